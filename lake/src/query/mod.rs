//! Tables at fixed snapshots as DataFusion tables, for SQL and DataFrames.
//!
//! [`PinnedTable`] is a table at one snapshot (the one a step pinned):
//! DataFusion hands it the query's filters and columns, which become an
//! Iceberg scan plan ([`crate::scan`]) that skips files by partition value
//! and statistics; each plan's figures go to a shared list the caller logs.
//! DataFusion applies the filters again to the rows it gets, so a filter
//! Iceberg cannot judge is still exact.
//!
//! [`references`] names the tables a query reads, so that a caller can
//! check each against what it may read before anything runs.

use std::any::Any;
use std::sync::{Arc, Mutex};

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{MemorySchemaProvider, Session};
use datafusion::common::TableReference;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use iceberg::table::Table as IcebergTable;
use iceberg_datafusion::physical_plan::convert_filters_to_predicate;

use crate::scan::{self, ScanRequest, ScanStats};

pub mod codec;
mod exec;
mod planned;
pub mod write;

use crate::{LakeError, Result};
pub use exec::PinnedScan;
pub use planned::{Admission, PlannedTable, ScanPayload, ORG_ENV, PLAN_FORMAT};

/// The plans of the scans a session ran, in order.
pub type ScanLog = Arc<Mutex<Vec<ScanStats>>>;

/// How many data files one scan reads at once: enough to keep both of a
/// small machine's cores decoding, few enough that memory stays a handful
/// of row groups.
pub const FILES_AT_ONCE: usize = 2;

/// The variable that bounds the memory of a step's queries, in MiB.
pub const MEMORY_ENV: &str = "ORCA_SQL_MEMORY_MB";

/// A session for queries over pinned tables: its own catalog, the given
/// batch size, one partition per core. With `ORCA_SQL_MEMORY_MB` set, its
/// sorts, joins and aggregations hold at most that much memory and spill
/// to disk beyond it (DataFusion's fair spill pool); unset, they are bounded
/// only by the machine.
pub fn session(batch_size: usize) -> Result<SessionContext> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let config = SessionConfig::new()
        .with_batch_size(batch_size)
        .with_target_partitions(cores)
        .with_information_schema(false);
    let Some(limit) = std::env::var(MEMORY_ENV).ok().filter(|v| !v.is_empty()) else {
        return Ok(SessionContext::new_with_config(config));
    };
    let mib: usize = limit
        .trim()
        .parse()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            LakeError::Config(format!(
                "{MEMORY_ENV}={limit:?} is not a number of MiB above 0"
            ))
        })?;
    let runtime = datafusion::execution::runtime_env::RuntimeEnvBuilder::new()
        .with_memory_limit(mib.saturating_mul(1 << 20), 1.0)
        .build_arc()
        .map_err(|e| LakeError::Config(format!("{MEMORY_ENV}: {e}")))?;
    Ok(SessionContext::new_with_config_rt(config, runtime))
}

/// A table at one snapshot, or empty when it had none.
#[derive(Debug)]
pub struct PinnedTable {
    table: IcebergTable,
    dataset: String,
    snapshot: Option<i64>,
    schema: SchemaRef,
    log: ScanLog,
}

impl PinnedTable {
    /// The table at `snapshot`, in the schema that snapshot was written
    /// with; `None` is a table that had no snapshot, which reads as empty.
    pub fn new(
        table: IcebergTable,
        dataset: &str,
        snapshot: Option<i64>,
        log: ScanLog,
    ) -> Result<PinnedTable> {
        let meta = table.metadata();
        let schema = match snapshot {
            Some(id) => {
                let s = meta.snapshot_by_id(id).ok_or_else(|| {
                    LakeError::Table(format!("table {dataset} has no snapshot {id}"))
                })?;
                s.schema(meta).map_err(LakeError::iceberg(format!(
                    "the schema of {dataset} at {id}"
                )))?
            }
            None => meta.current_schema().clone(),
        };
        let schema = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(&schema)
                .map_err(LakeError::iceberg(format!("the schema of {dataset}")))?,
        );
        Ok(PinnedTable {
            table,
            dataset: dataset.to_string(),
            snapshot,
            schema,
            log,
        })
    }

    /// The dataset the table is.
    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    /// Plans a scan of the pinned snapshot, its figures added to the log.
    async fn plan(&self, snapshot: i64, req: &ScanRequest) -> Result<scan::Planned> {
        let planned = scan::plan(&self.table, &self.dataset, snapshot, req).await?;
        if let Ok(mut log) = self.log.lock() {
            log.push(planned.stats.clone());
        }
        Ok(planned)
    }

    /// The scan a query's `TableScan` of this table makes (its columns and
    /// filters), planned here, as a table that carries its file list: what
    /// a cluster's scheduler and executors get instead of the catalog.
    pub async fn plan_for(
        &self,
        org: &str,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        batch_size: usize,
    ) -> Result<PlannedTable> {
        let iceberg_schema = self.iceberg_schema()?;
        let Some(snapshot) = self.snapshot else {
            return Ok(PlannedTable::new(
                org,
                &self.dataset,
                None,
                iceberg_schema,
                self.schema.clone(),
                Vec::new(),
                None,
            ));
        };
        let projected = match projection {
            Some(p) => Arc::new(
                self.schema
                    .project(p)
                    .map_err(|e| LakeError::Table(format!("columns of {}: {e}", self.dataset)))?,
            ),
            None => self.schema.clone(),
        };
        let req = scan_request(&projected, projection, filters, batch_size);
        let planned = self.plan(snapshot, &req).await?;
        Ok(PlannedTable::new(
            org,
            &self.dataset,
            Some(snapshot),
            iceberg_schema,
            self.schema.clone(),
            planned.tasks,
            Some(planned.stats),
        ))
    }

    fn iceberg_schema(&self) -> Result<iceberg::spec::SchemaRef> {
        let meta = self.table.metadata();
        match self.snapshot {
            Some(id) => meta
                .snapshot_by_id(id)
                .ok_or_else(|| {
                    LakeError::Table(format!("table {} has no snapshot {id}", self.dataset))
                })?
                .schema(meta)
                .map_err(LakeError::iceberg(format!(
                    "the schema of {} at {id}",
                    self.dataset
                ))),
            None => Ok(meta.current_schema().clone()),
        }
    }
}

