//! A pipeline that writes Iceberg tables: `probe_tables`, backfilled each
//! round. Its `write` step appends one row per day of its month to
//! `probe.rows` in the warehouse (the bucket, through the fault proxy, or
//! the directory beside the store) and returns the snapshot it committed;
//! its `read` step scans `probe.src`. Under faults each (run, month) must
//! commit once: an attempt killed after its commit finds that commit on
//! its retry, and one whose store did not answer is handed back.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::checks::{fail, failed_only_with_retries_spent, python, runs_finished};
use crate::world::World;

/// Rows of `probe.src`, which each `read` step counts.
const SRC_ROWS: i64 = 10;

/// The months a round backfills.
pub const MONTHS: &str = "2024-01..2024-03";

/// PyIceberg (tests/py/iceberg.py) on the seed's warehouse.
async fn iceberg(w: &World, args: &[&str]) -> Result<Value, String> {
    let (url, warehouse) = (w.db.url(), w.warehouse());
    let mut all = vec![args[0], url.as_str(), warehouse.as_str()];
    all.extend(&args[1..]);
    python(w, "iceberg.py", &all).await
}

/// Writes `probe.src`, as an outside writer would, before any run reads it.
pub async fn create_source(w: &World) {
    let rows: Vec<Value> = (0..SRC_ROWS).map(|n| json!({ "n": n })).collect();
    if let Err(e) = iceberg(w, &["create", "probe.src", &json!(rows).to_string()]).await {
        panic!("create probe.src in {}: {e}", w.warehouse());
    }
}

fn days(month: &str) -> Option<i64> {
    let (y, m) = month.split_once('-')?;
    let (y, m): (i64, u32) = (y.parse().ok()?, m.parse().ok()?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    Some(match m {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    })
}

/// Every run ended (failed only with its retries spent); each succeeded
/// `read` counted `probe.src`; `probe.rows`, read from the warehouse by
/// PyIceberg, holds no two commits of one (run, step, month, commit
/// number), each month's rows are its days times its commits, and every
/// succeeded `write` returned a snapshot the table holds. Returns how many
/// commits it checked (every one so far: the seed's last count is its
/// figure).
pub async fn committed_once(w: &World, runs: &[i64], trace: &[String]) -> u64 {
    runs_finished(w, runs, trace, std::time::Duration::from_secs(240)).await;
    failed_only_with_retries_spent(w, runs, trace).await;
    let outputs: Vec<(String, Option<Value>)> = sqlx::query_as(
        "SELECT s.step, s.output FROM orca.step_states s JOIN orca.runs r ON r.id = s.run_id
         WHERE r.id = ANY ($1) AND r.status = 'succeeded' AND s.step IN ('write', 'read')",
    )
    .bind(runs)
    .fetch_all(&w.db.pool)
    .await
    .expect("probe_tables outputs");
    let table = match iceberg(w, &["read", "probe.rows"]).await {
        Ok(t) => t,
        Err(e) => fail(w, trace, &format!("probe.rows cannot be read: {e}")),
    };
    let mut seen = BTreeSet::new();
    let mut commits: BTreeMap<String, i64> = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for s in table["snapshots"].as_array().into_iter().flatten() {
        ids.insert(s["id"].as_i64().unwrap_or(-1));
        let p = &s["summary"];
        let key = ["orca.run", "orca.step", "orca.partition", "orca.commit"]
            .map(|k| p[k].as_str().unwrap_or("?").to_string());
        if !seen.insert(key.clone()) {
            fail(
                w,
                trace,
                &format!("probe.rows holds two commits of {key:?}"),
            );
        }
        *commits.entry(key[2].clone()).or_default() += 1;
    }
    let mut rows: BTreeMap<String, i64> = BTreeMap::new();
    for r in table["rows"].as_array().into_iter().flatten() {
        *rows
            .entry(r["month"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    let want: BTreeMap<String, i64> = commits
        .iter()
        .map(|(m, n)| (m.clone(), days(m).unwrap_or(-1) * n))
        .collect();
    if rows != want {
        fail(
            w,
            trace,
            &format!(
                "probe.rows holds {rows:?} rows a month, its commits {commits:?} make {want:?}"
            ),
        );
    }
    for (step, output) in &outputs {
        let good = match step.as_str() {
            "write" => output
                .as_ref()
                .and_then(Value::as_i64)
                .is_some_and(|id| ids.contains(&id)),
            _ => output.as_ref().and_then(Value::as_i64) == Some(SRC_ROWS),
        };
        if !good {
            fail(
                w,
                trace,
                &format!("probe_tables step {step} gave {output:?} under faults"),
            );
        }
    }
    seen.len() as u64
}
