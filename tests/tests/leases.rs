//! Leases under concurrency and failure: racing claims, heartbeats, lapsed
//! leases reclaimed by tick, stale tokens refused.

use std::collections::HashSet;

use orca_tests::sqlx::{self, Connection, Executor};
use orca_tests::*;
use serde_json::json;

/// A daily pipeline with no run cap, `n` runs queued and started.
async fn with_pending(db: &TestDb, n: usize) {
    let mut m = daily_manifest("jobs", "0 3 * * *", "UTC");
    m["run_retries"] = json!(0);
    db.register(&m).await;
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT orca.backfill('jobs', to_char(d, 'YYYY-MM-DD')) \
         FROM generate_series('2021-01-01'::date, '2021-01-01'::date + ($1 - 1), '1 day') d",
    )
    .bind(n as i32)
    .fetch_all(&db.pool)
    .await
    .expect("backfill");
    assert_eq!(ids.len(), n);
}

#[tokio::test]
async fn two_sessions_racing_for_one_attempt_never_both_get_it() {
    let db = TestDb::new().await;
    with_pending(&db, 1).await;
    let mut a = db.connect().await;
    let mut b = db.connect().await;
    let mut ta = a.begin().await.expect("begin a");
    let mut tb = b.begin().await.expect("begin b");
    // A holds the row lock until it commits; B must skip it, not wait.
    let got_a = claim(&mut *ta, "a", 1).await;
    let got_b = claim(&mut *tb, "b", 1).await;
    assert_eq!(got_a.len(), 1);
    assert!(got_b.is_empty(), "B got {got_b:?} while A held it");
    ta.commit().await.expect("commit a");
    tb.commit().await.expect("commit b");
    assert!(claim(&db.pool, "b", 1).await.is_empty(), "it stays A's");
}

#[tokio::test]
async fn many_concurrent_claimers_share_out_every_attempt_exactly_once() {
    let db = TestDb::new().await;
    const N: usize = 300;
    with_pending(&db, N).await;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let mut conn = db.connect().await;
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = claim(&mut conn, &format!("w{w}"), 3).await;
                if got.is_empty() {
                    break;
                }
                for l in got {
                    sqlx::query("SELECT orca.finish($1, true)")
                        .bind(l.lease)
                        .execute(&mut conn)
                        .await
                        .expect("finish");
                    mine.push(l.attempt);
                }
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("worker"));
    }
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(all.len(), N, "every attempt claimed once");
    assert_eq!(distinct.len(), N, "no attempt claimed twice");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.runs WHERE status = 'succeeded'")
            .await,
        N as i64
    );
}

#[tokio::test]
async fn heartbeat_extends_the_deadline() {
    let db = TestDb::new().await;
    with_pending(&db, 1).await;
    let mut c = db.connect().await;
    c.execute("SET orca.lease_seconds = 120")
        .await
        .expect("set");
    let l = claim(&mut c, "r", 1).await;
    let before: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT deadline FROM orca.attempts WHERE id = $1")
            .bind(l[0].attempt)
            .fetch_one(&db.pool)
            .await
            .expect("deadline");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let after: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT orca.heartbeat($1)")
        .bind(l[0].lease)
        .fetch_one(&mut c)
        .await
        .expect("heartbeat");
    assert!(after > before, "{after} > {before}");
    let secs = (after - chrono::Utc::now()).num_seconds();
    assert!((100..=121).contains(&secs), "deadline {secs} s ahead");
}

