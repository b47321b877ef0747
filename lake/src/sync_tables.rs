//! Iceberg tables as a sync's destination (for `orca-engine`).
//!
//! Lane 0 commits epoch N of a stream as one snapshot whose summary carries
//! the stream marker: `orca.sync` (the sync), `orca.sync.stream`,
//! `orca.sync.epoch` = N and `orca.sync.generation`. The marker makes the
//! commit idempotent (an epoch at or below the table's marker is applied
//! already; the same commit also sets table property `orca.sync.<sync>.epoch`,
//! so the marker outlives snapshot expiry), and the fence, table property `orca.sync.<sync>.fence`, which
//! each attempt raises to its generation before it recovers, refuses a
//! commit from an older attempt. A `merge` stream's epoch is merged
//! copy-on-write: the files holding replaced rows are rewritten and the
//! snapshot is an `overwrite` (through [`crate::table::commit_change`]).

use std::collections::HashMap;

use arrow_array::{Array, RecordBatch};
use arrow_schema::Schema as ArrowSchema;
use iceberg::Catalog;

use crate::catalog::{ident, Lake, LakeConfig};
use crate::spec::{PartitionField, TableSpec};
use crate::table::{self, Table};
use crate::{LakeError, Result};

/// What a commit of an epoch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EpochCommit {
    /// A new snapshot.
    Committed { snapshot: i64 },
    /// The table's marker shows the epoch applied already.
    AlreadyApplied,
    /// A newer attempt raised the fence; nothing was written.
    Fenced { fence: i32 },
}

/// How many times an epoch is worked out again when another commit
/// replaced a file it rewrites.
const MERGE_TRIES: usize = 5;

/// The catalog, opened for a sync.
pub struct SyncTables {
    t: Lake,
}

fn fence_key(sync: &str) -> String {
    format!("orca.sync.{sync}.fence")
}

/// The table property that keeps the last epoch of a sync, written in the
/// same commit as the epoch's snapshot: it outlives snapshot expiry.
fn epoch_key(sync: &str) -> String {
    format!("orca.sync.{sync}.epoch")
}

impl SyncTables {
    /// The catalog in `ORCA_CATALOG_URL` (else `database_url`), the
    /// warehouse `ORCA_WAREHOUSE`, the org's catalog.
    pub fn open(database_url: &str, org: &str) -> Result<SyncTables> {
        let mut config = LakeConfig::from_env(Some(database_url));
        config.org = org.to_string();
        SyncTables::with_config(&config)
    }

    /// The catalog and warehouse `config` names.
    pub fn with_config(config: &LakeConfig) -> Result<SyncTables> {
        Ok(SyncTables {
            t: Lake::open(config)?,
        })
    }

    /// The generation that fences `sync`'s writes to the table, and the last
    /// epoch of it the table holds (0, 0 for a table that does not exist).
    pub fn fence_and_marker(&self, dataset: &str, sync: &str) -> Result<(i32, u64)> {
        if !self.exists(dataset)? {
            return Ok((0, 0));
        }
        let table = self.load(dataset)?;
        Ok((fence_of(&table.inner, sync), marker_of(&table.inner, sync)))
    }

    /// Creates the table (and its namespace) with this schema unless it
    /// exists; an existing table must have these columns.
    /// Creates the table with this spec (its columns and partitioning)
    /// unless it exists: an existing table keeps the partitioning it has.
    pub fn ensure(&self, dataset: &str, spec: impl Into<TableSpec>) -> Result<()> {
        table::create_or_load(&self.t, dataset, spec).map(|_| ())
    }

    fn load(&self, dataset: &str) -> Result<Table> {
        let id = ident(dataset)?;
        let inner =
            self.t
                .rt
                .block_on(self.t.catalog.load_table(&id))
                .map_err(LakeError::iceberg(format!(
                    "table {dataset} cannot be loaded"
                )))?;
        Ok(Table::new(dataset, id, inner))
    }

    fn exists(&self, dataset: &str) -> Result<bool> {
        let id = ident(dataset)?;
        Ok(self
            .t
            .rt
            .block_on(self.t.catalog.table_exists(&id))
            .map_err(|e| format!("table {dataset}: {e}"))?)
    }

    /// The table's partitioning as [`Table::partitioning`] says it
    /// (`day(at), bucket[16](id)`, `unpartitioned`); None when there is
    /// no table yet.
    pub fn partitioning(&self, dataset: &str) -> Result<Option<String>> {
        if !self.exists(dataset)? {
            return Ok(None);
        }
        Ok(Some(self.load(dataset)?.partitioning()))
    }

