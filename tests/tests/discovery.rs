//! Discovery as a runner's task: `orca.discover` queues it, a runner's
//! engine reads the source's catalog and stores it in versions,
//! `orca.create_sync` plans its streams from it, and each attempt of the
//! sync reports how the source drifted from the planned version.

use std::time::Duration;

use orca_tests::procs::{outputs, sync_runner, Runner};
use orca_tests::sqlx;
use orca_tests::*;
use serde_json::{json, Value};

async fn succeeded(db: &TestDb, run: i64, runner: &Runner, what: &str) {
    wait_until(
        what,
        Duration::from_secs(120),
        || async {
            let s: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
                .bind(run)
                .fetch_one(&db.pool)
                .await
                .expect("run status");
            assert_ne!(s, "failed", "{}", outputs(&[runner]));
            (s == "succeeded").then_some(())
        },
        || outputs(&[runner]),
    )
    .await;
}

async fn discover(db: &TestDb, source: Option<&Value>) -> i64 {
    sqlx::query_scalar("SELECT orca.discover('shop', $1)")
        .bind(source)
        .fetch_one(&db.pool)
        .await
        .expect("orca.discover")
}

async fn events(db: &TestDb, kind: &str) -> Vec<Value> {
    sqlx::query_scalar("SELECT data FROM orca.events WHERE kind = $1 ORDER BY id")
        .bind(kind)
        .fetch_all(&db.pool)
        .await
        .expect("events")
}

fn refusal(e: sqlx::Error) -> (String, String) {
    match e {
        sqlx::Error::Database(d) => (
            d.code().map(|c| c.to_string()).unwrap_or_default(),
            d.message().to_string(),
        ),
        other => (String::new(), other.to_string()),
    }
}

