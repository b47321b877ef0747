//! Table maintenance: expiring old snapshots, removing orphan files and
//! compacting small files, so that a table's metadata and files do not grow
//! without bound.
//!
//! What each may never do is decided here, from facts the caller brings
//! ([`Keep`]: the snapshots runs have pinned, what sensors have yet to see):
//! - expiry keeps the current snapshot, every snapshot a ref names, the
//!   newest `keep_last`, those younger than `older_than`, those that were
//!   current within `grace` (a reader that just loaded the table may still
//!   pin it), the pinned ones, and outside writers' snapshots a sensor has
//!   not seen;
//! - orphan removal deletes only files no snapshot, manifest or metadata
//!   file of the table references, and only those older than a safety
//!   window (a writer's files before its commit lands are unreferenced);
//! - compaction rewrites a partition's small files into one and commits a
//!   `replace` that keeps every row (checked), or nothing.
//!
//! The decisions ([`plan_expiry`], [`orphans_of`]) are pure and tested here;
//! the I/O around them is in [`expire`], [`remove_orphans`] and [`compact`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;

use futures::StreamExt;
use iceberg::spec::{DataFile, Operation, TableMetadata};
use iceberg::table::Table as IcebergTable;
use iceberg::MetadataLocation;
use serde::Serialize;

use crate::catalog::Lake;
use crate::objstore::{self, Listed};
use crate::rewrite::Change;
use crate::table::{self, Table};
use crate::{scan, LakeError, Result};

/// How often an expiry starts again after losing the swap to another commit.
const CONFLICT_RETRIES: usize = 10;

/// What expiry keeps, besides the current snapshot and those refs name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpireOptions {
    /// The newest this many snapshots, at least 1.
    pub keep_last: usize,
    /// Snapshots made at or after this instant (milliseconds since the epoch).
    pub keep_since_ms: i64,
    /// Snapshots that stopped being current at or after this instant.
    pub current_since_ms: i64,
}

/// A sensor watching the table: an outside writer's snapshot made after
/// `since_ms` that is not in `seen` must stay until the sensor sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watcher {
    pub since_ms: i64,
    pub seen: HashSet<i64>,
}

/// What the control plane says must stay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keep {
    /// Snapshots pinned by runs that may still read them.
    pub pinned: HashSet<i64>,
    pub watchers: Vec<Watcher>,
}

/// Why a snapshot is kept, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kept {
    Current,
    Ref,
    Newest,
    Young,
    RecentlyCurrent,
    Pinned,
    Unseen,
}

/// What expiry knows of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFact {
    pub id: i64,
    pub timestamp_ms: i64,
    /// When it stopped being the current snapshot (`None`: it still is, or
    /// the log does not say).
    pub current_until_ms: Option<i64>,
    /// Made by a writer outside Orca (no `orca.run` in its summary): a
    /// sensor learns of it by polling the table.
    pub outside: bool,
}

/// The facts of `meta`'s snapshots, and those it must keep whatever the
/// options say: the current one and those refs (branches, tags) name.
pub fn facts(meta: &TableMetadata) -> (Vec<SnapshotFact>, Vec<i64>) {
    let log = meta.history();
    let mut current_until: HashMap<i64, i64> = HashMap::new();
    for w in log.windows(2) {
        current_until.insert(w[0].snapshot_id, w[1].timestamp_ms);
    }
    let snaps = meta
        .snapshots()
        .map(|s| SnapshotFact {
            id: s.snapshot_id(),
            timestamp_ms: s.timestamp_ms(),
            current_until_ms: current_until.get(&s.snapshot_id()).copied(),
            outside: !s.summary().additional_properties.contains_key("orca.run"),
        })
        .collect();
    let mut always: Vec<i64> = meta.current_snapshot_id().into_iter().collect();
    always.extend(ref_snapshots(meta));
    (snaps, always)
}

