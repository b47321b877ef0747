//! `/events`: the outbox's events, a page at a time.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{limit, Page, Params};
use crate::error::{ApiError, ErrorBody};
use crate::session::Session;
use crate::AppState;

/// An event of the outbox: what happened to a run, a sync or a dataset.
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

/// This resource's endpoints, each with its OpenAPI operation.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
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
