//! The consumer, shaped as Orca's runner serves tasks (runner/src/tasks.rs):
//! one claimer takes whole batches (`orca.claim_tasks`) while fewer jobs
//! than `WORKER_COUNT` are queued or running here, and puts their jobs on
//! one queue; `WORKER_COUNT` workers take jobs from it one at a time (so a
//! batch's jobs run side by side), and the worker that ends a batch's last
//! job finishes the batch in one call (`orca.finish_tasks`). An idle
//! claimer waits for `NOTIFY orca_tasks` or half a second.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::{mpsc, Mutex, Notify};

use crate::config::Config;
use crate::telemetry::Stats;

/// A claimed batch: its lease and how many of its jobs are still to end.
struct Batch {
    lease: uuid::Uuid,
    size: usize,
    left: AtomicUsize,
}

/// A job of a batch: when it was added (for the claim latency).
type Job = (Arc<Batch>, i64);

/// Finishes a batch; a connection lost on the way is tried again (the
/// lease still holds), an error of the control plane is not (the batch's
/// lease lapsed or its run ended: the tick retries or cancels it).
async fn finish(pool: &PgPool, lease: uuid::Uuid, n: usize) -> bool {
    let outputs = serde_json::Value::Array(vec![serde_json::Value::Null; n]);
    for tries in 0..20 {
        match sqlx::query("SELECT orca.finish_tasks($1, $2)")
            .bind(lease)
            .bind(&outputs)
            .execute(pool)
            .await
        {
            Ok(_) => return true,
            Err(sqlx::Error::Database(e)) if e.code().is_some_and(|c| c.starts_with("OR")) => {
                eprintln!("orca-adapter: finish_tasks: {e}");
                return false;
            }
            Err(e) => {
                if tries == 0 {
                    eprintln!("orca-adapter: finish_tasks: {e}; again");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    false
}

/// Starts the claimer and the workers; they stop with `stop`.
pub fn spawn(
    cfg: &Config,
    pool: PgPool,
    name: String,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
    wake: Arc<Notify>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (tx, rx) = mpsc::unbounded_channel::<Job>();
    let rx = Arc::new(Mutex::new(rx));
    // Jobs claimed here and not yet ended.
    let held = Arc::new(AtomicUsize::new(0));
    let freed = Arc::new(Notify::new());
    let mut handles = vec![tokio::spawn(claimer(
        cfg.workers,
        pool.clone(),
        name,
        tx,
        held.clone(),
        freed.clone(),
        stop.clone(),
        wake,
    ))];
    let work = Duration::from_millis(cfg.work_ms);
    for _ in 0..cfg.workers {
        let (rx, pool, stats, held, freed) = (
            rx.clone(),
            pool.clone(),
            stats.clone(),
            held.clone(),
            freed.clone(),
        );
        handles.push(tokio::spawn(async move {
            loop {
                let job = rx.lock().await.recv().await;
                let Some((batch, added)) = job else { return };
                stats.claimed(added);
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                if batch.left.fetch_sub(1, Ordering::AcqRel) == 1
                    && finish(&pool, batch.lease, batch.size).await
                {
                    stats
                        .completed
                        .fetch_add(batch.size as u64, Ordering::Relaxed);
                }
                held.fetch_sub(1, Ordering::AcqRel);
                freed.notify_one();
            }
        }));
    }
    handles
}

#[allow(clippy::too_many_arguments)]
async fn claimer(
    workers: usize,
    pool: PgPool,
    name: String,
    tx: mpsc::UnboundedSender<Job>,
    held: Arc<AtomicUsize>,
    freed: Arc<Notify>,
    stop: Arc<AtomicBool>,
    wake: Arc<Notify>,
) {
    let mut errors = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let room = workers.saturating_sub(held.load(Ordering::Acquire));
        if room == 0 {
            let _ = tokio::time::timeout(Duration::from_millis(100), freed.notified()).await;
            continue;
        }
        let got: Result<Vec<(uuid::Uuid, serde_json::Value)>, _> =
            sqlx::query_as("SELECT lease, inputs FROM orca.claim_tasks($1, 'default', $2)")
                .bind(&name)
                .bind(room as i32)
                .fetch_all(&pool)
                .await;
        let got = match got {
            Ok(got) => {
                errors = 0;
                got
            }
            Err(e) => {
                errors += 1;
                if errors == 1 || errors.is_power_of_two() {
                    eprintln!("orca-adapter: claim_tasks failed ({errors} in a row): {e}");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        if got.is_empty() {
            let _ = tokio::time::timeout(Duration::from_millis(500), wake.notified()).await;
            continue;
        }
        for (lease, inputs) in got {
            let jobs = inputs.as_array().map_or(&[][..], Vec::as_slice);
            if jobs.is_empty() {
                continue;
            }
            let batch = Arc::new(Batch {
                lease,
                size: jobs.len(),
                left: AtomicUsize::new(jobs.len()),
            });
            held.fetch_add(jobs.len(), Ordering::AcqRel);
            for job in jobs {
                let added = job.get("t").and_then(|t| t.as_i64()).unwrap_or(0);
                if tx.send((batch.clone(), added)).is_err() {
                    return;
                }
            }
        }
    }
}

/// Wakes the claimer on `NOTIFY orca_tasks`; listens again after the
/// connection is lost.
pub async fn listen(url: String, wake: Arc<Notify>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        let mut l = match PgListener::connect(&url).await {
            Ok(l) => l,
            Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if l.listen("orca_tasks").await.is_err() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        while let Ok(Some(_)) = l.try_recv().await {
            wake.notify_one();
        }
        // The connection was lost (try_recv gives None or an error): the
        // claimer polls until it is back.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
