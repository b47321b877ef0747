//! `/runs`: runs with their steps, attempts, tasks and events; cancelling and retrying one.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::events::Event;
use crate::api::extract::{limit, Page, Params, PathOf};
use crate::error::{ApiError, ErrorBody};
use crate::session::Session;
use crate::AppState;

/// This resource's endpoints, each with its OpenAPI operation.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(runs))
        .routes(routes!(run))
        .routes(routes!(cancel))
        .routes(routes!(retry))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Run {
    pub run: i64,
    pub pipeline: String,
    pub version: i64,
    pub partitions: Vec<String>,
    pub trigger: String,
    pub kind: String,
    pub status: String,
    pub parent_run: Option<i64>,
    pub fire_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub failures: i32,
    pub losses: i32,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub duration_s: Option<f64>,
    pub steps_succeeded: i64,
    pub steps_total: i64,
}

const RUN_COLUMNS: &str = "run, pipeline, version::bigint AS version, partitions, trigger, kind, \
    status, parent_run, fire_at, attempts::int AS attempts, failures::int AS failures, \
    losses::int AS losses, error, created_at, started_at, finished_at, \
    extract(epoch FROM duration)::float8 AS duration_s, steps_succeeded, steps_total";

/// Which runs a listing shows, newest first.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunFilter {
    pub pipeline: Option<String>,
    pub status: Option<String>,
    pub trigger: Option<String>,
    /// Runs that cover this partition.
    pub partition: Option<String>,
    /// Runs created at or after this instant (RFC 3339).
    pub since: Option<DateTime<Utc>>,
    /// Runs created before this instant.
    pub until: Option<DateTime<Utc>>,
    /// Runs a page holds (1 to 500, default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
    /// The `next_cursor` of the page before.
    pub cursor: Option<i64>,
}

/// Runs, newest first, a page at a time.
#[utoipa::path(get, path = "/runs", tag = "runs",
    params(RunFilter),
    responses(
        (status = 200, description = "A page of runs", body = Page<Run>),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn runs(mut s: Session, Params(f): Params<RunFilter>) -> Result<Json<Page<Run>>, ApiError> {
    let n = limit(f.limit)?;
    let rows = sqlx::query_as::<_, Run>(&format!(
        "SELECT {RUN_COLUMNS} FROM orca.run_overview \
         WHERE ($1::text IS NULL OR pipeline = $1) AND ($2::text IS NULL OR status = $2) \
           AND ($3::text IS NULL OR trigger = $3) AND ($4::text IS NULL OR $4 = ANY (partitions)) \
           AND ($5::timestamptz IS NULL OR created_at >= $5) \
           AND ($6::timestamptz IS NULL OR created_at < $6) \
           AND ($7::bigint IS NULL OR run < $7) \
         ORDER BY run DESC LIMIT $8"
    ))
    .bind(&f.pipeline)
    .bind(&f.status)
    .bind(&f.trigger)
    .bind(&f.partition)
    .bind(f.since)
    .bind(f.until)
    .bind(f.cursor)
    .bind(n + 1)
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(Page::of(rows, n, |r| r.run)))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct StepState {
    pub step: String,
    pub partition: String,
    pub status: String,
    pub attempts: i32,
    pub error: Option<String>,
    pub updated_at: DateTime<Utc>,
}

/// The tasks a (step, partition) of a run fanned out, one row per task
/// name: how many, in which state, and how long they took.
#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct TaskSummary {
    pub step: String,
    pub partition: String,
    pub task: String,
    pub tasks: i64,
    pub queued: i64,
    pub running: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub cancelled: i64,
    /// Tries that failed and were tried again.
    pub retries: i64,
    pub p50_millis: Option<i32>,
    pub p95_millis: Option<i32>,
    pub p99_millis: Option<i32>,
    pub max_millis: Option<i32>,
}

/// A task that failed after its last try.
#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct TaskFailure {
    pub step: String,
    pub partition: String,
    pub task: String,
    pub index: i32,
    pub tries: i32,
    pub runner: Option<String>,
    pub error: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Attempt {
    pub attempt: i64,
    pub number: i32,
    pub status: String,
    pub pool: String,
    pub runner: Option<String>,
    pub created_at: DateTime<Utc>,
    pub leased_at: Option<DateTime<Utc>>,
    pub heartbeat_at: Option<DateTime<Utc>>,
    pub deadline: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
    /// The memory the attempt got, when its version declares resources.
    pub memory_bytes: Option<i64>,
    /// The CPU it got, in millicores.
    pub cpu_millis: Option<i64>,
    /// `memory` when it was killed for memory (and retried with more).
    pub killed_for: Option<String>,
}

/// A snapshot a run read (pinned for its retries), committed, or was
/// started by (a sensor's).
#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct RunSnapshot {
    /// `read`, `committed` or `started_by`.
    pub role: String,
    pub dataset: String,
    pub snapshot: Option<i64>,
    /// The step and partition (none for what started the run).
    pub step: Option<String>,
    pub partition: Option<String>,
    pub at: DateTime<Utc>,
}

/// Why a run is where it is (`orca.explain`): what holds it, who holds
/// that, since and until when.
#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Reason {
    /// A stable code: finished, restart_backoff, paused, max_runs, starting,
    /// no_live_runner, no_runner_for_command, waiting_for_runner, running,
    /// lease_lapsed, waiting_for_tasks, sensing, lease_reclaimed, handed_back.
    pub code: String,
    pub message: String,
    /// What blocks it: runs, runners, a pool, counts.
    pub blocked_by: Option<serde_json::Value>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: Run,
    /// Why it is not running or not finished (`orca.explain`).
    pub why: Vec<Reason>,
    pub steps: Vec<StepState>,
    /// The tasks its steps fanned out, per (step, partition, task).
    pub tasks: Vec<TaskSummary>,
    /// Its tasks that failed for good (the first 20).
    pub task_failures: Vec<TaskFailure>,
    pub attempt_list: Vec<Attempt>,
    pub events: Vec<Event>,
    pub snapshots: Vec<RunSnapshot>,
}

