//! `orca runs`, `orca run <id>`, `orca fires`, `orca cancel`, `orca retry`.

use std::path::Path;

use chrono::{DateTime, Utc};
use postgres::Client;

use crate::db::explain;

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".into())
}

fn secs(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.1}s", (b - a).num_milliseconds() as f64 / 1000.0),
        _ => "-".into(),
    }
}

pub fn runs(
    c: &mut Client,
    pipeline: Option<&str>,
    status: Option<&str>,
    limit: i64,
) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT run, pipeline, version, partitions, trigger, status, attempts, created_at,
                    started_at, finished_at, steps_succeeded, steps_total, error, kind
             FROM orca.run_overview
             WHERE kind IN ('pipeline', 'sync')
               AND ($1::text IS NULL OR pipeline = $1) AND ($2::text IS NULL OR status = $2)
             ORDER BY run DESC LIMIT $3",
            &[&pipeline, &status, &limit],
        )
        .map_err(explain)?;
    println!(
        "{:>7}  {:<16} {:>3}  {:<24} {:<9} {:<10} {:>3}  {:<19}  {:>8}  {:>5}",
        "run", "pipeline", "v", "partitions", "trigger", "status", "att", "queued", "took", "steps"
    );
    for r in &rows {
        let parts: Vec<String> = r.get(3);
        let mut p = parts.join(",");
        if p.len() > 24 {
            p.truncate(21);
            p.push_str("...");
        }
        // A sync's run has no steps: its progress is the sync's HEAD.
        let steps = if r.get::<_, String>(13) == "sync" {
            "  -  ".to_string()
        } else {
            format!("{:>2}/{:<2}", r.get::<_, i64>(10), r.get::<_, i64>(11))
        };
        println!(
            "{:>7}  {:<16} {:>3}  {:<24} {:<9} {:<10} {:>3}  {:<19}  {:>8}  {steps}{}",
            r.get::<_, i64>(0),
            r.get::<_, String>(1),
            r.get::<_, i32>(2),
            p,
            r.get::<_, String>(4),
            r.get::<_, String>(5),
            r.get::<_, i32>(6),
            time(r.get(7)),
            secs(r.get(8), r.get(9)),
            r.get::<_, Option<String>>(12)
                .map(|e| format!("  {}", e.lines().next().unwrap_or_default()))
                .unwrap_or_default()
        );
    }
    if rows.is_empty() {
        println!("(no runs)");
    }
    Ok(0)
}

pub fn run(c: &mut Client, id: i64, logs: &Path) -> anyhow::Result<i32> {
    let r = c
        .query_opt(
            "SELECT o.pipeline, o.version, o.registry_hash, o.partitions, o.trigger, o.status,
                    o.created_at, o.started_at, o.finished_at, o.error, o.org, r.version_id
             FROM orca.run_overview o JOIN orca.runs r ON r.id = o.run WHERE o.run = $1",
            &[&id],
        )
        .map_err(explain)?
        .ok_or_else(|| anyhow::anyhow!("unknown run {id}"))?;
    let pipeline: String = r.get(0);
    let partitions: Vec<String> = r.get(3);
    let org: String = r.get(10);
    let version_id: i64 = r.get(11);
    println!(
        "run {id} of {pipeline} (version {}, registry hash {}): {} by {}",
        r.get::<_, i32>(1),
        r.get::<_, String>(2),
        r.get::<_, String>(5),
        r.get::<_, String>(4)
    );
    println!("  partitions {}", partitions.join(","));
    println!(
        "  queued {}  started {}  finished {}  took {}",
        time(r.get(6)),
        time(r.get(7)),
        time(r.get(8)),
        secs(r.get(7), r.get(8))
    );
    if let Some(e) = r.get::<_, Option<String>>(9) {
        println!("  error: {e}");
    }

    println!("\nsteps");
    let states = c
        .query(
            "SELECT s.step, s.partition, s.status, s.attempts, s.error
             FROM orca.step_states s
             LEFT JOIN orca.steps st ON st.version_id = $2 AND st.name = s.step
             WHERE s.run_id = $1
             ORDER BY coalesce(st.position, 1000), s.step, s.partition",
            &[&id, &version_id],
        )
        .map_err(explain)?;
    for s in &states {
        let attempts: i32 = s.get(3);
        println!(
            "  {:<18} {:<12} {:<10} {}{}",
            s.get::<_, String>(0),
            s.get::<_, String>(1),
            s.get::<_, String>(2),
            if attempts > 1 {
                format!("{attempts} attempts")
            } else {
                String::new()
            },
            s.get::<_, Option<String>>(4)
                .map(|e| format!("  {e}"))
                .unwrap_or_default()
        );
    }

    println!("\nattempts");
    let attempts = c
        .query(
            "SELECT a.number, a.status, a.runner, a.leased_at, a.finished_at, a.error,
                    x.build->>'commit'
             FROM orca.attempt_overview a JOIN orca.attempts x ON x.id = a.attempt
             WHERE a.run = $1 ORDER BY a.number",
            &[&id],
        )
        .map_err(explain)?;
    let mut last = None;
    for a in &attempts {
        let n: i32 = a.get(0);
        last = Some(n);
        println!(
            "  #{n} {:<10} runner {:<20} leased {}  took {}{}{}",
            a.get::<_, String>(1),
            a.get::<_, Option<String>>(2).unwrap_or_else(|| "-".into()),
            time(a.get(3)),
            secs(a.get(3), a.get(4)),
            a.get::<_, Option<String>>(6)
                .map(|c| format!("  commit {c}"))
                .unwrap_or_default(),
            a.get::<_, Option<String>>(5)
                .map(|e| format!("\n       {e}"))
                .unwrap_or_default()
        );
    }
    if let Some(n) = last {
        let path = logs
            .join(&org)
            .join(&pipeline)
            .join(format!("run-{id}"))
            .join(format!("attempt-{n}.log"));
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                println!("\nlog of attempt {n} ({})", path.display());
                let lines: Vec<&str> = text.lines().collect();
                for l in &lines[lines.len().saturating_sub(20)..] {
                    println!("  {l}");
                }
            }
            Err(_) => println!(
                "\n(no log of attempt {n} at {}: logs stay on the runner's host)",
                path.display()
            ),
        }
    }
    Ok(0)
}

