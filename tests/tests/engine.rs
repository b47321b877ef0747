//! orca-engine end to end: real engine processes move a Postgres table into
//! Parquet files in epochs, are killed with SIGKILL mid-sync and started
//! again, and are fenced by a newer claim; every row lands exactly once.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use arrow_array::{
    Array, BooleanArray, Decimal128Array, FixedSizeBinaryArray, Float64Array, Int64Array,
    RecordBatch, StringArray,
};
use orca_tests::procs::{bin, pyiceberg, sync_runner, sync_runner_with, text};
use orca_tests::sqlx;
use orca_tests::*;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{json, Value};

fn engine(db: &TestDb, store: &Path, batch_rows: usize) -> Command {
    engine_of("shop", db, store, batch_rows)
}

/// The engine of sync `sync`.
fn engine_of(sync: &str, db: &TestDb, store: &Path, batch_rows: usize) -> Command {
    let mut c = Command::new(bin("orca-engine"));
    c.args(["sync", sync, "--batch-rows", &batch_rows.to_string()])
        .arg("--store")
        .arg(store)
        .env("DATABASE_URL", db.url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The engine, with the Iceberg warehouse at `wh`.
fn into_iceberg(db: &TestDb, store: &Path, batch_rows: usize, wh: &Path) -> Command {
    let mut c = engine(db, store, batch_rows);
    c.env("ORCA_WAREHOUSE", wh);
    c
}

async fn head(db: &TestDb) -> (i64, i32) {
    let r = sqlx::query_as::<_, (i64, i32)>(
        "SELECT head_epoch, generation FROM orca.syncs WHERE name = 'shop'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("sync row");
    r
}

/// Waits until HEAD reaches `epoch`, then SIGKILLs the engine.
async fn kill_at(db: &TestDb, child: Child, epoch: i64) -> i64 {
    let child = std::cell::RefCell::new(child);
    let ended = wait_until(
        &format!("HEAD to reach epoch {epoch}"),
        Duration::from_secs(120),
        || async {
            if let Ok(Some(status)) = child.borrow_mut().try_wait() {
                return Some(Some(status));
            }
            (head(db).await.0 >= epoch).then_some(None)
        },
        String::new,
    )
    .await;
    let mut child = child.into_inner();
    if let Some(status) = ended {
        let out = child.wait_with_output().expect("engine output");
        panic!(
            "the engine ended ({status}) before epoch {epoch}: {}",
            text(&out)
        );
    }
    child.kill().expect("SIGKILL the engine");
    let _ = child.wait();
    head(db).await.0
}

/// Waits until HEAD reaches `epoch`.
async fn wait_head(db: &TestDb, epoch: i64, context: impl Fn() -> String) {
    wait_until(
        &format!("HEAD to reach epoch {epoch}"),
        Duration::from_secs(60),
        || async { (head(db).await.0 >= epoch).then_some(()) },
        context,
    )
    .await
}

/// How many processes run with `needle` in their command line.
fn processes_with(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(needle))
        .count()
}

async fn make_source(db: &TestDb, rows: i64) {
    sqlx::raw_sql(&format!(
        "CREATE TABLE public.orders (
             id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, customer text,
             amount numeric(12,2), qty int, ok boolean, meta jsonb, day date,
             score double precision, tags text[]);
         INSERT INTO public.orders
         SELECT g, '2024-01-01'::timestamptz + (g / 3) * interval '1 second',
                CASE WHEN g % 10 = 0 THEN NULL ELSE 'customer ' || (g % 500) END,
                (g % 100000) / 100.0, g % 1000, g % 3 = 0,
                jsonb_build_object('n', g), '2024-01-01'::date + (g % 365), g / 7.0,
                ARRAY['a', 'b''c']
         FROM generate_series(1, {rows}) g;"
    ))
    .execute(&db.pool)
    .await
    .expect("source table");
}

/// Defines the sync `shop`: the stream `orders` of public.orders (cursor
/// updated_at, key id, and the fields in `stream`, such as its mode) from
/// `source` into `destination`.
async fn define_orders(
    db: &TestDb,
    source: Value,
    destination: Value,
    stream: Value,
    delivery: &str,
) {
    let mut orders = json!({"name": "orders", "table": "public.orders", "cursor": "updated_at",
                            "primary_key": ["id"]});
    if let (Some(o), Some(extra)) = (orders.as_object_mut(), stream.as_object()) {
        o.extend(extra.clone());
    }
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3, NULL, $4)")
        .bind(source)
        .bind(destination)
        .bind(json!([orders]))
        .bind(delivery)
        .execute(&db.pool)
        .await
        .expect("create_sync");
}

async fn define(db: &TestDb, out: &Path) {
    define_orders(
        db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "parquet", "url": out.to_string_lossy()}),
        json!({}),
        "at_least_once",
    )
    .await;
}

/// Every batch of every published Parquet file of a stream.
fn published(out: &Path, stream: &str) -> Vec<RecordBatch> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join(stream))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "parquet"));
    files.sort();
    files
        .iter()
        .flat_map(|p| {
            let f = std::fs::File::open(p).expect("parquet file");
            ParquetRecordBatchReaderBuilder::try_new(f)
                .expect("parquet reader")
                .build()
                .expect("parquet reader")
                .map(|b| b.expect("parquet batch"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// What DuckDB makes of the Parquet files under `folder`
/// (`tests/py/parquet_duckdb.py`): `column`'s type, and the ids of the rows
/// where it equals `value`.
fn parquet_duckdb(folder: &Path, column: &str, value: &str) -> Value {
    let out = Command::new(orca_tests::s3::python())
        .arg(orca_tests::repo_root().join("tests/py/parquet_duckdb.py"))
        .arg(folder)
        .args([column, value])
        .output()
        .expect("run DuckDB (scripts/setup.sh installs it)");
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).expect("DuckDB's JSON")
}

fn column<'a, T: 'static>(b: &'a RecordBatch, name: &str) -> &'a T {
    b.column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_any()
        .downcast_ref::<T>()
        .unwrap_or_else(|| panic!("column {name} has another type"))
}

/// (rows, distinct source ids, distinct _orca_ids, sum of id)
fn tally(batches: &[RecordBatch]) -> (usize, usize, usize, i64) {
    let mut ids = HashSet::new();
    let mut orca_ids = HashSet::new();
    let (mut rows, mut sum) = (0, 0i64);
    for b in batches {
        let id = column::<Int64Array>(b, "id");
        // A new stream's ids are 16 bytes.
        let oid = column::<FixedSizeBinaryArray>(b, "_orca_id");
        for i in 0..b.num_rows() {
            ids.insert(id.value(i));
            orca_ids.insert(oid.value(i).to_vec());
            sum += id.value(i);
        }
        rows += b.num_rows();
    }
    (rows, ids.len(), orca_ids.len(), sum)
}

#[tokio::test]
async fn a_table_lands_in_parquet_exactly_once_across_two_sigkills_then_incrementally() {
    let db = TestDb::new().await;
    let rows = 300_000i64;
    make_source(&db, rows).await;
    let dir = scratch("kills");
    let (out, store) = (dir.join("out"), dir.join("store"));
    define(&db, &out).await;

    // Two attempts killed with SIGKILL mid-sync, the third runs to the end.
    let first = kill_at(&db, engine(&db, &store, 10_000).spawn().expect("engine"), 3).await;
    let second = kill_at(
        &db,
        engine(&db, &store, 10_000).spawn().expect("engine"),
        first + 5,
    )
    .await;
    assert!(
        second > first,
        "the second attempt resumed and committed more"
    );
    let o = engine(&db, &store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["generation"], 3, "{outcome}");
    assert_eq!(outcome["from_epoch"].as_i64(), Some(second), "{outcome}");
    assert_eq!(
        outcome["to_epoch"], 30,
        "300k rows in epochs of 10k: {outcome}"
    );
    // Where its epochs' time went: staging them took some.
    for part in ["waiting_ms", "staging_ms", "committing_ms"] {
        assert!(outcome[part].is_u64(), "{part}: {outcome}");
    }
    assert!(outcome["staging_ms"].as_u64() > Some(0), "{outcome}");

    let batches = published(&out, "orders");
    let (n, ids, orca_ids, sum) = tally(&batches);
    assert_eq!(n, rows as usize, "every row once, no more");
    assert_eq!(ids, rows as usize);
    assert_eq!(orca_ids, rows as usize, "_orca_id is unique per record");
    assert_eq!(sum, rows * (rows + 1) / 2);

    // Values keep their types: a null customer, a decimal, jsonb and an
    // array (read as text).
    let b = &batches[0];
    let id = column::<Int64Array>(b, "id");
    let at = (0..b.num_rows())
        .find(|&i| id.value(i) == 10)
        .expect("row 10");
    assert!(column::<StringArray>(b, "customer").is_null(at));
    assert_eq!(column::<Decimal128Array>(b, "amount").value(at), 10, "0.10");
    assert_eq!(column::<StringArray>(b, "meta").value(at), r#"{"n": 10}"#);
    assert_eq!(column::<StringArray>(b, "tags").value(at), r#"{a,b'c}"#);

    // Another reader finds a row by its id as docs/syncs.md says: DuckDB
    // reads the 16 bytes as a blob (no UUID annotation, which Spark
    // refuses), and row 10 by their hex.
    let id10 = column::<FixedSizeBinaryArray>(b, "_orca_id").value(at);
    let hex: String = id10.iter().map(|b| format!("{b:02x}")).collect();
    let duck = parquet_duckdb(&out, "_orca_id", &hex);
    assert_eq!(duck, json!({"type": "BLOB", "ids": [10]}));

    // The checkpoint log: one record per epoch and attempt, the last one
    // HEAD; each attempt's log; nothing left staged.
    let records = std::fs::read_dir(store.join("default/shop/_checkpoints"))
        .expect("checkpoints")
        .count();
    assert!(records >= 30, "{records} records");
    // (A SIGKILL in the middle of a log's write can leave the store's
    // temporary file beside it: only the logs count.)
    let logs = std::fs::read_dir(store.join("default/shop/_logs"))
        .expect("logs")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
        .count();
    assert_eq!(
        logs, 3,
        "one log per attempt (the killed ones flushed theirs per epoch)"
    );
    let staged = walk(&store.join("default/shop/_staging"));
    assert!(staged.is_empty(), "staged files left: {staged:?}");
    let (epoch, generation) = head(&db).await;
    assert_eq!((epoch, generation), (30, 3));

    // Later rows and an updated row: the next attempt reads only those.
    late_rows_are_read_alone(&db, &store).await;
    let (n, ids, orca_ids, _) = tally(&published(&out, "orders"));
    assert_eq!(n, 300_501);
    assert_eq!(ids, 300_500, "row 7 twice: its old and its new version");
    assert_eq!(orca_ids, 300_501, "each version is its own record");

    // Nothing more to read: an attempt commits no epoch.
    let o = engine(&db, &store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], 0, "{outcome}");
    assert_eq!(head(&db).await.0, 31);
    let _ = std::fs::remove_dir_all(dir);
}

/// 500 later rows and an updated one (id 7): the next attempt reads only
/// those 501.
async fn late_rows_are_read_alone(db: &TestDb, store: &Path) {
    sqlx::raw_sql(
        "INSERT INTO public.orders (id, updated_at, customer)
         SELECT g, '2030-01-01'::timestamptz + g * interval '1 ms', 'late'
         FROM generate_series(300001, 300500) g;
         UPDATE public.orders SET updated_at = '2031-01-01', customer = 'changed' WHERE id = 7;",
    )
    .execute(&db.pool)
    .await
    .expect("more rows");
    let o = engine(db, store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], 501, "{outcome}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(d) = std::fs::read_dir(dir) {
        for e in d.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[tokio::test]
async fn a_newer_claim_fences_a_running_attempt_which_stops_without_committing() {
    let db = TestDb::new().await;
    let rows = 100_000i64;
    make_source(&db, rows).await;
    let dir = scratch("fence");
    let (out, store) = (dir.join("out"), dir.join("store"));
    define(&db, &out).await;

    let child = engine(&db, &store, 2_000).spawn().expect("engine");
    wait_head(&db, 2, String::new).await;
    // Another attempt claims the sync: the running one is a zombie now.
    let claim: Value = sqlx::query_scalar("SELECT orca.claim_sync('shop')")
        .fetch_one(&db.pool)
        .await
        .expect("claim");
    assert_eq!(claim["generation"], 2);
    let o = child.wait_with_output().expect("engine output");
    assert_eq!(o.status.code(), Some(3), "fenced exit status: {}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("fenced"),
        "{}",
        text(&o)
    );
    let (fenced_at, generation) = head(&db).await;
    assert_eq!(generation, 2);
    assert!(fenced_at < 50, "the zombie stopped at its next advance");

    let o = engine(&db, &store, 2_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let (n, ids, _, sum) = tally(&published(&out, "orders"));
    assert_eq!((n, ids), (rows as usize, rows as usize), "exactly once");
    assert_eq!(sum, rows * (rows + 1) / 2);
    assert_eq!(head(&db).await, (50, 3));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_missing_table_or_directory_is_a_clear_error_and_moves_nothing() {
    let db = TestDb::new().await;
    let dir = scratch("bad");
    let (out, store) = (dir.join("out"), dir.join("store"));
    define(&db, &out).await; // public.orders does not exist
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("source table public.orders does not exist"),
        "{err}"
    );
    assert_eq!(head(&db).await.0, 0, "HEAD did not move");
    assert!(walk(&out)
        .iter()
        .all(|p| !p.to_string_lossy().ends_with(".parquet")));

    let missing = dir.join("nowhere");
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3, NULL, 'at_least_once')")
        .bind(json!({"type": "files", "url": missing.to_string_lossy(), "format": "jsonl"}))
        .bind(json!({"type": "parquet", "url": out.to_string_lossy()}))
        .bind(json!([{"name": "events", "pattern": "*.jsonl"}]))
        .execute(&db.pool)
        .await
        .expect("create_sync");
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains(&format!("store {}: no such directory", missing.display())),
        "{}",
        text(&o)
    );
    assert!(!missing.exists(), "a source directory is not made");

    let _ = std::fs::remove_dir_all(dir);
}

fn log_of(store: &Path, generation: i32) -> String {
    std::fs::read_to_string(store.join(format!("default/shop/_logs/g{generation:06}.jsonl")))
        .unwrap_or_default()
}

#[tokio::test]
async fn recovery_applies_a_recorded_epoch_and_rewinds_a_lost_one() {
    let db = TestDb::new().await;
    let rows = 50_000i64;
    make_source(&db, rows).await;
    let dir = scratch("recover");
    let (out, store) = (dir.join("out"), dir.join("store"));
    define(&db, &out).await;

    // A crash at the commit point of epoch 2: HEAD names it, nothing of it
    // is visible, its staged file is there.
    let o = engine(&db, &store, 10_000)
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "2")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(head(&db).await, (2, 1));
    assert!(!out.join("orders/part-0000000002.parquet").exists());
    assert_eq!(
        std::fs::read_to_string(out.join("orders/_orca_epoch")).expect("marker"),
        "1"
    );

    // The next attempt applies epoch 2 from its staged file, goes on, and
    // crashes at epoch 4's commit point in turn.
    let o = engine(&db, &store, 10_000)
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "4")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        log_of(&store, 2).contains("apply epoch 2 to orders, then resume"),
        "{}",
        log_of(&store, 2)
    );
    assert!(out.join("orders/part-0000000002.parquet").exists());
    assert_eq!(head(&db).await, (4, 2));

    // Epoch 4's staged file is lost: nothing of it is visible, so the next
    // attempt rewinds HEAD to epoch 3 and reads epoch 4 again.
    std::fs::remove_dir_all(store.join("default/shop/_staging")).expect("lose the staging");
    let o = engine(&db, &store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["recovery"], "rewind to epoch 3", "{outcome}");
    assert_eq!(outcome["from_epoch"], 3, "{outcome}");
    assert_eq!(outcome["to_epoch"], 5, "{outcome}");
    let rewound = db
        .strings("SELECT data->>'lost_epoch' FROM orca.events WHERE kind = 'sync.rewound'")
        .await;
    assert_eq!(rewound, ["4"]);

    let (n, ids, _, sum) = tally(&published(&out, "orders"));
    assert_eq!((n, ids), (rows as usize, rows as usize), "exactly once");
    assert_eq!(sum, rows * (rows + 1) / 2);
    let _ = std::fs::remove_dir_all(dir);
}

/// The issue's end-to-end case: 1M rows (`ORCA_E2E_ROWS` for another size)
/// into an Iceberg table, exactly once by the sync's own requirement, with
/// the engine killed twice mid-sync; PyIceberg reads every row once.
#[tokio::test]
async fn a_million_rows_land_in_iceberg_exactly_once_across_two_sigkills() {
    let db = TestDb::new().await;
    let rows: i64 = std::env::var("ORCA_E2E_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let batch = (rows / 20).max(1) as usize;
    make_source(&db, rows).await;
    let dir = scratch("iceberg");
    let (wh, store) = (dir.join("wh"), dir.join("store"));
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "postgres", "url": db.url()}))
        .bind(json!({"type": "iceberg", "namespace": "raw"}))
        .bind(
            json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                      "primary_key": ["id"]}]),
        )
        .execute(&db.pool)
        .await
        .expect("an exactly-once sync into Iceberg");
    let run = || into_iceberg(&db, &store, batch, &wh);
    let first = kill_at(&db, run().spawn().expect("engine"), 3).await;
    let second = kill_at(&db, run().spawn().expect("engine"), first + 5).await;
    assert!(second > first);
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let expected_epochs = (rows as usize).div_ceil(batch) as i64;
    assert_eq!(head(&db).await, (expected_epochs, 3));

    let wh_s = wh.to_string_lossy();
    let stats = pyiceberg(&["stats", &db.url(), &wh_s, "raw.orders", "id"]);
    assert_eq!(stats["rows"], rows, "every row once: {}", stats["rows"]);
    assert_eq!(stats["distinct"], rows);
    assert_eq!(stats["sum"], rows * (rows + 1) / 2);
    // One snapshot per epoch, each with its stream marker, none twice.
    let mut epochs: Vec<i64> = stats["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .filter(|s| s["orca.sync"] == "shop")
        .map(|s| {
            assert_eq!(s["orca.sync.stream"], "orders");
            s["orca.sync.epoch"]
                .as_str()
                .and_then(|e| e.parse().ok())
                .expect("epoch marker")
        })
        .collect();
    epochs.sort_unstable();
    assert_eq!(epochs, (1..=expected_epochs).collect::<Vec<_>>());
    // The marker and the fence as table properties, which snapshot expiry
    // does not take away.
    assert_eq!(
        stats["properties"]["orca.sync.shop.epoch"],
        expected_epochs.to_string()
    );
    assert_eq!(stats["properties"]["orca.sync.shop.fence"], "3");
    let columns: Vec<&str> = stats["schema"]
        .as_array()
        .expect("schema")
        .iter()
        .filter_map(|f| f[0].as_str())
        .collect();
    assert!(
        columns.ends_with(&["_orca_id", "_orca_seq", "_orca_synced_at"]),
        "{columns:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_key_that_is_not_unique_is_refused_before_anything_moves() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE TABLE public.orders (id bigint, updated_at timestamptz NOT NULL);
         INSERT INTO public.orders SELECT g % 10, now() FROM generate_series(1, 100) g;",
    )
    .execute(&db.pool)
    .await
    .expect("a table without a key");
    let dir = scratch("unique");
    let (out, store) = (dir.join("out"), dir.join("store"));
    define(&db, &out).await;
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "stream orders: (id) is neither the primary key nor a unique key of public.orders"
        ),
        "{err}"
    );
    assert_eq!(head(&db).await.0, 0);
    // With a unique key it goes through.
    sqlx::raw_sql(
        "TRUNCATE public.orders; ALTER TABLE public.orders ADD PRIMARY KEY (id);
                   INSERT INTO public.orders SELECT g, now() FROM generate_series(1, 100) g;",
    )
    .execute(&db.pool)
    .await
    .expect("a key");
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(tally(&published(&out, "orders")).0, 100);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn delivery_levels_are_checked_again_before_an_attempt() {
    let db = TestDb::new().await;
    make_source(&db, 10).await;
    let dir = scratch("delivery");
    let (out, store) = (dir.join("out"), dir.join("store"));
    define(&db, &out).await;
    // A definition stored by something other than create_sync (an older
    // control plane, a hand edit) that asks more than the sync can keep.
    sqlx::query(
        "UPDATE orca.syncs SET definition = jsonb_set(definition, '{delivery}', '\"exactly_once\"')",
    )
    .execute(&db.pool)
    .await
    .expect("edit the definition");
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("stream 'orders' cannot be delivered exactly_once"),
        "{err}"
    );
    assert_eq!(head(&db).await.0, 0);
    assert!(walk(&out).is_empty(), "nothing written");
    let _ = std::fs::remove_dir_all(dir);
}

