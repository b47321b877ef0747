//! Orca's adapter for the public job-queue harness
//! `hardbyte/postgresql-job-queue-benchmarking` (its CONTRIBUTING_ADAPTERS.md
//! is the contract): one long-running process that produces jobs and works
//! them, printing the harness's JSONL on stdout and its logs on stderr.
//!
//! A job is an Orca task. The producer is a step attempt (a run of the
//! `jobqueue` pipeline, claimed and heartbeated here as a runner would),
//! adding jobs with `orca.add_tasks`, a batch a call. The consumer works as
//! a runner serves tasks, on a runner login with a runner token: whole
//! batches claimed (`orca.claim_tasks`) while it has room, their jobs run
//! by `WORKER_COUNT` workers one job each at a time (`JOB_WORK_MS` of sleep
//! each), each batch finished in one `orca.finish_tasks`. Nothing here
//! is private SQL: these are the functions the SDK's fleet runtime and the
//! runner call. Lapsed task leases (a killed replica's) are retried by
//! `orca.tick`, which the extension's background worker runs: the database
//! must be in `orca.databases` of a cluster that preloads `orca`.
//!
//! Env (the harness's): `DATABASE_URL`, `PRODUCER_MODE` (`fixed` or
//! `depth-target`), `PRODUCER_RATE`, `PRODUCER_RATE_CONTROL_FILE` (read each
//! second: the harness raises the rate there for high-load phases),
//! `PRODUCER_PACING` (`harness`: `ENQUEUE <n>` lines on stdin),
//! `PRODUCER_BATCH_MAX` (128), `PRODUCER_BATCH_MS` (25), `TARGET_DEPTH`
//! (1000), `WORKER_COUNT` (32), `JOB_PAYLOAD_BYTES` (256), `JOB_WORK_MS`
//! (1), `SAMPLE_EVERY_S` (5). Orca's own: `ORCA_DRIVER_LEASE_S` (the producer's attempt lease, default 300: it
//! outlives the harness's 30-second Postgres outage).

mod config;
mod driver;
mod producer;
mod telemetry;
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use orca_bench_common::runner_options;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};

use crate::config::Config;
use crate::telemetry::Stats;

/// Waits for the database, retrying: a replica restarted mid-outage starts
/// before Postgres does.
async fn connect_retrying(url: &str) -> Result<PgConnection> {
    let mut tries = 0;
    loop {
        match PgConnection::connect(url).await {
            Ok(c) => return Ok(c),
            Err(e) if tries < 120 => {
                tries += 1;
                eprintln!("orca-adapter: connecting: {e}; again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e).context("connecting to DATABASE_URL"),
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let cfg = Config::from_env()?;
    let mut setup = connect_retrying(&cfg.url).await?;
    let version = driver::install(&mut setup).await?;
    telemetry::descriptor(&version);

    let runner = runner_options(&mut setup, &cfg.url).await?;
    drop(setup);
    let pool = PgPoolOptions::new()
        .max_connections(cfg.workers as u32 + 2)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(runner);
    // The producer's connections: its attempt's lease is claimed and
    // extended for ORCA_DRIVER_LEASE_S (a superuser setting).
    let lease_s = cfg.driver_lease_s.to_string();
    let admin_opts: sqlx::postgres::PgConnectOptions = cfg.url.parse().context("DATABASE_URL")?;
    let admin = PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(admin_opts.options([("orca.lease_seconds", lease_s.as_str())]));

    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(tokio::sync::Notify::new());
    let name = format!("jobqueue-{}", std::process::id());

    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(producer::run(
        cfg.clone(),
        admin.clone(),
        stats.clone(),
        stop.clone(),
    )));
    tasks.extend(worker::spawn(
        &cfg,
        pool.clone(),
        name,
        stats.clone(),
        stop.clone(),
        wake.clone(),
    ));
    tasks.push(tokio::spawn(worker::listen(
        cfg.url.clone(),
        wake.clone(),
        stop.clone(),
    )));
    tasks.push(tokio::spawn(telemetry::depth_poller(
        admin.clone(),
        stats.clone(),
        stop.clone(),
    )));
    let sampler = tokio::spawn(telemetry::sampler(
        cfg.sample_every_s,
        stats.clone(),
        stop.clone(),
    ));

    // SIGTERM or SIGINT: stop, print the last sample, exit 0 (the harness
    // allows 5 seconds).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    stop.store(true, Ordering::SeqCst);
    wake.notify_waiters();
    let _ = tokio::time::timeout(Duration::from_secs(3), sampler).await;
    for t in tasks {
        t.abort();
    }
    Ok(())
}
