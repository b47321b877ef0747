//! `/pipelines`: registered pipelines, their versions and schedules; running one and backfilling it.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{Body, PathOf};
use crate::error::{ApiError, ErrorBody};
use crate::session::Session;
use crate::AppState;

/// This resource's endpoints, each with its OpenAPI operation.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(pipelines))
        .routes(routes!(pipeline))
        .routes(routes!(run_pipeline))
        .routes(routes!(backfill))
}

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
    /// How many partitions a run of a backfill covers unless the backfill
    /// says (the current version's `backfill_per_run`; none is one).
    pub backfill_per_run: Option<i32>,
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
    let backfill_per_run: Option<i32> = sqlx::query_scalar(
        "SELECT (v.manifest ->> 'backfill_per_run')::int FROM orca.pipelines p \
         JOIN orca.pipeline_versions v ON v.id = p.current_version WHERE p.name = $1",
    )
    .bind(&name)
    .fetch_optional(&mut *s.tx)
    .await?
    .flatten();
    Ok(Json(PipelineDetail {
        pipeline,
        versions,
        next_fires,
        backfill_per_run,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Partitions {
    /// One partition, a comma list, a range (`2024-01..2024-06`) or `@all`.
    #[schema(example = "2024-03")]
    pub partitions: String,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Backfill {
    /// One partition, a comma list, a range (`2024-01..2024-06`) or `@all`.
    #[schema(example = "2024-01..2024-06")]
    pub partitions: String,
    /// Up to this many partitions a run (default: the pipeline's
    /// `backfill_per_run`, else one; for a keyed pipeline its
    /// `keys_per_run`).
    #[serde(default)]
    #[schema(example = 3)]
    pub per_run: Option<i32>,
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

/// Queues runs over partitions, one a run or `per_run` a run (`orca.backfill`).
#[utoipa::path(post, path = "/pipelines/{name}/backfill", tag = "runs",
    params(("name" = String, Path, description = "The pipeline", example = "lake")),
    request_body = Backfill,
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
    Body(body): Body<Backfill>,
) -> Result<Json<Queued>, ApiError> {
    let runs: Vec<i64> = sqlx::query_scalar("SELECT * FROM orca.backfill($1, $2, $3)")
        .bind(&name)
        .bind(&body.partitions)
        .bind(body.per_run)
        .fetch_all(&mut *s.tx)
        .await?;
    s.commit().await?;
    Ok(Json(Queued { runs }))
}
