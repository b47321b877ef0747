//! The SQL API as a user drives it from psql: register, run, backfill,
//! claim, heartbeat, finish, cancel, retry, and the outbox they write.

use orca_tests::sqlx::{self, Executor, Row};
use orca_tests::*;
use serde_json::json;

async fn statuses(db: &TestDb, pipeline: &str) -> Vec<String> {
    db.strings(&format!(
        "SELECT r.status FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
         WHERE p.name = '{pipeline}' ORDER BY r.id"
    ))
    .await
}

async fn finish(db: &TestDb, lease: &Lease, ok: bool) -> String {
    sqlx::query_scalar("SELECT orca.finish($1, $2, CASE WHEN $2 THEN NULL ELSE 'boom' END)")
        .bind(lease.lease)
        .bind(ok)
        .fetch_one(&db.pool)
        .await
        .expect("finish")
}

#[tokio::test]
async fn register_accepts_the_documented_manifest_and_versions_it() {
    let db = TestDb::new().await;
    // The exact shape the issue requires.
    let m = json!({"name":"lake","steps":[{"name":"one","kind":"mapped"},{"name":"two","kind":"gather","after":"one","retries":2}],
        "partitions":{"monthly":"2024-01"},"schedule":{"cron":"0 3 2 * *","tz":"UTC"},
        "fills":"previous","max_runs":2,"run_retries":3,"catchup":true,
        "registry_hash":"...","binary":"/path/to/lake"});
    let v1 = db.register(&m).await;
    assert_eq!(
        db.register(&m).await,
        v1,
        "the same manifest is the same version"
    );

    let mut m2 = m.clone();
    m2["registry_hash"] = json!("changed");
    m2["commit"] = json!("abc123");
    let v2 = db.register(&m2).await;
    assert_ne!(v1, v2);
    let row = sqlx::query(
        "SELECT p.current_version, v.version, v.commit, v.binary_path, v.max_runs, v.run_retries \
         FROM orca.pipelines p JOIN orca.pipeline_versions v ON v.id = p.current_version \
         WHERE p.name = 'lake'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("pipeline row");
    assert_eq!(row.get::<i64, _>("current_version"), v2);
    assert_eq!(row.get::<i32, _>("version"), 2);
    assert_eq!(
        row.get::<Option<String>, _>("commit").as_deref(),
        Some("abc123")
    );
    assert_eq!(row.get::<String, _>("binary_path"), "/path/to/lake");
    assert_eq!(row.get::<Option<i32>, _>("max_runs"), Some(2));
    assert_eq!(row.get::<i32, _>("run_retries"), 3);
    let steps = db
        .strings(&format!(
            "SELECT name || ':' || kind || ':' || coalesce(after, '-') || ':' || retries \
             FROM orca.steps WHERE version_id = {v2} ORDER BY position"
        ))
        .await;
    assert_eq!(steps, ["one:mapped:-:0", "two:gather:one:2"]);
    // Going back to the first manifest makes the first version current again.
    assert_eq!(db.register(&m).await, v1);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.events WHERE kind = 'pipeline.registered'")
            .await,
        3
    );
}

#[tokio::test]
async fn backfill_queues_one_run_per_partition_and_max_runs_caps_running() {
    let db = TestDb::new().await;
    db.register(&lake_manifest("lake")).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('lake', '2024-01..2024-06')")
        .fetch_all(&db.pool)
        .await
        .expect("backfill");
    assert_eq!(ids.len(), 6);
    let parts = db
        .strings("SELECT partitions[1] FROM orca.runs ORDER BY id")
        .await;
    assert_eq!(
        parts,
        ["2024-01", "2024-02", "2024-03", "2024-04", "2024-05", "2024-06"]
    );
    // max_runs = 2: the two oldest run, the rest wait.
    assert_eq!(
        statuses(&db, "lake").await,
        ["running", "running", "queued", "queued", "queued", "queued"]
    );
    // Every run has its (step, partition) states: mapped per partition, gather once.
    let states = db
        .strings(&format!(
            "SELECT step || '/' || partition || '/' || status FROM orca.step_states \
             WHERE run_id = {} ORDER BY step",
            ids[0]
        ))
        .await;
    assert_eq!(states, ["one/2024-01/pending", "two/*/pending"]);

    let leases = claim(&db.pool, "r1", 10).await;
    assert_eq!(leases.len(), 2, "only started runs have attempts to claim");
    assert_eq!(finish(&db, &leases[0], true).await, "succeeded");
    // The freed slot goes to the oldest queued run.
    assert_eq!(
        statuses(&db, "lake").await,
        [
            "succeeded",
            "running",
            "running",
            "queued",
            "queued",
            "queued"
        ]
    );
    let next = claim(&db.pool, "r1", 10).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].run, ids[2]);
    assert_eq!(next[0].partitions, ["2024-03"]);
}

