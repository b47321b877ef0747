//! Raw rows to Arrow, per stream: the schema is inferred from what the rows
//! hold and only ever widened; values are coerced to the types a source
//! declares; records that cannot be taken are set aside with a reason; and the
//! metadata columns `_orca_id`, `_orca_seq` and `_orca_synced_at` are added.
//!
//! Types widen along `bool`, `int64 → float64`, and anything → `string`
//! (objects and arrays are kept as JSON text). A column never narrows and is
//! never dropped: once a stream has seen a string in `amount`, `amount` stays
//! a string column, and a row without it gets null. New columns join the
//! schema in name order at the end, so the order is the same on every replay.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, FixedSizeBinaryBuilder, Float64Builder, Int64Builder, StringBuilder,
};
use arrow_array::{ArrayRef, RecordBatch, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use orca_core::sync::{ColumnType, SchemaPolicy};
use serde_json::{Map, Value};

use crate::ids::IdForm;

/// A column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ColType {
    Bool,
    Int64,
    Float64,
    String,
}

impl ColType {
    fn arrow(self) -> DataType {
        match self {
            Self::Bool => DataType::Boolean,
            Self::Int64 => DataType::Int64,
            Self::Float64 => DataType::Float64,
            Self::String => DataType::Utf8,
        }
    }

    /// The type's name in a definition (`columns`).
    pub fn name(self) -> &'static str {
        ColumnType::from(self).name()
    }

    /// The narrowest type that holds both.
    pub fn widen(self, other: ColType) -> ColType {
        use ColType::*;
        match (self, other) {
            (a, b) if a == b => a,
            (Int64, Float64) | (Float64, Int64) => Float64,
            _ => String,
        }
    }

    /// The type an Arrow type name (as records keep schemas) stands for.
    pub fn from_arrow_name(name: &str) -> Option<ColType> {
        Some(match name {
            "Boolean" => Self::Bool,
            "Int64" => Self::Int64,
            "Float64" => Self::Float64,
            "Utf8" => Self::String,
            _ => return None,
        })
    }

    /// The type a JSON value asks for; `None` for null.
    fn of(v: &Value) -> Option<ColType> {
        match v {
            Value::Null => None,
            Value::Bool(_) => Some(Self::Bool),
            Value::Number(n) if n.is_i64() => Some(Self::Int64),
            Value::Number(_) => Some(Self::Float64),
            _ => Some(Self::String),
        }
    }
}

impl From<ColumnType> for ColType {
    fn from(t: ColumnType) -> ColType {
        match t {
            ColumnType::Boolean => ColType::Bool,
            ColumnType::Int64 => ColType::Int64,
            ColumnType::Float64 => ColType::Float64,
            ColumnType::String => ColType::String,
        }
    }
}

impl From<ColType> for ColumnType {
    fn from(t: ColType) -> ColumnType {
        match t {
            ColType::Bool => ColumnType::Boolean,
            ColType::Int64 => ColumnType::Int64,
            ColType::Float64 => ColumnType::Float64,
            ColType::String => ColumnType::String,
        }
    }
}

/// A record the stream could not take, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Quarantined {
    pub position: String,
    pub record: Value,
    pub reason: String,
}

/// One raw record with the source position it was read at (which makes its
/// `_orca_id` and `_orca_seq`).
#[derive(Debug, Clone)]
pub struct Raw {
    pub position: String,
    pub seq: i64,
    pub record: Value,
}

/// What a stream does when records no longer fit its schema.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Policy {
    /// New columns join, types widen.
    #[default]
    Evolve,
    /// Once the stream has a schema, a record with a new column or a value
    /// that would widen a column is quarantined.
    Freeze,
    /// New columns are dropped from the records; a value that would widen a
    /// column is quarantined.
    Discard,
}

impl From<SchemaPolicy> for Policy {
    fn from(p: SchemaPolicy) -> Policy {
        match p {
            SchemaPolicy::Evolve => Policy::Evolve,
            SchemaPolicy::Freeze => Policy::Freeze,
            SchemaPolicy::Discard => Policy::Discard,
        }
    }
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "evolve" => Some(Policy::Evolve),
            "freeze" => Some(Policy::Freeze),
            "discard" => Some(Policy::Discard),
            _ => None,
        }
    }
}

