//! Tasks through the SQL API, as a driver (the step's attempt) and runners
//! use it: batches added, claimed whole, finished with results the driver
//! reads back; retries with backoff, lapsed leases, a resumed driver, a run
//! that ends, another org's runner, and bad input refused with nothing
//! written.

use std::collections::BTreeMap;

use orca_tests::sqlx::{self, Executor, PgConnection, Row};
use orca_tests::*;
use serde_json::{json, Value};
use uuid::Uuid;

/// A daily pipeline that declares task `trips` (`retries` retries, no
/// backoff unless asked), one run of it leased: the driver's lease and the
/// run's partition.
async fn driver(db: &TestDb, retries: i64, backoff_ms: i64) -> (Uuid, i64, String) {
    let mut m = daily_manifest("fanout", "0 3 * * *", "UTC");
    m["tasks"] = json!([{"name": "trips", "retries": retries, "backoff_ms": backoff_ms}]);
    m["run_retries"] = json!(2);
    db.register(&m).await;
    db.pool
        .execute("SELECT orca.backfill('fanout', '2024-01-01')")
        .await
        .expect("backfill");
    let l = claim(&db.pool, "driver-host", 1).await;
    assert_eq!(l.len(), 1);
    (l[0].lease, l[0].run, l[0].partitions[0].clone())
}

async fn add(c: &mut PgConnection, lease: Uuid, part: &str, first: i32, inputs: Value) -> i32 {
    sqlx::query_scalar("SELECT orca.add_tasks($1, 'load', $2, 'trips', $3, $4)")
        .bind(lease)
        .bind(part)
        .bind(first)
        .bind(inputs)
        .fetch_one(c)
        .await
        .expect("add_tasks")
}

/// A batch as orca.claim_tasks hands it out.
#[derive(Debug)]
struct Batch {
    lease: Uuid,
    indexes: Vec<i32>,
    inputs: Value,
    try_: i32,
}

async fn claim_tasks(c: &mut PgConnection, runner: &str, max: i32) -> Vec<Batch> {
    sqlx::query("SELECT * FROM orca.claim_tasks($1, 'default', $2)")
        .bind(runner)
        .bind(max)
        .fetch_all(c)
        .await
        .expect("claim_tasks")
        .iter()
        .map(|r| Batch {
            lease: r.get("lease"),
            indexes: r.get("indexes"),
            inputs: r.get("inputs"),
            try_: r.get("try"),
        })
        .collect()
}

/// Finishes a batch: each input n gives n * 2, except those `fail` names.
async fn finish(c: &mut PgConnection, b: &Batch, fail: &[i32]) -> i32 {
    let inputs = b.inputs.as_array().expect("inputs array");
    let outputs: Vec<Value> = inputs
        .iter()
        .zip(&b.indexes)
        .map(|(v, i)| {
            if fail.contains(i) {
                Value::Null
            } else {
                json!(v.as_i64().unwrap_or(0) * 2)
            }
        })
        .collect();
    let errors: Vec<Option<String>> = b
        .indexes
        .iter()
        .map(|i| {
            fail.contains(i)
                .then(|| format!("task {i} failed on purpose"))
        })
        .collect();
    let millis: Vec<i32> = b.indexes.iter().map(|i| 10 + i % 7).collect();
    sqlx::query_scalar("SELECT orca.finish_tasks($1, $2, $3, $4)")
        .bind(b.lease)
        .bind(Value::Array(outputs))
        .bind(errors)
        .bind(millis)
        .fetch_one(c)
        .await
        .expect("finish_tasks")
}

/// What `orca.heartbeat_tasks` did not extend, with why.
async fn heartbeat_tasks(c: &mut PgConnection, leases: Vec<Uuid>) -> Vec<(Uuid, String)> {
    sqlx::query_as("SELECT * FROM orca.heartbeat_tasks($1)")
        .bind(leases)
        .fetch_all(c)
        .await
        .expect("heartbeat_tasks")
}