#[tokio::test]
async fn a_backfill_policy_queues_runs_of_several_partitions() {
    let db = TestDb::new().await;
    let mut m = lake_manifest("lake");
    m["max_runs"] = json!(null);
    m["backfill_per_run"] = json!(4);
    db.register(&m).await;
    let runs = |sql: &'static str| {
        let pool = db.pool.clone();
        async move {
            let ids: Vec<i64> = sqlx::query_scalar(sql).fetch_all(&pool).await.expect(sql);
            let parts: Vec<Vec<String>> = sqlx::query_scalar(
                "SELECT partitions FROM orca.runs WHERE id = ANY($1) ORDER BY id",
            )
            .bind(&ids)
            .fetch_all(&pool)
            .await
            .expect("partitions");
            parts.into_iter().map(|p| p.join(",")).collect::<Vec<_>>()
        }
    };
    // The pipeline's policy: consecutive months, four a run, oldest first.
    assert_eq!(
        runs("SELECT orca.backfill('lake', '2024-01..2024-10')").await,
        [
            "2024-01,2024-02,2024-03,2024-04",
            "2024-05,2024-06,2024-07,2024-08",
            "2024-09,2024-10"
        ]
    );
    // Each run's attempt covers its months: a state per (step, month).
    let first = db
        .strings(
            "SELECT step || '/' || partition FROM orca.step_states \
             WHERE run_id = (SELECT min(id) FROM orca.runs) ORDER BY step, partition",
        )
        .await;
    assert_eq!(
        first,
        [
            "one/2024-01",
            "one/2024-02",
            "one/2024-03",
            "one/2024-04",
            "two/*"
        ]
    );
    let lease = claim(&db.pool, "r1", 1).await.remove(0);
    assert_eq!(
        lease.partitions,
        ["2024-01", "2024-02", "2024-03", "2024-04"]
    );
    // The call's own per_run wins, and months already queued are skipped.
    assert_eq!(
        runs("SELECT orca.backfill('lake', '2024-09..2025-02', per_run => 2)").await,
        ["2024-11,2024-12", "2025-01,2025-02"]
    );
    assert!(runs("SELECT orca.backfill('lake', '2024-01..2024-12', 5)")
        .await
        .is_empty());
    // per_run is bounded by orca.max_partitions, as a run's partitions are.
    let mut c = db.connect().await;
    c.execute("SET orca.max_partitions = 3").await.expect("set");
    // Out of bounds: refused, nothing queued.
    let before = db.table_counts().await;
    for (sql, want) in [
        ("SELECT orca.backfill('lake', '2026-01', 0)", "got 0"),
        ("SELECT orca.backfill('lake', '2026-01', -1)", "got -1"),
        ("SELECT orca.backfill('lake', '2026-01', 4)", "from 1 to 3"),
    ] {
        let (code, msg) = expect_error(&mut c, sql).await;
        assert_eq!(code, "OR110", "{sql}: {msg}");
        assert!(msg.contains(want), "{sql}: {msg}");
    }
    assert_eq!(db.table_counts().await, before);
}

