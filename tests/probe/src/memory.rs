//! `probe_memory`: a pipeline sized for end-to-end tests of sizing. Its one
//! step holds `PROBE_HOLD_MB` MiB (default 200) at once; the pipeline
//! declares 96 MiB, growing four-fold up to 1 GiB. Under a runner's memory
//! limit its first attempt is killed for memory and its second, at 384 MiB,
//! succeeds.

use orca::{Ctx, Month, Result};

#[orca::step(mapped)]
fn hold(ctx: &mut Ctx, month: Month) -> Result<(String, u64)> {
    let mb: usize = std::env::var("PROBE_HOLD_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    // Written, so the pages are really taken.
    let held = vec![1u8; mb << 20];
    let touched: u64 = held.iter().step_by(4096).map(|b| u64::from(*b)).sum();
    ctx.log(format!("{month}: held {mb} MiB"));
    Ok((month.to_string(), touched))
}

orca::pipeline! {
    ProbeMemory = "probe_memory" [hold],
    partitions = Monthly("2024-01"),
    memory = "96Mi",
    max_memory = "1Gi",
    memory_growth = 4.0,
}

fn main() {
    orca::main::<ProbeMemory>()
}
