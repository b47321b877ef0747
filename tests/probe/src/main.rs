//! `probe`: a three-step monthly pipeline for end-to-end tests. Its outputs
//! are a pure function of the months, and it can be told, through the
//! environment, to record calls, fail once, or stall once:
//!
//! - `PROBE_DIR`: every step call appends `step partition attempt pid` to
//!   `PROBE_DIR/calls.log`; markers for the other hooks live there too.
//! - `PROBE_FAIL_ONCE=step:partition`: that pair fails the first time.
//! - `PROBE_STALL_ONCE=step:partition:ms`: that pair sleeps the first time,
//!   after writing `PROBE_DIR/stalling`.
//! - `PROBE_SLEEP_MS=ms`: every step call sleeps this long.
//! - `PROBE_LINE_BYTES=n`: every step call prints one line of `n` bytes
//!   (and no line end) to its stdout, as a runaway binary would.

use std::io::Write;

use orca::{Ctx, Month, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Loaded {
    pub month: Month,
    pub rows: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Measured {
    pub month: Month,
    pub rows: u64,
    pub score: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Total {
    pub months: Vec<Month>,
    pub rows: u64,
    pub score: u64,
}

fn dir() -> Option<String> {
    std::env::var("PROBE_DIR").ok()
}

/// Whether this is the first time a marker is taken (and takes it).
fn first_time(marker: &str) -> bool {
    let Some(d) = dir() else { return true };
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(format!("{d}/{marker}"))
        .is_ok()
}

fn hooks(ctx: &Ctx) -> Result<()> {
    let pair = format!("{}:{}", ctx.step, ctx.partition);
    if let Some(d) = dir() {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(format!("{d}/calls.log"))?;
        // One write of the whole line: with O_APPEND it lands whole, where
        // writeln! writes piece by piece and lines of processes running at
        // once interleave.
        let line = format!(
            "{} {} {} {}\n",
            ctx.step,
            ctx.partition,
            ctx.attempt,
            std::process::id()
        );
        f.write_all(line.as_bytes())?;
    }
    if let Some(n) = std::env::var("PROBE_LINE_BYTES")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
    {
        let mut out = std::io::stdout().lock();
        let chunk = [b'x'; 8192];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len());
            // The runner may stop reading (and kill us) part way.
            if out.write_all(&chunk[..k]).is_err() {
                break;
            }
            left -= k;
        }
        let _ = out.flush();
    }
    if let Ok(ms) = std::env::var("PROBE_SLEEP_MS") {
        std::thread::sleep(std::time::Duration::from_millis(ms.parse().unwrap_or(0)));
    }
    if let Ok(spec) = std::env::var("PROBE_STALL_ONCE") {
        if let Some((p, ms)) = spec.rsplit_once(':') {
            if p == pair && first_time(&format!("stalled-{}", pair.replace(['*', ':'], "_"))) {
                if let Some(d) = dir() {
                    std::fs::write(format!("{d}/stalling"), &pair)?;
                }
                std::thread::sleep(std::time::Duration::from_millis(ms.parse().unwrap_or(0)));
            }
        }
    }
    if std::env::var("PROBE_FAIL_ONCE").ok().as_deref() == Some(pair.as_str())
        && first_time(&format!("failed-{}", pair.replace(['*', ':'], "_")))
    {
        return Err(format!("{pair} fails once, on purpose").into());
    }
    Ok(())
}

#[orca::step(mapped)]
fn load(ctx: &mut Ctx, month: Month) -> Result<Loaded> {
    hooks(ctx)?;
    Ok(Loaded {
        month,
        rows: u64::from(month.days()) * 1000 + u64::from(month.month()),
    })
}

#[orca::step(mapped, after = load, retries = 2)]
fn measure(ctx: &mut Ctx, l: Loaded) -> Result<Measured> {
    hooks(ctx)?;
    Ok(Measured {
        month: l.month,
        rows: l.rows,
        score: l.rows % 97 + u64::try_from(l.month.year()).unwrap_or(0),
    })
}

#[orca::step(gather, after = measure)]
fn total(ctx: &mut Ctx, ms: Vec<Measured>) -> Result<Total> {
    hooks(ctx)?;
    Ok(Total {
        months: ms.iter().map(|m| m.month).collect(),
        rows: ms.iter().map(|m| m.rows).sum(),
        score: ms.iter().map(|m| m.score).sum(),
    })
}

orca::pipeline! {
    Probe = "probe" [load, measure, total],
    partitions = Monthly("2024-01"),
    max_runs = 2,
    run_retries = 1,
}

fn main() {
    orca::main::<Probe>()
}