#[tokio::test]
async fn partition_lists_all_and_multi_partition_runs() {
    let db = TestDb::new().await;
    let mut m = lake_manifest("lake");
    m["max_runs"] = json!(null);
    db.register(&m).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('lake', '2024-01,2024-03')")
        .fetch_all(&db.pool)
        .await
        .expect("list");
    assert_eq!(ids.len(), 2);
    let all: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('lake', '@all')")
        .fetch_all(&db.pool)
        .await
        .expect("@all");
    let months_to_now = db
        .scalar_i64(
            "SELECT ((extract(year FROM now()) - 2024) * 12 + extract(month FROM now()))::bigint",
        )
        .await;
    // The two already running are skipped; everything else from 2024-01 to now.
    assert_eq!(all.len() as i64, months_to_now - 2);
    let last = db
        .strings("SELECT partitions[1] FROM orca.runs ORDER BY id DESC LIMIT 1")
        .await;
    assert_eq!(
        last,
        db.strings("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM')")
            .await
    );

    let run: i64 = sqlx::query_scalar("SELECT orca.run('lake', '2024-01..2024-02')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let parts: Vec<String> = sqlx::query_scalar("SELECT partitions FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("partitions");
    assert_eq!(parts, ["2024-01", "2024-02"]);
    let states = db
        .strings(&format!(
            "SELECT step || '/' || partition FROM orca.step_states WHERE run_id = {run} ORDER BY 1"
        ))
        .await;
    assert_eq!(states, ["one/2024-01", "one/2024-02", "two/*"]);
}

#[tokio::test]
async fn run_retries_start_a_failed_run_again_up_to_n_times() {
    let db = TestDb::new().await;
    db.register(&lake_manifest("lake")).await; // run_retries = 3
    let run: i64 = sqlx::query_scalar("SELECT orca.run('lake', '2024-02')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    for attempt in 1..=3 {
        let l = claim(&db.pool, "r1", 1).await;
        assert_eq!(l[0].number, attempt);
        assert_eq!(
            finish(&db, &l[0], false).await,
            "running",
            "attempt {attempt} is retried"
        );
    }
    let l = claim(&db.pool, "r1", 1).await;
    assert_eq!(l[0].number, 4);
    assert_eq!(finish(&db, &l[0], false).await, "failed");
    let (status, error, attempts): (String, String, i32) =
        sqlx::query_as("SELECT status, error, attempts FROM orca.runs WHERE id = $1")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("run row");
    assert_eq!(
        (status.as_str(), error.as_str(), attempts),
        ("failed", "boom", 4)
    );
    assert!(claim(&db.pool, "r1", 1).await.is_empty());
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM orca.events WHERE run_id = {run} AND kind = 'run.retrying'"
        ))
        .await,
        3
    );
}

#[tokio::test]
async fn cancel_fences_the_runner_and_retry_requeues() {
    let db = TestDb::new().await;
    db.register(&lake_manifest("lake")).await;
    let ids: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('lake', '2024-01..2024-03')")
        .fetch_all(&db.pool)
        .await
        .expect("backfill");
    let leases = claim(&db.pool, "r1", 1).await;
    assert_eq!(leases[0].run, ids[0]);

    // Cancelling a queued run, then a running one whose lease a runner holds.
    db.pool
        .execute(format!("SELECT orca.cancel({})", ids[2]).as_str())
        .await
        .expect("cancel queued");
    db.pool
        .execute(format!("SELECT orca.cancel({})", ids[0]).as_str())
        .await
        .expect("cancel running");
    let before = db.table_counts().await;
    let hb = format!("SELECT orca.heartbeat('{}')", leases[0].lease);
    let (code, msg) = expect_error(&db.pool, &hb).await;
    assert_eq!(code, "OR015", "{msg}");
    assert!(
        msg.contains(&format!("run {} was cancelled", ids[0])),
        "{msg}"
    );
    let fin = format!("SELECT orca.finish('{}', true)", leases[0].lease);
    assert_eq!(expect_error(&db.pool, &fin).await.0, "OR015");
    assert_eq!(
        db.table_counts().await,
        before,
        "a fenced lease changes nothing"
    );

    let again = format!("SELECT orca.cancel({})", ids[0]);
    let (code, msg) = expect_error(&db.pool, &again).await;
    assert_eq!(code, "OR013");
    assert!(msg.contains("already cancelled"), "{msg}");
    // The freed slot went to run 2; run 3 was cancelled before it started.
    assert_eq!(
        statuses(&db, "lake").await,
        ["cancelled", "running", "cancelled"]
    );

    let retried: i64 = sqlx::query_scalar("SELECT orca.retry($1)")
        .bind(ids[0])
        .fetch_one(&db.pool)
        .await
        .expect("retry");
    assert_eq!(retried, ids[0]);
    assert_eq!(
        statuses(&db, "lake").await,
        ["running", "running", "cancelled"]
    );
    let l = claim(&db.pool, "r2", 5).await;
    let mine: Vec<_> = l.iter().filter(|x| x.run == ids[0]).collect();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].number, 2, "a retry is the run's next attempt");
    let (code, _) = expect_error(&db.pool, &format!("SELECT orca.retry({})", ids[1])).await;
    assert_eq!(code, "OR013", "a running run cannot be retried");
}

