//! `/datasets` and `/lineage`: datasets with their commits and lineage, and the graph of pipelines and datasets.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::PathOf;
use crate::error::{ApiError, ErrorBody};
use crate::session::Session;
use crate::AppState;

/// This resource's endpoints, each with its OpenAPI operation.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(datasets))
        .routes(routes!(dataset))
        .routes(routes!(lineage_graph))
}

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
