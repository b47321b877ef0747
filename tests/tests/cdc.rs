//! The postgres_cdc source end to end: real orca-engine processes read a
//! real table's snapshot and then its changes by logical replication from a
//! slot on this machine's cluster (wal_level = logical, set up by
//! scripts/setup.sh), into a merged table and a change log in Postgres.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use orca_tests::procs::bin;
use orca_tests::sqlx;
use orca_tests::*;
use serde_json::{json, Value};

fn engine(db: &TestDb, store: &Path, batch_rows: usize) -> Command {
    let mut c = Command::new(bin("orca-engine"));
    c.args(["sync", "shop", "--batch-rows", &batch_rows.to_string()])
        .arg("--store")
        .arg(store)
        .env("DATABASE_URL", db.url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run_engine(db: &TestDb, store: &Path, batch_rows: usize) -> Value {
    let o = engine(db, store, batch_rows).output().expect("engine");
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).expect("outcome JSON")
}

async fn exec(db: &TestDb, sql: &str) {
    sqlx::raw_sql(sql)
        .execute(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The source: orders of mixed types, a TOASTable note among them.
async fn make_source(db: &TestDb, rows: i64) {
    exec(
        db,
        &format!(
            "CREATE TABLE public.orders (
                 id bigint PRIMARY KEY,
                 customer text NOT NULL,
                 amount numeric(12,2),
                 qty integer,
                 ok boolean,
                 placed timestamptz,
                 day date,
                 tags text[],
                 note text);
             ALTER TABLE public.orders REPLICA IDENTITY FULL;
             INSERT INTO public.orders
             SELECT g, 'c' || (g % 97), (g * 1.25)::numeric(12,2), (g % 7)::int, g % 2 = 0,
                    '2024-01-01'::timestamptz + g * interval '1 minute',
                    '2024-01-01'::date + (g % 300)::int,
                    ARRAY['t' || (g % 3), 'x'], NULL
             FROM generate_series(1, {rows}) g;"
        ),
    )
    .await;
}

async fn define(db: &TestDb) {
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "postgres_cdc", "url": db.url()}))
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
        .bind(json!([
            {"name": "orders", "table": "public.orders", "primary_key": ["id"], "mode": "merge"},
            {"name": "changes", "table": "public.orders", "primary_key": ["id"], "mode": "append"}
        ]))
        .execute(&db.pool)
        .await
        .expect("create_sync");
}

/// Rows of raw.orders that differ from public.orders.
async fn differences(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM public.orders o FULL JOIN raw.orders r USING (id)
         WHERE o.id IS NULL OR r.id IS NULL
            OR (o.customer, o.amount, o.qty, o.ok, o.placed, o.day, o.tags::text, o.note)
               IS DISTINCT FROM
               (r.customer, r.amount, r.qty, r.ok, r.placed, r.day, r.tags, r.note)",
    )
    .await
}

/// The LSN of HEAD's resume point (the orders stream's), from its record.
async fn head_lsn(db: &TestDb, store: &Path) -> String {
    let record = db
        .strings("SELECT head_record FROM orca.syncs WHERE name = 'shop'")
        .await
        .into_iter()
        .next()
        .expect("a HEAD record");
    let body = std::fs::read(store.join(&record)).expect("the record");
    let v: Value = serde_json::from_slice(&body).expect("record JSON");
    v["streams"]["orders"]["position"][1]
        .as_str()
        .unwrap_or_else(|| panic!("no LSN in {v}"))
        .to_string()
}

async fn slot(db: &TestDb) -> Option<String> {
    db.strings("SELECT slot FROM orca.cdc_slots WHERE sync = 'shop' AND on_this_server")
        .await
        .into_iter()
        .next()
}

#[tokio::test]
async fn a_snapshot_then_changes_land_merged_and_logged_with_deletes_and_the_slot_goes_with_the_sync(
) {
    let db = TestDb::new().await;
    make_source(&db, 2_000).await;
    define(&db).await;
    let dir = scratch("cdc-basic");
    let store = dir.join("store");

    // The first attempt: the slot's exported snapshot, in epochs of 500.
    let out = run_engine(&db, &store, 500);
    assert_eq!(out["rows"], 4_000, "each stream read the table: {out}");
    assert_eq!(differences(&db).await, 0, "the snapshot is the table");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.changes WHERE NOT _orca_deleted")
            .await,
        2_000
    );
    let slot_name = slot(&db).await.expect("the sync's slot on this server");
    assert!(slot_name.starts_with("orca_shop_"), "{slot_name}");

    // Changes in transactions: inserts, updates (one moves its key, one
    // sets a long TOASTed note), deletes.
    exec(
        &db,
        "BEGIN;
         INSERT INTO public.orders (id, customer, amount) SELECT g, 'new', 1 FROM generate_series(3001, 3010) g;
         UPDATE public.orders SET amount = amount + 1, ok = NOT ok WHERE id BETWEEN 1 AND 20;
         COMMIT;
         UPDATE public.orders SET id = 5000 WHERE id = 21;
         UPDATE public.orders SET note = repeat('long note ', 10000) WHERE id = 22;
         UPDATE public.orders SET qty = 99 WHERE id = 22;
         DELETE FROM public.orders WHERE id BETWEEN 100 AND 104;
         DELETE FROM public.orders WHERE id = 3001;",
    )
    .await;
    let out = run_engine(&db, &store, 500);
    assert_eq!(
        differences(&db).await,
        0,
        "the merge equals the source: {out}"
    );
    let log = |sql: &'static str| db.scalar_i64(sql);
    assert_eq!(
        log("SELECT count(*) FROM raw.changes WHERE _orca_deleted").await,
        7,
        "five deletes, one for the moved key's old row, and the deleted insert"
    );
    assert_eq!(
        log("SELECT count(*) FROM raw.changes").await,
        2_000 + 10 + 20 + 3 + 1 + 6,
        "every change once after the snapshot"
    );
    assert_eq!(
        log("SELECT count(*) FROM raw.changes WHERE id = 3001").await,
        2,
        "an insert and its delete"
    );
    // Changes carry their commit's LSN, after the snapshot's.
    assert_eq!(
        log("SELECT count(*) FROM raw.changes WHERE _orca_lsn = (SELECT min(_orca_lsn) FROM raw.changes)")
            .await,
        2_000,
        "the snapshot's rows, and only they, carry its LSN"
    );

    // Nothing new: nothing moves, and the slot is not behind the
    // committed epochs.
    let out = run_engine(&db, &store, 500);
    assert_eq!(out["rows"], 0, "{out}");
    let head = head_lsn(&db, &store).await;
    let ahead = db
        .scalar_i64(&format!(
            "SELECT count(*) FROM pg_replication_slots
             WHERE slot_name = '{slot_name}' AND confirmed_flush_lsn > '{head}'::pg_lsn"
        ))
        .await;
    assert_eq!(ahead, 0, "the slot never confirms past HEAD ({head})");
    let held = db
        .strings("SELECT held_back::text FROM orca.cdc_slots WHERE sync = 'shop'")
        .await;
    assert_eq!(
        held,
        ["true"],
        "an unscheduled sync with no run holds its slot back"
    );

    // Dropping the sync drops its slot and publication.
    exec(&db, "SELECT orca.drop_sync('shop')").await;
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot_name}'"
        ))
        .await,
        0
    );
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pg_publication WHERE pubname = '{slot_name}'"
        ))
        .await,
        0
    );
    let _ = std::fs::remove_dir_all(dir);
}
