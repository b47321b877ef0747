//! How pinned scans travel in DataFusion's serialized plans: a
//! [`PlannedTable`] in a logical plan (step to scheduler) and a
//! [`PinnedScan`] in a physical plan (scheduler to executors). Everything
//! else goes to the codec wrapped (Ballista's, for its shuffles and file
//! formats).
//!
//! Orca's nodes are written as `ORCA` and a JSON [`ScanPayload`]: a
//! protobuf message cannot start with that byte (field 9 of wire type 7
//! does not exist), so the wrapped codec's bytes are never taken for ours.

use std::sync::Arc;

use arrow_schema::SchemaRef;
use datafusion::common::TableReference;
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, Extension, LogicalPlan, ScalarUDF, WindowUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use super::exec::PinnedScan;
use super::planned::{file_io, Admission, PlannedTable, ScanPayload, PLAN_FORMAT};
use super::write::{WriteFilesExec, WriteFilesNode, WriteSpec};
use super::PinnedTable;

const MAGIC: &[u8] = b"ORCA";
/// A write ([`WriteSpec`]) rather than a scan.
const MAGIC_WRITE: &[u8] = b"ORCW";

fn write_spec(spec: &WriteSpec, buf: &mut Vec<u8>) -> DFResult<()> {
    buf.extend_from_slice(MAGIC_WRITE);
    serde_json::to_writer(buf, spec).map_err(|e| {
        DataFusionError::Internal(format!("encoding the write of {}: {e}", spec.dataset))
    })
}

fn read_write_spec(buf: &[u8], admission: &Admission) -> Option<DFResult<Arc<WriteSpec>>> {
    let body = buf.strip_prefix(MAGIC_WRITE)?;
    Some(
        serde_json::from_slice::<WriteSpec>(body)
            .map_err(|e| {
                DataFusionError::Plan(format!(
                    "an Orca write this cluster cannot read ({e}): is it a cluster of the pipeline binary's Orca version (plan format {PLAN_FORMAT})?"
                ))
            })
            .and_then(|w| {
                admission
                    .check_write(&w.org, &w.dataset, w.format, &w.datafusion, w.location())
                    .map(|_| Arc::new(w))
                    .map_err(DataFusionError::Plan)
            }),
    )
}

fn one_input<T: Clone>(inputs: &[T]) -> DFResult<T> {
    match inputs {
        [one] => Ok(one.clone()),
        _ => Err(DataFusionError::Plan(format!(
            "an Orca write takes one input, not {}",
            inputs.len()
        ))),
    }
}

fn write(payload: &ScanPayload, buf: &mut Vec<u8>) -> DFResult<()> {
    buf.extend_from_slice(MAGIC);
    serde_json::to_writer(buf, payload).map_err(|e| {
        DataFusionError::Internal(format!("encoding the scan of {}: {e}", payload.dataset))
    })
}

/// Ours: the payload, checked against what this process admits.
fn read(buf: &[u8], admission: &Admission) -> Option<DFResult<ScanPayload>> {
    let body = buf.strip_prefix(MAGIC)?;
    Some(
        serde_json::from_slice::<ScanPayload>(body)
            .map_err(|e| {
                DataFusionError::Plan(format!(
                    "an Orca scan this cluster cannot read ({e}): is it a cluster of the pipeline binary's Orca version (plan format {PLAN_FORMAT})?"
                ))
            })
            .and_then(|p| admission.check(&p).map(|_| p).map_err(DataFusionError::Plan)),
    )
}

/// The logical codec: [`PlannedTable`]s, else the wrapped codec's.
#[derive(Debug)]
pub struct LogicalCodec {
    inner: Arc<dyn LogicalExtensionCodec>,
    admission: Admission,
}

impl LogicalCodec {
    pub fn new(inner: Arc<dyn LogicalExtensionCodec>, admission: Admission) -> LogicalCodec {
        LogicalCodec { inner, admission }
    }
}

