//! `orca secrets`: the org's secrets (set from standard input, list, drop).

use std::io::Read;

use anyhow::Context;
use chrono::{DateTime, Utc};
use postgres::Client;

use crate::db::explain;
use crate::listing::Listing;

/// Sets a secret to what standard input holds (a trailing newline dropped),
/// so that the value is never on a command line.
pub fn set(c: &mut Client, name: &str) -> anyhow::Result<i32> {
    let mut value = String::new();
    std::io::stdin()
        .read_to_string(&mut value)
        .context("reading the secret's value from standard input")?;
    let value = value.strip_suffix('\n').unwrap_or(&value);
    let value = value.strip_suffix('\r').unwrap_or(value);
    c.execute("SELECT orca.set_secret($1, $2)", &[&name, &value])
        .map_err(explain)?;
    println!("set secret {name}; options name it as {{\"secret\": \"{name}\"}}");
    Ok(0)
}

pub fn drop(c: &mut Client, name: &str) -> anyhow::Result<i32> {
    c.execute("SELECT orca.drop_secret($1)", &[&name])
        .map_err(explain)?;
    println!("dropped secret {name}");
    Ok(0)
}

pub fn list(c: &mut Client, json: bool) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT name, updated_at, updated_by::text FROM orca.secrets ORDER BY name",
            &[],
        )
        .map_err(explain)?;
    let mut out = Listing::new(&["secret", "updated_at", "updated_by"]);
    for r in &rows {
        out.push(vec![
            r.get::<_, String>(0).into(),
            r.get::<_, DateTime<Utc>>(1).into(),
            r.get::<_, String>(2).into(),
        ]);
    }
    out.print(json, "(no secrets)");
    Ok(0)
}
