//! The connection to the control plane, and its errors in words.

use anyhow::Context;
use postgres::{Client, NoTls};

pub fn connect(url: &str, org: Option<&str>) -> anyhow::Result<Client> {
    let mut c = Client::connect(url, NoTls)
        .with_context(|| format!("cannot connect to the control plane at {}", redact(url)))?;
    if let Some(org) = org {
        c.execute("SELECT set_config('orca.org', $1, false)", &[&org])?;
    }
    Ok(c)
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}@{}", &url[..s + 3], user, &url[at + 1..])
        }
        _ => url.to_string(),
    }
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