#[tokio::test]
async fn outbox_records_every_state_change_in_order() {
    let db = TestDb::new().await;
    db.register(&lake_manifest("lake")).await;
    let run: i64 = sqlx::query_scalar("SELECT orca.run('lake', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let l = claim(&db.pool, "r1", 1).await;
    sqlx::query("SELECT orca.report_step($1, 'one', '2024-01', 'running')")
        .bind(l[0].lease)
        .execute(&db.pool)
        .await
        .expect("step running");
    sqlx::query(
        "SELECT orca.report_step($1, 'one', '2024-01', 'succeeded', output => '{\"rows\": 3}')",
    )
    .bind(l[0].lease)
    .execute(&db.pool)
    .await
    .expect("step succeeded");
    finish(&db, &l[0], true).await;
    let kinds = db
        .strings(&format!(
            "SELECT kind FROM orca.events WHERE run_id = {run} ORDER BY id"
        ))
        .await;
    assert_eq!(
        kinds,
        [
            "run.queued",
            "run.started",
            "attempt.leased",
            "step.running",
            "step.succeeded",
            "attempt.succeeded",
            "run.succeeded"
        ]
    );
    let (status, output, attempts): (String, serde_json::Value, i32) = sqlx::query_as(
        "SELECT status, output, attempts FROM orca.step_states WHERE run_id = $1 AND step = 'one'",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("step state");
    assert_eq!(status, "succeeded");
    assert_eq!(output, json!({"rows": 3}));
    assert_eq!(attempts, 1);
    let (code, msg) = expect_error(
        &db.pool,
        &format!(
            "SELECT orca.report_step('{}', 'one', '2024-01', 'running')",
            l[0].lease
        ),
    )
    .await;
    assert_eq!(code, "OR014", "a finished attempt cannot report: {msg}");
}

#[tokio::test]
async fn new_work_notifies_idle_runners() {
    let db = TestDb::new().await;
    db.register(&lake_manifest("lake")).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&db.pool)
        .await
        .expect("listener");
    listener.listen("orca_work").await.expect("listen");
    db.pool
        .execute("SELECT orca.run('lake', '2024-01')")
        .await
        .expect("run");
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification within 5 s")
        .expect("notification");
    assert_eq!(n.channel(), "orca_work");
    assert_eq!(
        n.payload(),
        "default",
        "the payload is the pool with new work"
    );
}

#[tokio::test]
async fn runs_that_end_notify_once_a_transaction_and_name_nothing() {
    let db = TestDb::new().await;
    db.register(&lake_manifest("lake")).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&db.pool)
        .await
        .expect("listener");
    listener.listen("orca_runs_finished").await.expect("listen");
    let quiet = std::time::Duration::from_millis(300);
    db.pool
        .execute("SELECT orca.run('lake', '2024-01')")
        .await
        .expect("run");
    let l = claim(&db.pool, "r1", 1).await;
    assert!(
        tokio::time::timeout(quiet, listener.recv()).await.is_err(),
        "a run queued and started has not ended"
    );
    assert_eq!(finish(&db, &l[0], true).await, "succeeded");
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification within 5 s of the run's end")
        .expect("notification");
    assert_eq!(n.channel(), "orca_runs_finished");
    assert_eq!(n.payload(), "", "the payload names no org and no run");

    // Two runs cancelled in one transaction: one notification at its commit.
    let ids: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('lake', '2024-02..2024-03')")
        .fetch_all(&db.pool)
        .await
        .expect("backfill");
    assert_eq!(ids.len(), 2, "{ids:?}");
    let mut tx = db.pool.begin().await.expect("begin");
    for id in &ids {
        sqlx::query("SELECT orca.cancel($1)")
            .bind(id)
            .execute(&mut *tx)
            .await
            .expect("cancel");
    }
    assert!(
        tokio::time::timeout(quiet, listener.recv()).await.is_err(),
        "nothing is sent before the commit"
    );
    tx.commit().await.expect("commit");
    tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification at the commit")
        .expect("notification");
    assert!(
        tokio::time::timeout(quiet, listener.recv()).await.is_err(),
        "one notification for the transaction's two runs"
    );
    assert_eq!(
        statuses(&db, "lake").await,
        ["succeeded", "cancelled", "cancelled"]
    );
}

