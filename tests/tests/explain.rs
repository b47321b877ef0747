//! `orca.explain(run)`: why a run is not running or not finished, each
//! reason caused for real through the SQL API (runs queued, claimed by
//! runners that say what they run, leases left to lapse, ticks that hand
//! runs on, pauses), and the reason gone once what caused it is.

use std::time::Duration;

use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

type Reason = (String, String, Option<Value>);

async fn why(db: &TestDb, run: i64) -> Vec<Reason> {
    sqlx::query_as("SELECT code, message, blocked_by FROM orca.explain($1)")
        .bind(run)
        .fetch_all(&db.pool)
        .await
        .expect("explain")
}

/// The reason with this code, or a failure that shows them all.
fn reason<'a>(reasons: &'a [Reason], code: &str) -> &'a Reason {
    reasons
        .iter()
        .find(|r| r.0 == code)
        .unwrap_or_else(|| panic!("no {code} among {reasons:#?}"))
}

fn codes(reasons: &[Reason]) -> Vec<&str> {
    reasons.iter().map(|r| r.0.as_str()).collect()
}

async fn run(db: &TestDb, pipeline: &str, partition: &str) -> i64 {
    sqlx::query_scalar("SELECT orca.run($1, $2)")
        .bind(pipeline)
        .bind(partition)
        .fetch_one(&db.pool)
        .await
        .expect("run")
}

fn manifest(name: &str) -> Value {
    json!({
        "name": name,
        "steps": [{"name": "work", "kind": "mapped"}],
        "partitions": {"monthly": "2024-01"},
        "registry_hash": format!("hash-{name}"),
        "binary": "/bin/true"
    })
}

#[tokio::test]
async fn a_queued_run_says_it_waits_for_max_runs_or_a_pause_and_which_runs_hold_it() {
    let db = TestDb::new().await;
    let mut m = manifest("capped");
    m["max_runs"] = json!(1);
    db.register(&m).await;
    let first = run(&db, "capped", "2024-01").await;
    let second = run(&db, "capped", "2024-02").await;
    let third = run(&db, "capped", "2024-03").await;
    let w = why(&db, second).await;
    let (_, msg, blocked) = reason(&w, "max_runs");
    assert!(
        msg.contains("runs at most 1 at a time") && msg.contains(&format!("run {first} holds")),
        "{msg}"
    );
    assert_eq!(
        blocked.as_ref().expect("blocked_by")["runs"],
        json!([first])
    );
    // The third also waits for the second, queued ahead of it.
    let w = why(&db, third).await;
    let (_, msg, blocked) = reason(&w, "max_runs");
    assert!(msg.contains("1 queued run goes first"), "{msg}");
    assert_eq!(blocked.as_ref().expect("blocked_by")["queued_ahead"], 1);

    // Paused: queued runs say so, and who paused it.
    db.pool
        .execute("SELECT orca.pause('capped')")
        .await
        .expect("pause");
    let w = why(&db, second).await;
    let (_, msg, _) = reason(&w, "paused");
    assert!(msg.contains("pipeline capped is paused (by "), "{msg}");
    db.pool
        .execute("SELECT orca.unpause('capped')")
        .await
        .expect("unpause");
    assert!(!codes(&why(&db, second).await).contains(&"paused"));

    // The first run ends: the second starts, and its reason moves on.
    let l = claim(&db.pool, "r1", 1).await.remove(0);
    assert_eq!(l.run, first);
    sqlx::query("SELECT orca.finish($1, true)")
        .bind(l.lease)
        .execute(&db.pool)
        .await
        .expect("finish");
    let w = why(&db, first).await;
    assert_eq!(codes(&w), ["finished"], "{w:#?}");
    assert!(w[0].1.contains("succeeded"), "{w:#?}");
    let w = why(&db, second).await;
    assert!(codes(&w).contains(&"waiting_for_runner"), "{w:#?}");

    // Another org's run is unknown, as one that does not exist.
    let (code, _) = expect_error(&db.pool, "SELECT * FROM orca.explain(999999)").await;
    assert_eq!(code, "OR011");
}

