//! Iceberg tables from steps: `table`, `ensure_table`, `scan`, `files`,
//! `append`, `write_files` and `commit`, over `orca-lake` (`ctx.sql` is in
//! [`crate::query`]).
//!
//! The catalog lives in the control plane's Postgres, in the SQL-catalog
//! layout other Iceberg clients read (catalog name = the org). Data and
//! metadata go under `ORCA_WAREHOUSE`: dataset `lake.clean` is table `clean`
//! in namespace `lake` at `<warehouse>/lake/clean` (docs/tables.md).
//!
//! A table a pipeline creates is partitioned by the pipeline's partition
//! unless its spec says otherwise ([`default_partitioning`]).
//!
//! What makes reruns safe:
//! - `scan` reads the snapshot pinned for this (run, step, partition): the
//!   table's current one on the first read, recorded in the control plane, the
//!   same one on every retry and resume;
//! - `append` and `commit` put `orca.*` properties in the snapshot summary and,
//!   before writing, look for a snapshot this (run, step, partition) already
//!   committed as this commit number: an attempt killed after its commit but
//!   before the control plane heard of it is found on retry and returned.

use std::collections::HashMap;

use arrow_schema::{DataType, Schema as ArrowSchema};
use orca_lake::table::{self as lake_table, Change};
use orca_lake::{DataFile, Partitioning as TablePartitioning, TableSpec, Transform};

pub use orca_lake::Table;

use crate::ctx::Ctx;
use crate::error::Result;
use crate::partitioning::Partitioning;
use crate::pins::{declared, pinned};
#[cfg(feature = "ballista")]
use crate::query::{report, BATCH_ROWS};
use crate::query::{IntoBatches, Query, Scan};

/// Loads a table the step declared it reads or writes.
pub fn table(ctx: &mut Ctx<'_>, dataset: &str) -> Result<Table> {
    if !ctx.io.reads.contains(&dataset) && !ctx.io.writes.contains(&dataset) {
        return Err(format!(
            "step {} declares neither reads nor writes of dataset {dataset}",
            ctx.step
        )
        .into());
    }
    Ok(lake_table::load(ctx.io.tables.get()?, dataset)?)
}

/// Loads a table the step writes, creating it (and its namespace) if it
/// does not exist, with a schema or a [`TableSpec`] (partitioning, sort
/// order). Without a partitioning in the spec, a new table is partitioned
/// by the pipeline's partition ([`default_partitioning`]). An existing table
/// must have the columns; it keeps its partitioning and sort order.
pub fn ensure_table(ctx: &mut Ctx<'_>, dataset: &str, spec: impl Into<TableSpec>) -> Result<Table> {
    declared(ctx, dataset, false)?;
    let mut spec: TableSpec = spec.into();
    let asked = spec.partitioning.clone();
    if spec.partitioning == TablePartitioning::Auto {
        spec.partitioning = default_partitioning(ctx.io.partitioning.as_ref(), &spec.schema);
    }
    let t = ctx.io.tables.get()?;
    let existed = t.exists(&orca_lake::ident(dataset)?)?;
    let table = lake_table::create_or_load(t, dataset, spec.clone())?;
    let have = table.partitioning();
    if !existed {
        ctx.log(format!("created {dataset}, partitioned by {have}"));
    } else if let TablePartitioning::By(_) = asked {
        let wanted = describe_fields(&spec);
        if wanted != have {
            ctx.log(format!(
                "{dataset} exists partitioned by {have}, not {wanted}: it keeps its partitioning"
            ));
        }
    }
    Ok(table)
}

