//! What every endpoint takes and gives alike: a JSON body, query and path
//! parameters refused as JSON errors, and a page of a listing.

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::ApiError;

/// A JSON body; one that does not parse is a 400 with the JSON error body
/// every other failure has.
pub struct Body<T>(pub T);

impl<S, T> FromRequest<S> for Body<T>
where
    Json<T>: FromRequest<S, Rejection = axum::extract::rejection::JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Body(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// Query parameters, refused the same way.
pub struct Params<T>(pub T);

impl<S, T> FromRequestParts<S> for Params<T>
where
    Query<T>: FromRequestParts<S, Rejection = axum::extract::rejection::QueryRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(Params(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// Path parameters, refused the same way (a run id that is not a number is a
/// 400 with a JSON body, not axum's plain-text one).
pub struct PathOf<T>(pub T);

impl<S, T> FromRequestParts<S> for PathOf<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(PathOf(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// A page of a listing is at most this long, whatever the caller asks.
pub const PAGE_MAX: i64 = 500;
pub const PAGE_DEFAULT: i64 = 50;

/// A page of rows and where the next one starts.
#[derive(Debug, Serialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<i64>,
}

impl<T> Page<T> {
    /// A page of at most `n` rows from a query that asked for `n + 1`: the
    /// extra row, if it came, says there is a next page, which starts after
    /// the last row kept.
    pub fn of(mut rows: Vec<T>, n: i64, cursor: impl Fn(&T) -> i64) -> Page<T> {
        let n = usize::try_from(n).unwrap_or(0);
        let more = rows.len() > n;
        rows.truncate(n);
        let next_cursor = if more { rows.last().map(cursor) } else { None };
        Page {
            items: rows,
            next_cursor,
        }
    }
}

pub fn limit(asked: Option<i64>) -> Result<i64, ApiError> {
    match asked {
        None => Ok(PAGE_DEFAULT),
        Some(n) if (1..=PAGE_MAX).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "limit must be from 1 to {PAGE_MAX}, got {n}"
        ))),
    }
}
