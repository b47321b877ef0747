// Rule 1: a first gather step takes a Vec of the partition key.
use orca::{Ctx, Day, Result};

#[orca::step(gather)]
fn all(_ctx: &mut Ctx, d: Day) -> Result<u32> {
    Ok(d.month().days())
}

orca::pipeline! {
    P = "p" [all],
    partitions = Daily("2024-01-01"),
}

fn main() {}
