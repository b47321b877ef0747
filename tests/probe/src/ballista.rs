//! `probe_ballista`: steps whose SQL runs on a Ballista cluster, for the
//! Ballista test. `seed` appends a month of flights (carrier, delay) to
//! `dist.events` in four commits (four files a month, so a scan has several
//! tasks to spread); `totals` runs a join and an aggregation over the
//! month's snapshot on the runner's cluster (`ORCA_BALLISTA_URL`) into
//! `dist.totals`, and the same query in its own process (`Query::local`)
//! into `dist.totals_local`, for the test to compare, and once more on the
//! cluster with its result written as data files of `dist.written` by the
//! executors, committed by the step. With `PROBE_HEAVY`
//! set, `totals` also runs a self-join big enough to be caught mid-query
//! (an executor is killed under it), into `dist.pairs`.

use std::sync::Arc;

use orca::arrow_array::{Int64Array, RecordBatch, StringArray};
use orca::arrow_schema::{DataType, Field, Schema};
use orca::{append, commit, ensure_table, write_files, Ctx, Month, Result, TableSpec, Transform};

const CARRIERS: [&str; 5] = ["AA", "B6", "DL", "UA", "WN"];
const ROWS_PER_FILE: u64 = 25_000;

fn schema() -> Schema {
    Schema::new(vec![
        Field::new("month", DataType::Utf8, false),
        Field::new("carrier", DataType::Utf8, false),
        Field::new("delay", DataType::Int64, false),
    ])
}

#[orca::step(mapped, writes = ["dist.events"])]
fn seed(ctx: &mut Ctx, month: Month) -> Result<String> {
    let spec = TableSpec::new(schema()).partition_by("month", Transform::Identity);
    let t = ensure_table(ctx, "dist.events", spec)?;
    let seed = u64::from(month.days()) * 31;
    for file in 0..4u64 {
        let ids = (file * ROWS_PER_FILE)..((file + 1) * ROWS_PER_FILE);
        let n = ROWS_PER_FILE as usize;
        let batch = RecordBatch::try_new(
            Arc::new(schema()),
            vec![
                Arc::new(StringArray::from(vec![month.to_string(); n])),
                Arc::new(StringArray::from(
                    ids.clone()
                        .map(|i| CARRIERS[(i % 5) as usize])
                        .collect::<Vec<_>>(),
                )),
                Arc::new(Int64Array::from(
                    ids.map(|i| ((i * 7919 + seed) % 211) as i64 - 40)
                        .collect::<Vec<_>>(),
                )),
            ],
        )?;
        append(ctx, &t, vec![batch])?;
    }
    Ok(month.to_string())
}

const TOTALS: &str = "WITH names(code, name) AS (VALUES ('AA', 'American'), ('B6', 'JetBlue'), \
     ('DL', 'Delta'), ('UA', 'United'), ('WN', 'Southwest')) \
     SELECT e.month, e.carrier, n.name, count(*) AS flights, sum(e.delay) AS delay, \
     max(e.delay) AS worst \
     FROM dist.events e JOIN names n ON n.code = e.carrier \
     WHERE e.month = $1 AND e.delay > -30 GROUP BY e.month, e.carrier, n.name";

const PAIRS: &str = "SELECT a.month, a.carrier, count(*) AS pairs \
     FROM dist.events a JOIN dist.events b ON a.carrier = b.carrier AND a.delay = b.delay \
     WHERE a.month = $1 AND b.month = $1 GROUP BY a.month, a.carrier";

fn written_spec() -> TableSpec {
    let text = |n: &str| Field::new(n, DataType::Utf8, true);
    let int = |n: &str| Field::new(n, DataType::Int64, true);
    TableSpec::new(Schema::new(vec![
        text("month"),
        text("carrier"),
        text("name"),
        int("flights"),
        int("delay"),
        int("worst"),
    ]))
    .partition_by("month", Transform::Identity)
}

fn keep(ctx: &mut Ctx, dataset: &str, rows: Vec<RecordBatch>) -> Result<usize> {
    let schema = rows
        .first()
        .map(|b| b.schema().as_ref().clone())
        .ok_or_else(|| format!("{dataset}: the query found no rows"))?;
    let t = ensure_table(ctx, dataset, TableSpec::new(schema))?;
    let n = rows.iter().map(RecordBatch::num_rows).sum();
    append(ctx, &t, rows)?;
    Ok(n)
}

#[orca::step(mapped, after = seed, retries = 2, reads = ["dist.events"], writes = ["dist.totals", "dist.totals_local", "dist.written", "dist.pairs"])]
fn totals(ctx: &mut Ctx, month: String) -> Result<usize> {
    // On the runner's cluster, its result streamed back into the table.
    let remote = ctx.sql(TOTALS, [month.as_str()])?.collect()?;
    let n = keep(ctx, "dist.totals", remote)?;
    // The same in this process, over the same pinned snapshot.
    let local = ctx.sql(TOTALS, [month.as_str()])?.local().collect()?;
    keep(ctx, "dist.totals_local", local)?;
    // Written as data files by the executors (partitioned by month), and
    // committed by the step in one snapshot.
    let written = ensure_table(ctx, "dist.written", written_spec())?;
    let query = ctx.sql(TOTALS, [month.as_str()])?;
    let files = write_files(ctx, &written, query)?;
    commit(ctx, &written, files, vec![], "append")?;
    if std::env::var("PROBE_HEAVY").is_ok_and(|v| !v.is_empty()) {
        let pairs = ctx.sql(PAIRS, [month.as_str()])?.collect()?;
        keep(ctx, "dist.pairs", pairs)?;
    }
    Ok(n)
}

orca::pipeline! {
    ProbeBallista = "probe_ballista" [seed, totals],
    partitions = Monthly("2024-01"),
}

fn main() {
    orca::main::<ProbeBallista>()
}
