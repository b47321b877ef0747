//! Syncs in the control plane: definitions validated with a clear error per
//! fault, delivery levels per stream, and HEAD moved by a fenced
//! compare-and-swap that a zombie attempt cannot win.

use orca_tests::sqlx::{self, Row};
use orca_tests::*;
use serde_json::{json, Value};

async fn create(
    db: &TestDb,
    source: &Value,
    destination: &Value,
    streams: &Value,
    delivery: &str,
) -> Result<i64, (String, String)> {
    sqlx::query_scalar("SELECT orca.create_sync('shop', $1, $2, $3, NULL, $4)")
        .bind(source)
        .bind(destination)
        .bind(streams)
        .bind(delivery)
        .fetch_one(&db.pool)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(d) => (
                d.code().map(|c| c.to_string()).unwrap_or_default(),
                d.message().to_string(),
            ),
            other => panic!("{other}"),
        })
}

fn pg() -> Value {
    json!({"type": "postgres", "url": "postgres://127.0.0.1/shop"})
}

fn orders(mode: &str) -> Value {
    json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
            "primary_key": ["id"], "mode": mode}])
}

#[tokio::test]
async fn definitions_are_validated_and_keep_their_delivery_levels() {
    let db = TestDb::new().await;
    let iceberg = json!({"type": "iceberg", "namespace": "raw"});
    let parquet = json!({"type": "parquet", "url": "/tmp/orca-never-written/out"});

    for (source, destination, streams, delivery, code, needle) in [
        (
            json!({"type": "mysql", "url": "x"}),
            iceberg.clone(),
            orders("append"),
            "exactly_once",
            "OR060",
            "'mysql'",
        ),
        (
            json!({"type": "postgres"}),
            iceberg.clone(),
            orders("append"),
            "exactly_once",
            "OR061",
            "'url'",
        ),
        (
            pg(),
            parquet.clone(),
            orders("append"),
            "exactly_once",
            "OR062",
            "stream 'orders'",
        ),
        (
            pg(),
            iceberg.clone(),
            json!([{"name": "orders", "table": "public.orders"}]),
            "at_least_once",
            "OR063",
            "streams[0].cursor",
        ),
        (
            pg(),
            iceberg.clone(),
            orders("append"),
            "twice",
            "OR063",
            "'twice'",
        ),
        (
            pg(),
            json!({"type": "parquet", "url": "/tmp/orca-never-written/out", "lanes": 0}),
            orders("append"),
            "at_least_once",
            "OR063",
            "destination.lanes",
        ),
        // A misspelt stream option is named, not dropped.
        (
            pg(),
            iceberg.clone(),
            json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                    "primary_key": ["id"], "mode": "merge", "lookbak": "10 minutes"}]),
            "at_least_once",
            "OR063",
            "streams[0].lookbak: is not an option of a stream",
        ),
        // A stream asks for more than the sync: an append to parquet cannot.
        (
            pg(),
            parquet.clone(),
            json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                    "primary_key": ["id"], "delivery": "effectively_once"}]),
            "at_least_once",
            "OR062",
            "cannot be delivered effectively_once",
        ),
    ] {
        let (c, m) = create(&db, &source, &destination, &streams, delivery)
            .await
            .expect_err("refused");
        assert_eq!(c, code, "{m}");
        assert!(m.contains(needle), "{m}");
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.syncs").await,
        0,
        "nothing half-written"
    );

    let id = create(&db, &pg(), &iceberg, &orders("merge"), "effectively_once")
        .await
        .expect("a valid sync");
    let def: Value = sqlx::query_scalar("SELECT definition FROM orca.syncs WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .expect("definition");
    assert_eq!(def["streams"][0]["delivery"], "effectively_once");
    // Its stored streams can be given again as they are.
    let same = create(&db, &pg(), &iceberg, &def["streams"], "effectively_once")
        .await
        .expect("the stored streams");
    assert_eq!(same, id);
    // Defining it again replaces the definition and keeps the sync.
    let again = create(&db, &pg(), &iceberg, &orders("append"), "exactly_once")
        .await
        .expect("redefined");
    assert_eq!(again, id);
    let kinds = db
        .strings("SELECT kind FROM orca.events WHERE kind LIKE 'sync.%' ORDER BY id")
        .await;
    assert_eq!(kinds, ["sync.defined", "sync.defined", "sync.defined"]);
}

