//! `labels`: a keyed pipeline. Its partitions are the airports in the `origin`
//! column of `lake.clean` (which the `lake` example writes): each key gets a
//! label from its flights so far, and the run's labels are appended to
//! `lake.labels`. As a sensor it runs for airports that appear in a new
//! snapshot of `lake.clean`, and only for those.
//!
//! ```sh
//! labels keys                               # the snapshot read, one key a line
//! labels run --partitions EWR,JFK
//! orca backfill labels @all                 # every airport that is not done
//! ```

use std::sync::Arc;

use orca::arrow_array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use orca::arrow_schema::{DataType, Field, Schema};
use orca::datafusion::common::ScalarValue;
use orca::{append, ensure_table, Ctx, Name, Result};
use serde::{Deserialize, Serialize};

/// What one airport's flights say about it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Label {
    pub origin: String,
    pub days: i64,
    pub flights: i64,
    pub avg_delay_minutes: f64,
    pub label: String,
}

fn labels_schema() -> Schema {
    Schema::new(vec![
        Field::new("origin", DataType::Utf8, false),
        Field::new("days", DataType::Int64, false),
        Field::new("flights", DataType::Int64, false),
        Field::new("avg_delay_minutes", DataType::Float64, false),
        Field::new("label", DataType::Utf8, false),
    ])
}

/// An integer of the first row of a query's result (0 when it is NULL).
fn int(batches: &[RecordBatch], column: &str) -> Result<i64> {
    let Some(b) = batches.iter().find(|b| b.num_rows() > 0) else {
        return Ok(0);
    };
    let c = b
        .column_by_name(column)
        .ok_or_else(|| format!("no column {column}"))?;
    match ScalarValue::try_from_array(c, 0)? {
        ScalarValue::Int64(v) => Ok(v.unwrap_or(0)),
        v => Err(format!("{column} is {v:?}, not an integer").into()),
    }
}

/// A word for an average departure delay, in minutes.
fn word(avg_delay: f64) -> &'static str {
    match avg_delay {
        d if d < 10.0 => "punctual",
        d if d < 15.0 => "fair",
        _ => "late",
    }
}

#[orca::step(mapped, reads = ["lake.clean"])]
fn label(ctx: &mut Ctx, origin: Name) -> Result<Label> {
    let totals = ctx
        .sql(
            "SELECT count(*) AS days, sum(flights) AS flights, sum(departed) AS departed,
                    sum(delay_minutes) AS delay
             FROM lake.clean WHERE origin = $1",
            [origin.clone()],
        )?
        .collect()?;
    let (days, flights) = (int(&totals, "days")?, int(&totals, "flights")?);
    let (departed, delay) = (int(&totals, "departed")?, int(&totals, "delay")?);
    let avg = if departed == 0 {
        0.0
    } else {
        (delay as f64 / departed as f64 * 100.0).round() / 100.0
    };
    ctx.log(format!(
        "{origin}: {flights} flights over {days} days, {avg} minutes late on average"
    ));
    Ok(Label {
        origin: origin.to_string(),
        days,
        flights,
        avg_delay_minutes: avg,
        label: word(avg).to_string(),
    })
}

#[orca::step(gather, after = label, writes = ["lake.labels"])]
fn publish(ctx: &mut Ctx, labels: Vec<Label>) -> Result<usize> {
    let batch = RecordBatch::try_new(
        Arc::new(labels_schema()),
        vec![
            Arc::new(StringArray::from(
                labels.iter().map(|l| l.origin.clone()).collect::<Vec<_>>(),
            )) as Arc<dyn Array>,
            Arc::new(Int64Array::from(
                labels.iter().map(|l| l.days).collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(
                labels.iter().map(|l| l.flights).collect::<Vec<_>>(),
            )),
            Arc::new(Float64Array::from(
                labels
                    .iter()
                    .map(|l| l.avg_delay_minutes)
                    .collect::<Vec<_>>(),
            )),
            Arc::new(StringArray::from(
                labels.iter().map(|l| l.label.clone()).collect::<Vec<_>>(),
            )),
        ],
    )?;
    let out = ensure_table(ctx, "lake.labels", labels_schema())?;
    let snapshot = append(ctx, &out, vec![batch])?;
    ctx.log(format!(
        "{} labels appended to lake.labels as snapshot {snapshot}",
        labels.len()
    ));
    Ok(labels.len())
}

orca::pipeline! {
    Labels = "labels" [label, publish],
    partitions = Keyed("lake.clean", "origin"),
    keys_per_run = 2,
    sensor = true,
}

fn main() {
    orca::main::<Labels>()
}