    /// The last epoch of `sync` the table holds (0: none, or no table yet:
    /// a stream whose columns are inferred makes it at its first epoch).
    pub fn marker(&self, dataset: &str, sync: &str) -> Result<u64> {
        if !self.exists(dataset)? {
            return Ok(0);
        }
        Ok(marker_of(&self.load(dataset)?.inner, sync))
    }

    /// Raises the table's fence for `sync` to `generation`; `Fenced` when a
    /// newer generation raised it already.
    pub fn raise_fence(&self, dataset: &str, sync: &str, generation: i32) -> Result<EpochCommit> {
        // A table not made yet holds no epoch to protect; the attempt that
        // makes it commits only after moving HEAD, which fences zombies.
        if !self.exists(dataset)? {
            return Ok(EpochCommit::AlreadyApplied);
        }
        let table = self.load(dataset)?;
        // Looked at again on every try, against the state the swap
        // replaces: a newer attempt's fence is never lowered.
        let done = table::set_properties_if(
            &self.t,
            &table.ident,
            dataset,
            table.inner.clone(),
            &HashMap::from([(fence_key(sync), generation.to_string())]),
            |now| match fence_of(now, sync) {
                fence if fence > generation => Some(EpochCommit::Fenced { fence }),
                fence if fence == generation => Some(EpochCommit::AlreadyApplied),
                _ => None,
            },
        )?;
        Ok(done.err().unwrap_or(EpochCommit::Committed { snapshot: 0 }))
    }

    /// Commits a stream's epoch as one snapshot with its marker, unless the
    /// table holds it already or the fence is newer than the generation,
    /// written as [`Write`] says.
    ///
    /// A merge whose commit finds a file it rewrote replaced by another
    /// commit (table maintenance compacting it) is worked out again from
    /// the table as it is now: its files written so far are orphans that
    /// maintenance removes later.
    pub fn apply_epoch(
        &self,
        at: &EpochAt<'_>,
        batches: Vec<RecordBatch>,
        write: Write<'_>,
    ) -> Result<EpochCommit> {
        let mut tries = 0;
        loop {
            match self.apply_once(at, batches.clone(), write) {
                Err(LakeError::Conflict(_)) if tries + 1 < MERGE_TRIES => tries += 1,
                done => return done,
            }
        }
    }

    fn apply_once(
        &self,
        at: &EpochAt<'_>,
        batches: Vec<RecordBatch>,
        write: Write<'_>,
    ) -> Result<EpochCommit> {
        let dataset = at.dataset;
        let table = self.load(dataset)?;
        if let Some(done) = settled(&table, at) {
            return Ok(done);
        }
        let schema = table.arrow_schema()?;
        let batches = batches
            .into_iter()
            .map(|b| fit(&schema, dataset, b))
            .collect::<Result<Vec<_>>>()?;
        let (groups, removed, scan) = match write {
            Write::Append => (vec![batches], Vec::new(), None),
            Write::AppendNew => (
                vec![self.unknown(&table, dataset, batches)?],
                Vec::new(),
                None,
            ),
            Write::Merge(key) => {
                let m = self.merged(&table, dataset, &schema, batches, key)?;
                (m.groups, m.removed, Some(m.scan))
            }
        };
        let mut files = Vec::new();
        for group in groups {
            if group.iter().any(|b| b.num_rows() > 0) {
                files.extend(self.write(&table, at, group)?);
            }
        }
        let extra = scan.map(|s| {
            vec![
                ("orca.merge.files-read".to_string(), s.read.to_string()),
                (
                    "orca.merge.files-skipped".to_string(),
                    s.skipped.to_string(),
                ),
            ]
        });
        self.commit_epoch(&table, at, files, removed, extra.unwrap_or_default())
    }

