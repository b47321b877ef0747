//! The Postgres source: a table read in the order of its cursor column and
//! primary key, from a resume point, as binary COPY.
//!
//! The resume point is the cursor and key values of the last row an epoch
//! took, as text; reading again from it returns exactly the rows after it
//! (and any row updated since, with a newer cursor: a superset).

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::{ArrowError, Schema};
use orca_core::sync::SchemaPolicy;

use crate::ids::IdForm;
use crate::source::postgres::copy::{PgColumn, PgKind};
use crate::util::{pg_text, quote_ident};

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("source table {table}: {}", pg_text(source))]
    Postgres {
        table: String,
        source: postgres::Error,
    },
    #[error("source table {table} does not exist or has no columns")]
    NoTable { table: String },
    #[error("source table {table} has no column '{column}' (named as the stream's {role})")]
    NoColumn {
        table: String,
        column: String,
        role: &'static str,
    },
    #[error(
        "stream {stream}: a lookback needs a timestamp or date cursor, and {cursor} of {table} \
         is {ty}"
    )]
    Lookback {
        stream: String,
        table: String,
        cursor: String,
        ty: String,
    },
    #[error(
        "stream {stream}: ({columns}) is neither the primary key nor a unique key of {table}; \
         the resume point needs a unique key, or rows sharing a cursor value are lost or read twice"
    )]
    NotUnique {
        stream: String,
        table: String,
        columns: String,
    },
    #[error(
        "stream {stream}: source table {table} changed (new columns: [{added}], gone: [{missing}]) \
         and the stream's schema policy is {policy}"
    )]
    SchemaChanged {
        stream: String,
        table: String,
        policy: String,
        added: String,
        missing: String,
    },
    #[error("resume point {position:?} has {got} values, stream {stream} keys on {want}")]
    BadPosition {
        stream: String,
        position: Vec<String>,
        got: usize,
        want: usize,
    },
    #[error("formatting a resume point: {0}")]
    Arrow(#[from] ArrowError),
    #[error(
        "stream {stream}: {table}'s replica identity is {identity}, and a change stream keyed on \
         ({key}) needs those columns in every delete and update: make ({key}) the primary key, \
         or ALTER TABLE {table} REPLICA IDENTITY FULL"
    )]
    ReplicaIdentity {
        stream: String,
        table: String,
        identity: String,
        key: String,
    },
    #[error(
        "stream {stream}: {table} has columns whose values Postgres may TOAST ({columns}), and an \
         update that leaves such a value alone sends it in the change stream only under \
         REPLICA IDENTITY FULL: ALTER TABLE {table} REPLICA IDENTITY FULL"
    )]
    Toastable {
        stream: String,
        table: String,
        columns: String,
    },
}

/// A stream as the sync defines it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StreamSpec {
    pub name: String,
    pub table: String,
    pub cursor: String,
    pub primary_key: Vec<String>,
    /// What happens when the table's columns change: `evolve` (new columns
    /// join), `freeze` (the attempt stops with an error), `discard` (new
    /// columns are not read).
    pub schema_policy: SchemaPolicy,
    /// Read again, at each attempt's start, the rows whose cursor is this
    /// much (a Postgres interval: `10 minutes`) before the resume point:
    /// rows a long transaction committed late with an older cursor value.
    pub lookback: Option<String>,
    /// Read as a change stream (`postgres_cdc`): no cursor, the key alone
    /// makes a row's identity, and each row carries `_orca_deleted` and
    /// `_orca_lsn`.
    #[serde(default)]
    pub cdc: bool,
    /// Connections a big read of the table is split over (by ranges of the
    /// cursor); None: the engine host's cores (at most 8).
    #[serde(default)]
    pub splits: Option<u8>,
}

/// The columns a change stream adds to each of its rows: whether the row is
/// a delete marker, and the LSN of its transaction's commit (a snapshot
/// row: the LSN the change stream starts after).
pub const CDC_COLUMNS: [&str; 2] = ["_orca_deleted", "_orca_lsn"];

