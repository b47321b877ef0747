//! `orca runs`, `orca run <id>`, `orca explain <id>`, `orca incidents`, `orca fires`,
//! `orca cancel`, `orca retry`.

use std::path::Path;

use chrono::{DateTime, Utc};
use postgres::Client;

use crate::db::explain;
use crate::listing::{Cell, Listing};

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
    json: bool,
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
    let mut out = Listing::new(&[
        "#run",
        "pipeline",
        "#version",
        "partitions",
        "trigger",
        "status",
        "#attempts",
        "queued_at",
        "#seconds",
        "steps",
        "error",
    ]);
    for r in &rows {
        let parts: Vec<String> = r.get(3);
        let mut p = parts.join(",");
        if !json && p.len() > 24 {
            p.truncate(21);
            p.push_str("...");
        }
        // A sync's run has no steps: its progress is the sync's HEAD.
        let steps: Cell = if r.get::<_, String>(13) == "sync" {
            Cell::None
        } else {
            format!("{}/{}", r.get::<_, i64>(10), r.get::<_, i64>(11)).into()
        };
        let error: Option<String> = r.get(12);
        out.push(vec![
            r.get::<_, i64>(0).into(),
            r.get::<_, String>(1).into(),
            r.get::<_, i32>(2).into(),
            if json { parts.into() } else { p.into() },
            r.get::<_, String>(4).into(),
            r.get::<_, String>(5).into(),
            r.get::<_, i32>(6).into(),
            r.get::<_, Option<DateTime<Utc>>>(7).into(),
            took(r.get(8), r.get(9)),
            steps,
            if json {
                error.into()
            } else {
                error
                    .map(|e| e.lines().next().unwrap_or_default().to_string())
                    .into()
            },
        ]);
    }
    out.print(json, "(no runs)");
    Ok(0)
}