/// The snapshots to expire, and why each other one stays.
pub fn plan_expiry(
    snaps: &[SnapshotFact],
    always: &[i64],
    opts: &ExpireOptions,
    keep: &Keep,
) -> (Vec<i64>, BTreeMap<i64, Kept>) {
    let mut kept: BTreeMap<i64, Kept> = BTreeMap::new();
    for (i, id) in always.iter().enumerate() {
        kept.entry(*id)
            .or_insert(if i == 0 { Kept::Current } else { Kept::Ref });
    }
    let mut by_age: Vec<(i64, i64)> = snaps.iter().map(|s| (s.timestamp_ms, s.id)).collect();
    by_age.sort_unstable_by(|a, b| b.cmp(a));
    for (_, id) in by_age.iter().take(opts.keep_last.max(1)) {
        kept.entry(*id).or_insert(Kept::Newest);
    }
    let mut expire = Vec::new();
    for s in snaps {
        if kept.contains_key(&s.id) {
            continue;
        }
        let why = if s.timestamp_ms >= opts.keep_since_ms {
            Some(Kept::Young)
        } else if s
            .current_until_ms
            .is_some_and(|until| until >= opts.current_since_ms)
        {
            Some(Kept::RecentlyCurrent)
        } else if keep.pinned.contains(&s.id) {
            Some(Kept::Pinned)
        } else if s.outside
            && keep
                .watchers
                .iter()
                .any(|w| s.timestamp_ms > w.since_ms && !w.seen.contains(&s.id))
        {
            Some(Kept::Unseen)
        } else {
            None
        };
        match why {
            Some(k) => {
                kept.insert(s.id, k);
            }
            None => expire.push(s.id),
        }
    }
    expire.sort_unstable();
    (expire, kept)
}

/// The snapshots the table's refs (branches and tags) name. iceberg-rust
/// keeps refs private, so they are read from the metadata as written.
fn ref_snapshots(meta: &TableMetadata) -> Vec<i64> {
    serde_json::to_value(meta)
        .ok()
        .and_then(|v| v.get("refs").cloned())
        .and_then(|r| r.as_object().cloned())
        .map(|refs| {
            refs.values()
                .filter_map(|r| r.get("snapshot-id").and_then(serde_json::Value::as_i64))
                .collect()
        })
        .unwrap_or_default()
}

/// What an expiry did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Expired {
    pub snapshots: Vec<i64>,
    pub kept: usize,
    /// Snapshots only the control plane's facts kept (pinned, unseen).
    pub protected: Vec<i64>,
    pub files_deleted: u64,
    pub bytes_deleted: u64,
}

/// Expires the snapshots [`plan_expiry`] picks: a metadata file without
/// them is swapped in (compare-and-swap; on a conflict it plans again from
/// the new state), then the files only they reached are deleted. A crash
/// after the swap leaves those files as orphans, which orphan removal
/// deletes later.
pub fn expire(t: &Lake, table: &Table, opts: &ExpireOptions, keep: &Keep) -> Result<Expired> {
    let dataset = table.dataset();
    for _ in 0..CONFLICT_RETRIES {
        let fresh = t.load(&table.ident)?;
        let meta = fresh.metadata();
        let (snaps, always) = facts(meta);
        let (ids, kept) = plan_expiry(&snaps, &always, opts, keep);
        let protected = kept
            .iter()
            .filter(|(_, k)| matches!(k, Kept::Pinned | Kept::Unseen))
            .map(|(id, _)| *id)
            .collect();
        if ids.is_empty() {
            return Ok(Expired {
                kept: kept.len(),
                protected,
                ..Expired::default()
            });
        }
        let old = fresh
            .metadata_location_result()
            .map_err(LakeError::iceberg(format!("table {dataset}")))?
            .to_string();
        let next = MetadataLocation::from_str(&old)
            .map_err(LakeError::iceberg(format!("table {dataset}")))?
            .with_next_version();
        let without = meta
            .clone()
            .into_builder(Some(old))
            .remove_snapshots(&ids)
            .build()
            .map_err(LakeError::iceberg(format!(
                "expiring snapshots of {dataset}"
            )))?
            .metadata;
        t.rt.block_on(without.write_to(fresh.file_io(), &next))
            .map_err(LakeError::iceberg(format!(
                "writing the metadata of {dataset}"
            )))?;
        if !t.rt.block_on(t.swap(&table.ident, &fresh, &next))? {
            continue;
        }
        let expired: HashSet<i64> = ids.iter().copied().collect();
        let (gone, bytes) = t.rt.block_on(delete_unreachable(&fresh, &expired))?;
        return Ok(Expired {
            snapshots: ids,
            kept: kept.len(),
            protected,
            files_deleted: gone,
            bytes_deleted: bytes,
        });
    }
    Err(LakeError::Table(format!(
        "expiring snapshots of {dataset}: {CONFLICT_RETRIES} concurrent commits won the race; giving up"
    )))
}

