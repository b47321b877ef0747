//! Sync definitions: the built-in connectors, what each needs, and the
//! delivery level each stream can keep. `orca.create_sync` validates through
//! [`check`]; every error names the connector, option or stream at fault.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cron::Schedule;
use crate::delivery::{self, Delivery, DestClass, Replay, StreamFacts, WriteMode};
use crate::error::{Error, Result};
use crate::manifest::NAME_MAX;
use crate::netguard::Reach;
use crate::secret::{self, Resolver, SecretError, SecretRef, Setting};

pub mod partition_by;
pub use partition_by::{PartitionBy, PartitionTransform, PARTITION_FIELDS_MAX};

/// A sync's definition as [`check`] normalizes it and `orca.syncs.definition`
/// stores it: what `orca.claim_sync` hands the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncDef {
    pub name: String,
    pub source: Source,
    pub destination: Destination,
    pub streams: Vec<Stream>,
    /// A cron expression in UTC, or none: runs only when asked.
    pub schedule: Option<String>,
    /// The level the sync requires (each stream keeps at least this much).
    pub delivery: Delivery,
}

/// Where a sync reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Source {
    /// Tables read incrementally by a cursor column and their primary key.
    Postgres {
        /// The database: a URL or conninfo string without a password, or a
        /// secret holding one (`{"secret": "shop-db"}`).
        url: Setting,
        /// Rows per stream per epoch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_rows: Option<u64>,
    },
    /// JSON lines, CSV or Parquet files under a path or an object store's
    /// prefix (`s3://`, `az://`, `gs://`).
    Files { url: Setting, format: FileFormat },
    /// Every insert, update and delete of tables, by logical replication
    /// (`pgoutput`) from a slot the sync owns, after a first snapshot.
    #[serde(rename = "postgres_cdc")]
    PostgresCdc {
        url: Setting,
        /// Changes per epoch (whole transactions: an epoch can hold more).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_rows: Option<u64>,
        /// One long-lived attempt that streams on, an epoch at least every
        /// `epoch_seconds`, instead of one that stops at the WAL's end.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        continuous: Option<bool>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        epoch_seconds: Option<u64>,
    },
    /// Tables of the org's own Iceberg catalog: each stream reads its table
    /// at its current snapshot, then the rows later snapshots append.
    Iceberg {
        /// Rows per stream per epoch.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_rows: Option<u64>,
    },
    /// An external connector: a program the runner's host installed in its
    /// connectors directory (`orca-runner --connectors DIR`), which speaks
    /// the connector protocol (docs/connectors.md) on a Unix socket.
    Connector {
        /// The program's name in the connectors directory.
        connector: String,
        /// The connector's own options; a `{"secret": "<name>"}` value is
        /// resolved by the attempt before the connector starts.
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        config: Map<String, Value>,
        /// What a read again from a resume point returns, as the connector
        /// promises it (its `spec` must say the same or better).
        replay: ConnectorReplay,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_rows: Option<u64>,
        /// How long the connector may send nothing before it is taken for
        /// hung and killed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_seconds: Option<u64>,
    },
}

/// What an external connector promises of a read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectorReplay {
    /// The same records, in the same order (a log read by its sequence).
    Exact,
    /// At least the records, possibly newer versions of them.
    Superset,
}

impl ConnectorReplay {
    pub fn name(self) -> &'static str {
        match self {
            ConnectorReplay::Exact => "exact",
            ConnectorReplay::Superset => "superset",
        }
    }
}

/// A connector's name: what a connectors directory holds it under.
pub fn is_connector_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'))
}

/// The longest a connector may send nothing unless its source says.
pub const CONNECTOR_TIMEOUT_DEFAULT: u64 = 300;

impl Source {
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Postgres { .. } => "postgres",
            Source::Files { .. } => "files",
            Source::PostgresCdc { .. } => "postgres_cdc",
            Source::Iceberg { .. } => "iceberg",
            Source::Connector { .. } => "connector",
        }
    }

    /// The database or place the source reads (an external connector's
    /// are in its config).
    pub fn url(&self) -> Option<&Setting> {
        match self {
            Source::Postgres { url, .. }
            | Source::Files { url, .. }
            | Source::PostgresCdc { url, .. } => Some(url),
            Source::Iceberg { .. } | Source::Connector { .. } => None,
        }
    }

    /// The source's streams have typed columns of their own (a Postgres
    /// table's, Parquet files'), not records whose columns are inferred.
    pub fn typed(&self) -> bool {
        matches!(
            self,
            Source::Postgres { .. }
                | Source::PostgresCdc { .. }
                | Source::Iceberg { .. }
                | Source::Files {
                    format: FileFormat::Parquet,
                    ..
                }
        )
    }

    /// The source reads a database's change stream (a replication slot).
    pub fn is_cdc(&self) -> bool {
        matches!(self, Source::PostgresCdc { .. })
    }

    /// Replaces the source's secret references with their values.
    pub fn resolve_secrets(
        &mut self,
        resolver: &mut dyn Resolver,
    ) -> std::result::Result<(), SecretError> {
        match self {
            Source::Postgres { url, .. }
            | Source::Files { url, .. }
            | Source::PostgresCdc { url, .. } => url.resolve(resolver),
            Source::Iceberg { .. } => Ok(()),
            Source::Connector { config, .. } => resolve_config(config, resolver),
        }
    }

    /// What the source reaches, as netguard judges it before anything is
    /// resolved (see [`SyncDef::reaches`]).
    pub fn reaches(&self) -> Vec<(&'static str, Reach<'_>)> {
        match self {
            Source::Postgres { url, .. } | Source::PostgresCdc { url, .. } => url
                .plain()
                .map(|u| vec![("source.url", Reach::Postgres(u))])
                .unwrap_or_default(),
            Source::Files { url, .. } => url
                .plain()
                .map(|u| vec![("source.url", Reach::Place(u))])
                .unwrap_or_default(),
            // What an external connector reaches, its spec names: the
            // attempt checks it before the connector starts.
            Source::Connector { .. } => Vec::new(),
            // The org's own catalog and warehouse, which the org reaches.
            Source::Iceberg { .. } => Vec::new(),
        }
    }

    /// A continuous sync's epoch interval (`epoch_seconds`, default
    /// [`EPOCH_SECONDS_DEFAULT`]); None for a sync whose attempts end.
    pub fn continuous(&self) -> Option<u64> {
        match self {
            Source::PostgresCdc {
                continuous: Some(true),
                epoch_seconds,
                ..
            } => Some(epoch_seconds.unwrap_or(EPOCH_SECONDS_DEFAULT)),
            _ => None,
        }
    }
}

/// The format of a files source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    Jsonl,
    Csv,
    /// Typed columns: each stream's columns are its files' (their union,
    /// read from the footers), not inferred from values.
    Parquet,
}

/// Where a sync writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Destination {
    /// Parquet files under a path or an object store's prefix (`s3://`, `az://`, `gs://`).
    Parquet {
        url: Setting,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lanes: Option<u64>,
    },
    /// Iceberg tables in a namespace of the warehouse.
    Iceberg {
        namespace: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lanes: Option<u64>,
    },
    /// Tables of a Postgres database.
    Postgres {
        url: Setting,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lanes: Option<u64>,
    },
    /// An external connector's `write` (docs/connectors.md): the engine
    /// sends it each epoch's rows and asks it to commit them.
    Connector {
        connector: String,
        /// How it makes an epoch visible, as the definition relies on it
        /// (the connector's spec must promise the same or better).
        commits: ConnectorCommits,
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        config: Map<String, Value>,
        /// How long the connector may take to answer a request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_seconds: Option<u64>,
    },
}

/// What a destination connector promises of a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectorCommits {
    /// An epoch's rows and the stream's marker become visible together, and
    /// a commit of an epoch at or below the marker changes nothing (as a
    /// Postgres transaction does).
    Atomic,
    /// Rows are delivered as they come and the marker after them: a crash
    /// between the two delivers the epoch again.
    AtLeastOnce,
}

impl ConnectorCommits {
    pub fn name(self) -> &'static str {
        match self {
            ConnectorCommits::Atomic => "atomic",
            ConnectorCommits::AtLeastOnce => "at_least_once",
        }
    }
}

impl Destination {
    pub fn kind(&self) -> &'static str {
        match self {
            Destination::Parquet { .. } => "parquet",
            Destination::Iceberg { .. } => "iceberg",
            Destination::Postgres { .. } => "postgres",
            Destination::Connector { .. } => "connector",
        }
    }

    /// Writer lanes asked for, if any.
    pub fn lanes(&self) -> Option<u64> {
        match self {
            Destination::Parquet { lanes, .. }
            | Destination::Iceberg { lanes, .. }
            | Destination::Postgres { lanes, .. } => *lanes,
            // One connection to the connector: its commits are in order.
            Destination::Connector { .. } => None,
        }
    }
}

