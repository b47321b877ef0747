// Rule 3: a gather step after a mapped step takes a Vec of its output.
use orca::{Ctx, Month, Result};

#[orca::step(mapped)]
fn load(_ctx: &mut Ctx, m: Month) -> Result<u32> {
    Ok(m.days())
}

#[orca::step(gather, after = load)]
fn total(_ctx: &mut Ctx, n: u32) -> Result<u32> {
    Ok(n)
}

orca::pipeline! {
    P = "p" [load, total],
    partitions = Monthly("2024-01"),
}

fn main() {}