async fn run_status(db: &TestDb, run: i64) -> String {
    sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("run status")
}

async fn wait_run(db: &TestDb, run: i64, want: &str, runner: &orca_tests::procs::Runner) {
    wait_until(
        &format!("run {run} to be {want}"),
        Duration::from_secs(120),
        || async {
            let s = run_status(db, run).await;
            assert!(
                s == want || s != "failed",
                "run {run} failed, waited for {want}\n{}",
                runner.output()
            );
            (s == want).then_some(())
        },
        || runner.output(),
    )
    .await
}

/// Syncs as runs: a runner leases the sync's run and starts orca-engine for
/// it; a cancelled run stops its engine mid-sync; the next run resumes.
#[tokio::test]
async fn a_runner_runs_a_sync_and_a_cancelled_run_stops_its_engine_mid_sync() {
    let db = TestDb::new().await;
    let rows = 400_000i64;
    make_source(&db, rows).await;
    let dir = scratch("runner");
    let (out, store, logs) = (dir.join("out"), dir.join("store"), dir.join("logs"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url(), "batch_rows": 2000}),
        json!({"type": "parquet", "url": out.to_string_lossy()}),
        json!({}),
        "at_least_once",
    )
    .await;
    // Short leases: heartbeats every ~300 ms, so a cancel stops the engine
    // within a few epochs.
    sqlx::raw_sql(&format!(
        "ALTER DATABASE \"{}\" SET orca.lease_seconds = 1",
        db.name
    ))
    .execute(&db.pool)
    .await
    .expect("lease seconds");
    let runner = sync_runner(&db, &store, &logs);

    let first: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run now");
    wait_head(&db, 3, || runner.output()).await;
    sqlx::query("SELECT orca.cancel($1)")
        .bind(first)
        .execute(&db.pool)
        .await
        .expect("cancel");
    // The runner's next heartbeat is refused; it asks the engine to stop,
    // which finishes its epoch in flight and exits ("done" in its log).
    let first_log_path = logs.join(format!("default/shop/run-{first}/attempt-1.log"));
    let first_log = wait_until(
        "the engine to stop after its run was cancelled",
        Duration::from_secs(30),
        || async {
            let log = std::fs::read_to_string(&first_log_path).unwrap_or_default();
            log.contains(r#""event":"done""#).then_some(log)
        },
        || runner.output(),
    )
    .await;
    let stopped_at = head(&db).await.0;
    assert!(
        stopped_at < 100,
        "cancelled mid-sync, at epoch {stopped_at}"
    );
    assert_eq!(run_status(&db, first).await, "cancelled");
    assert!(
        first_log.contains(r#""event":"stopped""#) && first_log.contains(r#""stopped":true"#),
        "the runner asked the engine to stop: {first_log}\n{}",
        runner.output()
    );
    // The runner says so after the engine's log has its "done": wait for it.
    wait_until(
        "the runner to see the engine stop at a resume point",
        Duration::from_secs(30),
        || async {
            runner
                .output()
                .contains("the engine stopped at a resume point")
                .then_some(())
        },
        || runner.output(),
    )
    .await;
    // The runner follows the engine's progress on the control channel.
    assert!(first_log.contains("runner: engine at epoch"), "{first_log}");
    let (n, _, _, _) = tally(&published(&out, "orders"));
    assert_eq!(
        n,
        (stopped_at * 2_000) as usize,
        "all HEAD names is visible"
    );

    let second: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run now");
    wait_run(&db, second, "succeeded", &runner).await;
    assert_eq!(head(&db).await.0, 200, "400k rows in epochs of 2000");
    let (n, ids, _, sum) = tally(&published(&out, "orders"));
    assert_eq!((n, ids), (rows as usize, rows as usize), "exactly once");
    assert_eq!(sum, rows * (rows + 1) / 2);
    // The engine's output is the attempt's log, as for any pipeline.
    let log =
        std::fs::read_to_string(logs.join(format!("default/shop/run-{second}/attempt-1.log")))
            .expect("attempt log");
    assert!(log.contains(r#""event":"done""#), "{log}");
    assert!(log.contains(&format!(r#""run":"{second}""#)), "{log}");
    // The runner hosted the source: its pump read the rows after HEAD and
    // sent them to the engine over the data edge.
    assert!(log.contains(r#""event":"edge""#), "{log}");
    let pumped = format!(
        "runner: source pump sent {} rows in {} chunks of 1 streams",
        rows - stopped_at * 2_000,
        200 - stopped_at
    );
    assert!(log.contains(&pumped), "{pumped}\n{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Each published file's lane (`part-N.parquet` is lane 0's, `part-N-k`
/// lane k's) and the ids in it.
fn ids_by_lane(out: &Path) -> Vec<(usize, Vec<i64>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join("orders"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "parquet"));
    files
        .iter()
        .map(|p| {
            let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            let lane = stem
                .split('-')
                .nth(2)
                .map_or(0, |k| k.parse().expect("lane"));
            let f = std::fs::File::open(p).expect("parquet file");
            let ids = ParquetRecordBatchReaderBuilder::try_new(f)
                .expect("parquet reader")
                .build()
                .expect("parquet reader")
                .flat_map(|b| {
                    let b = b.expect("batch");
                    column::<Int64Array>(&b, "id").values().to_vec()
                })
                .collect();
            (lane, ids)
        })
        .collect()
}

/// Writer lanes: a sync into Parquet through 4 lanes stages one file per
/// lane and epoch, is exactly once across a SIGKILL, and keeps every version
/// of a key in the same lane; a merge into Postgres through 3 lanes ends
/// equal to the source.
#[tokio::test]
async fn writer_lanes_split_rows_by_key_and_stay_exactly_once_across_a_sigkill() {
    let db = TestDb::new().await;
    let rows = 100_000i64;
    make_source(&db, rows).await;
    let dir = scratch("lanes");
    let (out, store) = (dir.join("out"), dir.join("store"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "parquet", "url": out.to_string_lossy(), "lanes": 4}),
        json!({}),
        "at_least_once",
    )
    .await;
    kill_at(&db, engine(&db, &store, 5_000).spawn().expect("engine"), 3).await;
    let o = engine(&db, &store, 5_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["to_epoch"], 20, "{outcome}");
    let (n, ids, _, sum) = tally(&published(&out, "orders"));
    assert_eq!((n, ids), (rows as usize, rows as usize), "exactly once");
    assert_eq!(sum, rows * (rows + 1) / 2);
    let lanes: HashSet<usize> = ids_by_lane(&out).iter().map(|(l, _)| *l).collect();
    assert_eq!(
        lanes,
        HashSet::from([0, 1, 2, 3]),
        "every lane staged files"
    );
    for (lane, ids) in ids_by_lane(&out) {
        // 5 000 rows an epoch over 4 lanes by key hash: none gets them all.
        assert!(
            ids.len() < 2_500,
            "lane {lane} got {} rows of an epoch",
            ids.len()
        );
    }

    // New versions of 1 000 keys land in the lane of their first version.
    sqlx::query(
        "UPDATE public.orders SET qty = qty + 1, updated_at = '2030-01-01' WHERE id % 100 = 0",
    )
    .execute(&db.pool)
    .await
    .expect("update");
    let o = engine(&db, &store, 5_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let mut lane_of: std::collections::HashMap<i64, HashSet<usize>> = Default::default();
    let mut total = 0;
    for (lane, ids) in ids_by_lane(&out) {
        total += ids.len();
        for id in ids {
            lane_of.entry(id).or_default().insert(lane);
        }
    }
    assert_eq!(total, rows as usize + 1_000, "the updated rows again");
    assert!(
        lane_of.values().all(|l| l.len() == 1),
        "a key's versions are all in one lane"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // A merge into Postgres through 3 lanes, after a SIGKILL and updates.
    let db = TestDb::new().await;
    make_source(&db, 30_000).await;
    let store = scratch("lanes-pg");
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "postgres", "url": db.url(), "schema": "raw", "lanes": 3}),
        json!({"mode": "merge"}),
        "effectively_once",
    )
    .await;
    kill_at(&db, engine(&db, &store, 2_000).spawn().expect("engine"), 2).await;
    sqlx::query(
        "UPDATE public.orders SET customer = 'changed', updated_at = '2030-01-01' WHERE id % 7 = 0",
    )
    .execute(&db.pool)
    .await
    .expect("update");
    let o = engine(&db, &store, 2_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(differences(&db).await, 0, "raw.orders equals the source");
    let _ = std::fs::remove_dir_all(store);
}

/// A runner shutting down (SIGTERM, then its 5 s grace) asks its engine to
/// stop: the epoch in flight commits, the attempt is handed back, and what
/// HEAD names is all visible.
#[tokio::test]
async fn a_runner_shutting_down_stops_its_engine_at_a_resume_point_and_hands_the_run_back() {
    let db = TestDb::new().await;
    make_source(&db, 400_000).await;
    let dir = scratch("runner-term");
    let (out, store, logs) = (dir.join("out"), dir.join("store"), dir.join("logs"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url(), "batch_rows": 500}),
        json!({"type": "parquet", "url": out.to_string_lossy()}),
        json!({}),
        "at_least_once",
    )
    .await;
    let mut runner = sync_runner(&db, &store, &logs);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run now");
    wait_head(&db, 3, || runner.output()).await;
    let status = runner.terminate().expect("runner exit status");
    assert!(status.success(), "{}", runner.output());
    let output = runner.output();
    assert!(
        output.contains("the engine stopped at a resume point") && output.contains("handed back"),
        "{output}"
    );
    let stopped_at = head(&db).await.0;
    assert!(
        (3..800).contains(&stopped_at),
        "stopped mid-sync at epoch {stopped_at}\n{output}"
    );
    let (n, ids, _, _) = tally(&published(&out, "orders"));
    assert_eq!(
        (n, ids),
        ((stopped_at * 500) as usize, (stopped_at * 500) as usize)
    );
    let attempts: Vec<String> = sqlx::query_scalar(
        "SELECT number || ' ' || status FROM orca.attempts WHERE run_id = $1 ORDER BY number",
    )
    .bind(run)
    .fetch_all(&db.pool)
    .await
    .expect("attempts");
    assert_eq!(attempts[0], "1 released", "{attempts:?}");
    let log = std::fs::read_to_string(logs.join(format!("default/shop/run-{run}/attempt-1.log")))
        .expect("attempt log");
    assert!(log.contains(r#""stopped":true"#), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A runner that dies (SIGKILL, its engine left running) takes its source
/// pump with it: the engine finds the data edge closed, fails the attempt
/// with that reason and exits instead of going on unwatched; what HEAD names
/// stays visible, nothing after it.
#[tokio::test]
async fn an_engine_whose_runner_died_stops_when_its_data_edge_closes() {
    let db = TestDb::new().await;
    make_source(&db, 400_000).await;
    let dir = scratch("runner-dies");
    let (out, store, logs) = (dir.join("out"), dir.join("store"), dir.join("logs"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url(), "batch_rows": 500}),
        json!({"type": "parquet", "url": out.to_string_lossy()}),
        json!({}),
        "at_least_once",
    )
    .await;
    let mut runner = sync_runner(&db, &store, &logs);
    sqlx::query("SELECT orca.run('shop', 'now')")
        .execute(&db.pool)
        .await
        .expect("run now");
    wait_head(&db, 3, || runner.output()).await;
    // The runner alone: its engine lives on, orphaned.
    let status = Command::new("kill")
        .args(["-KILL", &runner.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let log = wait_until(
        "the orphaned engine to fail",
        Duration::from_secs(30),
        || async {
            let log = log_of(&store, 1);
            log.contains(r#""event":"failed""#).then_some(log)
        },
        || log_of(&store, 1),
    )
    .await;
    assert!(
        log.contains("the runner's source pump closed the edge before the stream ended"),
        "{log}"
    );
    // The engine exits (its command line names its runner's socket
    // directory); HEAD is where it stopped.
    let sockets = format!("orca-runner-{}", runner.pid());
    wait_until(
        "the orphaned engine to exit",
        Duration::from_secs(30),
        || async { (processes_with(&sockets) == 0).then_some(()) },
        String::new,
    )
    .await;
    let stopped_at = head(&db).await.0;
    assert!(stopped_at < 800, "stopped mid-sync, at epoch {stopped_at}");
    let (n, ids, _, _) = tally(&published(&out, "orders"));
    assert_eq!(
        (n, ids),
        ((stopped_at * 500) as usize, (stopped_at * 500) as usize)
    );
    runner.kill();
    let _ = std::fs::remove_dir_all(dir);
}

/// A runner hosts the source, so it also looks the tables up in the
/// source's catalog for the engine: a missing table fails the attempt with
/// the catalog's word, through the runner, before anything moves.
#[tokio::test]
async fn a_runner_describes_the_source_for_its_engine_and_a_missing_table_fails_the_attempt() {
    let db = TestDb::new().await;
    let dir = scratch("runner-describe");
    let (out, store, logs) = (dir.join("out"), dir.join("store"), dir.join("logs"));
    define(&db, &out).await; // public.orders does not exist
    let runner = sync_runner(&db, &store, &logs);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run now");
    let error = wait_until(
        "an attempt to fail",
        Duration::from_secs(60),
        || async {
            sqlx::query_scalar::<_, Option<String>>(
                "SELECT error FROM orca.attempts WHERE run_id = $1 AND error IS NOT NULL ORDER BY number LIMIT 1",
            )
            .bind(run)
            .fetch_optional(&db.pool)
            .await
            .expect("attempts")
            .flatten()
        },
        || runner.output(),
    )
    .await;
    assert!(
        error.contains("the runner's source")
            && error.contains("source table public.orders does not exist"),
        "{error}"
    );
    assert_eq!(head(&db).await.0, 0, "HEAD did not move");
    assert!(walk(&out)
        .iter()
        .all(|p| !p.to_string_lossy().ends_with(".parquet")));
    let _ = std::fs::remove_dir_all(dir);
}

/// One request on an engine's control channel; the answer's JSON.
fn control_call(socket: &Path, request: &str) -> Value {
    use std::io::{BufRead, Write};
    let mut conn = std::os::unix::net::UnixStream::connect(socket).expect("connect to the engine");
    writeln!(conn, "{request}").expect("send");
    let mut line = String::new();
    std::io::BufReader::new(conn)
        .read_line(&mut line)
        .expect("answer");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

/// The control channel: hello, status while the engine streams, a clear
/// error for a bad request, and a stop that ends the attempt at a resume
/// point with its epoch committed; the next attempt has nothing to recover
/// and every row lands once.
#[tokio::test]
async fn the_control_channel_reports_progress_and_a_stop_ends_the_attempt_at_a_resume_point() {
    let db = TestDb::new().await;
    let rows = 120_000i64;
    make_source(&db, rows).await;
    let dir = scratch("control");
    let (out, store, socket) = (dir.join("out"), dir.join("store"), dir.join("e.sock"));
    define(&db, &out).await;
    let child = engine(&db, &store, 2_000)
        .arg("--control")
        .arg(&socket)
        .spawn()
        .expect("engine");
    wait_until(
        "the control socket",
        Duration::from_secs(30),
        || async { socket.exists().then_some(()) },
        String::new,
    )
    .await;
    let hello = control_call(&socket, r#"{"id": 1, "method": "hello"}"#);
    assert_eq!(hello["ok"], true, "{hello}");
    assert_eq!(hello["result"]["protocol"], 1, "{hello}");
    assert_eq!(hello["result"]["sync"], "shop", "{hello}");
    assert_eq!(hello["result"]["pid"], child.id(), "{hello}");

    let status = wait_until(
        "three epochs on the control channel",
        Duration::from_secs(60),
        || async {
            let s = control_call(&socket, r#"{"id": 2, "method": "status"}"#);
            (s["result"]["committed"].as_u64().unwrap_or(0) >= 3).then_some(s)
        },
        || control_call(&socket, r#"{"id": 3, "method": "status"}"#).to_string(),
    )
    .await;
    let st = &status["result"];
    assert_eq!(st["phase"], "streaming", "{status}");
    assert_eq!(st["generation"], 1, "{status}");
    assert!(st["head"].as_u64() >= st["committed"].as_u64(), "{status}");
    let committed = st["committed"].as_u64().unwrap_or(0);
    assert_eq!(
        st["streams"]["orders"]["rows"].as_u64(),
        Some(committed * 2_000),
        "{status}"
    );
    assert!(st["rows"].as_u64() >= Some(committed * 2_000), "{status}");

    let bad = control_call(&socket, r#"{"id": 3, "method": "rewind"}"#);
    assert_eq!(
        (bad["ok"].clone(), bad["id"].clone()),
        (json!(false), json!(3)),
        "{bad}"
    );
    assert!(
        bad["error"]
            .as_str()
            .unwrap_or_default()
            .contains("\"rewind\""),
        "{bad}"
    );
    let bad = control_call(&socket, "stop please");
    assert!(
        bad["error"].as_str().unwrap_or_default().contains("JSON"),
        "{bad}"
    );

    let stop = control_call(&socket, r#"{"id": 4, "method": "stop"}"#);
    assert_eq!(stop["result"]["stopping"], true, "{stop}");
    let exiting = std::cell::RefCell::new(child);
    let status = wait_until(
        "the engine to stop",
        Duration::from_secs(30),
        || async { exiting.borrow_mut().try_wait().expect("engine status") },
        String::new,
    )
    .await;
    let child = exiting.into_inner();
    let o = child.wait_with_output().expect("engine output");
    assert!(status.success(), "a stop is a clean exit: {}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["stopped"], true, "{outcome}");
    let stopped_at = outcome["to_epoch"].as_i64().unwrap_or(0);
    assert!(
        (committed as i64..60).contains(&stopped_at),
        "stopped mid-sync at {stopped_at}: {outcome}"
    );
    assert_eq!(head(&db).await.0, stopped_at, "HEAD is where it stopped");
    assert!(!socket.exists(), "the engine removes its socket");
    // Everything HEAD names is visible: the stop waited for the commit.
    let (n, ids, _, _) = tally(&published(&out, "orders"));
    assert_eq!(
        (n, ids),
        ((stopped_at * 2_000) as usize, (stopped_at * 2_000) as usize)
    );
    let log = log_of(&store, 1);
    assert!(log.contains(r#""event":"stopped""#), "{log}");

    let o = engine(&db, &store, 2_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(
        outcome["recovery"],
        format!("resume from epoch {stopped_at}"),
        "nothing to recover: {outcome}"
    );
    assert_eq!(outcome["stopped"], false, "{outcome}");
    assert_eq!(outcome["to_epoch"], 60, "{outcome}");
    let (n, ids, _, sum) = tally(&published(&out, "orders"));
    assert_eq!((n, ids), (rows as usize, rows as usize), "exactly once");
    assert_eq!(sum, rows * (rows + 1) / 2);
    let _ = std::fs::remove_dir_all(dir);
}

fn all_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = walk(dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

async fn define_files(db: &TestDb, input: &Path, format: &str, pattern: &str, out: &Path) {
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "files", "url": input.to_string_lossy(), "format": format}))
        .bind(json!({"type": "parquet", "url": out.to_string_lossy()}))
        .bind(json!([{"name": "events", "pattern": pattern}]))
        .execute(&db.pool)
        .await
        .expect("an exactly-once sync of files");
}

#[tokio::test]
async fn json_lines_sync_exactly_once_widening_their_schema_and_quarantining_bad_lines() {
    let db = TestDb::new().await;
    let dir = scratch("jsonl");
    let (input, out, store) = (dir.join("in"), dir.join("out"), dir.join("store"));
    std::fs::create_dir_all(input.join("events")).expect("input dir");
    let mut day1: String = (1..=10_000)
        .map(|i| format!("{{\"id\": {i}, \"amount\": {i}, \"name\": \"n{i}\"}}\n"))
        .collect();
    day1.push_str("not json at all\n[1, 2]\n{\"id\": 0, \"_orca_id\": \"forged\"}\n");
    let mut day2: String = (10_001..=20_000)
        .map(|i| format!("{{\"id\": {i}, \"amount\": {i}.5}}\n"))
        .collect();
    day2.push_str("{\"id\": 20001, \"extra\": true}\n");
    std::fs::write(input.join("events/2024-01-01.jsonl"), day1).expect("day 1");
    std::fs::write(input.join("events/2024-01-02.jsonl"), day2).expect("day 2");
    std::fs::write(input.join("events/notes.txt"), "not a stream file").expect("other file");
    define_files(&db, &input, "jsonl", "events/*.jsonl", &out).await;

    // A crash at the commit point of epoch 2, then an attempt to the end.
    let o = engine(&db, &store, 3_000)
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "2")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    let o = engine(&db, &store, 3_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["recovery"], "apply epoch 2 to events, then resume");

    let batches = published(&out, "events");
    let (n, ids, orca_ids, sum) = tally(&batches);
    assert_eq!(
        (n, ids, orca_ids),
        (20_001, 20_001, 20_001),
        "every good line once"
    );
    assert_eq!(sum, 20_001 * 20_002 / 2);
    // The schema only widened: amount was int64, became float64; extra joined.
    let last = batches.last().expect("a batch");
    let amount = last
        .schema()
        .field_with_name("amount")
        .expect("amount")
        .data_type()
        .clone();
    assert_eq!(amount, arrow_schema::DataType::Float64);
    assert!(last.schema().field_with_name("extra").is_ok());
    assert!(
        last.schema().field_with_name("name").is_ok(),
        "never dropped"
    );

    // The three bad lines, set aside once each with a reason.
    let q = jsonl_records(&store.join("default/shop/_quarantine"));
    let reasons: Vec<&str> = q.iter().filter_map(|r| r["reason"].as_str()).collect();
    assert_eq!(reasons.len(), 3, "{q:?}");
    assert!(reasons[0].starts_with("not JSON"), "{reasons:?}");
    assert!(reasons[1].contains("must be an object"), "{reasons:?}");
    assert!(reasons[2].contains("reserved prefix"), "{reasons:?}");
    assert!(q[0]["position"]
        .as_str()
        .is_some_and(|p| p.starts_with("events/2024-01-01.jsonl@")));

    // A new file: the next attempt reads only it.
    std::fs::write(
        input.join("events/2024-01-03.jsonl"),
        "{\"id\": 20002}\n{\"id\": 20003}\n",
    )
    .expect("day 3");
    let o = engine(&db, &store, 3_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], 2, "{outcome}");
    assert_eq!(tally(&published(&out, "events")).1, 20_003);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn csv_files_resume_after_a_sigkill_by_file_and_offset() {
    let db = TestDb::new().await;
    let dir = scratch("csv");
    let (input, out, store) = (dir.join("in"), dir.join("out"), dir.join("store"));
    std::fs::create_dir_all(&input).expect("input dir");
    for f in 0..4 {
        let body: String = std::iter::once("id,city,note\n".to_string())
            .chain((0..50_000).map(|i| {
                let id = f * 50_000 + i + 1;
                format!("{id},\"city, {}\",\n", id % 7)
            }))
            .collect();
        std::fs::write(input.join(format!("part-{f}.csv")), body).expect("csv");
    }
    define_files(&db, &input, "csv", "part-*.csv", &out).await;
    let first = kill_at(&db, engine(&db, &store, 5_000).spawn().expect("engine"), 3).await;
    assert!(first < 40, "killed mid-sync at epoch {first}");
    let o = engine(&db, &store, 5_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));

    let batches = published(&out, "events");
    let mut ids = HashSet::new();
    let mut rows = 0;
    for b in &batches {
        let id = column::<StringArray>(b, "id");
        let city = column::<StringArray>(b, "city");
        let note = column::<StringArray>(b, "note");
        for i in 0..b.num_rows() {
            ids.insert(id.value(i).to_string());
            assert!(city.value(i).starts_with("city, "));
            assert!(note.is_null(i), "an empty field is null");
        }
        rows += b.num_rows();
    }
    assert_eq!((rows, ids.len()), (200_000, 200_000), "every row once");
    assert_eq!(head(&db).await.0, 40);
    let _ = std::fs::remove_dir_all(dir);
}

async fn define_typed_csv(db: &TestDb, input: &Path, out: &Path, columns: Value) {
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "files", "url": input.to_string_lossy(), "format": "csv"}))
        .bind(json!({"type": "parquet", "url": out.to_string_lossy()}))
        .bind(json!([{"name": "events", "pattern": "*.csv", "columns": columns}]))
        .execute(&db.pool)
        .await
        .expect("a files sync with declared columns");
}

#[tokio::test]
async fn declared_column_types_coerce_csv_values_and_quarantine_those_that_do_not_fit() {
    let db = TestDb::new().await;
    let dir = scratch("declared");
    let (input, out, store) = (dir.join("in"), dir.join("out"), dir.join("store"));
    std::fs::create_dir_all(&input).expect("input dir");
    std::fs::write(
        input.join("a.csv"),
        "id,amount,paid,note\n1,10.5,true,first\n2,7,f,\n3,x,true,bad amount\n4,3,maybe,bad paid\n",
    )
    .expect("csv");
    // A type the engine does not know is refused when the sync is defined.
    let e = sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "files", "url": input.to_string_lossy(), "format": "csv"}))
        .bind(json!({"type": "parquet", "url": out.to_string_lossy()}))
        .bind(json!([{"name": "events", "pattern": "*.csv", "columns": {"amount": "decimal"}}]))
        .execute(&db.pool)
        .await
        .expect_err("an unknown type");
    assert!(
        e.to_string().contains("streams[0].columns.amount")
            && e.to_string().contains("\"decimal\" is not a column type"),
        "{e}"
    );
    define_typed_csv(
        &db,
        &input,
        &out,
        json!({"id": "int64", "amount": "float64", "paid": "boolean"}),
    )
    .await;
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));

    // CSV values are text; the declared columns land typed, the rest
    // (note) inferred as text.
    let batches = published(&out, "events");
    assert_eq!(batches.len(), 1, "one epoch, one file");
    let b = &batches[0];
    let ty = |n: &str| {
        b.schema()
            .field_with_name(n)
            .map(|f| f.data_type().clone())
            .ok()
    };
    use arrow_schema::DataType;
    assert_eq!(
        (ty("id"), ty("amount"), ty("paid"), ty("note")),
        (
            Some(DataType::Int64),
            Some(DataType::Float64),
            Some(DataType::Boolean),
            Some(DataType::Utf8)
        )
    );
    assert_eq!(column::<Int64Array>(b, "id").values().to_vec(), [1, 2]);
    assert_eq!(
        column::<Float64Array>(b, "amount").values().to_vec(),
        [10.5, 7.0]
    );
    let paid = column::<BooleanArray>(b, "paid");
    assert_eq!((paid.value(0), paid.value(1)), (true, false));
    assert!(
        column::<StringArray>(b, "note").is_null(1),
        "an empty field is null"
    );

    // The rows whose values do not fit, set aside with the reason.
    let q = jsonl_records(&store.join("default/shop/_quarantine"));
    let reasons: Vec<&str> = q.iter().filter_map(|r| r["reason"].as_str()).collect();
    assert_eq!(
        reasons,
        [
            "column amount: \"x\" is not a number",
            "column paid: \"maybe\" is not a boolean"
        ],
        "{q:?}"
    );

    // A declaration may not narrow what the stream delivered: note went out
    // as text; declared int64 stops the next attempt before anything moves.
    std::fs::write(input.join("b.csv"), "id,amount,paid,note\n5,1,t,5\n").expect("csv");
    define_typed_csv(&db, &input, &out, json!({"id": "int64", "note": "int64"})).await;
    let before = head(&db).await.0;
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o)
            .contains("stream events: column note was delivered as string and is declared int64"),
        "{}",
        text(&o)
    );
    assert_eq!(head(&db).await.0, before, "nothing moved");
    // Declared as text again, the file lands.
    define_typed_csv(&db, &input, &out, json!({"id": "int64", "note": "string"})).await;
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(tally(&published(&out, "events")).0, 3);
    let _ = std::fs::remove_dir_all(dir);
}

async fn define_pg(db: &TestDb, mode: &str, delivery: &str) {
    define_orders(
        db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "postgres", "url": db.url(), "schema": "raw"}),
        json!({"mode": mode}),
        delivery,
    )
    .await;
}

/// Rows of raw.orders that differ from public.orders (either side missing,
/// or a value not the same).
async fn differences(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM public.orders o FULL JOIN raw.orders r USING (id)
         WHERE o.id IS NULL OR r.id IS NULL
            OR (o.updated_at, o.customer, o.amount, o.qty, o.ok, o.meta::text, o.day, o.score, o.tags::text)
               IS DISTINCT FROM
               (r.updated_at, r.customer, r.amount, r.qty, r.ok, r.meta, r.day, r.score, r.tags)",
    )
    .await
}

#[tokio::test]
async fn a_merge_into_postgres_ends_equal_to_the_source_across_sigkills_and_updates() {
    let db = TestDb::new().await;
    let rows = 100_000i64;
    make_source(&db, rows).await;
    let dir = scratch("pgmerge");
    let store = dir.join("store");
    define_pg(&db, "merge", "effectively_once").await;

    let first = kill_at(&db, engine(&db, &store, 5_000).spawn().expect("engine"), 3).await;
    kill_at(
        &db,
        engine(&db, &store, 5_000).spawn().expect("engine"),
        first + 4,
    )
    .await;
    let o = engine(&db, &store, 5_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(db.scalar_i64("SELECT count(*) FROM raw.orders").await, rows);
    assert_eq!(
        differences(&db).await,
        0,
        "the destination equals the source"
    );
    let markers = db
        .strings("SELECT stream || ' ' || epoch FROM raw._orca_markers WHERE sync = 'shop'")
        .await;
    assert_eq!(markers, ["orders 20"]);

    // Updates read again as newer versions replace the old rows by key.
    sqlx::raw_sql(
        "UPDATE public.orders SET amount = amount + 1, updated_at = '2031-01-01'::timestamptz + id * interval '1 ms'
         WHERE id % 100 = 0",
    )
    .execute(&db.pool)
    .await
    .expect("updates");
    let o = engine(&db, &store, 5_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], 1000, "{outcome}");
    assert_eq!(db.scalar_i64("SELECT count(*) FROM raw.orders").await, rows);
    assert_eq!(differences(&db).await, 0, "updated in place");

    // An older version delivered again changes nothing: _orca_seq guards it.
    let before = db
        .scalar_i64("SELECT (amount * 100)::bigint FROM raw.orders WHERE id = 100")
        .await;
    sqlx::raw_sql(
        "INSERT INTO raw.orders (id, updated_at, amount, _orca_id, _orca_seq, _orca_synced_at)
         VALUES (100, '2024-01-01', 0, gen_random_uuid(), 1, now())
         ON CONFLICT (id) DO UPDATE SET amount = excluded.amount
         WHERE raw.orders._orca_seq < excluded._orca_seq",
    )
    .execute(&db.pool)
    .await
    .expect("a stale replay");
    assert_eq!(
        db.scalar_i64("SELECT (amount * 100)::bigint FROM raw.orders WHERE id = 100")
            .await,
        before
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn an_append_into_postgres_is_exactly_once_through_a_crash_at_the_commit_point() {
    let db = TestDb::new().await;
    let rows = 50_000i64;
    make_source(&db, rows).await;
    let dir = scratch("pgappend");
    let store = dir.join("store");
    define_pg(&db, "append", "exactly_once").await;

    let o = engine(&db, &store, 10_000)
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "3")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    // HEAD names epoch 3; the destination has epochs 1 and 2, in the same
    // transactions as their marker.
    assert_eq!(head(&db).await.0, 3);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.orders").await,
        20_000
    );
    let o = engine(&db, &store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["recovery"], "apply epoch 3 to orders, then resume");
    assert_eq!(db.scalar_i64("SELECT count(*) FROM raw.orders").await, rows);
    assert_eq!(
        db.scalar_i64("SELECT count(DISTINCT _orca_id) FROM raw.orders")
            .await,
        rows
    );
    assert_eq!(differences(&db).await, 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// Makes sync `sync`'s newest checkpoint record say its stream's ids are
/// text, as an engine before 16-byte ids recorded them.
fn record_hex_ids(store: &Path, sync: &str) {
    let dir = store.join("default").join(sync).join("_checkpoints");
    let newest = all_files(&dir, "json")
        .into_iter()
        .max()
        .expect("a checkpoint record");
    let mut record: Value =
        serde_json::from_slice(&std::fs::read(&newest).expect("record")).expect("JSON");
    let mut changed = 0;
    if let Some(streams) = record["streams"].as_object_mut() {
        for stream in streams.values_mut() {
            for pair in stream["schema"].as_array_mut().into_iter().flatten() {
                if pair[0] == "_orca_id" {
                    pair[1] = json!("Utf8");
                    changed += 1;
                }
            }
        }
    }
    assert_eq!(changed, 1, "the record names its id type: {record}");
    let body = serde_json::to_vec_pretty(&record).expect("JSON");
    std::fs::write(&newest, body).expect("rewrite the record");
}

#[tokio::test]
async fn hex_ids_of_an_older_engine_and_a_new_syncs_uuids_name_the_same_rows_in_one_table() {
    let db = TestDb::new().await;
    let rows = 3_000i64;
    make_source(&db, rows).await;
    let dir = scratch("hexids");
    let store = dir.join("store");
    let add_row = |id: i64| {
        let db = &db;
        async move {
            sqlx::raw_sql(&format!(
                "INSERT INTO public.orders (id, updated_at) VALUES ({id}, '2030-01-01'::timestamptz + {id} * interval '1 s')"
            ))
            .execute(&db.pool)
            .await
            .expect("a new row");
        }
    };
    let ty = "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
              WHERE attrelid = 'raw.orders'::regclass AND attname = '_orca_id'";
    let count = "SELECT count(*) FROM raw.orders";
    define_pg(&db, "append", "exactly_once").await;
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        db.strings(ty).await,
        ["uuid"],
        "a new stream's ids are uuids"
    );

    // What an engine before 16-byte ids left: the same ids as 32 hex
    // characters in a text column, and a checkpoint that says text.
    sqlx::raw_sql(
        "ALTER TABLE raw.orders ALTER COLUMN _orca_id TYPE text
         USING replace(_orca_id::text, '-', '')",
    )
    .execute(&db.pool)
    .await
    .expect("hex ids");
    record_hex_ids(&store, "shop");
    let hex = db
        .strings("SELECT _orca_id FROM raw.orders ORDER BY id")
        .await;
    assert!(hex.iter().all(|h| h.len() == 32), "{:?}", &hex[..2]);

    // That stream goes on with hex ids: the column stays text.
    add_row(100_001).await;
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(db.strings(ty).await, ["text"], "an old stream keeps hex");
    assert_eq!(db.scalar_i64(count).await, rows + 1);

    // A second sync of the same stream, with no checkpoint of its own: its
    // rows carry the same ids as uuids; the column turns uuid and the
    // append skips every row the table holds.
    sqlx::query("SELECT orca.create_sync('shop2', $1, $2, $3, NULL, 'exactly_once')")
        .bind(json!({"type": "postgres", "url": db.url()}))
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
        .bind(
            json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                      "primary_key": ["id"], "mode": "append"}]),
        )
        .execute(&db.pool)
        .await
        .expect("the second sync");
    add_row(100_002).await;
    let o = engine_of("shop2", &db, &dir.join("store2"), 1_000)
        .output()
        .expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        db.scalar_i64(count).await,
        rows + 2,
        "the rows held were skipped, the new one added"
    );
    assert_eq!(db.strings(ty).await, ["uuid"], "the column now holds uuids");
    assert_eq!(
        db.strings(
            "SELECT replace(_orca_id::text, '-', '') FROM raw.orders WHERE id <= 3000 ORDER BY id"
        )
        .await,
        hex,
        "each old row keeps its id"
    );

    // The old stream's hex ids now go in as uuids: the column is not
    // turned back, and what it delivers again is still skipped.
    add_row(100_003).await;
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(db.strings(ty).await, ["uuid"], "uuids stay uuids");
    assert_eq!(db.scalar_i64(count).await, rows + 3);
    assert_eq!(
        db.scalar_i64("SELECT count(DISTINCT _orca_id) FROM raw.orders")
            .await,
        rows + 3
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// An exactly-once sync of the JSON lines under `input` into `raw.events`.
async fn files_into_raw(db: &TestDb, input: &Path) {
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "files", "url": input.to_string_lossy(), "format": "jsonl"}))
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
        .bind(json!([{"name": "events", "pattern": "*.jsonl"}]))
        .execute(&db.pool)
        .await
        .expect("files into Postgres, exactly once");
}

/// Every JSON line of the `.jsonl` files under a folder, in file order.
fn jsonl_records(dir: &Path) -> Vec<Value> {
    all_files(dir, "jsonl")
        .iter()
        .flat_map(|p| {
            std::fs::read_to_string(p)
                .expect("JSON lines file")
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).expect("JSON line"))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn files_into_postgres_widen_the_table_as_the_stream_widens() {
    let db = TestDb::new().await;
    let dir = scratch("files-pg");
    let (input, store) = (dir.join("in"), dir.join("store"));
    std::fs::create_dir_all(&input).expect("input dir");
    std::fs::write(
        input.join("a.jsonl"),
        "{\"id\": 1, \"amount\": 5}\n{\"id\": 2, \"amount\": 6}\n",
    )
    .expect("a");
    std::fs::write(
        input.join("b.jsonl"),
        "{\"id\": 3, \"amount\": 7.5, \"tag\": \"new\"}\n",
    )
    .expect("b");
    files_into_raw(&db, &input).await;
    // One record per epoch: the table is made from the first and widened
    // by the later ones.
    let o = engine(&db, &store, 1).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let types = db
        .strings(
            "SELECT attname || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute
             WHERE attrelid = 'raw.events'::regclass AND attnum > 0 AND attname IN ('amount', 'tag')
             ORDER BY attname",
        )
        .await;
    assert_eq!(types, ["amount double precision", "tag text"]);
    let rows = db
        .strings(
            "SELECT id || ' ' || amount || ' ' || coalesce(tag, '-') FROM raw.events ORDER BY id",
        )
        .await;
    assert_eq!(rows, ["1 5 -", "2 6 -", "3 7.5 new"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// The store (its checkpoint log, created with conditional writes, staged
/// epochs and attempt logs) and the parquet destination in an object store,
/// an engine killed after its HEAD moved and a second one recovering: the
/// store served by `server` (an emulator of its cloud's API, since no cloud
/// is reachable here) and read back by another client.
/// Inserts 100 orders from id `first`.
async fn hundred_more(db: &TestDb, first: i64) {
    sqlx::query(
        "INSERT INTO public.orders (id, updated_at) \
         SELECT g, now() FROM generate_series($1::bigint, $1::bigint + 99) g",
    )
    .bind(first)
    .execute(&db.pool)
    .await
    .expect("more rows");
}

/// A source of 30,000 orders and a sync of them into Parquet files under
/// `out/` of bucket `orca`; returns the database and the row count.
async fn orders_into_bucket(server: &dyn orca_tests::stores::ObjectServer) -> (TestDb, i64) {
    let db = TestDb::new().await;
    let rows = 30_000i64;
    make_source(&db, rows).await;
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "parquet", "url": server.url("orca", "out")}),
        json!({}),
        "at_least_once",
    )
    .await;
    (db, rows)
}

async fn a_sync_lives_in(server: &dyn orca_tests::stores::ObjectServer) {
    let (db, rows) = orders_into_bucket(server).await;
    let store = server.url("orca", "store");
    let run = |crash: Option<&str>| {
        let mut c = Command::new(bin("orca-engine"));
        c.args(["sync", "shop", "--batch-rows", "10000", "--store", &store])
            .env("DATABASE_URL", db.url())
            .envs(server.env());
        if let Some(epoch) = crash {
            c.env("ORCA_ENGINE_CRASH_AFTER_HEAD", epoch);
        }
        c.output().expect("engine")
    };
    let o = run(Some("2"));
    assert!(!o.status.success(), "{}", text(&o));
    let o = run(None);
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["recovery"], "apply epoch 2 to orders, then resume");

    let parts: Vec<String> = server
        .keys("orca", "out/orders/")
        .into_iter()
        .filter(|k| k.ends_with(".parquet"))
        .collect();
    assert_eq!(
        parts,
        (1..=3)
            .map(|e| format!("out/orders/part-{e:010}.parquet"))
            .collect::<Vec<_>>()
    );
    let checkpoints = server.keys("orca", "store/default/shop/_checkpoints/");
    assert_eq!(checkpoints.len(), 3, "{checkpoints:?}");
    assert!(server
        .keys("orca", "store/default/shop/_staging/")
        .is_empty());
    // A checkpoint is created once, with a conditional write the store
    // itself enforces: when another writer (a zombie engine) made the next
    // one first, this engine stops and says so rather than replace it.
    // Records are named {epoch}-g{generation}: the next attempt claims
    // generation + 1 and writes epoch + 1 first.
    let last = checkpoints.iter().max().expect("a checkpoint");
    let (dir, file) = last.rsplit_once('/').expect("a record's path");
    let (epoch, generation) = file
        .trim_end_matches(".json")
        .split_once("-g")
        .and_then(|(e, g)| Some((e.parse::<u64>().ok()?, g.parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("a record named {{epoch}}-g{{generation}}.json: {last}"));
    let next = format!(
        "{dir}/{:0width$}-g{}.json",
        epoch + 1,
        generation + 1,
        width = file.find('-').unwrap_or(10)
    );
    server.put("orca", &next, b"{\"written by\": \"another engine\"}");
    hundred_more(&db, rows + 1).await;
    let o = run(None);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("exists already"), "{}", text(&o));
    // Every row once, fetched from the bucket by another client.
    let local = scratch(&format!("{}-copy", server.scheme()));
    std::fs::create_dir_all(local.join("orders")).expect("copy dir");
    for e in 1..=3 {
        let key = format!("out/orders/part-{e:010}.parquet");
        server.download("orca", &key, &local.join(&key["out/".len()..]));
    }
    let (n, ids, _, _) = tally(&published(&local, "orders"));
    assert_eq!((n, ids), (rows as usize, rows as usize));

    // The published files read back from the bucket as a parquet files
    // source (footers and row groups fetched by ranges of the objects):
    // every row once, each column in its type.
    sqlx::query("SELECT orca.create_sync('back', $1, $2, $3)")
        .bind(json!({"type": "files", "url": server.url("orca", "out"), "format": "parquet"}))
        .bind(json!({"type": "parquet", "url": local.join("back").to_string_lossy()}))
        .bind(json!([{"name": "orders", "pattern": "orders/*.parquet"}]))
        .execute(&db.pool)
        .await
        .expect("a parquet sync from the bucket");
    let o = Command::new(bin("orca-engine"))
        .args(["sync", "back", "--batch-rows", "7000", "--store", &store])
        .env("DATABASE_URL", db.url())
        .envs(server.env())
        .output()
        .expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let back = published(&local.join("back"), "orders");
    let (n, ids, _, _) = tally(&back);
    assert_eq!((n, ids), (rows as usize, rows as usize));
    let amount = back[0]
        .schema()
        .field_with_name("amount")
        .expect("amount")
        .data_type()
        .clone();
    assert_eq!(amount, arrow_schema::DataType::Decimal128(12, 2));
    // The first sync's own columns gave way to this one's.
    let schema = back[0].schema();
    let orca: Vec<&str> = schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .filter(|n| n.starts_with("_orca_"))
        .collect();
    assert_eq!(orca, ["_orca_id", "_orca_seq", "_orca_synced_at"]);
    let _ = std::fs::remove_dir_all(local);
}

#[tokio::test]
async fn checkpoints_staging_and_parquet_files_live_in_s3() {
    a_sync_lives_in(&orca_tests::s3::S3Server::start("orca")).await;
}

/// The object store failing under a sync, on moto's S3 behind the fault
/// proxy (no real S3 is reachable here). A checkpoint record is created
/// with a conditional write; when the write lands and its answer is lost
/// (a 500), the client's retry finds the object there: the engine must see
/// its own bytes and go on, not stop as if another engine had written it.
/// A store that does not answer at all (each record's write held past the
/// client's timeout) stops the attempt with exit 4, which a runner hands
/// back without spending a retry; the next attempt goes on from HEAD.
#[tokio::test]
async fn a_lost_answer_or_a_silent_moto_s3_store_costs_no_commit_and_no_retry() {
    use orca_tests::s3proxy::{Fault, S3Proxy};
    use orca_tests::stores::ObjectServer;
    let server = orca_tests::s3::S3Server::start("orca");
    let proxy = S3Proxy::start(server.port());
    let (db, rows) = orders_into_bucket(&server).await;
    let through = format!("http://127.0.0.1:{}", proxy.port);
    let run = |timeout: Option<&str>| {
        let mut c = Command::new(bin("orca-engine"));
        c.args([
            "sync",
            "shop",
            "--batch-rows",
            "10000",
            "--store",
            "s3://orca/store",
        ])
        .env("DATABASE_URL", db.url())
        .envs(server.env())
        .env("AWS_ENDPOINT", &through);
        if let Some(t) = timeout {
            c.env("AWS_TIMEOUT", t);
        }
        c.output().expect("engine")
    };

    proxy.fail_conditional_puts(Some(Fault::Error));
    let o = run(None);
    assert!(o.status.success(), "{}", text(&o));
    let records = server.keys("orca", "store/default/shop/_checkpoints/");
    assert_eq!(records.len(), 3, "{records:?}");
    let (lost, _) = proxy.hits();
    assert!(
        lost >= records.len(),
        "each record's first write landed and its answer was lost: {lost} answers lost for {} records",
        records.len()
    );

    hundred_more(&db, rows + 1).await;
    proxy.hold(Duration::from_secs(6));
    proxy.fail_conditional_puts(Some(Fault::Slow));
    let o = run(Some("2s"));
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(
        text(&o).contains("the object store did not answer"),
        "{}",
        text(&o)
    );
    proxy.fail_conditional_puts(None);
    let o = run(None);
    assert!(o.status.success(), "{}", text(&o));

    // Every row once, fetched from the bucket by another client.
    let local = scratch("s3-faults-copy");
    let _ = std::fs::remove_dir_all(&local);
    std::fs::create_dir_all(local.join("orders")).expect("copy dir");
    for key in server.keys("orca", "out/orders/") {
        if key.ends_with(".parquet") {
            server.download("orca", &key, &local.join(&key["out/".len()..]));
        }
    }
    let (n, ids, _, _) = tally(&published(&local, "orders"));
    assert_eq!(ids, rows as usize + 100);
    assert!(n >= ids, "{n} rows for {ids} ids");
    let _ = std::fs::remove_dir_all(local);
}

#[tokio::test]
async fn checkpoints_staging_and_parquet_files_live_in_azure_blob_storage() {
    a_sync_lives_in(&orca_tests::stores::Azurite::start("orca")).await;
}

/// A backfill of a sync reads every stream again from its start: a merge
/// repairs a destination that drifted, where a run from the checkpoint
/// reads nothing new.
#[tokio::test]
async fn a_backfill_reads_everything_again_and_a_merge_repairs_drift() {
    let db = TestDb::new().await;
    let rows = 20_000i64;
    make_source(&db, rows).await;
    let dir = scratch("backfill");
    let (store, logs) = (dir.join("store"), dir.join("logs"));
    define_pg(&db, "merge", "effectively_once").await;
    let runner = sync_runner(&db, &store, &logs);
    let now = |db: &TestDb| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT orca.run('shop', 'now')")
                .fetch_one(&pool)
                .await
                .expect("run now")
        }
    };
    let r = now(&db).await;
    wait_run(&db, r, "succeeded", &runner).await;
    assert_eq!(differences(&db).await, 0);

    sqlx::raw_sql(
        "DELETE FROM raw.orders WHERE id % 10 = 0;
         UPDATE raw.orders SET amount = -1 WHERE id % 7 = 0;",
    )
    .execute(&db.pool)
    .await
    .expect("drift");
    let drift = differences(&db).await;
    assert!(drift > 4000, "{drift}");
    let r = now(&db).await;
    wait_run(&db, r, "succeeded", &runner).await;
    assert_eq!(differences(&db).await, drift, "nothing new to read");

    // From the command line: queue the backfill and follow it to its end.
    let o = Command::new(bin("orca"))
        .args(["sync", "shop", "--backfill"])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca sync");
    assert!(o.status.success(), "{}\n{}", text(&o), runner.output());
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains("(every stream again from its start)"),
        "{said}"
    );
    assert!(said.contains("1/1 done: 1 succeeded"), "{said}");
    assert!(said.contains("sync shop: HEAD at epoch"), "{said}");
    // A sync's run has no steps to count: its line says so instead of 0/0.
    let o = Command::new(bin("orca"))
        .args(["runs", "--pipeline", "shop", "--json"])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca runs");
    let runs: Value = serde_json::from_slice(&o.stdout).expect("orca runs --json");
    let line = runs
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|r| r["trigger"] == "backfill" && r["status"] == "succeeded")
        })
        .unwrap_or_else(|| panic!("the backfill run: {runs}"));
    assert_eq!(line["steps"], Value::Null, "{line}");
    let b: i64 = sqlx::query_scalar("SELECT max(id) FROM orca.runs WHERE trigger = 'backfill'")
        .fetch_one(&db.pool)
        .await
        .expect("the backfill run");
    assert_eq!(run_status(&db, b).await, "succeeded");
    assert_eq!(differences(&db).await, 0, "repaired");
    // Every committed epoch's figures reached the control plane: the last
    // is HEAD, and the backfill's epochs moved at least every row again.
    let (epochs, last, moved): (i64, Option<i64>, Option<i64>) = sqlx::query_as(
        "SELECT count(*), max(e.epoch), sum(e.total_rows)::bigint FROM orca.sync_epochs e \
         JOIN orca.syncs s ON s.id = e.sync_id WHERE s.name = 'shop'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the sync's epochs");
    let head = db
        .scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'shop'")
        .await;
    assert!(epochs >= 1, "no epochs recorded");
    assert_eq!(last, Some(head), "the last recorded epoch is HEAD");
    assert!(
        moved.unwrap_or(0) >= rows,
        "epochs moved {moved:?} rows of {rows}"
    );
    let o = Command::new(bin("orca"))
        .args(["syncs", "--json"])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca syncs");
    let listed: Value = serde_json::from_slice(&o.stdout).expect("orca syncs --json");
    assert!(
        listed
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["sync"] == "shop"
                && s["delivery"] == "effectively_once"
                && s["source"] == "postgres"
                && s["destination"] == "postgres"
                && s["last_run"] == format!("{b} succeeded"))),
        "{listed}"
    );
    // And as a table for people.
    let o = Command::new(bin("orca"))
        .arg("syncs")
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca syncs");
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.contains("shop") && l.contains(&format!("{b} succeeded"))),
        "{table}"
    );
    assert_eq!(db.scalar_i64("SELECT count(*) FROM raw.orders").await, rows);
    let log = std::fs::read_to_string(logs.join(format!("default/shop/run-{b}/attempt-1.log")))
        .expect("attempt log");
    assert!(log.contains(r#""event":"full""#), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn cells_postgres_cannot_take_are_held_and_the_rest_of_the_row_lands() {
    let db = TestDb::new().await;
    let dir = scratch("held");
    let (input, store) = (dir.join("in"), dir.join("store"));
    std::fs::create_dir_all(&input).expect("input dir");
    std::fs::write(
        input.join("a.jsonl"),
        "{\"id\": 1, \"note\": \"fine\"}\n{\"id\": 2, \"note\": \"nul\\u0000inside\"}\n",
    )
    .expect("a");
    files_into_raw(&db, &input).await;
    let o = engine(&db, &store, 100).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["held"], 1, "{outcome}");
    let rows = db
        .strings("SELECT id || ' ' || coalesce(note, '(null)') FROM raw.events ORDER BY id")
        .await;
    assert_eq!(rows, ["1 fine", "2 (null)"]);
    let held = jsonl_records(&store.join("default/shop/_held"));
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["column"], "note");
    assert_eq!(held[0]["value"], "nul\u{0}inside");
    // A new stream's ids are uuids; the held value names its record by the
    // same 16 bytes in hex.
    let (id, ty): (String, String) = sqlx::query_as(
        "SELECT replace(_orca_id::text, '-', ''), pg_typeof(_orca_id)::text
         FROM raw.events WHERE id = 2",
    )
    .fetch_one(&db.pool)
    .await
    .expect("id");
    assert_eq!(ty, "uuid");
    assert_eq!(held[0]["_orca_id"], id, "the held value names its record");
    let _ = std::fs::remove_dir_all(dir);
}

