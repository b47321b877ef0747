//! Iceberg tables from steps: `table`, `ensure_table`, `scan`, `append`,
//! `write_files` and `commit`.
//!
//! The catalog lives in the control plane's Postgres, in the SQL-catalog
//! layout other Iceberg clients read (tables `iceberg_tables` and
//! `iceberg_namespace_properties`, catalog name = the org). Data and metadata
//! go under `ORCA_WAREHOUSE`: dataset `lake.clean` is table `clean` in
//! namespace `lake` at `<warehouse>/lake/clean`.
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
use std::sync::{Arc, Once, OnceLock};

use arrow_array::RecordBatch;
use arrow_schema::Schema as ArrowSchema;
use futures::TryStreamExt;
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_sql::{SqlBindStyle, SqlCatalog, SqlCatalogBuilder};
use parquet::file::properties::WriterProperties;

use crate::ctx::Ctx;
use crate::error::{Result, SdkError};

/// Where tables live: the catalog's database, the warehouse, the org.
#[derive(Debug, Clone)]
pub(crate) struct TablesConfig {
    pub catalog_url: Option<String>,
    pub warehouse: String,
    pub org: String,
}

impl TablesConfig {
    /// `ORCA_CATALOG_URL` (else the control plane's URL), `ORCA_WAREHOUSE`
    /// (else `./warehouse`; `s3://bucket/prefix` for S3, see `objstore`),
    /// `ORCA_ORG` (else `default`).
    pub fn from_env(database_url: Option<&str>) -> Self {
        let catalog_url = std::env::var("ORCA_CATALOG_URL")
            .ok()
            .or_else(|| database_url.map(str::to_string))
            .or_else(|| std::env::var("DATABASE_URL").ok());
        let warehouse = std::env::var("ORCA_WAREHOUSE").unwrap_or_else(|_| "warehouse".into());
        TablesConfig {
            catalog_url,
            warehouse: absolute_warehouse(&warehouse),
            org: std::env::var("ORCA_ORG").unwrap_or_else(|_| "default".into()),
        }
    }
}

/// A local warehouse path as a `file://` URL; URLs stay as they are.
fn absolute_warehouse(w: &str) -> String {
    if w.contains("://") {
        return w.to_string();
    }
    let p = std::path::Path::new(w);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    format!("file://{}", abs.display())
}

/// The catalog, opened on the first table operation of a run.
pub(crate) struct TablesCell {
    config: TablesConfig,
    cell: OnceLock<std::result::Result<Tables, String>>,
}

pub(crate) struct Tables {
    pub(crate) rt: tokio::runtime::Runtime,
    pub(crate) catalog: SqlCatalog,
    /// The catalog's database and name, for commits iceberg-rust cannot make.
    pub(crate) url: String,
    pub(crate) name: String,
}

impl TablesCell {
    pub fn new(config: TablesConfig) -> Self {
        TablesCell {
            config,
            cell: OnceLock::new(),
        }
    }

    pub(crate) fn get(&self) -> std::result::Result<&Tables, SdkError> {
        self.cell
            .get_or_init(|| open(&self.config).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| SdkError::Tables(e.clone()))
    }
}

pub(crate) fn open(config: &TablesConfig) -> std::result::Result<Tables, SdkError> {
    static DRIVERS: Once = Once::new();
    DRIVERS.call_once(sqlx::any::install_default_drivers);
    let url = config.catalog_url.clone().ok_or_else(|| {
        SdkError::Tables("no catalog: set ORCA_CATALOG_URL or DATABASE_URL".into())
    })?;
    if !config.warehouse.starts_with("file://") && !config.warehouse.starts_with("s3://") {
        return Err(SdkError::Tables(format!(
            "warehouse {} is neither a local path nor an s3:// URL (other object stores are not built yet)",
            config.warehouse
        )));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| SdkError::Tables(format!("cannot start the I/O runtime: {e}")))?;
    rt.block_on(catalog_tables(&url))
        .map_err(|e| SdkError::Tables(format!("cannot prepare the catalog tables: {e}")))?;
    let catalog = rt
        .block_on(
            SqlCatalogBuilder::default()
                .uri(url.clone())
                .warehouse_location(config.warehouse.clone())
                .sql_bind_style(SqlBindStyle::DollarNumeric)
                .with_storage_factory(Arc::new(crate::objstore::ObjectStoreFactory))
                // One pipeline binary needs few connections; many run at once.
                .prop("pool.max-connections", "2")
                .load(config.org.clone(), HashMap::new()),
        )
        .map_err(|e| SdkError::Tables(format!("cannot open the catalog: {e}")))?;
    Ok(Tables {
        rt,
        catalog,
        url,
        name: config.org.clone(),
    })
}

