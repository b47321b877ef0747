//! `orca-engine maintain`: the attempt of a table maintenance run
//! (`orca.maintain`). The control plane reads no table, so a runner's
//! engine does the work: it reads the task under its lease (the dataset,
//! the options, and what must stay: pinned snapshots, sensors' unseen
//! ones), then compacts, expires and removes orphans, in that order (the
//! files a compaction replaced are expired with their snapshots once those
//! are old enough), and reports what each did (`orca.report_maintenance`),
//! which the control plane turns into events and the compaction's commit.
//!
//! Only the org's own tables are touched: a table whose location is not
//! under the org's part of the warehouse is refused, and nothing outside
//! the table's own location is deleted.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use orca_core::api::{LeaseToken, MaintenanceTask};
use orca_lake::maintain::{self, CompactOptions, ExpireOptions, Keep, Watcher};
use orca_lake::{Lake, LakeConfig, Table};
use serde_json::{json, Value};

use crate::error::EngineError;

/// What a maintenance attempt needs.
#[derive(Debug, Clone)]
pub struct MaintainOptions {
    pub database_url: String,
    pub org: String,
    pub lease: String,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn lake_error(e: orca_lake::LakeError) -> EngineError {
    EngineError::Maintenance(e.to_string())
}

fn secs_ms(s: u64) -> i64 {
    i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// Carries out the task and reports it; returns the report.
pub fn run(opts: &MaintainOptions) -> Result<Value, EngineError> {
    let lease: LeaseToken = opts
        .lease
        .parse()
        .map_err(|e| EngineError::Maintenance(format!("--lease {:?}: {e}", opts.lease)))?;
    let mut control = orca_client::Control::connect(&opts.database_url, Some(&opts.org))?;
    let task = control.maintenance_task(lease)?;
    let mut config = LakeConfig::from_env(Some(&opts.database_url));
    config.org = opts.org.clone();
    let lake = Lake::open(&config).map_err(lake_error)?;
    let id = orca_lake::ident(&task.dataset).map_err(lake_error)?;
    if !lake.exists(&id).map_err(lake_error)? {
        // Nothing written yet: nothing to keep tidy.
        let report = json!({"missing": true});
        control.report_maintenance(lease, &report)?;
        return Ok(json!({"dataset": task.dataset, "report": report}));
    }
    let table = Table::new(
        &task.dataset,
        id.clone(),
        lake.load(&id).map_err(lake_error)?,
    );
    maintain::check_place(&table, &config.org_warehouse()).map_err(lake_error)?;
    let report = work(&lake, &table, &task)?;
    control.report_maintenance(lease, &report)?;
    Ok(json!({"dataset": task.dataset, "report": report}))
}

/// Compaction, expiry, orphans: each as the options say.
fn work(lake: &Lake, table: &Table, task: &MaintenanceTask) -> Result<Value, EngineError> {
    let mut report = serde_json::Map::new();
    let say = |what: &str, v: &Value| println!("maintain {}: {what} {v}", table.dataset());
    if let Some(c) = task.options.compact.on() {
        let props = HashMap::from([
            ("orca.pipeline".to_string(), task.pipeline.clone()),
            ("orca.run".to_string(), task.run.0.to_string()),
            ("orca.step".to_string(), "maintain".to_string()),
            ("orca.partition".to_string(), task.dataset.clone()),
            ("orca.attempt".to_string(), task.attempt.to_string()),
            ("orca.commit".to_string(), "1".to_string()),
            ("orca.maintenance".to_string(), "compact".to_string()),
        ]);
        let prefix = format!(
            "orca-maintain-{}-{}-{}",
            task.run.0,
            task.attempt,
            uuid::Uuid::new_v4().simple()
        );
        let done = maintain::compact(
            lake,
            table,
            &CompactOptions {
                small_bytes: c.small_bytes,
                min_files: usize::try_from(c.min_files).unwrap_or(usize::MAX),
            },
            props,
            prefix,
        )
        .map_err(lake_error)?;
        let v = serde_json::to_value(&done).unwrap_or_default();
        say("compacted", &v);
        report.insert("compact".into(), v);
    }
    if let Some(e) = task.options.expire.on() {
        // Windows count back from when each operation starts: a compaction
        // just before made the snapshot it replaced stop being current.
        let now = now_ms();
        let keep = Keep {
            pinned: task.pinned.iter().copied().collect(),
            watchers: task
                .watchers
                .iter()
                .map(|w| Watcher {
                    since_ms: w.since_ms,
                    seen: w.seen.iter().copied().collect(),
                })
                .collect(),
        };
        let done = maintain::expire(
            lake,
            table,
            &ExpireOptions {
                keep_last: usize::try_from(e.keep_last).unwrap_or(usize::MAX),
                keep_since_ms: now.saturating_sub(secs_ms(e.older_than_seconds)),
                current_since_ms: now.saturating_sub(secs_ms(e.grace_seconds)),
            },
            &keep,
        )
        .map_err(lake_error)?;
        let v = serde_json::to_value(&done).unwrap_or_default();
        say("expired", &v);
        report.insert("expire".into(), v);
    }
    if let Some(o) = task.options.orphans.on() {
        let now = now_ms();
        let done = maintain::remove_orphans(
            lake,
            table,
            now.saturating_sub(secs_ms(o.older_than_seconds)),
        )
        .map_err(lake_error)?;
        let v = serde_json::to_value(&done).unwrap_or_default();
        say("removed orphans", &v);
        report.insert("orphans".into(), v);
    }
    Ok(Value::Object(report))
}
