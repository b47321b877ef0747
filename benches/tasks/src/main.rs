//! Tasks benchmark, by the method of `benches/peers` (its README) so that
//! it runs beside graphile-worker in the same run:
//!
//! 1. **enqueue**: N no-op tasks added by a driver (a leased attempt of a
//!    pipeline that declares the task) with `orca.add_tasks`,
//!    `ORCA_TASK_BATCH` tasks a call (default 500, as the SDK's fleet runtime
//!    sends them; each call is a batch, the unit runners claim), timed. The
//!    harness's `ENQ_CHUNK` (its peers' enqueue call size) does not apply:
//!    a bigger batch would make the burn-down a few calls, whatever N;
//! 2. `ANALYZE` (untimed), as the peers get;
//! 3. **burn-down**: K workers, each on its own connection as a runner's
//!    login with a runner token, claiming whole batches of up to
//!    `ORCA_CLAIM` tasks (`orca.claim_tasks`, default 500) and finishing each
//!    batch with its tasks' outputs (`orca.finish_tasks`); tasks/s is
//!    N / (drained - first claim), where drained is when a separate
//!    connection polling every 5 ms sees no batch unfinished;
//! 4. **add->start latency**: one idle worker LISTENing on `orca_tasks`;
//!    tasks are added one at a time, and the time from just before that call
//!    to the moment the worker's claim returns it is recorded (`LAT_WARMUP`
//!    discarded, `LAT_SAMPLES` kept, `LAT_GAP_MS` before each).
//!
//! Env: `BENCH_DB_URL` (a fresh database), `N`, `K`, `LAT_SAMPLES`,
//! `LAT_WARMUP`, `LAT_GAP_MS`, `ANALYZE_BEFORE_WORK`, `ORCA_TASK_BATCH`,
//! `ORCA_CLAIM`. Prints one `RESULT orca-tasks ...` line (jobs/s are
//! tasks/s), and details before it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use orca_bench_common::{env_num, pct, runner_options};
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};

/// Adds `n` no-op tasks from index `first`, `chunk` a call.
async fn add(
    c: &mut PgConnection,
    lease: uuid::Uuid,
    first: usize,
    n: usize,
    chunk: usize,
) -> Result<()> {
    let mut at = first;
    while at < first + n {
        let m = chunk.min(first + n - at);
        let inputs = serde_json::Value::Array((at..at + m).map(|i| serde_json::json!(i)).collect());
        let added: i32 =
            sqlx::query_scalar("SELECT orca.add_tasks($1, 'fan', '1000-01-01', 'noop', $2, $3)")
                .bind(lease)
                .bind(at as i32)
                .bind(&inputs)
                .fetch_one(&mut *c)
                .await
                .with_context(|| format!("add_tasks at {at}"))?;
        if added as usize != m {
            bail!("add_tasks at {at} added {added}, expected {m}");
        }
        at += m;
    }
    Ok(())
}

