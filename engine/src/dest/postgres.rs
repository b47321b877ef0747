//! The Postgres destination (transactional): lane 0 commits a stream's epoch
//! in one transaction that checks the fence, loads the rows and moves the
//! stream's marker, so the rows and the marker become visible together or
//! not at all.
//!
//! - `append`: rows are inserted, skipping any whose `_orca_id` the table
//!   holds already (a unique index), so a replayed record lands once;
//! - `merge`: rows are upserted by the stream's primary key, and a row only
//!   replaces one with a lower `_orca_seq`, so a replay of older versions
//!   changes nothing;
//! - `overwrite`: each refresh loads its epochs into a shadow table
//!   `{schema}._orca_refresh_{stream}` (appended as above), and its last
//!   epoch replaces the table's rows with the shadow's in the transaction
//!   that moves the marker: readers see the old rows or the new, never half.
//!
//! Tables are `{schema}.{stream}`, made from the batch's columns on first use
//! and widened (new columns added, a column's type changed to the wider one)
//! as the stream's schema widens. Markers live in `{schema}._orca_markers`,
//! fences in `{schema}._orca_fences`.

use std::io::Write;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema, TimeUnit};

use crate::commit::record::Refresh;
use crate::dest::error::DestError;
use crate::dest::held::Held;
use crate::ids::{in_form, IdForm, ORCA_ID};
use crate::netguard::Guard;
use crate::util::{pg_text, quote_ident};

const PG_EPOCH_US: i64 = 946_684_800_000_000;
const PG_EPOCH_DAYS: i32 = 10_957;

/// The Postgres type a column is stored as.
pub fn pg_type(t: &DataType) -> Option<String> {
    Some(match t {
        DataType::Boolean => "boolean".into(),
        DataType::Int16 => "smallint".into(),
        DataType::Int32 => "integer".into(),
        DataType::Int64 => "bigint".into(),
        DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Utf8 => "text".into(),
        DataType::Binary => "bytea".into(),
        // 16 bytes are an `_orca_id`.
        DataType::FixedSizeBinary(crate::ids::ID_BYTES) => "uuid".into(),
        DataType::Date32 => "date".into(),
        DataType::Timestamp(TimeUnit::Microsecond, None) => "timestamp without time zone".into(),
        DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => "timestamp with time zone".into(),
        DataType::Decimal128(p, s) => format!("numeric({p},{s})"),
        _ => return None,
    })
}

/// A decimal at `scale` in numeric's send format.
pub fn numeric_bytes(v: i128, scale: i8) -> Vec<u8> {
    let scale = scale.max(0) as u32;
    let neg = v < 0;
    let abs = v.unsigned_abs();
    let pow = 10u128.pow(scale);
    let (int, frac) = (abs / pow, abs % pow);
    // Base-10000 groups of the integer part, most significant first.
    let mut groups: Vec<u16> = Vec::new();
    let mut x = int;
    while x > 0 {
        groups.insert(0, (x % 10_000) as u16);
        x /= 10_000;
    }
    let mut weight = groups.len() as i16 - 1;
    // The fraction's digits, padded to whole groups of four.
    if scale > 0 {
        let digits = format!("{frac:0width$}", width = scale as usize);
        let padded = format!("{digits:0<width$}", width = digits.len().div_ceil(4) * 4);
        for chunk in padded.as_bytes().chunks(4) {
            let g = std::str::from_utf8(chunk)
                .ok()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            groups.push(g);
        }
    }
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    let mut out = Vec::with_capacity(8 + groups.len() * 2);
    out.extend((groups.len() as u16).to_be_bytes());
    out.extend(weight.to_be_bytes());
    out.extend(
        (if neg && !groups.is_empty() {
            0x4000u16
        } else {
            0
        })
        .to_be_bytes(),
    );
    out.extend((scale as u16).to_be_bytes());
    for g in groups {
        out.extend(g.to_be_bytes());
    }
    out
}

/// The header of a binary COPY stream.
pub fn copy_header() -> Vec<u8> {
    let mut out = b"PGCOPY\n\xff\r\n\0".to_vec();
    out.extend(0u32.to_be_bytes());
    out.extend(0u32.to_be_bytes());
    out
}

/// The trailer of a binary COPY stream.
pub fn copy_trailer() -> [u8; 2] {
    (-1i16).to_be_bytes()
}