#[tokio::test]
async fn pause_stops_the_schedule_and_the_queue() {
    let db = TestDb::new().await;
    db.register(&daily_manifest("daily", "0 3 * * *", "UTC"))
        .await;
    db.tick("2024-05-01 00:00Z").await;
    db.pool
        .execute("SELECT orca.pause('daily')")
        .await
        .expect("pause");
    let t = db.tick("2024-05-03 00:00Z").await;
    assert_eq!(t["runs_created"], 0, "{t}");
    let run: i64 = sqlx::query_scalar("SELECT orca.run('daily', '2024-05-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    assert_eq!(statuses(&db, "daily").await, ["queued"]);
    db.pool
        .execute("SELECT orca.unpause('daily')")
        .await
        .expect("unpause");
    assert_eq!(statuses(&db, "daily").await, ["running"]);
    // Fires that fell while paused are not made up; the next one fires.
    let t = db.tick("2024-05-03 02:00Z").await;
    assert_eq!(t["runs_created"], 0, "{t}");
    let t = db.tick("2024-05-03 03:00Z").await;
    assert_eq!(t["runs_created"], 1, "{t}");
    assert!(run > 0);
}

#[tokio::test]
async fn every_api_function_and_table_is_documented() {
    let db = TestDb::new().await;
    let undocumented = db
        .strings(
            "SELECT p.oid::regprocedure::text FROM pg_proc p \
             WHERE p.pronamespace = 'orca'::regnamespace AND p.proname NOT LIKE '\\_%' \
               AND coalesce(obj_description(p.oid, 'pg_proc'), '') = '' ORDER BY 1",
        )
        .await;
    assert!(undocumented.is_empty(), "no COMMENT ON: {undocumented:?}");
    let tables = db
        .strings(
            "SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = 'orca'::regnamespace \
             AND c.relkind IN ('r', 'v') AND coalesce(obj_description(c.oid, 'pg_class'), '') = ''",
        )
        .await;
    assert!(tables.is_empty(), "no COMMENT ON: {tables:?}");
    let reference = std::fs::read_to_string(repo_root().join("docs/sql.md")).expect("docs/sql.md");
    let functions = db
        .strings(
            "SELECT DISTINCT p.proname::text FROM pg_proc p \
             WHERE p.pronamespace = 'orca'::regnamespace AND p.proname NOT LIKE '\\_%' ORDER BY 1",
        )
        .await;
    for f in functions {
        assert!(
            reference.contains(&format!("orca.{f}(")),
            "docs/sql.md does not document orca.{f}"
        );
    }
}

#[tokio::test]
async fn a_viewer_reads_runs_attempts_and_events_as_plain_tables() {
    let db = TestDb::new().await;
    ensure_role(&db, "orca_t_viewer", &["orca_viewer"]).await;
    db.pool
        .execute("SELECT orca.add_member('default', 'orca_t_viewer')")
        .await
        .expect("member");
    db.register(&lake_manifest("lake")).await;
    db.pool
        .execute("SELECT orca.backfill('lake', '2024-01..2024-03')")
        .await
        .expect("backfill");
    claim(&db.pool, "r1", 1).await;
    let mut bi = db.connect_as("orca_t_viewer").await;
    for view in [
        "run_overview",
        "attempt_overview",
        "pipeline_overview",
        "event_log",
        "runs",
        "attempts",
        "events",
        "step_states",
    ] {
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM orca.{view}"))
            .fetch_one(&mut bi)
            .await
            .unwrap_or_else(|e| panic!("viewer reads orca.{view}: {e}"));
        assert!(n > 0, "orca.{view} is empty for the viewer");
    }
    let (code, _) = expect_error(&mut bi, "SELECT orca.backfill('lake', '2024-04')").await;
    assert_eq!(code, "42501", "a viewer cannot queue runs");
}