async fn define_with_policy(db: &TestDb, out: &Path, policy: &str) {
    define_orders(
        db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "parquet", "url": out.to_string_lossy()}),
        json!({"schema_policy": policy}),
        "at_least_once",
    )
    .await;
}

#[tokio::test]
async fn schema_policies_freeze_or_discard_what_a_source_adds() {
    let db = TestDb::new().await;
    make_source(&db, 1_000).await;
    let dir = scratch("policy");
    let (out, store, input) = (dir.join("out"), dir.join("store"), dir.join("in"));
    define_with_policy(&db, &out, "freeze").await;
    let o = engine(&db, &store, 500).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));

    // The table gains a column: a frozen stream stops before reading.
    sqlx::raw_sql(
        "ALTER TABLE public.orders ADD COLUMN region text DEFAULT 'eu';
         INSERT INTO public.orders (id, updated_at) VALUES (1001, '2030-01-01');",
    )
    .execute(&db.pool)
    .await
    .expect("a new column");
    let o = engine(&db, &store, 500).output().expect("engine");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(
            "stream orders: source table public.orders changed (new columns: [region], gone: []) \
             and the stream's schema policy is freeze"
        ),
        "{}",
        text(&o)
    );
    // discard: the new column is not read; the new row is.
    define_with_policy(&db, &out, "discard").await;
    let o = engine(&db, &store, 500).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let batches = published(&out, "orders");
    assert_eq!(tally(&batches).0, 1_001);
    assert!(batches
        .iter()
        .all(|b| b.schema().field_with_name("region").is_err()));

    // Files: a frozen stream quarantines records that would change it (a
    // sync of its own: redefining one keeps its HEAD).
    let db = TestDb::new().await;
    std::fs::create_dir_all(&input).expect("input");
    std::fs::write(input.join("a.jsonl"), "{\"id\": 1, \"name\": \"a\"}\n").expect("a");
    std::fs::write(
        input.join("b.jsonl"),
        "{\"id\": 2, \"name\": \"b\", \"extra\": 1}\n{\"id\": 3.5}\n{\"id\": 4}\n",
    )
    .expect("b");
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "files", "url": input.to_string_lossy(), "format": "jsonl"}))
        .bind(json!({"type": "parquet", "url": dir.join("out2").to_string_lossy()}))
        .bind(json!([{"name": "events", "pattern": "*.jsonl", "schema_policy": "freeze"}]))
        .execute(&db.pool)
        .await
        .expect("files sync");
    let o = engine(&db, &dir.join("store2"), 1)
        .output()
        .expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(
        (outcome["rows"].as_i64(), outcome["quarantined"].as_i64()),
        (Some(2), Some(2))
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether the destination still has a refresh's shadow of raw.orders.
async fn shadow_exists(db: &TestDb) -> bool {
    db.scalar_i64("SELECT (to_regclass('raw._orca_refresh_orders') IS NOT NULL)::int::int8")
        .await
        == 1
}

#[tokio::test]
async fn an_overwrite_into_postgres_replaces_the_rows_whole_and_a_crash_mid_refresh_shows_the_old_ones(
) {
    let db = TestDb::new().await;
    make_source(&db, 25_000).await;
    let dir = scratch("pgoverwrite");
    let store = dir.join("store");
    define_pg(&db, "overwrite", "exactly_once").await;

    // Three epochs of rows, then one in which the source ran out: the
    // refresh replaces the table's rows.
    let o = engine(&db, &store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(
        (outcome["rows"].as_i64(), outcome["to_epoch"].as_i64()),
        (Some(25_000), Some(4))
    );
    assert_eq!(differences(&db).await, 0);
    assert!(!shadow_exists(&db).await, "the shadow goes with the swap");

    // Rows deleted at the source: an append or a merge would keep them, a
    // refresh does not. A crash after HEAD moved in the refresh's second
    // epoch leaves the old rows visible, all of them.
    sqlx::raw_sql(
        "DELETE FROM public.orders WHERE id % 5 = 0;
         UPDATE public.orders SET amount = amount + 1,
                updated_at = '2031-01-01'::timestamptz + id * interval '1 ms'
         WHERE id % 97 = 0;",
    )
    .execute(&db.pool)
    .await
    .expect("source changes");
    let o = engine(&db, &store, 10_000)
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "6")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(head(&db).await.0, 6);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.orders").await,
        25_000
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.orders WHERE id % 5 = 0")
            .await,
        5_000,
        "the old rows, untouched mid-refresh"
    );
    assert!(shadow_exists(&db).await);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw._orca_refresh_orders")
            .await,
        10_000,
        "epoch 5 of the refresh is in its shadow"
    );

    // The next attempt applies epoch 6 into the shadow, goes on with the
    // same refresh (it does not start over) and swaps.
    let o = engine(&db, &store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["recovery"], "apply epoch 6 to orders, then resume");
    assert_eq!(outcome["rows"], 0, "{outcome}");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.orders").await,
        20_000
    );
    assert_eq!(
        differences(&db).await,
        0,
        "the table is the source's rows now"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(DISTINCT _orca_id) FROM raw.orders")
            .await,
        20_000
    );
    assert!(!shadow_exists(&db).await);

    // The refresh finished: the next attempt refreshes again from the start.
    sqlx::raw_sql("DELETE FROM public.orders WHERE id <= 1000")
        .execute(&db.pool)
        .await
        .expect("more deletes");
    let o = engine(&db, &store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], 19_200, "{outcome}");
    assert_eq!(differences(&db).await, 0);
    let markers = db
        .strings("SELECT stream || ' ' || epoch FROM raw._orca_markers WHERE sync = 'shop'")
        .await;
    assert_eq!(markers, ["orders 10"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn an_overwrite_into_parquet_publishes_each_refresh_in_place_of_the_one_before() {
    let db = TestDb::new().await;
    make_source(&db, 3_000).await;
    let dir = scratch("pqoverwrite");
    let (store, out) = (dir.join("store"), dir.join("out"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "parquet", "url": out.to_string_lossy()}),
        json!({"mode": "overwrite"}),
        "at_least_once",
    )
    .await;
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        tally(&published(&out, "orders")),
        (3_000, 3_000, 3_000, 4_501_500)
    );

    sqlx::raw_sql("DELETE FROM public.orders WHERE id > 2000")
        .execute(&db.pool)
        .await
        .expect("deletes");
    // Killed after HEAD moved in the refresh's first epoch: the files of the
    // refresh before are what a reader sees.
    let o = engine(&db, &store, 1_000)
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "5")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(
        published(&out, "orders")
            .iter()
            .map(RecordBatch::num_rows)
            .sum::<usize>(),
        3_000
    );

    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        tally(&published(&out, "orders")),
        (2_000, 2_000, 2_000, 2_001_000)
    );
    assert!(
        all_files(&out.join("orders/_refresh"), "parquet").is_empty(),
        "the shadow's files went with the swap"
    );
    let marker = std::fs::read_to_string(out.join("orders/_orca_epoch")).expect("marker");
    assert_eq!(marker.trim(), head(&db).await.0.to_string());
    let _ = std::fs::remove_dir_all(dir);
}

