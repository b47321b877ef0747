//! Table maintenance end to end: `orca.maintain` queues a run a runner's
//! orca-engine carries out on real Iceberg tables (compaction, snapshot
//! expiry, orphan removal), read back by PyIceberg and DuckDB; expiry keeps
//! what a run pinned while the run goes on; schedules fire from the tick;
//! bad input is refused with its SQLSTATE and nothing queued.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use orca_tests::procs::{orca, pyiceberg, register, wait_run, Runner};
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

async fn run(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn read(db: &TestDb, wh: &Path, dataset: &str) -> Value {
    pyiceberg(&["read", &db.url(), wh.to_str().unwrap_or_default(), dataset])
}

/// A table's rows as sorted JSON text, to compare two reads.
fn rows(table: &Value) -> Vec<String> {
    let mut out: Vec<String> = table["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(Value::to_string)
        .collect();
    out.sort();
    out
}

fn snapshot_ids(table: &Value) -> Vec<i64> {
    let mut ids: Vec<i64> = table["snapshots"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["id"].as_i64())
        .collect();
    ids.sort();
    ids
}

/// The Parquet files under a table's data directory.
fn data_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Sets a file's modification time into the past, as an old orphan has.
fn age(path: &Path, ago: &str) {
    let ok = Command::new("touch")
        .args(["-d", ago])
        .arg(path)
        .status()
        .expect("touch")
        .success();
    assert!(ok, "touch -d {ago} {}", path.display());
}

async fn events(db: &TestDb, run: i64) -> Vec<Value> {
    sqlx::query_scalar(
        "SELECT jsonb_build_object('kind', kind) || data FROM orca.events \
         WHERE run_id = $1 AND kind LIKE 'dataset.%' ORDER BY id",
    )
    .bind(run)
    .fetch_all(&db.pool)
    .await
    .expect("events")
}

#[tokio::test]
async fn maintenance_compacts_expires_and_removes_orphans_and_every_row_stays() {
    let db = TestDb::new().await;
    register(&db, "probe_tables");
    let wh = scratch("maintain-wh");
    let whs = wh.to_string_lossy().to_string();
    pyiceberg(&[
        "create",
        &db.url(),
        &whs,
        "probe.src",
        &json!([{"n": 1}]).to_string(),
    ]);
    let logs = scratch("maintain");
    let runner = Runner::start(
        &db.url(),
        "r",
        2,
        &logs,
        &[("ORCA_WAREHOUSE", whs.as_str())],
    );
    // Three runs of January and one of February: January's partition of
    // probe.rows has three small files, February's one.
    for month in ["2024-01", "2024-01", "2024-01", "2024-02"] {
        let r = run(&db, &format!("SELECT orca.run('probe_tables', '{month}')")).await;
        wait_run(&db, r, "succeeded", &runner).await;
    }
    let before = read(&db, &wh, "probe.rows");
    assert_eq!(before["rows"].as_array().map(Vec::len), Some(31 * 3 + 29));
    assert_eq!(snapshot_ids(&before).len(), 4);
    let table_dir = wh.join("default/probe/rows");
    let first_files = data_files(&table_dir.join("data"));
    assert_eq!(first_files.len(), 4, "{first_files:?}");
    // Two files nothing references: an old one (a commit that failed long
    // ago) and a young one (a commit that may still be on its way).
    let old_orphan = table_dir.join("data/orphan-old.parquet");
    let young_orphan = table_dir.join("data/orphan-young.parquet");
    std::fs::copy(&first_files[0], &old_orphan).expect("plant an orphan");
    std::fs::copy(&first_files[0], &young_orphan).expect("plant an orphan");
    age(&old_orphan, "2 days ago");

    let m = run(
        &db,
        r#"SELECT orca.maintain('probe.rows', '{"compact": {"min_files": 2},
              "expire": {"keep_last": 1, "older_than": "0 seconds", "grace": "0 seconds"},
              "orphans": {"older_than": "1 day"}}')"#,
    )
    .await;
    wait_run(&db, m, "succeeded", &runner).await;

    // Every row is still there, once, for PyIceberg and for DuckDB.
    let after = read(&db, &wh, "probe.rows");
    assert_eq!(rows(&after), rows(&before), "the rows changed");
    let pruned = pyiceberg(&["prune", &db.url(), &whs, "probe.rows", "month", "2024-01"]);
    assert_eq!(pruned["duckdb"]["rows"], json!(93), "{pruned}");
    assert_eq!(pruned["pyiceberg"]["rows"], json!(93), "{pruned}");
    // January's three files are one now; expiry left the current snapshot
    // alone, which is the compaction's replace.
    let ids = snapshot_ids(&after);
    assert_eq!(ids.len(), 1, "{after}");
    let current = after["snapshots"][0].clone();
    assert_eq!(current["operation"], "replace", "{current}");
    assert_eq!(current["summary"]["orca.maintenance"], "compact");
    assert_eq!(current["summary"]["orca.run"], m.to_string());
    assert_eq!(current["summary"]["total-data-files"], "2");
    assert_eq!(pruned["duckdb"]["all_files"], json!(2), "{pruned}");
    // The replaced files went with the expired snapshots, the old orphan
    // with the orphans; the young one stays for its commit.
    let left = data_files(&table_dir.join("data"));
    for f in &first_files[..] {
        let month_of_f = f.to_string_lossy().contains("month=2024-02");
        assert_eq!(left.contains(f), month_of_f, "{} in {left:?}", f.display());
    }
    assert!(!old_orphan.exists(), "the old orphan is still there");
    assert!(
        young_orphan.exists(),
        "a young unreferenced file was deleted"
    );
    assert_eq!(left.len(), 3, "{left:?}");

    // Each operation is an event of the run, and the compaction is recorded
    // as the run's read and commit.
    let ev = events(&db, m).await;
    let kinds: Vec<&str> = ev.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "dataset.compacted",
            "dataset.expired",
            "dataset.orphans_removed"
        ],
        "{ev:?}"
    );
    assert_eq!(ev[0]["files_removed"], 3, "{ev:?}");
    assert_eq!(ev[0]["files_added"], 1, "{ev:?}");
    assert_eq!(
        ev[1]["snapshots"].as_array().map(Vec::len),
        Some(4),
        "{ev:?}"
    );
    assert_eq!(ev[2]["files"].as_array().map(Vec::len), Some(1), "{ev:?}");
    let commits = db
        .strings(&format!(
            "SELECT step || ' ' || operation || ' ' || snapshot_id FROM orca.commits WHERE run_id = {m}"
        ))
        .await;
    assert_eq!(commits, [format!("maintain replace {}", ids[0])]);
    let kind = db
        .strings(&format!(
            "SELECT kind || ' ' || trigger FROM orca.runs WHERE id = {m}"
        ))
        .await;
    assert_eq!(kind, ["maintain manual"]);

    // Maintaining again, from the CLI, finds nothing to do and loses nothing;
    // the CLI follows the run and says what each operation did.
    let out = orca(
        &db,
        &[
            "maintain",
            "probe.rows",
            "--options",
            r#"{"orphans": false}"#,
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}\n{}", runner.output());
    assert!(text.contains("1/1 done: 1 succeeded"), "{text}");
    assert!(
        text.contains("compact: no partition has enough small files"),
        "{text}"
    );
    assert!(
        text.contains("expire: 0 snapshots expired, 1 kept"),
        "{text}"
    );
    assert!(!text.contains("orphans:"), "{text}");
    assert_eq!(rows(&read(&db, &wh, "probe.rows")), rows(&before));
}

