//! The sync benchmark. A table of `ROWS` rows of mixed types (bigint,
//! timestamptz, text with nulls, numeric(12,2), int, boolean, jsonb, date,
//! double precision) goes to Parquet three ways, in the same run on the same
//! Postgres:
//! - raw `COPY table TO STDOUT (FORMAT binary)`, read and thrown away: the
//!   ceiling, since every sync must at least get the bytes out;
//! - orca-engine: one attempt of a sync (Postgres source, parquet
//!   destination) with its checkpoints, staging and commits, the engine
//!   reading the source itself (`orca-engine sync` without a runner), with
//!   the stream's default splits (the machine's cores, at most 8: the
//!   table read over that many connections by ranges of its cursor);
//! - orca-split1: the same with `"splits": 1`, the table read over one
//!   connection;
//! - orca-edge: the same with the source read by a source pump (as a runner
//!   hosts it, here on a thread) and sent to the engine as frames over the
//!   data edge, a Unix socket: how a runner runs a sync;
//! - dlt (`DLT_PYTHON`, `DLT_SCRIPT`), if given: the same table with dlt's
//!   pyarrow backend into its filesystem destination as Parquet;
//! - DuckDB (`DLT_PYTHON`, `DUCKDB_SCRIPT`), if given: its Postgres scanner
//!   (ctid ranges over one connection per thread) copying the table to a
//!   Parquet file.
//!
//! MB/s counts the table's binary COPY bytes for all three. Each RESULT
//! line also says how many cores the machine kept busy over the tool's
//! run, how many its own process used and how many the Postgres server used
//! (`cpu.rs`); each orca attempt prints where its epochs' time went.
//!
//! `orca-bench-sync cdc` measures the postgres_cdc source instead, into a
//! merged Postgres table and then into a merged Iceberg table (`cdc.rs`).

use std::io::Read;
use std::process::Command;

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

mod cdc;
mod cpu;
mod shapes;
use cpu::{Busy, Mark};
use orca_engine::attempt::{self, Options};
use orca_engine::pump;

const TABLE: &str = "bench_rows";

fn admin_url(db: &str) -> String {
    let base =
        std::env::var("BENCH_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    format!("{}/{db}", base.trim_end_matches('/'))
}

/// Makes the bench database and its table of `rows` rows, unless they are
/// there already.
fn prepare(rows: i64) -> Result<String> {
    let mut admin = postgres::Client::connect(&admin_url("postgres"), postgres::NoTls)?;
    let exists = admin
        .query_opt(
            "SELECT 1 FROM pg_database WHERE datname = 'orca_bench_sync'",
            &[],
        )?
        .is_some();
    if !exists {
        admin.batch_execute("CREATE DATABASE orca_bench_sync")?;
    }
    let url = admin_url("orca_bench_sync");
    let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
    // The installed extension's own objects, whatever an earlier run left.
    c.batch_execute(
        "SET client_min_messages = warning; DROP EXTENSION IF EXISTS orca CASCADE; CREATE EXTENSION orca",
    )?;
    ensure_table(
        &mut c,
        TABLE,
        rows,
        "id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, customer text,
         amount numeric(12,2), qty int, ok boolean, meta jsonb, day date,
         score double precision",
        "g, '2024-01-01'::timestamptz + g * interval '1 second',
         CASE WHEN g % 10 = 0 THEN NULL ELSE 'customer-' || (g % 5000) END,
         (g % 100000) / 100.0, g % 1000, g % 3 = 0,
         jsonb_build_object('n', g, 'tag', 't' || (g % 7)),
         '2024-01-01'::date + (g % 365), g / 7.0",
    )?;
    c.batch_execute(&format!(
        "CREATE INDEX IF NOT EXISTS {TABLE}_updated_at_id_idx ON {TABLE} (updated_at, id)"
    ))?;
    Ok(url)
}

/// Makes `table` with `columns`, filled by `SELECT {values} FROM
/// generate_series(1, rows) g`, unless it holds `rows` rows already.
pub(crate) fn ensure_table(
    c: &mut postgres::Client,
    table: &str,
    rows: i64,
    columns: &str,
    values: &str,
) -> Result<()> {
    let exists = c
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])?
        .get::<_, bool>(0);
    let have: i64 = if exists {
        c.query_one(&format!("SELECT count(*) FROM {table}"), &[])?
            .get(0)
    } else {
        -1
    };
    if have != rows {
        eprintln!("# making {table} with {rows} rows");
        c.batch_execute(&format!(
            "DROP TABLE IF EXISTS {table};
             CREATE TABLE {table} ({columns});
             INSERT INTO {table} SELECT {values} FROM generate_series(1, {rows}) g;"
        ))?;
        // VACUUM runs outside the batch's implicit transaction.
        c.batch_execute(&format!("VACUUM ANALYZE {table}"))?;
    }
    Ok(())
}

