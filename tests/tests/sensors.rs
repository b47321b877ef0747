//! Sensors in the control plane: snapshots other pipelines' succeeded runs
//! commit, and snapshots outside writers make (reported by polls), each start
//! exactly one run.

use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

fn pipeline(name: &str, reads: &[&str], writes: &[&str], sensor: bool) -> Value {
    json!({
        "name": name,
        "steps": [{"name": "work", "kind": "mapped", "reads": reads, "writes": writes}],
        "partitions": {"monthly": "2024-01"},
        "sensor": sensor,
        "pool": if sensor { "sensing" } else { "default" },
        "registry_hash": format!("hash-{name}"),
        "binary": "/bin/true"
    })
}

/// Runs `name` over `month`, committing `snapshot` to `dataset`; finishes ok or not.
async fn commit_run(
    db: &TestDb,
    name: &str,
    month: &str,
    dataset: &str,
    snapshot: i64,
    ok: bool,
) -> i64 {
    let run: i64 = sqlx::query_scalar("SELECT orca.run($1, $2)")
        .bind(name)
        .bind(month)
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let l = claim(&db.pool, "r", 10)
        .await
        .into_iter()
        .find(|l| l.run == run)
        .expect("lease");
    sqlx::query("SELECT orca.record_commit($1, 'work', $2, $3, $4, 1)")
        .bind(l.lease)
        .bind(month)
        .bind(dataset)
        .bind(snapshot)
        .execute(&db.pool)
        .await
        .expect("commit");
    let before = sensor_runs(db).await.len();
    db.tick(&chrono::Utc::now().to_rfc3339()).await;
    assert_eq!(
        sensor_runs(db).await.len(),
        before,
        "a commit of a run still going is not seen yet"
    );
    sqlx::query("SELECT orca.finish($1, $2, 'boom')")
        .bind(l.lease)
        .bind(ok)
        .execute(&db.pool)
        .await
        .expect("finish");
    run
}

async fn sensor_runs(db: &TestDb) -> Vec<String> {
    db.strings(
        "SELECT p.name || ' ' || array_to_string(r.partitions, ',') FROM orca.runs r
         JOIN orca.pipelines p ON p.id = r.pipeline_id WHERE r.trigger = 'sensor' ORDER BY r.id",
    )
    .await
}

#[tokio::test]
async fn a_snapshot_a_succeeded_run_committed_starts_one_run_on_the_next_tick() {
    let db = TestDb::new().await;
    db.register(&pipeline("clean", &["lake.raw"], &["lake.clean"], false))
        .await;
    // A commit made before the sensor existed is history, not news.
    commit_run(&db, "clean", "2024-01", "lake.clean", 100, true).await;
    db.register(&pipeline("report", &["lake.clean"], &["bi.monthly"], true))
        .await;
    let now = || chrono::Utc::now().to_rfc3339();
    db.tick(&now()).await;
    assert!(sensor_runs(&db).await.is_empty());

    commit_run(&db, "clean", "2024-02", "lake.clean", 200, true).await;
    let t = db.tick(&now()).await;
    assert_eq!(t["sensor_runs"], 1, "{t}");
    assert_eq!(sensor_runs(&db).await, ["report 2024-02"]);
    // However many ticks see it, the snapshot started one run.
    db.tick(&now()).await;
    db.tick(&now()).await;
    assert_eq!(sensor_runs(&db).await.len(), 1);
    let (dataset, snapshot, source): (String, i64, String) = sqlx::query_as(
        "SELECT dataset, snapshot_id, source FROM orca.sensed WHERE run_id IS NOT NULL",
    )
    .fetch_one(&db.pool)
    .await
    .expect("what started the run");
    assert_eq!(
        (dataset.as_str(), snapshot, source.as_str()),
        ("lake.clean", 200, "orca")
    );

    // A failed run's commit starts nothing.
    commit_run(&db, "clean", "2024-03", "lake.clean", 300, false).await;
    db.tick(&now()).await;
    assert_eq!(sensor_runs(&db).await.len(), 1);
}

async fn poll(db: &TestDb) -> Lease {
    db.tick(&chrono::Utc::now().to_rfc3339()).await;
    let rows = sqlx::query_as::<_, (uuid::Uuid, String)>(
        "SELECT lease, command FROM orca.claim('poller', 'sensing')",
    )
    .fetch_all(&db.pool)
    .await
    .expect("claim a poll");
    assert_eq!(rows.len(), 1, "one poll queued");
    assert_eq!(rows[0].1, "sense", "the runner runs `<binary> sense`");
    Lease {
        attempt: 0,
        run: 0,
        lease: rows[0].0,
        partitions: vec![],
        number: 0,
    }
}

async fn report(db: &TestDb, l: &Lease, snapshots: Value) -> i32 {
    sqlx::query_scalar("SELECT orca.report_snapshots($1, $2)")
        .bind(l.lease)
        .bind(snapshots)
        .fetch_one(&db.pool)
        .await
        .expect("report")
}

