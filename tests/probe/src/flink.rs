//! `probe_flink`: a continuous step whose work is a Flink job, for the
//! Flink test. `numbers` runs the job `PROBE_FLINK_JAR`
//! (tests/flink/OrcaNumbers.java) on the runner's `ORCA_FLINK_URL`, writing
//! its numbers into `PROBE_FLINK_OUT/<partition>`, in the mode
//! `PROBE_FLINK_MODE` names (`continuous`, `bounded <n>` or `fail`).

use orca::flink::{self, Finished, Job};
use orca::{Ctx, Month, Result};

#[orca::step(mapped, retries = 0)]
fn numbers(ctx: &mut Ctx, month: Month) -> Result<Finished> {
    let jar = std::env::var("PROBE_FLINK_JAR").map_err(|_| "PROBE_FLINK_JAR is not set")?;
    let out = std::env::var("PROBE_FLINK_OUT").map_err(|_| "PROBE_FLINK_OUT is not set")?;
    let mode = std::env::var("PROBE_FLINK_MODE").unwrap_or_else(|_| "continuous".into());
    let mut job = Job::new(jar).arg(format!("{out}/{month}"));
    for word in mode.split_whitespace() {
        job = job.arg(word);
    }
    flink::run(ctx, job)
}

orca::pipeline! {
    ProbeFlink = "probe_flink" [numbers],
    partitions = Monthly("2024-01"),
}

fn main() {
    orca::main::<ProbeFlink>()
}