/// A stream's schema as far as it has seen: its columns in first-seen order.
#[derive(Debug, Clone, Default)]
pub struct StreamSchema {
    /// The destination's columns, by their names there.
    columns: Vec<(String, ColType)>,
    /// Types the definition declares, by column; values are coerced to them.
    declared: BTreeMap<String, ColType>,
    policy: Policy,
    /// The records' keys whose column is named otherwise (the key
    /// normalized, or a collision resolved). A key's column is named once,
    /// when it is first taken, and kept in the checkpoint records, so it
    /// never changes; a key not here names its column itself.
    renamed: BTreeMap<String, String>,
    /// Columns named after their keys in this attempt, not in `columns`
    /// yet (a batch's new columns join it after its rows).
    claimed: BTreeSet<String>,
    /// How the stream's `_orca_id` is written (its recorded form).
    ids: IdForm,
}

/// The most bytes of a column's name (PostgreSQL's identifiers).
const COLUMN_NAME_MAX: usize = 63;

/// A record key as a destination column's name: lowercase letters, digits
/// and `_` (a camelCase word boundary, spaces and punctuation become one
/// `_`), not starting with a digit or `_orca_`, at most 63 bytes.
/// `Order Total` → `order_total`, `userId` → `user_id`, `2nd` → `_2nd`.
pub fn column_name(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut prev_lower = false;
    for ch in key.chars() {
        if ch.is_alphanumeric() {
            if ch.is_uppercase() && prev_lower && !out.ends_with('_') {
                out.push('_');
            }
            prev_lower = ch.is_lowercase() || ch.is_numeric();
            out.extend(ch.to_lowercase());
        } else {
            prev_lower = false;
            if !out.ends_with('_') {
                out.push('_');
            }
        }
    }
    let trimmed = out.trim_end_matches('_');
    let mut name = if trimmed.is_empty() || trimmed.chars().all(|c| c == '_') {
        "column".to_string()
    } else {
        trimmed.to_string()
    };
    if name.starts_with(|c: char| c.is_numeric()) {
        name.insert(0, '_');
    }
    if name.starts_with("_orca_") {
        name.insert(0, 'c');
    }
    truncated(&name, COLUMN_NAME_MAX).to_string()
}

