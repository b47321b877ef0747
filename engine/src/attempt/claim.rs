//! Claiming a sync: listen for the runner, claim the sync (a new
//! generation), check its definition again, look the source's streams up,
//! open the store and the destination, and raise the destination's fence.

use std::collections::BTreeSet;

use orca_core::api::LeaseToken;
use serde_json::{json, Value};

use crate::attempt::error::EngineError;
use crate::attempt::log::Log;
use crate::attempt::options::{Options, DEFAULT_BATCH_ROWS};
use crate::attempt::state::{Attempt, Source};
use crate::commit::record::Layout;
use crate::commit::store::Store;
use crate::dest::destination::Dest;
use crate::source::files::Format;
use crate::source::normalize::Policy;
use crate::source::pg_table::{self, PgTable};
use crate::source::plan::{stream_specs, Plan};
use crate::transport::control::{Control, Phase};
use crate::transport::edge::Edge;
use crate::util::str_of;

/// A claimed sync, its fence raised: what its epochs start from.
pub(super) struct Claimed {
    pub(super) attempt: Attempt,
    /// What to read; where each stream starts is for recovery to say.
    pub(super) plan: Plan,
    pub(super) source: Source,
    /// Writer lanes.
    pub(super) lanes: usize,
    /// The epoch HEAD names, and its record, as the claim found them.
    pub(super) head_epoch: u64,
    pub(super) head_record: Option<String>,
    /// A backfill was asked for: every stream again from its start.
    pub(super) full: bool,
}

/// Claims the sync and raises the destination's fence. Anything that fails
/// here fails before the attempt has a log in the store.
pub(super) fn claim(opts: &Options) -> Result<Claimed, EngineError> {
    let (channel, mut edge) = listen(opts)?;
    let mut control = orca_client::Control::connect(&opts.database_url, Some(&opts.org))?;
    let lease = opts
        .lease
        .as_deref()
        .map(|l| {
            l.parse::<LeaseToken>()
                .map_err(|e| EngineError::Definition(format!("--lease {l:?}: {e}")))
        })
        .transpose()?;
    let claim = control.claim_sync(&opts.sync, lease)?;
    let full = claim.request.full();
    let generation = claim.generation.0;
    let head_epoch = claim.epoch.0;
    let head_record = claim.record.clone();
    if let Some(c) = &channel {
        c.update(|s| {
            s.phase = Phase::Recovering;
            s.generation = generation;
            s.head = head_epoch;
        });
    }
    // The delivery levels again, as this build of the rules sees the
    // definition: a definition stored by an older control plane, or one whose
    // rules changed, must still hold before anything moves.
    claim
        .definition
        .recheck()
        .map_err(|e| EngineError::Definition(e.to_string()))?;
    let def = claim.definition.to_json();
    let source = def.get("source").cloned().unwrap_or(Value::Null);
    let destination = def.get("destination").cloned().unwrap_or(Value::Null);
    let source_type = str_of(&source, "type")?;
    let batch_rows = opts
        .batch_rows
        .or(batch_rows_of(&source)?)
        .unwrap_or(DEFAULT_BATCH_ROWS);
    let url = str_of(&source, "url")?;
    let stop = || channel.as_ref().is_some_and(Control::stop_requested);
    let source = look_up(&def, &source, &source_type, &url, edge.as_mut(), stop)?;
    let tables: &[PgTable] = match &source {
        Source::Tables(t) => t,
        Source::Files { .. } => &[],
    };
    let layout = Layout::new(&opts.org, &opts.sync);
    let store = Store::open(&opts.store_url)?;
    let dest = Dest::open(
        &destination,
        &opts.database_url,
        &opts.org,
        &opts.sync,
        tables,
        &def,
    )?;
    let mut a = Attempt {
        log: Log::new(layout.log(generation), generation),
        opts: opts.clone(),
        control,
        store,
        dest,
        layout,
        generation,
        streams: match &source {
            Source::Tables(t) => t.iter().map(|t| t.spec.name.clone()).collect(),
            Source::Files { streams, .. } => streams.iter().map(|s| s.0.clone()).collect(),
        },
        overwrite: overwrite_streams(&def),
        channel,
        edge,
    };
    a.log.event(
        "claimed",
        json!({"sync": opts.sync, "head": head_epoch, "batch_rows": batch_rows,
               "run": std::env::var("ORCA_RUN").ok(),
               "attempt": std::env::var("ORCA_ATTEMPT").ok()}),
    );
    // Raise the fence before looking at HEAD, so that no older attempt can
    // make anything visible while this one decides.
    a.dest
        .raise_fence(generation, &a.streams)
        .map_err(|e| a.dest_error(e))?;
    let lanes = lanes_of(opts.lanes, &destination);
    let plan = Plan {
        sync: opts.sync.clone(),
        source: def.get("source").cloned().unwrap_or(Value::Null),
        streams: def.get("streams").cloned().unwrap_or(Value::Null),
        batch_rows,
        start: Vec::new(),
    };
    Ok(Claimed {
        attempt: a,
        plan,
        source,
        lanes,
        head_epoch,
        head_record,
        full,
    })
}

