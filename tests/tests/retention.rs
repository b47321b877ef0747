//! Retention: under a steady load the history tables stop growing once
//! orca.tick prunes what is older than the orca.retain_* settings, and
//! nothing a live run, a keyed pipeline's done keys or an undelivered
//! webhook needs is pruned. Real time, a three-second window.

use std::time::Duration;

use orca_tests::sqlx::{self, Executor, PgConnection};
use orca_tests::*;
use serde_json::{json, Value};

const ROUNDS: usize = 10;
/// Runs each round queues and finishes.
const PER_ROUND: i64 = 4;

async fn count(c: &mut PgConnection, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM orca.{table}"))
        .fetch_one(c)
        .await
        .unwrap_or_else(|e| panic!("count {table}: {e}"))
}

async fn events_after(c: &mut PgConnection, from: i64) -> Vec<i64> {
    sqlx::query_scalar("SELECT id FROM orca.events WHERE id > $1 ORDER BY id")
        .bind(from)
        .fetch_all(c)
        .await
        .expect("events")
}

async fn tick(c: &mut PgConnection) -> Value {
    sqlx::query_scalar("SELECT orca.tick()")
        .fetch_one(c)
        .await
        .expect("tick")
}

/// One round of load: four runs queued, claimed and finished by r1.
async fn round(c: &mut PgConnection) {
    sqlx::query("SELECT orca.backfill('lake', '2024-01..2024-04')")
        .execute(&mut *c)
        .await
        .expect("backfill");
    tick(c).await;
    let leases = claim(&mut *c, "r1", PER_ROUND as i32).await;
    assert_eq!(leases.len(), PER_ROUND as usize);
    for l in leases {
        sqlx::query("SELECT orca.finish($1, true, NULL)")
            .bind(l.lease)
            .execute(&mut *c)
            .await
            .expect("finish");
    }
}

