//! Commits that remove data files: `replace` (a compaction: the same rows in
//! other files), `overwrite` and `delete`.
//!
//! iceberg 0.10 builds only appends, so this writes what a snapshot is made of
//! itself: a manifest of the added files, the current snapshot's manifests that
//! held a removed file rewritten with it marked deleted (the others kept as
//! they are), a manifest list, the snapshot and the next metadata file. Then it
//! swaps the catalog's metadata pointer with a compare-and-swap, as the SQL
//! catalog does for its own commits. When another commit won the swap, it
//! starts again from the new state; a file to remove that the new state no
//! longer holds is a conflict it reports instead.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use iceberg::spec::{
    DataFile, FormatVersion, ManifestContentType, ManifestFile, ManifestListWriter,
    ManifestWriterBuilder, Operation, Snapshot, SnapshotSummaryCollector, Summary,
};
use iceberg::table::Table as IcebergTable;
use iceberg::{Catalog, MetadataLocation, TableIdent};

use crate::catalog::Lake;
use crate::LakeError;

/// How often a commit starts again after losing the swap to another writer.
const CONFLICT_RETRIES: usize = 10;

fn err(dataset: &str, what: impl std::fmt::Display) -> LakeError {
    LakeError::Table(format!("commit to {dataset}: {what}"))
}

/// An Iceberg error of a commit, kept whole: a store that did not answer
/// is told by it ([`LakeError::unavailable`]).
fn failed(dataset: &str) -> impl FnOnce(iceberg::Error) -> LakeError {
    LakeError::iceberg(format!("commit to {dataset}"))
}

/// A commit: what it adds and removes, as which operation, with which
/// summary properties and table properties (set in the same metadata).
pub struct Change {
    pub added: Vec<DataFile>,
    pub removed: Vec<DataFile>,
    pub op: Operation,
    pub props: HashMap<String, String>,
    pub table_props: HashMap<String, String>,
}

/// Commits the change unless `stop`, asked about the table before each try
/// (the first and every one after losing the swap to another commit), says
/// why not: then `Ok(Err(why))` and nothing is committed. The swap is a
/// compare-and-swap on the state `stop` saw, so nothing can slip in between.
pub(crate) fn commit_if<T>(
    t: &Lake,
    ident: &TableIdent,
    dataset: &str,
    fresh: IcebergTable,
    change: &Change,
    stop: impl Fn(&IcebergTable) -> Option<T>,
) -> Result<Result<i64, T>, LakeError> {
    swap_if(t, ident, dataset, fresh, stop, |table| {
        t.rt.block_on(stage(table, dataset, change))
    })
}

/// Writes the next metadata (`next`: what it returns and where it is) and
/// swaps it in, unless `stop`, asked about the table before each try, says
/// why not; a lost swap starts again from the state that won it.
fn swap_if<R, T>(
    t: &Lake,
    ident: &TableIdent,
    dataset: &str,
    fresh: IcebergTable,
    stop: impl Fn(&IcebergTable) -> Option<T>,
    next: impl Fn(&IcebergTable) -> Result<(R, MetadataLocation), LakeError>,
) -> Result<Result<R, T>, LakeError> {
    let mut table = fresh;
    for _ in 0..CONFLICT_RETRIES {
        if let Some(why) = stop(&table) {
            return Ok(Err(why));
        }
        let (done, location) = next(&table)?;
        if t.rt.block_on(t.swap(ident, &table, &location))? {
            return Ok(Ok(done));
        }
        table =
            t.rt.block_on(t.catalog.load_table(ident))
                .map_err(LakeError::iceberg(format!(
                    "commit to {dataset}: reloading after a conflict"
                )))?;
    }
    Err(err(
        dataset,
        format!("{CONFLICT_RETRIES} concurrent commits won the race; giving up"),
    ))
}