#[tokio::test]
async fn a_lease_that_stops_heartbeating_is_reclaimed_and_retried() {
    let db = TestDb::new().await;
    with_pending(&db, 1).await;
    let first = claim(&db.pool, "dies", 1).await;
    assert_eq!(first[0].number, 1);
    // Before the deadline nothing happens; after it, the attempt is lost.
    let t = db.tick(&chrono::Utc::now().to_rfc3339()).await;
    assert_eq!(t["attempts_lost"], 0, "{t}");
    let later = (chrono::Utc::now() + chrono::Duration::seconds(60)).to_rfc3339();
    let t = db.tick(&later).await;
    assert_eq!(t["attempts_lost"], 1, "{t}");
    let again = db.tick(&later).await;
    assert_eq!(again["attempts_lost"], 0, "idempotent: {again}");

    let status: String = sqlx::query_scalar("SELECT status FROM orca.attempts WHERE id = $1")
        .bind(first[0].attempt)
        .fetch_one(&db.pool)
        .await
        .expect("attempt");
    assert_eq!(status, "lost");
    // The old token is refused and changes nothing; a live runner gets attempt 2.
    let before = db.table_counts().await;
    let (code, msg) = expect_error(
        &db.pool,
        &format!("SELECT orca.heartbeat('{}')", first[0].lease),
    )
    .await;
    assert_eq!(code, "OR014");
    assert!(msg.contains("is lost"), "{msg}");
    assert_eq!(
        expect_error(
            &db.pool,
            &format!("SELECT orca.finish('{}', true)", first[0].lease)
        )
        .await
        .0,
        "OR014"
    );
    assert_eq!(db.table_counts().await, before);
    let second = claim(&db.pool, "lives", 1).await;
    assert_eq!(second[0].run, first[0].run);
    assert_eq!(second[0].number, 2);
    let kinds = db
        .strings(&format!(
            "SELECT kind FROM orca.events WHERE run_id = {} AND kind LIKE 'attempt.%' ORDER BY id",
            first[0].run
        ))
        .await;
    assert_eq!(kinds, ["attempt.leased", "attempt.lost", "attempt.leased"]);
}

#[tokio::test]
async fn a_run_that_keeps_losing_its_lease_fails_after_the_budget() {
    let db = TestDb::new().await;
    with_pending(&db, 1).await;
    let mut c = db.connect().await;
    c.execute("SET orca.lost_attempts_max = 2")
        .await
        .expect("set");
    for minutes in 1..=3 {
        let l = claim(&mut c, "flaky", 1).await;
        assert_eq!(l.len(), 1);
        let at = (chrono::Utc::now() + chrono::Duration::minutes(minutes)).to_rfc3339();
        sqlx::query("SELECT orca.tick($1::timestamptz)")
            .bind(at)
            .execute(&mut c)
            .await
            .expect("tick");
    }
    let (status, losses, error): (String, i32, String) =
        sqlx::query_as("SELECT status, losses, error FROM orca.runs")
            .fetch_one(&db.pool)
            .await
            .expect("run");
    assert_eq!(status, "failed");
    assert_eq!(losses, 3);
    assert!(error.contains("no lost attempts left"), "{error}");
    assert!(claim(&db.pool, "flaky", 1).await.is_empty());
}

#[tokio::test]
async fn unknown_and_finished_leases_are_refused_without_changes() {
    let db = TestDb::new().await;
    with_pending(&db, 1).await;
    let l = claim(&db.pool, "r", 1).await;
    sqlx::query("SELECT orca.finish($1, true)")
        .bind(l[0].lease)
        .execute(&db.pool)
        .await
        .expect("finish");
    let before = db.table_counts().await;
    let fake = uuid::Uuid::new_v4();
    for sql in [
        format!("SELECT orca.heartbeat('{fake}')"),
        format!("SELECT orca.finish('{fake}', false, 'x')"),
        format!("SELECT orca.report_step('{fake}', 'load', '2021-01-01', 'running')"),
    ] {
        let (code, msg) = expect_error(&db.pool, &sql).await;
        assert_eq!(code, "OR012", "{sql}: {msg}");
        assert!(msg.contains(&fake.to_string()), "{msg}");
    }
    let (code, msg) = expect_error(
        &db.pool,
        &format!("SELECT orca.finish('{}', false)", l[0].lease),
    )
    .await;
    assert_eq!(code, "OR014");
    assert!(msg.contains("succeeded"), "{msg}");
    assert_eq!(db.table_counts().await, before);
}