/// Listens on the control channel and the data edge a runner asked for,
/// first thing, so that the runner can ask how the attempt goes from its
/// first moment on.
fn listen(opts: &Options) -> Result<(Option<Control>, Option<Edge>), EngineError> {
    let channel = match &opts.control {
        Some(path) => {
            Some(
                Control::listen(path, &opts.sync).map_err(|source| EngineError::Channel {
                    path: path.display().to_string(),
                    source,
                })?,
            )
        }
        None => None,
    };
    let edge = match &opts.edge {
        Some(path) => Some(Edge::listen(path).map_err(|e| EngineError::Edge {
            path: path.display().to_string(),
            reason: format!("listening: {e}"),
        })?),
        None => None,
    };
    Ok((channel, edge))
}

/// The source's streams, looked up before anything is written: a missing
/// table or column, or a format the readers do not know, stops the attempt
/// here. A runner hosting a Postgres source looks its tables up for the
/// engine over the data edge; `stop` is asked while waiting for it.
fn look_up(
    def: &Value,
    source: &Value,
    source_type: &str,
    url: &str,
    edge: Option<&mut Edge>,
    stop: impl Fn() -> bool,
) -> Result<Source, EngineError> {
    match source_type {
        "postgres" => {
            let specs = stream_specs(def)?;
            let tables = match edge {
                Some(e) => {
                    let asked = json!({"source": source, "streams": def.get("streams")});
                    let tables = e.describe(asked, stop)?;
                    let names: Vec<&str> = tables.iter().map(|t| t.spec.name.as_str()).collect();
                    let want: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                    if names != want {
                        return Err(EngineError::Definition(format!(
                            "the runner described streams {names:?}, the definition has {want:?}"
                        )));
                    }
                    tables
                }
                None => {
                    let mut probe = postgres::Client::connect(url, postgres::NoTls)?;
                    specs
                        .iter()
                        .map(|spec| pg_table::describe(&mut probe, spec))
                        .collect::<Result<Vec<_>, _>>()?
                }
            };
            Ok(Source::Tables(tables))
        }
        "files" => {
            Format::parse(&str_of(source, "format")?).ok_or_else(|| {
                EngineError::Definition(format!("source.format of {source} is not jsonl or csv"))
            })?;
            let streams = def
                .get("streams")
                .and_then(Value::as_array)
                .ok_or_else(|| EngineError::Definition("no streams".into()))?
                .iter()
                .map(|s| {
                    let policy = s
                        .get("schema_policy")
                        .and_then(Value::as_str)
                        .and_then(Policy::parse)
                        .unwrap_or_default();
                    Ok((str_of(s, "name")?, str_of(s, "pattern")?, policy))
                })
                .collect::<Result<Vec<_>, EngineError>>()?;
            Ok(Source::Files { streams })
        }
        other => Err(EngineError::NotBuilt(format!(
            "the {other} source's data path"
        ))),
    }
}

/// The source's `batch_rows`, if it sets one.
fn batch_rows_of(source: &Value) -> Result<Option<usize>, EngineError> {
    match source.get("batch_rows") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
            .filter(|n| *n >= 1)
            .map(|n| Some(n as usize))
            .ok_or_else(|| {
                EngineError::Definition(format!(
                    "source.batch_rows must be a positive number of rows, got {v}"
                ))
            }),
    }
}

/// The streams written with `overwrite`.
fn overwrite_streams(def: &Value) -> BTreeSet<String> {
    def.get("streams")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|s| s.get("mode").and_then(Value::as_str) == Some("overwrite"))
        .filter_map(|s| s.get("name").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// Writer lanes: the options', else the destination's, else one; never
/// more than a destination may ask for.
fn lanes_of(asked: Option<usize>, destination: &Value) -> usize {
    asked
        .or(destination
            .get("lanes")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok()))
        .unwrap_or(1)
        .clamp(1, orca_core::sync::MAX_LANES as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_rows_is_a_positive_number_or_absent() {
        assert_eq!(batch_rows_of(&json!({"url": "x"})).ok(), Some(None));
        assert_eq!(batch_rows_of(&json!({"batch_rows": null})).ok(), Some(None));
        assert_eq!(
            batch_rows_of(&json!({"batch_rows": 500})).ok(),
            Some(Some(500))
        );
        assert_eq!(
            batch_rows_of(&json!({"batch_rows": "500"})).ok(),
            Some(Some(500))
        );
        for bad in [json!(0), json!(-3), json!("many"), json!(2.5)] {
            let e = batch_rows_of(&json!({ "batch_rows": bad }))
                .expect_err("refused")
                .to_string();
            assert_eq!(
                e,
                format!(
                    "sync definition: source.batch_rows must be a positive number of rows, \
                     got {bad}"
                )
            );
        }
    }

    #[test]
    fn lanes_come_from_the_options_then_the_destination_within_bounds() {
        let dst = json!({"type": "parquet", "lanes": 4});
        assert_eq!(lanes_of(None, &dst), 4);
        assert_eq!(lanes_of(Some(2), &dst), 2);
        assert_eq!(lanes_of(None, &json!({"type": "parquet"})), 1);
        assert_eq!(lanes_of(Some(0), &dst), 1);
        assert_eq!(
            lanes_of(Some(1000), &dst),
            orca_core::sync::MAX_LANES as usize
        );
    }

    #[test]
    fn only_overwrite_streams_are_refreshed() {
        let def = json!({"streams": [
            {"name": "orders", "mode": "append"},
            {"name": "prices", "mode": "overwrite"},
            {"name": "users", "mode": "merge"},
        ]});
        assert_eq!(
            overwrite_streams(&def),
            BTreeSet::from(["prices".to_string()])
        );
    }
}
