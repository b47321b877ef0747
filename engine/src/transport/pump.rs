//! The source pump: the runner's end of an engine's inbound data edge.
//!
//! A runner hosts the sync's source connector. The engine, once it has
//! claimed the sync and recovered, sends an **open** frame with a [`Plan`]:
//! the source, its streams and where each resumes. The pump starts one
//! reader per stream and sends what they read as frames, a round of streams
//! at a time in the plan's order (the order the engine takes them in): each
//! chunk a **batch** and a **barrier** carrying the resume point after it,
//! then an **end** per stream. A chunk of stream N is the stream's
//! contribution to one epoch, so its frames carry the epoch it belongs to
//! (the open frame's first epoch, plus how many chunks the stream sent
//! before).
//!
//! Before the open frame the engine may send a **describe** frame: the pump
//! looks the streams' tables up in the source's catalog and answers with a
//! **catalog** frame, so the engine never connects to the source itself.
//!
//! A typed source (a Postgres table) sends its columns in the types it
//! declares plus `_orca_id`; a files source sends raw records (`position`,
//! `record` as JSON text, `error`: why a line is not a record), which the
//! engine normalizes.

use std::io::{BufReader, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema};
use serde_json::Value;

use crate::source::error::ReadError;
use crate::source::open::{open_readers, Upstream};
use crate::source::plan::{Describe, Plan};
use crate::source::readers::{Msg, Reader, Shape};
use crate::transport::frame::{read_frame, write_frame, Frame, FrameError, ANY_STREAM};
use crate::transport::wire::raw_batch;
// The simulation builds the pump's batches by hand from these.
pub use crate::transport::wire::{raw_schema, ORCA_ID};
// The runner reports what the gauge measured.
pub use crate::source::postgres::cdc::{SlotGauge, SlotReading};

#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    #[error("data edge {path}: no engine listening within {waited:?}: {source}")]
    Connect {
        path: String,
        waited: Duration,
        source: std::io::Error,
    },
    #[error("data edge: {0}")]
    Frame(#[from] FrameError),
    #[error("data edge: the engine's first frame is not an open frame")]
    NoOpen,
    #[error("data edge: the engine closed it before sending its plan (its log says why)")]
    Closed,
    #[error("data edge: the engine's plan: {0}")]
    Plan(String),
    #[error("source: {0}")]
    Source(#[from] ReadError),
}

/// What a pump sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pumped {
    pub streams: usize,
    pub chunks: u64,
    pub rows: u64,
}

