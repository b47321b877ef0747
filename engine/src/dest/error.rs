//! Why a destination failed.

use crate::commit::store::StoreError;
use crate::netguard::NetError;

#[derive(Debug, thiserror::Error)]
pub enum DestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("encoding Parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("{path} holds {text:?}, not an epoch or generation number")]
    Garbled { path: String, text: String },
    #[error("the destination is fenced by generation {fence}; generation {mine} may not commit")]
    Fenced { fence: i32, mine: i32 },
    #[error("staged file {path} is gone")]
    StagedGone { path: String },
    #[error("reading a staged file: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error("iceberg destination: {0}")]
    Iceberg(String),
    /// The warehouse's object store did not answer.
    #[error("iceberg destination: {0}")]
    IcebergUnavailable(String),
    #[error("postgres destination: {0}")]
    Postgres(String),
    #[error("destination: {0}")]
    Definition(String),
    #[error("{0} is not built yet")]
    NotBuilt(String),
    #[error(transparent)]
    Netguard(#[from] NetError),
    #[error("destination connector {name}: {reason}")]
    Connector { name: String, reason: String },
}

impl DestError {
    /// Whether the destination's object store did not answer.
    pub fn unavailable(&self) -> bool {
        match self {
            DestError::Store(e) => e.unavailable(),
            DestError::IcebergUnavailable(_) => true,
            _ => false,
        }
    }
}
