//! The autoscaling signal through the SQL API, as KEDA's postgresql scaler
//! and a dashboard read it: `orca.pool_load()` and `orca.pool_backlog()`
//! follow attempts and tasks as they are queued, claimed and finished; idle
//! pools read zero; a pool nothing names and an unknown kind are refused;
//! `orca.metrics()` carries the same figures.

use orca_tests::sqlx::{self, Executor, PgConnection};
use orca_tests::*;
use serde_json::{json, Value};

#[derive(Debug, PartialEq, sqlx::FromRow)]
struct Load {
    pool: String,
    queued_attempts: i64,
    running_attempts: i64,
    queued_tasks: i64,
    running_tasks: i64,
    runners: i64,
    slots: i64,
}

async fn load(c: &mut PgConnection) -> Vec<Load> {
    sqlx::query_as("SELECT * FROM orca.pool_load()")
        .fetch_all(c)
        .await
        .expect("pool_load")
}

async fn backlog(c: &mut PgConnection, pool: &str, kind: &str) -> i64 {
    sqlx::query_scalar("SELECT orca.pool_backlog($1, $2)")
        .bind(pool)
        .bind(kind)
        .fetch_one(c)
        .await
        .expect("pool_backlog")
}

fn row(pool: &str, figures: [i64; 6]) -> Load {
    let [queued_attempts, running_attempts, queued_tasks, running_tasks, runners, slots] = figures;
    Load {
        pool: pool.to_string(),
        queued_attempts,
        running_attempts,
        queued_tasks,
        running_tasks,
        runners,
        slots,
    }
}

async fn metric(c: &mut PgConnection, name: &str, pool: &str, state: &str) -> Option<f64> {
    sqlx::query_scalar(
        "SELECT value FROM orca.metrics() WHERE metric = $1 AND labels = jsonb_build_object('pool', $2::text, 'state', $3::text)",
    )
    .bind(name)
    .bind(pool)
    .bind(state)
    .fetch_optional(c)
    .await
    .expect("metrics")
}

