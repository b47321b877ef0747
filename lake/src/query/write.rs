//! A query's result written as a table's data files by the cluster that ran
//! it: each partition of the result becomes data files of the table (split
//! by its partition spec, named with the step's prefix) written by the
//! executor that computed it, and the query's rows are the files, as
//! Iceberg's JSON for data files. The step commits them in one snapshot, as
//! `write_files` + `commit`: a killed attempt leaves only orphans, which
//! maintenance removes.

use std::any::Any;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::context::{QueryPlanner, SessionState};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{
    Expr, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore,
};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use futures::StreamExt;
use iceberg::spec::{DataFile, TableMetadata};
use iceberg::TableIdent;
use serde::{Deserialize, Serialize};

use super::planned::{file_io, PLAN_FORMAT};
use crate::table::Table;
use crate::writer::FileWriter;
use crate::{LakeError, Result};

/// The one column of a write's result: a data file, as Iceberg's JSON.
pub const DATA_FILE_COLUMN: &str = "data_file";

/// Where and how a query's result is written: the table at the step's
/// view of it, and the file name prefix unique to the step's attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriteSpec {
    pub format: u32,
    pub datafusion: String,
    pub org: String,
    pub dataset: String,
    pub metadata: TableMetadata,
    pub prefix: String,
}

impl WriteSpec {
    pub fn new(org: &str, table: &Table, prefix: &str) -> WriteSpec {
        WriteSpec {
            format: PLAN_FORMAT,
            datafusion: datafusion::DATAFUSION_VERSION.to_string(),
            org: org.to_string(),
            dataset: table.dataset().to_string(),
            metadata: table.inner.metadata().clone(),
            prefix: prefix.to_string(),
        }
    }

    /// The table the executor writes into: its metadata, no catalog.
    fn table(&self) -> Result<Table> {
        let (ns, name) = self
            .dataset
            .split_once('.')
            .ok_or_else(|| LakeError::Table(format!("{} is not namespace.table", self.dataset)))?;
        let ident = TableIdent::from_strs([ns, name])
            .map_err(LakeError::iceberg(format!("table {}", self.dataset)))?;
        let runtime = iceberg::Runtime::try_current().map_err(LakeError::iceberg(format!(
            "writing {}: the I/O runtime",
            self.dataset
        )))?;
        let inner = iceberg::table::Table::builder()
            .runtime(runtime)
            .metadata(self.metadata.clone())
            .identifier(ident.clone())
            .file_io(file_io())
            .readonly(true)
            .build()
            .map_err(LakeError::iceberg(format!("table {}", self.dataset)))?;
        Ok(Table::new(&self.dataset, ident, inner))
    }

    /// Where the table's files go.
    pub fn location(&self) -> &str {
        self.metadata.location()
    }
}

/// The data files a write's rows name, read back in the table's terms.
pub fn data_files(table: &Table, rows: &[RecordBatch]) -> Result<Vec<DataFile>> {
    let meta = table.inner.metadata();
    let spec = meta.default_partition_spec();
    let schema = meta.current_schema();
    let ptype = spec
        .partition_type(schema)
        .map_err(LakeError::iceberg(format!(
            "the partition type of {}",
            table.dataset()
        )))?;
    let mut out = Vec::new();
    for b in rows {
        let col = b
            .column_by_name(DATA_FILE_COLUMN)
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or_else(|| {
                LakeError::Table(format!(
                    "a write of {} returned no {DATA_FILE_COLUMN} column",
                    table.dataset()
                ))
            })?;
        for json in col.iter().flatten() {
            out.push(
                iceberg::spec::deserialize_data_file_from_json(
                    json,
                    spec.spec_id(),
                    &ptype,
                    schema,
                )
                .map_err(LakeError::iceberg(format!(
                    "a data file of {}",
                    table.dataset()
                )))?,
            );
        }
    }
    Ok(out)
}

fn output_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        DATA_FILE_COLUMN,
        DataType::Utf8,
        false,
    )]))
}

/// The write as a node of the logical plan the step sends.
#[derive(Debug, Clone)]
pub struct WriteFilesNode {
    pub input: LogicalPlan,
    pub spec: Arc<WriteSpec>,
    schema: DFSchemaRef,
}

impl WriteFilesNode {
    pub fn new(input: LogicalPlan, spec: Arc<WriteSpec>) -> DFResult<WriteFilesNode> {
        Ok(WriteFilesNode {
            input,
            spec,
            schema: Arc::new(DFSchema::try_from(output_schema().as_ref().clone())?),
        })
    }

