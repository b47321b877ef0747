// Rule 2: a mapped step cannot follow a gather step.
use orca::{Ctx, Month, Result};

#[orca::step(gather)]
fn count(_ctx: &mut Ctx, ms: Vec<Month>) -> Result<u32> {
    Ok(ms.len() as u32)
}

#[orca::step(mapped, after = count)]
fn each(_ctx: &mut Ctx, n: u32) -> Result<u32> {
    Ok(n)
}

orca::pipeline! {
    P = "p" [count, each],
    partitions = Monthly("2024-01"),
}

fn main() {}
