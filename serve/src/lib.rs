//! `orca serve`: the HTTP API over the control plane's SQL API (the console
//! and the webhook relay will join it). Everything it answers comes from a
//! session that acts with the caller's API key ([`session`]), so the
//! boundary is the one SQL proves for every other client.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;

pub mod api;
pub mod console;
pub mod error;
pub mod logs;
pub mod metrics;
pub mod relay;
pub mod session;

/// What a request handler reaches.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// Whether the console's cookies are marked `Secure` (served over TLS,
    /// directly or behind a proxy that terminates it).
    pub secure_cookies: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("connecting to the control plane: {0}")]
    Connect(sqlx::Error),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving: {0}")]
    Serve(std::io::Error),
}

/// How to serve.
#[derive(Debug, Clone)]
pub struct Options {
    /// The control plane, as the server's own login (NOINHERIT, granted the
    /// orca_viewer, orca_operator and orca_admin roles to take).
    pub database_url: String,
    pub listen: SocketAddr,
    /// Connections to the control plane at most.
    pub connections: u32,
    /// Also relay webhooks (the login needs orca_relay), as this server's
    /// name in the delivery rows.
    pub relay: Option<relay::RelayOptions>,
    /// Mark the console's cookies `Secure`.
    pub secure_cookies: bool,
}

/// The OpenAPI document's frame: what the operations under `/api/v1` are
/// added to (by [`api::routes`]) and how callers authenticate.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Orca",
        description = "The HTTP API of Orca's control plane. Every call acts with the caller's \
                       API key, in its org and with its role (docs/http.md).",
        license(name = "Apache-2.0"),
    ),
    paths(healthz, metrics::metrics),
    modifiers(&BearerKey),
    security(("api_key" = [])),
)]
pub struct ApiDoc;

struct BearerKey;

impl utoipa::Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("orca_ak_...")
                    .description(Some(
                        "An org's API key (orca.create_api_key, orca api-keys create)",
                    ))
                    .build(),
            ),
        );
    }
}

/// Every endpoint under `/api/v1`.
fn v1() -> OpenApiRouter<AppState> {
    api::routes().merge(logs::routes())
}

/// The OpenAPI 3.1 document of everything [`app`] serves.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let (_, spec) = OpenApiRouter::<AppState>::with_openapi(<ApiDoc as utoipa::OpenApi>::openapi())
        .nest("/api/v1", v1())
        .split_for_parts();
    spec
}

/// The whole application: `/api/v1` with its OpenAPI document, metrics and
/// a health check.
pub fn app(state: AppState) -> Router {
    let (router, spec) = OpenApiRouter::with_openapi(<ApiDoc as utoipa::OpenApi>::openapi())
        .nest("/api/v1", v1())
        .split_for_parts();
    let spec = Arc::new(spec);
    router
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let spec = spec.clone();
                async move { Json(spec.as_ref().clone()) }
            }),
        )
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics::metrics))
        .merge(console::routes())
        .fallback(not_found)
        .with_state(state)
}

/// Whether the server is up (no key needed).
#[utoipa::path(get, path = "/healthz", tag = "server", security(()),
    responses((status = 200, description = "Up", body = Object, example = json!({"ok": true}))))]
async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"ok": true}))
}

async fn not_found() -> error::ApiError {
    error::ApiError::not_found("no such endpoint (the API is under /api/v1)")
}

/// Relays webhooks until the process is told to stop (`orca relay`).
pub async fn relay_only(database_url: &str, opts: relay::RelayOptions) -> Result<(), ServeError> {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(database_url)
        .await
        .map_err(ServeError::Connect)?;
    println!("orca relay {}: delivering webhooks", opts.name);
    tokio::select! {
        _ = relay::run(pool, opts) => {}
        _ = stopped() => {}
    }
    Ok(())
}

/// Serves until the process is told to stop (SIGINT or SIGTERM).
pub async fn serve(opts: Options) -> Result<(), ServeError> {
    let pool = PgPoolOptions::new()
        .max_connections(opts.connections.max(1))
        .connect(&opts.database_url)
        .await
        .map_err(ServeError::Connect)?;
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: opts.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(ServeError::Serve)?;
    println!("orca serve: listening on http://{addr}/api/v1 (console: http://{addr}/console/)");
    if let Some(r) = opts.relay.clone() {
        println!("orca serve: relaying webhooks as {}", r.name);
        tokio::spawn(relay::run(pool.clone(), r));
    }
    let state = AppState {
        pool,
        secure_cookies: opts.secure_cookies,
    };
    axum::serve(listener, app(state))
        .with_graceful_shutdown(stopped())
        .await
        .map_err(ServeError::Serve)
}

async fn stopped() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
