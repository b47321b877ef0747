//! `probe_sensor`: a sensor pipeline for end-to-end tests. It runs when
//! `probe.src` (written outside Orca) or `probe.rows` (written by
//! `probe_tables`) gets a new snapshot, and counts what it then reads.

use orca::arrow_array::RecordBatch;
use orca::{scan, table, Ctx, Month, Result};

#[orca::step(mapped, reads = ["probe.src", "probe.rows"])]
fn react(ctx: &mut Ctx, month: Month) -> Result<(String, usize)> {
    let src = table(ctx, "probe.src")?;
    let rows: usize = scan(ctx, &src)
        .collect()?
        .iter()
        .map(RecordBatch::num_rows)
        .sum();
    ctx.log(format!("{month}: probe.src has {rows} rows"));
    Ok((month.to_string(), rows))
}

orca::pipeline! {
    ProbeSensor = "probe_sensor" [react],
    partitions = Monthly("2024-01"),
    sensor = true,
}

fn main() {
    orca::main::<ProbeSensor>()
}
