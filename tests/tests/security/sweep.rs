//! The sweep: every table, view, sequence and function that an org-scoped
//! principal can reach, read from PostgreSQL's catalog rather than listed by
//! hand, tried by every kind of principal of org acme against org globex.
//!
//! The principals of acme: a viewer, an operator, a runner (a login in
//! orca_runner only, with acme's runner token), an attempt (a login in
//! orca_attempt only, with acme's live lease), and each kind of API key
//! (viewer, operator, admin) as `orca serve` presents it (its login takes
//! the key's role) and over an operator's and a runner's own logins. An
//! `orca_admin` login is the installation's admin, which sees every org by
//! design; an org's admin is its admin API key.
//!
//! For each principal: a table or view shows acme's rows only; no table
//! takes a write (every write goes through a function); no sequence can be
//! read or moved; every function it may execute is called with globex's ids
//! and names (a function without a case here fails the test by name) and
//! returns nothing of globex's. At the end globex's rows are what they
//! were, to the byte.

use std::collections::{BTreeMap, BTreeSet};

use super::*;

const SW_VIEWER: &str = "orca_t_sw_viewer";
const SW_OPERATOR: &str = "orca_t_sw_operator";
const SW_RUNNER: &str = "orca_t_sw_runner";
const SW_ATTEMPT: &str = "orca_t_sw_attempt";
const SW_SERVE: &str = "orca_t_sw_serve";

/// What globex's rows are known by in an answer: its org's name as a value,
/// its lease, its table's metadata, its sync's records, its webhook, its
/// secret's value.
fn markers(b_lease: &uuid::Uuid) -> Vec<String> {
    vec![
        "\"globex\"".to_string(),
        b_lease.to_string(),
        "/w/globex/".to_string(),
        "/sp/globex/".to_string(),
        "globex/globex_sync/_checkpoints".to_string(),
        "hooks.example.com/globex".to_string(),
        "pw@db/globex".to_string(),
        "globex-task-".to_string(),
        "globex-out-".to_string(),
    ]
}

/// A lease with the same id half as `real` and another random half: what
/// someone who knows only the id can make.
fn forge(real: &uuid::Uuid) -> String {
    let real = real.to_string();
    let (_, tail) = real.split_at(8);
    let head = if real.starts_with("00000000") {
        "11111111"
    } else {
        "00000000"
    };
    format!("{head}{tail}")
}

/// How a function's answer is judged beyond "nothing of globex's".
#[derive(Clone, Copy, PartialEq)]
enum Expect {
    /// Anything but globex's rows.
    NoLeak,
    /// An error, or false.
    NotTrue,
    /// An error, or acme's id.
    Acme,
}

