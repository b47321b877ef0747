//! The runner's side of the SQL API: claim, heartbeat, finish, release.

use chrono::{DateTime, Utc};
use orca_core::api::{self, LeaseToken};
use orca_core::sqlstate;
use serde_json::Value;
use sqlx::PgPool;

/// An attempt this runner holds a lease on: a row of `orca.lease`.
pub use orca_core::api::Lease;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The control plane took the lease away (lost, finished elsewhere, or
    /// the run was cancelled): the attempt must stop.
    #[error("lease fenced ({code}): {message}")]
    Fenced { code: String, message: String },
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Malformed(#[from] api::Malformed),
}

impl ControlError {
    fn classify(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(d) = &e {
            if let Some(code) = d.code() {
                if sqlstate::lease_gone(&code) {
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

/// Leases up to `max` attempts of the pool whose command this runner can run.
/// A control plane older than 0.2.0 has no `commands` parameter: this runner
/// then claims as runners did before, whatever the command (until the
/// server is upgraded, which a running runner sees at its next claim).
pub async fn claim(
    db: &PgPool,
    name: &str,
    pool: &str,
    max: i32,
    commands: &[&str],
) -> Result<Vec<Lease>, ControlError> {
    let with_commands =
        sqlx::query_scalar("SELECT to_jsonb(l) FROM orca.claim($1, $2, $3, $4) AS l")
            .bind(name)
            .bind(pool)
            .bind(max)
            .bind(commands)
            .fetch_all(db)
            .await;
    let rows: Vec<Value> = match with_commands {
        Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some(UNDEFINED_FUNCTION) => {
            sqlx::query_scalar("SELECT to_jsonb(l) FROM orca.claim($1, $2, $3) AS l")
                .bind(name)
                .bind(pool)
                .bind(max)
                .fetch_all(db)
                .await
                .map_err(ControlError::classify)?
        }
        other => other.map_err(ControlError::classify)?,
    };
    rows.into_iter()
        .map(|r| api::from_json("orca.lease", r).map_err(ControlError::from))
        .collect()
}

/// PostgreSQL's SQLSTATE for a call no function matches.
const UNDEFINED_FUNCTION: &str = "42883";

pub async fn heartbeat(db: &PgPool, lease: LeaseToken) -> Result<DateTime<Utc>, ControlError> {
    sqlx::query_scalar("SELECT orca.heartbeat($1)")
        .bind(lease.0)
        .fetch_one(db)
        .await
        .map_err(ControlError::classify)
}

/// Reports how a change stream's slot stands on its source server, as the
/// leased attempt's source pump measured it.
pub async fn report_slot(
    db: &PgPool,
    lease: LeaseToken,
    reading: &orca_engine::pump::SlotReading,
) -> Result<(), ControlError> {
    sqlx::query("SELECT orca.report_slot($1, $2)")
        .bind(lease.0)
        .bind(sqlx::types::Json(reading))
        .execute(db)
        .await
        .map(|_| ())
        .map_err(ControlError::classify)
}

/// Ships lines of the leased attempt's log, numbered from `first`.
pub async fn append_log(
    db: &PgPool,
    lease: LeaseToken,
    first: i32,
    lines: &[String],
) -> Result<(), ControlError> {
    // The control plane keeps a line's first 8 KiB (the file has it all):
    // only that much travels.
    let lines: Vec<String> = lines
        .iter()
        .map(|l| orca_core::api::clip(l, orca_core::api::LOG_LINE_MAX).into_owned())
        .collect();
    sqlx::query("SELECT orca.append_log($1, $2, $3)")
        .bind(lease.0)
        .bind(first)
        .bind(&lines)
        .execute(db)
        .await
        .map(|_| ())
        .map_err(ControlError::classify)
}

/// Reports an attempt's end; `killed_for` says why it died when the runner
/// knows (a control plane before 0.3.0 takes the call without it).
pub async fn finish(
    db: &PgPool,
    lease: LeaseToken,
    ok: bool,
    error: Option<&str>,
    killed_for: Option<&str>,
) -> Result<String, ControlError> {
    let error = error.map(|e| orca_core::api::clip(e, orca_core::api::ERROR_TEXT_MAX));
    let with_cause = sqlx::query_scalar("SELECT orca.finish($1, $2, $3, $4)")
        .bind(lease.0)
        .bind(ok)
        .bind(error.as_deref())
        .bind(killed_for)
        .fetch_one(db)
        .await;
    match with_cause {
        Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some(UNDEFINED_FUNCTION) => {
            sqlx::query_scalar("SELECT orca.finish($1, $2, $3)")
                .bind(lease.0)
                .bind(ok)
                .bind(error.as_deref())
                .fetch_one(db)
                .await
                .map_err(ControlError::classify)
        }
        other => other.map_err(ControlError::classify),
    }
}

pub async fn release(db: &PgPool, lease: LeaseToken, reason: &str) -> Result<(), ControlError> {
    sqlx::query("SELECT orca.release($1, $2)")
        .bind(lease.0)
        .bind(orca_core::api::clip(reason, orca_core::api::ERROR_TEXT_MAX))
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