#[tokio::test]
async fn history_stops_growing_and_what_is_live_stays() {
    let db = TestDb::new().await;
    let mut c = connect_org(&db, "postgres", "default").await;
    for (name, pool) in [("lake", "default"), ("live", "slow")] {
        let mut m = lake_manifest(name);
        m["max_runs"] = json!(null);
        m["pool"] = json!(pool);
        m["steps"][0]["reads"] = json!([format!("{name}.raw")]);
        sqlx::query("SELECT orca.register($1)")
            .bind(&m)
            .execute(&mut c)
            .await
            .expect("register");
    }
    // A run that stays running throughout, with a step under way and a
    // pinned read.
    let live: i64 = sqlx::query_scalar("SELECT orca.run('live', '2024-01')")
        .fetch_one(&mut c)
        .await
        .expect("run");
    tick(&mut c).await;
    let held: uuid::Uuid = sqlx::query_scalar("SELECT lease FROM orca.claim('slowpoke', 'slow')")
        .fetch_one(&mut c)
        .await
        .expect("claim the live run");
    sqlx::query("SELECT orca.report_step($1, 'one', '2024-01', 'running')")
        .bind(held)
        .execute(&mut c)
        .await
        .expect("report");
    sqlx::query("SELECT orca.pin_read($1, 'one', '2024-01', 'live.raw', 7)")
        .bind(held)
        .execute(&mut c)
        .await
        .expect("pin");
    // A keyed pipeline whose key k1 is done.
    let keyed = json!({
        "name": "labels",
        "steps": [{"name": "label", "kind": "mapped"}],
        "partitions": {"keyed": {"dataset": "lake.clean", "column": "id"}},
        "pool": "keying",
        "registry_hash": "keyed",
        "binary": "/bin/true"
    });
    sqlx::query("SELECT orca.register($1)")
        .bind(&keyed)
        .execute(&mut c)
        .await
        .expect("register the keyed pipeline");
    let keys: uuid::Uuid = sqlx::query_scalar("SELECT lease FROM orca.claim('keyer', 'keying')")
        .fetch_one(&mut c)
        .await
        .expect("the keys task");
    sqlx::query("SELECT orca.report_keys($1, 5, 5000, ARRAY['k1'])")
        .bind(keys)
        .execute(&mut c)
        .await
        .expect("report keys");
    sqlx::query("SELECT orca.finish($1, true, NULL)")
        .bind(keys)
        .execute(&mut c)
        .await
        .expect("finish the keys task");
    sqlx::query("SELECT orca.run('labels', 'k1')")
        .execute(&mut c)
        .await
        .expect("a run of k1");
    tick(&mut c).await;
    let k1: uuid::Uuid = sqlx::query_scalar("SELECT lease FROM orca.claim('keyer', 'keying')")
        .fetch_one(&mut c)
        .await
        .expect("k1's run");
    sqlx::query("SELECT orca.report_step($1, 'label', 'k1', 'succeeded')")
        .bind(k1)
        .execute(&mut c)
        .await
        .expect("k1 labelled");
    sqlx::query("SELECT orca.finish($1, true, NULL)")
        .bind(k1)
        .execute(&mut c)
        .await
        .expect("finish k1");
    let done: bool =
        sqlx::query_scalar("SELECT done FROM orca.key_status('labels') WHERE key = 'k1'")
            .fetch_one(&mut c)
            .await
            .expect("key status");
    assert!(done);
    // A runner that is never seen again.
    c.execute("SELECT orca.register_runner('gone', 'default', 1, 'old-host')")
        .await
        .expect("runner");

    for setting in [
        "orca.retain_runs",
        "orca.retain_events",
        "orca.retain_webhook_deliveries",
        "orca.retain_runners",
        "orca.retain_tasks",
    ] {
        c.execute(format!("SET {setting} = '3s'").as_str())
            .await
            .expect("set retention");
    }
    let shown: Vec<(String, i32)> =
        sqlx::query_as("SELECT what, keep_seconds FROM orca.retention() ORDER BY what")
            .fetch_all(&mut c)
            .await
            .expect("retention");
    assert!(shown.iter().all(|(_, s)| *s == 3), "{shown:?}");
    // A bad setting is refused by name, and changes nothing.
    let err = c
        .execute("SET orca.retain_runs = 'a week'")
        .await
        .expect_err("a bad retention");
    assert!(err.to_string().contains("orca.retain_runs"), "{err}");

    // The load: the history stops growing once the window is full.
    let mut runs = Vec::new();
    let mut events = Vec::new();
    for _ in 0..ROUNDS {
        round(&mut c).await;
        sqlx::query("SELECT orca.heartbeat($1)")
            .bind(held)
            .execute(&mut c)
            .await
            .expect("heartbeat");
        tokio::time::sleep(Duration::from_millis(1000)).await;
        tick(&mut c).await;
        runs.push(count(&mut c, "runs").await);
        events.push(count(&mut c, "events").await);
    }
    let made = ROUNDS as i64 * PER_ROUND;
    let steady = runs[ROUNDS / 2..].iter().max().copied().unwrap_or(0);
    assert!(
        steady <= 6 * PER_ROUND + 3,
        "runs kept {runs:?} after {made} made: the history did not stop growing"
    );
    assert!(
        runs[ROUNDS - 1] <= runs[ROUNDS / 2] + PER_ROUND,
        "runs kept kept growing: {runs:?}"
    );
    assert!(
        events[ROUNDS - 1] <= events[ROUNDS / 2] + 2 * PER_ROUND * 10,
        "events kept growing: {events:?}"
    );
    for table in ["attempts", "step_states"] {
        let n = count(&mut c, table).await;
        assert!(n <= 2 * (6 * PER_ROUND + 3), "{table}: {n} rows kept");
    }

    // What is live stayed: the running run, its attempt, step and read.
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(live)
        .fetch_one(&mut c)
        .await
        .expect("the live run is kept");
    assert_eq!(status, "running");
    let kept: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM orca.attempts WHERE run_id = $1), \
                (SELECT count(*) FROM orca.step_states WHERE run_id = $1 AND status = 'running'), \
                (SELECT count(*) FROM orca.reads WHERE run_id = $1)",
    )
    .bind(live)
    .fetch_one(&mut c)
    .await
    .expect("the live run's rows");
    assert_eq!(kept, (1, 1, 1));
    let beat: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT orca.heartbeat($1)")
            .bind(held)
            .fetch_one(&mut c)
            .await
            .expect("the held lease still heartbeats");
    assert!(beat.is_some());
    // k1 is still done (its run is kept), so a 'new' refresh queues nothing.
    let done: bool =
        sqlx::query_scalar("SELECT done FROM orca.key_status('labels') WHERE key = 'k1'")
            .fetch_one(&mut c)
            .await
            .expect("key status");
    assert!(done, "pruning forgot that k1 is done");
    // The runner never seen again is gone; the one holding a lease stays.
    let runners: Vec<String> = sqlx::query_scalar("SELECT name FROM orca.runners ORDER BY name")
        .fetch_all(&mut c)
        .await
        .expect("runners");
    assert!(!runners.contains(&"gone".to_string()), "{runners:?}");
    assert!(runners.contains(&"slowpoke".to_string()), "{runners:?}");
    // The pruned rows are counted (the counters outlive them).
    let pruned: f64 = sqlx::query_scalar(
        "SELECT value FROM orca.metrics() WHERE metric = 'orca_pruned_runs_total'",
    )
    .fetch_one(&mut c)
    .await
    .expect("pruned runs counted");
    assert!(pruned >= (made - steady) as f64, "{pruned}");

    // An enabled webhook endpoint keeps the events it has not had.
    let hook: i64 = sqlx::query_scalar(
        "SELECT (orca.create_webhook('https://hooks.example.com/in', '{*}') ->> 'id')::bigint",
    )
    .fetch_one(&mut c)
    .await
    .expect("a webhook");
    let from: i64 = sqlx::query_scalar("SELECT cursor FROM orca.webhooks WHERE id = $1")
        .bind(hook)
        .fetch_one(&mut c)
        .await
        .expect("its cursor");
    let mut first: Vec<i64> = Vec::new();
    for i in 0..4 {
        round(&mut c).await;
        if i == 0 {
            first = events_after(&mut c, from).await;
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        tick(&mut c).await;
    }
    assert!(first.len() as i64 >= PER_ROUND, "{first:?}");
    let kept = events_after(&mut c, from).await;
    assert!(
        first.iter().all(|id| kept.contains(id)),
        "an undelivered event was pruned: {first:?} then {kept:?}"
    );
    // Disabled, it protects nothing: the old events go.
    c.execute(format!("SELECT orca.set_webhook_enabled({hook}, false)").as_str())
        .await
        .expect("disable");
    tokio::time::sleep(Duration::from_millis(3100)).await;
    for _ in 0..3 {
        tick(&mut c).await;
    }
    let kept = events_after(&mut c, from).await;
    assert!(
        !first.iter().any(|id| kept.contains(id)),
        "the first round's events outlived retention: {first:?} in {kept:?}"
    );
}

