//! Sizing with a real runner: `probe_memory` declares 96 MiB growing
//! four-fold; its step holds 200 MiB. The runner holds the binary to each
//! attempt's memory (RLIMIT_DATA), so the first attempt dies for memory,
//! is reported so, and the second, at 384 MiB, succeeds: no retry spent.

use orca_tests::procs::{bin, orca, wait_run, Runner};
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::Value;

/// (number, resources, killed_for, status, error) of an attempt.
type AttemptRow = (i32, Value, Option<String>, String, Option<String>);

#[tokio::test]
async fn an_attempt_killed_for_memory_by_the_runner_s_limit_succeeds_bigger() {
    let db = TestDb::new().await;
    let out = orca(
        &db,
        &["register", bin("probe_memory").to_str().unwrap_or_default()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logs = scratch("sizing");
    let runner = Runner::start(&db.url(), "sizer", 1, &logs, &[]);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_memory', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_run(&db, run, "succeeded", &runner).await;
    let seen: Vec<AttemptRow> = sqlx::query_as(
        "SELECT number, resources, killed_for, status, error FROM orca.attempts \
         WHERE run_id = $1 ORDER BY number",
    )
    .bind(run)
    .fetch_all(&db.pool)
    .await
    .expect("attempts");
    assert_eq!(seen.len(), 2, "{seen:?}\n{}", runner.output());
    assert_eq!(seen[0].1["memory_bytes"], 96 << 20);
    assert_eq!(seen[0].2.as_deref(), Some("memory"));
    assert_eq!(seen[0].3, "failed");
    let error = seen[0].4.clone().unwrap_or_default();
    assert!(
        error.contains("killed for memory") && error.contains("96 MiB"),
        "{error}"
    );
    assert_eq!(seen[1].1["memory_bytes"], 384 << 20);
    assert_eq!(seen[1].2, None);
    assert_eq!(seen[1].3, "succeeded");
    let failures = db
        .scalar_i64(&format!(
            "SELECT failures::bigint FROM orca.runs WHERE id = {run}"
        ))
        .await;
    assert_eq!(failures, 0, "a kill for memory spends no retry");
    // `orca run` shows each attempt's size and why the first died.
    let out = orca(&db, &["run", &run.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("96 MiB") && text.contains("384 MiB"),
        "{text}"
    );
    assert!(text.contains("killed for memory"), "{text}");
    db.pool.execute("SELECT 1").await.expect("still there");
}
