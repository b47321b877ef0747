//! `/datasets` and `/lineage`: datasets with their commits and lineage, and the graph of pipelines and datasets.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
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
        .routes(routes!(datasets))
        .routes(routes!(dataset))
        .routes(routes!(maintain))
        .routes(routes!(lineage_graph))
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct Dataset {
    /// `namespace.table`.
    pub dataset: String,
    /// Pipelines whose current version declares they write it, and syncs
    /// whose Iceberg destination holds it (`namespace.stream`).
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
        UNION ALL
        SELECT (s.definition -> 'destination' ->> 'namespace') || '.' || (st ->> 'name'),
               s.name, 'write'
        FROM orca.syncs s, jsonb_array_elements(s.definition -> 'streams') st
        WHERE s.definition -> 'destination' ->> 'type' = 'iceberg'
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
    /// Its table maintenance: the schedule, if any, and the latest runs.
    pub maintenance: Maintenance,
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct MaintenanceSchedule {
    pub cron: String,
    pub tz: String,
    /// What each run does, every default filled in.
    #[schema(value_type = Object)]
    pub options: serde_json::Value,
    pub next_fire_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, FromRow, ToSchema)]
pub struct MaintenanceRun {
    pub run: i64,
    /// The pipeline (or sync) it runs under.
    pub pipeline: String,
    pub status: String,
    /// `manual` (orca.maintain, the API) or `schedule`.
    pub trigger: String,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
    /// What each operation did: the run's `dataset.compacted`,
    /// `dataset.expired` and `dataset.orphans_removed` events by kind.
    #[schema(value_type = Object)]
    pub report: serde_json::Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Maintenance {
    pub schedule: Option<MaintenanceSchedule>,
    /// The latest maintenance runs, newest first (at most 20).
    pub runs: Vec<MaintenanceRun>,
}

async fn maintenance_of(s: &mut Session, name: &str) -> Result<Maintenance, ApiError> {
    let schedule = sqlx::query_as::<_, MaintenanceSchedule>(
        "SELECT cron, tz, options, next_fire_at FROM orca.maintenance WHERE dataset = $1",
    )
    .bind(name)
    .fetch_optional(&mut *s.tx)
    .await?;
    let runs = sqlx::query_as::<_, MaintenanceRun>(
        "SELECT r.id AS run, p.name AS pipeline, r.status, r.trigger, r.created_at, \
                r.finished_at, r.error, \
                coalesce((SELECT jsonb_object_agg(e.kind, e.data) FROM orca.events e \
                          WHERE e.run_id = r.id AND e.kind LIKE 'dataset.%'), '{}') AS report \
         FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
         WHERE r.kind = 'maintain' AND r.request ->> 'dataset' = $1 \
         ORDER BY r.id DESC LIMIT 20",
    )
    .bind(name)
    .fetch_all(&mut *s.tx)
    .await?;
    Ok(Maintenance { schedule, runs })
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
    let maintenance = maintenance_of(&mut s, &name).await?;
    Ok(Json(DatasetDetail {
        dataset,
        snapshots,
        lineage,
        maintenance,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Queued {
    pub run: i64,
    pub status: String,
}

/// Queues a maintenance run of the dataset (`orca.maintain`), or returns the
/// one queued or running for it already. The body is its options
/// (`{"compact": false, "expire": {"keep_last": 5}}`; `{}` for the defaults).
#[utoipa::path(post, path = "/datasets/{name}/maintain", tag = "datasets",
    params(("name" = String, Path, description = "namespace.table", example = "lake.clean")),
    request_body(content = Object, description = "The run's options: expire, orphans, compact"),
    responses(
        (status = 200, description = "The maintenance run", body = Queued),
        (status = 400, description = "Bad input: a malformed dataset or options (OR042)", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "No pipeline or sync of the key's org reads or writes it (OR043)", body = ErrorBody),
    ))]
async fn maintain(
    mut s: Session,
    PathOf(name): PathOf<String>,
    Body(options): Body<serde_json::Value>,
) -> Result<Json<Queued>, ApiError> {
    let run: i64 = sqlx::query_scalar("SELECT orca.maintain($1, $2)")
        .bind(&name)
        .bind(&options)
        .fetch_one(&mut *s.tx)
        .await?;
    let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&mut *s.tx)
        .await?;
    s.commit().await?;
    Ok(Json(Queued { run, status }))
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
