//! The HTTP service a host offers the external connectors it starts
//! (docs/connectors.md, "Host services"): instead of reaching its servers
//! itself, a connector sends the host one JSON request per line on the
//! Unix socket `ORCA_HOST_SOCKET` names, and the host makes the request to
//! an address netguard checked (the connection is pinned to it, as the
//! built-in connectors' are), retrying what a server says may pass
//! (connection failures, 429 and 502-504, honouring `Retry-After`), and
//! answers with the response on one line.
//!
//! Request: `{"id": 1, "method": "GET", "url": "https://api.example/items?page=2",
//! "headers": {"authorization": "..."}, "body": "text", "retry": true}`
//! (`body_base64` instead of `body` for bytes; `retry` is implied for GET,
//! HEAD, PUT and DELETE). Answer: `{"id": 1, "status": 200, "headers": {...},
//! "body": "text", "attempts": 1}` (`body_base64` when the body is not UTF-8),
//! or `{"id": 1, "error": "..."}`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::netguard::Guard;

/// The socket a connector reaches the host's services on.
pub const HOST_SOCKET_ENV: &str = "ORCA_HOST_SOCKET";
/// How often a request is tried in all.
const TRIES: u32 = 5;
/// The longest wait between tries, whatever `Retry-After` says.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The largest response body the host hands on.
const BODY_MAX: usize = 64 << 20;
/// A request's timeout unless it names one.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Listens on `socket` and serves each connection on a thread of its own,
/// until the socket is gone (its directory goes with the connector).
pub fn serve(name: &str, socket: &Path, guard: &Guard) -> Result<(), String> {
    let listener = UnixListener::bind(socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listening on {}: {e}", socket.display()))?;
    let guard = guard.clone();
    let name = name.to_string();
    let socket = socket.to_path_buf();
    std::thread::Builder::new()
        .name(format!("connector-{name}-http"))
        .spawn(move || {
            while socket.exists() {
                match listener.accept() {
                    Ok((conn, _)) => {
                        if conn.set_nonblocking(false).is_err() {
                            continue;
                        }
                        let guard = guard.clone();
                        let name = name.clone();
                        let _ = std::thread::Builder::new()
                            .name(format!("connector-{name}-http-conn"))
                            .spawn(move || serve_connection(&name, conn, &guard));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(_) => break,
                }
            }
        })
        .map(|_| ())
        .map_err(|e| format!("starting the HTTP service: {e}"))
}

fn serve_connection(name: &str, conn: UnixStream, guard: &Guard) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(req) => {
                let id = req.get("id").cloned().unwrap_or(Value::Null);
                let mut a = runtime
                    .block_on(request(guard, &req))
                    .unwrap_or_else(|e| json!({ "error": e }));
                a["id"] = id;
                if let Some(e) = a.get("error").and_then(Value::as_str) {
                    eprintln!("connector {name}: host HTTP: {e}");
                }
                a
            }
            Err(e) => json!({"id": null, "error": format!("not a JSON request: {e}")}),
        };
        let mut text = answer.to_string();
        text.push('\n');
        if out.write_all(text.as_bytes()).is_err() {
            break;
        }
    }
}

/// Makes one request, with its retries.
async fn request(guard: &Guard, req: &Value) -> Result<Value, String> {
    let method = req.get("method").and_then(Value::as_str).unwrap_or("GET");
    let method = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
        .map_err(|_| format!("{method:?} is not an HTTP method"))?;
    let url_text = req
        .get("url")
        .and_then(Value::as_str)
        .ok_or("the request names no url")?;
    let url = reqwest::Url::parse(url_text).map_err(|e| format!("url {url_text:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("url {url_text:?}: only http and https are served"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "url {url_text:?} carries credentials: send them in a header"
        ));
    }
    let host = url
        .host_str()
        .ok_or_else(|| format!("url {url_text:?} names no host"))?
        .to_string();
    let port = url
        .port_or_known_default()
        .ok_or_else(|| format!("url {url_text:?} names no port"))?;
    let pinned = guard.address(&host, port).map_err(|e| e.to_string())?;
    let timeout = req
        .get("timeout_seconds")
        .and_then(Value::as_u64)
        .map(Duration::from_secs)
        .unwrap_or(REQUEST_TIMEOUT);
    let mut client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .user_agent(concat!("orca-connector-host/", env!("CARGO_PKG_VERSION")));
    if let Some(addr) = pinned {
        client = client.resolve(&host, addr);
    }
    let client = client
        .build()
        .map_err(|e| format!("building the HTTP client: {e}"))?;
    let body: Vec<u8> = match (req.get("body"), req.get("body_base64")) {
        (Some(Value::String(t)), _) => t.clone().into_bytes(),
        (_, Some(Value::String(b))) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| format!("body_base64: {e}"))?,
        _ => Vec::new(),
    };
    let headers: Map<String, Value> = req
        .get("headers")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let idempotent = matches!(
        method,
        reqwest::Method::GET
            | reqwest::Method::HEAD
            | reqwest::Method::PUT
            | reqwest::Method::DELETE
    );
    let retry = req
        .get("retry")
        .and_then(Value::as_bool)
        .unwrap_or(idempotent);
    let mut tried = 0;
    loop {
        tried += 1;
        let mut r = client.request(method.clone(), url.clone());
        for (k, v) in &headers {
            if let Some(v) = v.as_str() {
                r = r.header(k.as_str(), v);
            }
        }
        if !body.is_empty() {
            r = r.body(body.clone());
        }
        let wait = match r.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let transient = matches!(status, 429 | 502 | 503 | 504);
                if !(transient && retry && tried < TRIES) {
                    return answer(resp, tried).await;
                }
                let after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs);
                after.unwrap_or_else(|| backoff(tried))
            }
            // A request that never reached the server is safe to send again.
            Err(e) if tried < TRIES && (e.is_connect() || (retry && e.is_timeout())) => {
                backoff(tried)
            }
            Err(e) => return Err(format!("{method} {url_text}: {e} (after {tried} tries)")),
        };
        tokio::time::sleep(wait.min(BACKOFF_MAX)).await;
    }
}

fn backoff(tried: u32) -> Duration {
    Duration::from_millis(250u64 << tried.min(6))
}

async fn answer(resp: reqwest::Response, attempts: u32) -> Result<Value, String> {
    let status = resp.status().as_u16();
    let headers: Map<String, Value> = resp
        .headers()
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.as_str().to_string(),
                Value::String(v.to_str().ok()?.into()),
            ))
        })
        .collect();
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| format!("reading the response: {e}"))?;
    if bytes.len() > BODY_MAX {
        return Err(format!(
            "the response body of {} bytes is over the host's limit of {BODY_MAX}",
            bytes.len()
        ));
    }
    let mut out = json!({"status": status, "headers": headers, "attempts": attempts});
    match std::str::from_utf8(&bytes) {
        Ok(text) => out["body"] = Value::String(text.to_string()),
        Err(_) => {
            out["body_base64"] =
                Value::String(base64::engine::general_purpose::STANDARD.encode(&bytes))
        }
    }
    Ok(out)
}
