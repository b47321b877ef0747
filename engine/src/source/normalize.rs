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

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use orca_core::sync::SchemaPolicy;
use serde_json::{Map, Value};

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
    columns: Vec<(String, ColType)>,
    /// Types the source declared; values are coerced to them.
    declared: BTreeMap<String, ColType>,
    policy: Policy,
}

impl StreamSchema {
    pub fn with_declared(declared: impl IntoIterator<Item = (String, ColType)>) -> Self {
        let declared: BTreeMap<String, ColType> = declared.into_iter().collect();
        StreamSchema {
            columns: declared.iter().map(|(n, t)| (n.clone(), *t)).collect(),
            declared,
            policy: Policy::Evolve,
        }
    }

    /// A schema inferred before (from a checkpoint record), to widen on.
    pub fn inferred(columns: Vec<(String, ColType)>) -> Self {
        StreamSchema {
            columns,
            declared: BTreeMap::new(),
            policy: Policy::Evolve,
        }
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
        fields.push(Field::new("_orca_id", DataType::Utf8, false));
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

/// The stable id of a record: its stream and source position.
pub fn record_id(stream: &str, position: &str) -> String {
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
    crate::util::id_text(fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142))
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
        let mut out = Map::new();
        for (k, v) in obj {
            if k.starts_with("_orca_") {
                quarantined.push(Quarantined {
                    position: raw.position.clone(),
                    record: raw.record.clone(),
                    reason: format!("column {k} uses the reserved prefix _orca_"),
                });
                continue 'rows;
            }
            if schema.policy != Policy::Evolve && !schema.columns.is_empty() {
                let have = schema.columns.iter().find(|(n, _)| n == k).map(|(_, t)| *t);
                match (have, ColType::of(v)) {
                    (None, _) if schema.policy == Policy::Discard => continue,
                    (None, _) => {
                        quarantined.push(Quarantined {
                            position: raw.position.clone(),
                            record: raw.record.clone(),
                            reason: format!("column {k} is not in the stream's frozen schema"),
                        });
                        continue 'rows;
                    }
                    (Some(t), Some(vt)) if t.widen(vt) != t => {
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
                    _ => {}
                }
            }
            let v = match schema.declared.get(k) {
                Some(t) => match coerce(v, *t) {
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
            out.insert(k.clone(), v);
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
    let mut ids = StringBuilder::new();
    let mut seqs = Int64Builder::new();
    for (raw, _) in &taken {
        ids.append_value(record_id(stream, &raw.position));
        seqs.append_value(raw.seq);
    }
    columns.push(Arc::new(ids.finish()));
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
        let mut s = StreamSchema::with_declared([
            ("id".to_string(), ColType::Int64),
            ("paid".to_string(), ColType::Bool),
        ]);
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
    fn metadata_columns_are_stable_per_record() {
        let mut s = StreamSchema::default();
        let (a, _) = normalize("orders", &mut s, &[raw(1, json!({"x": 1}))], 5).expect("a");
        let (b, _) = normalize("orders", &mut s, &[raw(1, json!({"x": 2}))], 6).expect("b");
        let id = |r: &RecordBatch| {
            r.column_by_name("_orca_id")
                .map(|c| c.as_string::<i32>().value(0).to_string())
        };
        assert_eq!(id(&a), id(&b), "the same position is the same record");
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