/// Creates the SQL catalog's two tables in the layout every client reads,
/// one creator at a time: two `CREATE TABLE IF NOT EXISTS` racing each other
/// fail, and a client that created them first (PyIceberg) leaves out the
/// `iceberg_type` column iceberg-rust reads (NULL means a table to both).
async fn catalog_tables(url: &str) -> std::result::Result<(), sqlx::Error> {
    use sqlx::Connection;
    let mut c = sqlx::AnyConnection::connect(url).await?;
    let mut tx = c.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('orca.iceberg_catalog'))")
        .execute(&mut *tx)
        .await?;
    for ddl in [
        "CREATE TABLE IF NOT EXISTS iceberg_tables (
            catalog_name VARCHAR(255) NOT NULL,
            table_namespace VARCHAR(255) NOT NULL,
            table_name VARCHAR(255) NOT NULL,
            metadata_location VARCHAR(1000),
            previous_metadata_location VARCHAR(1000),
            iceberg_type VARCHAR(5),
            PRIMARY KEY (catalog_name, table_namespace, table_name))",
        "ALTER TABLE iceberg_tables ADD COLUMN IF NOT EXISTS iceberg_type VARCHAR(5)",
        "CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
            catalog_name VARCHAR(255) NOT NULL,
            namespace VARCHAR(255) NOT NULL,
            property_key VARCHAR(255),
            property_value VARCHAR(1000),
            PRIMARY KEY (catalog_name, namespace, property_key))",
    ] {
        sqlx::query(ddl).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// A snapshot as a sensor's poll reports it.
pub(crate) use orca_core::api::SnapshotSeen;

impl TablesCell {
    /// The snapshots of a dataset newer than `since_ms`, oldest first, at most
    /// `max` of the newest; none when the table does not exist.
    pub fn snapshots_since(
        &self,
        dataset: &str,
        since_ms: i64,
        max: usize,
    ) -> std::result::Result<Vec<SnapshotSeen>, SdkError> {
        let t = self.get()?;
        let id = ident(dataset).map_err(|e| SdkError::Tables(e.to_string()))?;
        let exists =
            t.rt.block_on(t.catalog.table_exists(&id))
                .map_err(|e| SdkError::Tables(e.to_string()))?;
        if !exists {
            return Ok(Vec::new());
        }
        let table =
            t.rt.block_on(t.catalog.load_table(&id))
                .map_err(|e| SdkError::Tables(format!("table {dataset} cannot be loaded: {e}")))?;
        let mut seen: Vec<SnapshotSeen> = table
            .metadata()
            .snapshots()
            .filter(|s| s.timestamp_ms() > since_ms)
            .map(|s| {
                let p = &s.summary().additional_properties;
                SnapshotSeen {
                    dataset: dataset.to_string(),
                    snapshot: s.snapshot_id(),
                    timestamp_ms: s.timestamp_ms(),
                    partitions: p.get("orca.partitions").cloned(),
                    orca_run: p.get("orca.run").cloned(),
                }
            })
            .collect();
        seen.sort_by_key(|s| s.timestamp_ms);
        let skip = seen.len().saturating_sub(max);
        Ok(seen.split_off(skip))
    }
}

/// The keys of a keyed pipeline, as read from its dataset.
#[derive(Debug, Clone, Default)]
pub struct KeysRead {
    /// The snapshot read; `None` when the table has none (or does not exist).
    pub snapshot: Option<i64>,
    pub timestamp_ms: Option<i64>,
    /// The column's distinct values, sorted; nulls are left out.
    pub keys: Vec<String>,
}

impl TablesCell {
    /// The distinct values of `column` in the current snapshot of `dataset`,
    /// each checked to be a key. A table that does not exist has no keys.
    pub fn read_keys(
        &self,
        dataset: &str,
        column: &str,
    ) -> std::result::Result<KeysRead, SdkError> {
        let t = self.get()?;
        let id = ident(dataset).map_err(|e| SdkError::Tables(e.to_string()))?;
        let exists =
            t.rt.block_on(t.catalog.table_exists(&id))
                .map_err(|e| SdkError::Tables(e.to_string()))?;
        if !exists {
            return Ok(KeysRead::default());
        }
        let table =
            t.rt.block_on(t.catalog.load_table(&id))
                .map_err(|e| SdkError::Tables(format!("table {dataset} cannot be loaded: {e}")))?;
        let Some(snap) = table.metadata().current_snapshot() else {
            return Ok(KeysRead::default());
        };
        let (snapshot, timestamp_ms) = (snap.snapshot_id(), snap.timestamp_ms());
        if table
            .metadata()
            .current_schema()
            .field_by_name(column)
            .is_none()
        {
            return Err(SdkError::Tables(format!(
                "table {dataset} has no column {column}, which the pipeline takes its keys from"
            )));
        }
        let batches: Vec<RecordBatch> =
            t.rt.block_on(async {
                table
                    .scan()
                    .snapshot_id(snapshot)
                    .select([column])
                    .build()?
                    .to_arrow()
                    .await?
                    .try_collect()
                    .await
            })
            .map_err(|e: iceberg::Error| {
                SdkError::Tables(format!("reading {dataset}.{column}: {e}"))
            })?;
        let mut keys = std::collections::BTreeSet::new();
        for b in &batches {
            let col =
                arrow_cast::cast(b.column(0), &arrow_schema::DataType::Utf8).map_err(|e| {
                    SdkError::Tables(format!(
                        "{dataset}.{column} cannot be read as text for keys: {e}"
                    ))
                })?;
            let Some(text) = col.as_any().downcast_ref::<arrow_array::StringArray>() else {
                return Err(SdkError::Tables(format!(
                    "{dataset}.{column} did not read as text"
                )));
            };
            for v in text.iter().flatten() {
                if !keys.contains(v) {
                    orca_core::keyed::check_key(v).map_err(|e| {
                        SdkError::Tables(format!("{dataset}.{column} at snapshot {snapshot}: {e}"))
                    })?;
                    keys.insert(v.to_string());
                }
            }
        }
        Ok(KeysRead {
            snapshot: Some(snapshot),
            timestamp_ms: Some(timestamp_ms),
            keys: keys.into_iter().collect(),
        })
    }
}

/// A table, known by its dataset name.
pub struct Table {
    dataset: String,
    pub(crate) ident: TableIdent,
    pub(crate) inner: iceberg::table::Table,
}

impl Table {
    pub(crate) fn new(dataset: &str, ident: TableIdent, inner: iceberg::table::Table) -> Table {
        Table {
            dataset: dataset.to_string(),
            ident,
            inner,
        }
    }

    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    /// The table's current snapshot when it was loaded.
    pub fn current_snapshot(&self) -> Option<i64> {
        self.inner
            .metadata()
            .current_snapshot()
            .map(|s| s.snapshot_id())
    }

    /// Where its data and metadata live.
    pub fn location(&self) -> &str {
        self.inner.metadata().location()
    }

    /// Its schema, as Arrow sees it.
    pub fn arrow_schema(&self) -> Result<Arc<ArrowSchema>> {
        Ok(Arc::new(iceberg::arrow::schema_to_arrow_schema(
            self.inner.metadata().current_schema(),
        )?))
    }
}

pub(crate) fn ident(dataset: &str) -> Result<TableIdent> {
    if !orca_core::manifest::valid_dataset(dataset) {
        return Err(
            format!("{dataset:?} is not a dataset: write namespace.table in lowercase").into(),
        );
    }
    let (ns, t) = dataset.split_once('.').unwrap_or_default();
    Ok(TableIdent::new(
        NamespaceIdent::new(ns.to_string()),
        t.to_string(),
    ))
}

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
    let t = ctx.io.tables.get()?;
    let id = ident(dataset)?;
    let inner =
        t.rt.block_on(t.catalog.load_table(&id))
            .map_err(|e| format!("table {dataset} cannot be loaded: {e}"))?;
    Ok(Table {
        dataset: dataset.to_string(),
        ident: id,
        inner,
    })
}

