//! The `local` burn-down: a runner-side queue in front of K executors, with
//! claims and completions batched across executors, as graphile-worker's
//! `localQueue` and `completeJobBatchDelay` settings do.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sqlx::PgPool;
use tokio::sync::{mpsc, Mutex};

/// How the local queue is fed and drained.
#[derive(Clone, Copy)]
pub struct Shape {
    /// Attempts claimed and not yet finished, at most.
    pub local_queue: usize,
    /// Connections finishing completed attempts.
    pub completers: usize,
    /// The claimer refills once this many places are free.
    pub refill: usize,
    /// A completer finishes at most this many attempts per call.
    pub finish_chunk: usize,
}

/// Claims, runs and finishes `n` attempts; returns once all are finished.
pub async fn burn_down(
    pool: &PgPool,
    n: usize,
    executors: usize,
    shape: &Shape,
    first: Arc<OnceLock<Instant>>,
) -> Result<()> {
    let Shape {
        local_queue,
        completers,
        refill,
        finish_chunk,
    } = *shape;
    // Claimed and not yet finished. Claims and completions go in chunks
    // smaller than the queue so that the claimer and the completers work at
    // the same time: with one whole-queue batch each they took turns.
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (job_tx, job_rx) = mpsc::unbounded_channel::<uuid::Uuid>();
    let (done_tx, done_rx) = mpsc::unbounded_channel::<uuid::Uuid>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let done_rx = Arc::new(Mutex::new(done_rx));

    let mut tasks = Vec::new();
    for _ in 0..executors {
        let job_rx = job_rx.clone();
        let done_tx = done_tx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let next = job_rx.lock().await.recv().await;
                let Some(lease) = next else {
                    return anyhow::Ok(());
                };
                // The job is a no-op; handing it on is all there is to do.
                done_tx
                    .send(lease)
                    .context("the completers stopped early")?;
            }
        }));
    }
    drop(done_tx);

    for _ in 0..completers {
        let done_rx = done_rx.clone();
        let in_flight = in_flight.clone();
        let mut conn = pool.acquire().await?;
        tasks.push(tokio::spawn(async move {
            loop {
                let batch = {
                    let mut rx = done_rx.lock().await;
                    let Some(one) = rx.recv().await else {
                        return anyhow::Ok(());
                    };
                    let mut batch = vec![one];
                    while batch.len() < finish_chunk {
                        match rx.try_recv() {
                            Ok(l) => batch.push(l),
                            Err(_) => break,
                        }
                    }
                    batch
                };
                sqlx::query("SELECT orca.finish_many($1)")
                    .bind(&batch)
                    .execute(&mut *conn)
                    .await?;
                in_flight.fetch_sub(batch.len(), Ordering::SeqCst);
            }
        }));
    }

    let mut conn = pool.acquire().await?;
    let mut claimed = 0usize;
    while claimed < n {
        let room = local_queue.saturating_sub(in_flight.load(Ordering::SeqCst));
        if room < refill {
            tokio::time::sleep(Duration::from_micros(200)).await;
            continue;
        }
        let leases: Vec<uuid::Uuid> =
            sqlx::query_scalar("SELECT lease FROM orca.claim('bench-local', 'default', $1)")
                .bind(room as i32)
                .fetch_all(&mut *conn)
                .await?;
        if leases.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        first.get_or_init(Instant::now);
        claimed += leases.len();
        in_flight.fetch_add(leases.len(), Ordering::SeqCst);
        for l in leases {
            job_tx.send(l).context("the executors stopped early")?;
        }
    }
    drop(job_tx);
    for t in tasks {
        t.await??;
    }
    Ok(())
}
