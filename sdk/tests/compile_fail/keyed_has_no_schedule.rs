// A keyed pipeline has no schedule (nor fills): it runs by hand, by backfill
// or as a sensor.
use orca::{Ctx, Name, Result};

#[orca::step(mapped)]
fn label(_ctx: &mut Ctx, key: Name) -> Result<String> {
    Ok(key.to_string())
}

orca::pipeline! {
    P = "p" [label],
    partitions = Keyed("logs.index", "log_id"),
    schedule = Cron("0 3 * * *"),
}

fn main() {}
