//! The webhook relay: delivers the outbox to each org's endpoints, signed
//! as the Standard Webhooks spec says (`orca_core::webhook`).
//!
//! One transaction per endpoint and turn: `orca.relay_take` locks one due
//! endpoint (other relays skip it) and hands over its next events; each is
//! POSTed in order and its outcome recorded with `orca.relay_done` in the
//! same transaction, which moves the endpoint's cursor past a delivered
//! event. The first failure ends the turn (later events wait, so an
//! endpoint sees its events in order) and the control plane backs the
//! endpoint off. A relay that dies mid-turn rolls its transaction back: the
//! cursor stays, and the events go again (at least once).
//!
//! Every request goes through netguard: the endpoint's name is resolved,
//! each address checked against its org's allowlist, and the request sent
//! to the checked address; redirects are not followed.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use orca_core::netguard::Allowlist;
use orca_core::webhook;
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::PgPool;

/// How long one delivery may take before it counts as failed.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Events one turn takes at most.
pub const TURN_EVENTS_MAX: i32 = 20;
/// The most of an endpoint's answer kept with a failed delivery.
const ERROR_LEN_MAX: usize = 500;

#[derive(Debug, Clone)]
pub struct RelayOptions {
    /// This relay's name in the delivery rows.
    pub name: String,
    /// How long to wait when no endpoint is due.
    pub idle: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("control plane: {0}")]
    Db(#[from] sqlx::Error),
    #[error("the control plane's turn is malformed: {0}")]
    Malformed(String),
}

/// One endpoint's turn, as orca.relay_take hands it over.
#[derive(Debug, Deserialize)]
struct Turn {
    webhook: i64,
    org: String,
    url: String,
    secret: String,
    allowlist: Vec<String>,
    events: Vec<OutboxEvent>,
}

#[derive(Debug, Deserialize)]
struct OutboxEvent {
    id: i64,
    kind: String,
    at: DateTime<Utc>,
    pipeline: Option<String>,
    run: Option<i64>,
    attempt: Option<i64>,
    data: Value,
}

impl OutboxEvent {
    /// The delivery's body: Standard Webhooks' `type`, `timestamp`, `data`.
    fn body(&self, org: &str) -> Value {
        json!({
            "type": self.kind,
            "timestamp": self.at,
            "data": {
                "event": self.id,
                "org": org,
                "pipeline": self.pipeline,
                "run": self.run,
                "attempt": self.attempt,
                "details": self.data,
            },
        })
    }
}

/// How a delivery went.
struct Outcome {
    delivered: bool,
    response: Option<i32>,
    latency_ms: i32,
    error: Option<String>,
}

/// Delivers until the process stops: a turn after another while endpoints
/// are due, then a wait of `idle`.
pub async fn run(pool: PgPool, opts: RelayOptions) {
    loop {
        match turn(&pool, &opts).await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => eprintln!("orca relay {}: {e}", opts.name),
        }
        tokio::time::sleep(opts.idle).await;
    }
}

/// One endpoint's turn; false when none was due.
pub async fn turn(pool: &PgPool, opts: &RelayOptions) -> Result<bool, RelayError> {
    let mut tx = pool.begin().await?;
    // The login may hold the role without inheriting it (orca serve's).
    sqlx::query("SET LOCAL ROLE orca_relay")
        .execute(&mut *tx)
        .await?;
    let taken: Option<Value> = sqlx::query_scalar("SELECT orca.relay_take($1)")
        .bind(TURN_EVENTS_MAX)
        .fetch_one(&mut *tx)
        .await?;
    let Some(taken) = taken else {
        tx.rollback().await?;
        return Ok(false);
    };
    let turn: Turn =
        serde_json::from_value(taken).map_err(|e| RelayError::Malformed(e.to_string()))?;
    let client = match connect(&turn) {
        Ok(c) => Some(c),
        Err(why) => {
            if let Some(first) = turn.events.first() {
                record(&mut tx, &turn, first.id, &failed(None, 0, why), opts).await?;
            }
            None
        }
    };
    if let Some(client) = client {
        for event in &turn.events {
            let outcome = deliver(&client, &turn, event).await;
            let delivered = outcome.delivered;
            record(&mut tx, &turn, event.id, &outcome, opts).await?;
            if !delivered {
                break;
            }
        }
    }
    tx.commit().await?;
    Ok(true)
}

