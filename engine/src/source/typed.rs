//! Typed columns from Arrow (Parquet files, Iceberg tables): the kinds a
//! Postgres table's columns travel as, which an Arrow type becomes, a batch
//! conformed to a stream's columns, and a chunk of rows named by their
//! file and row.

use std::sync::Arc;

use arrow_array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray};
use arrow_cast::cast::{can_cast_types, cast_with_options, CastOptions};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::DataType;
use orca_core::sync::Stream;

use crate::source::error::ReadError;
use crate::source::msg::Msg;
use crate::source::normalize::record_id;
use crate::source::postgres::copy::{PgColumn, PgKind};
use crate::source::postgres::table::{PgTable, StreamSpec};

/// The kind an Arrow column travels as: the types a Postgres column
/// travels in, widened where Arrow has more (unsigned integers, half
/// floats, other units of time); what none holds (lists, structs, maps,
/// times of day, intervals) travels as its text.
pub(crate) fn kind_of(t: &DataType) -> PgKind {
    match t {
        DataType::Boolean => PgKind::Bool,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => PgKind::Int2,
        DataType::Int32 | DataType::UInt16 => PgKind::Int4,
        DataType::Int64 | DataType::UInt32 => PgKind::Int8,
        DataType::UInt64 => PgKind::Numeric {
            precision: 20,
            scale: 0,
        },
        DataType::Float16 | DataType::Float32 => PgKind::Float4,
        DataType::Float64 => PgKind::Float8,
        DataType::Decimal32(p, s) | DataType::Decimal64(p, s) | DataType::Decimal128(p, s) => {
            PgKind::Numeric {
                precision: *p,
                scale: *s,
            }
        }
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => PgKind::Bytea,
        DataType::Date32 | DataType::Date64 => PgKind::Date,
        DataType::Timestamp(_, None) => PgKind::Timestamp,
        DataType::Timestamp(_, Some(_)) => PgKind::TimestampTz,
        DataType::Dictionary(_, values) => kind_of(values),
        _ => PgKind::Text,
    }
}

/// The SQL name of a kind, as a table's catalog would give it.
pub(crate) fn sql_type(k: PgKind) -> String {
    match k {
        PgKind::Bool => "boolean".into(),
        PgKind::Int2 => "smallint".into(),
        PgKind::Int4 => "integer".into(),
        PgKind::Int8 => "bigint".into(),
        PgKind::Float4 => "real".into(),
        PgKind::Float8 => "double precision".into(),
        PgKind::Text => "text".into(),
        PgKind::Jsonb => "jsonb".into(),
        PgKind::Bytea => "bytea".into(),
        PgKind::Date => "date".into(),
        PgKind::Timestamp => "timestamp without time zone".into(),
        PgKind::TimestampTz => "timestamp with time zone".into(),
        PgKind::Uuid => "uuid".into(),
        PgKind::Numeric { precision, scale } => format!("numeric({precision},{scale})"),
    }
}

/// The kind that holds both, for a column two files give different types:
/// a wider integer, a float for integers and floats; None for anything
/// else.
pub(crate) fn widen(a: PgKind, b: PgKind) -> Option<PgKind> {
    use PgKind::*;
    let rank = |k: PgKind| match k {
        Int2 => Some(1),
        Int4 => Some(2),
        Int8 => Some(3),
        Float4 => Some(4),
        Float8 => Some(5),
        _ => None,
    };
    if a == b {
        return Some(a);
    }
    match (rank(a)?, rank(b)?) {
        (x, y) if x <= 3 && y <= 3 => Some(if x > y { a } else { b }),
        (4, 4) => Some(Float4),
        _ => Some(Float8),
    }
}

/// The columns of one schema as a stream's, each nullable, but for those
/// with the engine's reserved prefix `_orca_` (an earlier sync's own).
pub(crate) fn columns_of(schema: &arrow_schema::Schema) -> Vec<PgColumn> {
    schema
        .fields()
        .iter()
        .filter(|f| !f.name().starts_with("_orca_"))
        .map(|f| PgColumn {
            name: f.name().clone(),
            kind: kind_of(f.data_type()),
            nullable: true,
        })
        .collect()
}

