//! The readers of what an engine asks to read: a [`Plan`]
//! ([`crate::source::read_plan`]) is what the engine sends a runner's pump
//! in its open frame, and what the engine reads by itself when no runner
//! hosts the source.

use orca_core::sync::Stream;
use serde_json::Value;

use crate::netguard::Guard;
use crate::source::connector::{spawn_connector, ConnectorAcks};
use crate::source::error::ReadError;
use crate::source::files::Format;
use crate::source::pg_cdc::{lowest_acknowledged, spawn_cdc, Acks, SlotGauge};
use crate::source::pg_table::{describe, PgTable, SourceError, StreamSpec};
pub use crate::source::read_plan::{Plan, Start};
use crate::source::readers::{spawn_file_reader, spawn_reader, Reader};
use crate::util::{str_of, strings, Missing};

/// Where the commit protocol's acknowledgements go, for a source that
/// confirms upstream what a committed checkpoint covers.
pub(crate) enum Upstream {
    /// A change stream's slot: the lowest acknowledged LSN of its streams.
    Slot(Acks),
    /// An external connector: ack frames on its socket.
    Connector(ConnectorAcks),
}

impl Upstream {
    /// Takes the acknowledged resume points (stream, the point's values
    /// joined by U+001F).
    pub(crate) fn acknowledge<'a>(&self, positions: impl IntoIterator<Item = (&'a str, &'a str)>) {
        match self {
            Upstream::Slot(acks) => {
                let recorded = positions.into_iter().map(|(_, p)| p);
                if let Some(lsn) = lowest_acknowledged(recorded) {
                    acks.fetch_max(lsn.0, std::sync::atomic::Ordering::AcqRel);
                }
            }
            Upstream::Connector(c) => c.acknowledge(positions),
        }
    }
}

/// Starts a reader thread per stream of the plan, reading the source
/// itself (the engine reading without a runner does this too), and, for a
/// source that confirms upstream (a change stream, an external connector),
/// where its acknowledgements go. A change stream's slot is measured into
/// `gauge`, if one is given, while its readers read.
pub(crate) fn open_readers(
    plan: &Plan,
    gauge: Option<&SlotGauge>,
) -> Result<(Vec<Reader>, Option<Upstream>), ReadError> {
    let guard = Guard::new(&plan.guard)?;
    let kind = str_of(&plan.source, "type")?;
    if kind == "connector" {
        let (readers, acks) = spawn_connector(plan, &guard)?;
        return Ok((readers, Some(Upstream::Connector(acks))));
    }
    let url = str_of(&plan.source, "url")?;
    let definition = serde_json::json!({ "streams": plan.streams });
    match kind.as_str() {
        "postgres_cdc" => {
            let specs = stream_specs(&definition, true)?;
            let mut probe = guard.postgres(&url)?;
            let mut streams = Vec::new();
            for s in &plan.start {
                let spec = specs.iter().find(|p| p.name == s.name).ok_or_else(|| {
                    ReadError::Definition(format!("stream {} is not defined", s.name))
                })?;
                streams.push((cdc_table(&mut probe, spec, &s.recorded)?, s.after.clone()));
            }
            drop(probe);
            let slot = str_of(&plan.source, "slot")?;
            let continuous =
                (plan.source.get("continuous") == Some(&Value::Bool(true))).then(|| {
                    std::time::Duration::from_secs(
                        plan.source
                            .get("epoch_seconds")
                            .and_then(Value::as_u64)
                            .unwrap_or(orca_core::sync::EPOCH_SECONDS_DEFAULT),
                    )
                });
            let (readers, acks) = spawn_cdc(
                guard,
                url,
                slot,
                streams,
                plan.batch_rows,
                continuous,
                gauge,
            )?;
            Ok((readers, Some(Upstream::Slot(acks))))
        }
        "postgres" => {
            let specs = stream_specs(&definition, false)?;
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
                .collect::<Result<Vec<_>, _>>()
                .map(|r| (r, None))
        }
        "files" => {
            // The directory as netguard allowed it, links resolved: each
            // file is then read only if it lies under it (FileReader).
            let root = guard.place(&url)?;
            let url = match &root {
                Some(real) => real.display().to_string(),
                None => url,
            };
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
                        root.clone(),
                        format,
                        s.name.clone(),
                        str_of(def, "pattern")?,
                        s.after.clone(),
                        plan.batch_rows,
                    )
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|r| (r, None))
        }
        other => Err(ReadError::NotBuilt(format!(
            "the {other} source's data path"
        ))),
    }
}

/// A change stream's table, looked up, under the schema it delivered
/// before: a column that is gone stops it whatever its policy (a change
/// stream cannot tell a dropped column's later rows from nulls).
pub(crate) fn cdc_table(
    client: &mut postgres::Client,
    spec: &StreamSpec,
    recorded: &[(String, String)],
) -> Result<PgTable, ReadError> {
    let t = describe(client, spec)?;
    let gone: Vec<&str> = recorded
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !n.starts_with("_orca_") && !t.columns.iter().any(|c| c.name == *n))
        .collect();
    if !gone.is_empty() {
        return Err(ReadError::Table(SourceError::SchemaChanged {
            stream: spec.name.clone(),
            table: spec.table.clone(),
            policy: spec.schema_policy.clone(),
            added: String::new(),
            missing: gone.join(", "),
        }));
    }
    Ok(t.under_policy(recorded)?)
}

/// The streams of a typed definition, for the Postgres sources: each needs
/// its table, and a cursor unless it is a change stream.
pub(crate) fn table_specs(streams: &[Stream], cdc: bool) -> Result<Vec<StreamSpec>, Missing> {
    streams
        .iter()
        .map(|s| {
            Ok(StreamSpec {
                name: s.name.clone(),
                table: s.table.clone().ok_or_else(|| Missing::of("table", s))?,
                cursor: match cdc {
                    true => String::new(),
                    false => s.cursor.clone().ok_or_else(|| Missing::of("cursor", s))?,
                },
                primary_key: s.primary_key.clone(),
                schema_policy: s.schema_policy.name().to_string(),
                lookback: s.lookback.as_ref().map(|l| l.as_str().to_string()),
                cdc,
                splits: s.splits.and_then(|n| u8::try_from(n).ok()),
            })
        })
        .collect()
}

/// The streams of a definition as the data edge carries it (JSON), for the
/// Postgres source.
pub(crate) fn stream_specs(def: &Value, cdc: bool) -> Result<Vec<StreamSpec>, ReadError> {
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
                cursor: match cdc {
                    true => String::new(),
                    false => str_of(s, "cursor")?,
                },
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
                cdc,
                splits: s
                    .get("splits")
                    .and_then(Value::as_u64)
                    .and_then(|n| u8::try_from(n).ok()),
            })
        })
        .collect()
}