    /// Makes the table take a stream's columns and returns its schema: the
    /// table is created with them if it does not exist, and columns the
    /// stream gained are added to it (optional, with new field ids) in a
    /// schema change swapped in like any commit. Existing columns keep their
    /// type: a value that does not fit one is the caller's to hold. A table
    /// made here is partitioned by `partition_by`.
    pub fn fit_columns(
        &self,
        dataset: &str,
        want: &ArrowSchema,
        partition_by: &[PartitionField],
    ) -> Result<std::sync::Arc<ArrowSchema>> {
        if !self.exists(dataset)? {
            let spec = TableSpec::new(want.clone()).partitioned(partition_by);
            return table::create_or_load(&self.t, dataset, spec)?.arrow_schema();
        }
        for _ in 0..10 {
            let table = self.load(dataset)?;
            let have = table.arrow_schema()?;
            let new: Vec<&arrow_schema::FieldRef> = want
                .fields()
                .iter()
                .filter(|f| have.field_with_name(f.name()).is_err())
                .collect();
            if new.is_empty() {
                return Ok(have);
            }
            let meta = table.inner.metadata();
            let mut next_id = meta.last_column_id();
            let mut fields: Vec<iceberg::spec::NestedFieldRef> =
                meta.current_schema().as_struct().fields().to_vec();
            for f in new {
                next_id += 1;
                let ty = iceberg::arrow::arrow_type_to_type(f.data_type())
                    .map_err(|e| format!("column {} of {dataset}: {e}", f.name()))?;
                fields.push(std::sync::Arc::new(iceberg::spec::NestedField::optional(
                    next_id,
                    f.name(),
                    ty,
                )));
            }
            let schema = iceberg::spec::Schema::builder()
                .with_fields(fields)
                .build()
                .map_err(|e| format!("the new schema of {dataset}: {e}"))?;
            let old = table
                .inner
                .metadata_location_result()
                .map_err(|e| format!("table {dataset}: {e}"))?;
            let next = <iceberg::MetadataLocation as std::str::FromStr>::from_str(old)
                .map_err(|e| format!("table {dataset}: {e}"))?
                .with_next_version();
            let metadata = meta
                .clone()
                .into_builder(Some(old.to_string()))
                .add_current_schema(schema)
                .and_then(|b| b.build())
                .map_err(|e| format!("the new schema of {dataset}: {e}"))?
                .metadata;
            let io = table.inner.file_io();
            self.t
                .rt
                .block_on(metadata.write_to(io, &next))
                .map_err(LakeError::iceberg(format!(
                    "writing the new schema of {dataset}"
                )))?;
            // Lost the swap to another commit: look again at what it left.
            self.t
                .rt
                .block_on(self.t.swap(&table.ident, &table.inner, &next))?;
        }
        Err(
            format!("table {dataset}: 10 concurrent commits won the race to change its schema")
                .into(),
        )
    }

    /// Moves the table's marker to the epoch without a snapshot (an epoch
    /// of a refresh, whose rows wait in the sync's store).
    pub fn mark_epoch(&self, at: &EpochAt<'_>) -> Result<EpochCommit> {
        let table = self.load(at.dataset)?;
        let done = table::set_properties_if(
            &self.t,
            &table.ident,
            at.dataset,
            table.inner.clone(),
            &HashMap::from([(epoch_key(at.sync), at.epoch.to_string())]),
            |now| settled_inner(now, at),
        )?;
        Ok(done.err().unwrap_or(EpochCommit::Committed { snapshot: 0 }))
    }

