//! The Iceberg destination's own steps: an epoch's commit as the SDK
//! reports it, a refresh kept in a shadow until its last epoch, and the
//! cells an Iceberg column is too narrow to take.

use orca_lake::sync_tables::{EpochAt, EpochCommit, SyncTables};

use crate::commit::record::{Refresh, Staged};
use crate::commit::store::Store;
use crate::dest::error::DestError;
use crate::dest::held::Held;
use crate::dest::staged::read_parquet;

/// An error of the lake SDK, as the destination's.
pub(super) fn iceberg_error(e: orca_lake::LakeError) -> DestError {
    if e.unavailable() {
        DestError::IcebergUnavailable(e.to_string())
    } else {
        DestError::Iceberg(e.to_string())
    }
}

pub(super) fn committed(
    done: orca_lake::Result<EpochCommit>,
    generation: i32,
) -> Result<(), DestError> {
    match done.map_err(iceberg_error)? {
        EpochCommit::Fenced { fence } => Err(DestError::Fenced {
            fence,
            mine: generation,
        }),
        EpochCommit::Committed { .. } | EpochCommit::AlreadyApplied => Ok(()),
    }
}

/// An epoch of a stream refreshed into Iceberg: its staged files are kept in
/// the sync's store under `shadow` (the first epoch of a refresh empties it)
/// and the table's marker moves; the refresh's last epoch replaces every
/// data file of the table with the shadow's rows in one `overwrite` snapshot
/// carrying the marker, then lets the shadow go.
pub(super) fn refresh_iceberg(
    tables: &SyncTables,
    store: &Store,
    shadow: &str,
    at: &EpochAt<'_>,
    staged: &[&Staged],
    r: Refresh,
) -> Result<(), DestError> {
    if tables.marker(at.dataset, at.sync).map_err(iceberg_error)? >= at.epoch {
        return Ok(());
    }
    if r.begins {
        for f in store.list(shadow)? {
            store.delete(&f)?;
        }
    }
    for s in staged {
        let data = store.get(&s.path)?.ok_or_else(|| DestError::StagedGone {
            path: store.url_of(&s.path),
        })?;
        store.put(
            &format!("{shadow}/part-{:010}-{}.parquet", at.epoch, s.lane),
            data,
        )?;
    }
    if !r.ends {
        return committed(tables.mark_epoch(at), at.generation);
    }
    let files = store.list(shadow)?;
    let parts = files
        .iter()
        .map(|f| read_parquet(store, f).map_err(|e| orca_lake::LakeError::Table(e.to_string())));
    committed(tables.replace_epoch(at, parts), at.generation)?;
    for f in &files {
        store.delete(f)?;
    }
    Ok(())
}

