//! Tick benchmark: what one `orca.tick()` costs as registered schedules grow.
//!
//! For each size in `SIZES` (default `1000 10000 100000`) and each extension
//! version in `VERSIONS` (default: the current one and, as the peer, the
//! previous release `0.1.0`, whose tick worked out every schedule's fires on
//! every tick), in a fresh database:
//!
//! 1. registers that many daily pipelines, pipeline i on cron `i%60 * * * *`
//!    (so that at each minute boundary 1/60 of them fire), in chunks of 1000;
//! 2. ticks once at 2020-01-01 00:00:30 UTC, before the registrations, which
//!    starts every schedule's clock there (untimed);
//! 3. **idle**: after three untimed ticks, `TICKS` ticks (default 20) at
//!    00:00:34, 00:00:35, ...: no schedule is due; each tick is timed from the
//!    client, one per transaction;
//! 4. **minute boundary**: `BOUNDARIES` ticks (default 3) at 00:01:00,
//!    00:02:00, ...: 1/60 of the schedules fire, and their runs are created
//!    and started.
//!
//! With `EVERY_MINUTE=1` every pipeline's cron is `* * * * *` instead, so
//! that every schedule fires at each boundary: what a tick makes of
//! fires at scale (fires/s is its fires over the boundary tick's median).
//!
//! Prints a line per (version, size) with median, minimum and maximum, then
//! the growth from each size to the next and the ratio to the peer version.
//! Env: `BENCH_DB_URL` (a maintenance database; default the local cluster),
//! `SIZES`, `VERSIONS`, `TICKS`, `BOUNDARIES`, `PEER_TICKS` (idle ticks for a
//! version other than the current, default 3: the old tick is slow).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result};
use orca_bench_common::env_num;
use sqlx::{Connection, Executor, PgConnection};

/// Untimed ticks before the idle ones are timed.
const WARMUP: usize = 3;

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// (median, min, max) in milliseconds.
fn summary(ms: &mut [f64]) -> (f64, f64, f64) {
    ms.sort_by(f64::total_cmp);
    let n = ms.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    (ms[n / 2], ms[0], ms[n - 1])
}

fn db_url(base: &str, db: &str) -> String {
    match base.rsplit_once('/') {
        Some((head, _)) => format!("{head}/{db}"),
        None => format!("{base}/{db}"),
    }
}

async fn tick_ms(c: &mut PgConnection, at: &str) -> Result<(f64, serde_json::Value)> {
    let t0 = Instant::now();
    let out: serde_json::Value = sqlx::query_scalar("SELECT orca.tick($1::timestamptz)")
        .bind(at)
        .fetch_one(&mut *c)
        .await
        .with_context(|| format!("tick at {at}"))?;
    Ok((t0.elapsed().as_secs_f64() * 1000.0, out))
}

struct Measured {
    idle: (f64, f64, f64),
    boundary: (f64, f64, f64),
    fired: i64,
}

