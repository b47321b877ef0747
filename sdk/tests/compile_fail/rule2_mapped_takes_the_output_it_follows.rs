// Rule 2: a mapped step takes the output of the mapped step it follows.
use orca::{Ctx, Month, Result};

#[orca::step(mapped)]
fn load(_ctx: &mut Ctx, m: Month) -> Result<u32> {
    Ok(m.days())
}

#[orca::step(mapped, after = load)]
fn clean(_ctx: &mut Ctx, s: String) -> Result<String> {
    Ok(s)
}

orca::pipeline! {
    P = "p" [load, clean],
    partitions = Monthly("2024-01"),
}

fn main() {}