/// What the driver reads back: index -> (ok, output, error).
async fn results(
    c: &mut PgConnection,
    lease: Uuid,
    part: &str,
    after: i64,
) -> (BTreeMap<i32, (bool, Value, Option<String>)>, i64) {
    let rows = sqlx::query("SELECT * FROM orca.task_results($1, 'load', $2, $3)")
        .bind(lease)
        .bind(part)
        .bind(after)
        .fetch_all(c)
        .await
        .expect("task_results");
    let mut out = BTreeMap::new();
    let mut seq = after;
    for r in rows {
        let i: i32 = r.get("index");
        let prev = out.insert(i, (r.get("ok"), r.get("output"), r.get("error")));
        assert!(prev.is_none(), "task {i} answered twice");
        seq = seq.max(r.get::<i64, _>("seq"));
    }
    (out, seq)
}

#[tokio::test]
async fn a_driver_fans_out_runners_share_the_batches_and_the_driver_reads_every_result() {
    let db = TestDb::new().await;
    let (lease, run, part) = driver(&db, 1, 0).await;
    let mut d = db.connect().await;
    // 250 tasks in three batches, as a driver flushes them.
    let mut first = 0;
    for n in [100, 100, 50] {
        let inputs: Vec<i32> = (first..first + n).collect();
        assert_eq!(add(&mut d, lease, &part, first, json!(inputs)).await, n);
        first += n;
    }
    // Whole batches up to max tasks: 150 takes one batch of 100.
    let mut a = db.connect().await;
    let mut b = db.connect().await;
    let got_a = claim_tasks(&mut a, "runner-a", 150).await;
    assert_eq!(got_a.len(), 1);
    assert_eq!(got_a[0].indexes, (0..100).collect::<Vec<_>>());
    assert_eq!(got_a[0].try_, 1);
    let got_b = claim_tasks(&mut b, "runner-b", 1000).await;
    assert_eq!(got_b.len(), 2, "the other runner takes the rest");
    assert!(claim_tasks(&mut a, "runner-a", 1000).await.is_empty());
    // Nothing is back before the runners finish.
    assert!(results(&mut d, lease, &part, 0).await.0.is_empty());
    for batch in &got_b {
        assert_eq!(finish(&mut b, batch, &[]).await, 0);
    }
    let (partial, seq) = results(&mut d, lease, &part, 0).await;
    assert_eq!(partial.len(), 150);
    finish(&mut a, &got_a[0], &[]).await;
    // After the seq it saw, the driver gets only what is new.
    let (rest, _) = results(&mut d, lease, &part, seq).await;
    assert_eq!(rest.len(), 100);
    let (all, _) = results(&mut d, lease, &part, 0).await;
    assert_eq!(all.len(), 250);
    let sum: i64 = all
        .values()
        .map(|(ok, v, _)| {
            assert!(ok);
            v.as_i64().expect("an output")
        })
        .sum();
    assert_eq!(sum, 2 * (0..250).sum::<i64>());

    // What BI sees: a row per task, and the step's summary.
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM orca.tasks WHERE run = {run} AND status = 'succeeded'"
        ))
        .await,
        250
    );
    let o = sqlx::query(
        "SELECT tasks, succeeded, failed, queued, running, p50_millis, max_millis FROM orca.task_overview WHERE run = $1",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("overview");
    assert_eq!(o.get::<i64, _>("tasks"), 250);
    assert_eq!(o.get::<i64, _>("succeeded"), 250);
    assert_eq!(o.get::<i64, _>("failed"), 0);
    assert_eq!(o.get::<Option<i32>, _>("max_millis"), Some(16));
    // One event per batch and transition, not per task.
    let events: Vec<(String, i64)> = sqlx::query_as(
        "SELECT kind, count(*) FROM orca.events WHERE run_id = $1 AND kind LIKE 'tasks.%' \
         GROUP BY kind ORDER BY kind",
    )
    .bind(run)
    .fetch_all(&db.pool)
    .await
    .expect("events");
    assert_eq!(
        events,
        vec![
            ("tasks.added".to_string(), 3),
            ("tasks.finished".to_string(), 3),
            ("tasks.leased".to_string(), 3)
        ]
    );
}