/// Prints a figure's RESULT line (`mb`: the table's binary COPY size),
/// once it moved the `want` rows the table has.
pub(crate) fn result(
    label: &str,
    rows: u64,
    want: u64,
    seconds: f64,
    mb: f64,
    busy: Busy,
) -> Result<()> {
    if rows != want {
        bail!("{label} moved {rows} rows, the table has {want}");
    }
    println!(
        "RESULT {label} rows={rows}: {seconds:.2} s, {:.0} rows/s, {:.1} MB/s; {busy}",
        rows as f64 / seconds,
        mb / seconds
    );
    Ok(())
}

/// The bytes of the Parquet files under `dir`, at any depth.
fn parquet_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                parquet_bytes(&p)
            } else if p.extension().is_some_and(|x| x == "parquet") {
                e.metadata().map_or(0, |m| m.len())
            } else {
                0
            }
        })
        .sum()
}

struct Figure {
    name: &'static str,
    rows: u64,
    seconds: f64,
    busy: Busy,
}

fn copy_ceiling(url: &str, table: &str) -> Result<(u64, f64, u64, Busy)> {
    let mut c = postgres::Client::connect(url, postgres::NoTls)?;
    let mark = Mark::now();
    let started = Instant::now();
    let mut r = c.copy_out(format!("COPY {table} TO STDOUT (FORMAT binary)").as_str())?;
    let mut buf = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    drop(r);
    let secs = started.elapsed().as_secs_f64();
    let busy = mark.busy(secs);
    let rows: i64 = c
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])?
        .get(0);
    Ok((rows as u64, secs, bytes, busy))
}

