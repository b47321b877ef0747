//! A request's session with the control plane: the caller's API key
//! presented and the key's role taken, in one transaction that ends with
//! the request.
//!
//! The server's login has nothing of its own (create it `NOINHERIT` and
//! grant it `orca_viewer`, `orca_operator` and `orca_admin` to take): each
//! request takes `orca_viewer`, presents the key (`orca.api_key`, local to
//! the transaction), asks `orca.api_session()` — which refuses an unknown or
//! revoked key — and only then takes the key's role. So a request can do
//! exactly what its key's role may, in its key's org, and grants and
//! row-level security decide it as they do for any other client.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::Serialize;
use sqlx::{Postgres, Transaction};

use crate::error::ApiError;
use crate::AppState;

/// Who is calling: the key's org, role and name.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Whoami {
    pub org: String,
    pub role: String,
    pub key: String,
}

/// The caller's transaction; dropped without [`Session::commit`] it rolls
/// back.
pub struct Session {
    pub tx: Transaction<'static, Postgres>,
    pub who: Whoami,
}

impl Session {
    pub async fn commit(self) -> Result<(), ApiError> {
        self.tx.commit().await.map_err(ApiError::from)
    }
}

/// The key of an `Authorization: Bearer <key>` header.
pub fn bearer(parts: &Parts) -> Result<String, ApiError> {
    let header = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("no Authorization header"))?;
    let text = header
        .to_str()
        .map_err(|_| ApiError::unauthorized("the Authorization header is not text"))?;
    let key = text
        .strip_prefix("Bearer ")
        .or_else(|| text.strip_prefix("bearer "))
        .ok_or_else(|| ApiError::unauthorized("the Authorization header is not 'Bearer <key>'"))?
        .trim();
    if key.is_empty() || key.len() > 256 {
        return Err(ApiError::unauthorized(
            "the bearer key is empty or too long",
        ));
    }
    Ok(key.to_string())
}

/// Opens the caller's session for `key`.
pub async fn open(state: &AppState, key: &str) -> Result<Session, ApiError> {
    let mut tx = state.pool.begin().await?;
    sqlx::query("SET LOCAL ROLE orca_viewer")
        .execute(&mut *tx)
        .await?;
    sqlx::query("SELECT set_config('orca.api_key', $1, true)")
        .bind(key)
        .execute(&mut *tx)
        .await?;
    let s: serde_json::Value = sqlx::query_scalar("SELECT orca.api_session()")
        .fetch_one(&mut *tx)
        .await?;
    let field = |k: &str| {
        s.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let who = Whoami {
        org: field("org"),
        role: field("role"),
        key: field("key"),
    };
    // The role names a group role: only the three the extension made.
    let role = match who.role.as_str() {
        "viewer" => "orca_viewer",
        "operator" => "orca_operator",
        "admin" => "orca_admin",
        other => {
            return Err(ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!(
                    "the control plane gave the key a role this server does not know: {other:?}"
                ),
            ))
        }
    };
    sqlx::query(&format!("SET LOCAL ROLE {role}"))
        .execute(&mut *tx)
        .await?;
    Ok(Session { tx, who })
}

/// The cookie the console's session keeps the key in (HttpOnly: no script
/// reads it), and the one that carries its CSRF token (scripts read it and
/// send it back as [`CSRF_HEADER`]).
pub const KEY_COOKIE: &str = "orca_key";
pub const CSRF_COOKIE: &str = "orca_csrf";
pub const CSRF_HEADER: &str = "x-csrf-token";

/// A cookie of the request, by name.
pub fn cookie(parts: &Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// The caller's key: the `Authorization` header's, or else the console
/// session cookie's. A write with the cookie must also carry the CSRF token
/// (double submit: another site can make the browser send the cookie, but
/// cannot read the token to send it back), and the cookies are SameSite.
pub fn caller_key(parts: &Parts) -> Result<String, ApiError> {
    if parts
        .headers
        .contains_key(axum::http::header::AUTHORIZATION)
    {
        return bearer(parts);
    }
    let Some(key) = cookie(parts, KEY_COOKIE).filter(|k| !k.is_empty()) else {
        return Err(ApiError::unauthorized(
            "no Authorization header and no session",
        ));
    };
    if !parts.method.is_safe() {
        let sent = parts
            .headers
            .get(CSRF_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let want = cookie(parts, CSRF_COOKIE).unwrap_or_default();
        if want.is_empty() || sent != want {
            return Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "csrf",
                format!(
                    "a {} with the session cookie needs the {CSRF_HEADER} header",
                    parts.method
                ),
            ));
        }
    }
    Ok(key)
}

impl FromRequestParts<AppState> for Session {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let key = caller_key(parts)?;
        open(state, &key).await
    }
}
