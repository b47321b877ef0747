// A step's runtime submits only the tasks of its set: another task is a
// compile error that names both.
use orca::{Ctx, Month, Result};

#[orca::task(Double)]
fn double(n: u64) -> Result<u64> {
    Ok(n * 2)
}

#[orca::task(Halve)]
fn halve(n: u64) -> Result<u64> {
    Ok(n / 2)
}

orca::tasks!(Doubling = [Double]);

#[orca::step(mapped)]
fn month(ctx: &mut Ctx, m: Month) -> Result<u64> {
    let rt = ctx.runtime::<Doubling>()?;
    let r = rt.remote::<Halve>(u64::from(m.days()))?;
    rt.get(r)
}

orca::pipeline! {
    P = "p" [month],
    partitions = Monthly("2024-01"),
    tasks = Doubling,
}

fn main() {}