/// What a stream does when the source's columns change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemaPolicy {
    /// New columns are added; widened types follow.
    Evolve,
    /// The destination's columns stay; a change stops the attempt.
    Freeze,
    /// Columns the destination lacks are left out.
    Discard,
}

impl SchemaPolicy {
    pub fn name(self) -> &'static str {
        match self {
            SchemaPolicy::Evolve => "evolve",
            SchemaPolicy::Freeze => "freeze",
            SchemaPolicy::Discard => "discard",
        }
    }
}

/// How far back a table stream reads again each time: a whole number and a
/// unit (`90 seconds`, `10 minutes`, `1 hour`, `2 days`), kept as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Lookback {
    text: String,
    seconds: u64,
}

impl Lookback {
    pub fn seconds(&self) -> u64 {
        self.seconds
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl TryFrom<String> for Lookback {
    type Error = String;
    fn try_from(text: String) -> std::result::Result<Self, String> {
        match lookback_seconds(&text) {
            Some(seconds) => Ok(Lookback { text, seconds }),
            None => Err(format!(
                "'{text}' is not a lookback such as '10 minutes' (a number and second, minute, \
                 hour or day)"
            )),
        }
    }
}

impl From<Lookback> for String {
    fn from(l: Lookback) -> String {
        l.text
    }
}

/// The type a files or connector stream declares for a column: its values
/// are coerced to it (`"7"` to 7 for `int64`), and one that cannot be is
/// quarantined with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    Boolean,
    Int64,
    Float64,
    String,
}

impl ColumnType {
    pub fn name(self) -> &'static str {
        match self {
            ColumnType::Boolean => "boolean",
            ColumnType::Int64 => "int64",
            ColumnType::Float64 => "float64",
            ColumnType::String => "string",
        }
    }

    fn parse(name: &str) -> Option<ColumnType> {
        [
            ColumnType::Boolean,
            ColumnType::Int64,
            ColumnType::Float64,
            ColumnType::String,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }
}

/// The most columns a stream may declare.
pub const DECLARED_COLUMNS_MAX: usize = 1000;

/// One stream of a sync: what it reads (a table by a cursor, or files by a
/// pattern), how it writes, and the delivery level it keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stream {
    /// The destination table's name.
    pub name: String,
    pub mode: WriteMode,
    pub primary_key: Vec<String>,
    pub schema_policy: SchemaPolicy,
    /// The level this stream keeps (at least the sync's).
    pub delivery: Delivery,
    /// A postgres source's table, `schema.table`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// The column that orders a table's changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookback: Option<Lookback>,
    /// A files source's files, such as `events/*.jsonl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// A postgres table's big reads split over this many connections
    /// (absent: the engine host's cores, at most 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub splits: Option<u32>,
    /// An external connector's options for this stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Map<String, Value>>,
    /// A files or connector stream's declared column types (a table's
    /// columns have the table's types).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<BTreeMap<String, ColumnType>>,
    /// An Iceberg destination's partitioning of the stream's table, given
    /// when the table is made (`["day(updated_at)"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_by: Option<Vec<PartitionBy>>,
}

/// The most connections one table's read is split over.
pub const SPLITS_MAX: u32 = 64;

/// The keys a stream's definition may hold (what `Stream` serializes, so a
/// stored definition's streams can be given again).
const STREAM_KEYS: &[&str] = &[
    "name",
    "mode",
    "primary_key",
    "schema_policy",
    "delivery",
    "table",
    "cursor",
    "lookback",
    "pattern",
    "splits",
    "config",
    "columns",
    "partition_by",
];

/// A built-in connector: its options and what it means for delivery.
struct Connector {
    name: &'static str,
    required: &'static [&'static str],
    optional: &'static [&'static str],
}

const SOURCES: &[Connector] = &[
    // A table read incrementally by a cursor column and its primary key.
    Connector {
        name: "postgres",
        required: &["url"],
        optional: &["batch_rows"],
    },
    // JSON lines or CSV files under a path or an s3:// prefix, resumable by
    // file and offset.
    Connector {
        name: "files",
        required: &["url", "format"],
        optional: &[],
    },
    // Logical replication from a slot: exact, replayable from a confirmed
    // LSN, deletes included.
    Connector {
        name: "postgres_cdc",
        required: &["url"],
        optional: &["batch_rows", "continuous", "epoch_seconds"],
    },
    // Tables of the org's own Iceberg catalog: a snapshot, then what later
    // snapshots append (exact: snapshots never change).
    Connector {
        name: "iceberg",
        required: &[],
        optional: &["batch_rows"],
    },
    // A program of the runner host's connectors directory, on a Unix socket.
    Connector {
        name: "connector",
        required: &["connector", "replay"],
        optional: &["config", "batch_rows", "timeout_seconds"],
    },
];

const DESTINATIONS: &[Connector] = &[
    Connector {
        name: "parquet",
        required: &["url"],
        optional: &["lanes"],
    },
    Connector {
        name: "iceberg",
        required: &["namespace"],
        optional: &["lanes"],
    },
    Connector {
        name: "postgres",
        required: &["url"],
        optional: &["schema", "lanes"],
    },
    Connector {
        name: "connector",
        required: &["connector", "commits"],
        optional: &["config", "timeout_seconds"],
    },
];

/// The most writer lanes a destination may ask for.
pub const MAX_LANES: u64 = 64;