    /// Replaces every data file of the table with the rows of `parts` (a
    /// refresh's last epoch), as one snapshot with the epoch's marker.
    pub fn replace_epoch<I>(&self, at: &EpochAt<'_>, parts: I) -> Result<EpochCommit>
    where
        I: IntoIterator<Item = Result<Vec<RecordBatch>>>,
    {
        let table = self.load(at.dataset)?;
        if let Some(done) = settled(&table, at) {
            return Ok(done);
        }
        let schema = table.arrow_schema()?;
        let mut files = Vec::new();
        // One part at a time: the refresh never has to fit in memory.
        for part in parts {
            let part = part?
                .into_iter()
                .map(|b| fit(&schema, at.dataset, b))
                .collect::<Result<Vec<_>>>()?;
            if !part.is_empty() {
                files.extend(self.write(&table, at, part)?);
            }
        }
        let removed = self.live_files(&table)?;
        if files.is_empty() && removed.is_empty() {
            return self.mark_epoch(at);
        }
        self.commit_epoch(&table, at, files, removed, Vec::new())
    }

    /// The rows whose `_orca_id` the table does not hold.
    fn unknown(
        &self,
        table: &Table,
        dataset: &str,
        batches: Vec<RecordBatch>,
    ) -> Result<Vec<RecordBatch>> {
        let mut known = std::collections::HashSet::new();
        for file in self.live_files(table)? {
            for b in self.read_columns(table, &file, dataset, &["_orca_id"])? {
                let ids = orca_ids(&b, dataset)?;
                known.extend(
                    (0..ids.len())
                        .filter_map(|i| id_at(ids, i))
                        .map(<[u8]>::to_vec),
                );
            }
        }
        let mut out = Vec::with_capacity(batches.len());
        for b in batches {
            let ids = orca_ids(&b, dataset)?;
            let keep: arrow_array::BooleanArray = (0..ids.len())
                .map(|i| Some(!id_at(ids, i).is_some_and(|id| known.contains(id))))
                .collect();
            out.push(
                arrow_select::filter::filter_record_batch(&b, &keep)
                    .map_err(|e| format!("appending to {dataset}: {e}"))?,
            );
        }
        out.retain(|b| b.num_rows() > 0);
        Ok(out)
    }

    /// Some columns of a data file, as stored.
    fn read_columns(
        &self,
        table: &Table,
        file: &iceberg::spec::DataFile,
        dataset: &str,
        columns: &[&str],
    ) -> Result<Vec<RecordBatch>> {
        let what =
            |e: &dyn std::fmt::Display| format!("reading {} of {dataset}: {e}", file.file_path());
        // By ranges: only the wanted columns' chunks are fetched.
        let builder = crate::ranged::open_data_file(
            &self.t.rt,
            table.inner.file_io(),
            file.file_path(),
            file.file_size_in_bytes(),
        )
        .map_err(|e| what(&e))?;
        let mask = parquet::arrow::ProjectionMask::columns(
            builder.parquet_schema(),
            columns.iter().copied(),
        );
        let reader = builder
            .with_projection(mask)
            .build()
            .map_err(|e| what(&e))?;
        reader.map(|b| b.map_err(|e| what(&e).into())).collect()
    }

    /// What a merge writes (the epoch's surviving rows, and the rows kept
    /// of the files it rewrites) and the files it removes.
    fn merged(
        &self,
        table: &Table,
        dataset: &str,
        schema: &std::sync::Arc<ArrowSchema>,
        batches: Vec<RecordBatch>,
        key: &[String],
    ) -> Result<Merged> {
        let incoming = arrow_select::concat::concat_batches(schema, &batches)
            .map_err(|e| format!("merging into {dataset}: {e}"))?;
        // The newest version of each key in the epoch: (row, seq).
        let keys_in = key_strings(&incoming, key, dataset)?;
        let seq_in = seqs(&incoming, dataset)?;
        let mut newest: HashMap<String, (usize, i64)> = HashMap::new();
        for (row, k) in keys_in.into_iter().enumerate() {
            let seq = seq_in.value(row);
            match newest.get(&k) {
                Some((_, s)) if *s >= seq => {}
                _ => {
                    newest.insert(k, (row, seq));
                }
            }
        }
        let mut removed = Vec::new();
        let mut groups = Vec::new();
        let mut scan = MergeScan::default();
        let probe = KeyProbe::new(table, &incoming, key);
        // The key and _orca_seq columns of every file that may hold one of
        // the epoch's keys first; only a file holding a replaced row is read
        // whole and written again.
        let mut wanted: Vec<&str> = key.iter().map(String::as_str).collect();
        wanted.push("_orca_seq");
        for file in self.live_files(table)? {
            if probe.as_ref().is_some_and(|p| !p.may_hold(&file)) {
                scan.skipped += 1;
                continue;
            }
            scan.read += 1;
            let mut keep = Vec::new();
            for b in self.read_columns(table, &file, dataset, &wanted)? {
                let keys = key_strings(&b, key, dataset)?;
                let seq = seqs(&b, dataset)?;
                for (row, k) in keys.iter().enumerate() {
                    let replaced = match newest.get(k) {
                        // The table holds a newer (or the same) version:
                        // the epoch's is stale.
                        Some((_, s)) if *s <= seq.value(row) => {
                            newest.remove(k);
                            false
                        }
                        Some(_) => true,
                        None => false,
                    };
                    keep.push(!replaced);
                }
            }
            if keep.iter().all(|k| *k) {
                continue;
            }
            let mut at = 0;
            // A rewritten file's rows stay a file of their own, so its key
            // range stays as narrow as it was and later merges can pass it by.
            let mut kept = Vec::new();
            for b in self.read_file(table, &file, dataset, schema)? {
                let end = (at + b.num_rows()).min(keep.len());
                let mask = arrow_array::BooleanArray::from(keep[at..end].to_vec());
                at = end;
                kept.push(
                    arrow_select::filter::filter_record_batch(&b, &mask)
                        .map_err(|e| format!("merging into {dataset}: {e}"))?,
                );
            }
            groups.push(kept);
            if at != keep.len() {
                return Err(format!(
                    "merging into {dataset}: {} read {at} rows whole and {} by column",
                    file.file_path(),
                    keep.len()
                )
                .into());
            }
            removed.push(file);
        }
        // A key whose newest version is a change stream's delete marker
        // leaves the table: its old rows were replaced above, and the
        // marker itself is not written.
        let deleted = incoming
            .column_by_name("_orca_deleted")
            .and_then(|c| c.as_any().downcast_ref::<arrow_array::BooleanArray>());
        let mut rows: Vec<u32> = newest
            .values()
            .filter(|(r, _)| !deleted.is_some_and(|d| d.is_valid(*r) && d.value(*r)))
            .map(|(r, _)| *r as u32)
            .collect();
        rows.sort_unstable();
        let take = arrow_array::UInt32Array::from(rows);
        let fresh = arrow_select::take::take_record_batch(&incoming, &take)
            .map_err(|e| format!("merging into {dataset}: {e}"))?;
        groups.push(vec![fresh]);
        Ok(Merged {
            groups,
            removed,
            scan,
        })
    }

    fn write(
        &self,
        table: &Table,
        at: &EpochAt<'_>,
        batches: Vec<RecordBatch>,
    ) -> Result<Vec<iceberg::spec::DataFile>> {
        let prefix = format!(
            "orca-sync-{}-e{}-g{}-{}",
            at.sync,
            at.epoch,
            at.generation,
            uuid::Uuid::new_v4().simple()
        );
        table::write_data_files(&self.t, table, batches.into_iter().map(Ok), prefix)
    }

    /// The data files of the table's current snapshot.
    fn live_files(&self, table: &Table) -> Result<Vec<iceberg::spec::DataFile>> {
        match table.inner.metadata().current_snapshot() {
            Some(snapshot) => table::live_data_files(&self.t, &table.inner, snapshot),
            None => Ok(Vec::new()),
        }
    }

    /// A data file's rows, in the table's Arrow types.
    fn read_file(
        &self,
        table: &Table,
        file: &iceberg::spec::DataFile,
        dataset: &str,
        schema: &std::sync::Arc<ArrowSchema>,
    ) -> Result<Vec<RecordBatch>> {
        let reader = crate::ranged::open_data_file(
            &self.t.rt,
            table.inner.file_io(),
            file.file_path(),
            file.file_size_in_bytes(),
        )
        .and_then(|b| b.build())
        .map_err(|e| format!("reading {} of {dataset}: {e}", file.file_path()))?;
        reader
            .map(|b| {
                let b = b.map_err(|e| format!("reading {} of {dataset}: {e}", file.file_path()))?;
                fit(schema, dataset, b)
            })
            .collect()
    }

    /// Commits data files added (and removed) as the epoch's snapshot, with
    /// its marker in the summary and as a table property.
    fn commit_epoch(
        &self,
        table: &Table,
        at: &EpochAt<'_>,
        files: Vec<iceberg::spec::DataFile>,
        removed: Vec<iceberg::spec::DataFile>,
        extra: Vec<(String, String)>,
    ) -> Result<EpochCommit> {
        let EpochAt {
            dataset,
            sync,
            stream,
            generation,
            epoch,
        } = *at;
        let props = HashMap::from([
            ("orca.sync".to_string(), sync.to_string()),
            ("orca.sync.stream".to_string(), stream.to_string()),
            ("orca.sync.epoch".to_string(), epoch.to_string()),
            ("orca.sync.generation".to_string(), generation.to_string()),
        ])
        .into_iter()
        .chain(extra)
        .collect();
        let op = if removed.is_empty() {
            iceberg::spec::Operation::Append
        } else {
            iceberg::spec::Operation::Overwrite
        };
        let change = table::Change {
            added: files,
            removed,
            op,
            props,
            // The marker also as a table property, in the same metadata: it
            // outlives the snapshot's expiry.
            table_props: HashMap::from([(epoch_key(sync), epoch.to_string())]),
        };
        // The fence and the marker are looked at again on every try, against
        // the very state the compare-and-swap replaces: a newer attempt that
        // raised the fence, or applied this epoch, since the first look wins.
        let done = table::commit_change(
            &self.t,
            &table.ident,
            dataset,
            table.inner.clone(),
            &change,
            |now| settled_inner(now, at),
        )?;
        let snapshot = match done {
            Ok(snapshot) => snapshot,
            Err(settled) => return Ok(settled),
        };
        Ok(EpochCommit::Committed { snapshot })
    }
}

/// How an epoch's rows go into the table.
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    Append,
    /// Append the rows whose `_orca_id` the table does not hold (a
    /// backfill reading the stream again): every data file's `_orca_id`
    /// column is read first.
    AppendNew,
    /// Merge by this key, copy-on-write: the newest version of each key in
    /// the epoch replaces the table's row of that key when it has a higher
    /// `_orca_seq` (an older version delivered again changes nothing), and
    /// the data files that held replaced rows are written again without
    /// them. The key columns of every data file that may hold one of the
    /// epoch's keys are read: when the key's first column is an integer,
    /// date, timestamp or text, a file whose bounds for it hold none of the
    /// epoch's values is passed by; other keys read every file, so their
    /// cost grows with the table.
    Merge(&'a [String]),
}

/// What a merge writes, as groups of rows each written as files of their
/// own, and the data files it replaces.
struct Merged {
    groups: Vec<Vec<RecordBatch>>,
    removed: Vec<iceberg::spec::DataFile>,
    scan: MergeScan,
}

/// How many data files a merge read the key columns of, and how many it
/// passed by on their key bounds (both go into the snapshot summary as
/// `orca.merge.files-read` and `orca.merge.files-skipped`).
#[derive(Debug, Default, Clone, Copy)]
struct MergeScan {
    read: usize,
    skipped: usize,
}

/// The epoch's values of the key's first column, sorted: what a data file's
/// bounds for that column are checked against. A file whose range holds none
/// of them holds none of the epoch's keys, whatever the other key columns.
struct KeyProbe {
    field: i32,
    keys: KeyValues,
}

/// Key values as the bounds of an Iceberg manifest entry encode them:
/// integers, dates (days) and timestamps (in the table's unit) as `i64`,
/// text as UTF-8 (compared bytewise, as the bounds are).
#[derive(Debug, PartialEq)]
enum KeyValues {
    Ints(Vec<i64>),
    Texts(Vec<String>),
}

impl KeyValues {
    /// None for a column with nulls (bounds say nothing of them) or of a
    /// type not checked against bounds.
    fn of(col: &dyn Array) -> Option<KeyValues> {
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Date32Type, Int32Type, Int64Type};
        use arrow_schema::{DataType, TimeUnit};
        if col.null_count() > 0 {
            return None;
        }
        let widen = |v: &[i32]| v.iter().map(|x| i64::from(*x)).collect::<Vec<i64>>();
        let mut keys = match col.data_type() {
            DataType::Int32 => KeyValues::Ints(widen(col.as_primitive::<Int32Type>().values())),
            DataType::Date32 => KeyValues::Ints(widen(col.as_primitive::<Date32Type>().values())),
            DataType::Int64 => KeyValues::Ints(col.as_primitive::<Int64Type>().values().to_vec()),
            DataType::Timestamp(TimeUnit::Microsecond, _) => KeyValues::Ints(
                col.as_primitive::<arrow_array::types::TimestampMicrosecondType>()
                    .values()
                    .to_vec(),
            ),
            DataType::Timestamp(TimeUnit::Nanosecond, _) => KeyValues::Ints(
                col.as_primitive::<arrow_array::types::TimestampNanosecondType>()
                    .values()
                    .to_vec(),
            ),
            DataType::Utf8 => KeyValues::Texts(texts(col.as_string::<i32>())),
            DataType::LargeUtf8 => KeyValues::Texts(texts(col.as_string::<i64>())),
            _ => return None,
        };
        match &mut keys {
            KeyValues::Ints(v) => {
                v.sort_unstable();
                v.dedup();
            }
            KeyValues::Texts(v) => {
                v.sort_unstable();
                v.dedup();
            }
        }
        Some(keys)
    }

