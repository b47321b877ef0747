//! One attempt of a sync, end to end: claim the sync (a new generation),
//! raise the destination's fence, recover the epoch HEAD names, then read
//! every stream from its resume point in epochs until the source has no more
//! rows, committing each epoch through the protocol's coordinator.
//!
//! Each stream is read by its own thread (`readers`): a Postgres table over
//! its own connection (binary COPY into Arrow), or files through the object
//! store (raw records, normalized here). Those threads run in the runner
//! when one hosts the source ([`crate::transport::pump`]), their chunks coming over the
//! data edge ([`crate::transport::edge`]), or here. The attempt's thread holds cells the
//! destination cannot take, stages, records, moves HEAD and commits, one
//! epoch after the other.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write as _;
use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, TimestampMicrosecondArray};
use bytes::Bytes;
use orca_core::api::{Epoch, Generation, LeaseToken};
use orca_core::sqlstate;
use serde_json::{json, Value};

use crate::commit::protocol::{Action, Committable, Coordinator, Positions, ProtocolError};
use crate::commit::record::{LaneCommittable, Layout, Record, Refresh, Staged, StreamState};
use crate::commit::recovery::{self, HeadState, Recovery, RecoveryError};
use crate::commit::route::{LaneInput, Router};
use crate::commit::store::{Store, StoreError};
use crate::dest::destination::Dest;
use crate::dest::error::DestError;
use crate::dest::parquet;
use crate::source::error::ReadError;
use crate::source::files::{FilesError, Format};
use crate::source::normalize::{ColType, Policy, Raw, StreamSchema};
use crate::source::pg_copy::CopyError;
use crate::source::pg_table::{self, PgTable, SourceError};
use crate::source::plan::{open_readers, stream_specs, Plan, Start};
use crate::source::readers::{Msg, Shape};
use crate::transport::control::{Control, Phase};
use crate::transport::edge::{Edge, EdgeError};
pub use crate::util::pg_text;
use crate::util::{str_of, Missing};

/// Rows per stream per epoch unless the source's `batch_rows` says otherwise.
pub const DEFAULT_BATCH_ROWS: usize = 100_000;

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
    #[error("control channel at {path}: {source}")]
    Channel {
        path: String,
        source: std::io::Error,
    },
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
        }
    }
}

impl From<EdgeError> for EngineError {
    fn from(EdgeError { path, reason }: EdgeError) -> Self {
        EngineError::Edge { path, reason }
    }
}

/// What an attempt needs to know.
#[derive(Debug, Clone)]
pub struct Options {
    /// The control plane (the database with the orca extension).
    pub database_url: String,
    pub org: String,
    pub sync: String,
    /// Where checkpoints, staged epochs and logs live.
    pub store_url: String,
    /// Overrides the source's `batch_rows`.
    pub batch_rows: Option<usize>,
    /// Overrides the destination's `lanes` (writer lanes, default 1).
    pub lanes: Option<usize>,
    /// The lease of the run's attempt, when a runner started this one.
    pub lease: Option<String>,
    /// Where to listen for the control channel (`control`), if anywhere.
    pub control: Option<std::path::PathBuf>,
    /// Where to listen for the runner's source pump (`edge`): the runner
    /// reads the source and sends it over this data edge. Without one the
    /// engine reads the source itself.
    pub edge: Option<std::path::PathBuf>,
    /// A fault to inject: the attempt stops dead at that point of that
    /// epoch, without cleaning anything up, as a crash would (the
    /// simulation's; None otherwise).
    pub crash: Option<Crash>,
}

/// Where in an epoch an injected crash strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// The epoch's files are staged; its record is not written.
    Staged,
    /// The record is in the store; HEAD has not moved to it.
    Recorded,
    /// HEAD moved (the commit point); lane 0 has not committed.
    HeadMoved,
    /// The destination applied the epoch; its staged files are still there.
    Applied,
}

/// An injected crash: at `at` of epoch `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crash {
    pub at: CrashPoint,
    pub epoch: u64,
}

