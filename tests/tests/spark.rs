//! Steps that hand their work to Spark (`orca::spark`), on a real
//! standalone cluster (a master and a worker from PyPI's pyspark, on Java
//! 17) started by the test: the application reads the snapshot the step
//! pinned and its result is committed by the step, equal to DataFusion's
//! over the same snapshot; a failing application fails the step with the
//! driver's words; cancelling the run kills the application. Skipped, and
//! saying so, only when pyspark or Java is missing (CI installs both).

use std::time::Duration;

use orca_tests::procs::{
    assert_pinned, orca, register, run_to_failure, table_lines, wait_run, Runner,
};
use orca_tests::spark::SparkCluster;
use orca_tests::*;

fn runner(
    db: &TestDb,
    cluster: &SparkCluster,
    wh: &str,
    dir: &std::path::Path,
    extra: &[(&'static str, String)],
) -> Runner {
    let app = repo_root().join("tests/py/spark_totals.py");
    let mut env = cluster.env();
    env.push(("ORCA_WAREHOUSE", wh.to_string()));
    env.push(("PROBE_SPARK_APP", app.to_string_lossy().to_string()));
    env.push((
        "ORCA_SPARK_STAGING",
        dir.join("staging").to_string_lossy().to_string(),
    ));
    env.extend_from_slice(extra);
    let refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Runner::start(&db.url(), "spark-runner", 1, &dir.join("logs"), &refs)
}

#[tokio::test]
async fn a_step_s_spark_application_reads_its_pinned_snapshot_and_the_step_commits_its_result() {
    if let Some(why) = orca_tests::spark::unavailable() {
        eprintln!("{why}");
        return;
    }
    let dir = scratch("spark");
    let cluster = SparkCluster::start(&dir.join("cluster"));
    let db = TestDb::new().await;
    register(&db, "probe_spark");
    let wh = dir.join("warehouse").to_string_lossy().to_string();
    let r = runner(&db, &cluster, &wh, &dir, &[]);
    let out = orca(&db, &["backfill", "probe_spark", "2024-01..2024-02"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        r.output()
    );
    // A backfill is a run per month.
    let runs: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, partitions[1] FROM orca.runs ORDER BY partitions[1]")
            .fetch_all(&db.pool)
            .await
            .expect("runs");
    assert_eq!(runs.len(), 2, "{runs:?}");
    for (run, _) in &runs {
        wait_run(&db, *run, "succeeded", &r).await;
    }
    let cols = ["month", "carrier", "flights", "delay"];
    let spark = table_lines(&db, &wh, "spark.totals", &cols);
    let local = table_lines(&db, &wh, "spark.totals_local", &cols);
    assert_eq!(
        spark.len(),
        10,
        "five carriers in each of two months: {spark:?}"
    );
    assert_eq!(
        spark, local,
        "Spark's totals are DataFusion's over the same snapshot"
    );
    // The application read the snapshot the step pinned, recorded as any read.
    assert_pinned(&db, "totals", "spark.events", &["2024-01", "2024-02"]).await;
    let log = r.output();
    assert!(
        log.contains("submitting") && log.contains("the Spark application"),
        "{log}"
    );
    let done: Vec<String> = cluster.state()["completedapps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["name"].as_str().map(str::to_string))
        .collect();
    assert!(
        runs.iter()
            .all(|(run, month)| done.contains(&format!("orca-probe_spark-{run}-totals-{month}"))),
        "{done:?}"
    );
    drop(r);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_failing_spark_application_fails_its_step_and_a_cancel_kills_it() {
    if let Some(why) = orca_tests::spark::unavailable() {
        eprintln!("{why}");
        return;
    }
    let dir = scratch("spark-fail");
    let cluster = SparkCluster::start(&dir.join("cluster"));
    let db = TestDb::new().await;
    register(&db, "probe_spark");
    let wh = dir.join("warehouse").to_string_lossy().to_string();

    // A task that raises: the step fails with the driver's words.
    let r = runner(
        &db,
        &cluster,
        &wh,
        &dir,
        &[("PROBE_SPARK_FAIL", "1".into())],
    );
    let error = run_to_failure(&db, "probe_spark", "2024-01", &r).await;
    assert!(
        error.contains("the Spark application")
            && error.contains("probe: the Spark job was asked to fail"),
        "{error}"
    );
    drop(r);

    // A long application: cancelling the run kills it on the cluster.
    let r = runner(
        &db,
        &cluster,
        &wh,
        &dir,
        &[("PROBE_SPARK_SLEEP", "600".into())],
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_spark', '2024-02')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let name = format!("orca-probe_spark-{run}-totals-2024-02");
    wait_until(
        "the application to run on the cluster",
        Duration::from_secs(180),
        || async { cluster.active().contains(&name).then_some(()) },
        || r.output(),
    )
    .await;
    sqlx::query("SELECT orca.cancel($1)")
        .bind(run)
        .execute(&db.pool)
        .await
        .expect("cancel");
    wait_until(
        "the cancelled application to be gone from the cluster",
        Duration::from_secs(90),
        || async { (!cluster.active().contains(&name)).then_some(()) },
        || format!("{}\n{}", r.output(), cluster.state()),
    )
    .await;
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("status");
    assert_eq!(status, "cancelled");
    drop(r);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