/// A spec's partition fields as [`Table::partitioning`] spells them.
fn describe_fields(spec: &TableSpec) -> String {
    let fields = spec.partition_fields();
    if fields.is_empty() {
        return "unpartitioned".into();
    }
    fields
        .iter()
        .map(|f| format!("{}({})", f.transform, f.column))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How a table a pipeline creates is partitioned when its spec does not
/// say: by the pipeline's partition.
/// - monthly: identity on a column `month` (text such as `2013-05`, or a
///   date), else month of the date or timestamp column (the one named
///   `date`, or the only one);
/// - daily: identity on a column `day`, else day of that date or timestamp
///   column;
/// - keyed: identity on the key column (`Keyed("lake.clean", "origin")`:
///   `origin`);
///
/// and unpartitioned when the schema has no such column.
pub fn default_partitioning(p: Option<&Partitioning>, schema: &ArrowSchema) -> TablePartitioning {
    let has = |name: &str| schema.field_with_name(name).is_ok();
    let temporal = || {
        let dated: Vec<&str> = schema
            .fields()
            .iter()
            .filter(|f| {
                matches!(
                    f.data_type(),
                    DataType::Date32 | DataType::Date64 | DataType::Timestamp(_, _)
                )
            })
            .map(|f| f.name().as_str())
            .collect();
        match dated.as_slice() {
            [one] => Some(one.to_string()),
            many => many.iter().find(|n| **n == "date").map(|n| n.to_string()),
        }
    };
    let by = |column: &str, transform: Transform| {
        TablePartitioning::By(vec![orca_lake::PartitionField {
            column: column.to_string(),
            transform,
        }])
    };
    match p {
        Some(Partitioning::Dated { kind, .. }) => {
            let (column, transform) = if *kind == "daily" {
                ("day", Transform::Day)
            } else {
                ("month", Transform::Month)
            };
            if has(column) {
                by(column, Transform::Identity)
            } else if let Some(c) = temporal() {
                by(&c, transform)
            } else {
                TablePartitioning::Unpartitioned
            }
        }
        Some(Partitioning::Keyed { column, .. }) if has(column) => by(column, Transform::Identity),
        _ => TablePartitioning::Unpartitioned,
    }
}

/// The data files of the snapshot pinned for this (run, step, partition), as
/// [`commit`] takes them in `removed`: a compaction reads them with [`scan`],
/// writes their rows anew with [`write_files`] and commits a `replace`.
pub fn files(ctx: &mut Ctx<'_>, table: &Table) -> Result<Vec<DataFile>> {
    let (fresh, pinned) = pinned(ctx, table)?;
    let Some(snapshot) = pinned.and_then(|id| fresh.metadata().snapshot_by_id(id).cloned()) else {
        return Ok(Vec::new());
    };
    Ok(lake_table::live_data_files(
        ctx.io.tables.get()?,
        &fresh,
        &snapshot,
    )?)
}

/// A scan of the table at the snapshot pinned for this (run, step,
/// partition): `scan(ctx, &t).filter(col("month").eq(lit(m))).select(["a",
/// "b"]).stream()?` yields batches as the files are read, `.collect()?`
/// reads them all. The filter is pushed down to partition values, file
/// statistics and row groups; the attempt log says how many files it read.
pub fn scan<'c, 'a>(ctx: &'c mut Ctx<'a>, table: &Table) -> Scan<'c, 'a> {
    Scan::new(ctx, table)
}

/// Writes rows (batches, or a scan or query as it streams) as Parquet data
/// files of the table, one file set per partition value, not yet committed
/// (for `commit`). Each file name is unique to the run, step, partition and
/// attempt, so a retry never overwrites a committed file.
pub fn write_files<'a>(
    ctx: &mut Ctx<'_>,
    table: &Table,
    batches: impl IntoBatches<'a>,
) -> Result<Vec<DataFile>> {
    declared(ctx, table.dataset(), false)?;
    let prefix = file_prefix(ctx);
    let batches = match batches.on_cluster()? {
        Ok((query, url)) => return write_on_cluster(table, query, &url, &prefix),
        Err(b) => b.into_batches()?,
    };
    let files = lake_table::write_data_files(ctx.io.tables.get()?, table, batches, prefix)?;
    let rows: u64 = files.iter().map(DataFile::record_count).sum();
    ctx.log(format!(
        "wrote {rows} rows of {} in {} data files",
        table.dataset(),
        files.len()
    ));
    Ok(files)
}