/// Every function an org-scoped principal may execute, by signature, with
/// the calls it is tried with. {B_LEASE} (a lease forged around globex's
/// attempt's id), {B_RUN}, {B_FAILED}, {B_HOOK}, {B_ORG}, {B_PLAYBOOK}, {B_INCIDENT} and {A_LEASE}
/// are globex's and acme's.
fn cases() -> BTreeMap<&'static str, (Expect, Vec<&'static str>)> {
    use Expect::*;
    let globex_sync_files = "SELECT orca.create_sync('globex_sync', \
         '{\"type\": \"files\", \"url\": \"/in\", \"format\": \"jsonl\"}', \
         '{\"type\": \"parquet\", \"url\": \"/out\"}', \
         '[{\"name\": \"events\", \"pattern\": \"*.jsonl\"}]')";
    let v: Vec<(&str, Expect, Vec<&str>)> = vec![
        ("orca.current_org_id()", Acme, vec!["SELECT orca.current_org_id()"]),
        ("orca._may_use_org(bigint)", NotTrue, vec!["SELECT orca._may_use_org({B_ORG})"]),
        ("orca._catalog_visible(text)", NotTrue, vec!["SELECT orca._catalog_visible('globex')"]),
        ("orca.fires(text,integer,timestamp with time zone)", NoLeak,
         vec!["SELECT * FROM orca.fires('globex_only')"]),
        ("orca.lineage(text)", NoLeak, vec!["SELECT * FROM orca.lineage('globex_only.clean')"]),
        ("orca.key_status(text)", NoLeak, vec!["SELECT * FROM orca.key_status('globex_keyed')"]),
        ("orca.api_session()", NoLeak, vec!["SELECT orca.api_session()"]),
        ("orca.metrics()", NoLeak, vec!["SELECT * FROM orca.metrics()"]),
        ("orca.retention()", NoLeak, vec!["SELECT * FROM orca.retention()"]),
        ("orca.pool_load()", NoLeak, vec!["SELECT * FROM orca.pool_load()"]),
        ("orca.pool_backlog(text,text)", NoLeak, vec!["SELECT orca.pool_backlog('default')",
                                                     "SELECT orca.pool_backlog('default', 'tasks')"]),
        ("orca.register(jsonb)", NoLeak, vec!["SELECT orca.register('{\"name\": \"globex_only\", \
            \"steps\": [{\"name\": \"one\", \"kind\": \"mapped\"}], \"partitions\": {\"monthly\": \"2024-01\"}, \
            \"registry_hash\": \"sweep\", \"binary\": \"/opt/orca/pipelines/x\"}')"]),
        ("orca.run(text,text)", NoLeak, vec!["SELECT orca.run('globex_only', '2024-01')",
                                            "SELECT orca.run('globex_keyed', 'k1')"]),
        ("orca.backfill(text,text,integer)", NoLeak, vec!["SELECT orca.backfill('globex_only', '2024-01')",
                                                 "SELECT orca.backfill('globex_only', '2024-01..2024-03', 2)",
                                                 "SELECT orca.backfill('globex_keyed', '@all')",
                                                 "SELECT orca.backfill('globex_keyed', '@all', 1)"]),
        ("orca.cancel(bigint)", NoLeak, vec!["SELECT orca.cancel({B_RUN})"]),
        ("orca.create_playbook(text,text,jsonb)", NoLeak,
         vec!["SELECT orca.create_playbook('run_failed', 'open_only')"]),
        ("orca.drop_playbook(bigint)", NoLeak, vec!["SELECT orca.drop_playbook({B_PLAYBOOK})"]),
        ("orca.resolve_incident(bigint,text)", NoLeak,
         vec!["SELECT orca.resolve_incident({B_INCIDENT}, 'planted')"]),
        ("orca.explain(bigint)", NoLeak, vec!["SELECT * FROM orca.explain({B_RUN})",
                                            "SELECT * FROM orca.explain({B_FAILED})"]),
        ("orca.retry(bigint)", NoLeak, vec!["SELECT orca.retry({B_FAILED})"]),
        ("orca.pause(text)", NoLeak, vec!["SELECT orca.pause('globex_only')"]),
        ("orca.unpause(text)", NoLeak, vec!["SELECT orca.unpause('globex_only')"]),
        ("orca.refresh_keys(text)", NoLeak, vec!["SELECT orca.refresh_keys('globex_keyed')"]),
        ("orca.create_sync(text,jsonb,jsonb,jsonb,text,text,text,integer)", NoLeak,
         vec![globex_sync_files]),
        ("orca.discover(text,jsonb)", NoLeak, vec!["SELECT orca.discover('globex_cdc')"]),
        ("orca.drop_sync(text)", NoLeak, vec!["SELECT orca.drop_sync('globex_sync')"]),
        ("orca.pause_sync(text)", NoLeak, vec!["SELECT orca.pause_sync('globex_sync')"]),
        ("orca.resume_sync(text)", NoLeak, vec!["SELECT orca.resume_sync('globex_sync')"]),
        ("orca.scale_sync(text,integer)", NoLeak, vec!["SELECT orca.scale_sync('globex_sync', 2)"]),
        ("orca.maintain(text,jsonb)", NoLeak, vec!["SELECT orca.maintain('globex_only.clean')"]),
        ("orca.schedule_maintenance(text,text,jsonb,text)", NoLeak,
         vec!["SELECT orca.schedule_maintenance('globex_only.clean', '0 5 * * *')"]),
        ("orca.unschedule_maintenance(text)", NoLeak,
         vec!["SELECT orca.unschedule_maintenance('globex_only.clean')"]),
        ("orca.create_runner_token(text,text)", NoLeak,
         vec!["SELECT orca.create_runner_token('default', 'sweep-' || md5(random()::text))"]),
        ("orca.revoke_runner_token(text)", NoLeak, vec!["SELECT orca.revoke_runner_token('globex-token')"]),
        ("orca.rotate_runner_token(text,interval)", NoLeak,
         vec!["SELECT orca.rotate_runner_token('globex-token')"]),
        ("orca.create_api_key(text,text)", NoLeak,
         vec!["SELECT orca.create_api_key('sweep-' || md5(random()::text), 'admin')"]),
        ("orca.revoke_api_key(text)", NoLeak, vec!["SELECT orca.revoke_api_key('globex-key')"]),
        ("orca.create_webhook(text,text[],text)", NoLeak,
         vec!["SELECT orca.create_webhook('https://hooks.example.com/sweep', '{run.*}')"]),
        ("orca.rotate_webhook_secret(bigint)", NoLeak, vec!["SELECT orca.rotate_webhook_secret({B_HOOK})"]),
        ("orca.set_webhook_enabled(bigint,boolean)", NoLeak,
         vec!["SELECT orca.set_webhook_enabled({B_HOOK}, false)"]),
        ("orca.drop_webhook(bigint)", NoLeak, vec!["SELECT orca.drop_webhook({B_HOOK})"]),
        ("orca.set_incident_threshold(text,bigint,text)", NoLeak,
         vec!["SELECT orca.set_incident_threshold('cdc_lag_bytes', 12345)",
              "SELECT orca.set_incident_threshold('cdc_lag_bytes', 12345, 'globex_cdc')",
              "SELECT orca.set_incident_threshold('cdc_lag_bytes', NULL, 'globex_cdc')"]),
        ("orca.set_secret(text,text)", NoLeak, vec!["SELECT orca.set_secret('globex-db', 'planted')"]),
        ("orca.drop_secret(text)", NoLeak, vec!["SELECT orca.drop_secret('globex-db')"]),
        ("orca.tick(timestamp with time zone)", NoLeak,
         vec!["SELECT orca.tick()", "SELECT orca.tick(now() + interval '1 day')"]),
        ("orca.catalog_create_namespace(text,text,jsonb,uuid)", NoLeak,
         vec!["SELECT orca.catalog_create_namespace('globex', 'planted')",
              "SELECT orca.catalog_create_namespace('globex', 'planted', '{}', '{B_LEASE}')",
              "SELECT orca.catalog_create_namespace('acme', 'planted', '{}', '{B_LEASE}')"]),
        ("orca.catalog_create_table(text,text,text,text,uuid)", NoLeak,
         vec!["SELECT orca.catalog_create_table('globex', 'lake', 'planted', 'file:///w/acme/x.json')",
              "SELECT orca.catalog_create_table('globex', 'lake', 'planted', 'file:///w/acme/x.json', '{B_LEASE}')"]),
        ("orca.catalog_commit(text,text,text,text,text,uuid)", NoLeak,
         vec!["SELECT orca.catalog_commit('globex', 'lake', 'clean', \
               'file:///w/globex/lake/clean/metadata/1.json', 'file:///w/acme/x.json')",
              "SELECT orca.catalog_commit('globex', 'lake', 'clean', \
               'file:///w/globex/lake/clean/metadata/1.json', 'file:///w/acme/x.json', '{B_LEASE}')",
              "SELECT orca.catalog_commit('globex', 'lake', 'clean', \
               'file:///w/globex/lake/clean/metadata/1.json', 'file:///w/acme/x.json', '{A_LEASE}')"]),
        ("orca.catalog_drop_table(text,text,text,uuid)", NoLeak,
         vec!["SELECT orca.catalog_drop_table('globex', 'lake', 'clean')",
              "SELECT orca.catalog_drop_table('globex', 'lake', 'clean', '{B_LEASE}')",
              "SELECT orca.catalog_drop_table('globex', 'lake', 'clean', '{A_LEASE}')"]),
        ("orca.report_step(uuid,text,text,text,text,jsonb,text,text)", NoLeak,
         vec!["SELECT orca.report_step('{B_LEASE}', 'one', '2024-02', 'succeeded')"]),
        ("orca.attempt_context(uuid,jsonb)", NoLeak, vec!["SELECT orca.attempt_context('{B_LEASE}')"]),
        ("orca.pin_read(uuid,text,text,text,bigint)", NoLeak,
         vec!["SELECT orca.pin_read('{B_LEASE}', 'one', '2024-02', 'lake.raw', 1)"]),
        ("orca.sense_context(uuid)", NoLeak, vec!["SELECT orca.sense_context('{B_LEASE}')"]),
        ("orca.report_snapshots(uuid,jsonb)", NoLeak,
         vec!["SELECT orca.report_snapshots('{B_LEASE}', '[]')"]),
        ("orca.keys_context(uuid)", NoLeak, vec!["SELECT orca.keys_context('{B_LEASE}')"]),
        ("orca.report_keys(uuid,bigint,bigint,text[])", NoLeak,
         vec!["SELECT orca.report_keys('{B_LEASE}', 1, 1, ARRAY['k3'])"]),
        ("orca.claim_sync(text,uuid)", NoLeak,
         vec!["SELECT orca.claim_sync('globex_sync')",
              "SELECT orca.claim_sync('globex_sync', '{B_LEASE}')"]),
        ("orca.advance_head(text,integer,bigint,text,uuid)", NoLeak,
         vec!["SELECT orca.advance_head('globex_sync', 1, 2, 'globex/globex_sync/_checkpoints/r2')",
              "SELECT orca.advance_head('globex_sync', 1, 2, 'globex/globex_sync/_checkpoints/r2', '{B_LEASE}')"]),
        ("orca.rewind_head(text,integer,bigint,text,uuid)", NoLeak,
         vec!["SELECT orca.rewind_head('globex_sync', 1, 0, NULL)",
              "SELECT orca.rewind_head('globex_sync', 1, 0, NULL, '{B_LEASE}')"]),
        ("orca.record_epoch(text,integer,bigint,jsonb,uuid)", NoLeak,
         vec!["SELECT orca.record_epoch('globex_sync', 1, 1, '{}')",
              "SELECT orca.record_epoch('globex_sync', 1, 1, '{}', '{B_LEASE}')"]),
        ("orca.record_commit(uuid,text,text,text,bigint,integer,text)", NoLeak,
         vec!["SELECT orca.record_commit('{B_LEASE}', 'one', '2024-02', 'lake.raw', 1, 1)"]),
        ("orca.attempt_secret(uuid,text)", NoLeak,
         vec!["SELECT orca.attempt_secret('{B_LEASE}', 'globex-db')",
              "SELECT orca.attempt_secret(NULL, 'globex-db')",
              "SELECT orca.attempt_secret('{A_LEASE}', 'globex-db')"]),
        ("orca.discovery(uuid)", NoLeak, vec!["SELECT orca.discovery('{B_LEASE}')"]),
        ("orca.store_catalog(uuid,jsonb)", NoLeak,
         vec!["SELECT orca.store_catalog('{B_LEASE}', '{\"streams\": [], \"plan\": []}')"]),
        ("orca.report_drift(text,integer,jsonb,uuid)", NoLeak,
         vec!["SELECT orca.report_drift('globex_sync', 1, '[]')",
              "SELECT orca.report_drift('globex_sync', 1, '[]', '{B_LEASE}')"]),
        ("orca.sync_lanes(text,integer,uuid)", NoLeak,
         vec!["SELECT orca.sync_lanes('globex_sync', 1)",
              "SELECT orca.sync_lanes('globex_sync', 1, '{B_LEASE}')"]),
        ("orca.maintenance_task(uuid)", NoLeak, vec!["SELECT orca.maintenance_task('{B_LEASE}')"]),
        ("orca.report_maintenance(uuid,jsonb)", NoLeak,
         vec!["SELECT orca.report_maintenance('{B_LEASE}', '{}')"]),
        ("orca.add_tasks(uuid,text,text,text,integer,jsonb)", NoLeak,
         vec!["SELECT orca.add_tasks('{B_LEASE}', 'one', '2024-02', 'weigh', 0, '[\"planted\"]')",
              "SELECT orca.add_tasks('{B_LEASE}', 'one', '2024-02', 'weigh', 3, '[\"planted\"]')"]),
        ("orca.task_results(uuid,text,text,bigint)", NoLeak,
         vec!["SELECT * FROM orca.task_results('{B_LEASE}', 'one', '2024-02')",
              "SELECT * FROM orca.task_results('{B_LEASE}', 'one', '2024-01')"]),
        ("orca.attempt_state(uuid)", NoLeak,
         vec!["SELECT orca.attempt_state('{B_LEASE}')"]),
        ("orca.resume_point(uuid,text,text)", NoLeak,
         vec!["SELECT orca.resume_point('{B_LEASE}', 'one', '2024-02')",
              "SELECT orca.resume_point('{A_LEASE}', 'one', '2024-02')"]),
        ("orca.record_resume_point(uuid,text,text,text)", NoLeak,
         vec!["SELECT orca.record_resume_point('{B_LEASE}', 'one', '2024-02', 'file:///planted')",
              "SELECT orca.record_resume_point('{A_LEASE}', 'one', '2024-02', 'file:///sp/acme/planted')"]),
        ("orca.claim_tasks(text,text,integer)", NoLeak,
         vec!["SELECT * FROM orca.claim_tasks('globex-runner', 'default', 10000)"]),
        ("orca.heartbeat_tasks(uuid[])", NoLeak,
         vec!["SELECT * FROM orca.heartbeat_tasks(ARRAY['{B_TASK_LEASE}'::uuid])"]),
        ("orca.finish_tasks(uuid,jsonb,text[],integer[])", NoLeak,
         vec!["SELECT orca.finish_tasks('{B_TASK_LEASE}', '[\"planted\"]')",
              "SELECT orca.finish_tasks('{B_TASK_LEASE}', '[null]', ARRAY['planted'])"]),
        ("orca.claim(text,text,integer,text[])", NoLeak,
         vec!["SELECT * FROM orca.claim('globex-runner', 'default', 100)"]),
        ("orca.heartbeat(uuid)", NoLeak, vec!["SELECT orca.heartbeat('{B_LEASE}')"]),
        ("orca.finish(uuid,boolean,text,text)", NoLeak,
         vec!["SELECT orca.finish('{B_LEASE}', true)", "SELECT orca.finish('{B_LEASE}', false, 'x')"]),
        ("orca.finish_many(uuid[],boolean,text)", NoLeak,
         vec!["SELECT orca.finish_many(ARRAY['{B_LEASE}'::uuid])"]),
        ("orca.release(uuid,text)", NoLeak, vec!["SELECT orca.release('{B_LEASE}')"]),
        ("orca.register_runner(text,text,integer,text)", NoLeak,
         vec!["SELECT orca.register_runner('globex-runner', 'default')"]),
        ("orca.append_log(uuid,integer,text[])", NoLeak,
         vec!["SELECT orca.append_log('{B_LEASE}', 100, ARRAY['planted'])"]),
        ("orca.report_slot(uuid,jsonb)", NoLeak,
         vec!["SELECT orca.report_slot('{B_LEASE}', '{\"slot\": \"planted\", \"measured_at\": \"2026-01-01T00:00:00Z\"}')",
              "SELECT orca.report_slot('{A_LEASE}', '{\"slot\": \"planted\", \"measured_at\": \"2026-01-01T00:00:00Z\"}')"]),
        ("orca.relay_take(integer)", NoLeak, vec!["SELECT orca.relay_take(10)"]),
        ("orca.relay_done(bigint,bigint,boolean,integer,integer,text,text)", NoLeak,
         vec!["SELECT orca.relay_done({B_HOOK}, 1, true, 200, 1, NULL)"]),
        ("orca.create_org(text)", NoLeak, vec!["SELECT orca.create_org('sweep')"]),
        ("orca.add_member(text,text)", NoLeak,
         vec!["SELECT orca.add_member('globex', 'orca_t_sw_operator')"]),
        ("orca.remove_member(text,text)", NoLeak,
         vec!["SELECT orca.remove_member('globex', 'orca_t_sw_operator')"]),
        ("orca.rewrap_data_keys()", NoLeak, vec!["SELECT orca.rewrap_data_keys()"]),
        ("orca.allow(text,text,text)", NoLeak,
         vec!["SELECT orca.allow('globex', '10.0.0.0/8')", "SELECT orca.allow('acme', '10.0.0.0/8')"]),
        ("orca.disallow(text,text)", NoLeak, vec!["SELECT orca.disallow('globex', '/in')"]),
    ];
    v.into_iter().map(|(k, e, c)| (k, (e, c))).collect()
}

