//! `orca-bench-sync cdc`: the postgres_cdc source of a table (`CDC_KEYS`
//! keys, `REPLICA IDENTITY FULL`, the slot on the same server), merged into
//! a Postgres table and then into an Iceberg table (copy-on-write), one
//! after the other on the same Postgres, each:
//! - a backlog of `CDC_CHANGES` updates in transactions of 100 read by one
//!   attempt: changes/s end to end;
//! - a writer at a steady `CDC_RATE` changes/s for `CDC_SECONDS` while
//!   attempts run back to back (each a claim, a slot connection, the WAL up
//!   to its start, the epochs' commits), with each key's last change's
//!   latency from its commit (`at`, the writer's `clock_timestamp()`) to its
//!   epoch (`_orca_synced_at`, when the epoch was staged) and, for Iceberg,
//!   to when a reader sees it (the commit of the snapshot that holds its
//!   epoch: the first snapshot of the table at or after the epoch was
//!   staged), and the slot's lag after each attempt.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use futures::TryStreamExt;
use orca_engine::attempt::{self, Options};
use orca_lake::scan::{self, ScanRequest};

use crate::env_or;

/// The destination the changes are merged into.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Postgres,
    Iceberg,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Postgres => "postgres",
            Target::Iceberg => "iceberg",
        }
    }
}

/// The destination's namespace or schema.
const RAW: &str = "bench_raw";

/// One attempt of the sync, in process; returns (rows, seconds).
fn attempt(url: &str, sync: &str, store: &std::path::Path) -> Result<(u64, f64)> {
    let opts = Options {
        database_url: url.to_string(),
        org: "default".into(),
        sync: sync.to_string(),
        store_url: store.to_string_lossy().into_owned(),
        batch_rows: Some(env_or("BATCH_ROWS", 10_000)),
        lanes: None,
        lease: None,
        control: None,
        edge: None,
        crash: None,
    };
    let started = Instant::now();
    let o = attempt::run(&opts)?;
    Ok((o.rows, started.elapsed().as_secs_f64()))
}

/// A writer of `rate` changes/s (statements of 10 updates) until `stop`;
/// returns the changes it wrote.
fn steady_writer(
    url: &str,
    keys: i64,
    rate: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<u64>> {
    let url = url.to_string();
    std::thread::spawn(move || -> Result<u64> {
        let mut w = postgres::Client::connect(&url, postgres::NoTls)?;
        let per = 10u64;
        let every = Duration::from_secs_f64(per as f64 / rate.max(1) as f64);
        let started = Instant::now();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let from = 1 + (n as i64 * 7) % keys;
            w.batch_execute(&format!(
                "UPDATE bench_cdc SET v = v + 1, at = clock_timestamp() WHERE id BETWEEN {from} AND {}",
                from + per as i64 - 1
            ))?;
            n += per;
            let due = every * (n / per) as u32;
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        Ok(n)
    })
}

/// p50, p99 and max of `v` (NaN when empty).
fn percentiles(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99), v[v.len() - 1])
}