fn took(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Cell {
    match (a, b) {
        (Some(a), Some(b)) => Cell::Secs((b - a).num_milliseconds() as f64 / 1000.0),
        _ => Cell::None,
    }
}

/// The tasks a run's steps fanned out: counts by state and durations per
/// (step, partition, task), then the first failures with their errors.
fn tasks(c: &mut Client, run: i64) -> anyhow::Result<()> {
    let rows = c
        .query(
            "SELECT step, partition, task, tasks, queued, running, succeeded, failed, cancelled,
                    retries, p50_millis, p99_millis, max_millis
             FROM orca.task_overview WHERE run = $1 ORDER BY step, partition, task",
            &[&run],
        )
        .map_err(explain)?;
    if rows.is_empty() {
        return Ok(());
    }
    println!("\ntasks");
    for t in &rows {
        let n = |i: usize| t.get::<_, i64>(i);
        let ms = |i: usize| {
            t.get::<_, Option<i32>>(i)
                .map_or_else(|| "-".to_string(), |m| format!("{m} ms"))
        };
        println!(
            "  {:<18} {:<12} {:<14} {} tasks: {} succeeded, {} failed, {} running, {} queued, {} cancelled; {} retries; p50 {} p99 {} max {}",
            t.get::<_, String>(0),
            t.get::<_, String>(1),
            t.get::<_, String>(2),
            n(3),
            n(6),
            n(7),
            n(5),
            n(4),
            n(8),
            n(9),
            ms(10),
            ms(11),
            ms(12)
        );
    }
    let failed = c
        .query(
            "SELECT step, partition, task, index, try, error FROM orca.tasks
             WHERE run = $1 AND status = 'failed' ORDER BY finished_at, index LIMIT 5",
            &[&run],
        )
        .map_err(explain)?;
    for f in &failed {
        println!(
            "  failed: {} {} {} #{} after {} tries: {}",
            f.get::<_, String>(0),
            f.get::<_, String>(1),
            f.get::<_, String>(2),
            f.get::<_, i32>(3),
            f.get::<_, i32>(4),
            // Its log lines, when it has them, under it.
            f.get::<_, Option<String>>(5)
                .unwrap_or_default()
                .replace('\n', "\n    ")
        );
    }
    Ok(())
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

    // Why it is where it is, as the scheduler decides (orca.explain).
    let reasons = c
        .query("SELECT code, message FROM orca.explain($1)", &[&id])
        .map_err(explain)?;
    if !reasons.is_empty() {
        println!("\nwhy");
        for w in &reasons {
            println!("  {:<22} {}", w.get::<_, String>(0), w.get::<_, String>(1));
        }
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

    tasks(c, id)?;

    println!("\nattempts");
    let attempts = c
        .query(
            "SELECT a.number, a.status, a.runner, a.leased_at, a.finished_at, a.error,
                    x.build->>'commit', (x.resources->>'memory_bytes')::bigint,
                    (x.resources->>'cpu_millis')::bigint, x.killed_for
             FROM orca.attempt_overview a JOIN orca.attempts x ON x.id = a.attempt
             WHERE a.run = $1 ORDER BY a.number",
            &[&id],
        )
        .map_err(explain)?;
    let mut last = None;
    for a in &attempts {
        let n: i32 = a.get(0);
        last = Some(n);
        // The size it got, when its version declares one, and why it died
        // when it was killed for memory.
        let size = [
            a.get::<_, Option<i64>>(7)
                .map(|b| format!("memory {}", orca_core::resources::show_bytes(b))),
            a.get::<_, Option<i64>>(8).map(|m| format!("cpu {m}m")),
            a.get::<_, Option<String>>(9)
                .map(|k| format!("killed for {k}")),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ");
        println!(
            "  #{n} {:<10} runner {:<20} leased {}  took {}{}{}{}",
            a.get::<_, String>(1),
            a.get::<_, Option<String>>(2).unwrap_or_else(|| "-".into()),
            time(a.get(3)),
            secs(a.get(3), a.get(4)),
            if size.is_empty() {
                String::new()
            } else {
                format!("  [{size}]")
            },
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
            // Not on this host: the lines the runner shipped to the control plane.
            Err(_) => {
                let lines = c
                    .query(
                        "SELECT line FROM (SELECT l.seq, l.line FROM orca.attempt_logs l \
                         JOIN orca.attempts a ON a.id = l.attempt_id \
                         WHERE a.run_id = $1 AND a.number = $2 ORDER BY l.seq DESC LIMIT 20) x \
                         ORDER BY seq",
                        &[&id, &n],
                    )
                    .map_err(explain)?;
                if lines.is_empty() {
                    println!(
                        "\n(no log of attempt {n} at {}, and none shipped to the control plane)",
                        path.display()
                    );
                } else {
                    println!("\nlog of attempt {n} (as its runner shipped it)");
                    for l in &lines {
                        println!("  {}", l.get::<_, String>(0));
                    }
                }
            }
        }
    }
    Ok(0)
}

pub fn fires(c: &mut Client, pipeline: &str, n: i32, json: bool) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT fire_at, partition FROM orca.fires($1, $2)",
            &[&pipeline, &n],
        )
        .map_err(explain)?;
    let mut out = Listing::new(&["fire_at", "fills"]);
    for r in rows {
        let at: DateTime<Utc> = r.get(0);
        let p: Option<String> = r.get(1);
        out.push(vec![
            at.into(),
            match p {
                Some(p) => p.into(),
                None if json => Cell::None,
                None => "(before the first partition)".into(),
            },
        ]);
    }
    out.print(json, &format!("{pipeline} has no schedule"));
    Ok(0)
}

pub fn keys(
    c: &mut Client,
    pipeline: &str,
    not_done: bool,
    refresh: bool,
    json: bool,
) -> anyhow::Result<i32> {
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
    if !json {
        match read_at {
            Some(at) => println!(
                "# keys of {pipeline} from snapshot {}, read {}",
                snapshot.map_or_else(|| "(none)".to_string(), |s| s.to_string()),
                at.format("%Y-%m-%d %H:%M:%S %Z")
            ),
            None => {
                println!("# {pipeline} has not read its keys yet (orca keys {pipeline} --refresh)")
            }
        }
    }
    let mut out = Listing::new(&["key", "done", "#active_run"]);
    for r in &rows {
        let (key, done, active): (String, bool, Option<i64>) = (r.get(0), r.get(1), r.get(2));
        out.push(vec![key.into(), done.into(), active.into()]);
    }
    out.print(json, "(no keys)");
    Ok(0)
}

/// `orca explain <run>`: orca.explain's rows.
pub fn why(c: &mut Client, id: i64, json: bool) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT code, message, blocked_by, since, until FROM orca.explain($1)",
            &[&id],
        )
        .map_err(explain)?;
    let mut out = Listing::new(&["code", "message", "blocked_by", "since", "until"]);
    for r in &rows {
        out.push(vec![
            r.get::<_, String>(0).into(),
            r.get::<_, String>(1).into(),
            r.get::<_, Option<serde_json::Value>>(2)
                .map(Cell::Json)
                .unwrap_or(Cell::None),
            r.get::<_, Option<DateTime<Utc>>>(3)
                .map(Cell::Time)
                .unwrap_or(Cell::None),
            r.get::<_, Option<DateTime<Utc>>>(4)
                .map(Cell::Time)
                .unwrap_or(Cell::None),
        ]);
    }
    out.print(json, "(nothing to explain)");
    Ok(0)
}

/// `orca incidents`: the open incidents (or every one), newest first.
pub fn incidents(c: &mut Client, all: bool, json: bool) -> anyhow::Result<i32> {
    let rows = c
        .query(
            "SELECT id, kind, summary, opened_at, seen, resolved_at, resolution, actions
             FROM orca.incidents WHERE $1 OR resolved_at IS NULL ORDER BY id DESC LIMIT 1000",
            &[&all],
        )
        .map_err(explain)?;
    let mut out = Listing::new(&[
        "#incident",
        "kind",
        "summary",
        "opened_at",
        "#seen",
        "resolved_at",
        "resolution",
        "actions",
    ]);
    for r in &rows {
        out.push(vec![
            Cell::Int(r.get(0)),
            r.get::<_, String>(1).into(),
            r.get::<_, String>(2).into(),
            Cell::Time(r.get(3)),
            Cell::Int(i64::from(r.get::<_, i32>(4))),
            r.get::<_, Option<DateTime<Utc>>>(5)
                .map(Cell::Time)
                .unwrap_or(Cell::None),
            r.get::<_, Option<String>>(6)
                .map(Cell::Text)
                .unwrap_or(Cell::None),
            Cell::Json(r.get(7)),
        ]);
    }
    out.print(
        json,
        if all {
            "(no incidents)"
        } else {
            "(no open incidents)"
        },
    );
    Ok(0)
}

/// `orca resolve-incident <id>`.
pub fn resolve_incident(c: &mut Client, id: i64, note: Option<&str>) -> anyhow::Result<i32> {
    c.execute("SELECT orca.resolve_incident($1, $2)", &[&id, &note])
        .map_err(explain)?;
    println!("resolved incident {id}");
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