/// A typed stream's table: its columns, read from `what` (a pattern, a
/// table of the lake), without a cursor or a key of its own (its resume
/// point is its reader's).
pub(crate) fn table_of(stream: &Stream, what: &str, columns: Vec<PgColumn>) -> PgTable {
    let n = columns.len();
    PgTable {
        spec: StreamSpec {
            name: stream.name.clone(),
            table: what.to_string(),
            cursor: String::new(),
            primary_key: stream.primary_key.clone(),
            schema_policy: stream.schema_policy,
            lookback: None,
            cdc: false,
            splits: None,
        },
        sql_types: columns.iter().map(|c| sql_type(c.kind)).collect(),
        columns,
        as_text: vec![false; n],
        key: Vec::new(),
        ids: crate::ids::IdForm::default(),
    }
}

/// A batch's columns as the stream's: each cast to its kind's type (a
/// value that does not fit is an error naming it, never a silent null),
/// one the file lacks as nulls, one that travels as text formatted.
pub(crate) fn conform(
    batch: &RecordBatch,
    table: &PgTable,
    file: &str,
) -> Result<Vec<ArrayRef>, ReadError> {
    let strict = CastOptions {
        safe: false,
        ..CastOptions::default()
    };
    let fail = |column: &str, reason: String| ReadError::Stream {
        stream: table.spec.name.clone(),
        reason: format!("{file}: column {column}: {reason}"),
    };
    table
        .columns
        .iter()
        .map(|c| {
            let want = c.kind.data_type();
            let Some(a) = batch.column_by_name(&c.name) else {
                return Ok(new_null_array(&want, batch.num_rows()));
            };
            if a.data_type() == &want {
                return Ok(a.clone());
            }
            if c.kind == PgKind::Text && !can_cast_types(a.data_type(), &want) {
                let opts = FormatOptions::default();
                let f = ArrayFormatter::try_new(a.as_ref(), &opts)
                    .map_err(|e| fail(&c.name, e.to_string()))?;
                let text: StringArray = (0..a.len())
                    .map(|i| a.is_valid(i).then(|| f.value(i).to_string()))
                    .collect();
                return Ok(Arc::new(text) as ArrayRef);
            }
            cast_with_options(a, &want, &strict).map_err(|e| {
                fail(
                    &c.name,
                    format!("{} does not fit {}: {e}", a.data_type(), sql_type(c.kind)),
                )
            })
        })
        .collect()
}

/// A batch read from `file`, its first row `row`, as a chunk of the
/// stream: its columns conformed, each row's `_orca_id` made from the
/// file and row, and the resume point `last` gives for the row after it.
pub(crate) fn chunk_of(
    table: &PgTable,
    batch: &RecordBatch,
    file: &str,
    row: usize,
    last: impl FnOnce(usize) -> Vec<String>,
) -> Result<Msg, ReadError> {
    let rows = batch.num_rows();
    let arrays = conform(batch, table, file)?;
    let name = &table.spec.name;
    let ids: StringArray = (row..row + rows)
        .map(|r| Some(record_id(name, &format!("{file}\u{1f}{r}"))))
        .collect();
    Ok(Msg::Chunk {
        arrays,
        ids: Arc::new(ids),
        last: last(row + rows),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrow_types_travel_as_the_kinds_a_table_would() {
        use arrow_schema::TimeUnit;
        for (t, k) in [
            (DataType::Int32, PgKind::Int4),
            (DataType::UInt32, PgKind::Int8),
            (
                DataType::UInt64,
                PgKind::Numeric {
                    precision: 20,
                    scale: 0,
                },
            ),
            (DataType::LargeUtf8, PgKind::Text),
            (
                DataType::Timestamp(TimeUnit::Nanosecond, Some("+02:00".into())),
                PgKind::TimestampTz,
            ),
            (
                DataType::Timestamp(TimeUnit::Millisecond, None),
                PgKind::Timestamp,
            ),
            (DataType::Date64, PgKind::Date),
            (
                DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
                PgKind::Text,
            ),
            (
                DataType::List(Arc::new(arrow_schema::Field::new(
                    "x",
                    DataType::Int64,
                    true,
                ))),
                PgKind::Text,
            ),
        ] {
            assert_eq!(kind_of(&t), k, "{t}");
        }
    }

    #[test]
    fn integers_and_floats_widen_and_nothing_else_does() {
        use PgKind::*;
        assert_eq!(widen(Int2, Int8), Some(Int8));
        assert_eq!(widen(Int8, Int4), Some(Int8));
        assert_eq!(widen(Int8, Float4), Some(Float8));
        assert_eq!(widen(Float4, Float4), Some(Float4));
        assert_eq!(widen(Float4, Float8), Some(Float8));
        assert_eq!(widen(Text, Text), Some(Text));
        assert_eq!(widen(Int8, Text), None);
        assert_eq!(widen(Timestamp, TimestampTz), None);
    }
}
