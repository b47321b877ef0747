//! `/api/v1`: the control plane's rows as JSON, and its calls. Each handler
//! runs in its caller's [`Session`], so what it reads and may call is what
//! the caller's key allows; handlers only shape queries and answers.

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;

use crate::error::ApiError;
use crate::session::{Session, Whoami};
use crate::AppState;

/// A JSON body; one that does not parse is a 400 with the JSON error body
/// every other failure has.
pub struct Body<T>(pub T);

impl<S, T> FromRequest<S> for Body<T>
where
    Json<T>: FromRequest<S, Rejection = axum::extract::rejection::JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// Query parameters, refused the same way.
pub struct Params<T>(pub T);

impl<S, T> FromRequestParts<S> for Params<T>
where
    Query<T>: FromRequestParts<S, Rejection = axum::extract::rejection::QueryRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(Params(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// A page of a listing is at most this long, whatever the caller asks.
pub const PAGE_MAX: i64 = 500;
const PAGE_DEFAULT: i64 = 50;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/session", get(whoami))
        .route("/pipelines", get(pipelines))
        .route("/pipelines/{name}", get(pipeline))
        .route("/pipelines/{name}/runs", post(run_pipeline))
        .route("/pipelines/{name}/backfill", post(backfill))
        .route("/runs", get(runs))
        .route("/runs/{id}", get(run))
        .route("/runs/{id}/cancel", post(cancel))
        .route("/runs/{id}/retry", post(retry))
        .route("/syncs", get(syncs))
        .route("/events", get(events))
        .route("/runners", get(runners))
}

async fn whoami(s: Session) -> Json<Whoami> {
    Json(s.who.clone())
}

/// A page of rows and where the next one starts.
#[derive(Debug, Serialize)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<i64>,
}

fn limit(asked: Option<i64>) -> Result<i64, ApiError> {
    match asked {
        None => Ok(PAGE_DEFAULT),
        Some(n) if (1..=PAGE_MAX).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit must be from 1 to {PAGE_MAX}, got {n}"
        ))),
    }
}

// --- Pipelines --------------------------------------------------------------

#[derive(Debug, Serialize, FromRow)]
pub struct Pipeline {
    pub pipeline: String,
    pub version: i64,
    pub registry_hash: String,
    pub partition_kind: String,
    pub cron: Option<String>,
    pub tz: Option<String>,
    pub paused: bool,
    pub max_runs: Option<i32>,
    pub commit: Option<String>,
    pub registered_at: DateTime<Utc>,
    pub queued: i64,
    pub running: i64,
    pub last_finished_at: Option<DateTime<Utc>>,
}

const PIPELINE_COLUMNS: &str = "pipeline, version::bigint AS version, registry_hash, \
    partition_kind, cron, tz, paused, max_runs::int AS max_runs, commit, registered_at, \
    queued, running, last_finished_at";

async fn pipelines(mut s: Session) -> Result<Json<Vec<Pipeline>>, ApiError> {
    let rows = sqlx::query_as::<_, Pipeline>(&format!(
        "SELECT {PIPELINE_COLUMNS} FROM orca.pipeline_overview ORDER BY pipeline"
    ))
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(rows))
}

#[derive(Debug, Serialize, FromRow)]
pub struct Version {
    pub version: i64,
    pub registry_hash: String,
    pub source: Option<String>,
    pub commit: Option<String>,
    pub dirty: Option<bool>,
    pub image: Option<String>,
    pub binary_sha256: Option<String>,
    pub registered_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, FromRow)]
pub struct Fire {
    pub fire_at: DateTime<Utc>,
    pub partition: String,
}

#[derive(Debug, Serialize)]
pub struct PipelineDetail {
    #[serde(flatten)]
    pub pipeline: Pipeline,
    pub versions: Vec<Version>,
    /// The schedule's next fires (none for an unscheduled pipeline).
    pub next_fires: Vec<Fire>,
}

