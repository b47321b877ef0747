// Rule 1: a first mapped step takes the partition key.
use orca::{Ctx, Result};

#[orca::step(mapped)]
fn load(_ctx: &mut Ctx, n: u32) -> Result<u32> {
    Ok(n)
}

orca::pipeline! {
    P = "p" [load],
    partitions = Monthly("2024-01"),
}

fn main() {}
