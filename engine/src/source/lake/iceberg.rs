//! Iceberg tables of the org's own catalog as a sync source: a stream reads
//! its table at the current snapshot (every live data file), then, attempt
//! by attempt, the files each later `append` snapshot added, passing by
//! compactions (`replace`: the same rows in new files). A snapshot that
//! overwrote or deleted rows cannot be read as an increment and stops the
//! stream, saying so.
//!
//! Snapshots never change, so a read again from a resume point returns
//! exactly the rows after it (exact replay). The resume point is
//! `[mode, snapshot, file, row]`: `full` (the first snapshot, every live
//! file) or `added` (an append's own files), the snapshot, the data file
//! and the rows read of it; files are read in path order. `done` marks a
//! snapshot every row up to which was read, which a stream moves to when
//! the snapshots after its last rows brought none (compactions), so that
//! it never rests on a snapshot expiry may take.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions, StringArray};
use arrow_schema::{ArrowError, Schema};
use orca_core::sync::Stream;
use orca_lake::iceberg::spec::{DataContentType, ManifestContentType, ManifestStatus, Operation};
use orca_lake::iceberg::table::Table as IcebergTable;
use orca_lake::ranged::{open_data_file, starting_at};
use orca_lake::{Lake, LakeConfig, Table};
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

use crate::source::error::ReadError;
use crate::source::msg::Msg;
use crate::source::plan::Plan;
use crate::source::postgres::table::PgTable;
use crate::source::readers::{spawn, Reader, Shape};
use crate::source::typed::{chunk_of, columns_of, table_of};
use crate::util::Missing;

/// What reading a table of the lake fails with, named by its stream.
fn failed(stream: &str, reason: impl std::fmt::Display) -> ReadError {
    ReadError::Stream {
        stream: stream.to_string(),
        reason: reason.to_string(),
    }
}

/// The stream's table, loaded from the org's catalog and checked to lie in
/// the org's part of the warehouse.
fn load(lake: &Lake, config: &LakeConfig, stream: &Stream) -> Result<Table, ReadError> {
    let dataset = stream
        .table
        .clone()
        .ok_or_else(|| Missing::of("table", stream))?;
    let id = orca_lake::ident(&dataset).map_err(|e| failed(&stream.name, e))?;
    if !lake.exists(&id).map_err(|e| failed(&stream.name, e))? {
        return Err(failed(
            &stream.name,
            format!("table {dataset} is not in org {}'s catalog", config.org),
        ));
    }
    let table = Table::new(
        &dataset,
        id.clone(),
        lake.load(&id).map_err(|e| failed(&stream.name, e))?,
    );
    orca_lake::maintain::check_within(
        &table,
        &config.org_warehouse(),
        "a sync reads only the org's own tables",
    )
    .map_err(|e| failed(&stream.name, e))?;
    Ok(table)
}

/// A stream of an Iceberg table, described: the table's current columns
/// (but for the engine's own `_orca_` ones), in the types a Postgres
/// table's travel in.
pub(crate) fn describe(
    lake: &Lake,
    config: &LakeConfig,
    stream: &Stream,
) -> Result<PgTable, ReadError> {
    let table = load(lake, config, stream)?;
    let schema = table.arrow_schema().map_err(|e| failed(&stream.name, e))?;
    let columns = columns_of(&schema);
    if let Some(k) = stream
        .primary_key
        .iter()
        .find(|k| !columns.iter().any(|c| &c.name == *k))
    {
        return Err(failed(
            &stream.name,
            format!(
                "its primary key column {k} is not a column of {}",
                table.dataset()
            ),
        ));
    }
    Ok(table_of(stream, table.dataset(), columns))
}

/// One snapshot's files a stream reads: all its live ones (`full`), or the
/// ones an append added (`added`), in path order, each with its size in
/// bytes as its manifest gives it.
struct Work {
    mode: &'static str,
    snapshot: i64,
    files: Vec<(String, u64)>,
}