fn release(db: &TestDb, store: &Path, extra: &[&str]) -> Output {
    Command::new(bin("orca-engine"))
        .args(["release", "shop"])
        .args(extra)
        .arg("--store")
        .arg(store)
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca-engine release")
}

#[tokio::test]
async fn held_cells_are_released_once_the_user_says_how_or_the_column_can_take_them() {
    let db = TestDb::new().await;
    let dir = scratch("release");
    let (input, store) = (dir.join("in"), dir.join("store"));
    std::fs::create_dir_all(&input).expect("input dir");
    std::fs::write(
        input.join("a.jsonl"),
        "{\"id\": 1, \"note\": \"fine\"}\n{\"id\": 2, \"note\": \"nul\\u0000inside\"}\n\
         {\"id\": 3, \"note\": \"x\\u0000y\"}\n",
    )
    .expect("a");
    files_into_raw(&db, &input).await;
    let o = engine(&db, &store, 100).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let notes = |db: &TestDb| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT id || ' ' || coalesce(note, '(null)') FROM raw.events ORDER BY id",
            )
            .fetch_all(&pool)
            .await
            .expect("notes")
        }
    };
    assert_eq!(notes(&db).await, ["1 fine", "2 (null)", "3 (null)"]);

    // A text column cannot take NUL as it is: the release says what to do
    // and writes nothing.
    let o = release(&db, &store, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("column raw.events.note is text") && err.contains("--nul strip"),
        "{err}"
    );
    assert_eq!(notes(&db).await, ["1 fine", "2 (null)", "3 (null)"]);

    // A cell someone fixed by hand is left alone.
    sqlx::raw_sql("UPDATE raw.events SET note = 'by hand' WHERE id = 3")
        .execute(&db.pool)
        .await
        .expect("a fix by hand");
    let o = release(&db, &store, &["--nul", "strip"]);
    assert!(o.status.success(), "{}", text(&o));
    let said: Value = serde_json::from_slice(&o.stdout).expect("release JSON");
    assert_eq!(
        (
            &said["files"],
            &said["cells"],
            &said["released"],
            &said["skipped"]
        ),
        (&json!(1), &json!(2), &json!(1), &json!(1)),
        "{said}"
    );
    assert_eq!(notes(&db).await, ["1 fine", "2 nulinside", "3 by hand"]);
    let again = release(&db, &store, &["--nul", "strip"]);
    let said: Value = serde_json::from_slice(&again.stdout).expect("release JSON");
    assert_eq!(
        said["files"], 0,
        "a released file is not read again: {said}"
    );

    // A column made bytea takes the value as it is, NUL and all.
    std::fs::write(
        input.join("b.jsonl"),
        "{\"id\": 4, \"note\": \"z\\u0000z\"}\n",
    )
    .expect("b");
    let o = engine(&db, &store, 100).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    sqlx::raw_sql(
        "ALTER TABLE raw.events ALTER COLUMN note TYPE bytea USING convert_to(note, 'UTF8')",
    )
    .execute(&db.pool)
    .await
    .expect("note as bytea");
    let o = release(&db, &store, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let said: Value = serde_json::from_slice(&o.stdout).expect("release JSON");
    assert_eq!(said["released"], 1, "{said}");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.events WHERE id = 4 AND note = '\\x7a007a'::bytea")
            .await,
        1
    );
    let bad = release(&db, &store, &["--nul", "drop"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("'drop' is not strip or replace=TEXT"));
    let _ = std::fs::remove_dir_all(dir);
}

