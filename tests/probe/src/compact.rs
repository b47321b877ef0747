//! `probe_compact`: a compaction, for the end-to-end test of commits that
//! remove files. Each month's `pieces` step appends its days to
//! `probe.pieces` in three commits (three small files); the `compact` step
//! rewrites every file of the table it read into one per month (the table is
//! partitioned by month) and commits a `replace`.
//!
//! `PROBE_DROP_ROWS=1` makes `compact` lose a batch on the way, which the
//! replace must refuse: a replace keeps the table's rows.

use std::sync::Arc;

use orca::arrow_array::{Int64Array, RecordBatch, StringArray};
use orca::arrow_schema::{DataType, Field, Schema};
use orca::{
    append, commit, ensure_table, files, scan, table, write_files, Ctx, Month, Result, TableSpec,
};

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("month", DataType::Utf8, false),
        Field::new("day", DataType::Int64, false),
    ])
}

#[orca::step(mapped, writes = ["probe.pieces"])]
fn pieces(ctx: &mut Ctx, month: Month) -> Result<usize> {
    // Partitioned by month (the pipeline's partition), each file sorted by
    // day, latest first.
    let t = ensure_table(
        ctx,
        "probe.pieces",
        TableSpec::new(schema()).sort_by_desc("day"),
    )?;
    let days: Vec<i64> = (1..=i64::from(month.days())).collect();
    for chunk in days.chunks(days.len().div_ceil(3)) {
        let batch = RecordBatch::try_new(
            Arc::new(schema()),
            vec![
                Arc::new(StringArray::from(vec![month.to_string(); chunk.len()])),
                Arc::new(Int64Array::from(chunk.to_vec())),
            ],
        )?;
        append(ctx, &t, vec![batch])?;
    }
    Ok(days.len())
}

#[orca::step(gather, after = pieces, reads = ["probe.pieces"], writes = ["probe.pieces"])]
fn compact(ctx: &mut Ctx, _days: Vec<usize>) -> Result<(usize, usize)> {
    let t = table(ctx, "probe.pieces")?;
    let before = files(ctx, &t)?;
    let mut batches = scan(ctx, &t).collect()?;
    if std::env::var("PROBE_DROP_ROWS").is_ok() {
        batches.pop();
    }
    let after = write_files(ctx, &t, batches)?;
    let n = (before.len(), after.len());
    let snapshot = commit(ctx, &t, after, before, "replace")?;
    ctx.log(format!(
        "{} files rewritten as {} in snapshot {snapshot}",
        n.0, n.1
    ));
    Ok(n)
}

orca::pipeline! {
    ProbeCompact = "probe_compact" [pieces, compact],
    partitions = Monthly("2024-01"),
}

fn main() {
    orca::main::<ProbeCompact>()
}
