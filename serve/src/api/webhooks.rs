//! `/webhooks`: webhooks and their deliveries.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{limit, Page, Params, PathOf};
use crate::error::{ApiError, ErrorBody};
use crate::session::Session;
use crate::AppState;

/// This resource's endpoints, each with its OpenAPI operation.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(webhooks))
        .routes(routes!(webhook_deliveries))
}

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