/// At most `max` bytes of `s`, cut at a character's boundary.
fn truncated(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl StreamSchema {
    /// The columns named otherwise than their keys, as a checkpoint record
    /// keeps them (key, column).
    pub fn renamed(&self) -> &BTreeMap<String, String> {
        &self.renamed
    }

    /// The names given before (from a checkpoint record).
    pub fn with_names(mut self, renamed: BTreeMap<String, String>) -> Self {
        self.renamed = renamed;
        self
    }

    /// The column a key's values go to, if it has one yet.
    fn column_of<'a>(&'a self, key: &'a str) -> Option<&'a str> {
        if let Some(c) = self.renamed.get(key) {
            return Some(c);
        }
        let own = self.claimed.contains(key)
            || (self.columns.iter().any(|(n, _)| n == key)
                && !self.renamed.values().any(|c| c == key));
        own.then_some(key)
    }

    fn is_taken(&self, column: &str) -> bool {
        self.claimed.contains(column)
            || self.columns.iter().any(|(n, _)| n == column)
            || self.renamed.values().any(|c| c == column)
    }

    /// The column of a key, named now if it has none: the key normalized
    /// ([`column_name`]), with `_2`, `_3`, ... when another key has that
    /// name.
    fn name_column(&mut self, key: &str) -> String {
        if let Some(c) = self.column_of(key) {
            return c.to_string();
        }
        let base = column_name(key);
        let mut name = base.clone();
        let mut n = 2;
        while self.is_taken(&name) {
            let suffix = format!("_{n}");
            name = format!(
                "{}{suffix}",
                truncated(&base, COLUMN_NAME_MAX - suffix.len())
            );
            n += 1;
        }
        if name == key {
            self.claimed.insert(name.clone());
        } else {
            self.renamed.insert(key.to_string(), name.clone());
        }
        name
    }

    /// Names the columns of a record's new keys: the keys already in their
    /// normal form first, so that `order_total` keeps its name beside an
    /// `Order Total` of the same record.
    fn name_columns<'a>(&mut self, keys: impl Iterator<Item = &'a String> + Clone) {
        let new = |s: &Self, k: &String| s.column_of(k).is_none() && !k.starts_with("_orca_");
        let plain: Vec<&String> = keys
            .clone()
            .filter(|k| new(self, k) && column_name(k) == **k)
            .collect();
        for k in plain {
            self.name_column(k);
        }
        let rest: Vec<&String> = keys.filter(|k| new(self, k)).collect();
        for k in rest {
            self.name_column(k);
        }
    }

    /// The column types the definition declares, over the columns inferred
    /// so far: a declared column not seen yet joins (in name order, after
    /// those seen), and its values are coerced to its type from now on. A
    /// column the stream already delivered keeps its type unless the
    /// declared one widens it under `evolve`: the destination holds its
    /// values, which a narrower type could not.
    pub fn declaring(mut self, declared: &[(String, ColType)]) -> Result<Self, String> {
        self.name_columns(declared.iter().map(|(k, _)| k));
        for (key, t) in declared {
            let name = self.name_column(key);
            match self.columns.iter_mut().find(|(n, _)| *n == name) {
                None => self.columns.push((name.clone(), *t)),
                Some((_, have)) if *have == *t => {}
                Some((_, have)) if self.policy == Policy::Evolve && have.widen(*t) == *t => {
                    *have = *t;
                }
                Some((_, have)) => {
                    return Err(format!(
                        "column {key} was delivered as {} and is declared {}: a declared \
                         type may only widen a delivered column, under schema policy evolve",
                        have.name(),
                        t.name()
                    ))
                }
            }
            self.declared.insert(name, *t);
        }
        Ok(self)
    }

    /// A schema inferred before (from a checkpoint record), to widen on.
    pub fn inferred(columns: Vec<(String, ColType)>) -> Self {
        StreamSchema {
            columns,
            ..StreamSchema::default()
        }
    }

    /// The same schema writing `_orca_id` in `form`.
    pub fn with_ids(mut self, form: IdForm) -> Self {
        self.ids = form;
        self
    }

    /// The same schema under another policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    pub fn columns(&self) -> &[(String, ColType)] {
        &self.columns
    }

    fn widen(&mut self, name: &str, t: ColType) {
        match self.columns.iter_mut().find(|(n, _)| n == name) {
            Some((_, have)) => *have = have.widen(t),
            None => self.columns.push((name.to_string(), t)),
        }
    }

    /// The Arrow schema of the batches: the data columns, then the metadata.
    pub fn arrow(&self) -> Schema {
        let mut fields: Vec<Field> = self
            .columns
            .iter()
            .map(|(n, t)| Field::new(n, t.arrow(), true))
            .collect();
        fields.push(self.ids.field());
        fields.push(Field::new("_orca_seq", DataType::Int64, false));
        fields.push(Field::new(
            "_orca_synced_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ));
        Schema::new(fields)
    }
}

/// Coerces a value to a declared type, or says why it cannot be.
fn coerce(v: &Value, to: ColType) -> Result<Value, String> {
    let fail = || {
        format!(
            "{v} is not {}",
            match to {
                ColType::Bool => "a boolean",
                ColType::Int64 => "a 64-bit integer",
                ColType::Float64 => "a number",
                ColType::String => "text",
            }
        )
    };
    Ok(match (to, v) {
        (_, Value::Null) => Value::Null,
        (ColType::String, Value::String(_)) => v.clone(),
        (ColType::String, other) => Value::String(other.to_string()),
        (ColType::Bool, Value::Bool(_)) => v.clone(),
        (ColType::Bool, Value::String(s)) => match s.to_ascii_lowercase().as_str() {
            "true" | "t" | "1" => Value::Bool(true),
            "false" | "f" | "0" => Value::Bool(false),
            _ => return Err(fail()),
        },
        (ColType::Int64, Value::Number(n)) if n.is_i64() => v.clone(),
        (ColType::Int64, Value::Number(n)) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => return Err(fail()),
        },
        (ColType::Int64, Value::String(s)) => {
            Value::from(s.trim().parse::<i64>().map_err(|_| fail())?)
        }
        (ColType::Float64, Value::Number(_)) => v.clone(),
        (ColType::Float64, Value::String(s)) => {
            let f: f64 = s.trim().parse().map_err(|_| fail())?;
            if !f.is_finite() {
                return Err(fail());
            }
            Value::from(f)
        }
        _ => return Err(fail()),
    })
}

