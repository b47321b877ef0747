//! A step's query on a Ballista cluster (DataFusion's distributed engine):
//! the same SQL over the same pinned tables, run by the team's scheduler
//! and executors instead of the step's process.
//!
//! The step does what only it may do: it checks the tables against its
//! `reads`, pins and records them (as for a local query, in
//! [`crate::Ctx::sql`]), and plans each table's scan with the query's
//! columns and filters. The plan it sends carries each table as that file
//! list ([`orca_lake::query::PlannedTable`]): the cluster reads files, never
//! the catalog or the control plane. Results stream back to the step, or
//! the executors write them as a table's data files for the step to commit
//! ([`crate::write_files`], [`crate::append`]).

use std::sync::Arc;

use ballista::prelude::{SessionConfigExt, SessionContextExt};
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::DataFusionError;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::prelude::{SessionConfig, SessionContext};
use orca_lake::query::codec::{LogicalCodec, PhysicalCodec};
use orca_lake::query::write::{data_files, WriteFilesNode, WriteSpec};
use orca_lake::query::{Admission, PinnedTable};
use orca_lake::{DataFile, Lake, Table};

use crate::error::Result;

/// How many groups a table's files are split into (the first stage's
/// tasks) and the partitions of later stages: the cluster's task slots are
/// a good value (`ORCA_BALLISTA_PARTITIONS`).
pub const PARTITIONS_ENV: &str = "ORCA_BALLISTA_PARTITIONS";
const DEFAULT_PARTITIONS: usize = 4;

/// `df://host:port` as `host:port`, refusing anything else.
fn scheduler_address(url: &str) -> Result<String> {
    let rest = url
        .strip_prefix("df://")
        .ok_or_else(|| format!("Ballista scheduler URL {url:?}: expected df://host:port"))?;
    let ok = rest
        .rsplit_once(':')
        .is_some_and(|(h, p)| !h.is_empty() && !h.contains('/') && p.parse::<u16>().is_ok());
    if !ok {
        return Err(format!("Ballista scheduler URL {url:?}: expected df://host:port").into());
    }
    Ok(rest.to_string())
}

/// Refuses a cluster whose DataFusion is not the binary's: plans would not
/// decode, or worse, decode differently. The scheduler says its version on
/// `/api/version`.
fn check_version(url: &str) -> Result<()> {
    // Once per scheduler and process: a step may run many queries.
    static CHECKED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if CHECKED.lock().is_ok_and(|c| c.iter().any(|u| u == url)) {
        return Ok(());
    }
    let addr = scheduler_address(url)?;
    let answer: serde_json::Value = ureq::get(&format!("http://{addr}/api/version"))
        .timeout(std::time::Duration::from_secs(10))
        .call()
        .map_err(|e| format!("the Ballista scheduler at {url} does not answer: {e}"))?
        .into_json()
        .map_err(|e| {
            format!("the Ballista scheduler at {url} answered /api/version with no JSON: {e}")
        })?;
    let theirs = answer
        .get("datafusion_version")
        .and_then(|v| v.as_str())
        .unwrap_or("?");
    if theirs != datafusion::DATAFUSION_VERSION {
        return Err(format!(
            "the Ballista cluster at {url} runs DataFusion {theirs} (Ballista {}), and this pipeline binary is built with DataFusion {}: run a cluster of the same DataFusion (orca-ballista of this Orca version)",
            answer.get("version").and_then(|v| v.as_str()).unwrap_or("?"),
            datafusion::DATAFUSION_VERSION
        )
        .into());
    }
    if let Ok(mut c) = CHECKED.lock() {
        c.push(url.to_string());
    }
    Ok(())
}

fn partitions() -> Result<usize> {
    match std::env::var(PARTITIONS_ENV).ok().filter(|v| !v.is_empty()) {
        None => Ok(DEFAULT_PARTITIONS),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=4096).contains(n))
            .ok_or_else(|| format!("{PARTITIONS_ENV}={v:?} is not a number from 1 to 4096").into()),
    }
}

