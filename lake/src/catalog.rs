//! Where tables live: the SQL catalog in the control plane's Postgres and the
//! warehouse their files go to.
//!
//! The catalog is the SQL-catalog layout every Iceberg client reads (tables
//! `iceberg_tables` and `iceberg_namespace_properties`, created by the orca
//! extension, `sql/catalog.sql`), with catalog name = the org. Data and
//! metadata go under the warehouse: dataset `lake.clean` is table `clean` in
//! namespace `lake` at `<warehouse>/lake/clean`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Once, OnceLock};

use futures::TryStreamExt;
use iceberg::{Catalog, CatalogBuilder, MetadataLocation, NamespaceIdent, TableIdent};
use iceberg_catalog_sql::{SqlBindStyle, SqlCatalog, SqlCatalogBuilder};
use orca_core::api::SnapshotSeen;

use crate::{LakeError, Result};

/// Where tables live: the catalog's database, the warehouse, the org.
#[derive(Debug, Clone)]
pub struct LakeConfig {
    pub catalog_url: Option<String>,
    pub warehouse: String,
    pub org: String,
    /// The attempt's lease (`ORCA_LEASE`): the catalog shows a session that
    /// presents it its attempt's org only (docs/security.md).
    pub lease: Option<String>,
}

impl LakeConfig {
    /// `ORCA_CATALOG_URL` (else the control plane's URL, else
    /// `DATABASE_URL`), `ORCA_WAREHOUSE` (else `./warehouse`;
    /// `s3://bucket/prefix` for S3, see [`crate::objstore`]), `ORCA_ORG` (else
    /// `default`), `ORCA_LEASE`.
    pub fn from_env(database_url: Option<&str>) -> Self {
        let catalog_url = std::env::var("ORCA_CATALOG_URL")
            .ok()
            .or_else(|| database_url.map(str::to_string))
            .or_else(|| std::env::var("DATABASE_URL").ok());
        let warehouse = std::env::var("ORCA_WAREHOUSE").unwrap_or_else(|_| "warehouse".into());
        LakeConfig {
            catalog_url,
            warehouse: absolute_warehouse(&warehouse),
            org: std::env::var("ORCA_ORG").unwrap_or_else(|_| "default".into()),
            lease: std::env::var("ORCA_LEASE").ok().filter(|l| !l.is_empty()),
        }
    }

    /// Where this org's tables go: `<warehouse>/<org>`, so that no org's
    /// files land among another's.
    pub fn org_warehouse(&self) -> String {
        format!("{}/{}", self.warehouse.trim_end_matches('/'), self.org)
    }

    /// The catalog URL with the lease as a session setting (`orca.lease`),
    /// sent in the connection's startup packet.
    pub fn session_url(&self) -> Option<String> {
        let url = self.catalog_url.clone()?;
        let Some(lease) = &self.lease else {
            return Some(url);
        };
        // A lease is a UUID: nothing in it needs escaping but the option's
        // own "-c name=value" syntax.
        if !lease.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Some(url);
        }
        let sep = if url.contains('?') { '&' } else { '?' };
        Some(format!("{url}{sep}options=-c%20orca.lease%3D{lease}"))
    }
}

