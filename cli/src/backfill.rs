//! `orca backfill <pipeline> <partitions>`: queue, then follow with progress.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Context;
use postgres::Client;

use crate::db::explain;

/// The partitions of a spec; `@file:path` reads one partition a line.
fn spec(partitions: &str) -> anyhow::Result<String> {
    match partitions.strip_prefix("@file:") {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read partitions from {path}"))?;
            Ok(text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .collect::<Vec<_>>()
                .join(","))
        }
        None => Ok(partitions.to_string()),
    }
}

#[derive(Default, PartialEq, Clone, Copy)]
struct Counts {
    queued: i64,
    running: i64,
    succeeded: i64,
    failed: i64,
    cancelled: i64,
}

impl Counts {
    fn done(&self) -> i64 {
        self.succeeded + self.failed + self.cancelled
    }
}

/// The runs a backfill queued: those it returned, and those its keys tasks
/// (a keyed pipeline's `@all`) queued once they had read the keys.
fn counts(c: &mut Client, ids: &[i64]) -> anyhow::Result<Counts> {
    let mut k = Counts::default();
    for row in c
        .query(
            "SELECT status, count(*) FROM orca.runs \
             WHERE (id = ANY($1) AND kind IN ('pipeline', 'sync', 'maintain')) OR parent_run = ANY($1) \
             GROUP BY status",
            &[&ids],
        )
        .map_err(explain)?
    {
        let (status, n): (String, i64) = (row.get(0), row.get(1));
        match status.as_str() {
            "queued" => k.queued = n,
            "running" => k.running = n,
            "succeeded" => k.succeeded = n,
            "failed" => k.failed = n,
            _ => k.cancelled = n,
        }
    }
    Ok(k)
}

fn bar(k: &Counts, total: i64, started: Instant) -> String {
    const WIDTH: i64 = 30;
    let filled = if total == 0 {
        WIDTH
    } else {
        k.done() * WIDTH / total
    };
    format!(
        "[{}{}] {}/{} done: {} succeeded, {} failed, {} cancelled; {} running, {} queued ({}s)",
        "#".repeat(usize::try_from(filled).unwrap_or(0)),
        ".".repeat(usize::try_from(WIDTH - filled).unwrap_or(0)),
        k.done(),
        total,
        k.succeeded,
        k.failed,
        k.cancelled,
        k.running,
        k.queued,
        started.elapsed().as_secs()
    )
}

/// Waits until the keys tasks have read the keys and queued their runs
/// (a keys task is a run: its end notifies like any other's).
fn wait_for_keys(c: &mut Client, tasks: &[i64], pipeline: &str) -> anyhow::Result<i64> {
    c.batch_execute(RUNS_FINISHED)
        .context("listening for runs that end")?;
    loop {
        let rows = c
            .query(
                "SELECT id, status, coalesce(error, '') FROM orca.runs WHERE id = ANY($1)",
                &[&tasks],
            )
            .map_err(explain)?;
        if let Some(bad) = rows
            .iter()
            .find(|r| matches!(r.get::<_, String>(1).as_str(), "failed" | "cancelled"))
        {
            let (id, status, error): (i64, String, String) = (bad.get(0), bad.get(1), bad.get(2));
            let why = if error.is_empty() {
                String::new()
            } else {
                format!(": {error}")
            };
            anyhow::bail!("keys task {id} of {pipeline} {status}{why}");
        }
        if rows.iter().all(|r| r.get::<_, String>(1) == "succeeded") {
            let queued: i64 = c
                .query_one(
                    "SELECT count(*) FROM orca.runs WHERE parent_run = ANY($1)",
                    &[&tasks],
                )
                .map_err(explain)?
                .get(0);
            println!("keys read: {queued} run(s) queued for the keys that are not done");
            return Ok(queued);
        }
        wait_for_ends(c)?;
    }
}