impl LogicalExtensionCodec for LogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> DFResult<Extension> {
        match read_write_spec(buf, &self.admission) {
            Some(spec) => Ok(Extension {
                node: Arc::new(WriteFilesNode::new(one_input(inputs)?, spec?)?),
            }),
            None => self.inner.try_decode(buf, inputs, ctx),
        }
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> DFResult<()> {
        match node.node.as_any().downcast_ref::<WriteFilesNode>() {
            Some(w) => write_spec(&w.spec, buf),
            None => self.inner.try_encode(node, buf),
        }
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> DFResult<Arc<dyn TableProvider>> {
        match read(buf, &self.admission) {
            Some(p) => Ok(Arc::new(PlannedTable::from_payload(p?, schema))),
            None => self
                .inner
                .try_decode_table_provider(buf, table_ref, schema, ctx),
        }
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> DFResult<()> {
        if let Some(t) = node.as_any().downcast_ref::<PlannedTable>() {
            return write(t.payload(), buf);
        }
        if let Some(t) = node.as_any().downcast_ref::<PinnedTable>() {
            return Err(DataFusionError::Plan(format!(
                "{table_ref} ({}) must be planned by the step before its query travels",
                t.dataset()
            )));
        }
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> DFResult<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> DFResult<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> DFResult<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode_udf(node, buf)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> DFResult<Arc<AggregateUDF>> {
        self.inner.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> DFResult<Arc<WindowUDF>> {
        self.inner.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode_udwf(node, buf)
    }
}

/// The physical codec: [`PinnedScan`]s, else the wrapped codec's.
#[derive(Debug)]
pub struct PhysicalCodec {
    inner: Arc<dyn PhysicalExtensionCodec>,
    admission: Admission,
}

impl PhysicalCodec {
    pub fn new(inner: Arc<dyn PhysicalExtensionCodec>, admission: Admission) -> PhysicalCodec {
        PhysicalCodec { inner, admission }
    }
}

impl PhysicalExtensionCodec for PhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if let Some(spec) = read_write_spec(buf, &self.admission) {
            return Ok(Arc::new(WriteFilesExec::new(one_input(inputs)?, spec?)));
        }
        let Some(p) = read(buf, &self.admission) else {
            return self.inner.try_decode(buf, inputs, ctx);
        };
        let p = p?;
        let schema = p.arrow_schema()?;
        let stats = p.stats.clone().ok_or_else(|| {
            DataFusionError::Plan(format!("the scan of {} has no plan figures", p.dataset))
        })?;
        Ok(Arc::new(PinnedScan::new(
            file_io(),
            &p.org,
            p.schema,
            schema,
            stats,
            p.groups,
            p.batch_size,
        )))
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> DFResult<()> {
        if let Some(w) = node.as_any().downcast_ref::<WriteFilesExec>() {
            return write_spec(w.spec(), buf);
        }
        let Some(scan) = node.as_any().downcast_ref::<PinnedScan>() else {
            return self.inner.try_encode(node, buf);
        };
        let schema = scan.schema_ref();
        let payload = ScanPayload {
            format: PLAN_FORMAT,
            datafusion: datafusion::DATAFUSION_VERSION.to_string(),
            org: scan.org().to_string(),
            dataset: scan.stats().dataset.clone(),
            snapshot: Some(scan.stats().snapshot),
            schema: scan.iceberg_schema().clone(),
            columns: Some(schema.fields().iter().map(|f| f.name().clone()).collect()),
            stats: Some(scan.stats().clone()),
            batch_size: scan.batch_size(),
            groups: scan.groups().to_vec(),
        };
        write(&payload, buf)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> DFResult<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode_udf(node, buf)
    }

    fn try_decode_expr(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn datafusion::physical_plan::PhysicalExpr>],
    ) -> DFResult<Arc<dyn datafusion::physical_plan::PhysicalExpr>> {
        self.inner.try_decode_expr(buf, inputs)
    }

    fn try_encode_expr(
        &self,
        node: &Arc<dyn datafusion::physical_plan::PhysicalExpr>,
        buf: &mut Vec<u8>,
    ) -> DFResult<()> {
        self.inner.try_encode_expr(node, buf)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> DFResult<Arc<AggregateUDF>> {
        self.inner.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> DFResult<Arc<WindowUDF>> {
        self.inner.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> DFResult<()> {
        self.inner.try_encode_udwf(node, buf)
    }
}

#[cfg(test)]
mod tests {
    use datafusion_proto::logical_plan::DefaultLogicalExtensionCodec;
    use datafusion_proto::physical_plan::DefaultPhysicalExtensionCodec;
    use iceberg::scan::FileScanTask;
    use iceberg::spec::{DataFileFormat, NestedField, PrimitiveType, Schema, Type};

    use super::*;
    use crate::scan::ScanStats;

    fn table_schema() -> Arc<Schema> {
        Arc::new(
            Schema::builder()
                .with_fields(vec![
                    NestedField::required(1, "month", Type::Primitive(PrimitiveType::String))
                        .into(),
                    NestedField::required(2, "delay", Type::Primitive(PrimitiveType::Long)).into(),
                ])
                .build()
                .expect("schema"),
        )
    }

    fn task(path: &str) -> FileScanTask {
        FileScanTask::builder()
            .with_file_size_in_bytes(100)
            .with_start(0)
            .with_length(100)
            .with_data_file_path(path.to_string())
            .with_data_file_format(DataFileFormat::Parquet)
            .with_schema(table_schema())
            .with_project_field_ids(vec![2])
            .with_case_sensitive(true)
            .build()
    }

    fn stats() -> ScanStats {
        ScanStats {
            dataset: "lake.raw".into(),
            snapshot: 7,
            files_total: Some(3),
            files: 2,
            bytes: 200,
            rows: 20,
            filter: None,
        }
    }

    fn scan(org: &str, paths: &[&str]) -> Arc<dyn ExecutionPlan> {
        let arrow = Arc::new(
            iceberg::arrow::schema_to_arrow_schema(&table_schema())
                .expect("arrow")
                .project(&[1])
                .expect("project"),
        );
        Arc::new(PinnedScan::new(
            file_io(),
            org,
            table_schema(),
            arrow,
            stats(),
            paths.iter().map(|p| vec![task(p)]).collect(),
            Some(1024),
        ))
    }

    fn codec(admission: Admission) -> PhysicalCodec {
        PhysicalCodec::new(Arc::new(DefaultPhysicalExtensionCodec {}), admission)
    }

    #[test]
    fn a_pinned_scan_travels_whole_to_an_executor_of_its_org() {
        let wh = "file:///w";
        let node = scan(
            "acme",
            &[
                "file:///w/acme/lake/raw/data/a.parquet",
                "/w/acme/lake/raw/data/b.parquet",
            ],
        );
        let mut buf = Vec::new();
        codec(Admission::any_org())
            .try_encode(node.clone(), &mut buf)
            .expect("encode");
        assert!(buf.starts_with(MAGIC));
        let back = codec(Admission::org("acme", wh))
            .try_decode(&buf, &[], &TaskContext::default())
            .expect("decode");
        let back = back
            .as_any()
            .downcast_ref::<PinnedScan>()
            .expect("a PinnedScan");
        let orig = node
            .as_any()
            .downcast_ref::<PinnedScan>()
            .expect("a PinnedScan");
        assert_eq!(back.groups(), orig.groups());
        assert_eq!(back.stats(), orig.stats());
        assert_eq!(back.schema_ref().fields(), orig.schema_ref().fields());
        assert_eq!(back.batch_size(), Some(1024));
        assert_eq!(back.properties().partitioning.partition_count(), 2);
    }

    #[test]
    fn a_cluster_of_one_org_refuses_other_orgs_and_files_outside_its_prefix() {
        let refuse = |node: Arc<dyn ExecutionPlan>| {
            let mut buf = Vec::new();
            codec(Admission::any_org())
                .try_encode(node, &mut buf)
                .expect("encode");
            codec(Admission::org("acme", "/w"))
                .try_decode(&buf, &[], &TaskContext::default())
                .expect_err("refused")
                .to_string()
        };
        let e = refuse(scan("globex", &["/w/globex/lake/raw/data/a.parquet"]));
        assert!(
            e.contains(
                "this cluster serves org acme; a query of org globex reading lake.raw is refused"
            ),
            "{e}"
        );
        for path in [
            "/w/globex/lake/raw/data/a.parquet",
            "/w/acme/../globex/lake/raw/a.parquet",
            "/w/acmeco/lake/raw/a.parquet",
            "s3://bucket/w/acme/a.parquet",
        ] {
            let e = refuse(scan("acme", &[path]));
            assert!(
                e.contains(path) && e.contains("outside the warehouse of org acme"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_plan_of_another_datafusion_or_format_is_refused_by_name() {
        let node = scan("acme", &["/w/acme/a.parquet"]);
        let mut buf = Vec::new();
        codec(Admission::any_org())
            .try_encode(node, &mut buf)
            .expect("encode");
        let mut p: ScanPayload = serde_json::from_slice(&buf[MAGIC.len()..]).expect("payload");
        p.datafusion = "52.0.0".into();
        let mut forged = MAGIC.to_vec();
        forged.extend(serde_json::to_vec(&p).expect("json"));
        let e = codec(Admission::any_org())
            .try_decode(&forged, &[], &TaskContext::default())
            .expect_err("another DataFusion")
            .to_string();
        assert!(
            e.contains("made by DataFusion 52.0.0") && e.contains(datafusion::DATAFUSION_VERSION),
            "{e}"
        );
        p.datafusion = datafusion::DATAFUSION_VERSION.into();
        p.format = PLAN_FORMAT + 1;
        let mut forged = MAGIC.to_vec();
        forged.extend(serde_json::to_vec(&p).expect("json"));
        let e = codec(Admission::any_org())
            .try_decode(&forged, &[], &TaskContext::default())
            .expect_err("another format")
            .to_string();
        assert!(
            e.contains(&format!("plan format {}", PLAN_FORMAT + 1)),
            "{e}"
        );
    }

    #[test]
    fn a_pinned_table_must_be_planned_before_it_travels_and_a_planned_one_round_trips() {
        let codec = LogicalCodec::new(
            Arc::new(DefaultLogicalExtensionCodec {}),
            Admission::any_org(),
        );
        let arrow =
            Arc::new(iceberg::arrow::schema_to_arrow_schema(&table_schema()).expect("arrow"));
        let planned = PlannedTable::new(
            "acme",
            "lake.raw",
            Some(7),
            table_schema(),
            arrow.clone(),
            vec![task("/w/acme/a.parquet")],
            Some(stats()),
        );
        let mut buf = Vec::new();
        let r = TableReference::partial("lake", "raw");
        codec
            .try_encode_table_provider(&r, Arc::new(planned.clone()), &mut buf)
            .expect("encode");
        let back = codec
            .try_decode_table_provider(&buf, &r, arrow, &TaskContext::default())
            .expect("decode");
        let back = back
            .as_any()
            .downcast_ref::<PlannedTable>()
            .expect("a PlannedTable");
        assert_eq!(back.payload().groups, planned.payload().groups);
        assert_eq!(back.payload().org, "acme");
    }

    fn write_spec(org: &str, location: &str) -> WriteSpec {
        let meta = iceberg::spec::TableMetadataBuilder::new(
            (*table_schema()).clone(),
            iceberg::spec::UnboundPartitionSpec::builder().build(),
            iceberg::spec::SortOrder::unsorted_order(),
            location.to_string(),
            iceberg::spec::FormatVersion::V2,
            std::collections::HashMap::new(),
        )
        .expect("metadata")
        .build()
        .expect("metadata")
        .metadata;
        WriteSpec {
            format: PLAN_FORMAT,
            datafusion: datafusion::DATAFUSION_VERSION.to_string(),
            org: org.to_string(),
            dataset: "lake.out".into(),
            metadata: meta,
            prefix: "orca-1-totals-2024-01-1-x".into(),
        }
    }

    #[test]
    fn a_write_travels_to_executors_of_its_org_and_into_its_warehouse_only() {
        let input = scan("acme", &["/w/acme/lake/raw/data/a.parquet"]);
        let write = |org: &str, location: &str| -> Arc<dyn ExecutionPlan> {
            Arc::new(WriteFilesExec::new(
                input.clone(),
                Arc::new(write_spec(org, location)),
            ))
        };
        let mut buf = Vec::new();
        codec(Admission::any_org())
            .try_encode(write("acme", "/w/acme/lake/out"), &mut buf)
            .expect("encode");
        assert!(buf.starts_with(MAGIC_WRITE));
        let back = codec(Admission::org("acme", "/w"))
            .try_decode(&buf, std::slice::from_ref(&input), &TaskContext::default())
            .expect("decode");
        let back = back
            .as_any()
            .downcast_ref::<WriteFilesExec>()
            .expect("a write");
        assert_eq!(back.spec().prefix, "orca-1-totals-2024-01-1-x");
        assert_eq!(back.spec().location(), "/w/acme/lake/out");
        for (org, location, says) in [
            (
                "globex",
                "/w/globex/lake/out",
                "this cluster serves org acme; a query of org globex",
            ),
            (
                "acme",
                "/w/globex/lake/out",
                "writes into /w/globex/lake/out/, outside the warehouse of org acme",
            ),
            (
                "acme",
                "/w/acme/../globex/out",
                "outside the warehouse of org acme",
            ),
        ] {
            let mut buf = Vec::new();
            codec(Admission::any_org())
                .try_encode(write(org, location), &mut buf)
                .expect("encode");
            let e = codec(Admission::org("acme", "/w"))
                .try_decode(&buf, std::slice::from_ref(&input), &TaskContext::default())
                .expect_err("refused")
                .to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