#[tokio::test]
async fn a_zombie_attempt_is_fenced_at_its_next_commit() {
    let db = TestDb::new().await;
    create(
        &db,
        &pg(),
        &json!({"type": "iceberg", "namespace": "raw"}),
        &orders("append"),
        "exactly_once",
    )
    .await
    .expect("sync");
    let first: Value = sqlx::query_scalar("SELECT orca.claim_sync('shop')")
        .fetch_one(&db.pool)
        .await
        .expect("claim");
    assert_eq!(first["generation"], 1);
    assert_eq!(first["epoch"], 0);
    sqlx::query("SELECT orca.advance_head('shop', 1, 1, 'default/shop/_checkpoints/00000001')")
        .execute(&db.pool)
        .await
        .expect("epoch 1");

    // A second attempt claims the sync: it recovers from HEAD.
    let second: Value = sqlx::query_scalar("SELECT orca.claim_sync('shop')")
        .fetch_one(&db.pool)
        .await
        .expect("claim again");
    assert_eq!(second["generation"], 2);
    assert_eq!(second["epoch"], 1);
    assert_eq!(second["record"], "default/shop/_checkpoints/00000001");

    // The first one, still running, is fenced and changes nothing.
    let (code, msg) = expect_error(
        &db.pool,
        "SELECT orca.advance_head('shop', 1, 2, 'default/shop/_checkpoints/zombie')",
    )
    .await;
    assert_eq!(code, "OR070");
    assert!(msg.contains("generation 1 is fenced"), "{msg}");
    // Epochs go one at a time.
    let (code, _) = expect_error(
        &db.pool,
        "SELECT orca.advance_head('shop', 2, 3, 'default/shop/_checkpoints/00000003')",
    )
    .await;
    assert_eq!(code, "OR071");
    sqlx::query("SELECT orca.advance_head('shop', 2, 2, 'default/shop/_checkpoints/00000002')")
        .execute(&db.pool)
        .await
        .expect("epoch 2");
    let head = db
        .strings("SELECT head_epoch || ' ' || head_record FROM orca.syncs")
        .await;
    assert_eq!(head, ["2 default/shop/_checkpoints/00000002"]);
    // The same commit again (its answer was lost in a server restart)
    // succeeds and changes nothing; another record for the epoch does not.
    let commits = "SELECT count(*) FROM orca.events WHERE kind = 'sync.committed'";
    let before = db.scalar_i64(commits).await;
    sqlx::query("SELECT orca.advance_head('shop', 2, 2, 'default/shop/_checkpoints/00000002')")
        .execute(&db.pool)
        .await
        .expect("the same commit again");
    assert_eq!(db.scalar_i64(commits).await, before);
    let (code, _) = expect_error(
        &db.pool,
        "SELECT orca.advance_head('shop', 2, 2, 'default/shop/_checkpoints/other')",
    )
    .await;
    assert_eq!(code, "OR071");
    let (code, _) = expect_error(&db.pool, "SELECT orca.claim_sync('nope')").await;
    assert_eq!(code, "OR064");

    // Epoch 2 is lost: recovery goes back to epoch 1's record, only one
    // epoch back, only for the current generation.
    let (code, _) = expect_error(
        &db.pool,
        "SELECT orca.rewind_head('shop', 1, 1, 'default/shop/_checkpoints/00000001')",
    )
    .await;
    assert_eq!(code, "OR070", "a zombie cannot rewind");
    let (code, msg) = expect_error(&db.pool, "SELECT orca.rewind_head('shop', 2, 0, NULL)").await;
    assert_eq!(code, "OR071");
    assert!(msg.contains("HEAD is at epoch 2"), "{msg}");
    sqlx::query("SELECT orca.rewind_head('shop', 2, 1, 'default/shop/_checkpoints/00000001')")
        .execute(&db.pool)
        .await
        .expect("rewind");
    let head = db
        .strings("SELECT head_epoch || ' ' || head_record FROM orca.syncs")
        .await;
    assert_eq!(head, ["1 default/shop/_checkpoints/00000001"]);
    sqlx::query("SELECT orca.rewind_head('shop', 2, 1, 'default/shop/_checkpoints/00000001')")
        .execute(&db.pool)
        .await
        .expect("the same rewind again changes nothing");
    let events = db
        .strings("SELECT data->>'lost_epoch' FROM orca.events WHERE kind = 'sync.rewound'")
        .await;
    assert_eq!(events, ["2"]);
    sqlx::query("SELECT orca.rewind_head('shop', 2, 0, NULL)")
        .execute(&db.pool)
        .await
        .expect("rewind to the start");
    assert_eq!(db.scalar_i64("SELECT head_epoch FROM orca.syncs").await, 0);
}