/// The files each snapshot reaches: its manifest list, its manifests and
/// the files their live entries name (with their sizes).
#[derive(Default)]
struct Reach {
    lists: HashMap<i64, String>,
    manifests: HashMap<i64, Vec<String>>,
    entries: HashMap<String, Vec<(String, u64)>>,
    sizes: HashMap<String, u64>,
}

async fn reach(table: &IcebergTable, snapshots: &[i64]) -> Result<Reach> {
    let meta = table.metadata();
    let mut r = Reach::default();
    for id in snapshots {
        let Some(s) = meta.snapshot_by_id(*id) else {
            continue;
        };
        r.lists.insert(*id, s.manifest_list().to_string());
        let list = table
            .manifest_list_reader(s)
            .load()
            .await
            .map_err(LakeError::iceberg(format!(
                "reading the manifest list of snapshot {id}"
            )))?;
        let mut paths = Vec::new();
        for mf in list.entries() {
            paths.push(mf.manifest_path.clone());
            if r.entries.contains_key(&mf.manifest_path) {
                continue;
            }
            r.sizes.insert(
                mf.manifest_path.clone(),
                u64::try_from(mf.manifest_length).unwrap_or(0),
            );
            let m = mf
                .load_manifest(table.file_io())
                .await
                .map_err(LakeError::iceberg(format!(
                    "reading manifest {}",
                    mf.manifest_path
                )))?;
            let files = m
                .entries()
                .iter()
                .filter(|e| e.is_alive())
                .map(|e| {
                    (
                        e.file_path().to_string(),
                        e.data_file().file_size_in_bytes(),
                    )
                })
                .collect();
            r.entries.insert(mf.manifest_path.clone(), files);
        }
        r.manifests.insert(*id, paths);
    }
    Ok(r)
}

/// Deletes what only the expired snapshots of `before` (the metadata as it
/// was) reached; returns how many files and bytes.
async fn delete_unreachable(before: &IcebergTable, expired: &HashSet<i64>) -> Result<(u64, u64)> {
    let all: Vec<i64> = before
        .metadata()
        .snapshots()
        .map(|s| s.snapshot_id())
        .collect();
    let r = reach(before, &all).await?;
    // What each snapshot reaches, as (path, size).
    let reached = |id: &i64| -> Vec<(&str, u64)> {
        let mut out: Vec<(&str, u64)> = Vec::new();
        if let Some(l) = r.lists.get(id) {
            out.push((l.as_str(), 0));
        }
        for m in r.manifests.get(id).into_iter().flatten() {
            out.push((m.as_str(), r.sizes.get(m).copied().unwrap_or(0)));
            for (f, size) in r.entries.get(m).into_iter().flatten() {
                out.push((f.as_str(), *size));
            }
        }
        out
    };
    let live: HashSet<&str> = all
        .iter()
        .filter(|id| !expired.contains(id))
        .flat_map(|id| reached(id).into_iter().map(|(p, _)| p))
        .collect();
    let mut done: HashSet<&str> = HashSet::new();
    let (mut files, mut bytes) = (0u64, 0u64);
    let location = before.metadata().location();
    for (path, size) in expired.iter().flat_map(reached) {
        // A file the metadata names outside the table's own location (a
        // table another client made that way) is not ours to delete.
        if live.contains(path) || !done.insert(path) || !within(path, location) {
            continue;
        }
        before
            .file_io()
            .delete(path)
            .await
            .map_err(LakeError::iceberg(format!("deleting {path}")))?;
        files += 1;
        bytes += size;
    }
    Ok((files, bytes))
}