/// One attempt of a sync of `table` (read by `cursor`, keyed by `id`) into
/// Parquet; `splits`: the stream's option (None: the engine's default, the
/// machine's cores).
fn orca(
    url: &str,
    table: &str,
    cursor: &str,
    out: &std::path::Path,
    edge: bool,
    splits: Option<u32>,
) -> Result<(u64, f64, Busy)> {
    let name = format!(
        "bench_{}_{table}_{}_{}",
        std::process::id(),
        u8::from(edge),
        splits.unwrap_or(0)
    );
    let mut c = postgres::Client::connect(url, postgres::NoTls)?;
    let source = serde_json::json!({"type": "postgres", "url": url});
    let dest = serde_json::json!({"type": "parquet", "url": out.join("data").to_string_lossy()});
    let mut streams = serde_json::json!([{"name": table, "table": format!("public.{table}"),
                                          "cursor": cursor, "primary_key": ["id"]}]);
    if let Some(n) = splits {
        streams[0]["splits"] = n.into();
    }
    // Netguard: the bench's source is this machine's cluster, its
    // destination a local directory.
    c.execute(
        "SELECT orca.allow('default', '127.0.0.1'), orca.allow('default', $1)",
        &[&out.to_string_lossy().trim_end_matches('/')],
    )?;
    c.execute(
        "SELECT orca.create_sync($1, $2, $3, $4, NULL, 'at_least_once')",
        &[&name, &source, &dest, &streams],
    )?;
    let opts = Options {
        database_url: url.to_string(),
        org: "default".into(),
        sync: name,
        store_url: out.join("store").to_string_lossy().into_owned(),
        batch_rows: std::env::var("BATCH_ROWS")
            .ok()
            .and_then(|s| s.parse().ok()),
        lanes: std::env::var("LANES").ok().and_then(|s| s.parse().ok()),
        lease: None,
        control: None,
        edge: edge.then(|| out.join("edge.sock")),
        crash: None,
    };
    let mark = Mark::now();
    let started = Instant::now();
    let source_pump = opts.edge.clone().map(|path| {
        std::thread::spawn(move || {
            let gone = AtomicBool::new(false);
            pump::connect(&path, Duration::from_secs(30), &gone)
                .and_then(|c| pump::serve(c, &pump::SlotGauge::default()))
        })
    });
    let o = attempt::run(&opts)?;
    let secs = started.elapsed().as_secs_f64();
    let busy = mark.busy(secs);
    let s = o.spent;
    println!(
        "# {table} (splits {}, edge {edge}): the epochs waited {:.2} s for rows, staged {:.2} s, committed {:.2} s",
        splits.map_or("default".to_string(), |n| n.to_string()),
        s.waiting.as_secs_f64(),
        s.staging.as_secs_f64(),
        s.committing.as_secs_f64()
    );
    if let Some(p) = source_pump {
        match p.join() {
            Ok(Ok(p)) if p.rows == o.rows => {}
            Ok(Ok(p)) => bail!("the pump sent {} rows, the engine took {}", p.rows, o.rows),
            Ok(Err(e)) => bail!("source pump: {e}"),
            Err(_) => bail!("the source pump panicked"),
        }
    }
    Ok((o.rows, secs, busy))
}

