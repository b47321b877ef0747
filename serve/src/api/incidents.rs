//! `/incidents`: open and resolved incidents; resolving one.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::events::Event;
use crate::api::extract::{Body, Params, PathOf};
use crate::error::{ApiError, ErrorBody};
use crate::session::Session;
use crate::AppState;

/// This resource's endpoints, each with its OpenAPI operation.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(incidents))
        .routes(routes!(incident))
        .routes(routes!(resolve_incident))
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
