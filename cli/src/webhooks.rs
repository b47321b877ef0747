//! `orca webhooks`: the org's webhook endpoints (create, list, rotate,
//! enable, disable, drop) and their last deliveries.

use std::path::Path;

use chrono::{DateTime, Utc};
use postgres::Client;
use serde_json::Value;

use crate::db::explain;
use crate::listing::Listing;
use crate::tokens::hand_over;

pub fn create(
    c: &mut Client,
    url: &str,
    events: &[String],
    description: Option<&str>,
    out: Option<&Path>,
) -> anyhow::Result<i32> {
    let made: Value = c
        .query_one(
            "SELECT orca.create_webhook($1, $2, $3)",
            &[&url, &events, &description],
        )
        .map_err(explain)?
        .get(0);
    let id = made["id"].as_i64().unwrap_or_default();
    let secret = made["secret"].as_str().unwrap_or_default();
    eprintln!("webhook {id}: {url} gets {}", events.join(", "));
    hand_over(secret, out, &format!("webhook {id}'s signing secret"))?;
    Ok(0)
}

pub fn rotate(c: &mut Client, id: i64, out: Option<&Path>) -> anyhow::Result<i32> {
    let secret: String = c
        .query_one("SELECT orca.rotate_webhook_secret($1)", &[&id])
        .map_err(explain)?
        .get(0);
    hand_over(&secret, out, &format!("webhook {id}'s new signing secret"))?;
    Ok(0)
}

pub fn set_enabled(c: &mut Client, id: i64, enabled: bool) -> anyhow::Result<i32> {
    c.execute("SELECT orca.set_webhook_enabled($1, $2)", &[&id, &enabled])
        .map_err(explain)?;
    println!(
        "webhook {id} {}",
        if enabled { "enabled" } else { "disabled" }
    );
    Ok(0)
}

pub fn drop(c: &mut Client, id: i64) -> anyhow::Result<i32> {
    c.execute("SELECT orca.drop_webhook($1)", &[&id])
        .map_err(explain)?;
    println!("dropped webhook {id}");
    Ok(0)
}

pub fn list(c: &mut Client, json: bool) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT w.id, w.url, w.events, w.enabled, w.cursor, w.disabled_reason, \
                    (SELECT max(d.at) FROM orca.webhook_deliveries d \
                     WHERE d.webhook_id = w.id AND d.status = 'delivered') \
             FROM orca.webhooks w ORDER BY w.id",
            &[],
        )
        .map_err(explain)?;
    let mut out = Listing::new(&[
        "#id",
        "url",
        "events",
        "state",
        "#cursor",
        "last_delivered_at",
        "note",
    ]);
    for r in &rows {
        out.push(vec![
            r.get::<_, i64>(0).into(),
            r.get::<_, String>(1).into(),
            r.get::<_, Vec<String>>(2).into(),
            if r.get::<_, bool>(3) {
                "enabled"
            } else {
                "disabled"
            }
            .into(),
            r.get::<_, i64>(4).into(),
            r.get::<_, Option<DateTime<Utc>>>(6).into(),
            r.get::<_, Option<String>>(5).into(),
        ]);
    }
    out.print(json, "(no webhook endpoints)");
    Ok(0)
}
