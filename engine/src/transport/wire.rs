//! What a batch on the data edge looks like: a typed source's columns and
//! `_orca_id` last, or a files source's raw records as text columns.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::{ArrowError, DataType, Field, Schema};

use crate::source::msg::{RawChunk, RawRecords};
use crate::source::normalize::Raw;

/// The `_orca_id` column of a typed batch on the edge.
pub use crate::ids::ORCA_ID;

/// The columns of a raw batch on the edge.
pub fn raw_schema() -> Schema {
    Schema::new(vec![
        Field::new("position", DataType::Utf8, false),
        Field::new("record", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, true),
    ])
}

/// A files chunk as a batch of raw records, and its resume point.
pub(crate) fn raw_batch(chunk: RawChunk) -> Result<(RecordBatch, Vec<String>), ArrowError> {
    let n = chunk.records.len();
    let (mut position, mut record, mut error) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for r in &chunk.records {
        let (raw, why) = match r {
            Ok(raw) => (raw, None),
            Err((raw, why)) => (raw, Some(why.as_str())),
        };
        position.push(raw.position.as_str());
        record.push(raw.record.to_string());
        error.push(why);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(position)),
        Arc::new(StringArray::from(record)),
        Arc::new(StringArray::from(error)),
    ];
    let batch = RecordBatch::try_new(Arc::new(raw_schema()), columns)?;
    Ok((batch, chunk.last))
}

/// Raw records back from a batch on the edge.
pub(crate) fn raw_records(batch: &RecordBatch) -> Result<RawRecords, String> {
    let col = |name: &str| {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| format!("a raw batch has no text column {name:?}"))
    };
    let (position, record, error) = (col("position")?, col("record")?, col("error")?);
    (0..batch.num_rows())
        .map(|i| {
            let raw = Raw {
                position: position.value(i).to_string(),
                seq: 0,
                record: serde_json::from_str(record.value(i))
                    .map_err(|e| format!("record at {}: {e}", position.value(i)))?,
            };
            Ok(if error.is_null(i) {
                Ok(raw)
            } else {
                Err((raw, error.value(i).to_string()))
            })
        })
        .collect()
}
