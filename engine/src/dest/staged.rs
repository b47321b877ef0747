//! Reading staged Parquet files back, for a destination that loads rows
//! rather than files.

use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::commit::record::Staged;
use crate::commit::store::Store;
use crate::dest::error::DestError;

/// The batches of a stream's staged files, lane after lane.
pub(super) fn read_all(
    staging: &Store,
    staged: &[&Staged],
) -> Result<Vec<arrow_array::RecordBatch>, DestError> {
    let mut out = Vec::new();
    for s in staged {
        out.extend(read_staged(staging, s)?);
    }
    Ok(out)
}

/// The batches of a staged Parquet file.
fn read_staged(staging: &Store, s: &Staged) -> Result<Vec<arrow_array::RecordBatch>, DestError> {
    read_parquet(staging, &s.path)
}

/// The batches of a Parquet file in a store.
pub(super) fn read_parquet(
    store: &Store,
    path: &str,
) -> Result<Vec<arrow_array::RecordBatch>, DestError> {
    let data: Bytes = store.get(path)?.ok_or_else(|| DestError::StagedGone {
        path: store.url_of(path),
    })?;
    Ok(ParquetRecordBatchReaderBuilder::try_new(data)?
        .build()?
        .collect::<Result<Vec<_>, _>>()?)
}
