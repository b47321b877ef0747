//! No table, view or function of schema orca reads or writes across orgs.
//!
//! Two orgs are filled with the same kinds of rows (even the same pipeline
//! name). Then an ordinary role that belongs to one of them tries every table,
//! view and function against the other's identifiers, and the other org's rows
//! must come out exactly as they were.

use std::collections::BTreeSet;

use orca_tests::sqlx::{self, Executor, PgConnection, Row};
use orca_tests::*;
use serde_json::{json, Value};

const ALICE: &str = "orca_t_alice"; // member of acme
const BOB: &str = "orca_t_bob"; // member of globex

/// Every function the extension defines, by kind of test it gets below. A new
/// function fails this test until it is added here and tried across orgs.
const API: &[&str] = &[
    "add_member",
    "add_tasks",
    "allow",
    "api_session",
    "advance_head",
    "append_log",
    "attempt_context",
    "attempt_secret",
    "backfill",
    "cancel",
    "catalog_commit",
    "catalog_create_namespace",
    "catalog_create_table",
    "catalog_drop_table",
    "claim",
    "claim_sync",
    "claim_tasks",
    "create_api_key",
    "create_org",
    "create_runner_token",
    "create_playbook",
    "create_sync",
    "create_webhook",
    "current_org_id",
    "disallow",
    "discover",
    "discovery",
    "drop_playbook",
    "drop_secret",
    "drop_sync",
    "drop_webhook",
    "explain",
    "finish",
    "finish_many",
    "finish_tasks",
    "fires",
    "heartbeat",
    "heartbeat_tasks",
    "key_status",
    "keys_context",
    "lineage",
    "maintain",
    "maintenance_task",
    "metrics",
    "pause",
    "pause_sync",
    "pin_read",
    "pool_backlog",
    "pool_load",
    "register",
    "rewind_head",
    "record_commit",
    "record_epoch",
    "refresh_keys",
    "relay_done",
    "relay_take",
    "register_runner",
    "release",
    "remove_member",
    "report_drift",
    "report_keys",
    "report_maintenance",
    "report_slot",
    "report_snapshots",
    "report_step",
    "resolve_incident",
    "resume_sync",
    "retention",
    "retry",
    "revoke_api_key",
    "revoke_runner_token",
    "rewrap_data_keys",
    "rotate_runner_token",
    "rotate_webhook_secret",
    "run",
    "scale_sync",
    "schedule_maintenance",
    "sense_context",
    "set_incident_threshold",
    "set_secret",
    "store_catalog",
    "set_webhook_enabled",
    "sync_lanes",
    "task_results",
    "attempt_state",
    "resume_point",
    "record_resume_point",
    "tick",
    "unpause",
    "unschedule_maintenance",
];

async fn code_of(c: &mut PgConnection, sql: &str) -> String {
    expect_error(&mut *c, sql).await.0
}

