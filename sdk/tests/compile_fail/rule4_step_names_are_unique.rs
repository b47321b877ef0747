// Rule 4: steps have unique names.
use orca::{Ctx, Month, Result};

mod a {
    use orca::{Ctx, Month, Result};
    #[orca::step(mapped)]
    pub fn load(_ctx: &mut Ctx, m: Month) -> Result<Month> {
        Ok(m)
    }
}

#[orca::step(mapped, after = a::load)]
fn load(_ctx: &mut Ctx, m: Month) -> Result<Month> {
    Ok(m)
}

orca::pipeline! {
    P = "p" [a::load, load],
    partitions = Monthly("2024-01"),
}

fn main() {}