/// A path as the same file whichever way it was written: `file:///a`,
/// `file:/a` and `/a` are one file.
fn canonical(path: &str) -> &str {
    path.strip_prefix("file://")
        .or_else(|| path.strip_prefix("file:"))
        .unwrap_or(path)
}

/// Whether `path` lies under the directory (or prefix) `dir`.
pub fn within(path: &str, dir: &str) -> bool {
    let (p, d) = (canonical(path), canonical(dir).trim_end_matches('/'));
    p.strip_prefix(d).is_some_and(|rest| rest.starts_with('/'))
        && !p.split('/').any(|part| part == "..")
}

/// Refuses a table that is not the org's to maintain: its location and its
/// metadata file must lie under `root` (the org's part of the warehouse),
/// or maintenance could delete another org's files or the host's.
pub fn check_place(table: &Table, root: &str) -> Result<()> {
    check_within(table, root, "maintenance touches only the org's own tables")
}

/// Refuses a table whose location or metadata file is not under `root`
/// (the org's part of the warehouse), saying `why` it must be.
pub fn check_within(table: &Table, root: &str, why: &str) -> Result<()> {
    let location = table.location();
    let metadata = table.inner.metadata_location().unwrap_or_default();
    for (what, path) in [("location", location), ("metadata file", metadata)] {
        if !within(path, root) {
            return Err(LakeError::Table(format!(
                "table {}'s {what} {path} is not under its org's warehouse {root}: {why}",
                table.dataset()
            )));
        }
    }
    Ok(())
}

/// Every file the table's metadata references: the metadata files of its
/// log and the current one, statistics files, and everything each snapshot
/// reaches (every entry of its manifests, live or not).
pub async fn referenced(table: &IcebergTable) -> Result<HashSet<String>> {
    let meta = table.metadata();
    let mut out: HashSet<String> = HashSet::new();
    if let Some(l) = table.metadata_location() {
        out.insert(canonical(l).to_string());
    }
    for m in meta.metadata_log() {
        out.insert(canonical(&m.metadata_file).to_string());
    }
    for s in meta.statistics_iter() {
        out.insert(canonical(&s.statistics_path).to_string());
    }
    for s in meta.partition_statistics_iter() {
        out.insert(canonical(&s.statistics_path).to_string());
    }
    let mut manifests_done: HashSet<String> = HashSet::new();
    for s in meta.snapshots() {
        out.insert(canonical(s.manifest_list()).to_string());
        let list = table
            .manifest_list_reader(s)
            .load()
            .await
            .map_err(LakeError::iceberg(format!(
                "reading the manifest list of snapshot {}",
                s.snapshot_id()
            )))?;
        for mf in list.entries() {
            out.insert(canonical(&mf.manifest_path).to_string());
            if !manifests_done.insert(mf.manifest_path.clone()) {
                continue;
            }
            let m = mf
                .load_manifest(table.file_io())
                .await
                .map_err(LakeError::iceberg(format!(
                    "reading manifest {}",
                    mf.manifest_path
                )))?;
            for e in m.entries() {
                out.insert(canonical(e.file_path()).to_string());
            }
        }
    }
    Ok(out)
}

/// The listed files that are orphans: referenced by nothing, and last
/// written before `older_than_ms`.
pub fn orphans_of<'l>(
    listed: &'l [Listed],
    referenced: &HashSet<String>,
    older_than_ms: i64,
) -> Vec<&'l Listed> {
    listed
        .iter()
        .filter(|f| !referenced.contains(canonical(&f.path)) && f.modified_ms < older_than_ms)
        .collect()
}

/// What an orphan removal did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Orphans {
    pub files: Vec<String>,
    pub bytes: u64,
    /// Unreferenced files left because they are younger than the window.
    pub young: usize,
    /// Files the table's location holds in all.
    pub listed: usize,
}