fn failed(response: Option<i32>, latency_ms: i32, why: String) -> Outcome {
    Outcome {
        delivered: false,
        response,
        latency_ms,
        error: Some(why),
    }
}

async fn record(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    turn: &Turn,
    event: i64,
    o: &Outcome,
    opts: &RelayOptions,
) -> Result<(), RelayError> {
    sqlx::query("SELECT orca.relay_done($1, $2, $3, $4, $5, $6, $7)")
        .bind(turn.webhook)
        .bind(event)
        .bind(o.delivered)
        .bind(o.response)
        .bind(o.latency_ms)
        .bind(
            o.error
                .as_deref()
                .map(|e| orca_core::api::clip(e, orca_core::api::ERROR_TEXT_MAX)),
        )
        .bind(&opts.name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A client that reaches the endpoint at an address netguard checked, and
/// nowhere else (no redirects).
fn connect(turn: &Turn) -> Result<reqwest::Client, String> {
    let endpoint = webhook::endpoint(&turn.url).map_err(|e| e.to_string())?;
    let list = Allowlist::new(&turn.org, &turn.allowlist).map_err(|e| e.to_string())?;
    let addrs: Vec<SocketAddr> = match endpoint.host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, endpoint.port)],
        Err(_) => (endpoint.host.as_str(), endpoint.port)
            .to_socket_addrs()
            .map_err(|e| format!("netguard: cannot resolve {}: {e}", endpoint.host))?
            .collect(),
    };
    for a in &addrs {
        list.check(&endpoint.host, a.ip())
            .map_err(|r| r.to_string())?;
    }
    let first = addrs
        .first()
        .copied()
        .ok_or_else(|| format!("netguard: {} resolves to no address", endpoint.host))?;
    reqwest::Client::builder()
        .resolve(&endpoint.host, first)
        .redirect(reqwest::redirect::Policy::none())
        .timeout(DELIVERY_TIMEOUT)
        .user_agent(concat!("orca-relay/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))
}

async fn deliver(client: &reqwest::Client, turn: &Turn, event: &OutboxEvent) -> Outcome {
    let body = match serde_json::to_vec(&event.body(&turn.org)) {
        Ok(b) => b,
        Err(e) => return failed(None, 0, format!("encoding the event: {e}")),
    };
    let msg_id = format!("msg_{}", event.id);
    let timestamp = Utc::now().timestamp();
    let signature = match webhook::signature(&turn.secret, &msg_id, timestamp, &body) {
        Ok(s) => s,
        Err(e) => return failed(None, 0, e.to_string()),
    };
    let t0 = Instant::now();
    let sent = client
        .post(&turn.url)
        .header("content-type", "application/json")
        .header("webhook-id", &msg_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await;
    let latency_ms = i32::try_from(t0.elapsed().as_millis()).unwrap_or(i32::MAX);
    match sent {
        Ok(resp) if resp.status().is_success() => Outcome {
            delivered: true,
            response: Some(i32::from(resp.status().as_u16())),
            latency_ms,
            error: None,
        },
        Ok(resp) => {
            let status = i32::from(resp.status().as_u16());
            let text: String = resp
                .text()
                .await
                .unwrap_or_default()
                .chars()
                .take(ERROR_LEN_MAX)
                .collect();
            failed(Some(status), latency_ms, format!("HTTP {status}: {text}"))
        }
        Err(e) => failed(None, latency_ms, format!("{e}")),
    }
}