/// Loads a table the step writes, creating it (and its namespace) with this
/// schema if it does not exist. An existing table must have these columns.
pub fn ensure_table(ctx: &mut Ctx<'_>, dataset: &str, schema: &ArrowSchema) -> Result<Table> {
    declared(ctx, dataset, false)?;
    let t = ctx.io.tables.get()?;
    create_or_load(t, dataset, schema)
}

/// Loads a table, creating it (and its namespace) with this schema if it
/// does not exist; an existing table must have these columns.
pub(crate) fn create_or_load(t: &Tables, dataset: &str, schema: &ArrowSchema) -> Result<Table> {
    let id = ident(dataset)?;
    let inner = t.rt.block_on(async {
        if !t.catalog.namespace_exists(id.namespace()).await? {
            // Another writer may create it at the same moment.
            if let Err(e) = t
                .catalog
                .create_namespace(id.namespace(), HashMap::new())
                .await
            {
                if !t.catalog.namespace_exists(id.namespace()).await? {
                    return Err(e);
                }
            }
        }
        if t.catalog.table_exists(&id).await? {
            return t.catalog.load_table(&id).await;
        }
        let ice = iceberg::arrow::arrow_schema_to_schema_auto_assign_ids(schema)?;
        let creation = TableCreation::builder()
            .name(id.name().to_string())
            .schema(ice)
            .build();
        match t.catalog.create_table(id.namespace(), creation).await {
            Ok(table) => Ok(table),
            Err(e) if t.catalog.table_exists(&id).await.unwrap_or(false) => {
                let _ = e;
                t.catalog.load_table(&id).await
            }
            Err(e) => Err(e),
        }
    });
    let inner = inner.map_err(|e| format!("table {dataset} cannot be created: {e}"))?;
    let table = Table {
        dataset: dataset.to_string(),
        ident: id,
        inner,
    };
    let have = table.arrow_schema()?;
    for f in schema.fields() {
        match have.field_with_name(f.name()) {
            Ok(h) if same_type(h.data_type(), f.data_type()) => {}
            Ok(h) => {
                return Err(format!(
                    "table {dataset} exists and its column {} is {}, not {}",
                    f.name(),
                    h.data_type(),
                    f.data_type()
                )
                .into())
            }
            Err(_) => {
                return Err(format!("table {dataset} exists without column {}", f.name()).into())
            }
        }
    }
    Ok(table)
}

