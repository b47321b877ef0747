//! Test harness: a fresh database with `CREATE EXTENSION orca` per test, on
//! the server named by `ORCA_TEST_URL` (default: the local cluster on 5432).
//!
//! The extension must be installed (`scripts/setup.sh` does it). Each
//! [`TestDb`] drops its database when it goes out of scope.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection, PgPool, Row};

pub mod ballista;
pub mod cluster;
pub mod flink;
pub mod install;
pub mod oci;
pub mod orgs;
pub mod procs;
pub mod releases;
pub mod s3;
pub mod s3proxy;
pub mod serve;
pub mod spark;
pub mod stores;
pub mod wait;

pub use orgs::{org_snapshot, populate_org};
pub use wait::{connect_org, wait_for_sql, wait_until};

pub use sqlx;

/// The repository being tested. Read at run time (cargo sets
/// `CARGO_MANIFEST_DIR` for every test it runs) rather than baked in at
/// compile time: a test binary built in one clone is reused by another that
/// shares the target directory, and must look at its own files.
pub fn repo_root() -> std::path::PathBuf {
    let tests = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    std::path::PathBuf::from(tests).join("..")
}

/// A new scratch directory of a test, under the system's temporary
/// directory (`orca-<name>-<uuid>`).
pub fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("orca-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Where tests keep their scratch directories (the system's temporary
/// directory, symlinks resolved): the default org of every test database
/// may name local paths under it.
pub fn scratch_root() -> String {
    let t = std::env::temp_dir();
    std::fs::canonicalize(&t)
        .unwrap_or(t)
        .to_string_lossy()
        .trim_end_matches('/')
        .to_string()
}

/// The maintenance database URL tests create their databases from.
pub fn base_url() -> String {
    std::env::var("ORCA_TEST_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

fn options_at(base: &str, db: &str, user: &str) -> PgConnectOptions {
    let base: PgConnectOptions = base.parse().unwrap_or_else(|e| {
        panic!("{base} is not a postgres URL: {e}");
    });
    base.database(db).username(user)
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A database of its own with the extension installed.
pub struct TestDb {
    pub name: String,
    pub pool: PgPool,
    /// The maintenance database URL of its server.
    base: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        TestDb::at(&base_url()).await
    }

    /// A test database on another server (a private cluster), from that
    /// server's maintenance database URL.
    pub async fn at(base: &str) -> TestDb {
        let name = format!(
            "orca_t_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst),
            uuid::Uuid::new_v4()
                .simple()
                .to_string()
                .get(..6)
                .unwrap_or("x")
        );
        let mut admin = PgConnection::connect_with(&options_at(base, "postgres", "postgres"))
            .await
            .expect("connect to the maintenance database (is PostgreSQL running?)");
        admin
            .execute(format!("CREATE DATABASE \"{name}\"").as_str())
            .await
            .expect("create test database");
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options_at(base, &name, "postgres"))
            .await
            .expect("connect to test database");
        pool.execute("CREATE EXTENSION orca")
            .await
            .expect("CREATE EXTENSION orca (is the extension installed? run scripts/setup.sh)");
        // Netguard refuses loopback addresses and local paths unless an
        // org's allowlist permits them. The tests' sources and destinations
        // are this machine's cluster and scratch directories, so the default
        // org allows exactly those (written here rather than through
        // orca.allow, which would add an event to every test's outbox).
        // Tests of other orgs allow what they need themselves.
        sqlx::query(
            "INSERT INTO orca.allowlist (org_id, target, kind, note)
             SELECT o.id, t.target, t.kind, 'the test suite: its sources are on this machine'
             FROM orca.orgs o,
                  (VALUES ('127.0.0.1/32', 'network'), ('::1/128', 'network'), ($1, 'path'))
                      AS t(target, kind)
             WHERE o.name = 'default'",
        )
        .bind(scratch_root())
        .execute(&pool)
        .await
        .expect("allow the test suite's loopback and scratch directories");
        TestDb {
            name,
            pool,
            base: base.to_string(),
        }
    }

    /// This database's URL, for processes the test starts.
    pub fn url(&self) -> String {
        let base = &self.base;
        let (head, _) = base.rsplit_once('/').unwrap_or((base, ""));
        format!("{head}/{}", self.name)
    }

    /// A new connection to this database as `user` (which must be able to log in).
    pub async fn connect_as(&self, user: &str) -> PgConnection {
        PgConnection::connect_with(&options_at(&self.base, &self.name, user))
            .await
            .unwrap_or_else(|e| panic!("connect as {user}: {e}"))
    }

    /// A new superuser connection, for tests that need a session of their own.
    pub async fn connect(&self) -> PgConnection {
        self.connect_as("postgres").await
    }

    /// Rows in every table of schema orca: what "nothing was written" compares.
    pub async fn table_counts(&self) -> BTreeMap<String, i64> {
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'orca' ORDER BY 1",
        )
        .fetch_all(&self.pool)
        .await
        .expect("list tables");
        let mut out = BTreeMap::new();
        for t in tables {
            let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM orca.\"{t}\""))
                .fetch_one(&self.pool)
                .await
                .expect("count rows");
            out.insert(t, n);
        }
        out
    }

    pub async fn register(&self, manifest: &Value) -> i64 {
        sqlx::query_scalar("SELECT orca.register($1)")
            .bind(manifest)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("register {manifest}: {e}"))
    }

    pub async fn tick(&self, now: &str) -> Value {
        sqlx::query_scalar("SELECT orca.tick($1::timestamptz)")
            .bind(now)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("tick at {now}: {e}"))
    }

    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub async fn strings(&self, sql: &str) -> Vec<String> {
        sqlx::query_scalar(sql)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        let base = self.base.clone();
        // Drop cannot await; a thread with its own runtime drops the database.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async move {
                    if let Ok(mut c) =
                        PgConnection::connect_with(&options_at(&base, "postgres", "postgres")).await
                    {
                        // A change stream's slot keeps its database (and
                        // the cluster's WAL): its sessions and slots go first.
                        let _ = c
                            .execute(
                                format!(
                                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                     WHERE datname = '{name}' AND pid <> pg_backend_pid();
                                     SELECT pg_drop_replication_slot(slot_name)
                                     FROM pg_replication_slots WHERE database = '{name}'"
                                )
                                .as_str(),
                            )
                            .await;
                        let _ = c
                            .execute(
                                format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)").as_str(),
                            )
                            .await;
                    }
                });
            }
        });
        let _ = done.join();
    }
}