/// One principal of acme: a login, and what its session presents.
struct Principal {
    name: String,
    login: &'static str,
    /// Statements run when its session opens (settings, a role to take).
    setup: Vec<String>,
}

fn principals(a_token: &str, a_lease: &uuid::Uuid, keys: &[(String, String)]) -> Vec<Principal> {
    let org = |login| Principal {
        name: format!("{login} (member of acme)"),
        login,
        setup: vec!["SET orca.org = 'acme'".into()],
    };
    let mut out = vec![
        org(SW_VIEWER),
        org(SW_OPERATOR),
        Principal {
            name: "a runner login with acme's runner token".into(),
            login: SW_RUNNER,
            setup: vec![format!("SET orca.runner_token = '{a_token}'")],
        },
        Principal {
            name: "an attempt login with acme's lease".into(),
            login: SW_ATTEMPT,
            setup: vec![format!("SET orca.lease = '{a_lease}'")],
        },
    ];
    for (role, key) in keys {
        out.push(Principal {
            name: format!("acme's {role} API key as orca serve presents it"),
            login: SW_SERVE,
            setup: vec![
                format!("SET orca.api_key = '{key}'"),
                format!("SET ROLE orca_{role}"),
            ],
        });
        for (login, what) in [(SW_OPERATOR, "an operator's"), (SW_RUNNER, "a runner's")] {
            out.push(Principal {
                name: format!("acme's {role} API key over {what} login"),
                login,
                setup: vec![format!("SET orca.api_key = '{key}'")],
            });
        }
    }
    out
}

