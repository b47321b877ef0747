//! What a step may read and the snapshot each read is pinned to: a dataset
//! must be among the step's declared reads (or writes), and the first read
//! of a (run, step, partition) pins the table's current snapshot in the
//! control plane, which every retry and resume reads again.

use orca_lake::Table;

use crate::ctx::Ctx;
use crate::error::Result;

/// The dataset is among what the step declares it reads (`reading`) or
/// writes.
pub(crate) fn declared(ctx: &Ctx<'_>, dataset: &str, reading: bool) -> Result<()> {
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

/// The table as it is now, and the snapshot pinned for this (run, step,
/// partition): the current one on the first read, the same one after.
pub(crate) fn pinned(
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
