//! `orca serve`: the HTTP API over the control plane's SQL API (the console
//! and the webhook relay will join it). Everything it answers comes from a
//! session that acts with the caller's API key ([`session`]), so the
//! boundary is the one SQL proves for every other client.

use std::net::SocketAddr;

use axum::routing::get;
use axum::{Json, Router};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

pub mod api;
pub mod error;
pub mod relay;
pub mod session;

/// What a request handler reaches.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
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
}

/// The whole application: `/api/v1` and a health check.
pub fn app(state: AppState) -> Router {
    Router::new()
        .nest("/api/v1", api::routes())
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .with_state(state)
}

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
    println!("orca serve: listening on http://{addr}/api/v1");
    if let Some(r) = opts.relay.clone() {
        println!("orca serve: relaying webhooks as {}", r.name);
        tokio::spawn(relay::run(pool.clone(), r));
    }
    axum::serve(listener, app(AppState { pool }))
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