/// orca.claim locks its picked queue rows, then leases their attempts, in
/// one call whose window cannot be paused from outside; this test takes the
/// same locks in the same order by hand, and a cancel arrives in between.
#[tokio::test]
async fn a_cancel_that_meets_a_claim_in_flight_waits_for_it_instead_of_deadlocking() {
    let db = TestDb::new().await;
    with_pending(&db, 1).await;
    let run = db.scalar_i64("SELECT id FROM orca.runs").await;
    let attempt = db.scalar_i64("SELECT attempt_id FROM orca.queue").await;
    let mut claimer = db.connect().await;
    claimer.execute("BEGIN").await.expect("begin");
    sqlx::query("SELECT 1 FROM orca.queue WHERE attempt_id = $1 FOR UPDATE SKIP LOCKED")
        .bind(attempt)
        .execute(&mut claimer)
        .await
        .expect("pick");
    let mut canceller = db.connect().await;
    let canceller_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut canceller)
        .await
        .expect("pid");
    let cancel = tokio::spawn(async move {
        sqlx::query("SELECT orca.cancel($1)")
            .bind(run)
            .execute(&mut canceller)
            .await
    });
    // The cancel reaches the queue row the claim holds and waits for it.
    wait_for_sql(
        &db,
        "the cancel to wait for the claim's lock",
        &format!(
            "SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity \
             WHERE pid = {canceller_pid}"
        ),
        std::time::Duration::from_secs(10),
        String::new,
    )
    .await;
    for sql in [
        "UPDATE orca.attempts SET status = 'leased', runner = 'r', \
         lease = orca._new_lease(id), leased_at = now() WHERE id = $1",
        "INSERT INTO orca.leases (org_id, attempt_id, lease, runner, deadline) \
         SELECT org_id, id, lease, 'r', now() + interval '1 minute' FROM orca.attempts WHERE id = $1",
        "DELETE FROM orca.queue WHERE attempt_id = $1",
    ] {
        sqlx::query(sql)
            .bind(attempt)
            .execute(&mut claimer)
            .await
            .unwrap_or_else(|e| panic!("the claim's step {sql}: {e}"));
    }
    claimer.execute("COMMIT").await.expect("commit");
    cancel
        .await
        .expect("join")
        .expect("the cancel, after the claim");
    let status: String = sqlx::query_scalar("SELECT status FROM orca.attempts WHERE id = $1")
        .bind(attempt)
        .fetch_one(&db.pool)
        .await
        .expect("attempt");
    assert_eq!(status, "cancelled");
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.leases").await, 0);
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.queue").await, 0);
    assert_eq!(
        db.strings("SELECT status FROM orca.runs").await,
        ["cancelled"]
    );
}

#[tokio::test]
async fn leases_and_queue_rows_go_with_their_runs_when_runs_are_deleted_by_hand() {
    let db = TestDb::new().await;
    with_pending(&db, 2).await;
    let l = claim(&db.pool, "r", 1).await;
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.queue").await, 1);
    sqlx::query("DELETE FROM orca.runs")
        .execute(&db.pool)
        .await
        .expect("delete the runs");
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.leases").await, 0);
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.queue").await, 0);
    assert!(claim(&db.pool, "r", 1).await.is_empty());
    // The runner's next heartbeat is refused, so it stops the attempt.
    for sql in [
        format!("SELECT orca.heartbeat('{}')", l[0].lease),
        format!("SELECT orca.finish('{}', true)", l[0].lease),
        format!(
            "SELECT orca.finish_many(ARRAY['{}']::uuid[], false)",
            l[0].lease
        ),
    ] {
        let (code, msg) = expect_error(&db.pool, &sql).await;
        assert_eq!(code, "OR012", "{sql}: {msg}");
        assert!(msg.contains(&l[0].lease.to_string()), "{msg}");
    }
}

