//! An upgrade with work in flight, from each release, done as
//! docs/operations.md ("Upgrading") tells an operator to do it: a server
//! runs the release (its library preloaded, its background worker ticking);
//! runners hold leases on a backfill's attempts and a sync is mid-run (from
//! 0.2.0 on, a change-data-capture sync's slot also holds changes it has not
//! read); this build's files are installed under the running server, the
//! server restarts, and `ALTER EXTENSION orca UPDATE` moves the schema. The
//! same runner processes go on: every run ends succeeded, no attempt is lost
//! or run twice, the sync's HEAD moves on from where it was, and the CDC
//! sync reads the changes its slot kept, once.
//!
//! Each release's library is built from its commit by scripts/setup.sh;
//! the runner, pipeline and engine binaries are this build's (the SQL API
//! they call is the same in every release).
//!
//! Also: the databases of a new server install, or update, at the same
//! moment (the group roles they share are raced for).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use orca_tests::cluster::PrivateCluster;
use orca_tests::install::{installed_library, release_library, Installation};
use orca_tests::procs::{bin, outputs, probe_calls as calls, Runner};
use orca_tests::releases::{catalog, catalog_difference, current_version};
use orca_tests::sqlx::{self, Connection, Executor, PgConnection};
use orca_tests::*;
use serde_json::json;

const MONTHS: usize = 6;
const SOURCE_ROWS: i64 = 400_000;

