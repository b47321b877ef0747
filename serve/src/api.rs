//! `/api/v1`: the control plane's rows as JSON, and its calls. Each handler
//! runs in its caller's [`Session`], so what it reads and may call is what
//! the caller's key allows; handlers only shape queries and answers.

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
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

/// Path parameters, refused the same way (a run id that is not a number is a
/// 400 with a JSON body, not axum's plain-text one).
pub struct PathOf<T>(pub T);

impl<S, T> FromRequestParts<S> for PathOf<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(PathOf(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// A page of a listing is at most this long, whatever the caller asks.
pub const PAGE_MAX: i64 = 500;
pub const PAGE_DEFAULT: i64 = 50;

/// The endpoints under `/api/v1` but the logs' ([`crate::logs::routes`]),
/// each with its OpenAPI operation: the document at
/// `/api/v1/openapi.json` is made from these, so it cannot drift from what
/// is served.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(whoami, login, logout))
        .routes(routes!(pipelines))
        .routes(routes!(pipeline))
        .routes(routes!(run_pipeline))
        .routes(routes!(backfill))
        .routes(routes!(runs))
        .routes(routes!(run))
        .routes(routes!(cancel))
        .routes(routes!(retry))
        .routes(routes!(syncs))
        .routes(routes!(events))
        .routes(routes!(runners))
        .routes(routes!(datasets))
        .routes(routes!(dataset))
        .routes(routes!(lineage_graph))
        .routes(routes!(sensors))
        .routes(routes!(webhooks))
        .routes(routes!(sync_epochs))
        .routes(routes!(pause_sync))
        .routes(routes!(resume_sync))
        .routes(routes!(scale_sync))
        .routes(routes!(webhook_deliveries))
        .routes(routes!(incidents))
        .routes(routes!(incident))
        .routes(routes!(resolve_incident))
}

/// The key's org, role and name.
#[utoipa::path(get, path = "/session", tag = "session",
    responses(
        (status = 200, description = "Who is calling", body = Whoami),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn whoami(s: Session) -> Json<Whoami> {
    Json(s.who.clone())
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Login {
    /// An API key of the org (`orca_ak_...`).
    pub key: String,
}

/// Starts a console session: checks the key and keeps it in an HttpOnly,
/// SameSite=Strict cookie, with a CSRF token cookie that writes send back
/// in `X-CSRF-Token`. Revoking the key ends every session made with it.
#[utoipa::path(post, path = "/session", tag = "session", security(()),
    request_body = Login,
    responses(
        (status = 200, description = "The session started (Set-Cookie)", body = Whoami),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "The key was refused", body = ErrorBody),
    ))]
async fn login(
    axum::extract::State(state): axum::extract::State<AppState>,
    Body(body): Body<Login>,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    let key = body.key.trim().to_string();
    if key.is_empty()
        || key.len() > 256
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.+/=".contains(c))
    {
        return Err(ApiError::unauthorized(
            "the key is empty, too long or not a key",
        ));
    }
    let s = crate::session::open(&state, &key).await?;
    let who = s.who.clone();
    drop(s);
    let csrf = uuid::Uuid::new_v4().simple().to_string();
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    let cookies = [
        (
            axum::http::header::SET_COOKIE,
            format!(
                "{}={key}; Path=/; HttpOnly; SameSite=Strict{secure}",
                crate::session::KEY_COOKIE
            ),
        ),
        (
            axum::http::header::SET_COOKIE,
            format!(
                "{}={csrf}; Path=/; SameSite=Strict{secure}",
                crate::session::CSRF_COOKIE
            ),
        ),
    ];
    Ok((axum::response::AppendHeaders(cookies), Json(who)))
}

/// Ends the console session (clears its cookies).
#[utoipa::path(delete, path = "/session", tag = "session", security(()),
    responses((status = 204, description = "The cookies are cleared")))]
async fn logout() -> impl axum::response::IntoResponse {
    let gone = |name: &str| format!("{name}=; Path=/; Max-Age=0; SameSite=Strict");
    (
        axum::http::StatusCode::NO_CONTENT,
        axum::response::AppendHeaders([
            (
                axum::http::header::SET_COOKIE,
                gone(crate::session::KEY_COOKIE),
            ),
            (
                axum::http::header::SET_COOKIE,
                gone(crate::session::CSRF_COOKIE),
            ),
        ]),
    )
}

/// A page of rows and where the next one starts.
#[derive(Debug, Serialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<i64>,
}

