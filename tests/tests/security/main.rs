//! The trust boundary around the SQL API, tried as an attacker would: with
//! ordinary logins (never admins) and, where the attack goes through them,
//! real runner and pipeline processes. Each attempt is refused with its
//! SQLSTATE and changes nothing. docs/security.md is the model.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use orca_tests::procs::{bin, outputs, sync_runner_with, Runner};
use orca_tests::sqlx::{self, Executor, PgConnection};
use orca_tests::*;
use serde_json::{json, Value};

mod api_keys;
mod catalog;
mod http_sweep;
mod lake_reads;
mod limits;
mod maintenance;
mod netguard;
mod pinned;
mod secrets;
mod sweep;
mod tls;
mod tokens;

/// A login that is in orca_runner and nothing else: no org membership.
const RUNNER_LOGIN: &str = "orca_t_sec_runner";

/// A login with what a lease allows only (a runner's children).
const ATTEMPT_LOGIN: &str = "orca_t_sec_attempt";

/// An operator of org acme.
const OPERATOR: &str = "orca_t_sec_operator";

/// A viewer of org acme.
const VIEWER: &str = "orca_t_sec_viewer";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "orca-security-{name}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

async fn code_of(c: &mut PgConnection, sql: &str) -> String {
    expect_error(&mut *c, sql).await.0
}

/// A session of the runner login presenting `token`.
async fn runner_session(db: &TestDb, token: &str) -> PgConnection {
    let mut c = db.connect_as(RUNNER_LOGIN).await;
    sqlx::query("SELECT set_config('orca.runner_token', $1, false)")
        .bind(token)
        .execute(&mut c)
        .await
        .expect("present the token");
    c
}

async fn roles(db: &TestDb) {
    ensure_role(db, RUNNER_LOGIN, &["orca_runner"]).await;
    ensure_role(db, ATTEMPT_LOGIN, &["orca_attempt"]).await;
    ensure_role(db, OPERATOR, &["orca_operator"]).await;
    ensure_role(db, VIEWER, &["orca_viewer"]).await;
}

/// Two orgs with a backfill queued in each: acme and globex.
async fn two_orgs(db: &TestDb) {
    for org in ["acme", "globex"] {
        sqlx::query("SELECT orca.create_org($1)")
            .bind(org)
            .execute(&db.pool)
            .await
            .expect("org");
        let mut c = connect_org(db, "postgres", org).await;
        let mut m = lake_manifest("lake");
        m["max_runs"] = json!(null);
        sqlx::query("SELECT orca.register($1)")
            .bind(&m)
            .execute(&mut c)
            .await
            .expect("register");
        c.execute("SELECT orca.backfill('lake', '2024-01..2024-06')")
            .await
            .expect("backfill");
    }
    db.pool
        .execute(
            format!(
                "SELECT orca.add_member('acme', '{OPERATOR}'), orca.add_member('acme', '{VIEWER}')"
            )
            .as_str(),
        )
        .await
        .expect("members");
}

async fn token(db: &TestDb, org: &str, pool: &str, name: &str) -> String {
    let mut c = connect_org(db, OPERATOR, "acme").await;
    if org != "acme" {
        c = connect_org(db, "postgres", org).await;
    }
    sqlx::query_scalar("SELECT orca.create_runner_token($1, $2)")
        .bind(pool)
        .bind(name)
        .fetch_one(&mut c)
        .await
        .expect("create a runner token")
}

async fn claim_leases(c: &mut PgConnection, runner: &str, max: i32) -> Vec<(uuid::Uuid, String)> {
    sqlx::query_as("SELECT lease, org FROM orca.claim($1, 'default', $2)")
        .bind(runner)
        .bind(max)
        .fetch_all(c)
        .await
        .expect("claim")
}

fn register(db: &TestDb, binary: &std::path::Path) {
    let out = Command::new(bin("orca"))
        .arg("register")
        .arg(binary)
        .env("DATABASE_URL", db.url())
        .output()
        .expect("run orca");
    assert!(
        out.status.success(),
        "orca register: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The environment of the process that was given this lease, if one runs.
fn child_with_lease(lease: &uuid::Uuid) -> Option<String> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let environ = String::from_utf8_lossy(&environ).replace('\0', "\n");
            environ
                .lines()
                .any(|l| l == format!("ORCA_LEASE={lease}"))
                .then_some(environ)
        })
}

fn url_as(db: &TestDb, user: &str) -> String {
    db.url().replacen("postgres@", &format!("{user}@"), 1)
}

/// Runs ALTER SYSTEM (which no transaction block may hold) and reloads.
async fn alter_system(c: &mut PgConnection, setting: &str) {
    c.execute(format!("ALTER SYSTEM {setting}").as_str())
        .await
        .unwrap_or_else(|e| panic!("ALTER SYSTEM {setting}: {e}"));
    c.execute("SELECT pg_reload_conf()").await.expect("reload");
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// The catalog names (orgs) a session sees rows of, by `sql`.
async fn seen(c: &mut PgConnection, sql: &str) -> String {
    sqlx::query_scalar(sql)
        .fetch_one(c)
        .await
        .expect("read the catalog")
}

/// PyIceberg as org `catalog`.
fn py_as(catalog: &str, args: &[&str]) -> Value {
    let out = Command::new(orca_tests::s3::python())
        .arg(repo_root().join("tests/py/iceberg.py"))
        .args(args)
        .env("ORCA_TEST_CATALOG", catalog)
        .output()
        .expect("run PyIceberg");
    assert!(
        out.status.success(),
        "pyiceberg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("pyiceberg JSON")
}

/// Points `thief`'s catalog entry `namespace.table` at `owner`'s only
/// table's metadata, as an attempt of `thief` may write its org's catalog
/// rows as it likes.
async fn point_catalog_at(db: &TestDb, owner: &str, thief: &str, namespace: &str, table: &str) {
    let metadata: String = sqlx::query_scalar(
        "SELECT metadata_location FROM public.iceberg_tables WHERE catalog_name = $1",
    )
    .bind(owner)
    .fetch_one(&db.pool)
    .await
    .expect("the owner's table");
    sqlx::query(
        "INSERT INTO public.iceberg_namespace_properties VALUES ($1, $2, 'exists', 'true')",
    )
    .bind(thief)
    .bind(namespace)
    .execute(&db.pool)
    .await
    .expect("namespace");
    sqlx::query(
        "INSERT INTO public.iceberg_tables (catalog_name, table_namespace, table_name, \
         metadata_location, iceberg_type) VALUES ($1, $2, $3, $4, 'TABLE')",
    )
    .bind(thief)
    .bind(namespace)
    .bind(table)
    .bind(&metadata)
    .execute(&db.pool)
    .await
    .expect("the thief's row");
}