    /// False only when the bounds show that none of the values lies in
    /// [lo, hi]. Bounds of another type say nothing. Writers that shorten
    /// text bounds keep the lower a prefix and round the upper up, so a
    /// shortened range still covers the file's values.
    fn may_lie_within(
        &self,
        lo: &iceberg::spec::PrimitiveLiteral,
        hi: &iceberg::spec::PrimitiveLiteral,
    ) -> bool {
        use iceberg::spec::PrimitiveLiteral as L;
        let int = |l: &L| match l {
            L::Int(v) => Some(i64::from(*v)),
            L::Long(v) => Some(*v),
            _ => None,
        };
        match self {
            KeyValues::Ints(keys) => match (int(lo), int(hi)) {
                (Some(lo), Some(hi)) => {
                    let i = keys.partition_point(|k| *k < lo);
                    keys.get(i).is_some_and(|k| *k <= hi)
                }
                _ => true,
            },
            KeyValues::Texts(keys) => match (lo, hi) {
                (L::String(lo), L::String(hi)) => {
                    let i = keys.partition_point(|k| k.as_str() < lo.as_str());
                    keys.get(i).is_some_and(|k| k.as_str() <= hi.as_str())
                }
                _ => true,
            },
        }
    }
}

fn texts<O: arrow_array::OffsetSizeTrait>(a: &arrow_array::GenericStringArray<O>) -> Vec<String> {
    a.iter().flatten().map(str::to_string).collect()
}