async fn sweep_roles(db: &TestDb) {
    ensure_role(db, SW_VIEWER, &["orca_viewer"]).await;
    ensure_role(db, SW_OPERATOR, &["orca_operator"]).await;
    ensure_role(db, SW_RUNNER, &["orca_runner"]).await;
    ensure_role(db, SW_ATTEMPT, &["orca_attempt"]).await;
    orca_tests::serve::serve_login(db, SW_SERVE).await;
}

/// The error code of a statement, or its answer as JSON text.
async fn answer(c: &mut PgConnection, sql: &str) -> Result<String, (String, String)> {
    let wrapped = format!("SELECT coalesce(jsonb_agg(to_jsonb(x)), '[]')::text FROM ({sql}) x");
    match sqlx::query_scalar::<_, String>(&wrapped)
        .fetch_one(&mut *c)
        .await
    {
        Ok(v) => Ok(v),
        Err(sqlx::Error::Database(e)) => Err((
            e.code().map(|c| c.to_string()).unwrap_or_default(),
            e.message().to_string(),
        )),
        Err(e) => panic!("{sql}: {e}"),
    }
}

/// Relations (tables, views, matviews, partitioned and foreign tables) and
/// sequences of schemas orca and public.
async fn relations(db: &TestDb, kinds: &str) -> Vec<(String, String)> {
    sqlx::query_as(&format!(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.relkind::text \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname IN ('orca', 'public') AND c.relkind = ANY ('{{{kinds}}}') ORDER BY 1"
    ))
    .fetch_all(&db.pool)
    .await
    .expect("relations")
}

