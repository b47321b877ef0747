//! Keyed pipelines in the control plane: keys tasks, names checked against
//! the current keys, backfills of the keys that are not done, and sensors that
//! run new keys only. The keys tasks are played by hand here (the end-to-end
//! test in `tables.rs` runs the real `keys` command).

use orca_tests::sqlx::{self, Row};
use orca_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

fn keyed(name: &str, code: &str, sensor: bool) -> Value {
    json!({
        "name": name,
        "steps": [
            {"name": "label", "kind": "mapped", "code": format!("label-{code}"), "reads": ["logs.index"]},
            {"name": "check", "kind": "mapped", "after": "label", "code": "check-1"},
            {"name": "score", "kind": "gather", "after": "check", "code": "score-1"}
        ],
        "partitions": {"keyed": {"dataset": "logs.index", "column": "log_id"}},
        "keys_per_run": 2,
        "sensor": sensor,
        "registry_hash": format!("hash-{code}"),
        "binary": "/bin/true"
    })
}

/// Claims the one pending keys task, checks what it asks for, reports `keys`
/// of `snapshot` and finishes it. Returns (task run, report).
async fn play_keys_task(db: &TestDb, mode: &str, snapshot: i64, keys: &[&str]) -> (i64, Value) {
    let row = sqlx::query("SELECT run, lease, command FROM orca.claim('r', 'default', 1)")
        .fetch_one(&db.pool)
        .await
        .expect("a keys task to claim");
    assert_eq!(row.get::<String, _>("command"), "keys");
    let (run, lease): (i64, uuid::Uuid) = (row.get("run"), row.get("lease"));
    let ctx: Value = sqlx::query_scalar("SELECT orca.keys_context($1)")
        .bind(lease)
        .fetch_one(&db.pool)
        .await
        .expect("keys context");
    assert_eq!(ctx["mode"], mode, "{ctx}");
    assert_eq!(ctx["dataset"], "logs.index");
    assert_eq!(ctx["column"], "log_id");
    let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    let report: Value = sqlx::query_scalar("SELECT orca.report_keys($1, $2, $3, $4)")
        .bind(lease)
        .bind(snapshot)
        .bind(snapshot * 1000)
        .bind(&keys)
        .fetch_one(&db.pool)
        .await
        .expect("report keys");
    sqlx::query("SELECT orca.finish($1, true)")
        .bind(lease)
        .execute(&db.pool)
        .await
        .expect("finish the keys task");
    (run, report)
}

