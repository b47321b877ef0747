//! Infrastructure faults spend no retry: an attempt that fails while the
//! control plane crashes and restarts under it (a private cluster stopped
//! with `-m immediate`, its sessions cut with 57P01) is handed back, and the
//! run goes on with its retries as they were.

use std::time::Duration;

use orca_tests::cluster::PrivateCluster;
use orca_tests::procs::{attempts_of, register, wait_run, Runner};
use orca_tests::*;

#[tokio::test]
async fn an_attempt_failed_across_a_crash_of_the_control_plane_spends_no_retry() {
    let cluster = PrivateCluster::start(&[]);
    let db = TestDb::at(&cluster.url("postgres")).await;
    register(&db, "probe");
    let dir = scratch("restart-probe");
    let dirs = dir.to_string_lossy().to_string();
    // The first load of 2024-01 stalls (the crash comes then) and fails as a
    // step cut off by the crash would; the next attempt does neither.
    let runner = Runner::start(
        &db.url(),
        "r",
        1,
        &dir.join("logs"),
        &[
            ("PROBE_DIR", dirs.as_str()),
            ("PROBE_STALL_ONCE", "load:2024-01:6000"),
            ("PROBE_FAIL_ONCE", "load:2024-01"),
        ],
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_until(
        "the first attempt to stall",
        Duration::from_secs(60),
        || async { dir.join("stalling").exists().then_some(()) },
        || runner.output(),
    )
    .await;
    cluster.crash_restart();
    wait_run(&db, run, "succeeded", &runner).await;
    let (failures, losses): (i32, i32) =
        sqlx::query_as("SELECT failures, losses FROM orca.runs WHERE id = $1")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("run");
    assert_eq!(
        (failures, losses),
        (0, 0),
        "no retry and no lost attempt spent\n{}",
        runner.output()
    );
    let attempts = attempts_of(&db, run).await;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0].0, "released", "{attempts:?}");
    let why = attempts[0].1.clone().unwrap_or_default();
    assert!(
        why.starts_with("the control plane restarted at ")
            && why.contains("load:2024-01 fails once, on purpose"),
        "{why}"
    );
    assert_eq!(attempts[1].0, "succeeded", "{attempts:?}");
    drop(runner);
    drop(db);
    let _ = std::fs::remove_dir_all(dir);
}
