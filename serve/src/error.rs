//! What a request that failed answers: an HTTP status and a JSON body that
//! carries the SQLSTATE, the message and the hint the control plane gave.
//!
//! ```json
//! {"error": {"status": 403, "code": "42501", "message": "permission denied for function backfill", "hint": null}}
//! ```

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use orca_core::sqlstate;

#[derive(Debug, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    /// The SQLSTATE, or the API's own code (`unauthorized`, `bad_request`).
    pub code: String,
    pub message: String,
    pub hint: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: code.to_string(),
            message: message.into(),
            hint: None,
        }
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message);
        e.hint = Some(
            "send Authorization: Bearer <key>; an operator creates keys with orca api-keys create"
                .into(),
        );
        e
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

/// What every failed call answers, for the OpenAPI document.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// The HTTP status again.
    pub status: u16,
    /// The SQLSTATE (`42501`, `OR010`, ...) or the API's own code
    /// (`unauthorized`, `bad_request`, `not_found`, `unavailable`, `internal`).
    pub code: String,
    pub message: String,
    pub hint: Option<String>,
}

/// The status a control-plane SQLSTATE answers with.
pub fn status_of(code: &str) -> StatusCode {
    let is = |s: sqlstate::SqlState| s.is(code);
    if is(sqlstate::API_KEY_REFUSED) {
        StatusCode::UNAUTHORIZED
    } else if code == "42501"
        || is(sqlstate::NOT_A_MEMBER)
        || is(sqlstate::UNKNOWN_ORG)
        || is(sqlstate::CLOCK_ADMIN_ONLY)
    {
        StatusCode::FORBIDDEN
    } else if is(sqlstate::UNKNOWN_PIPELINE)
        || is(sqlstate::UNKNOWN_RUN)
        || is(sqlstate::UNKNOWN_SYNC)
        || is(sqlstate::UNKNOWN_API_KEY)
        || is(sqlstate::UNKNOWN_RUNNER_TOKEN)
        || is(sqlstate::UNKNOWN_SECRET)
        || is(sqlstate::UNKNOWN_INCIDENT)
        || is(sqlstate::NO_WRITER)
    {
        StatusCode::NOT_FOUND
    } else if is(sqlstate::RUN_STATE)
        || is(sqlstate::NAME_TAKEN)
        || is(sqlstate::DATASET_CYCLE)
        || is(sqlstate::INCIDENT_RESOLVED)
    {
        StatusCode::CONFLICT
    } else if code.starts_with("OR")
        || code.starts_with("22")
        || code.starts_with("23")
        || code.starts_with("54")
    {
        // The caller's input: partitions, specs, names, definitions (and
        // ones too long or deep for the server: 54xxx).
        StatusCode::BAD_REQUEST
    } else if code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300") {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        match &e {
            sqlx::Error::Database(d) => {
                let code = d.code().map(|c| c.to_string()).unwrap_or_default();
                let hint = d
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .and_then(|p| p.hint().map(str::to_string));
                ApiError {
                    status: status_of(&code),
                    code,
                    message: d.message().to_string(),
                    hint,
                }
            }
            sqlx::Error::RowNotFound => ApiError::not_found("no such row"),
            sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed => {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("the control plane cannot be reached: {e}"),
                )
            }
            other => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                other.to_string(),
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                status: self.status.as_u16(),
                code: self.code,
                message: self.message,
                hint: self.hint,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_plane_codes_answer_with_the_status_a_client_expects() {
        for (code, status) in [
            ("OR087", 401),
            ("42501", 403),
            ("OR002", 403),
            ("OR010", 404),
            ("OR011", 404),
            ("OR013", 409),
            ("OR021", 400),
            ("OR050", 400),
            ("22P02", 400),
            ("57P01", 503),
            ("XX000", 500),
        ] {
            assert_eq!(status_of(code).as_u16(), status, "{code}");
        }
    }
}