#[tokio::test]
async fn a_sync_is_runs_like_any_other_scheduled_manual_leased_one_at_a_time() {
    let db = TestDb::new().await;
    sqlx::query(
        "SELECT orca.create_sync('shop', $1, $2, $3, '*/15 * * * *', 'at_least_once', 'etl', 1)",
    )
    .bind(pg())
    .bind(json!({"type": "parquet", "url": "/tmp/orca-never-written/out"}))
    .bind(orders("append"))
    .execute(&db.pool)
    .await
    .expect("sync");
    // The schedule fires on UTC quarter hours, each fire one run named by
    // its instant. Missed fires are not caught up (a run reads everything
    // new anyway): the first tick makes one run, the next one the latest of
    // 00:15 and 00:30, which waits for the running one (max_runs 1).
    db.tick("2030-01-01 00:00:00Z").await;
    let fires = db
        .strings("SELECT fire_at::text || ' ' || partition FROM orca.fires('shop', 2, '2030-01-01 00:00Z')")
        .await;
    assert_eq!(
        fires,
        [
            "2030-01-01 00:15:00+00 2030-01-01T00:15:00Z",
            "2030-01-01 00:30:00+00 2030-01-01T00:30:00Z"
        ]
    );
    db.tick("2030-01-01 00:31:00Z").await;
    let runs = db
        .strings("SELECT kind || ' ' || trigger || ' ' || status || ' ' || partitions[1] FROM orca.runs ORDER BY id")
        .await;
    assert_eq!(
        runs,
        [
            "sync schedule running 2030-01-01T00:00:00Z",
            "sync schedule queued 2030-01-01T00:30:00Z"
        ]
    );

    // Leased to a runner of the sync's pool, as command sync.
    let lease = sqlx::query("SELECT * FROM orca.claim('r1', 'etl', 5)")
        .fetch_all(&db.pool)
        .await
        .expect("claim");
    assert_eq!(lease.len(), 1, "one attempt at a time");
    let command: String = lease[0].get("command");
    let pipeline: String = lease[0].get("pipeline");
    assert_eq!((command.as_str(), pipeline.as_str()), ("sync", "shop"));
    let token: uuid::Uuid = lease[0].get("lease");
    let status: String = sqlx::query_scalar("SELECT orca.finish($1, false, 'exit code 1: boom')")
        .bind(token)
        .fetch_one(&db.pool)
        .await
        .expect("finish");
    assert_eq!(status, "running", "retried once (run_retries 1)");
    let lease = sqlx::query("SELECT * FROM orca.claim('r1', 'etl', 5)")
        .fetch_all(&db.pool)
        .await
        .expect("claim");
    let token: uuid::Uuid = lease[0].get("lease");
    let status: String = sqlx::query_scalar("SELECT orca.finish($1, true)")
        .bind(token)
        .fetch_one(&db.pool)
        .await
        .expect("finish");
    assert_eq!(status, "succeeded");
    assert_eq!(
        db.strings("SELECT status FROM orca.runs ORDER BY id").await,
        ["succeeded", "running"],
        "the queued fire started when the slot freed"
    );

    // A manual run is 'now'; cancelling works as for any run.
    let id: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run now");
    sqlx::query("SELECT orca.cancel($1)")
        .bind(id)
        .execute(&db.pool)
        .await
        .expect("cancel");
    for (sql, code, needle) in [
        (
            "SELECT orca.run('shop', '2024-01')",
            "OR021",
            "the only partition is 'now'",
        ),
        (
            "SELECT orca.backfill('shop', '2024-01')",
            "OR021",
            "it backfills '@all'",
        ),
    ] {
        let (c, msg) = expect_error(&db.pool, sql).await;
        assert_eq!(c, code, "{sql}: {msg}");
        assert!(msg.contains(needle), "{msg}");
    }
    // A sync's name cannot become a pipeline's, nor a pipeline's a sync's.
    match sqlx::query("SELECT orca.register($1)")
        .bind(lake_manifest("shop"))
        .execute(&db.pool)
        .await
    {
        Err(sqlx::Error::Database(d)) => {
            assert_eq!(d.code().as_deref(), Some("OR065"));
            assert!(d.message().contains("belongs to a sync"), "{}", d.message());
        }
        other => panic!("register of a sync's name: {other:?}"),
    }

    db.register(&lake_manifest("lake")).await;
    let err = create(
        &db,
        &pg(),
        &json!({"type": "parquet", "url": "/tmp/orca-never-written/x"}),
        &orders("append"),
        "at_least_once",
    )
    .await;
    assert!(err.is_ok(), "redefining shop is fine: {err:?}");
    let (code, msg) = expect_error(
        &db.pool,
        "SELECT orca.create_sync('lake', '{\"type\": \"files\", \"url\": \"/tmp/orca-never-written/in\", \"format\": \"jsonl\"}', \
         '{\"type\": \"parquet\", \"url\": \"/tmp/orca-never-written/out\"}', '[{\"name\": \"events\", \"pattern\": \"*.jsonl\"}]')",
    )
    .await;
    assert_eq!(code, "OR065");
    assert!(msg.contains("belongs to a pipeline"), "{msg}");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.syncs WHERE name = 'lake'")
            .await,
        0
    );
}

