//! Writing rows as a table's data files: fitted to its schema, split by its
//! partition spec (one file set per partition value), sorted by its sort
//! order, as Parquet with the column statistics readers prune by.
//!
//! Batches are written as they come, so an append of a stream holds one
//! batch at a time (plus what each open Parquet writer buffers), except
//! under a sort order: rows are then gathered per partition value and sorted
//! before they are written, so memory grows with the largest partition of
//! the append, never with the table.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::spec::{DataFile, DataFileFormat, PartitionKey, SortDirection, SortOrder, Struct};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::partitioning::PartitioningWriter;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::file::properties::WriterProperties;

use crate::catalog::Lake;
use crate::table::Table;
use crate::{LakeError, Result};

/// A batch that fits the table's schema, as it names its columns (and with
/// the field ids its writers and partition splitter go by). Columns are
/// taken by name when the batch has every column of the table (a query's
/// result, in any order, with more columns), else by position; a column of
/// another type is cast when no value can change (text views and large
/// text to text, narrower to wider numbers, a time zone spelled otherwise).
pub fn fit_batch(table: &Table, schema: &SchemaRef, b: RecordBatch) -> Result<RecordBatch> {
    let bad = |e: String| {
        LakeError::Table(format!(
            "batch does not fit table {} ({e}); its columns are {:?}",
            table.dataset(),
            schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
        ))
    };
    let by_name = schema
        .fields()
        .iter()
        .all(|f| b.schema().index_of(f.name()).is_ok());
    if !by_name && b.num_columns() != schema.fields().len() {
        return Err(bad(format!(
            "it has {} columns: {:?}",
            b.num_columns(),
            b.schema()
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect::<Vec<_>>()
        )));
    }
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (i, f) in schema.fields().iter().enumerate() {
        let c = if by_name {
            b.column_by_name(f.name())
                .cloned()
                .ok_or_else(|| bad(format!("no column {}", f.name())))?
        } else {
            b.column(i).clone()
        };
        if c.data_type() == f.data_type() || !widens(c.data_type(), f.data_type()) {
            columns.push(c);
            continue;
        }
        let opts = arrow_cast::CastOptions {
            safe: false,
            ..Default::default()
        };
        columns.push(
            arrow_cast::cast_with_options(c.as_ref(), f.data_type(), &opts)
                .map_err(|e| bad(format!("column {}: {e}", f.name())))?,
        );
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| bad(e.to_string()))
}

/// Whether every value of type `from` is the same value in type `to`.
fn widens(from: &arrow_schema::DataType, to: &arrow_schema::DataType) -> bool {
    use arrow_schema::DataType as D;
    match (from, to) {
        (D::Utf8View | D::LargeUtf8, D::Utf8) => true,
        (D::BinaryView | D::LargeBinary, D::Binary) => true,
        (D::Dictionary(_, v), t) => v.as_ref() == t || widens(v, t),
        (D::Int8 | D::Int16 | D::UInt8 | D::UInt16, D::Int32) => true,
        (D::Int8 | D::Int16 | D::Int32 | D::UInt8 | D::UInt16 | D::UInt32, D::Int64) => true,
        (D::Float16 | D::Float32, D::Float64) => true,
        (D::Timestamp(u1, z1), D::Timestamp(u2, z2)) => {
            let utc = |z: &Option<Arc<str>>| matches!(z.as_deref(), Some("UTC" | "+00:00"));
            u1 == u2 && utc(z1) && utc(z2)
        }
        _ => false,
    }
}

/// Batches that fit the table's schema.
pub fn fit(table: &Table, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    let schema = table.arrow_schema()?;
    batches
        .into_iter()
        .map(|b| fit_batch(table, &schema, b))
        .collect()
}