/// A query's result written as the table's data files by the executors of
/// the cluster it runs on: the rows never pass through the step.
#[cfg(feature = "ballista")]
fn write_on_cluster(
    table: &Table,
    query: Query<'_>,
    url: &str,
    prefix: &str,
) -> Result<Vec<DataFile>> {
    let (lake, df, log, tag, scans) = query.into_parts();
    let files = crate::ballista::write_files(lake, df, url, &tag, BATCH_ROWS, table, prefix)?;
    report(&log, &tag, &scans);
    let rows: u64 = files.iter().map(DataFile::record_count).sum();
    log.line(&format!(
        "{tag} query ran on the Ballista cluster at {url}: its executors wrote {rows} rows of {} in {} data files",
        table.dataset(),
        files.len()
    ));
    Ok(files)
}

#[cfg(not(feature = "ballista"))]
fn write_on_cluster(
    _table: &Table,
    query: Query<'_>,
    url: &str,
    _prefix: &str,
) -> Result<Vec<DataFile>> {
    let (_, _, _, tag, _) = query.into_parts();
    Err(format!("{tag}: no Ballista client for {url}").into())
}

/// The start of the names of the data files a step writes: unique to its
/// run, step, partition and attempt, and to the call.
pub(crate) fn file_prefix(ctx: &Ctx<'_>) -> String {
    format!(
        "orca-{}-{}-{}-{}-{}",
        ctx.run
            .map_or_else(|| "local".to_string(), |r| r.to_string()),
        ctx.step,
        ctx.partition.replace(['*', '/'], "all"),
        ctx.attempt,
        uuid::Uuid::new_v4().simple()
    )
}

/// The summary properties a commit carries.
fn properties(ctx: &Ctx<'_>, commit_no: u32) -> HashMap<String, String> {
    let reads: HashMap<&String, &Option<i64>> = ctx.io.read.iter().collect();
    HashMap::from([
        ("orca.pipeline".to_string(), ctx.pipeline.to_string()),
        (
            "orca.run".to_string(),
            ctx.run
                .map_or_else(|| "local".to_string(), |r| r.to_string()),
        ),
        ("orca.step".to_string(), ctx.step.to_string()),
        ("orca.partition".to_string(), ctx.partition.clone()),
        (
            "orca.partitions".to_string(),
            // What a sensor downstream maps to its own partitions: the
            // step's partition, or the run's for a gather step.
            if ctx.partition == "*" {
                ctx.partitions.join(",")
            } else {
                ctx.partition.clone()
            },
        ),
        ("orca.attempt".to_string(), ctx.attempt.to_string()),
        ("orca.commit".to_string(), commit_no.to_string()),
        ("orca.code".to_string(), ctx.io.registry_hash.to_string()),
        (
            "orca.reads".to_string(),
            serde_json::to_string(&reads).unwrap_or_else(|_| "{}".into()),
        ),
    ])
}

/// A snapshot this (run, step, partition) already committed as `commit_no`.
fn own_commit(
    ctx: &Ctx<'_>,
    table: &orca_lake::iceberg::table::Table,
    commit_no: u32,
) -> Option<i64> {
    let run = ctx.run?.to_string();
    let n = commit_no.to_string();
    lake_table::find_commit(
        table,
        &[
            ("orca.run", &run),
            ("orca.step", ctx.step),
            ("orca.partition", &ctx.partition),
            ("orca.commit", &n),
        ],
    )
}