/// What the source table looks like, and how to read it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PgTable {
    pub spec: StreamSpec,
    pub columns: Vec<PgColumn>,
    /// Each column's SQL type, for casting resume values back.
    pub sql_types: Vec<String>,
    /// Columns without a binary decoder, selected as `::text`.
    pub as_text: Vec<bool>,
    /// The columns of the resume point: the cursor, then the key.
    pub key: Vec<usize>,
    /// How the destination gets `_orca_id` (the stream's recorded form;
    /// decided in the engine, so never sent to a runner's pump).
    #[serde(skip)]
    pub ids: IdForm,
}

/// A range of the cursor's values, as text the column's type reads:
/// from `lo` (inclusive) to `hi` (exclusive); None: unbounded.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Range {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hi: Option<String>,
}

pub(crate) fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

pub(crate) fn qualified(table: &str) -> String {
    table
        .split('.')
        .map(quote_ident)
        .collect::<Vec<_>>()
        .join(".")
}

/// Looks the table up in the catalog.
pub fn describe(client: &mut postgres::Client, spec: &StreamSpec) -> Result<PgTable, SourceError> {
    let pg = |source| SourceError::Postgres {
        table: spec.table.clone(),
        source,
    };
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid::oid, a.atttypmod, NOT a.attnotnull,
                    format_type(a.atttypid, a.atttypmod)
             FROM pg_attribute a
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum",
            &[&qualified(&spec.table)],
        )
        .map_err(pg)?;
    if rows.is_empty() {
        return Err(SourceError::NoTable {
            table: spec.table.clone(),
        });
    }
    let mut columns = Vec::with_capacity(rows.len());
    let mut sql_types = Vec::with_capacity(rows.len());
    let mut as_text = Vec::with_capacity(rows.len());
    for r in &rows {
        let oid: u32 = r.get(1);
        let typmod: i32 = r.get(2);
        let kind = PgKind::of(oid, typmod);
        as_text.push(kind.is_none());
        columns.push(PgColumn {
            name: r.get(0),
            kind: kind.unwrap_or(PgKind::Text),
            nullable: r.get(3),
        });
        // A column read as text keeps its own type for the comparison in the
        // resume predicate.
        sql_types.push(r.get(4));
    }
    let find = |c: &str, role: &'static str| {
        columns
            .iter()
            .position(|col| col.name == c)
            .ok_or_else(|| SourceError::NoColumn {
                table: spec.table.clone(),
                column: c.to_string(),
                role,
            })
    };
    let mut key = Vec::new();
    if !spec.cdc {
        key.push(find(&spec.cursor, "cursor")?);
    }
    for k in &spec.primary_key {
        key.push(find(k, "primary key")?);
    }
    // What the catalog says about the key: some unique index (the primary
    // key among them) must cover only columns of the declared key.
    let unique: bool = client
        .query_one(
            "SELECT EXISTS (
                 SELECT 1 FROM pg_index i
                 WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL
                   AND i.indexprs IS NULL
                   AND (SELECT bool_and(a.attname::text = ANY ($2))
                        FROM unnest(i.indkey) k
                        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k))",
            &[&qualified(&spec.table), &spec.primary_key],
        )
        .map_err(pg)?
        .get(0);
    if !unique {
        return Err(SourceError::NotUnique {
            stream: spec.name.clone(),
            table: spec.table.clone(),
            columns: spec.primary_key.join(", "),
        });
    }
    if spec.cdc {
        replica_identity(client, spec)?;
        // A delete marker carries the key alone.
        for (i, c) in columns.iter_mut().enumerate() {
            if !key.contains(&i) {
                c.nullable = true;
            }
        }
        columns.push(PgColumn {
            name: CDC_COLUMNS[0].into(),
            kind: PgKind::Bool,
            nullable: false,
        });
        columns.push(PgColumn {
            name: CDC_COLUMNS[1].into(),
            kind: PgKind::Int8,
            nullable: false,
        });
        sql_types.extend(["boolean".to_string(), "bigint".to_string()]);
        as_text.extend([false, false]);
    }
    if spec.lookback.is_some() {
        let ty: String = key
            .first()
            .and_then(|&i| sql_types.get(i))
            .cloned()
            .unwrap_or_default();
        if !(ty.starts_with("timestamp") || ty == "date") {
            return Err(SourceError::Lookback {
                stream: spec.name.clone(),
                table: spec.table.clone(),
                cursor: spec.cursor.clone(),
                ty,
            });
        }
    }
    Ok(PgTable {
        spec: spec.clone(),
        columns,
        sql_types,
        as_text,
        key,
        ids: IdForm::default(),
    })
}

