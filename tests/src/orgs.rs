//! Two orgs filled with the same kinds of rows (even the same pipeline
//! names), for the tests that try one org's credentials against the
//! other's objects, and a snapshot of an org's rows to see nothing of it
//! changed.

use serde_json::{json, Value};
use sqlx::Executor;

use crate::{claim, connect_org, lake_manifest, TestDb};

/// Every org's rows of every table, as JSON, for before/after comparison.
pub async fn org_snapshot(db: &TestDb, org: i64) -> Value {
    let tables = db
        .strings("SELECT tablename::text FROM pg_tables WHERE schemaname = 'orca' ORDER BY 1")
        .await;
    let mut out = serde_json::Map::new();
    for t in tables {
        let cond = if t == "orgs" { "id" } else { "org_id" };
        let rows: Value = sqlx::query_scalar(&format!(
            "SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY to_jsonb(x)::text), '[]') \
             FROM orca.\"{t}\" x WHERE {cond} = $1"
        ))
        .bind(org)
        .fetch_one(&db.pool)
        .await
        .expect("snapshot");
        out.insert(t, rows);
    }
    // The org's Iceberg catalog (catalog_name is the org's name).
    for t in ["iceberg_tables", "iceberg_namespace_properties"] {
        let rows: Value = sqlx::query_scalar(&format!(
            "SELECT coalesce(jsonb_agg(to_jsonb(x) ORDER BY to_jsonb(x)::text), '[]') \
             FROM public.{t} x WHERE catalog_name = (SELECT name FROM orca.orgs WHERE id = $1)"
        ))
        .bind(org)
        .fetch_one(&db.pool)
        .await
        .expect("catalog snapshot");
        out.insert(t.to_string(), rows);
    }
    Value::Object(out)
}