async fn measure(
    base: &str,
    version: &str,
    size: usize,
    ticks: usize,
    boundaries: usize,
    every_minute: bool,
) -> Result<Measured> {
    let name = format!("orca_bench_tick_{}_{size}", version.replace('.', "_"));
    let mut admin = PgConnection::connect(base)
        .await
        .context("connect BENCH_DB_URL")?;
    admin
        .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
        .await?;
    admin
        .execute(format!("CREATE DATABASE {name}").as_str())
        .await?;
    let result = async {
        let mut c = PgConnection::connect(&db_url(base, &name)).await?;
        c.execute(format!("CREATE EXTENSION orca VERSION '{version}'").as_str())
            .await
            .with_context(|| format!("install orca {version} (scripts/setup.sh installs the released ones)"))?;
        let t0 = Instant::now();
        for start in (0..size).step_by(1000) {
            let end = (start + 1000).min(size);
            sqlx::query(
                "SELECT count(orca.register(jsonb_build_object(
                     'name', 'p' || i,
                     'steps', jsonb_build_array(jsonb_build_object('name', 'load', 'kind', 'mapped')),
                     'partitions', jsonb_build_object('daily', '2019-01-01'),
                     'schedule', jsonb_build_object('cron', CASE WHEN $3 THEN '*' ELSE (i % 60)::text END
                                                            || ' * * * *', 'tz', 'UTC'),
                     'fills', 'previous', 'catchup', false,
                     'registry_hash', 'h', 'binary', '/bin/true')))
                 FROM generate_series($1::int, $2::int - 1) AS i",
            )
            .bind(i32::try_from(start)?)
            .bind(i32::try_from(end)?)
            .bind(every_minute)
            .execute(&mut c)
            .await
            .context("register")?;
        }
        eprintln!(
            "# {version} {size}: registered in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        c.execute("ANALYZE").await?;
        tick_ms(&mut c, "2020-01-01 00:00:30+00").await?;
        // Warm-up: the first ticks of a session plan their statements.
        for i in 0..WARMUP {
            tick_ms(&mut c, &format!("2020-01-01 00:00:3{i}+00")).await?;
        }
        let mut idle = Vec::new();
        for i in 0..ticks {
            let at = format!("2020-01-01 00:00:{:02}+00", 31 + WARMUP + (i % 25));
            let (ms, out) = tick_ms(&mut c, &at).await?;
            anyhow::ensure!(out["runs_created"] == 0, "an idle tick made runs: {out}");
            idle.push(ms);
        }
        let mut boundary = Vec::new();
        let mut fired = 0;
        for i in 0..boundaries {
            let at = format!("2020-01-01 00:{:02}:00+00", 1 + (i % 58));
            let (ms, out) = tick_ms(&mut c, &at).await?;
            fired = out["runs_created"].as_i64().unwrap_or(0);
            boundary.push(ms);
        }
        Ok::<_, anyhow::Error>(Measured {
            idle: summary(&mut idle),
            boundary: summary(&mut boundary),
            fired,
        })
    }
    .await;
    admin
        .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
        .await?;
    result
}

#[tokio::main]
async fn main() -> Result<()> {
    let base = std::env::var("BENCH_DB_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
    let current = env!("CARGO_PKG_VERSION").to_string();
    let sizes: Vec<usize> = env_list("SIZES", "1000 10000 100000")
        .iter()
        .map(|s| {
            s.parse()
                .with_context(|| format!("SIZES: {s} is not a number"))
        })
        .collect::<Result<_>>()?;
    let versions = env_list("VERSIONS", &format!("{current} 0.1.0"));
    let ticks = env_num("TICKS", 20)?.max(1);
    let peer_ticks = env_num("PEER_TICKS", 3)?.max(1);
    let boundaries = env_num("BOUNDARIES", 3)?.max(1);
    let every_minute = env_num("EVERY_MINUTE", 0)? == 1;
    let mut results: BTreeMap<(String, usize), Measured> = BTreeMap::new();
    for version in &versions {
        let n = if *version == current {
            ticks
        } else {
            peer_ticks
        };
        for &size in &sizes {
            let m = measure(&base, version, size, n, boundaries, every_minute).await?;
            println!(
                "tick {version} schedules={size}: idle p50 {:.2} ms (min {:.2}, max {:.2}, {n} ticks); \
                 minute boundary ({} fire) p50 {:.1} ms (min {:.1}, max {:.1}, {boundaries} ticks), \
                 {:.0} fires/s",
                m.idle.0,
                m.idle.1,
                m.idle.2,
                m.fired,
                m.boundary.0,
                m.boundary.1,
                m.boundary.2,
                m.fired as f64 / (m.boundary.0 / 1000.0)
            );
            results.insert((version.clone(), size), m);
        }
    }
    for version in &versions {
        for pair in sizes.windows(2) {
            if let (Some(a), Some(b)) = (
                results.get(&(version.clone(), pair[0])),
                results.get(&(version.clone(), pair[1])),
            ) {
                println!(
                    "growth {version} {} -> {} schedules: idle {:.2}x, minute boundary {:.2}x",
                    pair[0],
                    pair[1],
                    b.idle.0 / a.idle.0,
                    b.boundary.0 / a.boundary.0
                );
            }
        }
    }
    for version in versions.iter().filter(|v| **v != current) {
        for &size in &sizes {
            if let (Some(new), Some(old)) = (
                results.get(&(current.clone(), size)),
                results.get(&(version.clone(), size)),
            ) {
                println!(
                    "ratio {version}/{current} schedules={size}: idle {:.1}x slower, minute boundary {:.1}x slower",
                    old.idle.0 / new.idle.0,
                    old.boundary.0 / new.boundary.0
                );
            }
        }
    }
    Ok(())
}