/// Checks that every delete and update of the table will carry the
/// stream's key: the replica identity is the key's index, or full.
fn replica_identity(client: &mut postgres::Client, spec: &StreamSpec) -> Result<(), SourceError> {
    let row = client
        .query_one(
            "SELECT c.relreplident::text,
                    coalesce((SELECT array_agg(a.attname::text ORDER BY a.attname::text)
                              FROM pg_index i
                              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                              WHERE i.indrelid = c.oid
                                AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                                        ELSE i.indisreplident END),
                             '{}')
             FROM pg_class c WHERE c.oid = to_regclass($1)",
            &[&qualified(&spec.table)],
        )
        .map_err(|source| SourceError::Postgres {
            table: spec.table.clone(),
            source,
        })?;
    let identity: String = row.get(0);
    let columns: Vec<String> = row.get(1);
    let mut want = spec.primary_key.clone();
    want.sort();
    let fits = match identity.as_str() {
        "f" => true,
        "d" | "i" => columns == want,
        _ => false,
    };
    if fits && identity != "f" {
        // An update that leaves a TOASTed value alone sends no value for it
        // unless the old row goes whole into the WAL: without it, a merge
        // could not tell the value.
        let toastable: Vec<String> = client
            .query_one(
                "SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum), '{}')
                 FROM pg_attribute a
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
                   AND a.attlen = -1 AND a.attstorage <> 'p' AND NOT a.attname::text = ANY ($2)",
                &[&qualified(&spec.table), &spec.primary_key],
            )
            .map_err(|source| SourceError::Postgres {
                table: spec.table.clone(),
                source,
            })?
            .get(0);
        if !toastable.is_empty() {
            return Err(SourceError::Toastable {
                stream: spec.name.clone(),
                table: spec.table.clone(),
                columns: toastable.join(", "),
            });
        }
    }
    if fits {
        return Ok(());
    }
    let identity = match identity.as_str() {
        "n" => "NOTHING".to_string(),
        "d" if columns.is_empty() => "DEFAULT, and it has no primary key".to_string(),
        "d" => format!("its primary key ({})", columns.join(", ")),
        _ => format!("the index on ({})", columns.join(", ")),
    };
    Err(SourceError::ReplicaIdentity {
        stream: spec.name.clone(),
        table: spec.table.clone(),
        identity,
        key: spec.primary_key.join(", "),
    })
}

