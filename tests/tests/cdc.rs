//! The postgres_cdc source end to end: real orca-engine processes read a
//! real table's snapshot and then its changes by logical replication from a
//! slot on this machine's cluster (wal_level = logical, set up by
//! scripts/setup.sh), into a merged table and a change log in Postgres.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use orca_tests::procs::{bin, processes_with_env, pyiceberg, sync_runner, text};
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
async fn head_lsn(pool: &sqlx::PgPool, store: &Path) -> String {
    let record: String =
        sqlx::query_scalar("SELECT head_record FROM orca.syncs WHERE name = 'shop'")
            .fetch_one(pool)
            .await
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
    let head = head_lsn(&db.pool, &store).await;
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
    // A discovery of its source queued meanwhile reads no slot: the slot is
    // still held back.
    let discovery = db.scalar_i64("SELECT orca.discover('shop')").await;
    let held = db
        .strings("SELECT held_back::text FROM orca.cdc_slots WHERE sync = 'shop'")
        .await;
    assert_eq!(held, ["true"], "a discovery run reads no slot");
    exec(&db, &format!("SELECT orca.cancel({discovery})")).await;

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

/// A snapshot cut short by a crash is read on in a later snapshot (a
/// temporary slot's), made to stand for the table at the slot's point
/// (REPLICA IDENTITY FULL): the change log is the table at that point and
/// every change after it once, rows inserted and deleted meanwhile too (the
/// chaos suite's seed 72376 lost those), and the merge equals the source.
#[tokio::test]
async fn a_snapshot_cut_short_by_a_crash_goes_on_and_shows_no_change_twice() {
    let db = TestDb::new().await;
    make_source(&db, 3_000).await;
    define(&db).await;
    let dir = scratch("cdc-resnap");
    let store = dir.join("store");
    // Epochs of 500: the merge's snapshot is epochs 1-6, the change log's
    // 7-12; the engine dies once HEAD is at 8.
    let o = engine(&db, &store, 500)
        .env("ORCA_ENGINE_CRASH_AFTER_HEAD", "8")
        .output()
        .expect("engine");
    assert!(!o.status.success(), "it was to crash: {}", text(&o));
    let record: String =
        sqlx::query_scalar("SELECT head_record FROM orca.syncs WHERE name = 'shop'")
            .fetch_one(&db.pool)
            .await
            .expect("HEAD");
    let v: Value =
        serde_json::from_slice(&std::fs::read(store.join(&record)).expect("record")).expect("JSON");
    let pos = &v["streams"]["changes"]["position"];
    assert_eq!(pos[0], "snapshot", "{v}");
    assert_eq!(
        pos[2], "1000",
        "the change log's snapshot stands after key 1000: {v}"
    );

    // Meanwhile: updates on both sides of key 1000, deletes and inserts
    // after it, a key moved within the unread part and one moved into it,
    // rows inserted and deleted, one inserted and updated.
    exec(
        &db,
        "UPDATE public.orders SET qty = -id WHERE id % 100 = 7;
         DELETE FROM public.orders WHERE id BETWEEN 2000 AND 2004;
         INSERT INTO public.orders (id, customer, qty) SELECT g, 'late', 1 FROM generate_series(4001, 4005) g;
         UPDATE public.orders SET id = 6000 WHERE id = 2500;
         UPDATE public.orders SET id = 7000 WHERE id = 10;",
    )
    .await;
    for each in [
        "INSERT INTO public.orders (id, customer, qty) SELECT g, 'brief', 1 FROM generate_series(5001, 5003) g",
        "DELETE FROM public.orders WHERE id BETWEEN 5001 AND 5003",
        "INSERT INTO public.orders (id, customer, qty) VALUES (5010, 'late', 1)",
        "UPDATE public.orders SET qty = 2 WHERE id = 5010",
    ] {
        exec(&db, each).await;
    }
    let out = run_engine(&db, &store, 500);
    assert_eq!(
        differences(&db).await,
        0,
        "the merge equals the source: {out}"
    );
    exec(&db, "UPDATE public.orders SET qty = 1 WHERE id = 2600").await;
    let out = run_engine(&db, &store, 500);
    assert_eq!(differences(&db).await, 0, "{out}");

    // The change log: the table at the slot's point (1000 rows read there,
    // 2000 read later as they were then), then every change after it: 30
    // updates, 5 deletes, 5 inserts, two moves (a delete marker and a row
    // each), 3 rows inserted and deleted, one inserted and updated, and
    // the last update.
    let db = &db;
    let log = |sql: String| async move { db.scalar_i64(&sql).await };
    assert_eq!(
        log("SELECT count(*) FROM raw.changes".into()).await,
        3000 + 30 + 5 + 5 + 2 * 2 + 3 * 2 + 2 + 1
    );
    let lsns = db
        .strings(
            "SELECT _orca_lsn::text FROM raw.changes GROUP BY _orca_lsn HAVING count(*) > 100
             ORDER BY _orca_lsn",
        )
        .await;
    assert_eq!(lsns.len(), 1, "one snapshot point: {lsns:?}");
    assert_eq!(
        log(format!(
            "SELECT count(*) FROM raw.changes WHERE _orca_lsn = {}",
            lsns[0]
        ))
        .await,
        3000,
        "the later part's rows carry the slot's point"
    );
    assert_eq!(
        db.strings(
            "SELECT format('%s %s %s', id, _orca_deleted, qty) FROM raw.changes
             WHERE id IN (1007, 2001, 5002, 5010) ORDER BY _orca_lsn, id",
        )
        .await,
        [
            "1007 f 6",
            "2001 f 6",
            "1007 f -1007",
            "2001 t 6",
            "5002 f 1",
            "5002 t 1",
            "5010 f 1",
            "5010 f 2",
        ],
        "a key read later shows its row at the slot's point, then its changes"
    );
    // No change twice: no key has two rows in a row that say the same.
    let twice = log(
        "SELECT count(*) FROM (
             SELECT id, (_orca_deleted, customer, amount, qty, note) AS v,
                    lag((_orca_deleted, customer, amount, qty, note)) OVER (PARTITION BY id ORDER BY _orca_lsn) AS before
             FROM raw.changes) x
         WHERE v IS NOT DISTINCT FROM before"
            .into(),
    )
    .await;
    assert_eq!(twice, 0, "a change shown twice");
    // Replayed, the log is the source: each key's last row.
    let replayed = log(
        "SELECT count(*) FROM public.orders o FULL JOIN (
             SELECT DISTINCT ON (id) * FROM raw.changes ORDER BY id, _orca_lsn DESC) c USING (id)
         WHERE o.id IS NULL AND NOT c._orca_deleted
            OR c.id IS NULL
            OR o.id IS NOT NULL AND (c._orca_deleted OR (o.qty, o.customer) IS DISTINCT FROM (c.qty, c.customer))"
            .into(),
    )
    .await;
    assert_eq!(replayed, 0, "the log replayed is the source");
    let slot_name = slot(db).await.expect("the sync's slot");
    exec(db, "SELECT orca.drop_sync('shop')").await;
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE starts_with(slot_name, '{slot_name}')"
        ))
        .await,
        0,
        "no temporary slot left either"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Crashed twice in its snapshot, over a text key of its own collation
/// (ICU's, whose order is not the database's C order), with the key's
/// index as replica identity, a change log still holds no change twice:
/// each later part of the snapshot is a window kept in the resume point
/// across attempts, and which window a key falls in is the column's
/// collation's call.
#[tokio::test]
async fn a_snapshot_crashed_twice_over_a_collated_key_shows_no_change_twice() {
    crashed_twice_over_a_collated_key(Identity::Key).await;
}

/// The same under REPLICA IDENTITY FULL: each later part is read as of the
/// slot's point, in the collation's order, so the change log is the table
/// at that point and every change after it.
#[tokio::test]
async fn a_snapshot_crashed_twice_over_a_collated_key_logs_every_change_under_full_identity() {
    crashed_twice_over_a_collated_key(Identity::Full).await;
}

/// Made FULL after the first crash: the changes made before carry no old
/// rows, so the later parts are windows, as under the key's identity.
#[tokio::test]
async fn a_snapshot_whose_table_became_full_identity_meanwhile_falls_back_to_windows() {
    crashed_twice_over_a_collated_key(Identity::FullAfterFirstCrash).await;
}

#[derive(Clone, Copy, PartialEq)]
enum Identity {
    Key,
    Full,
    FullAfterFirstCrash,
}