/// Fills an org with a pipeline named `lake` and one named `only`, runs in
/// every state, a live lease and a failed run. Returns (run ids, live lease).
pub async fn populate_org(db: &TestDb, org: &str, only: &str) -> (Vec<i64>, uuid::Uuid, i64, i64) {
    let mut c = connect_org(db, "postgres", org).await;
    for name in ["lake", only] {
        let mut m = lake_manifest(name);
        m["max_runs"] = json!(null);
        m["run_retries"] = json!(0);
        m["steps"][0]["reads"] = json!([format!("{name}.raw")]);
        m["steps"][0]["writes"] = json!([format!("{name}.clean")]);
        m["tasks"] = json!([{"name": "weigh"}]);
        sqlx::query("SELECT orca.register($1)")
            .bind(&m)
            .execute(&mut c)
            .await
            .expect("register");
    }
    c.execute("SELECT orca.tick('2024-03-01 00:00Z')")
        .await
        .expect("tick");
    c.execute("SELECT orca.tick('2024-03-02 03:00Z')")
        .await
        .expect("tick");
    let runs: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT orca.backfill('{only}', '2024-01..2024-04')"
    ))
    .fetch_all(&mut c)
    .await
    .expect("backfill");
    // A table maintenance schedule of its own dataset.
    c.execute(format!("SELECT orca.schedule_maintenance('{only}.clean', '0 4 * * *')").as_str())
        .await
        .expect("schedule maintenance");
    // A webhook endpoint (public address: no netguard entry needed).
    sqlx::query("SELECT orca.create_webhook('https://hooks.example.com/' || $1, '{run.*}')")
        .bind(org)
        .execute(&mut c)
        .await
        .expect("a webhook");
    // A delivery try of it, as a relay records one.
    sqlx::query(
        "SELECT orca.relay_done(w.id, 1, false, 500, 3, 'down', 'populate') FROM orca.webhooks w \
         JOIN orca.orgs o ON o.id = w.org_id WHERE o.name = $1",
    )
    .bind(org)
    .execute(&mut c)
    .await
    .expect("a delivery");
    // An API key.
    sqlx::query("SELECT orca.create_api_key($1 || '-key', 'operator')")
        .bind(org)
        .execute(&mut c)
        .await
        .expect("an API key");
    // A secret (the machine's installation key is scripts/setup.sh's).
    sqlx::query("SELECT orca.set_secret($1 || '-db', 'postgres://app:pw@db/' || $1)")
        .bind(org)
        .execute(&mut c)
        .await
        .expect("a secret");
    let token: String =
        sqlx::query_scalar("SELECT orca.create_runner_token('default', $1 || '-token')")
            .bind(org)
            .fetch_one(&mut c)
            .await
            .expect("runner token");
    assert!(token.starts_with("orca_rt_"), "{token}");
    c.execute(
        format!("SELECT orca.register_runner('{org}-runner', 'default', 4, 'host')").as_str(),
    )
    .await
    .expect("runner");
    // A playbook, which the failed run's incident runs (it only opens).
    c.execute("SELECT orca.create_playbook('run_failed', 'open_only')")
        .await
        .expect("playbook");
    c.execute("SELECT orca.set_incident_threshold('cdc_lag_bytes', 268435456)")
        .await
        .expect("incident threshold");
    let leases = claim(&mut c, &format!("{org}-runner"), 3).await;
    sqlx::query("SELECT orca.finish($1, false, 'failed on purpose')")
        .bind(leases[0].lease)
        .execute(&mut c)
        .await
        .expect("fail one");
    sqlx::query("SELECT orca.report_step($1, 'one', $2, 'running')")
        .bind(leases[1].lease)
        .bind(&leases[1].partitions[0])
        .execute(&mut c)
        .await
        .expect("report");
    let name: String = sqlx::query_scalar(
        "SELECT p.name FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id WHERE r.id = $1",
    )
    .bind(leases[1].run)
    .fetch_one(&mut c)
    .await
    .expect("pipeline of the lease");
    sqlx::query("SELECT orca.pin_read($1, 'one', $2, $3 || '.raw', 7)")
        .bind(leases[1].lease)
        .bind(&leases[1].partitions[0])
        .bind(&name)
        .execute(&mut c)
        .await
        .expect("pin a read");
    sqlx::query("SELECT orca.record_commit($1, 'one', $2, $3 || '.clean', 8, 1)")
        .bind(leases[1].lease)
        .bind(&leases[1].partitions[0])
        .bind(&name)
        .execute(&mut c)
        .await
        .expect("record a commit");
    sqlx::query("SELECT orca.append_log($1, 1, ARRAY['step one started'])")
        .bind(leases[1].lease)
        .execute(&mut c)
        .await
        .expect("a log line");
    // Where the live attempt's step resumes (a savepoint in the org's own
    // directory).
    sqlx::query(
        "SELECT orca.record_resume_point($1, 'one', $2, 'file:///sp/' || $3 || '/savepoint-1')",
    )
    .bind(leases[1].lease)
    .bind(&leases[1].partitions[0])
    .bind(org)
    .execute(&mut c)
    .await
    .expect("record a resume point");
    // Tasks the live attempt fanned out: a batch the org's runner finished
    // (one task succeeded, one failed and waits for its retry in a batch of
    // its own), and a batch it holds.
    for (first, inputs) in [
        (0, "jsonb_build_array($3 || '-task-1', $3 || '-task-2')"),
        (2, "jsonb_build_array($3 || '-task-3')"),
    ] {
        sqlx::query(&format!(
            "SELECT orca.add_tasks($1, 'one', $2, 'weigh', {first}, {inputs})"
        ))
        .bind(leases[1].lease)
        .bind(&leases[1].partitions[0])
        .bind(org)
        .execute(&mut c)
        .await
        .expect("add tasks");
    }
    let done: uuid::Uuid =
        sqlx::query_scalar("SELECT lease FROM orca.claim_tasks($1 || '-runner', 'default', 2)")
            .bind(org)
            .fetch_one(&mut c)
            .await
            .expect("claim a task batch");
    sqlx::query(
        "SELECT orca.finish_tasks($1, jsonb_build_array($2 || '-out-1', NULL), \
         ARRAY[NULL, 'failed on purpose'], ARRAY[5, 7])",
    )
    .bind(done)
    .bind(org)
    .execute(&mut c)
    .await
    .expect("finish a task batch");
    sqlx::query("SELECT lease FROM orca.claim_tasks($1 || '-runner', 'default', 1)")
        .bind(org)
        .fetch_one(&mut c)
        .await
        .expect("hold a task batch");
    // A lease that lapsed (counted in orca.counters), in a pool of its own:
    // claimed with a one-second lease and ticked past it.
    let mut m = lake_manifest(&format!("{org}_lapse"));
    m["pool"] = json!("lapsing");
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut c)
        .await
        .expect("register the lapsing pipeline");
    sqlx::query("SELECT orca.run($1, '2024-01')")
        .bind(format!("{org}_lapse"))
        .execute(&mut c)
        .await
        .expect("run it");
    c.execute("SET orca.lease_seconds = 1").await.expect("set");
    let lapsing: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT lease FROM orca.claim('lapsing-runner', 'lapsing')")
            .fetch_all(&mut c)
            .await
            .expect("claim the lapsing attempt");
    assert_eq!(lapsing.len(), 1);
    c.execute("RESET orca.lease_seconds").await.expect("reset");
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let t: Value = sqlx::query_scalar("SELECT orca.tick()")
        .fetch_one(&mut c)
        .await
        .expect("tick");
    assert_eq!(t["attempts_lost"], json!(1), "{t}");
    // A sensor that has seen a snapshot, in a pool of its own.
    let watch = json!({
        "name": format!("{org}_watch"),
        "steps": [{"name": "watch", "kind": "mapped", "reads": [format!("{name}.clean")]}],
        "partitions": {"monthly": "2024-01"},
        "sensor": true,
        "pool": "sensing",
        "registry_hash": "watch",
        "binary": "/bin/true"
    });
    sqlx::query("SELECT orca.register($1)")
        .bind(&watch)
        .execute(&mut c)
        .await
        .expect("register the sensor");
    c.execute("SELECT orca.tick()").await.expect("tick");
    let sense: uuid::Uuid =
        sqlx::query_scalar("SELECT lease FROM orca.claim('sensing-runner', 'sensing')")
            .fetch_one(&mut c)
            .await
            .expect("the sensor's poll");
    let seen = json!([{
        "dataset": format!("{name}.clean"),
        "snapshot": 4242,
        "timestamp_ms": chrono::Utc::now().timestamp_millis() + 1000,
        "partitions": "2024-03"
    }]);
    let started: i32 = sqlx::query_scalar("SELECT orca.report_snapshots($1, $2)")
        .bind(sense)
        .bind(&seen)
        .fetch_one(&mut c)
        .await
        .expect("report a snapshot");
    assert_eq!(started, 1);
    // A keyed pipeline that has read its keys, in a pool of its own.
    let keyed = json!({
        "name": format!("{org}_keyed"),
        "steps": [{"name": "label", "kind": "mapped"}],
        "partitions": {"keyed": {"dataset": format!("{name}.clean"), "column": "id"}},
        "pool": "keying",
        "registry_hash": "keyed",
        "binary": "/bin/true"
    });
    sqlx::query("SELECT orca.register($1)")
        .bind(&keyed)
        .execute(&mut c)
        .await
        .expect("register the keyed pipeline");
    let keys: uuid::Uuid =
        sqlx::query_scalar("SELECT lease FROM orca.claim('keying-runner', 'keying')")
            .fetch_one(&mut c)
            .await
            .expect("the keys task");
    sqlx::query("SELECT orca.report_keys($1, 5, 5000, ARRAY['k1', 'k2'])")
        .bind(keys)
        .execute(&mut c)
        .await
        .expect("report keys");
    // A table and a namespace in the org's Iceberg catalog.
    sqlx::query(
        "INSERT INTO public.iceberg_tables (catalog_name, table_namespace, table_name, \
         metadata_location, iceberg_type) VALUES ($1, 'lake', 'clean', $2, 'TABLE')",
    )
    .bind(org)
    .bind(format!("file:///w/{org}/lake/clean/metadata/1.json"))
    .execute(&mut c)
    .await
    .expect("a catalog table");
    sqlx::query(
        "INSERT INTO public.iceberg_namespace_properties VALUES ($1, 'lake', 'exists', 'true')",
    )
    .bind(org)
    .execute(&mut c)
    .await
    .expect("a catalog namespace");
    // A sync that has committed an epoch (its local paths allowed).
    sqlx::query("SELECT orca.allow($1, '/in'), orca.allow($1, '/out')")
        .bind(org)
        .execute(&mut c)
        .await
        .expect("allow the sync's paths");
    sqlx::query(
        "SELECT orca.create_sync($1, '{\"type\": \"files\", \"url\": \"/in\", \"format\": \"jsonl\"}', \
         '{\"type\": \"parquet\", \"url\": \"/out\"}', '[{\"name\": \"events\", \"pattern\": \"*.jsonl\"}]')",
    )
    .bind(format!("{org}_sync"))
    .execute(&mut c)
    .await
    .expect("create a sync");
    // A sync into the org's Iceberg tables: its table ({only}_lake.events)
    // is a dataset the org may maintain (no pipeline writes it).
    sqlx::query(
        "SELECT orca.create_sync($1, '{\"type\": \"files\", \"url\": \"/in\", \"format\": \"jsonl\"}', \
         jsonb_build_object('type', 'iceberg', 'namespace', $2::text), \
         '[{\"name\": \"events\", \"pattern\": \"*.jsonl\", \"partition_by\": [\"day(at)\"]}]')",
    )
    .bind(format!("{org}_lake"))
    .bind(format!("{only}_lake"))
    .execute(&mut c)
    .await
    .expect("create an Iceberg sync");
    // A change-data-capture sync, whose slot orca.cdc_slots shows.
    sqlx::query(
        "SELECT orca.create_sync($1, '{\"type\": \"postgres_cdc\", \"url\": \"postgres://db.example/shop\"}', \
         '{\"type\": \"parquet\", \"url\": \"/out\"}', \
         '[{\"name\": \"orders\", \"table\": \"public.orders\", \"primary_key\": [\"id\"]}]')",
    )
    .bind(format!("{org}_cdc"))
    .execute(&mut c)
    .await
    .expect("create a CDC sync");
    sqlx::query("SELECT orca.claim_sync($1)")
        .bind(format!("{org}_sync"))
        .execute(&mut c)
        .await
        .expect("claim the sync");
    sqlx::query("SELECT orca.advance_head($1, 1, 1, $2)")
        .bind(format!("{org}_sync"))
        .bind(format!("{org}/{org}_sync/_checkpoints/r1"))
        .execute(&mut c)
        .await
        .expect("commit an epoch");
    sqlx::query("SELECT orca.record_epoch($1, 1, 1, '{\"rows\": {\"events\": 3}}')")
        .bind(format!("{org}_sync"))
        .execute(&mut c)
        .await
        .expect("record its figures");
    // A discovered catalog of the CDC sync's source: the discovery's
    // attempt stores it under its lease, as a runner's engine would.
    sqlx::query("SELECT orca.discover($1)")
        .bind(format!("{org}_cdc"))
        .execute(&mut c)
        .await
        .expect("discover the CDC sync's source");
    let d: uuid::Uuid = sqlx::query_scalar(
        "SELECT lease FROM orca.claim('discoverer', 'default', 1, ARRAY['discover'])",
    )
    .fetch_one(&mut c)
    .await
    .expect("claim the discovery");
    sqlx::query(
        "SELECT orca.store_catalog($1, '{\"source\": \"postgres_cdc\", \"streams\": \
         [{\"table\": \"public.orders\", \"columns\": []}], \"plan\": []}'), orca.finish($1, true)",
    )
    .bind(d)
    .execute(&mut c)
    .await
    .expect("store the catalog");
    // The last measure of the CDC sync's slot on its source server, as its
    // runner reports it (orca.report_slot; written here, since no runner
    // reads a source that does not exist).
    sqlx::query(
        "INSERT INTO orca.sync_slots (sync_id, org_id, slot, wal_status, safe_wal_size, lag_bytes,
                                      retained_bytes, confirmed_flush_lsn, measured_at, attempt_id)
         SELECT y.id, y.org_id, orca._cdc_slot(y.org_id, y.name), 'reserved', 1048576, 4096,
                8192, '0/1', now(), 0
         FROM orca.syncs y WHERE y.name = $1",
    )
    .bind(format!("{org}_cdc"))
    .execute(&mut c)
    .await
    .expect("a reported slot");
    (runs, leases[1].lease, leases[0].run, leases[1].attempt)
}
