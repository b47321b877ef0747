//! External connectors end to end: programs of a connectors directory that
//! speak the connector protocol on a Unix socket, hosted by a runner's
//! source pump (or the engine itself). A NATS JetStream source written on
//! the Python package (connectors/python) lands a real stream's messages
//! once across a SIGKILLed connector; connectors that crash, hang, write a
//! malformed frame or break the turn fail their attempt with the reason,
//! and nothing after the last checkpoint lands.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use orca_tests::procs::{bin, sync_runner_with, text};
use orca_tests::sqlx;
use orca_tests::*;
use serde_json::{json, Value};

/// The Python the test suite's venv has (pyarrow, nats-py).
fn python() -> String {
    orca_tests::s3::python()
}

/// A connectors directory: each connector a shell script running a
/// Python program of the repository.
fn connectors(dir: &Path, progs: &[(&str, &str)]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = dir.join("connectors");
    std::fs::create_dir_all(&d).expect("connectors dir");
    for (name, cmd) in progs {
        let p = d.join(name);
        std::fs::write(&p, format!("#!/bin/sh\nexec {} {cmd} \"$@\"\n", python()))
            .expect("connector script");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    d
}

fn repo(rel: &str) -> String {
    repo_root().join(rel).to_string_lossy().into_owned()
}

/// Publishes `count` messages from id `first` to JetStream stream `stream`.
fn publish(stream: &str, first: i64, count: i64) -> i64 {
    let o = Command::new(python())
        .arg(repo("tests/py/connectors/nats_publish.py"))
        .args([stream, &first.to_string(), &count.to_string()])
        .output()
        .expect("publish to NATS");
    assert!(o.status.success(), "nats_publish: {}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("publish JSON");
    v["last_seq"].as_i64().expect("last_seq")
}

struct Stream(String);

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = Command::new(python())
            .arg(repo("tests/py/connectors/nats_publish.py"))
            .args([&self.0, "--delete"])
            .output();
    }
}

fn jetstream(tag: &str) -> Stream {
    Stream(format!(
        "ORCA_T_{}_{}",
        tag.to_uppercase(),
        uuid::Uuid::new_v4().simple()
    ))
}

async fn define_nats(db: &TestDb, stream: &str, batch_rows: u64) {
    sqlx::raw_sql("CREATE SCHEMA IF NOT EXISTS raw")
        .execute(&db.pool)
        .await
        .expect("schema raw");
    sqlx::query("SELECT orca.create_sync('events', $1, $2, $3, NULL, 'exactly_once')")
        .bind(
            json!({"type": "connector", "connector": "nats_jetstream", "replay": "exact",
                     "batch_rows": batch_rows,
                     "config": {"servers": "nats://127.0.0.1:4222"}}),
        )
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
        .bind(json!([{"name": "orders", "config": {"stream": stream}}]))
        .execute(&db.pool)
        .await
        .expect("create_sync");
}

async fn run_status(db: &TestDb, run: i64) -> String {
    sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("run status")
}

/// Waits for run `run` to succeed; a failure fails the test at once.
async fn succeeded(db: &TestDb, run: i64, runner: &orca_tests::procs::Runner, what: &str) {
    wait_until(
        what,
        Duration::from_secs(120),
        || async {
            let s = run_status(db, run).await;
            assert_ne!(s, "failed", "{}", runner.output());
            (s == "succeeded").then_some(())
        },
        || runner.output(),
    )
    .await;
}

async fn head(db: &TestDb) -> i64 {
    db.scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'events'")
        .await
}

/// A process's parent, from /proc (the field after its name's
/// parenthesis and its state).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The pids of processes whose command line holds `needle`.
fn pids_with(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmd)
                .contains(needle)
                .then_some(pid)
        })
        .collect()
}