#[tokio::test]
async fn a_running_run_names_the_runner_or_the_lack_of_one() {
    let db = TestDb::new().await;
    db.register(&manifest("work")).await;
    let a = run(&db, "work", "2024-01").await;

    // No runner has ever claimed in the org.
    let w = why(&db, a).await;
    let (_, msg, _) = reason(&w, "no_live_runner");
    assert!(
        msg.contains("pool default, which has no live runner (none was ever seen)"),
        "{msg}"
    );

    // A runner that runs only sensor polls leaves the attempt where it is.
    let none: Vec<(i64,)> =
        sqlx::query_as("SELECT run FROM orca.claim('polls', 'default', 1, ARRAY['sense'])")
            .fetch_all(&db.pool)
            .await
            .expect("claim sense only");
    assert!(none.is_empty());
    let w = why(&db, a).await;
    let (_, msg, blocked) = reason(&w, "no_runner_for_command");
    assert!(
        msg.contains("needs a runner that runs attempt") && msg.contains("polls runs sense"),
        "{msg}"
    );
    assert_eq!(blocked.as_ref().expect("blocked_by")["command"], "attempt");

    // A runner that runs it, busy with an older run: this one waits behind it.
    let b = run(&db, "work", "2024-02").await;
    let la = claim(&db.pool, "busy", 1).await.remove(0);
    assert_eq!(la.run, a);
    let w = why(&db, b).await;
    let (_, msg, _) = reason(&w, "waiting_for_runner");
    assert!(
        msg.contains("behind 0 older attempts") && msg.contains("1 attempt running there"),
        "{msg}"
    );
    let w = why(&db, a).await;
    let (_, msg, blocked) = reason(&w, "running");
    assert!(msg.contains("attempt 1 runs on runner busy"), "{msg}");
    assert_eq!(blocked.as_ref().expect("blocked_by")["runner"], "busy");

    // The runners go quiet for good (their last claim five minutes ago and
    // more): the waiting run says which was seen last, and when.
    db.pool
        .execute(
            "UPDATE orca.runners SET last_seen = now() - CASE name WHEN 'busy' \
             THEN interval '10 minutes' ELSE interval '20 minutes' END",
        )
        .await
        .expect("age the runners");
    let w = why(&db, b).await;
    let (_, msg, blocked) = reason(&w, "no_live_runner");
    assert!(msg.contains("the last, busy, was seen at"), "{msg}");
    assert_eq!(blocked.as_ref().expect("blocked_by")["last_runner"], "busy");
}

#[tokio::test]
async fn a_lapsed_lease_is_explained_before_and_after_the_tick_hands_the_run_on() {
    let db = TestDb::new().await;
    let mut m = manifest("flaky");
    m["run_retries"] = json!(0);
    db.register(&m).await;
    let r = run(&db, "flaky", "2024-01").await;
    // A lease of one second, left without a heartbeat.
    let mut c = db.pool.acquire().await.expect("connection");
    c.execute("SET orca.lease_seconds = 1").await.expect("set");
    let l = claim(&mut *c, "gone", 1).await.remove(0);
    drop(c);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let w = why(&db, r).await;
    let (_, msg, _) = reason(&w, "lease_lapsed");
    assert!(
        msg.contains("attempt 1's lease on runner gone lapsed") && msg.contains("next orca.tick"),
        "{msg}"
    );
    // The tick hands it on: the lost attempt is history, the new one waits.
    db.pool.execute("SELECT orca.tick()").await.expect("tick");
    let w = why(&db, r).await;
    let (_, msg, blocked) = reason(&w, "lease_reclaimed");
    assert!(msg.contains("attempt 1 on runner gone was lost"), "{msg}");
    assert_eq!(blocked.as_ref().expect("blocked_by")["runner"], "gone");
    assert!(codes(&w).contains(&"waiting_for_runner"), "{w:#?}");
    let _ = l;
}

#[tokio::test]
async fn a_run_handed_back_again_and_again_says_how_close_it_is_to_the_loop_bound() {
    let db = TestDb::new().await;
    db.register(&manifest("loopy")).await;
    let r = run(&db, "loopy", "2024-01").await;
    for i in 0..4 {
        let l = claim(&db.pool, "restarting", 1).await.remove(0);
        sqlx::query("SELECT orca.release($1, $2)")
            .bind(l.lease)
            .bind(format!("runner restarting ({i})"))
            .execute(&db.pool)
            .await
            .expect("release");
    }
    let w = why(&db, r).await;
    let (_, msg, blocked) = reason(&w, "handed_back");
    assert!(
        msg.contains("handed back 4 times in the last 10 minutes")
            && msg.contains("runner restarting (3)"),
        "{msg}"
    );
    assert_eq!(blocked.as_ref().expect("blocked_by")["times"], 4);
}