#[tokio::test]
async fn a_resumed_driver_adds_only_what_it_had_not_added_and_gaps_are_refused() {
    let db = TestDb::new().await;
    let (lease, run, part) = driver(&db, 0, 0).await;
    let mut d = db.connect().await;
    assert_eq!(add(&mut d, lease, &part, 0, json!([0, 1, 2])).await, 3);
    let mut r = db.connect().await;
    let b = claim_tasks(&mut r, "r", 100).await;
    finish(&mut r, &b[0], &[]).await;
    // The driver dies; the run's next attempt runs the step again, which
    // submits the same tasks and more.
    db.pool
        .execute(
            format!(
                "SELECT orca.finish(lease, false, 'driver died') FROM orca.attempts WHERE run_id = {run}"
            )
            .as_str(),
        )
        .await
        .expect("the driver fails");
    let again = claim(&db.pool, "driver-host", 1).await;
    assert_eq!(again.len(), 1, "the run is retried");
    let lease2 = again[0].lease;
    assert_ne!(lease2, lease);
    assert_eq!(
        add(&mut d, lease2, &part, 0, json!([0, 1, 2, 3, 4])).await,
        2,
        "tasks 0 to 2 exist: only 3 and 4 are new"
    );
    assert_eq!(add(&mut d, lease2, &part, 0, json!([0, 1, 2])).await, 0);
    let (done, _) = results(&mut d, lease2, &part, 0).await;
    assert_eq!(done.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2]);
    let (code, msg) = expect_error(
        &mut d,
        &format!("SELECT orca.add_tasks('{lease2}', 'load', '{part}', 'trips', 9, '[9]')"),
    )
    .await;
    assert_eq!(code, "OR101", "{msg}");
    assert!(
        msg.contains("first_index 9 leaves a gap") && msg.contains("5 tasks"),
        "{msg}"
    );
    // The old driver's lease is dead: it adds nothing.
    let (code, _) = expect_error(
        &mut d,
        &format!("SELECT orca.add_tasks('{lease}', 'load', '{part}', 'trips', 5, '[5]')"),
    )
    .await;
    assert_eq!(code, "OR014");
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM orca.tasks WHERE run = {run}"
        ))
        .await,
        5
    );
}

#[tokio::test]
async fn a_failed_task_is_retried_alone_after_its_backoff_and_fails_for_good_after_its_last_try() {
    let db = TestDb::new().await;
    let (lease, run, part) = driver(&db, 1, 60_000).await;
    let mut d = db.connect().await;
    add(&mut d, lease, &part, 0, json!([10, 11, 12])).await;
    let mut r = db.connect().await;
    let b = claim_tasks(&mut r, "r", 100).await;
    assert_eq!(finish(&mut r, &b[0], &[1]).await, 1, "one task retried");
    // Its retry waits out the backoff (a minute here): nothing to claim yet.
    assert!(claim_tasks(&mut r, "r", 100).await.is_empty());
    let wait = db
        .scalar_i64(&format!(
            "SELECT extract(epoch FROM not_before - now())::bigint FROM orca.task_batches \
             WHERE run_id = {run} AND try = 2"
        ))
        .await;
    assert!((55..=60).contains(&wait), "backoff {wait} s");
    let (got, _) = results(&mut d, lease, &part, 0).await;
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        vec![0, 2],
        "task 1 is not done yet"
    );
    // Backoff over: the retry holds task 1 alone, and fails for good.
    db.pool
        .execute(
            format!(
                "UPDATE orca.task_queue SET not_before = now() WHERE batch_id IN \
                 (SELECT id FROM orca.task_batches WHERE run_id = {run} AND try = 2)"
            )
            .as_str(),
        )
        .await
        .expect("end the backoff");
    let retry = claim_tasks(&mut r, "r", 100).await;
    assert_eq!(retry.len(), 1);
    assert_eq!(retry[0].indexes, vec![1]);
    assert_eq!(retry[0].inputs, json!([11]));
    assert_eq!(retry[0].try_, 2);
    assert_eq!(finish(&mut r, &retry[0], &[1]).await, 0, "no tries left");
    let (got, _) = results(&mut d, lease, &part, 0).await;
    assert_eq!(got.len(), 3);
    assert_eq!(got[&0], (true, json!(20), None));
    assert_eq!(
        got[&1],
        (
            false,
            Value::Null,
            Some("task 1 failed on purpose".to_string())
        )
    );
    let statuses = db
        .strings(&format!(
            "SELECT index || ':' || try || ':' || status FROM orca.tasks WHERE run = {run} \
             ORDER BY index, try"
        ))
        .await;
    assert_eq!(
        statuses,
        vec![
            "0:1:succeeded",
            "1:1:retried",
            "1:2:failed",
            "2:1:succeeded"
        ]
    );
    let retries = db
        .scalar_i64(&format!(
            "SELECT retries FROM orca.task_overview WHERE run = {run}"
        ))
        .await;
    assert_eq!(retries, 1);
}