#[tokio::test]
async fn no_table_view_or_function_crosses_orgs() {
    let db = TestDb::new().await;
    ensure_role(&db, ALICE, &["orca_operator", "orca_runner"]).await;
    ensure_role(&db, BOB, &["orca_operator", "orca_runner"]).await;
    let acme: i64 = sqlx::query_scalar("SELECT orca.create_org('acme')")
        .fetch_one(&db.pool)
        .await
        .expect("acme");
    let globex: i64 = sqlx::query_scalar("SELECT orca.create_org('globex')")
        .fetch_one(&db.pool)
        .await
        .expect("globex");
    db.pool
        .execute(
            format!(
                "SELECT orca.add_member('acme', '{ALICE}'), orca.add_member('globex', '{BOB}')"
            )
            .as_str(),
        )
        .await
        .expect("members");
    populate_org(&db, "acme", "acme_only").await;
    let (g_runs, g_lease, g_failed_run, g_attempt) =
        populate_org(&db, "globex", "globex_only").await;

    // The list of functions is what this test covers.
    let defined: BTreeSet<String> = db
        .strings(
            "SELECT DISTINCT proname::text FROM pg_proc \
             WHERE pronamespace = 'orca'::regnamespace AND proname NOT LIKE '\\_%'",
        )
        .await
        .into_iter()
        .collect();
    let covered: BTreeSet<String> = API.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        defined, covered,
        "a function was added or removed: cover it here"
    );
    // Internal functions are not callable by anyone but the owner, except the
    // two that row-level security policies evaluate as the reader.
    let callable_internal = db
        .strings(&format!(
            "SELECT proname::text FROM pg_proc WHERE pronamespace = 'orca'::regnamespace \
             AND proname LIKE '\\_%' AND has_function_privilege('{ALICE}', oid, 'EXECUTE') ORDER BY 1"
        ))
        .await;
    assert_eq!(callable_internal, ["_catalog_visible", "_may_use_org"]);

    let before = org_snapshot(&db, globex).await;
    let mut a = connect_org(&db, ALICE, "acme").await;
    // Alice's runner works with a token of her org, as any runner must.
    let alice_token: String =
        sqlx::query_scalar("SELECT orca.create_runner_token('default', 'alice-runner')")
            .fetch_one(&mut a)
            .await
            .expect("alice's token");
    sqlx::query("SELECT set_config('orca.runner_token', $1, false)")
        .bind(&alice_token)
        .execute(&mut a)
        .await
        .expect("present the token");

    // Reads: every table and view shows acme's rows only.
    let relations = db
        .strings(
            "SELECT relname::text FROM pg_class WHERE relnamespace = 'orca'::regnamespace \
             AND relkind IN ('r', 'v') ORDER BY 1",
        )
        .await;
    for rel in &relations {
        // Secrets (lease tokens, token hashes) are columns viewers cannot
        // read: every other column is read.
        let cols = db
            .strings(&format!(
                "SELECT quote_ident(attname) FROM pg_attribute \
                 WHERE attrelid = 'orca.\"{rel}\"'::regclass AND attnum > 0 AND NOT attisdropped \
                 AND has_column_privilege('{ALICE}', attrelid, attnum, 'SELECT') ORDER BY attnum"
            ))
            .await
            .join(", ");
        let rows: Vec<Value> = sqlx::query_scalar(&format!(
            "SELECT to_jsonb(x) FROM (SELECT {cols} FROM orca.\"{rel}\") x"
        ))
        .fetch_all(&mut a)
        .await
        .unwrap_or_else(|e| panic!("alice reads orca.{rel}: {e}"));
        assert!(!rows.is_empty(), "orca.{rel} shows alice nothing");
        for row in rows {
            let org_ok = match (row.get("org_id"), row.get("org"), rel.as_str()) {
                (Some(id), _, _) => id == &json!(acme),
                (None, Some(name), _) => name == "acme",
                (None, None, "orgs") => row["id"] == json!(acme),
                (None, None, _) => panic!("orca.{rel} has neither org_id nor org: {row}"),
            };
            assert!(org_ok, "orca.{rel} shows alice a row of another org: {row}");
        }
    }
    // The Iceberg catalog shows her acme's only; nobody writes its tables
    // directly, and its functions write her org's catalog only.
    for t in ["iceberg_tables", "iceberg_namespace_properties"] {
        let seen: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT DISTINCT catalog_name::text FROM public.{t}"
        ))
        .fetch_all(&mut a)
        .await
        .unwrap_or_else(|e| panic!("alice reads public.{t}: {e}"));
        assert_eq!(seen, ["acme"], "public.{t}");
        for sql in [
            format!("DELETE FROM public.{t} WHERE catalog_name = 'globex'"),
            format!("UPDATE public.{t} SET catalog_name = 'acme' WHERE catalog_name = 'globex'"),
        ] {
            assert_eq!(code_of(&mut a, &sql).await, "42501", "{sql}");
        }
    }
    for sql in [
        "SELECT orca.catalog_create_namespace('globex', 'planted')",
        "SELECT orca.catalog_create_table('globex', 'lake', 'planted', 'file:///w/acme/x.json')",
        "SELECT orca.catalog_commit('globex', 'lake', 'clean', \
         'file:///w/globex/lake/clean/metadata/1.json', 'file:///w/acme/x.json')",
        "SELECT orca.catalog_drop_table('globex', 'lake', 'clean')",
    ] {
        assert_eq!(code_of(&mut a, sql).await, "42501", "{sql}");
    }
    for sql in [
        format!("SELECT orca.catalog_create_namespace('globex', 'planted', '{{}}', '{g_lease}')"),
        format!("SELECT orca.catalog_drop_table('globex', 'lake', 'clean', '{g_lease}')"),
    ] {
        assert_eq!(code_of(&mut a, &sql).await, "OR012", "{sql}");
    }
    assert_eq!(
        code_of(
            &mut a,
            "INSERT INTO public.iceberg_tables (catalog_name, table_namespace, table_name, \
             metadata_location) VALUES ('globex', 'lake', 'planted', 'file:///w/acme/x.json')"
        )
        .await,
        "42501"
    );
    // Writes: no table takes a direct write.
    for rel in db
        .strings("SELECT tablename::text FROM pg_tables WHERE schemaname = 'orca' ORDER BY 1")
        .await
    {
        for sql in [
            format!("DELETE FROM orca.\"{rel}\""),
            format!(
                "UPDATE orca.\"{rel}\" SET {c} = {c}",
                c = if rel == "orgs" { "id" } else { "org_id" }
            ),
            format!("INSERT INTO orca.\"{rel}\" SELECT * FROM orca.\"{rel}\" LIMIT 1"),
        ] {
            assert_eq!(code_of(&mut a, &sql).await, "42501", "{sql}");
        }
    }

    // Functions, each with globex's identifiers.
    for sql in [
        "SELECT * FROM orca.fires('globex_only')".to_string(),
        "SELECT orca.run('globex_only', '2024-01')".to_string(),
        "SELECT orca.backfill('globex_only', '2024-01')".to_string(),
        "SELECT orca.pause('globex_only')".to_string(),
        "SELECT orca.unpause('globex_only')".to_string(),
        "SELECT orca.refresh_keys('globex_keyed')".to_string(),
        "SELECT * FROM orca.key_status('globex_keyed')".to_string(),
        "SELECT orca.run('globex_keyed', 'k1')".to_string(),
        "SELECT orca.backfill('globex_keyed', '@all')".to_string(),
    ] {
        assert_eq!(code_of(&mut a, &sql).await, "OR010", "{sql}");
    }
    // Metrics and retention settings: acme's series only.
    let series: Vec<Value> = sqlx::query_scalar("SELECT to_jsonb(m) FROM orca.metrics() m")
        .fetch_all(&mut a)
        .await
        .expect("alice's metrics");
    assert!(
        series
            .iter()
            .any(|m| m["metric"] == "orca_leases_lapsed_total"),
        "{series:?}"
    );
    for m in &series {
        assert!(!m.to_string().contains("globex"), "a series of globex: {m}");
    }
    let lapsed = series
        .iter()
        .find(|m| m["metric"] == "orca_leases_lapsed_total")
        .and_then(|m| m["value"].as_f64());
    assert_eq!(
        lapsed,
        Some(1.0),
        "acme's own lapsed lease, not globex's too"
    );
    // The autoscaling signal: acme's attempts only, though both orgs queue
    // on a pool named default.
    let count = |sql: String| {
        let pool = &db.pool;
        async move {
            sqlx::query_scalar::<_, i64>(&sql)
                .fetch_one(pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        }
    };
    let of = |org: &str| {
        format!(
            "SELECT (SELECT count(*) FROM orca.queue WHERE pool = 'default' AND org_id IN ({org})) + \
             (SELECT count(*) FROM orca.leases l JOIN orca.attempts t ON t.id = l.attempt_id \
              WHERE t.pool = 'default' AND l.org_id IN ({org}))"
        )
    };
    let acme_backlog = count(of(&acme.to_string())).await;
    let both = count(of(&format!("{acme}, {globex}"))).await;
    assert!(
        both > acme_backlog,
        "globex has work on its default pool too"
    );
    let alice_backlog: i64 = sqlx::query_scalar("SELECT orca.pool_backlog('default')")
        .fetch_one(&mut a)
        .await
        .expect("alice's backlog");
    assert_eq!(alice_backlog, acme_backlog);
    let alice_pools: Vec<String> = sqlx::query_scalar("SELECT pool FROM orca.pool_load()")
        .fetch_all(&mut a)
        .await
        .expect("alice's pools");
    let acme_pools = db
        .strings(&format!(
            "SELECT pool FROM orca.pipeline_versions WHERE org_id = {acme} \
             UNION SELECT pool FROM orca.runner_tokens WHERE org_id = {acme} ORDER BY 1"
        ))
        .await;
    assert_eq!(alice_pools, acme_pools);
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM orca.retention()")
        .fetch_one(&mut a)
        .await
        .expect("retention settings");
    assert_eq!(kept, 5);
    // A sync's HEAD moves only under its run's lease: without one, alice is
    // refused whatever the sync; with globex's, the lease is not her org's.
    for sql in [
        "SELECT orca.claim_sync('globex_sync')".to_string(),
        "SELECT orca.advance_head('globex_sync', 1, 2, 'globex/globex_sync/_checkpoints/r2')"
            .to_string(),
        "SELECT orca.rewind_head('globex_sync', 1, 0, NULL)".to_string(),
        "SELECT orca.record_epoch('globex_sync', 1, 1, '{}')".to_string(),
        "SELECT orca.report_drift('globex_sync', 1, '[]')".to_string(),
        "SELECT orca.sync_lanes('globex_sync', 1)".to_string(),
    ] {
        assert_eq!(code_of(&mut a, &sql).await, "OR084", "{sql}");
    }
    // Dropping a sync (and its replication slot) names it in the session's
    // org: globex's is unknown to alice.
    for sql in [
        "SELECT orca.drop_sync('globex_sync')",
        "SELECT orca.pause_sync('globex_sync')",
        "SELECT orca.resume_sync('globex_sync')",
        "SELECT orca.scale_sync('globex_sync', 2)",
        "SELECT orca.discover('globex_cdc')",
    ] {
        assert_eq!(code_of(&mut a, sql).await, "OR064", "{sql}");
    }
    for sql in [
        format!("SELECT orca.claim_sync('globex_sync', '{g_lease}')"),
        format!("SELECT orca.advance_head('globex_sync', 1, 2, 'globex/globex_sync/_checkpoints/r2', '{g_lease}')"),
        format!("SELECT orca.rewind_head('globex_sync', 1, 0, NULL, '{g_lease}')"),
        format!("SELECT orca.record_epoch('globex_sync', 1, 1, '{{}}', '{g_lease}')"),
        format!("SELECT orca.report_drift('globex_sync', 1, '[]', '{g_lease}')"),
        format!("SELECT orca.sync_lanes('globex_sync', 1, '{g_lease}')"),
    ] {
        assert_eq!(code_of(&mut a, &sql).await, "OR012", "{sql}");
    }
    for sql in [
        "SELECT orca.revoke_runner_token('globex-token')",
        "SELECT orca.rotate_runner_token('globex-token')",
    ] {
        assert_eq!(code_of(&mut a, sql).await, "OR083", "{sql}");
    }
    for r in &g_runs {
        assert_eq!(
            code_of(&mut a, &format!("SELECT orca.cancel({r})")).await,
            "OR011"
        );
        assert_eq!(
            code_of(&mut a, &format!("SELECT * FROM orca.explain({r})")).await,
            "OR011"
        );
    }
    assert_eq!(
        code_of(&mut a, &format!("SELECT orca.retry({g_failed_run})")).await,
        "OR011"
    );
    for sql in [
        format!("SELECT orca.heartbeat('{g_lease}')"),
        format!("SELECT orca.finish('{g_lease}', true)"),
        format!("SELECT orca.finish('{g_lease}', false, 'x')"),
        format!("SELECT orca.release('{g_lease}')"),
        format!("SELECT orca.attempt_context('{g_lease}')"),
        format!("SELECT orca.pin_read('{g_lease}', 'one', '2024-02', 'lake.raw', 1)"),
        format!("SELECT orca.sense_context('{g_lease}')"),
        format!("SELECT orca.report_snapshots('{g_lease}', '[]')"),
        format!("SELECT orca.keys_context('{g_lease}')"),
        format!("SELECT orca.report_keys('{g_lease}', 1, 1, ARRAY['k3'])"),
        format!("SELECT orca.record_commit('{g_lease}', 'one', '2024-02', 'lake.raw', 1, 1)"),
        format!("SELECT orca.finish_many(ARRAY['{g_lease}'::uuid])"),
        format!("SELECT orca.report_step('{g_lease}', 'one', '2024-02', 'succeeded')"),
        format!("SELECT orca.attempt_secret('{g_lease}', 'globex-db')"),
        format!("SELECT orca.discovery('{g_lease}')"),
        format!("SELECT orca.store_catalog('{g_lease}', '{{\"streams\": [], \"plan\": []}}')"),
        format!("SELECT orca.append_log('{g_lease}', 100, ARRAY['planted'])"),
        format!("SELECT orca.maintenance_task('{g_lease}')"),
        format!("SELECT orca.report_maintenance('{g_lease}', '{{}}')"),
        format!("SELECT orca.report_slot('{g_lease}', '{{\"slot\": \"planted\"}}')"),
        format!("SELECT orca.add_tasks('{g_lease}', 'one', '2024-02', 'weigh', 3, '[1]')"),
        format!("SELECT * FROM orca.task_results('{g_lease}', 'one', '2024-02')"),
        format!("SELECT orca.attempt_state('{g_lease}')"),
        format!("SELECT orca.resume_point('{g_lease}', 'one', '2024-02')"),
        format!(
            "SELECT orca.record_resume_point('{g_lease}', 'one', '2024-02', 'file:///planted')"
        ),
    ] {
        assert_eq!(code_of(&mut a, &sql).await, "OR012", "{sql}");
    }
    // globex's task batch, leased to its runner: alice's runner can neither
    // finish it nor learn more than that it is unknown.
    let g_task: uuid::Uuid = sqlx::query_scalar(
        "SELECT lease FROM orca.task_batches WHERE org_id = $1 AND status = 'leased'",
    )
    .bind(globex)
    .fetch_one(&db.pool)
    .await
    .expect("globex's task lease");
    assert_eq!(
        code_of(
            &mut a,
            &format!("SELECT orca.finish_tasks('{g_task}', '[1]')")
        )
        .await,
        "OR012"
    );
    let beat: Vec<(uuid::Uuid, String)> = sqlx::query_as("SELECT * FROM orca.heartbeat_tasks($1)")
        .bind(vec![g_task])
        .fetch_all(&mut a)
        .await
        .expect("heartbeat_tasks");
    assert_eq!(beat, vec![(g_task, "unknown".to_string())]);
    let claimed: Vec<String> =
        sqlx::query_scalar("SELECT org FROM orca.claim_tasks('alice-runner', 'default', 10000)")
            .fetch_all(&mut a)
            .await
            .expect("alice claims tasks");
    assert!(claimed.iter().all(|o| o == "acme"), "{claimed:?}");
    // globex's datasets are not acme's to maintain, nor its schedules to drop.
    for sql in [
        "SELECT orca.maintain('globex_only.clean')",
        "SELECT orca.schedule_maintenance('globex_only.clean', '0 5 * * *')",
        // A table only globex's sync writes.
        "SELECT orca.maintain('globex_only_lake.events')",
        "SELECT orca.schedule_maintenance('globex_only_lake.events', '0 5 * * *')",
    ] {
        assert_eq!(code_of(&mut a, sql).await, "OR043", "{sql}");
    }
    // Its own sync's table is acme's to maintain, under acme's sync.
    let own: i64 = sqlx::query_scalar("SELECT orca.maintain('acme_only_lake.events')")
        .fetch_one(&mut a)
        .await
        .expect("acme maintains its sync's table");
    assert_eq!(
        db.strings(&format!(
            "SELECT o.name || ' ' || p.name FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
             JOIN orca.orgs o ON o.id = r.org_id WHERE r.id = {own}"
        ))
        .await,
        ["acme acme_lake"]
    );
    let dropped: bool =
        sqlx::query_scalar("SELECT orca.unschedule_maintenance('globex_only.clean')")
            .fetch_one(&mut a)
            .await
            .expect("unschedule");
    assert!(!dropped, "acme dropped globex's maintenance schedule");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.maintenance WHERE dataset = 'globex_only.clean'")
            .await,
        1
    );
    let g_hook = db
        .scalar_i64(
            "SELECT w.id FROM orca.webhooks w JOIN orca.orgs o ON o.id = w.org_id \
             WHERE o.name = 'globex'",
        )
        .await;
    // globex's playbook and incident: unknown to alice, as ones that do not exist.
    let g_playbook = db
        .scalar_i64(
            "SELECT x.id FROM orca.playbooks x JOIN orca.orgs o ON o.id = x.org_id \
             WHERE o.name = 'globex'",
        )
        .await;
    let g_incident = db
        .scalar_i64(
            "SELECT x.id FROM orca.incidents x JOIN orca.orgs o ON o.id = x.org_id \
             WHERE o.name = 'globex' AND x.resolved_at IS NULL",
        )
        .await;
    assert_eq!(
        code_of(&mut a, &format!("SELECT orca.drop_playbook({g_playbook})")).await,
        "OR106"
    );
    assert_eq!(
        code_of(
            &mut a,
            &format!("SELECT orca.resolve_incident({g_incident})")
        )
        .await,
        "OR107"
    );
    for sql in [
        format!("SELECT orca.drop_webhook({g_hook})"),
        format!("SELECT orca.rotate_webhook_secret({g_hook})"),
        format!("SELECT orca.set_webhook_enabled({g_hook}, false)"),
    ] {
        assert_eq!(code_of(&mut a, &sql).await, "OR096", "{sql}");
    }
    for sql in [
        "SELECT orca.relay_take(10)".to_string(),
        format!("SELECT orca.relay_done({g_hook}, 1, true, 200, 1, NULL)"),
        "SELECT secret_sealed FROM orca.webhooks".to_string(),
    ] {
        assert_eq!(code_of(&mut a, &sql).await, "42501", "{sql}");
    }
    assert_eq!(
        code_of(&mut a, "SELECT orca.revoke_api_key('globex-key')").await,
        "OR088",
        "globex's API key is not acme's to revoke"
    );
    assert_eq!(
        code_of(&mut a, "SELECT orca.api_session()").await,
        "OR087",
        "a session without a key has no API session"
    );
    assert_eq!(
        code_of(&mut a, "SELECT orca.drop_secret('globex-db')").await,
        "OR091",
        "globex's secret is not acme's to drop"
    );
    assert_eq!(
        code_of(&mut a, "SELECT orca.rewrap_data_keys()").await,
        "42501"
    );
    for sql in [
        "SELECT orca.create_org('mine')",
        "SELECT orca.allow('globex', '10.0.0.0/8')",
        "SELECT orca.allow('acme', '10.0.0.0/8')",
        "SELECT orca.disallow('globex', '/in')",
        "SELECT orca.add_member('globex', 'orca_t_alice')",
        "SELECT orca.remove_member('globex', 'orca_t_bob')",
    ] {
        assert_eq!(code_of(&mut a, sql).await, "42501", "{sql}");
    }
    // Lineage walks only her org's reads and commits.
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM orca.lineage('globex_only.clean')")
        .fetch_one(&mut a)
        .await
        .expect("lineage");
    assert_eq!(seen, 0, "alice sees globex's lineage");
    // What alice may do acts on acme only, even with globex's names.
    let mut m = lake_manifest("globex_only");
    m["max_runs"] = json!(null);
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut a)
        .await
        .expect("alice registers her own globex_only");
    a.execute("SELECT orca.register_runner('globex-runner', 'default')")
        .await
        .expect("alice's runner");
    let got = claim(&mut a, "globex-runner", 100).await;
    let mine: BTreeSet<i64> = sqlx::query_scalar("SELECT id FROM orca.runs")
        .fetch_all(&mut a)
        .await
        .expect("alice's runs")
        .into_iter()
        .collect();
    assert!(
        got.iter().all(|l| mine.contains(&l.run)),
        "claimed a run that is not acme's"
    );
    // Only admins move the clock; alice ticks at the transaction's time.
    assert_eq!(
        code_of(&mut a, "SELECT orca.tick(now() + interval '1 day')").await,
        "OR086"
    );
    a.execute("SELECT orca.tick()")
        .await
        .expect("alice ticks now");
    // Far in the future every lease has lapsed: an admin's tick in acme
    // reclaims acme's only.
    let mut admin = connect_org(&db, "postgres", "acme").await;
    let t: Value = sqlx::query_scalar("SELECT orca.tick(now() + interval '1 day')")
        .fetch_one(&mut admin)
        .await
        .expect("tick");
    assert!(t["attempts_lost"].as_i64().unwrap_or(0) > 0, "{t}");
    let id: i64 = sqlx::query_scalar("SELECT orca.current_org_id()")
        .fetch_one(&mut a)
        .await
        .expect("org id");
    assert_eq!(id, acme);
    let may: bool = sqlx::query_scalar(&format!("SELECT orca._may_use_org({globex})"))
        .fetch_one(&mut a)
        .await
        .expect("may use");
    assert!(!may);
    // Switching to an org she does not belong to is refused everywhere.
    a.execute("SET orca.org = 'globex'").await.expect("set");
    // (A tick with her runner token acts in the token's org, and the token
    // is acme's.)
    assert_eq!(code_of(&mut a, "SELECT orca.tick()").await, "OR081");
    assert_eq!(
        code_of(&mut a, "SELECT count(*) FROM orca.runs").await,
        "OR002"
    );
    // Her token is acme's: it does not follow her to globex.
    assert_eq!(
        code_of(&mut a, "SELECT * FROM orca.claim('x')").await,
        "OR081"
    );

    assert_eq!(org_snapshot(&db, globex).await, before, "globex changed");
    // And bob, in globex, still sees his lease alive.
    let mut b = connect_org(&db, BOB, "globex").await;
    let row = sqlx::query("SELECT status FROM orca.attempts WHERE id = $1")
        .bind(g_attempt)
        .fetch_one(&mut b)
        .await
        .expect("bob reads his attempt");
    assert_eq!(row.get::<String, _>("status"), "leased");
    let lineage: i64 = sqlx::query_scalar("SELECT count(*) FROM orca.lineage('globex_only.clean')")
        .fetch_one(&mut b)
        .await
        .expect("bob's lineage");
    assert_eq!(lineage, 1, "bob sees his own lineage");
}