/// Changes the rows `filter` picks (qty set to `qty`, updated_at moved into
/// `year`), merges them into raw.orders with `engine`, and checks that it
/// read `changed` rows and that the table holds one row per key, each at its
/// newest version. Returns the table's stats of `qty`.
async fn merge_changes(
    db: &TestDb,
    mut engine: Command,
    wh: &str,
    qty: &str,
    year: &str,
    filter: &str,
    changed: i64,
) -> Value {
    sqlx::raw_sql(&format!(
        "UPDATE public.orders SET qty = {qty},
                updated_at = '{year}-01-01'::timestamptz + id * interval '1 ms'
         WHERE {filter}"
    ))
    .execute(&db.pool)
    .await
    .expect("updates");
    let o = engine.output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], changed, "{outcome}");
    let want = db
        .scalar_i64("SELECT sum(qty)::int8 FROM public.orders")
        .await;
    let keys = db.scalar_i64("SELECT count(*) FROM public.orders").await;
    let stats = pyiceberg(&["stats", &db.url(), wh, "raw.orders", "qty"]);
    assert_eq!(stats["rows"], keys, "one row per key");
    assert_eq!(stats["sum"], want, "every key at its newest version");
    stats
}

/// A stream's `partition_by` makes its Iceberg table partitioned: every
/// data file holds one year and one bucket of ids, so PyIceberg and DuckDB
/// read only a day's year, and a merge that moves rows to another year
/// keeps one per key.
#[tokio::test]
async fn an_iceberg_destination_partitioned_by_a_declared_transform_is_pruned_by_other_readers() {
    let db = TestDb::new().await;
    let rows = 3_000i64;
    make_source(&db, rows).await;
    // Five years of days. (Not month(day): DuckDB 1.4's Iceberg extension
    // finds no rows for a filter on a date under a month transform, in
    // PyIceberg's tables as in ours.)
    sqlx::raw_sql("UPDATE public.orders SET day = '2020-01-01'::date + (id % 5)::int * 366")
        .execute(&db.pool)
        .await
        .expect("five years");
    let dir = scratch("icepart");
    let (wh, store) = (dir.join("wh"), dir.join("store"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "iceberg", "namespace": "raw"}),
        json!({"mode": "merge", "partition_by": ["year(day)", "bucket(4, id)"]}),
        "effectively_once",
    )
    .await;
    let run = || into_iceberg(&db, &store, 1_000, &wh);
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let wh_s = wh.to_string_lossy();
    let on_day = "SELECT count(*) FROM public.orders WHERE day = '2022-01-02'";
    let want = db.scalar_i64(on_day).await;
    assert!(want > 0);
    let pruned = pyiceberg(&["prune", &db.url(), &wh_s, "raw.orders", "day", "2022-01-02"]);
    assert_eq!(pruned["spec"][0], json!(["day_year", "year"]), "{pruned}");
    assert_eq!(pruned["spec"][1][0], "id_bucket", "{pruned}");
    for reader in ["pyiceberg", "duckdb"] {
        let r = &pruned[reader];
        assert_eq!(r["rows"], want, "{reader}: {pruned}");
        let (files, all) = (r["files"].as_i64(), r["all_files"].as_i64());
        // Three epochs wrote a file per year and bucket each: 2022's are a
        // fifth of them.
        assert!(
            files.zip(all).is_some_and(|(f, a)| f >= 1 && f * 4 <= a),
            "{reader} reads only 2022's files: {pruned}"
        );
    }

    // Rows moved into another year are merged out of the files of their
    // old one: one row per key, each in its new year's files.
    sqlx::raw_sql(
        "UPDATE public.orders SET day = '2022-01-02', updated_at = '2031-01-01'
         WHERE id % 100 = 0 AND day <> '2022-01-02'",
    )
    .execute(&db.pool)
    .await
    .expect("updates");
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let stats = pyiceberg(&["stats", &db.url(), &wh_s, "raw.orders", "id"]);
    assert_eq!(
        (&stats["rows"], &stats["distinct"]),
        (&json!(rows), &json!(rows))
    );
    let pruned = pyiceberg(&["prune", &db.url(), &wh_s, "raw.orders", "day", "2022-01-02"]);
    let want = db.scalar_i64(on_day).await;
    assert_eq!(pruned["pyiceberg"]["rows"], want, "{pruned}");
    assert_eq!(pruned["duckdb"]["rows"], want, "{pruned}");

    // Declared again otherwise: the table keeps how it was made, and the
    // attempt's log says so.
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "iceberg", "namespace": "raw"}),
        json!({"mode": "merge", "partition_by": ["month(updated_at)"]}),
        "effectively_once",
    )
    .await;
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let said: Vec<Value> = jsonl_records(&store.join("default/shop/_logs"))
        .into_iter()
        .filter(|e| e["event"] == "partitioning")
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(
        (&said[0]["table"], &said[0]["declared"]),
        (
            &json!("year(day), bucket[4](id)"),
            &json!("month(updated_at)")
        ),
        "{said:?}"
    );
    let pruned = pyiceberg(&["prune", &db.url(), &wh_s, "raw.orders", "day", "2022-01-02"]);
    assert_eq!(pruned["spec"][0], json!(["day_year", "year"]), "{pruned}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A partition field the table cannot have stops the attempt before any
/// epoch, naming the column and the columns there are.
#[tokio::test]
async fn a_partition_field_the_table_cannot_have_stops_the_sync_naming_it() {
    let db = TestDb::new().await;
    make_source(&db, 10).await;
    let dir = scratch("icepartbad");
    let (wh, store) = (dir.join("wh"), dir.join("store"));
    for (field, says) in [
        ("day(nope)", "column nope: it has no such column"),
        (
            "day(customer)",
            "cannot be partitioned by day of column customer",
        ),
    ] {
        sqlx::query("SELECT orca.drop_sync('shop')")
            .execute(&db.pool)
            .await
            .ok();
        define_orders(
            &db,
            json!({"type": "postgres", "url": db.url()}),
            json!({"type": "iceberg", "namespace": "raw"}),
            json!({"partition_by": [field]}),
            "effectively_once",
        )
        .await;
        let o = into_iceberg(&db, &store, 1_000, &wh)
            .output()
            .expect("engine");
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{field}: {err}");
        assert_eq!(head(&db).await.0, 0, "nothing moved");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_merge_into_iceberg_keeps_one_row_per_key_across_a_sigkill_and_updates() {
    let db = TestDb::new().await;
    let rows = 20_000i64;
    make_source(&db, rows).await;
    let dir = scratch("icemerge");
    let (wh, store) = (dir.join("wh"), dir.join("store"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "iceberg", "namespace": "raw"}),
        json!({"mode": "merge"}),
        "effectively_once",
    )
    .await;
    let run = || into_iceberg(&db, &store, 5_000, &wh);
    kill_at(&db, run().spawn().expect("engine"), 2).await;
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let wh_s = wh.to_string_lossy();
    let stats = pyiceberg(&["stats", &db.url(), &wh_s, "raw.orders", "id"]);
    assert_eq!(
        (&stats["rows"], &stats["distinct"], &stats["sum"]),
        (&json!(rows), &json!(rows), &json!(rows * (rows + 1) / 2))
    );

    // Changed rows are read again as newer versions: each replaces its
    // key's row, in the files that held them.
    merge_changes(&db, run(), &wh_s, "qty + 1000", "2031", "id % 50 = 0", 400).await;
    let ids = pyiceberg(&["stats", &db.url(), &wh_s, "raw.orders", "id"]);
    assert_eq!(ids["distinct"], rows);

    // A change to the newest keys only: the merge reads the key columns of
    // the files whose id bounds may hold them and passes the others by, as
    // the snapshot's summary tells.
    let stats = merge_changes(&db, run(), &wh_s, "qty + 7", "2032", "id > 19900", 100).await;
    let epoch_of = |s: &Value| {
        s["orca.sync.epoch"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let last = stats["snapshots"]
        .as_array()
        .and_then(|s| s.iter().max_by_key(|s| epoch_of(s)))
        .cloned()
        .unwrap_or_default();
    let count = |k: &str| {
        last[k]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{k} in the last snapshot's summary: {last}"))
    };
    let (read, skipped) = (
        count("orca.merge.files-read"),
        count("orca.merge.files-skipped"),
    );
    // The files of the last id range and the one the spread-out update of
    // every 50th id wrote may hold ids above 19900; no other file can.
    assert!(
        (1..=2).contains(&read) && skipped >= 2,
        "read {read}, skipped {skipped}: {last}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_backfill_into_iceberg_skips_the_rows_the_table_holds() {
    let db = TestDb::new().await;
    make_source(&db, 20_000).await;
    let dir = scratch("icebackfill");
    let (wh, store, logs) = (dir.join("wh"), dir.join("store"), dir.join("logs"));
    // A Postgres table appended into Iceberg is exactly once by the third
    // rule: the destination skips rows by _orca_id when they come again.
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url(), "batch_rows": 5000}),
        json!({"type": "iceberg", "namespace": "raw"}),
        json!({}),
        "exactly_once",
    )
    .await;
    let wh_s = wh.to_string_lossy().into_owned();
    let runner = sync_runner_with(&db, &store, &logs, &[("ORCA_WAREHOUSE", wh_s.as_str())]);
    let r: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run now");
    wait_run(&db, r, "succeeded", &runner).await;
    sqlx::raw_sql(
        "INSERT INTO public.orders (id, updated_at, qty)
         SELECT g, '2031-01-01'::timestamptz + g * interval '1 ms', 1 FROM generate_series(20001, 20500) g",
    )
    .execute(&db.pool)
    .await
    .expect("new rows");
    let b: i64 = sqlx::query_scalar("SELECT orca.backfill('shop', '@all')")
        .fetch_one(&db.pool)
        .await
        .expect("backfill");
    wait_run(&db, b, "succeeded", &runner).await;
    let stats = pyiceberg(&["stats", &db.url(), &wh_s, "raw.orders", "id"]);
    assert_eq!(
        (&stats["rows"], &stats["distinct"]),
        (&json!(20_500), &json!(20_500)),
        "every row once after reading the table again"
    );
    let log = std::fs::read_to_string(logs.join(format!("default/shop/run-{b}/attempt-1.log")))
        .expect("attempt log");
    assert!(log.contains(r#""event":"full""#), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn an_overwrite_into_iceberg_swaps_each_refresh_in_as_one_snapshot() {
    let db = TestDb::new().await;
    make_source(&db, 3_000).await;
    let dir = scratch("iceoverwrite");
    let (wh, store) = (dir.join("wh"), dir.join("store"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "iceberg", "namespace": "raw"}),
        json!({"mode": "overwrite"}),
        "exactly_once",
    )
    .await;
    let run = || into_iceberg(&db, &store, 1_000, &wh);
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let wh_s = wh.to_string_lossy();
    let stats = pyiceberg(&["stats", &db.url(), &wh_s, "raw.orders", "id"]);
    assert_eq!(
        (&stats["rows"], &stats["sum"]),
        (&json!(3_000), &json!(4_501_500))
    );

    sqlx::raw_sql("DELETE FROM public.orders WHERE id > 2000")
        .execute(&db.pool)
        .await
        .expect("deletes");
    // Killed after HEAD moved in the refresh's second epoch: readers still
    // see the refresh before, whole.
    let o = run()
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "6")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    let stats = pyiceberg(&["stats", &db.url(), &wh_s, "raw.orders", "id"]);
    assert_eq!(stats["rows"], 3_000);

    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["recovery"], "apply epoch 6 to orders, then resume");
    let stats = pyiceberg(&["stats", &db.url(), &wh_s, "raw.orders", "id"]);
    assert_eq!(
        (&stats["rows"], &stats["distinct"], &stats["sum"]),
        (&json!(2_000), &json!(2_000), &json!(2_001_000)),
        "the table is the source's rows now"
    );
    let mut epochs: Vec<&str> = stats["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .filter_map(|s| s["orca.sync.epoch"].as_str())
        .collect();
    epochs.sort_unstable();
    // One snapshot per refresh: its last epoch (4, then 7).
    assert_eq!(epochs, ["4", "7"], "{stats}");
    assert_eq!(stats["properties"]["orca.sync.shop.epoch"], "7");
    assert!(all_files(&store.join("default/shop/_refresh"), "parquet").is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn json_lines_into_iceberg_add_columns_to_the_table_and_hold_what_it_cannot_widen() {
    let db = TestDb::new().await;
    let dir = scratch("filesice");
    let (input, store, wh) = (dir.join("in"), dir.join("store"), dir.join("wh"));
    std::fs::create_dir_all(&input).expect("input dir");
    std::fs::write(
        input.join("a.jsonl"),
        "{\"id\": 1, \"name\": \"a\", \"amount\": 1}\n{\"id\": 2, \"name\": \"b\", \"amount\": 2}\n",
    )
    .expect("a");
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "files", "url": input.to_string_lossy(), "format": "jsonl"}))
        .bind(json!({"type": "iceberg", "namespace": "raw"}))
        .bind(json!([{"name": "events", "pattern": "*.jsonl"}]))
        .execute(&db.pool)
        .await
        .expect("files into Iceberg, exactly once");
    let o = into_iceberg(&db, &store, 100, &wh)
        .output()
        .expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let wh_s = wh.to_string_lossy();
    let t = pyiceberg(&["read", &db.url(), &wh_s, "raw.events"]);
    assert_eq!(t["rows"].as_array().map(Vec::len), Some(2), "{t}");
    let types: Vec<(String, String)> = t["schema"]
        .as_array()
        .expect("schema")
        .iter()
        .map(|f| {
            (
                f[0].as_str().unwrap_or("").to_string(),
                f[1].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        types.contains(&("amount".into(), "long".into())),
        "{types:?}"
    );

    // A new column joins the table; a value the stream widened to double
    // does not fit the table's long column: 3.0 goes in as 3, 2.5 is held.
    std::fs::write(
        input.join("b.jsonl"),
        "{\"id\": 3, \"name\": \"c\", \"amount\": 2.5, \"region\": \"eu\"}\n{\"id\": 4, \"amount\": 3.0}\n",
    )
    .expect("b");
    let o = into_iceberg(&db, &store, 100, &wh)
        .output()
        .expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["held"], 1, "{outcome}");
    let t = pyiceberg(&["read", &db.url(), &wh_s, "raw.events"]);
    let mut rows: Vec<String> = t["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| format!("{} {} {} {}", r["id"], r["name"], r["amount"], r["region"]))
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            "1 \"a\" 1 null",
            "2 \"b\" 2 null",
            "3 \"c\" null \"eu\"",
            "4 null 3 null"
        ],
        "{t}"
    );
    let held = jsonl_records(&store.join("default/shop/_held"));
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (&held[0]["column"], &held[0]["value"]),
        (&json!("amount"), &json!("2.5"))
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_lookback_reads_rows_a_long_transaction_committed_late_and_lands_each_once() {
    let db = TestDb::new().await;
    make_source(&db, 1_000).await;
    let dir = scratch("lookback");
    let store = dir.join("store");
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "postgres", "url": db.url(), "schema": "raw"}),
        json!({"lookback": "1 hour"}),
        "exactly_once",
    )
    .await;
    let o = engine(&db, &store, 400).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.orders").await,
        1_000
    );

    // A row whose cursor value is older than the resume point, as a
    // transaction that began before the last read and committed after it
    // leaves one: the tuple comparison alone would never read it.
    sqlx::raw_sql(
        "INSERT INTO public.orders (id, updated_at, qty)
         VALUES (5000, '2024-01-01'::timestamptz + interval '100 seconds', 7)",
    )
    .execute(&db.pool)
    .await
    .expect("a late row");
    let o = engine(&db, &store, 400).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.orders").await,
        1_001
    );
    assert_eq!(
        db.scalar_i64("SELECT count(DISTINCT _orca_id) FROM raw.orders")
            .await,
        1_001,
        "the rows read again landed on themselves"
    );
    assert_eq!(differences(&db).await, 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// A runner not set up for syncs (no store) says so when it starts and
/// claims only what it can run: it runs a pipeline's attempt queued after a
/// sync's and leaves the sync's to a runner with a store, so no attempt of
/// the sync fails for want of a setting.
#[tokio::test]
async fn a_runner_without_a_store_leaves_syncs_to_a_runner_with_one() {
    let db = TestDb::new().await;
    make_source(&db, 5_000).await;
    let dir = scratch("no-store");
    let (out, store, logs) = (dir.join("out"), dir.join("store"), dir.join("logs"));
    define(&db, &out).await;
    let reg = Command::new(bin("orca"))
        .args(["register", bin("probe").to_str().unwrap_or_default()])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca register");
    assert!(reg.status.success(), "{}", text(&reg));
    let engine_bin = bin("orca-engine");
    let bare = orca_tests::procs::Runner::start(
        &db.url(),
        "bare",
        1,
        &logs,
        &[("ORCA_ENGINE", engine_bin.to_str().unwrap_or_default())],
    );
    wait_until(
        "the runner to say what it does not run",
        Duration::from_secs(30),
        || async {
            bare.output()
                .contains("not running syncs: no --store (ORCA_STORE)")
                .then_some(())
        },
        || bare.output(),
    )
    .await;
    let sync_run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("sync run");
    let probe_run: i64 = sqlx::query_scalar("SELECT orca.run('probe', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("probe run");
    wait_run(&db, probe_run, "succeeded", &bare).await;
    let sync_attempts: Vec<String> =
        sqlx::query_scalar("SELECT status FROM orca.attempts WHERE run_id = $1")
            .bind(sync_run)
            .fetch_all(&db.pool)
            .await
            .expect("attempts");
    assert_eq!(
        sync_attempts,
        ["pending"],
        "the older sync attempt was left alone\n{}",
        bare.output()
    );
    let with_store = sync_runner(&db, &store, &logs);
    wait_run(&db, sync_run, "succeeded", &with_store).await;
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM orca.runs WHERE id = $1")
        .bind(sync_run)
        .fetch_one(&db.pool)
        .await
        .expect("attempts");
    assert_eq!(attempts, 1, "no retry spent on a configuration");
    let _ = std::fs::remove_dir_all(dir);
}

/// HEAD's resume point of the orders stream, from its record.
async fn head_position(db: &TestDb, store: &Path) -> Value {
    let record: String =
        sqlx::query_scalar("SELECT head_record FROM orca.syncs WHERE name = 'shop'")
            .fetch_one(&db.pool)
            .await
            .expect("a HEAD record");
    let body = std::fs::read(store.join(&record)).expect("the record");
    let v: Value = serde_json::from_slice(&body).expect("record JSON");
    v["streams"]["orders"]["position"].clone()
}

/// The splits of a split read's resume point.
fn splits_of(position: &Value) -> Vec<Value> {
    assert_eq!(position[0], "splits", "a split read's position: {position}");
    let list: Value =
        serde_json::from_str(position[1].as_str().expect("the splits' JSON")).expect("the splits");
    list.as_array().expect("a list of splits").clone()
}

#[tokio::test]
async fn a_big_table_read_in_splits_resumes_every_split_after_sigkills_and_lands_once() {
    let db = TestDb::new().await;
    let rows = 300_000i64;
    make_source(&db, rows).await;
    // Statistics to cut the cursor's range by; three rows share each
    // cursor value, so a cut falls among equal values.
    sqlx::raw_sql("CREATE INDEX ON public.orders (updated_at, id); ANALYZE public.orders")
        .execute(&db.pool)
        .await
        .expect("analyze");
    let dir = scratch("splits");
    let (out, store) = (dir.join("out"), dir.join("store"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "parquet", "url": out.to_string_lossy()}),
        json!({"splits": 3}),
        "at_least_once",
    )
    .await;

    let first = kill_at(&db, engine(&db, &store, 10_000).spawn().expect("engine"), 4).await;
    let at_first = splits_of(&head_position(&db, &store).await);
    assert_eq!(at_first.len(), 3, "{at_first:?}");
    assert!(at_first[0].get("lo").is_none() && at_first[2].get("hi").is_none());
    assert_eq!(at_first[0]["hi"], at_first[1]["lo"], "the ranges meet");
    assert!(
        at_first.iter().all(|s| s["after"].is_array()),
        "every split reads at once: {at_first:?}"
    );
    let second = kill_at(
        &db,
        engine(&db, &store, 10_000).spawn().expect("engine"),
        first + 5,
    )
    .await;
    assert!(second > first, "the second attempt committed more");
    let at_second = splits_of(&head_position(&db, &store).await);
    for (a, b) in at_first.iter().zip(&at_second) {
        assert_eq!(
            (&a["lo"], &a["hi"]),
            (&b["lo"], &b["hi"]),
            "the same ranges"
        );
        let id = |s: &Value| {
            s["after"][1]
                .as_str()
                .unwrap_or("0")
                .parse::<i64>()
                .unwrap_or(0)
        };
        assert!(
            id(b) > id(a),
            "each split resumed where it was: {a} then {b}"
        );
    }

    let o = engine(&db, &store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(
        outcome["to_epoch"], 30,
        "epochs of 10k rows, as an unsplit read: {outcome}"
    );
    let (n, ids, orca_ids, sum) = tally(&published(&out, "orders"));
    assert_eq!(n, rows as usize, "every row once, no more");
    assert_eq!((ids, orca_ids), (rows as usize, rows as usize));
    assert_eq!(sum, rows * (rows + 1) / 2);
    // Read to the end: one resume point, the last row's in cursor order.
    let last = head_position(&db, &store).await;
    assert_eq!(last[1], "300000", "{last}");
    assert_eq!(last.as_array().map(Vec::len), Some(2), "{last}");

    // Later rows and an updated one: read after that point, unsplit.
    late_rows_are_read_alone(&db, &store).await;
    let last = head_position(&db, &store).await;
    assert_eq!(last[1], "7", "{last}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_never_analyzed_table_is_split_by_a_sample_and_lands_once() {
    let db = TestDb::new().await;
    let rows = 60_000i64;
    make_source(&db, rows).await;
    let dir = scratch("splits-sample");
    let (out, store) = (dir.join("out"), dir.join("store"));
    define_orders(
        &db,
        json!({"type": "postgres", "url": db.url()}),
        json!({"type": "parquet", "url": out.to_string_lossy()}),
        json!({"splits": 2}),
        "at_least_once",
    )
    .await;
    let o = engine(&db, &store, 10_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["to_epoch"], 6, "{outcome}");
    // The first epoch's record: a split read's resume point.
    let mut records: Vec<PathBuf> = std::fs::read_dir(store.join("default/shop/_checkpoints"))
        .expect("checkpoints")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    records.sort();
    let first: Value =
        serde_json::from_slice(&std::fs::read(&records[0]).expect("a record")).expect("JSON");
    let splits = splits_of(&first["streams"]["orders"]["position"]);
    assert_eq!(splits.len(), 2, "{first}");
    let (n, ids, orca_ids, sum) = tally(&published(&out, "orders"));
    assert_eq!((n, ids, orca_ids), (60_000, 60_000, 60_000));
    assert_eq!(sum, rows * (rows + 1) / 2);
    assert_eq!(head_position(&db, &store).await[1], "60000");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn splits_that_are_not_a_number_of_connections_are_refused() {
    let db = TestDb::new().await;
    make_source(&db, 10).await;
    for bad in [json!(0), json!(65), json!("4"), json!(2.5)] {
        let e = sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
            .bind(json!({"type": "postgres", "url": db.url()}))
            .bind(json!({"type": "parquet", "url": "/tmp/out"}))
            .bind(
                json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                          "primary_key": ["id"], "splits": bad}]),
            )
            .execute(&db.pool)
            .await
            .expect_err("refused");
        let msg = e.to_string();
        assert!(
            msg.contains("streams[0].splits") && msg.contains(&bad.to_string()),
            "{msg}"
        );
    }
    let e = sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "files", "url": "/tmp/in", "format": "jsonl"}))
        .bind(json!({"type": "parquet", "url": "/tmp/out"}))
        .bind(json!([{"name": "events", "pattern": "*.jsonl", "splits": 2}]))
        .execute(&db.pool)
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("not of a files source's"), "{e}");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.syncs").await,
        0,
        "nothing was defined"
    );
}