impl KeyProbe {
    fn new(table: &Table, incoming: &RecordBatch, key: &[String]) -> Option<KeyProbe> {
        let first = key.first()?;
        let field = table
            .inner
            .metadata()
            .current_schema()
            .field_by_name(first)?
            .id;
        let keys = KeyValues::of(incoming.column_by_name(first)?.as_ref())?;
        Some(KeyProbe { field, keys })
    }

    /// False only when the file's bounds for the key's first column show it
    /// holds none of the epoch's keys; a file without them may.
    fn may_hold(&self, file: &iceberg::spec::DataFile) -> bool {
        match (
            file.lower_bounds().get(&self.field),
            file.upper_bounds().get(&self.field),
        ) {
            (Some(lo), Some(hi)) => self.keys.may_lie_within(lo.literal(), hi.literal()),
            _ => true,
        }
    }
}

/// Which epoch of which stream goes into which table, by which attempt.
#[derive(Debug, Clone, Copy)]
pub struct EpochAt<'a> {
    pub dataset: &'a str,
    pub sync: &'a str,
    pub stream: &'a str,
    pub generation: i32,
    pub epoch: u64,
}

/// Each row's key as one string (the key columns as text, joined by a
/// separator no text key holds).
fn key_strings(b: &RecordBatch, key: &[String], dataset: &str) -> Result<Vec<String>> {
    let mut cols = Vec::with_capacity(key.len());
    for k in key {
        let c = b
            .column_by_name(k)
            .ok_or_else(|| format!("table {dataset} has no key column {k}"))?;
        let text = arrow_cast::cast(c, &arrow_schema::DataType::Utf8)
            .map_err(|e| format!("key column {k} of {dataset}: {e}"))?;
        cols.push(text);
    }
    let mut out = Vec::with_capacity(b.num_rows());
    for row in 0..b.num_rows() {
        let mut k = String::new();
        for c in &cols {
            let c = c
                .as_any()
                .downcast_ref::<arrow_array::StringArray>()
                .ok_or_else(|| format!("a key column of {dataset} did not read as text"))?;
            if c.is_null(row) {
                k.push('\u{0}');
            } else {
                k.push_str(c.value(row));
            }
            k.push('\u{1f}');
        }
        out.push(k);
    }
    Ok(out)
}