/// A local warehouse path as a `file://` URL; URLs stay as they are.
pub fn absolute_warehouse(w: &str) -> String {
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

/// The catalog, opened by the first table operation of a process.
pub struct LakeCell {
    config: LakeConfig,
    cell: OnceLock<std::result::Result<Lake, String>>,
}

impl LakeCell {
    pub fn new(config: LakeConfig) -> Self {
        LakeCell {
            config,
            cell: OnceLock::new(),
        }
    }

    pub fn get(&self) -> Result<&Lake> {
        self.cell
            .get_or_init(|| Lake::open(&self.config).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| LakeError::Config(e.clone()))
    }
}

/// An open catalog, with the runtime its I/O runs on.
pub struct Lake {
    pub rt: tokio::runtime::Runtime,
    pub catalog: SqlCatalog,
    /// The catalog's database and name, for commits iceberg-rust cannot make.
    pub url: String,
    pub name: String,
}

impl Lake {
    pub fn open(config: &LakeConfig) -> Result<Lake> {
        static DRIVERS: Once = Once::new();
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let url = config.session_url().ok_or_else(|| {
            LakeError::Config("no catalog: set ORCA_CATALOG_URL or DATABASE_URL".into())
        })?;
        if !config.warehouse.starts_with("file://") && !config.warehouse.starts_with("s3://") {
            return Err(LakeError::Config(format!(
                "warehouse {} is neither a local path nor an s3:// URL (other object stores are not built yet)",
                config.warehouse
            )));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| LakeError::Config(format!("cannot start the I/O runtime: {e}")))?;
        let catalog = rt
            .block_on(
                SqlCatalogBuilder::default()
                    .uri(url.clone())
                    .warehouse_location(config.org_warehouse())
                    .sql_bind_style(SqlBindStyle::DollarNumeric)
                    .with_storage_factory(Arc::new(crate::objstore::ObjectStoreFactory))
                    // One process needs few connections; many run at once.
                    .prop("pool.max-connections", "2")
                    .load(config.org.clone(), HashMap::new()),
            )
            .map_err(|e| {
                LakeError::Config(format!(
                    "cannot open the catalog (is the orca extension, which makes its tables, \
                     installed in that database?): {e}"
                ))
            })?;
        Ok(Lake {
            rt,
            catalog,
            url,
            name: config.org.clone(),
        })
    }

    /// Whether a table exists.
    pub fn exists(&self, id: &TableIdent) -> Result<bool> {
        self.rt
            .block_on(self.catalog.table_exists(id))
            .map_err(LakeError::iceberg(format!("looking up table {id}")))
    }

    /// Loads a table as it is now.
    pub fn load(&self, id: &TableIdent) -> Result<iceberg::table::Table> {
        self.rt
            .block_on(self.catalog.load_table(id))
            .map_err(LakeError::iceberg(format!("table {id} cannot be loaded")))
    }

    /// Points the catalog at the new metadata `next` if nobody else moved it
    /// since `table` was loaded (a compare-and-swap, as the SQL catalog does
    /// for its own commits). Returns whether it did.
    pub async fn swap(
        &self,
        ident: &TableIdent,
        table: &iceberg::table::Table,
        next: &MetadataLocation,
    ) -> Result<bool> {
        use sqlx::Connection;
        let old = table
            .metadata_location_result()
            .map_err(LakeError::iceberg(format!("table {ident}")))?;
        let mut c = sqlx::PgConnection::connect(&self.url)
            .await
            .map_err(|e| LakeError::Config(format!("connecting to the catalog: {e}")))?;
        let done = sqlx::query(
            "UPDATE iceberg_tables SET metadata_location = $1, previous_metadata_location = $2 \
             WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5 \
               AND metadata_location = $2 AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)",
        )
        .bind(next.to_string())
        .bind(old)
        .bind(&self.name)
        .bind(ident.namespace().join("."))
        .bind(ident.name())
        .execute(&mut c)
        .await
        .map_err(|e| LakeError::Table(format!("swapping the metadata pointer of {ident}: {e}")))?;
        Ok(done.rows_affected() == 1)
    }

    /// The snapshots of a dataset newer than `since_ms`, oldest first, at
    /// most `max` of the newest; none when the table does not exist.
    pub fn snapshots_since(
        &self,
        dataset: &str,
        since_ms: i64,
        max: usize,
    ) -> Result<Vec<SnapshotSeen>> {
        let id = ident(dataset)?;
        if !self.exists(&id)? {
            return Ok(Vec::new());
        }
        let table = self.load(&id)?;
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

    /// The distinct values of `column` in the current snapshot of
    /// `dataset`, each checked to be a key. A table that does not exist has
    /// no keys.
    pub fn read_keys(&self, dataset: &str, column: &str) -> Result<KeysRead> {
        let id = ident(dataset)?;
        if !self.exists(&id)? {
            return Ok(KeysRead::default());
        }
        let table = self.load(&id)?;
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
            return Err(LakeError::Table(format!(
                "table {dataset} has no column {column}, which the pipeline takes its keys from"
            )));
        }
        // The column streams a batch at a time: memory holds the keys, not
        // the table.
        let what = || LakeError::iceberg(format!("reading {dataset}.{column}"));
        let mut batches = self
            .rt
            .block_on(async {
                table
                    .scan()
                    .snapshot_id(snapshot)
                    .select([column])
                    .build()?
                    .to_arrow()
                    .await
            })
            .map_err(what())?;
        let mut keys = BTreeSet::new();
        while let Some(b) = self.rt.block_on(batches.try_next()).map_err(what())? {
            let col =
                arrow_cast::cast(b.column(0), &arrow_schema::DataType::Utf8).map_err(|e| {
                    LakeError::Table(format!(
                        "{dataset}.{column} cannot be read as text for keys: {e}"
                    ))
                })?;
            let Some(text) = col.as_any().downcast_ref::<arrow_array::StringArray>() else {
                return Err(LakeError::Table(format!(
                    "{dataset}.{column} did not read as text"
                )));
            };
            for v in text.iter().flatten() {
                if !keys.contains(v) {
                    orca_core::keyed::check_key(v).map_err(|e| {
                        LakeError::Table(format!("{dataset}.{column} at snapshot {snapshot}: {e}"))
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

/// The keys of a keyed pipeline, as read from its dataset.
#[derive(Debug, Clone, Default)]
pub struct KeysRead {
    /// The snapshot read; `None` when the table has none (or does not exist).
    pub snapshot: Option<i64>,
    pub timestamp_ms: Option<i64>,
    /// The column's distinct values, sorted; nulls are left out.
    pub keys: Vec<String>,
}

/// The table of a dataset: `namespace.table`, each a lowercase name.
pub fn ident(dataset: &str) -> Result<TableIdent> {
    match dataset.split_once('.') {
        Some((ns, t)) if orca_core::manifest::valid_dataset(dataset) => Ok(TableIdent::new(
            NamespaceIdent::new(ns.to_string()),
            t.to_string(),
        )),
        _ => Err(LakeError::Table(format!(
            "{dataset:?} is not a dataset: write namespace.table in lowercase"
        ))),
    }
}