#[tokio::test]
async fn a_lapsed_task_lease_is_handed_on_by_tick_and_its_runner_is_refused() {
    let db = TestDb::new().await;
    let (lease, run, part) = driver(&db, 2, 0).await;
    let mut d = db.connect().await;
    add(&mut d, lease, &part, 0, json!([1, 2])).await;
    let mut r = db.connect().await;
    let b = claim_tasks(&mut r, "gone", 100).await;
    let now = chrono::Utc::now();
    let t = db.tick(&now.to_rfc3339()).await;
    assert_eq!(t["task_batches_lost"], 0, "{t}");
    // Past the deadline the runner is taken for gone (the driver's lease
    // lapses too, and its run goes on with a new attempt).
    let later = (now + chrono::Duration::seconds(3600)).to_rfc3339();
    let t = db.tick(&later).await;
    assert_eq!(t["task_batches_lost"], 1, "{t}");
    assert_eq!(db.tick(&later).await["task_batches_lost"], 0);
    // Its heartbeat says to stop; its finish is refused.
    let gone = heartbeat_tasks(&mut r, vec![b[0].lease]).await;
    assert_eq!(gone, vec![(b[0].lease, "finished".to_string())]);
    let (code, msg) = expect_error(
        &mut r,
        &format!("SELECT orca.finish_tasks('{}', '[1, 2]')", b[0].lease),
    )
    .await;
    assert_eq!(code, "OR014", "{msg}");
    // The tasks go to the next runner as their second try.
    let next = claim_tasks(&mut r, "next", 100).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].indexes, vec![0, 1]);
    assert_eq!(next[0].try_, 2);
    let err = db
        .strings(&format!(
            "SELECT error FROM orca.tasks WHERE run = {run} AND try = 1 LIMIT 1"
        ))
        .await;
    assert!(
        err[0].contains("without a heartbeat from runner gone"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_run_that_ends_cancels_its_tasks_and_their_runners_are_told_to_stop() {
    let db = TestDb::new().await;
    let (lease, run, part) = driver(&db, 0, 0).await;
    let mut d = db.connect().await;
    add(&mut d, lease, &part, 0, json!([1, 2])).await;
    add(&mut d, lease, &part, 2, json!([3])).await;
    let mut r = db.connect().await;
    let held = claim_tasks(&mut r, "r", 2).await;
    assert_eq!(held.len(), 1);
    let live = heartbeat_tasks(&mut r, vec![held[0].lease]).await;
    assert!(live.is_empty(), "a live lease is extended: {live:?}");
    db.pool
        .execute(format!("SELECT orca.cancel({run})").as_str())
        .await
        .expect("cancel");
    assert!(
        claim_tasks(&mut r, "r", 100).await.is_empty(),
        "queued tasks of a cancelled run are never claimed"
    );
    let stop = heartbeat_tasks(&mut r, vec![held[0].lease, Uuid::new_v4()]).await;
    assert_eq!(stop.len(), 2);
    assert_eq!(stop[0], (held[0].lease, "cancelled".to_string()));
    assert_eq!(stop[1].1, "unknown");
    let (code, msg) = expect_error(
        &mut r,
        &format!("SELECT orca.finish_tasks('{}', '[2, 4]')", held[0].lease),
    )
    .await;
    assert_eq!(code, "OR015", "{msg}");
    assert_eq!(
        db.strings(&format!(
            "SELECT DISTINCT status FROM orca.tasks WHERE run = {run}"
        ))
        .await,
        vec!["cancelled"]
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM orca.events WHERE run_id = {run} AND kind = 'tasks.cancelled'"
        ))
        .await,
        1
    );
    // A run that succeeds leaves nothing queued either.
    db.pool
        .execute("SELECT orca.backfill('fanout', '2024-01-02')")
        .await
        .expect("backfill");
    let l = claim(&db.pool, "driver-host", 1).await;
    add(&mut d, l[0].lease, &l[0].partitions[0], 0, json!([1])).await;
    db.pool
        .execute(format!("SELECT orca.finish('{}', true)", l[0].lease).as_str())
        .await
        .expect("finish the run");
    assert!(claim_tasks(&mut r, "r", 100).await.is_empty());
}