/// Which org a row belongs to, by its org column.
fn row_org(rel: &str, row: &Value, acme: i64) -> Result<bool, String> {
    if let Some(id) = row.get("org_id") {
        return Ok(id == &json!(acme));
    }
    if let Some(org) = row.get("org") {
        return Ok(org == "acme");
    }
    if let Some(cat) = row.get("catalog_name") {
        return Ok(cat == "acme");
    }
    if rel == "orca.orgs" {
        return Ok(row["id"] == json!(acme));
    }
    Err(format!(
        "{rel} has no org_id, org or catalog_name column: say here how the sweep tells its \
         rows' org, and scope it"
    ))
}

#[tokio::test]
async fn no_object_an_org_can_reach_returns_or_changes_another_orgs() {
    let db = TestDb::new().await;
    sweep_roles(&db).await;
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
                "SELECT orca.add_member('acme', '{SW_VIEWER}'), orca.add_member('acme', '{SW_OPERATOR}')"
            )
            .as_str(),
        )
        .await
        .expect("members");
    let (_, a_lease, _, _) = populate_org(&db, "acme", "acme_only").await;
    let (b_runs, b_lease, b_failed, _) = populate_org(&db, "globex", "globex_only").await;
    let b_hook = db
        .scalar_i64(&format!(
            "SELECT id FROM orca.webhooks WHERE org_id = {globex}"
        ))
        .await;
    let mut admin = connect_org(&db, "postgres", "acme").await;
    let a_token: String = sqlx::query_scalar("SELECT orca.create_runner_token('default', 'sweep')")
        .fetch_one(&mut admin)
        .await
        .expect("acme's runner token");
    // The lease the runner token holds is acme's attempt's: the runner
    // principal may act on it; globex's it may not.
    let mut keys = Vec::new();
    for role in ["viewer", "operator", "admin"] {
        let k: String = sqlx::query_scalar("SELECT orca.create_api_key($1, $2)")
            .bind(format!("sweep-{role}"))
            .bind(role)
            .fetch_one(&mut admin)
            .await
            .expect("an API key");
        keys.push((role.to_string(), k));
    }
    let before = org_snapshot(&db, globex).await;
    let mut marks = markers(&b_lease);
    // globex's lease is its attempt's capability, which no principal of
    // acme can read: holding it is being that attempt. What acme can know
    // is the attempt's id, which a lease ends with; the calls take a lease
    // forged around it.
    let forged = forge(&b_lease);
    let b_playbook: i64 = sqlx::query_scalar("SELECT id FROM orca.playbooks WHERE org_id = $1")
        .bind(globex)
        .fetch_one(&db.pool)
        .await
        .expect("globex's playbook");
    let b_incident: i64 = sqlx::query_scalar(
        "SELECT id FROM orca.incidents WHERE org_id = $1 AND resolved_at IS NULL LIMIT 1",
    )
    .bind(globex)
    .fetch_one(&db.pool)
    .await
    .expect("globex's incident");
    // The same for the task batch globex's runner holds.
    let b_task_lease: uuid::Uuid = sqlx::query_scalar(
        "SELECT lease FROM orca.task_batches WHERE org_id = $1 AND status = 'leased'",
    )
    .bind(globex)
    .fetch_one(&db.pool)
    .await
    .expect("globex's leased task batch");
    marks.push(b_task_lease.to_string());
    let forged_task = forge(&b_task_lease);
    let fill = |sql: &str| {
        sql.replace("{B_LEASE}", &forged)
            .replace("{B_TASK_LEASE}", &forged_task)
            .replace("{A_LEASE}", &a_lease.to_string())
            .replace("{B_RUN}", &b_runs[0].to_string())
            .replace("{B_FAILED}", &b_failed.to_string())
            .replace("{B_HOOK}", &b_hook.to_string())
            .replace("{B_ORG}", &globex.to_string())
            .replace("{B_PLAYBOOK}", &b_playbook.to_string())
            .replace("{B_INCIDENT}", &b_incident.to_string())
    };

    // What any org-scoped role may execute, from the catalog: each needs
    // its case.
    let reachable: BTreeSet<String> = db
        .strings(
            "SELECT DISTINCT replace(p.oid::regprocedure::text, ', ', ',') FROM pg_proc p \
             JOIN pg_namespace n ON n.oid = p.pronamespace \
             CROSS JOIN (VALUES ('orca_viewer'), ('orca_operator'), ('orca_runner'), \
                                ('orca_attempt'), ('orca_admin'), ('orca_relay')) r(role) \
             WHERE n.nspname IN ('orca', 'public') \
               AND has_function_privilege(r.role, p.oid, 'EXECUTE') ORDER BY 1",
        )
        .await
        .into_iter()
        .collect();
    let cases = cases();
    let covered: BTreeSet<String> = cases.keys().map(|k| k.to_string()).collect();
    let missing: Vec<&String> = reachable.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "functions an org-scoped role may execute without a case in the sweep: {missing:?}"
    );
    let gone: Vec<&String> = covered.difference(&reachable).collect();
    assert!(
        gone.is_empty(),
        "cases of functions no role may execute: {gone:?}"
    );
    // Nothing in orca or public is executable by PUBLIC.
    let public = db
        .strings(
            "SELECT p.oid::regprocedure::text FROM pg_proc p \
             JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname IN ('orca', 'public') \
               AND EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a \
                           WHERE a.grantee = 0) ORDER BY 1",
        )
        .await;
    assert!(
        public.is_empty(),
        "functions PUBLIC may execute: {public:?}"
    );
    // Every table an org-scoped role may read is under row-level security.
    let unscoped = db
        .strings(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname IN ('orca', 'public') AND c.relkind IN ('r', 'p') \
               AND EXISTS (SELECT 1 FROM (VALUES ('orca_viewer'), ('orca_operator'), \
                           ('orca_runner'), ('orca_attempt')) r(role) \
                           WHERE has_any_column_privilege(r.role, c.oid, 'SELECT')) \
               AND NOT (c.relrowsecurity AND EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = c.oid)) \
             ORDER BY 1",
        )
        .await;
    assert!(
        unscoped.is_empty(),
        "readable tables without row-level security: {unscoped:?}"
    );

    let tables = relations(&db, "r,v,m,p,f").await;
    let sequences = relations(&db, "S").await;
    let mut seen_rows: BTreeMap<String, usize> = BTreeMap::new();
    for p in principals(&a_token, &a_lease, &keys) {
        let mut c = db.connect_as(p.login).await;
        for s in &p.setup {
            c.execute(s.as_str())
                .await
                .unwrap_or_else(|e| panic!("{}: {s}: {e}", p.name));
        }
        // Tables and views: acme's rows only, and no direct write.
        for (rel, kind) in &tables {
            let cols: Vec<String> = sqlx::query_scalar(
                "SELECT quote_ident(attname) FROM pg_attribute \
                 WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped \
                   AND has_column_privilege(current_user, attrelid, attnum, 'SELECT') \
                 ORDER BY attnum",
            )
            .bind(rel)
            .fetch_all(&mut c)
            .await
            .unwrap_or_else(|e| panic!("{}: columns of {rel}: {e}", p.name));
            if cols.is_empty() {
                let code = code_of(&mut c, &format!("SELECT 1 FROM {rel} LIMIT 1")).await;
                assert_eq!(code, "42501", "{}: {rel} without a readable column", p.name);
            } else {
                let rows = answer(&mut c, &format!("SELECT {} FROM {rel}", cols.join(", "))).await;
                match rows {
                    Ok(text) => {
                        let rows: Vec<Value> = serde_json::from_str(&text).expect("rows");
                        for row in &rows {
                            let ours = row_org(rel, row, acme).unwrap_or_else(|e| panic!("{e}"));
                            assert!(ours, "{}: {rel} shows a row of another org: {row}", p.name);
                        }
                        *seen_rows.entry(rel.clone()).or_default() += rows.len();
                    }
                    // An API key's session refuses a login's own org
                    // (OR002); a lease login is no member (OR002).
                    Err((code, msg)) => assert!(
                        ["42501", "OR002", "OR087"].contains(&code.as_str()),
                        "{}: reading {rel}: {code} {msg}",
                        p.name
                    ),
                }
            }
            if kind == "r" || kind == "p" {
                for sql in [
                    format!("DELETE FROM {rel}"),
                    format!(
                        "UPDATE {rel} SET {c} = {c}",
                        c = cols.first().map_or("x", |s| s)
                    ),
                    format!("INSERT INTO {rel} SELECT * FROM {rel} LIMIT 1"),
                    format!("TRUNCATE {rel}"),
                ] {
                    let code = code_of(&mut c, &sql).await;
                    assert!(
                        code == "42501" || (cols.is_empty() && code == "42703"),
                        "{}: {sql}: {code}",
                        p.name
                    );
                }
            }
        }
        // Sequences: neither read nor moved.
        for (seq, _) in &sequences {
            for sql in [
                format!("SELECT nextval('{seq}')"),
                format!("SELECT setval('{seq}', 1000000)"),
                format!("SELECT last_value FROM {seq}"),
            ] {
                assert_eq!(code_of(&mut c, &sql).await, "42501", "{}: {sql}", p.name);
            }
        }
        // Functions: those it may execute, with globex's ids and names.
        let mine: BTreeSet<String> = sqlx::query_scalar(
            "SELECT replace(p.oid::regprocedure::text, ', ', ',') FROM pg_proc p \
             JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname IN ('orca', 'public') \
               AND has_function_privilege(current_user, p.oid, 'EXECUTE')",
        )
        .fetch_all(&mut c)
        .await
        .expect("executable functions")
        .into_iter()
        .collect();
        for (sig, (expect, calls)) in &cases {
            for call in calls {
                let sql = fill(call);
                let got = answer(&mut c, &sql).await;
                if !mine.contains(*sig) {
                    let code = got.as_ref().err().map(|e| e.0.clone()).unwrap_or_default();
                    assert_eq!(code, "42501", "{}: {sql} without EXECUTE", p.name);
                    continue;
                }
                let Ok(text) = got else { continue };
                for m in &marks {
                    assert!(
                        !text.contains(m.as_str()),
                        "{}: {sql} answered with globex's {m}: {text}",
                        p.name
                    );
                }
                match expect {
                    Expect::NoLeak => {}
                    Expect::NotTrue => assert!(!text.contains("true"), "{}: {sql}: {text}", p.name),
                    Expect::Acme => {
                        let rows: Value = serde_json::from_str(&text).expect("rows");
                        let id = rows[0].as_object().and_then(|o| o.values().next().cloned());
                        assert_eq!(id, Some(json!(acme)), "{}: {sql}: {text}", p.name);
                    }
                }
            }
        }
        assert_eq!(
            org_snapshot(&db, globex).await,
            before,
            "{} changed globex",
            p.name
        );
    }
    // The sweep saw acme's rows: it read something in every table a viewer
    // reads (populate_org fills each).
    let empty: Vec<&String> = tables
        .iter()
        .map(|(r, _)| r)
        .filter(|r| seen_rows.get(*r).copied().unwrap_or(0) == 0)
        .collect();
    assert!(
        empty.is_empty(),
        "relations no principal saw a row of: {empty:?}"
    );
}