#[tokio::test]
async fn expiry_keeps_the_snapshot_a_running_run_pinned_and_the_run_reads_it() {
    let db = TestDb::new().await;
    register(&db, "probe_tables");
    let wh = scratch("maintain-pin-wh");
    let whs = wh.to_string_lossy().to_string();
    // An outside writer's table, in the org's part of the warehouse (where
    // maintenance may touch it).
    let org_wh = format!("{whs}/default");
    let first: i64 = pyiceberg(&[
        "create",
        &db.url(),
        &org_wh,
        "probe.src",
        &json!((0..5).map(|n| json!({"n": n})).collect::<Vec<_>>()).to_string(),
    ])["snapshot"]
        .as_i64()
        .expect("snapshot");
    let dir = scratch("maintain-pin");
    let dirs = dir.to_string_lossy().to_string();
    let runner = Runner::start(
        &db.url(),
        "r",
        2,
        &dir,
        &[
            ("ORCA_WAREHOUSE", whs.as_str()),
            ("PROBE_DIR", dirs.as_str()),
            ("PROBE_STALL_ONCE", "read:2024-03:60000"),
            ("PROBE_FAIL_ONCE", "read:2024-03"),
        ],
    );
    let r = run(&db, "SELECT orca.run('probe_tables', '2024-03')").await;
    let stalling = dir.join("stalling");
    wait_until(
        "the read step to stall",
        Duration::from_secs(60),
        || async { stalling.exists().then_some(()) },
        || runner.output(),
    )
    .await;
    // The step pinned the first snapshot; an outside writer adds two more.
    for i in 0..2 {
        pyiceberg(&[
            "append",
            &db.url(),
            &org_wh,
            "probe.src",
            &json!([{"n": 100 + i}]).to_string(),
        ]);
    }
    let three = snapshot_ids(&read(&db, Path::new(&org_wh), "probe.src"));
    assert_eq!(three.len(), 3);
    // Expire everything expiry may: the newest stays as the current one, the
    // pinned one because the run may read it again; the middle one goes.
    let m = run(
        &db,
        r#"SELECT orca.maintain('probe.src', '{"compact": false, "orphans": false,
              "expire": {"keep_last": 1, "older_than": "0 seconds", "grace": "0 seconds"}}')"#,
    )
    .await;
    wait_run(&db, m, "succeeded", &runner).await;
    let left = snapshot_ids(&read(&db, Path::new(&org_wh), "probe.src"));
    assert_eq!(left.len(), 2, "{left:?} of {three:?}");
    assert!(
        left.contains(&first),
        "the pinned snapshot {first} was expired: {left:?}"
    );
    let expired: Value = sqlx::query_scalar(
        "SELECT data FROM orca.events WHERE run_id = $1 AND kind = 'dataset.expired'",
    )
    .bind(m)
    .fetch_one(&db.pool)
    .await
    .expect("expired event");
    assert_eq!(expired["protected"], json!([first]), "{expired}");
    assert_eq!(expired["snapshots"].as_array().map(Vec::len), Some(1));

    // The step fails once after its stall, and its retry reads the pinned
    // snapshot again: five rows, not seven.
    std::fs::write(dir.join("go"), "").expect("release the stall");
    wait_run(&db, r, "succeeded", &runner).await;
    let (attempts, output): (i32, Value) = sqlx::query_as(
        "SELECT attempts, output FROM orca.step_states WHERE run_id = $1 AND step = 'read'",
    )
    .bind(r)
    .fetch_one(&db.pool)
    .await
    .expect("read step");
    assert_eq!((attempts, output), (2, json!(5)));
}

