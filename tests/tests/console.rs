//! The console in a real browser: Debian's chromium driven by Playwright
//! (tests/py/console_test.py) against a real `orca serve`, over a database
//! with a real runner running the probe pipeline. Screenshots of each page
//! go to a scratch directory (or ORCA_CONSOLE_SCREENSHOTS), which the test
//! prints.

use std::process::Command;

use orca_tests::procs::{bin, sync_runner, wait_run, Runner};
use orca_tests::serve::{api_key, serve};
use orca_tests::sqlx;
use orca_tests::*;
use serde_json::json;

fn playwright_python() -> String {
    std::env::var("ORCA_TEST_PLAYWRIGHT").unwrap_or_else(|_| "/var/tmp/orca-pw/bin/python".into())
}

#[tokio::test]
async fn a_user_drives_the_console_in_a_browser() {
    let db = TestDb::new().await;
    let out = Command::new(bin("orca"))
        .args(["register", bin("probe").to_str().unwrap_or_default()])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca register");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A pipeline no runner serves (its pool has none), with its code's
    // repository and commit, and datasets.
    let mut parked = lake_manifest("parked");
    parked["pool"] = json!("idle");
    parked["source"] = json!("https://github.com/example/orca-pipelines");
    parked["commit"] = json!("0123456789abcdef0123456789abcdef01234567");
    parked["locations"] = json!({"pipeline": {"file": "src/main.rs", "line": 3},
                                 "steps": {"one": {"file": "src/steps.rs", "line": 42}}});
    parked["steps"][0]["reads"] = json!(["parked.raw"]);
    parked["steps"][0]["writes"] = json!(["parked.clean"]);
    sqlx::query("SELECT orca.register($1)")
        .bind(&parked)
        .execute(&db.pool)
        .await
        .expect("register parked");
    let parked_run: i64 = sqlx::query_scalar("SELECT orca.run('parked', '2024-03')")
        .fetch_one(&db.pool)
        .await
        .expect("a run that waits");
    // An incident: a run whose only attempt failed, in a pool of its own,
    // claimed and failed through SQL as a runner there would.
    let mut broken = lake_manifest("broken");
    broken["pool"] = json!("nowhere");
    broken["run_retries"] = json!(0);
    broken["steps"][0]["writes"] = json!(["broken.out"]);
    sqlx::query("SELECT orca.register($1)")
        .bind(&broken)
        .execute(&db.pool)
        .await
        .expect("register broken");
    sqlx::query(
        "SELECT orca.run('broken', '2024-01'), \
                (SELECT orca.finish(lease, false, 'the disk is full') \
                 FROM orca.claim('sql-runner', 'nowhere', 1))",
    )
    .execute(&db.pool)
    .await
    .expect("a failed run");
    // A webhook endpoint with a failed and a delivered try, as a relay records them.
    let hook: i64 = sqlx::query_scalar(
        "SELECT (orca.create_webhook('https://hooks.example.com/orca', '{run.*}') ->> 'id')::bigint",
    )
    .fetch_one(&db.pool)
    .await
    .expect("a webhook");
    for (ok, code) in [(false, 503), (true, 200)] {
        sqlx::query("SELECT orca.relay_done($1, 1, $2, $3, 12, NULL, 'relay-a')")
            .bind(hook)
            .bind(ok)
            .bind(code)
            .execute(&db.pool)
            .await
            .expect("a delivery try");
    }
    // A sync (its local paths are under the scratch root the test org may use).
    let root = scratch_root();
    sqlx::query("SELECT orca.create_sync('mirror', $1, $2, $3)")
        .bind(json!({"type": "files", "url": format!("{root}/console-in"), "format": "jsonl"}))
        .bind(json!({"type": "parquet", "url": format!("{root}/console-out")}))
        .bind(json!([{"name": "events", "pattern": "*.jsonl"}]))
        .execute(&db.pool)
        .await
        .expect("a sync");
    // Two files the sync moves for real, so that its page charts epochs.
    let input = std::path::PathBuf::from(format!("{root}/console-in"));
    let _ = std::fs::remove_dir_all(&input);
    let _ = std::fs::remove_dir_all(format!("{root}/console-out"));
    std::fs::create_dir_all(&input).expect("the sync's input");
    for (i, n) in [(1, 30), (2, 70)] {
        let lines: String = (0..n).map(|k| format!("{{\"n\": {k}}}\n")).collect();
        std::fs::write(input.join(format!("part-{i}.jsonl")), lines).expect("an input file");
    }
    let sync_dir = scratch("console-sync");
    let syncer = sync_runner(&db, &sync_dir.join("store"), &sync_dir.join("logs"));
    let sync_run: i64 = sqlx::query_scalar("SELECT orca.run('mirror', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run the sync");
    wait_run(&db, sync_run, "succeeded", &syncer).await;
    drop(syncer);
    let logs = scratch("console-runner");
    let dir = logs.to_string_lossy().to_string();
    let env = [("PROBE_DIR", dir.as_str()), ("PROBE_SLEEP_MS", "300")];
    let runner = Runner::start(&db.url(), "console-runner", 2, &logs, &env);
    let key = api_key(&db, "default", "console", "operator").await;
    let server = serve(&db).await;
    let shots = std::env::var("ORCA_CONSOLE_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| scratch("console-screenshots"));

    // Every step of the script has its own timeout (Playwright's), so a
    // blocking wait is bounded; the server and the runner are processes.
    let out = Command::new(playwright_python())
        .arg(repo_root().join("tests/py/console_test.py"))
        .args([
            server.base.as_str(),
            key.as_str(),
            shots.to_str().unwrap_or_default(),
            "probe",
            "parked",
            &parked_run.to_string(),
        ])
        .output()
        .expect("run the browser test (scripts/setup.sh installs playwright)");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("console ok"),
        "{text}\nrunner:\n{}",
        runner.output()
    );
    println!("console screenshots: {}", shots.display());
    for page in [
        "login",
        "pipelines",
        "pipeline",
        "run",
        "cancelled",
        "datasets",
        "runners",
        "incident",
        "sync",
    ] {
        let png = shots.join(format!("{page}.png"));
        let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
        assert!(size > 1000, "no screenshot of {page}: {}", png.display());
    }
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(parked_run)
        .fetch_one(&db.pool)
        .await
        .expect("the parked run");
    assert_eq!(
        status, "cancelled",
        "the console's cancel reached the control plane"
    );
    drop(server);
    drop(runner);
}
