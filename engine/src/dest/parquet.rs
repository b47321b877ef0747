//! The parquet destination: staged Parquet files published per epoch.
//!
//! Lane 0 commits epoch N of a stream by copying (on one local file system,
//! hard-linking) its staged files to
//! `{stream}/part-{N}.parquet` (writer lane 0's; lane k's to
//! `part-{N}-{k}.parquet`) and then writing the stream marker
//! `{stream}/_orca_epoch` = N. Both are idempotent, so a commit retried, or
//! applied again by the next attempt's recovery, changes nothing. The fence
//! `_orca_fence` holds the newest generation that recovered; a commit from an
//! older one is refused.

use std::collections::HashSet;

use arrow_array::{Array, RecordBatch, UInt32Array};
use arrow_row::{RowConverter, SortField};
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::commit::record::{Refresh, Staged};
use crate::commit::store::Store;
use crate::dest::error::DestError;

/// Encodes a batch as one Parquet file.
pub fn encode(batch: &RecordBatch) -> Result<Bytes, DestError> {
    // `_orca_id` is unique per row and random: a dictionary of it would be
    // built only to be thrown away, snappy cannot shrink it, and its
    // min/max prune nothing.
    let id = || ColumnPath::from("_orca_id");
    let mut props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(1 << 20))
        .set_column_dictionary_enabled(id(), false)
        .set_column_compression(id(), Compression::UNCOMPRESSED)
        .set_column_statistics_enabled(id(), EnabledStatistics::None);
    if let Some(at) = sample_rows(batch.num_rows()) {
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            // `_orca_id` has no dictionary already.
            if field.name() != "_orca_id" && nearly_unique(column.as_ref(), &at) {
                let path = ColumnPath::from(field.name().as_str());
                props = props.set_column_dictionary_enabled(path, false);
            }
        }
    }
    let props = props.build();
    let mut w = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props))?;
    w.write(batch)?;
    Ok(Bytes::from(w.into_inner()?))
}

/// Rows sampled to judge a column's values.
const SAMPLE: usize = 4096;

/// The rows of a batch of `rows` sampled to judge its columns, spread in
/// an order unrelated to the batch's own (a step coprime with the length
/// visits each row once): a strided sample of sorted values would step over
/// their repeats. None for a small batch, which keeps the writer's default.
fn sample_rows(rows: usize) -> Option<UInt32Array> {
    if rows < 2 * SAMPLE {
        return None;
    }
    let mut step = rows * 5 / 8;
    while gcd(step, rows) != 1 {
        step -= 1;
    }
    Some(UInt32Array::from_iter_values(
        (0..SAMPLE).map(|i| ((i * step) % rows) as u32),
    ))
}

