//! Every kind of bad input gets a clear error naming the value, its own
//! SQLSTATE (docs/errors.md), and writes nothing.

use orca_tests::sqlx::Executor;
use orca_tests::*;
use serde_json::{json, Value};

/// Runs `sql`, expects `code` and a message containing `needle`, and checks
/// that no table of schema orca changed.
async fn refused(db: &TestDb, sql: &str, code: &str, needle: &str) {
    let before = db.table_counts().await;
    let (got, msg) = expect_error(&db.pool, sql).await;
    assert_eq!(got, code, "{sql}: {msg}");
    assert!(
        msg.contains(needle),
        "{sql}: message '{msg}' does not name '{needle}'"
    );
    assert_eq!(db.table_counts().await, before, "{sql} wrote something");
}

async fn register_refused(db: &TestDb, manifest: Value, code: &str, needle: &str) {
    let sql = format!(
        "SELECT orca.register('{}'::jsonb)",
        manifest.to_string().replace('\'', "''")
    );
    refused(db, &sql, code, needle).await;
}

async fn lake(db: &TestDb) {
    db.register(&lake_manifest("lake")).await;
    db.register(&daily_manifest("daily", "0 3 * * *", "UTC"))
        .await;
}

#[tokio::test]
async fn unknown_pipeline() {
    let db = TestDb::new().await;
    lake(&db).await;
    for sql in [
        "SELECT orca.backfill('lakes', '2024-01')",
        "SELECT orca.run('lakes', '2024-01')",
        "SELECT * FROM orca.fires('lakes')",
        "SELECT orca.pause('lakes')",
    ] {
        refused(&db, sql, "OR010", "'lakes'").await;
    }
}

#[tokio::test]
async fn malformed_partitions() {
    let db = TestDb::new().await;
    lake(&db).await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '2024-1')",
        "OR020",
        "'2024-1'",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '2024-13')",
        "OR020",
        "'2024-13'",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('lake', 'january')",
        "OR020",
        "'january'",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('daily', '2024-02-30')",
        "OR020",
        "'2024-02-30'",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('daily', '2024-02')",
        "OR020",
        "YYYY-MM-DD",
    )
    .await;
}

#[tokio::test]
async fn malformed_ranges_and_lists() {
    let db = TestDb::new().await;
    lake(&db).await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '2024-06..2024-01')",
        "OR021",
        "2024-06..2024-01",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '2024-01..')",
        "OR021",
        "'2024-01..'",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '2024-01,,2024-02')",
        "OR021",
        "2024-01,,2024-02",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '')",
        "OR021",
        "names no partition",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '@everything')",
        "OR021",
        "@everything",
    )
    .await;
    refused(&db, "SELECT orca.run('lake', NULL)", "OR021", "NULL").await;
}

#[tokio::test]
async fn partitions_outside_the_set() {
    let db = TestDb::new().await;
    lake(&db).await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '2023-12')",
        "OR022",
        "'2023-12'",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '2023-11..2024-02')",
        "OR022",
        "'2023-11'",
    )
    .await;
    refused(
        &db,
        "SELECT orca.backfill('lake', '2099-01')",
        "OR022",
        "'2099-01'",
    )
    .await;
    refused(
        &db,
        "SELECT orca.run('daily', '2019-12-31')",
        "OR022",
        "'2019-12-31'",
    )
    .await;
}

#[tokio::test]
async fn too_many_partitions() {
    let db = TestDb::new().await;
    lake(&db).await;
    let mut c = db.connect().await;
    c.execute("SET orca.max_partitions = 3").await.expect("set");
    let before = db.table_counts().await;
    let (code, msg) =
        expect_error(&mut c, "SELECT orca.backfill('lake', '2024-01..2024-06')").await;
    assert_eq!(code, "OR023");
    assert!(msg.contains("6 partitions"), "{msg}");
    assert_eq!(db.table_counts().await, before);
}

