//! The org's Iceberg catalog in the control plane: reads are `SELECT`s of
//! the SQL-catalog tables (`public.iceberg_tables`,
//! `public.iceberg_namespace_properties`), which row-level security limits
//! to the org the session's lease (or membership) gives; every write is a
//! call of an `orca.catalog_*` function, which takes the org from the lease
//! and refuses another org's catalog (`sql/iceberg.sql`). So the session
//! needs no right to write a table, and none to create one: opening the
//! catalog runs no DDL (the extension made its tables).
//!
//! The layout is the one every SQL-catalog client reads (PyIceberg, DuckDB,
//! Spark's JDBC catalog): catalog name = the org, a namespace's properties
//! with `exists = true`, a table's row pointing at its metadata file.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Mutex;

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::{TableMetadata, TableMetadataBuilder};
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, MetadataLocation, Namespace, NamespaceIdent, Result, Runtime,
    TableCommit, TableCreation, TableIdent,
};
use sqlx::postgres::PgPool;
use sqlx::Row;

/// An org's catalog, read and written as above.
#[derive(Debug)]
pub struct OrgCatalog {
    /// The org's name, which is the catalog's.
    name: String,
    pool: PgPool,
    /// The attempt's lease, passed to every write; none for an operator's
    /// own session.
    lease: Option<uuid::Uuid>,
    warehouse: String,
    fileio: FileIO,
    runtime: Runtime,
    /// The tables loaded, each at the metadata file it was loaded from.
    /// A metadata file never changes once written, so a load that finds
    /// the catalog still pointing at it parses nothing and keeps the
    /// table's cache of manifests (what a step that reads or appends to
    /// one table month after month would otherwise read again each time).
    /// The catalog's row is still read on every load: access and the
    /// current pointer are the control plane's, never the cache's.
    loaded: Mutex<HashMap<TableIdent, Table>>,
}

/// How many tables [`OrgCatalog`] keeps loaded; past it, it forgets them
/// all. Each holds up to 32 MiB of manifests in its own cache, so a
/// long-lived process (`orca serve`, a continuous sync) keeps at most a
/// quarter of a GiB of them, and a step, which reads a few tables, all of
/// its own.
const LOADED_MAX: usize = 8;

/// A table row of the catalog that a client of another kind made as a view
/// (`iceberg_type = 'VIEW'`) is not a table.
const IS_TABLE: &str = "(iceberg_type = 'TABLE' OR iceberg_type IS NULL)";

/// An error of the control plane as iceberg-rust's kinds: the catalog
/// functions' own codes (`OR044` bad input, `OR045` no such namespace or
/// table, or one that exists) keep their meaning for callers that match on
/// the kind (a create that lost a race, a commit of a dropped table).
fn db(what: &str) -> impl FnOnce(sqlx::Error) -> Error + '_ {
    move |e| {
        let (kind, text) = match &e {
            sqlx::Error::Database(d) => {
                let kind = match (d.code().as_deref(), d.message()) {
                    (Some("OR044"), _) => ErrorKind::DataInvalid,
                    (Some("OR045"), m) if m.contains("exists already") => {
                        ErrorKind::TableAlreadyExists
                    }
                    (Some("OR045"), m) if m.starts_with("no namespace") => {
                        ErrorKind::NamespaceNotFound
                    }
                    (Some("OR045"), _) => ErrorKind::TableNotFound,
                    _ => ErrorKind::Unexpected,
                };
                let text = match d.code() {
                    Some(code) => format!("{} ({code})", d.message()),
                    None => d.message().to_string(),
                };
                (kind, text)
            }
            other => (ErrorKind::Unexpected, other.to_string()),
        };
        Error::new(kind, format!("{what}: {text}"))
    }
}

/// A namespace as the SQL catalog layout keeps it: its levels joined by
/// '.', so no level may hold one (`a.b` and `a`/`b` would be one namespace).
fn ns_text(ns: &NamespaceIdent) -> Result<String> {
    if ns
        .iter()
        .any(|level| level.is_empty() || level.contains('.'))
    {
        return Err(Error::new(
            ErrorKind::DataInvalid,
            format!("namespace {ns:?}: a level is empty or holds a '.'"),
        ));
    }
    Ok(ns.join("."))
}

fn unsupported(what: &str) -> Error {
    Error::new(
        ErrorKind::FeatureUnsupported,
        format!("{what} is not something Orca's catalog does"),
    )
}

impl OrgCatalog {
    pub fn new(
        name: String,
        pool: PgPool,
        lease: Option<uuid::Uuid>,
        warehouse: String,
        fileio: FileIO,
        runtime: Runtime,
    ) -> Self {
        OrgCatalog {
            name,
            pool,
            lease,
            warehouse,
            fileio,
            runtime,
            loaded: Mutex::new(HashMap::new()),
        }
    }

    /// The table as loaded from `location` before, if it was.
    fn loaded(&self, ident: &TableIdent, location: &str) -> Option<Table> {
        let loaded = self.loaded.lock().ok()?;
        loaded
            .get(ident)
            .filter(|t| t.metadata_location() == Some(location))
            .cloned()
    }