/// The partitions of each queued or running pipeline run, in id order.
async fn open_runs(db: &TestDb) -> Vec<Vec<String>> {
    sqlx::query_scalar(
        "SELECT partitions FROM orca.runs WHERE kind = 'pipeline' \
         AND status IN ('queued', 'running') ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .expect("open runs")
}

/// Plays every open pipeline run to success: each mapped step for each key,
/// the gather step once.
async fn succeed_open_runs(db: &TestDb) {
    for l in claim(&db.pool, "r", 100).await {
        for step in ["label", "check"] {
            for p in &l.partitions {
                sqlx::query("SELECT orca.report_step($1, $2, $3, 'succeeded', NULL, '1')")
                    .bind(l.lease)
                    .bind(step)
                    .bind(p)
                    .execute(&db.pool)
                    .await
                    .expect("report step");
            }
        }
        sqlx::query("SELECT orca.report_step($1, 'score', '*', 'succeeded', NULL, '1')")
            .bind(l.lease)
            .execute(&db.pool)
            .await
            .expect("report gather");
        sqlx::query("SELECT orca.finish($1, true)")
            .bind(l.lease)
            .execute(&db.pool)
            .await
            .expect("finish");
    }
    assert!(open_runs(db).await.is_empty());
}

async fn not_done(db: &TestDb, pipeline: &str) -> Vec<String> {
    db.strings(&format!(
        "SELECT key FROM orca.key_status('{pipeline}') WHERE NOT done ORDER BY key"
    ))
    .await
}

fn keys(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn backfill_all_runs_the_keys_that_are_not_done() {
    let db = TestDb::new().await;
    db.register(&keyed("labels", "1", false)).await;
    // Registering reads the keys once, and queues nothing else.
    let (_, r) = play_keys_task(&db, "refresh", 1, &["a", "b", "c"]).await;
    assert_eq!(r["keys"], 3, "{r}");
    assert!(open_runs(&db).await.is_empty());
    assert_eq!(not_done(&db, "labels").await, keys(&["a", "b", "c"]));

    // @all: a keys task, whose report queues runs of keys_per_run.
    let task: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('labels', '@all')")
        .fetch_all(&db.pool)
        .await
        .expect("backfill");
    let (run, r) = play_keys_task(&db, "all", 1, &["a", "b", "c"]).await;
    assert_eq!(task, [run]);
    assert_eq!(
        open_runs(&db).await,
        [keys(&["a", "b"]), keys(&["c"])],
        "{r}"
    );
    let parents: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT parent_run FROM orca.runs WHERE kind = 'pipeline' ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .expect("parents");
    assert_eq!(parents, [Some(run), Some(run)]);
    succeed_open_runs(&db).await;
    assert!(not_done(&db, "labels").await.is_empty());

    // New keys appear: @all runs only them.
    sqlx::query("SELECT orca.backfill('labels', '@all')")
        .execute(&db.pool)
        .await
        .expect("backfill");
    play_keys_task(&db, "all", 2, &["a", "b", "c", "d"]).await;
    assert_eq!(open_runs(&db).await, [keys(&["d"])]);
    succeed_open_runs(&db).await;
    // Nothing left to do: the task reads the keys and queues nothing.
    sqlx::query("SELECT orca.backfill('labels', '@all')")
        .execute(&db.pool)
        .await
        .expect("backfill");
    let (_, r) = play_keys_task(&db, "all", 2, &["a", "b", "c", "d"]).await;
    assert_eq!(r["runs"], json!([]), "{r}");

    // A key whose run failed in one mapped step is not done.
    sqlx::query("SELECT orca.run('labels', 'a')")
        .execute(&db.pool)
        .await
        .expect("run a");
    let l = claim(&db.pool, "r", 1).await.remove(0);
    sqlx::query("SELECT orca.report_step($1, 'label', 'a', 'failed', 'boom')")
        .bind(l.lease)
        .execute(&db.pool)
        .await
        .expect("fail");
    sqlx::query("SELECT orca.finish($1, false, 'boom')")
        .bind(l.lease)
        .execute(&db.pool)
        .await
        .expect("finish");
    // Done is about any run under this code: the earlier success still counts.
    assert!(not_done(&db, "labels").await.is_empty());

    // A change of a step's code makes every key not done.
    db.register(&keyed("labels", "2", false)).await;
    assert_eq!(not_done(&db, "labels").await, keys(&["a", "b", "c", "d"]));
    sqlx::query("SELECT orca.backfill('labels', '@all')")
        .execute(&db.pool)
        .await
        .expect("backfill");
    play_keys_task(&db, "all", 2, &["a", "b", "c", "d"]).await;
    assert_eq!(open_runs(&db).await, [keys(&["a", "b"]), keys(&["c", "d"])]);
    succeed_open_runs(&db).await;
    assert!(not_done(&db, "labels").await.is_empty());
    // Going back to the first code: its runs still count.
    db.register(&keyed("labels", "1", false)).await;
    assert!(not_done(&db, "labels").await.is_empty());
}

#[tokio::test]
async fn a_backfill_may_name_its_own_keys_per_run() {
    let db = TestDb::new().await;
    db.register(&keyed("labels", "1", false)).await;
    play_keys_task(&db, "refresh", 1, &["a", "b", "c", "d", "e"]).await;
    // Named keys in one run of three, though keys_per_run is 2.
    let ids: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('labels', 'a,b,c', per_run => 3)")
        .fetch_all(&db.pool)
        .await
        .expect("backfill");
    assert_eq!(ids.len(), 1);
    assert_eq!(open_runs(&db).await, [keys(&["a", "b", "c"])]);
    succeed_open_runs(&db).await;
    // @all carries it through its keys task to the runs the task queues.
    let task: i64 = sqlx::query_scalar("SELECT orca.backfill('labels', '@all', 1)")
        .fetch_one(&db.pool)
        .await
        .expect("backfill @all");
    assert_eq!(
        db.strings(&format!(
            "SELECT request->>'per_run' FROM orca.runs WHERE id = {task}"
        ))
        .await,
        ["1"]
    );
    play_keys_task(&db, "all", 1, &["a", "b", "c", "d", "e"]).await;
    assert_eq!(open_runs(&db).await, [keys(&["d"]), keys(&["e"])]);
    let (code, msg) = expect_error(&db.pool, "SELECT orca.backfill('labels', 'a', 0)").await;
    assert_eq!(code, "OR110");
    assert!(msg.contains("got 0"), "{msg}");
}

/// A backfill of every key joins a keys task queued for the same runs'
/// size that has not started, and never one queued for another size: its
/// runs would not be the size it asked for.
#[tokio::test]
async fn an_all_backfill_joins_a_queued_keys_task_only_of_its_own_per_run() {
    let db = TestDb::new().await;
    db.register(&keyed("labels", "1", false)).await;
    play_keys_task(&db, "refresh", 1, &["a", "b", "c"]).await;
    let task = |sql: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .expect(sql)
        }
    };
    let one = task("SELECT orca.backfill('labels', '@all', 1)").await;
    assert_eq!(task("SELECT orca.backfill('labels', '@all', 1)").await, one);
    let three = task("SELECT orca.backfill('labels', '@all', per_run => 3)").await;
    assert_ne!(three, one);
    let policy = task("SELECT orca.backfill('labels', '@all')").await;
    assert!(policy != one && policy != three, "{one} {three} {policy}");
    assert_eq!(task("SELECT orca.backfill('labels', '@all')").await, policy);
    assert_eq!(
        db.strings(&format!(
            "SELECT coalesce(request->>'per_run', '-') FROM orca.runs \
             WHERE id IN ({one}, {three}, {policy}) ORDER BY id"
        ))
        .await,
        ["1", "3", "-"]
    );
}