/// A run with its (step, partition) states, attempts and events.
#[utoipa::path(get, path = "/runs/{id}", tag = "runs",
    params(("id" = i64, Path, description = "The run", example = 1)),
    responses(
        (status = 200, description = "The run", body = RunDetail),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn run(mut s: Session, PathOf(id): PathOf<i64>) -> Result<Json<RunDetail>, ApiError> {
    let run = sqlx::query_as::<_, Run>(&format!(
        "SELECT {RUN_COLUMNS} FROM orca.run_overview WHERE run = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *s.tx)
    .await?
    .ok_or_else(|| ApiError::not_found(format!("no run {id} in org {}", s.who.org)))?;
    let why = sqlx::query_as::<_, Reason>(
        "SELECT code, message, blocked_by, since, until FROM orca.explain($1)",
    )
    .bind(id)
    .fetch_all(&mut *s.tx)
    .await?;
    let steps = sqlx::query_as::<_, StepState>(
        "SELECT step, partition, status, attempts, error, updated_at FROM orca.step_states \
         WHERE run_id = $1 ORDER BY step, partition",
    )
    .bind(id)
    .fetch_all(&mut *s.tx)
    .await?;
    let tasks = sqlx::query_as::<_, TaskSummary>(
        "SELECT step, partition, task, tasks, queued, running, succeeded, failed, cancelled, \
                retries, p50_millis, p95_millis, p99_millis, max_millis \
         FROM orca.task_overview WHERE run = $1 ORDER BY step, partition, task",
    )
    .bind(id)
    .fetch_all(&mut *s.tx)
    .await?;
    let task_failures = sqlx::query_as::<_, TaskFailure>(
        "SELECT step, partition, task, index, try AS tries, runner, error, finished_at \
         FROM orca.tasks WHERE run = $1 AND status = 'failed' \
         ORDER BY finished_at, index LIMIT 20",
    )
    .bind(id)
    .fetch_all(&mut *s.tx)
    .await?;
    let attempt_list = sqlx::query_as::<_, Attempt>(
        "SELECT o.attempt, o.number, o.status, o.pool, o.runner, o.created_at, o.leased_at, \
                o.heartbeat_at, o.deadline, o.finished_at, o.error, \
                (x.resources->>'memory_bytes')::bigint AS memory_bytes, \
                (x.resources->>'cpu_millis')::bigint AS cpu_millis, x.killed_for \
         FROM orca.attempt_overview o JOIN orca.attempts x ON x.id = o.attempt \
         WHERE o.run = $1 ORDER BY o.number",
    )
    .bind(id)
    .fetch_all(&mut *s.tx)
    .await?;
    let events = sqlx::query_as::<_, Event>(
        "SELECT id, at, kind, pipeline, run, attempt, data FROM orca.event_log \
         WHERE run = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(&mut *s.tx)
    .await?;
    let snapshots = sqlx::query_as::<_, RunSnapshot>(
        "SELECT 'started_by' AS role, x.dataset, x.snapshot_id AS snapshot, NULL::text AS step, \
                NULL::text AS partition, x.seen_at AS at \
         FROM orca.sensed x WHERE x.run_id = $1 \
         UNION ALL \
         SELECT 'read', r.dataset, r.snapshot_id, r.step, r.partition, r.pinned_at \
         FROM orca.reads r WHERE r.run_id = $1 \
         UNION ALL \
         SELECT 'committed', c.dataset, c.snapshot_id, c.step, c.partition, c.committed_at \
         FROM orca.commits c WHERE c.run_id = $1 \
         ORDER BY at, role",
    )
    .bind(id)
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(RunDetail {
        run,
        why,
        steps,
        tasks,
        task_failures,
        attempt_list,
        events,
        snapshots,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Changed {
    pub run: i64,
    pub status: String,
}

/// Cancels a run (`orca.cancel`).
#[utoipa::path(post, path = "/runs/{id}/cancel", tag = "runs",
    params(("id" = i64, Path, description = "The run", example = 1)),
    responses(
        (status = 200, description = "The run's status after", body = Changed),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
        (status = 409, description = "The run's state does not allow it", body = ErrorBody),
    ))]
async fn cancel(mut s: Session, PathOf(id): PathOf<i64>) -> Result<Json<Changed>, ApiError> {
    sqlx::query("SELECT orca.cancel($1)")
        .bind(id)
        .execute(&mut *s.tx)
        .await?;
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(id)
        .fetch_one(&mut *s.tx)
        .await?;
    s.commit().await?;
    Ok(Json(Changed { run: id, status }))
}

/// Retries a failed or cancelled run (`orca.retry`).
#[utoipa::path(post, path = "/runs/{id}/retry", tag = "runs",
    params(("id" = i64, Path, description = "The run", example = 1)),
    responses(
        (status = 200, description = "The run queued again", body = Changed),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
        (status = 409, description = "The run's state does not allow it", body = ErrorBody),
    ))]
async fn retry(mut s: Session, PathOf(id): PathOf<i64>) -> Result<Json<Changed>, ApiError> {
    let run: i64 = sqlx::query_scalar("SELECT orca.retry($1)")
        .bind(id)
        .fetch_one(&mut *s.tx)
        .await?;
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&mut *s.tx)
        .await?;
    s.commit().await?;
    Ok(Json(Changed { run, status }))
}