#[tokio::test]
async fn finish_many_finishes_a_batch_or_nothing() {
    let db = TestDb::new().await;
    with_pending(&db, 6).await;
    let l = claim(&db.pool, "r", 6).await;
    let first: Vec<uuid::Uuid> = l[..3].iter().map(|x| x.lease).collect();
    let n: i32 = sqlx::query_scalar("SELECT orca.finish_many($1)")
        .bind(&first)
        .fetch_one(&db.pool)
        .await
        .expect("finish_many");
    assert_eq!(n, 3);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.runs WHERE status = 'succeeded'")
            .await,
        3
    );
    // Every run's events in order: the attempt, then the run.
    let kinds = db
        .strings(&format!(
            "SELECT kind FROM orca.events WHERE run_id = {} AND kind LIKE '%.succeeded' ORDER BY id",
            l[0].run
        ))
        .await;
    assert_eq!(kinds, ["attempt.succeeded", "run.succeeded"]);
    // One finished lease in the batch refuses the whole batch.
    let before = db.table_counts().await;
    let mixed = vec![l[3].lease, l[0].lease, l[4].lease];
    let err = sqlx::query("SELECT orca.finish_many($1)")
        .bind(&mixed)
        .execute(&db.pool)
        .await
        .expect_err("a finished lease in the batch");
    let code = match &err {
        sqlx::Error::Database(d) => d.code().map(|c| c.to_string()),
        _ => None,
    };
    assert_eq!(code.as_deref(), Some("OR014"), "{err}");
    assert_eq!(db.table_counts().await, before);
    // So does a forged token (a live attempt's id, other random bits) or a
    // NULL beside live leases, and the error names the token.
    let forged = uuid::Uuid::from_u128(l[4].lease.as_u128() ^ (1u128 << 100));
    for (batch, named) in [
        (format!("'{}', '{forged}'", l[3].lease), forged.to_string()),
        (format!("'{}', NULL", l[3].lease), "NULL".to_string()),
    ] {
        let sql = format!("SELECT orca.finish_many(ARRAY[{batch}]::uuid[])");
        let (code, msg) = expect_error(&db.pool, &sql).await;
        assert_eq!(code, "OR012", "{sql}: {msg}");
        assert!(msg.contains(&named), "{msg}");
        assert_eq!(db.table_counts().await, before);
    }
    // A live lease given twice is finished once.
    let twice = vec![l[5].lease, l[5].lease];
    let n: i32 = sqlx::query_scalar("SELECT orca.finish_many($1)")
        .bind(&twice)
        .fetch_one(&db.pool)
        .await
        .expect("the same lease twice");
    assert_eq!(n, 1);
    // Failing a batch retries or fails each run by its own budget.
    let rest = vec![l[3].lease, l[4].lease];
    sqlx::query("SELECT orca.finish_many($1, false, 'disk full')")
        .bind(&rest)
        .execute(&db.pool)
        .await
        .expect("fail two");
    let errors = db
        .strings("SELECT error FROM orca.runs WHERE status = 'failed' ORDER BY id")
        .await;
    assert_eq!(errors, ["disk full", "disk full"]);
}

#[tokio::test]
async fn a_released_attempt_goes_to_another_runner_without_spending_budgets() {
    let db = TestDb::new().await;
    with_pending(&db, 1).await;
    let l = claim(&db.pool, "stopping", 1).await;
    sqlx::query("SELECT orca.release($1, 'SIGTERM')")
        .bind(l[0].lease)
        .execute(&db.pool)
        .await
        .expect("release");
    let (failures, losses, status): (i32, i32, String) =
        sqlx::query_as("SELECT failures, losses, status FROM orca.runs")
            .fetch_one(&db.pool)
            .await
            .expect("run");
    assert_eq!((failures, losses, status.as_str()), (0, 0, "running"));
    let next = claim(&db.pool, "other", 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].number, 2);
    assert_eq!(
        expect_error(&db.pool, &format!("SELECT orca.release('{}')", l[0].lease))
            .await
            .0,
        "OR014"
    );
}

/// A run handed back again and again is in a loop: past ten hand-backs in
/// ten minutes the attempt fails, and the run's retries (none here) decide.
#[tokio::test]
async fn a_run_handed_back_in_a_loop_fails_instead_of_going_round() {
    let db = TestDb::new().await;
    with_pending(&db, 1).await;
    for n in 1..=11 {
        let l = claim(&db.pool, "looping", 1).await;
        assert_eq!(l.len(), 1, "attempt {n} is there to claim");
        assert_eq!(l[0].number, n);
        sqlx::query("SELECT orca.release($1, 'restart: a new column')")
            .bind(l[0].lease)
            .execute(&db.pool)
            .await
            .expect("release");
    }
    let (status, error): (String, Option<String>) =
        sqlx::query_as("SELECT status, error FROM orca.runs")
            .fetch_one(&db.pool)
            .await
            .expect("run");
    assert_eq!(status, "failed");
    let error = error.unwrap_or_default();
    assert!(
        error.contains("handed back 11 times in 10 minutes") && error.contains("a new column"),
        "{error}"
    );
    let released = db
        .scalar_i64("SELECT count(*) FROM orca.attempts WHERE status = 'released'")
        .await;
    assert_eq!(released, 10);
    assert!(
        claim(&db.pool, "looping", 1).await.is_empty(),
        "nothing left to claim"
    );
}
