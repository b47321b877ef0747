//! `orca-engine discover`: the attempt of a discovery task
//! (`orca.discover`). The control plane reads no source, so a runner's
//! engine does: it reads the task under its lease, resolves the source's
//! secrets, connects through netguard as a sync's attempt would, reads the
//! catalog (`orca_core::catalog` judges it) and stores it
//! (`orca.store_catalog`).

use orca_core::api::LeaseToken;
use orca_core::sync::Source;
use serde_json::{json, Value};

use crate::error::EngineError;
use crate::netguard::{Guard, Scope};
use crate::source::external::connector;

/// What a discovery attempt needs.
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    pub database_url: String,
    pub org: String,
    pub lease: String,
}

/// Reads and stores the catalog; returns what it stored:
/// `{"name", "version", "streams", "plannable"}`.
pub fn run(opts: &DiscoverOptions) -> Result<Value, EngineError> {
    let lease: LeaseToken = opts
        .lease
        .parse()
        .map_err(|e| EngineError::Definition(format!("--lease {:?}: {e}", opts.lease)))?;
    let mut control = orca_client::Control::connect(&opts.database_url, Some(&opts.org))?;
    let task = control.discovery(lease)?;
    let mut source = task.source.clone();
    let mut secrets = orca_client::Secrets::new(&mut control, Some(lease));
    source
        .resolve_secrets(&mut secrets)
        .map_err(|e| EngineError::Definition(e.to_string()))?;
    let scope = Scope {
        org: opts.org.clone(),
        allowlist: Some(task.allowlist.clone()),
        store: std::env::var("ORCA_STORE").ok().filter(|s| !s.is_empty()),
        warehouse: std::env::var("ORCA_WAREHOUSE")
            .ok()
            .filter(|w| !w.is_empty())
            .map(|w| orca_lake::catalog::absolute_warehouse(&w)),
    };
    let guard = Guard::new(&scope)?;
    let catalog = match &source {
        Source::Postgres { url, .. } | Source::PostgresCdc { url, .. } => {
            let url = url
                .plain()
                .map_err(|e| EngineError::Definition(e.to_string()))?;
            let mut client = guard.postgres(url)?;
            orca_client::discover::postgres_catalog(&mut client, source.kind())?
        }
        Source::Connector {
            connector: name,
            config,
            ..
        } => {
            let found = connector::discover(name, &Value::Object(config.clone()), &guard)?;
            orca_core::catalog::connector(name, &found)
        }
        Source::Files { .. } => {
            return Err(EngineError::Definition(
                "a files source has no catalog to discover".into(),
            ))
        }
        Source::Iceberg { .. } => {
            return Err(EngineError::Definition(
                "an iceberg source's tables are the org's catalog already".into(),
            ))
        }
    };
    let version = control.store_catalog(lease, &catalog)?;
    let count = |k: &str| catalog[k].as_array().map_or(0, Vec::len);
    Ok(json!({
        "name": task.name,
        "version": version,
        "streams": count("streams"),
        "plannable": count("plan"),
    }))
}
