//! Continuous steps whose work is a Flink job (`orca::flink`), on a real
//! Flink session cluster (a JobManager and a TaskManager from PyPI's
//! apache-flink-libraries, on Java 17) started by the test, running a real
//! job (tests/flink/OrcaNumbers.java, built by the test with javac):
//! pausing the pipeline stops the job with a savepoint, unpausing resumes
//! it from that savepoint, cancelling the run stops it too and the next run
//! resumes where it stopped, and every number the job wrote is there once,
//! with no gap; a failing job fails its step with the job's root exception;
//! a bounded job finishes its step. Skipped, and saying so, only when
//! Flink's jars or the JDK are missing (CI installs both).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use orca_tests::flink::{build_job, FlinkCluster};
use orca_tests::procs::{register, run_to_failure, wait_run, Runner};
use orca_tests::*;

fn runner(
    db: &TestDb,
    cluster: &FlinkCluster,
    jar: &Path,
    dir: &Path,
    mode: &str,
    name: &str,
) -> Runner {
    let env = [
        ("ORCA_FLINK_URL", cluster.rest.clone()),
        (
            "ORCA_FLINK_SAVEPOINTS",
            format!("file://{}", dir.join("savepoints").display()),
        ),
        ("ORCA_FLINK_POLL_MS", "500".into()),
        ("PROBE_FLINK_JAR", jar.to_string_lossy().to_string()),
        (
            "PROBE_FLINK_OUT",
            dir.join("out").to_string_lossy().to_string(),
        ),
        ("PROBE_FLINK_MODE", mode.to_string()),
    ];
    let refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Runner::start(&db.url(), name, 1, &dir.join(format!("logs-{name}")), &refs)
}