#[tokio::test]
async fn maintenance_schedules_fire_from_the_tick_one_run_at_a_time() {
    let db = TestDb::new().await;
    let mut m = lake_manifest("lake");
    m["steps"][0]["writes"] = json!(["lake.raw"]);
    // No schedule of its own: the ticks below make maintenance runs only.
    if let Some(o) = m.as_object_mut() {
        o.remove("schedule");
    }
    db.register(&m).await;
    let next: String = sqlx::query_scalar(
        "SELECT orca.schedule_maintenance('lake.raw', '0 4 * * *', '{\"compact\": false}', \
         'Europe/Paris')::text",
    )
    .fetch_one(&db.pool)
    .await
    .expect("schedule");
    let listed = db
        .strings("SELECT dataset || ' ' || cron || ' ' || tz || ' ' || (options->'compact')::text FROM orca.maintenance")
        .await;
    assert_eq!(listed, ["lake.raw 0 4 * * * Europe/Paris false"]);
    // The first fire is at 04:00 on Paris's clock.
    let paris: String =
        sqlx::query_scalar("SELECT (($1::timestamptz) AT TIME ZONE 'Europe/Paris')::time::text")
            .bind(&next)
            .fetch_one(&db.pool)
            .await
            .expect("local time");
    assert_eq!(paris, "04:00:00", "{next}");
    let runs = "SELECT count(*) FROM orca.runs WHERE kind = 'maintain'";
    db.tick(&next).await;
    assert_eq!(db.scalar_i64(runs).await, 1);
    let shape = db
        .strings(
            "SELECT trigger || ' ' || status || ' ' || array_to_string(partitions, ',') || ' ' \
             || (request #>> '{options,expire,keep_last}') FROM orca.runs WHERE kind = 'maintain'",
        )
        .await;
    assert_eq!(shape, ["schedule running lake.raw 10"]);
    // The next day's fire finds that run still going: no second one.
    db.tick("2099-01-01 00:00:00+00").await;
    assert_eq!(db.scalar_i64(runs).await, 1);
    // It waits for a runner with an engine: the queue row says maintain.
    let queued = db.strings("SELECT command FROM orca.queue").await;
    assert_eq!(queued, ["maintain"]);
    assert!(
        sqlx::query_scalar::<_, bool>("SELECT orca.unschedule_maintenance('lake.raw')")
            .fetch_one(&db.pool)
            .await
            .expect("unschedule")
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.maintenance").await,
        0
    );
}

