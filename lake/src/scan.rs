//! Reading a table at a snapshot: planned first (which data files the
//! filter leaves, from the partition values in the manifests and each
//! file's column statistics), then streamed file by file, with the filter
//! also pruning row groups and rows, and only the selected columns decoded.
//!
//! The plan's figures ([`ScanStats`]) are what makes pruning observable:
//! the attempt log says how many of the snapshot's files a scan read.

use std::fmt;

use futures::{StreamExt, TryStreamExt};
use iceberg::expr::Predicate;
use iceberg::io::FileIO;
use iceberg::scan::{ArrowRecordBatchStream, FileScanTask};
use iceberg::table::Table as IcebergTable;

use crate::{LakeError, Result};

/// What a scan asks of a table at a snapshot.
#[derive(Debug, Clone, Default)]
pub struct ScanRequest {
    /// The columns to read, in this order (`None`: all; empty: none, for
    /// counting rows).
    pub columns: Option<Vec<String>>,
    /// Rows to keep, as far as Iceberg can judge them: whole files by their
    /// partition values and statistics, row groups, then rows.
    pub predicate: Option<Predicate>,
    /// Rows per batch (Iceberg's default when `None`).
    pub batch_size: Option<usize>,
}

/// What a scan's plan found.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScanStats {
    pub dataset: String,
    pub snapshot: i64,
    /// The data files of the snapshot, when its summary says.
    pub files_total: Option<u64>,
    /// The data files the scan reads.
    pub files: u64,
    /// Their size, and their rows before any row-level filtering.
    pub bytes: u64,
    pub rows: u64,
    /// The filter pushed down, as Iceberg bound it.
    pub filter: Option<String>,
}

impl fmt::Display for ScanStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "scan of {} at snapshot {}: {} of {} data files ({} bytes, {} rows before filtering)",
            self.dataset,
            self.snapshot,
            self.files,
            self.files_total
                .map_or_else(|| "?".to_string(), |n| n.to_string()),
            self.bytes,
            self.rows
        )?;
        match &self.filter {
            Some(p) => write!(f, " for {p}"),
            None => write!(f, ", no filter"),
        }
    }
}

/// A planned scan: the files to read, and its figures.
pub struct Planned {
    pub tasks: Vec<FileScanTask>,
    pub stats: ScanStats,
}

/// Plans a scan of `snapshot`: reads the manifest list and the manifests
/// the filter does not rule out, and keeps the files it does not rule out.
pub async fn plan(
    table: &IcebergTable,
    dataset: &str,
    snapshot: i64,
    req: &ScanRequest,
) -> Result<Planned> {
    let what = || {
        LakeError::iceberg(format!(
            "planning a scan of {dataset} at snapshot {snapshot}"
        ))
    };
    let mut b = table.scan().snapshot_id(snapshot);
    b = match &req.columns {
        None => b.select_all(),
        Some(c) if c.is_empty() => b.select_empty(),
        Some(c) => b.select(c.iter()),
    };
    if let Some(p) = &req.predicate {
        b = b.with_filter(p.clone());
    }
    if let Some(n) = req.batch_size {
        b = b.with_batch_size(Some(n));
    }
    let scan = b.build().map_err(what())?;
    let mut tasks: Vec<FileScanTask> = scan
        .plan_files()
        .await
        .map_err(what())?
        .try_collect()
        .await
        .map_err(what())?;
    let files_total = table
        .metadata()
        .snapshot_by_id(snapshot)
        .and_then(|s| {
            s.summary()
                .additional_properties
                .get("total-data-files")
                .cloned()
        })
        .and_then(|n| n.parse().ok());
    let stats = ScanStats {
        dataset: dataset.to_string(),
        snapshot,
        files_total,
        files: tasks.len() as u64,
        bytes: tasks.iter().map(|t| t.length).sum(),
        rows: tasks.iter().filter_map(|t| t.record_count).sum(),
        filter: tasks
            .first()
            .and_then(|t| t.predicate.as_ref())
            .map(|p| p.to_string())
            .or_else(|| req.predicate.as_ref().map(|p| p.to_string())),
    };
    // The rows of a file whose partition decides the filter need no test.
    crate::residual::apply(&mut tasks, table.metadata());
    Ok(Planned { tasks, stats })
}

/// Streams the rows of planned files: at most `files_at_once` files are
/// open at a time, each yielding batches as its row groups are decoded.
pub fn read(
    table: &IcebergTable,
    dataset: &str,
    tasks: Vec<FileScanTask>,
    batch_size: Option<usize>,
    files_at_once: usize,
) -> Result<ArrowRecordBatchStream> {
    stream(
        table.reader_builder(),
        dataset,
        tasks,
        batch_size,
        files_at_once,
    )
}

/// [`read`] with only the files' I/O, as a cluster's executor reads a scan
/// planned elsewhere: no catalog, no table metadata. Called within the
/// tokio runtime that is to do the reading.
pub fn read_files(
    file_io: &FileIO,
    dataset: &str,
    tasks: Vec<FileScanTask>,
    batch_size: Option<usize>,
    files_at_once: usize,
) -> Result<ArrowRecordBatchStream> {
    let runtime = iceberg::Runtime::try_current().map_err(LakeError::iceberg(format!(
        "reading {dataset}: the I/O runtime"
    )))?;
    let builder = iceberg::arrow::ArrowReaderBuilder::new(file_io.clone(), runtime);
    stream(builder, dataset, tasks, batch_size, files_at_once)
}

fn stream(
    builder: iceberg::arrow::ArrowReaderBuilder,
    dataset: &str,
    tasks: Vec<FileScanTask>,
    batch_size: Option<usize>,
    files_at_once: usize,
) -> Result<ArrowRecordBatchStream> {
    let mut reader = builder
        .with_data_file_concurrency_limit(files_at_once.max(1))
        .with_row_group_filtering_enabled(true)
        .with_row_selection_enabled(true);
    if let Some(n) = batch_size {
        reader = reader.with_batch_size(n);
    }
    let tasks = futures::stream::iter(tasks.into_iter().map(Ok)).boxed();
    let result = reader
        .build()
        .read(tasks)
        .map_err(LakeError::iceberg(format!("reading {dataset}")))?;
    Ok(result.stream())
}