#[tokio::test]
async fn unparsable_impossible_cron_and_unknown_zone() {
    let db = TestDb::new().await;
    let with_schedule = |cron: &str, tz: &str| {
        let mut m = lake_manifest("lake");
        m["schedule"] = json!({"cron": cron, "tz": tz});
        m
    };
    register_refused(
        &db,
        with_schedule("every day", "UTC"),
        "OR030",
        "'every day'",
    )
    .await;
    register_refused(&db, with_schedule("* * *", "UTC"), "OR030", "found 3").await;
    register_refused(
        &db,
        with_schedule("61 * * * *", "UTC"),
        "OR030",
        "'61 * * * *'",
    )
    .await;
    register_refused(
        &db,
        with_schedule("0 0 * * FUNDAY", "UTC"),
        "OR030",
        "FUNDAY",
    )
    .await;
    register_refused(
        &db,
        with_schedule("0 0 30 2 *", "UTC"),
        "OR031",
        "'0 0 30 2 *'",
    )
    .await;
    register_refused(
        &db,
        with_schedule("0 3 * * *", "Mars/Olympus"),
        "OR032",
        "'Mars/Olympus'",
    )
    .await;
}

#[tokio::test]
async fn malformed_manifests() {
    let db = TestDb::new().await;
    let patched = |f: &dyn Fn(&mut Value)| {
        let mut m = lake_manifest("lake");
        f(&mut m);
        m
    };
    register_refused(&db, json!([1, 2]), "OR040", "must be a JSON object").await;
    register_refused(&db, json!({}), "OR040", "name: is required").await;
    register_refused(
        &db,
        patched(&|m| m["name"] = json!("Lake Pipeline")),
        "OR040",
        "'Lake Pipeline'",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["steps"] = json!([])),
        "OR040",
        "at least one step",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["steps"][1]["kind"] = json!("reduce")),
        "OR040",
        "\"reduce\"",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["steps"][1]["after"] = json!("zero")),
        "OR040",
        "'zero'",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["steps"][1]["name"] = json!("one")),
        "OR040",
        "used twice",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["max_runs"] = json!("two")),
        "OR040",
        "\"two\"",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["run_retries"] = json!(-1)),
        "OR040",
        "got -1",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["fills"] = json!("next")),
        "OR040",
        "\"next\"",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["catchup"] = json!("yes")),
        "OR040",
        "\"yes\"",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["partitions"] = json!({"weekly": "2024-01"})),
        "OR040",
        "weekly",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| m["partitions"] = json!({"monthly": "2024-1"})),
        "OR020",
        "'2024-1'",
    )
    .await;
    register_refused(
        &db,
        patched(&|m| {
            if let Some(o) = m.as_object_mut() {
                o.remove("binary");
            }
        }),
        "OR040",
        "binary",
    )
    .await;
    refused(&db, "SELECT orca.register(NULL)", "OR040", "required").await;
}

#[tokio::test]
async fn unknown_runs_and_bad_arguments() {
    let db = TestDb::new().await;
    lake(&db).await;
    refused(&db, "SELECT orca.cancel(424242)", "OR011", "424242").await;
    refused(&db, "SELECT orca.retry(424242)", "OR011", "424242").await;
    refused(
        &db,
        "SELECT * FROM orca.claim('r', max => 0)",
        "OR050",
        "got 0",
    )
    .await;
    refused(
        &db,
        "SELECT * FROM orca.claim('', 'default')",
        "OR050",
        "''",
    )
    .await;
    refused(
        &db,
        "SELECT * FROM orca.fires('lake', -1)",
        "OR050",
        "got -1",
    )
    .await;
    refused(&db, "SELECT orca.tick('infinity')", "OR050", "infinity").await;
    refused(
        &db,
        "SELECT orca.finish(gen_random_uuid(), NULL)",
        "OR050",
        "NULL",
    )
    .await;
}

#[tokio::test]
async fn unknown_org() {
    let db = TestDb::new().await;
    lake(&db).await;
    let mut c = db.connect().await;
    c.execute("SET orca.org = 'nowhere'").await.expect("set");
    let before = db.table_counts().await;
    let (code, msg) = expect_error(&mut c, "SELECT orca.backfill('lake', '2024-01')").await;
    assert_eq!(code, "OR001");
    assert!(msg.contains("'nowhere'"), "{msg}");
    assert_eq!(db.table_counts().await, before);
    refused(
        &db,
        "SELECT orca.create_org('Bad Name')",
        "OR003",
        "Bad Name",
    )
    .await;
    refused(
        &db,
        "SELECT orca.create_org('default')",
        "OR003",
        "'default' already exists",
    )
    .await;
    refused(
        &db,
        "SELECT orca.add_member('default', 'no_such_role_x')",
        "OR004",
        "no_such_role_x",
    )
    .await;
}