/// Writes batches as Parquet data files of the table whose names start
/// with `prefix` (unique to the writer, so that a retry never overwrites a
/// committed file). A partitioned table gets files per partition value, each
/// carrying its value. Nothing is committed.
///
/// Each batch is taken from the iterator outside the lake's runtime, so the
/// iterator may itself read a table (a scan or a query feeding an append).
pub fn write_data_files<I>(
    t: &Lake,
    table: &Table,
    batches: I,
    prefix: String,
) -> Result<Vec<DataFile>>
where
    I: IntoIterator<Item = Result<RecordBatch>>,
{
    let mut w = FileWriter::new(table, prefix)?;
    for b in batches {
        t.rt.block_on(w.write(b?))?;
    }
    t.rt.block_on(w.close())
}

type Files =
    DataFileWriterBuilder<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;
type Single = <Files as IcebergWriterBuilder>::R;

enum Mode {
    /// A sort order: every row of a partition value first.
    Sorted(HashMap<Option<Struct>, (Option<PartitionKey>, Vec<RecordBatch>)>),
    /// Unpartitioned: one rolling file set, opened with the first batch.
    Single(Option<Box<Single>>),
    /// Partitioned: a file set per partition value.
    Fanout(Box<FanoutWriter<Files>>),
}

/// A table's data files being written, a batch at a time: what
/// [`write_data_files`] drives from a step and a cluster's executor drives
/// from its stream.
pub struct FileWriter<'t> {
    table: &'t Table,
    schema: SchemaRef,
    /// The file sets' builder, unless a fanout writer holds it.
    files: Option<Files>,
    splitter: Option<RecordBatchPartitionSplitter>,
    mode: Mode,
}