async fn crashed_twice_over_a_collated_key(identity: Identity) {
    let full = identity == Identity::Full;
    let db = TestDb::new().await;
    // k00001, K00002, k00003...: in ICU order as numbered, in C order every
    // upper-case name before every lower-case one.
    exec(
        &db,
        "CREATE TABLE public.names (name text COLLATE \"und-x-icu\" PRIMARY KEY, n integer);
         INSERT INTO public.names
         SELECT CASE WHEN g % 2 = 0 THEN 'K' ELSE 'k' END || lpad(g::text, 5, '0'), g
         FROM generate_series(1, 1200) g;",
    )
    .await;
    if full {
        exec(&db, "ALTER TABLE public.names REPLICA IDENTITY FULL").await;
    }
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "postgres_cdc", "url": db.url()}))
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
        .bind(json!([
            {"name": "names", "table": "public.names", "primary_key": ["name"], "mode": "merge"},
            {"name": "log", "table": "public.names", "primary_key": ["name"], "mode": "append"}
        ]))
        .execute(&db.pool)
        .await
        .expect("create_sync");
    let dir = scratch("cdc-collated");
    let store = dir.join("store");
    let position = || async {
        let record: String =
            sqlx::query_scalar("SELECT head_record FROM orca.syncs WHERE name = 'shop'")
                .fetch_one(&db.pool)
                .await
                .expect("HEAD");
        let v: Value = serde_json::from_slice(&std::fs::read(store.join(&record)).expect("record"))
            .expect("JSON");
        v["streams"]["log"]["position"].clone()
    };
    let crash_at = |head: &str| {
        let o = engine(&db, &store, 200)
            .env("ORCA_ENGINE_CRASH_AFTER_HEAD", head)
            .output()
            .expect("engine");
        assert!(!o.status.success(), "it was to crash: {}", text(&o));
    };
    // Epochs of 200: the merge's snapshot is epochs 1-6, the log's 7-12.
    crash_at("8");
    let p = position().await;
    assert_eq!(
        (p[0].clone(), p[2].clone()),
        (json!("snapshot"), json!("K00400")),
        "{p}"
    );
    // Names up to K00400 were read at the slot's point; k00051 is one of
    // them, though C orders it after K00400.
    exec(&db, "UPDATE public.names SET n = -n WHERE n % 50 IN (0, 1)").await;
    if identity == Identity::FullAfterFirstCrash {
        exec(&db, "ALTER TABLE public.names REPLICA IDENTITY FULL").await;
    }
    crash_at("10");
    let p = position().await;
    if full {
        assert_eq!(
            (p[0].clone(), p[2].clone()),
            (json!("snapshot"), json!("K00800")),
            "no window: the part stands for the slot's point: {p}"
        );
    } else {
        assert_eq!(
            p[0], "snapshot+",
            "the window rides in the resume point: {p}"
        );
        assert_eq!(p[3], "K00800", "{p}");
    }
    exec(
        &db,
        "UPDATE public.names SET n = n + 100000 WHERE n % 50 = 3",
    )
    .await;
    let out = run_engine(&db, &store, 200);
    let differ = "SELECT count(*) FROM public.names s FULL JOIN raw.names r USING (name)
                  WHERE s.name IS NULL OR r.name IS NULL OR s.n IS DISTINCT FROM r.n";
    assert_eq!(
        db.scalar_i64(differ).await,
        0,
        "the merge equals the source: {out}"
    );
    if full {
        // The log: the 1200 names at the slot's point, then every update
        // after it (48 and 24).
        assert_eq!(
            db.scalar_i64("SELECT count(*) FROM raw.log").await,
            1200 + 48 + 24,
            "{out}"
        );
        assert_eq!(
            db.scalar_i64(
                "SELECT count(*) FROM raw.log WHERE _orca_lsn = (SELECT min(_orca_lsn) FROM raw.log)"
            )
            .await,
            1200,
            "every snapshot row carries the slot's point"
        );
        assert_eq!(
            db.scalar_i64(
                "SELECT count(*) FROM raw.log l JOIN raw.log f USING (name)
                 WHERE l._orca_lsn = (SELECT min(_orca_lsn) FROM raw.log)
                   AND f._orca_lsn > l._orca_lsn AND l.n < 0"
            )
            .await,
            0,
            "a snapshot row shows no later update"
        );
    } else {
        // The log: three snapshots of 400 names each, the first crash's 16
        // updates of names read before it, the second's 16 of names read
        // before or in the first window (those after it are in the second).
        assert_eq!(
            db.scalar_i64("SELECT count(*) FROM raw.log").await,
            1200 + 16 + 16,
            "{out}"
        );
    }
    let twice = db
        .scalar_i64(
            "SELECT count(*) FROM (
                 SELECT (_orca_deleted, n) AS v,
                        lag((_orca_deleted, n)) OVER (PARTITION BY name ORDER BY _orca_lsn) AS before
                 FROM raw.log) x
             WHERE v IS NOT DISTINCT FROM before",
        )
        .await;
    assert_eq!(twice, 0, "a change shown twice");
    let replayed = db
        .scalar_i64(
            "SELECT count(*) FROM public.names s FULL JOIN (
                 SELECT DISTINCT ON (name) * FROM raw.log ORDER BY name, _orca_lsn DESC) l
               USING (name)
             WHERE s.name IS NULL OR l.name IS NULL OR s.n IS DISTINCT FROM l.n",
        )
        .await;
    assert_eq!(replayed, 0, "the log replayed is the source");
    exec(&db, "SELECT orca.drop_sync('shop')").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A stream added to a CDC sync reads its snapshot at a later point than
/// where the sync's other streams stand; under REPLICA IDENTITY FULL it is
/// read as of their point, so the new change log is the table there and
/// every change since, as the merge that stood there takes them.
#[tokio::test]
async fn a_stream_added_later_joins_the_change_stream_without_a_change_twice() {
    let db = TestDb::new().await;
    make_source(&db, 1_000).await;
    let orders = json!({"name": "orders", "table": "public.orders", "primary_key": ["id"],
                        "mode": "merge"});
    let define_with = |streams: Value| {
        let db = &db;
        async move {
            sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
                .bind(json!({"type": "postgres_cdc", "url": db.url()}))
                .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
                .bind(streams)
                .execute(&db.pool)
                .await
                .expect("create_sync");
        }
    };
    define_with(json!([orders.clone()])).await;
    let dir = scratch("cdc-added");
    let store = dir.join("store");
    run_engine(&db, &store, 500);
    assert_eq!(differences(&db).await, 0);
    // Changes the merge has not read yet, then a change log joins.
    exec(
        &db,
        "UPDATE public.orders SET qty = -id WHERE id % 10 = 1;
         DELETE FROM public.orders WHERE id BETWEEN 500 AND 504;
         INSERT INTO public.orders (id, customer) VALUES (2001, 'late');",
    )
    .await;
    define_with(json!([orders,
        {"name": "changes", "table": "public.orders", "primary_key": ["id"], "mode": "append"}]))
    .await;
    let out = run_engine(&db, &store, 500);
    assert_eq!(
        differences(&db).await,
        0,
        "the merge took the changes: {out}"
    );
    let log = db.scalar_i64("SELECT count(*) FROM raw.changes").await;
    assert_eq!(
        log,
        1000 + 100 + 5 + 1,
        "the change log is the table at the merge's point (1000 rows), then the 100 \
         updates, 5 deletes and the insert since: {out}"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM raw.changes WHERE _orca_lsn = (SELECT min(_orca_lsn) FROM raw.changes)"
        )
        .await,
        1000
    );
    exec(&db, "UPDATE public.orders SET qty = 7 WHERE id = 2").await;
    run_engine(&db, &store, 500);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.changes").await,
        log + 1,
        "and the changes after it follow"
    );
    assert_eq!(differences(&db).await, 0);
    exec(&db, "SELECT orca.drop_sync('shop')").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes transactions of inserts, updates and deletes at a steady pace