/// A table's `_orca_id` column: 16 bytes, or hex text for a stream that
/// began before ids were bytes.
fn orca_ids<'a>(b: &'a RecordBatch, dataset: &str) -> Result<&'a dyn Array> {
    use arrow_schema::DataType;
    b.column_by_name("_orca_id")
        .filter(|c| {
            matches!(
                c.data_type(),
                DataType::Utf8 | DataType::FixedSizeBinary(16)
            )
        })
        .map(|c| c.as_ref())
        .ok_or_else(|| format!("table {dataset} has no _orca_id column of text or 16 bytes").into())
}

/// Row `i`'s id as bytes (one table holds one form).
fn id_at(ids: &dyn Array, i: usize) -> Option<&[u8]> {
    use arrow_array::cast::AsArray;
    if ids.is_null(i) {
        return None;
    }
    match ids.data_type() {
        arrow_schema::DataType::Utf8 => Some(ids.as_string::<i32>().value(i).as_bytes()),
        _ => Some(ids.as_fixed_size_binary().value(i)),
    }
}

fn seqs<'a>(b: &'a RecordBatch, dataset: &str) -> Result<&'a arrow_array::Int64Array> {
    b.column_by_name("_orca_seq")
        .and_then(|c| c.as_any().downcast_ref::<arrow_array::Int64Array>())
        .ok_or_else(|| format!("table {dataset} has no bigint _orca_seq column").into())
}