#[tokio::test]
async fn the_backlog_follows_attempts_and_tasks_through_claims_and_finishes() {
    let db = TestDb::new().await;
    const VIEWER: &str = "orca_t_scaling_viewer";
    ensure_role(&db, VIEWER, &["orca_viewer"]).await;
    db.pool
        .execute(format!("SELECT orca.add_member('default', '{VIEWER}')").as_str())
        .await
        .expect("member");
    // A pipeline on the default pool that fans out tasks, and a runner token
    // of a pool nothing runs on yet (KEDA scaled it to zero).
    let mut m = daily_manifest("fanout", "0 3 * * *", "UTC");
    m["tasks"] = json!([{"name": "trips"}]);
    m["max_runs"] = Value::Null;
    db.register(&m).await;
    db.pool
        .execute("SELECT orca.create_runner_token('gpu', 'gpu-1')")
        .await
        .expect("token");
    let mut v = connect_org(&db, VIEWER, "default").await;
    assert_eq!(
        load(&mut v).await,
        [row("default", [0; 6]), row("gpu", [0; 6])],
        "idle pools read zero"
    );
    assert_eq!(backlog(&mut v, "gpu", "attempts").await, 0);

    // Three runs queued: three attempts want a slot.
    db.pool
        .execute("SELECT orca.backfill('fanout', '2024-01-01..2024-01-03')")
        .await
        .expect("backfill");
    assert_eq!(backlog(&mut v, "default", "attempts").await, 3);
    // One claimed: still three want a slot, one of them running.
    let leases = claim(&db.pool, "host-a", 1).await;
    assert_eq!(leases.len(), 1);
    let l = &load(&mut v).await[0];
    assert_eq!(
        (l.queued_attempts, l.running_attempts, l.runners),
        (2, 1, 1)
    );
    assert_eq!(backlog(&mut v, "default", "attempts").await, 3);

    // Its step adds 250 tasks in two batches; a runner claims one batch.
    let mut d = db.connect().await;
    for (first, n) in [(0, 100), (100, 150)] {
        let inputs: Vec<i64> = (first..first + n).collect();
        sqlx::query("SELECT orca.add_tasks($1, 'load', $2, 'trips', $3, $4)")
            .bind(leases[0].lease)
            .bind(&leases[0].partitions[0])
            .bind(first as i32)
            .bind(json!(inputs))
            .execute(&mut d)
            .await
            .expect("add_tasks");
    }
    assert_eq!(backlog(&mut v, "default", "tasks").await, 250);
    let claimed: Vec<(uuid::Uuid, Vec<i32>)> =
        sqlx::query_as("SELECT lease, indexes FROM orca.claim_tasks('host-a', 'default', 1)")
            .fetch_all(&mut d)
            .await
            .expect("claim_tasks");
    assert_eq!(claimed.len(), 1);
    let running = claimed[0].1.len() as i64;
    assert_eq!(running, 100, "the oldest batch, whole");
    let l = &load(&mut v).await[0];
    assert_eq!((l.queued_tasks, l.running_tasks), (250 - running, running));
    assert_eq!(
        metric(&mut v, "orca_pool_tasks", "default", "running").await,
        Some(running as f64)
    );
    assert_eq!(
        metric(&mut v, "orca_pool_attempts", "default", "queued").await,
        Some(2.0)
    );
    assert_eq!(
        metric(&mut v, "orca_pool_attempts", "gpu", "queued").await,
        Some(0.0),
        "an idle pool's series is there, at zero"
    );

    // The batch finished: its tasks leave the backlog.
    let outputs: Vec<Value> = claimed[0].1.iter().map(|i| json!(i)).collect();
    sqlx::query("SELECT orca.finish_tasks($1, $2)")
        .bind(claimed[0].0)
        .bind(Value::Array(outputs))
        .execute(&mut d)
        .await
        .expect("finish_tasks");
    assert_eq!(backlog(&mut v, "default", "tasks").await, 250 - running);

    // Bad input: a clear error naming the value, distinct codes.
    let (code, msg) = expect_error(&mut v, "SELECT orca.pool_backlog('gpus')").await;
    assert_eq!(code, "OR102");
    assert!(msg.contains("'gpus'") && msg.contains("'default'"), "{msg}");
    let (code, msg) = expect_error(&mut v, "SELECT orca.pool_backlog('gpu', 'slots')").await;
    assert_eq!(code, "OR103");
    assert!(msg.contains("'slots'"), "{msg}");
    let (code, _) = expect_error(&mut v, "SELECT orca.pool_backlog('gpu', NULL)").await;
    assert_eq!(code, "OR103");
}

#[tokio::test]
async fn another_org_reads_only_its_own_pools() {
    let db = TestDb::new().await;
    const BOB: &str = "orca_t_scaling_bob";
    ensure_role(&db, BOB, &["orca_viewer"]).await;
    db.pool
        .execute(
            format!("SELECT orca.create_org('globex'); SELECT orca.add_member('globex', '{BOB}')")
                .as_str(),
        )
        .await
        .expect("globex");
    // The default org's work on a pool of its own name.
    let mut m = daily_manifest("etl", "0 3 * * *", "UTC");
    m["pool"] = json!("etl");
    m["max_runs"] = Value::Null;
    db.register(&m).await;
    db.pool
        .execute("SELECT orca.backfill('etl', '2024-01-01..2024-01-04')")
        .await
        .expect("backfill");
    let mut admin = db.connect().await;
    assert_eq!(backlog(&mut admin, "etl", "attempts").await, 4);

    let mut g = connect_org(&db, BOB, "globex").await;
    assert_eq!(load(&mut g).await, [], "globex uses no pool");
    let (code, msg) = expect_error(&mut g, "SELECT orca.pool_backlog('etl')").await;
    assert_eq!(code, "OR102", "{msg}");
    assert!(msg.contains("'globex'"), "{msg}");
    let leaked: Vec<String> = sqlx::query_scalar(
        "SELECT labels::text FROM orca.metrics() WHERE metric LIKE 'orca_pool_%'",
    )
    .fetch_all(&mut g)
    .await
    .expect("metrics");
    assert_eq!(leaked, Vec::<String>::new());
    // Naming the other org is refused, as everywhere.
    let (code, _) = expect_error(
        &mut g,
        "SELECT set_config('orca.org', 'default', false); SELECT * FROM orca.pool_load()",
    )
    .await;
    assert_eq!(code, "OR002");
}