/// Deletes the table's orphan files: those under its location that no
/// metadata references, written before `older_than_ms`. The references are
/// read after the listing, so a file a commit took up in between is
/// referenced.
pub fn remove_orphans(t: &Lake, table: &Table, older_than_ms: i64) -> Result<Orphans> {
    let dataset = table.dataset();
    let location = table.location().to_string();
    let props = table.inner.file_io().config().props().clone();
    let listed = t.rt.block_on(objstore::list(&location, &props))?;
    let fresh = t.load(&table.ident)?;
    let refs = t.rt.block_on(referenced(&fresh))?;
    let doomed: Vec<&Listed> = orphans_of(&listed, &refs, older_than_ms)
        .into_iter()
        .filter(|f| within(&f.path, &location))
        .collect();
    let young = listed
        .iter()
        .filter(|f| !refs.contains(canonical(&f.path)) && f.modified_ms >= older_than_ms)
        .count();
    let mut out = Orphans {
        young,
        listed: listed.len(),
        ..Orphans::default()
    };
    for f in doomed {
        t.rt.block_on(fresh.file_io().delete(&f.path))
            .map_err(LakeError::iceberg(format!(
                "deleting orphan {} of {dataset}",
                f.path
            )))?;
        out.bytes += f.size;
        out.files.push(f.path.clone());
    }
    Ok(out)
}

/// Which files compaction takes: a partition's files smaller than
/// `small_bytes`, when it has at least `min_files` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactOptions {
    pub small_bytes: u64,
    pub min_files: usize,
}

/// What a compaction did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Compacted {
    /// The replace snapshot, when there was something to compact.
    pub snapshot: Option<i64>,
    /// The snapshot it read.
    pub read: Option<i64>,
    pub partitions: usize,
    pub files_removed: usize,
    pub files_added: usize,
    pub rows: u64,
}

/// The groups of small files to rewrite, per partition value.
pub fn small_files(files: &[DataFile], opts: &CompactOptions) -> Vec<Vec<DataFile>> {
    let mut groups: BTreeMap<String, Vec<DataFile>> = BTreeMap::new();
    for f in files {
        if f.file_size_in_bytes() >= opts.small_bytes {
            continue;
        }
        groups
            .entry(format!("{:?}", f.partition()))
            .or_default()
            .push(f.clone());
    }
    groups
        .into_values()
        .filter(|g| g.len() >= opts.min_files.max(2))
        .collect()
}