/// What an attempt did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub generation: i32,
    /// What recovery decided for HEAD's epoch.
    pub recovery: String,
    /// The epoch HEAD named when the attempt started, and when it ended.
    pub from_epoch: u64,
    pub to_epoch: u64,
    pub rows: u64,
    /// Bytes of binary COPY read from the source.
    pub source_bytes: u64,
    /// Bytes of Parquet staged.
    pub staged_bytes: u64,
    /// Records set aside under `_quarantine/`.
    pub quarantined: u64,
    /// Cells held under `_held/` (the destination got null).
    pub held: u64,
    /// The attempt stopped on a `stop` request, at a resume point, before the
    /// source ran out of rows.
    pub stopped: bool,
}

/// The attempt's log: JSON lines, kept under `_logs/` next to the checkpoint
/// log and echoed to stderr.
struct Log {
    path: String,
    lines: Vec<String>,
    generation: i32,
}

impl Log {
    fn event(&mut self, event: &str, fields: Value) {
        let mut line = json!({
            "at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "generation": self.generation,
            "event": event,
        });
        if let (Some(l), Value::Object(f)) = (line.as_object_mut(), fields) {
            l.extend(f);
        }
        let text = line.to_string();
        // Stderr is the runner's pipe: once a runner died it is broken, and
        // the log must still reach the store (eprintln! would panic).
        let _ = writeln!(std::io::stderr(), "{text}");
        self.lines.push(text);
    }

    fn flush(&self, store: &Store) -> Result<(), StoreError> {
        let mut body = self.lines.join("\n");
        body.push('\n');
        store.put(&self.path, Bytes::from(body))
    }
}

/// A chunk of one stream at a barrier, before it is staged.
enum Taken {
    Typed {
        schema: Arc<arrow_schema::Schema>,
        arrays: Vec<ArrayRef>,
        ids: ArrayRef,
        rows: usize,
    },
    Raw(Vec<Result<Raw, (Raw, String)>>),
}

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

/// Where an attempt resumes after recovery.
struct Recovered {
    said: String,
    /// HEAD's epoch after recovery (one less after a rewind).
    head: u64,
    states: BTreeMap<String, StreamState>,
    /// The record resumed from: the next record's `previous`.
    record: Option<String>,
}

struct Attempt {
    opts: Options,
    control: orca_client::Control,
    store: Store,
    dest: Dest,
    layout: Layout,
    generation: i32,
    log: Log,
    streams: Vec<String>,
    /// The streams written with `overwrite`: each attempt refreshes them.
    overwrite: BTreeSet<String>,
    /// The control channel, when a runner asked for one.
    channel: Option<Control>,
    /// The data edge the runner's source pump connects to, when a runner
    /// hosts the source.
    edge: Option<Edge>,
}

impl Attempt {
    /// Stops dead here if the injected crash says so.
    fn crash_point(&self, at: CrashPoint, epoch: u64) -> Result<(), EngineError> {
        match self.opts.crash {
            Some(c) if c.at == at && c.epoch == epoch => Err(EngineError::Crashed { at, epoch }),
            _ => Ok(()),
        }
    }

    /// Tells the control channel, if there is one, how the attempt goes.
    fn report(&self, f: impl FnOnce(&mut crate::transport::control::Status)) {
        if let Some(c) = &self.channel {
            c.update(f);
        }
    }

    fn stop_requested(&self) -> bool {
        self.channel.as_ref().is_some_and(Control::stop_requested)
    }

    fn read_record(&self, path: &str) -> Result<Record, EngineError> {
        let bytes = self.store.get(path)?.ok_or_else(|| EngineError::NoRecord {
            path: self.store.url_of(path),
        })?;
        serde_json::from_slice(&bytes).map_err(|e| EngineError::BadRecord {
            path: self.store.url_of(path),
            reason: e.to_string(),
        })
    }

