//! `orca syncs` and `orca sync <name>`: syncs as the control plane sees them.

use chrono::{DateTime, Utc};
use postgres::Client;

use crate::db::explain;

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

pub fn list(c: &mut Client) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT s.name, s.delivery, s.generation, s.head_epoch, s.head_at,
                    s.definition->'source'->>'type', s.definition->'destination'->>'type',
                    s.definition->>'schedule',
                    (SELECT r.id::text || ' ' || r.status FROM orca.runs r
                     JOIN orca.pipelines p ON p.id = r.pipeline_id
                     WHERE p.name = s.name AND p.org_id = s.org_id AND r.kind = 'sync'
                     ORDER BY r.id DESC LIMIT 1)
             FROM orca.syncs s ORDER BY s.name",
            &[],
        )
        .map_err(explain)?;
    println!(
        "{:<16} {:<17} {:<22} {:>4} {:>6}  {:<19}  {:<14} last run",
        "sync", "delivery", "source -> destination", "gen", "HEAD", "committed", "schedule"
    );
    for r in &rows {
        println!(
            "{:<16} {:<17} {:<22} {:>4} {:>6}  {:<19}  {:<14} {}",
            r.get::<_, String>(0),
            r.get::<_, String>(1),
            format!(
                "{} -> {}",
                r.get::<_, Option<String>>(5).unwrap_or_default(),
                r.get::<_, Option<String>>(6).unwrap_or_default()
            ),
            r.get::<_, i32>(2),
            r.get::<_, i64>(3),
            time(r.get(4)),
            r.get::<_, Option<String>>(7).unwrap_or_else(|| "-".into()),
            r.get::<_, Option<String>>(8).unwrap_or_else(|| "-".into()),
        );
    }
    if rows.is_empty() {
        println!("(no syncs: orca.create_sync defines one)");
    }
    Ok(0)
}

pub fn run(c: &mut Client, name: &str, backfill: bool, detach: bool) -> anyhow::Result<i32> {
    let sql = if backfill {
        "SELECT orca.backfill($1, '@all')"
    } else {
        "SELECT orca.run($1, 'now')"
    };
    let id: i64 = c.query_one(sql, &[&name]).map_err(explain)?.get(0);
    println!(
        "queued run {id} of sync {name}{}",
        if backfill {
            " (every stream again from its start)"
        } else {
            ""
        }
    );
    if detach {
        return Ok(0);
    }
    let code = crate::backfill::follow(c, &[id], name)?;
    let head = c
        .query_one(
            "SELECT head_epoch, generation FROM orca.syncs WHERE name = $1",
            &[&name],
        )
        .map_err(explain)?;
    println!(
        "sync {name}: HEAD at epoch {} (generation {})",
        head.get::<_, i64>(0),
        head.get::<_, i32>(1)
    );
    Ok(code)
}
