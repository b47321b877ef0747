//! Why reading a source failed: the error a reader thread, the engine's own
//! or a runner's pump, hands on. Its texts are the attempt's own for the
//! same failures (an attempt's `EngineError` turns each variant into its own namesake),
//! and a pump sends them over the data edge as they are.

use crate::commit::store::StoreError;
use crate::netguard::NetError;
use crate::source::files::FilesError;
use crate::source::postgres::copy::CopyError;
use crate::source::postgres::table::SourceError;
use crate::util::{pg_text, Missing};

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("postgres: {}", pg_text(.0))]
    Postgres(#[from] postgres::Error),
    #[error("sync definition: {0}")]
    Definition(String),
    #[error("{0} is not built yet")]
    NotBuilt(String),
    #[error(transparent)]
    Table(#[from] SourceError),
    #[error("stream {stream}: {source}")]
    Copy { stream: String, source: CopyError },
    /// A stream's reader failed or went away; also a runner's reason for a
    /// stream, as the data edge brought it.
    #[error("stream {stream}: {reason}")]
    Stream { stream: String, reason: String },
    #[error(transparent)]
    Files(#[from] FilesError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Netguard(#[from] NetError),
    /// The change stream of a `postgres_cdc` source as a whole.
    #[error("change stream: {0}")]
    Cdc(String),
    /// An external connector, as its host saw it.
    #[error("connector {name}: {reason}")]
    Connector { name: String, reason: String },
    /// The source asks for a new attempt at its last resume point (a
    /// continuous change stream met a table's new shape): not a failure.
    /// Its text starts with [`RESTART`], which an error frame keeps.
    #[error("restart: {0}")]
    Restart(String),
}

/// What the text of a [`ReadError::Restart`] starts with.
pub const RESTART: &str = "restart: ";

impl From<Missing> for ReadError {
    fn from(m: Missing) -> Self {
        ReadError::Definition(m.to_string())
    }
}