#[tokio::test]
async fn an_outside_snapshot_found_by_polls_starts_exactly_one_run() {
    let db = TestDb::new().await;
    db.register(&pipeline("report", &["ext.orders"], &["bi.orders"], true))
        .await;
    let ctx: Value = {
        let l = poll(&db).await;
        let ctx = sqlx::query_scalar("SELECT orca.sense_context($1)")
            .bind(l.lease)
            .fetch_one(&db.pool)
            .await
            .expect("context");
        let later = chrono::Utc::now().timestamp_millis() + 1000;
        let snaps = json!([
            // A day maps to the month that contains it.
            {"dataset": "ext.orders", "snapshot": 7, "timestamp_ms": later, "partitions": "2024-03-15"},
            // Older than the sensor: already seen at registration.
            {"dataset": "ext.orders", "snapshot": 6, "timestamp_ms": 1_000},
            // Orca's own commits are seen from the control plane instead.
            {"dataset": "ext.orders", "snapshot": 8, "timestamp_ms": later, "orca_run": "12"},
            // Not a dataset the sensor watches.
            {"dataset": "ext.other", "snapshot": 9, "timestamp_ms": later}
        ]);
        assert_eq!(report(&db, &l, snaps.clone()).await, 1);
        // A second runner reporting the same snapshot starts nothing more.
        assert_eq!(report(&db, &l, snaps).await, 0);
        sqlx::query("SELECT orca.finish($1, true)")
            .bind(l.lease)
            .execute(&db.pool)
            .await
            .expect("finish the poll");
        ctx
    };
    assert_eq!(ctx["datasets"], json!(["ext.orders"]));
    assert_eq!(sensor_runs(&db).await, ["report 2024-03"]);
    // The sense run stays; polls are its attempts, one at a time.
    let kinds = db
        .strings("SELECT kind || ' ' || status FROM orca.runs WHERE trigger = 'sense'")
        .await;
    assert_eq!(kinds, ["sense running"]);
    let t = db.tick(&chrono::Utc::now().to_rfc3339()).await;
    assert_eq!(t["sense_polls"], 0, "not due yet: {t}");
    let later = (chrono::Utc::now() + chrono::Duration::seconds(61)).to_rfc3339();
    let t = db.tick(&later).await;
    assert_eq!(t["sense_polls"], 1, "due after orca.sense_seconds: {t}");
}

#[tokio::test]
async fn without_partitions_a_sensor_run_covers_what_the_schedule_would_fill() {
    let db = TestDb::new().await;
    let mut scheduled = pipeline("daily_report", &["ext.orders"], &[], true);
    scheduled["schedule"] = json!({"cron": "0 6 * * *", "tz": "UTC"});
    scheduled["fills"] = json!("previous");
    db.register(&scheduled).await;
    let l = poll(&db).await;
    let later = chrono::Utc::now().timestamp_millis() + 1000;
    report(
        &db,
        &l,
        json!([{"dataset": "ext.orders", "snapshot": 1, "timestamp_ms": later}]),
    )
    .await;
    let expected = db
        .strings("SELECT to_char((now() AT TIME ZONE 'UTC') - interval '1 month', 'YYYY-MM')")
        .await;
    assert_eq!(
        sensor_runs(&db).await,
        [format!("daily_report {}", expected[0])]
    );
}

#[tokio::test]
async fn a_sensor_must_read_a_dataset_it_does_not_write() {
    let db = TestDb::new().await;
    let bad = pipeline("loop", &["x.a"], &["x.a"], true);
    let (code, msg) =
        expect_error(&db.pool, &format!("SELECT orca.register('{bad}'::jsonb)")).await;
    assert_eq!(code, "OR040");
    assert!(msg.contains("sensor"), "{msg}");
    db.pool.execute("SELECT 1").await.expect("still fine");
}

#[tokio::test]
async fn a_poll_finished_in_a_batch_leaves_the_sensor_watching() {
    let db = TestDb::new().await;
    db.register(&pipeline("watch", &["up.data"], &[], true))
        .await;
    db.tick(&chrono::Utc::now().to_rfc3339()).await;
    let poll: uuid::Uuid =
        sqlx::query_scalar("SELECT lease FROM orca.claim('p', 'sensing') WHERE command = 'sense'")
            .fetch_one(&db.pool)
            .await
            .expect("a poll");
    let n: i32 = sqlx::query_scalar("SELECT orca.finish_many(ARRAY[$1::uuid])")
        .bind(poll)
        .fetch_one(&db.pool)
        .await
        .expect("finish the poll");
    assert_eq!(n, 1);
    let status = db
        .strings("SELECT status FROM orca.runs WHERE kind = 'sense'")
        .await;
    assert_eq!(status, ["running"], "the sense run goes on");
    let attempt = db
        .strings("SELECT a.status FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id WHERE r.kind = 'sense'")
        .await;
    assert_eq!(attempt, ["succeeded"]);
}
