// Rule 3: a gather step after a gather step takes its output.
use orca::{Ctx, Month, Result};

#[orca::step(gather)]
fn count(_ctx: &mut Ctx, ms: Vec<Month>) -> Result<u32> {
    Ok(ms.len() as u32)
}

#[orca::step(gather, after = count)]
fn report(_ctx: &mut Ctx, ns: Vec<u32>) -> Result<u32> {
    Ok(ns.iter().sum())
}

orca::pipeline! {
    P = "p" [count, report],
    partitions = Monthly("2024-01"),
}

fn main() {}