#[tokio::test]
async fn a_runner_discovers_a_source_a_sync_plans_from_it_and_attempts_report_drift() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE SCHEMA shop;
         CREATE TABLE shop.orders (id bigint PRIMARY KEY, amount integer NOT NULL,
                                   updated_at timestamptz NOT NULL DEFAULT now());
         INSERT INTO shop.orders (id, amount) SELECT g, g FROM generate_series(1, 500) g;
         CREATE TABLE shop.notes (body text);
         ANALYZE shop.orders;",
    )
    .execute(&db.pool)
    .await
    .expect("source tables");
    let dir = scratch("discovery");
    let runner = sync_runner(&db, &dir.join("store"), &dir.join("logs"));
    let source = json!({"type": "postgres", "url": db.url()});

    // The runner's engine reads the catalog: every table, and a plan with
    // the one a cursor sync can read (notes has no key and no cursor).
    let run = discover(&db, Some(&source)).await;
    succeeded(&db, run, &runner, "the discovery").await;
    let (version, catalog): (i32, Value) =
        sqlx::query_as("SELECT version, catalog FROM orca.catalogs WHERE name = 'shop'")
            .fetch_one(&db.pool)
            .await
            .expect("the stored catalog");
    assert_eq!(version, 1);
    let streams = catalog["streams"].as_array().cloned().unwrap_or_default();
    let orders = streams
        .iter()
        .find(|s| s["table"] == "shop.orders")
        .unwrap_or_else(|| panic!("no shop.orders in {catalog}"));
    assert_eq!(orders["primary_key"], json!(["id"]));
    assert_eq!(orders["rows_estimate"], 500);
    assert_eq!(
        orders["columns"][1],
        json!({"name": "amount", "type": "integer", "nullable": false, "toastable": false})
    );
    assert!(streams.iter().any(|s| s["table"] == "shop.notes"));
    assert_eq!(
        catalog["plan"],
        json!([{"name": "orders", "table": "shop.orders", "primary_key": ["id"],
                "mode": "merge", "cursor": "updated_at"}])
    );
    let found = events(&db, "catalog.discovered").await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["version"], 1);

    // Discovered again unchanged (rows come and go): the same version.
    sqlx::raw_sql("INSERT INTO shop.orders (id, amount) VALUES (501, 1); ANALYZE shop.orders")
        .execute(&db.pool)
        .await
        .expect("a row");
    let run = discover(&db, Some(&source)).await;
    succeeded(&db, run, &runner, "the second discovery").await;
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.catalogs").await, 1);
    assert_eq!(events(&db, "catalog.checked").await.len(), 1);

    // Planned from the catalog: the sync's streams are the plan's, options
    // beside "catalog" apply to each.
    let out = dir.join("out");
    let parquet = json!({"type": "parquet", "url": out.to_string_lossy()});
    let wrong = sqlx::query(
        "SELECT orca.create_sync('shop', $1, $2, '{\"catalog\": [\"shop.notes\"]}', NULL, 'at_least_once')",
    )
    .bind(&source)
    .bind(&parquet)
    .execute(&db.pool)
    .await
    .expect_err("notes cannot be planned");
    let (code, message) = refusal(wrong);
    assert_eq!(code, "OR063", "{message}");
    assert!(message.contains("shop.notes"), "{message}");
    let elsewhere = sqlx::query(
        "SELECT orca.create_sync('shop', $1, $2, '{\"catalog\": true, \"mode\": \"append\"}', NULL, 'at_least_once')",
    )
    .bind(json!({"type": "postgres", "url": "postgres://db.example/other"}))
    .bind(&parquet)
    .execute(&db.pool)
    .await
    .expect_err("a catalog of another source");
    let (code, message) = refusal(elsewhere);
    assert_eq!(code, "OR063", "{message}");
    assert!(message.contains("another source"), "{message}");
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.syncs").await, 0);
    sqlx::query(
        "SELECT orca.create_sync('shop', $1, $2, '{\"catalog\": [\"shop.orders\"], \"mode\": \"append\"}', \
         NULL, 'at_least_once')",
    )
    .bind(&source)
    .bind(&parquet)
    .execute(&db.pool)
    .await
    .expect("create_sync from the catalog");
    let (def, planned): (Value, Option<i32>) =
        sqlx::query_as("SELECT definition, catalog_version FROM orca.syncs WHERE name = 'shop'")
            .fetch_one(&db.pool)
            .await
            .expect("the sync");
    assert_eq!(planned, Some(1));
    assert_eq!(def["streams"][0]["table"], "shop.orders");
    assert_eq!(def["streams"][0]["cursor"], "updated_at");
    assert_eq!(def["streams"][0]["mode"], "append");

    // An attempt of the unchanged source reports no drift.
    let sync_run = || async {
        sqlx::query_scalar::<_, i64>("SELECT orca.run('shop', 'now')")
            .fetch_one(&db.pool)
            .await
            .expect("run the sync")
    };
    let r = sync_run().await;
    succeeded(&db, r, &runner, "the first sync").await;
    let drift = || async {
        sqlx::query_scalar::<_, Option<Value>>("SELECT drift FROM orca.syncs WHERE name = 'shop'")
            .fetch_one(&db.pool)
            .await
            .expect("drift")
    };
    assert_eq!(drift().await, None);

    // The source changes: the next attempt says how, once.
    sqlx::raw_sql(
        "ALTER TABLE shop.orders ADD COLUMN note text;
         ALTER TABLE shop.orders ALTER COLUMN amount DROP NOT NULL;",
    )
    .execute(&db.pool)
    .await
    .expect("change the table");
    for n in 0..2 {
        let r = sync_run().await;
        succeeded(&db, r, &runner, "a sync after the change").await;
        let changes = drift()
            .await
            .unwrap_or_else(|| panic!("no drift after run {n}"));
        assert_eq!(
            changes,
            json!([
                {"table": "shop.orders", "column": "amount", "change": "nullable",
                 "was": "false", "now": "true"},
                {"table": "shop.orders", "column": "note", "change": "added", "now": "text"}
            ])
        );
    }
    let reported = events(&db, "sync.drift").await;
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert_eq!(reported[0]["catalog_version"], 1);

    // Discovered again, the catalog gets a new version; the sync defined
    // again from it has nothing left to report.
    let run = discover(&db, None).await;
    succeeded(&db, run, &runner, "the rediscovery").await;
    let versions = db
        .strings("SELECT version::text FROM orca.catalogs WHERE name = 'shop' ORDER BY version")
        .await;
    assert_eq!(versions, ["1", "2"]);
    sqlx::query(
        "SELECT orca.create_sync('shop', $1, $2, '{\"catalog\": true, \"mode\": \"append\"}', NULL, 'at_least_once')",
    )
    .bind(&source)
    .bind(&parquet)
    .execute(&db.pool)
    .await
    .expect("redefine from version 2");
    let r = sync_run().await;
    succeeded(&db, r, &runner, "a sync planned from version 2").await;
    assert_eq!(drift().await, None);
    assert_eq!(
        db.scalar_i64("SELECT catalog_version::bigint FROM orca.syncs WHERE name = 'shop'")
            .await,
        2
    );
    // A discovery is a run of the sync's pipeline, in its history.
    let kinds = db
        .strings(
            "SELECT kind || ':' || status FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id
             WHERE p.name = 'shop' ORDER BY r.id",
        )
        .await;
    assert_eq!(
        kinds,
        [
            "discover:succeeded",
            "discover:succeeded",
            "sync:succeeded",
            "sync:succeeded",
            "sync:succeeded",
            "discover:succeeded",
            "sync:succeeded"
        ]
    );
    drop(runner);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn bad_discoveries_are_refused_and_leave_nothing() {
    let db = TestDb::new().await;
    db.register(&lake_manifest("lake")).await;
    let before = db.table_counts().await;
    for (name, source, code, needle) in [
        ("shop", None, "OR064", "unknown sync 'shop'"),
        (
            "Shop!",
            Some(json!({"type": "postgres", "url": "postgres://db.example/x"})),
            "OR063",
            "'Shop!'",
        ),
        ("shop", Some(json!({"type": "postgres"})), "OR061", "'url'"),
        (
            "shop",
            Some(json!({"type": "connector", "connector": "../bin/sh", "replay": "exact"})),
            "OR063",
            "connector",
        ),
    ] {
        let e = sqlx::query("SELECT orca.discover($1, $2)")
            .bind(name)
            .bind(&source)
            .execute(&db.pool)
            .await
            .expect_err("refused");
        let (c, m) = refusal(e);
        assert_eq!(c, code, "{m}");
        assert!(m.contains(needle), "{m} lacks {needle}");
    }
    // A pipeline's name is not a sync's.
    let e = sqlx::query("SELECT orca.discover('lake', $1)")
        .bind(json!({"type": "postgres", "url": "postgres://db.example/x"}))
        .execute(&db.pool)
        .await
        .expect_err("a pipeline's name");
    assert_eq!(refusal(e).0, "OR065");
    assert_eq!(db.table_counts().await, before, "a refused discovery wrote");
    // A store_catalog without a discovery's lease is refused.
    let e = sqlx::query(
        "SELECT orca.store_catalog(gen_random_uuid(), '{\"streams\": [], \"plan\": []}')",
    )
    .execute(&db.pool)
    .await
    .expect_err("no such lease");
    assert_eq!(refusal(e).0, "OR012");
}