/// Every number the job's committed files hold (the file sink's files in
/// progress are hidden, named with a leading dot), in file order.
fn committed(out: &Path) -> Vec<u64> {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut dirs = vec![out.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let hidden = e.file_name().to_string_lossy().starts_with('.');
            if p.is_dir() {
                dirs.push(p);
            } else if !hidden {
                files.push(p);
            }
        }
    }
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .map(|l| l.parse::<u64>().expect("a number a line"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The numbers are 0..n, each once: nothing lost and nothing written twice
/// across the job's stops and resumes.
fn assert_once_without_gaps(numbers: &[u64]) {
    let set: BTreeSet<u64> = numbers.iter().copied().collect();
    assert_eq!(
        set.len(),
        numbers.len(),
        "numbers written twice: {} lines, {} distinct",
        numbers.len(),
        set.len()
    );
    let max = set.iter().next_back().copied().unwrap_or(0);
    assert_eq!(
        set.len() as u64,
        max + 1,
        "numbers missing below {max}: {} of them there",
        set.len()
    );
}

async fn resume_point(db: &TestDb) -> Option<String> {
    sqlx::query_scalar(
        "SELECT location FROM orca.resume_points WHERE step = 'numbers' AND partition = '2024-01'",
    )
    .fetch_optional(&db.pool)
    .await
    .expect("resume point")
}

/// Waits for a job of the cluster other than `seen` to run; returns its id.
async fn new_job(cluster: &FlinkCluster, seen: &[String], r: &Runner) -> String {
    wait_until(
        "a new Flink job to run",
        Duration::from_secs(120),
        || async { cluster.running().into_iter().find(|j| !seen.contains(j)) },
        || format!("{}\n{}", r.output(), cluster.logs()),
    )
    .await
}

/// Waits for the job to have committed more than `n` numbers.
async fn written_past(out: &Path, n: usize, r: &Runner, cluster: &FlinkCluster) -> usize {
    wait_until(
        &format!("the job to commit more than {n} numbers"),
        Duration::from_secs(120),
        || async {
            let c = committed(out).len();
            (c > n).then_some(c)
        },
        || format!("{}\n{}", r.output(), cluster.logs()),
    )
    .await
}

/// The savepoint a job was restored from, as its checkpoint statistics say.
fn restored_from(cluster: &FlinkCluster, job: &str) -> Option<String> {
    let c = cluster.checkpoints(job);
    c.pointer("/latest/restored/external_path")
        .and_then(|v| v.as_str())
        .map(str::to_string)
}

#[tokio::test]
async fn a_paused_flink_job_stops_with_a_savepoint_and_resumes_from_it_across_runs() {
    if let Some(why) = orca_tests::flink::unavailable() {
        eprintln!("{why}");
        return;
    }
    let dir = scratch("flink");
    let jar = build_job(&dir.join("job"));
    let cluster = FlinkCluster::start(&dir.join("cluster"));
    let db = TestDb::new().await;
    register(&db, "probe_flink");
    let r = runner(&db, &cluster, &jar, &dir, "continuous", "flink-runner");
    let out = dir.join("out/2024-01");
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_flink', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let first = new_job(&cluster, &[], &r).await;
    assert_eq!(
        restored_from(&cluster, &first),
        None,
        "a first run starts afresh"
    );
    written_past(&out, 200, &r, &cluster).await;

    // Pause: the job stops with a savepoint under the step's directory,
    // recorded as its resume point; the run goes on, holding nothing on
    // the cluster, and nothing more is written.
    sqlx::query("SELECT orca.pause('probe_flink')")
        .execute(&db.pool)
        .await
        .expect("pause");
    let saved = wait_until(
        "the paused job's savepoint to be recorded",
        Duration::from_secs(120),
        || async { resume_point(&db).await },
        || format!("{}\n{}", r.output(), cluster.logs()),
    )
    .await;
    let own = format!(
        "file:{}/default/probe_flink/numbers/2024-01/savepoint-",
        dir.join("savepoints").display()
    );
    assert!(
        saved
            .replace("file:///", "file:/")
            .starts_with(&own.replace("file:///", "file:/")),
        "{saved} is not under {own}"
    );
    wait_until(
        "the paused job to be gone from the cluster",
        Duration::from_secs(60),
        || async { cluster.running().is_empty().then_some(()) },
        || r.output(),
    )
    .await;
    let stopped = cluster
        .jobs()
        .into_iter()
        .find(|(id, _, _)| *id == first)
        .map(|(_, _, state)| state);
    assert_eq!(
        stopped.as_deref(),
        Some("FINISHED"),
        "stopped with a savepoint, not failed"
    );
    let at_pause = committed(&out).len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        committed(&out).len(),
        at_pause,
        "a paused job writes nothing"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("status");
    assert_eq!(status, "running", "a paused step waits in its attempt");
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orca.events WHERE kind = 'step.resume_point' AND run_id = $1",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("events");
    assert_eq!(events, 1, "the savepoint is an event");

    // Unpause: a new job, restored from that savepoint, goes on writing.
    sqlx::query("SELECT orca.unpause('probe_flink')")
        .execute(&db.pool)
        .await
        .expect("unpause");
    let second = new_job(&cluster, std::slice::from_ref(&first), &r).await;
    let restored = wait_until(
        "the resumed job to say where it was restored from",
        Duration::from_secs(60),
        || async { restored_from(&cluster, &second) },
        || r.output(),
    )
    .await;
    assert_eq!(
        restored.trim_end_matches('/'),
        saved.trim_end_matches('/'),
        "resumed from the recorded savepoint"
    );
    written_past(&out, at_pause + 200, &r, &cluster).await;

    // Cancel: the job is stopped (by the step, or by its guard once the
    // runner killed the step) with a savepoint the next run resumes from.
    sqlx::query("SELECT orca.cancel($1)")
        .bind(run)
        .execute(&db.pool)
        .await
        .expect("cancel");
    wait_until(
        "the cancelled run's job to be gone from the cluster",
        Duration::from_secs(120),
        || async { cluster.running().is_empty().then_some(()) },
        || format!("{}\n{}", r.output(), cluster.logs()),
    )
    .await;
    let at_cancel = wait_until(
        "the cancelled job's savepoint to be recorded",
        Duration::from_secs(120),
        || async { resume_point(&db).await.filter(|l| *l != saved) },
        || format!("{}\n{}", r.output(), cluster.logs()),
    )
    .await;
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("status");
    assert_eq!(status, "cancelled");

    // The next run resumes where the cancelled one stopped.
    let next: i64 = sqlx::query_scalar("SELECT orca.run('probe_flink', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let third = new_job(&cluster, &[first.clone(), second.clone()], &r).await;
    let restored = wait_until(
        "the next run's job to say where it was restored from",
        Duration::from_secs(60),
        || async { restored_from(&cluster, &third) },
        || r.output(),
    )
    .await;
    assert_eq!(
        restored.trim_end_matches('/'),
        at_cancel.trim_end_matches('/')
    );
    let before = committed(&out).len();
    written_past(&out, before + 100, &r, &cluster).await;
    sqlx::query("SELECT orca.cancel($1)")
        .bind(next)
        .execute(&db.pool)
        .await
        .expect("cancel");
    wait_until(
        "the last job to be gone from the cluster",
        Duration::from_secs(120),
        || async { cluster.running().is_empty().then_some(()) },
        || format!("{}\n{}", r.output(), cluster.logs()),
    )
    .await;
    // Three jobs, two stops and a cancel: each number once, none missing.
    let numbers = committed(&out);
    assert!(numbers.len() > before, "{} numbers", numbers.len());
    assert_once_without_gaps(&numbers);
    eprintln!(
        "flink: {} numbers over 3 jobs; paused at {at_pause}, resumed from {saved}",
        numbers.len()
    );
    drop(r);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_failing_flink_job_fails_its_step_and_a_bounded_one_finishes_it() {
    if let Some(why) = orca_tests::flink::unavailable() {
        eprintln!("{why}");
        return;
    }
    let dir = scratch("flink-ends");
    let jar = build_job(&dir.join("job"));
    let cluster = FlinkCluster::start(&dir.join("cluster"));
    let db = TestDb::new().await;
    register(&db, "probe_flink");

    // A job that throws: the step fails with the job's root exception.
    let r = runner(&db, &cluster, &jar, &dir, "fail", "flink-fail");
    let error = run_to_failure(&db, "probe_flink", "2024-01", &r).await;
    assert!(
        error.contains("the Flink job")
            && error.contains(
                "java.lang.IllegalStateException: probe: the job was asked to fail at 50"
            ),
        "{error}"
    );
    drop(r);
    assert_eq!(
        resume_point(&db).await,
        None,
        "a failed job recorded no savepoint"
    );

    // A bounded job: the step succeeds when it finishes, with every number.
    let r = runner(&db, &cluster, &jar, &dir, "bounded 300", "flink-bounded");
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_flink', '2024-02')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_run(&db, run, "succeeded", &r).await;
    let numbers = committed(&dir.join("out/2024-02"));
    assert_eq!(numbers.len(), 300, "{numbers:?}");
    assert_once_without_gaps(&numbers);
    let output: serde_json::Value = sqlx::query_scalar(
        "SELECT output FROM orca.step_states WHERE run_id = $1 AND step = 'numbers'",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("output");
    assert_eq!(output["state"], "FINISHED", "{output}");
    assert!(output["resumed_from"].is_null(), "{output}");
    drop(r);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
