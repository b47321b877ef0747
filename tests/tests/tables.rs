//! Iceberg tables end to end: pipelines write real tables through the SDK,
//! runners run them, and PyIceberg, another client of the same catalog,
//! reads them back.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use orca_tests::procs::{attempts_of, bin, orca, outputs, register, wait_run, Runner};
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

/// PyIceberg, through tests/py/iceberg.py.
fn py(args: &[&str]) -> Value {
    py_env(args, &[])
}

/// PyIceberg with extra environment (the S3 settings of an S3 warehouse).
fn py_env(args: &[&str], env: &[(&str, String)]) -> Value {
    let python = orca_tests::s3::python();
    let script = repo_root().join("tests/py/iceberg.py");
    let out = Command::new(&python)
        .arg(script)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap_or_else(|e| panic!("run {python} (scripts/setup.sh installs it): {e}"));
    assert!(
        out.status.success(),
        "pyiceberg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("pyiceberg JSON")
}

fn read(db: &TestDb, wh: &Path, dataset: &str) -> Value {
    py(&["read", &db.url(), wh.to_str().unwrap_or_default(), dataset])
}

/// (text, integer) pairs of two columns of a table read, sorted.
fn pairs(table: &Value, text: &str, int: &str) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = table["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r[text].as_str().unwrap_or_default().to_string(),
                r[int].as_i64().unwrap_or(0),
            )
        })
        .collect();
    out.sort();
    out
}

