//! Iceberg tables as a sync's destination (for `orca-engine`).
//!
//! Lane 0 commits epoch N of a stream as one snapshot whose summary carries
//! the stream marker: `orca.sync` (the sync), `orca.sync.stream`,
//! `orca.sync.epoch` = N and `orca.sync.generation`. The marker makes the
//! commit idempotent (an epoch at or below the table's marker is applied
//! already; the same commit also sets table property `orca.sync.<sync>.epoch`,
//! so the marker outlives snapshot expiry), and the fence, table property `orca.sync.<sync>.fence`, which
//! each attempt raises to its generation before it recovers, refuses a
//! commit from an older attempt.

use std::collections::HashMap;

use arrow_array::RecordBatch;
use arrow_schema::Schema as ArrowSchema;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::Catalog;

use crate::error::Result;
use crate::tables::{self, Table, Tables, TablesConfig};

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

/// The catalog, opened for a sync.
pub struct SyncTables {
    t: Tables,
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
        let mut config = TablesConfig::from_env(Some(database_url));
        config.org = org.to_string();
        Ok(SyncTables {
            t: tables::open(&config)?,
        })
    }

    /// Creates the table (and its namespace) with this schema unless it
    /// exists; an existing table must have these columns.
    pub fn ensure(&self, dataset: &str, schema: &ArrowSchema) -> Result<()> {
        tables::create_or_load(&self.t, dataset, schema).map(|_| ())
    }

    fn load(&self, dataset: &str) -> Result<Table> {
        let id = tables::ident(dataset)?;
        let inner = self
            .t
            .rt
            .block_on(self.t.catalog.load_table(&id))
            .map_err(|e| format!("table {dataset} cannot be loaded: {e}"))?;
        Ok(Table::new(dataset, id, inner))
    }

    /// The last epoch of `sync` the table holds (0: none).
    pub fn marker(&self, dataset: &str, sync: &str) -> Result<u64> {
        Ok(marker_of(&self.load(dataset)?, sync))
    }

    /// Raises the table's fence for `sync` to `generation`; `Fenced` when a
    /// newer generation raised it already.
    pub fn raise_fence(&self, dataset: &str, sync: &str, generation: i32) -> Result<EpochCommit> {
        let table = self.load(dataset)?;
        let fence = fence_of(&table, sync);
        if fence > generation {
            return Ok(EpochCommit::Fenced { fence });
        }
        if fence == generation {
            return Ok(EpochCommit::AlreadyApplied);
        }
        self.t.rt.block_on(async {
            let tx = Transaction::new(&table.inner);
            let action = tx
                .update_table_properties()
                .set(fence_key(sync), generation.to_string());
            action.apply(tx)?.commit(&self.t.catalog).await
        })?;
        Ok(EpochCommit::Committed { snapshot: 0 })
    }

    /// Appends a stream's epoch as one snapshot with its marker, unless the
    /// table holds it already or the fence is newer than `generation`.
    pub fn append_epoch(
        &self,
        dataset: &str,
        sync: &str,
        stream: &str,
        generation: i32,
        epoch: u64,
        batches: Vec<RecordBatch>,
    ) -> Result<EpochCommit> {
        let table = self.load(dataset)?;
        let fence = fence_of(&table, sync);
        if fence > generation {
            return Ok(EpochCommit::Fenced { fence });
        }
        if marker_of(&table, sync) >= epoch {
            return Ok(EpochCommit::AlreadyApplied);
        }
        let schema = table.arrow_schema()?;
        let batches = batches
            .into_iter()
            .map(|b| fit(&schema, dataset, b))
            .collect::<Result<Vec<_>>>()?;
        let prefix = format!(
            "orca-sync-{sync}-e{epoch}-g{generation}-{}",
            uuid::Uuid::new_v4().simple()
        );
        let files = tables::write_data_files(&self.t, &table, batches, prefix)?;
        let props = HashMap::from([
            ("orca.sync".to_string(), sync.to_string()),
            ("orca.sync.stream".to_string(), stream.to_string()),
            ("orca.sync.epoch".to_string(), epoch.to_string()),
            ("orca.sync.generation".to_string(), generation.to_string()),
        ]);
        let committed = self.t.rt.block_on(async {
            let tx = Transaction::new(&table.inner);
            let append = tx
                .fast_append()
                .add_data_files(files)
                .set_snapshot_properties(props);
            let tx = append.apply(tx)?;
            let marker = tx
                .update_table_properties()
                .set(epoch_key(sync), epoch.to_string());
            marker.apply(tx)?.commit(&self.t.catalog).await
        })?;
        let snapshot = committed
            .metadata()
            .current_snapshot()
            .map(|s| s.snapshot_id())
            .ok_or_else(|| format!("commit to {dataset} made no snapshot"))?;
        Ok(EpochCommit::Committed { snapshot })
    }
}

fn marker_of(table: &Table, sync: &str) -> u64 {
    let kept: u64 = table
        .inner
        .metadata()
        .properties()
        .get(&epoch_key(sync))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let seen = table
        .inner
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

fn fence_of(table: &Table, sync: &str) -> i32 {
    table
        .inner
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