/// The bounds docs/security.md gives: (function, argument) -> bytes.
fn documented_bounds() -> BTreeMap<(String, String), usize> {
    let doc = std::fs::read_to_string(repo_root().join("docs/security.md")).expect("security.md");
    let mut out = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `orca.f` | `arg` | 64 KiB |
        if cells.len() != 5 {
            continue;
        }
        let (Some(f), Some(arg)) = (
            cells[1]
                .strip_prefix("`orca.")
                .and_then(|x| x.strip_suffix('`')),
            cells[2].strip_prefix('`').and_then(|x| x.strip_suffix('`')),
        ) else {
            continue;
        };
        let Some((n, unit)) = cells[3].split_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<usize>() else { continue };
        let bytes = match unit {
            "KiB" => n << 10,
            "MiB" => n << 20,
            _ => continue,
        };
        out.insert((f.to_string(), arg.to_string()), bytes);
    }
    out
}

/// A value of `ty` whose size as the bound measures it is `n` bytes.
fn sized(ty: &str, n: usize) -> String {
    match ty {
        "text" => format!("repeat('x', {n})"),
        // {"p": "..."} is 9 bytes around the string.
        "jsonb" => format!("jsonb_build_object('p', repeat('x', {}))", n - 9),
        // An array's size is its elements' bytes and one per element.
        "text[]" => format!("ARRAY[repeat('x', {})]", n - 1),
        other => panic!("no sized value of {other}"),
    }
}

