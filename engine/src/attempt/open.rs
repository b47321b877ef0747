//! Opening the streams: a reader per stream from its resume point (fed by
//! the runner's pump over the data edge, or reading the source here), what
//! each stream's rows become columns by, and the router that splits them
//! over the writer lanes.

use std::collections::BTreeMap;

use serde_json::json;

use crate::attempt::state::{Attempt, Source};
use crate::commit::record::StreamState;
use crate::commit::route::Router;
use crate::error::EngineError;
use crate::ids::IdForm;
use crate::source::normalize::{ColType, StreamSchema};
use crate::source::open::open_readers;
use crate::source::plan::{Plan, Start};
use crate::source::readers::{Reader, Shape};

/// The streams opened: a reader each, in the plan's order, and a router
/// each, by stream.
pub(super) struct Opened {
    pub(super) readers: Vec<Reader>,
    pub(super) routers: BTreeMap<String, Router>,
    /// The writer lanes the routers split rows over.
    pub(super) lanes: usize,
}

impl Attempt {
    /// Starts reading every stream from its resume point in `states`; the
    /// first epoch read is the one after `head`.
    pub(super) fn open(
        &mut self,
        mut plan: Plan,
        source: Source,
        lanes: usize,
        head: u64,
        states: &BTreeMap<String, StreamState>,
    ) -> Result<Opened, EngineError> {
        plan.start = starts(&self.streams, states);
        // The org's catalog is the engine's to read (a runner's pump holds
        // no lease of it): an iceberg source's streams never come over the
        // edge, whose pump ends when this attempt does.
        let edge = match plan.source {
            orca_core::sync::Source::Iceberg { .. } => None,
            _ => self.edge.take(),
        };
        let mut readers = match edge {
            Some(mut edge) => {
                let opened = edge.open(&plan, head + 1, || self.stop_requested());
                // Kept for the attempt's life: dropping it removes the socket.
                self.edge = Some(edge);
                let r = opened?;
                self.log.event("edge", json!({"streams": plan.start.len()}));
                r
            }
            None if matches!(plan.source, orca_core::sync::Source::Iceberg { .. }) => {
                crate::source::lake::iceberg::open_iceberg(&plan, &self.opts.lake_config())?
            }
            None => {
                // Without a runner no one reports the slot: the control
                // plane's tick measures a slot of its own server itself.
                let (readers, acks) = open_readers(&plan, None)?;
                self.acks = acks;
                readers
            }
        };
        // What each stream's rows become columns by, and their lanes: a key's
        // rows all go to one lane: the table's primary key, or for files (no
        // key) the record's `_orca_id`.
        let mut routers: BTreeMap<String, Router> = BTreeMap::new();
        match source {
            Source::Tables(tables) => {
                for (r, table) in readers.iter_mut().zip(tables) {
                    routers.insert(
                        table.spec.name.clone(),
                        Router::new(lanes, table.spec.primary_key.clone()),
                    );
                    let recorded = states
                        .get(&table.spec.name)
                        .map(|s| s.schema.clone())
                        .unwrap_or_default();
                    r.shape = Shape::Table(table.under_policy(&recorded)?);
                }
            }
            Source::Raw(streams) => {
                for (r, s) in readers.iter_mut().zip(streams) {
                    routers.insert(s.name.clone(), Router::new(lanes, Vec::new()));
                    let cols = states.get(&s.name).map(inferred_so_far).unwrap_or_default();
                    let names = states.get(&s.name).map(|st| st.names.clone());
                    let recorded = states.get(&s.name).map_or(&[][..], |st| &st.schema[..]);
                    let schema = StreamSchema::inferred(cols)
                        .with_names(names.unwrap_or_default())
                        .with_ids(IdForm::of_recorded(recorded))
                        .with_policy(s.policy)
                        .declaring(&s.declared)
                        .map_err(|reason| {
                            EngineError::Definition(format!("stream {}: {reason}", s.name))
                        })?;
                    r.shape = Shape::Inferred(schema);
                }
            }
        }
        Ok(Opened {
            readers,
            routers,
            lanes,
        })
    }
}

/// Where each stream resumes, and the schema the checkpoint log recorded
/// for it (which a `freeze` or `discard` policy keeps the source to).
fn starts(streams: &[String], states: &BTreeMap<String, StreamState>) -> Vec<Start> {
    streams
        .iter()
        .map(|name| Start {
            name: name.clone(),
            after: states.get(name).and_then(|s| s.position.clone()),
            recorded: states
                .get(name)
                .map(|s| s.schema.clone())
                .unwrap_or_default(),
        })
        .collect()
}

/// The columns inferred so far of a files stream, from its recorded schema
/// (the engine's own `_orca_` columns left out): the schema only ever
/// widens from there.
fn inferred_so_far(state: &StreamState) -> Vec<(String, ColType)> {
    state
        .schema
        .iter()
        .filter(|(n, _)| !n.starts_with("_orca_"))
        .filter_map(|(n, t)| ColType::from_arrow_name(t).map(|t| (n.clone(), t)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stream_starts_where_the_log_left_it_with_its_recorded_schema() {
        let mut states = BTreeMap::new();
        states.insert(
            "orders".to_string(),
            StreamState {
                position: Some(vec!["2024-05-01".into(), "42".into()]),
                schema: vec![("id".into(), "Int64".into())],
                ..StreamState::default()
            },
        );
        let streams = ["orders".to_string(), "fresh".to_string()];
        let s = starts(&streams, &states);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "orders");
        assert_eq!(
            s[0].after.as_deref(),
            Some(&["2024-05-01".to_string(), "42".to_string()][..])
        );
        assert_eq!(s[0].recorded, [("id".to_string(), "Int64".to_string())]);
        assert_eq!((s[1].name.as_str(), s[1].after.is_none()), ("fresh", true));
        assert!(s[1].recorded.is_empty());
    }

    #[test]
    fn a_files_stream_widens_from_its_recorded_columns_without_the_engines_own() {
        let state = StreamState {
            schema: vec![
                ("id".into(), "Int64".into()),
                ("note".into(), "Utf8".into()),
                ("_orca_id".into(), "Utf8".into()),
                ("_orca_seq".into(), "Int64".into()),
                ("at".into(), "Timestamp(Microsecond, Some(\"UTC\"))".into()),
            ],
            ..StreamState::default()
        };
        assert_eq!(
            inferred_so_far(&state),
            [
                ("id".to_string(), ColType::Int64),
                ("note".to_string(), ColType::String)
            ]
        );
    }
}
