//! What an engine asks to read, and the readers that read it: a [`Plan`]
//! (the source, its streams and where each resumes) is what the engine
//! sends a runner's pump in its open frame, and what the engine reads by
//! itself when no runner hosts the source.

use orca_core::sync::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::netguard::{Guard, Scope};
use crate::source::error::ReadError;
use crate::source::files::Format;
use crate::source::pg_table::{describe, StreamSpec};
use crate::source::readers::{spawn_file_reader, spawn_reader, Reader};
use crate::util::{str_of, strings, Missing};

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
        self.source.get("type").and_then(Value::as_str) == Some("postgres")
    }
}

/// Starts a reader thread per stream of the plan, reading the source
/// itself. The engine reading without a runner does this too.
pub(crate) fn open_readers(plan: &Plan) -> Result<Vec<Reader>, ReadError> {
    let url = str_of(&plan.source, "url")?;
    let definition = serde_json::json!({ "streams": plan.streams });
    let guard = Guard::new(&plan.guard)?;
    match str_of(&plan.source, "type")?.as_str() {
        "postgres" => {
            let specs = stream_specs(&definition)?;
            let mut probe = guard.postgres(&url)?;
            plan.start
                .iter()
                .map(|s| {
                    let spec = specs.iter().find(|p| p.name == s.name).ok_or_else(|| {
                        ReadError::Definition(format!("stream {} is not defined", s.name))
                    })?;
                    let table = describe(&mut probe, spec)?.under_policy(&s.recorded)?;
                    spawn_reader(
                        guard.clone(),
                        url.clone(),
                        table,
                        s.after.clone(),
                        plan.batch_rows,
                    )
                })
                .collect()
        }
        "files" => {
            guard.place(&url)?;
            let format = Format::parse(&str_of(&plan.source, "format")?).ok_or_else(|| {
                ReadError::Definition(format!(
                    "source.format of {} is not jsonl or csv",
                    plan.source
                ))
            })?;
            plan.start
                .iter()
                .map(|s| {
                    let def = plan
                        .streams
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|d| d.get("name").and_then(Value::as_str) == Some(s.name.as_str()))
                        .ok_or_else(|| {
                            ReadError::Definition(format!("stream {} is not defined", s.name))
                        })?;
                    spawn_file_reader(
                        url.clone(),
                        format,
                        s.name.clone(),
                        str_of(def, "pattern")?,
                        s.after.clone(),
                        plan.batch_rows,
                    )
                })
                .collect()
        }
        other => Err(ReadError::NotBuilt(format!(
            "the {other} source's data path"
        ))),
    }
}

/// The streams of a typed definition, for the Postgres source: each needs
/// its table and cursor.
pub(crate) fn table_specs(streams: &[Stream]) -> Result<Vec<StreamSpec>, Missing> {
    streams
        .iter()
        .map(|s| {
            Ok(StreamSpec {
                name: s.name.clone(),
                table: s.table.clone().ok_or_else(|| Missing::of("table", s))?,
                cursor: s.cursor.clone().ok_or_else(|| Missing::of("cursor", s))?,
                primary_key: s.primary_key.clone(),
                schema_policy: s.schema_policy.name().to_string(),
                lookback: s.lookback.as_ref().map(|l| l.as_str().to_string()),
            })
        })
        .collect()
}

/// The streams of a definition as the data edge carries it (JSON), for the
/// Postgres source.
pub(crate) fn stream_specs(def: &Value) -> Result<Vec<StreamSpec>, ReadError> {
    let streams = def
        .get("streams")
        .and_then(Value::as_array)
        .ok_or_else(|| ReadError::Definition("no streams".into()))?;
    streams
        .iter()
        .map(|s| {
            Ok(StreamSpec {
                name: str_of(s, "name")?,
                table: str_of(s, "table")?,
                cursor: str_of(s, "cursor")?,
                primary_key: strings(s, "primary_key"),
                schema_policy: s
                    .get("schema_policy")
                    .and_then(Value::as_str)
                    .unwrap_or("evolve")
                    .to_string(),
                lookback: s
                    .get("lookback")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            })
        })
        .collect()
}