/// A batch's rows in binary COPY format (between a header and a trailer).
pub fn copy_rows(batch: &RecordBatch) -> Result<Vec<u8>, DestError> {
    let mut out = Vec::with_capacity(batch.get_array_memory_size() + 64);
    let cols = batch.columns();
    let field = |out: &mut Vec<u8>, v: &[u8]| {
        out.extend((v.len() as i32).to_be_bytes());
        out.extend_from_slice(v);
    };
    for row in 0..batch.num_rows() {
        out.extend((cols.len() as i16).to_be_bytes());
        for c in cols {
            if c.is_null(row) {
                out.extend((-1i32).to_be_bytes());
                continue;
            }
            match c.data_type() {
                DataType::Boolean => field(&mut out, &[u8::from(c.as_boolean().value(row))]),
                DataType::Int16 => field(
                    &mut out,
                    &c.as_primitive::<Int16Type>().value(row).to_be_bytes(),
                ),
                DataType::Int32 => field(
                    &mut out,
                    &c.as_primitive::<Int32Type>().value(row).to_be_bytes(),
                ),
                DataType::Int64 => field(
                    &mut out,
                    &c.as_primitive::<Int64Type>().value(row).to_be_bytes(),
                ),
                DataType::Float32 => field(
                    &mut out,
                    &c.as_primitive::<Float32Type>().value(row).to_be_bytes(),
                ),
                DataType::Float64 => field(
                    &mut out,
                    &c.as_primitive::<Float64Type>().value(row).to_be_bytes(),
                ),
                DataType::Utf8 => field(&mut out, c.as_string::<i32>().value(row).as_bytes()),
                DataType::Binary => field(&mut out, c.as_binary::<i32>().value(row)),
                // uuid's binary form is its 16 bytes.
                DataType::FixedSizeBinary(crate::ids::ID_BYTES) => {
                    field(&mut out, c.as_fixed_size_binary().value(row))
                }
                DataType::Date32 => field(
                    &mut out,
                    &(c.as_primitive::<Date32Type>().value(row) - PG_EPOCH_DAYS).to_be_bytes(),
                ),
                DataType::Timestamp(TimeUnit::Microsecond, _) => field(
                    &mut out,
                    &(c.as_primitive::<TimestampMicrosecondType>().value(row) - PG_EPOCH_US)
                        .to_be_bytes(),
                ),
                DataType::Decimal128(_, s) => field(
                    &mut out,
                    &numeric_bytes(c.as_primitive::<Decimal128Type>().value(row), *s),
                ),
                other => {
                    return Err(DestError::Definition(format!(
                        "a column of type {other} cannot be written to Postgres"
                    )))
                }
            }
        }
    }
    Ok(out)
}

/// Whether `table`'s `_orca_id` is `uuid` (a stream that began with 16-byte
/// ids) rather than hex `text`.
pub(crate) fn ids_are_uuid(
    tx: &mut postgres::Transaction<'_>,
    table: &str,
) -> Result<bool, postgres::Error> {
    Ok(tx
        .query_opt(
            "SELECT format_type(atttypid, atttypmod) = 'uuid' FROM pg_attribute
             WHERE attrelid = to_regclass($1) AND attname = '_orca_id' AND attnum > 0
               AND NOT attisdropped",
            &[&table],
        )?
        .is_some_and(|r| r.get(0)))
}

/// Postgres text cannot hold NUL: such cells are loaded as null and held.
pub fn hold(batch: RecordBatch) -> Result<(RecordBatch, Vec<Held>), DestError> {
    use arrow_array::builder::StringBuilder;
    let schema = batch.schema();
    let ids = batch.column_by_name(crate::ids::ORCA_ID).cloned();
    let mut held = Vec::new();
    let mut columns = batch.columns().to_vec();
    for (i, f) in schema.fields().iter().enumerate() {
        if f.data_type() != &DataType::Utf8 || f.name().starts_with("_orca_") {
            continue;
        }
        let col = batch.column(i).as_string::<i32>();
        if !col.iter().flatten().any(|v| v.contains('\0')) {
            continue;
        }
        if !f.is_nullable() {
            return Err(DestError::Definition(format!(
                "column {} holds NUL characters Postgres cannot store, and cannot be null",
                f.name()
            )));
        }
        let mut b = StringBuilder::with_capacity(col.len(), col.value_data().len());
        for (row, v) in col.iter().enumerate() {
            match v {
                Some(v) if v.contains('\0') => {
                    held.push(Held {
                        column: f.name().clone(),
                        orca_id: ids
                            .as_ref()
                            .map(|ids| crate::ids::text_at(ids.as_ref(), row))
                            .unwrap_or_default(),
                        value: v.to_string(),
                        reason: "Postgres text cannot hold NUL (\\u0000)",
                    });
                    b.append_null();
                }
                other => b.append_option(other),
            }
        }
        columns[i] = std::sync::Arc::new(b.finish());
    }
    if held.is_empty() {
        return Ok((batch, held));
    }
    let batch = RecordBatch::try_new(schema, columns)
        .map_err(|e| DestError::Definition(format!("holding cells: {e}")))?;
    Ok((batch, held))
}

