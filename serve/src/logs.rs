//! Attempt logs: the lines runners ship to the control plane
//! (`orca.attempt_logs`), a page at a time or followed as server-sent
//! events while the attempt runs.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use chrono::{DateTime, Utc};
use futures_util::stream::{self, Stream};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::{limit, Params, PathOf};
use crate::error::{ApiError, ErrorBody};
use crate::session::{self, Session};
use crate::AppState;

/// How often a followed log looks for new lines.
const POLL: Duration = Duration::from_millis(500);
/// How long one follow lasts at most; a client reconnects with `after`.
const FOLLOW_FOR: Duration = Duration::from_secs(3600);

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogQuery {
    /// The attempt's number (1 for the first); default the run's latest.
    #[param(minimum = 1)]
    pub attempt: Option<i32>,
    /// Lines after this one (the `seq` last seen; default 0, from the start).
    #[param(minimum = 0)]
    pub after: Option<i32>,
    /// Lines a page holds (1 to 500, default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

#[derive(Debug, Clone, Serialize, FromRow, ToSchema)]
pub struct LogLine {
    pub seq: i32,
    pub at: DateTime<Utc>,
    pub line: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LogPage {
    pub run: i64,
    pub attempt: i32,
    /// The attempt's status (`leased` while it runs).
    pub status: String,
    pub lines: Vec<LogLine>,
    /// Pass as `after` for the lines that follow.
    pub next_after: i32,
    /// Whether the attempt ended and every line it shipped is in this page
    /// or before it.
    pub finished: bool,
}

#[derive(Debug, FromRow)]
struct AttemptRow {
    number: i32,
    status: String,
}

async fn attempt_of(
    s: &mut Session,
    run: i64,
    number: Option<i32>,
) -> Result<AttemptRow, ApiError> {
    if number.is_some_and(|n| n < 1) {
        return Err(ApiError::bad_request("attempt must be 1 or more"));
    }
    sqlx::query_as::<_, AttemptRow>(
        "SELECT number, status FROM orca.attempts WHERE run_id = $1 \
         AND ($2::int IS NULL OR number = $2) ORDER BY number DESC LIMIT 1",
    )
    .bind(run)
    .bind(number)
    .fetch_optional(&mut *s.tx)
    .await?
    .ok_or_else(|| {
        ApiError::not_found(match number {
            Some(n) => format!("run {run} has no attempt {n} in org {}", s.who.org),
            None => format!("run {run} has no attempts in org {}", s.who.org),
        })
    })
}

async fn page(s: &mut Session, run: i64, q: &LogQuery, max: i64) -> Result<LogPage, ApiError> {
    let a = attempt_of(s, run, q.attempt).await?;
    let after = q.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::bad_request("after must be 0 or more"));
    }
    let mut lines = sqlx::query_as::<_, LogLine>(
        "SELECT l.seq, l.at, l.line FROM orca.attempt_logs l \
         JOIN orca.attempts a ON a.id = l.attempt_id \
         WHERE a.run_id = $1 AND a.number = $2 AND l.seq > $3 ORDER BY l.seq LIMIT $4",
    )
    .bind(run)
    .bind(a.number)
    .bind(after)
    .bind(max + 1)
    .fetch_all(&mut *s.tx)
    .await?;
    let more = lines.len() as i64 > max;
    lines.truncate(usize::try_from(max).unwrap_or(0));
    let ended = !matches!(a.status.as_str(), "pending" | "leased");
    Ok(LogPage {
        run,
        attempt: a.number,
        next_after: lines.last().map_or(after, |l| l.seq),
        finished: ended && !more,
        status: a.status,
        lines,
    })
}

/// The log endpoints, under `/api/v1` beside [`crate::api::routes`].
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(log))
        .routes(routes!(log_stream))
}

/// A page of an attempt's log.
#[utoipa::path(get, path = "/runs/{id}/log", tag = "runs",
    params(("id" = i64, Path, description = "The run", example = 1), LogQuery),
    responses(
        (status = 200, description = "Lines of the attempt's log", body = LogPage),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
pub async fn log(
    mut s: Session,
    PathOf(id): PathOf<i64>,
    Params(q): Params<LogQuery>,
) -> Result<Json<LogPage>, ApiError> {
    let n = limit(q.limit)?;
    Ok(Json(page(&mut s, id, &q, n).await?))
}

/// The caller's key, checked once; a followed log opens a session per look.
pub struct Key(String);

impl FromRequestParts<AppState> for Key {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, ApiError> {
        session::caller_key(parts).map(Key)
    }
}

/// One server-sent event of a followed log, for the OpenAPI document.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogEvent {
    /// `line`, `end` or `error`.
    pub event: String,
    /// A `line`'s `{seq, at, line}` as JSON; `end`'s attempt status; an
    /// `error`'s message.
    pub data: String,
    /// A `line`'s seq.
    pub id: Option<String>,
}

/// Follows an attempt's log as server-sent events: a `line` event per line
/// (data: `{seq, at, line}`, id: its seq), then one `end` event (data: the
/// attempt's status) once the attempt ended and its lines were sent.
#[utoipa::path(get, path = "/runs/{id}/log/stream", tag = "runs",
    params(("id" = i64, Path, description = "The run", example = 1), LogQuery),
    responses(
        (status = 200, description = "Server-sent events", content_type = "text/event-stream",
         body = LogEvent),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
        (status = 404, description = "Not in the key's org", body = ErrorBody),
    ))]
pub async fn log_stream(
    State(state): State<AppState>,
    Key(key): Key,
    PathOf(id): PathOf<i64>,
    Params(q): Params<LogQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    // Refused at once (401, 404, ...) rather than inside the stream.
    let mut s = session::open(&state, &key).await?;
    let first = attempt_of(&mut s, id, q.attempt).await?;
    drop(s);
    let start = Follow {
        state,
        key,
        run: id,
        attempt: first.number,
        after: q.after.unwrap_or(0).max(0),
        since: tokio::time::Instant::now(),
        done: false,
        first: true,
    };
    let events = stream::unfold(start, |mut f| async move {
        if f.done {
            return None;
        }
        loop {
            if !f.first {
                tokio::time::sleep(POLL).await;
            }
            f.first = false;
            let q = LogQuery {
                attempt: Some(f.attempt),
                after: Some(f.after),
                limit: None,
            };
            let got = match session::open(&f.state, &f.key).await {
                Ok(mut s) => page(&mut s, f.run, &q, crate::api::PAGE_MAX).await,
                Err(e) => Err(e),
            };
            let p = match got {
                Ok(p) => p,
                Err(e) => {
                    f.done = true;
                    let ev = Event::default().event("error").data(e.message);
                    return Some((vec![Ok(ev)], f));
                }
            };
            let mut out: Vec<Result<Event, Infallible>> = p
                .lines
                .iter()
                .map(|l| {
                    Ok(Event::default()
                        .event("line")
                        .id(l.seq.to_string())
                        .json_data(l)
                        .unwrap_or_else(|_| Event::default().event("line").data(&l.line)))
                })
                .collect();
            f.after = p.next_after;
            if p.finished || f.since.elapsed() > FOLLOW_FOR {
                out.push(Ok(Event::default().event("end").data(p.status)));
                f.done = true;
            }
            if !out.is_empty() {
                return Some((out, f));
            }
        }
    })
    .flat_map(stream::iter);
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

struct Follow {
    state: AppState,
    key: String,
    run: i64,
    attempt: i32,
    after: i32,
    since: tokio::time::Instant,
    done: bool,
    first: bool,
}