/// Replaces each pinned table of the plan by its planned scan: the file
/// list the step's catalog gives for the scan's columns and filters.
fn plan_scans(lake: &Lake, plan: LogicalPlan, batch_rows: usize) -> Result<LogicalPlan> {
    let org = lake.name.clone();
    let planned = plan.transform_up(|node| {
        let LogicalPlan::TableScan(scan) = &node else {
            return Ok(Transformed::no(node));
        };
        let provider = source_as_provider(&scan.source)?;
        let Some(pinned) = provider.as_any().downcast_ref::<PinnedTable>() else {
            return Err(DataFusionError::Plan(format!(
                "a query on a Ballista cluster reads lake tables only, and {} is the step's own (register_csv): run it locally (Query::local)",
                scan.table_name
            )));
        };
        let table = lake
            .rt
            .block_on(pinned.plan_for(&org, scan.projection.as_ref(), &scan.filters, batch_rows))
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let mut scan = scan.clone();
        scan.source = provider_as_source(Arc::new(table));
        Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
    })?;
    Ok(planned.data)
}

/// The query's plan with its tables planned by the step, and a session on
/// the cluster at `url` to run it.
fn prepare(
    lake: &Lake,
    df: DataFrame,
    url: &str,
    tag: &str,
    batch_rows: usize,
) -> Result<(LogicalPlan, SessionState)> {
    check_version(url)?;
    let plan = df.into_optimized_plan()?;
    let plan = plan_scans(lake, plan, batch_rows)?;
    let admission = Admission::any_org();
    let config = SessionConfig::new_with_ballista()
        .with_target_partitions(partitions()?)
        .with_batch_size(batch_rows)
        .with_information_schema(false)
        .with_ballista_job_name(tag)
        .with_ballista_logical_extension_codec(Arc::new(LogicalCodec::new(
            Arc::new(BallistaLogicalExtensionCodec::default()),
            admission.clone(),
        )))
        .with_ballista_physical_extension_codec(Arc::new(PhysicalCodec::new(
            Arc::new(BallistaPhysicalExtensionCodec::default()),
            admission,
        )));
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .build();
    Ok((plan, state))
}

/// Runs a step's query (`df`, named `tag` on the cluster) on the cluster
/// at `url` and streams its result back.
pub(crate) fn stream(
    lake: &Lake,
    df: DataFrame,
    url: &str,
    tag: &str,
    batch_rows: usize,
) -> Result<SendableRecordBatchStream> {
    let fail = |e: &dyn std::fmt::Display| format!("{tag} query on Ballista {url}: {e}");
    let (plan, state) = prepare(lake, df, url, tag, batch_rows).map_err(|e| fail(&e))?;
    let stream = lake
        .rt
        .block_on(async {
            let ctx = SessionContext::remote_with_state(url, state).await?;
            ctx.execute_logical_plan(plan).await?.execute_stream().await
        })
        .map_err(|e| fail(&e))?;
    Ok(stream)
}

/// Runs a step's query on the cluster at `url`, its result written as data
/// files of `table` by the executors (file names starting with `prefix`),
/// and returns the files, not committed.
pub(crate) fn write_files(
    lake: &Lake,
    df: DataFrame,
    url: &str,
    tag: &str,
    batch_rows: usize,
    table: &Table,
    prefix: &str,
) -> Result<Vec<DataFile>> {
    let fail = |e: &dyn std::fmt::Display| format!("{tag} query on Ballista {url}: {e}");
    let (plan, state) = prepare(lake, df, url, tag, batch_rows).map_err(|e| fail(&e))?;
    let spec = Arc::new(WriteSpec::new(&lake.name, table, prefix));
    let node = WriteFilesNode::new(plan, spec).map_err(|e| fail(&e))?;
    let plan = LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    });
    let rows = lake
        .rt
        .block_on(async {
            let ctx = SessionContext::remote_with_state(url, state).await?;
            ctx.execute_logical_plan(plan).await?.collect().await
        })
        .map_err(|e| fail(&e))?;
    Ok(data_files(table, &rows).map_err(|e| fail(&e))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheduler_url_is_df_host_port() {
        assert_eq!(
            scheduler_address("df://127.0.0.1:50050").expect("valid"),
            "127.0.0.1:50050"
        );
        for bad in [
            "http://127.0.0.1:50050",
            "df://127.0.0.1",
            "df://:50050",
            "df://h/x:1",
            "df://h:99999",
        ] {
            let e = scheduler_address(bad).expect_err(bad).to_string();
            assert!(e.contains(bad), "{e}");
        }
    }
}