pub struct PgDest {
    pub client: postgres::Client,
    pub schema: String,
    pub sync: String,
}

fn pg(e: postgres::Error) -> DestError {
    DestError::Postgres(pg_text(&e))
}

/// How a stream is written.
#[derive(Debug, Clone)]
pub struct StreamMode {
    pub merge: bool,
    pub overwrite: bool,
    pub primary_key: Vec<String>,
}

impl PgDest {
    pub fn open(guard: &Guard, url: &str, schema: &str, sync: &str) -> Result<PgDest, DestError> {
        let mut client = guard.postgres(url)?;
        let s = quote_ident(schema);
        client
            .batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {s};
                 CREATE TABLE IF NOT EXISTS {s}._orca_markers (
                     sync text NOT NULL, stream text NOT NULL, epoch bigint NOT NULL,
                     generation integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(),
                     PRIMARY KEY (sync, stream));
                 CREATE TABLE IF NOT EXISTS {s}._orca_fences (
                     sync text PRIMARY KEY, generation integer NOT NULL);"
            ))
            .map_err(pg)?;
        Ok(PgDest {
            client,
            schema: schema.to_string(),
            sync: sync.to_string(),
        })
    }

    pub fn raise_fence(&mut self, generation: i32) -> Result<(), DestError> {
        let s = quote_ident(&self.schema);
        let mut tx = self.client.transaction().map_err(pg)?;
        let fence: Option<i32> = tx
            .query_opt(
                &format!("SELECT generation FROM {s}._orca_fences WHERE sync = $1 FOR UPDATE"),
                &[&self.sync],
            )
            .map_err(pg)?
            .map(|r| r.get(0));
        if let Some(f) = fence.filter(|f| *f > generation) {
            return Err(DestError::Fenced {
                fence: f,
                mine: generation,
            });
        }
        tx.execute(
            &format!(
                "INSERT INTO {s}._orca_fences (sync, generation) VALUES ($1, $2)
                 ON CONFLICT (sync) DO UPDATE SET generation = excluded.generation"
            ),
            &[&self.sync, &generation],
        )
        .map_err(pg)?;
        tx.commit().map_err(pg)
    }

    pub fn marker(&mut self, stream: &str) -> Result<u64, DestError> {
        let s = quote_ident(&self.schema);
        let m: Option<i64> = self
            .client
            .query_opt(
                &format!("SELECT epoch FROM {s}._orca_markers WHERE sync = $1 AND stream = $2"),
                &[&self.sync, &stream],
            )
            .map_err(pg)?
            .map(|r| r.get(0));
        Ok(m.unwrap_or(0) as u64)
    }

    /// Makes the table fit the batch: made on first use, new columns
    /// added, a column whose type widened changed to the wider type.
    fn fit_table(
        tx: &mut postgres::Transaction<'_>,
        schema: &str,
        stream: &str,
        batch: &Schema,
        mode: &StreamMode,
    ) -> Result<(), DestError> {
        let qt = format!("{}.{}", quote_ident(schema), quote_ident(stream));
        let have: Vec<(String, String)> = tx
            .query(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
                 FROM pg_attribute a
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                &[&qt],
            )
            .map_err(pg)?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let typed = |f: &arrow_schema::Field| {
            pg_type(f.data_type()).ok_or_else(|| {
                DestError::Definition(format!(
                    "column {} of type {} cannot be written to Postgres",
                    f.name(),
                    f.data_type()
                ))
            })
        };
        if have.is_empty() {
            let mut cols = Vec::new();
            for f in batch.fields() {
                cols.push(format!("{} {}", quote_ident(f.name()), typed(f)?));
            }
            let key = if mode.merge {
                format!(
                    ", PRIMARY KEY ({})",
                    mode.primary_key
                        .iter()
                        .map(|k| quote_ident(k))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                ", UNIQUE (_orca_id)".to_string()
            };
            tx.batch_execute(&format!("CREATE TABLE {qt} ({}{key})", cols.join(", ")))
                .map_err(pg)?;
            return Ok(());
        }
        for f in batch.fields() {
            let want = typed(f)?;
            match have.iter().find(|(n, _)| n == f.name()) {
                None => tx
                    .batch_execute(&format!(
                        "ALTER TABLE {qt} ADD COLUMN {} {want}",
                        quote_ident(f.name())
                    ))
                    .map_err(pg)?,
                // uuids are never turned back into text (which would be
                // them with dashes, no longer the hex a stream sends).
                Some((_, t)) if f.name() == ORCA_ID && t == "uuid" => {}
                Some((_, t)) if *t != want => tx
                    .batch_execute(&format!(
                        "ALTER TABLE {qt} ALTER COLUMN {c} TYPE {want} USING {c}::{want}",
                        c = quote_ident(f.name())
                    ))
                    .map_err(pg)?,
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Replaces the table's rows with a finished refresh's (none when the
    /// refresh read nothing), and drops the shadow.
    fn swap_in(
        tx: &mut postgres::Transaction<'_>,
        table: &str,
        shadow: &str,
    ) -> Result<(), DestError> {
        let exists = |tx: &mut postgres::Transaction<'_>, t: &str| -> Result<bool, DestError> {
            tx.query_one("SELECT to_regclass($1) IS NOT NULL", &[&t])
                .map(|r| r.get(0))
                .map_err(pg)
        };
        if !exists(tx, table)? {
            return Ok(());
        }
        // DELETE rather than TRUNCATE: readers that started before keep
        // seeing the old rows, as MVCC promises.
        tx.batch_execute(&format!("DELETE FROM {table}"))
            .map_err(pg)?;
        if exists(tx, shadow)? {
            let cols: Vec<String> = tx
                .query(
                    "SELECT quote_ident(attname) FROM pg_attribute
                     WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped
                     ORDER BY attnum",
                    &[&shadow],
                )
                .map_err(pg)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let list = cols.join(", ");
            tx.batch_execute(&format!(
                "INSERT INTO {table} ({list}) SELECT {list} FROM {shadow}; DROP TABLE {shadow}"
            ))
            .map_err(pg)?;
        }
        Ok(())
    }

    /// Loads a stream's epoch and moves its marker, in one transaction;
    /// nothing when the marker shows the epoch applied.
    pub fn apply(
        &mut self,
        generation: i32,
        epoch: u64,
        stream: &str,
        batches: &[RecordBatch],
        mode: &StreamMode,
        refresh: Option<Refresh>,
    ) -> Result<(), DestError> {
        let s = quote_ident(&self.schema);
        let schema_name = self.schema.clone();
        let sync = self.sync.clone();
        let mut tx = self.client.transaction().map_err(pg)?;
        // The fence row stays locked until commit: a newer attempt raising
        // it waits for this commit, or this one sees its generation.
        let fence: Option<i32> = tx
            .query_opt(
                &format!("SELECT generation FROM {s}._orca_fences WHERE sync = $1 FOR SHARE"),
                &[&sync],
            )
            .map_err(pg)?
            .map(|r| r.get(0));
        if let Some(f) = fence.filter(|f| *f > generation) {
            return Err(DestError::Fenced {
                fence: f,
                mine: generation,
            });
        }
        let marker: Option<i64> = tx
            .query_opt(
                &format!(
                    "SELECT epoch FROM {s}._orca_markers WHERE sync = $1 AND stream = $2 FOR UPDATE"
                ),
                &[&sync, &stream],
            )
            .map_err(pg)?
            .map(|r| r.get(0));
        if marker.unwrap_or(0) as u64 >= epoch {
            return Ok(());
        }
        let shadow = format!("_orca_refresh_{stream}");
        let qshadow = format!("{s}.{}", quote_ident(&shadow));
        let target = match refresh {
            Some(_) => shadow.as_str(),
            None => stream,
        };
        if refresh.is_some_and(|r| r.begins) {
            tx.batch_execute(&format!("DROP TABLE IF EXISTS {qshadow}"))
                .map_err(pg)?;
        }
        // A stream that keeps hex ids, into a table another sync's 16-byte
        // ids turned `uuid`: its ids go in as uuids (the same ids), never
        // the column back to text.
        let as_uuid;
        let batches = match batches.first() {
            Some(b)
                if b.schema()
                    .field_with_name(ORCA_ID)
                    .is_ok_and(|f| f.data_type() == &DataType::Utf8)
                    && ids_are_uuid(&mut tx, &format!("{s}.{}", quote_ident(stream)))
                        .map_err(pg)? =>
            {
                as_uuid = batches
                    .iter()
                    .map(|b| in_form(b, IdForm::Bytes))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| DestError::Definition(e.to_string()))?;
                &as_uuid[..]
            }
            _ => batches,
        };
        if let Some(first) = batches.first() {
            let bschema = first.schema();
            Self::fit_table(&mut tx, &schema_name, target, &bschema, mode)?;
            if refresh.is_some() {
                // The table gets every column the swap will copy.
                Self::fit_table(&mut tx, &schema_name, stream, &bschema, mode)?;
            }
            let qt = format!("{s}.{}", quote_ident(target));
            let cols: Vec<String> = bschema
                .fields()
                .iter()
                .map(|f| quote_ident(f.name()))
                .collect();
            let list = cols.join(", ");
            let defs = bschema
                .fields()
                .iter()
                .map(|f| {
                    pg_type(f.data_type())
                        .map(|t| format!("{} {t}", quote_ident(f.name())))
                        .ok_or_else(|| {
                            DestError::Definition(format!("column {} cannot be written", f.name()))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            tx.batch_execute(&format!(
                "CREATE TEMP TABLE _orca_load ({}) ON COMMIT DROP",
                defs.join(", ")
            ))
            .map_err(pg)?;
            let mut w = tx
                .copy_in(&format!(
                    "COPY _orca_load ({list}) FROM STDIN (FORMAT binary)"
                ))
                .map_err(pg)?;
            let io = |e: std::io::Error| DestError::Postgres(e.to_string());
            w.write_all(&copy_header()).map_err(io)?;
            for b in batches {
                w.write_all(&copy_rows(b)?).map_err(io)?;
            }
            w.write_all(&copy_trailer()).map_err(io)?;
            w.finish().map_err(pg)?;
            let load = if mode.merge {
                let key = mode
                    .primary_key
                    .iter()
                    .map(|k| quote_ident(k))
                    .collect::<Vec<_>>()
                    .join(", ");
                let set = cols
                    .iter()
                    .map(|c| format!("{c} = excluded.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                // The newest version of each key in the epoch, and only over
                // an older one; a change stream's delete marker as the
                // newest version deletes the key's row instead.
                let deletes = bschema.field_with_name("_orca_deleted").is_ok();
                if deletes {
                    let on = mode
                        .primary_key
                        .iter()
                        .map(|k| format!("t.{c} = n.{c}", c = quote_ident(k)))
                        .collect::<Vec<_>>()
                        .join(" AND ");
                    format!(
                        "CREATE TEMP TABLE _orca_newest ON COMMIT DROP AS
                             SELECT DISTINCT ON ({key}) {list} FROM _orca_load
                             ORDER BY {key}, _orca_seq DESC;
                         DELETE FROM {qt} t USING _orca_newest n
                         WHERE n._orca_deleted AND {on} AND t._orca_seq < n._orca_seq;
                         INSERT INTO {qt} ({list})
                         SELECT {list} FROM _orca_newest WHERE NOT _orca_deleted
                         ON CONFLICT ({key}) DO UPDATE SET {set}
                         WHERE {qt}._orca_seq < excluded._orca_seq"
                    )
                } else {
                    format!(
                        "INSERT INTO {qt} ({list})
                         SELECT DISTINCT ON ({key}) {list} FROM _orca_load ORDER BY {key}, _orca_seq DESC
                         ON CONFLICT ({key}) DO UPDATE SET {set}
                         WHERE {qt}._orca_seq < excluded._orca_seq"
                    )
                }
            } else {
                format!(
                    "INSERT INTO {qt} ({list}) SELECT {list} FROM _orca_load
                     ON CONFLICT (_orca_id) DO NOTHING"
                )
            };
            tx.batch_execute(&load).map_err(pg)?;
        }
        if refresh.is_some_and(|r| r.ends) {
            Self::swap_in(&mut tx, &format!("{s}.{}", quote_ident(stream)), &qshadow)?;
        }
        tx.execute(
            &format!(
                "INSERT INTO {s}._orca_markers (sync, stream, epoch, generation) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (sync, stream) DO UPDATE
                 SET epoch = excluded.epoch, generation = excluded.generation, applied_at = now()"
            ),
            &[&sync, &stream, &(epoch as i64), &generation],
        )
        .map_err(pg)?;
        tx.commit().map_err(pg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::postgres::copy::numeric;

    #[test]
    fn numerics_round_trip_through_the_send_format() {
        for (v, s) in [
            (1_234_567i128, 2i8),
            (-5, 2),
            (0, 3),
            (20_000, 0),
            (99_990_000, 4),
            (1, 9),
            (-123_456_789_012_345_678, 6),
        ] {
            assert_eq!(numeric(&numeric_bytes(v, s), s), Ok(v), "{v} at scale {s}");
        }
    }
}