pub(crate) fn run(url: &str, into: Target) -> Result<()> {
    let keys: i64 = env_or("CDC_KEYS", 10_000);
    let changes: i64 = env_or("CDC_CHANGES", 200_000);
    let rate: u64 = env_or("CDC_RATE", 2_000);
    let seconds: u64 = env_or("CDC_SECONDS", 20);
    let into_name = into.name();
    if into == Target::Iceberg && std::env::var_os("ORCA_WAREHOUSE").is_none() {
        println!("# cdc into iceberg not run (set ORCA_WAREHOUSE, as run.sh does)");
        return Ok(());
    }
    let work =
        std::env::temp_dir().join(format!("orca-bench-cdc-{}-{into_name}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let sync = format!("bench_cdc_{}_{into_name}", std::process::id());
    let mut c = postgres::Client::connect(url, postgres::NoTls)?;
    c.batch_execute(&format!(
        "DROP TABLE IF EXISTS bench_cdc; DROP SCHEMA IF EXISTS {RAW} CASCADE;
         CREATE TABLE bench_cdc (id bigint PRIMARY KEY, v int NOT NULL, amount numeric(12,2),
                                 at timestamptz NOT NULL, note text);
         ALTER TABLE bench_cdc REPLICA IDENTITY FULL;
         INSERT INTO bench_cdc SELECT g, 0, g / 100.0, clock_timestamp(), 'n' || g
         FROM generate_series(1, {keys}) g;
         SELECT orca.allow('default', '127.0.0.1');"
    ))?;
    let source = serde_json::json!({"type": "postgres_cdc", "url": url});
    let dest = match into {
        Target::Postgres => serde_json::json!({"type": "postgres", "url": url, "schema": RAW}),
        Target::Iceberg => serde_json::json!({"type": "iceberg", "namespace": RAW}),
    };
    let streams = serde_json::json!([{"name": "bench_cdc", "table": "public.bench_cdc",
                                      "primary_key": ["id"], "mode": "merge"}]);
    c.execute(
        "SELECT orca.create_sync($1, $2, $3, $4)",
        &[&sync, &source, &dest, &streams],
    )?;
    let store = work.join("store");
    let (snap, snap_s) = attempt(url, &sync, &store)?;
    println!("# cdc into {into_name}: snapshot of {snap} rows in {snap_s:.2} s");

    // A backlog of changes, then one attempt reads it.
    let per_txn = 100i64;
    let mut sql = String::new();
    for t in 0..changes / per_txn {
        let from = 1 + (t * per_txn) % keys;
        sql.push_str(&format!(
            "UPDATE bench_cdc SET v = v + 1, at = clock_timestamp() WHERE id BETWEEN {from} AND {};\n",
            from + per_txn - 1
        ));
    }
    c.batch_execute(&sql)?;
    let (rows, secs) = attempt(url, &sync, &store)?;
    println!(
        "RESULT cdc-backlog-{into_name} changes={rows}: {secs:.2} s, {:.0} changes/s end to end \
         (transactions of {per_txn}, merged into {into_name}; goal for iceberg >= 100000)",
        rows as f64 / secs
    );

    // A steady writer while attempts run back to back.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = steady_writer(url, keys, rate, stop.clone());
    let steady_from: i64 = c
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
            &[],
        )?
        .get(0);
    let started = Instant::now();
    let mut attempts = 0u64;
    let mut lags = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        attempt(url, &sync, &store)?;
        attempts += 1;
        let lag: Option<i64> = c
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
                 FROM pg_replication_slots WHERE slot_name LIKE $1",
                &[&format!("orca_{}_%", &sync[..sync.len().min(40)])],
            )?
            .get(0);
        lags.extend(lag);
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer
        .join()
        .map_err(|_| anyhow!("the writer panicked"))??;
    attempt(url, &sync, &store)?;
    let (epoch, visible) = match into {
        Target::Postgres => (postgres_latencies(&mut c, steady_from)?, None),
        Target::Iceberg => {
            let (e, v) = iceberg_latencies(url, steady_from)?;
            (e, Some(v))
        }
    };
    lags.sort_unstable();
    let lag_p50 = lags.get(lags.len() / 2).copied().unwrap_or(0);
    let lag_max = lags.last().copied().unwrap_or(0);
    let n = epoch.len();
    let (e50, e99, emax) = percentiles(epoch);
    let seen = match visible {
        Some(v) => {
            let (v50, v99, vmax) = percentiles(v);
            format!(
                "; commit-to-visible (the snapshot's commit) p50 {v50:.2} s, p99 {v99:.2} s, \
                 max {vmax:.2} s (goal p99 <= 2 s at 2000/s)"
            )
        }
        None => String::new(),
    };
    println!(
        "RESULT cdc-steady-{into_name} rate={rate}/s for {seconds} s: {written} changes written, \
         {attempts} attempts back to back; commit-to-epoch latency p50 {e50:.2} s, p99 {e99:.2} s, \
         max {emax:.2} s (over the {n} keys' last changes){seen}; slot lag after an attempt p50 \
         {lag_p50} B, max {lag_max} B"
    );
    c.execute("SELECT orca.drop_sync($1)", &[&sync])?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// Each key's last steady change's latency to its epoch, in the merged
/// Postgres table.
fn postgres_latencies(c: &mut postgres::Client, since_us: i64) -> Result<Vec<f64>> {
    Ok(c.query(
        &format!(
            "SELECT extract(epoch FROM _orca_synced_at - at)::float8 FROM {RAW}.bench_cdc
             WHERE at > to_timestamp($1::bigint / 1000000.0)"
        ),
        &[&since_us],
    )?
    .iter()
    .map(|r| r.get(0))
    .collect())
}

/// Each key's last steady change's latency to its epoch, and to the commit
/// of the first snapshot at or after its epoch was staged (when a reader
/// of the table sees it), in the merged Iceberg table.
fn iceberg_latencies(url: &str, since_us: i64) -> Result<(Vec<f64>, Vec<f64>)> {
    let config = orca_lake::LakeConfig::from_env(Some(url));
    let lake = orca_lake::Lake::open(&config)?;
    let table = orca_lake::table::load(&lake, &format!("{RAW}.bench_cdc"))?;
    let meta = table.inner.metadata();
    let mut commits: Vec<i64> = meta.snapshots().map(|s| s.timestamp_ms() * 1000).collect();
    commits.sort_unstable();
    let snapshot = table
        .current_snapshot()
        .ok_or_else(|| anyhow!("{RAW}.bench_cdc has no snapshot"))?;
    let req = ScanRequest {
        columns: Some(vec!["at".into(), "_orca_synced_at".into()]),
        ..ScanRequest::default()
    };
    let batches: Vec<arrow_array::RecordBatch> = lake.rt.block_on(async {
        let planned = scan::plan(&table.inner, table.dataset(), snapshot, &req).await?;
        let stream = scan::read(&table.inner, table.dataset(), planned.tasks, None, 2)?;
        stream
            .try_collect::<Vec<_>>()
            .await
            .map_err(|e| anyhow!("reading {RAW}.bench_cdc: {e}"))
    })?;
    let (mut epoch, mut visible) = (Vec::new(), Vec::new());
    for b in &batches {
        let at = b.column(0).as_primitive::<TimestampMicrosecondType>();
        let synced = b.column(1).as_primitive::<TimestampMicrosecondType>();
        for i in 0..b.num_rows() {
            let (a, s) = (at.value(i), synced.value(i));
            if a <= since_us {
                continue;
            }
            epoch.push((s - a) as f64 / 1e6);
            // Snapshot times are milliseconds: the epoch's own commit is the
            // first at or after its staging, to the millisecond.
            let floor = s / 1000 * 1000;
            if let Some(t) = commits.iter().find(|t| **t >= floor) {
                visible.push((t - a) as f64 / 1e6);
            }
        }
    }
    Ok((epoch, visible))
}
