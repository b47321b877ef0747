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
use std::sync::Arc;

use arrow_array::{Array, RecordBatch, UInt32Array};
use arrow_row::{RowConverter, SortField};
use bytes::Bytes;
use parquet::arrow::arrow_writer::{
    compute_leaves, ArrowColumnChunk, ArrowColumnWriter, ArrowLeafColumn,
    ArrowRowGroupWriterFactory,
};
use parquet::arrow::{add_encoded_arrow_schema_to_metadata, ArrowSchemaConverter, ArrowWriter};
use parquet::basic::{Compression, Encoding};
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::commit::record::{Refresh, Staged};
use crate::commit::store::Store;
use crate::dest::error::DestError;

/// Encodes a batch as one Parquet file, its columns on up to `threads`
/// threads (this one included).
pub fn encode(batch: &RecordBatch, threads: usize) -> Result<Bytes, DestError> {
    let props = properties(batch);
    let threads = threads.min(batch.num_columns());
    // One row group is written here; a batch past the writer's row group
    // size goes to the writer, which cuts it.
    if threads < 2 || batch.num_rows() < PARALLEL_ROWS || batch.num_rows() > ROW_GROUP_ROWS {
        let mut w = ArrowWriter::try_new(Vec::new(), batch.schema(), Some(props))?;
        w.write(batch)?;
        return Ok(Bytes::from(w.into_inner()?));
    }
    encode_parallel(batch, props, threads)
}

/// The threads a part of an epoch is encoded on when `parts` are encoded
/// at once: the machine's cores shared among them. The reader's thread and
/// a local source's server want cores too, but while an epoch is encoded
/// the reader is waiting for it (or running ahead into a bounded queue).
pub fn encode_threads(parts: usize) -> usize {
    (crate::util::cores() / parts.max(1)).clamp(1, 8)
}

/// Rows in a row group at most.
const ROW_GROUP_ROWS: usize = 1 << 20;

/// A batch smaller than this is encoded on one thread: starting threads
/// would cost more than they save.
const PARALLEL_ROWS: usize = 16_384;

fn properties(batch: &RecordBatch) -> WriterProperties {
    // `_orca_id` is unique per row and random: a dictionary of it would be
    // built only to be thrown away, snappy cannot shrink it, and its
    // min/max prune nothing.
    let id = || ColumnPath::from("_orca_id");
    // `_orca_seq` counts up by one through a file (its epoch, then its
    // place): delta-encoded it takes a few bits a row instead of eight
    // bytes, and snappy has nothing left to find in it.
    let seq = || ColumnPath::from("_orca_seq");
    let mut props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_column_dictionary_enabled(id(), false)
        .set_column_compression(id(), Compression::UNCOMPRESSED)
        .set_column_statistics_enabled(id(), EnabledStatistics::None)
        .set_column_dictionary_enabled(seq(), false)
        .set_column_encoding(seq(), Encoding::DELTA_BINARY_PACKED)
        .set_column_compression(seq(), Compression::UNCOMPRESSED);
    if let Some(at) = sample_rows(batch.num_rows()) {
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            // `_orca_id` and `_orca_seq` have no dictionary already.
            if !matches!(field.name().as_str(), "_orca_id" | "_orca_seq")
                && nearly_unique(column.as_ref(), &at)
            {
                let path = ColumnPath::from(field.name().as_str());
                props = props.set_column_dictionary_enabled(path, false);
            }
        }
    }
    props.build()
}

