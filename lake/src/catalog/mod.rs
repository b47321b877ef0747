//! Where tables live: the SQL catalog in the control plane's Postgres and the
//! warehouse their files go to.
//!
//! The catalog is the SQL-catalog layout every Iceberg client reads (tables
//! `iceberg_tables` and `iceberg_namespace_properties`, created by the orca
//! extension, `sql/catalog.sql`), with catalog name = the org, read under
//! row-level security and written through the extension's `orca.catalog_*`
//! functions ([`sql::OrgCatalog`]). Data and metadata go under the
//! warehouse: dataset `lake.clean` is table `clean` in namespace `lake` at
//! `<warehouse>/<org>/lake/clean`.

mod sql;

use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use futures::TryStreamExt;
use iceberg::io::FileIOBuilder;
use iceberg::{Catalog, MetadataLocation, NamespaceIdent, TableIdent};
use orca_core::api::SnapshotSeen;

pub use sql::OrgCatalog;

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
    /// sent in the connection's startup packet; without a lease, the org
    /// (`orca.org`), which the session must be a member of.
    pub fn session_url(&self) -> Option<String> {
        let url = self.catalog_url.clone()?;
        let sep = if url.contains('?') { '&' } else { '?' };
        match self.lease() {
            // A lease is a UUID: nothing in it needs escaping but the
            // option's own "-c name=value" syntax.
            Some(lease) => Some(format!("{url}{sep}options=-c%20orca.lease%3D{lease}")),
            // Org names are [a-z][a-z0-9_-]*: nothing to escape either.
            None if orca_core::api::valid_org_name(&self.org) => {
                Some(format!("{url}{sep}options=-c%20orca.org%3D{}", self.org))
            }
            None => Some(url),
        }
    }

    /// The lease, when it is one.
    pub fn lease(&self) -> Option<uuid::Uuid> {
        self.lease.as_deref().and_then(|l| l.parse().ok())
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
    pub catalog: OrgCatalog,
    /// The catalog's (the org's) name.
    pub name: String,
}

impl Lake {
    pub fn open(config: &LakeConfig) -> Result<Lake> {
        let url = config.session_url().ok_or_else(|| {
            LakeError::Config("no catalog: set ORCA_CATALOG_URL or DATABASE_URL".into())
        })?;
        match crate::objstore::place(&config.warehouse) {
            Ok(crate::objstore::Place::Bucket { .. }) => {}
            Ok(crate::objstore::Place::Local) if config.warehouse.starts_with("file://") => {}
            Ok(crate::objstore::Place::Local) => {
                return Err(LakeError::Config(format!(
                    "warehouse {} is neither a file:// URL nor an object store's",
                    config.warehouse
                )))
            }
            Err(e) => {
                return Err(LakeError::Config(format!(
                    "warehouse {}: {}",
                    config.warehouse,
                    e.message()
                )))
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| LakeError::Config(format!("cannot start the I/O runtime: {e}")))?;
        let catalog = rt.block_on(async {
            // One process needs few connections; many run at once.
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .connect(&url)
                .await
                .map_err(|e| {
                    LakeError::Config(format!(
                        "cannot open the catalog ({}): {e}",
                        orca_core::conninfo::redact(&url)
                    ))
                })?;
            let runtime = iceberg::Runtime::try_current()
                .map_err(LakeError::iceberg("the catalog's runtime".to_string()))?;
            let fileio = FileIOBuilder::new(Arc::new(crate::objstore::ObjectStoreFactory)).build();
            Ok::<_, LakeError>(OrgCatalog::new(
                config.org.clone(),
                pool,
                config.lease(),
                config.org_warehouse(),
                fileio,
                runtime,
            ))
        })?;
        Ok(Lake {
            rt,
            catalog,
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
    /// since `table` was loaded (a compare-and-swap, as every commit of the
    /// catalog is). Returns whether it did.
    pub async fn swap(
        &self,
        ident: &TableIdent,
        table: &iceberg::table::Table,
        next: &MetadataLocation,
    ) -> Result<bool> {
        let old = table
            .metadata_location_result()
            .map_err(LakeError::iceberg(format!("table {ident}")))?;
        self.catalog
            .swap(ident, old, &next.to_string())
            .await
            .map_err(LakeError::iceberg(format!(
                "swapping the metadata pointer of {ident}"
            )))
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
