//! The destinations a sync writes, behind one face: raise the fence, read a
//! stream's marker, apply a stream's staged epoch.
//!
//! - `parquet`: files under a URL ([`crate::dest::parquet`]);
//! - `iceberg`: table `{namespace}.{stream}` in the org's catalog, each epoch
//!   one snapshot whose summary carries the stream marker
//!   (`orca_lake::sync_tables`).

use bytes::Bytes;
use orca_lake::sync_tables::{EpochAt, EpochCommit, SyncTables, Write};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;

use std::collections::HashMap;

use crate::commit::record::{Refresh, Staged};
use crate::commit::store::Store;
use crate::dest::parquet::{DestError, ParquetDest};
use crate::dest::postgres::{PgDest, StreamMode};
use crate::source::pg_table::{self, PgTable};
use crate::util::strings;

/// How an epoch of a stream is applied.
#[derive(Debug, Clone, Copy, Default)]
pub struct How {
    /// The stream is being refreshed (`overwrite`).
    pub refresh: Option<Refresh>,
    /// Rows the destination holds already (by `_orca_id`) are skipped: the
    /// epoch is part of a backfill reading the stream again.
    pub skip_known: bool,
}

pub enum Dest {
    Parquet(ParquetDest),
    Postgres {
        pg: PgDest,
        modes: HashMap<String, StreamMode>,
    },
    Iceberg {
        tables: SyncTables,
        namespace: String,
        sync: String,
        /// The primary key of each stream written with `merge`.
        merge_keys: HashMap<String, Vec<String>>,
        /// The sync's folder in its store (`{org}/{sync}`): a refresh keeps
        /// its epochs' files under `_refresh/{stream}/` there until it ends.
        root: String,
    },
}

fn iceberg(e: orca_lake::LakeError) -> DestError {
    DestError::Iceberg(e.to_string())
}

