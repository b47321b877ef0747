//! Claiming a sync: listen for the runner, claim the sync (a new
//! generation), check its definition again, look the source's streams up,
//! open the store and the destination, and raise the destination's fence.

use std::collections::BTreeSet;

use orca_core::api::LeaseToken;
use orca_core::delivery::WriteMode;
use orca_core::sync::{Destination, FileFormat, Source as SourceDef, Stream, SyncDef};
use serde_json::{json, Value};

use crate::attempt::log::Log;
use crate::attempt::options::{Options, DEFAULT_BATCH_ROWS};
use crate::attempt::state::{Attempt, RawStream, Source};
use crate::commit::record::Layout;
use crate::commit::store::Store;
use crate::dest::destination::Dest;
use crate::error::EngineError;
use crate::netguard::{Guard, Scope};
use crate::source::normalize::{ColType, Policy};
use crate::source::plan::{Describe, Plan};
use crate::source::postgres::open::table_specs;
use crate::source::postgres::table::{self, PgTable};
use crate::transport::control::{Control, Phase};
use crate::transport::edge::Edge;
use crate::util::Missing;

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
    // Secrets are read now, under this attempt's lease, and live only in
    // this process (and the source pump of the runner that hosts it).
    let mut resolved = claim.definition.clone();
    let mut secrets = orca_client::Secrets::new(&mut control, lease);
    resolved
        .resolve_secrets(&mut secrets)
        .map_err(|e| EngineError::Definition(e.to_string()))?;
    let def = &resolved;
    // What the connectors may reach: the org's allowlist, outside the
    // installation's own store and warehouse.
    let scope = Scope {
        org: opts.org.clone(),
        allowlist: claim.allowlist.clone(),
        store: Some(opts.store_url.clone()),
        warehouse: std::env::var("ORCA_WAREHOUSE")
            .ok()
            .filter(|w| !w.is_empty())
            .map(|w| orca_lake::catalog::absolute_warehouse(&w)),
    };
    let guard = Guard::new(&scope)?;
    if !guard.enforced() {
        eprintln!(
            "orca-engine: the control plane predates netguard (no allowlist in its claim): \
             the sync's connections are not checked"
        );
    }
    let batch_rows = opts
        .batch_rows
        .or(batch_rows_of(&def.source)?)
        .unwrap_or(DEFAULT_BATCH_ROWS);
    let stop = || channel.as_ref().is_some_and(Control::stop_requested);
    let source = look_up(
        def,
        edge.as_mut(),
        stop,
        &guard,
        &scope,
        &opts.lake_config(),
    )?;
    let tables: &[PgTable] = match &source {
        Source::Tables(t) => t,
        Source::Raw(_) => &[],
    };
    let drift = match (
        &def.source,
        claim.catalog.as_ref().and_then(|c| c.get("streams")),
    ) {
        // A connector's streams are what its discover lists: asked again
        // now, under the same netguard as its read.
        (
            SourceDef::Connector {
                connector, config, ..
            },
            Some(planned),
        ) => {
            let found = crate::source::external::connector::discover(
                connector,
                &Value::Object(config.clone()),
                &guard,
            )?;
            let names: Vec<String> = def.streams.iter().map(|s| s.name.clone()).collect();
            orca_core::catalog::connector_drift(planned, &names, &found)
        }
        _ => drift_from_catalog(claim.catalog.as_ref(), tables),
    };
    if claim.catalog.is_some() {
        // Reported, not enforced: the streams' schema policy decides what
        // a change does to the attempt.
        control.report_drift(
            &opts.sync,
            claim.generation,
            &serde_json::to_value(&drift).unwrap_or_default(),
            lease,
        )?;
    }
    let layout = Layout::new(&opts.org, &opts.sync);
    let store = Store::open(&opts.store_url)?;
    let dest = Dest::open(
        &def.destination,
        &guard,
        &opts.database_url,
        &opts.org,
        &opts.sync,
        tables,
        &def.streams,
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
            Source::Raw(streams) => streams.iter().map(|s| s.name.clone()).collect(),
        },
        overwrite: overwrite_streams(&def.streams),
        channel,
        edge,
        acks: None,
        takes_acks: def.source.is_cdc() || matches!(def.source, SourceDef::Connector { .. }),
    };
    for (stream, table, declared) in a.dest.partitioning_drift() {
        // Said, not enforced: the table goes on as it was made.
        a.log.event(
            "partitioning",
            json!({"stream": stream, "table": table, "declared": declared,
                   "note": "the table keeps the partitioning it was made with"}),
        );
    }
    if !drift.is_empty() {
        a.log.event(
            "drift",
            json!({"catalog_version": claim.catalog.as_ref().map(|c| c["version"].clone()),
                   "changes": drift}),
        );
    }
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
    let lanes = lanes_of(opts.lanes, &def.destination);
    // The slot is the sync's own in this control plane and org.
    let slot = def.source.is_cdc().then(|| {
        let control_db = opts
            .database_url
            .parse::<postgres::Config>()
            .ok()
            .and_then(|c| c.get_dbname().or(c.get_user()).map(str::to_string))
            .unwrap_or_else(|| "postgres".into());
        orca_core::sync::cdc_slot(&control_db, &opts.org, &opts.sync)
    });
    let plan = Plan {
        sync: opts.sync.clone(),
        source: def.source.clone(),
        streams: def.streams.clone(),
        slot,
        batch_rows,
        start: Vec::new(),
        guard: scope,
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

/// How the tables differ from the catalog version the streams were
/// planned from (`{"version", "streams"}`), table by table.
fn drift_from_catalog(
    catalog: Option<&Value>,
    tables: &[PgTable],
) -> Vec<orca_core::catalog::Drift> {
    let Some(planned) = catalog.and_then(|c| c.get("streams")) else {
        return Vec::new();
    };
    tables
        .iter()
        .flat_map(|t| {
            let found: Vec<orca_core::catalog::Column> = t
                .columns
                .iter()
                .zip(&t.sql_types)
                .map(|(c, ty)| orca_core::catalog::Column {
                    name: c.name.clone(),
                    sql_type: ty.clone(),
                    nullable: c.nullable,
                    toastable: false,
                })
                .collect();
            orca_core::catalog::drift(planned, &t.spec.table, &found)
        })
        .collect()
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
/// table or column stops the attempt here. A runner hosting a Postgres
/// source looks its tables up for the engine over the data edge; `stop` is
/// asked while waiting for it.
fn look_up(
    def: &SyncDef,
    edge: Option<&mut Edge>,
    stop: impl Fn() -> bool,
    guard: &Guard,
    scope: &Scope,
    lake_config: &orca_lake::LakeConfig,
) -> Result<Source, EngineError> {
    match &def.source {
        SourceDef::Postgres { url, .. } | SourceDef::PostgresCdc { url, .. } => {
            let specs = table_specs(&def.streams, def.source.is_cdc())?;
            let tables = match edge {
                Some(e) => described(e, def, stop, scope)?,
                None => {
                    let url = url
                        .plain()
                        .map_err(|e| EngineError::Definition(e.to_string()))?;
                    let mut probe = guard.postgres(url)?;
                    specs
                        .iter()
                        .map(|spec| table::describe(&mut probe, spec))
                        .collect::<Result<Vec<_>, _>>()?
                }
            };
            Ok(Source::Tables(tables))
        }
        SourceDef::Files {
            url,
            format: FileFormat::Parquet,
        } => {
            guard.place(
                url.plain()
                    .map_err(|e| EngineError::Definition(e.to_string()))?,
            )?;
            let tables = match edge {
                Some(e) => described(e, def, stop, scope)?,
                None => crate::source::files::open::describe(&Describe {
                    source: def.source.clone(),
                    streams: def.streams.clone(),
                    guard: scope.clone(),
                })?,
            };
            Ok(Source::Tables(tables))
        }
        SourceDef::Iceberg { .. } => {
            let lake = orca_lake::Lake::open(lake_config)
                .map_err(|e| EngineError::Definition(format!("the lake: {e}")))?;
            let tables = def
                .streams
                .iter()
                .map(|s| crate::source::lake::iceberg::describe(&lake, lake_config, s))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Source::Tables(tables))
        }
        SourceDef::Files { url, .. } => {
            guard.place(
                url.plain()
                    .map_err(|e| EngineError::Definition(e.to_string()))?,
            )?;
            for s in &def.streams {
                s.pattern
                    .as_ref()
                    .ok_or_else(|| Missing::of("pattern", s))?;
            }
            Ok(Source::Raw(raw_streams(&def.streams)))
        }
        // Raw records, as files are; the connector starts when the streams
        // are opened (on the runner that hosts the source, or here).
        SourceDef::Connector { .. } => Ok(Source::Raw(raw_streams(&def.streams))),
    }
}

/// The streams' tables as the runner's pump describes them, in the
/// definition's order.
fn described(
    e: &mut Edge,
    def: &SyncDef,
    stop: impl Fn() -> bool,
    scope: &Scope,
) -> Result<Vec<PgTable>, EngineError> {
    let asked = Describe {
        source: def.source.clone(),
        streams: def.streams.clone(),
        guard: scope.clone(),
    };
    let tables = e.describe(&asked, stop)?;
    let names: Vec<&str> = tables.iter().map(|t| t.spec.name.as_str()).collect();
    let want: Vec<&str> = def.streams.iter().map(|s| s.name.as_str()).collect();
    if names != want {
        return Err(EngineError::Definition(format!(
            "the runner described streams {names:?}, the definition has {want:?}"
        )));
    }
    Ok(tables)
}

/// The streams of a source of raw records, with their policies and the
/// column types they declare.
fn raw_streams(streams: &[Stream]) -> Vec<RawStream> {
    streams
        .iter()
        .map(|s| RawStream {
            name: s.name.clone(),
            policy: Policy::from(s.schema_policy),
            declared: s
                .columns
                .iter()
                .flatten()
                .map(|(n, t)| (n.clone(), ColType::from(*t)))
                .collect(),
        })
        .collect()
}

/// The source's `batch_rows`, if it sets one.
fn batch_rows_of(source: &SourceDef) -> Result<Option<usize>, EngineError> {
    match source {
        SourceDef::Postgres {
            batch_rows: Some(n),
            ..
        }
        | SourceDef::PostgresCdc {
            batch_rows: Some(n),
            ..
        }
        | SourceDef::Connector {
            batch_rows: Some(n),
            ..
        }
        | SourceDef::Iceberg {
            batch_rows: Some(n),
        } => usize::try_from(*n)
            .ok()
            .filter(|n| *n >= 1)
            .map(Some)
            .ok_or_else(|| {
                EngineError::Definition(format!(
                    "source.batch_rows must be a positive number of rows, got {n}"
                ))
            }),
        SourceDef::Postgres { .. }
        | SourceDef::PostgresCdc { .. }
        | SourceDef::Files { .. }
        | SourceDef::Iceberg { .. }
        | SourceDef::Connector { .. } => Ok(None),
    }
}

/// The streams written with `overwrite`.
fn overwrite_streams(streams: &[Stream]) -> BTreeSet<String> {
    streams
        .iter()
        .filter(|s| s.mode == WriteMode::Overwrite)
        .map(|s| s.name.clone())
        .collect()
}

/// Writer lanes: the options', else the destination's, else one; never
/// more than a destination may ask for.
fn lanes_of(asked: Option<usize>, destination: &Destination) -> usize {
    asked
        .or(destination.lanes().and_then(|n| usize::try_from(n).ok()))
        .unwrap_or(1)
        .clamp(1, orca_core::sync::MAX_LANES as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn postgres(batch_rows: Option<u64>) -> SourceDef {
        SourceDef::Postgres {
            url: "postgres://127.0.0.1/shop".into(),
            batch_rows,
        }
    }

    #[test]
    fn batch_rows_is_a_positive_number_or_absent() {
        assert_eq!(batch_rows_of(&postgres(None)).ok(), Some(None));
        assert_eq!(batch_rows_of(&postgres(Some(500))).ok(), Some(Some(500)));
        let files: SourceDef =
            serde_json::from_value(json!({"type": "files", "url": "/in", "format": "csv"}))
                .expect("a files source");
        assert_eq!(batch_rows_of(&files).ok(), Some(None));
        let e = batch_rows_of(&postgres(Some(0)))
            .expect_err("refused")
            .to_string();
        assert_eq!(
            e,
            "sync definition: source.batch_rows must be a positive number of rows, got 0"
        );
    }

    #[test]
    fn lanes_come_from_the_options_then_the_destination_within_bounds() {
        let dst = |lanes| Destination::Parquet {
            url: "/out".into(),
            lanes,
        };
        assert_eq!(lanes_of(None, &dst(Some(4))), 4);
        assert_eq!(lanes_of(Some(2), &dst(Some(4))), 2);
        assert_eq!(lanes_of(None, &dst(None)), 1);
        assert_eq!(lanes_of(Some(0), &dst(Some(4))), 1);
        assert_eq!(
            lanes_of(Some(1000), &dst(None)),
            orca_core::sync::MAX_LANES as usize
        );
    }

    fn stream(name: &str, mode: &str) -> Stream {
        serde_json::from_value(json!({
            "name": name, "mode": mode, "primary_key": ["id"],
            "schema_policy": "evolve", "delivery": "at_least_once",
            "pattern": format!("{name}/*.jsonl"),
        }))
        .expect("a stream")
    }

    #[test]
    fn only_overwrite_streams_are_refreshed() {
        let streams = [
            stream("orders", "append"),
            stream("prices", "overwrite"),
            stream("users", "merge"),
        ];
        assert_eq!(
            overwrite_streams(&streams),
            BTreeSet::from(["prices".to_string()])
        );
    }

    #[test]
    fn the_plan_carries_the_definition_typed_through_the_open_frame() {
        let def: SyncDef = serde_json::from_value(json!({
            "name": "shop",
            "source": {"type": "files", "url": "/in", "format": "jsonl"},
            "destination": {"type": "parquet", "url": "/out"},
            "streams": [{"name": "orders", "mode": "append", "primary_key": [],
                         "schema_policy": "freeze", "delivery": "at_least_once",
                         "pattern": "orders/*.jsonl"}],
            "schedule": null,
            "delivery": "at_least_once",
        }))
        .expect("a definition");
        let plan = Plan {
            sync: def.name.clone(),
            source: def.source.clone(),
            streams: def.streams.clone(),
            slot: None,
            batch_rows: 10,
            start: Vec::new(),
            guard: Scope::default(),
        };
        // The open frame carries the plan as JSON; the pump reads it back
        // into the same types, the source as the definition stores it.
        let sent = serde_json::to_value(&plan).expect("json");
        assert_eq!(sent["source"], def.to_json()["source"]);
        assert!(sent.get("slot").is_none());
        let read: Plan = serde_json::from_value(sent).expect("the pump's plan");
        assert_eq!(read, plan);
        assert_eq!(read.stream("orders").ok(), def.streams.first());
        let e = read.stream("refunds").expect_err("not defined").to_string();
        assert_eq!(e, "sync definition: stream refunds is not defined");
    }
}