#[tokio::test]
async fn another_orgs_runner_token_sees_none_of_the_tasks() {
    let db = TestDb::new().await;
    const LOGIN: &str = "orca_t_tasks_runner";
    ensure_role(&db, LOGIN, &["orca_runner"]).await;
    let (lease, _, part) = driver(&db, 0, 0).await;
    let mut d = db.connect().await;
    add(&mut d, lease, &part, 0, json!([1, 2, 3])).await;
    db.pool
        .execute("SELECT orca.create_org('globex')")
        .await
        .expect("org");
    let mut g = connect_org(&db, "postgres", "globex").await;
    let globex: String = sqlx::query_scalar("SELECT orca.create_runner_token('default', 'g-1')")
        .fetch_one(&mut g)
        .await
        .expect("globex's token");
    let mine: String = sqlx::query_scalar("SELECT orca.create_runner_token('default', 'a-1')")
        .fetch_one(&db.pool)
        .await
        .expect("the default org's token");
    let session = |token: String| {
        let db = &db;
        async move {
            let mut c = db.connect_as(LOGIN).await;
            sqlx::query("SELECT set_config('orca.runner_token', $1, false)")
                .bind(token)
                .execute(&mut c)
                .await
                .expect("present the token");
            c
        }
    };
    let mut other = session(globex).await;
    assert!(claim_tasks(&mut other, "g-1", 10000).await.is_empty());
    let mut ours = session(mine).await;
    let b = claim_tasks(&mut ours, "a-1", 10000).await;
    assert_eq!(b.len(), 1);
    // Holding the lease's text gives another org's runner nothing.
    let gone = heartbeat_tasks(&mut other, vec![b[0].lease]).await;
    assert_eq!(gone, vec![(b[0].lease, "unknown".to_string())]);
    let (code, _) = expect_error(
        &mut other,
        &format!("SELECT orca.finish_tasks('{}', '[0, 0, 0]')", b[0].lease),
    )
    .await;
    assert_eq!(code, "OR012");
    // Nor does a login without a token, nor an attempt's.
    let mut bare = db.connect_as(LOGIN).await;
    let (code, _) = expect_error(&mut bare, "SELECT * FROM orca.claim_tasks('x')").await;
    assert_eq!(code, "OR080");
    // Another token of the same org may not finish what this one holds.
    let second: String = sqlx::query_scalar("SELECT orca.create_runner_token('default', 'a-2')")
        .fetch_one(&db.pool)
        .await
        .expect("a second token");
    let mut two = session(second).await;
    let (code, _) = expect_error(
        &mut two,
        &format!("SELECT orca.finish_tasks('{}', '[0, 0, 0]')", b[0].lease),
    )
    .await;
    assert_eq!(code, "OR082");
    assert_eq!(finish(&mut ours, &b[0], &[]).await, 0);
}