    fn remember(&self, table: &Table) {
        if let Ok(mut loaded) = self.loaded.lock() {
            if loaded.len() >= LOADED_MAX && !loaded.contains_key(table.identifier()) {
                loaded.clear();
            }
            loaded.insert(table.identifier().clone(), table.clone());
        }
    }

    fn forget(&self, ident: &TableIdent) {
        if let Ok(mut loaded) = self.loaded.lock() {
            loaded.remove(ident);
        }
    }

    /// The org's name, which names its catalog.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Points `ident` at `next` if it still points at `expected` (a
    /// compare-and-swap); whether it did.
    pub async fn swap(&self, ident: &TableIdent, expected: &str, next: &str) -> Result<bool> {
        sqlx::query_scalar::<_, bool>("SELECT orca.catalog_commit($1, $2, $3, $4, $5, $6)")
            .bind(&self.name)
            .bind(ns_text(ident.namespace())?)
            .bind(ident.name())
            .bind(expected)
            .bind(next)
            .bind(self.lease)
            .fetch_one(&self.pool)
            .await
            .map_err(db("committing to the catalog"))
    }

    async fn metadata_location(&self, ident: &TableIdent) -> Result<Option<String>> {
        let row: Option<Option<String>> = sqlx::query_scalar(&format!(
            "SELECT metadata_location::text FROM public.iceberg_tables \
             WHERE catalog_name = $1 AND table_namespace = $2 AND table_name = $3 AND {IS_TABLE}"
        ))
        .bind(&self.name)
        .bind(ns_text(ident.namespace())?)
        .bind(ident.name())
        .fetch_optional(&self.pool)
        .await
        .map_err(db("reading the catalog"))?;
        Ok(row.flatten())
    }

    async fn properties(&self, ns: &NamespaceIdent) -> Result<Option<HashMap<String, String>>> {
        let rows = sqlx::query(
            "SELECT property_key::text AS k, property_value::text AS v \
             FROM public.iceberg_namespace_properties WHERE catalog_name = $1 AND namespace = $2",
        )
        .bind(&self.name)
        .bind(ns_text(ns)?)
        .fetch_all(&self.pool)
        .await
        .map_err(db("reading the catalog"))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut props = HashMap::new();
        for r in rows {
            let k: Option<String> = r.try_get("k").map_err(db("reading the catalog"))?;
            let v: Option<String> = r.try_get("v").map_err(db("reading the catalog"))?;
            if let (Some(k), Some(v)) = (k, v) {
                if k != "exists" {
                    props.insert(k, v);
                }
            }
        }
        Ok(Some(props))
    }

    fn table(&self, ident: TableIdent, location: String, metadata: TableMetadata) -> Result<Table> {
        Table::builder()
            .file_io(self.fileio.clone())
            .identifier(ident)
            .metadata_location(location)
            .metadata(metadata)
            .runtime(self.runtime.clone())
            .build()
    }
}

