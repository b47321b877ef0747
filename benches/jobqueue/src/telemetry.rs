//! What the harness reads: the descriptor line, then every `SAMPLE_EVERY_S`
//! (aligned to the wall clock) claim latency p50/p95/p99 over the last 30
//! seconds, enqueue and completion rates and the queue's depth, one JSON
//! line each.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use sqlx::PgPool;

/// The latency window, in seconds, the contract asks for.
const WINDOW_S: u64 = 30;

/// Counters the producer and workers add to, and the latency window.
#[derive(Default)]
pub struct Stats {
    pub enqueued: AtomicU64,
    pub completed: AtomicU64,
    pub depth: AtomicI64,
    latency: Mutex<Window>,
}

/// One histogram (microseconds, 3 significant figures) per second of the
/// window: bounded memory whatever the rate.
#[derive(Default)]
struct Window {
    secs: VecDeque<(u64, Histogram<u64>)>,
}

pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

impl Stats {
    /// Records a job's pickup latency: from just before it was added to
    /// when a worker started it.
    pub fn claimed(&self, added_micros: i64) {
        let now = now_micros();
        let us = (now - added_micros).max(1) as u64;
        let sec = (now / 1_000_000) as u64;
        let Ok(mut w) = self.latency.lock() else {
            return;
        };
        if w.secs.back().is_none_or(|(s, _)| *s != sec) {
            match Histogram::new_with_bounds(1, 3_600_000_000, 3) {
                Ok(h) => w.secs.push_back((sec, h)),
                Err(_) => return,
            }
            while w.secs.front().is_some_and(|(s, _)| *s + WINDOW_S <= sec) {
                w.secs.pop_front();
            }
        }
        if let Some((_, h)) = w.secs.back_mut() {
            h.saturating_record(us);
        }
    }

    /// p50, p95 and p99 in milliseconds over the window, if any job started.
    fn percentiles(&self) -> Option<[f64; 3]> {
        let sec = (now_micros() / 1_000_000) as u64;
        let w = self.latency.lock().ok()?;
        let mut all = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).ok()?;
        for (_, h) in w.secs.iter().filter(|(s, _)| *s + WINDOW_S > sec) {
            all.add(h).ok()?;
        }
        if all.is_empty() {
            return None;
        }
        Some([0.5, 0.95, 0.99].map(|q| all.value_at_quantile(q) as f64 / 1000.0))
    }
}

fn timestamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The startup line the harness records in its manifest.
pub fn descriptor(version: &str) {
    let db = std::env::var("DATABASE_URL")
        .ok()
        .and_then(|u| {
            u.rsplit('/')
                .next()
                .map(|d| d.split('?').next().unwrap_or(d).to_string())
        })
        .unwrap_or_default();
    let line = serde_json::json!({
        "kind": "descriptor",
        "system": "orca",
        "event_tables": ["orca.task_batches", "orca.task_queue", "orca.task_leases",
                         "orca.task_steps", "orca.events"],
        "extensions": ["orca"],
        "version": env!("CARGO_PKG_VERSION"),
        "schema_version": version,
        "db_name": db,
        "started_at": timestamp(),
    });
    println!("{line}");
}

fn metric(metric: &str, value: f64, window_s: u64) {
    let line = serde_json::json!({
        "t": timestamp(), "system": "orca", "kind": "adapter", "subject_kind": "adapter",
        "subject": "", "metric": metric, "value": value, "window_s": window_s,
    });
    println!("{line}");
}

/// Prints a sample every `every` seconds, the first at the next multiple of
/// `every` on the wall clock; a last one when told to stop.
pub async fn sampler(every: u64, stats: Arc<Stats>, stop: Arc<AtomicBool>) {
    let period = every * 1_000_000;
    let wait = period - (now_micros() as u64 % period);
    tokio::time::sleep(Duration::from_micros(wait)).await;
    let mut last = (
        stats.enqueued.load(Ordering::Relaxed),
        stats.completed.load(Ordering::Relaxed),
        std::time::Instant::now(),
    );
    loop {
        let (enq, done) = (
            stats.enqueued.load(Ordering::Relaxed),
            stats.completed.load(Ordering::Relaxed),
        );
        let secs = last.2.elapsed().as_secs_f64().max(0.001);
        let (p50, p95, p99) = match stats.percentiles() {
            Some([a, b, c]) => (a, b, c),
            None => (0.0, 0.0, 0.0),
        };
        metric("claim_p50_ms", p50, WINDOW_S);
        metric("claim_p95_ms", p95, WINDOW_S);
        metric("claim_p99_ms", p99, WINDOW_S);
        metric("enqueue_rate", (enq - last.0) as f64 / secs, every);
        metric("completion_rate", (done - last.1) as f64 / secs, every);
        metric("queue_depth", stats.depth.load(Ordering::Relaxed) as f64, 0);
        last = (enq, done, std::time::Instant::now());
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let wait = period - (now_micros() as u64 % period);
        let stopped = async {
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_micros(wait)) => {}
            _ = stopped => {}
        }
    }
}

/// The jobs added and not yet claimed: the queued batches' sizes.
pub async fn depth(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT coalesce(sum(size), 0)::bigint FROM orca.task_queue")
        .fetch_one(pool)
        .await
}

/// Keeps `stats.depth` current (every second) for the samples.
pub async fn depth_poller(pool: PgPool, stats: Arc<Stats>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        if let Ok(d) = depth(&pool).await {
            stats.depth.store(d, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