    fn key(&self) -> (&str, &str) {
        (&self.spec.dataset, &self.spec.prefix)
    }
}

impl PartialEq for WriteFilesNode {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key() && self.input == other.input
    }
}

impl Eq for WriteFilesNode {}

impl Hash for WriteFilesNode {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
        self.input.hash(state);
    }
}

impl PartialOrd for WriteFilesNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match self.key().cmp(&other.key()) {
            Ordering::Equal => self.input.partial_cmp(&other.input),
            o => Some(o),
        }
    }
}

impl UserDefinedLogicalNodeCore for WriteFilesNode {
    fn name(&self) -> &str {
        "OrcaWriteFiles"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "OrcaWriteFiles: {} ({}*)",
            self.spec.dataset, self.spec.prefix
        )
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> DFResult<Self> {
        let input = inputs
            .pop()
            .ok_or_else(|| DataFusionError::Plan("OrcaWriteFiles takes one input".into()))?;
        Ok(WriteFilesNode {
            input,
            spec: self.spec.clone(),
            schema: self.schema.clone(),
        })
    }
}

/// Plans [`WriteFilesNode`]s as [`WriteFilesExec`]s: the scheduler's part.
#[derive(Debug, Default)]
pub struct WritePlanner;

#[async_trait]
impl ExtensionPlanner for WritePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session_state: &SessionState,
    ) -> DFResult<Option<Arc<dyn ExecutionPlan>>> {
        let Some(w) = node.as_any().downcast_ref::<WriteFilesNode>() else {
            return Ok(None);
        };
        let input = physical_inputs
            .first()
            .cloned()
            .ok_or_else(|| DataFusionError::Plan("OrcaWriteFiles has no input".into()))?;
        Ok(Some(Arc::new(WriteFilesExec::new(input, w.spec.clone()))))
    }
}

/// A query planner that knows Orca's writes, for a cluster's scheduler.
#[derive(Debug, Default)]
pub struct OrcaQueryPlanner;

#[async_trait]
impl QueryPlanner for OrcaQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session_state: &SessionState,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(WritePlanner)])
            .create_physical_plan(logical_plan, session_state)
            .await
    }
}

/// Each input partition written as data files by the executor running it;
/// yields one row a file.
#[derive(Debug)]
pub struct WriteFilesExec {
    input: Arc<dyn ExecutionPlan>,
    spec: Arc<WriteSpec>,
    properties: Arc<PlanProperties>,
}

impl WriteFilesExec {
    pub fn new(input: Arc<dyn ExecutionPlan>, spec: Arc<WriteSpec>) -> WriteFilesExec {
        let n = input.output_partitioning().partition_count().max(1);
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(output_schema()),
            Partitioning::UnknownPartitioning(n),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        WriteFilesExec {
            input,
            spec,
            properties,
        }
    }

    pub fn spec(&self) -> &WriteSpec {
        &self.spec
    }
}

impl DisplayAs for WriteFilesExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "WriteFilesExec: {} under {}",
            self.spec.dataset,
            self.spec.location()
        )
    }
}

/// Writes one partition's stream; the data files as Iceberg's JSON.
async fn write_partition(
    spec: Arc<WriteSpec>,
    partition: usize,
    mut input: SendableRecordBatchStream,
) -> DFResult<RecordBatch> {
    let df = |e: LakeError| DataFusionError::External(Box::new(e));
    let table = spec.table().map_err(df)?;
    let mut w = FileWriter::new(&table, format!("{}-p{partition}", spec.prefix)).map_err(df)?;
    while let Some(b) = input.next().await {
        w.write(b?).await.map_err(df)?;
    }
    let files = w.close().await.map_err(df)?;
    let meta = table.inner.metadata();
    let ptype = meta
        .default_partition_spec()
        .partition_type(meta.current_schema())
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    let json = files
        .into_iter()
        .map(|f| iceberg::spec::serialize_data_file_to_json(f, &ptype, meta.format_version()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    Ok(RecordBatch::try_new(
        output_schema(),
        vec![Arc::new(StringArray::from(json))],
    )?)
}

impl ExecutionPlan for WriteFilesExec {
    fn name(&self) -> &str {
        "WriteFilesExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let input = children
            .pop()
            .ok_or_else(|| DataFusionError::Plan("WriteFilesExec takes one input".into()))?;
        Ok(Arc::new(WriteFilesExec::new(input, self.spec.clone())))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DFResult<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let written = write_partition(self.spec.clone(), partition, input);
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            output_schema(),
            futures::stream::once(written),
        )))
    }
}
