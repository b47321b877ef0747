//! The runner's side of the SQL API: claim, heartbeat, finish, release.

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use uuid::Uuid;

/// An attempt this runner holds a lease on.
#[derive(Debug, Clone)]
pub struct Lease {
    pub attempt: i64,
    pub run: i64,
    pub lease: Uuid,
    pub pipeline: String,
    pub binary_path: String,
    pub partitions: Vec<String>,
    pub number: i32,
    pub deadline: DateTime<Utc>,
    pub org: String,
    /// `attempt` or `sense`: what to run the pipeline binary with.
    pub command: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The control plane took the lease away (lost, finished elsewhere, or
    /// the run was cancelled): the attempt must stop.
    #[error("lease fenced ({code}): {message}")]
    Fenced { code: String, message: String },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl ControlError {
    fn classify(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(d) = &e {
            if let Some(code) = d.code() {
                if matches!(code.as_ref(), "OR012" | "OR014" | "OR015") {
                    return ControlError::Fenced {
                        code: code.to_string(),
                        message: d.message().to_string(),
                    };
                }
            }
        }
        ControlError::Db(e)
    }
}

pub async fn register_runner(
    db: &PgPool,
    name: &str,
    pool: &str,
    slots: i32,
    host: &str,
) -> Result<(), ControlError> {
    sqlx::query("SELECT orca.register_runner($1, $2, $3, $4)")
        .bind(name)
        .bind(pool)
        .bind(slots)
        .bind(host)
        .execute(db)
        .await
        .map_err(ControlError::classify)?;
    Ok(())
}

pub async fn claim(
    db: &PgPool,
    name: &str,
    pool: &str,
    max: i32,
) -> Result<Vec<Lease>, ControlError> {
    let rows = sqlx::query("SELECT * FROM orca.claim($1, $2, $3)")
        .bind(name)
        .bind(pool)
        .bind(max)
        .fetch_all(db)
        .await
        .map_err(ControlError::classify)?;
    rows.iter()
        .map(|r| {
            Ok(Lease {
                attempt: r.try_get("attempt")?,
                run: r.try_get("run")?,
                lease: r.try_get("lease")?,
                pipeline: r.try_get("pipeline")?,
                binary_path: r.try_get("binary_path")?,
                partitions: r.try_get("partitions")?,
                number: r.try_get("attempt_number")?,
                deadline: r.try_get("deadline")?,
                org: r.try_get("org")?,
                command: r
                    .try_get::<Option<String>, _>("command")?
                    .unwrap_or_else(|| "attempt".to_string()),
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(ControlError::Db)
}

pub async fn heartbeat(db: &PgPool, lease: Uuid) -> Result<DateTime<Utc>, ControlError> {
    sqlx::query_scalar("SELECT orca.heartbeat($1)")
        .bind(lease)
        .fetch_one(db)
        .await
        .map_err(ControlError::classify)
}

pub async fn finish(
    db: &PgPool,
    lease: Uuid,
    ok: bool,
    error: Option<&str>,
) -> Result<String, ControlError> {
    sqlx::query_scalar("SELECT orca.finish($1, $2, $3)")
        .bind(lease)
        .bind(ok)
        .bind(error)
        .fetch_one(db)
        .await
        .map_err(ControlError::classify)
}

pub async fn release(db: &PgPool, lease: Uuid, reason: &str) -> Result<(), ControlError> {
    sqlx::query("SELECT orca.release($1, $2)")
        .bind(lease)
        .bind(reason)
        .execute(db)
        .await
        .map_err(ControlError::classify)?;
    Ok(())
}

pub async fn tick(db: &PgPool) -> Result<(), ControlError> {
    sqlx::query("SELECT orca.tick()")
        .execute(db)
        .await
        .map_err(ControlError::classify)?;
    Ok(())
}