#[tokio::test]
async fn every_text_and_json_input_of_the_api_has_its_documented_bound() {
    let db = TestDb::new().await;
    let bounds = documented_bounds();
    assert!(
        bounds.len() > 50,
        "docs/security.md lists the bounds: {bounds:?}"
    );
    let args: Vec<(String, String, String, i32, Vec<String>)> = sqlx::query_as(
        "SELECT p.proname::text, x.name::text, format_type(x.type, NULL), x.ord::int, \
                (SELECT array_agg(format_type(t, NULL) ORDER BY o) \
                 FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY u(t, o)) \
         FROM pg_proc p \
         CROSS JOIN LATERAL unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]), p.proargnames, \
                                   coalesce(p.proargmodes, array_fill('i'::\"char\", ARRAY[p.pronargs]))) \
              WITH ORDINALITY AS x(type, name, mode, ord) \
         WHERE p.pronamespace = 'orca'::regnamespace AND p.proname !~ '^_' \
           AND x.mode IN ('i', 'b', 'v') \
           AND format_type(x.type, NULL) IN ('text', 'jsonb', 'text[]') \
         ORDER BY 1, 4",
    )
    .fetch_all(&db.pool)
    .await
    .expect("the API's text and json arguments");
    assert!(args.len() > 50, "{args:?}");
    let mut undocumented = Vec::new();
    let mut c = db.connect().await;
    for (f, arg, ty, ord, types) in &args {
        let Some(&bound) = bounds.get(&(f.clone(), arg.clone())) else {
            undocumented.push(format!("orca.{f}({arg})"));
            continue;
        };
        assert!(
            (*ord as usize) <= types.len(),
            "orca.{f}: {arg} is not among its first arguments"
        );
        let call = |value: String| {
            let list: Vec<String> = types
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if i + 1 == *ord as usize {
                        value.clone()
                    } else {
                        format!("NULL::{t}")
                    }
                })
                .collect();
            format!("SELECT orca.{f}({})", list.join(", "))
        };
        let over = call(sized(ty, bound + 1));
        let (code, msg) = expect_error(&mut c, &over).await;
        assert_eq!(code, "OR051", "orca.{f}({arg}) over its bound: {msg}");
        assert!(
            msg.contains(&format!("{arg} is {} bytes", bound + 1)) && msg.len() < 300,
            "orca.{f}: {msg}"
        );
        let at = call(sized(ty, bound));
        if let Err(sqlx::Error::Database(e)) = c.execute(at.as_str()).await {
            assert_ne!(
                e.code().as_deref(),
                Some("OR051"),
                "orca.{f}({arg}) refuses a value of exactly its bound: {}",
                e.message()
            );
        }
    }
    assert!(
        undocumented.is_empty(),
        "text and json arguments without a bound in docs/security.md: {undocumented:?}"
    );
    // And every documented bound is of an argument that exists.
    let real: BTreeSet<(String, String)> = args
        .iter()
        .map(|(f, a, ..)| (f.clone(), a.clone()))
        .collect();
    let stale: Vec<&(String, String)> = bounds.keys().filter(|k| !real.contains(*k)).collect();
    assert!(
        stale.is_empty(),
        "bounds docs/security.md gives of no argument: {stale:?}"
    );
}