impl<T> Page<T> {
    /// A page of at most `n` rows from a query that asked for `n + 1`: the
    /// extra row, if it came, says there is a next page, which starts after
    /// the last row kept.
    pub fn of(mut rows: Vec<T>, n: i64, cursor: impl Fn(&T) -> i64) -> Page<T> {
        let n = usize::try_from(n).unwrap_or(0);
        let more = rows.len() > n;
        rows.truncate(n);
        let next_cursor = if more { rows.last().map(cursor) } else { None };
        Page {
            items: rows,
            next_cursor,
        }
    }
}

pub fn limit(asked: Option<i64>) -> Result<i64, ApiError> {
    match asked {
        None => Ok(PAGE_DEFAULT),
        Some(n) if (1..=PAGE_MAX).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit must be from 1 to {PAGE_MAX}, got {n}"
        ))),
    }
}

// --- Pipelines --------------------------------------------------------------

#[derive(Debug, Serialize, FromRow, ToSchema)]
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

/// The org's pipelines.
#[utoipa::path(get, path = "/pipelines", tag = "pipelines",
    responses(
        (status = 200, description = "Every pipeline, by name", body = Vec<Pipeline>),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn pipelines(mut s: Session) -> Result<Json<Vec<Pipeline>>, ApiError> {
    let rows = sqlx::query_as::<_, Pipeline>(&format!(
        "SELECT {PIPELINE_COLUMNS} FROM orca.pipeline_overview ORDER BY pipeline"
    ))
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(rows))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Version {
    pub version: i64,
    pub registry_hash: String,
    pub source: Option<String>,
    pub commit: Option<String>,
    pub dirty: Option<bool>,
    pub image: Option<String>,
    pub binary_sha256: Option<String>,
    pub registered_at: DateTime<Utc>,
    /// Where the pipeline and each step are in the source (`orca locate`):
    /// `{"pipeline": {"file", "line"}, "steps": {"<step>": {"file", "line"}}}`.
    pub locations: Option<serde_json::Value>,
    /// The kept runs of this version, by status, and the newest.
    pub runs: serde_json::Value,
    pub last_run: Option<i64>,
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Fire {
    pub fire_at: DateTime<Utc>,
    pub partition: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineDetail {
    #[serde(flatten)]
    pub pipeline: Pipeline,
    pub versions: Vec<Version>,
    /// The schedule's next fires (none for an unscheduled pipeline).
    pub next_fires: Vec<Fire>,
}

/// One pipeline with its versions and next fires.
#[utoipa::path(get, path = "/pipelines/{name}", tag = "pipelines",
    params(("name" = String, Path, description = "The pipeline", example = "lake")),
    responses(
        (status = 200, description = "The pipeline", body = PipelineDetail),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn pipeline(
    mut s: Session,
    PathOf(name): PathOf<String>,
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
                v.image, v.binary_sha256, v.registered_at, v.manifest -> 'locations' AS locations, \
                (SELECT coalesce(jsonb_object_agg(x.status, x.n), '{}') FROM \
                    (SELECT r.status, count(*) AS n FROM orca.runs r WHERE r.version_id = v.id \
                     GROUP BY r.status) x) AS runs, \
                (SELECT max(r.id) FROM orca.runs r WHERE r.version_id = v.id) AS last_run \
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

#[derive(Debug, Deserialize, ToSchema)]
pub struct Partitions {
    /// One partition, a comma list, a range (`2024-01..2024-06`) or `@all`.
    #[schema(example = "2024-03")]
    pub partitions: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Queued {
    pub runs: Vec<i64>,
}

/// Queues one run over the partitions (`orca.run`).
#[utoipa::path(post, path = "/pipelines/{name}/runs", tag = "runs",
    params(("name" = String, Path, description = "The pipeline", example = "lake")),
    request_body = Partitions,
    responses(
        (status = 200, description = "The run queued", body = Queued),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn run_pipeline(
    mut s: Session,
    PathOf(name): PathOf<String>,
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

/// Queues a run per partition (`orca.backfill`).
#[utoipa::path(post, path = "/pipelines/{name}/backfill", tag = "runs",
    params(("name" = String, Path, description = "The pipeline", example = "lake")),
    request_body = Partitions,
    responses(
        (status = 200, description = "The runs queued", body = Queued),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn backfill(
    mut s: Session,
    PathOf(name): PathOf<String>,
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

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Event {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub pipeline: Option<String>,
    pub run: Option<i64>,
    pub attempt: Option<i64>,
    pub data: serde_json::Value,
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

// --- Syncs, events, runners -----------------------------------------------------

#[derive(Debug, Serialize, FromRow, ToSchema)]
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
    /// Each stream's write mode and the delivery level it keeps.
    #[schema(value_type = Vec<StreamDelivery>)]
    pub stream_levels: sqlx::types::Json<Vec<StreamDelivery>>,
    /// Rows the last recorded epoch moved, and the quarantined and held
    /// files of the kept epochs (`orca.sync_epochs`).
    pub last_epoch_rows: Option<i64>,
    pub quarantined: i64,
    pub held: i64,
    /// A `postgres_cdc` sync's replication slot (`orca.cdc_slots`): its
    /// name, WAL since its confirmed position, seconds since HEAD moved
    /// while behind, and whether nothing will read it unless someone acts.
    /// Null for other sources; for a slot on another server, what its
    /// runner last reported from there (null before a first report).
    pub slot: Option<String>,
    pub slot_lag_bytes: Option<i64>,
    pub slot_lag_seconds: Option<i64>,
    pub slot_held_back: Option<bool>,
    /// The destination's writer lanes (`orca.scale_sync`; null: one).
    pub lanes: Option<i32>,
    /// How the source differs from the catalog version the streams were
    /// planned from, as the last attempt found it (`orca.report_drift`).
    #[schema(value_type = Option<Vec<Object>>)]
    pub drift: Option<sqlx::types::Json<serde_json::Value>>,
    /// Whether the sync's schedule (or continuous run) is paused.
    pub paused: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StreamDelivery {
    pub stream: String,
    /// `at_least_once`, `effectively_once` or `exactly_once`.
    pub delivery: Option<String>,
    /// `append`, `merge` or `overwrite`.
    pub mode: Option<String>,
}

/// The org's syncs with their HEADs.
#[utoipa::path(get, path = "/syncs", tag = "syncs",
    responses(
        (status = 200, description = "Every sync, by name", body = Vec<SyncRow>),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn syncs(mut s: Session) -> Result<Json<Vec<SyncRow>>, ApiError> {
    let rows = sqlx::query_as::<_, SyncRow>(
        "SELECT o.sync, o.delivery, o.source, o.destination, o.streams, o.schedule, o.pool, \
                o.generation, o.head_epoch, o.head_at, o.last_run, o.last_status, \
                o.last_finished_at, o.last_error, o.queued, o.running, \
                (SELECT coalesce(jsonb_agg(jsonb_build_object( \
                            'stream', x->>'name', 'delivery', x->>'delivery', 'mode', x->>'mode') \
                            ORDER BY x->>'name'), '[]'::jsonb) \
                 FROM jsonb_array_elements(sy.definition->'streams') x) AS stream_levels, \
                (SELECT e.total_rows FROM orca.sync_epochs e WHERE e.sync_id = o.sync_id \
                 ORDER BY e.epoch DESC LIMIT 1) AS last_epoch_rows, \
                (SELECT coalesce(sum(e.quarantined), 0)::bigint FROM orca.sync_epochs e \
                 WHERE e.sync_id = o.sync_id) AS quarantined, \
                (SELECT coalesce(sum(e.held), 0)::bigint FROM orca.sync_epochs e \
                 WHERE e.sync_id = o.sync_id) AS held, \
                c.slot, c.lag_bytes AS slot_lag_bytes, c.lag_seconds AS slot_lag_seconds, \
                c.held_back AS slot_held_back, \
                (sy.definition->'destination'->>'lanes')::int AS lanes, sy.drift, p.paused \
         FROM orca.sync_overview o LEFT JOIN orca.cdc_slots c ON c.sync_id = o.sync_id \
         JOIN orca.syncs sy ON sy.id = o.sync_id \
         LEFT JOIN orca.pipelines p ON p.org_id = sy.org_id AND p.name = sy.name \
         ORDER BY o.sync",
    )
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(rows))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SyncState {
    pub sync: String,
    /// Whether its schedule (or continuous run) is paused now.
    pub paused: bool,
    /// The run resuming started (a continuous sync's), if any.
    pub run: Option<i64>,
}

async fn sync_state(s: &mut Session, name: &str, run: Option<i64>) -> Result<SyncState, ApiError> {
    let paused: bool = sqlx::query_scalar(
        "SELECT p.paused FROM orca.pipelines p JOIN orca.syncs sy \
           ON sy.org_id = p.org_id AND sy.name = p.name WHERE sy.name = $1",
    )
    .bind(name)
    .fetch_one(&mut *s.tx)
    .await?;
    Ok(SyncState {
        sync: name.to_string(),
        paused,
        run,
    })
}

/// Pauses a sync (`orca.pause_sync`): no more runs, and a running attempt
/// stops at its next epoch boundary.
#[utoipa::path(post, path = "/syncs/{name}/pause", tag = "syncs",
    params(("name" = String, Path, description = "The sync", example = "orders_mirror")),
    responses(
        (status = 200, description = "The sync, paused", body = SyncState),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn pause_sync(
    mut s: Session,
    PathOf(name): PathOf<String>,
) -> Result<Json<SyncState>, ApiError> {
    sqlx::query("SELECT orca.pause_sync($1)")
        .bind(&name)
        .execute(&mut *s.tx)
        .await?;
    let state = sync_state(&mut s, &name, None).await?;
    s.commit().await?;
    Ok(Json(state))
}

/// Resumes a sync from its HEAD (`orca.resume_sync`); a continuous sync
/// gets its run back.
#[utoipa::path(post, path = "/syncs/{name}/resume", tag = "syncs",
    params(("name" = String, Path, description = "The sync", example = "orders_mirror")),
    responses(
        (status = 200, description = "The sync, resumed", body = SyncState),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn resume_sync(
    mut s: Session,
    PathOf(name): PathOf<String>,
) -> Result<Json<SyncState>, ApiError> {
    let run: Option<i64> = sqlx::query_scalar("SELECT orca.resume_sync($1)")
        .bind(&name)
        .fetch_one(&mut *s.tx)
        .await?;
    let state = sync_state(&mut s, &name, run).await?;
    s.commit().await?;
    Ok(Json(state))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Lanes {
    /// Writer lanes, 1 to 64.
    #[schema(example = 4, minimum = 1, maximum = 64)]
    pub lanes: i32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Scaled {
    pub sync: String,
    pub lanes: i32,
    /// The lanes it had.
    pub was: i32,
}

/// Sets a sync's writer lanes (`orca.scale_sync`): a continuous sync's
/// attempt takes them at its next epoch boundary, without a stop.
#[utoipa::path(post, path = "/syncs/{name}/scale", tag = "syncs",
    params(("name" = String, Path, description = "The sync", example = "orders_mirror")),
    request_body = Lanes,
    responses(
        (status = 200, description = "The lanes set", body = Scaled),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn scale_sync(
    mut s: Session,
    PathOf(name): PathOf<String>,
    Body(body): Body<Lanes>,
) -> Result<Json<Scaled>, ApiError> {
    let was: i32 = sqlx::query_scalar("SELECT orca.scale_sync($1, $2)")
        .bind(&name)
        .bind(body.lanes)
        .fetch_one(&mut *s.tx)
        .await?;
    s.commit().await?;
    Ok(Json(Scaled {
        sync: name,
        lanes: body.lanes,
        was,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventFilter {
    /// Events after this id (the last one seen), oldest first.
    pub after: Option<i64>,
    pub kind: Option<String>,
    /// Events a page holds (1 to 500, default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

/// The outbox, oldest first, a page at a time.
#[utoipa::path(get, path = "/events", tag = "events",
    params(EventFilter),
    responses(
        (status = 200, description = "A page of events", body = Page<Event>),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn events(
    mut s: Session,
    Params(f): Params<EventFilter>,
) -> Result<Json<Page<Event>>, ApiError> {
    let n = limit(f.limit)?;
    let rows = sqlx::query_as::<_, Event>(
        "SELECT id, at, kind, pipeline, run, attempt, data FROM orca.event_log \
         WHERE ($1::bigint IS NULL OR id > $1) AND ($2::text IS NULL OR kind = $2) \
         ORDER BY id LIMIT $3",
    )
    .bind(f.after)
    .bind(&f.kind)
    .bind(n + 1)
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(Page::of(rows, n, |e| e.id)))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Runner {
    pub name: String,
    pub host: Option<String>,
    pub pool: String,
    pub slots: Option<i32>,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

/// Runners seen.
#[utoipa::path(get, path = "/runners", tag = "runners",
    responses(
        (status = 200, description = "Every runner, by name", body = Vec<Runner>),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn runners(mut s: Session) -> Result<Json<Vec<Runner>>, ApiError> {
    let rows = sqlx::query_as::<_, Runner>(
        "SELECT name, host, pool, slots, first_seen, last_seen FROM orca.runners ORDER BY name",
    )
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(rows))
}

// --- Datasets, lineage, sensors -------------------------------------------------

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Dataset {
    /// `namespace.table`.
    pub dataset: String,
    /// Pipelines whose current version declares they write it.
    pub writers: Vec<String>,
    /// Pipelines whose current version declares they read it.
    pub readers: Vec<String>,
    /// Snapshots Orca's runs committed to it (kept runs).
    pub commits: i64,
    pub last_snapshot: Option<i64>,
    pub last_committed_at: Option<DateTime<Utc>>,
}

/// The same query answers the listing and one dataset.
const DATASETS: &str = "WITH declared AS (
        SELECT d.dataset, p.name AS pipeline, d.mode
        FROM orca.step_datasets d
        JOIN orca.pipelines p ON p.current_version = d.version_id
    ), names AS (
        SELECT dataset FROM declared UNION SELECT dataset FROM orca.commits
    )
    SELECT n.dataset,
           coalesce(array(SELECT DISTINCT x.pipeline FROM declared x
                          WHERE x.dataset = n.dataset AND x.mode = 'write' ORDER BY 1), '{}') AS writers,
           coalesce(array(SELECT DISTINCT x.pipeline FROM declared x
                          WHERE x.dataset = n.dataset AND x.mode = 'read' ORDER BY 1), '{}') AS readers,
           (SELECT count(*) FROM orca.commits c WHERE c.dataset = n.dataset) AS commits,
           (SELECT c.snapshot_id FROM orca.commits c WHERE c.dataset = n.dataset
            ORDER BY c.id DESC LIMIT 1) AS last_snapshot,
           (SELECT max(c.committed_at) FROM orca.commits c WHERE c.dataset = n.dataset)
               AS last_committed_at
    FROM names n
    WHERE $1::text IS NULL OR n.dataset = $1
    ORDER BY n.dataset";

/// The datasets the org's pipelines declare or committed to.
#[utoipa::path(get, path = "/datasets", tag = "datasets",
    responses(
        (status = 200, description = "Every dataset, by name", body = Vec<Dataset>),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn datasets(mut s: Session) -> Result<Json<Vec<Dataset>>, ApiError> {
    let rows = sqlx::query_as::<_, Dataset>(DATASETS)
        .bind(Option::<String>::None)
        .fetch_all(&mut *s.tx)
        .await?;
    Ok(Json(rows))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Commit {
    pub snapshot: i64,
    pub operation: String,
    pub pipeline: String,
    pub run: i64,
    pub step: String,
    pub partition: String,
    pub committed_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct LineageRow {
    /// `upstream` or `downstream`.
    pub direction: String,
    pub depth: i32,
    /// The related dataset.
    pub related: String,
    /// The dataset it connects to.
    pub via: String,
    pub pipeline: String,
    pub run: i64,
    pub read_snapshot: Option<i64>,
    pub commit_snapshot: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DatasetDetail {
    #[serde(flatten)]
    pub dataset: Dataset,
    /// The snapshots committed, newest first (at most 100).
    pub snapshots: Vec<Commit>,
    /// From the recorded reads and commits (`orca.lineage`).
    pub lineage: Vec<LineageRow>,
}

/// One dataset: its snapshots and its recorded lineage.
#[utoipa::path(get, path = "/datasets/{name}", tag = "datasets",
    params(("name" = String, Path, description = "namespace.table", example = "lake.clean")),
    responses(
        (status = 200, description = "The dataset", body = DatasetDetail),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn dataset(
    mut s: Session,
    PathOf(name): PathOf<String>,
) -> Result<Json<DatasetDetail>, ApiError> {
    let lineage = sqlx::query_as::<_, LineageRow>(
        "SELECT direction, depth, related, via, pipeline, run, read_snapshot, commit_snapshot \
         FROM orca.lineage($1)",
    )
    .bind(&name)
    .fetch_all(&mut *s.tx)
    .await?;
    let dataset = sqlx::query_as::<_, Dataset>(DATASETS)
        .bind(&name)
        .fetch_optional(&mut *s.tx)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no dataset {name:?} in org {}", s.who.org)))?;
    let snapshots = sqlx::query_as::<_, Commit>(
        "SELECT c.snapshot_id AS snapshot, c.operation, p.name AS pipeline, c.run_id AS run, \
                c.step, c.partition, c.committed_at \
         FROM orca.commits c JOIN orca.runs r ON r.id = c.run_id \
         JOIN orca.pipelines p ON p.id = r.pipeline_id \
         WHERE c.dataset = $1 ORDER BY c.id DESC LIMIT 100",
    )
    .bind(&name)
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(DatasetDetail {
        dataset,
        snapshots,
        lineage,
    }))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Edge {
    /// A pipeline (`writes`: pipeline to dataset) or a dataset (`reads`:
    /// dataset to pipeline).
    pub from: String,
    pub to: String,
    /// `reads` or `writes`.
    pub kind: String,
    /// Whether a kept run recorded it (a pinned read or a commit), not only
    /// the declaration.
    pub recorded: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LineageGraph {
    pub pipelines: Vec<String>,
    pub datasets: Vec<String>,
    pub edges: Vec<Edge>,
}

/// Pipelines and datasets as a graph: what current versions declare, each
/// edge marked when runs recorded it.
#[utoipa::path(get, path = "/lineage", tag = "datasets",
    responses(
        (status = 200, description = "The graph", body = LineageGraph),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn lineage_graph(mut s: Session) -> Result<Json<LineageGraph>, ApiError> {
    let edges = sqlx::query_as::<_, Edge>(
        "SELECT DISTINCT \
                CASE WHEN d.mode = 'write' THEN p.name ELSE d.dataset END AS \"from\", \
                CASE WHEN d.mode = 'write' THEN d.dataset ELSE p.name END AS \"to\", \
                d.mode || 's' AS kind, \
                CASE WHEN d.mode = 'write' \
                     THEN EXISTS (SELECT 1 FROM orca.commits c JOIN orca.runs r ON r.id = c.run_id \
                                  WHERE r.pipeline_id = p.id AND c.dataset = d.dataset) \
                     ELSE EXISTS (SELECT 1 FROM orca.reads x JOIN orca.runs r ON r.id = x.run_id \
                                  WHERE r.pipeline_id = p.id AND x.dataset = d.dataset) END \
                    AS recorded \
         FROM orca.step_datasets d JOIN orca.pipelines p ON p.current_version = d.version_id \
         ORDER BY 1, 2, 3",
    )
    .fetch_all(&mut *s.tx)
    .await?;
    let pipelines: Vec<String> =
        sqlx::query_scalar("SELECT name FROM orca.pipelines ORDER BY name")
            .fetch_all(&mut *s.tx)
            .await?;
    let mut datasets: Vec<String> = edges
        .iter()
        .map(|e| if e.kind == "writes" { &e.to } else { &e.from })
        .cloned()
        .collect();
    datasets.sort();
    datasets.dedup();
    Ok(Json(LineageGraph {
        pipelines,
        datasets,
        edges,
    }))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Sensor {
    pub pipeline: String,
    pub paused: bool,
    pub registered_at: DateTime<Utc>,
    /// How far other runs' commits were looked at (an `orca.commits` id).
    pub commit_cursor: i64,
    pub last_sense_at: Option<DateTime<Utc>>,
    /// The long-lived run whose attempts poll for outside snapshots.
    pub sense_run: Option<i64>,
    /// Snapshots it saw, and the last one.
    pub sensed: i64,
    pub last_sensed_at: Option<DateTime<Utc>>,
    /// Runs it started.
    pub runs_started: i64,
}

/// The org's sensor pipelines and what they saw.
#[utoipa::path(get, path = "/sensors", tag = "sensors",
    responses(
        (status = 200, description = "Every sensor, by pipeline", body = Vec<Sensor>),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn sensors(mut s: Session) -> Result<Json<Vec<Sensor>>, ApiError> {
    let rows = sqlx::query_as::<_, Sensor>(
        "SELECT p.name AS pipeline, p.paused, sn.registered_at, sn.commit_cursor, \
                sn.last_sense_at, sn.sense_run, \
                (SELECT count(*) FROM orca.sensed x WHERE x.pipeline_id = sn.pipeline_id) AS sensed, \
                (SELECT max(x.seen_at) FROM orca.sensed x WHERE x.pipeline_id = sn.pipeline_id) \
                    AS last_sensed_at, \
                (SELECT count(*) FROM orca.sensed x WHERE x.pipeline_id = sn.pipeline_id \
                 AND x.run_id IS NOT NULL) AS runs_started \
         FROM orca.sensors sn JOIN orca.pipelines p ON p.id = sn.pipeline_id ORDER BY p.name",
    )
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(rows))
}

// --- Webhooks ---------------------------------------------------------------------

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Webhook {
    pub id: i64,
    pub url: String,
    pub events: Vec<String>,
    pub description: Option<String>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    /// The last event delivered (or passed over as not wanted).
    pub cursor: i64,
    /// Failed tries of the event at the cursor, and since when it fails.
    pub failures: i32,
    pub failing_since: Option<DateTime<Utc>>,
    pub next_attempt_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
}

/// The org's webhook endpoints (never their secrets).
#[utoipa::path(get, path = "/webhooks", tag = "webhooks",
    responses(
        (status = 200, description = "Every endpoint, by id", body = Vec<Webhook>),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn webhooks(mut s: Session) -> Result<Json<Vec<Webhook>>, ApiError> {
    let rows = sqlx::query_as::<_, Webhook>(
        "SELECT id, url, events, description, enabled, disabled_reason, cursor, failures, \
                failing_since, next_attempt_at, created_at FROM orca.webhooks ORDER BY id",
    )
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(rows))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Delivery {
    pub id: i64,
    pub event: i64,
    /// 1 for the event's first try at this endpoint.
    pub attempt: i32,
    /// `delivered` or `failed`.
    pub status: String,
    /// The endpoint's HTTP status, if it answered.
    pub response: Option<i32>,
    pub latency_ms: i32,
    pub error: Option<String>,
    pub relay: Option<String>,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryFilter {
    /// Tries before this id (the `next_cursor` of the page before).
    pub cursor: Option<i64>,
    /// Tries a page holds (1 to 500, default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

/// An endpoint's delivery tries, newest first.
#[utoipa::path(get, path = "/webhooks/{id}/deliveries", tag = "webhooks",
    params(("id" = i64, Path, description = "The endpoint", example = 1), DeliveryFilter),
    responses(
        (status = 200, description = "A page of delivery tries", body = Page<Delivery>),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn webhook_deliveries(
    mut s: Session,
    PathOf(id): PathOf<i64>,
    Params(f): Params<DeliveryFilter>,
) -> Result<Json<Page<Delivery>>, ApiError> {
    let n = limit(f.limit)?;
    let known: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM orca.webhooks WHERE id = $1)")
            .bind(id)
            .fetch_one(&mut *s.tx)
            .await?;
    if !known {
        return Err(ApiError::not_found(format!(
            "no webhook {id} in org {}",
            s.who.org
        )));
    }
    let rows = sqlx::query_as::<_, Delivery>(
        "SELECT id, event_id AS event, attempt, status, response, latency_ms, error, relay, at \
         FROM orca.webhook_deliveries WHERE webhook_id = $1 AND ($2::bigint IS NULL OR id < $2) \
         ORDER BY id DESC LIMIT $3",
    )
    .bind(id)
    .bind(f.cursor)
    .bind(n + 1)
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(Page::of(rows, n, |d| d.id)))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct SyncEpoch {
    pub epoch: i64,
    pub generation: i32,
    /// Rows per stream: `{"<stream>": n}`.
    pub rows: serde_json::Value,
    pub total_rows: i64,
    pub quarantined: i32,
    pub held: i32,
    pub committed_at: DateTime<Utc>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EpochFilter {
    /// Epochs before this one (the `next_cursor` of the page before).
    pub cursor: Option<i64>,
    /// Epochs a page holds (1 to 500, default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

/// A sync's committed epochs, newest first, with what each moved.
#[utoipa::path(get, path = "/syncs/{name}/epochs", tag = "syncs",
    params(("name" = String, Path, description = "The sync", example = "orders_mirror"), EpochFilter),
    responses(
        (status = 200, description = "A page of epochs", body = Page<SyncEpoch>),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn sync_epochs(
    mut s: Session,
    PathOf(name): PathOf<String>,
    Params(f): Params<EpochFilter>,
) -> Result<Json<Page<SyncEpoch>>, ApiError> {
    let n = limit(f.limit)?;
    let id: Option<i64> = sqlx::query_scalar("SELECT id FROM orca.syncs WHERE name = $1")
        .bind(&name)
        .fetch_optional(&mut *s.tx)
        .await?;
    let Some(id) = id else {
        return Err(ApiError::not_found(format!(
            "no sync {name:?} in org {}",
            s.who.org
        )));
    };
    let rows = sqlx::query_as::<_, SyncEpoch>(
        "SELECT epoch, generation, rows, total_rows, quarantined, held, committed_at \
         FROM orca.sync_epochs WHERE sync_id = $1 AND ($2::bigint IS NULL OR epoch < $2) \
         ORDER BY epoch DESC LIMIT $3",
    )
    .bind(id)
    .bind(f.cursor)
    .bind(n + 1)
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(Page::of(rows, n, |e| e.epoch)))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Incident {
    pub id: i64,
    /// run_failed, maintenance_failing, pool_without_runner, webhook_disabled.
    pub kind: String,
    /// One open incident per key.
    pub key: String,
    /// What it is about: pipeline, run, partitions, pool, webhook, dataset.
    pub subject: serde_json::Value,
    pub summary: String,
    pub opened_at: DateTime<Utc>,
    /// Reports that showed it while it was open.
    pub seen: i32,
    pub last_seen_at: DateTime<Utc>,
    pub resolved_at: Option<DateTime<Utc>>,
    pub resolution: Option<String>,
    /// What the org's playbooks did when it opened.
    pub actions: serde_json::Value,
}

const INCIDENT_COLUMNS: &str = "id, kind, key, subject, summary, opened_at, seen, last_seen_at, \
                                resolved_at, resolution, actions";

#[derive(Debug, Deserialize, IntoParams)]
pub struct IncidentFilter {
    /// true: only open incidents; false: only resolved ones.
    pub open: Option<bool>,
    /// How many, newest first (1 to 1000, default 100).
    pub limit: Option<i64>,
}

/// The org's incidents, newest first (`orca.incidents`).
#[utoipa::path(get, path = "/incidents", tag = "incidents",
    params(IncidentFilter),
    responses(
        (status = 200, description = "Incidents, newest first", body = Vec<Incident>),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn incidents(
    mut s: Session,
    Params(f): Params<IncidentFilter>,
) -> Result<Json<Vec<Incident>>, ApiError> {
    let limit = f.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit must be from 1 to 1000, got {limit}"
        )));
    }
    let rows = sqlx::query_as::<_, Incident>(&format!(
        "SELECT {INCIDENT_COLUMNS} FROM orca.incidents \
         WHERE $1::boolean IS NULL OR (resolved_at IS NULL) = $1 ORDER BY id DESC LIMIT $2"
    ))
    .bind(f.open)
    .bind(limit)
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(rows))
}

/// A dataset an incident's pipeline writes, or one downstream of those.
#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Affected {
    pub dataset: String,
    /// 0: the pipeline writes it; n: n steps downstream.
    pub depth: i32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct IncidentDetail {
    #[serde(flatten)]
    pub incident: Incident,
    /// Its events (opened, playbook actions, pages, resolved), in order.
    pub timeline: Vec<Event>,
    /// The datasets its pipeline writes and those downstream of them (from
    /// lineage): what may be stale while it is open.
    pub affected: Vec<Affected>,
}

/// An incident with its timeline and the datasets it may leave stale.
#[utoipa::path(get, path = "/incidents/{id}", tag = "incidents",
    params(("id" = i64, Path, description = "The incident", example = 1)),
    responses(
        (status = 200, description = "The incident", body = IncidentDetail),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
async fn incident(
    mut s: Session,
    PathOf(id): PathOf<i64>,
) -> Result<Json<IncidentDetail>, ApiError> {
    let incident = sqlx::query_as::<_, Incident>(&format!(
        "SELECT {INCIDENT_COLUMNS} FROM orca.incidents WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *s.tx)
    .await?
    .ok_or_else(|| ApiError::not_found(format!("no incident {id} in org {}", s.who.org)))?;
    let timeline = sqlx::query_as::<_, Event>(
        "SELECT id, at, kind, pipeline, run, attempt, data FROM orca.event_log \
         WHERE kind LIKE 'incident.%' AND (data->>'incident')::bigint = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(&mut *s.tx)
    .await?;
    // What its pipeline (or dataset, for maintenance) writes, then downstream.
    let affected = sqlx::query_as::<_, Affected>(
        "WITH own AS ( \
             SELECT DISTINCT d.dataset FROM orca.step_datasets d \
             JOIN orca.pipelines p ON p.current_version = d.version_id \
             WHERE d.mode = 'write' AND p.name = $1 \
             UNION SELECT $2 WHERE $2 IS NOT NULL) \
         SELECT dataset, 0 AS depth FROM own \
         UNION \
         SELECT l.related, l.depth FROM own, orca.lineage(own.dataset) l \
         WHERE l.direction = 'downstream' \
         ORDER BY depth, dataset",
    )
    .bind(incident.subject["pipeline"].as_str())
    .bind(incident.subject["dataset"].as_str())
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Json(IncidentDetail {
        incident,
        timeline,
        affected,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ResolveBody {
    /// Why it is resolved.
    pub note: Option<String>,
}

/// Resolves an open incident by hand (`orca.resolve_incident`).
#[utoipa::path(post, path = "/incidents/{id}/resolve", tag = "incidents",
    params(("id" = i64, Path, description = "The incident", example = 1)),
    request_body = ResolveBody,
    responses(
        (status = 200, description = "The incident, resolved", body = Incident),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
        (status = 409, description = "Already resolved", body = ErrorBody),
    ))]
async fn resolve_incident(
    mut s: Session,
    PathOf(id): PathOf<i64>,
    Body(b): Body<ResolveBody>,
) -> Result<Json<Incident>, ApiError> {
    sqlx::query("SELECT orca.resolve_incident($1, $2)")
        .bind(id)
        .bind(b.note)
        .execute(&mut *s.tx)
        .await?;
    let incident = sqlx::query_as::<_, Incident>(&format!(
        "SELECT {INCIDENT_COLUMNS} FROM orca.incidents WHERE id = $1"
    ))
    .bind(id)
    .fetch_one(&mut *s.tx)
    .await?;
    s.commit().await?;
    Ok(Json(incident))
}