#[tokio::test]
async fn a_tick_prunes_a_bounded_batch() {
    let db = TestDb::new().await;
    let mut c = connect_org(&db, "postgres", "default").await;
    let mut m = lake_manifest("lake");
    m["max_runs"] = json!(null);
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut c)
        .await
        .expect("register");
    round(&mut c).await;
    c.execute("SET orca.retain_runs = '1s'").await.expect("set");
    c.execute("SET orca.retention_batch = 3")
        .await
        .expect("set");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let t = tick(&mut c).await;
    assert_eq!(t["pruned"]["runs"], json!(3), "{t}");
    let t = tick(&mut c).await;
    assert_eq!(t["pruned"]["runs"], json!(1), "{t}");
    assert_eq!(count(&mut c, "runs").await, 0);
    // 0 keeps forever.
    c.execute("SET orca.retain_runs = 0").await.expect("set");
    round(&mut c).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let t = tick(&mut c).await;
    assert!(t.get("pruned").is_none(), "{t}");
    assert_eq!(count(&mut c, "runs").await, PER_ROUND);
}

/// An org's enabled webhook holds back the pruning of its own org's events
/// only: another org's old events go on being pruned.
#[tokio::test]
async fn a_webhook_holds_back_its_own_orgs_events_only() {
    let db = TestDb::new().await;
    for org in ["acme", "globex"] {
        sqlx::query("SELECT orca.create_org($1)")
            .bind(org)
            .execute(&db.pool)
            .await
            .expect("org");
    }
    // acme's endpoint is enabled and has had nothing yet: it wants every
    // event of acme's after its cursor.
    let mut a = connect_org(&db, "postgres", "acme").await;
    a.execute("SELECT orca.create_webhook('https://hooks.example.com/acme', '{*}')")
        .await
        .expect("acme's webhook");
    let cursor: i64 = sqlx::query_scalar("SELECT cursor FROM orca.webhooks")
        .fetch_one(&mut a)
        .await
        .expect("its cursor");
    let mut events = std::collections::BTreeMap::new();
    for org in ["acme", "globex"] {
        let mut c = connect_org(&db, "postgres", org).await;
        let mut m = lake_manifest("lake");
        m["max_runs"] = json!(null);
        sqlx::query("SELECT orca.register($1)")
            .bind(&m)
            .execute(&mut c)
            .await
            .expect("register");
        sqlx::query("SELECT orca.backfill('lake', '2024-01..2024-04')")
            .execute(&mut c)
            .await
            .expect("backfill");
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT e.id FROM orca.events e JOIN orca.orgs o ON o.id = e.org_id \
             WHERE o.name = $1 AND e.id > $2 ORDER BY e.id",
        )
        .bind(org)
        .bind(cursor)
        .fetch_all(&db.pool)
        .await
        .expect("events");
        assert!(ids.len() >= 4, "{org}: {ids:?}");
        events.insert(org, ids);
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // The installation's tick (every org), with a one-second window.
    let mut all = db.connect().await;
    all.execute("SET orca.retain_events = '1s'")
        .await
        .expect("set");
    for _ in 0..3 {
        tick(&mut all).await;
    }
    let left = |org: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM orca.events e JOIN orca.orgs o ON o.id = e.org_id \
                 WHERE o.name = $1 AND e.id > $2 AND e.at < now() - interval '1 second'",
            )
            .bind(org)
            .bind(cursor)
            .fetch_one(&pool)
            .await
            .expect("events left")
        }
    };
    assert_eq!(
        left("acme").await,
        events["acme"].len() as i64,
        "acme's undelivered events were pruned"
    );
    assert_eq!(
        left("globex").await,
        0,
        "acme's webhook held back globex's pruning"
    );
}