impl Dest {
    /// Opens the destination a definition names; Iceberg tables are created
    /// with the streams' destination schemas if they do not exist.
    pub fn open(
        destination: &Value,
        database_url: &str,
        org: &str,
        sync: &str,
        streams: &[PgTable],
        definition: &Value,
    ) -> Result<Dest, DestError> {
        let opt = |k: &str| {
            destination
                .get(k)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| DestError::Definition(format!("destination.{k} is missing")))
        };
        match opt("type")?.as_str() {
            "parquet" => Ok(Dest::Parquet(ParquetDest {
                store: Store::open(&opt("url")?)?,
            })),
            "postgres" => {
                let schema = destination
                    .get("schema")
                    .and_then(Value::as_str)
                    .unwrap_or("public");
                let modes = definition
                    .get("streams")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| {
                        let name = s.get("name")?.as_str()?.to_string();
                        let mode = StreamMode {
                            merge: s.get("mode").and_then(Value::as_str) == Some("merge"),
                            overwrite: s.get("mode").and_then(Value::as_str) == Some("overwrite"),
                            primary_key: strings(s, "primary_key"),
                        };
                        Some((name, mode))
                    })
                    .collect();
                Ok(Dest::Postgres {
                    pg: PgDest::open(&opt("url")?, schema, sync)?,
                    modes,
                })
            }
            "iceberg" => {
                let tables = SyncTables::open(database_url, org).map_err(iceberg)?;
                let namespace = opt("namespace")?;
                for t in streams {
                    let dataset = format!("{namespace}.{}", t.spec.name);
                    tables
                        .ensure(&dataset, &pg_table::destination_schema(t))
                        .map_err(iceberg)?;
                }
                let merge_keys = definition
                    .get("streams")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|s| s.get("mode").and_then(Value::as_str) == Some("merge"))
                    .filter_map(|s| {
                        let name = s.get("name")?.as_str()?.to_string();
                        Some((name, strings(s, "primary_key")))
                    })
                    .collect();
                Ok(Dest::Iceberg {
                    tables,
                    namespace,
                    sync: sync.to_string(),
                    merge_keys,
                    root: crate::commit::record::Layout::new(org, sync).root,
                })
            }
            other => Err(DestError::NotBuilt(format!(
                "the {other} destination's data path"
            ))),
        }
    }

    pub fn raise_fence(&mut self, generation: i32, streams: &[String]) -> Result<(), DestError> {
        match self {
            Dest::Parquet(p) => p.raise_fence(generation),
            Dest::Postgres { pg, .. } => pg.raise_fence(generation),
            Dest::Iceberg {
                tables,
                namespace,
                sync,
                ..
            } => {
                for s in streams {
                    let dataset = format!("{namespace}.{s}");
                    if let EpochCommit::Fenced { fence } = tables
                        .raise_fence(&dataset, sync, generation)
                        .map_err(iceberg)?
                    {
                        return Err(DestError::Fenced {
                            fence,
                            mine: generation,
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// Sets aside the cells of a batch this destination cannot take (as
    /// null), returning them to be held under `_held/`.
    /// An Iceberg table is first made to take the stream's columns (made,
    /// or given the new ones), then holds the cells its narrower columns
    /// cannot take.
    pub fn hold(
        &self,
        stream: &str,
        batch: arrow_array::RecordBatch,
    ) -> Result<(arrow_array::RecordBatch, Vec<crate::dest::postgres::Held>), DestError> {
        match self {
            Dest::Postgres { .. } => crate::dest::postgres::hold(batch),
            Dest::Parquet(_) => Ok((batch, Vec::new())),
            Dest::Iceberg {
                tables, namespace, ..
            } => {
                let have = tables
                    .fit_columns(&format!("{namespace}.{stream}"), &batch.schema())
                    .map_err(iceberg)?;
                hold_narrower(batch, &have)
            }
        }
    }

    /// The last epoch applied to a stream.
    pub fn marker(&mut self, stream: &str) -> Result<u64, DestError> {
        match self {
            Dest::Parquet(p) => p.marker(stream),
            Dest::Postgres { pg, .. } => pg.marker(stream),
            Dest::Iceberg {
                tables,
                namespace,
                sync,
                ..
            } => tables
                .marker(&format!("{namespace}.{stream}"), sync)
                .map_err(iceberg),
        }
    }

    /// Makes a stream's epoch visible, idempotently; for a stream being
    /// refreshed (`overwrite`), into its shadow, which replaces the stream's
    /// rows at the refresh's last epoch.
    pub fn apply(
        &mut self,
        staging: &Store,
        generation: i32,
        epoch: u64,
        stream: &str,
        staged: &[&Staged],
        how: How,
    ) -> Result<(), DestError> {
        let refresh = how.refresh;
        match self {
            Dest::Parquet(p) => p.apply(staging, generation, epoch, stream, staged, refresh),
            Dest::Postgres { pg, modes } => {
                // The marker moves even for an epoch in which the stream
                // read nothing: it costs one row in the same transaction.
                let batches = read_all(staging, staged)?;
                let mode = modes.get(stream).cloned().unwrap_or(StreamMode {
                    merge: false,
                    overwrite: false,
                    primary_key: Vec::new(),
                });
                pg.apply(generation, epoch, stream, &batches, &mode, refresh)
            }
            Dest::Iceberg {
                tables,
                namespace,
                sync,
                merge_keys,
                root,
            } => {
                let dataset = format!("{namespace}.{stream}");
                let at = EpochAt {
                    dataset: &dataset,
                    sync,
                    stream,
                    generation,
                    epoch,
                };
                if let Some(r) = refresh {
                    let shadow = format!("{root}/_refresh/{stream}");
                    return refresh_iceberg(tables, staging, &shadow, &at, staged, r);
                }
                // An epoch in which the stream read nothing has nothing to
                // make visible; its marker stays where it is.
                if staged.is_empty() {
                    return Ok(());
                }
                let batches = read_all(staging, staged)?;
                let write = match merge_keys.get(stream) {
                    Some(key) => Write::Merge(key),
                    None if how.skip_known => Write::AppendNew,
                    None => Write::Append,
                };
                committed(tables.apply_epoch(&at, batches, write), generation)
            }
        }
    }
}

fn committed(done: orca_lake::Result<EpochCommit>, generation: i32) -> Result<(), DestError> {
    match done.map_err(iceberg)? {
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
fn refresh_iceberg(
    tables: &SyncTables,
    store: &Store,
    shadow: &str,
    at: &EpochAt<'_>,
    staged: &[&Staged],
    r: Refresh,
) -> Result<(), DestError> {
    if tables.marker(at.dataset, at.sync).map_err(iceberg)? >= at.epoch {
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
fn hold_narrower(
    batch: arrow_array::RecordBatch,
    table: &arrow_schema::Schema,
) -> Result<(arrow_array::RecordBatch, Vec<crate::dest::postgres::Held>), DestError> {
    use arrow_array::cast::AsArray;
    use arrow_array::Array;
    let text = |a: &arrow_array::ArrayRef| {
        arrow_cast::cast(a, &arrow_schema::DataType::Utf8).map_err(DestError::from)
    };
    let ids = batch
        .column_by_name("_orca_id")
        .map(|c| c.as_string::<i32>().clone());
    let mut columns = batch.columns().to_vec();
    let mut held = Vec::new();
    for (i, f) in batch.schema().fields().iter().enumerate() {
        let Ok(t) = table.field_with_name(f.name()) else {
            continue;
        };
        if t.data_type() == f.data_type() {
            continue;
        }
        let c = batch.column(i);
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
            held.push(crate::dest::postgres::Held {
                column: f.name().clone(),
                orca_id: ids
                    .as_ref()
                    .map(|ids| ids.value(row).to_string())
                    .unwrap_or_default(),
                value: orig.value(row).to_string(),
                reason: "the Iceberg table's column is narrower than the stream's and cannot be widened so",
            });
        }
        columns[i] = arrow_select::nullif::nullif(c, &lost)?;
    }
    if held.is_empty() {
        return Ok((batch, held));
    }
    Ok((
        arrow_array::RecordBatch::try_new(batch.schema(), columns)?,
        held,
    ))
}

/// The batches of a stream's staged files, lane after lane.
fn read_all(
    staging: &Store,
    staged: &[&Staged],
) -> Result<Vec<arrow_array::RecordBatch>, DestError> {
    let mut out = Vec::new();
    for s in staged {
        out.extend(read_staged(staging, s)?);
    }
    Ok(out)
}

/// The batches of a staged Parquet file.
fn read_staged(staging: &Store, s: &Staged) -> Result<Vec<arrow_array::RecordBatch>, DestError> {
    read_parquet(staging, &s.path)
}

/// The batches of a Parquet file in a store.
fn read_parquet(store: &Store, path: &str) -> Result<Vec<arrow_array::RecordBatch>, DestError> {
    let data: Bytes = store.get(path)?.ok_or_else(|| DestError::StagedGone {
        path: store.url_of(path),
    })?;
    Ok(ParquetRecordBatchReaderBuilder::try_new(data)?
        .build()?
        .collect::<Result<Vec<_>, _>>()?)
}