    /// Makes a recorded epoch visible for these streams and lets its staged
    /// files go.
    fn apply(&mut self, record: &Record, streams: &[String]) -> Result<(), EngineError> {
        let staged: Vec<&Staged> = record
            .committables
            .iter()
            .flat_map(|c| c.staged.iter())
            .collect();
        for s in streams {
            let files: Vec<&Staged> = staged.iter().copied().filter(|f| &f.stream == s).collect();
            let how = crate::dest::destination::How {
                refresh: record.refresh.get(s).copied(),
                skip_known: record.streams.get(s).is_some_and(|st| st.rereading),
            };
            let applied =
                self.dest
                    .apply(&self.store, self.generation, record.epoch, s, &files, how);
            // An older attempt that moved HEAD before this one claimed may
            // have been applying the same epoch meanwhile: it deletes the
            // staged files once its marker is written, so files gone with the
            // marker at the epoch mean the epoch is in.
            let applied = match applied {
                Err(DestError::StagedGone { .. }) if self.dest.marker(s)? >= record.epoch => {
                    self.log.event(
                        "epoch.applied_by_another",
                        json!({"epoch": record.epoch, "stream": s}),
                    );
                    Ok(())
                }
                other => other,
            };
            applied.map_err(|e| match e {
                DestError::Fenced { .. } => EngineError::Fenced {
                    sync: self.opts.sync.clone(),
                    generation: self.generation,
                },
                other => other.into(),
            })?;
        }
        self.crash_point(CrashPoint::Applied, record.epoch)?;
        for f in staged {
            self.store.delete(&f.path)?;
        }
        self.log.event(
            "epoch.committed",
            json!({"epoch": record.epoch, "streams": streams}),
        );
        Ok(())
    }

    /// What to do with the epoch HEAD names; returns the stream states to
    /// resume from.
    fn recover(
        &mut self,
        head_epoch: u64,
        head_record: Option<String>,
    ) -> Result<Recovered, EngineError> {
        let Some(path) = head_record.filter(|_| head_epoch > 0) else {
            return Ok(Recovered {
                said: "fresh".into(),
                head: 0,
                states: BTreeMap::new(),
                record: None,
            });
        };
        let record = self.read_record(&path)?;
        // Only streams that read something in HEAD's epoch, or whose refresh
        // begins or ends in it, have anything of it to make visible (the
        // epoch before was committed before this one was recorded).
        let staged: BTreeSet<&str> = record
            .committables
            .iter()
            .flat_map(|c| c.staged.iter().map(|f| f.stream.as_str()))
            .chain(record.refresh.keys().map(String::as_str))
            .collect();
        // The staged files first, the markers after: an older attempt that
        // moved HEAD may be applying the epoch right now, and it writes the
        // marker before it deletes the files, so files found gone mean the
        // marker read next already says the epoch is in. (The other order
        // took an epoch applied meanwhile for lost, and read it again.)
        let mut available = true;
        for f in record.committables.iter().flat_map(|c| c.staged.iter()) {
            available &= self.store.exists(&f.path)?;
        }
        let mut markers = BTreeMap::new();
        for s in &staged {
            markers.insert(s.to_string(), self.dest.marker(s)?);
        }
        let decision = recovery::decide(&HeadState {
            epoch: head_epoch,
            streams: staged.iter().map(|s| s.to_string()).collect(),
            markers,
            committables_available: available,
        })?;
        let said = match &decision {
            Recovery::Resume { epoch } => format!("resume from epoch {epoch}"),
            Recovery::Apply { epoch, streams } => {
                format!("apply epoch {epoch} to {}, then resume", streams.join(", "))
            }
            Recovery::Rewind { to } => format!("rewind to epoch {to}"),
        };
        self.log.event(
            "recovered",
            json!({"head": head_epoch, "decision": said.clone()}),
        );
        match decision {
            Recovery::Resume { .. } => {}
            Recovery::Apply { streams, .. } => self.apply(&record, &streams)?,
            Recovery::Rewind { to } => {
                // Nothing of the lost epoch is visible: read it again from
                // the record before, which HEAD names again.
                let previous = record.previous.clone().filter(|_| to > 0);
                let states = match &previous {
                    Some(p) => self.read_record(p)?.streams,
                    None => BTreeMap::new(),
                };
                let r = self.control.rewind_head(
                    &self.opts.sync,
                    Generation(self.generation),
                    Epoch(to),
                    previous.as_deref(),
                );
                match r {
                    Ok(()) => {}
                    Err(e) if e.is(sqlstate::FENCED) => {
                        return Err(EngineError::Fenced {
                            sync: self.opts.sync.clone(),
                            generation: self.generation,
                        })
                    }
                    Err(e) => return Err(e.into()),
                }
                return Ok(Recovered {
                    said,
                    head: to,
                    states,
                    record: previous,
                });
            }
        }
        Ok(Recovered {
            said,
            head: head_epoch,
            states: record.streams,
            record: Some(path),
        })
    }

