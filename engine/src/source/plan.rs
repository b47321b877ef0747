//! What an engine asks to read: a [`Plan`] (the source, its streams and
//! where each resumes), which the engine sends a runner's pump in its open
//! frame, and a [`Describe`] request, which asks a pump to look the
//! streams' tables up. Both carry the sync's definition as core types it
//! (`orca_core::sync`), checked once when the sync was created: no reader
//! looks a definition's option up by its name. The readers that read a
//! plan are [`crate::source::open`]'s.

use orca_core::sync::{Source, Stream};
use serde::{Deserialize, Serialize};

use crate::netguard::Scope;
use crate::source::error::ReadError;

/// What the engine asks a pump to read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Plan {
    pub sync: String,
    /// The definition's source, its secrets resolved.
    pub source: Source,
    /// The definition's streams.
    pub streams: Vec<Stream>,
    /// A change stream's slot: the sync's own in its control plane and org.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// Rows per stream per epoch.
    pub batch_rows: usize,
    /// The streams to read, in frame order (a frame's `stream` is an index
    /// here).
    pub start: Vec<Start>,
    /// What the source may reach: a runner's pump holds to it as the
    /// engine does.
    pub guard: Scope,
}

/// Where one stream resumes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Start {
    pub name: String,
    /// The resume point (None: from the stream's start).
    pub after: Option<Vec<String>>,
    /// The stream's schema as the checkpoint log recorded it, which a
    /// `freeze` or `discard` schema policy keeps the source's columns to.
    pub recorded: Vec<(String, String)>,
}

/// What the engine asks a pump to look up in the source's catalog before
/// it sends a plan: the tables of a Postgres source's streams, or the
/// columns of a parquet files source's streams.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Describe {
    pub source: Source,
    pub streams: Vec<Stream>,
    pub guard: Scope,
}

impl Plan {
    /// The source sends typed columns (a Postgres table, Parquet files),
    /// not raw records.
    pub fn typed(&self) -> bool {
        self.source.typed()
    }

    /// The source confirms upstream what committed checkpoints cover (a
    /// change stream, an external connector): the engine sends it ack
    /// frames, and a pump reads them.
    pub fn takes_acks(&self) -> bool {
        matches!(
            self.source,
            Source::PostgresCdc { .. } | Source::Connector { .. }
        )
    }

    /// The source is a change stream (`postgres_cdc`).
    pub fn cdc(&self) -> bool {
        self.source.is_cdc()
    }

    /// The definition of a stream the plan starts.
    pub fn stream(&self, name: &str) -> Result<&Stream, ReadError> {
        self.streams
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| ReadError::Definition(format!("stream {name} is not defined")))
    }

    /// Each started stream with its definition, in the plan's order.
    pub fn started(&self) -> Result<Vec<(&Start, &Stream)>, ReadError> {
        self.start
            .iter()
            .map(|s| Ok((s, self.stream(&s.name)?)))
            .collect()
    }
}

/// The place or database a source's definition names, resolved: a secret
/// left unresolved is a definition the engine cannot read.
pub(crate) fn url_of(source: &Source) -> Result<&str, ReadError> {
    let setting = source
        .url()
        .ok_or_else(|| ReadError::Definition(format!("a {} source names no url", source.kind())))?;
    setting
        .plain()
        .map_err(|e| ReadError::Definition(format!("source.url: {e}")))
}
