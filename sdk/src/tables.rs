//! Iceberg tables from steps: `table`, `ensure_table`, `scan`, `files`,
//! `append`, `write_files` and `commit`, over `orca-lake`.
//!
//! The catalog lives in the control plane's Postgres, in the SQL-catalog
//! layout other Iceberg clients read (catalog name = the org). Data and
//! metadata go under `ORCA_WAREHOUSE`: dataset `lake.clean` is table `clean`
//! in namespace `lake` at `<warehouse>/lake/clean` (docs/tables.md).
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

use arrow_array::RecordBatch;
use arrow_schema::Schema as ArrowSchema;
use orca_lake::table::{self as lake_table, Change};
use orca_lake::DataFile;

pub use orca_lake::Table;

use crate::ctx::Ctx;
use crate::error::Result;

fn declared(ctx: &Ctx<'_>, dataset: &str, reading: bool) -> Result<()> {
    let (list, what) = if reading {
        (ctx.io.reads, "reads")
    } else {
        (ctx.io.writes, "writes")
    };
    if list.contains(&dataset) {
        Ok(())
    } else {
        Err(format!(
            "step {} does not declare dataset {dataset} in its {what}: add it to #[orca::step(..., {what} = [\"{dataset}\"])]",
            ctx.step
        )
        .into())
    }
}

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

/// Loads a table the step writes, creating it (and its namespace) with this
/// schema if it does not exist. An existing table must have these columns.
pub fn ensure_table(ctx: &mut Ctx<'_>, dataset: &str, schema: &ArrowSchema) -> Result<Table> {
    declared(ctx, dataset, false)?;
    Ok(lake_table::create_or_load(
        ctx.io.tables.get()?,
        dataset,
        schema,
    )?)
}

/// The table as it is now, and the snapshot pinned for this (run, step,
/// partition): the current one on the first read, the same one after.
fn pinned(
    ctx: &mut Ctx<'_>,
    table: &Table,
) -> Result<(orca_lake::iceberg::table::Table, Option<i64>)> {
    declared(ctx, table.dataset(), true)?;
    // The table as it is now: a pinned snapshot may be newer than the handle.
    let fresh = ctx.io.tables.get()?.load(&table.ident)?;
    let current = fresh.metadata().current_snapshot().map(|s| s.snapshot_id());
    let pinned = ctx
        .io
        .store
        .pin_read(ctx.step, &ctx.partition, table.dataset(), current)?;
    ctx.io.read.insert(table.dataset().to_string(), pinned);
    if let Some(snapshot) = pinned {
        if fresh.metadata().snapshot_by_id(snapshot).is_none() {
            return Err(format!(
                "table {} no longer has snapshot {snapshot}, which this run read first (expired?)",
                table.dataset()
            )
            .into());
        }
    }
    Ok((fresh, pinned))
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

/// Reads the table at the snapshot pinned for this (run, step, partition).
pub fn scan(ctx: &mut Ctx<'_>, table: &Table) -> Result<Vec<RecordBatch>> {
    let (fresh, pinned) = pinned(ctx, table)?;
    let Some(snapshot) = pinned else {
        return Ok(Vec::new());
    };
    Ok(lake_table::scan_snapshot(
        ctx.io.tables.get()?,
        &fresh,
        snapshot,
    )?)
}

/// Writes batches as Parquet data files of the table, not yet committed
/// (for `commit`). Each file name is unique to the run, step, partition and
/// attempt, so a retry never overwrites a committed file.
pub fn write_files(
    ctx: &mut Ctx<'_>,
    table: &Table,
    batches: Vec<RecordBatch>,
) -> Result<Vec<DataFile>> {
    declared(ctx, table.dataset(), false)?;
    let batches = lake_table::fit(table, batches)?;
    let prefix = format!(
        "orca-{}-{}-{}-{}-{}",
        ctx.run
            .map_or_else(|| "local".to_string(), |r| r.to_string()),
        ctx.step,
        ctx.partition.replace(['*', '/'], "all"),
        ctx.attempt,
        uuid::Uuid::new_v4().simple()
    );
    Ok(lake_table::write_data_files(
        ctx.io.tables.get()?,
        table,
        batches,
        prefix,
    )?)
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
/// a crash at exactly this point leaves behind.
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

/// Appends batches as one snapshot and returns its id (`write_files` + `commit`).
pub fn append(ctx: &mut Ctx<'_>, table: &Table, batches: Vec<RecordBatch>) -> Result<i64> {
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
