//! Incidents (`orca.incidents`), each kind caused for real through the SQL
//! API and seen opening and resolving in the transaction of the report that
//! shows it: a run's last attempt failing and a later one succeeding, a
//! maintenance run failing and one succeeding, a tick finding a pool with
//! work and no live runner and then one with a runner, a relay disabling an
//! endpoint and an operator enabling it. One open incident per key, even
//! when reports race; a resolved key seen again opens a new one; the org's
//! playbooks run in the opening transaction.

use std::time::Duration;

use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

/// (id, kind, summary, seen, resolved, resolution, actions)
type Incident = (i64, String, String, i32, bool, Option<String>, Value);

async fn incidents(db: &TestDb, kind: &str) -> Vec<Incident> {
    sqlx::query_as(
        "SELECT id, kind, summary, seen, resolved_at IS NOT NULL, resolution, actions \
         FROM orca.incidents WHERE kind = $1 ORDER BY id",
    )
    .bind(kind)
    .fetch_all(&db.pool)
    .await
    .expect("incidents")
}

async fn events(db: &TestDb, kind: &str) -> Vec<Value> {
    sqlx::query_scalar("SELECT data FROM orca.events WHERE kind = $1 ORDER BY id")
        .bind(kind)
        .fetch_all(&db.pool)
        .await
        .expect("events")
}

fn manifest(name: &str, retries: i64) -> Value {
    json!({
        "name": name,
        "steps": [{"name": "work", "kind": "mapped", "writes": [format!("lake.{name}")]}],
        "partitions": {"monthly": "2024-01"},
        "registry_hash": format!("hash-{name}"),
        "binary": "/bin/true",
        "run_retries": retries
    })
}

async fn run(db: &TestDb, pipeline: &str, partition: &str) -> i64 {
    sqlx::query_scalar("SELECT orca.run($1, $2)")
        .bind(pipeline)
        .bind(partition)
        .fetch_one(&db.pool)
        .await
        .expect("run")
}

/// Claims the run's pending attempt and finishes it.
async fn finish(db: &TestDb, run: i64, ok: bool, error: &str) {
    let leases = claim(&db.pool, "r1", 100).await;
    let l = leases
        .iter()
        .find(|l| l.run == run)
        .unwrap_or_else(|| panic!("no pending attempt of run {run}"));
    sqlx::query("SELECT orca.finish($1, $2, $3)")
        .bind(l.lease)
        .bind(ok)
        .bind(error)
        .execute(&db.pool)
        .await
        .expect("finish");
    for other in leases.iter().filter(|l| l.run != run) {
        sqlx::query("SELECT orca.release($1)")
            .bind(other.lease)
            .execute(&db.pool)
            .await
            .expect("release");
    }
}

#[tokio::test]
async fn a_run_that_spends_its_retries_opens_an_incident_that_a_success_resolves() {
    let db = TestDb::new().await;
    db.register(&manifest("lake", 1)).await;
    let r = run(&db, "lake", "2024-01").await;
    // The first failure is retried: no incident yet.
    finish(&db, r, false, "disk full").await;
    assert!(incidents(&db, "run_failed").await.is_empty());
    finish(&db, r, false, "disk still full").await;
    let open = incidents(&db, "run_failed").await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert!(
        open[0].2.contains(&format!(
            "run {r} of lake over 2024-01 failed with its retries spent"
        )) && open[0].2.contains("disk still full"),
        "{}",
        open[0].2
    );
    assert_eq!(events(&db, "incident.opened").await.len(), 1);

    // Another run of the same partition failing is the same incident, seen again.
    let again = run(&db, "lake", "2024-01").await;
    finish(&db, again, false, "x").await;
    finish(&db, again, false, "disk full for good").await;
    let open = incidents(&db, "run_failed").await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].3, 2, "seen twice");
    // Another partition is another incident.
    let feb = run(&db, "lake", "2024-02").await;
    finish(&db, feb, false, "x").await;
    finish(&db, feb, false, "y").await;
    assert_eq!(incidents(&db, "run_failed").await.len(), 2);

    // The run retried by hand succeeds: its incident resolves in that transaction.
    sqlx::query("SELECT orca.retry($1)")
        .bind(r)
        .execute(&db.pool)
        .await
        .expect("retry");
    finish(&db, r, true, "").await;
    let all = incidents(&db, "run_failed").await;
    assert!(all[0].4, "{all:?}");
    assert_eq!(
        all[0].5.as_deref(),
        Some(format!("run {r} succeeded").as_str())
    );
    assert!(!all[1].4, "February's stays open: {all:?}");
    let resolved = events(&db, "incident.resolved").await;
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0]["incident"], all[0].0);

    // The key seen again after it resolved opens a new incident.
    let third = run(&db, "lake", "2024-01").await;
    finish(&db, third, false, "a").await;
    finish(&db, third, false, "b").await;
    let all = incidents(&db, "run_failed").await;
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(!all[2].4);
}