/// until `stop`, and counts them.
async fn writer(url: String, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> u64 {
    use std::sync::atomic::Ordering;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("writer connects");
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let id = 100_000 + n as i64;
        let sql = format!(
            "BEGIN;
             INSERT INTO public.orders (id, customer, amount, qty) VALUES ({id}, 'w', {n}, 1);
             UPDATE public.orders SET amount = amount + 1, qty = qty + 1 WHERE id = {};
             DELETE FROM public.orders WHERE id = {};
             COMMIT;",
            1 + (n * 37) % 5_000,
            if n.is_multiple_of(3) {
                id - 2
            } else {
                5_000 + n as i64
            }
        );
        sqlx::raw_sql(&sql)
            .execute(&pool)
            .await
            .expect("a writer transaction");
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    n
}

/// Whether the slot confirmed past HEAD's resume point: read the slot
/// first, then HEAD (which only moves on), so a true answer is a breach.
async fn confirmed_past_head(pool: &sqlx::PgPool, store: &Path, slot: &str) -> Option<String> {
    let confirmed: String = sqlx::query_scalar(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await
    .expect("the slot")?;
    let head = head_lsn(pool, store).await;
    let past: bool = sqlx::query_scalar("SELECT $1::text::pg_lsn > $2::text::pg_lsn")
        .bind(&confirmed)
        .bind(&head)
        .fetch_one(pool)
        .await
        .expect("compare LSNs");
    past.then(|| format!("slot confirmed {confirmed}, HEAD at {head}"))
}

#[tokio::test]
async fn changes_written_while_engines_are_killed_and_cut_off_land_exactly_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let db = TestDb::new().await;
    make_source(&db, 5_000).await;
    exec(
        &db,
        "CREATE TABLE public.audit (seq bigserial PRIMARY KEY, op text, id bigint, amount numeric(12,2));
         CREATE FUNCTION public.audit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF TG_OP = 'DELETE' THEN
                 INSERT INTO public.audit (op, id, amount) VALUES ('D', OLD.id, NULL);
             ELSE
                 INSERT INTO public.audit (op, id, amount) VALUES (left(TG_OP, 1), NEW.id, NEW.amount);
             END IF;
             RETURN NULL;
         END $$;
         CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON public.orders
             FOR EACH ROW EXECUTE FUNCTION public.audit();",
    )
    .await;
    define(&db).await;
    let dir = scratch("cdc-kills");
    let store = dir.join("store");
    // The snapshot first; the writer's changes all come after it.
    run_engine(&db, &store, 1_000);
    let slot_name = slot(&db).await.expect("the slot");

    let stop = Arc::new(AtomicBool::new(false));
    let writing = tokio::spawn(writer(db.url(), stop.clone()));
    let breach: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let watching = {
        let (pool, store2, slot2, breach2, stop2) = (
            db.pool.clone(),
            store.clone(),
            slot_name.clone(),
            breach.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut looks = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                if let Some(b) = confirmed_past_head(&pool, &store2, &slot2).await {
                    *breach2.lock().expect("breach") = Some(b);
                }
                looks += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            looks
        })
    };

    let mut kills = 0;
    let mut cuts = 0;
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let child = std::cell::RefCell::new(engine(&db, &store, 40).spawn().expect("engine"));
        let before = db
            .scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'shop'")
            .await;
        // Into its stream, then SIGKILL it, or cut its replication
        // connection from the server's side.
        let moved = wait_until(
            "the engine to commit an epoch of changes",
            Duration::from_secs(60),
            || async {
                if let Ok(Some(_)) = child.borrow_mut().try_wait() {
                    return Some(false);
                }
                let h = db
                    .scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'shop'")
                    .await;
                (h >= before + 2).then_some(true)
            },
            String::new,
        )
        .await;
        let mut child = child.into_inner();
        if !moved {
            let _ = child.wait();
            continue;
        }
        if round % 2 == 0 {
            child.kill().expect("SIGKILL the engine");
            kills += 1;
        } else {
            // This test's session only: other tests stream at the same time.
            let cut = db
                .scalar_i64(&format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication
                     WHERE application_name = 'orca {slot_name}'"
                ))
                .await;
            cuts += cut;
        }
        let _ = child.wait();
    }
    stop.store(true, Ordering::Relaxed);
    let written = writing.await.expect("writer");
    let looks = watching.await.expect("watcher");
    eprintln!("{kills} kills, {cuts} cuts, {written} transactions written");
    assert!(kills >= 2 && cuts >= 1, "{kills} kills, {cuts} cuts");
    assert!(written > 100, "the writer wrote {written} transactions");

    // Then to the end: the merge is the table, the log every change once.
    run_engine(&db, &store, 1_000);
    assert_eq!(differences(&db).await, 0, "the merge equals the source");
    let (logged, landed) = change_log_sets(&db.pool).await.expect("the change sets");
    assert_eq!(logged.len(), landed.len(), "as many distinct changes");
    assert_eq!(logged, landed, "every change once, none twice");
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM (
                 SELECT _orca_lsn FROM raw.changes
                 WHERE _orca_lsn > (SELECT min(_orca_lsn) FROM raw.changes)
                 GROUP BY 1 HAVING count(DISTINCT _orca_seq >> 32) > 1) split"
        )
        .await,
        0,
        "a transaction's changes land in one epoch"
    );
    assert!(
        breach.lock().expect("breach").is_none(),
        "{:?} (in {looks} looks)",
        breach.lock().expect("breach")
    );
    exec(&db, "SELECT orca.drop_sync('shop')").await;
    let _ = std::fs::remove_dir_all(dir);
}

async fn run_now(db: &TestDb, runner: &orca_tests::procs::Runner) {
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run now");
    wait_until(
        &format!("run {run} to succeed"),
        Duration::from_secs(120),
        || async {
            let s: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
                .bind(run)
                .fetch_one(&db.pool)
                .await
                .expect("run status");
            assert_ne!(s, "failed", "run {run} failed\n{}", runner.output());
            (s == "succeeded").then_some(())
        },
        || runner.output(),
    )
    .await;
}

/// A runner hosts the change stream (its pump reads the slot, the engine
/// never connects to the source): the engine's acknowledgements come back
/// over the data edge, and the slot lets go of what the epochs committed.
#[tokio::test]
async fn a_runner_hosts_the_change_stream_and_the_slot_follows_the_committed_epochs() {
    let db = TestDb::new().await;
    make_source(&db, 1_000).await;
    define(&db).await;
    let dir = scratch("cdc-runner");
    let store = dir.join("store");
    let runner = sync_runner(&db, &store, &dir.join("logs"));
    run_now(&db, &runner).await;
    assert_eq!(differences(&db).await, 0, "the snapshot");
    let slot_name = slot(&db).await.expect("the slot");
    let confirmed_sql = format!(
        "SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots
         WHERE slot_name = '{slot_name}'"
    );
    let first = db.scalar_i64(&confirmed_sql).await;
    for batch in 0..3 {
        exec(
            &db,
            &format!(
                "INSERT INTO public.orders (id, customer) SELECT g, 'r' FROM generate_series({a}, {b}) g;
                 UPDATE public.orders SET qty = {batch} WHERE id % 10 = {batch};
                 DELETE FROM public.orders WHERE id % 50 = {batch};",
                a = 10_000 + batch * 100,
                b = 10_000 + batch * 100 + 99
            ),
        )
        .await;
        run_now(&db, &runner).await;
        assert_eq!(differences(&db).await, 0, "after changes {batch}");
    }
    let last = db.scalar_i64(&confirmed_sql).await;
    assert!(
        last > first,
        "the slot confirmed what committed epochs hold ({first} -> {last})"
    );
    let head = head_lsn(&db.pool, &store).await;
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT (confirmed_flush_lsn > '{head}'::pg_lsn)::int::bigint FROM pg_replication_slots
             WHERE slot_name = '{slot_name}'"
        ))
        .await,
        0,
        "never past HEAD"
    );
    let lag = db
        .strings(
            "SELECT format('%s %s', active, held_back) FROM orca.cdc_slots WHERE sync = 'shop'",
        )
        .await;
    assert_eq!(lag, ["f t"], "no session, no schedule: held back");
    // The API's syncs say the same.
    let key = orca_tests::serve::api_key(&db, "default", "dash", "viewer").await;
    let server = orca_tests::serve::serve(&db).await;
    let body: Value = reqwest::Client::new()
        .get(format!("{}/api/v1/syncs", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .expect("GET /syncs")
        .json()
        .await
        .expect("JSON");
    assert_eq!(body[0]["slot"], slot_name.as_str(), "{body}");
    assert_eq!(body[0]["slot_held_back"], true, "{body}");
    assert!(body[0]["slot_lag_bytes"].as_i64().is_some(), "{body}");
    drop(server);
    drop(runner);
    exec(&db, "SELECT orca.drop_sync('shop')").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// What an attempt prints on failure.
fn failing(db: &TestDb, store: &Path) -> String {
    let o = engine(db, store, 500).output().expect("engine");
    assert!(!o.status.success(), "the attempt should fail: {}", text(&o));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn a_new_column_evolves_a_dropped_one_stops_the_attempt_and_a_bad_identity_is_refused() {
    let db = TestDb::new().await;
    make_source(&db, 300).await;
    // Default identity with TOASTable columns: refused before anything.
    exec(&db, "ALTER TABLE public.orders REPLICA IDENTITY DEFAULT").await;
    define(&db).await;
    let dir = scratch("cdc-schema");
    let store = dir.join("store");
    let e = failing(&db, &store);
    assert!(
        e.contains("REPLICA IDENTITY FULL") && e.contains("tags, note"),
        "{e}"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'orca_shop_%' AND database = current_database()")
            .await,
        0,
        "no slot made for a refused stream"
    );
    exec(&db, "ALTER TABLE public.orders REPLICA IDENTITY FULL").await;
    run_engine(&db, &store, 500);
    assert_eq!(differences(&db).await, 0);

    // A new column: the attempt ends before the transaction that adds
    // values to it; the next one reads it and the destination widens.
    exec(
        &db,
        "UPDATE public.orders SET qty = 1 WHERE id = 1;
         ALTER TABLE public.orders ADD COLUMN region text;
         UPDATE public.orders SET region = 'eu' WHERE id <= 10;",
    )
    .await;
    run_engine(&db, &store, 500);
    run_engine(&db, &store, 500);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw.orders WHERE region = 'eu'")
            .await,
        10,
        "the new column's values arrived"
    );
    assert_eq!(differences(&db).await, 0);

    // A dropped column stops the attempt, naming it, and moves nothing.
    let head = db
        .scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'shop'")
        .await;
    exec(
        &db,
        "ALTER TABLE public.orders DROP COLUMN note;
         UPDATE public.orders SET qty = 2 WHERE id = 2;",
    )
    .await;
    let e = failing(&db, &store);
    assert!(e.contains("note"), "{e}");
    assert_eq!(
        db.scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'shop'")
            .await,
        head,
        "nothing committed"
    );
    exec(&db, "SELECT orca.drop_sync('shop')").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// An Iceberg merge of a change stream: deletes leave the table (the
/// copy-on-write merge drops the key), as PyIceberg reads it.
#[tokio::test]
async fn a_change_stream_merged_into_iceberg_drops_deleted_keys() {
    let db = TestDb::new().await;
    make_source(&db, 300).await;
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3)")
        .bind(json!({"type": "postgres_cdc", "url": db.url()}))
        .bind(json!({"type": "iceberg", "namespace": "lake_cdc"}))
        .bind(
            json!([{"name": "orders", "table": "public.orders", "primary_key": ["id"],
                      "mode": "merge"}]),
        )
        .execute(&db.pool)
        .await
        .expect("create_sync");
    let dir = scratch("cdc-iceberg");
    let (wh, store) = (dir.join("wh"), dir.join("store"));
    let run = || {
        let mut c = engine(&db, &store, 100);
        c.env("ORCA_WAREHOUSE", &wh);
        let o = c.output().expect("engine");
        assert!(o.status.success(), "{}", text(&o));
    };
    run();
    exec(
        &db,
        "UPDATE public.orders SET qty = 1000 + id WHERE id <= 30;
         DELETE FROM public.orders WHERE id BETWEEN 100 AND 149;
         UPDATE public.orders SET id = 9000 WHERE id = 200;
         INSERT INTO public.orders (id, customer, qty) VALUES (9001, 'x', 5);
         DELETE FROM public.orders WHERE id = 9001;",
    )
    .await;
    run();
    let want = db
        .strings("SELECT id || ':' || coalesce(qty::text, '') FROM public.orders ORDER BY id")
        .await;
    let read = pyiceberg(&["read", &db.url(), &wh.to_string_lossy(), "lake_cdc.orders"]);
    let mut got: Vec<(i64, String)> = read["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            assert_eq!(r["_orca_deleted"], false, "no delete marker is a row: {r}");
            (
                r["id"].as_i64().expect("id"),
                r["qty"].as_i64().map(|q| q.to_string()).unwrap_or_default(),
            )
        })
        .collect();
    got.sort();
    let got: Vec<String> = got.into_iter().map(|(i, q)| format!("{i}:{q}")).collect();
    assert_eq!(got.len(), 300 - 50, "fifty keys deleted, one moved");
    assert_eq!(got, want, "the Iceberg table is the source table");
    exec(&db, "SELECT orca.drop_sync('shop')").await;
    let _ = std::fs::remove_dir_all(dir);
}

async fn runs_of(db: &TestDb, status: &str) -> i64 {
    db.scalar_i64(&format!(
        "SELECT count(*) FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id
         WHERE p.name = 'live' AND r.status = '{status}'"
    ))
    .await
}

/// Rows of raw.orders that differ from public.orders (the continuous sync's
/// merge).
async fn live_differences(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM public.orders o FULL JOIN raw.orders r USING (id)
         WHERE o.id IS NULL OR r.id IS NULL OR o.qty IS DISTINCT FROM r.qty",
    )
    .await
}

