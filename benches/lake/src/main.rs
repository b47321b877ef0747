//! `bench_lake`: the pipeline of `benches/lake/run.sh`. One monthly step
//! aggregates a month of flights (per origin and carrier: flights, mean
//! departure delay, miles) into a table, in one of two ways
//! (`BENCH_MODE`):
//!
//! - `before`: as steps read tables before pruned scans existed: the whole
//!   unpartitioned `bench.raw_flat` into memory at the pinned snapshot, its
//!   month kept by hand, aggregated by hand;
//! - `after` (the default): one SQL query over the month-partitioned
//!   `bench.raw`, which reads that month's files only, streamed;
//! - `spark`: the same aggregation by a Spark application
//!   (`BENCH_SPARK_APP`, on the runner's `ORCA_SPARK_MASTER`) over the data
//!   files of the snapshot the step pinned, committed by the step;
//! - `ballista`: `after`'s query, on the runner's Ballista cluster
//!   (`ORCA_BALLISTA_URL`).

use std::collections::BTreeMap;
use std::sync::Arc;

use orca::arrow_array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use orca::arrow_schema::{DataType, Field, Schema};
use orca::spark::{self, Job};
use orca::{append, ensure_table, scan, table, Ctx, Month, Result};

fn out_schema() -> Schema {
    Schema::new(vec![
        Field::new("month", DataType::Utf8, false),
        Field::new("origin", DataType::Utf8, false),
        Field::new("carrier", DataType::Utf8, false),
        Field::new("flights", DataType::Int64, false),
        Field::new("avg_dep_delay", DataType::Float64, true),
        Field::new("miles", DataType::Int64, true),
    ])
}

/// The whole table into memory, the month kept and aggregated by hand.
fn before(ctx: &mut Ctx, month: &str) -> Result<RecordBatch> {
    let flat = table(ctx, "bench.raw_flat")?;
    let all = scan(ctx, &flat).collect()?;
    // (origin, carrier) -> (flights, delay sum, delays counted, miles)
    let mut acc: BTreeMap<(String, String), (i64, f64, i64, i64)> = BTreeMap::new();
    for b in &all {
        let col = |n: &str| b.column_by_name(n).ok_or_else(|| format!("no column {n}"));
        let cast = |n: &str, t: &DataType| -> Result<Arc<dyn Array>> {
            Ok(orca::datafusion::arrow::compute::cast(col(n)?, t)?)
        };
        let m = cast("month", &DataType::Utf8)?;
        let o = cast("origin", &DataType::Utf8)?;
        let c = cast("carrier", &DataType::Utf8)?;
        let d = cast("dep_delay", &DataType::Float64)?;
        let mi = cast("distance", &DataType::Int64)?;
        let text = |a: &Arc<dyn Array>| a.as_any().downcast_ref::<StringArray>().cloned();
        let (Some(m), Some(o), Some(c)) = (text(&m), text(&o), text(&c)) else {
            return Err("text columns did not read as text".into());
        };
        let d = d
            .as_any()
            .downcast_ref::<Float64Array>()
            .ok_or("dep_delay")?;
        let mi = mi.as_any().downcast_ref::<Int64Array>().ok_or("distance")?;
        for i in 0..b.num_rows() {
            if m.value(i) != month {
                continue;
            }
            let e = acc
                .entry((o.value(i).to_string(), c.value(i).to_string()))
                .or_default();
            e.0 += 1;
            if d.is_valid(i) {
                e.1 += d.value(i);
                e.2 += 1;
            }
            if mi.is_valid(i) {
                e.3 += mi.value(i);
            }
        }
    }
    Ok(RecordBatch::try_new(
        Arc::new(out_schema()),
        vec![
            Arc::new(StringArray::from(vec![month; acc.len()])),
            Arc::new(StringArray::from_iter_values(
                acc.keys().map(|k| k.0.as_str()),
            )),
            Arc::new(StringArray::from_iter_values(
                acc.keys().map(|k| k.1.as_str()),
            )),
            Arc::new(Int64Array::from_iter_values(acc.values().map(|v| v.0))),
            Arc::new(Float64Array::from_iter(
                acc.values().map(|v| (v.2 > 0).then(|| v.1 / v.2 as f64)),
            )),
            Arc::new(Int64Array::from_iter_values(acc.values().map(|v| v.3))),
        ],
    )?)
}

#[orca::step(
    mapped,
    reads = ["bench.raw", "bench.raw_flat"],
    writes = ["bench.monthly"]
)]
fn aggregate(ctx: &mut Ctx, month: Month) -> Result<String> {
    let out = ensure_table(ctx, "bench.monthly", out_schema())?;
    let mode = std::env::var("BENCH_MODE").unwrap_or_else(|_| "after".into());
    let started = std::time::Instant::now();
    let snapshot = if mode == "before" {
        let batch = before(ctx, &month.to_string())?;
        append(ctx, &out, batch)?
    } else if mode == "spark" {
        let raw = table(ctx, "bench.raw")?;
        let app = std::env::var("BENCH_SPARK_APP").map_err(|_| "BENCH_SPARK_APP is not set")?;
        let done = spark::submit(ctx, Job::new(app).arg(month.to_string()).read(&raw))?;
        // Spark writes every column nullable; the table's are as declared.
        let mut batches = Vec::new();
        for b in done.batches()? {
            batches.push(RecordBatch::try_new(
                Arc::new(out_schema()),
                b.columns().to_vec(),
            )?);
        }
        append(ctx, &out, batches)?
    } else {
        let q = ctx.sql(
            "SELECT month, origin, carrier, count(*) AS flights, avg(dep_delay) AS avg_dep_delay,
                    sum(distance) AS miles
             FROM bench.raw WHERE month = $1 GROUP BY month, origin, carrier",
            [month],
        )?;
        append(ctx, &out, q)?
    };
    // What the run.sh compares with DuckDB's queries: the step's own work,
    // without the process, the lease and the control plane around it.
    ctx.log(format!(
        "aggregated {month} in {} ms",
        started.elapsed().as_millis()
    ));
    Ok(format!("{mode} {snapshot}"))
}

orca::pipeline! {
    BenchLake = "bench_lake" [aggregate],
    partitions = Monthly("2013-01"),
    max_runs = 2,
}

fn main() {
    orca::main::<BenchLake>()
}