pub fn fires(c: &mut Client, pipeline: &str, n: i32) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT fire_at, partition FROM orca.fires($1, $2)",
            &[&pipeline, &n],
        )
        .map_err(explain)?;
    if rows.is_empty() {
        println!("{pipeline} has no schedule");
    }
    for r in rows {
        let at: DateTime<Utc> = r.get(0);
        let p: Option<String> = r.get(1);
        println!(
            "{}  {}",
            at.format("%Y-%m-%d %H:%M %Z"),
            p.map(|p| format!("fills {p}"))
                .unwrap_or_else(|| "(before the first partition)".into())
        );
    }
    Ok(0)
}

pub fn keys(c: &mut Client, pipeline: &str, not_done: bool, refresh: bool) -> anyhow::Result<i32> {
    if refresh {
        let task: i64 = c
            .query_one("SELECT orca.refresh_keys($1)", &[&pipeline])
            .map_err(explain)?
            .get(0);
        println!("reading the keys of {pipeline} (keys task {task})");
        loop {
            let row = c
                .query_one(
                    "SELECT status, coalesce(error, '') FROM orca.runs WHERE id = $1",
                    &[&task],
                )
                .map_err(explain)?;
            let (status, error): (String, String) = (row.get(0), row.get(1));
            match status.as_str() {
                "succeeded" => break,
                "failed" | "cancelled" => anyhow::bail!("keys task {task} {status}: {error}"),
                _ => std::thread::sleep(std::time::Duration::from_millis(300)),
            }
        }
    }
    let rows = c
        .query(
            "SELECT key, done, active_run FROM orca.key_status($1) WHERE NOT (done AND $2)",
            &[&pipeline, &not_done],
        )
        .map_err(explain)?;
    let head = c
        .query_one(
            "SELECT keys_snapshot, keys_read_at FROM orca.pipelines \
             WHERE name = $1 AND org_id = orca.current_org_id()",
            &[&pipeline],
        )
        .map_err(explain)?;
    let (snapshot, read_at): (Option<i64>, Option<DateTime<Utc>>) = (head.get(0), head.get(1));
    match read_at {
        Some(at) => println!(
            "# keys of {pipeline} from snapshot {}, read {}",
            snapshot.map_or_else(|| "(none)".to_string(), |s| s.to_string()),
            at.format("%Y-%m-%d %H:%M:%S %Z")
        ),
        None => println!("# {pipeline} has not read its keys yet (orca keys {pipeline} --refresh)"),
    }
    for r in &rows {
        let (key, done, active): (String, bool, Option<i64>) = (r.get(0), r.get(1), r.get(2));
        println!(
            "{key:<24} {:<9} {}",
            if done { "done" } else { "not done" },
            active.map(|a| format!("run {a}")).unwrap_or_default()
        );
    }
    Ok(0)
}

pub fn cancel(c: &mut Client, id: i64) -> anyhow::Result<i32> {
    c.execute("SELECT orca.cancel($1)", &[&id])
        .map_err(explain)?;
    println!("cancelled run {id}");
    Ok(0)
}

pub fn retry(c: &mut Client, id: i64) -> anyhow::Result<i32> {
    c.execute("SELECT orca.retry($1)", &[&id])
        .map_err(explain)?;
    println!("queued run {id} again");
    Ok(0)
}
