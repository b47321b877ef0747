//! `orca allowlist`: what the org's connectors may reach besides public
//! addresses (netguard). Members list it; admins add and remove entries.

use chrono::{DateTime, Utc};
use postgres::Client;

use crate::db::explain;
use crate::listing::Listing;

/// Adds an entry for an org (admins): a host, `*.domain`, a network or a
/// local directory; prints it as stored.
pub fn add(c: &mut Client, org: &str, target: &str, note: Option<&str>) -> anyhow::Result<i32> {
    let stored: String = c
        .query_one("SELECT orca.allow($1, $2, $3)", &[&org, &target, &note])
        .map_err(explain)?
        .get(0);
    println!("org {org} may reach {stored}");
    Ok(0)
}

pub fn remove(c: &mut Client, org: &str, target: &str) -> anyhow::Result<i32> {
    c.execute("SELECT orca.disallow($1, $2)", &[&org, &target])
        .map_err(explain)?;
    println!("removed {target} from org {org}'s allowlist");
    Ok(0)
}

/// The session's org's entries.
pub fn list(c: &mut Client, json: bool) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT target, kind, note, created_at, created_by::text \
             FROM orca.allowlist ORDER BY kind, target",
            &[],
        )
        .map_err(explain)?;
    let mut out = Listing::new(&["target", "kind", "added_at", "added_by", "note"]);
    for r in &rows {
        out.push(vec![
            r.get::<_, String>(0).into(),
            r.get::<_, String>(1).into(),
            r.get::<_, DateTime<Utc>>(3).into(),
            r.get::<_, String>(4).into(),
            r.get::<_, Option<String>>(2).into(),
        ]);
    }
    out.print(json, "(no entries: only public addresses are reachable)");
    Ok(0)
}