#[tokio::test]
async fn bad_maintenance_input_is_refused_with_its_sqlstate_and_queues_nothing() {
    let db = TestDb::new().await;
    let mut m = lake_manifest("lake");
    m["steps"][0]["writes"] = json!(["lake.raw"]);
    db.register(&m).await;
    let cases = [
        (
            "SELECT orca.maintain('lake.gold')",
            "OR043",
            "reads or writes dataset lake.gold",
        ),
        (
            "SELECT orca.maintain('Lake.Raw')",
            "OR042",
            "malformed dataset 'Lake.Raw'",
        ),
        (
            "SELECT orca.maintain(NULL)",
            "OR042",
            "malformed dataset NULL",
        ),
        (
            "SELECT orca.maintain('lake.raw', '{\"vacuum\": true}')",
            "OR042",
            "unknown operation 'vacuum'",
        ),
        (
            "SELECT orca.maintain('lake.raw', '{\"expire\": {\"keep\": 3}}')",
            "OR042",
            "unknown setting expire.keep",
        ),
        (
            "SELECT orca.maintain('lake.raw', '{\"expire\": {\"keep_last\": 0}}')",
            "OR042",
            "expire.keep_last must be an integer from 1, got 0",
        ),
        (
            "SELECT orca.maintain('lake.raw', '{\"orphans\": {\"older_than\": \"5 minutes\"}}')",
            "OR042",
            "orphans.older_than must be at least 3600 seconds",
        ),
        (
            "SELECT orca.maintain('lake.raw', '{\"expire\": {\"older_than\": \"soon\"}}')",
            "OR042",
            "expire.older_than must be an interval",
        ),
        (
            "SELECT orca.maintain('lake.raw', '[]')",
            "OR042",
            "expected a JSON object",
        ),
        (
            "SELECT orca.schedule_maintenance('lake.raw', '0 4 * *')",
            "OR030",
            "0 4 * *",
        ),
        (
            "SELECT orca.schedule_maintenance('lake.raw', '0 4 * * *', '{}', 'Mars/Olympus')",
            "OR032",
            "Mars/Olympus",
        ),
    ];
    for (sql, code, text) in cases {
        let (got, message) = expect_error(&db.pool, sql).await;
        assert_eq!(got, code, "{sql}: {message}");
        assert!(message.contains(text), "{sql}: {message}");
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.runs").await
            + db.scalar_i64("SELECT count(*) FROM orca.maintenance").await,
        0,
        "a refused call queued or scheduled something"
    );
    // Another org sees none of this org's datasets to maintain.
    db.pool
        .execute("SELECT orca.create_org('globex')")
        .await
        .expect("org");
    let mut c = db.connect().await;
    c.execute("SET orca.org = 'globex'").await.expect("org");
    let (code, message) = expect_error(&mut c, "SELECT orca.maintain('lake.raw')").await;
    assert_eq!(code, "OR043", "{message}");
    assert!(message.contains("org 'globex'"), "{message}");
}