/// A snapshot's data files: the live ones, or only those it added. A
/// delete file (another engine's merge-on-read) is refused: its rows'
/// deletions would be lost.
fn files_of(
    lake: &Lake,
    table: &IcebergTable,
    dataset: &str,
    snapshot: i64,
    added_only: bool,
) -> Result<Vec<(String, u64)>, String> {
    let snap = table
        .metadata()
        .snapshot_by_id(snapshot)
        .cloned()
        .ok_or_else(|| {
            format!(
                "snapshot {snapshot} of {dataset} is gone (expired): the stream cannot go on \
                 from it; expire snapshots no sooner than the sync reads them, or read the \
                 stream again"
            )
        })?;
    let found = lake.rt.block_on(async {
        let list = table.manifest_list_reader(&snap).load().await?;
        let mut out = Vec::new();
        let mut deletes = false;
        for mf in list.entries() {
            // What a snapshot added is in the manifests it wrote: the
            // others need not be read.
            if added_only && mf.added_snapshot_id != snapshot {
                continue;
            }
            if mf.content != ManifestContentType::Data {
                deletes |= mf.has_added_files() || mf.has_existing_files();
                continue;
            }
            let m = mf.load_manifest(table.file_io()).await?;
            for e in m.entries() {
                let wanted = if added_only {
                    e.status() == ManifestStatus::Added && e.snapshot_id() == Some(snapshot)
                } else {
                    e.is_alive()
                };
                if wanted && e.data_file().content_type() == DataContentType::Data {
                    let f = e.data_file();
                    out.push((f.file_path().to_string(), f.file_size_in_bytes()));
                }
            }
        }
        Ok::<_, orca_lake::iceberg::Error>((out, deletes))
    });
    let (mut files, deletes) =
        found.map_err(|e| format!("listing the files of snapshot {snapshot} of {dataset}: {e}"))?;
    if deletes {
        return Err(format!(
            "snapshot {snapshot} of {dataset} has delete files (merge-on-read): a sync reads \
             tables whose rows live in data files alone"
        ));
    }
    files.sort();
    Ok(files)
}

/// The snapshots after `after` up to the current one that a stream reads,
/// oldest first: appends, passing by compactions.
fn increments(
    lake: &Lake,
    table: &IcebergTable,
    dataset: &str,
    after: i64,
) -> Result<Vec<Work>, String> {
    let meta = table.metadata();
    let mut chain = Vec::new();
    let mut at = meta.current_snapshot().cloned();
    while let Some(s) = at {
        if s.snapshot_id() == after {
            break;
        }
        at = match s.parent_snapshot_id() {
            Some(p) => Some(meta.snapshot_by_id(p).cloned().ok_or_else(|| {
                format!(
                    "the snapshots of {dataset} after {after} cannot be followed: {p} is gone \
                     (expired); read the stream again"
                )
            })?),
            None => {
                return Err(format!(
                    "snapshot {after} of {dataset}, where the stream stopped, is not an \
                     ancestor of its current snapshot (the table was replaced, or rolled \
                     back): read the stream again"
                ))
            }
        };
        chain.push(s);
    }
    chain.reverse();
    let mut out = Vec::new();
    for s in chain {
        match s.summary().operation {
            Operation::Append => out.push(Work {
                mode: "added",
                snapshot: s.snapshot_id(),
                files: files_of(lake, table, dataset, s.snapshot_id(), true)?,
            }),
            // The same rows in other files.
            Operation::Replace => {}
            Operation::Overwrite | Operation::Delete => {
                return Err(format!(
                    "snapshot {} of {dataset} {} rows: an iceberg stream reads what \
                     appends add (and passes compactions by); read the stream again to take \
                     the table as it is",
                    s.snapshot_id(),
                    match s.summary().operation {
                        Operation::Delete => "deleted",
                        _ => "overwrote",
                    }
                ))
            }
        }
    }
    Ok(out)
}

/// Where in the first snapshot's files a stream starts: the file and the
/// rows read of it.
type StartAt = Option<(String, usize)>;

/// What a stream reads from its resume point on, and where it starts.
fn plan_reads(
    lake: &Lake,
    table: &IcebergTable,
    dataset: &str,
    after: Option<&[String]>,
) -> Result<(Vec<Work>, StartAt), String> {
    let bad = || format!("resume point {after:?} is not [mode, snapshot, file, row]");
    match after {
        None => Ok(match table.metadata().current_snapshot() {
            None => (Vec::new(), None),
            Some(c) => (
                vec![Work {
                    mode: "full",
                    snapshot: c.snapshot_id(),
                    files: files_of(lake, table, dataset, c.snapshot_id(), false)?,
                }],
                None,
            ),
        }),
        Some([mode, snapshot, file, row]) => {
            let snapshot: i64 = snapshot.parse().map_err(|_| bad())?;
            let row: usize = row.parse().map_err(|_| bad())?;
            let mode = match mode.as_str() {
                "full" => "full",
                "added" => "added",
                "done" => "done",
                _ => return Err(bad()),
            };
            // `done`: every row up to the snapshot was read.
            let rest: Vec<(String, u64)> = match mode {
                "done" => Vec::new(),
                _ => files_of(lake, table, dataset, snapshot, mode == "added")?
                    .into_iter()
                    .filter(|(f, _)| f >= file)
                    .collect(),
            };
            let mut work = vec![Work {
                mode,
                snapshot,
                files: rest,
            }];
            work.extend(increments(lake, table, dataset, snapshot)?);
            Ok((work, Some((file.clone(), row))))
        }
        Some(_) => Err(bad()),
    }
}

/// A reader per stream of the plan, each over the org's lake.
pub(crate) fn open_iceberg(plan: &Plan, config: &LakeConfig) -> Result<Vec<Reader>, ReadError> {
    let lake = Lake::open(config).map_err(|e| ReadError::Definition(format!("the lake: {e}")))?;
    plan.started()?
        .into_iter()
        .map(|(start, stream)| {
            let table = describe(&lake, config, stream)?.under_policy(&start.recorded)?;
            spawn_iceberg_reader(
                config.clone(),
                stream.clone(),
                table,
                start.after.clone(),
                plan.batch_rows,
            )
        })
        .collect()
}

