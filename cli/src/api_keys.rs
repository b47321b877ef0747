//! `orca api-keys`: API keys of the org, with which `orca serve`'s callers act
//! (create, list, revoke).

use std::path::Path;

use chrono::{DateTime, Utc};
use postgres::Client;

use crate::db::explain;
use crate::listing::Listing;
use crate::tokens::hand_over;

pub fn create(c: &mut Client, name: &str, role: &str, out: Option<&Path>) -> anyhow::Result<i32> {
    let key: String = c
        .query_one("SELECT orca.create_api_key($1, $2)", &[&name, &role])
        .map_err(explain)?
        .get(0);
    hand_over(&key, out, &format!("created {role} API key {name}"))?;
    Ok(0)
}

pub fn revoke(c: &mut Client, name: &str) -> anyhow::Result<i32> {
    c.execute("SELECT orca.revoke_api_key($1)", &[&name])
        .map_err(explain)?;
    println!("revoked API key {name}: its next request is refused");
    Ok(0)
}

pub fn list(c: &mut Client, json: bool) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT name, role, created_at, created_by::text, revoked_at \
             FROM orca.api_keys ORDER BY name",
            &[],
        )
        .map_err(explain)?;
    let mut out = Listing::new(&["key", "role", "created_at", "created_by", "revoked_at"]);
    for r in &rows {
        out.push(vec![
            r.get::<_, String>(0).into(),
            r.get::<_, String>(1).into(),
            r.get::<_, DateTime<Utc>>(2).into(),
            r.get::<_, String>(3).into(),
            r.get::<_, Option<DateTime<Utc>>>(4).into(),
        ]);
    }
    out.print(json, "(no API keys)");
    Ok(0)
}
