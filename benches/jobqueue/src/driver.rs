//! The producer's side of Orca: the `jobqueue` pipeline that declares the
//! job task, and the step attempt (the driver) whose lease adds tasks.

use std::time::Duration;

use anyhow::{Context, Result};
use sqlx::{Executor, PgConnection, PgPool};

/// The pipeline the jobs belong to: one mapped step that fans out `job`
/// tasks (3 retries, as the SDK's default).
const PIPELINE: &str = "jobqueue";
pub const STEP: &str = "fan";
pub const PARTITION: &str = "1000-01-01";
pub const TASK: &str = "job";

/// Creates the extension and registers the pipeline (both idempotent, so
/// replicas starting together or again agree); returns the extension's
/// version for the descriptor.
pub async fn install(c: &mut PgConnection) -> Result<String> {
    // Two replicas creating the extension at once: one waits on the other's
    // lock, then finds it made.
    for tries in 0.. {
        match c.execute("CREATE EXTENSION IF NOT EXISTS orca").await {
            Ok(_) => break,
            Err(e) if tries < 5 => {
                eprintln!("orca-adapter: CREATE EXTENSION: {e}; again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).context("CREATE EXTENSION orca"),
        }
    }
    let manifest = serde_json::json!({
        "name": PIPELINE,
        "steps": [{"name": STEP, "kind": "mapped"}],
        "partitions": {"daily": PARTITION},
        "tasks": [{"name": TASK, "retries": 3, "backoff_ms": 100}],
        "registry_hash": "jobqueue-adapter",
        "binary": "/bin/true"
    });
    for tries in 0.. {
        match sqlx::query("SELECT orca.register($1)")
            .bind(&manifest)
            .execute(&mut *c)
            .await
        {
            Ok(_) => break,
            Err(e) if tries < 5 => {
                eprintln!("orca-adapter: orca.register: {e}; again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e).context("orca.register"),
        }
    }
    sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'orca'")
        .fetch_one(&mut *c)
        .await
        .context("the extension's version")
}

/// A lease of a step attempt: what `orca.add_tasks` is called with.
pub struct Driver {
    pub lease: uuid::Uuid,
    /// The submission index of the next task of this attempt.
    pub next: i64,
}

/// Queues a run of the pipeline and claims its attempt, as a runner would
/// (the lease lasts the pool's `orca.lease_seconds`).
pub async fn acquire(pool: &PgPool) -> Result<Driver> {
    let run: i64 = sqlx::query_scalar("SELECT orca.run($1, $2)")
        .bind(PIPELINE)
        .bind(PARTITION)
        .fetch_one(pool)
        .await
        .context("orca.run")?;
    // Claiming takes the oldest queued attempt, perhaps another replica's:
    // any is a driver.
    let lease: Option<uuid::Uuid> =
        sqlx::query_scalar("SELECT lease FROM orca.claim($1, 'default', 1)")
            .bind(format!("jobqueue-driver-{}", std::process::id()))
            .fetch_optional(pool)
            .await
            .context("orca.claim")?;
    let lease = lease.with_context(|| format!("run {run} queued, but nothing was claimed"))?;
    eprintln!("orca-adapter: producing as lease {lease} (run {run} queued)");
    Ok(Driver { lease, next: 0 })
}

/// Extends the driver's lease; an error means it is gone.
pub async fn heartbeat(pool: &PgPool, d: &Driver) -> Result<()> {
    sqlx::query("SELECT orca.heartbeat($1)")
        .bind(d.lease)
        .execute(pool)
        .await
        .map(|_| ())
        .context("orca.heartbeat")
}

/// Whether an error means the lease is no longer the driver's (the attempt
/// ended): a new driver is needed, not a retry.
pub fn lease_lost(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<sqlx::Error>()
            .and_then(|e| e.as_database_error())
            .and_then(|d| d.code())
            .is_some_and(|code| matches!(code.as_ref(), "OR012" | "OR014" | "OR015"))
    })
}