/// Rewrites each partition's small files into one and commits them as one
/// `replace` with these summary properties, unless a snapshot already
/// carries `props` (a retry of a compaction that committed): then that one.
pub fn compact(
    t: &Lake,
    table: &Table,
    opts: &CompactOptions,
    props: HashMap<String, String>,
    prefix: String,
) -> Result<Compacted> {
    let dataset = table.dataset();
    let fresh = t.load(&table.ident)?;
    let mine: Vec<(&str, &str)> = props
        .iter()
        .filter(|(k, _)| k.as_str() == "orca.run" || k.as_str() == "orca.maintenance")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if mine.len() == 2 {
        if let Some(id) = table::find_commit(&fresh, &mine) {
            return Ok(Compacted {
                snapshot: Some(id),
                ..Compacted::default()
            });
        }
    }
    let Some(current) = fresh.metadata().current_snapshot().cloned() else {
        return Ok(Compacted::default());
    };
    let live = table::live_data_files(t, &fresh, &current)?;
    let groups = small_files(&live, opts);
    let mut out = Compacted {
        read: Some(current.snapshot_id()),
        ..Compacted::default()
    };
    if groups.is_empty() {
        return Ok(out);
    }
    let planned = t.rt.block_on(scan::plan(
        &fresh,
        dataset,
        current.snapshot_id(),
        &scan::ScanRequest::default(),
    ))?;
    let mut tasks: HashMap<String, iceberg::scan::FileScanTask> = planned
        .tasks
        .into_iter()
        .map(|task| (task.data_file_path.clone(), task))
        .collect();
    let handle = Table::new(dataset, table.ident.clone(), fresh.clone());
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    for group in groups {
        let group_tasks: Vec<_> = group
            .iter()
            .filter_map(|f| tasks.remove(f.file_path()))
            .collect();
        if group_tasks.len() != group.len() {
            return Err(LakeError::Table(format!(
                "compacting {dataset}: the scan of snapshot {} does not plan every file it lists",
                current.snapshot_id()
            )));
        }
        let mut stream = scan::read(&fresh, dataset, group_tasks, None, 1)?;
        let batches = std::iter::from_fn(|| {
            t.rt.block_on(stream.next())
                .map(|r| r.map_err(LakeError::iceberg(format!("reading {dataset}"))))
        });
        let files = crate::writer::write_data_files(t, &handle, batches, prefix.clone())?;
        out.partitions += 1;
        out.files_removed += group.len();
        out.files_added += files.len();
        out.rows += files.iter().map(DataFile::record_count).sum::<u64>();
        added.extend(files);
        removed.extend(group);
    }
    table::check(dataset, &Operation::Replace, &added, &removed)?;
    let change = Change {
        added,
        removed,
        op: Operation::Replace,
        props,
        table_props: HashMap::new(),
    };
    let id = table::commit_change(t, &table.ident, dataset, fresh, &change, |_| None::<()>)?
        .map_err(|()| LakeError::Table(format!("compacting {dataset}: stopped")))?;
    out.snapshot = Some(id);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(id: i64, at: i64, until: Option<i64>, outside: bool) -> SnapshotFact {
        SnapshotFact {
            id,
            timestamp_ms: at,
            current_until_ms: until,
            outside,
        }
    }

    /// Six snapshots a minute apart, each current until the next; 6 is current.
    fn history() -> Vec<SnapshotFact> {
        (1..=6)
            .map(|i| snap(i, i * 60_000, (i < 6).then_some((i + 1) * 60_000), false))
            .collect()
    }

    fn opts(keep_last: usize, keep_since_ms: i64, current_since_ms: i64) -> ExpireOptions {
        ExpireOptions {
            keep_last,
            keep_since_ms,
            current_since_ms,
        }
    }

    #[test]
    fn expiry_keeps_the_current_the_newest_and_the_young() {
        let (expire, kept) = plan_expiry(&history(), &[6], &opts(2, 0, 0), &Keep::default());
        // Everything is young (made at or after 0).
        assert!(expire.is_empty());
        assert_eq!(kept.len(), 6);
        let (expire, kept) = plan_expiry(
            &history(),
            &[6],
            &opts(2, i64::MAX, i64::MAX),
            &Keep::default(),
        );
        assert_eq!(expire, [1, 2, 3, 4]);
        assert_eq!(kept.get(&6), Some(&Kept::Current));
        assert_eq!(kept.get(&5), Some(&Kept::Newest));
        // Made at or after 4 minutes: 4, 5 and 6 stay.
        let (expire, kept) = plan_expiry(
            &history(),
            &[6],
            &opts(1, 4 * 60_000, i64::MAX),
            &Keep::default(),
        );
        assert_eq!(expire, [1, 2, 3]);
        assert_eq!(kept.get(&4), Some(&Kept::Young));
    }

    #[test]
    fn expiry_keeps_what_was_current_within_the_grace() {
        // 3 stopped being current at minute 4, 4 at minute 5.
        let (expire, kept) = plan_expiry(
            &history(),
            &[6],
            &opts(1, i64::MAX, 4 * 60_000),
            &Keep::default(),
        );
        assert_eq!(expire, [1, 2]);
        assert_eq!(kept.get(&3), Some(&Kept::RecentlyCurrent));
    }

    #[test]
    fn expiry_never_removes_a_pinned_snapshot_nor_one_a_sensor_has_not_seen() {
        let mut snaps = history();
        // 2 and 3 came from a writer outside Orca.
        snaps[1].outside = true;
        snaps[2].outside = true;
        let keep = Keep {
            pinned: HashSet::from([1]),
            watchers: vec![Watcher {
                since_ms: 90_000,
                seen: HashSet::from([2]),
            }],
        };
        let (expire, kept) = plan_expiry(&snaps, &[6], &opts(1, i64::MAX, i64::MAX), &keep);
        assert_eq!(expire, [2, 4, 5]);
        assert_eq!(kept.get(&1), Some(&Kept::Pinned));
        assert_eq!(kept.get(&3), Some(&Kept::Unseen));
        // A sensor registered after a snapshot was made never waits for it.
        let late = Keep {
            pinned: HashSet::new(),
            watchers: vec![Watcher {
                since_ms: 10 * 60_000,
                seen: HashSet::new(),
            }],
        };
        let (expire, _) = plan_expiry(&snaps, &[6], &opts(1, i64::MAX, i64::MAX), &late);
        assert_eq!(expire, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_ref_keeps_its_snapshot() {
        let (expire, kept) = plan_expiry(
            &history(),
            &[6, 2],
            &opts(1, i64::MAX, i64::MAX),
            &Keep::default(),
        );
        assert_eq!(expire, [1, 3, 4, 5]);
        assert_eq!(kept.get(&2), Some(&Kept::Ref));
    }

    fn listed(path: &str, modified_ms: i64) -> Listed {
        Listed {
            path: path.to_string(),
            size: 10,
            modified_ms,
        }
    }

    #[test]
    fn orphans_are_unreferenced_and_old_enough() {
        let files = [
            listed("file:///w/o/t/data/a.parquet", 100),
            listed("file:///w/o/t/data/b.parquet", 100),
            listed("file:///w/o/t/data/c.parquet", 900),
            listed("file:///w/o/t/metadata/00001.metadata.json", 100),
        ];
        let refs: HashSet<String> = [
            "/w/o/t/data/a.parquet",
            "/w/o/t/metadata/00001.metadata.json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let orphans: Vec<&str> = orphans_of(&files, &refs, 500)
            .iter()
            .map(|f| f.path.as_str())
            .collect();
        // c is unreferenced too, but younger than the window.
        assert_eq!(orphans, ["file:///w/o/t/data/b.parquet"]);
    }

    #[test]
    fn paths_are_within_a_directory_only_below_it() {
        assert!(within(
            "file:///w/org/lake/raw/data/x.parquet",
            "file:///w/org/lake/raw"
        ));
        assert!(within("/w/org/lake/raw/data/x", "file:///w/org/lake/raw/"));
        assert!(within("s3://b/w/org/t/data/x", "s3://b/w/org"));
        assert!(!within(
            "file:///w/org/lake/raw2/x",
            "file:///w/org/lake/raw"
        ));
        assert!(!within("file:///w/other/lake/raw/x", "file:///w/org"));
        assert!(!within("file:///w/org/../other/x", "file:///w/org"));
        assert!(!within("s3://c/w/org/x", "s3://b/w/org"));
    }

    fn data_file(path: &str, size: u64, month: &str) -> DataFile {
        iceberg::spec::DataFileBuilder::default()
            .content(iceberg::spec::DataContentType::Data)
            .file_path(path.to_string())
            .file_format(iceberg::spec::DataFileFormat::Parquet)
            .partition(iceberg::spec::Struct::from_iter([Some(
                iceberg::spec::Literal::string(month),
            )]))
            .record_count(1)
            .file_size_in_bytes(size)
            .build()
            .expect("data file")
    }

    #[test]
    fn compaction_takes_partitions_with_enough_small_files() {
        let files = [
            data_file("a", 10, "2013-01"),
            data_file("b", 10, "2013-01"),
            data_file("c", 10, "2013-01"),
            data_file("d", 10_000, "2013-01"),
            data_file("e", 10, "2013-02"),
            data_file("f", 10, "2013-02"),
        ];
        let groups = small_files(
            &files,
            &CompactOptions {
                small_bytes: 100,
                min_files: 3,
            },
        );
        let paths: Vec<Vec<&str>> = groups
            .iter()
            .map(|g| g.iter().map(DataFile::file_path).collect())
            .collect();
        // d is big enough; 2013-02 has two small files, fewer than three.
        assert_eq!(paths, [vec!["a", "b", "c"]]);
    }
}
