//! Steps whose SQL runs on a Ballista cluster (a scheduler and two
//! executors, real `orca-ballista` processes started by the test): the
//! result equals DataFusion's in the step over the same pinned snapshot,
//! the reads are pinned and recorded as for a local query, an executor
//! SIGKILLed mid-query ends with the result committed once, and a cluster
//! that serves one org refuses another's queries.

use std::collections::BTreeMap;
use std::time::Duration;

use orca_tests::ballista::BallistaCluster;
use orca_tests::procs::{
    assert_pinned, orca, pyiceberg, register, run_to_failure, table_lines, wait_run, Runner,
};
use orca_tests::*;

fn runner(
    db: &TestDb,
    cluster: &BallistaCluster,
    wh: &str,
    dir: &std::path::Path,
    extra: &[(&str, &str)],
) -> Runner {
    let url = cluster.url();
    let mut env: Vec<(&str, &str)> =
        vec![("ORCA_WAREHOUSE", wh), ("ORCA_BALLISTA_URL", url.as_str())];
    env.extend_from_slice(extra);
    Runner::start(&db.url(), "ballista-runner", 1, &dir.join("logs"), &env)
}

#[tokio::test]
async fn a_step_s_sql_runs_on_a_ballista_cluster_over_the_snapshot_it_pinned() {
    let dir = scratch("ballista");
    let wh = dir.join("warehouse").to_string_lossy().to_string();
    let cluster = BallistaCluster::start(&dir.join("cluster"), 2, Some(("default", &wh)));
    let db = TestDb::new().await;
    register(&db, "probe_ballista");
    let r = runner(&db, &cluster, &wh, &dir, &[]);
    let out = orca(&db, &["backfill", "probe_ballista", "2024-01..2024-02"]);
    assert!(
        out.status.success(),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        r.output()
    );
    let runs: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, partitions[1] FROM orca.runs ORDER BY partitions[1]")
            .fetch_all(&db.pool)
            .await
            .expect("runs");
    assert_eq!(runs.len(), 2, "{runs:?}");
    for (run, _) in &runs {
        wait_run(&db, *run, "succeeded", &r).await;
    }
    let cols = ["month", "carrier", "name", "flights", "delay", "worst"];
    let remote = table_lines(&db, &wh, "dist.totals", &cols);
    let local = table_lines(&db, &wh, "dist.totals_local", &cols);
    assert_eq!(
        remote.len(),
        10,
        "five carriers in each of two months: {remote:?}"
    );
    assert_eq!(
        remote, local,
        "Ballista's result is DataFusion's over the same snapshot"
    );
    // Pinned and recorded as any read, once per partition.
    assert_pinned(&db, "totals", "dist.events", &["2024-01", "2024-02"]).await;
    // The step planned the scan (the month's four files of eight) and the
    // cluster ran it: each step's query is a job on the scheduler.
    let log = r.output();
    assert!(
        log.contains(&format!(
            "query runs on the Ballista cluster at {}",
            cluster.url()
        )),
        "{log}"
    );
    assert!(log.contains("scan of dist.events at snapshot"), "{log}");
    assert!(log.contains(": 4 of 8 data files"), "{log}");
    assert!(
        log.contains("its executors wrote 5 rows of dist.written in"),
        "{log}"
    );
    let jobs = cluster.jobs();
    assert_eq!(jobs.len(), 4, "two jobs a month: {jobs:?}");
    for j in &jobs {
        let status = j["job_status"].as_str().unwrap_or_default().to_lowercase();
        assert!(
            status.contains("success") || status.contains("complete"),
            "{j}"
        );
        let name = j["job_name"].as_str().unwrap_or_default();
        assert!(name.contains("totals"), "{j}");
    }
    drop(r);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What `PAIRS` of `probe_ballista` counts for a month of `seed`'s rows:
/// for each carrier, the pairs of its flights with equal delays.
fn expected_pairs(days: u64) -> BTreeMap<String, i64> {
    let carriers = ["AA", "B6", "DL", "UA", "WN"];
    let seed = days * 31;
    let mut counts: BTreeMap<(usize, i64), i64> = BTreeMap::new();
    for i in 0..100_000u64 {
        let delay = ((i * 7919 + seed) % 211) as i64 - 40;
        *counts.entry(((i % 5) as usize, delay)).or_default() += 1;
    }
    let mut out = BTreeMap::new();
    for ((c, _), n) in counts {
        *out.entry(carriers[c].to_string()).or_default() += n * n;
    }
    out
}

#[tokio::test]
async fn an_executor_killed_mid_query_leaves_the_result_committed_once() {
    let dir = scratch("ballista-kill");
    let wh = dir.join("warehouse").to_string_lossy().to_string();
    let mut cluster = BallistaCluster::start(&dir.join("cluster"), 2, None);
    let db = TestDb::new().await;
    register(&db, "probe_ballista");
    let r = runner(&db, &cluster, &wh, &dir, &[("PROBE_HEAVY", "1")]);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_ballista', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    // The third job of the step is the self-join: once its scans are done
    // (two stages of four), its join runs on every slot of both executors;
    // kill one then.
    wait_until(
        "the self-join's join stage to run on the cluster",
        Duration::from_secs(300),
        || async {
            let jobs = cluster.jobs();
            // The step's jobs: its totals streamed back, written by the
            // executors, then the self-join.
            let joining = jobs.len() >= 3
                && jobs.iter().any(|j| {
                    let s = j["job_status"].as_str().unwrap_or_default().to_lowercase();
                    s.contains("running") && j["completed_stages"].as_u64() >= Some(2)
                });
            joining.then_some(())
        },
        || format!("{}\n{}", r.output(), cluster.logs()),
    )
    .await;
    cluster.kill_executor(0);
    wait_for_sql(
        &db,
        "the run to succeed",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(600),
        || format!("{}\n{}", r.output(), cluster.logs()),
    )
    .await;
    let got: BTreeMap<String, i64> = pyiceberg(&["read", &db.url(), &wh, "dist.pairs"])["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["carrier"].as_str().unwrap_or_default().to_string(),
                r["pairs"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    let rows = pyiceberg(&["read", &db.url(), &wh, "dist.pairs"])["rows"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(rows, 5, "the result committed once: {got:?}");
    assert_eq!(got, expected_pairs(31));
    // The scheduler saw the executor die: it ran the lost tasks on the
    // other executor (the stage re-run), or failed the job and the step's
    // retry ran the query again. Either way the result is committed once.
    wait_until(
        "the scheduler to remove the dead executor",
        Duration::from_secs(60),
        || async {
            cluster
                .log("scheduler")
                .contains("Removing executor")
                .then_some(())
        },
        || cluster.logs(),
    )
    .await;
    let how = if r.output().contains("failed, retrying") {
        "the step retried"
    } else {
        "the cluster finished the query without it"
    };
    eprintln!("after the executor's death, {how}");
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM orca.attempts WHERE run_id = $1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("attempts");
    eprintln!("attempts of the run whose executor died: {attempts}");
    drop(r);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_cluster_serving_one_org_refuses_another_org_s_query() {
    let dir = scratch("ballista-org");
    let wh = dir.join("warehouse").to_string_lossy().to_string();
    let cluster = BallistaCluster::start(&dir.join("cluster"), 1, Some(("globex", &wh)));
    let db = TestDb::new().await;
    register(&db, "probe_ballista");
    let r = runner(&db, &cluster, &wh, &dir, &[]);
    let error = run_to_failure(&db, "probe_ballista", "2024-01", &r).await;
    assert!(
        error.contains(
            "this cluster serves org globex; a query of org default reading dist.events is refused"
        ),
        "{error}"
    );
    // Nothing was written from the refused query.
    let written: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM public.iceberg_tables WHERE table_name LIKE 'totals%'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("tables");
    assert_eq!(written, 0, "no result table was made");
    drop(r);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
