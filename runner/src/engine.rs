//! The runner's end of an engine's control channel: one JSON request per
//! line on the Unix socket the engine listens on (docs/syncs.md, "The control channel").

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// How long one request may take: the engine answers from memory.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("engine control channel {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("engine control channel {path}: no answer within {CALL_TIMEOUT:?}")]
    Timeout { path: String },
    #[error("engine control channel {path}: {reason}")]
    Refused { path: String, reason: String },
}

/// Sends `method` and returns the answer's `result`.
pub async fn call(path: &Path, method: &str) -> Result<Value, CallError> {
    let p = path.display().to_string();
    let io = |source| CallError::Io {
        path: p.clone(),
        source,
    };
    let exchange = async {
        let mut conn = UnixStream::connect(path).await.map_err(io)?;
        let request = json!({"id": 1, "method": method}).to_string() + "\n";
        conn.write_all(request.as_bytes()).await.map_err(io)?;
        let mut line = String::new();
        BufReader::new(conn)
            .read_line(&mut line)
            .await
            .map_err(io)?;
        let answer: Value = serde_json::from_str(&line).map_err(|e| CallError::Refused {
            path: p.clone(),
            reason: format!("not a JSON answer ({e}): {line:?}"),
        })?;
        if answer["ok"] == true {
            Ok(answer["result"].clone())
        } else {
            Err(CallError::Refused {
                path: p.clone(),
                reason: answer["error"].as_str().unwrap_or("no reason").to_string(),
            })
        }
    };
    tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(CallError::Timeout { path: p.clone() }))
}