#[async_trait]
impl Catalog for OrgCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT table_namespace::text FROM public.iceberg_tables WHERE catalog_name = $1 \
             UNION SELECT namespace::text FROM public.iceberg_namespace_properties \
             WHERE catalog_name = $1",
        )
        .bind(&self.name)
        .fetch_all(&self.pool)
        .await
        .map_err(db("reading the catalog"))?;
        let mut out: Vec<NamespaceIdent> = Vec::new();
        for n in names {
            let levels: Vec<&str> = n.split('.').collect();
            let ident = match parent {
                None => NamespaceIdent::from_strs(levels.iter().take(1))?,
                Some(p) => {
                    let under = levels.len() > p.len() && levels[..p.len()] == p.as_ref()[..];
                    if !under {
                        continue;
                    }
                    NamespaceIdent::from_strs(levels.iter().take(p.len() + 1))?
                }
            };
            if !out.contains(&ident) {
                out.push(ident);
            }
        }
        Ok(out)
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        let props = serde_json::to_value(&properties)
            .map_err(|e| Error::new(ErrorKind::DataInvalid, e.to_string()))?;
        let made: bool = sqlx::query_scalar("SELECT orca.catalog_create_namespace($1, $2, $3, $4)")
            .bind(&self.name)
            .bind(ns_text(namespace)?)
            .bind(props)
            .bind(self.lease)
            .fetch_one(&self.pool)
            .await
            .map_err(db("creating a namespace"))?;
        if !made {
            return Err(Error::new(
                ErrorKind::NamespaceAlreadyExists,
                format!("namespace {namespace:?} exists already"),
            ));
        }
        Ok(Namespace::with_properties(namespace.clone(), properties))
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        match self.properties(namespace).await? {
            Some(props) => Ok(Namespace::with_properties(namespace.clone(), props)),
            None if self.namespace_exists(namespace).await? => {
                Ok(Namespace::new(namespace.clone()))
            }
            None => Err(Error::new(
                ErrorKind::NamespaceNotFound,
                format!("no namespace {namespace:?} in catalog {}", self.name),
            )),
        }
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        // A namespace is one with properties, or one a table is in (a
        // client may have made the table without the namespace's row).
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM public.iceberg_namespace_properties \
                            WHERE catalog_name = $1 AND namespace = $2) \
                 OR EXISTS (SELECT 1 FROM public.iceberg_tables \
                            WHERE catalog_name = $1 AND table_namespace = $2)",
        )
        .bind(&self.name)
        .bind(ns_text(namespace)?)
        .fetch_one(&self.pool)
        .await
        .map_err(db("reading the catalog"))
    }

    async fn update_namespace(
        &self,
        _namespace: &NamespaceIdent,
        _properties: HashMap<String, String>,
    ) -> Result<()> {
        Err(unsupported("changing a namespace's properties"))
    }

    async fn drop_namespace(&self, _namespace: &NamespaceIdent) -> Result<()> {
        Err(unsupported("dropping a namespace"))
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        let names: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT table_name::text FROM public.iceberg_tables \
             WHERE catalog_name = $1 AND table_namespace = $2 AND {IS_TABLE} ORDER BY 1"
        ))
        .bind(&self.name)
        .bind(ns_text(namespace)?)
        .fetch_all(&self.pool)
        .await
        .map_err(db("reading the catalog"))?;
        Ok(names
            .into_iter()
            .map(|n| TableIdent::new(namespace.clone(), n))
            .collect())
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        let location = match &creation.location {
            Some(l) => l.clone(),
            None => {
                let props = self.properties(namespace).await?.unwrap_or_default();
                let base = match props.get("location") {
                    Some(l) => l.clone(),
                    None => format!(
                        "{}/{}",
                        self.warehouse.trim_end_matches('/'),
                        namespace.join("/")
                    ),
                };
                format!("{}/{}", base.trim_end_matches('/'), ident.name())
            }
        };
        let creation = TableCreation {
            location: Some(location.clone()),
            ..creation
        };
        let metadata = TableMetadataBuilder::from_table_creation(creation)?
            .build()?
            .metadata;
        let at = MetadataLocation::new_with_metadata(location, &metadata);
        metadata.write_to(&self.fileio, &at).await?;
        let at = at.to_string();
        sqlx::query("SELECT orca.catalog_create_table($1, $2, $3, $4, $5)")
            .bind(&self.name)
            .bind(ns_text(namespace)?)
            .bind(ident.name())
            .bind(&at)
            .bind(self.lease)
            .execute(&self.pool)
            .await
            .map_err(db("creating a table"))?;
        let table = self.table(ident, at, metadata)?;
        self.remember(&table);
        Ok(table)
    }

    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        let Some(location) = self.metadata_location(table).await? else {
            return Err(Error::new(
                ErrorKind::TableNotFound,
                format!("no table {table} in catalog {}", self.name),
            ));
        };
        if let Some(t) = self.loaded(table, &location) {
            return Ok(t);
        }
        let metadata = TableMetadata::read_from(&self.fileio, &location).await?;
        let t = self.table(table.clone(), location, metadata)?;
        self.remember(&t);
        Ok(t)
    }

    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        let dropped: bool = sqlx::query_scalar("SELECT orca.catalog_drop_table($1, $2, $3, $4)")
            .bind(&self.name)
            .bind(ns_text(table.namespace())?)
            .bind(table.name())
            .bind(self.lease)
            .fetch_one(&self.pool)
            .await
            .map_err(db("dropping a table"))?;
        self.forget(table);
        if dropped {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::TableNotFound,
                format!("no table {table} in catalog {}", self.name),
            ))
        }
    }

    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        let t = self.load_table(table).await?;
        self.drop_table(table).await?;
        iceberg::drop_table_data(&t).await
    }

    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        Ok(self.metadata_location(table).await?.is_some())
    }

    async fn rename_table(&self, _src: &TableIdent, _dest: &TableIdent) -> Result<()> {
        Err(unsupported("renaming a table"))
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        let metadata = TableMetadata::read_from(&self.fileio, &metadata_location).await?;
        sqlx::query("SELECT orca.catalog_create_table($1, $2, $3, $4, $5)")
            .bind(&self.name)
            .bind(ns_text(table.namespace())?)
            .bind(table.name())
            .bind(&metadata_location)
            .bind(self.lease)
            .execute(&self.pool)
            .await
            .map_err(db("registering a table"))?;
        self.table(table.clone(), metadata_location, metadata)
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        let ident = commit.identifier().clone();
        let current = self.load_table(&ident).await?;
        let expected = current.metadata_location_result()?.to_string();
        let staged = commit.apply(current)?;
        let next = MetadataLocation::from_str(staged.metadata_location_result()?)?;
        staged.metadata().write_to(staged.file_io(), &next).await?;
        if !self.swap(&ident, &expected, &next.to_string()).await? {
            return Err(Error::new(
                ErrorKind::CatalogCommitConflicts,
                format!("another commit of {ident} came first"),
            )
            .with_retryable(true));
        }
        self.remember(&staged);
        Ok(staged)
    }
}