/// Writes a Parquet file of these columns (each an array of the same length).
fn write_parquet(path: &Path, columns: Vec<(&str, arrow_array::ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).expect("a batch");
    std::fs::create_dir_all(path.parent().expect("a directory")).expect("its directory");
    let file = std::fs::File::create(path).expect("the file");
    // Small row groups, so a file is read in several of them.
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(700))
        .build();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(props)).expect("a writer");
    w.write(&batch).expect("write");
    w.close().expect("close");
}

/// An events file of ids `from..to`: amounts as decimal(10,2), times in
/// nanoseconds of another zone, names, and (`tags`) a list column; or
/// (`qty`) an int32 column of its own.
fn events_file(path: &Path, from: i64, to: i64, tags: bool, qty: bool) {
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use std::sync::Arc;
    let ids: Vec<i64> = (from..to).collect();
    let mut columns: Vec<(&str, arrow_array::ArrayRef)> = vec![
        ("id", Arc::new(Int64Array::from(ids.clone()))),
        (
            "amount",
            Arc::new(
                Decimal128Array::from(
                    ids.iter()
                        .map(|i| i128::from(*i) * 100 + 5)
                        .collect::<Vec<_>>(),
                )
                .with_precision_and_scale(10, 2)
                .expect("decimal(10,2)"),
            ),
        ),
        (
            "at",
            Arc::new(
                arrow_array::TimestampNanosecondArray::from(
                    ids.iter()
                        .map(|i| 1_704_067_200_000_000_000 + i * 1_000_000_000)
                        .collect::<Vec<_>>(),
                )
                .with_timezone("+02:00"),
            ),
        ),
        (
            "name",
            Arc::new(StringArray::from(
                ids.iter().map(|i| format!("n{i}")).collect::<Vec<_>>(),
            )),
        ),
    ];
    if tags {
        let mut b = ListBuilder::new(StringBuilder::new());
        for i in &ids {
            b.values().append_value("a");
            b.values().append_value(format!("t{}", i % 3));
            b.append(true);
        }
        columns.push(("tags", Arc::new(b.finish())));
    }
    if qty {
        columns.push((
            "qty",
            Arc::new(arrow_array::Int32Array::from(
                ids.iter().map(|i| (i % 10) as i32).collect::<Vec<_>>(),
            )),
        ));
    }
    write_parquet(path, columns);
}