/// Whether a column of type `have` takes values of type `want` as they are:
/// the same type, or one Iceberg stores the same way (int16 in an int
/// column, a UTC timestamp under either spelling of its zone).
fn same_type(have: &arrow_schema::DataType, want: &arrow_schema::DataType) -> bool {
    use arrow_schema::DataType as D;
    let utc = |tz: &Option<Arc<str>>| matches!(tz.as_deref(), Some("UTC" | "+00:00"));
    match (have, want) {
        (D::Timestamp(u1, z1), D::Timestamp(u2, z2)) => {
            u1 == u2 && (z1 == z2 || (utc(z1) && utc(z2)))
        }
        (D::Int32, D::Int16) => true,
        _ => have == want,
    }
}

/// The table as it is now, and the snapshot pinned for this (run, step,
/// partition): the current one on the first read, the same one after.
fn pinned(ctx: &mut Ctx<'_>, table: &Table) -> Result<(iceberg::table::Table, Option<i64>)> {
    declared(ctx, &table.dataset, true)?;
    let t = ctx.io.tables.get()?;
    // The table as it is now: a pinned snapshot may be newer than the handle.
    let fresh =
        t.rt.block_on(t.catalog.load_table(&table.ident))
            .map_err(|e| format!("table {} cannot be loaded: {e}", table.dataset))?;
    let current = fresh.metadata().current_snapshot().map(|s| s.snapshot_id());
    let pinned = ctx
        .io
        .store
        .pin_read(ctx.step, &ctx.partition, &table.dataset, current)?;
    ctx.io.read.insert(table.dataset.clone(), pinned);
    if let Some(snapshot) = pinned {
        if fresh.metadata().snapshot_by_id(snapshot).is_none() {
            return Err(format!(
                "table {} no longer has snapshot {snapshot}, which this run read first (expired?)",
                table.dataset
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
    let t = ctx.io.tables.get()?;
    live_data_files(t, &fresh, &snapshot)
}

/// The data files a snapshot of a table holds.
pub(crate) fn live_data_files(
    t: &Tables,
    table: &iceberg::table::Table,
    snapshot: &iceberg::spec::SnapshotRef,
) -> Result<Vec<DataFile>> {
    let files = t.rt.block_on(async {
        let list = table.manifest_list_reader(snapshot).load().await?;
        let mut out = Vec::new();
        for mf in list.entries() {
            if mf.content != iceberg::spec::ManifestContentType::Data {
                continue;
            }
            let m = mf.load_manifest(table.file_io()).await?;
            out.extend(
                m.entries()
                    .iter()
                    .filter(|e| e.is_alive())
                    .map(|e| e.data_file().clone()),
            );
        }
        Ok::<_, iceberg::Error>(out)
    })?;
    Ok(files)
}

/// Reads the table at the snapshot pinned for this (run, step, partition).
pub fn scan(ctx: &mut Ctx<'_>, table: &Table) -> Result<Vec<RecordBatch>> {
    let (fresh, pinned) = pinned(ctx, table)?;
    let Some(snapshot) = pinned else {
        return Ok(Vec::new());
    };
    let t = ctx.io.tables.get()?;
    let batches: Vec<RecordBatch> = t.rt.block_on(async {
        fresh
            .scan()
            .snapshot_id(snapshot)
            .build()?
            .to_arrow()
            .await?
            .try_collect()
            .await
    })?;
    Ok(batches)
}

/// Writes batches as Parquet data files of the table, not yet committed
/// (for `commit`). Each file name is unique to the run, step, partition and
/// attempt, so a retry never overwrites a committed file.
pub fn write_files(
    ctx: &mut Ctx<'_>,
    table: &Table,
    batches: Vec<RecordBatch>,
) -> Result<Vec<DataFile>> {
    declared(ctx, &table.dataset, false)?;
    let t = ctx.io.tables.get()?;
    let schema = table.arrow_schema()?;
    let batches: Vec<RecordBatch> = batches
        .into_iter()
        .map(|b| {
            RecordBatch::try_new(schema.clone(), b.columns().to_vec()).map_err(|e| {
                format!(
                    "batch does not fit table {} ({e}); its columns are {:?}",
                    table.dataset,
                    schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
                )
            })
        })
        .collect::<std::result::Result<_, _>>()?;
    let prefix = format!(
        "orca-{}-{}-{}-{}-{}",
        ctx.run
            .map_or_else(|| "local".to_string(), |r| r.to_string()),
        ctx.step,
        ctx.partition.replace(['*', '/'], "all"),
        ctx.attempt,
        uuid::Uuid::new_v4().simple()
    );
    write_data_files(t, table, batches, prefix)
}

/// Writes batches that fit the table's schema as Parquet data files whose
/// names start with `prefix`.
pub(crate) fn write_data_files(
    t: &Tables,
    table: &Table,
    batches: Vec<RecordBatch>,
    prefix: String,
) -> Result<Vec<DataFile>> {
    let meta = table.inner.metadata();
    let files = t.rt.block_on(async {
        let location = DefaultLocationGenerator::new(meta)?;
        let names = DefaultFileNameGenerator::new(prefix, None, DataFileFormat::Parquet);
        let parquet =
            ParquetWriterBuilder::new(WriterProperties::default(), meta.current_schema().clone());
        let rolling = RollingFileWriterBuilder::new_with_default_file_size(
            parquet,
            table.inner.file_io().clone(),
            location,
            names,
        );
        let mut writer = DataFileWriterBuilder::new(rolling).build(None).await?;
        for b in batches {
            writer.write(b).await?;
        }
        writer.close().await
    })?;
    Ok(files)
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
fn own_commit(ctx: &Ctx<'_>, table: &iceberg::table::Table, commit_no: u32) -> Option<i64> {
    let run = ctx.run?.to_string();
    let n = commit_no.to_string();
    table.metadata().snapshots().find_map(|s| {
        let p = &s.summary().additional_properties;
        let is = |k: &str, v: &str| p.get(k).map(String::as_str) == Some(v);
        (is("orca.run", &run)
            && is("orca.step", ctx.step)
            && is("orca.partition", &ctx.partition)
            && is("orca.commit", &n))
        .then(|| s.snapshot_id())
    })
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
    declared(ctx, &table.dataset, false)?;
    let rewrite = match operation {
        "append" if removed.is_empty() => None,
        "append" => {
            return Err(format!(
                "commit to {}: an append removes no files; use replace, overwrite or delete",
                table.dataset
            )
            .into())
        }
        other => {
            let op = crate::rewrite::operation(other).ok_or_else(|| {
                format!(
                    "commit to {}: unknown operation '{other}' (append, replace, overwrite or delete)",
                    table.dataset
                )
            })?;
            crate::rewrite::check(&table.dataset, &op, &added, &removed)?;
            Some(op)
        }
    };
    let n = {
        let c = ctx.io.commits.entry(table.dataset.clone()).or_insert(0);
        *c += 1;
        *c
    };
    let t = ctx.io.tables.get()?;
    let fresh =
        t.rt.block_on(t.catalog.load_table(&table.ident))
            .map_err(|e| format!("table {} cannot be loaded: {e}", table.dataset))?;
    let snapshot = match (own_commit(ctx, &fresh, n), rewrite) {
        (Some(id), _) => {
            ctx.log(format!(
                "{} already has snapshot {id} from this step's commit {n} in run {}: not committing again",
                table.dataset,
                ctx.run.unwrap_or_default()
            ));
            id
        }
        (None, Some(op)) => crate::rewrite::commit(
            t,
            &table.ident,
            &table.dataset,
            fresh,
            &crate::rewrite::Change {
                added,
                removed,
                op,
                props: properties(ctx, n),
                table_props: HashMap::new(),
            },
        )?,
        (None, None) => {
            let props = properties(ctx, n);
            // The SQL catalog swaps the metadata pointer with a compare-and-swap;
            // a concurrent commit makes the transaction retry on the new state.
            let committed = t.rt.block_on(async {
                let tx = Transaction::new(&fresh);
                let action = tx
                    .fast_append()
                    .add_data_files(added)
                    .set_snapshot_properties(props);
                action.apply(tx)?.commit(&t.catalog).await
            })?;
            committed
                .metadata()
                .current_snapshot()
                .map(|s| s.snapshot_id())
                .ok_or_else(|| format!("commit to {} made no snapshot", table.dataset))?
        }
    };
    fault_point("after-table-commit");
    ctx.io.store.record_commit(
        ctx.step,
        &ctx.partition,
        &table.dataset,
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
    declared(ctx, &table.dataset, false)?;
    // Look before writing: a retry after a commit the control plane never
    // heard of must not write the files again.
    let next = ctx.io.commits.get(&table.dataset).copied().unwrap_or(0) + 1;
    let t = ctx.io.tables.get()?;
    let fresh =
        t.rt.block_on(t.catalog.load_table(&table.ident))
            .map_err(|e| format!("table {} cannot be loaded: {e}", table.dataset))?;
    let files = if own_commit(ctx, &fresh, next).is_some() {
        Vec::new()
    } else {
        write_files(ctx, table, batches)?
    };
    commit(ctx, table, files, Vec::new(), "append")
}