pub fn run(
    c: &mut Client,
    pipeline: &str,
    partitions: &str,
    per_run: Option<i32>,
    detach: bool,
) -> anyhow::Result<i32> {
    let spec = spec(partitions)?;
    let ids: Vec<i64> = c
        .query(
            "SELECT orca.backfill($1, $2, $3)",
            &[&pipeline, &spec, &per_run],
        )
        .map_err(explain)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let tasks: Vec<i64> = c
        .query(
            "SELECT id FROM orca.runs WHERE id = ANY($1) AND kind = 'keys' ORDER BY id",
            &[&ids],
        )
        .map_err(explain)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if tasks.is_empty() {
        let parts: i64 = c
            .query_one(
                "SELECT coalesce(sum(cardinality(partitions)), 0)::bigint FROM orca.runs WHERE id = ANY($1)",
                &[&ids],
            )
            .map_err(explain)?
            .get(0);
        if parts > ids.len() as i64 {
            println!(
                "queued {} run(s) of {pipeline} over {parts} partitions",
                ids.len()
            );
        } else {
            println!("queued {} run(s) of {pipeline}", ids.len());
        }
    } else {
        println!(
            "queued keys task {}: it reads the keys of {pipeline} and queues runs for those not done",
            tasks
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if ids.is_empty() || detach {
        return Ok(0);
    }
    if !tasks.is_empty() && wait_for_keys(c, &tasks, pipeline)? == 0 && tasks.len() == ids.len() {
        return Ok(0);
    }
    follow(c, &ids, pipeline)
}

/// How long a follow waits for a notification that runs ended before it
/// looks at its runs anyway (a notification can be lost with its
/// connection, and a control plane before 0.3.0 sends none).
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// Listens on the channel the control plane notifies at the commit of
/// every transaction that ended runs (sql/runs.sql).
const RUNS_FINISHED: &str = "LISTEN orca_runs_finished";

/// Follows runs (and the runs their keys tasks queued) until every one has
/// finished; 1 when any did not succeed.
pub fn follow(c: &mut Client, ids: &[i64], pipeline: &str) -> anyhow::Result<i32> {
    let tty = std::io::stdout().is_terminal();
    let started = Instant::now();
    // On a terminal, a live bar (indicatif); in a pipe or a log, a line per
    // change, which scripts and tests read.
    let progress = tty.then(|| {
        let p = indicatif::ProgressBar::new(0);
        p.set_style(
            indicatif::ProgressStyle::with_template(
                "[{bar:30.green/white}] {pos}/{len} done: {msg} ({elapsed})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        p.enable_steady_tick(Duration::from_millis(200));
        p
    });
    // Listening before the first look: a run that ends between a look and
    // the wait after it leaves its notification waiting on the connection.
    c.batch_execute(RUNS_FINISHED)
        .context("listening for runs that end")?;
    let mut last = None;
    loop {
        let k = counts(c, ids)?;
        let total = k.done() + k.running + k.queued;
        if last != Some(k) {
            match &progress {
                Some(p) => {
                    p.set_length(u64::try_from(total).unwrap_or(0));
                    p.set_position(u64::try_from(k.done()).unwrap_or(0));
                    p.set_message(format!(
                        "{} succeeded, {} failed, {} cancelled; {} running, {} queued",
                        k.succeeded, k.failed, k.cancelled, k.running, k.queued
                    ));
                }
                None => println!("{}", bar(&k, total, started)),
            }
            last = Some(k);
        }
        if k.done() >= total {
            if let Some(p) = &progress {
                p.finish_and_clear();
                println!("{}", bar(&k, total, started));
            }
            if k.failed + k.cancelled > 0 {
                println!(
                    "{} run(s) did not succeed: orca runs --pipeline {pipeline} --status failed",
                    k.failed + k.cancelled
                );
                return Ok(1);
            }
            return Ok(0);
        }
        // A count over the runs' ids and the runs their keys tasks queued,
        // both by index (runs_pkey, runs_parent): ~0.3 ms however long the
        // history, so looking again whenever any run ends costs the
        // database little, and a backfill of short runs is seen done when
        // it is (a look every 50 ms was seen done 35-95 ms late).
        wait_for_ends(c)?;
    }
}

/// Waits until a transaction that ended runs commits (or [`FOLLOW_EVERY`]
/// passes), then takes every notification already there: one look
/// answers them all.
fn wait_for_ends(c: &mut Client) -> anyhow::Result<()> {
    use postgres::fallible_iterator::FallibleIterator;
    let mut notes = c.notifications();
    let came = notes
        .timeout_iter(FOLLOW_EVERY)
        .next()
        .context("waiting for runs to end")?;
    if came.is_some() {
        let mut pending = notes.iter();
        while pending.next().context("waiting for runs to end")?.is_some() {}
    }
    Ok(())
}
