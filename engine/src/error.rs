//! Why an attempt stopped. Its texts are read by people and matched by
//! tests; its variants by the simulation (`Reader`, `Crashed`, `Fenced`) and
//! the binary (`Fenced` exits with 3).

use crate::commit::protocol::CrashPoint;
use crate::commit::protocol::ProtocolError;
use crate::commit::recovery::RecoveryError;
use crate::commit::store::StoreError;
use crate::dest::error::DestError;
use crate::netguard::NetError;
use crate::source::error::ReadError;
use crate::source::files::FilesError;
use crate::source::postgres::copy::CopyError;
use crate::source::postgres::table::SourceError;
use crate::transport::edge::EdgeError;
use crate::util::{pg_text, Missing};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("postgres: {}", pg_text(.0))]
    Postgres(#[from] postgres::Error),
    #[error("control plane: {0}")]
    Control(#[from] orca_client::ClientError),
    #[error(
        "fenced: sync '{sync}' was claimed by a newer attempt than generation {generation}; \
         stopping without committing"
    )]
    Fenced { sync: String, generation: i32 },
    #[error("sync definition: {0}")]
    Definition(String),
    /// A table maintenance run could not do its work (`orca-engine maintain`).
    #[error("table maintenance: {0}")]
    Maintenance(String),
    #[error("{0} is not built yet")]
    NotBuilt(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Dest(#[from] DestError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("stream {stream}: {source}")]
    Copy { stream: String, source: CopyError },
    #[error("stream {stream}: {reason}")]
    Reader { stream: String, reason: String },
    #[error("HEAD names record {path}, which the store does not have")]
    NoRecord { path: String },
    #[error("record {path}: {reason}")]
    BadRecord { path: String, reason: String },
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("building a batch: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error(transparent)]
    Files(#[from] FilesError),
    #[error("crashed on purpose {at:?} epoch {epoch} (a simulation's fault)")]
    Crashed { at: CrashPoint, epoch: u64 },
    #[error("data edge {path}: {reason}")]
    Edge { path: String, reason: String },
    #[error(transparent)]
    Netguard(#[from] NetError),
    #[error("change stream: {0}")]
    Cdc(String),
    #[error("connector {name}: {reason}")]
    Connector { name: String, reason: String },
    /// The source asked for a new attempt at the last resume point; what
    /// was committed stays, and a runner hands the attempt back (exit 4)
    /// rather than failing it.
    #[error("{0}; the next attempt goes on from HEAD")]
    Restart(String),
    #[error("control channel at {path}: {source}")]
    Channel {
        path: String,
        source: std::io::Error,
    },
}

impl EngineError {
    /// Whether the attempt stopped because an object store (the sync's
    /// store, a parquet or Iceberg destination's, a files source's) did
    /// not answer. A runner hands such an attempt back (exit 4): the run's
    /// retries are for its own failures, not the store's.
    pub fn store_unavailable(&self) -> bool {
        match self {
            EngineError::Store(e) | EngineError::Files(FilesError::Store(e)) => e.unavailable(),
            EngineError::Dest(e) => e.unavailable(),
            _ => false,
        }
    }
}

impl From<Missing> for EngineError {
    fn from(m: Missing) -> Self {
        EngineError::Definition(m.to_string())
    }
}

/// A reader's error, as the attempt's own: the same variant and text as
/// when the attempt read the stream itself. (The simulation tells a failed
/// stream by `Reader`.)
impl From<ReadError> for EngineError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Postgres(e) => EngineError::Postgres(e),
            ReadError::Definition(d) => EngineError::Definition(d),
            ReadError::NotBuilt(what) => EngineError::NotBuilt(what),
            ReadError::Table(e) => EngineError::Source(e),
            ReadError::Copy { stream, source } => EngineError::Copy { stream, source },
            ReadError::Stream { stream, reason } => EngineError::Reader { stream, reason },
            ReadError::Files(e) => EngineError::Files(e),
            ReadError::Store(e) => EngineError::Store(e),
            ReadError::Netguard(e) => EngineError::Netguard(e),
            ReadError::Cdc(e) => EngineError::Cdc(e),
            ReadError::Connector { name, reason } => EngineError::Connector { name, reason },
            ReadError::Restart(why) => EngineError::Restart(why),
        }
    }
}

impl From<EdgeError> for EngineError {
    fn from(EdgeError { path, reason }: EdgeError) -> Self {
        EngineError::Edge { path, reason }
    }
}
