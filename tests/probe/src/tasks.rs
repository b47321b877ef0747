//! `probe_tasks`: a monthly pipeline for the end-to-end tests of tasks. Its
//! step `spread` fans out `PROBE_TASKS` tasks (default 100) of `square`,
//! numbered 0.., and returns the sum of their squares, which the tests know.
//!
//! - `PROBE_DIR`: each run of a task appends `index pid` to
//!   `PROBE_DIR/tasks.log`, and the driver appends `driver pid` to
//!   `PROBE_DIR/drivers.log` when it starts fanning out.
//! - `PROBE_TASK_SLEEP_MS=ms`: each task sleeps this long after logging.
//! - `PROBE_TASK_FAIL=i`: task i always fails.

use std::io::Write;

use orca::{Ctx, Month, Result};

fn append(file: &str, line: String) -> Result<()> {
    if let Ok(d) = std::env::var("PROBE_DIR") {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(format!("{d}/{file}"))?;
        // One write: with O_APPEND a whole line lands at once.
        f.write_all(line.as_bytes())?;
    }
    Ok(())
}

#[orca::task(Square, retries = 2, backoff_ms = 50)]
fn square(i: u64) -> Result<u64> {
    append("tasks.log", format!("{i} {}\n", std::process::id()))?;
    if let Some(ms) = std::env::var("PROBE_TASK_SLEEP_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    if std::env::var("PROBE_TASK_FAIL").ok() == Some(i.to_string()) {
        // What a user's task logs before it fails reaches the error.
        eprintln!("square {i}: about to fail (pid {})", std::process::id());
        return Err(format!("task {i} fails on purpose").into());
    }
    Ok(i * i)
}

orca::tasks!(pub Squares = [Square]);

#[orca::step(mapped)]
fn spread(ctx: &mut Ctx, month: Month) -> Result<u64> {
    let n: u64 = std::env::var("PROBE_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    append("drivers.log", format!("driver {}\n", std::process::id()))?;
    let rt = ctx.runtime::<Squares>()?;
    let refs = rt.remote_all::<Square>(0..n)?;
    let sum: u64 = rt.get_all(refs)?.into_iter().sum();
    ctx.log(format!("{month}: {n} tasks, sum of squares {sum}"));
    Ok(sum)
}

orca::pipeline! {
    ProbeTasks = "probe_tasks" [spread],
    partitions = Monthly("2024-01"),
    run_retries = 2,
    tasks = Squares,
}

fn main() {
    orca::main::<ProbeTasks>()
}
