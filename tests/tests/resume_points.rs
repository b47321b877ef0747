//! What a running attempt is asked to do (`orca.attempt_state`) and where a
//! step's long-running work resumes (`orca.resume_point`,
//! `orca.record_resume_point`), in SQL: the state follows pause, unpause,
//! cancel and the attempt's end; a resume point outlives its run, a later
//! attempt's record is never replaced by an earlier one's, a cancelled
//! attempt may still say where it stopped, and a bad location is refused
//! with nothing changed. (Another org's lease is tried in org_isolation.rs
//! and the security sweep; a real Flink job in flink.rs.)

use orca_tests::sqlx;
use orca_tests::*;
use serde_json::json;

async fn state(db: &TestDb, lease: uuid::Uuid) -> String {
    sqlx::query_scalar("SELECT orca.attempt_state($1)")
        .bind(lease)
        .fetch_one(&db.pool)
        .await
        .expect("attempt_state")
}

async fn point(db: &TestDb, lease: uuid::Uuid) -> Option<String> {
    sqlx::query_scalar("SELECT orca.resume_point($1, 'work', '2024-01')")
        .bind(lease)
        .fetch_one(&db.pool)
        .await
        .expect("resume_point")
}

async fn record(db: &TestDb, lease: uuid::Uuid, location: Option<&str>) -> bool {
    sqlx::query_scalar("SELECT orca.record_resume_point($1, 'work', '2024-01', $2)")
        .bind(lease)
        .bind(location)
        .fetch_one(&db.pool)
        .await
        .expect("record_resume_point")
}

async fn run_and_claim(db: &TestDb) -> (i64, Lease) {
    let run: i64 = sqlx::query_scalar("SELECT orca.run('stream', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let l = claim(&db.pool, "r", 1).await.remove(0);
    assert_eq!(l.run, run);
    (run, l)
}

async fn exec(db: &TestDb, sql: &str) {
    sqlx::query(sql).execute(&db.pool).await.expect(sql);
}

#[tokio::test]
async fn an_attempt_hears_of_pause_and_cancel_and_its_resume_point_outlives_the_run() {
    let db = TestDb::new().await;
    db.register(&json!({
        "name": "stream",
        "steps": [{"name": "work", "kind": "mapped"}],
        "partitions": {"monthly": "2024-01"},
        "registry_hash": "hash-stream",
        "binary": "/bin/true"
    }))
    .await;
    let (run, first) = run_and_claim(&db).await;
    assert_eq!(state(&db, first.lease).await, "running");
    exec(&db, "SELECT orca.pause('stream')").await;
    assert_eq!(state(&db, first.lease).await, "paused");
    exec(&db, "SELECT orca.unpause('stream')").await;
    assert_eq!(state(&db, first.lease).await, "running");

    // Nothing recorded yet; then a savepoint, which this run reads back.
    assert_eq!(point(&db, first.lease).await, None);
    assert!(
        record(
            &db,
            first.lease,
            Some("file:///sp/default/stream/work/2024-01/savepoint-1")
        )
        .await
    );
    assert_eq!(
        point(&db, first.lease).await.as_deref(),
        Some("file:///sp/default/stream/work/2024-01/savepoint-1")
    );

    // Bad locations are refused, naming the value, and change nothing.
    let before = db.table_counts().await;
    for bad in [
        "file:///sp/default/stream/../../globex/savepoint-9",
        "..",
        "",
        "file:///sp/x\nsavepoint",
    ] {
        let (code, msg) = expect_error(
            &db.pool,
            &format!(
                "SELECT orca.record_resume_point('{}', 'work', '2024-01', {})",
                first.lease,
                quote(bad)
            ),
        )
        .await;
        assert_eq!(code, "OR104", "{bad:?}: {msg}");
        assert!(msg.contains("resume point"), "{msg}");
    }
    let (code, _) = expect_error(
        &db.pool,
        &format!(
            "SELECT orca.record_resume_point('{}', 'nope', '2024-01', 'file:///sp/x')",
            first.lease
        ),
    )
    .await;
    assert_eq!(code, "OR016");
    assert_eq!(db.table_counts().await, before);
    assert_eq!(
        point(&db, first.lease).await.as_deref(),
        Some("file:///sp/default/stream/work/2024-01/savepoint-1")
    );

    // Cancelled: the attempt hears it, and may still say where it stopped.
    exec(&db, &format!("SELECT orca.cancel({run})")).await;
    assert_eq!(state(&db, first.lease).await, "cancelled");
    assert!(
        record(
            &db,
            first.lease,
            Some("file:///sp/default/stream/work/2024-01/savepoint-2")
        )
        .await
    );

    // The next run resumes there; once its attempt records, the cancelled
    // attempt's late word no longer replaces it.
    let (next, second) = run_and_claim(&db).await;
    assert_eq!(
        point(&db, second.lease).await.as_deref(),
        Some("file:///sp/default/stream/work/2024-01/savepoint-2")
    );
    assert!(
        record(
            &db,
            second.lease,
            Some("file:///sp/default/stream/work/2024-01/savepoint-3")
        )
        .await
    );
    assert!(
        !record(
            &db,
            first.lease,
            Some("file:///sp/default/stream/work/2024-01/savepoint-late")
        )
        .await
    );
    assert!(!record(&db, first.lease, None).await);
    assert_eq!(
        point(&db, second.lease).await.as_deref(),
        Some("file:///sp/default/stream/work/2024-01/savepoint-3")
    );
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orca.events WHERE kind = 'step.resume_point'")
            .fetch_one(&db.pool)
            .await
            .expect("events");
    assert_eq!(events, 3, "one event per recorded point");

    // Finished work forgets its resume point; a finished attempt's lease
    // is no longer good for it, and says why.
    assert!(record(&db, second.lease, None).await);
    assert_eq!(point(&db, second.lease).await, None);
    exec(
        &db,
        &format!("SELECT orca.finish('{}', true)", second.lease),
    )
    .await;
    assert_eq!(state(&db, second.lease).await, "ended");
    let (code, msg) = expect_error(
        &db.pool,
        &format!(
            "SELECT orca.record_resume_point('{}', 'work', '2024-01', 'file:///sp/x')",
            second.lease
        ),
    )
    .await;
    assert_eq!(code, "OR014", "{msg}");
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(next)
        .fetch_one(&db.pool)
        .await
        .expect("status");
    assert_eq!(status, "succeeded");
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}