/// The stable id of a record: its stream and source position, as hex.
pub fn record_id(stream: &str, position: &str) -> String {
    let (a, b) = record_lanes(stream, position);
    crate::ids::text(a, b)
}

/// The two lanes of [`record_id`].
fn record_lanes(stream: &str, position: &str) -> (u64, u64) {
    // FNV-1a, 64 bits twice with different offsets: stable across builds and
    // platforms, which a std hasher is not.
    let fnv = |offset: u64| {
        let mut h = offset;
        for b in stream.bytes().chain([0u8]).chain(position.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    };
    (fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142))
}

/// Normalizes a chunk of a stream's records into one batch, widening the
/// stream's schema as it goes; returns the batch and what was set aside.
pub fn normalize(
    stream: &str,
    schema: &mut StreamSchema,
    rows: &[Raw],
    synced_at_us: i64,
) -> Result<(RecordBatch, Vec<Quarantined>), arrow_schema::ArrowError> {
    let mut taken: Vec<(&Raw, Map<String, Value>)> = Vec::with_capacity(rows.len());
    let mut quarantined = Vec::new();
    'rows: for raw in rows {
        let Value::Object(obj) = &raw.record else {
            quarantined.push(Quarantined {
                position: raw.position.clone(),
                record: raw.record.clone(),
                reason: format!("a record must be an object, got {}", kind(&raw.record)),
            });
            continue;
        };
        if let Some(k) = obj.keys().find(|k| k.starts_with("_orca_")) {
            quarantined.push(Quarantined {
                position: raw.position.clone(),
                record: raw.record.clone(),
                reason: format!("column {k} uses the reserved prefix _orca_"),
            });
            continue;
        }
        let frozen = schema.policy != Policy::Evolve && !schema.columns.is_empty();
        if !frozen {
            schema.name_columns(obj.keys());
        }
        let mut out = Map::new();
        for (k, v) in obj {
            let Some(col) = schema.column_of(k).map(str::to_string) else {
                if schema.policy == Policy::Discard {
                    continue;
                }
                quarantined.push(Quarantined {
                    position: raw.position.clone(),
                    record: raw.record.clone(),
                    reason: format!("column {k} is not in the stream's frozen schema"),
                });
                continue 'rows;
            };
            let declared = schema.declared.get(&col).copied();
            if frozen && declared.is_none() {
                // A declared column's value is coerced below instead.
                let have = schema
                    .columns
                    .iter()
                    .find(|(n, _)| *n == col)
                    .map(|(_, t)| *t);
                if let (Some(t), Some(vt)) = (have, ColType::of(v)) {
                    if t.widen(vt) != t {
                        quarantined.push(Quarantined {
                            position: raw.position.clone(),
                            record: raw.record.clone(),
                            reason: format!(
                                "column {k}: {v} does not fit its {} type under schema policy {:?}",
                                t.arrow(),
                                schema.policy
                            ),
                        });
                        continue 'rows;
                    }
                }
            }
            let v = match declared {
                Some(t) => match coerce(v, t) {
                    Ok(c) => c,
                    Err(why) => {
                        quarantined.push(Quarantined {
                            position: raw.position.clone(),
                            record: raw.record.clone(),
                            reason: format!("column {k}: {why}"),
                        });
                        continue 'rows;
                    }
                },
                None => v.clone(),
            };
            out.insert(col, v);
        }
        taken.push((raw, out));
    }
    for (_, obj) in &taken {
        for (k, v) in obj {
            if let Some(t) = ColType::of(v) {
                if !schema.declared.contains_key(k) {
                    schema.widen(k, t);
                }
            } else if !schema.columns.iter().any(|(n, _)| n == k) {
                // A column seen only as null so far: text until it says more.
                schema.widen(k, ColType::String);
            }
        }
    }
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (name, t) in &schema.columns {
        let values = taken
            .iter()
            .map(|(_, o)| o.get(name).unwrap_or(&Value::Null));
        columns.push(match t {
            ColType::Bool => {
                let mut b = BooleanBuilder::new();
                values.for_each(|v| b.append_option(v.as_bool()));
                Arc::new(b.finish())
            }
            ColType::Int64 => {
                let mut b = Int64Builder::new();
                values.for_each(|v| b.append_option(v.as_i64()));
                Arc::new(b.finish())
            }
            ColType::Float64 => {
                let mut b = Float64Builder::new();
                values.for_each(|v| b.append_option(v.as_f64()));
                Arc::new(b.finish())
            }
            ColType::String => {
                let mut b = StringBuilder::new();
                values.for_each(|v| match v {
                    Value::Null => b.append_null(),
                    Value::String(s) => b.append_value(s),
                    other => b.append_value(other.to_string()),
                });
                Arc::new(b.finish())
            }
        });
    }
    let mut ids = FixedSizeBinaryBuilder::new(crate::ids::ID_BYTES);
    let mut seqs = Int64Builder::new();
    for (raw, _) in &taken {
        let (a, b) = record_lanes(stream, &raw.position);
        ids.append_value(crate::ids::bytes(a, b))?;
        seqs.append_value(raw.seq);
    }
    // A stream recorded with hex ids keeps them.
    let ids = crate::ids::conform(Arc::new(ids.finish()), &schema.ids.data_type())
        .map_err(|e| arrow_schema::ArrowError::InvalidArgumentError(e.to_string()))?;
    columns.push(ids);
    columns.push(Arc::new(seqs.finish()));
    columns.push(Arc::new(
        TimestampMicrosecondArray::from(vec![synced_at_us; taken.len()]).with_timezone("UTC"),
    ));
    let batch = RecordBatch::try_new(Arc::new(schema.arrow()), columns)?;
    Ok((batch, quarantined))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn frozen_and_discarding_schemas_quarantine_what_does_not_fit() {
        use super::*;
        let raw = |p: &str, v: Value| Raw {
            position: p.into(),
            seq: 0,
            record: v,
        };
        let first = [raw("1", serde_json::json!({"id": 1, "name": "a"}))];
        let later = [
            raw(
                "2",
                serde_json::json!({"id": 2, "name": "b", "extra": true}),
            ),
            raw("3", serde_json::json!({"id": 3.5, "name": "c"})),
            raw("4", serde_json::json!({"id": 4})),
        ];
        let mut frozen = StreamSchema::default().with_policy(Policy::Freeze);
        normalize("s", &mut frozen, &first, 0).expect("first");
        let (b, q) = normalize("s", &mut frozen, &later, 0).expect("later");
        assert_eq!(b.num_rows(), 1, "only the record that fits");
        assert!(q[0]
            .reason
            .contains("column extra is not in the stream's frozen schema"));
        assert!(
            q[1].reason
                .contains("column id: 3.5 does not fit its Int64 type"),
            "{}",
            q[1].reason
        );
        assert_eq!(frozen.columns().len(), 2);

        let mut discard = StreamSchema::default().with_policy(Policy::Discard);
        normalize("s", &mut discard, &first, 0).expect("first");
        let (b, q) = normalize("s", &mut discard, &later, 0).expect("later");
        assert_eq!(b.num_rows(), 2, "extra dropped, the record kept");
        assert_eq!(q.len(), 1);
        assert_eq!(discard.columns().len(), 2, "no extra column");
    }

    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type};
    use serde_json::json;

    use super::*;

    fn raw(i: i64, v: Value) -> Raw {
        Raw {
            position: format!("file-1:{i}"),
            seq: i,
            record: v,
        }
    }

    #[test]
    fn the_schema_widens_and_never_narrows() {
        let mut s = StreamSchema::default();
        let (b, q) = normalize(
            "orders",
            &mut s,
            &[
                raw(1, json!({"id": 1, "amount": 10})),
                raw(2, json!({"id": 2, "amount": 2.5})),
            ],
            0,
        )
        .expect("batch");
        assert!(q.is_empty());
        assert_eq!(
            s.columns(),
            [
                ("amount".to_string(), ColType::Float64),
                ("id".to_string(), ColType::Int64)
            ]
        );
        let amount = b.column(0).as_primitive::<Float64Type>();
        assert_eq!(amount.value(0), 10.0);
        // A later chunk with text in amount makes it text; id stays an integer.
        let (b, _) = normalize(
            "orders",
            &mut s,
            &[raw(3, json!({"id": 3, "amount": "n/a", "note": {"a": 1}}))],
            0,
        )
        .expect("batch");
        assert_eq!(s.columns()[0], ("amount".to_string(), ColType::String));
        assert_eq!(s.columns()[1], ("id".to_string(), ColType::Int64));
        assert_eq!(s.columns()[2], ("note".to_string(), ColType::String));
        assert_eq!(b.column(2).as_string::<i32>().value(0), "{\"a\":1}");
        // A chunk back to numbers does not narrow it again.
        normalize(
            "orders",
            &mut s,
            &[raw(4, json!({"id": 4, "amount": 1}))],
            0,
        )
        .expect("batch");
        assert_eq!(s.columns()[0].1, ColType::String);
        assert_eq!(ColType::Bool.widen(ColType::Int64), ColType::String);
    }

    #[test]
    fn declared_types_coerce_or_quarantine_with_a_reason() {
        let mut s = StreamSchema::default()
            .declaring(&[
                ("id".to_string(), ColType::Int64),
                ("paid".to_string(), ColType::Bool),
            ])
            .expect("a new stream takes any declaration");
        let rows = [
            raw(1, json!({"id": "7", "paid": "true"})),
            raw(2, json!({"id": "seven", "paid": true})),
            raw(3, json!([1, 2])),
            raw(4, json!({"id": 9, "_orca_id": "x"})),
            raw(5, json!({"id": 2.0, "paid": null})),
        ];
        let (b, q) = normalize("orders", &mut s, &rows, 1_700_000_000_000_000).expect("batch");
        assert_eq!(b.num_rows(), 2);
        let ids = b.column(0).as_primitive::<Int64Type>();
        assert_eq!((ids.value(0), ids.value(1)), (7, 2));
        let reasons: Vec<&str> = q.iter().map(|x| x.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "column id: \"seven\" is not a 64-bit integer",
                "a record must be an object, got an array",
                "column _orca_id uses the reserved prefix _orca_",
            ]
        );
        assert_eq!(q[0].position, "file-1:2");
    }

    #[test]
    fn a_declaration_over_delivered_columns_may_only_widen_them() {
        let delivered = || {
            StreamSchema::inferred(vec![
                ("amount".to_string(), ColType::Int64),
                ("note".to_string(), ColType::String),
            ])
        };
        // Widening under evolve: amount becomes float64; a new declared
        // column joins after the delivered ones.
        let s = delivered()
            .declaring(&[
                ("amount".to_string(), ColType::Float64),
                ("zone".to_string(), ColType::Int64),
            ])
            .expect("widens");
        assert_eq!(
            s.columns(),
            [
                ("amount".to_string(), ColType::Float64),
                ("note".to_string(), ColType::String),
                ("zone".to_string(), ColType::Int64),
            ]
        );
        let e = delivered()
            .declaring(&[("note".to_string(), ColType::Int64)])
            .expect_err("narrowing is refused");
        assert_eq!(
            e,
            "column note was delivered as string and is declared int64: a declared type may \
             only widen a delivered column, under schema policy evolve"
        );
        let e = delivered()
            .with_policy(Policy::Freeze)
            .declaring(&[("amount".to_string(), ColType::Float64)])
            .expect_err("a frozen column does not widen");
        assert!(e.contains("column amount was delivered as int64"), "{e}");

        // Declared and frozen: the declared columns are the schema, and a
        // value is coerced before it is judged.
        let mut strict = StreamSchema::default()
            .with_policy(Policy::Freeze)
            .declaring(&[("qty".to_string(), ColType::Int64)])
            .expect("declared");
        let (b, q) = normalize(
            "orders",
            &mut strict,
            &[
                raw(1, json!({"qty": "3"})),
                raw(2, json!({"qty": 4, "extra": true})),
            ],
            1,
        )
        .expect("batch");
        assert_eq!(b.num_rows(), 1);
        assert_eq!(q.len(), 1);
        assert_eq!(
            q[0].reason,
            "column extra is not in the stream's frozen schema"
        );
    }

    #[test]
    fn keys_become_column_names_lowercase_and_safe() {
        for (key, column) in [
            ("Order Total", "order_total"),
            ("userId", "user_id"),
            ("amount", "amount"),
            ("2nd", "_2nd"),
            ("a--b", "a_b"),
            ("price ($)", "price"),
            ("", "column"),
            ("!!", "column"),
            ("_ORCA_id", "c_orca_id"),
            ("_private", "_private"),
            ("Ünïcode Straße", "ünïcode_straße"),
        ] {
            assert_eq!(column_name(key), column, "{key:?}");
        }
        let long = "x".repeat(100);
        assert_eq!(column_name(&long).len(), 63);
        assert_eq!(column_name(&"é".repeat(40)).len(), 62, "cut at a character");
    }

    #[test]
    fn a_column_is_named_once_collisions_get_a_suffix_and_old_names_stay() {
        let mut s = StreamSchema::default();
        let rows = [
            raw(1, json!({"Order Total": 1, "order_total": 2, "userId": 3})),
            raw(2, json!({"ORDER-TOTAL": 4})),
        ];
        let (b, q) = normalize("orders", &mut s, &rows, 1).expect("batch");
        assert!(q.is_empty(), "{q:?}");
        let names: Vec<String> = b
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        // The key already in its normal form keeps its name beside the one
        // that normalizes to it.
        assert_eq!(
            names[..4],
            ["order_total", "order_total_2", "user_id", "order_total_3"]
        );
        let total = b.column(0).as_primitive::<Int64Type>();
        let spaced = b.column(1).as_primitive::<Int64Type>();
        assert_eq!((total.value(0), spaced.value(0)), (2, 1));
        assert_eq!(
            s.renamed().clone(),
            BTreeMap::from([
                ("ORDER-TOTAL".to_string(), "order_total_3".to_string()),
                ("Order Total".to_string(), "order_total_2".to_string()),
                ("userId".to_string(), "user_id".to_string()),
            ])
        );
        // The next attempt, from the checkpoint's columns and names, names
        // every key as before, whatever order the keys come in now.
        let mut again =
            StreamSchema::inferred(s.columns().to_vec()).with_names(s.renamed().clone());
        let (b2, _) = normalize(
            "orders",
            &mut again,
            &[raw(
                3,
                json!({"userId": 5, "ORDER-TOTAL": 6, "order_total": 7, "Order Total": 8}),
            )],
            2,
        )
        .expect("batch");
        let names2: Vec<String> = b2
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names2[..4], names[..4]);
        assert_eq!(b2.column(3).as_primitive::<Int64Type>().value(0), 6);
        // A column an older engine named after its key as it was (before
        // names were normalized) keeps that name.
        let mut old = StreamSchema::inferred(vec![("Order Total".to_string(), ColType::Int64)]);
        let (b3, _) =
            normalize("orders", &mut old, &[raw(4, json!({"Order Total": 9}))], 3).expect("batch");
        assert_eq!(b3.schema().field(0).name(), "Order Total");
        assert!(old.renamed().is_empty());
    }

    #[test]
    fn metadata_columns_are_stable_per_record() {
        let mut s = StreamSchema::default();
        let (a, _) = normalize("orders", &mut s, &[raw(1, json!({"x": 1}))], 5).expect("a");
        let (b, _) = normalize("orders", &mut s, &[raw(1, json!({"x": 2}))], 6).expect("b");
        let id = |r: &RecordBatch| {
            r.column_by_name("_orca_id")
                .map(|c| crate::ids::text_at(c.as_ref(), 0))
        };
        assert_eq!(id(&a), id(&b), "the same position is the same record");
        // A new stream's ids are bytes; one recorded with hex keeps hex, and
        // both are the same id.
        assert_eq!(
            a.schema()
                .field_with_name("_orca_id")
                .map(|f| f.data_type().clone())
                .ok(),
            Some(IdForm::Bytes.data_type())
        );
        let mut old = StreamSchema::default().with_ids(IdForm::Hex);
        let (h, _) = normalize("orders", &mut old, &[raw(1, json!({"x": 1}))], 5).expect("hex");
        let hex = h
            .column_by_name("_orca_id")
            .map(|c| c.as_string::<i32>().value(0).to_string());
        assert_eq!(hex, id(&a));
        assert_eq!(
            hex.as_deref(),
            Some(record_id("orders", "file-1:1").as_str())
        );
        assert_ne!(
            record_id("orders", "file-1:1"),
            record_id("users", "file-1:1")
        );
        assert_eq!(record_id("orders", "p").len(), 32);
        let seq = a
            .column_by_name("_orca_seq")
            .map(|c| c.as_primitive::<Int64Type>().value(0));
        assert_eq!(seq, Some(1));
    }
}
