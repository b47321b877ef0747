//! Bounded inputs: what a child or a source sends the runner is held to
//! limits, and going over fails the attempt with a clear error instead of
//! filling the runner's memory. (The engine's own limits — a files
//! source's record, the data edge's pending batches, the control channel's
//! clients and their user — are tested beside their code.)

use super::*;

#[tokio::test]
async fn a_child_s_overlong_output_line_fails_its_attempt_not_the_runner() {
    let db = TestDb::new().await;
    register(&db, &bin("probe"));
    let logs = scratch("limits");
    let probe_dir = logs.to_string_lossy().to_string();
    let env = [
        ("PROBE_DIR", probe_dir.as_str()),
        // 64 MiB without a line end, against a runner that takes 64 KiB.
        ("PROBE_LINE_BYTES", "67108864"),
        ("ORCA_OUTPUT_LINE_MAX", "65536"),
    ];
    let runner = Runner::start(&db.url(), "r1", 1, &logs, &env);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let error: String = wait_until(
        "the flooding attempt to fail",
        Duration::from_secs(120),
        || async {
            sqlx::query_scalar::<_, String>(
                "SELECT error FROM orca.attempts WHERE run_id = $1 AND status = 'failed' \
                 ORDER BY id LIMIT 1",
            )
            .bind(run)
            .fetch_optional(&db.pool)
            .await
            .ok()
            .flatten()
        },
        || outputs(&[&runner]),
    )
    .await;
    assert!(
        error.contains("a line of more than 65536 bytes") && error.contains("--output-line-max"),
        "{error}"
    );
    // The runner took none of it and goes on working.
    assert!(
        runner.output().len() < 1 << 20,
        "the runner echoed the flood"
    );
    assert!(
        std::path::Path::new(&format!("/proc/{}", runner.pid())).exists(),
        "the runner died"
    );
    drop(runner);
    let _ = std::fs::remove_dir_all(&logs);
}