#[tokio::test]
async fn the_cli_explains_a_run_and_lists_incidents() {
    let db = TestDb::new().await;
    let mut m = manifest("capped");
    m["max_runs"] = json!(1);
    m["run_retries"] = json!(0);
    db.register(&m).await;
    let first = run(&db, "capped", "2024-01").await;
    let second = run(&db, "capped", "2024-02").await;
    let out = orca_tests::procs::orca(&db, &["explain", &second.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("max_runs") && text.contains(&format!("run {first} holds")),
        "{text}"
    );
    let out = orca_tests::procs::orca(&db, &["--json", "explain", &second.to_string()]);
    let rows: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(rows[0]["code"], "max_runs", "{rows}");
    assert_eq!(rows[0]["blocked_by"]["runs"], json!([first]), "{rows}");
    // `orca run` shows the same under "why".
    let out = orca_tests::procs::orca(&db, &["run", &second.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("\nwhy\n") && text.contains("max_runs"),
        "{text}"
    );

    // The first run fails for good: an incident, listed and resolved by the CLI.
    let l = claim(&db.pool, "r1", 1).await.remove(0);
    sqlx::query("SELECT orca.finish($1, false, 'out of disk')")
        .bind(l.lease)
        .execute(&db.pool)
        .await
        .expect("finish");
    let out = orca_tests::procs::orca(&db, &["--json", "incidents"]);
    let open: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(open.as_array().map(Vec::len), Some(1), "{open}");
    assert_eq!(open[0]["kind"], "run_failed");
    let id = open[0]["incident"].as_i64().expect("id");
    let out = orca_tests::procs::orca(
        &db,
        &["resolve-incident", &id.to_string(), "--note", "disk added"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = orca_tests::procs::orca(&db, &["--json", "incidents"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).expect("json"),
        json!([])
    );
    let out = orca_tests::procs::orca(&db, &["--json", "incidents", "--all"]);
    let all: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        all[0]["resolution"]
            .as_str()
            .is_some_and(|r| r.ends_with(": disk added")),
        "{all}"
    );
}

#[tokio::test]
async fn a_driver_waiting_for_its_tasks_says_how_many_and_until_when_retries_back_off() {
    let db = TestDb::new().await;
    let mut m = manifest("fan");
    m["tasks"] = json!([{"name": "weigh", "retries": 1, "backoff_ms": 60000}]);
    db.register(&m).await;
    let r = run(&db, "fan", "2024-01").await;
    let driver = claim(&db.pool, "driver", 1).await.remove(0);
    sqlx::query("SELECT orca.add_tasks($1, 'work', '2024-01', 'weigh', 0, '[1, 2, 3]')")
        .bind(driver.lease)
        .execute(&db.pool)
        .await
        .expect("add tasks");
    let w = why(&db, r).await;
    let (_, msg, blocked) = reason(&w, "waiting_for_tasks");
    assert!(
        msg.contains("1 batch queued in pool default, 0 running"),
        "{msg}"
    );
    assert_eq!(blocked.as_ref().expect("blocked_by")["queued_batches"], 1);
    // A runner takes the batch and one task fails: its retry waits a minute.
    let lease: uuid::Uuid =
        sqlx::query_scalar("SELECT lease FROM orca.claim_tasks('worker', 'default', 10)")
            .fetch_one(&db.pool)
            .await
            .expect("claim tasks");
    sqlx::query("SELECT orca.finish_tasks($1, '[1, null, 9]', ARRAY[NULL, 'too heavy', NULL])")
        .bind(lease)
        .execute(&db.pool)
        .await
        .expect("finish tasks");
    let until: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT until FROM orca.explain($1) WHERE code = 'waiting_for_tasks'")
            .bind(r)
            .fetch_one(&db.pool)
            .await
            .expect("until");
    let wait = until.expect("a backoff") - chrono::Utc::now();
    assert!(
        (30..=61).contains(&wait.num_seconds()),
        "retries wait until {until:?}"
    );
    let w = why(&db, r).await;
    assert!(
        reason(&w, "waiting_for_tasks")
            .1
            .contains("retries wait for their backoff until"),
        "{w:#?}"
    );
}

#[tokio::test]
async fn a_sensor_s_polling_run_says_it_is_between_polls() {
    let db = TestDb::new().await;
    db.register(&json!({
        "name": "report",
        "steps": [{"name": "work", "kind": "mapped", "reads": ["ext.orders"], "writes": ["bi.orders"]}],
        "partitions": {"monthly": "2024-01"},
        "sensor": true,
        "pool": "sensing",
        "registry_hash": "hash-report",
        "binary": "/bin/true"
    }))
    .await;
    db.tick(&chrono::Utc::now().to_rfc3339()).await;
    let sense: i64 = sqlx::query_scalar("SELECT id FROM orca.runs WHERE kind = 'sense'")
        .fetch_one(&db.pool)
        .await
        .expect("the sense run");
    // Its first poll waits for a runner of its pool.
    assert!(codes(&why(&db, sense).await).contains(&"no_live_runner"));
    let lease: uuid::Uuid = sqlx::query_scalar("SELECT lease FROM orca.claim('poller', 'sensing')")
        .fetch_one(&db.pool)
        .await
        .expect("claim the poll");
    sqlx::query("SELECT orca.finish($1, true)")
        .bind(lease)
        .execute(&db.pool)
        .await
        .expect("finish the poll");
    let w = why(&db, sense).await;
    let (_, msg, _) = reason(&w, "sensing");
    assert!(
        msg.contains("sensor report polls for new snapshots")
            && msg.contains("its last poll (attempt 1) ended succeeded"),
        "{msg}"
    );
}

/// A continuous sync whose run failed with its retries spent: its run says
/// when the supervisor starts the next one, and a tick after that starts it.
#[tokio::test]
async fn a_failed_continuous_sync_says_when_its_next_run_starts() {
    let db = TestDb::new().await;
    db.pool
        .execute("CREATE TABLE public.src (id bigint PRIMARY KEY)")
        .await
        .expect("source table");
    sqlx::query("SELECT orca.create_sync('live', $1, $2, $3, NULL, 'at_least_once', 'default', 0)")
        .bind(json!({"type": "postgres_cdc", "url": db.url(), "continuous": true}))
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
        .bind(
            json!([{"name": "src", "table": "public.src", "primary_key": ["id"], "mode": "merge"}]),
        )
        .execute(&db.pool)
        .await
        .expect("create_sync");
    let run: i64 = sqlx::query_scalar(
        "SELECT r.id FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id
         WHERE p.name = 'live'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the sync's run");
    let leases = claim(&db.pool, "r1", 10).await;
    let lease = leases.iter().find(|l| l.run == run).expect("its attempt");
    sqlx::query("SELECT orca.finish($1, false, 'the source went away')")
        .bind(lease.lease)
        .execute(&db.pool)
        .await
        .expect("fail it");
    let reasons = why(&db, run).await;
    let backoff = reason(&reasons, "restart_backoff");
    assert!(
        backoff.1.starts_with(
            "continuous sync live starts a new run after 10 s (1 failed runs in a row)"
        ),
        "{}",
        backoff.1
    );
    assert_eq!(
        backoff.2,
        Some(json!({"failed_runs": 1, "backoff_seconds": 10}))
    );
    let (since, until): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT since, until FROM orca.explain($1) WHERE code = 'restart_backoff'")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("since and until");
    assert_eq!((until - since).num_seconds(), 10);
    // Before the backoff passed, a tick starts nothing; after, it starts the next run.
    let early: Value = sqlx::query_scalar("SELECT orca.tick()")
        .fetch_one(&db.pool)
        .await
        .expect("tick");
    assert_eq!(early["continuous_restarted"], 0, "{early}");
    let late: Value = sqlx::query_scalar("SELECT orca.tick($1 + interval '1 second')")
        .bind(until)
        .fetch_one(&db.pool)
        .await
        .expect("tick");
    assert_eq!(late["continuous_restarted"], 1, "{late}");
    let reasons = why(&db, run).await;
    assert!(
        !codes(&reasons).contains(&"restart_backoff"),
        "a successor exists: {reasons:#?}"
    );
}