async fn pipeline(
    mut s: Session,
    Path(name): Path<String>,
) -> Result<Json<PipelineDetail>, ApiError> {
    let pipeline = sqlx::query_as::<_, Pipeline>(&format!(
        "SELECT {PIPELINE_COLUMNS} FROM orca.pipeline_overview WHERE pipeline = $1"
    ))
    .bind(&name)
    .fetch_optional(&mut *s.tx)
    .await?
    .ok_or_else(|| ApiError::not_found(format!("no pipeline {name:?} in org {}", s.who.org)))?;
    let versions = sqlx::query_as::<_, Version>(
        "SELECT v.version::bigint AS version, v.registry_hash, v.source, v.commit, v.dirty, \
                v.image, v.binary_sha256, v.registered_at \
         FROM orca.pipeline_versions v JOIN orca.pipelines p ON p.id = v.pipeline_id \
         WHERE p.name = $1 ORDER BY v.version DESC",
    )
    .bind(&name)
    .fetch_all(&mut *s.tx)
    .await?;
    let next_fires = if pipeline.cron.is_some() {
        sqlx::query_as::<_, Fire>("SELECT fire_at, partition FROM orca.fires($1, 5)")
            .bind(&name)
            .fetch_all(&mut *s.tx)
            .await?
    } else {
        Vec::new()
    };
    Ok(Json(PipelineDetail {
        pipeline,
        versions,
        next_fires,
    }))
}

#[derive(Debug, Deserialize)]
pub struct Partitions {
    /// One partition, a comma list, a range (`2024-01..2024-06`) or `@all`.
    pub partitions: String,
}

#[derive(Debug, Serialize)]
pub struct Queued {
    pub runs: Vec<i64>,
}

async fn run_pipeline(
    mut s: Session,
    Path(name): Path<String>,
    Body(body): Body<Partitions>,
) -> Result<Json<Queued>, ApiError> {
    let run: i64 = sqlx::query_scalar("SELECT orca.run($1, $2)")
        .bind(&name)
        .bind(&body.partitions)
        .fetch_one(&mut *s.tx)
        .await?;
    s.commit().await?;
    Ok(Json(Queued { runs: vec![run] }))
}

async fn backfill(
    mut s: Session,
    Path(name): Path<String>,
    Body(body): Body<Partitions>,
) -> Result<Json<Queued>, ApiError> {
    let runs: Vec<i64> = sqlx::query_scalar("SELECT * FROM orca.backfill($1, $2)")
        .bind(&name)
        .bind(&body.partitions)
        .fetch_all(&mut *s.tx)
        .await?;
    s.commit().await?;
    Ok(Json(Queued { runs }))
}

// --- Runs ---------------------------------------------------------------------

#[derive(Debug, Serialize, FromRow)]
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
#[derive(Debug, Deserialize)]
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
    pub limit: Option<i64>,
    /// The `next_cursor` of the page before.
    pub cursor: Option<i64>,
}

async fn runs(mut s: Session, Params(f): Params<RunFilter>) -> Result<Json<Page<Run>>, ApiError> {
    let n = limit(f.limit)?;
    let mut rows = sqlx::query_as::<_, Run>(&format!(
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
    let more = rows.len() as i64 > n;
    rows.truncate(n as usize);
    let next_cursor = more.then(|| rows.last().map(|r| r.run)).flatten();
    Ok(Json(Page {
        items: rows,
        next_cursor,
    }))
}

#[derive(Debug, Serialize, FromRow)]
pub struct StepState {
    pub step: String,
    pub partition: String,
    pub status: String,
    pub attempts: i32,
    pub error: Option<String>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, FromRow)]
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
}

#[derive(Debug, Serialize, FromRow)]
pub struct Event {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub pipeline: Option<String>,
    pub run: Option<i64>,
    pub attempt: Option<i64>,
    pub data: serde_json::Value,
}

#[derive(Debug, Serialize)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: Run,
    pub steps: Vec<StepState>,
    pub attempt_list: Vec<Attempt>,
    pub events: Vec<Event>,
}