/// The SQLSTATE and message of a statement that must fail.
pub async fn expect_error<'e, E>(executor: E, sql: &str) -> (String, String)
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    match executor.execute(sql).await {
        Ok(_) => panic!("expected an error from: {sql}"),
        Err(sqlx::Error::Database(e)) => (
            e.code().map(|c| c.to_string()).unwrap_or_default(),
            e.message().to_string(),
        ),
        Err(other) => panic!("expected a database error from {sql}, got {other}"),
    }
}

/// Creates a login role if it does not exist yet; roles are cluster-wide and
/// tests run in parallel, so a concurrent creation counts as success.
pub async fn ensure_role(db: &TestDb, role: &str, grants: &[&str]) {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(role)
            .fetch_one(&db.pool)
            .await
            .expect("look up role");
    if !exists {
        if let Err(e) = db
            .pool
            .execute(format!("CREATE ROLE \"{role}\" LOGIN").as_str())
            .await
        {
            let dup = matches!(&e, sqlx::Error::Database(d)
                if matches!(d.code().as_deref(), Some("42710") | Some("23505")));
            assert!(dup, "create role {role}: {e}");
        }
    }
    for g in grants {
        // Repeated grants only raise a notice, but concurrent ones can collide
        // on the catalog row ("tuple concurrently updated"): try again.
        let sql = format!("GRANT {g} TO \"{role}\"");
        let mut tries = 0;
        while let Err(e) = db.pool.execute(sql.as_str()).await {
            tries += 1;
            assert!(tries < 20, "{sql}: {e}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// A monthly manifest like the example, with a name and overrides.
pub fn lake_manifest(name: &str) -> Value {
    serde_json::json!({
        "name": name,
        "steps": [
            {"name": "one", "kind": "mapped"},
            {"name": "two", "kind": "gather", "after": "one", "retries": 2}
        ],
        "partitions": {"monthly": "2024-01"},
        "schedule": {"cron": "0 3 2 * *", "tz": "UTC"},
        "fills": "previous",
        "max_runs": 2,
        "run_retries": 3,
        "catchup": true,
        "registry_hash": "hash-1",
        "binary": format!("/opt/orca/pipelines/{name}")
    })
}

/// A daily manifest with a schedule in a zone, no run cap.
pub fn daily_manifest(name: &str, cron: &str, tz: &str) -> Value {
    serde_json::json!({
        "name": name,
        "steps": [{"name": "load", "kind": "mapped"}],
        "partitions": {"daily": "2020-01-01"},
        "schedule": {"cron": cron, "tz": tz},
        "fills": "previous",
        "registry_hash": "hash-daily",
        "binary": format!("/opt/orca/pipelines/{name}")
    })
}

/// One leased attempt as orca.claim returns it.
#[derive(Debug, Clone)]
pub struct Lease {
    pub attempt: i64,
    pub run: i64,
    pub lease: uuid::Uuid,
    pub partitions: Vec<String>,
    pub number: i32,
}

pub async fn claim<'e, E>(executor: E, runner: &str, max: i32) -> Vec<Lease>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    sqlx::query("SELECT * FROM orca.claim($1, 'default', $2)")
        .bind(runner)
        .bind(max)
        .fetch_all(executor)
        .await
        .unwrap_or_else(|e| panic!("claim: {e}"))
        .iter()
        .map(|r| Lease {
            attempt: r.get("attempt"),
            run: r.get("run"),
            lease: r.get("lease"),
            partitions: r.get("partitions"),
            number: r.get("attempt_number"),
        })
        .collect()
}

/// The changes a source's trigger logged in `public.audit` (op, id,
/// amount), and those a change-data-capture sync's change log `raw.changes`
/// holds after its snapshot (rows above its first `_orca_lsn`), each as
/// "deleted id amount xN": equal when every change landed once. An error
/// while the change log does not exist yet.
pub async fn change_log_sets(pool: &PgPool) -> Result<(Vec<String>, Vec<String>), sqlx::Error> {
    let logged: Vec<String> = sqlx::query_scalar(
        "SELECT format('%s %s %s x%s', d, id, amount, n) FROM (
             SELECT op = 'D' AS d, id, amount, count(*) AS n
             FROM public.audit GROUP BY 1, 2, 3) x ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    let landed: Vec<String> = sqlx::query_scalar(
        "SELECT format('%s %s %s x%s', d, id, amount, n) FROM (
             SELECT _orca_deleted AS d, id,
                    CASE WHEN _orca_deleted THEN NULL ELSE amount END AS amount, count(*) AS n
             FROM raw.changes WHERE _orca_lsn > (SELECT min(_orca_lsn) FROM raw.changes)
             GROUP BY 1, 2, 3) x ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    Ok((logged, landed))
}
