//! End to end with real processes: the extension in PostgreSQL, `orca-runner`
//! processes, the `probe` pipeline binary (built on the SDK) and the `orca`
//! CLI. Runners tick themselves (`--tick-ms`) since this server does not
//! preload the extension.

use std::process::Command;
use std::time::Duration;

use orca_tests::procs::{bin, orca, outputs, probe_calls as calls, Runner};
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::Value;

async fn register_probe(db: &TestDb) {
    let out = orca(db, &["register", bin("probe").to_str().unwrap_or_default()]);
    assert!(
        out.status.success(),
        "orca register: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The gather step's output of an undisturbed in-memory run.
fn in_memory_total(partitions: &str) -> Value {
    let logs = scratch("mem");
    let out = Command::new(bin("probe"))
        .args(["run", "--partitions", partitions])
        .arg("--logs")
        .arg(&logs)
        .output()
        .expect("probe run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("total *: "))
        .unwrap_or_else(|| panic!("no total in {text}"));
    serde_json::from_str(line).expect("total JSON")
}

async fn output_of(db: &TestDb, run: i64, step: &str, partition: &str) -> Value {
    sqlx::query_scalar(
        "SELECT output FROM orca.step_states WHERE run_id = $1 AND step = $2 AND partition = $3",
    )
    .bind(run)
    .bind(step)
    .bind(partition)
    .fetch_one(&db.pool)
    .await
    .expect("step output")
}

#[tokio::test]
async fn two_runners_finish_a_three_month_backfill() {
    let db = TestDb::new().await;
    register_probe(&db).await;
    let logs = scratch("backfill");
    let dir = logs.to_string_lossy().to_string();
    let env = [("PROBE_DIR", dir.as_str())];
    let a = Runner::start(&db.url(), "runner-a", 2, &logs, &env);
    let b = Runner::start(&db.url(), "runner-b", 2, &logs, &env);
    // The CLI queues the runs and follows them until they finish.
    let out = orca(&db, &["backfill", "probe", "2024-01..2024-03"]);
    assert!(
        out.status.success(),
        "orca backfill: {}{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        a.output(),
        b.output()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("queued 3 run(s)"), "{stdout}");
    assert!(stdout.contains("3/3 done: 3 succeeded"), "{stdout}");
    let states = db
        .strings(
            "SELECT step || '/' || partition || '/' || status FROM orca.step_states ORDER BY 1",
        )
        .await;
    assert_eq!(
        states,
        [
            "load/2024-01/succeeded",
            "load/2024-02/succeeded",
            "load/2024-03/succeeded",
            "measure/2024-01/succeeded",
            "measure/2024-02/succeeded",
            "measure/2024-03/succeeded",
            "total/*/succeeded",
            "total/*/succeeded",
            "total/*/succeeded"
        ]
    );
    // Each run's output is what an in-memory run of its month gives.
    for (run, month) in db
        .strings("SELECT id || ' ' || partitions[1] FROM orca.runs ORDER BY id")
        .await
        .iter()
        .filter_map(|s| s.split_once(' '))
    {
        let run: i64 = run.parse().expect("run id");
        assert_eq!(
            output_of(&db, run, "total", "*").await,
            in_memory_total(month)
        );
    }
    // The attempts recorded which build ran them.
    let hashes = db
        .strings("SELECT DISTINCT build->>'registry_hash' FROM orca.attempts")
        .await;
    let registered = db
        .strings("SELECT registry_hash FROM orca.pipeline_versions")
        .await;
    assert_eq!(hashes, registered);
}

#[tokio::test]
async fn a_step_that_fails_once_succeeds_on_its_retry() {
    let db = TestDb::new().await;
    register_probe(&db).await;
    let logs = scratch("retry");
    let dir = logs.to_string_lossy().to_string();
    let r = Runner::start(
        &db.url(),
        "runner",
        1,
        &logs,
        &[
            ("PROBE_DIR", dir.as_str()),
            ("PROBE_FAIL_ONCE", "measure:2024-02"),
        ],
    );
    db.pool
        .execute("SELECT orca.run('probe', '2024-02')")
        .await
        .expect("run");
    wait_for_sql(
        &db,
        "the run to succeed",
        "SELECT bool_and(status = 'succeeded') FROM orca.runs",
        Duration::from_secs(30),
        || outputs(&[&r]),
    )
    .await;
    let (attempts, status): (i32, String) = sqlx::query_as(
        "SELECT attempts, status FROM orca.step_states WHERE step = 'measure' AND partition = '2024-02'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("state");
    assert_eq!((attempts, status.as_str()), (2, "succeeded"));
    let c = calls(&logs);
    assert_eq!(c.get(&("measure".into(), "2024-02".into())), Some(&2));
    assert_eq!(c.get(&("load".into(), "2024-02".into())), Some(&1));
    // One attempt of the run: the step retried inside it.
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.attempts").await, 1);
}

#[tokio::test]
async fn a_killed_runner_s_run_resumes_elsewhere_without_redoing_steps() {
    let db = TestDb::new().await;
    db.pool
        .execute(format!("ALTER DATABASE \"{}\" SET orca.lease_seconds = 2", db.name).as_str())
        .await
        .expect("short leases");
    register_probe(&db).await;
    let logs = scratch("kill");
    let dir = logs.to_string_lossy().to_string();
    let env = [
        ("PROBE_DIR", dir.as_str()),
        ("PROBE_STALL_ONCE", "total:*:30000"),
    ];
    let mut a = Runner::start(&db.url(), "doomed", 1, &logs, &env);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe', '2024-01..2024-03')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    // Wait until the gather step is under way, then kill the runner and its
    // pipeline binary with SIGKILL.
    let stalling = logs.join("stalling");
    wait_until(
        "the gather step to stall",
        Duration::from_secs(30),
        || async { stalling.exists().then_some(()) },
        || a.output(),
    )
    .await;
    a.kill();
    let b = Runner::start(&db.url(), "survivor", 1, &logs, &env);
    wait_for_sql(
        &db,
        "the run to succeed on another runner",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(60),
        || outputs(&[&b]),
    )
    .await;
    let attempts = db
        .strings(&format!(
            "SELECT number || ' ' || status || ' ' || runner FROM orca.attempts WHERE run_id = {run} ORDER BY number"
        ))
        .await;
    assert_eq!(attempts, ["1 lost doomed", "2 succeeded survivor"]);
    // Steps that had succeeded were not run again; the killed one was.
    let c = calls(&logs);
    for m in ["2024-01", "2024-02", "2024-03"] {
        assert_eq!(
            c.get(&("load".into(), m.into())),
            Some(&1),
            "load {m}: {c:?}"
        );
        assert_eq!(
            c.get(&("measure".into(), m.into())),
            Some(&1),
            "measure {m}: {c:?}"
        );
    }
    assert_eq!(c.get(&("total".into(), "*".into())), Some(&2));
    // And the result is what an undisturbed run gives.
    assert_eq!(
        output_of(&db, run, "total", "*").await,
        in_memory_total("2024-01..2024-03")
    );
}

#[tokio::test]
async fn max_runs_holds_under_a_backfill_of_twelve() {
    let db = TestDb::new().await;
    register_probe(&db).await; // max_runs = 2
    let logs = scratch("maxruns");
    let dir = logs.to_string_lossy().to_string();
    let env = [("PROBE_DIR", dir.as_str()), ("PROBE_SLEEP_MS", "100")];
    let a = Runner::start(&db.url(), "a", 3, &logs, &env);
    let b = Runner::start(&db.url(), "b", 3, &logs, &env);
    db.pool
        .execute("SELECT orca.backfill('probe', '2024-01..2024-12')")
        .await
        .expect("backfill");
    let most = std::cell::Cell::new(0);
    wait_until(
        "the backfill to finish",
        Duration::from_secs(90),
        || async {
            let running = db
                .scalar_i64("SELECT count(*) FROM orca.runs WHERE status = 'running'")
                .await;
            most.set(most.get().max(running));
            assert!(running <= 2, "{running} runs running at once");
            let done = db
                .scalar_i64("SELECT count(*) FROM orca.runs WHERE status = 'succeeded'")
                .await;
            (done == 12).then_some(())
        },
        || outputs(&[&a, &b]),
    )
    .await;
    let most = most.get();
    assert_eq!(most, 2, "the cap was reached");
    // No two attempts of more than two runs ever overlapped in time.
    let overlapping = db
        .scalar_i64(
            "SELECT max(c) FROM (
                 SELECT (SELECT count(*) FROM orca.attempts y
                         WHERE y.leased_at <= x.leased_at AND y.finished_at > x.leased_at) AS c
                 FROM orca.attempts x) t",
        )
        .await;
    assert!(overlapping <= 2, "{overlapping} attempts overlapped");
}

#[tokio::test]
async fn sigterm_hands_a_long_attempt_back_after_the_grace_period() {
    let db = TestDb::new().await;
    register_probe(&db).await;
    let logs = scratch("sigterm");
    let dir = logs.to_string_lossy().to_string();
    let env = [
        ("PROBE_DIR", dir.as_str()),
        ("PROBE_STALL_ONCE", "load:2024-05:60000"),
    ];
    let mut a = Runner::start(&db.url(), "leaving", 1, &logs, &env);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe', '2024-05')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let stalling = logs.join("stalling");
    wait_until(
        "the attempt to stall",
        Duration::from_secs(30),
        || async { stalling.exists().then_some(()) },
        || a.output(),
    )
    .await;
    // SIGTERM: no new claims, a grace period (5 s here), then the attempt is
    // handed back and the runner exits cleanly.
    let status = a.terminate().expect("runner exit status");
    assert!(status.success(), "{}", a.output());
    assert!(a.output().contains("handed back"), "{}", a.output());
    let b = Runner::start(&db.url(), "staying", 1, &logs, &env);
    wait_for_sql(
        &db,
        "the run to finish on the other runner",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(30),
        || outputs(&[&b]),
    )
    .await;
    let attempts = db
        .strings(&format!(
            "SELECT number || ' ' || status || ' ' || runner FROM orca.attempts WHERE run_id = {run} ORDER BY number"
        ))
        .await;
    assert_eq!(attempts, ["1 released leaving", "2 succeeded staying"]);
    let (failures, losses): (i32, i32) =
        sqlx::query_as("SELECT failures, losses FROM orca.runs WHERE id = $1")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("budgets");
    assert_eq!((failures, losses), (0, 0), "a hand-back spends no retries");
}

#[tokio::test]
async fn a_binary_whose_code_changed_refuses_the_old_version_s_runs() {
    let db = TestDb::new().await;
    register_probe(&db).await;
    // As if the binary at the registered path had been rebuilt with other code.
    db.pool
        .execute("UPDATE orca.pipeline_versions SET registry_hash = 'older-code'")
        .await
        .expect("stale version");
    let logs = scratch("stale");
    let r = Runner::start(&db.url(), "runner", 1, &logs, &[]);
    db.pool
        .execute("SELECT orca.run('probe', '2024-01')")
        .await
        .expect("run");
    wait_for_sql(
        &db,
        "the run to fail",
        "SELECT bool_and(status = 'failed') FROM orca.runs",
        Duration::from_secs(30),
        || outputs(&[&r]),
    )
    .await;
    let error: String = sqlx::query_scalar("SELECT error FROM orca.runs")
        .fetch_one(&db.pool)
        .await
        .expect("error");
    assert!(error.contains("exit code 3"), "{error}");
    assert!(error.contains("register this binary"), "{error}");
    assert!(error.contains("older-code"), "{error}");
}

#[tokio::test]
async fn locate_and_register_record_where_each_step_is() {
    let db = TestDb::new().await;
    let dir = scratch("locate");
    let copy = dir.join("probe");
    std::fs::copy(bin("probe"), &copy).expect("copy the binary");
    let root = repo_root().join("tests/probe");
    let out = orca(
        &db,
        &[
            "locate",
            copy.to_str().unwrap_or_default(),
            "--root",
            root.to_str().unwrap_or_default(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let source =
        std::fs::read_to_string(repo_root().join("tests/probe/src/main.rs")).expect("probe source");
    let line_of = |needle: &str| {
        source
            .lines()
            .position(|l| l.starts_with(needle))
            .map(|i| i + 1)
            .unwrap_or_else(|| panic!("{needle} not in the probe"))
    };
    let located: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("probe.source.json")).expect("sidecar"),
    )
    .expect("sidecar JSON");
    assert_eq!(located["steps"]["load"]["file"], "src/main.rs");
    assert_eq!(located["steps"]["load"]["line"], line_of("fn load("));
    assert_eq!(located["steps"]["total"]["line"], line_of("fn total("));
    assert_eq!(located["pipeline"]["line"], line_of("orca::pipeline!"));
    // orca register records them with the version.
    let out = orca(&db, &["register", copy.to_str().unwrap_or_default()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored: Value =
        sqlx::query_scalar("SELECT manifest->'locations' FROM orca.pipeline_versions")
            .fetch_one(&db.pool)
            .await
            .expect("manifest");
    assert_eq!(stored["steps"]["measure"]["line"], line_of("fn measure("));
}

#[tokio::test]
async fn cli_errors_name_what_was_wrong_and_exit_non_zero() {
    let db = TestDb::new().await;
    register_probe(&db).await;
    for (args, needle) in [
        (
            vec!["backfill", "nope", "2024-01"],
            "unknown pipeline 'nope' in org 'default' (OR010)",
        ),
        (
            vec!["backfill", "probe", "2024-13"],
            "malformed partition '2024-13'",
        ),
        (
            vec!["backfill", "probe", "@file:/no/such/file"],
            "cannot read partitions from /no/such/file",
        ),
        (
            vec!["register", "/no/such/binary"],
            "no pipeline binary at /no/such/binary",
        ),
        (vec!["run", "424242"], "unknown run 424242"),
        (vec!["cancel", "424242"], "unknown run 424242 (OR011)"),
    ] {
        let out = orca(&db, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let out = Command::new(bin("orca"))
        .args(["runs"])
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .expect("orca");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect to the control plane"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Server-sent events of a followed log until its `end` event: (event, data).
async fn follow_log(base: &str, key: &str, run: i64) -> Vec<(String, String)> {
    let mut resp = reqwest::Client::new()
        .get(format!("{base}/api/v1/runs/{run}/log/stream"))
        .bearer_auth(key)
        .send()
        .await
        .expect("follow the log");
    assert_eq!(resp.status().as_u16(), 200);
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !text.contains("event: end") {
        match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Ok(Ok(Some(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(Ok(None)) => break,
            Ok(Err(e)) => panic!("reading the stream: {e}"),
            Err(_) => panic!("the log did not end within two minutes: {text}"),
        }
    }
    text.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = String::new();
            for l in block.lines() {
                if let Some(e) = l.strip_prefix("event: ") {
                    event = Some(e.to_string());
                } else if let Some(d) = l.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            event.map(|e| (e, data))
        })
        .collect()
}

#[tokio::test]
async fn an_attempts_log_is_shipped_and_followed_over_http() {
    let db = TestDb::new().await;
    register_probe(&db).await;
    let logs = scratch("shipped");
    let dir = logs.to_string_lossy().to_string();
    let env = [("PROBE_DIR", dir.as_str()), ("PROBE_SLEEP_MS", "400")];
    let runner = Runner::start(&db.url(), "shipper", 1, &logs, &env);
    let key = orca_tests::serve::api_key(&db, "default", "logs", "viewer").await;
    db.pool
        .execute("SELECT orca.create_org('globex')")
        .await
        .expect("org");
    let theirs = orca_tests::serve::api_key(&db, "globex", "theirs", "viewer").await;
    let server = orca_tests::serve::serve(&db).await;
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe', '2024-02')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_for_sql(
        &db,
        "the runner to take the attempt",
        &format!("SELECT EXISTS (SELECT 1 FROM orca.attempts WHERE run_id = {run} AND status <> 'pending')"),
        Duration::from_secs(60),
        || runner.output(),
    )
    .await;

    // Followed from while it runs to its end.
    let events = follow_log(&server.base, &key, run).await;
    let (last, status) = events.last().cloned().unwrap_or_default();
    assert_eq!(
        (last.as_str(), status.as_str()),
        ("end", "succeeded"),
        "{events:?}\n{}",
        runner.output()
    );
    let streamed: Vec<String> = events
        .iter()
        .filter(|(e, _)| e == "line")
        .map(|(_, d)| {
            let v: Value = serde_json::from_str(d).expect("a line's JSON");
            v["line"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    // Every line of the file on the runner's host, in order.
    let file = std::fs::read_to_string(logs.join(format!("default/probe/run-{run}/attempt-1.log")))
        .expect("the attempt's log file");
    let on_host: Vec<String> = file.lines().map(str::to_string).collect();
    assert!(!on_host.is_empty());
    assert_eq!(streamed, on_host, "the shipped log differs from the file");

    // A page of it, and the next page empty and finished.
    let page: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/runs/{run}/log?limit=2", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .expect("a page")
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        page["lines"].as_array().map(Vec::len),
        Some(2.min(on_host.len())),
        "{page}"
    );
    assert_eq!(page["lines"][0]["line"], on_host[0].as_str(), "{page}");
    let after = on_host.len();
    let rest: Value = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/runs/{run}/log?after={after}",
            server.base
        ))
        .bearer_auth(&key)
        .send()
        .await
        .expect("the page after the end")
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        (rest["lines"].clone(), rest["finished"].clone()),
        (Value::Array(vec![]), Value::Bool(true)),
        "{rest}"
    );
    // Another org's key finds no such run.
    let resp = reqwest::Client::new()
        .get(format!("{}/api/v1/runs/{run}/log", server.base))
        .bearer_auth(&theirs)
        .send()
        .await
        .expect("globex asks");
    assert_eq!(resp.status().as_u16(), 404);
    // `orca run` shows the shipped tail when the file is not on this host.
    let out = Command::new(bin("orca"))
        .args(["run", &run.to_string(), "--logs", "/nonexistent"])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("as its runner shipped it")
            && text.contains(on_host.last().map(String::as_str).unwrap_or("?")),
        "{text}"
    );
    drop(server);
    drop(runner);
}