    /// Writes record N, moves HEAD to it (the commit point).
    fn write_record(&mut self, record: &Record) -> Result<String, EngineError> {
        let path = self.layout.record(record.epoch, self.generation);
        let body = serde_json::to_vec_pretty(record).map_err(|e| EngineError::BadRecord {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        self.store.create(&path, Bytes::from(body))?;
        self.crash_point(CrashPoint::Recorded, record.epoch)?;
        let r = self.control.advance_head(
            &self.opts.sync,
            Generation(self.generation),
            Epoch(record.epoch),
            &path,
        );
        match r {
            Ok(()) => Ok(path),
            Err(e) if e.is(sqlstate::FENCED) => {
                self.log.event("fenced", json!({"epoch": record.epoch}));
                Err(EngineError::Fenced {
                    sync: self.opts.sync.clone(),
                    generation: self.generation,
                })
            }
            Err(e) => Err(e.into()),
        }
    }
}

fn schema_pairs(schema: &arrow_schema::Schema) -> Vec<(String, String)> {
    schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().to_string()))
        .collect()
}

/// Runs one attempt of a sync until its source has no more rows.
pub fn run(opts: &Options) -> Result<Outcome, EngineError> {
    // Listen first, so that the runner can ask how the attempt goes from its
    // first moment on.
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
    let mut edge = match &opts.edge {
        Some(path) => Some(Edge::listen(path).map_err(|e| EngineError::Edge {
            path: path.display().to_string(),
            reason: format!("listening: {e}"),
        })?),
        None => None,
    };
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
    let source = match source_type.as_str() {
        "postgres" => {
            // The source's tables first: a missing table or column stops
            // the attempt before anything is written. A runner hosting the
            // source looks them up for the engine.
            let specs = stream_specs(&def)?;
            let tables = match edge.as_mut() {
                Some(e) => {
                    let asked = json!({"source": source, "streams": def.get("streams")});
                    let tables = e.describe(asked, || {
                        channel.as_ref().is_some_and(Control::stop_requested)
                    })?;
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
                    let mut probe = postgres::Client::connect(&url, postgres::NoTls)?;
                    specs
                        .iter()
                        .map(|spec| pg_table::describe(&mut probe, spec))
                        .collect::<Result<Vec<_>, _>>()?
                }
            };
            Source::Tables(tables)
        }
        "files" => {
            // A format the readers do not know stops the attempt before
            // anything moves, wherever the source is read.
            Format::parse(&str_of(&source, "format")?).ok_or_else(|| {
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
            Source::Files { streams }
        }
        other => {
            return Err(EngineError::NotBuilt(format!(
                "the {other} source's data path"
            )))
        }
    };
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
        log: Log {
            path: layout.log(generation),
            lines: Vec::new(),
            generation,
        },
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
        overwrite: def
            .get("streams")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|s| s.get("mode").and_then(Value::as_str) == Some("overwrite"))
            .filter_map(|s| s.get("name").and_then(Value::as_str).map(str::to_string))
            .collect(),
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
        .map_err(|e| match e {
            DestError::Fenced { .. } => EngineError::Fenced {
                sync: opts.sync.clone(),
                generation,
            },
            other => other.into(),
        })?;
    let lanes = opts
        .lanes
        .or(destination
            .get("lanes")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok()))
        .unwrap_or(1)
        .clamp(1, orca_core::sync::MAX_LANES as usize);
    let result = stream_epochs(
        &mut a,
        Plan {
            sync: opts.sync.clone(),
            source: def.get("source").cloned().unwrap_or(Value::Null),
            streams: def.get("streams").cloned().unwrap_or(Value::Null),
            batch_rows,
            start: Vec::new(),
        },
        source,
        lanes,
        head_epoch,
        head_record,
        full,
    );
    if let Err(EngineError::Crashed { .. }) = result {
        // A crash leaves nothing behind: no last log line, no report.
        return result;
    }
    match &result {
        Err(e) => {
            a.log.event("failed", json!({"error": e.to_string()}));
            a.report(|s| {
                s.phase = Phase::Failed;
                s.error = Some(e.to_string());
            });
        }
        Ok(o) => a.report(|s| {
            s.phase = if o.stopped {
                Phase::Stopped
            } else {
                Phase::Done
            }
        }),
    }
    a.log.flush(&a.store)?;
    result
}