/// Whether a column's values hardly repeat (99 % of the sampled rows `at`
/// distinct): ids, hashes, documents, measures. Parquet's writer would
/// intern them into a dictionary until it passes a megabyte (for 8- or
/// 16-byte values, most of a batch) and then fall back to plain encoding;
/// a dictionary of unique values is no smaller than the values. Nested
/// columns (several Parquet columns each) and mostly null ones keep the
/// writer's default.
fn nearly_unique(column: &dyn Array, at: &UInt32Array) -> bool {
    if column.data_type().is_nested() || column.null_count() * 2 > column.len() {
        return false;
    }
    let Ok(sample) = arrow_select::take::take(column, at, None) else {
        return false;
    };
    let Ok(converter) = RowConverter::new(vec![SortField::new(column.data_type().clone())]) else {
        return false;
    };
    let Ok(sampled) = converter.convert_columns(&[sample]) else {
        return false;
    };
    let distinct: HashSet<_> = sampled.iter().collect();
    distinct.len() * 100 >= at.len() * 99
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

pub struct ParquetDest {
    pub store: Store,
}

const FENCE: &str = "_orca_fence";

impl ParquetDest {
    fn number<T: std::str::FromStr>(&self, rel: &str) -> Result<Option<T>, DestError> {
        match self.store.get(rel)? {
            None => Ok(None),
            Some(b) => {
                let text = String::from_utf8_lossy(&b).trim().to_string();
                text.parse().map(Some).map_err(|_| DestError::Garbled {
                    path: self.store.url_of(rel),
                    text,
                })
            }
        }
    }

    /// The last epoch applied to a stream (0: none).
    pub fn marker(&self, stream: &str) -> Result<u64, DestError> {
        Ok(self.number(&format!("{stream}/_orca_epoch"))?.unwrap_or(0))
    }

    /// Refuses a generation older than the fence.
    fn fence_allows(&self, generation: i32) -> Result<(), DestError> {
        let fence: i32 = self.number(FENCE)?.unwrap_or(0);
        if fence > generation {
            return Err(DestError::Fenced {
                fence,
                mine: generation,
            });
        }
        Ok(())
    }

    /// Raises the fence to `generation`; an older generation finds it raised.
    pub fn raise_fence(&self, generation: i32) -> Result<(), DestError> {
        self.fence_allows(generation)?;
        self.store.put(FENCE, Bytes::from(generation.to_string()))?;
        Ok(())
    }

    /// Makes a stream's epoch visible: its staged files (none if it read no
    /// rows), then its marker. A stream being refreshed publishes into
    /// `{stream}/_refresh/` (hidden from dataset readers by its `_`) instead;
    /// the refresh's last epoch moves those files in and deletes the parts
    /// of the refresh before.
    pub fn apply(
        &self,
        staging: &Store,
        generation: i32,
        epoch: u64,
        stream: &str,
        staged: &[&Staged],
        refresh: Option<Refresh>,
    ) -> Result<(), DestError> {
        self.fence_allows(generation)?;
        if self.marker(stream)? >= epoch {
            return Ok(());
        }
        let shadow = format!("{stream}/_refresh");
        let dir = match refresh {
            Some(_) => shadow.as_str(),
            None => stream,
        };
        if refresh.is_some_and(|r| r.begins) {
            // Whatever a refresh before left is not part of this one.
            for f in self.store.list(&shadow)? {
                self.store.delete(&f)?;
            }
        }
        for s in staged {
            let name = match s.lane {
                0 => format!("{dir}/part-{epoch:010}.parquet"),
                lane => format!("{dir}/part-{epoch:010}-{lane}.parquet"),
            };
            // Staged files are immutable: a local store links them rather
            // than writing their bytes again.
            if !self.store.put_from(staging, &s.path, &name)? {
                return Err(DestError::StagedGone {
                    path: staging.url_of(&s.path),
                });
            }
        }
        let fresh = match refresh {
            Some(r) if r.ends => self.swap_in(stream, &shadow)?,
            _ => Vec::new(),
        };
        // Asked again just before the marker moves: a newer attempt may have
        // claimed (and applied later epochs) while the files were copied, and
        // the marker must not go back. The store has no compare-and-swap on
        // a plain object, so this narrows the window rather than closing it.
        self.fence_allows(generation)?;
        if self.marker(stream)? >= epoch {
            return Ok(());
        }
        self.store.put(
            &format!("{stream}/_orca_epoch"),
            Bytes::from(epoch.to_string()),
        )?;
        // Only once the marker says the refresh is in: until then a retry
        // needs the shadow's files.
        for f in fresh {
            self.store.delete(&f)?;
        }
        Ok(())
    }

    /// Puts a finished refresh's files in place of the stream's parts;
    /// returns the shadow's files, to delete once the marker moved. Every
    /// step can be done again.
    fn swap_in(&self, stream: &str, shadow: &str) -> Result<Vec<String>, DestError> {
        let fresh = self.store.list(shadow)?;
        let mut names = std::collections::BTreeSet::new();
        for f in &fresh {
            let Some(name) = f.rsplit('/').next() else {
                continue;
            };
            let data = self.store.get(f)?.ok_or_else(|| DestError::StagedGone {
                path: self.store.url_of(f),
            })?;
            self.store.put(&format!("{stream}/{name}"), data)?;
            names.insert(name.to_string());
        }
        let prefix = format!("{stream}/");
        for f in self.store.list(stream)? {
            let Some(name) = f.strip_prefix(&prefix) else {
                continue;
            };
            let part = name.starts_with("part-") && name.ends_with(".parquet");
            if part && !name.contains('/') && !names.contains(name) {
                self.store.delete(&f)?;
            }
        }
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    use super::*;

    #[test]
    fn columns_of_unique_values_are_written_without_a_dictionary() {
        let rows = 20_000;
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from_iter_values(0..rows)) as _),
            (
                "city",
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("city-{}", i % 50)),
                )) as _,
            ),
            (
                "doc",
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("{{\"n\": {i}, \"tag\": \"t{}\"}}", i % 7)),
                )) as _,
            ),
            // Each value twice: a dictionary halves it, so it keeps one.
            (
                "pair",
                Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i / 2))) as _,
            ),
        ])
        .expect("batch");
        let bytes = encode(&batch).expect("encoded");
        let reader = SerializedFileReader::new(bytes.clone()).expect("parquet");
        let group = reader.metadata().row_group(0);
        let dictionary = |name: &str| {
            let c = group
                .columns()
                .iter()
                .find(|c| c.column_path().string() == name)
                .expect("column");
            c.dictionary_page_offset().is_some()
        };
        assert!(!dictionary("id"), "a unique id needs no dictionary");
        assert!(!dictionary("doc"), "unique documents need no dictionary");
        assert!(dictionary("city"), "50 cities keep their dictionary");
        assert!(
            dictionary("pair"),
            "values that repeat keep their dictionary"
        );
        // The values read back as they were written.
        let back: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .expect("reader")
            .build()
            .expect("reader")
            .collect::<Result<_, _>>()
            .expect("batches");
        let back = arrow_select::concat::concat_batches(&batch.schema(), &back).expect("concat");
        assert_eq!(back, batch);
    }

    #[test]
    fn a_small_batch_keeps_the_writers_default() {
        assert!(sample_rows(100).is_none());
        let rows = 4 * SAMPLE;
        let at = sample_rows(rows).expect("a sample of a big batch");
        let a = Int64Array::from_iter_values(0..rows as i64);
        assert!(nearly_unique(&a, &at));
    }
}