impl<'t> FileWriter<'t> {
    pub fn new(table: &'t Table, prefix: String) -> Result<FileWriter<'t>> {
        let meta = table.inner.metadata();
        let what = || LakeError::iceberg(format!("writing data files of {}", table.dataset()));
        let location = DefaultLocationGenerator::new(meta).map_err(what())?;
        let names = DefaultFileNameGenerator::new(prefix, None, DataFileFormat::Parquet);
        let parquet =
            ParquetWriterBuilder::new(WriterProperties::default(), meta.current_schema().clone());
        let rolling = RollingFileWriterBuilder::new_with_default_file_size(
            parquet,
            table.inner.file_io().clone(),
            location,
            names,
        );
        let files = DataFileWriterBuilder::new(rolling);
        let spec = meta.default_partition_spec().clone();
        let splitter = if spec.is_unpartitioned() {
            None
        } else {
            Some(
                RecordBatchPartitionSplitter::try_new_with_computed_values(
                    meta.current_schema().clone(),
                    spec,
                )
                .map_err(what())?,
            )
        };
        let (mode, files) = if !meta.default_sort_order().is_unsorted() {
            (Mode::Sorted(HashMap::new()), Some(files))
        } else if splitter.is_none() {
            (Mode::Single(None), Some(files))
        } else {
            (Mode::Fanout(Box::new(FanoutWriter::new(files))), None)
        };
        Ok(FileWriter {
            schema: table.arrow_schema()?,
            table,
            files,
            splitter,
            mode,
        })
    }

    fn what(&self) -> impl FnOnce(iceberg::Error) -> LakeError {
        LakeError::iceberg(format!("writing data files of {}", self.table.dataset()))
    }

    fn split(&self, b: RecordBatch) -> Result<Vec<(Option<PartitionKey>, RecordBatch)>> {
        match &self.splitter {
            None => Ok(vec![(None, b)]),
            Some(s) => Ok(s
                .split(&b)
                .map_err(self.what())?
                .into_iter()
                .map(|(k, b)| (Some(k), b))
                .collect()),
        }
    }

    /// Writes a batch (fitted to the table's schema first).
    pub async fn write(&mut self, b: RecordBatch) -> Result<()> {
        let b = fit_batch(self.table, &self.schema, b)?;
        let what = self.what();
        match &mut self.mode {
            Mode::Sorted(_) => {
                let split = self.split(b)?;
                if let Mode::Sorted(parts) = &mut self.mode {
                    for (key, b) in split {
                        let id = key.as_ref().map(|k| k.data().clone());
                        parts.entry(id).or_insert((key, Vec::new())).1.push(b);
                    }
                }
                Ok(())
            }
            Mode::Single(w) => {
                if w.is_none() {
                    let files = self
                        .files
                        .as_ref()
                        .ok_or_else(|| LakeError::Table("no file writer".into()))?;
                    *w = Some(Box::new(files.build(None).await.map_err(what)?));
                }
                match w {
                    Some(w) => w.write(b).await.map_err(LakeError::iceberg(format!(
                        "writing data files of {}",
                        self.table.dataset()
                    ))),
                    None => Ok(()),
                }
            }
            Mode::Fanout(_) => {
                let split = self.split(b)?;
                if let Mode::Fanout(w) = &mut self.mode {
                    for (key, b) in split {
                        let key = key.ok_or_else(|| LakeError::Table("no partition key".into()))?;
                        w.write(key, b).await.map_err(LakeError::iceberg(format!(
                            "writing data files of {}",
                            self.table.dataset()
                        )))?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Closes the files and returns them, not committed.
    pub async fn close(self) -> Result<Vec<DataFile>> {
        let what = self.what();
        let dataset = self.table.dataset().to_string();
        let err = move || LakeError::iceberg(format!("writing data files of {dataset}"));
        match self.mode {
            Mode::Sorted(parts) => {
                let order = self.table.inner.metadata().default_sort_order().clone();
                let mut out = Vec::new();
                let files = self
                    .files
                    .as_ref()
                    .ok_or_else(|| LakeError::Table("no file writer".into()))?;
                for (_, (key, bs)) in parts {
                    let sorted = sort(self.table, &self.schema, &order, &bs)?;
                    let mut w = files.build(key).await.map_err(err())?;
                    w.write(sorted).await.map_err(err())?;
                    out.extend(w.close().await.map_err(err())?);
                }
                Ok(out)
            }
            Mode::Single(None) => Ok(Vec::new()),
            Mode::Single(Some(mut w)) => w.close().await.map_err(what),
            Mode::Fanout(w) => w.close().await.map_err(what),
        }
    }
}

/// The rows of `batches` as one batch, in the sort order.
fn sort(
    table: &Table,
    schema: &SchemaRef,
    order: &SortOrder,
    batches: &[RecordBatch],
) -> Result<RecordBatch> {
    let all = arrow_select::concat::concat_batches(schema, batches)
        .map_err(|e| LakeError::Table(format!("sorting rows of {}: {e}", table.dataset())))?;
    let ice = table.inner.metadata().current_schema();
    let mut keys = Vec::new();
    for f in &order.fields {
        let name = ice
            .field_by_id(f.source_id)
            .map(|c| c.name.clone())
            .ok_or_else(|| {
                LakeError::Table(format!(
                    "{}: the sort order names field {} the schema lacks",
                    table.dataset(),
                    f.source_id
                ))
            })?;
        let column = all.column_by_name(&name).cloned().ok_or_else(|| {
            LakeError::Table(format!("{}: no column {name} to sort by", table.dataset()))
        })?;
        let descending = f.direction == SortDirection::Descending;
        keys.push(arrow_ord::sort::SortColumn {
            values: column,
            options: Some(arrow_schema::SortOptions {
                descending,
                nulls_first: f.null_order == iceberg::spec::NullOrder::First,
            }),
        });
    }
    let indices = arrow_ord::sort::lexsort_to_indices(&keys, None)
        .map_err(|e| LakeError::Table(format!("sorting rows of {}: {e}", table.dataset())))?;
    let columns = all
        .columns()
        .iter()
        .map(|c| arrow_select::take::take(c.as_ref(), &indices, None))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| LakeError::Table(format!("sorting rows of {}: {e}", table.dataset())))?;
    RecordBatch::try_new(Arc::clone(schema), columns)
        .map_err(|e| LakeError::Table(format!("sorting rows of {}: {e}", table.dataset())))
}