#[tokio::test]
async fn racing_reports_open_one_incident() {
    let db = TestDb::new().await;
    db.register(&manifest("race", 0)).await;
    let runs = [
        run(&db, "race", "2024-01").await,
        run(&db, "race", "2024-01").await,
    ];
    let leases = claim(&db.pool, "r1", 10).await;
    assert_eq!(leases.len(), 2);
    // Both last attempts fail at once, each in its own transaction.
    let mut tasks = Vec::new();
    for l in leases {
        let pool = db.pool.clone();
        tasks.push(tokio::spawn(async move {
            sqlx::query("SELECT orca.finish($1, false, 'boom')")
                .bind(l.lease)
                .execute(&pool)
                .await
                .expect("finish");
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let open = incidents(&db, "run_failed").await;
    assert_eq!(open.len(), 1, "{open:?} for runs {runs:?}");
    assert_eq!(open[0].3, 2, "seen by both reports");
}

#[tokio::test]
async fn playbooks_run_in_the_transaction_that_opens_the_incident() {
    let db = TestDb::new().await;
    db.register(&manifest("flaky", 0)).await;
    let retry: i64 = sqlx::query_scalar("SELECT orca.create_playbook('run_failed', 'retry_run')")
        .fetch_one(&db.pool)
        .await
        .expect("playbook");
    let page: i64 = sqlx::query_scalar(
        "SELECT orca.create_playbook('run_failed', 'page', '{\"severity\": \"critical\"}')",
    )
    .fetch_one(&db.pool)
    .await
    .expect("playbook");
    let r = run(&db, "flaky", "2024-01").await;
    finish(&db, r, false, "first").await;
    // Retried by its playbook: the run runs again, and a pager got the page.
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(r)
        .fetch_one(&db.pool)
        .await
        .expect("status");
    assert_eq!(status, "running");
    let open = incidents(&db, "run_failed").await;
    assert_eq!(
        open[0].6,
        json!([
            {"playbook": retry, "action": "retry_run", "outcome": format!("run {r} queued again"),
             "at": open[0].6[0]["at"]},
            {"playbook": page, "action": "page", "outcome": "paged", "at": open[0].6[1]["at"]}
        ])
    );
    let pages = events(&db, "incident.page").await;
    assert_eq!(pages.len(), 1);
    assert_eq!(pages[0]["severity"], "critical");
    assert_eq!(pages[0]["incident"], open[0].0);
    // It fails again: the incident is open, so no second retry, no second page.
    finish(&db, r, false, "second").await;
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(r)
        .fetch_one(&db.pool)
        .await
        .expect("status");
    assert_eq!(status, "failed");
    assert_eq!(events(&db, "incident.page").await.len(), 1);

    // A pause playbook pauses the pipeline whose run failed.
    sqlx::query("SELECT orca.drop_playbook($1)")
        .bind(retry)
        .execute(&db.pool)
        .await
        .expect("drop");
    db.pool
        .execute("SELECT orca.create_playbook('run_failed', 'pause')")
        .await
        .expect("pause playbook");
    let feb = run(&db, "flaky", "2024-02").await;
    finish(&db, feb, false, "down").await;
    let paused: bool = sqlx::query_scalar("SELECT paused FROM orca.pipelines WHERE name = 'flaky'")
        .fetch_one(&db.pool)
        .await
        .expect("paused");
    assert!(paused);
    let by: Vec<Value> = events(&db, "pipeline.paused").await;
    assert!(
        by.iter()
            .any(|e| e["by"].as_str().is_some_and(|b| b.starts_with("playbook "))),
        "{by:?}"
    );
}

#[tokio::test]
async fn a_failing_maintenance_opens_an_incident_for_its_dataset() {
    let db = TestDb::new().await;
    db.register(&manifest("lake", 0)).await;
    let m: i64 = sqlx::query_scalar("SELECT orca.maintain('lake.lake')")
        .fetch_one(&db.pool)
        .await
        .expect("maintain");
    let retries: i32 = sqlx::query_scalar("SELECT run_retries FROM orca.runs WHERE id = $1")
        .bind(m)
        .fetch_one(&db.pool)
        .await
        .expect("retries");
    for i in 0..=retries {
        finish(&db, m, false, &format!("the store refused ({i})")).await;
    }
    let open = incidents(&db, "maintenance_failing").await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert!(
        open[0].2.contains("maintenance of lake.lake failed"),
        "{}",
        open[0].2
    );
    assert!(incidents(&db, "run_failed").await.is_empty());
    let next: i64 = sqlx::query_scalar("SELECT orca.maintain('lake.lake')")
        .fetch_one(&db.pool)
        .await
        .expect("maintain");
    finish(&db, next, true, "").await;
    let all = incidents(&db, "maintenance_failing").await;
    assert!(all[0].4, "{all:?}");
}

#[tokio::test]
async fn a_pool_with_work_and_no_runner_opens_an_incident_until_a_runner_is_back() {
    let db = TestDb::new().await;
    db.register(&manifest("lake", 0)).await;
    let r = run(&db, "lake", "2024-01").await;
    // A minute later no runner has come: the tick opens it, once.
    let later = (chrono::Utc::now() + chrono::Duration::seconds(90)).to_rfc3339();
    let t = db.tick(&later).await;
    assert_eq!(t["incidents_opened"], 1, "{t}");
    let t = db.tick(&later).await;
    assert_eq!(t["incidents_opened"], 0, "{t}");
    let open = incidents(&db, "pool_without_runner").await;
    assert_eq!(open.len(), 1);
    assert!(
        open[0].2.contains("pool default has 1 attempt waiting")
            && open[0].2.contains("none was ever seen"),
        "{}",
        open[0].2
    );
    assert_eq!(open[0].3, 2, "the second tick saw it again");
    // A runner claims: the next tick resolves it.
    finish(&db, r, true, "").await;
    let t = db.tick(&chrono::Utc::now().to_rfc3339()).await;
    assert_eq!(t["incidents_resolved"], 1, "{t}");
    let all = incidents(&db, "pool_without_runner").await;
    assert!(all[0].4);
    assert_eq!(
        all[0].5.as_deref(),
        Some("a runner of the pool is live again")
    );
}

#[tokio::test]
async fn an_endpoint_the_relay_disables_opens_an_incident_that_enabling_resolves() {
    let db = TestDb::new().await;
    db.register(&manifest("lake", 0)).await;
    let hook: i64 = sqlx::query_scalar(
        "SELECT (orca.create_webhook('https://hooks.example.com/pager', '{run.*}')->>'id')::bigint",
    )
    .fetch_one(&db.pool)
    .await
    .expect("webhook");
    run(&db, "lake", "2024-01").await;
    let event: i64 = sqlx::query_scalar("SELECT max(id) FROM orca.events")
        .fetch_one(&db.pool)
        .await
        .expect("event");
    let mut c = db.pool.acquire().await.expect("connection");
    c.execute("SET orca.webhook_disable_after_seconds = 1")
        .await
        .expect("set");
    let fail = "SELECT orca.relay_done($1, $2, false, 503, 12, NULL, 'relay-1')";
    for _ in 0..2 {
        sqlx::query(fail)
            .bind(hook)
            .bind(event)
            .execute(&mut *c)
            .await
            .expect("relay_done");
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    let open = incidents(&db, "webhook_disabled").await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert!(
        open[0].2.contains(&format!(
            "webhook {hook} (https://hooks.example.com/pager) was disabled"
        )) && open[0].2.contains("503"),
        "{}",
        open[0].2
    );
    sqlx::query("SELECT orca.set_webhook_enabled($1, true)")
        .bind(hook)
        .execute(&db.pool)
        .await
        .expect("enable");
    let all = incidents(&db, "webhook_disabled").await;
    assert!(all[0].4, "{all:?}");
    assert!(all[0]
        .5
        .as_deref()
        .is_some_and(|r| r.starts_with("enabled again by ")));
}

#[tokio::test]
async fn bad_playbooks_and_resolutions_are_refused_and_change_nothing() {
    let db = TestDb::new().await;
    db.register(&manifest("lake", 0)).await;
    let before = db.table_counts().await;
    for (sql, code, says) in [
        (
            "SELECT orca.create_playbook('run_faild', 'retry_run')",
            "OR105",
            "unknown incident kind 'run_faild'",
        ),
        (
            "SELECT orca.create_playbook('run_failed', 'reboot')",
            "OR105",
            "unknown playbook action 'reboot'",
        ),
        (
            "SELECT orca.create_playbook('webhook_disabled', 'retry_run')",
            "OR105",
            "has no run to retry",
        ),
        (
            "SELECT orca.create_playbook('pool_without_runner', 'pause')",
            "OR105",
            "has no pipeline to pause",
        ),
        (
            "SELECT orca.create_playbook('run_failed', 'page', '{\"severity\": \"meh\"}')",
            "OR105",
            "severity",
        ),
        (
            "SELECT orca.create_playbook('run_failed', 'retry_run', '{\"severity\": \"high\"}')",
            "OR105",
            "page takes severity",
        ),
        (
            "SELECT orca.create_playbook('run_failed', 'scale_sync')",
            "OR105",
            "a run_failed incident has no sync to scale",
        ),
        (
            "SELECT orca.create_playbook('cdc_lag', 'pause')",
            "OR105",
            "a cdc_lag incident has no pipeline to pause",
        ),
        (
            "SELECT orca.create_playbook('cdc_lag', 'scale_sync', '{\"max_lanes\": 65}')",
            "OR105",
            "scale_sync takes max_lanes (1 to 64)",
        ),
        (
            "SELECT orca.create_playbook('sync_stalled', 'scale_sync', '{\"max_lanes\": \"4\"}')",
            "OR105",
            "scale_sync takes max_lanes",
        ),
        (
            "SELECT orca.set_incident_threshold('lag_bytes', 10)",
            "OR109",
            "unknown incident threshold 'lag_bytes'",
        ),
        (
            "SELECT orca.set_incident_threshold('cdc_lag_bytes', 0)",
            "OR109",
            "incident threshold cdc_lag_bytes must be 1 or more (NULL: its default, 1073741824), got 0",
        ),
        (
            "SELECT orca.create_playbook('run_failed', 'page', '[]')",
            "OR105",
            "playbook options []",
        ),
        (
            "SELECT orca.drop_playbook(424242)",
            "OR106",
            "unknown playbook 424242",
        ),
        (
            "SELECT orca.resolve_incident(424242)",
            "OR107",
            "unknown incident 424242",
        ),
    ] {
        let (c, msg) = expect_error(&db.pool, sql).await;
        assert_eq!(c, code, "{sql}: {msg}");
        assert!(msg.contains(says), "{sql}: {msg}");
    }
    assert_eq!(db.table_counts().await, before);
    // Resolved by hand, once.
    let r = run(&db, "lake", "2024-01").await;
    finish(&db, r, false, "x").await;
    let id = incidents(&db, "run_failed").await[0].0;
    sqlx::query("SELECT orca.resolve_incident($1, 'fixed the disk')")
        .bind(id)
        .execute(&db.pool)
        .await
        .expect("resolve");
    let all = incidents(&db, "run_failed").await;
    assert!(
        all[0]
            .5
            .as_deref()
            .is_some_and(|r| r.ends_with(": fixed the disk")),
        "{all:?}"
    );
    let (c, msg) = expect_error(&db.pool, &format!("SELECT orca.resolve_incident({id})")).await;
    assert_eq!(c, "OR108", "{msg}");
}

/// Thresholds: set, read back through what the tick uses, reset to the
/// default with NULL; each change is an event naming the old value. A
/// sync's own threshold wins over its org's and goes with the sync.
#[tokio::test]
async fn incident_thresholds_are_set_per_org_and_reset_to_their_default() {
    let db = TestDb::new().await;
    let was: i64 =
        sqlx::query_scalar("SELECT orca.set_incident_threshold('sync_stalled_seconds', 60)")
            .fetch_one(&db.pool)
            .await
            .expect("set");
    assert_eq!(was, 900, "the default");
    let was: i64 =
        sqlx::query_scalar("SELECT orca.set_incident_threshold('sync_stalled_seconds', NULL)")
            .fetch_one(&db.pool)
            .await
            .expect("reset");
    assert_eq!(was, 60);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.incident_thresholds")
            .await,
        0,
        "reset leaves no row"
    );
    let set = events(&db, "incident.threshold_set").await;
    assert_eq!(set.len(), 2, "{set:?}");
    assert_eq!(set[1]["value"], 900, "{set:?}");
    assert_eq!(set[1]["was"], 60, "{set:?}");
    // A sync's own threshold wins over the org's, is reset to the org's
    // with NULL, and goes with the sync.
    let root = scratch_root();
    sqlx::query("SELECT orca.create_sync('mirror', $1, $2, $3)")
        .bind(json!({"type": "files", "url": format!("{root}/thresholds-in"), "format": "jsonl"}))
        .bind(json!({"type": "parquet", "url": format!("{root}/thresholds-out")}))
        .bind(json!([{"name": "events", "pattern": "*.jsonl"}]))
        .execute(&db.pool)
        .await
        .expect("a sync");
    db.pool
        .execute("SELECT orca.set_incident_threshold('cdc_lag_bytes', 1000)")
        .await
        .expect("the org's threshold");
    let was: i64 = sqlx::query_scalar(
        "SELECT orca.set_incident_threshold('cdc_lag_bytes', 50, sync => 'mirror')",
    )
    .fetch_one(&db.pool)
    .await
    .expect("a sync's threshold");
    assert_eq!(was, 1000, "a sync without its own has the org's");
    let rows: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT y.name, t.value FROM orca.incident_thresholds t
         LEFT JOIN orca.syncs y ON y.id = t.sync_id WHERE t.name = 'cdc_lag_bytes' ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .expect("thresholds");
    assert_eq!(rows, [(Some("mirror".to_string()), 50), (None, 1000)]);
    let set = events(&db, "incident.threshold_set").await;
    assert_eq!(
        set.last().map(|e| e["sync"].clone()),
        Some(json!("mirror")),
        "{set:?}"
    );
    let was: i64 =
        sqlx::query_scalar("SELECT orca.set_incident_threshold('cdc_lag_bytes', NULL, 'mirror')")
            .fetch_one(&db.pool)
            .await
            .expect("reset a sync's threshold");
    assert_eq!(was, 50);
    let (c, msg) = expect_error(
        &db.pool,
        "SELECT orca.set_incident_threshold('cdc_lag_bytes', 10, 'no_such_sync')",
    )
    .await;
    assert_eq!(c, "OR064", "{msg}");
    assert!(msg.contains("no_such_sync"), "{msg}");
    db.pool
        .execute(
            "SELECT orca.set_incident_threshold('sync_stalled_seconds', 30, 'mirror');
             SELECT orca.drop_sync('mirror');",
        )
        .await
        .expect("a sync's threshold, then the sync dropped");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.incident_thresholds WHERE sync_id IS NOT NULL")
            .await,
        0,
        "a dropped sync's thresholds go with it"
    );
    // Playbooks for the new kinds are accepted where they can act.
    for sql in [
        "SELECT orca.create_playbook('cdc_lag', 'scale_sync', '{\"max_lanes\": 4}')",
        "SELECT orca.create_playbook('sync_stalled', 'page')",
        "SELECT orca.create_playbook('slot_at_risk', 'page', '{\"severity\": \"critical\"}')",
        "SELECT orca.create_playbook('sensor_unreadable', 'pause')",
    ] {
        sqlx::query(sql)
            .execute(&db.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}