/// Sets aside (as null) the cells of columns that are narrower in the
/// table than in the stream (Iceberg cannot widen long to double, or
/// anything to string) and do not convert to the table's type and back
/// unchanged: 2.5 into a long column is held, 3.0 goes in as 3.
pub(super) fn hold_narrower(
    batch: arrow_array::RecordBatch,
    table: &arrow_schema::Schema,
) -> Result<(arrow_array::RecordBatch, Vec<Held>), DestError> {
    use arrow_array::cast::AsArray;
    use arrow_array::Array;
    let text = |a: &arrow_array::ArrayRef| {
        arrow_cast::cast(a, &arrow_schema::DataType::Utf8).map_err(DestError::from)
    };
    let ids = batch.column_by_name(crate::ids::ORCA_ID).cloned();
    let mut columns = batch.columns().to_vec();
    let mut fields: Vec<arrow_schema::FieldRef> = batch.schema().fields().iter().cloned().collect();
    let mut held = Vec::new();
    let mut ids_moved = false;
    for (i, f) in batch.schema().fields().iter().enumerate() {
        let Ok(t) = table.field_with_name(f.name()) else {
            continue;
        };
        if t.data_type() == f.data_type() {
            continue;
        }
        let c = batch.column(i);
        if f.name() == crate::ids::ORCA_ID {
            // A table made with the other form of id (a new sync into an
            // old table): the ids go in the table's form.
            columns[i] = crate::ids::conform(c.clone(), t.data_type())
                .map_err(|e| DestError::Definition(e.to_string()))?;
            fields[i] =
                std::sync::Arc::new(f.as_ref().clone().with_data_type(t.data_type().clone()));
            ids_moved = true;
            continue;
        }
        let there = arrow_cast::cast(c, t.data_type())?;
        let back = text(&arrow_cast::cast(&there, f.data_type())?)?;
        let (back, orig) = (back.as_string::<i32>(), text(c)?);
        let orig = orig.as_string::<i32>();
        let lost: arrow_array::BooleanArray = (0..c.len())
            .map(|row| {
                Some(c.is_valid(row) && (there.is_null(row) || back.value(row) != orig.value(row)))
            })
            .collect();
        if lost.true_count() == 0 {
            continue;
        }
        for row in (0..c.len()).filter(|r| lost.value(*r)) {
            held.push(Held {
                column: f.name().clone(),
                orca_id: ids
                    .as_ref()
                    .map(|ids| crate::ids::text_at(ids.as_ref(), row))
                    .unwrap_or_default(),
                value: orig.value(row).to_string(),
                reason: "the Iceberg table's column is narrower than the stream's and cannot be widened so",
            });
        }
        columns[i] = arrow_select::nullif::nullif(c, &lost)?;
    }
    if held.is_empty() && !ids_moved {
        return Ok((batch, held));
    }
    let schema = arrow_schema::Schema::new_with_metadata(fields, batch.schema().metadata().clone());
    Ok((
        arrow_array::RecordBatch::try_new(std::sync::Arc::new(schema), columns)?,
        held,
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::{Array, ArrayRef, FixedSizeBinaryArray, Float64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::ids::{self, IdForm};

    #[test]
    fn a_table_made_with_hex_ids_gets_them_as_hex_and_a_narrower_cell_is_held_by_its_id() {
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("amount", DataType::Float64, true),
                IdForm::Bytes.field(),
            ])),
            vec![
                Arc::new(Float64Array::from(vec![2.5, 3.0])) as ArrayRef,
                Arc::new(
                    FixedSizeBinaryArray::try_from_iter(
                        [ids::bytes(1, 2), ids::bytes(3, 4)].into_iter(),
                    )
                    .expect("ids"),
                ),
            ],
        )
        .expect("batch");
        // The table an older engine made: long amounts, text ids.
        let table = Schema::new(vec![
            Field::new("amount", DataType::Int64, true),
            IdForm::Hex.field(),
        ]);
        let (out, held) = hold_narrower(batch, &table).expect("held");
        assert_eq!(out.schema().field(1).data_type(), &DataType::Utf8);
        let hex: Vec<&str> = out.column(1).as_string::<i32>().iter().flatten().collect();
        assert_eq!(hex, [ids::text(1, 2), ids::text(3, 4)]);
        assert_eq!(held.len(), 1, "2.5 does not fit a long; 3.0 does");
        assert_eq!(
            (held[0].orca_id.as_str(), held[0].value.as_str()),
            (ids::text(1, 2).as_str(), "2.5")
        );
        assert!(out.column(0).is_null(0) && out.column(0).is_valid(1));

        // And the other way: hex ids into a table made with 16 bytes.
        let bytes_table = Schema::new(vec![
            Field::new("amount", DataType::Float64, true),
            IdForm::Bytes.field(),
        ]);
        let (back, held) = hold_narrower(out, &bytes_table).expect("held");
        assert!(held.is_empty());
        assert_eq!(
            back.schema().field(1).data_type(),
            &IdForm::Bytes.data_type()
        );
        assert_eq!(
            back.column(1).as_fixed_size_binary().value(1),
            ids::bytes(3, 4)
        );
    }
}