/// Connects to the engine's data edge at `path`, trying again while the
/// engine is starting, until `wait` passes or `give_up` turns true (the
/// engine exited before listening).
pub fn connect(path: &Path, wait: Duration, give_up: &AtomicBool) -> Result<UnixStream, PumpError> {
    let started = Instant::now();
    loop {
        match UnixStream::connect(path) {
            Ok(s) => return Ok(s),
            Err(e) if started.elapsed() >= wait || give_up.load(Ordering::Relaxed) => {
                return Err(PumpError::Connect {
                    path: path.display().to_string(),
                    waited: started.elapsed(),
                    source: e,
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Serves one engine over its data edge: reads its plan, reads the source
/// and sends the streams' frames until every stream ended. A source error
/// goes to the engine as an error frame before it is returned. A change
/// stream's slot is measured into `gauge` meanwhile, for the runner to
/// report.
pub fn serve(conn: UnixStream, gauge: &SlotGauge) -> Result<Pumped, PumpError> {
    let mut input = BufReader::new(conn.try_clone().map_err(FrameError::Io)?);
    let mut out = BufWriter::with_capacity(1 << 20, conn);
    let (first_epoch, plan) = loop {
        match read_frame(&mut input)? {
            Some(Frame::Describe { request }) => match describe(&request) {
                Ok(tables) => {
                    write_frame(&mut out, &Frame::Catalog { tables })?;
                    out.flush().map_err(FrameError::Io)?;
                }
                Err(e) => {
                    tell(&mut out, ANY_STREAM, &e);
                    return Err(e.into());
                }
            },
            Some(Frame::Open { first_epoch, plan }) => break (first_epoch, plan),
            Some(_) => return Err(PumpError::NoOpen),
            None => return Err(PumpError::Closed),
        }
    };
    let plan: Plan = serde_json::from_value(plan).map_err(|e| PumpError::Plan(e.to_string()))?;
    let (mut readers, acks) = match open_readers(&plan, Some(gauge)) {
        Ok(r) => r,
        Err(e) => {
            tell(&mut out, ANY_STREAM, &e);
            return Err(e.into());
        }
    };
    // The engine's acknowledgements come back on the same edge; they end
    // with it.
    if let Some(acks) = acks {
        let spawned = std::thread::Builder::new()
            .name("pump-acks".into())
            .spawn(move || take_acks(input, &acks));
        if let Err(e) = spawned {
            let e = ReadError::Cdc(format!("starting the acknowledgement thread: {e}"));
            tell(&mut out, ANY_STREAM, &e);
            return Err(e.into());
        }
    }
    let mut epochs = vec![first_epoch; readers.len()];
    let mut pumped = Pumped {
        streams: readers.len(),
        ..Pumped::default()
    };
    loop {
        let mut open = false;
        for (i, r) in readers.iter_mut().enumerate().filter(|(_, r)| !r.done) {
            open = true;
            let stream = u16::try_from(i).unwrap_or(ANY_STREAM);
            let msg = match r.rx.recv() {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => {
                    tell(&mut out, stream, &e);
                    return Err(e.into());
                }
                Err(_) => {
                    let e = ReadError::Stream {
                        stream: r.name.clone(),
                        reason: "its reader stopped without saying why".into(),
                    };
                    tell(&mut out, stream, &e);
                    return Err(e.into());
                }
            };
            let (batch, position) = match msg {
                Msg::Chunk {
                    arrays, ids, last, ..
                } => (typed_batch(r, arrays, ids)?, last),
                Msg::Raw(chunk) => {
                    raw_batch(chunk).map_err(|e| PumpError::Frame(FrameError::Arrow(e)))?
                }
                Msg::End { bytes } => {
                    r.done = true;
                    write_frame(&mut out, &Frame::End { stream, bytes })?;
                    continue;
                }
            };
            pumped.chunks += 1;
            pumped.rows += batch.num_rows() as u64;
            let epoch = epochs[i];
            write_frame(
                &mut out,
                &Frame::Batch {
                    stream,
                    epoch,
                    batch,
                },
            )?;
            write_frame(
                &mut out,
                &Frame::Barrier {
                    stream,
                    epoch,
                    position,
                },
            )?;
            epochs[i] = epoch.saturating_add(1);
        }
        // A round of streams is an epoch's worth: the engine can stage it.
        out.flush().map_err(FrameError::Io)?;
        if !open {
            return Ok(pumped);
        }
    }
}

/// Hands the engine's ack frames to the source until the edge closes.
fn take_acks(mut input: BufReader<UnixStream>, acks: &Upstream) {
    while let Ok(Some(frame)) = read_frame(&mut input) {
        if let Frame::Ack { positions } = frame {
            let recorded = positions
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(s, p)| Some((s.as_str(), p.as_str()?)));
            acks.acknowledge(recorded);
        }
    }
}

/// The source's catalog entry of each stream's table, in the streams'
/// order, as JSON, for a describe frame's request ([`Describe`]).
pub fn describe(request: &Value) -> Result<Value, ReadError> {
    let request: Describe = serde_json::from_value(request.clone())
        .map_err(|e| ReadError::Definition(format!("the describe request: {e}")))?;
    let tables = crate::source::open::describe(&request)?;
    serde_json::to_value(tables).map_err(|e| ReadError::Definition(e.to_string()))
}

/// Tells the engine why the source failed, as far as the edge still works:
/// the error is returned to the runner either way.
fn tell(out: &mut BufWriter<UnixStream>, stream: u16, e: &ReadError) {
    let _ = write_frame(
        out,
        &Frame::Error {
            stream,
            reason: e.to_string(),
        },
    );
    let _ = out.flush();
}

/// A table chunk's columns under their names, and `_orca_id` last.
fn typed_batch(r: &Reader, arrays: Vec<ArrayRef>, ids: ArrayRef) -> Result<RecordBatch, PumpError> {
    let Shape::Table(table) = &r.shape else {
        return Err(PumpError::Plan(format!(
            "stream {} read typed rows without a table",
            r.name
        )));
    };
    let mut fields: Vec<Field> = table
        .columns
        .iter()
        .zip(&arrays)
        .map(|(c, a)| Field::new(&c.name, a.data_type().clone(), true))
        .collect();
    fields.push(Field::new(ORCA_ID, ids.data_type().clone(), false));
    let mut columns = arrays;
    columns.push(ids);
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| PumpError::Frame(FrameError::Arrow(e)))
}
