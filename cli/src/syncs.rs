//! `orca syncs` and `orca sync <name>`: syncs as the control plane sees them.

use chrono::{DateTime, Utc};
use postgres::Client;

use crate::db::explain;
use crate::listing::Listing;

pub fn list(c: &mut Client, json: bool) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT s.name, s.delivery, s.generation, s.head_epoch, s.head_at,
                    s.definition->'source'->>'type', s.definition->'destination'->>'type',
                    s.definition->>'schedule',
                    (SELECT r.id::text || ' ' || r.status FROM orca.runs r
                     JOIN orca.pipelines p ON p.id = r.pipeline_id
                     WHERE p.name = s.name AND p.org_id = s.org_id AND r.kind = 'sync'
                     ORDER BY r.id DESC LIMIT 1),
                    coalesce((s.definition->'destination'->>'lanes')::int, 1),
                    (SELECT p.paused FROM orca.pipelines p
                     WHERE p.name = s.name AND p.org_id = s.org_id),
                    coalesce(jsonb_array_length(s.drift), 0)
             FROM orca.syncs s ORDER BY s.name",
            &[],
        )
        .map_err(explain)?;
    let mut out = Listing::new(&[
        "sync",
        "delivery",
        "source",
        "destination",
        "#generation",
        "#head_epoch",
        "committed_at",
        "schedule",
        "last_run",
        "#lanes",
        "paused",
        "#drift",
    ]);
    for r in &rows {
        out.push(vec![
            r.get::<_, String>(0).into(),
            r.get::<_, String>(1).into(),
            r.get::<_, Option<String>>(5).into(),
            r.get::<_, Option<String>>(6).into(),
            r.get::<_, i32>(2).into(),
            r.get::<_, i64>(3).into(),
            r.get::<_, Option<DateTime<Utc>>>(4).into(),
            r.get::<_, Option<String>>(7).into(),
            r.get::<_, Option<String>>(8).into(),
            r.get::<_, i32>(9).into(),
            r.get::<_, Option<bool>>(10).into(),
            r.get::<_, i32>(11).into(),
        ]);
    }
    out.print(json, "(no syncs: orca.create_sync defines one)");
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

pub fn pause(c: &mut Client, name: &str) -> anyhow::Result<i32> {
    c.execute("SELECT orca.pause_sync($1)", &[&name])
        .map_err(explain)?;
    println!("paused sync {name}: a running attempt stops at its next epoch boundary");
    Ok(0)
}

pub fn resume(c: &mut Client, name: &str) -> anyhow::Result<i32> {
    let run: Option<i64> = c
        .query_one("SELECT orca.resume_sync($1)", &[&name])
        .map_err(explain)?
        .get(0);
    match run {
        Some(r) => println!("resumed sync {name} from its HEAD: run {r}"),
        None => println!("resumed sync {name} from its HEAD"),
    }
    Ok(0)
}

pub fn scale(c: &mut Client, name: &str, lanes: i32) -> anyhow::Result<i32> {
    let was: i32 = c
        .query_one("SELECT orca.scale_sync($1, $2)", &[&name, &lanes])
        .map_err(explain)?
        .get(0);
    if was == lanes {
        println!("sync {name} has {lanes} lanes already");
    } else {
        println!("sync {name}: {was} -> {lanes} lanes (a running attempt takes them at its next epoch boundary)");
    }
    Ok(0)
}