/// Sets table properties (no snapshot) unless `stop`, asked about the table
/// before each try, says why not, as [`commit_if`] does: a property that
/// guards something (a sync's fence, its epoch marker) is never set over a
/// state it was not checked against, as a blind retry would.
pub(crate) fn set_properties_if<T>(
    t: &Lake,
    ident: &TableIdent,
    dataset: &str,
    fresh: IcebergTable,
    props: &HashMap<String, String>,
    stop: impl Fn(&IcebergTable) -> Option<T>,
) -> Result<Result<(), T>, LakeError> {
    swap_if(t, ident, dataset, fresh, stop, |table| {
        let old = table.metadata_location_result().map_err(failed(dataset))?;
        let next = MetadataLocation::from_str(old)
            .map_err(failed(dataset))?
            .with_next_version();
        let metadata = table
            .metadata()
            .clone()
            .into_builder(Some(old.to_string()))
            .set_properties(props.clone())
            .and_then(|b| b.build())
            .map_err(failed(dataset))?
            .metadata;
        t.rt.block_on(metadata.write_to(table.file_io(), &next))
            .map_err(failed(dataset))?;
        Ok(((), next))
    })
}

/// Writes the manifests, manifest list and metadata of the new snapshot;
/// returns its id and the metadata file's location.
async fn stage(
    table: &IcebergTable,
    dataset: &str,
    change: &Change,
) -> Result<(i64, MetadataLocation), LakeError> {
    let (added, removed) = (change.added.as_slice(), change.removed.as_slice());
    let meta = table.metadata();
    if meta.format_version() != FormatVersion::V2 {
        return Err(err(
            dataset,
            format!(
                "removing files is built for Iceberg format version 2; this table is {}",
                meta.format_version()
            ),
        ));
    }
    // An append into a table without a snapshot has no manifests to keep.
    let current = meta.current_snapshot();
    if current.is_none() && !removed.is_empty() {
        return Err(err(
            dataset,
            "the table has no snapshot, so no file to remove",
        ));
    }
    let io = table.file_io();
    let snapshot_id = new_snapshot_id(table);
    let sequence = meta.next_sequence_number();
    let schema = meta.current_schema().clone();
    let spec = meta.default_partition_spec().clone();
    let commit_uuid = uuid::Uuid::new_v4();
    let mut counter = 0;
    let writer = |counter: &mut i32| -> Result<_, LakeError> {
        *counter += 1;
        let path = format!("{}/metadata/{commit_uuid}-m{counter}.avro", meta.location());
        let out = io.new_output(path).map_err(failed(dataset))?;
        Ok(ManifestWriterBuilder::new(
            out,
            Some(snapshot_id),
            schema.clone(),
            spec.as_ref().clone(),
        )
        .build_v2_data())
    };

    let to_remove: HashSet<&str> = removed.iter().map(DataFile::file_path).collect();
    let mut found: HashSet<String> = HashSet::new();
    let mut manifests: Vec<ManifestFile> = Vec::new();
    let kept = match current {
        Some(current) => table
            .manifest_list_reader(current)
            .load()
            .await
            .map_err(failed(dataset))?
            .consume_entries()
            .into_iter()
            .collect(),
        None => Vec::new(),
    };
    for mf in kept {
        if mf.content != ManifestContentType::Data {
            manifests.push(mf);
            continue;
        }
        let manifest = mf.load_manifest(io).await.map_err(failed(dataset))?;
        let touched = manifest
            .entries()
            .iter()
            .any(|e| e.is_alive() && to_remove.contains(e.file_path()));
        if !touched {
            manifests.push(mf);
            continue;
        }
        let mut w = writer(&mut counter)?;
        for e in manifest.entries().iter().filter(|e| e.is_alive()) {
            let seq = e.sequence_number().unwrap_or(mf.sequence_number);
            let file_seq = e.file_sequence_number.or(Some(seq));
            if to_remove.contains(e.file_path()) {
                found.insert(e.file_path().to_string());
                w.add_delete_file(e.data_file().clone(), seq, file_seq)
            } else {
                w.add_existing_file(
                    e.data_file().clone(),
                    e.snapshot_id().unwrap_or(mf.added_snapshot_id),
                    seq,
                    file_seq,
                )
            }
            .map_err(failed(dataset))?;
        }
        manifests.push(w.write_manifest_file().await.map_err(failed(dataset))?);
    }
    if let Some(missing) = removed.iter().find(|f| !found.contains(f.file_path())) {
        return Err(LakeError::Conflict(format!(
            "commit to {dataset}: file {} is not in the current snapshot {} (another commit \
             removed it)",
            missing.file_path(),
            current.map(|c| c.snapshot_id()).unwrap_or_default()
        )));
    }
    if !added.is_empty() {
        let mut w = writer(&mut counter)?;
        for f in added {
            // A negative sequence number is inherited from the manifest list.
            w.add_file(f.clone(), -1).map_err(failed(dataset))?;
        }
        manifests.push(w.write_manifest_file().await.map_err(failed(dataset))?);
    }

    let list_path = format!(
        "{}/metadata/snap-{snapshot_id}-0-{commit_uuid}.avro",
        meta.location()
    );
    let out = io.new_output(list_path.clone()).map_err(failed(dataset))?;
    let mut list_writer = ManifestListWriter::v2(
        out.writer().await.map_err(failed(dataset))?,
        snapshot_id,
        current.map(|c| c.snapshot_id()),
        sequence,
    );
    list_writer
        .add_manifests(manifests.into_iter())
        .map_err(failed(dataset))?;
    list_writer.close().await.map_err(failed(dataset))?;

    let snapshot = Snapshot::builder()
        .with_manifest_list(list_path)
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(current.map(|c| c.snapshot_id()))
        .with_sequence_number(sequence)
        .with_summary(summary(table, change))
        .with_schema_id(meta.current_schema_id())
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
        .build();
    let old = table.metadata_location_result().map_err(failed(dataset))?;
    let next = MetadataLocation::from_str(old)
        .map_err(failed(dataset))?
        .with_next_version();
    let metadata = meta
        .clone()
        .into_builder(Some(old.to_string()))
        .set_branch_snapshot(snapshot, "main")
        .and_then(|b| {
            if change.table_props.is_empty() {
                Ok(b)
            } else {
                b.set_properties(change.table_props.clone())
            }
        })
        .and_then(|b| b.build())
        .map_err(failed(dataset))?
        .metadata;
    metadata
        .write_to(io, &next)
        .await
        .map_err(failed(dataset))?;
    Ok((snapshot_id, next))
}

