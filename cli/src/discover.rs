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
    let q = |e: postgres::Error| DiscoverError::Catalog(e.to_string());
    let server = c
        .query_one(
            "SELECT current_setting('wal_level'),
                    (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user),
                    current_setting('server_version')",
            &[],
        )
        .map_err(q)?;
    let wal_level: String = server.get(0);
    let replication: bool = server.get(1);
    let mut server_blocks = Vec::new();
    if wal_level != "logical" {
        server_blocks.push(format!(
            "wal_level is {wal_level}: ALTER SYSTEM SET wal_level = logical, then restart"
        ));
    }
    if !replication {
        server_blocks
            .push("the role has no REPLICATION attribute: ALTER ROLE ... REPLICATION".into());
    }
    let rows = c
        .query(
            "SELECT n.nspname::text || '.' || c.relname::text, c.relreplident::text,
                    (SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum), '{}')
                     FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                     WHERE i.indrelid = c.oid AND i.indisprimary),
                    (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                'name', a.attname::text, 'type', format_type(a.atttypid, a.atttypmod),
                                'nullable', NOT a.attnotnull,
                                'toastable', a.attlen = -1 AND a.attstorage <> 'p')
                            ORDER BY a.attnum), '[]')
                     FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
                    c.reltuples::bigint
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
               AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'orca')
               AND n.nspname NOT LIKE 'pg\\_%' AND c.relname NOT LIKE 'iceberg\\_%'
             ORDER BY 1",
            &[],
        )
        .map_err(q)?;
    let mut streams = Vec::new();
    let mut plan = Vec::new();
    for r in &rows {
        let table: String = r.get(0);
        let identity: String = r.get(1);
        let key: Vec<String> = r.get(2);
        let columns: Value = r.get(3);
        let rows_estimate: i64 = r.get(4);
        let cols = columns.as_array().cloned().unwrap_or_default();
        let toastable: Vec<String> = cols
            .iter()
            .filter(|c| c["toastable"] == true)
            .filter_map(|c| c["name"].as_str().map(str::to_string))
            .filter(|n| !key.contains(n))
            .collect();
        let mut blocks = server_blocks.clone();
        match identity.as_str() {
            "f" => {}
            "n" => blocks.push("REPLICA IDENTITY NOTHING: deletes carry no key".into()),
            "d" if key.is_empty() => blocks
                .push("no primary key: add one, or REPLICA IDENTITY FULL with a unique key".into()),
            _ if !toastable.is_empty() => blocks.push(format!(
                "TOASTable columns ({}) need REPLICA IDENTITY FULL",
                toastable.join(", ")
            )),
            _ => {}
        }
        let cursor = cols
            .iter()
            .filter(|c| {
                c["type"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("timestamp") || t == "date")
            })
            .filter_map(|c| c["name"].as_str())
            .find(|n| ["updated_at", "modified_at", "changed_at"].contains(n))
            .map(str::to_string);
        let name = table
            .rsplit('.')
            .next()
            .unwrap_or(&table)
            .to_lowercase()
            .replace(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'), "_");
        let readable = !key.is_empty()
            && match kind {
                "postgres_cdc" => blocks.is_empty(),
                _ => cursor.is_some(),
            };
        if readable {
            let mut s = json!({"name": name, "table": table, "primary_key": key,
                               "mode": if key.is_empty() { "append" } else { "merge" }});
            if kind == "postgres" {
                s["cursor"] = json!(cursor);
            }
            plan.push(s);
        }
        streams.push(json!({
            "table": table,
            "columns": cols,
            "primary_key": key,
            "replica_identity": match identity.as_str() {
                "d" => "default", "f" => "full", "i" => "index", _ => "nothing"
            },
            "rows_estimate": rows_estimate.max(0),
            "cdc": blocks.is_empty(),
            "cdc_blocked_by": blocks,
            "cursor": cursor,
        }));
    }
    Ok(json!({
        "source": kind,
        "server": {"version": server.get::<_, String>(2), "wal_level": wal_level,
                   "replication_role": replication},
        "streams": streams,
        "plan": plan,
    }))
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
    let streams = found.get("streams").cloned().unwrap_or_else(|| json!([]));
    let plan: Vec<Value> = streams
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| json!({"name": s["name"], "config": s.get("config").cloned().unwrap_or_else(|| json!({}))}))
        .collect();
    Ok(json!({"source": "connector", "connector": name, "streams": streams, "plan": plan}))
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
