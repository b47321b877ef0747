// Rule 1 for a keyed pipeline: its first mapped step takes a Name.
use orca::{Ctx, Month, Result};

#[orca::step(mapped)]
fn label(_ctx: &mut Ctx, m: Month) -> Result<String> {
    Ok(m.to_string())
}

orca::pipeline! {
    P = "p" [label],
    partitions = Keyed("logs.index", "log_id"),
}

fn main() {}