/// The current snapshot of a table read (its id, operation and summary).
fn current_snapshot(table: &Value) -> Value {
    table["snapshots"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["id"] == table["current"])
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn the_lake_s_tables_read_back_in_pyiceberg_with_their_orca_properties() {
    let db = TestDb::new().await;
    register(&db, "lake");
    let wh = scratch("lake-wh");
    let logs = scratch("lake-logs");
    let whs = wh.to_string_lossy().to_string();
    let runner = Runner::start(
        &db.url(),
        "r",
        2,
        &logs,
        &[("ORCA_WAREHOUSE", whs.as_str())],
    );
    let out = orca(&db, &["backfill", "lake", "2013-01..2013-03"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        runner.output()
    );

    let monthly = read(&db, &wh, "lake.monthly");
    assert_eq!(
        monthly["schema"],
        json!([
            ["month", "string", true],
            ["flights", "long", true],
            ["avg_delay_minutes", "double", true],
            ["cancelled_pct", "double", true]
        ])
    );
    let flights = pairs(&monthly, "month", "flights");
    assert_eq!(
        flights,
        [
            ("2013-01".into(), 27004),
            ("2013-02".into(), 24951),
            ("2013-03".into(), 28834)
        ]
    );
    assert!(monthly["location"]
        .as_str()
        .unwrap_or_default()
        .ends_with("/lake/monthly"));
    // How a lost commit waits, as any Iceberg writer of the table reads it.
    assert_eq!(monthly["properties"]["commit.retry.min-wait-ms"], "10");
    assert_eq!(monthly["properties"]["commit.retry.num-retries"], "10");

    // Every snapshot carries the orca.* properties of the step that made it,
    // and the control plane recorded exactly those snapshots.
    let hash = db
        .strings("SELECT registry_hash FROM orca.pipeline_versions")
        .await;
    let runs = db
        .strings("SELECT id::text FROM orca.runs ORDER BY id")
        .await;
    let raw = read(&db, &wh, "lake.raw");
    let snaps = raw["snapshots"].as_array().cloned().unwrap_or_default();
    assert_eq!(snaps.len(), 3);
    let mut months = Vec::new();
    for s in &snaps {
        let p = &s["summary"];
        assert_eq!(p["orca.pipeline"], "lake", "{p}");
        assert_eq!(p["orca.step"], "load", "{p}");
        assert_eq!(p["orca.attempt"], "1", "{p}");
        assert_eq!(p["orca.commit"], "1", "{p}");
        assert_eq!(p["orca.code"], hash[0].as_str(), "{p}");
        assert!(
            runs.contains(&p["orca.run"].as_str().unwrap_or_default().to_string()),
            "{p}"
        );
        months.push(p["orca.partition"].as_str().unwrap_or_default().to_string());
    }
    months.sort();
    assert_eq!(months, ["2013-01", "2013-02", "2013-03"]);
    let mut recorded = db
        .strings("SELECT snapshot_id::text FROM orca.commits WHERE dataset = 'lake.raw' ORDER BY 1")
        .await;
    let mut seen: Vec<String> = snaps.iter().map(|s| s["id"].to_string()).collect();
    recorded.sort();
    seen.sort();
    assert_eq!(recorded, seen);
    let clean = read(&db, &wh, "lake.clean");
    let reads: Value = serde_json::from_str(
        clean["snapshots"][0]["summary"]["orca.reads"]
            .as_str()
            .unwrap_or("{}"),
    )
    .expect("orca.reads JSON");
    assert!(
        reads["lake.raw"].is_i64(),
        "the clean step names the lake.raw snapshot it read: {reads}"
    );

    // Lineage connects them through the runs.
    let lineage = db
        .strings("SELECT DISTINCT direction || ' ' || related FROM orca.lineage('lake.clean') ORDER BY 1")
        .await;
    assert_eq!(lineage, ["downstream lake.monthly", "upstream lake.raw"]);

    // Every table is partitioned by month, as the pipeline is, and each
    // clean step read its month's file alone (of the one to three months
    // the runs had loaded when it read): the attempt logs say so.
    let logged = runner.output();
    for (month, rows) in [("2013-01", 93), ("2013-02", 84), ("2013-03", 93)] {
        let line = logged
            .lines()
            .find(|l| l.contains(&format!("[clean {month} #1] scan of lake.raw")))
            .unwrap_or_else(|| panic!("no scan of lake.raw logged for {month}:\n{logged}"));
        assert!(
            line.contains(": 1 of ") && line.contains(&format!(" {rows} rows before filtering")),
            "{line}"
        );
    }
    // PyIceberg and DuckDB, reading the same tables through the catalog's
    // read-only role (a login in orca_viewer, a member of the org), prune
    // by month too.
    ensure_role(&db, "orca_t_tables_reader", &["orca_viewer"]).await;
    db.pool
        .execute("SELECT orca.add_member('default', 'orca_t_tables_reader')")
        .await
        .expect("a reader of the default org");
    let reader = orca_tests::procs::url_as(&db.url(), "orca_t_tables_reader");
    for (dataset, rows) in [("lake.raw", 84), ("lake.clean", 84), ("lake.monthly", 1)] {
        let pruned = py(&[
            "prune",
            &reader,
            wh.to_str().unwrap_or_default(),
            dataset,
            "month",
            "2013-02",
        ]);
        assert_eq!(
            pruned["spec"],
            json!([["month", "identity"]]),
            "{dataset}: {pruned}"
        );
        for reader in ["pyiceberg", "duckdb"] {
            assert_eq!(
                (
                    &pruned[reader]["files"],
                    &pruned[reader]["all_files"],
                    &pruned[reader]["rows"]
                ),
                (&json!(1), &json!(3), &json!(rows)),
                "{reader} reading {dataset} for 2013-02: {pruned}"
            );
        }
    }
}

async fn probe_src(db: &TestDb, wh: &Path, rows: usize) -> i64 {
    let data: Vec<Value> = (0..rows).map(|i| json!({"n": i as i64})).collect();
    let out = py(&[
        "create",
        &db.url(),
        wh.to_str().unwrap_or_default(),
        "probe.src",
        &json!(data).to_string(),
    ]);
    out["snapshot"].as_i64().expect("snapshot")
}

#[tokio::test]
async fn a_crash_after_the_table_commit_does_not_write_the_month_twice() {
    let db = TestDb::new().await;
    register(&db, "probe_tables");
    let wh = scratch("crash-wh");
    probe_src(&db, &wh, 3).await;
    let dir = scratch("crash");
    let (whs, marker, dirs) = (
        wh.to_string_lossy().to_string(),
        dir.join("fault").to_string_lossy().to_string(),
        dir.to_string_lossy().to_string(),
    );
    let runner = Runner::start(
        &db.url(),
        "r",
        1,
        &dir,
        &[
            ("ORCA_WAREHOUSE", whs.as_str()),
            ("ORCA_FAULT", "after-table-commit"),
            ("ORCA_FAULT_MARKER", marker.as_str()),
            ("PROBE_DIR", dirs.as_str()),
        ],
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_tables', '2024-02')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_run(&db, run, "succeeded", &runner).await;
    let attempts = db
        .strings(&format!(
            "SELECT number || ' ' || status FROM orca.attempts WHERE run_id = {run} ORDER BY 1"
        ))
        .await;
    assert_eq!(attempts, ["1 failed", "2 succeeded"], "{}", runner.output());
    // The first attempt committed and died before telling the control plane;
    // the retry found that snapshot instead of writing the month again.
    let rows = read(&db, &wh, "probe.rows");
    assert_eq!(
        rows["rows"].as_array().map(Vec::len),
        Some(29),
        "February 2024 has 29 days"
    );
    assert_eq!(rows["snapshots"].as_array().map(Vec::len), Some(1));
    let recorded = db
        .strings(&format!("SELECT snapshot_id::text FROM orca.commits WHERE run_id = {run} AND dataset = 'probe.rows'"))
        .await;
    assert_eq!(recorded, [rows["current"].to_string()]);
    let counted: Value = sqlx::query_scalar(
        "SELECT output FROM orca.step_states WHERE run_id = $1 AND step = 'count'",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("count output");
    assert_eq!(counted, json!({"2024-02": 29}));
}

#[tokio::test]
async fn a_retry_reads_the_pinned_snapshot_after_another_writer_committed() {
    let db = TestDb::new().await;
    register(&db, "probe_tables");
    let wh = scratch("pin-wh");
    let first = probe_src(&db, &wh, 5).await;
    let dir = scratch("pin");
    let (whs, dirs) = (
        wh.to_string_lossy().to_string(),
        dir.to_string_lossy().to_string(),
    );
    let runner = Runner::start(
        &db.url(),
        "r",
        1,
        &dir,
        &[
            ("ORCA_WAREHOUSE", whs.as_str()),
            ("PROBE_DIR", dirs.as_str()),
            ("PROBE_STALL_ONCE", "read:2024-03:30000"),
            ("PROBE_FAIL_ONCE", "read:2024-03"),
        ],
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_tables', '2024-03')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    // While the read step is stalled (it has read), another writer appends.
    let stalling = dir.join("stalling");
    wait_until(
        "the read step to stall",
        Duration::from_secs(60),
        || async { stalling.exists().then_some(()) },
        || runner.output(),
    )
    .await;
    let data: Vec<Value> = (0..7).map(|i| json!({"n": 100 + i as i64})).collect();
    py(&[
        "append",
        &db.url(),
        &whs,
        "probe.src",
        &json!(data).to_string(),
    ]);
    std::fs::write(dir.join("go"), "").expect("release the stall");
    wait_run(&db, run, "succeeded", &runner).await;
    // The step failed once after its read and its retry read the same snapshot.
    let (attempts, output): (i32, Value) = sqlx::query_as(
        "SELECT attempts, output FROM orca.step_states WHERE run_id = $1 AND step = 'read'",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("read step");
    assert_eq!((attempts, output), (2, json!(5)));
    let pinned: Option<i64> = sqlx::query_scalar(
        "SELECT snapshot_id FROM orca.reads WHERE run_id = $1 AND dataset = 'probe.src'",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("pin");
    assert_eq!(pinned, Some(first));
    // A new run reads the table as it is now.
    let next: i64 = sqlx::query_scalar("SELECT orca.run('probe_tables', '2024-04')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_run(&db, next, "succeeded", &runner).await;
    let output: Value = sqlx::query_scalar(
        "SELECT output FROM orca.step_states WHERE run_id = $1 AND step = 'read'",
    )
    .bind(next)
    .fetch_one(&db.pool)
    .await
    .expect("read step");
    assert_eq!(output, json!(12));
}

/// A run of probe_tables whose read step also touches probe.secret, which
/// it does not declare, through `env` (PROBE_TOUCH or PROBE_SQL_TOUCH); the
/// run fails. Returns the database, the run and the read step's error.
async fn undeclared_read(env: &str, name: &str) -> (TestDb, i64, String) {
    let db = TestDb::new().await;
    register(&db, "probe_tables");
    let wh = scratch(&format!("{name}-wh"));
    probe_src(&db, &wh, 1).await;
    // The table exists: only the step's declaration stands in the way.
    py(&[
        "create",
        &db.url(),
        wh.to_str().unwrap_or_default(),
        "probe.secret",
        &json!([{"n": 1}]).to_string(),
    ]);
    let dir = scratch(name);
    let whs = wh.to_string_lossy().to_string();
    let runner = Runner::start(
        &db.url(),
        "r",
        1,
        &dir,
        &[("ORCA_WAREHOUSE", whs.as_str()), (env, "probe.secret")],
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_tables', '2024-05')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_run(&db, run, "failed", &runner).await;
    let error: String = sqlx::query_scalar(
        "SELECT error FROM orca.step_states WHERE run_id = $1 AND step = 'read'",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("step error");
    (db, run, error)
}

#[tokio::test]
async fn an_undeclared_dataset_fails_the_attempt_naming_the_step_and_the_dataset() {
    let (_db, _run, error) = undeclared_read("PROBE_TOUCH", "undeclared").await;
    assert!(
        error.contains("step read declares neither reads nor writes of dataset probe.secret"),
        "{error}"
    );
}

#[tokio::test]
async fn an_undeclared_dataset_in_sql_fails_the_attempt_naming_the_step_and_the_dataset() {
    let (db, run, error) = undeclared_read("PROBE_SQL_TOUCH", "undeclared-sql").await;
    assert!(
        error.contains("step read does not declare dataset probe.secret in its reads"),
        "{error}"
    );
    // Nothing of it was read: no pin of probe.secret.
    let pins = db
        .strings(&format!(
            "SELECT dataset FROM orca.reads WHERE run_id = {run} AND dataset = 'probe.secret'"
        ))
        .await;
    assert!(pins.is_empty(), "{pins:?}");
}

async fn sensor_runs(db: &TestDb) -> Vec<String> {
    db.strings(
        "SELECT array_to_string(r.partitions, ',') FROM orca.runs r
         JOIN orca.pipelines p ON p.id = r.pipeline_id
         WHERE p.name = 'probe_sensor' AND r.trigger = 'sensor' ORDER BY r.id",
    )
    .await
}

async fn wait_for(db: &TestDb, what: &str, sql: &str, runners: &[&Runner]) {
    wait_for_sql(db, what, sql, Duration::from_secs(60), || outputs(runners)).await
}

#[tokio::test]
async fn sensors_start_one_run_per_new_snapshot_from_outside_writers_and_from_orca_runs() {
    let db = TestDb::new().await;
    db.pool
        .execute(format!("ALTER DATABASE \"{}\" SET orca.sense_seconds = 1", db.name).as_str())
        .await
        .expect("poll every second");
    let wh = scratch("sensor-wh");
    let whs = wh.to_string_lossy().to_string();
    // What probe.src holds before the sensor exists is already seen.
    probe_src(&db, &wh, 2).await;
    register(&db, "probe_tables");
    register(&db, "probe_sensor");
    let logs = scratch("sensor");
    let env = [("ORCA_WAREHOUSE", whs.as_str())];
    let a = Runner::start(&db.url(), "a", 2, &logs, &env);
    let b = Runner::start(&db.url(), "b", 2, &logs, &env);
    wait_for(
        &db,
        "a few polls",
        "SELECT count(*) >= 2 FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id
         WHERE r.kind = 'sense' AND a.status = 'succeeded'",
        &[&a, &b],
    )
    .await;
    assert!(sensor_runs(&db).await.is_empty(), "history started a run");

    // An outside append, saying which day it holds: one run, for its month.
    let rows = json!([{"n": 1}, {"n": 2}, {"n": 3}]).to_string();
    py(&[
        "append",
        &db.url(),
        &whs,
        "probe.src",
        &rows,
        &json!({"orca.partitions": "2024-03-05"}).to_string(),
    ]);
    wait_for(
        &db,
        "the sensor run",
        "SELECT count(*) = 1 FROM orca.runs WHERE trigger = 'sensor' AND status = 'succeeded'",
        &[&a, &b],
    )
    .await;
    // More polls, by either runner, see the same snapshot: still one run.
    let polls_before = db
        .scalar_i64("SELECT count(*) FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id WHERE r.kind = 'sense'")
        .await;
    wait_for(
        &db,
        "more polls",
        &format!(
            "SELECT count(*) >= {} FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id
             WHERE r.kind = 'sense' AND a.status = 'succeeded'",
            polls_before + 2
        ),
        &[&a, &b],
    )
    .await;
    assert_eq!(sensor_runs(&db).await, ["2024-03"]);
    let pollers = db
        .scalar_i64(
            "SELECT count(DISTINCT a.runner) FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id
             WHERE r.kind = 'sense' AND a.status = 'succeeded'",
        )
        .await;
    assert!(pollers >= 1);
    let output: Value = sqlx::query_scalar(
        "SELECT s.output FROM orca.step_states s JOIN orca.runs r ON r.id = s.run_id WHERE r.trigger = 'sensor'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("sensor run output");
    assert_eq!(output, json!(["2024-03", 5]), "it read the new snapshot");

    // A snapshot a succeeded Orca run committed is seen on the next tick.
    db.pool
        .execute("SELECT orca.run('probe_tables', '2024-04')")
        .await
        .expect("run probe_tables");
    wait_for(
        &db,
        "the second sensor run",
        "SELECT count(*) = 2 FROM orca.runs WHERE trigger = 'sensor'",
        &[&a, &b],
    )
    .await;
    assert_eq!(sensor_runs(&db).await, ["2024-03", "2024-04"]);
    let sources = db
        .strings("SELECT source FROM orca.sensed WHERE run_id IS NOT NULL ORDER BY seen_at")
        .await;
    assert_eq!(sources, ["outside", "orca"]);
}

/// A sensor whose source cannot be read (the table's current metadata file
/// gone from the warehouse) opens sensor_unreadable with the poll's error,
/// in the poll's own finish; a poll that reads it again resolves it.
#[tokio::test]
async fn a_sensor_that_cannot_read_its_source_opens_an_incident_until_a_poll_reads_it() {
    let db = TestDb::new().await;
    db.pool
        .execute(format!("ALTER DATABASE \"{}\" SET orca.sense_seconds = 1", db.name).as_str())
        .await
        .expect("poll every second");
    let wh = scratch("sensor-unreadable-wh");
    let whs = wh.to_string_lossy().to_string();
    probe_src(&db, &wh, 2).await;
    register(&db, "probe_sensor");
    let logs = scratch("sensor-unreadable");
    let a = Runner::start(
        &db.url(),
        "a",
        1,
        &logs,
        &[("ORCA_WAREHOUSE", whs.as_str())],
    );
    wait_for(
        &db,
        "a poll that reads probe.src",
        "SELECT count(*) >= 1 FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id
         WHERE r.kind = 'sense' AND a.status = 'succeeded'",
        &[&a],
    )
    .await;
    let location: String = sqlx::query_scalar(
        "SELECT metadata_location FROM public.iceberg_tables
         WHERE table_namespace = 'probe' AND table_name = 'src'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("probe.src's metadata");
    let file = std::path::PathBuf::from(location.trim_start_matches("file://"));
    let away = file.with_extension("away");
    std::fs::rename(&file, &away).expect("move the metadata away");
    wait_for(
        &db,
        "sensor_unreadable to open",
        "SELECT count(*) = 1 FROM orca.incidents
         WHERE kind = 'sensor_unreadable' AND resolved_at IS NULL",
        &[&a],
    )
    .await;
    let (summary, subject): (String, Value) = sqlx::query_as(
        "SELECT summary, subject FROM orca.incidents WHERE kind = 'sensor_unreadable'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("incident");
    assert!(
        summary.starts_with("the sensor of probe_sensor could not read its sources: "),
        "{summary}"
    );
    assert_eq!(subject["pipeline"], "probe_sensor", "{subject}");
    let failed_poll = db
        .strings(
            "SELECT a.error FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id
             WHERE r.kind = 'sense' AND a.status = 'failed' ORDER BY a.id LIMIT 1",
        )
        .await;
    assert_eq!(
        subject["error"].as_str(),
        failed_poll.first().map(String::as_str),
        "the incident carries the failed poll's error"
    );
    // Polls go on failing: the same incident, seen again.
    wait_for(
        &db,
        "another failed poll seen by the same incident",
        "SELECT seen >= 2 FROM orca.incidents WHERE kind = 'sensor_unreadable'",
        &[&a],
    )
    .await;
    std::fs::rename(&away, &file).expect("bring the metadata back");
    wait_for(
        &db,
        "a poll that reads it again to resolve the incident",
        "SELECT count(*) = 1 FROM orca.incidents
         WHERE kind = 'sensor_unreadable' AND resolution = 'a poll of the sensor read its sources'",
        &[&a],
    )
    .await;
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.incidents").await,
        1,
        "one incident over all the failed polls"
    );
    assert!(sensor_runs(&db).await.is_empty(), "nothing new was seen");
}

/// The partitions of the labels pipeline's runs, in id order.
async fn label_runs(db: &TestDb) -> Vec<(String, String)> {
    sqlx::query_as::<_, (String, String)>(
        "SELECT r.trigger, array_to_string(r.partitions, ',') FROM orca.runs r
         JOIN orca.pipelines p ON p.id = r.pipeline_id
         WHERE p.name = 'labels' AND r.kind = 'pipeline' ORDER BY r.id",
    )
    .fetch_all(&db.pool)
    .await
    .expect("labels runs")
}

#[tokio::test]
async fn a_keyed_pipeline_runs_new_keys_only_from_its_sensor_and_from_backfill_all() {
    let db = TestDb::new().await;
    // Outside snapshots are not polled for during this test: the keys an
    // outside writer adds are for the backfill to find.
    db.pool
        .execute(
            format!(
                "ALTER DATABASE \"{}\" SET orca.sense_seconds = 3600",
                db.name
            )
            .as_str(),
        )
        .await
        .expect("poll rarely");
    let wh = scratch("labels-wh");
    let whs = wh.to_string_lossy().to_string();
    register(&db, "lake");
    register(&db, "labels");
    let logs = scratch("labels");
    let runner = Runner::start(
        &db.url(),
        "r",
        2,
        &logs,
        &[("ORCA_WAREHOUSE", whs.as_str())],
    );
    // Registering read the keys: lake.clean does not exist yet, so none.
    wait_for(
        &db,
        "the first read of the keys",
        "SELECT count(*) = 1 FROM orca.runs WHERE kind = 'keys' AND status = 'succeeded'",
        &[&runner],
    )
    .await;
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.keys").await, 0);

    // The lake's run commits lake.clean: the sensor runs the airports it
    // brought, keys_per_run (2) to a run.
    let out = orca(&db, &["backfill", "lake", "2013-01"]);
    assert!(out.status.success(), "{}", runner.output());
    wait_for(
        &db,
        "the labels runs",
        "SELECT count(*) = 2 FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id
         WHERE p.name = 'labels' AND r.kind = 'pipeline' AND r.status = 'succeeded'",
        &[&runner],
    )
    .await;
    assert_eq!(
        label_runs(&db).await,
        [
            ("sensor".to_string(), "EWR,JFK".to_string()),
            ("sensor".to_string(), "LGA".to_string())
        ]
    );
    let labels = read(&db, &wh, "lake.labels");
    let mut origins: Vec<&str> = labels["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["origin"].as_str())
        .collect();
    origins.sort_unstable();
    assert_eq!(origins, ["EWR", "JFK", "LGA"]);
    assert!(
        labels["snapshots"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|s| s["summary"]["orca.pipeline"] == "labels"),
        "{labels}"
    );
    assert!(db
        .strings("SELECT key FROM orca.key_status('labels') WHERE NOT done")
        .await
        .is_empty());

    // Another writer adds an airport to lake.clean.
    let row = json!([{"month": "2013-01", "date": "2013-01-01", "origin": "XYZ", "flights": 7,
                      "departed": 7, "delay_minutes": 140, "cancelled_pct": 0.0}]);
    py(&["append", &db.url(), &whs, "lake.clean", &row.to_string()]);
    // The binary's keys command reads the new snapshot.
    let keys = Command::new(bin("labels"))
        .arg("keys")
        .env("DATABASE_URL", db.url())
        .env("ORCA_WAREHOUSE", &whs)
        .output()
        .expect("labels keys");
    let text = String::from_utf8_lossy(&keys.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("# lake.clean snapshot "), "{text}");
    assert_eq!(lines[1..], ["EWR", "JFK", "LGA", "XYZ"]);

    // backfill @all runs the new airport only, and waits for it.
    let out = orca(&db, &["backfill", "labels", "@all"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", runner.output());
    assert!(stdout.contains("1 run(s) queued"), "{stdout}");
    assert_eq!(
        label_runs(&db).await.last(),
        Some(&("backfill".to_string(), "XYZ".to_string()))
    );
    let labels = read(&db, &wh, "lake.labels");
    let xyz: Vec<&Value> = labels["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["origin"] == "XYZ")
        .collect();
    assert_eq!(xyz.len(), 1, "{labels}");
    assert_eq!(xyz[0]["flights"], 7);
    assert_eq!(xyz[0]["label"], "late");
    // Everything is done: another @all queues nothing.
    let out = orca(&db, &["backfill", "labels", "@all"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("0 run(s) queued"), "{stdout}");
    assert_eq!(label_runs(&db).await.len(), 3);

    // Names that are not keys are refused, by the binary and by the control plane.
    let run = Command::new(bin("labels"))
        .args(["run", "--partitions", "EWR,NOPE"])
        .env("DATABASE_URL", db.url())
        .env("ORCA_WAREHOUSE", &whs)
        .env("ORCA_LOGS", &logs)
        .output()
        .expect("labels run");
    assert_eq!(run.status.code(), Some(2));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("'NOPE' is not a key of labels"), "{err}");
    let out = orca(&db, &["backfill", "labels", "NOPE"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'NOPE' is not a key") && err.contains("OR024"),
        "{err}"
    );
}

#[tokio::test]
async fn a_compaction_replaces_files_without_changing_the_rows_and_refuses_to_lose_any() {
    let db = TestDb::new().await;
    let wh = scratch("compact-wh");
    let whs = wh.to_string_lossy().to_string();
    register(&db, "probe_compact");
    let logs = scratch("compact");
    let runner = Runner::start(
        &db.url(),
        "r",
        2,
        &logs,
        &[("ORCA_WAREHOUSE", whs.as_str())],
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_compact', '2024-01,2024-02')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_run(&db, run, "succeeded", &runner).await;

    let t = read(&db, &wh, "probe.pieces");
    let rows = pairs(&t, "month", "day");
    let expected: Vec<(String, i64)> = (1..=31)
        .map(|d| ("2024-01".to_string(), d))
        .chain((1..=29).map(|d| ("2024-02".to_string(), d)))
        .collect();
    assert_eq!(rows, expected, "the compaction kept every row once");
    assert_eq!(
        t["snapshots"].as_array().map(Vec::len),
        Some(7),
        "six appends and a replace: {t}"
    );
    let current = current_snapshot(&t);
    assert_eq!(current["operation"], "replace");
    let summary = &current["summary"];
    assert_eq!(summary["orca.step"], "compact");
    assert_eq!(summary["orca.run"], run.to_string());
    // probe.pieces is partitioned by month, as its pipeline is: a file per
    // month after the compaction.
    assert_eq!(summary["deleted-data-files"], "6");
    assert_eq!(summary["added-data-files"], "2");
    assert_eq!(summary["total-data-files"], "2");
    // The table's sort order (day, latest first) holds in each new file.
    let files = py(&[
        "files",
        &db.url(),
        wh.to_str().unwrap_or_default(),
        "probe.pieces",
        "day",
    ]);
    assert_eq!(files["sort_order"], json!([["day", "DESC"]]), "{files}");
    let mut lens = Vec::new();
    for f in files["files"].as_array().into_iter().flatten() {
        let days: Vec<i64> = f["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_i64)
            .collect();
        let mut sorted = days.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(days, sorted, "a file is not sorted by day descending: {f}");
        lens.push(days.len());
    }
    lens.sort();
    assert_eq!(lens, [29, 31], "{files}");
    assert_eq!(summary["total-records"], "60");
    // The control plane recorded it as a replace.
    let ops = db
        .strings(&format!(
            "SELECT step || ':' || operation FROM orca.commits WHERE run_id = {run} ORDER BY id"
        ))
        .await;
    assert_eq!(ops.len(), 7, "{ops:?}");
    assert_eq!(ops.last().map(String::as_str), Some("compact:replace"));

    // A compaction that loses rows on the way is refused and commits nothing.
    let out = Command::new(bin("probe_compact"))
        .args(["run", "--partitions", "2024-03"])
        .env("DATABASE_URL", db.url())
        .env("ORCA_WAREHOUSE", &whs)
        .env("ORCA_LOGS", &logs)
        .env("PROBE_DROP_ROWS", "1")
        .output()
        .expect("probe_compact run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("a replace keeps the table's rows, but it adds"),
        "{err}"
    );
    let after = read(&db, &wh, "probe.pieces");
    assert_eq!(
        after["snapshots"].as_array().map(Vec::len),
        Some(10),
        "the three appends of 2024-03 and no replace"
    );
    let current = current_snapshot(&after);
    assert_eq!(current["operation"], "append");
}

/// A warehouse in another object store than S3 (azurite's Azure Blob
/// Storage, an emulator of its API since no cloud is reachable here): the
/// lake pipeline backfills two months into it (each step reading the
/// previous one's table back from the store), and PyIceberg, through
/// pyarrow's own file system for that store, reads the tables from there.
async fn a_warehouse_in(
    server: &dyn orca_tests::stores::ObjectServer,
    warehouse: &str,
) -> (TestDb, Runner, Vec<(&'static str, String)>) {
    let db = TestDb::new().await;
    register(&db, "lake");
    let logs = scratch(server.scheme());
    let mut env: Vec<(&str, String)> = server.env();
    env.push(("ORCA_WAREHOUSE", warehouse.to_string()));
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let runner = Runner::start(&db.url(), "r", 2, &logs, &env_refs);
    let out = orca(&db, &["backfill", "lake", "2013-01..2013-02"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        runner.output()
    );
    let keys = server.keys("orca-lake", "warehouse/default/lake/clean/");
    assert!(
        keys.iter()
            .any(|k| k.starts_with("warehouse/default/lake/clean/data/") && k.ends_with(".parquet")),
        "{keys:?}"
    );
    assert!(
        keys.iter()
            .any(|k| k.starts_with("warehouse/default/lake/clean/metadata/")
                && k.ends_with(".metadata.json")),
        "{keys:?}"
    );
    let mut py_env_vars = server.env();
    py_env_vars.push(("ORCA_TEST_STORE_ENDPOINT", server_endpoint(&env)));
    let monthly = py_env(
        &["read", &db.url(), warehouse, "lake.monthly"],
        &py_env_vars,
    );
    assert_eq!(
        monthly["location"],
        format!("{warehouse}/default/lake/monthly")
    );
    assert_eq!(
        pairs(&monthly, "month", "flights"),
        [("2013-01".into(), 27004), ("2013-02".into(), 24951)]
    );
    (db, runner, py_env_vars)
}

/// The endpoint of an emulator, from the environment Orca reaches it with.
fn server_endpoint(env: &[(&str, String)]) -> String {
    env.iter()
        .find_map(|(k, v)| match *k {
            "AZURITE_BLOB_STORAGE_URL" => Some(v.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_azure_warehouse_keeps_data_and_metadata_in_the_container() {
    let azurite = orca_tests::stores::Azurite::start("orca-lake");
    // abfss:// without the account (fsspec's spelling): Orca and PyIceberg
    // both read it; the account is the configured one.
    a_warehouse_in(&azurite, "abfss://orca-lake/warehouse").await;
}

#[tokio::test]
async fn an_s3_warehouse_keeps_data_and_metadata_in_the_bucket() {
    let s3 = orca_tests::s3::S3Server::start("orca-lake");
    let warehouse = "s3://orca-lake/warehouse";
    let (db, runner, py_env_vars) = a_warehouse_in(&s3, warehouse).await;

    // A commit that removes files works against the bucket too.
    register(&db, "probe_compact");
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_compact', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_run(&db, run, "succeeded", &runner).await;
    let pieces = py_env(
        &["read", &db.url(), warehouse, "probe.pieces"],
        &py_env_vars,
    );
    assert_eq!(pieces["rows"].as_array().map(Vec::len), Some(31));
    let current = current_snapshot(&pieces);
    assert_eq!(current["operation"], "replace");
}

/// A bucket that does not answer for longer than its client retries (every
/// request failing with 500, half of them after they landed: moto's server,
/// the stand-in for S3 here, behind the fault proxy) stops a pipeline's
/// attempt with its step unfinished. The runner hands the attempt back,
/// spending none of the run's retries, and the next attempt, once the
/// bucket answers, writes each table once: PyIceberg reads the month's
/// aggregate from the bucket itself, not through the proxy.
#[tokio::test]
async fn a_bucket_that_does_not_answer_hands_the_attempt_back_and_spends_no_retry_moto_s3() {
    use orca_tests::s3proxy::{Fault, S3Proxy};
    let s3 = orca_tests::s3::S3Server::start("orca-lake");
    let proxy = S3Proxy::start(s3.port());
    let warehouse = "s3://orca-lake/warehouse";
    let db = TestDb::new().await;
    register(&db, "lake");
    let mut env: Vec<(&str, String)> = s3
        .env()
        .into_iter()
        .filter(|(k, _)| *k != "AWS_ENDPOINT")
        .collect();
    env.push(("AWS_ENDPOINT", format!("http://127.0.0.1:{}", proxy.port)));
    env.push(("ORCA_WAREHOUSE", warehouse.to_string()));
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // Longer than the clients' 45 s of retries: the first attempt gives up.
    proxy.fail(Fault::Error, Duration::from_secs(70));
    let runner = Runner::start(&db.url(), "r", 1, &scratch("s3-outage"), &env_refs);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('lake', '2013-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_for_sql(
        &db,
        &format!("run {run} to succeed"),
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(240),
        || runner.output(),
    )
    .await;
    let attempts = attempts_of(&db, run).await;
    let released: Vec<&Option<String>> = attempts
        .iter()
        .filter(|(s, _)| s == "released")
        .map(|(_, e)| e)
        .collect();
    assert!(
        !released.is_empty()
            && released.iter().all(|e| e
                .as_deref()
                .is_some_and(|e| e.contains("the object store did not answer"))),
        "{attempts:?}\n{}",
        runner.output()
    );
    assert!(
        attempts.iter().all(|(s, _)| s != "failed"),
        "a store outage spent a retry: {attempts:?}"
    );
    let (failed, landed) = proxy.hits();
    assert!(failed > 0 && landed > 0, "{failed} failed, {landed} landed");
    let monthly = py_env(&["read", &db.url(), warehouse, "lake.monthly"], &s3.env());
    assert_eq!(
        pairs(&monthly, "month", "flights"),
        [("2013-01".into(), 27004)]
    );
}

/// A test database and the default org's lake in a new scratch warehouse,
/// as an operator's session opens it (no lease).
fn operator_lake(
    warehouse: &str,
) -> (
    tokio::runtime::Runtime,
    TestDb,
    std::path::PathBuf,
    orca_lake::LakeConfig,
) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let db = rt.block_on(TestDb::new());
    let wh = scratch(warehouse);
    let config = orca_lake::LakeConfig {
        catalog_url: Some(db.url()),
        warehouse: format!("file://{}", wh.display()),
        org: "default".into(),
        lease: None,
    };
    (rt, db, wh, config)
}

/// Attempts of one sync raising their fences on one Iceberg table at once
/// (a zombie racing the attempt that replaced it), through orca's catalog in
/// Postgres: however the compare-and-swap orders them, the table ends at the
/// newest generation, and the same for the epoch markers of racing
/// attempts. A commit that loses the swap looks at the fence again before
/// it tries again; a blind retry could have set an older one over a newer.
#[test]
fn racing_fences_and_epoch_markers_of_a_syncs_iceberg_table_only_move_forward() {
    use orca_lake::sync_tables::{EpochAt, EpochCommit, SyncTables};
    let (_rt, _db, wh, config) = operator_lake("fence-race-wh");
    let open = || SyncTables::with_config(&config).expect("the sync's catalog");
    let schema = arrow_schema::Schema::new(vec![arrow_schema::Field::new(
        "id",
        arrow_schema::DataType::Int64,
        false,
    )]);
    open()
        .ensure("raw.fenced", schema.clone())
        .expect("the table");
    const RACERS: i32 = 6;
    for round in 0..3 {
        let base = round * 10;
        let barrier = std::sync::Barrier::new(RACERS as usize);
        let told: Vec<EpochCommit> = std::thread::scope(|s| {
            let racers: Vec<_> = (1..=RACERS)
                .map(|g| {
                    let (open, barrier) = (&open, &barrier);
                    s.spawn(move || {
                        let tables = open();
                        barrier.wait();
                        tables
                            .raise_fence("raw.fenced", "shop", base + g)
                            .expect("raise the fence")
                    })
                })
                .collect();
            racers
                .into_iter()
                .map(|r| r.join().expect("racer"))
                .collect()
        });
        let (fence, _) = open()
            .fence_and_marker("raw.fenced", "shop")
            .expect("the fence");
        assert_eq!(fence, base + RACERS, "round {round}: {told:?}");
        assert!(
            matches!(told.last(), Some(EpochCommit::Committed { .. })),
            "the newest raised it: {told:?}"
        );
        // The epochs of the newest generation, marked by racing writers.
        let generation = base + RACERS;
        let first = (round as u64) * 10;
        std::thread::scope(|s| {
            for e in 1..=(RACERS as u64) {
                let (open, barrier) = (&open, &barrier);
                s.spawn(move || {
                    let tables = open();
                    barrier.wait();
                    let at = EpochAt {
                        dataset: "raw.fenced",
                        sync: "shop",
                        stream: "orders",
                        generation,
                        epoch: first + e,
                    };
                    tables.mark_epoch(&at).expect("mark the epoch")
                });
            }
        });
        let (_, marker) = open()
            .fence_and_marker("raw.fenced", "shop")
            .expect("the marker");
        assert_eq!(marker, first + RACERS as u64, "round {round}");
        // A zombie of an older generation is told, and changes nothing.
        let zombie = EpochAt {
            dataset: "raw.fenced",
            sync: "shop",
            stream: "orders",
            generation: generation - 1,
            epoch: first + 100,
        };
        assert_eq!(
            open().mark_epoch(&zombie).expect("the zombie's mark"),
            EpochCommit::Fenced { fence: generation }
        );
    }
    let _ = std::fs::remove_dir_all(wh);
}

/// A lake handle keeps the tables it loaded (a step reading or appending to
/// one table month after month parses its metadata once), but never past a
/// commit another writer made: its next load, its appends and its scans
/// follow the catalog's pointer, not what it kept.
#[test]
fn a_lake_handle_that_kept_a_table_sees_another_writers_commits() {
    use orca_lake::table::{create_or_load, fast_append, live_data_files, load};
    use orca_lake::writer::write_data_files;
    let (_rt, _db, wh, config) = operator_lake("kept-tables-wh");
    let (mine, theirs) = (
        orca_lake::Lake::open(&config).expect("a lake"),
        orca_lake::Lake::open(&config).expect("another lake"),
    );
    let schema = std::sync::Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
        "id",
        arrow_schema::DataType::Int64,
        false,
    )]));
    let batch = |ids: Vec<i64>| {
        arrow_array::RecordBatch::try_new(
            schema.clone(),
            vec![std::sync::Arc::new(arrow_array::Int64Array::from(ids))],
        )
        .expect("a batch")
    };
    let append = |lake: &orca_lake::Lake, prefix: &str, ids: Vec<i64>| {
        let table = load(lake, "kept.t").expect("load");
        let files = write_data_files(lake, &table, [Ok(batch(ids))], prefix.into()).expect("write");
        fast_append(lake, "kept.t", &table.inner, files, Default::default()).expect("append")
    };
    let current = |lake: &orca_lake::Lake| {
        load(lake, "kept.t")
            .expect("load")
            .inner
            .metadata()
            .current_snapshot()
            .map(|s| s.snapshot_id())
    };
    create_or_load(&mine, "kept.t", (*schema).clone()).expect("the table");
    let first = append(&mine, "mine-1", vec![1, 2]);
    assert_eq!(current(&mine), Some(first));

    let second = append(&theirs, "theirs-1", vec![3]);
    assert_eq!(
        current(&mine),
        Some(second),
        "the kept table hid another writer's commit"
    );
    // An append from the handle that kept the table goes on from the other
    // writer's snapshot, and loses none of its files.
    let third = append(&mine, "mine-2", vec![4, 5, 6]);
    let now = load(&theirs, "kept.t").expect("load");
    let snap = now.inner.metadata().current_snapshot().expect("a snapshot");
    assert_eq!(snap.snapshot_id(), third);
    assert_eq!(snap.parent_snapshot_id(), Some(second));
    let rows: u64 = live_data_files(&theirs, &now.inner, snap)
        .expect("files")
        .iter()
        .map(|f| f.record_count())
        .sum();
    assert_eq!(rows, 6, "every append's rows are in the table");
    let _ = std::fs::remove_dir_all(wh);
}
