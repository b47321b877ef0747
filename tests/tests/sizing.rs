//! Sizing through the SQL API: the size a version declares is each
//! attempt's, handed to the runner with its lease; an attempt killed for
//! memory comes back bigger (by memory_growth, up to max_memory) without
//! spending the run's retries, and at the cap it is an ordinary failure;
//! bad sizes and bad reports are refused with nothing changed.

use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

const MI: i64 = 1 << 20;

async fn sized(db: &TestDb, name: &str, resources: Value, run_retries: i64) {
    let mut m = daily_manifest(name, "0 3 * * *", "UTC");
    m["resources"] = resources;
    m["run_retries"] = json!(run_retries);
    db.register(&m).await;
}

/// (number, resources, killed_for, status) of a run's attempts.
async fn attempts(db: &TestDb, run: i64) -> Vec<(i32, Option<Value>, Option<String>, String)> {
    sqlx::query_as(
        "SELECT number, resources, killed_for, status FROM orca.attempts WHERE run_id = $1 ORDER BY number",
    )
    .bind(run)
    .fetch_all(&db.pool)
    .await
    .expect("attempts")
}

async fn claim_one(db: &TestDb) -> (uuid::Uuid, i64, Value) {
    let (lease, run, resources): (uuid::Uuid, i64, Option<Value>) =
        sqlx::query_as("SELECT lease, run, resources FROM orca.claim('host-a', 'default', 1)")
            .fetch_one(&db.pool)
            .await
            .expect("a claim");
    (lease, run, resources.unwrap_or(Value::Null))
}

async fn finish(db: &TestDb, lease: uuid::Uuid, error: &str, killed_for: Option<&str>) -> String {
    sqlx::query_scalar("SELECT orca.finish($1, false, $2, $3)")
        .bind(lease)
        .bind(error)
        .bind(killed_for)
        .fetch_one(&db.pool)
        .await
        .expect("finish")
}

#[tokio::test]
async fn an_attempt_killed_for_memory_comes_back_bigger_up_to_the_cap() {
    let db = TestDb::new().await;
    sized(
        &db,
        "hungry",
        json!({"memory": "100Mi", "max_memory": "400Mi", "memory_growth": 2, "cpu": "500m"}),
        0,
    )
    .await;
    db.pool
        .execute("SELECT orca.backfill('hungry', '2024-01-01')")
        .await
        .expect("backfill");
    // The lease carries the size the runner holds the child to.
    let (lease, run, size) = claim_one(&db).await;
    assert_eq!(size, json!({"cpu_millis": 500, "memory_bytes": 100 * MI}));
    // Killed for memory: retried at twice the memory, no retry spent
    // (run_retries is 0).
    assert_eq!(
        finish(&db, lease, "OOMKilled", Some("memory")).await,
        "running"
    );
    let (lease, _, size) = claim_one(&db).await;
    assert_eq!(size["memory_bytes"], 200 * MI);
    assert_eq!(size["cpu_millis"], 500, "CPU stays as declared");
    assert_eq!(
        finish(&db, lease, "OOMKilled", Some("memory")).await,
        "running"
    );
    // The cap: 400 MiB, not 800.
    let (lease, _, size) = claim_one(&db).await;
    assert_eq!(size["memory_bytes"], 400 * MI);
    // Killed at the cap: an ordinary failure, and with no retries left the
    // run fails, saying why.
    assert_eq!(
        finish(&db, lease, "killed for memory at 400 MiB", Some("memory")).await,
        "failed"
    );
    let seen = attempts(&db, run).await;
    let sizes: Vec<i64> = seen
        .iter()
        .map(|(_, r, _, _)| {
            r.as_ref()
                .and_then(|r| r["memory_bytes"].as_i64())
                .unwrap_or(0)
        })
        .collect();
    assert_eq!(sizes, [100 * MI, 200 * MI, 400 * MI]);
    assert!(seen
        .iter()
        .all(|(_, _, why, status)| why.as_deref() == Some("memory") && status == "failed"));
    let (failures, error): (i32, String) =
        sqlx::query_as("SELECT failures, error FROM orca.runs WHERE id = $1")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("run");
    assert_eq!(failures, 1, "only the kill at the cap was a failure");
    assert!(error.contains("400 MiB"), "{error}");
    // The retries' events say why.
    let afters = db
        .strings(&format!(
            "SELECT data->>'after' FROM orca.events WHERE run_id = {run} AND kind = 'run.retrying' ORDER BY id"
        ))
        .await;
    assert_eq!(afters, ["killed for memory", "killed for memory"]);
}

