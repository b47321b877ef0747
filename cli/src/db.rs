//! The connection to the control plane, and its errors in words.

use anyhow::Context;
use orca_core::conninfo::redact;
use postgres::Client;

/// Connects to the control plane, with TLS as the URL's `sslmode` says.
pub fn connect(url: &str, org: Option<&str>) -> anyhow::Result<Client> {
    let p = orca_client::tls::prepare(url)
        .with_context(|| format!("cannot connect to the control plane at {}", redact(url)))?;
    let mut c = p
        .config
        .connect(p.tls)
        .map_err(explain)
        .with_context(|| format!("cannot connect to the control plane at {}", redact(url)))?;
    if let Some(org) = org {
        c.execute("SELECT set_config('orca.org', $1, false)", &[&org])?;
    }
    Ok(c)
}

/// A database error as a user reads it: the message, the hint, the SQLSTATE.
pub fn explain(e: postgres::Error) -> anyhow::Error {
    match e.as_db_error() {
        Some(db) => {
            let mut msg = format!("{} ({})", db.message(), db.code().code());
            if let Some(h) = db.hint() {
                msg.push_str(&format!("\n  hint: {h}"));
            }
            anyhow::anyhow!(msg)
        }
        None => anyhow::anyhow!(e),
    }
}
