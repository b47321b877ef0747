//! The producer: adds jobs as tasks of the driver's step, a batch of up to
//! `PRODUCER_BATCH_MAX` a call, paced by the wall clock (fixed rate), by the
//! queue's depth (depth-target) or by the harness's `ENQUEUE <n>` lines.
//! A call that fails is made again with the same submission numbers, so a
//! batch whose commit was lost with its connection is not added twice.

use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sqlx::PgPool;

use crate::config::Config;
use crate::driver::{self, Driver};
use crate::telemetry::{self, now_micros, Stats};

/// Reads `ENQUEUE <n>` lines from stdin (the harness's pacer) on a thread
/// of its own, as stdin blocks.
fn harness_tokens() -> tokio::sync::mpsc::UnboundedReceiver<usize> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if let Some(n) = line.trim().strip_prefix("ENQUEUE ") {
                if let Ok(n) = n.trim().parse::<usize>() {
                    if tx.send(n).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// The offered rate: `PRODUCER_RATE_CONTROL_FILE` when it holds a number.
fn read_rate(cfg: &Config, current: f64) -> f64 {
    cfg.rate_file
        .as_deref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|r| *r >= 0.0)
        .unwrap_or(current)
}

/// Adds `n` jobs at the driver's next submission number; returns once they
/// are in the control plane (added now or found added by an earlier try).
async fn add(admin: &PgPool, d: &mut Driver, n: usize, pad: &str) -> Result<()> {
    let t = now_micros();
    let inputs = serde_json::Value::Array(
        (0..n)
            .map(|_| serde_json::json!({"t": t, "p": pad}))
            .collect(),
    );
    sqlx::query_scalar::<_, i32>("SELECT orca.add_tasks($1, $2, $3, $4, $5, $6)")
        .bind(d.lease)
        .bind(driver::STEP)
        .bind(driver::PARTITION)
        .bind(driver::TASK)
        .bind(d.next as i32)
        .bind(&inputs)
        .fetch_one(admin)
        .await
        .context("orca.add_tasks")?;
    d.next += n as i64;
    Ok(())
}

pub async fn run(cfg: Config, admin: PgPool, stats: Arc<Stats>, stop: Arc<AtomicBool>) {
    let pad = "x".repeat(cfg.payload_bytes);
    let mut tokens = cfg.harness_pacing.then(harness_tokens);
    let mut driver: Option<Driver> = None;
    let mut heartbeat_at = Instant::now();
    let mut rate = read_rate(&cfg, cfg.rate);
    let mut rate_at = Instant::now();
    let mut credit = 0.0_f64;
    let mut credited_at = Instant::now();
    let mut pending = 0usize;
    let tick = Duration::from_millis(cfg.batch_ms);
    let mut next_tick = Instant::now();
    let mut errors = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let Some(d) = driver.as_mut() else {
            match driver::acquire(&admin).await {
                Ok(d) => {
                    driver = Some(d);
                    heartbeat_at = Instant::now();
                }
                Err(e) => {
                    eprintln!("orca-adapter: no driver yet: {e:#}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            continue;
        };
        if heartbeat_at.elapsed().as_secs() as usize * 5 >= cfg.driver_lease_s {
            match driver::heartbeat(&admin, d).await {
                Ok(()) => heartbeat_at = Instant::now(),
                Err(e) if driver::lease_lost(&e) => {
                    eprintln!("orca-adapter: the driver's lease is gone ({e:#}); a new one");
                    driver = None;
                    continue;
                }
                Err(e) => eprintln!("orca-adapter: heartbeat: {e:#}"),
            }
        }
        // What to add next, unless a failed batch is still to be added.
        if pending == 0 {
            pending = if let Some(rx) = tokens.as_mut() {
                match tokio::time::timeout(tick, rx.recv()).await {
                    Ok(Some(n)) => n.min(cfg.batch_max),
                    Ok(None) => {
                        tokens = None;
                        0
                    }
                    Err(_) => 0,
                }
            } else if cfg.depth_target {
                match telemetry::depth(&admin).await {
                    Ok(depth) if depth < cfg.target_depth => {
                        ((cfg.target_depth - depth) as usize).min(cfg.batch_max)
                    }
                    Ok(_) => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        0
                    }
                    Err(e) => {
                        eprintln!("orca-adapter: depth: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        0
                    }
                }
            } else {
                // Offered load is credited on the wall clock, so a slow call
                // does not lower it (the contract's pacing rule).
                next_tick += tick;
                let now = Instant::now();
                if next_tick > now {
                    tokio::time::sleep(next_tick - now).await;
                } else {
                    next_tick = now;
                }
                if rate_at.elapsed() >= Duration::from_secs(1) {
                    rate = read_rate(&cfg, rate);
                    rate_at = Instant::now();
                }
                let now = Instant::now();
                credit += rate * now.duration_since(credited_at).as_secs_f64();
                credited_at = now;
                let whole = (credit.floor() as usize).min(cfg.batch_max);
                credit -= whole as f64;
                whole
            };
        }
        if pending == 0 {
            continue;
        }
        match add(&admin, d, pending, &pad).await {
            Ok(()) => {
                stats.enqueued.fetch_add(pending as u64, Ordering::Relaxed);
                pending = 0;
                errors = 0;
            }
            Err(e) if driver::lease_lost(&e) => {
                eprintln!("orca-adapter: the driver's lease is gone ({e:#}); a new one");
                driver = None;
            }
            Err(e) => {
                errors += 1;
                if errors == 1 || errors.is_power_of_two() {
                    eprintln!("orca-adapter: add_tasks failed ({errors} in a row): {e:#}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