/// [`encode`] with the columns' leaves shared out over `threads` threads,
/// the biggest first to the least loaded, and written in the schema's
/// order into one row group: the file is the one `ArrowWriter` writes
/// (the Arrow schema in its metadata included), made in less time where
/// snappy and the encodings of several wide columns dominate.
fn encode_parallel(
    batch: &RecordBatch,
    mut props: WriterProperties,
    threads: usize,
) -> Result<Bytes, DestError> {
    let schema = batch.schema();
    add_encoded_arrow_schema_to_metadata(&schema, &mut props);
    let props = Arc::new(props);
    let parquet_schema = ArrowSchemaConverter::new()
        .with_coerce_types(props.coerce_types())
        .convert(&schema)?;
    let size = batch.get_array_memory_size();
    let mut file = SerializedFileWriter::new(
        Vec::with_capacity(size / 2),
        parquet_schema.root_schema_ptr(),
        props,
    )?;
    let writers =
        ArrowRowGroupWriterFactory::new(&file, schema.clone()).create_column_writers(0)?;
    let mut leaves = Vec::with_capacity(writers.len());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        let weight = column.get_array_memory_size();
        let of_field = compute_leaves(field, column)?;
        let n = of_field.len().max(1);
        leaves.extend(of_field.into_iter().map(|l| (l, weight / n)));
    }
    if leaves.len() != writers.len() {
        return Err(DestError::Parquet(ParquetError::General(format!(
            "{} leaf columns for {} column writers",
            leaves.len(),
            writers.len()
        ))));
    }
    let mut jobs: Vec<Vec<(usize, ArrowColumnWriter, ArrowLeafColumn)>> =
        (0..threads).map(|_| Vec::new()).collect();
    let mut load = vec![0usize; threads];
    let mut order: Vec<_> = writers.into_iter().zip(leaves).enumerate().collect();
    order.sort_by_key(|(_, (_, (_, weight)))| std::cmp::Reverse(*weight));
    for (i, (w, (leaf, weight))) in order {
        let t = (0..threads).min_by_key(|&t| load[t]).unwrap_or(0);
        load[t] += weight;
        jobs[t].push((i, w, leaf));
    }
    let encode_job = |job: Vec<(usize, ArrowColumnWriter, ArrowLeafColumn)>| {
        job.into_iter()
            .map(|(i, mut w, leaf)| {
                w.write(&leaf)?;
                Ok((i, w.close()?))
            })
            .collect::<Result<Vec<(usize, ArrowColumnChunk)>, ParquetError>>()
    };
    let mut chunks = std::thread::scope(|scope| {
        let mut jobs = jobs.into_iter();
        let own = jobs.next().unwrap_or_default();
        let spawned: Vec<_> = jobs.map(|job| scope.spawn(|| encode_job(job))).collect();
        let mine = encode_job(own);
        // Every thread is joined before an error is returned: the scope
        // would turn a panicked thread left unjoined into a panic here.
        let mut failure = None;
        let mut chunks = Vec::new();
        for handle in spawned {
            match handle.join() {
                Ok(Ok(done)) => chunks.extend(done),
                Ok(Err(e)) => {
                    failure.get_or_insert(e);
                }
                Err(_) => {
                    failure
                        .get_or_insert(ParquetError::General("a column's encoder panicked".into()));
                }
            }
        }
        chunks.extend(mine?);
        match failure {
            Some(e) => Err(e),
            None => Ok(chunks),
        }
    })?;
    chunks.sort_by_key(|(i, _)| *i);
    let mut group = file.next_row_group()?;
    for (_, chunk) in chunks {
        chunk.append_to_row_group(&mut group)?;
    }
    group.close()?;
    Ok(Bytes::from(file.into_inner()?))
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
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::RecordBatchReader;
    use arrow_array::{ArrayRef, Int64Array, StringArray, StructArray, TimestampMicrosecondArray};
    use arrow_schema::{DataType, Field};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    use super::*;

    /// A Parquet file's rows as one batch of the schema it holds.
    fn read_back(file: Bytes) -> RecordBatch {
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("reader")
            .build()
            .expect("reader");
        let schema = reader.schema();
        let back: Vec<RecordBatch> = reader.collect::<Result<_, _>>().expect("batches");
        arrow_select::concat::concat_batches(&schema, &back).expect("concat")
    }

    /// A batch of flat, nested (a list, a struct of two leaves) and
    /// time-zoned columns, with nulls.
    fn mixed(rows: i64) -> RecordBatch {
        let mut tags = ListBuilder::new(StringBuilder::new());
        for i in 0..rows {
            if i % 11 == 0 {
                tags.append_null();
            } else {
                for k in 0..(i % 3) {
                    tags.values().append_value(format!("t{k}"));
                }
                tags.append(true);
            }
        }
        let point = StructArray::from(vec![
            (
                Arc::new(Field::new("x", DataType::Int64, false)),
                Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
            ),
            (
                Arc::new(Field::new("label", DataType::Utf8, true)),
                Arc::new(StringArray::from_iter(
                    (0..rows).map(|i| (i % 5 != 0).then(|| format!("p{}", i % 13))),
                )) as ArrayRef,
            ),
        ]);
        RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
            ),
            (
                "doc",
                Arc::new(StringArray::from_iter(
                    (0..rows).map(|i| (i % 7 != 0).then(|| format!("{{\"n\": {i}}}"))),
                )) as _,
            ),
            ("tags", Arc::new(tags.finish()) as _),
            ("point", Arc::new(point) as _),
            (
                "at",
                Arc::new(
                    TimestampMicrosecondArray::from_iter_values((0..rows).map(|i| i * 1_000_000))
                        .with_timezone("UTC"),
                ) as _,
            ),
        ])
        .expect("batch")
    }

    #[test]
    fn columns_encoded_on_several_threads_make_the_same_file() {
        let batch = mixed(40_000);
        let one = encode(&batch, 1).expect("one thread");
        for threads in [2, 3, 8] {
            let many = encode(&batch, threads).expect("threads");
            assert!(one == many, "{threads} threads wrote another file");
        }
        // And it reads back as the batch, its time zone included.
        assert_eq!(read_back(one), batch);
        // A small batch is written by one writer, whatever it is given.
        let small = mixed(100);
        assert!(encode(&small, 1).expect("small") == encode(&small, 4).expect("small"));
    }

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
        let bytes = encode(&batch, 1).expect("encoded");
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
        assert_eq!(read_back(bytes), batch);
    }

    #[test]
    fn a_sixteen_byte_row_id_is_written_without_a_uuid_annotation() {
        // Parquet's UUID annotation would make DuckDB and pyarrow show a
        // uuid, but Spark refuses the file ("Illegal Parquet type:
        // FIXED_LEN_BYTE_ARRAY (UUID)", tried with Spark 4): the ids stay
        // plain 16 bytes, which every reader takes as binary.
        let rows = 40_000u64;
        let ids = arrow_array::FixedSizeBinaryArray::try_from_iter(
            (0..rows).map(|i| crate::ids::bytes(i, !i)),
        )
        .expect("ids");
        let batch = RecordBatch::try_from_iter([
            (
                "id",
                Arc::new(Int64Array::from_iter_values(0..rows as i64)) as ArrayRef,
            ),
            (crate::ids::ORCA_ID, Arc::new(ids) as _),
        ])
        .expect("batch");
        // One writer (a small batch) and columns on threads.
        for (rows, threads) in [(100, 1), (rows as usize, 2)] {
            let part = batch.slice(0, rows);
            let bytes = encode(&part, threads).expect("encoded");
            let reader = SerializedFileReader::new(bytes.clone()).expect("parquet");
            let schema = reader.metadata().file_metadata().schema_descr();
            let id = schema
                .columns()
                .iter()
                .find(|c| c.name() == crate::ids::ORCA_ID)
                .expect("column");
            assert_eq!(
                (id.physical_type(), id.type_length(), id.logical_type_ref()),
                (parquet::basic::Type::FIXED_LEN_BYTE_ARRAY, 16, None),
                "{threads} threads"
            );
            assert_eq!(read_back(bytes), part);
        }
    }

    #[test]
    fn the_sequence_is_delta_encoded_in_a_bit_a_row_and_reads_back() {
        let rows = 100_000i64;
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from_iter_values(0..rows)) as _),
            (
                "_orca_seq",
                Arc::new(Int64Array::from_iter_values(
                    (0..rows).map(|i| (3 << 32) | i),
                )) as _,
            ),
        ])
        .expect("batch");
        for threads in [1, 2] {
            let bytes = encode(&batch, threads).expect("encoded");
            let reader = SerializedFileReader::new(bytes.clone()).expect("parquet");
            let group = reader.metadata().row_group(0);
            let seq = group
                .columns()
                .iter()
                .find(|c| c.column_path().string() == "_orca_seq")
                .expect("column");
            assert!(
                seq.encodings()
                    .any(|e| e == parquet::basic::Encoding::DELTA_BINARY_PACKED),
                "{:?}",
                seq.encodings().collect::<Vec<_>>()
            );
            assert!(
                seq.compressed_size() < rows / 8,
                "{} bytes for {rows} rows",
                seq.compressed_size()
            );
            assert_eq!(read_back(bytes), batch);
        }
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