#[tokio::test]
async fn a_grown_size_is_kept_by_later_attempts_and_an_unsized_version_has_none() {
    let db = TestDb::new().await;
    sized(&db, "grown", json!({"memory": "64Mi"}), 1).await;
    db.pool
        .execute("SELECT orca.backfill('grown', '2024-01-01')")
        .await
        .expect("backfill");
    let (lease, run, size) = claim_one(&db).await;
    assert_eq!(size, json!({"memory_bytes": 64 * MI}));
    finish(&db, lease, "OOMKilled", Some("memory")).await;
    // The grown attempt fails for another reason: its retry (one spent)
    // keeps the grown size rather than starting small again.
    let (lease, _, size) = claim_one(&db).await;
    assert_eq!(size["memory_bytes"], 128 * MI);
    assert_eq!(finish(&db, lease, "bad data", None).await, "running");
    let (lease, _, size) = claim_one(&db).await;
    assert_eq!(size["memory_bytes"], 128 * MI);
    assert_eq!(finish(&db, lease, "bad data again", None).await, "failed");
    let failures = db
        .scalar_i64(&format!(
            "SELECT failures::bigint FROM orca.runs WHERE id = {run}"
        ))
        .await;
    assert_eq!(failures, 2);

    // A version that declares no size: its attempts have none, and a
    // runner's report of a memory kill is an ordinary failure.
    let mut m = daily_manifest("plain", "0 3 * * *", "UTC");
    m["run_retries"] = json!(0);
    db.register(&m).await;
    db.pool
        .execute("SELECT orca.backfill('plain', '2024-01-01')")
        .await
        .expect("backfill");
    let (lease, run, size) = claim_one(&db).await;
    assert_eq!(size, Value::Null);
    assert_eq!(
        finish(&db, lease, "OOMKilled", Some("memory")).await,
        "failed"
    );
    assert_eq!(attempts(&db, run).await.len(), 1);
}

#[tokio::test]
async fn bad_sizes_and_bad_reports_are_refused_with_nothing_changed() {
    let db = TestDb::new().await;
    for (resources, field) in [
        (json!({"memory": "lots"}), "resources.memory"),
        (
            json!({"memory": "1Gi", "max_memory": "512Mi"}),
            "resources.max_memory",
        ),
        (json!({"cpu": "0m"}), "resources.cpu"),
        (
            json!({"memory": "1Gi", "memory_growth": 0.5}),
            "resources.memory_growth",
        ),
        (json!({"gpus": 2}), "resources.gpus"),
    ] {
        let mut m = daily_manifest("bad", "0 3 * * *", "UTC");
        m["resources"] = resources.clone();
        let (code, msg) = expect_error(
            &db.pool,
            &format!(
                "SELECT orca.register('{}')",
                m.to_string().replace('\'', "''")
            ),
        )
        .await;
        assert_eq!(code, "OR040", "{resources}: {msg}");
        assert!(msg.contains(field), "{resources}: {msg}");
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.pipelines").await,
        0
    );
    // A step's size counts too: the attempt gets the larger.
    let mut m = daily_manifest("stepped", "0 3 * * *", "UTC");
    m["resources"] = json!({"memory": "256Mi", "cpu": "1"});
    m["steps"][0]["resources"] = json!({"memory": "1Gi"});
    db.register(&m).await;
    db.pool
        .execute("SELECT orca.backfill('stepped', '2024-01-01')")
        .await
        .expect("backfill");
    let (lease, run, size) = claim_one(&db).await;
    assert_eq!(size, json!({"cpu_millis": 1000, "memory_bytes": 1 << 30}));
    for call in [
        format!("SELECT orca.finish('{lease}', false, 'x', 'cpu')"),
        format!("SELECT orca.finish('{lease}', true, NULL, 'memory')"),
    ] {
        let (code, msg) = expect_error(&db.pool, &call).await;
        assert_eq!(code, "OR050", "{call}: {msg}");
        assert!(msg.contains("killed_for"), "{msg}");
    }
    let seen = attempts(&db, run).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].3, "leased", "the refused reports changed nothing");
    assert_eq!(seen[0].2, None);
}