/// Parquet files are a typed source: each stream's columns are the union of
/// its files' (decimals stay decimals, timestamps become microseconds in
/// UTC, a list travels as its text, a column a file lacks is null), read
/// exactly once across a crash at the commit point, and a later file is
/// read on its own; a file whose column does not fit stops the stream
/// naming both files.
#[tokio::test]
async fn parquet_files_sync_typed_and_exactly_once_from_file_and_row() {
    let db = TestDb::new().await;
    let dir = scratch("parquet-src");
    let (input, out, store) = (dir.join("in"), dir.join("out"), dir.join("store"));
    events_file(
        &input.join("events/2024-01-01.parquet"),
        1,
        2_501,
        true,
        false,
    );
    events_file(
        &input.join("events/2024-01-02.parquet"),
        2_501,
        5_001,
        false,
        true,
    );
    std::fs::write(input.join("events/notes.txt"), "not a stream file").expect("other file");
    define_files(&db, &input, "parquet", "events/*.parquet", &out).await;

    // A crash at the commit point of epoch 2, then an attempt to the end:
    // 1 000 rows an epoch, so a file's second row group starts mid-epoch.
    let o = engine(&db, &store, 1_000)
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "2")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["recovery"], "apply epoch 2 to events, then resume");
    let batches = published(&out, "events");
    let (n, ids, orca_ids, sum) = tally(&batches);
    assert_eq!((n, ids, orca_ids), (5_000, 5_000, 5_000), "every row once");
    assert_eq!(sum, 5_000 * 5_001 / 2);
    let last = batches.last().expect("a batch");
    let schema = last.schema();
    let ty = |c: &str| schema.field_with_name(c).expect(c).data_type().clone();
    assert_eq!(ty("amount"), arrow_schema::DataType::Decimal128(10, 2));
    assert_eq!(
        ty("at"),
        arrow_schema::DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some("UTC".into()))
    );
    assert_eq!(ty("qty"), arrow_schema::DataType::Int32);
    assert_eq!(ty("tags"), arrow_schema::DataType::Utf8);
    // Row 7 of the first file, as its file holds it.
    let row7 = batches
        .iter()
        .find_map(|b| {
            let id = column::<Int64Array>(b, "id");
            (0..b.num_rows())
                .find(|&i| id.value(i) == 7)
                .map(|i| (b.clone(), i))
        })
        .expect("row 7");
    let (b, i) = row7;
    assert_eq!(column::<Decimal128Array>(&b, "amount").value(i), 705);
    assert_eq!(
        column::<arrow_array::TimestampMicrosecondArray>(&b, "at").value(i),
        1_704_067_207_000_000
    );
    assert_eq!(column::<StringArray>(&b, "tags").value(i), "[a, t1]");
    assert!(column::<arrow_array::Int32Array>(&b, "qty").is_null(i));

    // A later file: the next attempt reads only it, its int64 qty widening
    // the stream's int32.
    let published_before = all_files(&out.join("events"), "parquet").len();
    {
        use std::sync::Arc;
        write_parquet(
            &input.join("events/2024-01-03.parquet"),
            vec![
                ("id", Arc::new(Int64Array::from(vec![5_001i64, 5_002]))),
                (
                    "qty",
                    Arc::new(Int64Array::from(vec![10_000_000_000i64, 2])),
                ),
            ],
        );
    }
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], 2, "{outcome}");
    assert_eq!(
        all_files(&out.join("events"), "parquet").len(),
        published_before + 1
    );
    let (n, ids, _, _) = tally(&published(&out, "events"));
    assert_eq!((n, ids), (5_002, 5_002));

    // A column two files give types that do not widen stops the stream
    // before anything moves, naming both files.
    {
        use std::sync::Arc;
        write_parquet(
            &input.join("events/2024-01-04.parquet"),
            vec![
                ("id", Arc::new(Int64Array::from(vec![5_003i64]))),
                ("name", Arc::new(Int64Array::from(vec![1i64]))),
            ],
        );
    }
    let head_before = head(&db).await.0;
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("column name is text in events/2024-01-01.parquet and bigint in events/2024-01-04.parquet"),
        "{err}"
    );
    assert_eq!(head(&db).await.0, head_before, "nothing moved");

    // A file that is a link to one outside the source's directory is
    // refused, whatever it holds.
    std::fs::remove_file(input.join("events/2024-01-04.parquet")).expect("remove");
    let elsewhere = dir.join("elsewhere/x.parquet");
    events_file(&elsewhere, 9_000, 9_010, false, false);
    std::os::unix::fs::symlink(&elsewhere, input.join("events/2024-01-05.parquet"))
        .expect("a link");
    let o = engine(&db, &store, 1_000).output().expect("engine");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(
            "events/2024-01-05.parquet: refused: it resolves outside the source's directory"
        ),
        "{err}"
    );
    assert_eq!(head(&db).await.0, head_before, "nothing moved");
    let _ = std::fs::remove_dir_all(dir);
}

