//! `/sensors`: sensors and their last evaluations.

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
    OpenApiRouter::new().routes(routes!(sensors))
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