async fn run(mut s: Session, Path(id): Path<i64>) -> Result<Json<RunDetail>, ApiError> {
    let run = sqlx::query_as::<_, Run>(&format!(
        "SELECT {RUN_COLUMNS} FROM orca.run_overview WHERE run = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *s.tx)
    .await?
    .ok_or_else(|| ApiError::not_found(format!("no run {id} in org {}", s.who.org)))?;
    let steps = sqlx::query_as::<_, StepState>(
        "SELECT step, partition, status, attempts, error, updated_at FROM orca.step_states \
         WHERE run_id = $1 ORDER BY step, partition",
    )
    .bind(id)
    .fetch_all(&mut *s.tx)
    .await?;
    let attempt_list = sqlx::query_as::<_, Attempt>(
        "SELECT attempt, number, status, pool, runner, created_at, leased_at, heartbeat_at, \
                deadline, finished_at, error \
         FROM orca.attempt_overview WHERE run = $1 ORDER BY number",
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
    Ok(Json(RunDetail {
        run,
        steps,
        attempt_list,
        events,
    }))
}

#[derive(Debug, Serialize)]
pub struct Changed {
    pub run: i64,
    pub status: String,
}

async fn cancel(mut s: Session, Path(id): Path<i64>) -> Result<Json<Changed>, ApiError> {
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

async fn retry(mut s: Session, Path(id): Path<i64>) -> Result<Json<Changed>, ApiError> {
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

// --- Syncs, events, runners -----------------------------------------------------

#[derive(Debug, Serialize, FromRow)]
pub struct SyncRow {
    pub sync: String,
    pub delivery: String,
    pub source: Option<String>,
    pub destination: Option<String>,
    pub streams: Option<i32>,
    pub schedule: Option<String>,
    pub pool: Option<String>,
    pub generation: i32,
    pub head_epoch: i64,
    pub head_at: Option<DateTime<Utc>>,
    pub last_run: Option<i64>,
    pub last_status: Option<String>,
    pub last_finished_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub queued: i64,
    pub running: i64,
}

async fn syncs(mut s: Session) -> Result<Json<Vec<SyncRow>>, ApiError> {
    let rows = sqlx::query_as::<_, SyncRow>(
        "SELECT sync, delivery, source, destination, streams, schedule, pool, generation, \
                head_epoch, head_at, last_run, last_status, last_finished_at, last_error, \
                queued, running \
         FROM orca.sync_overview ORDER BY sync",
    )
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(rows))
}

#[derive(Debug, Deserialize)]
pub struct EventFilter {
    /// Events after this id (the last one seen), oldest first.
    pub after: Option<i64>,
    pub kind: Option<String>,
    pub limit: Option<i64>,
}

async fn events(
    mut s: Session,
    Params(f): Params<EventFilter>,
) -> Result<Json<Page<Event>>, ApiError> {
    let n = limit(f.limit)?;
    let mut rows = sqlx::query_as::<_, Event>(
        "SELECT id, at, kind, pipeline, run, attempt, data FROM orca.event_log \
         WHERE ($1::bigint IS NULL OR id > $1) AND ($2::text IS NULL OR kind = $2) \
         ORDER BY id LIMIT $3",
    )
    .bind(f.after)
    .bind(&f.kind)
    .bind(n + 1)
    .fetch_all(&mut *s.tx)
    .await?;
    let more = rows.len() as i64 > n;
    rows.truncate(n as usize);
    let next_cursor = more.then(|| rows.last().map(|e| e.id)).flatten();
    Ok(Json(Page {
        items: rows,
        next_cursor,
    }))
}

#[derive(Debug, Serialize, FromRow)]
pub struct Runner {
    pub name: String,
    pub host: Option<String>,
    pub pool: String,
    pub slots: Option<i32>,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

async fn runners(mut s: Session) -> Result<Json<Vec<Runner>>, ApiError> {
    let rows = sqlx::query_as::<_, Runner>(
        "SELECT name, host, pool, slots, first_seen, last_seen FROM orca.runners ORDER BY name",
    )
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(rows))
}
