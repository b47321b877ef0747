//! Dispatch benchmark, by the method of `benches/peers` (its README) so
//! that it runs beside graphile-worker (and any peer the harness runs):
//!
//! 1. **enqueue**: N no-op runs, with `orca.backfill` over ranges of
//!    `ENQ_CHUNK` daily partitions (one call per chunk), timed;
//! 2. `ANALYZE` (untimed), as the peers get;
//! 3. **burn-down**: one process with K concurrent workers, each on its own
//!    connection, claiming up to `ORCA_BATCH` attempts at a time and finishing
//!    each; jobs/s is N / (drained - first claim), where drained is when a
//!    separate connection polling every 5 ms sees no run unfinished;
//! 4. **add->start latency**: one idle worker LISTENing on `orca_work`; runs are
//!    added one at a time with `orca.run`, and the time from just before that
//!    call to the moment the worker's claim returns the attempt is recorded
//!    (`LAT_WARMUP` discarded, `LAT_SAMPLES` kept, `LAT_GAP_MS` before each).
//!
//! Env: `BENCH_DB_URL` (a fresh database), `N`, `K`, `LAT_SAMPLES`,
//! `LAT_WARMUP`, `LAT_GAP_MS`, `ENQ_CHUNK`, `ANALYZE_BEFORE_WORK`,
//! `ORCA_BATCH` (claim size, default ceil(500/K) like pg-boss's batch),
//! `ORCA_FINISH` (`each`: one orca.finish call per attempt, as a runner does;
//! `batch`: one orca.finish_many call per claimed batch; `local`: the shape
//! of graphile-worker's recommended `localQueue` setting, which the peer
//! harness uses: one connection claims up to `ORCA_LOCAL_QUEUE` attempts
//! (default 500, as graphile-worker's) into an in-process queue whenever
//! `ORCA_REFILL` places are free (default a quarter of the queue), K
//! executors take jobs from it, and `ORCA_COMPLETERS` connections (default 1)
//! finish what completed since their last call, up to `ORCA_FINISH_CHUNK`
//! (default a quarter of the queue) per orca.finish_many, as
//! graphile-worker's completeJobBatchDelay=0 batches completions; chunks
//! smaller than the queue let claims and completions overlap).
//! Prints one `RESULT orca ...` line, and details before it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use orca_bench_common::{env_num, pct, runner_options};
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};

mod local;

/// The daily partition `i` days after the pipeline's first, 1000-01-01.
fn day(i: usize) -> String {
    let first = chrono::NaiveDate::from_ymd_opt(1000, 1, 1).unwrap_or_default();
    (first + chrono::Days::new(i as u64))
        .format("%Y-%m-%d")
        .to_string()
}