/// A table only a sync writes (an Iceberg destination's) is maintained
/// under the sync's pipeline: its epochs' small files are compacted and the
/// old snapshots expired with every row kept once; the sync goes on from
/// its marker afterwards, merging into the compacted file exactly once. A
/// member of another org cannot maintain it.
#[tokio::test]
async fn a_table_only_a_sync_writes_is_maintained_and_the_sync_goes_on_exactly_once() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL,
                                     qty int NOT NULL);
         INSERT INTO public.orders
         SELECT g, '2024-01-01'::timestamptz + g * interval '1 minute', g % 7
         FROM generate_series(1, 600) g;",
    )
    .execute(&db.pool)
    .await
    .expect("source table");
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3, NULL, 'effectively_once')")
        .bind(json!({"type": "postgres", "url": db.url(), "batch_rows": 100}))
        .bind(json!({"type": "iceberg", "namespace": "raw"}))
        .bind(
            json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                      "primary_key": ["id"], "mode": "merge"}]),
        )
        .execute(&db.pool)
        .await
        .expect("an Iceberg sync");
    // No pipeline reads or writes raw.orders: before, this was OR043.
    let dir = scratch("maintain-sync");
    let (wh, store, logs) = (dir.join("wh"), dir.join("store"), dir.join("logs"));
    let whs = wh.to_string_lossy().to_string();
    let runner =
        orca_tests::procs::sync_runner_with(&db, &store, &logs, &[("ORCA_WAREHOUSE", &whs)]);
    let r = run(&db, "SELECT orca.run('shop', 'now')").await;
    wait_run(&db, r, "succeeded", &runner).await;
    let before = read(&db, &wh, "raw.orders");
    assert_eq!(before["rows"].as_array().map(Vec::len), Some(600));
    let epochs = snapshot_ids(&before).len();
    assert!(epochs >= 6, "an epoch per 100 rows: {epochs}");

    let m = run(
        &db,
        r#"SELECT orca.maintain('raw.orders', '{"compact": {"min_files": 2}, "orphans": false,
              "expire": {"keep_last": 1, "older_than": "0 seconds", "grace": "0 seconds"}}')"#,
    )
    .await;
    wait_run(&db, m, "succeeded", &runner).await;
    let owner = db
        .strings(&format!(
            "SELECT p.name || ' ' || r.kind FROM orca.runs r \
             JOIN orca.pipelines p ON p.id = r.pipeline_id WHERE r.id = {m}"
        ))
        .await;
    assert_eq!(
        owner,
        ["shop maintain"],
        "it runs under the sync's pipeline"
    );
    let after = read(&db, &wh, "raw.orders");
    assert_eq!(rows(&after), rows(&before), "the rows changed");
    let ids = snapshot_ids(&after);
    assert_eq!(ids.len(), 1, "{after}");
    let current = &after["snapshots"][0];
    assert_eq!(current["operation"], "replace", "{current}");
    assert_eq!(current["summary"]["total-data-files"], "1", "{current}");
    // The sync's marker outlives its expired snapshots.
    let head = db
        .scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'shop'")
        .await;
    let stats = pyiceberg(&["stats", &db.url(), &whs, "raw.orders", "qty"]);
    assert_eq!(
        stats["properties"]["orca.sync.shop.epoch"],
        head.to_string(),
        "{stats}"
    );

    // The sync goes on: changed rows merge into the compacted file, new ones
    // append, each key once at its newest version.
    sqlx::raw_sql(
        "UPDATE public.orders SET qty = qty + 100, updated_at = '2031-01-01' WHERE id % 12 = 0;
         INSERT INTO public.orders
         SELECT g, '2031-02-01'::timestamptz + g * interval '1 second', 1
         FROM generate_series(601, 700) g;",
    )
    .execute(&db.pool)
    .await
    .expect("changes");
    let r = run(&db, "SELECT orca.run('shop', 'now')").await;
    wait_run(&db, r, "succeeded", &runner).await;
    let stats = pyiceberg(&["stats", &db.url(), &whs, "raw.orders", "qty"]);
    assert_eq!(stats["rows"], 700, "{stats}");
    let want = db
        .scalar_i64("SELECT sum(qty)::int8 FROM public.orders")
        .await;
    assert_eq!(stats["sum"], want, "every key at its newest version");
    let ids = pyiceberg(&["stats", &db.url(), &whs, "raw.orders", "id"]);
    assert_eq!(ids["distinct"], 700, "{ids}");

    // Another org's member: the sync is not theirs, nor its table.
    ensure_role(&db, "orca_t_maint_bob", &["orca_operator"]).await;
    db.pool
        .execute("SELECT orca.create_org('globex'), orca.add_member('globex', 'orca_t_maint_bob')")
        .await
        .expect("globex");
    let mut bob = connect_org(&db, "orca_t_maint_bob", "globex").await;
    let queued = db.scalar_i64("SELECT count(*) FROM orca.runs").await;
    for sql in [
        "SELECT orca.maintain('raw.orders')",
        "SELECT orca.schedule_maintenance('raw.orders', '0 5 * * *')",
    ] {
        let (code, message) = expect_error(&mut bob, sql).await;
        assert_eq!(code, "OR043", "{sql}: {message}");
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.runs").await,
        queued
    );
    let _ = std::fs::remove_dir_all(dir);
}