/// The snapshot summary: the caller's properties, the files and rows added
/// and removed, and the table's totals after it.
fn summary(table: &IcebergTable, change: &Change) -> Summary {
    let (added, removed) = (change.added.as_slice(), change.removed.as_slice());
    let meta = table.metadata();
    let mut c = SnapshotSummaryCollector::default();
    for f in added {
        c.add_file(
            f,
            meta.current_schema().clone(),
            meta.default_partition_spec().clone(),
        );
    }
    for f in removed {
        c.remove_file(
            f,
            meta.current_schema().clone(),
            meta.default_partition_spec().clone(),
        );
    }
    let mut out = change.props.clone();
    out.extend(c.build());
    let previous = meta
        .current_snapshot()
        .map(|s| s.summary().additional_properties.clone())
        .unwrap_or_default();
    let total = |key: &str, plus: u64, minus: u64| {
        let before = previous
            .get(key)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        (before + plus).saturating_sub(minus).to_string()
    };
    let sum = |files: &[DataFile], f: fn(&DataFile) -> u64| files.iter().map(f).sum::<u64>();
    out.insert(
        "total-records".into(),
        total(
            "total-records",
            sum(added, DataFile::record_count),
            sum(removed, DataFile::record_count),
        ),
    );
    out.insert(
        "total-data-files".into(),
        total("total-data-files", added.len() as u64, removed.len() as u64),
    );
    out.insert(
        "total-files-size".into(),
        total(
            "total-files-size",
            sum(added, DataFile::file_size_in_bytes),
            sum(removed, DataFile::file_size_in_bytes),
        ),
    );
    for key in [
        "total-delete-files",
        "total-position-deletes",
        "total-equality-deletes",
    ] {
        out.insert(key.into(), total(key, 0, 0));
    }
    Summary {
        operation: change.op.clone(),
        additional_properties: out,
    }
}

fn new_snapshot_id(table: &IcebergTable) -> i64 {
    loop {
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let id = ((a ^ b) >> 1) as i64;
        if id != 0 && table.metadata().snapshot_by_id(id).is_none() {
            return id;
        }
    }
}