#[tokio::test]
async fn bad_task_input_is_refused_by_name_and_writes_nothing() {
    let db = TestDb::new().await;
    let (lease, _, part) = driver(&db, 0, 0).await;
    let mut d = db.connect().await;
    let before = db.table_counts().await;
    for (sql, code, says) in [
        (
            format!("SELECT orca.add_tasks('{lease}', 'load', '{part}', 'trip', 0, '[1]')"),
            "OR100",
            "declares no task 'trip'",
        ),
        (
            format!("SELECT orca.add_tasks('{lease}', 'lod', '{part}', 'trips', 0, '[1]')"),
            "OR016",
            "has no step 'lod'",
        ),
        (
            format!(
                "SELECT orca.add_tasks('{lease}', 'load', '{part}', 'trips', 0, '{{\"a\": 1}}')"
            ),
            "OR050",
            "must be a JSON array",
        ),
        (
            format!("SELECT orca.add_tasks('{lease}', 'load', '{part}', 'trips', 0, '[]')"),
            "OR050",
            "1 to 10000 tasks, got 0",
        ),
        (
            format!("SELECT orca.add_tasks('{lease}', 'load', '{part}', 'trips', -1, '[1]')"),
            "OR050",
            "first_index must be 0 or more, got -1",
        ),
        (
            format!(
                "SELECT orca.add_tasks('{lease}', 'load', '{part}', 'trips', 0, \
                  (SELECT jsonb_agg(g) FROM generate_series(1, 10001) g))"
            ),
            "OR050",
            "got 10001",
        ),
        (
            format!(
                "SELECT orca.add_tasks('{}', 'load', '{part}', 'trips', 0, '[1]')",
                Uuid::new_v4()
            ),
            "OR012",
            "unknown lease",
        ),
        (
            "SELECT * FROM orca.claim_tasks('r', 'default', 0)".to_string(),
            "OR050",
            "got 0",
        ),
        (
            "SELECT * FROM orca.claim_tasks('', 'default', 1)".to_string(),
            "OR050",
            "runner name",
        ),
        (
            "SELECT * FROM orca.heartbeat_tasks(array_fill(gen_random_uuid(), ARRAY[10001]))"
                .to_string(),
            "OR050",
            "got 10001",
        ),
    ] {
        let (got, msg) = expect_error(&mut d, &sql).await;
        assert_eq!(got, code, "{sql}: {msg}");
        assert!(msg.contains(says), "{sql}: {msg}");
    }
    assert_eq!(db.table_counts().await, before, "nothing was written");
    // Results that do not fit the batch are refused, and the batch stays leased.
    add(&mut d, lease, &part, 0, json!([1, 2])).await;
    let mut r = db.connect().await;
    let b = claim_tasks(&mut r, "r", 10).await;
    for (sql, says) in [
        (
            format!("SELECT orca.finish_tasks('{}', '[1]')", b[0].lease),
            "2 outputs",
        ),
        (
            format!("SELECT orca.finish_tasks('{}', '{{}}')", b[0].lease),
            "got object",
        ),
        (
            format!(
                "SELECT orca.finish_tasks('{}', '[1, 2]', ARRAY['x'])",
                b[0].lease
            ),
            "errors must hold 2",
        ),
        (
            format!(
                "SELECT orca.finish_tasks('{}', '[1, 2]', NULL, ARRAY[1, -1])",
                b[0].lease
            ),
            "millis",
        ),
    ] {
        let (got, msg) = expect_error(&mut r, &sql).await;
        assert_eq!(got, "OR050", "{sql}: {msg}");
        assert!(msg.contains(says), "{sql}: {msg}");
    }
    assert_eq!(finish(&mut r, &b[0], &[]).await, 0);
    // A manifest's bad task declaration never registers.
    let mut m = daily_manifest("bad_tasks", "0 3 * * *", "UTC");
    m["tasks"] = json!([{"name": "trips", "retries": -1}]);
    let (code, msg) = expect_error(
        &db.pool,
        &format!(
            "SELECT orca.register('{}')",
            m.to_string().replace('\'', "''")
        ),
    )
    .await;
    assert!(code.starts_with("OR"), "{code}: {msg}");
    assert!(msg.contains("tasks[0].retries"), "{msg}");
}

/// A run's rows of orca.task_overview: task, tasks, succeeded, failed,
/// max_millis, summarised.
async fn overview(db: &TestDb, run: i64) -> Vec<(String, i64, i64, i64, Option<i32>, bool)> {
    sqlx::query_as(
        "SELECT task, tasks, succeeded, failed, max_millis, summarised FROM orca.task_overview \
         WHERE run = $1",
    )
    .bind(run)
    .fetch_all(&db.pool)
    .await
    .expect("overview")
}