/// The continuous sync `live`: public.orders merged into raw.orders, an
/// epoch every second, its run tried `run_retries` more times.
async fn define_live(db: &TestDb, run_retries: i32) {
    sqlx::query(
        "SELECT orca.create_sync('live', $1, $2, $3, NULL, 'at_least_once', 'default', $4)",
    )
    .bind(
        json!({"type": "postgres_cdc", "url": db.url(), "continuous": true,
                     "epoch_seconds": 1}),
    )
    .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
    .bind(
        json!([{"name": "orders", "table": "public.orders", "primary_key": ["id"],
                      "mode": "merge"}]),
    )
    .bind(run_retries)
    .execute(&db.pool)
    .await
    .expect("create_sync");
}

/// Waits until the continuous sync's raw.orders equals the source.
async fn live_equal(db: &TestDb, runner: &orca_tests::procs::Runner, what: &str) {
    wait_until(
        what,
        Duration::from_secs(60),
        || async {
            let t = db
                .scalar_i64(
                    "SELECT count(*) FROM pg_tables WHERE schemaname = 'raw' AND tablename = 'orders'",
                )
                .await;
            (t == 1 && live_differences(db).await == 0).then_some(())
        },
        || runner.output(),
    )
    .await
}

/// Waits until the continuous sync's attempt has let go of its slot.
async fn stopped(db: &TestDb, runner: &orca_tests::procs::Runner) {
    wait_until(
        "the continuous attempt to stop",
        Duration::from_secs(60),
        || async {
            // This database's sync only: other tests stream from the
            // same cluster.
            let active = db
                .scalar_i64(
                    "SELECT count(*) FROM pg_stat_replication r, orca.cdc_slots s
                     WHERE s.sync = 'live' AND r.application_name = 'orca ' || s.slot",
                )
                .await;
            (active == 0).then_some(())
        },
        || runner.output(),
    )
    .await;
}

