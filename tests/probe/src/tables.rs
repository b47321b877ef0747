//! `probe_tables`: a monthly pipeline over Iceberg tables, for end-to-end
//! tests of pinned reads, idempotent commits and declared datasets.
//!
//! - `write` appends one row per day of its month to `probe.rows`;
//! - `read` counts the rows of `probe.src` (written by an outside writer);
//! - `count` counts `probe.rows` per month.
//!
//! Environment: `PROBE_DIR` (calls log and markers), `PROBE_STALL_ONCE` and
//! `PROBE_FAIL_ONCE` (`step:partition[:ms]`, after the step's reads),
//! `PROBE_TOUCH=dataset` (the `read` step also opens that dataset),
//! `PROBE_SQL_TOUCH=dataset` (the `read` step also queries it in SQL).

use std::io::Write;
use std::sync::Arc;

use orca::arrow_array::{Int64Array, RecordBatch, StringArray};
use orca::arrow_schema::{DataType, Field, Schema};
use orca::{append, col, ensure_table, lit, scan, table, Ctx, Month, Result};

fn first_time(marker: &str) -> bool {
    let Ok(d) = std::env::var("PROBE_DIR") else {
        return true;
    };
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(format!("{d}/{marker}"))
        .is_ok()
}

fn hooks(ctx: &Ctx) -> Result<()> {
    let pair = format!("{}:{}", ctx.step, ctx.partition);
    if let Ok(d) = std::env::var("PROBE_DIR") {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(format!("{d}/calls.log"))?;
        // One write of the whole line (see main.rs's hooks).
        let line = format!(
            "{} {} {} {}\n",
            ctx.step,
            ctx.partition,
            ctx.attempt,
            std::process::id()
        );
        f.write_all(line.as_bytes())?;
    }
    if let Ok(spec) = std::env::var("PROBE_STALL_ONCE") {
        if let Some((p, ms)) = spec.rsplit_once(':') {
            if p == pair && first_time("stalled") {
                if let Ok(d) = std::env::var("PROBE_DIR") {
                    std::fs::write(format!("{d}/stalling"), &pair)?;
                }
                let until = std::time::Instant::now()
                    + std::time::Duration::from_millis(ms.parse().unwrap_or(0));
                // Wake early when the test says it is done with the stall.
                while std::time::Instant::now() < until {
                    if let Ok(d) = std::env::var("PROBE_DIR") {
                        if std::path::Path::new(&format!("{d}/go")).exists() {
                            break;
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }
        }
    }
    if std::env::var("PROBE_FAIL_ONCE").ok().as_deref() == Some(pair.as_str())
        && first_time("failed")
    {
        return Err(format!("{pair} fails once, on purpose").into());
    }
    Ok(())
}

fn rows_schema() -> Schema {
    Schema::new(vec![
        Field::new("month", DataType::Utf8, false),
        Field::new("day", DataType::Int64, false),
    ])
}

#[orca::step(mapped, writes = ["probe.rows"])]
fn write(ctx: &mut Ctx, month: Month) -> Result<i64> {
    let days: Vec<i64> = (1..=i64::from(month.days())).collect();
    let batch = RecordBatch::try_new(
        Arc::new(rows_schema()),
        vec![
            Arc::new(StringArray::from(vec![month.to_string(); days.len()])),
            Arc::new(Int64Array::from(days)),
        ],
    )?;
    let t = ensure_table(ctx, "probe.rows", rows_schema())?;
    let snapshot = append(ctx, &t, vec![batch])?;
    hooks(ctx)?;
    Ok(snapshot)
}

#[orca::step(mapped, after = write, retries = 2, reads = ["probe.src"])]
fn read(ctx: &mut Ctx, _written: i64) -> Result<usize> {
    if let Ok(other) = std::env::var("PROBE_TOUCH") {
        table(ctx, &other)?;
    }
    if let Ok(other) = std::env::var("PROBE_SQL_TOUCH") {
        ctx.sql(&format!("SELECT count(*) FROM {other}"), ())?
            .collect()?;
    }
    let src = table(ctx, "probe.src")?;
    // A filtered, projected scan as it streams: every row of probe.src holds
    // n >= 0, so it counts the rows of the snapshot the step pinned.
    let mut rows = 0;
    for b in scan(ctx, &src)
        .filter(col("n").gt_eq(lit(0i64)))
        .select(["n"])
        .stream()?
    {
        rows += b?.num_rows();
    }
    hooks(ctx)?;
    Ok(rows)
}

#[orca::step(gather, after = read, reads = ["probe.rows"])]
fn count(
    ctx: &mut Ctx,
    _src_rows: Vec<usize>,
) -> Result<std::collections::BTreeMap<String, usize>> {
    let t = table(ctx, "probe.rows")?;
    let mut per = std::collections::BTreeMap::new();
    for b in scan(ctx, &t).collect()? {
        let months = b
            .column_by_name("month")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>())
            .ok_or("no month column")?;
        for i in 0..b.num_rows() {
            *per.entry(months.value(i).to_string()).or_insert(0) += 1;
        }
    }
    Ok(per)
}

orca::pipeline! {
    ProbeTables = "probe_tables" [write, read, count],
    partitions = Monthly("2024-01"),
    run_retries = 1,
}

fn main() {
    orca::main::<ProbeTables>()
}