async fn scalar_i64(c: &mut PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(c)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Rows and distinct ids in the Parquet files of the stream `orders`.
fn published(out: &Path) -> (usize, usize) {
    use arrow_array::{Array, Int64Array};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let mut ids = std::collections::HashSet::new();
    let mut rows = 0;
    let files = std::fs::read_dir(out.join("orders"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    for f in files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
    {
        let file = std::fs::File::open(f).expect("parquet file");
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .expect("parquet reader");
        for b in reader {
            let b = b.expect("parquet batch");
            let id = b
                .column_by_name("id")
                .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
                .expect("an id column of bigints");
            rows += id.len();
            ids.extend(id.values().iter().copied());
        }
    }
    (rows, ids.len())
}

/// The text of every attempt log under a runner's logs directory.
fn attempt_logs(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("attempt-"))
            {
                out.push(std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    out
}

#[tokio::test]
async fn the_first_release_upgrades_with_a_backfill_and_a_sync_in_flight() {
    upgrade_in_flight("0.1.0").await;
}

#[tokio::test]
async fn release_0_2_0_upgrades_with_a_backfill_a_sync_and_a_cdc_slot_in_flight() {
    upgrade_in_flight("0.2.0").await;
}

/// Rows and distinct ids in the Parquet files a CDC sync appended.
fn cdc_published(out: &Path) -> (usize, usize) {
    use arrow_array::{Array, Int64Array};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let mut ids = std::collections::HashSet::new();
    let mut rows = 0;
    let files = std::fs::read_dir(out.join("events"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    for f in files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
    {
        let file = std::fs::File::open(f).expect("parquet file");
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .expect("parquet reader");
        for b in reader {
            let b = b.expect("batch");
            let col = b.column_by_name("id").expect("id column");
            let col = col
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("bigint ids");
            rows += col.len();
            ids.extend(col.iter().flatten());
        }
    }
    (rows, ids.len())
}

/// Waits for a run to succeed, on a private cluster.
async fn wait_succeeded(url: &str, run: i64, runners: &[&Runner]) {
    wait_until(
        &format!("run {run} to succeed"),
        Duration::from_secs(180),
        || async {
            let mut c = PgConnection::connect(url).await.ok()?;
            let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
                .bind(run)
                .fetch_one(&mut c)
                .await
                .ok()?;
            assert_ne!(status, "failed", "run {run} failed\n{}", outputs(runners));
            (status == "succeeded").then_some(())
        },
        || outputs(runners),
    )
    .await;
}

async fn upgrade_in_flight(from: &str) {
    let cdc = from != "0.1.0";
    let library = release_library(from).unwrap_or_else(|| {
        // A clone without the release's commit cannot build its library;
        // the schema upgrade below is then run on this build's library.
        eprintln!(
            "NOTE: release {from}'s library was not built (scripts/setup.sh builds it from \
             the commit migrations/RELEASES names); starting on this build's library"
        );
        installed_library()
    });
    let install = Installation::copy();
    install.install_release(from, &library);
    let cluster = PrivateCluster::start_in(
        &install.bindir,
        &["orca.databases = 'orca'", "orca.tick_ms = 200"],
    );
    let mut admin = PgConnection::connect(&cluster.url("postgres"))
        .await
        .expect("connect");
    admin
        .execute("CREATE DATABASE orca")
        .await
        .expect("create db");
    let url = cluster.url("orca");
    let mut c = PgConnection::connect(&url).await.expect("connect orca");
    c.execute("CREATE EXTENSION orca")
        .await
        .expect("install the release");
    let version: String =
        sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'orca'")
            .fetch_one(&mut c)
            .await
            .expect("version");
    assert_eq!(version, from);

    // The sync reads a table of another server (the test cluster), so that
    // the restart below is the control plane's alone.
    let source = TestDb::new().await;
    sqlx::raw_sql(&format!(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL,
                                     customer text, amount numeric(12,2));
         INSERT INTO public.orders
         SELECT g, '2024-01-01'::timestamptz + g * interval '1 second', 'customer ' || (g % 500),
                (g % 100000) / 100.0
         FROM generate_series(1, {SOURCE_ROWS}) g;"
    ))
    .execute(&source.pool)
    .await
    .expect("source table");
    let dir = scratch("work");
    let (out, store, logs) = (dir.join("out"), dir.join("store"), dir.join("logs"));
    let out_cdc = dir.join("out-cdc");
    if from != "0.1.0" {
        // From 0.2.0 on netguard judges the syncs' hosts and paths: the
        // source is this machine's test cluster, the destinations scratch.
        sqlx::query("SELECT orca.allow('default', '127.0.0.1'), orca.allow('default', $1)")
            .bind(dir.to_string_lossy().to_string())
            .execute(&mut c)
            .await
            .expect("allow the source's host and the scratch directory");
    }
    if cdc {
        // A change stream of another table of the source: its slot lives on
        // the source's server and holds changes across the upgrade.
        sqlx::raw_sql(
            "CREATE TABLE public.events (id bigint PRIMARY KEY, v int);
             INSERT INTO public.events SELECT g, g FROM generate_series(1, 1000) g;",
        )
        .execute(&source.pool)
        .await
        .expect("the CDC source table");
        sqlx::query("SELECT orca.create_sync('changes', $1, $2, $3, NULL, 'at_least_once')")
            .bind(json!({"type": "postgres_cdc", "url": source.url()}))
            .bind(json!({"type": "parquet", "url": out_cdc.to_string_lossy()}))
            .bind(
                json!([{"name": "events", "table": "public.events", "primary_key": ["id"],
                          "mode": "append"}]),
            )
            .execute(&mut c)
            .await
            .expect("create the CDC sync");
    }
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3, NULL, 'at_least_once')")
        .bind(json!({"type": "postgres", "url": source.url(), "batch_rows": 1000}))
        .bind(json!({"type": "parquet", "url": out.to_string_lossy()}))
        .bind(
            json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                      "primary_key": ["id"]}]),
        )
        .execute(&mut c)
        .await
        .expect("create_sync");
    let reg = Command::new(bin("orca"))
        .args(["register", bin("probe").to_str().unwrap_or_default()])
        .env("DATABASE_URL", &url)
        .output()
        .expect("orca register");
    assert!(
        reg.status.success(),
        "orca register: {}",
        String::from_utf8_lossy(&reg.stderr)
    );

    let probe_dir = dir.to_string_lossy().to_string();
    let (engine, store_s) = (bin("orca-engine"), store.to_string_lossy().to_string());
    let env = [
        ("PROBE_DIR", probe_dir.as_str()),
        ("PROBE_SLEEP_MS", "1500"),
        ("ORCA_STORE", store_s.as_str()),
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
        // What 0.1.0 leases carry has no binary hash: the documented way
        // through an upgrade is to let runners run unpinned versions until
        // they are registered again.
        ("ORCA_ALLOW_UNPINNED", "true"),
    ];
    let (a, b) = if from == "0.1.0" {
        // Superuser runners, the exception: 0.1.0 has no runner tokens to
        // give a least-privileged login.
        (
            Runner::start_superuser(&url, "runner-a", 3, &logs, &env),
            Runner::start_superuser(&url, "runner-b", 3, &logs, &env),
        )
    } else {
        (
            Runner::start(&url, "runner-a", 3, &logs, &env),
            Runner::start(&url, "runner-b", 3, &logs, &env),
        )
    };
    let pids = (a.pid(), b.pid());
    if cdc {
        // The CDC sync's first run: its snapshot, and the slot it makes.
        let run: i64 = sqlx::query_scalar("SELECT orca.run('changes', 'now')")
            .fetch_one(&mut c)
            .await
            .expect("the CDC sync's first run");
        wait_succeeded(&url, run, &[&a, &b]).await;
        assert_eq!(cdc_published(&out_cdc), (1000, 1000), "the snapshot");
    }
    c.execute(format!("SELECT orca.backfill('probe', '2024-01..2024-0{MONTHS}')").as_str())
        .await
        .expect("backfill");
    c.execute("SELECT orca.run('shop', 'now')")
        .await
        .expect("sync run");

    // Work in flight: leases on the backfill's attempts, the sync mid-run.
    let c = tokio::sync::Mutex::new(c);
    wait_until(
        "leases held and the sync at epoch 3",
        Duration::from_secs(120),
        || async {
            let mut c = c.lock().await;
            let leased = scalar_i64(
                &mut c,
                "SELECT count(*) FROM orca.leases l JOIN orca.attempts a ON a.id = l.attempt_id
                 JOIN orca.runs r ON r.id = a.run_id WHERE r.kind = 'pipeline'",
            )
            .await;
            let head = scalar_i64(
                &mut c,
                "SELECT head_epoch FROM orca.syncs WHERE name = 'shop'",
            )
            .await;
            (leased > 0 && head >= 3).then_some(())
        },
        || outputs(&[&a, &b]),
    )
    .await;
    let mut c = c.into_inner();
    if cdc {
        // Changes the slot holds, unread, across the upgrade.
        sqlx::raw_sql("INSERT INTO public.events SELECT g, g FROM generate_series(1001, 1050) g")
            .execute(&source.pool)
            .await
            .expect("changes for the slot to hold");
    }

    // The upgrade, as an operator does it: the new package's files under the
    // running server, a restart, then the schema.
    install.install_current();
    let head_before = scalar_i64(
        &mut c,
        "SELECT head_epoch FROM orca.syncs WHERE name = 'shop'",
    )
    .await;
    let in_flight = scalar_i64(&mut c, "SELECT count(*) FROM orca.leases").await;
    drop(c);
    cluster.restart();
    // pg_ctl -w has seen the server ready; a connection over TCP may still
    // meet it finishing recovery for a moment.
    let mut c = {
        let mut tries = 0;
        loop {
            match PgConnection::connect(&url).await {
                Ok(c) => break c,
                Err(e) if tries < 20 => {
                    tries += 1;
                    eprintln!("connect after the restart: {e}; again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => panic!("connect after the restart: {e}\n{}", cluster.log()),
            }
        }
    };
    // As docs/operations.md tells an operator: a deadlock or a lock not had
    // within a minute changed nothing, so the update is run again.
    let mut tries = 0;
    loop {
        tries += 1;
        match c.execute("ALTER EXTENSION orca UPDATE").await {
            Ok(_) => break,
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("40P01" | "55P03")) && tries < 3 =>
            {
                eprintln!("ALTER EXTENSION orca UPDATE: {e}; again, as an operator would");
            }
            Err(e) => panic!("ALTER EXTENSION orca UPDATE: {e}\n{}", cluster.log()),
        }
    }
    let version: String =
        sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'orca'")
            .fetch_one(&mut c)
            .await
            .expect("version");
    assert_eq!(version, current_version());
    assert!(
        in_flight >= 2,
        "leases were held across the upgrade ({in_flight})"
    );
    let sync_running = scalar_i64(
        &mut c,
        "SELECT count(*) FROM orca.runs WHERE kind = 'sync' AND status = 'running'",
    )
    .await;
    assert_eq!(
        sync_running, 1,
        "the sync was still running at the upgrade (HEAD at epoch {head_before}): the source is \
         too small for this machine"
    );

    // The same runners go on, and everything ends.
    let c = tokio::sync::Mutex::new(c);
    wait_until(
        "every run to end after the upgrade",
        Duration::from_secs(300),
        || async {
            let open = scalar_i64(
                &mut *c.lock().await,
                "SELECT count(*) FROM orca.runs WHERE status IN ('queued', 'running')",
            )
            .await;
            (open == 0).then_some(())
        },
        || format!("{}\n{}", outputs(&[&a, &b]), cluster.log()),
    )
    .await;
    let mut c = c.into_inner();
    assert_eq!(
        (a.pid(), b.pid()),
        pids,
        "the runners are the same processes"
    );
    if cdc {
        // The CDC sync's next run reads what its slot kept, once.
        let run: i64 = sqlx::query_scalar("SELECT orca.run('changes', 'now')")
            .fetch_one(&mut c)
            .await
            .expect("the CDC sync's run after the upgrade");
        wait_succeeded(&url, run, &[&a, &b]).await;
        assert_eq!(
            cdc_published(&out_cdc),
            (1050, 1050),
            "the changes the slot held, each once"
        );
    }
    let runs: Vec<(i64, String, String, i32)> = sqlx::query_as(
        "SELECT r.id, r.kind, r.status, r.attempts FROM orca.runs r \
         JOIN orca.pipelines p ON p.id = r.pipeline_id \
         WHERE r.kind IN ('pipeline', 'sync') AND p.name <> 'changes' ORDER BY r.id",
    )
    .fetch_all(&mut c)
    .await
    .expect("runs");
    assert_eq!(runs.len(), MONTHS + 1, "{runs:?}");
    for (id, kind, status, attempts) in &runs {
        assert_eq!(
            (status.as_str(), *attempts),
            ("succeeded", 1),
            "{kind} run {id} ended {status} after {attempts} attempts\n{}",
            outputs(&[&a, &b])
        );
    }
    let not_succeeded: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT id, status, error FROM orca.attempts WHERE status <> 'succeeded' ORDER BY id",
    )
    .fetch_all(&mut c)
    .await
    .expect("attempts");
    assert!(
        not_succeeded.is_empty(),
        "attempts lost or failed: {not_succeeded:?}"
    );
    // Each step of each month ran once (the gather step once per run).
    let ran = calls(&dir);
    for step in ["load", "measure"] {
        for m in 1..=MONTHS {
            assert_eq!(
                ran.get(&(step.to_string(), format!("2024-{m:02}"))),
                Some(&1),
                "{step} of 2024-{m:02} ran {:?} times",
                ran.get(&(step.to_string(), format!("2024-{m:02}")))
            );
        }
    }
    if ran.get(&("total".to_string(), "*".to_string())) != Some(&MONTHS) {
        // What each run's gather step says it did, to tell a step that did
        // not run from a call the log did not keep.
        let states: Vec<(i64, String, i32, Option<String>)> = sqlx::query_as(
            "SELECT run_id, status, attempts, code FROM orca.step_states WHERE step = 'total' \
             ORDER BY run_id",
        )
        .fetch_all(&mut c)
        .await
        .expect("states");
        panic!(
            "the gather step ran {:?} times for {MONTHS} runs; its states: {states:?}\ncalls.log:\n{}\n{}",
            ran.get(&("total".to_string(), "*".to_string())),
            std::fs::read_to_string(dir.join("calls.log")).unwrap_or_default(),
            outputs(&[&a, &b])
        );
    }
    // HEAD moved on from where the upgrade found it, and every row arrived
    // once: the sync's one attempt read the table once.
    let head_after = scalar_i64(
        &mut c,
        "SELECT head_epoch FROM orca.syncs WHERE name = 'shop'",
    )
    .await;
    assert!(
        head_after > head_before,
        "HEAD {head_before} -> {head_after}"
    );
    let (rows, ids) = published(&out);
    assert_eq!(
        ids,
        usize::try_from(SOURCE_ROWS).unwrap_or(0),
        "every row arrived"
    );
    assert_eq!(rows, ids, "and once");

    // The attempts alive across the restart lost their connections and went
    // on on new ones (their logs say so).
    let went_on = attempt_logs(&logs)
        .iter()
        .filter(|t| t.contains("went on on a new connection"))
        .count();
    assert!(
        went_on >= 1,
        "no attempt's log shows a call that went on after the restart\n{}",
        outputs(&[&a, &b])
    );
    eprintln!(
        "upgrade: {in_flight} leases held and HEAD at epoch {head_before} at the upgrade; \
         {went_on} attempts went on on new connections; HEAD at epoch {head_after} after"
    );

    // The upgraded schema is a fresh install's, and the new library ticks.
    admin = PgConnection::connect(&cluster.url("postgres"))
        .await
        .expect("connect");
    admin
        .execute("CREATE DATABASE fresh")
        .await
        .expect("create fresh");
    let mut fresh = PgConnection::connect(&cluster.url("fresh"))
        .await
        .expect("fresh");
    fresh
        .execute("CREATE EXTENSION orca")
        .await
        .expect("fresh install");
    if let Some(diff) = catalog_difference(&catalog(&mut fresh).await, &catalog(&mut c).await) {
        panic!("the upgraded schema differs from a fresh install:\n{diff}");
    }
    let workers = scalar_i64(
        &mut c,
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'orca scheduler'",
    )
    .await;
    assert_eq!(workers, 1, "the background worker runs on the new library");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `sql` in each of `dbs` of `cluster` at once; the errors, by database.
async fn at_once(cluster: &PrivateCluster, dbs: &[String], sql: &str) -> Vec<String> {
    let mut conns = Vec::new();
    for db in dbs {
        conns.push(
            PgConnection::connect(&cluster.url(db))
                .await
                .unwrap_or_else(|e| panic!("connect {db}: {e}")),
        );
    }
    let mut tasks = Vec::new();
    for (db, mut c) in dbs.iter().cloned().zip(conns) {
        let sql = sql.to_string();
        tasks.push(tokio::spawn(async move {
            c.execute(sql.as_str())
                .await
                .err()
                .map(|e| format!("{db}: {sql}: {e}"))
        }));
    }
    let mut errors = Vec::new();
    for t in tasks {
        if let Some(e) = t.await.expect("join") {
            errors.push(e);
        }
    }
    errors
}

async fn databases(cluster: &PrivateCluster, prefix: &str, n: usize) -> Vec<String> {
    let mut admin = PgConnection::connect(&cluster.url("postgres"))
        .await
        .expect("connect");
    let mut dbs = Vec::new();
    for i in 0..n {
        let db = format!("{prefix}{i}");
        admin
            .execute(format!("CREATE DATABASE {db}").as_str())
            .await
            .expect("create database");
        dbs.push(db);
    }
    dbs
}

/// The group roles are the cluster's, made by the first install: databases
/// that install (or upgrade) at the same moment on a new server all succeed,
/// the ones that lose the race for a role finding it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn databases_of_a_new_server_install_and_upgrade_at_once() {
    const N: usize = 4;
    let cluster = PrivateCluster::start(&[]);
    let dbs = databases(&cluster, "fresh", N).await;
    let errors = at_once(&cluster, &dbs, "CREATE EXTENSION orca").await;
    assert!(errors.is_empty(), "every install succeeds: {errors:#?}");
    let mut c = PgConnection::connect(&cluster.url(&dbs[N - 1]))
        .await
        .expect("connect");
    let roles: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_roles WHERE rolname IN \
         ('orca_viewer', 'orca_operator', 'orca_runner', 'orca_attempt', 'orca_admin', 'orca_relay')",
    )
    .fetch_one(&mut c)
    .await
    .expect("roles");
    assert_eq!(roles, 6, "each group role made once");
    let admin_in: bool = sqlx::query_scalar(
        "SELECT pg_has_role('orca_admin', 'orca_viewer', 'MEMBER') \
         AND pg_has_role('orca_admin', 'orca_relay', 'MEMBER') \
         AND pg_has_role('orca_runner', 'orca_attempt', 'MEMBER')",
    )
    .fetch_one(&mut c)
    .await
    .expect("memberships");
    assert!(admin_in, "the memberships are granted");
    drop(c);
    drop(cluster);

    // A server whose databases run the first release (its roles made) and
    // update together: the roles a later release adds are raced for too.
    let current = current_version();
    let Some(first) = releases::releases()
        .into_iter()
        .find(|r| r.version != current)
    else {
        return;
    };
    let cluster = PrivateCluster::start(&[]);
    let dbs = databases(&cluster, "old", N).await;
    for db in &dbs {
        let mut c = PgConnection::connect(&cluster.url(db))
            .await
            .expect("connect");
        c.execute(format!("CREATE EXTENSION orca VERSION '{}'", first.version).as_str())
            .await
            .unwrap_or_else(|e| panic!("install {} in {db}: {e}", first.version));
    }
    let errors = at_once(&cluster, &dbs, "ALTER EXTENSION orca UPDATE").await;
    assert!(errors.is_empty(), "every upgrade succeeds: {errors:#?}");
    for db in &dbs {
        let mut c = PgConnection::connect(&cluster.url(db))
            .await
            .expect("connect");
        let v: String =
            sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'orca'")
                .fetch_one(&mut c)
                .await
                .expect("extversion");
        assert_eq!(v, current, "{db} upgraded");
    }
}