/// A continuous sync is one long-lived run: changes land while it runs,
/// pausing stops it at an epoch boundary, resuming goes on from HEAD.
#[tokio::test]
async fn a_continuous_sync_streams_on_and_pauses_and_resumes_from_head() {
    let db = TestDb::new().await;
    make_source(&db, 200).await;
    let dir = scratch("cdc-live");
    let store = dir.join("store");
    let runner = sync_runner(&db, &store, &dir.join("logs"));
    define_live(&db, 2).await;
    assert_eq!(
        runs_of(&db, "queued").await + runs_of(&db, "running").await,
        1,
        "creating it started its run"
    );
    let equal = |what: &'static str| live_equal(&db, &runner, what);
    equal("the snapshot to land").await;
    for round in 0..3 {
        exec(
            &db,
            &format!(
                "UPDATE public.orders SET qty = {round} * 100 + id WHERE id % 3 = {round};
                 DELETE FROM public.orders WHERE id = {};
                 INSERT INTO public.orders (id, customer, qty) VALUES ({}, 'live', 1);",
                10 + round,
                1_000 + round
            ),
        )
        .await;
        equal("the changes to land while the run goes on").await;
    }
    assert_eq!(runs_of(&db, "running").await, 1, "still the one run");
    assert_eq!(runs_of(&db, "succeeded").await, 0);

    // Paused: the run is cancelled and its attempt stops; changes wait.
    exec(&db, "SELECT orca.pause_sync('live')").await;
    stopped(&db, &runner).await;
    assert_eq!(runs_of(&db, "cancelled").await, 1);
    exec(&db, "UPDATE public.orders SET qty = -1 WHERE id <= 5").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(live_differences(&db).await, 5, "nothing moves while paused");

    // Resumed: a new run goes on from HEAD.
    let run: Option<i64> = sqlx::query_scalar("SELECT orca.resume_sync('live')")
        .fetch_one(&db.pool)
        .await
        .expect("resume_sync");
    assert!(run.is_some(), "a new run");
    equal("the changes made while paused to land").await;
    exec(&db, "SELECT orca.pause_sync('live')").await;
    stopped(&db, &runner).await;
    drop(runner);
    exec(&db, "SELECT orca.drop_sync('live')").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The lanes of HEAD's record: how many writer lanes its epoch was staged
/// over.
async fn head_lanes(db: &TestDb, store: &Path) -> Option<usize> {
    let record: Option<String> =
        sqlx::query_scalar("SELECT head_record FROM orca.syncs WHERE name = 'live'")
            .fetch_one(&db.pool)
            .await
            .expect("HEAD");
    let body = std::fs::read(store.join(record?)).ok()?;
    let v: Value = serde_json::from_slice(&body).ok()?;
    Some(v["committables"].as_array()?.len())
}

/// A continuous sync scaled while it runs takes its new lanes at an epoch
/// boundary: the same run and attempt go on, later epochs are staged over
/// the new lanes, and the merge stays equal to the source.
#[tokio::test]
async fn a_continuous_sync_scales_its_lanes_without_a_new_attempt() {
    let db = TestDb::new().await;
    make_source(&db, 300).await;
    let dir = scratch("cdc-scale");
    let store = dir.join("store");
    let runner = sync_runner(&db, &store, &dir.join("logs"));
    define_live(&db, 0).await;
    live_equal(&db, &runner, "the snapshot to land").await;
    assert_eq!(head_lanes(&db, &store).await, Some(1));
    let attempts = "SELECT count(*) FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id
                    JOIN orca.pipelines p ON p.id = r.pipeline_id WHERE p.name = 'live'";
    assert_eq!(db.scalar_i64(attempts).await, 1);

    for (round, lanes) in [(1_i64, 3_i64), (2, 1)] {
        let was = db
            .scalar_i64(&format!("SELECT orca.scale_sync('live', {lanes})::bigint"))
            .await;
        assert_eq!(was, if lanes == 3 { 1 } else { 3 }, "the lanes it had");
        wait_until(
            &format!("epochs staged over {lanes} lanes"),
            Duration::from_secs(60),
            || async {
                exec(
                    &db,
                    &format!("UPDATE public.orders SET qty = {round} * 1000 + id WHERE id % 10 = {round}"),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                (head_lanes(&db, &store).await == Some(lanes as usize)).then_some(())
            },
            || runner.output(),
        )
        .await;
        live_equal(&db, &runner, "the changes after scaling to land").await;
        assert_eq!(runs_of(&db, "running").await, 1, "still the one run");
        assert_eq!(db.scalar_i64(attempts).await, 1, "and its one attempt");
    }
    let scaled = db
        .scalar_i64("SELECT count(*) FROM orca.events WHERE kind = 'sync.scaled'")
        .await;
    assert_eq!(scaled, 2);
    // Scaling to what it has is not news; out of range, or a sync that is
    // not there, is refused naming the value.
    assert_eq!(
        db.scalar_i64("SELECT orca.scale_sync('live', 1)::bigint")
            .await,
        1
    );
    for (sql, code, says) in [
        ("SELECT orca.scale_sync('live', 0)", "OR063", "got 0"),
        ("SELECT orca.scale_sync('live', 65)", "OR063", "got 65"),
        ("SELECT orca.scale_sync('nope', 2)", "OR064", "'nope'"),
    ] {
        let e = sqlx::query(sql).execute(&db.pool).await.expect_err(sql);
        let e = e.as_database_error().expect("a database error");
        assert_eq!(e.code().as_deref(), Some(code), "{sql}");
        assert!(e.message().contains(says), "{sql}: {}", e.message());
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.events WHERE kind = 'sync.scaled'")
            .await,
        2
    );
    // Redefined with other lanes only, the run is not cancelled either.
    sqlx::query(
        "SELECT orca.create_sync('live', $1, $2, $3, NULL, 'at_least_once', 'default', 0)",
    )
    .bind(json!({"type": "postgres_cdc", "url": db.url(), "continuous": true, "epoch_seconds": 1}))
    .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw", "lanes": 2}))
    .bind(json!([{"name": "orders", "table": "public.orders", "primary_key": ["id"], "mode": "merge"}]))
    .execute(&db.pool)
    .await
    .expect("create_sync");
    wait_until(
        "epochs staged over 2 lanes",
        Duration::from_secs(60),
        || async {
            exec(
                &db,
                "UPDATE public.orders SET qty = qty + 1 WHERE id % 10 = 3",
            )
            .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            (head_lanes(&db, &store).await == Some(2)).then_some(())
        },
        || runner.output(),
    )
    .await;
    live_equal(&db, &runner, "the changes after redefining to land").await;
    assert_eq!(runs_of(&db, "cancelled").await, 0);
    assert_eq!(db.scalar_i64(attempts).await, 1);

    // The same from the command line: scale, list, pause.
    let orca = |args: &[&str]| {
        Command::new(bin("orca"))
            .args(args)
            .env("DATABASE_URL", db.url())
            .output()
            .expect("orca")
    };
    let o = orca(&["sync-scale", "live", "4"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("2 -> 4 lanes"),
        "{}",
        text(&o)
    );
    let o = orca(&["syncs", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).expect("orca syncs --json");
    let live = listed
        .as_array()
        .and_then(|a| a.iter().find(|s| s["sync"] == "live").cloned())
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(
        (live["lanes"].clone(), live["paused"].clone()),
        (json!(4), json!(false)),
        "{live}"
    );
    let o = orca(&["sync-scale", "nope", "2"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("nope"),
        "{}",
        text(&o)
    );
    let o = orca(&["sync-pause", "live"]);
    assert!(o.status.success(), "{}", text(&o));
    stopped(&db, &runner).await;
    let o = orca(&["syncs", "--json"]);
    let listed: Value = serde_json::from_slice(&o.stdout).expect("orca syncs --json");
    assert!(
        listed
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["sync"] == "live" && s["paused"] == true)),
        "{listed}"
    );
    drop(runner);
    exec(&db, "SELECT orca.drop_sync('live')").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// The supervisor of continuous syncs goes by the sync's own runs: a
/// discovery of its source (a run of the same pipeline, as a maintenance
/// run is) neither holds back the restart of its failed run nor stands for
/// its last run, so a run cancelled by hand stays cancelled after a
/// discovery failed or succeeded. The runs are played by hand (no runner).
#[tokio::test]
async fn a_continuous_sync_is_supervised_by_its_own_runs_not_its_discoveries() {
    let db = TestDb::new().await;
    make_source(&db, 10).await;
    define_live(&db, 0).await;
    let open_sync_runs = "SELECT count(*) FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
                          WHERE p.name = 'live' AND r.kind = 'sync' AND r.status IN ('queued', 'running')";
    // Its run's one attempt fails (no retries): the run fails.
    let l = claim(&db.pool, "r", 1).await.remove(0);
    exec(
        &db,
        &format!("SELECT orca.finish('{}', false, 'boom')", l.lease),
    )
    .await;
    assert_eq!(runs_of(&db, "failed").await, 1);
    // A discovery of its source, open meanwhile: the failed run is
    // restarted after its backoff all the same, as orca.explain says.
    let failed = db
        .scalar_i64(
            &open_sync_runs
                .replace("count(*)", "r.id")
                .replace("r.status IN ('queued', 'running')", "r.status = 'failed'"),
        )
        .await;
    exec(&db, "SELECT orca.discover('live')").await;
    let why = db
        .strings(&format!("SELECT code FROM orca.explain({failed})"))
        .await;
    assert!(why.iter().any(|c| c == "restart_backoff"), "{why:?}");
    wait_until(
        "the supervisor to restart the failed run beside an open discovery",
        Duration::from_secs(60),
        || async {
            db.scalar_i64(
                "SELECT (orca.tick(now() + interval '11 seconds') ->> 'continuous_restarted')::bigint",
            )
            .await;
            (db.scalar_i64(open_sync_runs).await == 1).then_some(())
        },
        String::new,
    )
    .await;
    // Cancelled by hand, then discoveries that fail and succeed later: the
    // sync stays stopped (orca.resume_sync starts it).
    let open_sync_run = open_sync_runs.replace("count(*)", "r.id");
    let run = db.scalar_i64(&open_sync_run).await;
    exec(&db, &format!("SELECT orca.cancel({run})")).await;
    exec(&db, "SELECT orca.discover('live')").await;
    for l in claim(&db.pool, "r", 10).await {
        exec(&db, &format!("SELECT orca.finish('{}', true)", l.lease)).await;
    }
    let failing = db.scalar_i64("SELECT orca.discover('live')").await;
    for _ in 0..2 {
        for l in claim(&db.pool, "r", 10).await {
            exec(
                &db,
                &format!(
                    "SELECT orca.finish('{}', false, 'no route to the source')",
                    l.lease
                ),
            )
            .await;
        }
    }
    let last: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(failing)
        .fetch_one(&db.pool)
        .await
        .expect("the discovery's status");
    assert_eq!(last, "failed");
    for later in ["11 seconds", "11 minutes"] {
        db.scalar_i64(&format!(
            "SELECT (orca.tick(now() + interval '{later}') ->> 'continuous_restarted')::bigint"
        ))
        .await;
        assert_eq!(
            db.scalar_i64(open_sync_runs).await,
            0,
            "restarted {later} later"
        );
    }
    let why: Vec<String> = db
        .strings(&format!("SELECT code FROM orca.explain({run})"))
        .await;
    assert!(!why.iter().any(|r| r == "restart_backoff"), "{why:?}");
    exec(&db, "SELECT orca.resume_sync('live')").await;
    assert_eq!(db.scalar_i64(open_sync_runs).await, 1);
    let resumed = db.scalar_i64(&open_sync_run).await;
    exec(&db, &format!("SELECT orca.cancel({resumed})")).await;
    exec(&db, "SELECT orca.drop_sync('live')").await;
}

/// A continuous sync's run that failed with its retries spent is started
/// again by the supervisor (a phase of orca.tick) once a backoff passed,
/// with a sync.restarted event; the new run goes on from HEAD.
#[tokio::test]
async fn a_continuous_sync_whose_run_failed_is_restarted_after_a_backoff() {
    let db = TestDb::new().await;
    make_source(&db, 100).await;
    let dir = scratch("cdc-supervised");
    let runner = sync_runner(&db, &dir.join("store"), &dir.join("logs"));
    define_live(&db, 0).await;
    let equal = |what: &'static str| live_equal(&db, &runner, what);
    equal("the snapshot to land").await;
    // Its replication session cut, the attempt fails; with no retries, so
    // does the run.
    wait_until(
        "the run to fail",
        Duration::from_secs(60),
        || async {
            db.scalar_i64(
                "SELECT count(pg_terminate_backend(r.pid)) FROM pg_stat_replication r, orca.cdc_slots s
                 WHERE s.sync = 'live' AND r.application_name = 'orca ' || s.slot",
            )
            .await;
            (runs_of(&db, "failed").await == 1).then_some(())
        },
        || runner.output(),
    )
    .await;
    exec(&db, "UPDATE public.orders SET qty = -7 WHERE id <= 4").await;
    // Within the backoff nothing starts (asked only while the failure is
    // recent: a slow machine may have taken longer than the backoff to see
    // it); after it, a run does.
    let recent = db
        .scalar_i64(
            "SELECT (extract(epoch FROM now() - max(coalesce(r.finished_at, r.created_at))) < 7)::int::bigint
             FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id WHERE p.name = 'live'",
        )
        .await;
    if recent == 1 {
        let started = db
            .scalar_i64("SELECT (orca.tick() ->> 'continuous_restarted')::bigint")
            .await;
        assert_eq!(started, 0, "restarted within the backoff");
    }
    // A tick elsewhere (a background worker) may hold the sync's row for a
    // moment, and a tick skips what another holds: tick until it is done.
    wait_until(
        "the supervisor to restart the run",
        Duration::from_secs(60),
        || async {
            db.scalar_i64(
                "SELECT (orca.tick(now() + interval '11 seconds') ->> 'continuous_restarted')::bigint",
            )
            .await;
            (runs_of(&db, "queued").await + runs_of(&db, "running").await == 1).then_some(())
        },
        || runner.output(),
    )
    .await;
    let event: Value = sqlx::query_scalar(
        "SELECT data FROM orca.events WHERE kind = 'sync.restarted' ORDER BY id DESC LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .expect("a sync.restarted event");
    assert_eq!(
        (
            &event["sync"],
            &event["after"],
            &event["failed_runs"],
            &event["backoff_seconds"]
        ),
        (&json!("live"), &json!("failed"), &json!(1), &json!(10)),
        "{event}"
    );
    equal("the changes made while it was down to land").await;
    assert_eq!(runs_of(&db, "running").await, 1, "the new run goes on");
    // A new column: the attempt ends before the transaction that shows it
    // and is handed back, not failed, so the run (with no retries) goes on
    // in a new attempt that reads the new shape.
    let run = db
        .scalar_i64(
            "SELECT r.id FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id
             WHERE p.name = 'live' AND r.status = 'running'",
        )
        .await;
    exec(
        &db,
        "ALTER TABLE public.orders ADD COLUMN region text;
         UPDATE public.orders SET region = 'eu', qty = 70 WHERE id <= 10;",
    )
    .await;
    wait_until(
        "the new column's values to land",
        Duration::from_secs(60),
        || async {
            let t = db
                .scalar_i64(
                    "SELECT count(*) FROM information_schema.columns
                     WHERE table_schema = 'raw' AND table_name = 'orders' AND column_name = 'region'",
                )
                .await;
            if t == 0 {
                return None;
            }
            let eu = db
                .scalar_i64("SELECT count(*) FROM raw.orders WHERE region = 'eu'")
                .await;
            (eu == 10).then_some(())
        },
        || runner.output(),
    )
    .await;
    let (status, failures): (String, i32) =
        sqlx::query_as("SELECT status, failures FROM orca.runs WHERE id = $1")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("the run");
    assert_eq!(
        (status.as_str(), failures),
        ("running", 0),
        "{}",
        runner.output()
    );
    let released = db
        .scalar_i64(&format!(
            "SELECT count(*) FROM orca.attempts WHERE run_id = {run} AND status = 'released'
               AND error LIKE '%has a new column region%'"
        ))
        .await;
    assert_eq!(released, 1, "{}", runner.output());
    equal("the rest to stay equal").await;
    exec(&db, "SELECT orca.pause_sync('live')").await;
    stopped(&db, &runner).await;
    // Paused: the supervisor leaves it alone.
    let started = db
        .scalar_i64(
            "SELECT (orca.tick(now() + interval '1 hour') ->> 'continuous_restarted')::bigint",
        )
        .await;
    assert_eq!(started, 0, "a paused sync is not restarted");
    drop(runner);
    exec(&db, "SELECT orca.drop_sync('live')").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// `orca discover` reads the source's catalog: which tables a change
/// stream can read (and why not), and the streams a sync could take.
#[tokio::test]
async fn discover_tells_which_tables_a_change_stream_can_read_and_plans_streams() {
    let db = TestDb::new().await;
    make_source(&db, 10).await;
    exec(
        &db,
        "CREATE TABLE public.notes (id bigint PRIMARY KEY, body text);
         CREATE TABLE public.loose (x int);",
    )
    .await;
    let source = json!({"type": "postgres_cdc", "url": db.url()}).to_string();
    let o = Command::new(bin("orca"))
        .args(["--json", "discover", &source])
        .output()
        .expect("orca discover");
    assert!(o.status.success(), "{}", text(&o));
    let cat: Value = serde_json::from_slice(&o.stdout).expect("catalog JSON");
    let table = |name: &str| {
        cat["streams"]
            .as_array()
            .expect("streams")
            .iter()
            .find(|s| s["table"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {cat}"))
    };
    let orders = table("public.orders");
    assert_eq!(orders["cdc"], true, "{orders}");
    assert_eq!(orders["replica_identity"], "full");
    assert_eq!(orders["primary_key"], json!(["id"]));
    let notes = table("public.notes");
    assert_eq!(notes["cdc"], false);
    assert!(
        notes["cdc_blocked_by"][0]
            .as_str()
            .is_some_and(|b| b.contains("body") && b.contains("REPLICA IDENTITY FULL")),
        "{notes}"
    );
    assert_eq!(table("public.loose")["cdc"], false);
    let planned: Vec<&str> = cat["plan"]
        .as_array()
        .expect("plan")
        .iter()
        .filter_map(|s| s["table"].as_str())
        .collect();
    assert!(planned.contains(&"public.orders"), "{planned:?}");
    assert!(!planned.contains(&"public.notes"), "{planned:?}");
    // The plan is a sync's streams as they stand.
    sqlx::query("SELECT orca.create_sync('planned', $1, $2, $3)")
        .bind(json!({"type": "postgres_cdc", "url": db.url()}))
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
        .bind(&cat["plan"])
        .execute(&db.pool)
        .await
        .expect("create_sync from the plan");
    let bad = Command::new(bin("orca"))
        .args([
            "discover",
            r#"{"type": "postgres_cdc", "url": {"secret": "x"}}"#,
        ])
        .output()
        .expect("orca discover");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("plain connection string"),
        "{}",
        text(&bad)
    );
}

/// The orca-engine processes a runner started on `store` (their environment
/// names it): what a fault is sent to.
fn engines_on(store: &Path) -> Vec<i32> {
    processes_with_env("orca-engine", &format!("ORCA_STORE={}", store.display()))
}

fn signal(pids: &[i32], sig: &str) {
    for pid in pids {
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }
}

/// Makes `segments` WAL segments' worth of distance from here: a row, then a
/// switch to the next segment, each time (a switch with nothing written
/// since the last one is no switch).
async fn wal_segments(db: &TestDb, segments: usize) {
    for _ in 0..segments {
        exec(
            db,
            "INSERT INTO public.orders (id, customer, qty)
             VALUES ((SELECT coalesce(max(id), 0) + 1 FROM public.orders), 'wal', 1);
             SELECT pg_switch_wal();",
        )
        .await;
    }
}

/// (kind, resolved, summary, resolution, actions) of the sync incidents.
type SyncIncident = (String, bool, String, Option<String>, Value);

async fn sync_incidents(db: &TestDb) -> Vec<SyncIncident> {
    sqlx::query_as(
        "SELECT kind, resolved_at IS NOT NULL, summary, resolution, actions FROM orca.incidents
         WHERE kind IN ('sync_stalled', 'cdc_lag', 'slot_at_risk') ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .expect("incidents")
}

/// Ticks until `done` holds for the sync incidents (up to `within`).
async fn tick_until(
    db: &TestDb,
    runner: &orca_tests::procs::Runner,
    what: &str,
    within: Duration,
    done: impl Fn(&[SyncIncident]) -> bool,
) {
    wait_until(
        what,
        within,
        || async {
            tokio::time::sleep(Duration::from_millis(250)).await;
            exec(db, "SELECT orca.tick()").await;
            let got = sync_incidents(db).await;
            done(&got).then_some(())
        },
        || runner.output(),
    )
    .await
}

/// Ticks until an incident of `kind` is open (or, `resolved`, has been
/// resolved), and returns it.
async fn tick_until_kind(
    db: &TestDb,
    runner: &orca_tests::procs::Runner,
    kind: &str,
    resolved: bool,
    within: Duration,
) -> SyncIncident {
    let what = format!("{kind} to {}", if resolved { "resolve" } else { "open" });
    tick_until(db, runner, &what, within, |got| {
        got.iter().any(|i| i.0 == kind && i.1 == resolved)
    })
    .await;
    sync_incidents(db)
        .await
        .into_iter()
        .find(|i| i.0 == kind && i.1 == resolved)
        .unwrap_or_else(|| panic!("{what}"))
}

/// A continuous sync whose engine is stopped (SIGSTOP) while its runner
/// keeps the lease: HEAD stops moving and its slot falls behind the WAL, so
/// ticks open sync_stalled and cdc_lag (whose scale_sync playbook doubles
/// the sync's lanes in that transaction); once the engine goes on, HEAD
/// moving resolves sync_stalled and a tick measuring the lag below its
/// threshold resolves cdc_lag.
#[tokio::test]
async fn a_stopped_engine_opens_sync_stalled_and_cdc_lag_until_it_goes_on() {
    let db = TestDb::new().await;
    make_source(&db, 200).await;
    let dir = scratch("cdc-stalled");
    let store = dir.join("store");
    let runner = sync_runner(&db, &store, &dir.join("logs"));
    exec(
        &db,
        "SELECT orca.set_incident_threshold('sync_stalled_seconds', 4);
         SELECT orca.create_playbook('cdc_lag', 'scale_sync', '{\"max_lanes\": 2}');",
    )
    .await;
    define_live(&db, 2).await;
    live_equal(&db, &runner, "the snapshot to land").await;
    // A sync that streams moves HEAD each epoch: ticks past the stall
    // threshold open nothing.
    for _ in 0..6 {
        exec(&db, "SELECT orca.tick()").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let healthy = sync_incidents(&db).await;
    assert!(
        healthy.iter().all(|i| i.0 != "sync_stalled"),
        "a streaming sync is not stalled: {healthy:?}"
    );

    let engines = engines_on(&store);
    assert_eq!(engines.len(), 1, "one engine on the store: {engines:?}");
    signal(&engines, "-STOP");
    // The lag threshold is low only from here, and only for this sync (the
    // org's stays 1 GiB, more than the lag made below): the cluster's WAL
    // is every test's, and other tests' bursts must not open cdc_lag while
    // the sync streams.
    exec(
        &db,
        "SELECT orca.set_incident_threshold('cdc_lag_bytes', 64 * 1024 * 1024, 'live')",
    )
    .await;
    exec(
        &db,
        "UPDATE public.orders SET qty = qty + 1000 WHERE id <= 20",
    )
    .await;
    wal_segments(&db, 6).await;
    tick_until(
        &db,
        &runner,
        "sync_stalled and cdc_lag to open",
        Duration::from_secs(30),
        |got| {
            ["sync_stalled", "cdc_lag"]
                .iter()
                .all(|k| got.iter().any(|i| i.0 == *k && !i.1))
        },
    )
    .await;
    let got = sync_incidents(&db).await;
    let stalled = got.iter().find(|i| i.0 == "sync_stalled").expect("stalled");
    assert!(
        stalled
            .2
            .starts_with("sync live has not moved HEAD (epoch "),
        "{}",
        stalled.2
    );
    let lag = got.iter().find(|i| i.0 == "cdc_lag").expect("lag");
    assert!(
        lag.2.starts_with("the change stream of sync live is ")
            && lag.2.ends_with("behind the WAL (cdc_lag_bytes 64 MB)"),
        "{}",
        lag.2
    );
    assert_eq!(
        lag.4[0]["outcome"], "scaled live from 1 to 2 lanes",
        "the playbook ran as it opened: {}",
        lag.4
    );
    let lanes: i64 = db
        .scalar_i64("SELECT (definition -> 'destination' ->> 'lanes')::bigint FROM orca.syncs WHERE name = 'live'")
        .await;
    assert_eq!(lanes, 2);
    assert_eq!(
        runs_of(&db, "running").await,
        1,
        "the run still holds its lease"
    );

    // These two resolve; another test's WAL burst may open a later cdc_lag
    // on its own, which is not theirs to wait for.
    let open: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM orca.incidents WHERE kind IN ('sync_stalled', 'cdc_lag')
         AND resolved_at IS NULL ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .expect("the open incidents");
    assert_eq!(open.len(), 2, "{got:?}");
    signal(&engines, "-CONT");
    wait_until(
        "both to resolve once the engine goes on",
        Duration::from_secs(60),
        || async {
            tokio::time::sleep(Duration::from_millis(250)).await;
            exec(&db, "SELECT orca.tick()").await;
            let resolved: bool = sqlx::query_scalar(
                "SELECT bool_and(resolved_at IS NOT NULL) FROM orca.incidents WHERE id = ANY ($1)",
            )
            .bind(&open)
            .fetch_one(&db.pool)
            .await
            .expect("resolved");
            resolved.then_some(())
        },
        || runner.output(),
    )
    .await;
    let got: Vec<SyncIncident> = sqlx::query_as(
        "SELECT kind, resolved_at IS NOT NULL, summary, resolution, actions FROM orca.incidents
         WHERE id = ANY ($1) ORDER BY id",
    )
    .bind(&open)
    .fetch_all(&db.pool)
    .await
    .expect("the two incidents");
    let stalled = got.iter().find(|i| i.0 == "sync_stalled").expect("stalled");
    assert!(
        stalled
            .3
            .as_deref()
            .is_some_and(|r| r.starts_with("HEAD moved to epoch ")),
        "{stalled:?}"
    );
    let lag = got.iter().find(|i| i.0 == "cdc_lag").expect("lag");
    assert!(
        lag.3
            .as_deref()
            .is_some_and(|r| r.starts_with("the change stream is ")),
        "{lag:?}"
    );
    live_equal(&db, &runner, "the changes made while stopped to land").await;
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.sync_slots").await,
        0,
        "a slot of this server is the tick's to measure, not a report's"
    );
    exec(&db, "SELECT orca.pause_sync('live')").await;
    stopped(&db, &runner).await;
    drop(runner);
    exec(&db, "SELECT orca.drop_sync('live')").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A paused sync's slot keeps WAL: once less than slot_safe_wal_bytes is
/// left before max_slot_wal_keep_size would invalidate it, a tick opens
/// slot_at_risk; the sync resumed, its slot lets the WAL go and a tick
/// resolves it. max_slot_wal_keep_size is set for the whole cluster, far
/// above anything the suite keeps (64 GB), and reset at the end.
#[tokio::test]
async fn a_paused_syncs_slot_nearing_its_wal_limit_opens_slot_at_risk_until_it_is_read() {
    let db = TestDb::new().await;
    exec(&db, "ALTER SYSTEM SET max_slot_wal_keep_size = '64GB'").await;
    exec(&db, "SELECT pg_reload_conf()").await;
    make_source(&db, 100).await;
    let dir = scratch("cdc-slot-risk");
    let store = dir.join("store");
    let runner = sync_runner(&db, &store, &dir.join("logs"));
    define_live(&db, 2).await;
    live_equal(&db, &runner, "the snapshot to land").await;
    exec(&db, "SELECT orca.pause_sync('live')").await;
    stopped(&db, &runner).await;
    let safe0 = wait_until(
        "the slot's safe_wal_size under the new limit",
        Duration::from_secs(20),
        || async {
            let v: Option<i64> = sqlx::query_scalar(
                "SELECT rs.safe_wal_size FROM orca.cdc_slots s
                 JOIN pg_replication_slots rs ON rs.slot_name = s.slot WHERE s.sync = 'live'",
            )
            .fetch_one(&db.pool)
            .await
            .expect("safe_wal_size");
            v
        },
        || runner.output(),
    )
    .await;
    // At risk once 48 MB more of WAL is kept.
    let threshold = safe0 - 48 * 1024 * 1024;
    exec(
        &db,
        &format!("SELECT orca.set_incident_threshold('slot_safe_wal_bytes', {threshold})"),
    )
    .await;
    wal_segments(&db, 6).await;
    let risk = tick_until_kind(&db, &runner, "slot_at_risk", false, Duration::from_secs(30)).await;
    let got = sync_incidents(&db).await;
    assert!(
        risk.2.starts_with("the slot orca_live_") && risk.2.ends_with(": the sync is paused"),
        "{}",
        risk.2
    );
    assert!(
        got.iter().all(|i| i.0 != "cdc_lag"),
        "a paused sync is behind by choice: {got:?}"
    );

    exec(&db, "SELECT orca.resume_sync('live')").await;
    live_equal(&db, &runner, "the changes made while paused to land").await;
    // The slot's restart point moves past the kept WAL at a record of the
    // running transactions, which a checkpoint logs.
    let t0 = std::time::Instant::now();
    loop {
        exec(&db, "CHECKPOINT").await;
        exec(&db, "SELECT orca.tick()").await;
        let got = sync_incidents(&db).await;
        if got.iter().any(|i| i.0 == "slot_at_risk" && i.1) {
            let risk = got.iter().find(|i| i.0 == "slot_at_risk").expect("risk");
            assert!(
                risk.3
                    .as_deref()
                    .is_some_and(|r| r.starts_with("the slot has ")),
                "{risk:?}"
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "slot_at_risk did not resolve once the slot was read: {got:?}\n{}",
            runner.output()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    exec(&db, "SELECT orca.pause_sync('live')").await;
    stopped(&db, &runner).await;
    drop(runner);
    exec(&db, "SELECT orca.drop_sync('live')").await;
    exec(&db, "ALTER SYSTEM RESET max_slot_wal_keep_size").await;
    exec(&db, "SELECT pg_reload_conf()").await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Rows of the remote sync's raw.orders (-1 before it exists), and the
/// source's orders.
async fn remote_counts(db: &TestDb, source: &sqlx::PgPool) -> (i64, i64) {
    let exists = db
        .scalar_i64(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'raw' AND tablename = 'orders'",
        )
        .await;
    let landed = if exists == 1 {
        db.scalar_i64("SELECT count(*) FROM raw.orders").await
    } else {
        -1
    };
    let there: i64 = sqlx::query_scalar("SELECT count(*) FROM public.orders")
        .fetch_one(source)
        .await
        .expect("the source's count");
    (landed, there)
}

/// (slot on this server, wal_status, safe_wal_size, lag_bytes, measured_at
/// is set) of the remote sync's row of orca.cdc_slots.
type RemoteSlot = (bool, Option<String>, Option<i64>, Option<i64>, bool);

async fn remote_slot(db: &TestDb) -> RemoteSlot {
    sqlx::query_as(
        "SELECT on_this_server, wal_status, safe_wal_size, lag_bytes, measured_at IS NOT NULL
         FROM orca.cdc_slots WHERE sync = 'remote'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the remote sync's slot")
}

/// A change stream whose source is another server (a private cluster with
/// max_slot_wal_keep_size 64 MB): the control plane's tick cannot see that
/// slot, so the source pump measures it there and the runner reports each
/// measure at a heartbeat (orca.report_slot into orca.sync_slots).
/// orca.cdc_slots shows it; ticks open and resolve slot_at_risk and
/// cdc_lag by it as for a slot of their own server, the summaries saying
/// when it was measured. A report for another slot or with a malformed
/// value is refused by name.
#[tokio::test]
async fn a_source_on_another_server_has_its_slot_measured_there_and_judged_by_ticks() {
    let db = TestDb::new().await;
    exec(
        &db,
        &format!("ALTER DATABASE \"{}\" SET orca.lease_seconds = 15", db.name),
    )
    .await;
    let cluster = orca_tests::cluster::PrivateCluster::start(&[
        "wal_level = logical",
        "max_wal_senders = 10",
        "max_replication_slots = 10",
        "max_slot_wal_keep_size = '64MB'",
    ]);
    let source_url = cluster.url("postgres");
    let source = sqlx::PgPool::connect(&source_url)
        .await
        .expect("the source server");
    sqlx::raw_sql(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, customer text NOT NULL, qty integer);
         ALTER TABLE public.orders REPLICA IDENTITY FULL;
         INSERT INTO public.orders SELECT g, 'c' || g, 1 FROM generate_series(1, 300) g;",
    )
    .execute(&source)
    .await
    .expect("the source table");
    let dir = scratch("cdc-remote-slot");
    let store = dir.join("store");
    let runner = sync_runner(&db, &store, &dir.join("logs"));
    sqlx::query(
        "SELECT orca.create_sync('remote', $1, $2, $3, NULL, 'at_least_once', 'default', 2)",
    )
    .bind(
        json!({"type": "postgres_cdc", "url": source_url, "continuous": true,
                 "epoch_seconds": 1}),
    )
    .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
    .bind(
        json!([{"name": "orders", "table": "public.orders", "primary_key": ["id"],
                  "mode": "merge"}]),
    )
    .execute(&db.pool)
    .await
    .expect("create_sync");
    let landed = || async {
        let (landed, there) = remote_counts(&db, &source).await;
        (landed == there).then_some(())
    };
    wait_until(
        "the snapshot to land",
        Duration::from_secs(60),
        landed,
        || runner.output(),
    )
    .await;

    // Not on this server: only the runner's report shows the slot.
    let slot = wait_until(
        "the runner to report the slot",
        Duration::from_secs(60),
        || async {
            let s = remote_slot(&db).await;
            s.4.then_some(s)
        },
        || runner.output(),
    )
    .await;
    assert!(!slot.0, "the slot is on the source's server: {slot:?}");
    assert!(
        matches!(slot.1.as_deref(), Some("reserved" | "extended")),
        "{slot:?}"
    );
    let safe = slot.2.expect("safe_wal_size under max_slot_wal_keep_size");
    // PostgreSQL counts the limit from the start of the current 16 MB
    // segment: up to one segment more than max_slot_wal_keep_size.
    assert!(
        safe > 0 && safe <= 80 * 1024 * 1024,
        "safe_wal_size within the source's 64 MB and a segment: {slot:?}"
    );
    assert!(slot.3.is_some_and(|l| l >= 0), "{slot:?}");
    let reported: (String, i64) = sqlx::query_as(
        "SELECT ss.slot, ss.attempt_id FROM orca.sync_slots ss
         JOIN orca.syncs y ON y.id = ss.sync_id WHERE y.name = 'remote'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the report");
    assert!(reported.0.starts_with("orca_remote_"), "{reported:?}");
    let on_source: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1")
            .bind(&reported.0)
            .fetch_one(&source)
            .await
            .expect("the source's slots");
    assert_eq!(on_source, 1, "the measured slot is the source's");

    // The org's slot_safe_wal_bytes (1 GiB) is more than the source lets
    // any slot keep: the reported slot is at risk.
    let risk = tick_until_kind(&db, &runner, "slot_at_risk", false, Duration::from_secs(30)).await;
    assert!(
        risk.2
            .starts_with(&format!("the slot {} of sync remote keeps ", reported.0))
            && risk.2.contains("(measured on its source server at "),
        "{}",
        risk.2
    );
    exec(
        &db,
        "SELECT orca.set_incident_threshold('slot_safe_wal_bytes', 1024 * 1024, 'remote')",
    )
    .await;
    // This sync's own threshold under what is left resolves it.
    let risk = tick_until_kind(&db, &runner, "slot_at_risk", true, Duration::from_secs(30)).await;
    assert!(
        risk.3
            .as_deref()
            .is_some_and(|r| r.starts_with("the slot has ")),
        "{risk:?}"
    );

    // The engine stopped, the pump's gauge goes on measuring while the
    // slot falls behind the source's WAL.
    let engines = engines_on(&store);
    assert_eq!(engines.len(), 1, "one engine on the store: {engines:?}");
    signal(&engines, "-STOP");
    exec(
        &db,
        "SELECT orca.set_incident_threshold('cdc_lag_bytes', 8 * 1024 * 1024, 'remote')",
    )
    .await;
    for _ in 0..2 {
        sqlx::raw_sql(
            "UPDATE public.orders SET qty = qty + 1 WHERE id <= 10; SELECT pg_switch_wal();",
        )
        .execute(&source)
        .await
        .expect("WAL on the source");
    }
    let lag = tick_until_kind(&db, &runner, "cdc_lag", false, Duration::from_secs(60)).await;
    assert!(
        lag.2.starts_with("the change stream of sync remote is ")
            && lag.2.contains(
                "behind the WAL (cdc_lag_bytes 8192 kB) (measured on its source server at "
            ),
        "{}",
        lag.2
    );

    // Refused by name: a report of another slot, a malformed measure.
    let lease: uuid::Uuid = sqlx::query_scalar(
        "SELECT l.lease FROM orca.leases l JOIN orca.attempts a ON a.id = l.attempt_id
         JOIN orca.runs r ON r.id = a.run_id JOIN orca.pipelines p ON p.id = r.pipeline_id
         WHERE p.name = 'remote' AND a.status = 'leased'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the sync's lease");
    for (measured, says) in [
        (
            json!({"slot": "orca_other_0000", "measured_at": "2026-01-01T00:00:00Z"}),
            "whose slot is the sync's slot orca_remote_",
        ),
        (
            json!({"slot": reported.0, "lag_bytes": "lots", "measured_at": "2026-01-01T00:00:00Z"}),
            "measured.lag_bytes must be a whole number of bytes or null, got \"lots\"",
        ),
        (
            json!({"slot": reported.0, "wal_status": "fine", "measured_at": "2026-01-01T00:00:00Z"}),
            "measured.wal_status must be reserved, extended, unreserved or lost, got 'fine'",
        ),
        (
            json!({"slot": reported.0, "measured_at": "yesterday-ish"}),
            "measured.measured_at must be a time",
        ),
        (
            json!({"slot": reported.0, "absent": "yes", "measured_at": "2026-01-01T00:00:00Z"}),
            "measured.absent must be true, false or null, got \"yes\"",
        ),
    ] {
        let e = sqlx::query("SELECT orca.report_slot($1, $2)")
            .bind(lease)
            .bind(&measured)
            .execute(&db.pool)
            .await
            .expect_err("a bad report");
        let d = e.as_database_error().expect("a database error");
        assert_eq!(
            d.code().as_deref(),
            Some("OR050"),
            "{measured}: {}",
            d.message()
        );
        assert!(d.message().contains(says), "{measured}: {}", d.message());
    }

    signal(&engines, "-CONT");
    let lag = tick_until_kind(&db, &runner, "cdc_lag", true, Duration::from_secs(90)).await;
    assert!(
        lag.3
            .as_deref()
            .is_some_and(|r| r.starts_with("the change stream is ")),
        "{lag:?}"
    );
    wait_until(
        "the changes to land",
        Duration::from_secs(60),
        landed,
        || runner.output(),
    )
    .await;
    // A slot its server no longer holds leaves no measure to judge; the
    // next measure of the live slot is reported again.
    sqlx::query("SELECT orca.report_slot($1, $2)")
        .bind(lease)
        .bind(json!({"slot": reported.0, "absent": true, "measured_at": "2026-01-01T00:00:00Z"}))
        .execute(&db.pool)
        .await
        .expect("an absent slot");
    assert_eq!(remote_slot(&db).await, (false, None, None, None, false));
    wait_until(
        "the runner to report the slot again",
        Duration::from_secs(60),
        || async { remote_slot(&db).await.4.then_some(()) },
        || runner.output(),
    )
    .await;
    exec(&db, "SELECT orca.pause_sync('remote')").await;
    wait_until(
        "the remote attempt to stop",
        Duration::from_secs(60),
        || async { (runs_of_sync(&db, "remote", "running").await == 0).then_some(()) },
        || runner.output(),
    )
    .await;
    drop(runner);
    exec(&db, "SELECT orca.drop_sync('remote')").await;
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.sync_slots").await,
        0,
        "the report goes with the sync"
    );
    drop(source);
    drop(cluster);
    let _ = std::fs::remove_dir_all(dir);
}

async fn runs_of_sync(db: &TestDb, sync: &str, status: &str) -> i64 {
    db.scalar_i64(&format!(
        "SELECT count(*) FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id
         WHERE p.name = '{sync}' AND r.status = '{status}'"
    ))
    .await
}