/// What DataFusion asks of a scan, as an Iceberg scan request.
fn scan_request(
    projected: &SchemaRef,
    projection: Option<&Vec<usize>>,
    filters: &[Expr],
    batch_size: usize,
) -> ScanRequest {
    ScanRequest {
        columns: projection.map(|_| {
            projected
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect()
        }),
        predicate: convert_filters_to_predicate(filters),
        batch_size: Some(batch_size),
    }
}

pub(crate) fn df_error(e: LakeError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

#[async_trait]
impl TableProvider for PinnedTable {
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
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let schema = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let Some(snapshot) = self.snapshot else {
            return Ok(Arc::new(EmptyExec::new(schema)));
        };
        let req = scan_request(&schema, projection, filters, state.config().batch_size());
        let planned = self.plan(snapshot, &req).await.map_err(df_error)?;
        // One stream reading a few files at once: a step's own process
        // keeps its memory to a handful of row groups.
        Ok(Arc::new(PinnedScan::new(
            self.table.file_io().clone(),
            "",
            self.iceberg_schema().map_err(df_error)?,
            schema,
            planned.stats,
            vec![planned.tasks],
            req.batch_size,
        )))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        // Iceberg prunes by what it can judge; DataFusion filters the rows.
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }
}

/// Registers `provider` as `dataset` (`namespace.table`) in the session,
/// replacing a table of that name.
pub fn register(
    session: &SessionContext,
    dataset: &str,
    provider: Arc<dyn TableProvider>,
) -> Result<()> {
    let (ns, name) = dataset
        .split_once('.')
        .ok_or_else(|| LakeError::Table(format!("{dataset} is not namespace.table")))?;
    let catalog = session
        .catalog("datafusion")
        .ok_or_else(|| LakeError::Table("the session has no default catalog".into()))?;
    if catalog.schema(ns).is_none() {
        catalog
            .register_schema(ns, Arc::new(MemorySchemaProvider::new()))
            .map_err(|e| LakeError::Table(format!("namespace {ns}: {e}")))?;
    }
    let r = TableReference::partial(ns, name);
    session
        .deregister_table(r.clone())
        .and_then(|_| session.register_table(r, provider))
        .map(|_| ())
        .map_err(|e| LakeError::Table(format!("table {dataset}: {e}")))
}

/// A table a query reads.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reference {
    /// `namespace.table`: a dataset of the lake.
    Dataset(String),
    /// A bare name: something registered in the session itself.
    Local(String),
}

/// The tables one SQL statement reads, sorted (common table expressions
/// are not tables). A reference into another catalog, or of more parts than
/// `namespace.table`, is an error naming it.
pub fn references(session: &SessionContext, sql: &str) -> Result<Vec<Reference>> {
    let state = session.state();
    let dialect = state.config().options().sql_parser.dialect;
    let bad = |e: DataFusionError| LakeError::Table(format!("SQL: {e}"));
    let statement = state.sql_to_statement(sql, &dialect).map_err(bad)?;
    let refs = state.resolve_table_references(&statement).map_err(bad)?;
    let mut out: Vec<Reference> = Vec::new();
    for r in refs {
        let one = match &r {
            TableReference::Bare { table } => Reference::Local(table.to_string()),
            TableReference::Partial { schema, table } => {
                Reference::Dataset(format!("{schema}.{table}"))
            }
            TableReference::Full {
                catalog,
                schema,
                table,
            } if catalog.as_ref() == "datafusion" => {
                Reference::Dataset(format!("{schema}.{table}"))
            }
            TableReference::Full { .. } => {
                return Err(LakeError::Table(format!(
                    "SQL reads {r}: name a lake table as namespace.table"
                )))
            }
        };
        out.push(one);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_names_the_tables_it_reads_and_not_its_ctes() {
        let s = session(1024).expect("session");
        let refs = references(
            &s,
            "WITH m AS (SELECT * FROM lake.raw WHERE month = $1) \
             SELECT * FROM m JOIN lake.airports a ON a.code = m.origin \
             UNION ALL SELECT * FROM flights, Lake.Raw",
        )
        .expect("parses");
        assert_eq!(
            refs,
            [
                Reference::Dataset("lake.airports".into()),
                Reference::Dataset("lake.raw".into()),
                Reference::Local("flights".into()),
            ]
        );
        let e = references(&s, "SELECT * FROM other.lake.raw")
            .expect_err("another catalog")
            .to_string();
        assert!(e.contains("other.lake.raw"), "{e}");
        let e = references(&s, "SELEC 1").expect_err("not SQL").to_string();
        assert!(e.starts_with("SQL: "), "{e}");
    }
}