/// Where the streams come from.
enum Source {
    Tables(Vec<PgTable>),
    Files {
        /// (stream, pattern, schema policy)
        streams: Vec<(String, String, Policy)>,
    },
}

/// Each lane's part encoded as Parquet, the lanes on threads of their own.
fn encode_lanes(parts: &[(usize, RecordBatch)]) -> Result<Vec<Bytes>, EngineError> {
    if let [(_, only)] = parts {
        return Ok(vec![parquet::encode(only)?]);
    }
    std::thread::scope(|scope| {
        let jobs: Vec<_> = parts
            .iter()
            .map(|(_, b)| scope.spawn(move || parquet::encode(b)))
            .collect();
        jobs.into_iter()
            .map(|j| match j.join() {
                Ok(r) => r.map_err(EngineError::from),
                Err(_) => Err(EngineError::Reader {
                    stream: "(writer lane)".into(),
                    reason: "a writer lane's encoder panicked".into(),
                }),
            })
            .collect()
    })
}

fn stream_epochs(
    a: &mut Attempt,
    mut plan: Plan,
    source: Source,
    lanes: usize,
    head_epoch: u64,
    head_record: Option<String>,
    full: bool,
) -> Result<Outcome, EngineError> {
    let Recovered {
        said,
        head: head_epoch,
        mut states,
        record: mut previous,
    } = a.recover(head_epoch, head_record)?;
    if full {
        // A backfill: every stream from its start, in epochs after HEAD.
        for s in &a.streams {
            let st = states.entry(s.clone()).or_default();
            st.position = None;
            st.rereading = true;
        }
        a.log.event("full", json!({"streams": a.streams}));
    }
    // An `overwrite` stream whose last refresh finished (or that never
    // began one) reads its source again from the start into a fresh shadow;
    // one cut short by a crash or a stop goes on where it was.
    let mut begins = BTreeSet::new();
    for name in &a.overwrite {
        let st = states.entry(name.clone()).or_default();
        if full || st.refreshed || st.position.is_none() {
            st.position = None;
            st.refreshed = false;
            begins.insert(name.clone());
        }
    }
    if !a.overwrite.is_empty() {
        a.log.event(
            "refresh",
            json!({"begins": begins, "continues": a.overwrite.difference(&begins).collect::<Vec<_>>()}),
        );
    }
    // Whatever is still staged now belongs to epochs that are applied or
    // that will be read again: none of it is needed.
    for f in a.store.list(&format!("{}/_staging", a.layout.root))? {
        a.store.delete(&f)?;
    }
    let crash_after: Option<u64> = std::env::var("ORCA_ENGINE_CRASH_AFTER_HEAD")
        .ok()
        .and_then(|v| v.parse().ok());
    // Every stream from its resume point: read by the runner's source pump
    // over the data edge, or here.
    plan.start = a
        .streams
        .iter()
        .map(|name| Start {
            name: name.clone(),
            after: states.get(name).and_then(|s| s.position.clone()),
            recorded: states
                .get(name)
                .map(|s| s.schema.clone())
                .unwrap_or_default(),
        })
        .collect();
    let mut readers = match a.edge.take() {
        Some(mut edge) => {
            let opened = edge.open(&plan, head_epoch + 1, || a.stop_requested());
            // Kept for the attempt's life: dropping it removes the socket.
            a.edge = Some(edge);
            let r = opened?;
            a.log.event("edge", json!({"streams": plan.start.len()}));
            r
        }
        None => open_readers(&plan)?,
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
        Source::Files { streams, .. } => {
            for (r, (name, _, policy)) in readers.iter_mut().zip(streams) {
                routers.insert(name.clone(), Router::new(lanes, Vec::new()));
                // The schema inferred so far: it only ever widens.
                let cols = states
                    .get(&name)
                    .map(|s| {
                        s.schema
                            .iter()
                            .filter(|(n, _)| !n.starts_with("_orca_"))
                            .filter_map(|(n, t)| {
                                ColType::from_arrow_name(t).map(|t| (n.clone(), t))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                r.shape = Shape::Inferred(StreamSchema::inferred(cols).with_policy(policy));
            }
        }
    }

    let mut out = Outcome {
        generation: a.generation,
        recovery: said,
        from_epoch: head_epoch,
        to_epoch: head_epoch,
        ..Outcome::default()
    };
    let mut coord = Coordinator::new(lanes, head_epoch);
    let mut pending: BTreeMap<u64, Record> = BTreeMap::new();
    a.report(|s| {
        s.phase = Phase::Streaming;
        s.head = head_epoch;
        s.committed = head_epoch;
    });
    loop {
        // Every epoch before this point is committed: a resume point.
        if a.stop_requested() {
            out.stopped = true;
            a.log
                .event("stopped", json!({"epoch": coord.last_committed()}));
            break;
        }
        // Barrier N sits after each stream's next chunk: a resume point.
        let mut chunks = Vec::new();
        // `overwrite` streams whose source ran out: their refresh ends with
        // this epoch.
        let mut ended = Vec::new();
        for r in readers.iter_mut().filter(|r| !r.done) {
            match r.rx.recv() {
                Ok(Ok(Msg::Chunk {
                    arrays,
                    ids,
                    last,
                    rows,
                })) => {
                    let Shape::Table(table) = &r.shape else {
                        return Err(EngineError::Reader {
                            stream: r.name.clone(),
                            reason: "typed rows from an untyped stream".into(),
                        });
                    };
                    let taken = Taken::Typed {
                        schema: pg_table::destination_schema(table),
                        arrays,
                        ids,
                        rows,
                    };
                    chunks.push((r.name.clone(), taken, last));
                }
                Ok(Ok(Msg::Raw(chunk))) => {
                    chunks.push((r.name.clone(), Taken::Raw(chunk.records), chunk.last))
                }
                Ok(Ok(Msg::End { bytes })) => {
                    r.done = true;
                    out.source_bytes += bytes;
                    // A refresh ends, or a backfill's read again: an epoch
                    // says so even when no other stream read anything.
                    let rereading = states.get(&r.name).is_some_and(|s| s.rereading);
                    if a.overwrite.contains(&r.name) || rereading {
                        ended.push(r.name.clone());
                    }
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    return Err(EngineError::Reader {
                        stream: r.name.clone(),
                        reason: "its reader stopped without saying why".into(),
                    })
                }
            }
        }
        if chunks.is_empty() && ended.is_empty() {
            break;
        }
        let positions: Positions = chunks
            .iter()
            .map(|c| (c.0.clone(), c.2.join("\u{1f}")))
            .collect();
        let epoch = coord.request_barrier(positions);
        let synced_at = chrono::Utc::now().timestamp_micros();
        let mut staged: Vec<Vec<Staged>> = vec![Vec::new(); lanes];
        let mut quarantined = Vec::new();
        let mut held_files = Vec::new();
        for (name, taken, last) in chunks {
            let batch = match taken {
                Taken::Typed {
                    schema,
                    mut arrays,
                    ids,
                    rows,
                } => {
                    let seq: Int64Array = (0..rows as i64)
                        .map(|i| ((epoch as i64) << 32) | i)
                        .collect();
                    let at =
                        TimestampMicrosecondArray::from(vec![synced_at; rows]).with_timezone("UTC");
                    arrays.extend([ids, Arc::new(seq) as ArrayRef, Arc::new(at) as ArrayRef]);
                    RecordBatch::try_new(schema, arrays)?
                }
                Taken::Raw(records) => {
                    let Some(Shape::Inferred(schema)) = readers
                        .iter_mut()
                        .find(|r| r.name == name)
                        .map(|r| &mut r.shape)
                    else {
                        return Err(EngineError::Reader {
                            stream: name,
                            reason: "records from a typed stream".into(),
                        });
                    };
                    let mut good = Vec::with_capacity(records.len());
                    let mut bad = Vec::new();
                    for (i, r) in records.into_iter().enumerate() {
                        let seq = ((epoch as i64) << 32) | i as i64;
                        match r {
                            Ok(mut raw) => {
                                raw.seq = seq;
                                good.push(raw);
                            }
                            Err((raw, reason)) => bad.push((raw.position, raw.record, reason)),
                        }
                    }
                    let (batch, set_aside) =
                        crate::source::normalize::normalize(&name, schema, &good, synced_at)?;
                    bad.extend(
                        set_aside
                            .into_iter()
                            .map(|q| (q.position, q.record, q.reason)),
                    );
                    if !bad.is_empty() {
                        let path = a.layout.quarantine(epoch, a.generation, &name);
                        let mut body = String::new();
                        for (position, record, reason) in &bad {
                            body.push_str(
                                &json!({"stream": name, "position": position,
                                        "reason": reason, "record": record})
                                .to_string(),
                            );
                            body.push('\n');
                        }
                        a.store.put(&path, Bytes::from(body))?;
                        out.quarantined += bad.len() as u64;
                        quarantined.push(path);
                    }
                    batch
                }
            };
            let (batch, held) = a.dest.hold(&name, batch)?;
            if !held.is_empty() {
                let path = a.layout.held(epoch, a.generation, &name);
                let mut body = String::new();
                for h in &held {
                    body.push_str(
                        &json!({"stream": name, "_orca_id": h.orca_id, "column": h.column,
                                          "value": h.value, "reason": h.reason})
                        .to_string(),
                    );
                    body.push('\n');
                }
                a.store.put(&path, Bytes::from(body))?;
                out.held += held.len() as u64;
                held_files.push(path);
            }
            let schema = batch.schema();
            let rows = batch.num_rows();
            // Each writer lane stages its key groups' rows; the lanes encode
            // at the same time.
            let parts = match routers.get(&name) {
                Some(router) if lanes > 1 => router
                    .route(&batch)?
                    .into_iter()
                    .filter_map(|(lane, input)| match input {
                        LaneInput::Rows(b) => Some((lane, b)),
                        LaneInput::Barrier { .. } => None,
                    })
                    .collect(),
                _ => vec![(0, batch)],
            };
            let encoded = encode_lanes(&parts)?;
            for ((lane, part), data) in parts.iter().zip(encoded) {
                let path = a.layout.staged(epoch, a.generation, &name, *lane);
                let bytes = data.len() as u64;
                a.store.put(&path, data)?;
                out.staged_bytes += bytes;
                staged[*lane].push(Staged {
                    stream: name.clone(),
                    path,
                    rows: part.num_rows() as u64,
                    bytes,
                    lane: *lane,
                });
            }
            out.rows += rows as u64;
            let st = states.entry(name.clone()).or_default();
            st.position = Some(last);
            st.rows += rows as u64;
            st.schema = schema_pairs(&schema);
        }
        for s in &a.streams {
            states.entry(s.clone()).or_default();
        }
        for name in &ended {
            states.entry(name.clone()).or_default().rereading = false;
        }
        let mut refresh = BTreeMap::new();
        for name in &a.overwrite {
            let ends = ended.contains(name);
            if ends || staged.iter().flatten().any(|f| &f.stream == name) || begins.contains(name) {
                let step = Refresh {
                    begins: begins.remove(name),
                    ends,
                };
                if ends {
                    states.entry(name.clone()).or_default().refreshed = true;
                }
                refresh.insert(name.clone(), step);
            }
        }
        let record = Record {
            sync: a.opts.sync.clone(),
            epoch,
            generation: a.generation,
            previous: previous.clone(),
            streams: states.clone(),
            committables: staged
                .into_iter()
                .enumerate()
                .map(|(lane, staged)| LaneCommittable { lane, staged })
                .collect(),
            quarantined,
            held: held_files,
            refresh,
            written_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        };
        // Every lane crossed barrier N with its files staged: each
        // pre-commits, and the record is written once the last one has.
        let mut actions: VecDeque<Action> = VecDeque::new();
        for c in &record.committables {
            let payload = serde_json::to_string(c).unwrap_or_default();
            actions.extend(coord.pre_committed(
                epoch,
                Committable {
                    lane: c.lane,
                    payload,
                },
            )?);
        }
        pending.insert(epoch, record);
        a.crash_point(CrashPoint::Staged, epoch)?;
        while let Some(action) = actions.pop_front() {
            match action {
                Action::WriteRecord { epoch, .. } => {
                    let record = pending
                        .get(&epoch)
                        .ok_or(ProtocolError::UnknownEpoch { epoch })?;
                    let record = record.clone();
                    let path = a.write_record(&record)?;
                    a.crash_point(CrashPoint::HeadMoved, epoch)?;
                    if crash_after == Some(epoch) {
                        // A test hook: die at the commit point, after HEAD
                        // moved and before lane 0 commits, as a crash would.
                        eprintln!("orca-engine: ORCA_ENGINE_CRASH_AFTER_HEAD={epoch}: aborting");
                        std::process::abort();
                    }
                    previous = Some(path);
                    out.to_epoch = epoch;
                    a.report(|s| s.head = epoch);
                    actions.extend(coord.head_moved(epoch)?);
                }
                Action::Commit { epoch } => {
                    let record = pending
                        .remove(&epoch)
                        .ok_or(ProtocolError::UnknownEpoch { epoch })?;
                    let streams = a.streams.clone();
                    a.apply(&record, &streams)?;
                    let rows = out.rows;
                    a.report(|s| {
                        s.committed = epoch;
                        s.rows = rows;
                        for (name, st) in &record.streams {
                            let e = s.streams.entry(name.clone()).or_default();
                            e.position.clone_from(&st.position);
                        }
                        for staged in record.committables.iter().flat_map(|c| &c.staged) {
                            if let Some(e) = s.streams.get_mut(&staged.stream) {
                                e.rows += staged.rows;
                            }
                        }
                    });
                    actions.extend(coord.committed(epoch)?);
                }
                // A table source has nothing to acknowledge upstream.
                Action::Acknowledge { .. } => {}
            }
        }
        a.log.flush(&a.store)?;
    }
    if out.stopped {
        // A reader still going fails at its next send once its channel is
        // gone, and ends with the process; nothing waits for it.
        drop(readers);
    } else {
        for r in &mut readers {
            if let Some(h) = r.handle.take() {
                let _ = h.join();
            }
        }
    }
    a.log.event(
        "done",
        json!({"epoch": out.to_epoch, "rows": out.rows, "source_bytes": out.source_bytes,
               "stopped": out.stopped}),
    );
    Ok(out)
}