/// A delivery level by its name; the error names `field` and the levels.
fn delivery_level(field: impl Into<String>, name: &str) -> Result<Delivery> {
    Delivery::parse_name(name).ok_or_else(|| {
        bad(
            field,
            format!(
                "'{name}' is not a delivery level (at_least_once, effectively_once, exactly_once)"
            ),
        )
    })
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::BadSync {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A lookback's length in seconds: a whole number and a unit (`90
/// seconds`, `10 minutes`, `1 hour`, `2 days`).
pub fn lookback_seconds(text: &str) -> Option<u64> {
    let mut parts = text.split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    let unit = parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    let per = match unit.trim_end_matches('s') {
        "second" => 1,
        "minute" => 60,
        "hour" => 3600,
        "day" => 86_400,
        _ => return None,
    };
    n.checked_mul(per)
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= NAME_MAX
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// A column or table identifier as the source spells it (any case).
fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= NAME_MAX
        && s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The connector a side names, with its options checked.
fn connector(
    side: &'static str,
    catalog: &'static [Connector],
    v: &Value,
) -> Result<(&'static Connector, Map<String, Value>)> {
    let obj = v.as_object().ok_or_else(|| {
        bad(
            side,
            format!("must be an object such as {{\"type\": \"postgres\", ...}}, got {v}"),
        )
    })?;
    let kind = obj
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{side}.type"), "is required"))?;
    let c = catalog
        .iter()
        .find(|c| c.name == kind)
        .ok_or_else(|| Error::UnknownConnector {
            side,
            name: kind.to_string(),
            known: catalog
                .iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    for opt in c.required {
        match obj.get(*opt) {
            Some(Value::String(s)) if !s.trim().is_empty() => {}
            // Any string option may be a secret instead.
            Some(v @ Value::Object(_)) if *opt != "format" => {
                let r: SecretRef = serde_json::from_value(v.clone()).map_err(|_| {
                    bad(
                        format!("{side}.{opt}"),
                        format!("must be a string or {{\"secret\": \"<name>\"}}, got {v}"),
                    )
                })?;
                r.provider()
                    .map_err(|e| bad(format!("{side}.{opt}"), e.to_string()))?;
            }
            Some(other) if !other.is_null() => {
                return Err(bad(
                    format!("{side}.{opt}"),
                    format!("must be a non-empty string, got {other}"),
                ))
            }
            _ => {
                return Err(Error::MissingOption {
                    side,
                    connector: c.name,
                    option: (*opt).to_string(),
                })
            }
        }
    }
    if let Some(k) = obj.keys().find(|k| {
        *k != "type" && !c.required.contains(&k.as_str()) && !c.optional.contains(&k.as_str())
    }) {
        return Err(bad(
            format!("{side}.{k}"),
            format!(
                "is not an option of the {} {side} (it takes {})",
                c.name,
                c.required
                    .iter()
                    .chain(c.optional)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Ok((c, obj.clone()))
}

/// An external connector source's own options: its name, its replay, its
/// config (no password in plain text), its timeout.
fn check_connector(opts: &Map<String, Value>) -> Result<()> {
    let name = opts.get("connector").and_then(Value::as_str).unwrap_or("");
    if !is_connector_name(name) {
        return Err(bad(
            "source.connector",
            format!(
                "'{name}' is not a connector's name: 1 to {NAME_MAX} lowercase letters, digits, \
                 '_' or '-', as the runner's connectors directory holds it"
            ),
        ));
    }
    let replay = opts.get("replay").and_then(Value::as_str).unwrap_or("");
    if !matches!(replay, "exact" | "superset") {
        return Err(bad(
            "source.replay",
            format!(
                "'{replay}' is not what a read again returns: exact (the same records) or \
                 superset (at least them)"
            ),
        ));
    }
    match opts.get("config") {
        None | Some(Value::Null) => {}
        Some(Value::Object(c)) => check_config("source.config", c)?,
        Some(other) => {
            return Err(bad(
                "source.config",
                format!("must be an object of the connector's options, got {other}"),
            ))
        }
    }
    if let Some(t) = opts.get("timeout_seconds") {
        if !t.as_u64().is_some_and(|n| (1..=86_400).contains(&n)) {
            return Err(bad(
                "source.timeout_seconds",
                format!("must be a number of seconds from 1 to 86400, got {t}"),
            ));
        }
    }
    Ok(())
}

/// A destination connector's own options: its name, what its commits
/// promise, its config (no credential in plain text), its timeout.
fn check_destination_connector(opts: &Map<String, Value>) -> Result<()> {
    let name = opts.get("connector").and_then(Value::as_str).unwrap_or("");
    if !is_connector_name(name) {
        return Err(bad(
            "destination.connector",
            format!(
                "'{name}' is not a connector's name: 1 to {NAME_MAX} lowercase letters, digits, \
                 '_' or '-', as the runner's connectors directory holds it"
            ),
        ));
    }
    let commits = opts.get("commits").and_then(Value::as_str).unwrap_or("");
    if !matches!(commits, "atomic" | "at_least_once") {
        return Err(bad(
            "destination.commits",
            format!(
                "'{commits}' is not what the connector's commits promise: atomic (rows and \
                 marker together) or at_least_once"
            ),
        ));
    }
    match opts.get("config") {
        None | Some(Value::Null) => {}
        Some(Value::Object(c)) => check_config("destination.config", c)?,
        Some(other) => {
            return Err(bad(
                "destination.config",
                format!("must be an object of the connector's options, got {other}"),
            ))
        }
    }
    if let Some(t) = opts.get("timeout_seconds") {
        if !t.as_u64().is_some_and(|n| (1..=86_400).contains(&n)) {
            return Err(bad(
                "destination.timeout_seconds",
                format!("must be a number of seconds from 1 to 86400, got {t}"),
            ));
        }
    }
    Ok(())
}

/// A connector's config: a `{"secret": ...}` value must name a secret, and a
/// credential is never in plain text.
fn check_config(at: &str, config: &Map<String, Value>) -> Result<()> {
    for (k, v) in config {
        let key = k.to_ascii_lowercase();
        let credential = [
            "password",
            "secret",
            "token",
            "credential",
            "api_key",
            "apikey",
        ]
        .iter()
        .any(|c| key.contains(c));
        match v {
            Value::Object(o) if o.contains_key("secret") => {
                let r: SecretRef = serde_json::from_value(v.clone()).map_err(|_| {
                    bad(
                        format!("{at}.{k}"),
                        format!("must be {{\"secret\": \"<name>\"}}, got {v}"),
                    )
                })?;
                r.provider()
                    .map_err(|e| bad(format!("{at}.{k}"), e.to_string()))?;
            }
            Value::String(text)
                if (credential && !text.is_empty()) || secret::has_inline_password(text) =>
            {
                return Err(bad(
                    format!("{at}.{k}"),
                    "carries a credential: keep it in a secret (SELECT orca.set_secret('name', \
                     '<value>')) and write {\"secret\": \"name\"} here",
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn strings(v: Option<&Value>, field: &str) -> Result<Vec<String>> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .filter(|s| is_ident(s))
                    .map(str::to_string)
                    .ok_or_else(|| bad(field, format!("{x} is not a column name")))
            })
            .collect(),
        Some(other) => Err(bad(
            field,
            format!("must be a list of columns, got {other}"),
        )),
    }
}

/// A table stream's source table, `schema.table` or `table`.
fn source_table(obj: &Map<String, Value>, at: &str) -> Result<String> {
    let table = obj.get("table").and_then(Value::as_str).ok_or_else(|| {
        bad(
            format!("{at}.table"),
            "is required: the source table, schema.table",
        )
    })?;
    if !table.split('.').all(is_ident) || table.split('.').count() > 2 {
        return Err(bad(
            format!("{at}.table"),
            format!("'{table}' is not a table name"),
        ));
    }
    Ok(table.to_string())
}

/// The replication slot (and publication) of a CDC sync: one per sync of
/// an org of a control plane (`database`), named so that two control planes
/// or orgs reading one source never share one. At most 63 bytes, the
/// longest name Postgres keeps.
pub fn cdc_slot(database: &str, org: &str, sync: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [database, org, sync] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let hex: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let short: String = sync.chars().take(40).collect();
    format!("orca_{short}_{hex}")
}

/// Validates a sync and returns its normalized definition, with the delivery
/// level each stream keeps. Every error names the connector, option or stream
/// at fault.
pub fn check(
    name: &str,
    source: &Value,
    destination: &Value,
    streams: &Value,
    schedule: Option<&str>,
    required: &str,
) -> Result<SyncDef> {
    // A password in a definition is readable by every viewer of the org and
    // lands in dumps: it belongs in a secret.
    for (side, options) in [("source", source), ("destination", destination)] {
        if let Some(at) = secret::inline_passwords(side, options).first() {
            return Err(bad(
                at,
                "carries a password: keep the connection string in a secret \
                 (SELECT orca.set_secret('name', '<url>')) and write {\"secret\": \"name\"} here",
            ));
        }
    }
    check_rules(name, source, destination, streams, schedule, required)
}

/// Validates a source to be discovered (`orca.discover`): the options a
/// sync's source takes, of a kind whose catalog can be read (postgres,
/// postgres_cdc, connector), with no password in plain text.
pub fn check_source(name: &str, source: &Value) -> Result<Source> {
    if !is_name(name) {
        return Err(bad(
            "name",
            format!("'{name}' is not a valid name: use 1 to {NAME_MAX} lowercase letters, digits or '_'"),
        ));
    }
    if let Some(at) = secret::inline_passwords("source", source).first() {
        return Err(bad(
            at,
            "carries a password: keep the connection string in a secret \
             (SELECT orca.set_secret('name', '<url>')) and write {\"secret\": \"name\"} here",
        ));
    }
    let (src, opts) = connector("source", SOURCES, source)?;
    if !matches!(src.name, "postgres" | "postgres_cdc" | "connector") {
        return Err(bad(
            "source.type",
            format!(
                "'{}' has no catalog to discover (postgres, postgres_cdc and connector have)",
                src.name
            ),
        ));
    }
    if src.name == "connector" {
        check_connector(&opts)?;
    }
    serde_json::from_value(Value::Object(opts)).map_err(|e| bad("source", e.to_string()))
}

fn check_rules(
    name: &str,
    source: &Value,
    destination: &Value,
    streams: &Value,
    schedule: Option<&str>,
    required: &str,
) -> Result<SyncDef> {
    if !is_name(name) {
        return Err(bad(
            "name",
            format!("'{name}' is not a valid name: use 1 to {NAME_MAX} lowercase letters, digits or '_'"),
        ));
    }
    let required = delivery_level("delivery", required)?;
    let (src, src_opts) = connector("source", SOURCES, source)?;
    let (dst, dst_opts) = connector("destination", DESTINATIONS, destination)?;
    if src.name == "files" {
        let format = src_opts.get("format").and_then(Value::as_str).unwrap_or("");
        if !matches!(format, "jsonl" | "csv" | "parquet") {
            return Err(bad(
                "source.format",
                format!("'{format}' is not a format (jsonl, csv or parquet)"),
            ));
        }
    }
    if let Some(l) = dst_opts.get("lanes") {
        if !l.as_u64().is_some_and(|n| (1..=MAX_LANES).contains(&n)) {
            return Err(bad(
                "destination.lanes",
                format!("must be a number of writer lanes from 1 to {MAX_LANES}, got {l}"),
            ));
        }
    }
    if let Some(b) = src_opts.get("batch_rows") {
        if !b
            .as_u64()
            .is_some_and(|n| (1..=BATCH_ROWS_MAX).contains(&n))
        {
            return Err(bad(
                "source.batch_rows",
                format!("must be a number of rows from 1 to {BATCH_ROWS_MAX}, got {b}"),
            ));
        }
    }
    if let Some(c) = src_opts.get("continuous") {
        if !c.is_boolean() {
            return Err(bad(
                "source.continuous",
                format!("must be true or false, got {c}"),
            ));
        }
        if c == &Value::Bool(true) && schedule.is_some() {
            return Err(bad(
                "schedule",
                "a continuous sync runs all the time and takes no schedule",
            ));
        }
    }
    if let Some(e) = src_opts.get("epoch_seconds") {
        if !e.as_u64().is_some_and(|n| (1..=3600).contains(&n)) {
            return Err(bad(
                "source.epoch_seconds",
                format!("must be a number of seconds from 1 to 3600, got {e}"),
            ));
        }
        if src_opts.get("continuous") != Some(&Value::Bool(true)) {
            return Err(bad(
                "source.epoch_seconds",
                "is for a continuous sync (\"continuous\": true)",
            ));
        }
    }
    if let Some(schema) = dst_opts.get("schema") {
        if !schema.as_str().is_some_and(is_ident) {
            return Err(bad(
                "destination.schema",
                format!("must be a schema name, got {schema}"),
            ));
        }
    }
    if dst.name == "iceberg" {
        let ns = dst_opts
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !is_name(ns) {
            return Err(bad(
                "destination.namespace",
                format!("'{ns}' is not a namespace name"),
            ));
        }
    }
    if dst.name == "connector" {
        check_destination_connector(&dst_opts)?;
    }
    let (class, skips_by_id) = match dst.name {
        "parquet" => (DestClass::StageAndApply, false),
        "iceberg" => (DestClass::StageAndApply, true),
        "connector" => match dst_opts.get("commits").and_then(Value::as_str) {
            Some("atomic") => (DestClass::Transactional, false),
            _ => (DestClass::DeliverAndAck, false),
        },
        _ => (DestClass::Transactional, true),
    };
    if src.name == "connector" {
        check_connector(&src_opts)?;
    }
    let replay = match src.name {
        "files" | "postgres_cdc" | "iceberg" => Replay::Exact,
        "connector" if src_opts.get("replay").and_then(Value::as_str) == Some("exact") => {
            Replay::Exact
        }
        _ => Replay::Superset,
    };

    let list = match streams {
        Value::Array(a) if !a.is_empty() => a,
        Value::Array(_) => return Err(bad("streams", "must list at least one stream")),
        other => return Err(bad("streams", format!("must be an array, got {other}"))),
    };
    let mut out = Vec::with_capacity(list.len());
    let mut seen: Vec<String> = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let at = format!("streams[{i}]");
        let obj = s
            .as_object()
            .ok_or_else(|| bad(&at, format!("must be an object, got {s}")))?;
        let sname = obj
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| is_name(n))
            .ok_or_else(|| {
                bad(
                    format!("{at}.name"),
                    "is required: the destination table's name, lowercase",
                )
            })?;
        if seen.iter().any(|n| n == sname) {
            return Err(bad(
                format!("{at}.name"),
                format!("stream '{sname}' is listed twice"),
            ));
        }
        seen.push(sname.to_string());
        // A misspelt option ("curser") would otherwise be dropped without a
        // word and the stream run without it.
        if let Some(key) = obj.keys().find(|k| !STREAM_KEYS.contains(&k.as_str())) {
            return Err(bad(
                format!("{at}.{key}"),
                format!(
                    "is not an option of a stream (it takes {})",
                    STREAM_KEYS.join(", ")
                ),
            ));
        }
        // A stream may ask for more than the sync's level, never less.
        let wanted = match obj.get("delivery") {
            None => required,
            Some(v) => {
                let level = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                delivery_level(format!("{at}.delivery"), &level)?.max(required)
            }
        };
        let mode_name = obj.get("mode").and_then(Value::as_str).unwrap_or("append");
        let mode = WriteMode::parse_name(mode_name).ok_or_else(|| {
            bad(
                format!("{at}.mode"),
                format!("'{mode_name}' is not a write mode (append, merge, overwrite)"),
            )
        })?;
        let primary_key = strings(obj.get("primary_key"), &format!("{at}.primary_key"))?;
        let policy_name = obj
            .get("schema_policy")
            .and_then(Value::as_str)
            .unwrap_or("evolve");
        let schema_policy = match policy_name {
            "evolve" => SchemaPolicy::Evolve,
            "freeze" => SchemaPolicy::Freeze,
            "discard" => SchemaPolicy::Discard,
            _ => {
                return Err(bad(
                    format!("{at}.schema_policy"),
                    format!("'{policy_name}' is not a schema policy (evolve, freeze, discard)"),
                ))
            }
        };
        let mut stream = Stream {
            name: sname.to_string(),
            mode,
            primary_key: primary_key.clone(),
            schema_policy,
            delivery: required,
            table: None,
            cursor: None,
            lookback: None,
            pattern: None,
            splits: None,
            config: None,
            columns: None,
            partition_by: None,
        };
        if let Some(c) = obj.get("columns") {
            if src_opts.get("format").and_then(Value::as_str) == Some("parquet") {
                return Err(bad(
                    format!("{at}.columns"),
                    "declares the types of a files or connector stream's columns; a parquet \
                     stream's columns have its files' types",
                ));
            }
            stream.columns = declared_columns(c, &format!("{at}.columns"), src.name)?;
        }
        if let Some(p) = obj.get("partition_by") {
            stream.partition_by = partition_fields(p, &format!("{at}.partition_by"), dst.name)?;
        }
        if let Some(n) = obj.get("splits") {
            if src.name != "postgres" {
                return Err(bad(
                    format!("{at}.splits"),
                    format!(
                        "is an option of a postgres source's streams, not of a {} source's",
                        src.name
                    ),
                ));
            }
            let splits = n
                .as_u64()
                .filter(|n| (1..=u64::from(SPLITS_MAX)).contains(n))
                .ok_or_else(|| {
                    bad(
                        format!("{at}.splits"),
                        format!(
                            "{n} is not a number of connections from 1 to {SPLITS_MAX} to split \
                             the table's read over"
                        ),
                    )
                })?;
            stream.splits = Some(splits as u32);
        }
        match src.name {
            "iceberg" => {
                let table = obj.get("table").and_then(Value::as_str).unwrap_or("");
                let parts: Vec<&str> = table.split('.').collect();
                if parts.len() != 2 || !parts.iter().all(|p| is_name(p)) {
                    return Err(bad(
                        format!("{at}.table"),
                        format!(
                            "'{table}' is not a table of the org's catalog: namespace.table, \
                             lowercase"
                        ),
                    ));
                }
                stream.table = Some(table.to_string());
                for no in ["cursor", "lookback", "pattern"] {
                    if obj.contains_key(no) {
                        return Err(bad(
                            format!("{at}.{no}"),
                            "is not an option of an iceberg stream: it reads the table's \
                             snapshots in order, without a cursor",
                        ));
                    }
                }
            }
            "connector" => {
                for no in ["table", "cursor", "lookback", "pattern"] {
                    if obj.contains_key(no) {
                        return Err(bad(
                            format!("{at}.{no}"),
                            "is not an option of an external connector's stream: put what the \
                             connector needs in the stream's config",
                        ));
                    }
                }
                match obj.get("config") {
                    None | Some(Value::Null) => {}
                    Some(Value::Object(c)) => {
                        check_config(&format!("{at}.config"), c)?;
                        stream.config = Some(c.clone());
                    }
                    Some(other) => {
                        return Err(bad(
                            format!("{at}.config"),
                            format!("must be an object of the connector's options, got {other}"),
                        ))
                    }
                }
            }
            "postgres_cdc" => {
                stream.table = Some(source_table(obj, &at)?);
                for no in ["cursor", "lookback", "pattern"] {
                    if obj.contains_key(no) {
                        return Err(bad(
                            format!("{at}.{no}"),
                            "is not an option of a postgres_cdc stream: changes come in \
                             commit order from the slot, without a cursor",
                        ));
                    }
                }
                if primary_key.is_empty() {
                    return Err(bad(
                        format!("{at}.primary_key"),
                        "is required for a postgres_cdc source: the table's replica identity, \
                         which deletes and merges key on",
                    ));
                }
            }
            "postgres" => {
                let table = source_table(obj, &at)?;
                let cursor = obj
                    .get("cursor")
                    .and_then(Value::as_str)
                    .filter(|c| is_ident(c))
                    .ok_or_else(|| {
                        bad(
                            format!("{at}.cursor"),
                            "is required: the column that orders changes (updated_at, id)",
                        )
                    })?;
                if primary_key.is_empty() {
                    return Err(bad(
                        format!("{at}.primary_key"),
                        "is required for a postgres source: the cursor and the key make the resume point",
                    ));
                }
                stream.table = Some(table);
                stream.cursor = Some(cursor.to_string());
                if let Some(back) = obj.get("lookback") {
                    let lookback = back
                        .as_str()
                        .and_then(|t| Lookback::try_from(t.to_string()).ok())
                        .ok_or_else(|| {
                            bad(
                                format!("{at}.lookback"),
                                format!(
                                    "{back} is not a lookback such as '10 minutes' (a number and \
                                     second, minute, hour or day)"
                                ),
                            )
                        })?;
                    // Rows read again are harmless only where they land on
                    // themselves: skipped by _orca_id, or merged by key.
                    if dst.name == "iceberg" && mode != WriteMode::Merge {
                        return Err(bad(
                            format!("{at}.lookback"),
                            "reads rows again, which an iceberg append or overwrite would hold \
                             twice; use merge, or a postgres destination",
                        ));
                    }
                    stream.lookback = Some(lookback);
                }
            }
            _ => {
                let pattern = obj
                    .get("pattern")
                    .and_then(Value::as_str)
                    .filter(|p| !p.trim().is_empty())
                    .ok_or_else(|| {
                        bad(
                            format!("{at}.pattern"),
                            "is required: the files of the stream, such as events/*.jsonl",
                        )
                    })?;
                stream.pattern = Some(pattern.to_string());
            }
        }
        if mode == WriteMode::Overwrite && dst.name == "connector" {
            return Err(bad(
                format!("{at}.mode"),
                "a destination connector takes append and merge; overwrite (a refresh behind \
                 a shadow) is not in the connector protocol",
            ));
        }
        if mode == WriteMode::Merge && dst.name == "parquet" {
            return Err(bad(
                format!("{at}.mode"),
                "the parquet destination writes files and cannot merge; use append",
            ));
        }
        if mode == WriteMode::Merge && primary_key.is_empty() {
            return Err(bad(
                format!("{at}.primary_key"),
                "a merge needs a primary key",
            ));
        }
        let facts = StreamFacts {
            class,
            replay,
            mode,
            has_primary_key: !primary_key.is_empty(),
            skips_by_id,
        };
        let kept = delivery::check(facts, wanted).map_err(|reason| Error::ImpossibleDelivery {
            stream: sname.to_string(),
            required: wanted.name(),
            from: src.name,
            to: dst.name,
            reason,
        })?;
        stream.delivery = kept;
        out.push(stream);
    }
    if let Some(cron) = schedule {
        Schedule::parse(cron, "UTC")?;
    }
    // The options were checked above, so these cannot fail but by a bug;
    // the error still names the side.
    let source: Source = serde_json::from_value(Value::Object(src_opts))
        .map_err(|e| bad("source", e.to_string()))?;
    let destination: Destination = serde_json::from_value(Value::Object(dst_opts))
        .map_err(|e| bad("destination", e.to_string()))?;
    Ok(SyncDef {
        name: name.to_string(),
        source,
        destination,
        streams: out,
        schedule: schedule.map(str::to_string),
        delivery: required,
    })
}

/// Replaces each `{"secret": ...}` value of a connector's config with the
/// secret's value.
fn resolve_config(
    config: &mut Map<String, Value>,
    resolver: &mut dyn Resolver,
) -> std::result::Result<(), SecretError> {
    for v in config.values_mut() {
        if let Ok(mut setting) = serde_json::from_value::<Setting>(v.clone()) {
            if matches!(setting, Setting::Secret(_)) {
                setting.resolve(resolver)?;
                if let Setting::Plain(text) = setting {
                    *v = Value::String(text);
                }
            }
        }
    }
    Ok(())
}

/// A stream's declared column types (`{"amount": "float64"}`), for the
/// sources whose records carry no types of their own: files and external
/// connectors. An empty object declares nothing.
fn declared_columns(
    c: &Value,
    at: &str,
    source: &str,
) -> Result<Option<BTreeMap<String, ColumnType>>> {
    if !matches!(source, "files" | "connector") {
        return Err(bad(
            at,
            format!(
                "declares the types of a files or connector stream's columns; a {source} \
                 stream's columns have its table's types"
            ),
        ));
    }
    let Value::Object(m) = c else {
        return Err(bad(
            at,
            format!(
                "must be an object of column names and types, such as {{\"amount\": \"float64\"}}, \
                 got {c}"
            ),
        ));
    };
    if m.len() > DECLARED_COLUMNS_MAX {
        return Err(bad(
            at,
            format!(
                "declares {} columns; a stream declares at most {DECLARED_COLUMNS_MAX}",
                m.len()
            ),
        ));
    }
    let mut out = BTreeMap::new();
    for (name, t) in m {
        if name.trim().is_empty() || name.chars().count() > 255 {
            return Err(bad(
                at,
                format!("{name:?} is not a column name (1 to 255 characters)"),
            ));
        }
        if name.starts_with("_orca_") {
            return Err(bad(
                format!("{at}.{name}"),
                "uses the reserved prefix _orca_ (the engine's own columns)",
            ));
        }
        let ty = t.as_str().and_then(ColumnType::parse).ok_or_else(|| {
            bad(
                format!("{at}.{name}"),
                format!("{t} is not a column type (boolean, int64, float64, string)"),
            )
        })?;
        out.insert(name.clone(), ty);
    }
    Ok((!out.is_empty()).then_some(out))
}

/// An Iceberg destination stream's partitioning (`["day(updated_at)"]`).
/// An empty list asks for none.
fn partition_fields(p: &Value, at: &str, destination: &str) -> Result<Option<Vec<PartitionBy>>> {
    if destination != "iceberg" {
        return Err(bad(
            at,
            format!(
                "partitions an Iceberg destination's table; a {destination} destination has no \
                 partitions"
            ),
        ));
    }
    let Value::Array(list) = p else {
        return Err(bad(
            at,
            format!("must be a list of partition fields, such as [\"day(updated_at)\"], got {p}"),
        ));
    };
    if list.len() > PARTITION_FIELDS_MAX {
        return Err(bad(
            at,
            format!(
                "has {} fields; a table is partitioned by at most {PARTITION_FIELDS_MAX}",
                list.len()
            ),
        ));
    }
    let mut out: Vec<PartitionBy> = Vec::with_capacity(list.len());
    for (i, f) in list.iter().enumerate() {
        let field = f
            .as_str()
            .ok_or_else(|| {
                format!("must be a partition field such as \"day(updated_at)\", got {f}")
            })
            .and_then(PartitionBy::parse)
            .map_err(|reason| bad(format!("{at}[{i}]"), reason))?;
        if out.iter().any(|o| o.same_field(&field)) {
            return Err(bad(
                format!("{at}[{i}]"),
                format!("{field} partitions by a field given before it"),
            ));
        }
        out.push(field);
    }
    Ok((!out.is_empty()).then_some(out))
}

/// A continuous sync's epoch interval unless it sets `epoch_seconds`.
pub const EPOCH_SECONDS_DEFAULT: u64 = 10;

/// A bound on a postgres source's rows per stream per epoch.
pub const BATCH_ROWS_MAX: u64 = 10_000_000;

impl SyncDef {
    /// Checks a stored definition again, as this build's rules see it: a
    /// definition stored by an older control plane, or one whose rules
    /// changed, must still hold before anything moves.
    /// Definitions stored before inline passwords were refused keep working
    /// (their runs warn): this does not refuse them.
    pub fn recheck(&self) -> Result<SyncDef> {
        let streams: Vec<Value> = self
            .streams
            .iter()
            .map(|s| {
                let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
                if let Some(o) = v.as_object_mut() {
                    o.remove("delivery");
                }
                v
            })
            .collect();
        check_rules(
            &self.name,
            &serde_json::to_value(&self.source).unwrap_or(Value::Null),
            &serde_json::to_value(&self.destination).unwrap_or(Value::Null),
            &Value::Array(streams),
            self.schedule.as_deref(),
            self.delivery.name(),
        )
    }

    /// Replaces every secret reference with the secret's value, for the
    /// attempt that is about to connect.
    pub fn resolve_secrets(
        &mut self,
        resolver: &mut dyn Resolver,
    ) -> std::result::Result<(), SecretError> {
        self.source.resolve_secrets(resolver)?;
        for s in &mut self.streams {
            if let Some(config) = &mut s.config {
                resolve_config(config, resolver)?;
            }
        }
        match &mut self.destination {
            Destination::Parquet { url, .. } | Destination::Postgres { url, .. } => {
                url.resolve(resolver)?
            }
            Destination::Iceberg { .. } => {}
            Destination::Connector { config, .. } => resolve_config(config, resolver)?,
        }
        Ok(())
    }

    /// Where the definition keeps a password in plain text (a definition
    /// made before that was refused).
    pub fn inline_passwords(&self) -> Vec<String> {
        let mut at = secret::inline_passwords(
            "source",
            &serde_json::to_value(&self.source).unwrap_or(Value::Null),
        );
        at.extend(secret::inline_passwords(
            "destination",
            &serde_json::to_value(&self.destination).unwrap_or(Value::Null),
        ));
        at
    }

    /// What the connectors reach, by where the definition says it: the
    /// options netguard judges (those that name a secret are judged once
    /// the attempt has read it).
    pub fn reaches(&self) -> Vec<(&'static str, Reach<'_>)> {
        let mut out = self.source.reaches();
        match &self.destination {
            Destination::Postgres { url, .. } => {
                if let Ok(u) = url.plain() {
                    out.push(("destination.url", Reach::Postgres(u)));
                }
            }
            Destination::Parquet { url, .. } => {
                if let Ok(u) = url.plain() {
                    out.push(("destination.url", Reach::Place(u)));
                }
            }
            // As for a source connector: its spec names what it reaches,
            // checked before it starts.
            Destination::Iceberg { .. } | Destination::Connector { .. } => {}
        }
        out
    }

    /// The definition as `orca.syncs.definition` stores it.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The definition as it is stored, for the assertions below.
    fn check(
        name: &str,
        source: &Value,
        destination: &Value,
        streams: &Value,
        schedule: Option<&str>,
        required: &str,
    ) -> Result<Value> {
        super::check(name, source, destination, streams, schedule, required).map(|d| d.to_json())
    }

    fn pg() -> Value {
        json!({"type": "postgres", "url": "postgres://127.0.0.1/shop"})
    }
    fn orders(mode: &str) -> Value {
        json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                "primary_key": ["id"], "mode": mode}])
    }

    #[test]
    fn a_stream_option_it_does_not_know_is_refused_by_name() {
        let parquet = json!({"type": "parquet", "url": "/tmp/out"});
        let mut s = orders("append");
        s[0]["curser"] = json!("updated_at");
        let e = check("shop", &pg(), &parquet, &s, None, "at_least_once").expect_err("typo");
        assert_eq!(e.sqlstate(), "OR063");
        assert!(e.to_string().contains("streams[0].curser"), "{e}");
        assert!(e.to_string().contains("cursor"), "{e}");
        // A stored definition's streams (with the delivery each keeps) can be
        // given again as they are.
        let pg_dst = json!({"type": "postgres", "url": "postgres://127.0.0.1/dw"});
        let def = check(
            "shop",
            &pg(),
            &pg_dst,
            &orders("merge"),
            None,
            "at_least_once",
        )
        .expect("merge");
        let again = check(
            "shop",
            &pg(),
            &pg_dst,
            &def["streams"],
            None,
            "at_least_once",
        )
        .expect("the stored streams");
        assert_eq!(again["streams"], def["streams"]);
    }

    #[test]
    fn the_stream_options_taken_are_the_keys_a_stream_is_stored_with() {
        let stream = Stream {
            name: "orders".into(),
            mode: WriteMode::Append,
            primary_key: vec!["id".into()],
            schema_policy: SchemaPolicy::Evolve,
            delivery: Delivery::AtLeastOnce,
            table: Some("public.orders".into()),
            cursor: Some("updated_at".into()),
            lookback: Lookback::try_from("10 minutes".to_string()).ok(),
            pattern: Some("*.jsonl".into()),
            splits: Some(2),
            config: Some(Map::new()),
            columns: Some(BTreeMap::from([("id".into(), ColumnType::Int64)])),
            partition_by: Some(vec![PartitionBy::parse("day(updated_at)").expect("day")]),
        };
        let stored = serde_json::to_value(&stream).expect("json");
        let mut keys: Vec<&str> = stored
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut taken = STREAM_KEYS.to_vec();
        keys.sort_unstable();
        taken.sort_unstable();
        assert_eq!(keys, taken);
    }

    #[test]
    fn a_stream_may_ask_for_more_delivery_than_the_sync_never_less() {
        let pg_dst = json!({"type": "postgres", "url": "postgres://127.0.0.1/dw"});
        let mut s = orders("merge");
        s[0]["delivery"] = json!("effectively_once");
        let def = check("shop", &pg(), &pg_dst, &s, None, "at_least_once").expect("merge");
        assert_eq!(def["streams"][0]["delivery"], "effectively_once");
        // An append from a source that may read rows again cannot promise it
        // into a destination that cannot skip them: OR062 names the stream.
        let mut s = orders("append");
        s[0]["delivery"] = json!("effectively_once");
        let parquet = json!({"type": "parquet", "url": "/tmp/out"});
        let e = check("shop", &pg(), &parquet, &s, None, "at_least_once").expect_err("append");
        assert_eq!(e.sqlstate(), "OR062");
        assert!(e.to_string().contains("orders"), "{e}");
        // Asking for less than the sync keeps the sync's level.
        let mut s = orders("merge");
        s[0]["delivery"] = json!("at_least_once");
        let def = check("shop", &pg(), &pg_dst, &s, None, "effectively_once").expect("merge");
        assert_eq!(def["streams"][0]["delivery"], "effectively_once");
        s[0]["delivery"] = json!("twice");
        let e = check("shop", &pg(), &pg_dst, &s, None, "at_least_once").expect_err("level");
        assert_eq!(e.sqlstate(), "OR063");
        assert!(e.to_string().contains("streams[0].delivery"), "{e}");
    }

    #[test]
    fn writer_lanes_are_a_destination_option_from_1_to_64() {
        for lanes in [1, 4, 64] {
            let dst = json!({"type": "parquet", "url": "/tmp/out", "lanes": lanes});
            check(
                "shop",
                &pg(),
                &dst,
                &orders("append"),
                None,
                "at_least_once",
            )
            .expect("ok");
        }
        for bad_lanes in [json!(0), json!(65), json!("2"), json!(1.5)] {
            let dst = json!({"type": "parquet", "url": "/tmp/out", "lanes": bad_lanes});
            let e = check(
                "shop",
                &pg(),
                &dst,
                &orders("append"),
                None,
                "at_least_once",
            )
            .expect_err("refused")
            .to_string();
            assert!(
                e.contains("destination.lanes") && e.contains(&bad_lanes.to_string()),
                "{e}"
            );
        }
    }

    #[test]
    fn a_lookback_is_a_length_and_only_where_rows_read_again_land_on_themselves() {
        assert_eq!(lookback_seconds("10 minutes"), Some(600));
        assert_eq!(lookback_seconds("1 hour"), Some(3600));
        assert_eq!(lookback_seconds("90 seconds"), Some(90));
        for bad in ["10", "ten minutes", "5 weeks", "1 hour ago", ""] {
            assert_eq!(lookback_seconds(bad), None, "{bad}");
        }
        let with = |mode: &str, lookback: Value| {
            let mut s = orders(mode);
            s[0]["lookback"] = lookback;
            s
        };
        let dw = json!({"type": "postgres", "url": "postgres://127.0.0.1/dw"});
        let v = check(
            "shop",
            &pg(),
            &dw,
            &with("append", json!("10 minutes")),
            None,
            "exactly_once",
        )
        .expect("ok");
        assert_eq!(v["streams"][0]["lookback"], "10 minutes");
        let e = check(
            "shop",
            &pg(),
            &dw,
            &with("append", json!("soon")),
            None,
            "exactly_once",
        )
        .expect_err("bad lookback");
        assert_eq!(e.sqlstate(), "OR063");
        assert!(e.to_string().contains("streams[0].lookback"), "{e}");
        let ice = json!({"type": "iceberg", "namespace": "raw"});
        let e = check(
            "shop",
            &pg(),
            &ice,
            &with("append", json!("1 hour")),
            None,
            "exactly_once",
        )
        .expect_err("iceberg append");
        assert!(e.to_string().contains("use merge"), "{e}");
        check(
            "shop",
            &pg(),
            &ice,
            &with("merge", json!("1 hour")),
            None,
            "effectively_once",
        )
        .expect("a merge takes rows again");
    }

    #[test]
    fn a_postgres_table_into_iceberg_or_postgres_keeps_what_it_can() {
        let ice = json!({"type": "iceberg", "namespace": "raw"});
        let dst = json!({"type": "postgres", "url": "postgres://127.0.0.1/dw", "schema": "raw"});
        // A merge is effectively once; an append or a refresh from a
        // superset source lands once where rows are skipped by _orca_id.
        for (destination, mode, level) in [
            (&ice, "append", "exactly_once"),
            (&ice, "merge", "effectively_once"),
            (&ice, "overwrite", "exactly_once"),
            (&dst, "merge", "effectively_once"),
            (&dst, "overwrite", "exactly_once"),
        ] {
            let v = check("shop", &pg(), destination, &orders(mode), None, level)
                .unwrap_or_else(|e| panic!("{mode} into {destination}: {e}"));
            assert_eq!(
                v["streams"][0]["delivery"], level,
                "{mode} into {destination}"
            );
        }
        let v = check(
            "shop",
            &pg(),
            &dst,
            &orders("append"),
            Some("*/5 * * * *"),
            "exactly_once",
        )
        .expect("ok");
        assert_eq!(v["schedule"], "*/5 * * * *");
    }

    #[test]
    fn errors_name_the_connector_option_or_stream() {
        let parquet = json!({"type": "parquet", "url": "/tmp/out"});
        let e = check(
            "shop",
            &pg(),
            &parquet,
            &orders("append"),
            None,
            "exactly_once",
        )
        .expect_err("superset into parquet");
        assert_eq!(e.sqlstate(), "OR062");
        assert!(e.to_string().contains("stream 'orders'"), "{e}");
        assert!(check(
            "shop",
            &pg(),
            &parquet,
            &orders("append"),
            None,
            "at_least_once"
        )
        .is_ok());

        let e = check(
            "shop",
            &json!({"type": "mysql", "url": "x"}),
            &parquet,
            &orders("append"),
            None,
            "at_least_once",
        )
        .expect_err("unknown");
        assert_eq!(e.sqlstate(), "OR060");
        assert!(e.to_string().contains("'mysql'"), "{e}");
        let e = check(
            "shop",
            &json!({"type": "postgres"}),
            &parquet,
            &orders("append"),
            None,
            "at_least_once",
        )
        .expect_err("missing url");
        assert_eq!(e.sqlstate(), "OR061");
        assert!(e.to_string().contains("'url'"), "{e}");
        let e = check(
            "shop",
            &pg(),
            &json!({"type": "parquet", "url": "/x", "path": "/y"}),
            &orders("append"),
            None,
            "at_least_once",
        )
        .expect_err("unknown option");
        assert!(e.to_string().contains("destination.path"), "{e}");
        let mut s = orders("append");
        s[0]["cursor"] = Value::Null;
        let e = check("shop", &pg(), &parquet, &s, None, "at_least_once").expect_err("no cursor");
        assert!(e.to_string().contains("streams[0].cursor"), "{e}");
        let e = check(
            "shop",
            &pg(),
            &parquet,
            &orders("merge"),
            None,
            "at_least_once",
        )
        .expect_err("merge");
        assert!(e.to_string().contains("cannot merge"), "{e}");
        let e = check(
            "shop",
            &pg(),
            &parquet,
            &orders("append"),
            Some("0 0 30 2 *"),
            "at_least_once",
        )
        .expect_err("cron");
        assert_eq!(e.sqlstate(), "OR031");
        let e = check(
            "Shop!",
            &pg(),
            &parquet,
            &orders("append"),
            None,
            "at_least_once",
        )
        .expect_err("name");
        assert_eq!(e.sqlstate(), "OR063");
    }

    #[test]
    fn iceberg_sources_read_tables_of_the_orgs_catalog_by_name() {
        let lake = json!({"type": "iceberg", "batch_rows": 500});
        let out = json!({"type": "parquet", "url": "/out"});
        let with = |streams: Value| check("s", &lake, &out, &streams, None, "exactly_once");
        let def = with(json!([{"name": "events", "table": "lake.events"}])).expect("valid");
        let typed: SyncDef = serde_json::from_value(def).expect("typed");
        assert!(typed.source.typed());
        assert_eq!(typed.source.kind(), "iceberg");
        assert!(typed.source.url().is_none() && typed.source.reaches().is_empty());
        assert_eq!(typed.streams[0].table.as_deref(), Some("lake.events"));
        for (streams, field, says) in [
            (
                json!([{"name": "e"}]),
                "streams[0].table",
                "is not a table of the org's catalog",
            ),
            (
                json!([{"name": "e", "table": "public.a.b"}]),
                "streams[0].table",
                "namespace.table",
            ),
            (
                json!([{"name": "e", "table": "Lake.Events"}]),
                "streams[0].table",
                "lowercase",
            ),
            (
                json!([{"name": "e", "table": "lake.e", "cursor": "at"}]),
                "streams[0].cursor",
                "is not an option of an iceberg stream",
            ),
            (
                json!([{"name": "e", "table": "lake.e", "columns": {"a": "int64"}}]),
                "streams[0].columns",
                "have its table's types",
            ),
        ] {
            let e = with(streams.clone()).expect_err("refused").to_string();
            assert!(e.contains(field) && e.contains(says), "{streams}: {e}");
        }
        let e = check(
            "s",
            &json!({"type": "iceberg", "url": "/x"}),
            &out,
            &json!([{"name": "e", "table": "lake.e"}]),
            None,
            "exactly_once",
        )
        .expect_err("url")
        .to_string();
        assert!(e.contains("source.url"), "{e}");
    }

    #[test]
    fn parquet_files_are_a_typed_files_source() {
        let parquet = json!({"type": "files", "url": "/in", "format": "parquet"});
        let out = json!({"type": "parquet", "url": "/out"});
        let def = check(
            "s",
            &parquet,
            &out,
            &json!([{"name": "a", "pattern": "*.parquet"}]),
            None,
            "exactly_once",
        )
        .expect("valid");
        let typed: SyncDef = serde_json::from_value(def).expect("typed");
        assert!(typed.source.typed());
        let e = check(
            "s",
            &parquet,
            &out,
            &json!([{"name": "a", "pattern": "*.parquet", "columns": {"x": "int64"}}]),
            None,
            "exactly_once",
        )
        .expect_err("columns")
        .to_string();
        assert!(
            e.contains("a parquet stream's columns have its files' types"),
            "{e}"
        );
        let e = check(
            "s",
            &json!({"type": "files", "url": "/in", "format": "orc"}),
            &out,
            &json!([{"name": "a", "pattern": "*.orc"}]),
            None,
            "exactly_once",
        )
        .expect_err("orc")
        .to_string();
        assert!(
            e.contains("'orc' is not a format (jsonl, csv or parquet)"),
            "{e}"
        );
    }

    #[test]
    fn iceberg_streams_declare_their_tables_partitioning() {
        let pg = json!({"type": "postgres", "url": "postgres://127.0.0.1/shop"});
        let with = |dest: Value, partition_by: Value| {
            check(
                "s",
                &pg,
                &dest,
                &json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                         "primary_key": ["id"], "partition_by": partition_by}]),
                None,
                "exactly_once",
            )
        };
        let lake = json!({"type": "iceberg", "namespace": "raw"});
        let def = with(
            lake.clone(),
            json!(["day(updated_at)", " bucket(16,id)", "region"]),
        )
        .expect("valid");
        assert_eq!(
            def["streams"][0]["partition_by"],
            json!(["day(updated_at)", "bucket(16, id)", "region"])
        );
        let typed: SyncDef = serde_json::from_value(def).expect("typed");
        let fields = typed.streams[0].partition_by.clone().expect("fields");
        assert_eq!(fields[1].transform, PartitionTransform::Bucket(16));
        assert!(with(lake.clone(), json!([])).expect("none")["streams"][0]
            .get("partition_by")
            .is_none());
        for (partition_by, field, says) in [
            (
                json!(["week(at)"]),
                "streams[0].partition_by[0]",
                "is not a partition transform",
            ),
            (
                json!([3]),
                "streams[0].partition_by[0]",
                "must be a partition field",
            ),
            (
                json!("day(at)"),
                "streams[0].partition_by",
                "must be a list",
            ),
            (
                json!(["day(at)", "days(at)"]),
                "streams[0].partition_by[1]",
                "a field given before it",
            ),
            (
                json!(["a", "b", "c", "d", "e", "f", "g", "h", "i"]),
                "streams[0].partition_by",
                "at most 8",
            ),
        ] {
            let e = with(lake.clone(), partition_by.clone()).expect_err("refused");
            assert_eq!(e.sqlstate(), "OR063");
            let e = e.to_string();
            assert!(e.contains(field) && e.contains(says), "{partition_by}: {e}");
        }
        let e = with(
            json!({"type": "parquet", "url": "/out"}),
            json!(["day(updated_at)"]),
        )
        .expect_err("parquet")
        .to_string();
        assert!(e.contains("a parquet destination has no partitions"), "{e}");
    }

    #[test]
    fn files_and_connector_streams_declare_column_types_by_name() {
        let files = json!({"type": "files", "url": "/in", "format": "csv"});
        let out = json!({"type": "parquet", "url": "/out"});
        let with = |columns: Value| {
            check(
                "s",
                &files,
                &out,
                &json!([{"name": "a", "pattern": "*.csv", "columns": columns}]),
                None,
                "exactly_once",
            )
        };
        let def =
            with(json!({"amount": "float64", "id": "int64", "ok": "boolean", "note": "string"}))
                .expect("valid");
        assert_eq!(def["streams"][0]["columns"]["amount"], "float64");
        assert_eq!(def["streams"][0]["columns"]["ok"], "boolean");
        // Nothing declared is the same as no declaration.
        let def = with(json!({})).expect("empty");
        assert!(def["streams"][0].get("columns").is_none());
        for (columns, field, says) in [
            (
                json!({"amount": "decimal"}),
                "streams[0].columns.amount",
                "\"decimal\" is not a column type",
            ),
            (
                json!({"amount": 3}),
                "streams[0].columns.amount",
                "3 is not a column type",
            ),
            (
                json!({"_orca_id": "string"}),
                "streams[0].columns._orca_id",
                "reserved prefix",
            ),
            (
                json!({"": "string"}),
                "streams[0].columns",
                "is not a column name",
            ),
            (
                json!(["amount"]),
                "streams[0].columns",
                "must be an object of column names and types",
            ),
        ] {
            let e = with(columns.clone()).expect_err("refused").to_string();
            assert!(e.contains(field) && e.contains(says), "{columns}: {e}");
        }
        let many: Map<String, Value> = (0..=DECLARED_COLUMNS_MAX)
            .map(|i| (format!("c{i}"), json!("string")))
            .collect();
        let e = with(Value::Object(many)).expect_err("too many").to_string();
        assert!(e.contains("declares 1001 columns"), "{e}");
        // A table's columns have the table's types.
        let e = check(
            "s",
            &json!({"type": "postgres", "url": "postgres://127.0.0.1/shop"}),
            &out,
            &json!([{"name": "a", "table": "public.a", "cursor": "id", "primary_key": ["id"],
                     "columns": {"id": "int64"}}]),
            None,
            "at_least_once",
        )
        .expect_err("postgres")
        .to_string();
        assert!(
            e.contains("a postgres stream's columns have its table's types"),
            "{e}"
        );
    }

    #[test]
    fn schema_policies_are_named_and_default_to_evolve() {
        let files = json!({"type": "files", "url": "/in", "format": "jsonl"});
        let out = json!({"type": "parquet", "url": "/out"});
        let def = check(
            "s",
            &files,
            &out,
            &json!([{"name": "a", "pattern": "*.jsonl"},
                    {"name": "b", "pattern": "*.jsonl", "schema_policy": "freeze"}]),
            None,
            "exactly_once",
        )
        .expect("valid");
        assert_eq!(def["streams"][0]["schema_policy"], "evolve");
        assert_eq!(def["streams"][1]["schema_policy"], "freeze");
        let e = check(
            "s",
            &files,
            &out,
            &json!([{"name": "a", "pattern": "*.jsonl", "schema_policy": "lax"}]),
            None,
            "exactly_once",
        )
        .expect_err("unknown policy");
        assert!(
            e.to_string().contains("'lax' is not a schema policy"),
            "{e}"
        );
    }

    #[test]
    fn files_are_an_exact_source() {
        let files = json!({"type": "files", "url": "s3://in/events", "format": "jsonl"});
        let parquet = json!({"type": "parquet", "url": "/tmp/out"});
        let s = json!([{"name": "events", "pattern": "*.jsonl"}]);
        let v = check("ev", &files, &parquet, &s, None, "exactly_once").expect("ok");
        assert_eq!(v["streams"][0]["delivery"], "exactly_once");
        let bad_format = json!({"type": "files", "url": "/in", "format": "xml"});
        assert!(check("ev", &bad_format, &parquet, &s, None, "exactly_once").is_err());
    }

    #[test]
    fn a_cdc_source_is_exact_needs_a_key_and_takes_no_cursor() {
        let cdc = json!({"type": "postgres_cdc", "url": "postgres://127.0.0.1/shop"});
        let dw = json!({"type": "postgres", "url": "postgres://127.0.0.1/dw"});
        let def = check(
            "shop",
            &cdc,
            &dw,
            &json!([{"name": "orders", "table": "public.orders", "primary_key": ["id"],
                     "mode": "merge"},
                    {"name": "log", "table": "public.orders", "primary_key": ["id"]}]),
            None,
            "exactly_once",
        )
        .expect("valid");
        assert_eq!(def["source"]["type"], "postgres_cdc");
        assert_eq!(def["streams"][0]["delivery"], "exactly_once");
        assert_eq!(def["streams"][1]["delivery"], "exactly_once");
        let e = check(
            "shop",
            &cdc,
            &dw,
            &json!([{"name": "orders", "table": "public.orders", "primary_key": ["id"],
                     "cursor": "updated_at"}]),
            None,
            "at_least_once",
        )
        .expect_err("a cursor");
        assert!(e.to_string().contains("streams[0].cursor"), "{e}");
        let e = check(
            "shop",
            &cdc,
            &dw,
            &json!([{"name": "orders", "table": "public.orders"}]),
            None,
            "at_least_once",
        )
        .expect_err("no key");
        assert!(e.to_string().contains("replica identity"), "{e}");
    }

    #[test]
    fn cdc_slots_differ_by_control_plane_org_and_sync_and_fit_postgres() {
        let a = cdc_slot("orca", "acme", "shop");
        assert!(a.starts_with("orca_shop_"), "{a}");
        assert_ne!(a, cdc_slot("orca2", "acme", "shop"));
        assert_ne!(a, cdc_slot("orca", "beta", "shop"));
        assert_eq!(a, cdc_slot("orca", "acme", "shop"));
        let long = cdc_slot("orca", "acme", &"s".repeat(63));
        assert!(long.len() <= 63, "{long}");
        assert!(long
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
    }

    #[test]
    fn a_continuous_sync_is_cdc_without_a_schedule_with_a_bounded_epoch() {
        let cdc = |extra: Value| {
            let mut v = json!({"type": "postgres_cdc", "url": "postgres://127.0.0.1/shop"});
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            v
        };
        let dw = json!({"type": "postgres", "url": "postgres://127.0.0.1/dw"});
        let streams = json!([{"name": "orders", "table": "public.orders", "primary_key": ["id"]}]);
        let def = check(
            "live",
            &cdc(json!({"continuous": true, "epoch_seconds": 2})),
            &dw,
            &streams,
            None,
            "exactly_once",
        )
        .expect("valid");
        assert_eq!(def["source"]["continuous"], true);
        let parsed: SyncDef = serde_json::from_value(def).expect("a definition");
        assert_eq!(parsed.source.continuous(), Some(2));
        for (extra, schedule, field) in [
            (json!({"continuous": true}), Some("* * * * *"), "schedule"),
            (json!({"continuous": "yes"}), None, "source.continuous"),
            (
                json!({"continuous": true, "epoch_seconds": 0}),
                None,
                "source.epoch_seconds",
            ),
            (json!({"epoch_seconds": 5}), None, "source.epoch_seconds"),
        ] {
            let e = check(
                "live",
                &cdc(extra),
                &dw,
                &streams,
                schedule,
                "at_least_once",
            )
            .expect_err("refused");
            assert!(e.to_string().contains(field), "{e}");
        }
    }

    #[test]
    fn a_connector_s_replay_decides_its_delivery_and_its_secrets_are_resolved() {
        let dst = json!({"type": "iceberg", "namespace": "raw"});
        let src = |replay: &str| {
            json!({"type": "connector", "connector": "nats_jetstream", "replay": replay,
                   "config": {"servers": "nats://10.0.0.1:4222", "password": {"secret": "nats"}}})
        };
        let streams = json!([{"name": "orders", "config": {"stream": "ORDERS"}}]);
        let exact = check(
            "events",
            &src("exact"),
            &dst,
            &streams,
            None,
            "exactly_once",
        )
        .expect("an exact connector into an Iceberg append is exactly once");
        assert_eq!(exact["streams"][0]["config"]["stream"], "ORDERS");
        let parquet = json!({"type": "parquet", "url": "/tmp/out"});
        check(
            "events",
            &src("exact"),
            &parquet,
            &streams,
            None,
            "exactly_once",
        )
        .expect("exact into stage-and-apply files");
        check(
            "events",
            &src("superset"),
            &parquet,
            &streams,
            None,
            "exactly_once",
        )
        .expect_err("a superset read again lands twice in files that cannot skip rows");
        let mut def = super::check(
            "events",
            &src("exact"),
            &dst,
            &streams,
            None,
            "at_least_once",
        )
        .expect("definition");
        struct Fixed;
        impl Resolver for Fixed {
            fn resolve(
                &mut self,
                p: &secret::Provider,
            ) -> std::result::Result<String, SecretError> {
                Ok(format!("value of {p:?}"))
            }
        }
        def.resolve_secrets(&mut Fixed).expect("resolved");
        let Source::Connector { config, .. } = &def.source else {
            panic!("a connector source")
        };
        assert!(config["password"]
            .as_str()
            .is_some_and(|p| p.contains("nats")));
        assert_eq!(config["servers"], "nats://10.0.0.1:4222");
    }
}