impl PgTable {
    /// Applies the stream's schema policy against the columns it delivered
    /// before (`recorded`, from the checkpoint record; empty the first time).
    /// The stream's `_orca_id` keeps the form it was recorded with.
    pub fn under_policy(mut self, recorded: &[(String, String)]) -> Result<PgTable, SourceError> {
        self.ids = IdForm::of_recorded(recorded);
        let recorded: Vec<&str> = recorded
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !n.starts_with("_orca_"))
            .collect();
        if recorded.is_empty() || self.spec.schema_policy == SchemaPolicy::Evolve {
            return Ok(self);
        }
        let now: Vec<&str> = self
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .filter(|n| !n.starts_with("_orca_"))
            .collect();
        let added: Vec<&str> = now
            .iter()
            .filter(|c| !recorded.contains(c))
            .copied()
            .collect();
        let missing: Vec<&str> = recorded
            .iter()
            .filter(|c| !now.contains(c))
            .copied()
            .collect();
        if !missing.is_empty()
            || (self.spec.schema_policy == SchemaPolicy::Freeze && !added.is_empty())
        {
            return Err(SourceError::SchemaChanged {
                stream: self.spec.name.clone(),
                table: self.spec.table.clone(),
                policy: self.spec.schema_policy.name().to_string(),
                added: added.join(", "),
                missing: missing.join(", "),
            });
        }
        // discard: read only the columns delivered before.
        let keep: Vec<bool> = self
            .columns
            .iter()
            .map(|c| recorded.contains(&c.name.as_str()) || c.name.starts_with("_orca_"))
            .collect();
        let old_key: Vec<String> = self
            .key
            .iter()
            .map(|&i| self.columns[i].name.clone())
            .collect();
        self.columns = pick(self.columns, &keep);
        self.sql_types = pick(self.sql_types, &keep);
        self.as_text = pick(self.as_text, &keep);
        self.key = old_key
            .iter()
            .filter_map(|k| self.columns.iter().position(|c| &c.name == k))
            .collect();
        Ok(self)
    }

    /// The Arrow schema of the source's columns.
    pub fn schema(&self) -> Schema {
        Schema::new(self.columns.iter().map(PgColumn::field).collect::<Vec<_>>())
    }

    /// The COPY that reads every row after `after`, in resume order.
    pub fn copy_query(&self, after: Option<&[String]>) -> Result<String, SourceError> {
        self.copy_query_in(after, &Range::default(), 0)
    }

    /// The COPY of a change stream's snapshot: `lsn` is the one its rows
    /// carry in `_orca_lsn`.
    pub fn copy_query_at(&self, after: Option<&[String]>, lsn: u64) -> Result<String, SourceError> {
        self.copy_query_in(after, &Range::default(), lsn)
    }

    /// The COPY of the rows after `after` whose first resume column (the
    /// cursor) lies in `range`, in resume order.
    pub fn copy_query_in(
        &self,
        after: Option<&[String]>,
        range: &Range,
        lsn: u64,
    ) -> Result<String, SourceError> {
        let order = self.key_list();
        let mut q = format!(
            "COPY (SELECT {} FROM {}",
            self.select_list(lsn),
            qualified(&self.spec.table)
        );
        let mut conditions = Vec::new();
        if let Some(&first) = self.key.first() {
            let col = quote_ident(&self.columns[first].name);
            let ty = &self.sql_types[first];
            if let Some(lo) = &range.lo {
                conditions.push(format!("{col} >= {}::{ty}", quote_literal(lo)));
            }
            if let Some(hi) = &range.hi {
                conditions.push(format!("{col} < {}::{ty}", quote_literal(hi)));
            }
        }
        if let Some(pos) = after {
            conditions.push(self.after_condition(pos)?);
        }
        if !conditions.is_empty() {
            q.push_str(" WHERE ");
            q.push_str(&conditions.join(" AND "));
        }
        q.push_str(&format!(" ORDER BY {order}) TO STDOUT (FORMAT binary)"));
        Ok(q)
    }

    /// The COPY of a change stream's snapshot read after `after` in a later
    /// snapshot, made to stand for the table as it was at `lsn`: the keys
    /// that changed between the two points (`changed`, key values in key
    /// order) are left out and `rows` (those of them that existed at `lsn`,
    /// as they were, values in the order of the table's own columns) take
    /// their place, in key order by each key column's collation
    /// (`collate`, quoted, None: a type without one).
    pub fn copy_query_as_of(
        &self,
        after: Option<&[String]>,
        lsn: u64,
        changed: &[Vec<Option<String>>],
        rows: &[Vec<Option<String>>],
        collate: &[Option<String>],
    ) -> Result<String, SourceError> {
        let select = self.select_list(lsn);
        let typed = |v: &Option<String>, i: usize| match v {
            Some(v) => format!("{}::{}", quote_literal(v), self.sql_types[i]),
            None => format!("NULL::{}", self.sql_types[i]),
        };
        let mut conditions = Vec::new();
        if let Some(pos) = after {
            conditions.push(self.after_condition(pos)?);
        }
        let table = qualified(&self.spec.table);
        if !changed.is_empty() {
            let keys: Vec<String> = changed
                .iter()
                .map(|k| {
                    let values: Vec<String> =
                        self.key.iter().zip(k).map(|(&i, v)| typed(v, i)).collect();
                    format!("({})", values.join(", "))
                })
                .collect();
            let names: Vec<String> = (0..self.key.len()).map(|n| format!("k{n}")).collect();
            let ours: Vec<String> = self
                .key
                .iter()
                .map(|&i| format!("{table}.{}", quote_ident(&self.columns[i].name)))
                .collect();
            // An anti-join (hashed, and spilled when big), where NOT IN
            // would test each row against the whole list.
            conditions.push(format!(
                "NOT EXISTS (SELECT FROM (VALUES {}) AS changed({}) WHERE ({}) = ({}))",
                keys.join(", "),
                names.join(", "),
                // A text key compares in its column's collation (the
                // list's values have the type's default).
                names
                    .iter()
                    .enumerate()
                    .map(|(n, k)| match collate.get(n).cloned().flatten() {
                        Some(coll) => format!("changed.{k} COLLATE {coll}"),
                        None => format!("changed.{k}"),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                ours.join(", ")
            ));
        }
        let mut q = format!("SELECT {select} FROM {table}");
        if !conditions.is_empty() {
            q.push_str(" WHERE ");
            q.push_str(&conditions.join(" AND "));
        }
        let own: Vec<usize> = (0..self.columns.len())
            .filter(|&i| !(self.spec.cdc && CDC_COLUMNS.contains(&self.columns[i].name.as_str())))
            .collect();
        if rows.is_empty() {
            // The table's own order (its key's index).
            q.push_str(&format!(" ORDER BY {}", self.key_list()));
            return Ok(format!("COPY ({q}) TO STDOUT (FORMAT binary)"));
        }
        let values: Vec<String> = rows
            .iter()
            .map(|r| {
                let v: Vec<String> = own.iter().zip(r).map(|(&i, v)| typed(v, i)).collect();
                format!("({})", v.join(", "))
            })
            .collect();
        let names: Vec<String> = own
            .iter()
            .map(|&i| quote_ident(&self.columns[i].name))
            .collect();
        q.push_str(&format!(
            " UNION ALL SELECT {select} FROM (VALUES {}) AS {}({})",
            values.join(", "),
            quote_ident(&self.spec.name),
            names.join(", ")
        ));
        // The two parts' text columns have different collations (the
        // column's, the type's default): the order names the column's.
        let order: Vec<String> = self
            .key
            .iter()
            .enumerate()
            .map(|(n, &i)| {
                let c = quote_ident(&self.columns[i].name);
                match collate.get(n).cloned().flatten() {
                    Some(coll) => format!("{c} COLLATE {coll}"),
                    None => c,
                }
            })
            .collect();
        Ok(format!(
            "COPY (SELECT * FROM ({q}) AS part ORDER BY {}) TO STDOUT (FORMAT binary)",
            order.join(", ")
        ))
    }

    /// The selected columns; a change stream's carry `lsn` and no delete.
    fn select_list(&self, lsn: u64) -> String {
        self.columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if self.spec.cdc && c.name == CDC_COLUMNS[0] {
                    format!("false AS {}", quote_ident(&c.name))
                } else if self.spec.cdc && c.name == CDC_COLUMNS[1] {
                    format!("{}::bigint AS {}", lsn as i64, quote_ident(&c.name))
                } else if self.as_text[i] {
                    format!("{}::text AS {}", quote_ident(&c.name), quote_ident(&c.name))
                } else {
                    quote_ident(&c.name)
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The resume columns, in order.
    fn key_list(&self) -> String {
        self.key
            .iter()
            .map(|&i| quote_ident(&self.columns[i].name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The condition for the rows after resume point `pos`.
    fn after_condition(&self, pos: &[String]) -> Result<String, SourceError> {
        if pos.len() != self.key.len() {
            return Err(SourceError::BadPosition {
                stream: self.spec.name.clone(),
                position: pos.to_vec(),
                got: pos.len(),
                want: self.key.len(),
            });
        }
        let values = self
            .key
            .iter()
            .zip(pos)
            .map(|(&i, v)| format!("{}::{}", quote_literal(v), self.sql_types[i]))
            .collect::<Vec<_>>()
            .join(", ");
        Ok(match (&self.spec.lookback, self.key.first()) {
            // From the cursor's value less the lookback: the rows after
            // the resume point and those that committed late before it.
            (Some(back), Some(&c)) => format!(
                "{} >= {}::{} - {}::interval",
                quote_ident(&self.columns[c].name),
                quote_literal(&pos[0]),
                self.sql_types[c],
                quote_literal(back)
            ),
            _ => format!("({}) > ({values})", self.key_list()),
        })
    }

    /// The resume point at a row: its cursor and key values, as text the
    /// column's type reads back.
    pub fn position_at(&self, arrays: &[ArrayRef], row: usize) -> Result<Vec<String>, SourceError> {
        let opts = FormatOptions::default().with_null("");
        self.key
            .iter()
            .map(|&i| {
                let f = ArrayFormatter::try_new(arrays[i].as_ref(), &opts)?;
                Ok(f.value(row).to_string())
            })
            .collect()
    }
}

/// The items whose flag is set.
fn pick<T>(v: Vec<T>, keep: &[bool]) -> Vec<T> {
    v.into_iter()
        .zip(keep)
        .filter(|(_, k)| **k)
        .map(|(x, _)| x)
        .collect()
}

/// The metadata columns every destination row carries, `_orca_id` in
/// `ids`' form.
pub fn metadata_fields(ids: IdForm) -> Vec<arrow_schema::Field> {
    use arrow_schema::{DataType, Field, TimeUnit};
    vec![
        ids.field(),
        Field::new("_orca_seq", DataType::Int64, false),
        Field::new(
            "_orca_synced_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
    ]
}

/// The schema of a stream at the destination: the source's columns and the
/// metadata columns.
pub fn destination_schema(t: &PgTable) -> Arc<Schema> {
    let mut fields: Vec<arrow_schema::Field> = t.columns.iter().map(PgColumn::field).collect();
    fields.extend(metadata_fields(t.ids));
    Arc::new(Schema::new(fields))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> PgTable {
        PgTable {
            spec: StreamSpec {
                name: "orders".into(),
                table: "public.orders".into(),
                cursor: "updated_at".into(),
                primary_key: vec!["id".into()],
                schema_policy: SchemaPolicy::Evolve,
                lookback: None,
                cdc: false,
                splits: None,
            },
            columns: vec![
                PgColumn {
                    name: "id".into(),
                    kind: PgKind::Int8,
                    nullable: false,
                },
                PgColumn {
                    name: "updated_at".into(),
                    kind: PgKind::TimestampTz,
                    nullable: false,
                },
                PgColumn {
                    name: "tags".into(),
                    kind: PgKind::Text,
                    nullable: true,
                },
            ],
            sql_types: vec![
                "bigint".into(),
                "timestamp with time zone".into(),
                "text[]".into(),
            ],
            as_text: vec![false, false, true],
            key: vec![1, 0],
            ids: IdForm::default(),
        }
    }

    #[test]
    fn a_stream_recorded_with_hex_ids_keeps_them_and_a_new_one_gets_bytes() {
        use arrow_schema::DataType;
        let id_type = |t: &PgTable| {
            destination_schema(t)
                .field_with_name("_orca_id")
                .map(|f| f.data_type().clone())
                .expect("_orca_id")
        };
        let new = table().under_policy(&[]).expect("new");
        assert_eq!(id_type(&new), DataType::FixedSizeBinary(16));
        let recorded = [
            ("id".to_string(), "Int64".to_string()),
            ("_orca_id".to_string(), "Utf8".to_string()),
        ];
        let old = table().under_policy(&recorded).expect("old");
        assert_eq!(id_type(&old), DataType::Utf8);
    }

    #[test]
    fn the_query_resumes_after_the_cursor_and_key() {
        let t = table();
        assert_eq!(
            t.copy_query(None).expect("query"),
            "COPY (SELECT \"id\", \"updated_at\", \"tags\"::text AS \"tags\" FROM \"public\".\"orders\" \
             ORDER BY \"updated_at\", \"id\") TO STDOUT (FORMAT binary)"
        );
        let q = t
            .copy_query(Some(&["2024-01-01T00:00:00Z".into(), "it's".into()]))
            .expect("query");
        assert!(
            q.contains("WHERE (\"updated_at\", \"id\") > ('2024-01-01T00:00:00Z'::timestamp with time zone, 'it''s'::bigint)"),
            "{q}"
        );
        let mut back = t.clone();
        back.spec.lookback = Some("10 minutes".into());
        let q = back
            .copy_query(Some(&["2024-01-01T00:00:00Z".into(), "7".into()]))
            .expect("query");
        assert!(
            q.contains("WHERE \"updated_at\" >= '2024-01-01T00:00:00Z'::timestamp with time zone - '10 minutes'::interval ORDER BY \"updated_at\", \"id\""),
            "{q}"
        );
        assert!(matches!(
            t.copy_query(Some(&["x".into()])),
            Err(SourceError::BadPosition {
                got: 1,
                want: 2,
                ..
            })
        ));
    }
}