/// Through a runner (its pump describes the files and reads them, the
/// engine gets typed batches over the data edge) into an Iceberg table
/// merged by key: a file that updates some ids leaves one row per id.
#[tokio::test]
async fn parquet_files_come_over_the_data_edge_and_merge_into_iceberg() {
    let db = TestDb::new().await;
    let dir = scratch("parquet-edge");
    let (input, wh, store, logs) = (
        dir.join("in"),
        dir.join("wh"),
        dir.join("store"),
        dir.join("logs"),
    );
    events_file(&input.join("events/a.parquet"), 1, 3_001, false, true);
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3, NULL, 'effectively_once')")
        .bind(json!({"type": "files", "url": input.to_string_lossy(), "format": "parquet"}))
        .bind(json!({"type": "iceberg", "namespace": "raw"}))
        .bind(
            json!([{"name": "events", "pattern": "events/*.parquet", "mode": "merge",
                      "primary_key": ["id"]}]),
        )
        .execute(&db.pool)
        .await
        .expect("a parquet sync into Iceberg");
    let whs = wh.to_string_lossy().to_string();
    let runner = sync_runner_with(&db, &store, &logs, &[("ORCA_WAREHOUSE", &whs)]);
    let run_once = || async {
        let r = db.scalar_i64("SELECT orca.run('shop', 'now')").await;
        wait_run(&db, r, "succeeded", &runner).await;
    };
    run_once().await;
    // Ids 2 001..4 000 again, with new quantities: half update, half are new.
    {
        use std::sync::Arc;
        let ids: Vec<i64> = (2_001..4_001).collect();
        write_parquet(
            &input.join("events/b.parquet"),
            vec![
                ("id", Arc::new(Int64Array::from(ids.clone()))),
                (
                    "qty",
                    Arc::new(arrow_array::Int32Array::from(vec![1_000i32; ids.len()])),
                ),
            ],
        );
    }
    run_once().await;
    let stats = pyiceberg(&["stats", &db.url(), &whs, "raw.events", "id"]);
    assert_eq!(
        (&stats["rows"], &stats["distinct"]),
        (&json!(4_000), &json!(4_000)),
        "{stats}"
    );
    let qty = pyiceberg(&["stats", &db.url(), &whs, "raw.events", "qty"]);
    // Ids 1..2 000 keep id % 10; 2 001..4 000 are 1 000 each.
    let kept: i64 = (1..=2_000).map(|i| i % 10).sum();
    assert_eq!(qty["sum"], kept + 2_000 * 1_000, "{qty}");
    let logs: String = all_files(&store.join("default/shop/_logs"), "jsonl")
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect();
    assert!(
        logs.contains("\"event\":\"edge\""),
        "the source came over the edge: {logs}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Rows `from..=to` of an events table as JSON: an id and a name.
fn events_rows(from: i64, to: i64) -> String {
    json!((from..=to)
        .map(|i| json!({"id": i, "name": format!("n{i}")}))
        .collect::<Vec<_>>())
    .to_string()
}

/// An Iceberg source reads data files by the columns' field ids, as every
/// Iceberg reader must: a column renamed by another engine (PyIceberg) keeps
/// its values from the files written before the rename, and a column added
/// later under the old name (a new field id) is null in those files rather
/// than filled with the renamed column's values.
#[tokio::test]
async fn an_iceberg_source_reads_renamed_columns_by_their_field_ids() {
    let db = TestDb::new().await;
    let dir = scratch("ice-evolve");
    let (wh, out, store) = (dir.join("wh"), dir.join("out"), dir.join("store"));
    let org_wh = format!("{}/default", wh.to_string_lossy());
    let url = db.url();
    pyiceberg(&["create", &url, &org_wh, "lake.people", &events_rows(1, 100)]);
    let evolved = pyiceberg(&[
        "evolve",
        &url,
        &org_wh,
        "lake.people",
        r#"[["rename", "name", "label"], ["add", "name", "string"]]"#,
    ]);
    let later = json!((101..=150)
        .map(|i| json!({"id": i, "label": format!("l{i}"), "name": format!("new{i}")}))
        .collect::<Vec<_>>())
    .to_string();
    pyiceberg(&["append", &url, &org_wh, "lake.people", &later]);
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "iceberg"}))
        .bind(json!({"type": "parquet", "url": out.to_string_lossy()}))
        .bind(json!([{"name": "people", "table": "lake.people"}]))
        .execute(&db.pool)
        .await
        .expect("a sync of an evolved Iceberg table");
    let o = into_iceberg(&db, &store, 1_000, &wh)
        .output()
        .expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let mut seen = std::collections::BTreeMap::new();
    for b in published(&out, "people") {
        let id = column::<Int64Array>(&b, "id");
        let label = column::<StringArray>(&b, "label");
        let name = column::<StringArray>(&b, "name");
        for i in 0..b.num_rows() {
            let text = |a: &StringArray| a.is_valid(i).then(|| a.value(i).to_string());
            seen.insert(id.value(i), (text(label), text(name)));
        }
    }
    assert_eq!(seen.len(), 150, "{evolved}");
    for (id, (label, name)) in &seen {
        let want = if *id <= 100 {
            (Some(format!("n{id}")), None)
        } else {
            (Some(format!("l{id}")), Some(format!("new{id}")))
        };
        assert_eq!(
            (label, name),
            (&want.0, &want.1),
            "row {id}; schema {evolved}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A table of the org's own lake is a source: read at its current snapshot
/// (two appends made it), exactly once across a crash at the commit point;
/// then only what later appends add; a snapshot that overwrote rows stops
/// the stream before anything moves, naming it; a table the org's catalog
/// does not hold is refused by name.
#[tokio::test]
async fn an_iceberg_table_syncs_at_a_snapshot_then_by_the_snapshots_appended_after_it() {
    let db = TestDb::new().await;
    let dir = scratch("ice-src");
    let (wh, out, store) = (dir.join("wh"), dir.join("out"), dir.join("store"));
    let org_wh = format!("{}/default", wh.to_string_lossy());
    let url = db.url();
    pyiceberg(&["create", &url, &org_wh, "lake.events", &events_rows(1, 500)]);
    pyiceberg(&[
        "append",
        &url,
        &org_wh,
        "lake.events",
        &events_rows(501, 1_000),
    ]);
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "iceberg"}))
        .bind(json!({"type": "parquet", "url": out.to_string_lossy()}))
        .bind(json!([{"name": "events", "table": "lake.events"}]))
        .execute(&db.pool)
        .await
        .expect("an exactly-once sync of an Iceberg table");
    let run = || into_iceberg(&db, &store, 300, &wh);
    let o = run()
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "2")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "{}", text(&o));
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["recovery"], "apply epoch 2 to events, then resume");
    let (n, ids, orca_ids, sum) = tally(&published(&out, "events"));
    assert_eq!((n, ids, orca_ids), (1_000, 1_000, 1_000), "every row once");
    assert_eq!(sum, 1_000 * 1_001 / 2);

    // A later append: the next attempt reads only its rows; then nothing.
    pyiceberg(&[
        "append",
        &url,
        &org_wh,
        "lake.events",
        &events_rows(1_001, 1_200),
    ]);
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], 200, "{outcome}");
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], 0, "{outcome}");
    let (n, ids, _, _) = tally(&published(&out, "events"));
    assert_eq!((n, ids), (1_200, 1_200));

    // A compaction (a replace snapshot: the same rows in other files)
    // brings nothing, and the stream moves past it.
    let config = orca_lake::LakeConfig {
        catalog_url: Some(db.url()),
        warehouse: format!("file://{}", wh.display()),
        org: "default".into(),
        lease: None,
    };
    // The lake blocks on a runtime of its own: off this test's.
    let compacted = tokio::task::spawn_blocking(move || {
        let lake = orca_lake::Lake::open(&config).expect("the lake");
        let table = orca_lake::table::load(&lake, "lake.events").expect("the table");
        let opts = orca_lake::maintain::CompactOptions {
            small_bytes: 1 << 30,
            min_files: 2,
        };
        orca_lake::maintain::compact(
            &lake,
            &table,
            &opts,
            std::collections::HashMap::new(),
            "test-compact".into(),
        )
        .expect("a compaction")
        .snapshot
    })
    .await
    .expect("the compaction's thread");
    assert!(compacted.is_some(), "it compacted");
    let o = run().output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    let outcome: Value = serde_json::from_slice(&o.stdout).expect("outcome JSON");
    assert_eq!(outcome["rows"], 0, "{outcome}");
    let record: String =
        sqlx::query_scalar("SELECT head_record FROM orca.syncs WHERE name = 'shop'")
            .fetch_one(&db.pool)
            .await
            .expect("a HEAD record");
    let record: Value =
        serde_json::from_slice(&std::fs::read(store.join(&record)).expect("the record"))
            .expect("record JSON");
    let position = &record["streams"]["events"]["position"];
    assert_eq!(position[0], "done", "{record}");
    let (n, ids, _, _) = tally(&published(&out, "events"));
    assert_eq!((n, ids), (1_200, 1_200));

    // An overwrite cannot be read as an increment (PyIceberg overwrites
    // with a delete snapshot, then an append).
    pyiceberg(&[
        "overwrite",
        &url,
        &org_wh,
        "lake.events",
        &events_rows(1, 3),
    ]);
    let head_before = head(&db).await.0;
    let o = run().output().expect("engine");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("of lake.events deleted rows: an iceberg stream reads what appends add"),
        "{err}"
    );
    assert_eq!(head(&db).await.0, head_before, "nothing moved");

    // A table the org's catalog does not hold.
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "iceberg"}))
        .bind(json!({"type": "parquet", "url": out.to_string_lossy()}))
        .bind(json!([{"name": "nope", "table": "lake.nope"}]))
        .execute(&db.pool)
        .await
        .expect("redefined");
    let o = run().output().expect("engine");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("table lake.nope is not in org default's catalog"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Through a runner (the engine reads the lake itself, under its lease)
/// into an Iceberg table merged by key.
#[tokio::test]
async fn an_iceberg_source_syncs_through_a_runner_into_a_merged_iceberg_table() {
    let db = TestDb::new().await;
    let dir = scratch("ice-src-runner");
    let (wh, store, logs) = (dir.join("wh"), dir.join("store"), dir.join("logs"));
    let whs = wh.to_string_lossy().to_string();
    let org_wh = format!("{whs}/default");
    let url = db.url();
    pyiceberg(&["create", &url, &org_wh, "lake.events", &events_rows(1, 800)]);
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3, NULL, 'effectively_once')")
        .bind(json!({"type": "iceberg", "batch_rows": 250}))
        .bind(json!({"type": "iceberg", "namespace": "mirror"}))
        .bind(
            json!([{"name": "events", "table": "lake.events", "mode": "merge",
                      "primary_key": ["id"]}]),
        )
        .execute(&db.pool)
        .await
        .expect("a lake to lake sync");
    let runner = sync_runner_with(&db, &store, &logs, &[("ORCA_WAREHOUSE", &whs)]);
    for rows in [events_rows(801, 1_000), events_rows(1_001, 1_100)] {
        let r = db.scalar_i64("SELECT orca.run('shop', 'now')").await;
        wait_run(&db, r, "succeeded", &runner).await;
        pyiceberg(&["append", &url, &org_wh, "lake.events", &rows]);
    }
    let r = db.scalar_i64("SELECT orca.run('shop', 'now')").await;
    wait_run(&db, r, "succeeded", &runner).await;
    let stats = pyiceberg(&["stats", &url, &whs, "mirror.events", "id"]);
    assert_eq!(
        (&stats["rows"], &stats["distinct"], &stats["sum"]),
        (&json!(1_100), &json!(1_100), &json!(1_100 * 1_101 / 2)),
        "{stats}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