/// The table's current columns by field id.
fn names_by_id(table: &IcebergTable) -> HashMap<i32, String> {
    table
        .metadata()
        .current_schema()
        .as_struct()
        .fields()
        .iter()
        .map(|f| (f.id, f.name.clone()))
        .collect()
}

/// A data file's batch with its columns named as the table names them now,
/// matched by field id as Iceberg's readers match them (names change, ids
/// do not): a column renamed since the file was written takes its new name,
/// one dropped since (its id gone from the schema) is left out, so a column
/// added later under an old name is null in the file rather than the old
/// column's values. A column without a field id (a file written outside
/// Iceberg's writers, then added to the table) keeps its name.
fn by_field_id(
    batch: RecordBatch,
    names: &HashMap<i32, String>,
) -> Result<RecordBatch, ArrowError> {
    let schema = batch.schema();
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    let mut changed = false;
    for (f, c) in schema.fields().iter().zip(batch.columns()) {
        let id = f
            .metadata()
            .get(PARQUET_FIELD_ID_META_KEY)
            .and_then(|id| id.parse::<i32>().ok());
        match id.map(|id| names.get(&id)) {
            None => fields.push(f.clone()),
            Some(Some(now)) if now == f.name() => fields.push(f.clone()),
            Some(Some(now)) => {
                changed = true;
                fields.push(Arc::new(f.as_ref().clone().with_name(now.clone())));
            }
            Some(None) => {
                changed = true;
                continue;
            }
        }
        columns.push(c.clone());
    }
    if !changed {
        return Ok(batch);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone())),
        columns,
        &options,
    )
}

/// Reads a stream's table from its resume point in chunks of at most
/// `batch_rows` rows; a chunk never spans two data files.
fn spawn_iceberg_reader(
    config: LakeConfig,
    stream: Stream,
    table: PgTable,
    after: Option<Vec<String>>,
    batch_rows: usize,
) -> Result<Reader, ReadError> {
    let name = stream.name.clone();
    let t = table.clone();
    spawn(name.clone(), Shape::Table(table), move |tx| {
        let lake =
            Lake::open(&config).map_err(|e| ReadError::Definition(format!("the lake: {e}")))?;
        let source = load(&lake, &config, &stream)?;
        let dataset = source.dataset().to_string();
        let (work, mut start) = plan_reads(&lake, &source.inner, &dataset, after.as_deref())
            .map_err(|e| failed(&name, e))?;
        let io = source.inner.file_io().clone();
        let names = names_by_id(&source.inner);
        let current = source.inner.metadata().current_snapshot_id();
        // The snapshot the stream's position names, as it moves.
        let mut at: Option<i64> = after
            .as_ref()
            .and_then(|a| a.get(1))
            .and_then(|s| s.parse().ok());
        for w in work {
            for (file, size) in w.files {
                let offset = match &start {
                    Some((f, row)) if *f == file => *row,
                    _ => 0,
                };
                start = None;
                let batches = open_data_file(&lake.rt, &io, &file, size)
                    .and_then(|b| starting_at(b.with_batch_size(batch_rows.max(1)), offset).build())
                    .map_err(|e| failed(&name, format!("reading {file}: {e}")))?;
                let mut row = offset;
                for b in batches {
                    let b = b
                        .and_then(|b| by_field_id(b, &names))
                        .map_err(|e| failed(&name, format!("reading {file}: {e}")))?;
                    let rows = b.num_rows();
                    if rows == 0 {
                        continue;
                    }
                    let chunk = chunk_of(&t, &b, &file, row, |next| {
                        vec![
                            w.mode.to_string(),
                            w.snapshot.to_string(),
                            file.clone(),
                            next.to_string(),
                        ]
                    })?;
                    row += rows;
                    at = Some(w.snapshot);
                    if tx.send(Ok(chunk)).is_err() {
                        return Ok(());
                    }
                }
            }
        }
        if let Some(c) = current.filter(|c| at.is_some_and(|a| a != *c)) {
            // Read up to the current snapshot, whose rows (if any) came in
            // an earlier snapshot's files: move there without a row.
            let arrays = t
                .columns
                .iter()
                .map(|col| arrow_array::new_empty_array(&col.kind.data_type()))
                .collect();
            let done = Msg::Chunk {
                arrays,
                ids: Arc::new(StringArray::from(Vec::<String>::new())),
                last: vec!["done".into(), c.to_string(), String::new(), "0".into()],
                rows: 0,
            };
            if tx.send(Ok(done)).is_err() {
                return Ok(());
            }
        }
        let _ = tx.send(Ok(Msg::End { bytes: 0 }));
        Ok(())
    })
}