/// Waits until `cli` queued its keys task for every key (the only one
/// open); a CLI that exited first, or queued none in 60 s, fails the test
/// with its output.
async fn queued_by(db: &TestDb, mut cli: std::process::Child) -> std::process::Child {
    for _ in 0..600 {
        let queued: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT FROM orca.runs WHERE kind = 'keys' \
             AND request->>'mode' = 'all' AND status IN ('queued', 'running'))",
        )
        .fetch_one(&db.pool)
        .await
        .expect("keys tasks");
        if queued {
            return cli;
        }
        if let Ok(Some(_)) = cli.try_wait() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let runs = db
        .strings("SELECT id || ' ' || kind || ' ' || status FROM orca.runs ORDER BY id")
        .await;
    let _ = cli.kill();
    let out = cli.wait_with_output().expect("orca backfill's output");
    panic!(
        "orca backfill queued no keys task (runs: {runs:?}): {}",
        orca_tests::procs::text(&out)
    );
}

/// The output of `cli` once it exits; one still running after 60 s is
/// killed and fails the test with what it said.
async fn ended(mut cli: std::process::Child) -> std::process::Output {
    for _ in 0..600 {
        if let Ok(Some(_)) = cli.try_wait() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let still = matches!(cli.try_wait(), Ok(None));
    if still {
        let _ = cli.kill();
    }
    let out = cli.wait_with_output().expect("orca backfill's output");
    assert!(
        !still,
        "orca backfill still ran after 60 s: {}",
        orca_tests::procs::text(&out)
    );
    out
}

/// `orca backfill labels @all` from the CLI: it waits for its keys task
/// (woken when the task ends, like the runs it follows), says how many runs
/// the keys queued, follows them to the end; a keys task cancelled stops
/// it, saying so. The control plane's side is played by hand.
#[tokio::test]
async fn the_cli_follows_an_all_backfill_through_its_keys_task() {
    use std::process::{Command, Stdio};
    let db = TestDb::new().await;
    db.register(&keyed("labels", "1", false)).await;
    // Registering reads the keys once.
    play_keys_task(&db, "refresh", 1, &["a", "b", "c"]).await;
    let cli = || {
        Command::new(orca_tests::procs::bin("orca"))
            .args(["backfill", "labels", "@all"])
            .env("DATABASE_URL", db.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("orca backfill")
    };
    let child = queued_by(&db, cli()).await;
    play_keys_task(&db, "all", 1, &["a", "b", "c"]).await;
    succeed_open_runs(&db).await;
    let out = ended(child).await;
    let said = orca_tests::procs::text(&out);
    assert!(out.status.success(), "{said}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("queued keys task"), "{said}");
    assert!(
        stdout.contains("keys read: 2 run(s) queued for the keys that are not done"),
        "{said}"
    );
    assert!(
        stdout.contains("2/2 done: 2 succeeded, 0 failed, 0 cancelled"),
        "{said}"
    );

    // A keys task cancelled meanwhile: the CLI stops and says so, exit 1.
    let child = queued_by(&db, cli()).await;
    let task = db
        .scalar_i64(
            "SELECT id FROM orca.runs WHERE kind = 'keys' AND status IN ('queued', 'running')",
        )
        .await;
    sqlx::query("SELECT orca.cancel($1)")
        .bind(task)
        .execute(&db.pool)
        .await
        .expect("cancel the keys task");
    let out = ended(child).await;
    let said = orca_tests::procs::text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("keys task {task} of labels cancelled")),
        "{said}"
    );
}

#[tokio::test]
async fn names_are_checked_against_the_current_keys() {
    let db = TestDb::new().await;
    db.register(&keyed("labels", "1", false)).await;
    // Before the keys were read, no name can be checked.
    let (code, msg) = expect_error(&db.pool, "SELECT orca.run('labels', 'a')").await;
    assert_eq!(code, "OR024");
    assert!(msg.contains("has not read its keys yet"), "{msg}");
    play_keys_task(&db, "refresh", 5, &["a", "b", "c", "v1..2"]).await;

    let (code, msg) = expect_error(&db.pool, "SELECT orca.backfill('labels', 'a,zz,yy')").await;
    assert_eq!(code, "OR024");
    assert!(
        msg.contains("'zz', 'yy' are not a key of pipeline 'labels'"),
        "{msg}"
    );
    assert!(msg.contains("snapshot 5"), "{msg}");
    let (code, msg) = expect_error(&db.pool, "SELECT orca.run('labels', 'a..c')").await;
    assert_eq!(code, "OR021");
    assert!(msg.contains("'a..c' is a range"), "{msg}");
    let (code, msg) = expect_error(&db.pool, "SELECT orca.run('labels', 'a b')").await;
    assert_eq!(code, "OR020");
    assert!(msg.contains("'a b'"), "{msg}");
    let (code, _) = expect_error(&db.pool, "SELECT orca.run('labels', '@all,a')").await;
    assert_eq!(code, "OR021");
    // A refused call leaves nothing behind.
    assert!(open_runs(&db).await.is_empty());

    // A key that contains `..` is a key, not a range.
    let run: i64 = sqlx::query_scalar("SELECT orca.run('labels', 'v1..2, a')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let parts: Vec<String> = sqlx::query_scalar("SELECT partitions FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("partitions");
    assert_eq!(parts, keys(&["v1..2", "a"]));
    // Named keys in a backfill go in runs of keys_per_run; one with a run
    // going is skipped.
    let ids: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('labels', 'a,b,c')")
        .fetch_all(&db.pool)
        .await
        .expect("backfill");
    assert_eq!(ids.len(), 1);
    assert_eq!(
        open_runs(&db).await,
        [keys(&["v1..2", "a"]), keys(&["b", "c"])]
    );

    // A key the dataset no longer holds is not a key any more.
    sqlx::query("SELECT orca.refresh_keys('labels')")
        .execute(&db.pool)
        .await
        .expect("refresh");
    // (The pipeline runs hold the pool's other attempts; claim the task only.)
    let task: i64 =
        sqlx::query_scalar("SELECT id FROM orca.runs WHERE kind = 'keys' AND status = 'running'")
            .fetch_one(&db.pool)
            .await
            .expect("task");
    let leases = claim(&db.pool, "r", 100).await;
    let l = leases.iter().find(|l| l.run == task).expect("task lease");
    let r: Value = sqlx::query_scalar("SELECT orca.report_keys($1, 7, 7000, ARRAY['a', 'b'])")
        .bind(l.lease)
        .fetch_one(&db.pool)
        .await
        .expect("report");
    assert_eq!(r["keys"], 2, "{r}");
    let (code, _) = expect_error(&db.pool, "SELECT orca.run('labels', 'c')").await;
    assert_eq!(code, "OR024");
    // An older snapshot reported late changes nothing.
    let r: Value = sqlx::query_scalar("SELECT orca.report_keys($1, 6, 6000, ARRAY['x'])")
        .bind(l.lease)
        .fetch_one(&db.pool)
        .await
        .expect("stale report");
    assert_eq!(r["stale"], true, "{r}");
    assert_eq!(
        db.strings("SELECT key FROM orca.key_status('labels') ORDER BY key")
            .await,
        keys(&["a", "b"])
    );
    // Values that are not keys are refused, naming one, and change nothing.
    let (code, msg) = expect_error(
        &db.pool,
        &format!(
            "SELECT orca.report_keys('{}', 8, 8000, ARRAY['a', 'has space'])",
            l.lease
        ),
    )
    .await;
    assert_eq!(code, "OR020");
    assert!(
        msg.contains("'has space'") && msg.contains("logs.index.log_id"),
        "{msg}"
    );
    assert_eq!(
        db.strings("SELECT key FROM orca.key_status('labels') ORDER BY key")
            .await,
        keys(&["a", "b"])
    );
    // A dated pipeline has no keys to refresh.
    db.register(&lake_manifest("lake")).await;
    let (code, _) = expect_error(&db.pool, "SELECT orca.refresh_keys('lake')").await;
    assert_eq!(code, "OR050");
}

#[tokio::test]
async fn keyed_manifests_refuse_schedules_and_fills() {
    let db = TestDb::new().await;
    for (patch, needle) in [
        (json!({"schedule": {"cron": "0 3 * * *"}}), "no schedule"),
        (json!({"fills": "previous"}), "no fills"),
        (json!({"keys_per_run": 0}), "keys_per_run"),
    ] {
        let mut m = keyed("labels", "1", false);
        for (k, v) in patch.as_object().expect("patch") {
            m[k] = v.clone();
        }
        let sql = format!(
            "SELECT orca.register('{}')",
            m.to_string().replace('\'', "''")
        );
        let (code, msg) = expect_error(&db.pool, &sql).await;
        assert_eq!(code, "OR040");
        assert!(msg.contains(needle), "{msg}");
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.pipelines").await,
        0
    );
}

#[tokio::test]
async fn a_keyed_sensor_runs_the_new_keys_of_a_new_snapshot_only() {
    let db = TestDb::new().await;
    // A pipeline that writes the keys dataset, and the keyed sensor.
    db.register(&json!({
        "name": "index",
        "steps": [{"name": "work", "kind": "mapped", "writes": ["logs.index"]}],
        "partitions": {"monthly": "2024-01"},
        "pool": "writers",
        "registry_hash": "index",
        "binary": "/bin/true"
    }))
    .await;
    db.register(&keyed("labels", "1", true)).await;
    play_keys_task(&db, "refresh", 1, &["a", "b"]).await;

    // An Orca run commits a snapshot of the keys dataset.
    let run: i64 = sqlx::query_scalar("SELECT orca.run('index', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let lease: uuid::Uuid =
        sqlx::query_scalar("SELECT lease FROM orca.claim('w', 'writers', 1) WHERE run = $1")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("lease");
    sqlx::query("SELECT orca.record_commit($1, 'work', '2024-01', 'logs.index', 2, 1)")
        .bind(lease)
        .execute(&db.pool)
        .await
        .expect("commit");
    sqlx::query("SELECT orca.finish($1, true)")
        .bind(lease)
        .execute(&db.pool)
        .await
        .expect("finish");
    let now = chrono::Utc::now().to_rfc3339();
    db.tick(&now).await;
    db.tick(&now).await;
    let (task, _) = play_keys_task(&db, "new", 2, &["a", "b", "c", "d", "e"]).await;
    assert_eq!(
        open_runs(&db).await,
        [keys(&["c", "d"]), keys(&["e"])],
        "only the new keys run"
    );
    let triggers = db
        .strings("SELECT DISTINCT trigger FROM orca.runs WHERE parent_run IS NOT NULL")
        .await;
    assert_eq!(triggers, ["sensor"]);
    let sensed: i64 = db
        .scalar_i64("SELECT run_id FROM orca.sensed WHERE snapshot_id = 2")
        .await;
    assert_eq!(
        sensed, task,
        "the snapshot records the keys task it started"
    );

    // The poll watches the keys dataset only, and a snapshot reported twice
    // (two runners) starts one keys task.
    let polls: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT lease FROM orca.claim('p', 'default', 10) WHERE command = 'sense'",
    )
    .fetch_all(&db.pool)
    .await
    .expect("the poll");
    assert_eq!(polls.len(), 1);
    let ctx: Value = sqlx::query_scalar("SELECT orca.sense_context($1)")
        .bind(polls[0])
        .fetch_one(&db.pool)
        .await
        .expect("sense context");
    assert_eq!(ctx["datasets"], json!(["logs.index"]));
    let seen = json!([{"dataset": "logs.index", "snapshot": 3,
                       "timestamp_ms": chrono::Utc::now().timestamp_millis() + 1000}]);
    for _ in 0..2 {
        sqlx::query("SELECT orca.report_snapshots($1, $2)")
            .bind(polls[0])
            .bind(&seen)
            .execute(&db.pool)
            .await
            .expect("report");
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.runs WHERE kind = 'keys' AND trigger = 'sensor'")
            .await,
        2
    );
}