#[tokio::test]
async fn retention_summarises_a_finished_runs_tasks_into_its_step_and_prunes_them() {
    let db = TestDb::new().await;
    let (lease, run, part) = driver(&db, 0, 0).await;
    let mut d = db.connect().await;
    add(&mut d, lease, &part, 0, json!([1, 2, 3, 4])).await;
    let mut r = db.connect().await;
    let b = claim_tasks(&mut r, "r", 100).await;
    finish(&mut r, &b[0], &[2]).await;
    db.pool
        .execute(format!("SELECT orca.finish('{lease}', false, 'task 2 failed')").as_str())
        .await
        .expect("the driver fails");
    // The run is retried (run_retries 2): its tasks stay while it runs.
    let later = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
    let t = db.tick(&later).await;
    assert!(t.get("task_batches_pruned").is_none(), "{t}");
    db.pool
        .execute(format!("SELECT orca.cancel({run})").as_str())
        .await
        .expect("end the run");
    let before = overview(&db, run).await;
    assert_eq!(before.len(), 1);
    assert!(!before[0].5);
    // A week (the default orca.retain_tasks) after the run ended.
    let soon = (chrono::Utc::now() + chrono::Duration::days(6)).to_rfc3339();
    assert!(db.tick(&soon).await.get("task_batches_pruned").is_none());
    let t = db.tick(&later).await;
    assert_eq!(t["task_batches_pruned"], 1, "{t}");
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM orca.tasks WHERE run = {run}"
        ))
        .await,
        0
    );
    let after = overview(&db, run).await;
    assert_eq!(after.len(), 1);
    assert_eq!(
        (&after[0].0, after[0].1, after[0].2, after[0].3, after[0].4),
        (
            &before[0].0,
            before[0].1,
            before[0].2,
            before[0].3,
            before[0].4
        ),
        "what the summary keeps"
    );
    assert!(after[0].5, "summarised");
    let failures: Value =
        sqlx::query_scalar("SELECT summary->0->'failures' FROM orca.task_steps WHERE run_id = $1")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("summary");
    assert_eq!(
        failures,
        json!([{"index": 2, "tries": 1, "error": "task 2 failed on purpose"}])
    );
    let retention = db
        .strings("SELECT setting || '=' || keep_seconds FROM orca.retention() WHERE what = 'tasks'")
        .await;
    assert_eq!(retention, ["orca.retain_tasks=604800"]);
}

#[tokio::test]
async fn concurrent_runners_share_out_every_batch_exactly_once() {
    let db = TestDb::new().await;
    let (lease, run, part) = driver(&db, 0, 0).await;
    let mut d = db.connect().await;
    for b in 0..60 {
        add(&mut d, lease, &part, b * 5, json!([1, 2, 3, 4, 5])).await;
    }
    let mut claimers = Vec::new();
    for w in 0..8 {
        let mut c = db.connect().await;
        claimers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                // Up to two batches a claim: whole batches only.
                let got = claim_tasks(&mut c, &format!("w{w}"), 10).await;
                if got.is_empty() {
                    return mine;
                }
                assert!(got.len() <= 2, "{got:?}");
                for b in &got {
                    finish(&mut c, b, &[]).await;
                    mine.extend(b.indexes.iter().copied());
                }
            }
        }));
    }
    let mut all = Vec::new();
    for c in claimers {
        all.extend(c.await.expect("claimer"));
    }
    all.sort_unstable();
    assert_eq!(all, (0..300).collect::<Vec<i32>>(), "each task once");
    let (got, _) = results(&mut d, lease, &part, 0).await;
    assert_eq!(got.len(), 300);
    let runners = db
        .scalar_i64(&format!(
            "SELECT count(DISTINCT runner) FROM orca.tasks WHERE run = {run}"
        ))
        .await;
    assert!(runners > 1, "the batches were shared: {runners} runner(s)");
}
