// Rule 5: a step's `after` is the pipeline's own step, compared by function.
use orca::{Ctx, Month, Result};

mod other {
    use orca::{Ctx, Month, Result};
    #[orca::step(mapped)]
    pub fn load(_ctx: &mut Ctx, m: Month) -> Result<Month> {
        Ok(m)
    }
}

#[orca::step(mapped)]
fn load(_ctx: &mut Ctx, m: Month) -> Result<Month> {
    Ok(m)
}

// Follows a function also called `load`, but not this pipeline's.
#[orca::step(mapped, after = other::load)]
fn clean(_ctx: &mut Ctx, m: Month) -> Result<Month> {
    Ok(m)
}

orca::pipeline! {
    P = "p" [load, clean],
    partitions = Monthly("2024-01"),
}

fn main() {}
