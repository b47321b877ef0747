// Rule 4: steps are listed in run order, a step after the step it follows.
use orca::{Ctx, Month, Result};

#[orca::step(mapped)]
fn load(_ctx: &mut Ctx, m: Month) -> Result<Month> {
    Ok(m)
}

#[orca::step(mapped, after = clean)]
fn check(_ctx: &mut Ctx, m: Month) -> Result<Month> {
    Ok(m)
}

#[orca::step(mapped, after = load)]
fn clean(_ctx: &mut Ctx, m: Month) -> Result<Month> {
    Ok(m)
}

orca::pipeline! {
    P = "p" [load, check, clean],
    partitions = Monthly("2024-01"),
}

fn main() {}