/// Commits data files as one snapshot and returns its id. Operation `append`
/// only: commits that remove files (replace, delete) are not built yet.
pub fn commit(
    ctx: &mut Ctx<'_>,
    table: &Table,
    added: Vec<DataFile>,
    removed: Vec<DataFile>,
    operation: &str,
) -> Result<i64> {
    declared(ctx, table.dataset(), false)?;
    let dataset = table.dataset();
    let rewrite = match operation {
        "append" if removed.is_empty() => None,
        "append" => {
            return Err(format!(
                "commit to {dataset}: an append removes no files; use replace, overwrite or delete"
            )
            .into())
        }
        other => {
            let op = lake_table::operation(other).ok_or_else(|| {
                format!(
                    "commit to {dataset}: unknown operation '{other}' (append, replace, overwrite or delete)"
                )
            })?;
            lake_table::check(dataset, &op, &added, &removed)?;
            Some(op)
        }
    };
    let n = {
        let c = ctx.io.commits.entry(dataset.to_string()).or_insert(0);
        *c += 1;
        *c
    };
    let t = ctx.io.tables.get()?;
    let fresh = t.load(&table.ident)?;
    let snapshot = match (own_commit(ctx, &fresh, n), rewrite) {
        (Some(id), _) => {
            ctx.log(format!(
                "{dataset} already has snapshot {id} from this step's commit {n} in run {}: not committing again",
                ctx.run.unwrap_or_default()
            ));
            id
        }
        (None, Some(op)) => {
            let change = Change {
                added,
                removed,
                op,
                props: properties(ctx, n),
                table_props: HashMap::new(),
            };
            match lake_table::commit_change(
                t,
                &table.ident,
                dataset,
                fresh,
                &change,
                |_| None::<()>,
            )? {
                Ok(id) => id,
                Err(()) => return Err(format!("commit to {dataset}: stopped").into()),
            }
        }
        (None, None) => lake_table::fast_append(t, dataset, &fresh, added, properties(ctx, n))?,
    };
    fault_point("after-table-commit");
    ctx.io.store.record_commit(
        ctx.step,
        &ctx.partition,
        table.dataset(),
        snapshot,
        n,
        operation,
    )?;
    Ok(snapshot)
}

/// A place tests can crash the process at: `ORCA_FAULT=<name>` aborts here,
/// once per `ORCA_FAULT_MARKER` file (created on the way down), to prove what
/// a crash at exactly this point leaves behind. Only in a build with the
/// `fault-injection` feature (the end-to-end tests'): a shipping binary
/// ignores the variable.
#[cfg(not(feature = "fault-injection"))]
fn fault_point(_name: &str) {}

#[cfg(feature = "fault-injection")]
fn fault_point(name: &str) {
    if std::env::var("ORCA_FAULT").ok().as_deref() != Some(name) {
        return;
    }
    let first = match std::env::var("ORCA_FAULT_MARKER") {
        Ok(marker) => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(marker)
            .is_ok(),
        Err(_) => true,
    };
    if first {
        eprintln!("orca: fault injected at {name}: aborting");
        std::process::abort();
    }
}

/// Appends rows (batches, or a scan or query as it streams) as one snapshot
/// and returns its id (`write_files` + `commit`).
pub fn append<'a>(ctx: &mut Ctx<'_>, table: &Table, batches: impl IntoBatches<'a>) -> Result<i64> {
    declared(ctx, table.dataset(), false)?;
    // Look before writing: a retry after a commit the control plane never
    // heard of must not write the files again.
    let next = ctx.io.commits.get(table.dataset()).copied().unwrap_or(0) + 1;
    let fresh = ctx.io.tables.get()?.load(&table.ident)?;
    let files = if own_commit(ctx, &fresh, next).is_some() {
        Vec::new()
    } else {
        write_files(ctx, table, batches)?
    };
    commit(ctx, table, files, Vec::new(), "append")
}

#[cfg(all(test, not(feature = "fault-injection")))]
mod shipping {
    /// A build without the `fault-injection` feature (every build but the
    /// end-to-end tests') never aborts at a fault point: were it to, this
    /// test's process would die.
    #[test]
    fn a_build_without_fault_injection_ignores_orca_fault() {
        std::env::set_var("ORCA_FAULT", "after-table-commit");
        std::env::remove_var("ORCA_FAULT_MARKER");
        super::fault_point("after-table-commit");
    }
}
