//! Orca's lake: Iceberg tables in the control plane's SQL catalog, their
//! data in a warehouse on the local file system or an object store.
//!
//! - [`catalog`]: where tables live ([`LakeConfig`]), the catalog opened
//!   once per process ([`LakeCell`]), reads of snapshots and keys;
//! - [`table`]: a table handle, creating and loading tables, appending,
//!   and finding a commit by its summary properties;
//! - [`spec`]: what a table is created with: columns, partitioning, sort
//!   order ([`TableSpec`]);
//! - [`writer`]: rows written as data files, split by partition value and
//!   sorted;
//! - [`scan`]: reading a snapshot, planned (files pruned by partition value
//!   and statistics) and streamed;
//! - [`query`]: tables at pinned snapshots as DataFusion tables, and the
//!   tables a SQL query reads;
//! - [`maintain`]: expiring snapshots, removing orphan files, compacting
//!   small files;
//! - [`sync_tables`]: the tables a sync's epochs are applied to (fenced,
//!   marked, merged by key);
//! - [`ranged`]: Parquet files read by byte ranges, a column chunk at a
//!   time (memory follows a row group, not the file);
//! - [`objstore`]: one URL-to-store helper for `s3://`, `az://`, `gs://` and local paths, and
//!   the Iceberg storage built on it;
//! - `rewrite` (private): commits that remove files, which iceberg-rust does
//!   not build yet, behind [`table::commit_change`] alone, so that it can be
//!   deleted when iceberg-rust ships overwrite and rewrite actions.
//!
//! The SDK wraps this for pipeline authors (pinned reads, recorded commits);
//! the engine uses it directly, without the SDK.

pub mod catalog;
pub mod maintain;
pub mod objstore;
pub mod query;
pub mod ranged;
pub mod residual;
mod rewrite;
pub mod scan;
pub mod spec;
pub mod sync_tables;
pub mod table;
pub mod writer;

pub use catalog::{ident, KeysRead, Lake, LakeCell, LakeConfig};
pub use datafusion;
pub use datafusion_proto;
pub use iceberg;
pub use iceberg::spec::DataFile;
pub use scan::ScanStats;
pub use spec::{describe_fields, PartitionField, Partitioning, SortKey, TableSpec, Transform};
pub use table::Table;

/// What can go wrong with a table, each naming what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum LakeError {
    /// Where tables live is not set up: no catalog, a warehouse of an
    /// unsupported kind, no runtime.
    #[error("lake: {0}")]
    Config(String),
    /// An Iceberg operation failed: what was being done, and why.
    #[error("{what}: {source}")]
    Iceberg {
        what: String,
        #[source]
        source: Box<iceberg::Error>,
    },
    /// The table, its data or a commit to it is not what was asked.
    #[error("{0}")]
    Table(String),
    /// A removing commit found a file it removes gone: another commit (a
    /// compaction, a merge) replaced it first. Worked out again from the
    /// table as it is now, the change may go through.
    #[error("{0}")]
    Conflict(String),
    /// The rows given to be written failed to come: the error of whatever
    /// produced them (a query reading another table), kept whole so that
    /// an outage of its store can still be told.
    #[error(transparent)]
    Input(Box<dyn std::error::Error + Send + Sync>),
}

impl LakeError {
    /// Whether the object store did not answer, or a local warehouse's
    /// disk is full (see [`objstore::unavailable`]): the work failed for
    /// the store's sake, and may be tried again as it was.
    pub fn unavailable(&self) -> bool {
        let source = match self {
            LakeError::Iceberg { source, .. } => source,
            LakeError::Input(e) => return outage(e.as_ref()),
            _ => return false,
        };
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
        while let Some(e) = next {
            if let Some(os) = e.downcast_ref::<object_store::Error>() {
                return objstore::unavailable(os);
            }
            next = e.source();
        }
        objstore::disk_full(source.as_ref())
    }

    /// An Iceberg error with what was being done when it happened.
    pub fn iceberg(what: impl Into<String>) -> impl FnOnce(iceberg::Error) -> LakeError {
        let what = what.into();
        move |source| LakeError::Iceberg {
            what,
            source: Box::new(source),
        }
    }
}

/// Whether any error in `e`'s chain says that the object store did not
/// answer or a local warehouse's disk is full: a [`LakeError`] or an
/// [`object_store::Error`] that is [`LakeError::unavailable`] or
/// [`objstore::unavailable`], or a disk-full I/O error. For code that holds
/// a boxed error of any kind (a step's, DataFusion's), where the store's
/// error may sit several wrappers down.
pub fn outage(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(l) = err.downcast_ref::<LakeError>() {
            if l.unavailable() {
                return true;
            }
        } else if let Some(os) = err.downcast_ref::<object_store::Error>() {
            return objstore::unavailable(os);
        }
        next = err.source();
    }
    objstore::disk_full(e)
}

impl From<iceberg::Error> for LakeError {
    fn from(source: iceberg::Error) -> Self {
        LakeError::Iceberg {
            what: "iceberg".into(),
            source: Box::new(source),
        }
    }
}

impl From<String> for LakeError {
    fn from(s: String) -> Self {
        LakeError::Table(s)
    }
}

impl From<&str> for LakeError {
    fn from(s: &str) -> Self {
        LakeError::Table(s.to_string())
    }
}

pub type Result<T, E = LakeError> = std::result::Result<T, E>;
