//! `orca discover <source-json>`: what a Postgres source holds, as a sync
//! would read it — each table's columns, types, keys and replica identity,
//! whether a change stream (`postgres_cdc`) can read it and why not, and the
//! streams `orca.create_sync` could take. It connects to the source itself
//! with the URL given (a secret is resolved only under an attempt's lease,
//! so it must be a plain URL here).

use postgres::{Client, NoTls};
use serde_json::{json, Value};

use crate::listing::Listing;

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("the source must be JSON such as {{\"type\": \"postgres_cdc\", \"url\": \"postgres://...\"}}: {0}")]
    NotJson(String),
    #[error("source.type {0:?} cannot be discovered (postgres, postgres_cdc and connector can)")]
    Kind(String),
    #[error("connector {name}: {reason}")]
    Connector { name: String, reason: String },
    #[error("source.url must be a plain connection string here (a secret is read only by an attempt); got {0}")]
    Url(String),
    #[error("connecting to the source: {0}")]
    Connect(String),
    #[error("reading the source's catalog: {0}")]
    Catalog(String),
}

/// The catalog, as JSON.
pub fn catalog(source: &str) -> Result<Value, DiscoverError> {
    let v: Value =
        serde_json::from_str(source).map_err(|e| DiscoverError::NotJson(e.to_string()))?;
    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
    if kind == "connector" {
        return connector_catalog(&v);
    }
    if !matches!(kind, "postgres" | "postgres_cdc") {
        return Err(DiscoverError::Kind(kind.to_string()));
    }
    let url = v
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| DiscoverError::Url(v.get("url").cloned().unwrap_or_default().to_string()))?;
    let mut c = Client::connect(url, NoTls).map_err(|e| DiscoverError::Connect(e.to_string()))?;
    orca_client::discover::postgres_catalog(&mut c, kind)
        .map_err(|e| DiscoverError::Catalog(e.to_string()))
}

/// An external connector's streams, as its `discover` says: the program
/// of this host's connectors directory (`ORCA_CONNECTORS`), the source's
/// config on its stdin.
fn connector_catalog(v: &Value) -> Result<Value, DiscoverError> {
    use std::io::Write;
    let name = v
        .get("connector")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let fail = |reason: String| DiscoverError::Connector {
        name: name.clone(),
        reason,
    };
    if !orca_core::sync::is_connector_name(&name) {
        return Err(fail("is not a connector's name".into()));
    }
    let dir = std::env::var_os("ORCA_CONNECTORS")
        .filter(|d| !d.is_empty())
        .ok_or_else(|| fail("set ORCA_CONNECTORS to the connectors directory".into()))?;
    let program = std::path::Path::new(&dir).join(&name);
    let mut child = std::process::Command::new(&program)
        .arg("discover")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start {}: {e}", program.display())))?;
    let config = v.get("config").cloned().unwrap_or_else(|| json!({}));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(config.to_string().as_bytes())
            .map_err(|e| fail(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(format!(
            "discover failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let found: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| fail(format!("discover printed no JSON: {e}")))?;
    Ok(orca_core::catalog::connector(&name, &found))
}

pub fn run(source: &str, json: bool) -> anyhow::Result<i32> {
    let cat = catalog(source)?;
    if cat["source"] == "connector" && !json {
        for s in cat["streams"].as_array().into_iter().flatten() {
            println!("{}", serde_json::to_string(s)?);
        }
        println!(
            "streams orca.create_sync could take:\n{}",
            serde_json::to_string(&cat["plan"])?
        );
        return Ok(0);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&cat)?);
        return Ok(0);
    }
    let mut out = Listing::new(&["table", "primary_key", "identity", "#rows", "cursor", "cdc"]);
    for s in cat["streams"].as_array().into_iter().flatten() {
        let key: Vec<&str> = s["primary_key"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let blocks: Vec<&str> = s["cdc_blocked_by"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        out.push(vec![
            s["table"].as_str().map(str::to_string).into(),
            Some(key.join(", ")).filter(|k| !k.is_empty()).into(),
            s["replica_identity"].as_str().map(str::to_string).into(),
            s["rows_estimate"].as_i64().unwrap_or(0).into(),
            s["cursor"].as_str().map(str::to_string).into(),
            Some(if blocks.is_empty() {
                "yes".to_string()
            } else {
                format!("no: {}", blocks.join("; "))
            })
            .into(),
        ]);
    }
    out.print(false, "(no tables)");
    println!(
        "streams orca.create_sync could take:\n{}",
        serde_json::to_string(&cat["plan"])?
    );
    Ok(0)
}