#[tokio::test]
async fn a_nats_jetstream_connector_lands_every_message_once_across_a_sigkilled_connector() {
    let db = TestDb::new().await;
    let js = jetstream("kill");
    let n = 6000i64;
    assert_eq!(publish(&js.0, 1, n), n);
    define_nats(&db, &js.0, 200).await;
    let dir = scratch("connector-kill");
    let conns = connectors(
        &dir,
        &[(
            "nats_jetstream",
            &repo("connectors/python/examples/nats_jetstream.py"),
        )],
    );
    let conns_s = conns.to_string_lossy().into_owned();
    // The connector's discover, through `orca discover`.
    let source = json!({"type": "connector", "connector": "nats_jetstream",
                        "config": {"servers": "nats://127.0.0.1:4222"}});
    let o = Command::new(bin("orca"))
        .args(["--json", "discover", &source.to_string()])
        .env("ORCA_CONNECTORS", &conns)
        .output()
        .expect("orca discover");
    assert!(o.status.success(), "{}", text(&o));
    let cat: Value = serde_json::from_slice(&o.stdout).expect("catalog JSON");
    let found = cat["streams"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["config"]["stream"] == js.0.as_str())
        .unwrap_or_else(|| panic!("{} in {cat}", js.0));
    assert_eq!(found["rows_estimate"], n, "{found}");
    assert!(
        cat["plan"]
            .as_array()
            .is_some_and(|p| p.iter().any(|s| s["config"]["stream"] == js.0.as_str())),
        "{cat}"
    );
    let runner = sync_runner_with(
        &db,
        &dir.join("store"),
        &dir.join("logs"),
        &[("ORCA_CONNECTORS", conns_s.as_str())],
    );
    // The same discover as a runner's task (orca.discover of the sync's
    // own source): the catalog lands in the control plane.
    let discovery: i64 = sqlx::query_scalar("SELECT orca.discover('events')")
        .fetch_one(&db.pool)
        .await
        .expect("orca.discover");
    succeeded(&db, discovery, &runner, "the connector's discovery").await;
    let stored: Value = sqlx::query_scalar(
        "SELECT catalog FROM orca.catalogs WHERE name = 'events' AND version = 1",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the stored catalog");
    assert_eq!(stored["source"], "connector");
    assert_eq!(stored["connector"], "nats_jetstream");
    assert!(
        stored["plan"]
            .as_array()
            .is_some_and(|p| p.iter().any(|s| s["config"]["stream"] == js.0.as_str())),
        "{stored}"
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('events', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    // Mid-read, the connector is killed: its attempt fails and says so.
    wait_until(
        "a few epochs from the connector",
        Duration::from_secs(90),
        || async { (head(&db).await >= 3).then_some(()) },
        || runner.output(),
    )
    .await;
    let killed = pids_with("examples/nats_jetstream.py");
    assert!(
        !killed.is_empty(),
        "the connector runs: {}",
        runner.output()
    );
    for pid in &killed {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    succeeded(&db, run, &runner, "the run to succeed after a retry").await;
    let errors = db
        .strings(&format!(
            "SELECT coalesce(error, '') FROM orca.attempts WHERE run_id = {run} ORDER BY id"
        ))
        .await;
    assert!(errors.len() >= 2, "a retry after the kill: {errors:?}");
    assert!(
        errors[0].contains("connector nats_jetstream")
            && errors[0].contains("before stream orders ended"),
        "the first attempt's error names the connector and what it left: {errors:?}"
    );
    // Every message once: seq 1..n, each id once.
    let (rows, seqs, ids, min, max): (i64, i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT nats_seq), count(DISTINCT id), min(nats_seq), max(nats_seq)
         FROM raw.orders",
    )
    .fetch_one(&db.pool)
    .await
    .expect("raw.orders");
    assert_eq!((rows, seqs, ids, min, max), (n, n, n, 1, n));
    let nulls = db
        .scalar_i64("SELECT count(*) FROM raw.orders WHERE note IS NULL")
        .await;
    assert_eq!(nulls, n / 10, "a null stays null");
    // Its host closes its socket once the attempt is done with it.
    wait_until(
        "no connector left running",
        Duration::from_secs(20),
        || async {
            pids_with("examples/nats_jetstream.py")
                .is_empty()
                .then_some(())
        },
        || runner.output(),
    )
    .await;

    // New messages: the next run reads only those.
    publish(&js.0, n + 1, 250);
    let next: i64 = sqlx::query_scalar("SELECT orca.run('events', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    succeeded(&db, next, &runner, "the second run").await;
    let (rows, seqs) = sqlx::query_as::<_, (i64, i64)>(
        "SELECT count(*), count(DISTINCT nats_seq) FROM raw.orders",
    )
    .fetch_one(&db.pool)
    .await
    .expect("raw.orders");
    assert_eq!((rows, seqs), (n + 250, n + 250));
    drop(runner);
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs one engine attempt of sync `sync` with the connectors of `conns`
/// (the engine hosting the source itself).
fn engine(db: &TestDb, sync: &str, store: &Path, conns: Option<&Path>) -> std::process::Output {
    let mut c = Command::new(bin("orca-engine"));
    c.args(["sync", sync])
        .arg("--store")
        .arg(store)
        .env("DATABASE_URL", db.url())
        .env_remove("ORCA_CONNECTORS")
        .stdin(Stdio::null());
    if let Some(d) = conns {
        c.env("ORCA_CONNECTORS", d);
    }
    c.output().expect("orca-engine")
}

/// Sync `mode` (into schema `mode`) from connector `mode`.
async fn define_misbehave(db: &TestDb, mode: &str, streams: &[&str], timeout: u64) {
    sqlx::raw_sql(&format!("CREATE SCHEMA IF NOT EXISTS {mode}"))
        .execute(&db.pool)
        .await
        .expect("schema");
    let streams: Vec<Value> = streams.iter().map(|s| json!({"name": s})).collect();
    sqlx::query("SELECT orca.create_sync($4, $1, $2, $3, NULL, 'exactly_once')")
        .bind(
            json!({"type": "connector", "connector": mode, "replay": "exact",
                     "batch_rows": 3, "timeout_seconds": timeout}),
        )
        .bind(json!({"type": "postgres", "url": db.url(), "schema": mode}))
        .bind(json!(streams))
        .bind(mode)
        .execute(&db.pool)
        .await
        .expect("create_sync");
}

#[tokio::test]
async fn connectors_that_crash_hang_garble_or_break_turn_fail_their_attempt_clearly() {
    let db = TestDb::new().await;
    let dir = scratch("connector-bad");
    let script = repo("tests/py/connectors/misbehave.py");
    let modes = [
        "garbage",
        "hang",
        "crash",
        "outofturn",
        "noconnect",
        "wrongcols",
    ];
    let progs: Vec<(String, String)> = modes
        .iter()
        .map(|m| (m.to_string(), format!("{script} {m}")))
        .collect();
    let progs: Vec<(&str, &str)> = progs
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let conns = connectors(&dir, &progs);
    let store = dir.join("store");
    for (mode, streams, says) in [
        (
            "garbage",
            &["a"][..],
            "sent a malformed frame: frame version 7 is not supported",
        ),
        ("hang", &["a"], "sent nothing for 2s"),
        ("crash", &["a"], "the source fell over"),
        (
            "outofturn",
            &["a", "b"],
            "sent a frame of stream b out of turn: stream a's chunk or end comes first",
        ),
        (
            "noconnect",
            &["a"],
            "exited (exit status: 4) without connecting",
        ),
        ("wrongcols", &["a"], "a batch holds raw records"),
    ] {
        define_misbehave(&db, mode, streams, 2).await;
        let started = std::time::Instant::now();
        let o = engine(&db, mode, &store, Some(&conns));
        assert!(
            !o.status.success(),
            "{mode}: the attempt fails: {}",
            text(&o)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("connector {mode}")) && err.contains(says),
            "{mode}: the error names the connector and says {says:?}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{mode}: failed in {:?}",
            started.elapsed()
        );
        // Nothing past the last checkpoint: the destination holds what HEAD
        // names and no more.
        let head = db
            .scalar_i64(&format!(
                "SELECT head_epoch FROM orca.syncs WHERE name = '{mode}'"
            ))
            .await;
        let tables = db
            .strings(&format!(
                "SELECT tablename::text FROM pg_tables
                 WHERE schemaname = '{mode}' AND tablename NOT LIKE '\\_orca\\_%'"
            ))
            .await;
        let mut rows = 0;
        for t in &tables {
            rows += db
                .scalar_i64(&format!("SELECT count(*) FROM {mode}.\"{t}\""))
                .await;
        }
        assert_eq!(
            rows,
            head * 3,
            "{mode}: rows of committed epochs only ({tables:?})"
        );
        assert!(
            pids_with(&format!("misbehave.py {mode}")).is_empty(),
            "{mode}: the connector was killed with its attempt"
        );
    }

    // A connector this host does not have, and a host with none.
    define_misbehave(&db, "absent", &["a"], 2).await;
    let o = engine(&db, "absent", &store, Some(&conns));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err
                .contains("connector absent: is not installed in this host's connectors directory"),
        "{err}"
    );
    let o = engine(&db, "absent", &store, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("this host runs no external connectors"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_connector_source_is_checked_when_it_is_defined() {
    let db = TestDb::new().await;
    let refused = |source: Value, streams: Value| {
        let pool = db.pool.clone();
        async move {
            sqlx::query("SELECT orca.create_sync('events', $1, $2, $3)")
                .bind(source)
                .bind(json!({"type": "parquet", "url": "/tmp/out"}))
                .bind(streams)
                .execute(&pool)
                .await
                .expect_err("refused")
                .to_string()
        }
    };
    let s = json!([{"name": "orders"}]);
    for (source, streams, says) in [
        (
            json!({"type": "connector", "connector": "../../bin/sh", "replay": "exact"}),
            s.clone(),
            "source.connector",
        ),
        (
            json!({"type": "connector", "connector": "nats", "replay": "maybe"}),
            s.clone(),
            "source.replay",
        ),
        (
            json!({"type": "connector", "connector": "nats"}),
            s.clone(),
            "replay",
        ),
        (
            json!({"type": "connector", "connector": "nats", "replay": "exact",
                   "config": {"password": "hunter2"}}),
            s.clone(),
            "source.config.password",
        ),
        (
            json!({"type": "connector", "connector": "nats", "replay": "exact"}),
            json!([{"name": "orders", "table": "public.orders"}]),
            "streams[0].table",
        ),
        (
            json!({"type": "connector", "connector": "nats", "replay": "exact",
                   "timeout_seconds": 0}),
            s.clone(),
            "source.timeout_seconds",
        ),
    ] {
        let e = refused(source, streams).await;
        assert!(e.contains(says), "{says}: {e}");
    }
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.syncs").await, 0);
    // A secret reference is fine.
    sqlx::query("SELECT orca.create_sync('events', $1, $2, $3)")
        .bind(
            json!({"type": "connector", "connector": "nats", "replay": "exact",
                     "config": {"password": {"secret": "nats-pass"}}}),
        )
        .bind(json!({"type": "parquet", "url": "/tmp/out"}))
        .bind(&s)
        .execute(&db.pool)
        .await
        .expect("a secret in the config");
}

/// A connector that must confirm upstream what it delivered gets ack
/// frames: once a committed checkpoint holds a stream's records up to a
/// point, one behind, never past what HEAD holds.
#[tokio::test]
async fn a_connector_is_acknowledged_what_committed_checkpoints_hold() {
    let db = TestDb::new().await;
    let dir = scratch("connector-acks");
    let script = repo("tests/py/connectors/misbehave.py");
    let conns = connectors(&dir, &[("acks", &format!("{script} acks"))]);
    let log = dir.join("acks.log");
    sqlx::raw_sql("CREATE SCHEMA acks")
        .execute(&db.pool)
        .await
        .expect("schema");
    sqlx::query("SELECT orca.create_sync('acks', $1, $2, $3, NULL, 'exactly_once')")
        .bind(json!({"type": "connector", "connector": "acks", "replay": "exact", "batch_rows": 5}))
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "acks"}))
        .bind(json!([{"name": "items"}]))
        .execute(&db.pool)
        .await
        .expect("create_sync");
    let (conns_s, log_s) = (
        conns.to_string_lossy().into_owned(),
        log.to_string_lossy().into_owned(),
    );
    let runner = sync_runner_with(
        &db,
        &dir.join("store"),
        &dir.join("logs"),
        &[
            ("ORCA_CONNECTORS", conns_s.as_str()),
            ("MISBEHAVE_LOG", log_s.as_str()),
        ],
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('acks', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    succeeded(&db, run, &runner, "the run to succeed").await;
    let head = db
        .scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'acks'")
        .await;
    assert_eq!(head, 8, "40 records in epochs of 5");
    assert_eq!(
        db.scalar_i64("SELECT count(DISTINCT id) FROM acks.items")
            .await,
        40
    );
    let acked: Vec<i64> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("ack items "))
        .filter_map(|p| p.trim().parse().ok())
        .collect();
    assert!(!acked.is_empty(), "acknowledged: {}", runner.output());
    assert!(
        acked.windows(2).all(|w| w[0] < w[1]),
        "acknowledgements only move forward: {acked:?}"
    );
    assert!(
        acked.iter().all(|p| p % 5 == 0 && *p <= 40),
        "only resume points of committed chunks: {acked:?}"
    );
    drop(runner);
    let _ = std::fs::remove_dir_all(dir);
}

/// Every key under `prefix` in the machine's Redis, with its type's size.
fn redis_keys(prefix: &str) -> Vec<String> {
    let o = Command::new(python())
        .args([
            "-c",
            "import redis, sys; r = redis.Redis(decode_responses=True); \
             print('\\n'.join(sorted(r.scan_iter(sys.argv[1] + '*', count=10000))))",
            prefix,
        ])
        .output()
        .expect("read Redis");
    assert!(o.status.success(), "redis: {}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn redis_eval(script: &str, prefix: &str) -> Value {
    let o = Command::new(python())
        .args(["-c", script, prefix])
        .output()
        .expect("read Redis");
    assert!(o.status.success(), "redis: {}", text(&o));
    serde_json::from_slice(&o.stdout).expect("JSON from Redis")
}

#[tokio::test]
async fn a_destination_connector_commits_each_epoch_once_across_a_killed_engine() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE TABLE public.accounts (id bigint PRIMARY KEY, balance integer NOT NULL,
                                       updated_at timestamptz NOT NULL);
         INSERT INTO public.accounts
         SELECT g, g % 1000, '2024-01-01'::timestamptz + g * interval '1 second'
         FROM generate_series(1, 20000) g;
         CREATE TABLE public.ledger (id bigint PRIMARY KEY, note text,
                                     updated_at timestamptz NOT NULL);
         INSERT INTO public.ledger
         SELECT g, 'entry ' || g, '2024-01-01'::timestamptz + g * interval '1 second'
         FROM generate_series(1, 20000) g;",
    )
    .execute(&db.pool)
    .await
    .expect("source tables");
    let dir = scratch("connector-dest");
    let conns = connectors(
        &dir,
        &[(
            "redis_hash",
            &repo("connectors/python/examples/redis_hash.py"),
        )],
    );
    let conns_s = conns.to_string_lossy().into_owned();
    let prefix = format!("orca_t_{}:", uuid::Uuid::new_v4().simple());
    let destination = |commits: &str, mode: &str| {
        (
            json!({"type": "connector", "connector": "redis_hash", "commits": commits,
                   "config": {"url": "redis://127.0.0.1:6379/0", "prefix": prefix}}),
            json!([
                {"name": "accounts", "table": "public.accounts", "cursor": "updated_at",
                 "primary_key": ["id"], "mode": mode},
                {"name": "ledger", "table": "public.ledger", "cursor": "updated_at",
                 "primary_key": ["id"], "mode": "append"}
            ]),
        )
    };
    let source = json!({"type": "postgres", "url": db.url(), "batch_rows": 500});
    // What the definition can check, it refuses at once.
    for (commits, mode, needle) in [
        ("sometimes", "merge", "destination.commits"),
        ("atomic", "overwrite", "overwrite"),
    ] {
        let (d, s) = destination(commits, mode);
        let e = sqlx::query("SELECT orca.create_sync('ledger', $1, $2, $3)")
            .bind(&source)
            .bind(&d)
            .bind(&s)
            .execute(&db.pool)
            .await
            .expect_err("refused");
        let msg = e.to_string();
        assert!(msg.contains(needle), "{msg}");
    }
    let (d, s) = destination("atomic", "merge");
    sqlx::query("SELECT orca.create_sync('ledger', $1, $2, $3, NULL, 'at_least_once')")
        .bind(&source)
        .bind(&d)
        .bind(&s)
        .execute(&db.pool)
        .await
        .expect("create_sync into Redis");
    let runner = sync_runner_with(
        &db,
        &dir.join("store"),
        &dir.join("logs"),
        &[("ORCA_CONNECTORS", conns_s.as_str())],
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('ledger', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    // A few epochs in, the engine (and with it the connector) is killed.
    let started = std::time::Instant::now();
    loop {
        let h = db
            .scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'ledger'")
            .await;
        if h >= 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no epochs: {}",
            runner.output()
        );
        assert_ne!(run_status(&db, run).await, "failed", "{}", runner.output());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // This runner's engine only: other tests run engines beside it.
    let engines: Vec<i32> = pids_with("orca-engine")
        .into_iter()
        .filter(|p| parent_of(*p) == Some(runner.pid() as i32))
        .collect();
    assert!(!engines.is_empty(), "the engine runs: {}", runner.output());
    for pid in &engines {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    succeeded(&db, run, &runner, "the sync after the kill").await;
    let attempts = db
        .scalar_i64(&format!(
            "SELECT count(*) FROM orca.attempts WHERE run_id = {run}"
        ))
        .await;
    assert_eq!(attempts, 2, "{}", runner.output());
    // Every account once, as the source has it; every ledger row once,
    // although the killed attempt's last epoch may have been committed to
    // Redis and not to HEAD (the next attempt found it in, by the marker).
    let hashes = redis_keys(&format!("{prefix}accounts:"));
    assert_eq!(hashes.len(), 20000);
    let facts = redis_eval(
        "import json, redis, sys; r = redis.Redis(decode_responses=True); p = sys.argv[1]; \
         rows = [json.loads(x) for x in r.lrange(p + 'ledger', 0, -1)]; \
         print(json.dumps({'rows': len(rows), 'ids': len({x['id'] for x in rows}), \
                           'a7': r.hgetall(p + 'accounts:7'), \
                           'markers': [int(r.get(p + '_orca:marker:' + s)) for s in ('accounts', 'ledger')], \
                           'fence': int(r.get(p + '_orca:fence'))}))",
        &prefix,
    );
    assert_eq!(facts["rows"], 20000, "{facts}");
    assert_eq!(facts["ids"], 20000, "{facts}");
    assert_eq!(facts["a7"]["balance"], "7", "{facts}");
    let head = db
        .scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'ledger'")
        .await;
    assert_eq!(facts["markers"], json!([head, head]), "{facts}");
    assert_eq!(facts["fence"], 2, "{facts}");
    drop(runner);
    let _ = redis_eval(
        "import json, redis, sys; r = redis.Redis(); p = sys.argv[1]; \
         n = sum(r.delete(k) for k in r.scan_iter(p + '*', count=10000)); print(json.dumps(n))",
        &prefix,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn destination_connectors_that_crash_hang_garble_or_refuse_fail_their_attempt_clearly() {
    use std::os::unix::fs::PermissionsExt;
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE TABLE public.items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL);
         INSERT INTO public.items
         SELECT g, '2024-01-01'::timestamptz + g * interval '1 second' FROM generate_series(1, 9) g;",
    )
    .execute(&db.pool)
    .await
    .expect("source table");
    let dir = scratch("connector-dest-bad");
    let conns = dir.join("connectors");
    std::fs::create_dir_all(&conns).expect("connectors dir");
    let script = repo("tests/py/connectors/misbehave_dest.py");
    let store = dir.join("store");
    for (mode, stream_mode, says) in [
        (
            "crash",
            "merge",
            "exited (exit status: 3), its last words: misbehave_dest: the disk fell over",
        ),
        ("hang", "merge", "sent no answer to commit within 2s"),
        ("garbage", "merge", "unknown frame kind 42"),
        (
            "refuse",
            "merge",
            "refused commit: quota exceeded for this stream",
        ),
        (
            "loose",
            "merge",
            "the sync takes its commits for atomic, and the connector's spec says at_least_once",
        ),
        (
            "nomerge",
            "merge",
            "stream items is written with merge, and the connector's spec takes [\"append\"]",
        ),
    ] {
        let name = format!("bad_{mode}");
        let p = conns.join(&name);
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\nexec env MISBEHAVE_DIR={} {} {script} {mode} \"$@\"\n",
                dir.display(),
                python()
            ),
        )
        .expect("connector script");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        sqlx::query("SELECT orca.create_sync($1, $2, $3, $4, NULL, 'at_least_once')")
            .bind(&name)
            .bind(json!({"type": "postgres", "url": db.url(), "batch_rows": 3}))
            .bind(
                json!({"type": "connector", "connector": name, "commits": "atomic",
                         "timeout_seconds": 2}),
            )
            .bind(
                json!([{"name": "items", "table": "public.items", "cursor": "updated_at",
                          "primary_key": ["id"], "mode": stream_mode}]),
            )
            .execute(&db.pool)
            .await
            .expect("create_sync");
        let started = std::time::Instant::now();
        let o = engine(&db, &name, &store, Some(&conns));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "{mode}: the attempt fails: {}",
            text(&o)
        );
        assert!(
            err.contains(&format!("destination connector {name}")) && err.contains(says),
            "{mode}: the error names the connector and says {says:?}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{mode}: failed in {:?}",
            started.elapsed()
        );
        // Nothing past the last checkpoint: the connector holds no epoch
        // HEAD does not name (HEAD moves first; what it names and the
        // connector lacks, the next attempt's recovery applies).
        let head = db
            .scalar_i64(&format!(
                "SELECT head_epoch FROM orca.syncs WHERE name = '{name}'"
            ))
            .await;
        let log = std::fs::read_to_string(dir.join(format!("{mode}.jsonl"))).unwrap_or_default();
        let epochs: Vec<i64> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| v["epoch"].as_i64())
            .collect();
        assert!(
            epochs.iter().all(|e| *e <= head),
            "{mode}: HEAD {head}, committed {log}"
        );
        assert!(
            pids_with(&format!("misbehave_dest.py {mode}")).is_empty(),
            "{mode}: the connector was killed with its attempt"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The paginated test API (tests/py/connectors/pages_server.py), killed
/// when dropped.
struct Pages {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Pages {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pages_server(dir: &Path, tag: &str, items: u32, evil: bool) -> Pages {
    let port_file = dir.join(format!("{tag}.port"));
    let log = dir.join(format!("{tag}.log"));
    let mut c = Command::new(python());
    c.arg(repo("tests/py/connectors/pages_server.py"))
        .arg(&port_file)
        .args([&items.to_string(), "10"])
        .arg(&log);
    if evil {
        c.arg("--evil");
    }
    let child = c.spawn().expect("the pages server");
    let started = std::time::Instant::now();
    let port = loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            break p.trim().parse().expect("a port");
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no pages server"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    Pages { child, port, log }
}

#[tokio::test]
async fn an_http_api_connector_pages_through_the_host_which_retries_and_guards_each_request() {
    let db = TestDb::new().await;
    let dir = scratch("connector-http");
    let conns = connectors(
        &dir,
        &[(
            "http_pages",
            &repo("connectors/python/examples/http_pages.py"),
        )],
    );
    let store = dir.join("store");
    let define = |name: &'static str, port: u16| {
        let pool = db.pool.clone();
        let url = db.url();
        async move {
            sqlx::raw_sql(&format!("CREATE SCHEMA IF NOT EXISTS {name}"))
                .execute(&pool)
                .await
                .expect("schema");
            sqlx::query("SELECT orca.create_sync($1, $2, $3, $4, NULL, 'exactly_once')")
                .bind(name)
                .bind(
                    json!({"type": "connector", "connector": "http_pages", "replay": "exact",
                             "batch_rows": 7,
                             "config": {"base_url": format!("http://127.0.0.1:{port}")}}),
                )
                .bind(json!({"type": "postgres", "url": url, "schema": name}))
                .bind(json!([{"name": "items", "config": {"path": "/items"}}]))
                .execute(&pool)
                .await
                .expect("create_sync");
        }
    };
    // 45 items in pages of 10, every page's first request a 503.
    let api = pages_server(&dir, "api", 45, false);
    define("pages", api.port).await;
    let o = engine(&db, "pages", &store, Some(&conns));
    assert!(o.status.success(), "{}", text(&o));
    let (rows, ids): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT id) FROM pages.items")
            .fetch_one(&db.pool)
            .await
            .unwrap_or_else(|e| panic!("pages.items: {e}\n{}", text(&o)));
    assert_eq!((rows, ids), (45, 45));
    let hits = std::fs::read_to_string(&api.log).expect("the server's log");
    for page in 1..=5 {
        assert!(
            hits.contains(&format!("page {page} 503"))
                && hits.contains(&format!("page {page} 200")),
            "page {page} was retried by the host: {hits}"
        );
    }
    // Nothing new: the next attempt reads the last page again and lands
    // nothing twice.
    let o = engine(&db, "pages", &store, Some(&conns));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(db.scalar_i64("SELECT count(*) FROM pages.items").await, 45);

    // A next link to the metadata address: the host refuses that request
    // (the allowlist permits 127.0.0.1 only), and the attempt fails saying so.
    let evil = pages_server(&dir, "evil", 25, true);
    define("evil", evil.port).await;
    let o = engine(&db, "evil", &store, Some(&conns));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        err.contains("connector http_pages") && err.contains("netguard refused 169.254.169.254"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes the shapes connector's source as `streams` (name and columns).
fn shape(path: &Path, streams: Value) {
    std::fs::write(path, json!({"streams": streams}).to_string()).expect("shape file");
}

/// A connector's sync planned from its catalog is checked against what the
/// connector discovers before each attempt: a stream it no longer lists and
/// a column it describes differently are reported as drift (once, with a
/// sync.drift event), and the sync goes on.
#[tokio::test]
async fn a_connector_s_drift_from_its_catalog_is_reported_before_each_attempt() {
    let db = TestDb::new().await;
    let dir = scratch("connector-drift");
    let conns = connectors(&dir, &[("shapes", &repo("tests/py/connectors/shapes.py"))]);
    let conns_s = conns.to_string_lossy().into_owned();
    let file = dir.join("shape.json");
    let col = |name: &str, ty: &str| json!({"name": name, "type": ty, "nullable": true});
    shape(
        &file,
        json!([{"name": "accounts", "columns": [col("id", "bigint"), col("plan", "text")]},
               {"name": "invoices", "columns": [col("id", "bigint")]}]),
    );
    let source = json!({"type": "connector", "connector": "shapes", "replay": "exact",
                        "config": {"shape": file.to_string_lossy()}});
    let runner = sync_runner_with(
        &db,
        &dir.join("store"),
        &dir.join("logs"),
        &[("ORCA_CONNECTORS", conns_s.as_str())],
    );
    let discovery: i64 = sqlx::query_scalar("SELECT orca.discover('shaped', $1)")
        .bind(&source)
        .fetch_one(&db.pool)
        .await
        .expect("orca.discover");
    succeeded(&db, discovery, &runner, "the discovery").await;
    sqlx::raw_sql("CREATE SCHEMA shaped")
        .execute(&db.pool)
        .await
        .expect("schema");
    sqlx::query("SELECT orca.create_sync('shaped', $1, $2, '{\"catalog\": true}')")
        .bind(&source)
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "shaped"}))
        .execute(&db.pool)
        .await
        .expect("create_sync planned from the catalog");
    let run_once = || async {
        let run: i64 = sqlx::query_scalar("SELECT orca.run('shaped', 'now')")
            .fetch_one(&db.pool)
            .await
            .expect("run");
        succeeded(&db, run, &runner, "a run of the shaped sync").await;
    };
    let drift = || async {
        sqlx::query_scalar::<_, Option<Value>>("SELECT drift FROM orca.syncs WHERE name = 'shaped'")
            .fetch_one(&db.pool)
            .await
            .expect("drift")
    };
    let events = "SELECT count(*) FROM orca.events WHERE kind = 'sync.drift'";
    run_once().await;
    assert_eq!(drift().await, None, "the source is as discovered");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM shaped.accounts").await,
        3
    );

    // The source changes: a column's type, and a stream is gone.
    shape(
        &file,
        json!([{"name": "accounts", "columns": [col("id", "text"), col("plan", "text")]}]),
    );
    run_once().await;
    let d = drift().await.expect("drift is reported");
    let mut got: Vec<(String, String, String)> = d
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            (s("table"), s("column"), s("change"))
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("accounts".into(), "id".into(), "type".into()),
            ("invoices".into(), "*".into(), "removed".into()),
        ],
        "{d}"
    );
    assert_eq!(db.scalar_i64(events).await, 1);
    // The same drift again is not news.
    run_once().await;
    assert_eq!(db.scalar_i64(events).await, 1);
    drop(runner);
    let _ = std::fs::remove_dir_all(dir);
}
