//! The destinations a sync writes, behind one face: raise the fence, read a
//! stream's marker, apply a stream's staged epoch.
//!
//! - `parquet`: files under a URL ([`crate::dest::parquet`]);
//! - `postgres`: tables `{schema}.{stream}` ([`crate::dest::postgres`]);
//! - `iceberg`: table `{namespace}.{stream}` in the org's catalog, each epoch
//!   one snapshot whose summary carries the stream marker
//!   (`orca_lake::sync_tables`; [`crate::dest::iceberg`]).

use std::collections::HashMap;

use orca_core::delivery::WriteMode;
use orca_core::sync::{Destination, Stream};
use orca_lake::sync_tables::{EpochAt, EpochCommit, SyncTables, Write};
use orca_lake::{describe_fields, PartitionField, TableSpec};

use crate::commit::record::{Layout, Refresh, Staged};
use crate::commit::store::Store;
use crate::dest::connector::ConnectorDest;
use crate::dest::error::DestError;
use crate::dest::held::Held;
use crate::dest::iceberg::{committed, hold_narrower, iceberg_error, refresh_iceberg};
use crate::dest::parquet::ParquetDest;
use crate::dest::postgres::{self, PgDest, StreamMode};
use crate::dest::staged::read_all;
use crate::netguard::Guard;
use crate::source::postgres::table::{self, PgTable};

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
        /// Each stream's partitioning, for a table not made yet.
        partitions: HashMap<String, Vec<PartitionField>>,
        /// The sync's folder in its store (`{org}/{sync}`): a refresh keeps
        /// its epochs' files under `_refresh/{stream}/` there until it ends.
        root: String,
    },
    Connector {
        conn: ConnectorDest,
        modes: HashMap<String, WriteMode>,
    },
}

fn unresolved(e: orca_core::secret::SecretError) -> DestError {
    DestError::Definition(e.to_string())
}

impl Dest {
    /// Opens the destination a definition names; Iceberg tables are created
    /// with the streams' destination schemas if they do not exist.
    pub fn open(
        destination: &Destination,
        guard: &Guard,
        database_url: &str,
        org: &str,
        sync: &str,
        tables: &[PgTable],
        streams: &[Stream],
    ) -> Result<Dest, DestError> {
        match destination {
            Destination::Parquet { url, .. } => {
                let url = url.plain().map_err(unresolved)?;
                guard.place(url)?;
                Ok(Dest::Parquet(ParquetDest {
                    store: Store::open(url)?,
                }))
            }
            Destination::Postgres { url, schema, .. } => {
                let modes = streams
                    .iter()
                    .map(|s| {
                        let mode = StreamMode {
                            merge: s.mode == WriteMode::Merge,
                            overwrite: s.mode == WriteMode::Overwrite,
                            primary_key: s.primary_key.clone(),
                        };
                        (s.name.clone(), mode)
                    })
                    .collect();
                Ok(Dest::Postgres {
                    pg: PgDest::open(
                        guard,
                        url.plain().map_err(unresolved)?,
                        schema.as_deref().unwrap_or("public"),
                        sync,
                    )?,
                    modes,
                })
            }
            Destination::Connector {
                connector,
                commits,
                config,
                timeout_seconds,
            } => Ok(Dest::Connector {
                conn: ConnectorDest::open(
                    connector,
                    *commits,
                    config,
                    *timeout_seconds,
                    guard,
                    sync,
                    streams,
                )?,
                modes: streams.iter().map(|s| (s.name.clone(), s.mode)).collect(),
            }),
            Destination::Iceberg { namespace, .. } => {
                let sync_tables = SyncTables::open(database_url, org).map_err(iceberg_error)?;
                let partitions: HashMap<String, Vec<PartitionField>> = streams
                    .iter()
                    .map(|s| {
                        let fields = s.partition_by.iter().flatten().map(PartitionField::from);
                        (s.name.clone(), fields.collect())
                    })
                    .collect();
                for t in tables {
                    let dataset = format!("{namespace}.{}", t.spec.name);
                    let fields = partitions.get(&t.spec.name).map_or(&[][..], Vec::as_slice);
                    let spec = TableSpec::new(table::destination_schema(t)).partitioned(fields);
                    sync_tables.ensure(&dataset, spec).map_err(iceberg_error)?;
                }
                let merge_keys = streams
                    .iter()
                    .filter(|s| s.mode == WriteMode::Merge)
                    .map(|s| (s.name.clone(), s.primary_key.clone()))
                    .collect();
                Ok(Dest::Iceberg {
                    tables: sync_tables,
                    namespace: namespace.clone(),
                    sync: sync.to_string(),
                    merge_keys,
                    partitions,
                    root: Layout::new(org, sync).root,
                })
            }
        }
    }

    /// The Iceberg tables made before with another partitioning than their
    /// stream now declares (a table keeps the one it was made with): each
    /// stream's, the table's and the declared one, as Iceberg writes them.
    /// A table that cannot be looked at now is left to the epochs to find.
    pub fn partitioning_drift(&self) -> Vec<(String, String, String)> {
        let Dest::Iceberg {
            tables,
            namespace,
            partitions,
            ..
        } = self
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (stream, fields) in partitions {
            let declared = describe_fields(fields);
            if let Ok(Some(have)) = tables.partitioning(&format!("{namespace}.{stream}")) {
                if have != declared {
                    out.push((stream.clone(), have, declared));
                }
            }
        }
        out.sort();
        out
    }

    pub fn raise_fence(&mut self, generation: i32, streams: &[String]) -> Result<(), DestError> {
        match self {
            Dest::Parquet(p) => p.raise_fence(generation),
            Dest::Postgres { pg, .. } => pg.raise_fence(generation),
            Dest::Connector { conn, .. } => conn.raise_fence(generation),
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
                        .map_err(iceberg_error)?
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
    ) -> Result<(arrow_array::RecordBatch, Vec<Held>), DestError> {
        match self {
            Dest::Postgres { .. } => postgres::hold(batch),
            Dest::Parquet(_) | Dest::Connector { .. } => Ok((batch, Vec::new())),
            Dest::Iceberg {
                tables,
                namespace,
                partitions,
                ..
            } => {
                let fields = partitions.get(stream).map_or(&[][..], Vec::as_slice);
                let have = tables
                    .fit_columns(&format!("{namespace}.{stream}"), &batch.schema(), fields)
                    .map_err(iceberg_error)?;
                hold_narrower(batch, &have)
            }
        }
    }

    /// The last epoch applied to a stream.
    pub fn marker(&mut self, stream: &str) -> Result<u64, DestError> {
        match self {
            Dest::Parquet(p) => p.marker(stream),
            Dest::Postgres { pg, .. } => pg.marker(stream),
            Dest::Connector { conn, .. } => conn.marker(stream),
            Dest::Iceberg {
                tables,
                namespace,
                sync,
                ..
            } => tables
                .marker(&format!("{namespace}.{stream}"), sync)
                .map_err(iceberg_error),
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
            Dest::Connector { conn, modes } => {
                // The definition refuses overwrite for connectors: there is
                // no refresh to apply.
                let batches = read_all(staging, staged)?;
                let mode = modes.get(stream).copied().unwrap_or(WriteMode::Append);
                conn.commit(generation, epoch, stream, &batches, mode)
            }
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
                ..
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
