// Rule 5: the first step follows no step.
use orca::{Ctx, Month, Result};

#[orca::step(mapped)]
fn prepare(_ctx: &mut Ctx, m: Month) -> Result<Month> {
    Ok(m)
}

#[orca::step(mapped, after = prepare)]
fn load(_ctx: &mut Ctx, m: Month) -> Result<Month> {
    Ok(m)
}

orca::pipeline! {
    P = "p" [load],
    partitions = Monthly("2024-01"),
}

fn main() {}
