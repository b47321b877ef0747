//! `/syncs`: syncs with their streams' delivery and slots, their epochs; pausing, resuming and scaling one.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{limit, Body, Page, Params, PathOf};
use crate::error::{ApiError, ErrorBody};
use crate::session::Session;
use crate::AppState;

/// This resource's endpoints, each with its OpenAPI operation.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(syncs))
        .routes(routes!(pause_sync))
        .routes(routes!(resume_sync))
        .routes(routes!(scale_sync))
        .routes(routes!(sync_epochs))
}

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