#[tokio::test]
async fn a_sync_backfill_asks_its_attempt_to_read_everything_again() {
    let db = TestDb::new().await;
    create(
        &db,
        &pg(),
        &json!({"type": "parquet", "url": "/tmp/orca-never-written/out"}),
        &orders("append"),
        "at_least_once",
    )
    .await
    .expect("sync");
    // A sync's backfill is one run: it takes no partitions a run.
    let (code, msg) = expect_error(&db.pool, "SELECT orca.backfill('shop', '@all', 2)").await;
    assert_eq!(code, "OR110");
    assert!(msg.contains("'shop' is a sync"), "{msg}");
    let ids: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('shop', '@all')")
        .fetch_all(&db.pool)
        .await
        .expect("backfill");
    assert_eq!(ids.len(), 1);
    let run = db
        .strings("SELECT kind || ' ' || trigger || ' ' || request::text FROM orca.runs")
        .await;
    assert_eq!(run, [r#"sync backfill {"mode": "full"}"#]);
    let leases = claim(&db.pool, "r1", 1).await;
    assert_eq!(leases.len(), 1);
    let claimed: Value = sqlx::query_scalar("SELECT orca.claim_sync('shop', $1)")
        .bind(leases[0].lease)
        .fetch_one(&db.pool)
        .await
        .expect("claim with the lease");
    assert_eq!(claimed["run"], ids[0]);
    assert_eq!(claimed["request"], json!({"mode": "full"}));
    let overview = db
        .strings(
            "SELECT concat_ws(' ', sync, source, destination, streams, pool, generation,
                              head_epoch, last_run, last_status, last_trigger, running)
             FROM orca.sync_overview",
        )
        .await;
    assert_eq!(
        overview,
        [format!(
            "shop postgres parquet 1 default 1 0 {} running backfill 1",
            ids[0]
        )]
    );
    // A lease that is not live, or of another sync, claims nothing.
    let (code, _) = expect_error(
        &db.pool,
        "SELECT orca.claim_sync('shop', '00000000-0000-0000-0000-000000000000')",
    )
    .await;
    assert!(code.starts_with("OR01"), "{code}");
    sqlx::query("SELECT orca.create_sync('other', $1, $2, $3, NULL, 'at_least_once')")
        .bind(pg())
        .bind(json!({"type": "parquet", "url": "/tmp/orca-never-written/out"}))
        .bind(orders("append"))
        .execute(&db.pool)
        .await
        .expect("another sync");
    let (code, msg) = expect_error(
        &db.pool,
        &format!("SELECT orca.claim_sync('other', '{}')", leases[0].lease),
    )
    .await;
    assert_eq!(code, "OR084");
    assert!(msg.contains("not of sync 'other'"), "{msg}");
    assert_eq!(
        db.scalar_i64("SELECT generation::bigint FROM orca.syncs WHERE name = 'other'")
            .await,
        0,
        "nothing claimed"
    );
}

#[tokio::test]
async fn a_runner_claims_only_the_commands_it_can_run() {
    // A runner not set up for syncs (no store) claims pipeline attempts and
    // leaves a sync's attempt to a runner that is.
    let db = TestDb::new().await;
    create(
        &db,
        &pg(),
        &json!({"type": "parquet", "url": "/tmp/orca-never-written/out"}),
        &orders("append"),
        "at_least_once",
    )
    .await
    .expect("create");
    db.register(&daily_manifest("daily", "0 3 * * *", "UTC"))
        .await;
    sqlx::query("SELECT orca.run('shop', 'now')")
        .execute(&db.pool)
        .await
        .expect("sync run");
    sqlx::query("SELECT orca.run('daily', '2024-01-01')")
        .execute(&db.pool)
        .await
        .expect("pipeline run");
    let claimed = |commands: Option<Vec<&'static str>>| {
        let pool = db.pool.clone();
        async move {
            sqlx::query("SELECT pipeline, command FROM orca.claim('r', 'default', 10, $1)")
                .bind(commands)
                .fetch_all(&pool)
                .await
                .expect("claim")
                .iter()
                .map(|r| (r.get::<String, _>(0), r.get::<String, _>(1)))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        claimed(Some(vec!["attempt", "sense", "keys"])).await,
        [("daily".to_string(), "attempt".to_string())]
    );
    assert!(
        claimed(Some(vec!["attempt"])).await.is_empty(),
        "the sync's attempt is left for a runner that runs syncs"
    );
    assert_eq!(
        claimed(Some(vec!["sync"])).await,
        [("shop".to_string(), "sync".to_string())]
    );
    let before = db.table_counts().await;
    let (code, msg) = expect_error(
        &db.pool,
        "SELECT * FROM orca.claim('r', 'default', 1, ARRAY['attempt', 'spark'])",
    )
    .await;
    assert_eq!(code, "OR050");
    assert!(msg.contains("'spark'"), "{msg}");
    assert_eq!(
        db.table_counts().await,
        before,
        "a refused claim writes nothing"
    );
}
