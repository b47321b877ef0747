//! A pinned table's scan planned by the step, as it travels to a cluster
//! (Ballista): the dataset, the snapshot, its schema and the file scan tasks
//! the step's plan kept. The cluster's scheduler and executors read these
//! files and nothing else: no catalog, no control plane.
//!
//! What may arrive is checked where it arrives ([`Admission`]): the plan's
//! DataFusion version is the cluster's, and a cluster that serves one org
//! reads only files under that org's warehouse prefix.

use std::any::Any;
use std::sync::Arc;

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::ExecutionPlan;
use iceberg::io::{FileIO, FileIOBuilder};
use iceberg::scan::FileScanTask;
use iceberg::spec::SchemaRef as IcebergSchemaRef;
use serde::{Deserialize, Serialize};

use super::exec::{balance, PinnedScan};
use crate::scan::ScanStats;

/// The version of the payload below; a cluster refuses another.
pub const PLAN_FORMAT: u32 = 1;

/// A planned scan as it travels: the table's part of a logical plan (one
/// group, the file list the step planned) or of a physical plan (the
/// groups one stage's tasks read, and the columns they produce).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanPayload {
    pub format: u32,
    /// The DataFusion version of the process that made the plan.
    pub datafusion: String,
    pub org: String,
    pub dataset: String,
    pub snapshot: Option<i64>,
    /// The table's schema at the snapshot.
    pub schema: IcebergSchemaRef,
    /// The columns the scan produces, in order (physical plans only).
    pub columns: Option<Vec<String>>,
    pub stats: Option<ScanStats>,
    pub batch_size: Option<usize>,
    pub groups: Vec<Vec<FileScanTask>>,
}

impl ScanPayload {
    /// Every file the payload reads: data files and their delete files.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.groups.iter().flatten().flat_map(|t| {
            std::iter::once(t.data_file_path.as_str())
                .chain(t.deletes.iter().map(|d| d.file_path.as_str()))
        })
    }

    /// The Arrow schema of the table, or of the scan's `columns`.
    pub fn arrow_schema(&self) -> DFResult<SchemaRef> {
        let full = iceberg::arrow::schema_to_arrow_schema(&self.schema)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        match &self.columns {
            None => Ok(Arc::new(full)),
            Some(cols) => {
                let idx = cols
                    .iter()
                    .map(|c| full.index_of(c))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Arc::new(full.project(&idx)?))
            }
        }
    }
}

/// What a cluster accepts: plans of its own DataFusion version, and, when
/// it serves one org (`ORCA_BALLISTA_ORG`), files of that org's warehouse
/// prefix (`<ORCA_WAREHOUSE>/<org>/`) only.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    org: Option<String>,
    prefix: Option<String>,
}

/// The org a cluster serves.
pub const ORG_ENV: &str = "ORCA_BALLISTA_ORG";

impl Admission {
    /// No org bound: what a step's own process (which never decodes) uses.
    pub fn any_org() -> Admission {
        Admission::default()
    }

    /// A cluster serving `org`, whose tables live under `warehouse`.
    pub fn org(org: &str, warehouse: &str) -> Admission {
        let w = crate::catalog::absolute_warehouse(warehouse);
        Admission {
            org: Some(org.to_string()),
            prefix: Some(format!("{}/{org}/", w.trim_end_matches('/'))),
        }
    }

    /// `ORCA_BALLISTA_ORG` and `ORCA_WAREHOUSE`, as a cluster's processes
    /// are started with.
    pub fn from_env() -> Admission {
        match std::env::var(ORG_ENV).ok().filter(|o| !o.is_empty()) {
            Some(org) => {
                let w = std::env::var("ORCA_WAREHOUSE").unwrap_or_else(|_| "warehouse".into());
                Admission::org(&org, &w)
            }
            None => Admission::any_org(),
        }
    }

    /// The org this cluster serves, if one.
    pub fn serves(&self) -> Option<&str> {
        self.org.as_deref()
    }

    /// Refuses a write this cluster must not make: another version's,
    /// another org's, or into a table outside the org's warehouse prefix.
    pub fn check_write(
        &self,
        org: &str,
        dataset: &str,
        format: u32,
        df: &str,
        location: &str,
    ) -> Result<(), String> {
        self.check_version(dataset, format, df)?;
        self.check_org(org, dataset)?;
        self.check_path(
            dataset,
            "writes into",
            &format!("{}/", location.trim_end_matches('/')),
        )
    }

    fn check_version(&self, dataset: &str, format: u32, df: &str) -> Result<(), String> {
        if format != PLAN_FORMAT {
            return Err(format!(
                "the plan for {dataset} is in plan format {format}, and this cluster reads format {PLAN_FORMAT}: run a cluster of the pipeline binary's Orca version"
            ));
        }
        if df != datafusion::DATAFUSION_VERSION {
            return Err(format!(
                "the plan for {dataset} was made by DataFusion {df}, and this cluster runs DataFusion {}: run a cluster built with the pipeline binary's DataFusion",
                datafusion::DATAFUSION_VERSION
            ));
        }
        Ok(())
    }

