//! What an engine asks to read: a [`Plan`] (the source, its streams and
//! where each resumes), which the engine sends a runner's pump in its open
//! frame. The readers that read it are [`crate::source::plan`]'s.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::netguard::Scope;

/// What the engine asks a pump to read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Plan {
    pub sync: String,
    /// The definition's `source` (type, url, format, ...).
    pub source: Value,
    /// The definition's `streams`.
    pub streams: Value,
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

impl Plan {
    /// The source sends typed columns (a Postgres table), not raw records.
    pub fn typed(&self) -> bool {
        matches!(
            self.source.get("type").and_then(Value::as_str),
            Some("postgres" | "postgres_cdc")
        )
    }

    /// The source confirms upstream what committed checkpoints cover (a
    /// change stream, an external connector): the engine sends it ack
    /// frames, and a pump reads them.
    pub fn takes_acks(&self) -> bool {
        matches!(
            self.source.get("type").and_then(Value::as_str),
            Some("postgres_cdc" | "connector")
        )
    }

    /// The source is a change stream (`postgres_cdc`).
    pub fn cdc(&self) -> bool {
        self.source.get("type").and_then(Value::as_str) == Some("postgres_cdc")
    }
}