/// A peer's run by its Python script (`PYTHON`, the script), which prints
/// its figures as a JSON line; None if the environment names no script.
fn peer(
    python: &str,
    script: &str,
    url: &str,
    table: &str,
    out: &std::path::Path,
) -> Result<Option<(u64, f64, Busy, serde_json::Value)>> {
    let (Ok(py), Ok(script)) = (std::env::var(python), std::env::var(script)) else {
        return Ok(None);
    };
    let o = Command::new(py)
        .arg(&script)
        .args([url, table])
        .arg(out)
        .output()
        .with_context(|| format!("running {script}"))?;
    if !o.status.success() {
        bail!("{script} failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text.lines().last().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("{script}'s figures"))?;
    // The script measures the machine and its own process over its timed
    // part (interpreter start and imports left out).
    let busy = Busy {
        machine: v["busy"].as_f64(),
        own: v["own"].as_f64(),
        postgres: v["postgres"].as_f64(),
    };
    Ok(Some((
        v["rows"].as_u64().unwrap_or(0),
        v["seconds"].as_f64().unwrap_or(f64::NAN),
        busy,
        v,
    )))
}

pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("cdc") {
        let url = prepare(env_or("ROWS", 1_000_000))?;
        cdc::run(&url, cdc::Target::Postgres)?;
        return cdc::run(&url, cdc::Target::Iceberg);
    }
    let rows: i64 = std::env::var("ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let url = prepare(rows)?;
    let work = std::env::temp_dir().join(format!("orca-bench-sync-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    if std::env::args().nth(1).as_deref() == Some("shapes") {
        let done = shapes::run(&url, &work);
        let _ = std::fs::remove_dir_all(&work);
        return done;
    }

    let (copy_rows, copy_secs, copy_bytes, copy_busy) = copy_ceiling(&url, TABLE)?;
    let mb = copy_bytes as f64 / 1e6;
    let mut figures = vec![Figure {
        name: "copy-binary",
        rows: copy_rows,
        seconds: copy_secs,
        busy: copy_busy,
    }];
    // What each tool's Parquet weighs: the same rows, each tool's own
    // columns and encodings.
    let mut sizes: Vec<(&str, u64)> = Vec::new();
    // The default (splits: the machine's cores), the read over one
    // connection, and the default through a runner's pump over the data
    // edge.
    for (name, edge, splits) in [
        ("orca-engine", false, None),
        ("orca-split1", false, Some(1)),
        ("orca-edge", true, None),
    ] {
        let dir = work.join(name);
        std::fs::create_dir_all(&dir)?;
        let (rows, seconds, busy) = orca(&url, TABLE, "updated_at", &dir, edge, splits)?;
        sizes.push((name, parquet_bytes(&dir.join("data"))));
        figures.push(Figure {
            name,
            rows,
            seconds,
            busy,
        });
    }
    let mut labels = Vec::new();
    for (name, python, script) in [
        ("dlt", "DLT_PYTHON", "DLT_SCRIPT"),
        ("duckdb", "DLT_PYTHON", "DUCKDB_SCRIPT"),
    ] {
        match peer(python, script, &url, TABLE, &work.join(name))? {
            Some((rows, seconds, busy, v)) => {
                sizes.push((name, parquet_bytes(&work.join(name))));
                figures.push(Figure {
                    name,
                    rows,
                    seconds,
                    busy,
                });
                labels.push(match name {
                    "dlt" => format!(
                        "dlt {} ({} backend)",
                        v["dlt"].as_str().unwrap_or("?"),
                        v["backend"].as_str().unwrap_or("?")
                    ),
                    _ => format!(
                        "DuckDB {} postgres scanner, {} threads",
                        v["duckdb"].as_str().unwrap_or("?"),
                        v["threads"]
                    ),
                });
            }
            None => labels.push(format!("{name} not run (set {python} and {script})")),
        }
    }
    println!(
        "# {rows} rows, {mb:.1} MB as binary COPY; {}",
        labels.join("; ")
    );
    for f in &figures {
        result(f.name, f.rows, copy_rows, f.seconds, mb, f.busy)?;
    }
    for (name, bytes) in &sizes {
        println!(
            "SIZE {name} = {:.1} MB of Parquet, {:.1} bytes a row",
            *bytes as f64 / 1e6,
            *bytes as f64 / copy_rows.max(1) as f64
        );
    }
    let rate = |n: &str| {
        figures
            .iter()
            .find(|f| f.name == n)
            .map(|f| f.rows as f64 / f.seconds)
    };
    if let (Some(one), Some(o)) = (rate("orca-split1"), rate("orca-engine")) {
        println!(
            "RATIO orca-engine / orca-split1 = {:.2} (what splitting the read gains here; \
             the default splits: {})",
            o / one,
            orca_engine::source::postgres::splits::default_splits()
        );
    }
    for orca in ["orca-engine", "orca-edge"] {
        if let (Some(o), Some(c)) = (rate(orca), rate("copy-binary")) {
            println!("RATIO {orca} / copy-binary = {:.2} (target >= 0.50)", o / c);
        }
        if let (Some(o), Some(d)) = (rate(orca), rate("dlt")) {
            println!("RATIO {orca} / dlt = {:.2} (target >= 3)", o / d);
        }
        if let (Some(o), Some(d)) = (rate(orca), rate("duckdb")) {
            println!("RATIO {orca} / duckdb = {:.2} (target > 1)", o / d);
        }
    }
    if let (Some(e), Some(o)) = (rate("orca-edge"), rate("orca-engine")) {
        println!(
            "RATIO orca-edge / orca-engine = {:.2} (the data edge's cost)",
            e / o
        );
    }
    if std::env::var_os("KEEP_WORK").is_some() {
        println!("# the files are kept in {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(())
}