/// Claims whole batches and finishes each with its inputs as outputs;
/// returns how many tasks it finished.
async fn claim_and_finish(c: &mut PgConnection, name: &str, max: i32) -> Result<usize> {
    let got: Vec<(uuid::Uuid, serde_json::Value)> =
        sqlx::query_as("SELECT lease, inputs FROM orca.claim_tasks($1, 'default', $2)")
            .bind(name)
            .bind(max)
            .fetch_all(&mut *c)
            .await?;
    let mut n = 0;
    for (lease, inputs) in got {
        n += inputs.as_array().map_or(0, Vec::len);
        sqlx::query("SELECT orca.finish_tasks($1, $2)")
            .bind(lease)
            .bind(&inputs)
            .execute(&mut *c)
            .await?;
    }
    Ok(n)
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
    let chunk = env_num("ORCA_TASK_BATCH", 500)?.clamp(1, 10_000);
    let analyze = env_num("ANALYZE_BEFORE_WORK", 1)? == 1;
    let claim = env_num("ORCA_CLAIM", 500)?.clamp(1, 10_000) as i32;

    // The driver: a leased attempt of a pipeline that declares the task.
    let mut setup = PgConnection::connect(&url).await.context("connect")?;
    setup.execute("CREATE EXTENSION IF NOT EXISTS orca").await?;
    let manifest = serde_json::json!({
        "name": "bench",
        "steps": [{"name": "fan", "kind": "mapped"}],
        "partitions": {"daily": "1000-01-01"},
        "tasks": [{"name": "noop", "retries": 0}],
        "registry_hash": "bench",
        "binary": "/bin/true"
    });
    sqlx::query("SELECT orca.register($1)")
        .bind(&manifest)
        .execute(&mut setup)
        .await?;
    setup
        .execute("SELECT orca.run('bench', '1000-01-01')")
        .await?;
    let lease: uuid::Uuid = sqlx::query_scalar("SELECT lease FROM orca.claim('driver')")
        .fetch_one(&mut setup)
        .await
        .context("the driver's lease")?;
    // A long lease: the driver does not heartbeat while the bench runs.
    setup
        .execute("UPDATE orca.leases SET deadline = now() + interval '1 day'")
        .await?;

    // 1. Enqueue.
    let t_enq = Instant::now();
    add(&mut setup, lease, 0, n, chunk).await?;
    let enq = t_enq.elapsed();
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
    let mut conns = Vec::with_capacity(k);
    for _ in 0..k {
        conns.push(pool.acquire().await?);
    }
    let done = Arc::new(AtomicUsize::new(0));
    let first: Arc<std::sync::OnceLock<Instant>> = Arc::new(std::sync::OnceLock::new());
    let t_work = Instant::now();
    let mut workers = Vec::with_capacity(k);
    for (w, mut conn) in conns.into_iter().enumerate() {
        let done = done.clone();
        let first = first.clone();
        workers.push(tokio::spawn(async move {
            let name = format!("bench-{w}");
            loop {
                let got = claim_and_finish(&mut conn, &name, claim).await?;
                if got == 0 {
                    if done.load(Ordering::SeqCst) >= n {
                        return anyhow::Ok(());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                first.get_or_init(Instant::now);
                done.fetch_add(got, Ordering::SeqCst);
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    let t_handlers = Instant::now();
    let mut probe = PgConnection::connect(&url).await?;
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM orca.task_batches WHERE status <> 'finished'")
                .fetch_one(&mut probe)
                .await?;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t_drained = Instant::now();
    let t_first = *first.get().context("no task was ever claimed")?;

    // 3. add->start latency with an idle, listening worker.
    let mut listener = PgListener::connect(&url).await?;
    listener.listen("orca_tasks").await?;
    let mut worker = PgConnection::connect_with(&runner).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lat = Vec::with_capacity(lat_samples);
    for i in 0..(lat_warmup + lat_samples) {
        tokio::time::sleep(lat_gap).await;
        let t0 = Instant::now();
        add(&mut setup, lease, n + i, 1, 1).await?;
        loop {
            tokio::time::timeout(Duration::from_secs(10), listener.recv())
                .await
                .context("no notification within 10 s")??;
            if claim_and_finish(&mut worker, "lat", 1).await? > 0 {
                break;
            }
        }
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        if i >= lat_warmup {
            lat.push(ms);
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));

    let work = n as f64 / (t_drained - t_first).as_secs_f64();
    let wall = n as f64 / (t_drained - t_work).as_secs_f64();
    let enq_rate = n as f64 / enq.as_secs_f64();
    let avg = lat.iter().sum::<f64>() / lat.len().max(1) as f64;
    println!(
        "detail orca-tasks: K={k} workers claiming up to {claim} tasks (whole batches) and \
         finishing each batch in one orca.finish_tasks; enqueue via orca.add_tasks batches of \
         {chunk}: {:.1} ms; first claim {:.1} ms after start, first claim->last finish {:.1} ms, \
         last finish->drained {:.1} ms; analyze={analyze}; incl. startup {wall:.0} tasks/s; \
         latency (a task added alone, claimed alone) gap={}ms n={} min {:.2} avg {avg:.2} max {:.2} ms",
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
        "RESULT orca-tasks burn-down N={n} K={k}: {work:.0} jobs/s; enqueue {enq_rate:.0} jobs/s; add->start p50 {:.1} ms p99 {:.1} ms",
        pct(&lat, 50),
        pct(&lat, 99)
    );
    Ok(())
}
