//! `orca tokens`: runner tokens of the org (create, list, rotate, revoke).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use chrono::{DateTime, Utc};
use postgres::Client;

use crate::db::explain;
use crate::listing::Listing;

/// Prints the token, or writes it to a new file only this user can read.
pub fn hand_over(token: &str, out: Option<&Path>, what: &str) -> anyhow::Result<()> {
    match out {
        None => println!("{token}"),
        Some(path) => {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating {} (it must not exist)", path.display()))?;
            writeln!(f, "{token}").with_context(|| format!("writing {}", path.display()))?;
            eprintln!("{what}; the token is in {} (mode 600)", path.display());
        }
    }
    Ok(())
}

pub fn create(
    c: &mut Client,
    pool: &str,
    name: Option<&str>,
    out: Option<&Path>,
) -> anyhow::Result<i32> {
    let token: String = c
        .query_one("SELECT orca.create_runner_token($1, $2)", &[&pool, &name])
        .map_err(explain)?
        .get(0);
    hand_over(
        &token,
        out,
        &format!("created a runner token for pool {pool}"),
    )?;
    Ok(0)
}

pub fn rotate(
    c: &mut Client,
    name: &str,
    grace_seconds: i64,
    out: Option<&Path>,
) -> anyhow::Result<i32> {
    let token: String = c
        .query_one(
            "SELECT orca.rotate_runner_token($1, make_interval(secs => $2::bigint))",
            &[&name, &grace_seconds],
        )
        .map_err(explain)?
        .get(0);
    hand_over(
        &token,
        out,
        &format!("rotated {name}; the old secret works for {grace_seconds} s more"),
    )?;
    Ok(0)
}

pub fn revoke(c: &mut Client, name: &str) -> anyhow::Result<i32> {
    c.execute("SELECT orca.revoke_runner_token($1)", &[&name])
        .map_err(explain)?;
    println!("revoked {name}: its runner's next call is refused and its leases lapse");
    Ok(0)
}

pub fn list(c: &mut Client, json: bool) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT name, pool, created_at, created_by::text, rotated_at, revoked_at
             FROM orca.runner_tokens ORDER BY name",
            &[],
        )
        .map_err(explain)?;
    let mut out = Listing::new(&[
        "token",
        "pool",
        "created_at",
        "created_by",
        "rotated_at",
        "revoked_at",
    ]);
    for r in &rows {
        out.push(vec![
            r.get::<_, String>(0).into(),
            r.get::<_, String>(1).into(),
            r.get::<_, Option<DateTime<Utc>>>(2).into(),
            r.get::<_, String>(3).into(),
            r.get::<_, Option<DateTime<Utc>>>(4).into(),
            r.get::<_, Option<DateTime<Utc>>>(5).into(),
        ]);
    }
    out.print(json, "(no runner tokens)");
    Ok(0)
}