/// `Fenced` when a newer attempt raised the fence, `AlreadyApplied` when
/// the table holds the epoch; `None` when the epoch may be committed.
fn settled(table: &Table, at: &EpochAt<'_>) -> Option<EpochCommit> {
    settled_inner(&table.inner, at)
}

fn settled_inner(table: &iceberg::table::Table, at: &EpochAt<'_>) -> Option<EpochCommit> {
    let fence = fence_of(table, at.sync);
    if fence > at.generation {
        return Some(EpochCommit::Fenced { fence });
    }
    (marker_of(table, at.sync) >= at.epoch).then_some(EpochCommit::AlreadyApplied)
}

fn marker_of(table: &iceberg::table::Table, sync: &str) -> u64 {
    let kept: u64 = table
        .metadata()
        .properties()
        .get(&epoch_key(sync))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let seen = table
        .metadata()
        .snapshots()
        .filter_map(|s| {
            let p = &s.summary().additional_properties;
            (p.get("orca.sync").map(String::as_str) == Some(sync))
                .then(|| p.get("orca.sync.epoch")?.parse::<u64>().ok())
                .flatten()
        })
        .max()
        .unwrap_or(0);
    kept.max(seen)
}

fn fence_of(table: &iceberg::table::Table, sync: &str) -> i32 {
    table
        .metadata()
        .properties()
        .get(&fence_key(sync))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A batch in the table's own Arrow types (field ids, int16 widened, the
/// zone's spelling), column by column by name.
fn fit(schema: &std::sync::Arc<ArrowSchema>, dataset: &str, b: RecordBatch) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let c = b.column_by_name(f.name()).ok_or_else(|| {
                format!(
                    "table {dataset} has column {} the sync does not write",
                    f.name()
                )
            })?;
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                arrow_cast::cast(c, f.data_type())
                    .map_err(|e| format!("column {} of {dataset}: {e}", f.name()).into())
            }
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| format!("batch does not fit table {dataset}: {e}").into())
}

#[cfg(test)]
mod tests {
    use super::KeyValues;
    use arrow_array::{Date32Array, Int32Array, Int64Array, StringArray};
    use iceberg::spec::PrimitiveLiteral as L;

    #[test]
    fn integer_keys_are_checked_against_int_and_long_bounds() {
        let keys = KeyValues::of(&Int64Array::from(vec![40, 7, 19_950, 7])).expect("ints");
        assert_eq!(keys, KeyValues::Ints(vec![7, 40, 19_950]));
        assert!(
            keys.may_lie_within(&L::Long(1), &L::Long(7)),
            "7 is a bound"
        );
        assert!(keys.may_lie_within(&L::Long(19_901), &L::Long(20_000)));
        assert!(
            !keys.may_lie_within(&L::Long(8), &L::Long(39)),
            "between keys"
        );
        assert!(
            !keys.may_lie_within(&L::Long(19_951), &L::Long(30_000)),
            "above all"
        );
        assert!(!keys.may_lie_within(&L::Int(-5), &L::Int(6)), "below all");
        let ints = KeyValues::of(&Int32Array::from(vec![3])).expect("int32");
        assert!(ints.may_lie_within(&L::Int(3), &L::Int(3)));
    }

    #[test]
    fn text_and_date_keys_compare_as_their_bounds_do() {
        let keys = KeyValues::of(&StringArray::from(vec!["customer 7", "b"])).expect("texts");
        assert!(keys.may_lie_within(&L::String("a".into()), &L::String("c".into())));
        assert!(!keys.may_lie_within(&L::String("c".into()), &L::String("customer 6".into())));
        // A shortened upper bound rounded up still covers its file's values.
        assert!(keys.may_lie_within(&L::String("custom".into()), &L::String("customf".into())));
        let days = KeyValues::of(&Date32Array::from(vec![19_723])).expect("dates");
        assert!(days.may_lie_within(&L::Int(19_700), &L::Int(19_800)));
        assert!(!days.may_lie_within(&L::Int(19_724), &L::Int(19_800)));
    }

    #[test]
    fn nulls_other_types_and_mismatched_bounds_say_nothing() {
        assert_eq!(KeyValues::of(&Int64Array::from(vec![Some(1), None])), None);
        assert_eq!(
            KeyValues::of(&arrow_array::Float64Array::from(vec![1.5])),
            None
        );
        let keys = KeyValues::of(&Int64Array::from(vec![5])).expect("ints");
        assert!(keys.may_lie_within(&L::String("a".into()), &L::String("b".into())));
    }
}