    fn check_org(&self, org: &str, dataset: &str) -> Result<(), String> {
        match &self.org {
            Some(ours) if ours != org => Err(format!(
                "this cluster serves org {ours}; a query of org {org} reading {dataset} is refused"
            )),
            _ => Ok(()),
        }
    }

    fn check_path(&self, dataset: &str, verb: &str, f: &str) -> Result<(), String> {
        let Some(prefix) = &self.prefix else {
            return Ok(());
        };
        let bare = |s: &str| s.strip_prefix("file://").unwrap_or(s).to_string();
        let path = bare(f);
        if !path.starts_with(&bare(prefix)) || path.split('/').any(|s| s == "..") {
            return Err(format!(
                "the plan for {dataset} {verb} {f}, outside the warehouse of org {} ({prefix}): refused",
                self.org.as_deref().unwrap_or("?")
            ));
        }
        Ok(())
    }

    /// Refuses a payload this cluster must not run, naming why.
    pub fn check(&self, p: &ScanPayload) -> Result<(), String> {
        self.check_version(&p.dataset, p.format, &p.datafusion)?;
        self.check_org(&p.org, &p.dataset)?;
        for f in p.files() {
            self.check_path(&p.dataset, "reads", f)?;
        }
        Ok(())
    }
}

/// The files' I/O of a cluster's process: the object store clients take
/// their credentials from the process's environment, as a runner's
/// pipeline binaries do.
pub fn file_io() -> FileIO {
    FileIOBuilder::new(Arc::new(crate::objstore::ObjectStoreFactory)).build()
}

/// A pinned table whose scan the step planned: what a cluster's scheduler
/// turns into a physical plan without reading the catalog.
#[derive(Debug, Clone)]
pub struct PlannedTable {
    payload: ScanPayload,
    /// The table's Arrow schema (all columns, as the plan's projection
    /// indexes them).
    schema: SchemaRef,
}

impl PlannedTable {
    pub(crate) fn new(
        org: &str,
        dataset: &str,
        snapshot: Option<i64>,
        iceberg_schema: IcebergSchemaRef,
        schema: SchemaRef,
        tasks: Vec<FileScanTask>,
        stats: Option<ScanStats>,
    ) -> PlannedTable {
        PlannedTable {
            payload: ScanPayload {
                format: PLAN_FORMAT,
                datafusion: datafusion::DATAFUSION_VERSION.to_string(),
                org: org.to_string(),
                dataset: dataset.to_string(),
                snapshot,
                schema: iceberg_schema,
                columns: None,
                stats,
                batch_size: None,
                groups: vec![tasks.into_iter().map(travelling).collect()],
            },
            schema,
        }
    }

    /// The table a payload describes, in `schema` (the plan's).
    pub fn from_payload(payload: ScanPayload, schema: SchemaRef) -> PlannedTable {
        PlannedTable { payload, schema }
    }

    pub fn payload(&self) -> &ScanPayload {
        &self.payload
    }
}

/// A task as it can travel: the partition value, the spec and the name
/// mapping are not serializable in iceberg-rust 0.10, and Orca's data files
/// carry every column and its field id, so the reader needs none of them.
fn travelling(mut t: FileScanTask) -> FileScanTask {
    t.partition = None;
    t.partition_spec = None;
    t.name_mapping = None;
    t
}

#[async_trait]
impl TableProvider for PlannedTable {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let (Some(stats), Some(_)) = (&self.payload.stats, self.payload.snapshot) else {
            return Ok(Arc::new(EmptyExec::new(schema)));
        };
        // The step planned with the query's columns; the scheduler's plan
        // may keep fewer, so each task projects what this scan produces.
        let mut ids = Vec::with_capacity(schema.fields().len());
        for f in schema.fields() {
            let field = self.payload.schema.field_by_name(f.name()).ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "{} has no column {} at snapshot {}",
                    self.payload.dataset,
                    f.name(),
                    stats.snapshot
                ))
            })?;
            ids.push(field.id);
        }
        let tasks: Vec<FileScanTask> = self
            .payload
            .groups
            .iter()
            .flatten()
            .cloned()
            .map(|mut t| {
                t.project_field_ids = ids.clone();
                t
            })
            .collect();
        let groups = balance(tasks, state.config().target_partitions());
        Ok(Arc::new(PinnedScan::new(
            file_io(),
            &self.payload.org,
            self.payload.schema.clone(),
            schema,
            stats.clone(),
            groups,
            Some(state.config().batch_size()),
        )))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        // The step's plan pruned by them; DataFusion filters the rows.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }
}
