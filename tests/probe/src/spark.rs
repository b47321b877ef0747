//! `probe_spark`: a step that hands its work to a Spark cluster, for the
//! Spark test. `seed` appends a month of flights (carrier, delay) to
//! `spark.events`; `totals` submits the application `PROBE_SPARK_APP`
//! (tests/py/spark_totals.py) to the runner's `ORCA_SPARK_MASTER`, reading
//! the snapshot of `spark.events` it pinned, and commits what the
//! application wrote to `spark.totals`; it computes the same with DataFusion
//! over the same snapshot into `spark.totals_local`, for the test to compare.

use std::sync::Arc;

use orca::arrow_array::{Int64Array, RecordBatch, StringArray};
use orca::arrow_schema::{DataType, Field, Schema};
use orca::spark::{self, Job};
use orca::{append, ensure_table, table, Ctx, Month, Result, TableSpec};

const CARRIERS: [&str; 5] = ["AA", "B6", "DL", "UA", "WN"];

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("month", DataType::Utf8, false),
        Field::new("carrier", DataType::Utf8, false),
        Field::new("delay", DataType::Int64, false),
    ])
}

#[orca::step(mapped, writes = ["spark.events"])]
fn seed(ctx: &mut Ctx, month: Month) -> Result<String> {
    let t = ensure_table(ctx, "spark.events", TableSpec::new(schema()))?;
    let n = 20_000usize;
    let seed = u64::from(month.days()) * 31;
    let delays: Vec<i64> = (0..n as u64)
        .map(|i| ((i * 7919 + seed) % 211) as i64 - 40)
        .collect();
    let batch = RecordBatch::try_new(
        Arc::new(schema()),
        vec![
            Arc::new(StringArray::from(vec![month.to_string(); n])),
            Arc::new(StringArray::from(
                (0..n)
                    .map(|i| CARRIERS[i % CARRIERS.len()])
                    .collect::<Vec<_>>(),
            )),
            Arc::new(Int64Array::from(delays)),
        ],
    )?;
    append(ctx, &t, vec![batch])?;
    Ok(month.to_string())
}

#[orca::step(mapped, after = seed, retries = 0, reads = ["spark.events"], writes = ["spark.totals", "spark.totals_local"])]
fn totals(ctx: &mut Ctx, month: String) -> Result<usize> {
    let events = table(ctx, "spark.events")?;
    let app = std::env::var("PROBE_SPARK_APP").map_err(|_| "PROBE_SPARK_APP is not set")?;
    let out = spark::submit(ctx, Job::new(app).arg(&month).read(&events))?;
    let spark_rows = out.batches()?;
    let t = ensure_table(
        ctx,
        "spark.totals",
        TableSpec::new(out.schema()?.as_ref().clone()),
    )?;
    let n = spark_rows.iter().map(RecordBatch::num_rows).sum();
    append(ctx, &t, spark_rows)?;
    // The same, by DataFusion in this process, over the same pinned snapshot.
    let local = ctx
        .sql(
            "SELECT month, carrier, count(*) AS flights, sum(delay) AS delay \
             FROM spark.events WHERE month = $1 GROUP BY month, carrier",
            [month.as_str()],
        )?
        .collect()?;
    let schema = local
        .first()
        .map(|b| b.schema().as_ref().clone())
        .ok_or("DataFusion found no rows")?;
    let l = ensure_table(ctx, "spark.totals_local", TableSpec::new(schema))?;
    append(ctx, &l, local)?;
    Ok(n)
}

orca::pipeline! {
    ProbeSpark = "probe_spark" [seed, totals],
    partitions = Monthly("2024-01"),
}

fn main() {
    orca::main::<ProbeSpark>()
}
