//! The execution plan of a pinned table's scan: planned Iceberg file scan
//! tasks in groups, one output partition a group, read with the files' I/O
//! only. A step's own query reads one group (a few files at once); a
//! cluster's executors each read the groups they are given.

use std::any::Any;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::TryStreamExt;
use iceberg::io::FileIO;
use iceberg::scan::FileScanTask;
use iceberg::spec::SchemaRef as IcebergSchemaRef;

use super::{df_error, FILES_AT_ONCE};
use crate::scan::{self, ScanStats};

/// The planned files of a pinned table.
#[derive(Debug)]
pub struct PinnedScan {
    file_io: FileIO,
    /// Whose table, and its schema at the snapshot: what the scan carries
    /// when it travels to a cluster.
    org: String,
    table_schema: IcebergSchemaRef,
    stats: ScanStats,
    groups: Vec<Vec<FileScanTask>>,
    batch_size: Option<usize>,
    properties: Arc<PlanProperties>,
}

impl PinnedScan {
    /// A scan reading `groups` (at least one, maybe empty), one output
    /// partition each, in `schema` (the planned columns, in order).
    pub fn new(
        file_io: FileIO,
        org: &str,
        table_schema: IcebergSchemaRef,
        schema: SchemaRef,
        stats: ScanStats,
        mut groups: Vec<Vec<FileScanTask>>,
        batch_size: Option<usize>,
    ) -> PinnedScan {
        if groups.is_empty() {
            groups.push(Vec::new());
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(groups.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        PinnedScan {
            file_io,
            org: org.to_string(),
            table_schema,
            stats,
            groups,
            batch_size,
            properties,
        }
    }

    pub fn org(&self) -> &str {
        &self.org
    }

    pub fn iceberg_schema(&self) -> &IcebergSchemaRef {
        &self.table_schema
    }

    pub fn stats(&self) -> &ScanStats {
        &self.stats
    }

    pub fn groups(&self) -> &[Vec<FileScanTask>] {
        &self.groups
    }

    pub fn batch_size(&self) -> Option<usize> {
        self.batch_size
    }

    pub fn schema_ref(&self) -> SchemaRef {
        self.properties.eq_properties.schema().clone()
    }
}

impl DisplayAs for PinnedScan {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "PinnedScan: {} at {}, {} of {} files",
            self.stats.dataset,
            self.stats.snapshot,
            self.stats.files,
            self.stats
                .files_total
                .map_or_else(|| "?".to_string(), |n| n.to_string())
        )?;
        if self.groups.len() > 1 {
            write!(f, " in {} groups", self.groups.len())?;
        }
        if let Some(p) = &self.stats.filter {
            write!(f, ", filter {p}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for PinnedScan {
    fn name(&self) -> &str {
        "PinnedScan"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let tasks = self.groups.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!(
                "PinnedScan of {} has {} partitions, not {}",
                self.stats.dataset,
                self.groups.len(),
                partition + 1
            ))
        })?;
        let stream = scan::read_files(
            &self.file_io,
            &self.stats.dataset,
            tasks,
            self.batch_size,
            FILES_AT_ONCE,
        )
        .map_err(df_error)?
        .map_err(|e| DataFusionError::External(Box::new(e)));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.properties.eq_properties.schema().clone(),
            stream,
        )))
    }
}

/// Splits tasks into at most `n` groups of about the same bytes (largest
/// first, each to the lightest group), so that no executor gets all the big
/// files.
pub fn balance(mut tasks: Vec<FileScanTask>, n: usize) -> Vec<Vec<FileScanTask>> {
    let n = n.clamp(1, tasks.len().max(1));
    tasks.sort_by_key(|t| std::cmp::Reverse(t.length));
    let mut groups: Vec<(u64, Vec<FileScanTask>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for t in tasks {
        if let Some(g) = groups.iter_mut().min_by_key(|g| g.0) {
            g.0 += t.length;
            g.1.push(t);
        }
    }
    groups.into_iter().map(|g| g.1).collect()
}
