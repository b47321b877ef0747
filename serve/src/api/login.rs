//! `/session`: who the caller is, and the console's login and logout.

use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::Body;
use crate::error::{ApiError, ErrorBody};
use crate::session::{Session, Whoami};
use crate::AppState;

/// This resource's endpoints, each with its OpenAPI operation.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(whoami, login, logout))
}

/// The key's org, role and name.
#[utoipa::path(get, path = "/session", tag = "session",
    responses(
        (status = 200, description = "Who is calling", body = Whoami),
        (status = 401, description = "No key, or a key refused", body = ErrorBody),
        (status = 403, description = "The key's role may not", body = ErrorBody),
    ))]
async fn whoami(s: Session) -> Json<Whoami> {
    Json(s.who.clone())
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Login {
    /// An API key of the org (`orca_ak_...`).
    pub key: String,
}

/// Starts a console session: checks the key and keeps it in an HttpOnly,
/// SameSite=Strict cookie, with a CSRF token cookie that writes send back
/// in `X-CSRF-Token`. Revoking the key ends every session made with it.
#[utoipa::path(post, path = "/session", tag = "session", security(()),
    request_body = Login,
    responses(
        (status = 200, description = "The session started (Set-Cookie)", body = Whoami),
        (status = 400, description = "Bad input", body = ErrorBody),
        (status = 401, description = "The key was refused", body = ErrorBody),
    ))]
async fn login(
    axum::extract::State(state): axum::extract::State<AppState>,
    Body(body): Body<Login>,
) -> Result<impl axum::response::IntoResponse, ApiError> {
    let key = body.key.trim().to_string();
    if key.is_empty()
        || key.len() > 256
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.+/=".contains(c))
    {
        return Err(ApiError::unauthorized(
            "the key is empty, too long or not a key",
        ));
    }
    let s = crate::session::open(&state, &key).await?;
    let who = s.who.clone();
    drop(s);
    let csrf = uuid::Uuid::new_v4().simple().to_string();
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    let cookies = [
        (
            axum::http::header::SET_COOKIE,
            format!(
                "{}={key}; Path=/; HttpOnly; SameSite=Strict{secure}",
                crate::session::KEY_COOKIE
            ),
        ),
        (
            axum::http::header::SET_COOKIE,
            format!(
                "{}={csrf}; Path=/; SameSite=Strict{secure}",
                crate::session::CSRF_COOKIE
            ),
        ),
    ];
    Ok((axum::response::AppendHeaders(cookies), Json(who)))
}

/// Ends the console session (clears its cookies).
#[utoipa::path(delete, path = "/session", tag = "session", security(()),
    responses((status = 204, description = "The cookies are cleared")))]
async fn logout() -> impl axum::response::IntoResponse {
    let gone = |name: &str| format!("{name}=; Path=/; Max-Age=0; SameSite=Strict");
    (
        axum::http::StatusCode::NO_CONTENT,
        axum::response::AppendHeaders([
            (
                axum::http::header::SET_COOKIE,
                gone(crate::session::KEY_COOKIE),
            ),
            (
                axum::http::header::SET_COOKIE,
                gone(crate::session::CSRF_COOKIE),
            ),
        ]),
    )
}
