//! `/runners`: the org's runners and what they hold.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::session::Session;
use crate::AppState;

/// This resource's endpoints, each with its OpenAPI operation.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(runners))
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