async fn unfinished(c: &mut PgConnection) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM orca.runs WHERE status <> 'succeeded'")
            .fetch_one(c)
            .await?,
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    let url =
        std::env::var("BENCH_DB_URL").context("BENCH_DB_URL (a fresh database) is required")?;
    let n = env_num("N", 20_000)?;
    let k = env_num("K", 16)?.max(1);
    let lat_samples = env_num("LAT_SAMPLES", 500)?;
    let lat_warmup = env_num("LAT_WARMUP", 50)?;
    let lat_gap = Duration::from_millis(env_num("LAT_GAP_MS", 10)? as u64);
    let chunk = env_num("ENQ_CHUNK", 10_000)?.max(1);
    let analyze = env_num("ANALYZE_BEFORE_WORK", 1)? == 1;
    let batch = env_num("ORCA_BATCH", 500_usize.div_ceil(k))?.clamp(1, 1000);
    let finish_mode = std::env::var("ORCA_FINISH").unwrap_or_else(|_| "each".into());
    if !matches!(finish_mode.as_str(), "each" | "batch" | "local") {
        bail!("ORCA_FINISH must be each, batch or local, got {finish_mode}");
    }
    let local_queue = env_num("ORCA_LOCAL_QUEUE", 500)?.clamp(2, 1000);
    let completers = env_num("ORCA_COMPLETERS", 1)?.max(1);
    let shape = local::Shape {
        local_queue,
        completers,
        refill: env_num("ORCA_REFILL", local_queue / 4)?.clamp(1, local_queue),
        finish_chunk: env_num("ORCA_FINISH_CHUNK", local_queue / 4)?.clamp(1, 10_000),
    };

    let mut setup = PgConnection::connect(&url).await.context("connect")?;
    setup.execute("CREATE EXTENSION IF NOT EXISTS orca").await?;
    let manifest = serde_json::json!({
        "name": "bench",
        "steps": [{"name": "noop", "kind": "mapped"}],
        "partitions": {"daily": "1000-01-01"},
        "registry_hash": "bench",
        "binary": "/bin/true"
    });
    sqlx::query("SELECT orca.register($1)")
        .bind(&manifest)
        .execute(&mut setup)
        .await?;
    setup
        .execute(
            format!(
                "SET orca.max_partitions = {}",
                chunk.max(lat_samples + lat_warmup)
            )
            .as_str(),
        )
        .await?;

    // 1. Enqueue.
    let t_enq = Instant::now();
    let mut queued = 0usize;
    while queued < n {
        let m = chunk.min(n - queued);
        let spec = format!("{}..{}", day(queued), day(queued + m - 1));
        let got: i64 = sqlx::query_scalar("SELECT count(*) FROM orca.backfill('bench', $1)")
            .bind(&spec)
            .fetch_one(&mut setup)
            .await
            .with_context(|| format!("backfill {spec}"))?;
        if got as usize != m {
            bail!("backfill {spec} queued {got} runs, expected {m}");
        }
        queued += m;
    }
    let enq = t_enq.elapsed();
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orca.attempts WHERE status = 'pending'")
            .fetch_one(&mut setup)
            .await?;
    if pending as usize != n {
        bail!("expected {n} pending attempts, found {pending}");
    }
    if analyze {
        setup.execute("ANALYZE").await?;
    }

    // 2. Burn-down.
    let runner = runner_options(&mut setup, &url).await?;
    let pool = PgPoolOptions::new()
        .max_connections(k as u32 + 2)
        .min_connections(k as u32)
        .connect_with(runner.clone())
        .await?;
    // A connection per worker, opened before the clock starts; the local
    // mode takes its few connections from the pool itself.
    let mut conns = Vec::with_capacity(k);
    if finish_mode != "local" {
        for _ in 0..k {
            conns.push(pool.acquire().await?);
        }
    }
    let done = Arc::new(AtomicUsize::new(0));
    let first: Arc<std::sync::OnceLock<Instant>> = Arc::new(std::sync::OnceLock::new());
    let t_work = Instant::now();
    if finish_mode == "local" {
        local::burn_down(&pool, n, k, &shape, first.clone()).await?;
    }
    let mut workers = Vec::with_capacity(conns.len());
    for (w, mut conn) in conns.into_iter().enumerate() {
        let done = done.clone();
        let first = first.clone();
        let finish_mode = finish_mode.clone();
        workers.push(tokio::spawn(async move {
            let name = format!("bench-{w}");
            loop {
                let leases: Vec<uuid::Uuid> =
                    sqlx::query_scalar("SELECT lease FROM orca.claim($1, 'default', $2)")
                        .bind(&name)
                        .bind(batch as i32)
                        .fetch_all(&mut *conn)
                        .await?;
                if leases.is_empty() {
                    if done.load(Ordering::SeqCst) >= n {
                        return anyhow::Ok(());
                    }
                    // Others hold the rest; wait for them to finish or hand back.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                first.get_or_init(Instant::now);
                if finish_mode == "batch" {
                    sqlx::query("SELECT orca.finish_many($1)")
                        .bind(&leases)
                        .execute(&mut *conn)
                        .await?;
                } else {
                    for l in &leases {
                        sqlx::query("SELECT orca.finish($1, true)")
                            .bind(l)
                            .execute(&mut *conn)
                            .await?;
                    }
                }
                done.fetch_add(leases.len(), Ordering::SeqCst);
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    let t_handlers = Instant::now();
    let mut probe = PgConnection::connect(&url).await?;
    loop {
        if unfinished(&mut probe).await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t_drained = Instant::now();
    let t_first = *first.get().context("no attempt was ever claimed")?;

    // 3. add->start latency with an idle, listening worker.
    let mut listener = PgListener::connect(&url).await?;
    listener.listen("orca_work").await?;
    let mut worker = PgConnection::connect_with(&runner).await?;
    let mut adder = PgConnection::connect(&url).await?;
    adder
        .execute(format!("SET orca.max_partitions = {}", lat_samples + lat_warmup).as_str())
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lat = Vec::with_capacity(lat_samples);
    for i in 0..(lat_warmup + lat_samples) {
        tokio::time::sleep(lat_gap).await;
        let part = day(n + i);
        let t0 = Instant::now();
        sqlx::query("SELECT orca.run('bench', $1)")
            .bind(&part)
            .execute(&mut adder)
            .await?;
        let lease = loop {
            tokio::time::timeout(Duration::from_secs(10), listener.recv())
                .await
                .context("no notification within 10 s")??;
            let got: Option<uuid::Uuid> =
                sqlx::query_scalar("SELECT lease FROM orca.claim('lat', 'default', 1)")
                    .fetch_optional(&mut worker)
                    .await?;
            if let Some(l) = got {
                break l;
            }
        };
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        if i >= lat_warmup {
            lat.push(ms);
        }
        sqlx::query("SELECT orca.finish($1, true)")
            .bind(lease)
            .execute(&mut worker)
            .await?;
    }
    lat.sort_by(|a, b| a.total_cmp(b));

    let work = n as f64 / (t_drained - t_first).as_secs_f64();
    let wall = n as f64 / (t_drained - t_work).as_secs_f64();
    let enq_rate = n as f64 / enq.as_secs_f64();
    let avg = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    println!(
        "detail orca: K={k} workers, {}; enqueue via orca.backfill chunks of {chunk}: {:.1} ms; \
         first claim {:.1} ms after start, first claim->last finish {:.1} ms, last finish->drained {:.1} ms; \
         analyze={analyze}; incl. startup {wall:.0} jobs/s; latency gap={}ms n={} min {:.2} avg {avg:.2} max {:.2} ms",
        if finish_mode == "local" {
            format!(
                "local queue {local_queue} refilled when {} free, {completers} completer(s) \
                 calling orca.finish_many on up to {}",
                shape.refill, shape.finish_chunk
            )
        } else {
            format!("claim batch {batch}, finish {finish_mode}")
        },
        enq.as_secs_f64() * 1000.0,
        (t_first - t_work).as_secs_f64() * 1000.0,
        (t_handlers - t_first).as_secs_f64() * 1000.0,
        (t_drained - t_handlers).as_secs_f64() * 1000.0,
        lat_gap.as_millis(),
        lat.len(),
        lat.first().copied().unwrap_or(f64::NAN),
        lat.last().copied().unwrap_or(f64::NAN),
    );
    println!(
        "RESULT orca burn-down N={n} K={k}: {work:.0} jobs/s; enqueue {enq_rate:.0} jobs/s; add->start p50 {:.1} ms p99 {:.1} ms",
        pct(&lat, 50),
        pct(&lat, 99)
    );
    Ok(())
}
