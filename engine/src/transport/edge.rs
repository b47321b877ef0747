//! The engine's inbound data edge: a Unix socket the runner's source pump
//! ([`crate::transport::pump`]) connects to. The engine sends the open frame
//! with its plan; one thread then reads the pump's frames and hands each
//! stream's chunks to the attempt through a channel of one per stream, as its
//! own readers would: the attempt cannot tell them apart.
//!
//! The thread checks the edge as it goes: a frame of a stream the plan does
//! not have, of the wrong epoch, after the stream's end, or an edge that
//! closes before every stream ended, fails the stream with a reason.

use std::io::{BufReader, BufWriter, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, RecordBatch};

use crate::source::error::{ReadError, RESTART};
use crate::source::msg::RawChunk;
use crate::source::plan::{Describe, Plan};
use crate::source::postgres::table::PgTable;
use crate::source::readers::{fed_readers, Msg, Reader};
use crate::transport::frame::{read_frame, write_frame, Frame, FrameError, ANY_STREAM};
use crate::transport::wire::{raw_records, ORCA_ID};

/// How long the engine waits for the runner's pump to connect.
pub const CONNECT_WAIT: Duration = Duration::from_secs(60);
/// The most a stream's batches may hold between two of its barriers (in
/// Arrow memory): a pump that never places a barrier fails its stream here
/// instead of filling the engine's memory. An epoch's rows are a few
/// hundred megabytes at most with the default `batch_rows`.
pub const PENDING_BYTES_MAX: usize = 1 << 30;

/// What went wrong on the data edge itself (a stream's failure travels as
/// the stream's [`ReadError`]).
#[derive(Debug, thiserror::Error)]
#[error("data edge {path}: {reason}")]
pub struct EdgeError {
    pub path: String,
    pub reason: String,
}

/// A listening data edge, and the pump's connection once it came.
pub struct Edge {
    listener: UnixListener,
    path: PathBuf,
    conn: Option<UnixStream>,
    /// [`PENDING_BYTES_MAX`] unless a test says otherwise.
    pending_max: usize,
}

impl Edge {
    /// Listens on `path`, a socket file this engine owns (one an engine that
    /// died left behind is replaced).
    pub fn listen(path: &Path) -> std::io::Result<Edge> {
        let listener = crate::transport::control::bind_owned(path)?;
        listener.set_nonblocking(true)?;
        Ok(Edge {
            listener,
            pending_max: PENDING_BYTES_MAX,
            path: path.to_path_buf(),
            conn: None,
        })
    }

    fn err(&self, reason: String) -> EdgeError {
        EdgeError {
            path: self.path.display().to_string(),
            reason,
        }
    }

    /// The pump's connection: waits for it the first time. `stop` is asked
    /// while waiting.
    fn conn(&mut self, stop: impl Fn() -> bool) -> Result<&UnixStream, EdgeError> {
        if self.conn.is_none() {
            let started = Instant::now();
            let conn = loop {
                match self.listener.accept() {
                    // Rows come from this engine's own runner only.
                    Ok((c, _)) => match crate::transport::peer::check_same_user(&c) {
                        Ok(()) => break c,
                        Err(why) => {
                            eprintln!("orca-engine: data edge {}: {why}", self.path.display())
                        }
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if started.elapsed() > CONNECT_WAIT || stop() {
                            return Err(self.err(format!(
                                "no source pump connected within {CONNECT_WAIT:?} (a runner \
                                 connects one; without a runner, leave out --edge and the \
                                 engine reads the source itself)"
                            )));
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(self.err(format!("accepting the pump: {e}"))),
                }
            };
            conn.set_nonblocking(false)
                .map_err(|e| self.err(e.to_string()))?;
            self.conn = Some(conn);
        }
        self.conn
            .as_ref()
            .ok_or_else(|| self.err("no connection".into()))
    }

    /// Asks the runner to look the streams' tables up in the source's
    /// catalog: the engine never connects to a source a runner hosts.
    pub(crate) fn describe(
        &mut self,
        request: &Describe,
        stop: impl Fn() -> bool,
    ) -> Result<Vec<PgTable>, EdgeError> {
        let conn = match self.conn(stop)?.try_clone() {
            Ok(c) => c,
            Err(e) => return Err(self.err(e.to_string())),
        };
        let mut input = BufReader::new(match conn.try_clone() {
            Ok(c) => c,
            Err(e) => return Err(self.err(e.to_string())),
        });
        let mut out = BufWriter::new(conn);
        let request =
            serde_json::to_value(request).map_err(|e| self.err(format!("the request: {e}")))?;
        let answer = write_frame(&mut out, &Frame::Describe { request })
            .and_then(|()| out.flush().map_err(Into::into))
            .and_then(|()| read_frame(&mut input))
            .map_err(|e| e.to_string());
        match answer {
            Ok(Some(Frame::Catalog { tables })) => serde_json::from_value(tables)
                .map_err(|e| self.err(format!("the runner's catalog: {e}"))),
            Ok(Some(Frame::Error { reason, .. })) => {
                Err(self.err(format!("the runner's source: {reason}")))
            }
            Ok(Some(_)) => {
                Err(self.err("the runner answered a describe with another frame".into()))
            }
            Ok(None) => Err(self.err(
                "the runner's source pump closed the edge before answering a describe".into(),
            )),
            Err(e) => Err(self.err(format!("describing the source: {e}"))),
        }
    }

    /// Tells the pump the commit protocol acknowledged these resume points
    /// (a change stream confirms them to its slot). Best effort: an edge
    /// that broke fails the attempt through its streams.
    pub(crate) fn acknowledge(&self, positions: &crate::commit::protocol::Positions) {
        let Some(conn) = self.conn.as_ref().and_then(|c| c.try_clone().ok()) else {
            return;
        };
        let mut out = BufWriter::new(conn);
        let positions = serde_json::to_value(positions).unwrap_or_default();
        let _ = write_frame(&mut out, &Frame::Ack { positions }).and_then(|()| {
            out.flush()?;
            Ok(())
        });
    }

    /// Waits for the pump if it has not come yet, sends it the plan and
    /// returns a reader per stream of the plan, fed from the edge. `stop` is
    /// asked while waiting.
    pub(crate) fn open(
        &mut self,
        plan: &Plan,
        first_epoch: u64,
        stop: impl Fn() -> bool,
    ) -> Result<Vec<Reader>, EdgeError> {
        let first = u32::try_from(first_epoch)
            .map_err(|_| self.err(format!("epoch {first_epoch} does not fit a frame")))?;
        let conn = match self.conn(stop)?.try_clone() {
            Ok(c) => c,
            Err(e) => return Err(self.err(e.to_string())),
        };
        let io = |e: std::io::Error| self.err(e.to_string());
        let mut out = BufWriter::new(conn.try_clone().map_err(io)?);
        let open = Frame::Open {
            first_epoch: first,
            plan: serde_json::to_value(plan).map_err(|e| self.err(e.to_string()))?,
        };
        write_frame(&mut out, &open).map_err(|e| self.err(e.to_string()))?;
        out.flush().map_err(io)?;

        let (senders, mut readers) = fed_readers(plan.start.iter().map(|s| s.name.clone()));
        let demux = Demux {
            names: plan.start.iter().map(|s| s.name.clone()).collect(),
            typed: plan.typed(),
            senders,
            pending: vec![Vec::new(); plan.start.len()],
            pending_bytes: vec![0; plan.start.len()],
            pending_max: self.pending_max,
            epochs: vec![first; plan.start.len()],
            ended: vec![false; plan.start.len()],
        };
        let handle = std::thread::Builder::new()
            .name("edge".into())
            .spawn(move || demux.run(conn))
            .map_err(|e| self.err(format!("starting its thread: {e}")))?;
        if let Some(r) = readers.first_mut() {
            r.handle = Some(handle);
        }
        Ok(readers)
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The edge's reading end: frames in, each stream's chunks out.
struct Demux {
    names: Vec<String>,
    typed: bool,
    senders: Vec<SyncSender<Result<Msg, ReadError>>>,
    /// Each stream's batches since its last barrier, and their size.
    pending: Vec<Vec<RecordBatch>>,
    pending_bytes: Vec<usize>,
    pending_max: usize,
    /// The epoch each stream's next chunk belongs to.
    epochs: Vec<u32>,
    ended: Vec<bool>,
}

/// The attempt stopped listening: nothing more to hand over.
struct Gone;

impl Demux {
    fn run(mut self, conn: UnixStream) {
        let mut input = BufReader::with_capacity(1 << 20, conn);
        loop {
            let frame = match read_frame(&mut input) {
                Ok(Some(f)) => f,
                Ok(None) => {
                    self.fail_open(
                        "the runner's source pump closed the edge before the stream ended",
                    );
                    return;
                }
                Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    self.fail_open(
                        "the runner's source pump closed the edge before the stream ended \
                         (inside a frame)",
                    );
                    return;
                }
                Err(e) => {
                    self.fail_open(&format!("the data edge failed: {e}"));
                    return;
                }
            };
            match self.take(frame) {
                Ok(true) => {}
                // Every stream ended, or the attempt is gone.
                Ok(false) | Err(Gone) => return,
            }
        }
    }

    /// Fails every stream that has not ended, in order (the attempt takes
    /// them in that order, so no send waits for ever).
    fn fail_open(&self, reason: &str) {
        for (i, tx) in self.senders.iter().enumerate() {
            if !self.ended[i] {
                let e = ReadError::Stream {
                    stream: self.names[i].clone(),
                    reason: reason.to_string(),
                };
                if tx.send(Err(e)).is_err() {
                    return;
                }
            }
        }
    }

    fn fail(&self, stream: usize, reason: String) -> Result<bool, Gone> {
        let e = ReadError::Stream {
            stream: self.names[stream].clone(),
            reason,
        };
        let _ = self.senders[stream].send(Err(e));
        Err(Gone)
    }

    /// A stream the runner's source asked a new attempt for.
    fn restart(&self, stream: usize, why: &str) -> Result<bool, Gone> {
        let e = ReadError::Restart(why.to_string());
        let _ = self.senders[stream].send(Err(e));
        Err(Gone)
    }

    /// Takes one frame; Ok(false) once every stream has ended.
    fn take(&mut self, frame: Frame) -> Result<bool, Gone> {
        let (stream, epoch) = match &frame {
            Frame::Batch { stream, epoch, .. } | Frame::Barrier { stream, epoch, .. } => {
                (*stream, Some(*epoch))
            }
            Frame::End { stream, .. } => (*stream, None),
            Frame::Error { stream, reason } => {
                if let Some(why) = reason.strip_prefix(RESTART) {
                    let i = usize::from(*stream);
                    if i < self.names.len() {
                        return self.restart(i, why);
                    }
                    for i in 0..self.names.len() {
                        if !self.ended[i] {
                            return self.restart(i, why);
                        }
                    }
                    return Err(Gone);
                }
                let reason = format!("the runner's source: {reason}");
                match usize::from(*stream) {
                    i if i < self.names.len() => return self.fail(i, reason),
                    _ if *stream == ANY_STREAM => {
                        self.fail_open(&reason);
                        return Err(Gone);
                    }
                    _ => {}
                }
                self.fail_open(&format!(
                    "an error frame of unknown stream {stream}: {reason}"
                ));
                return Err(Gone);
            }
            Frame::Open { .. }
            | Frame::Describe { .. }
            | Frame::Catalog { .. }
            | Frame::Ack { .. }
            | Frame::Request { .. }
            | Frame::Reply { .. } => {
                self.fail_open(
                    "the runner sent an open, describe, catalog, ack, request or reply frame \
                     while the streams flowed",
                );
                return Err(Gone);
            }
        };
        let i = usize::from(stream);
        if i >= self.names.len() {
            self.fail_open(&format!(
                "a frame of stream {stream}, which the plan does not have"
            ));
            return Err(Gone);
        }
        if self.ended[i] {
            return self.fail(i, "a frame after the stream's end".into());
        }
        if let Some(e) = epoch.filter(|e| *e != self.epochs[i]) {
            return self.fail(
                i,
                format!(
                    "a frame of epoch {e} on the data edge where epoch {} was due",
                    self.epochs[i]
                ),
            );
        }
        let msg = match frame {
            Frame::Batch { batch, .. } => {
                self.pending_bytes[i] += batch.get_array_memory_size();
                if self.pending_bytes[i] > self.pending_max {
                    return self.fail(
                        i,
                        format!(
                            "the runner sent more than {} bytes of the stream without a barrier",
                            self.pending_max
                        ),
                    );
                }
                self.pending[i].push(batch);
                return Ok(true);
            }
            Frame::Barrier { position, .. } => {
                self.epochs[i] = self.epochs[i].saturating_add(1);
                self.pending_bytes[i] = 0;
                let batches = std::mem::take(&mut self.pending[i]);
                match self.chunk(batches, position) {
                    Ok(m) => m,
                    Err(reason) => return self.fail(i, reason),
                }
            }
            Frame::End { bytes, .. } => {
                if !self.pending[i].is_empty() {
                    return self.fail(i, "rows after the stream's last barrier".into());
                }
                self.ended[i] = true;
                Msg::End { bytes }
            }
            Frame::Error { .. }
            | Frame::Open { .. }
            | Frame::Describe { .. }
            | Frame::Catalog { .. }
            | Frame::Ack { .. }
            | Frame::Request { .. }
            | Frame::Reply { .. } => return Err(Gone),
        };
        if self.senders[i].send(Ok(msg)).is_err() {
            return Err(Gone);
        }
        Ok(!self.ended.iter().all(|e| *e))
    }

    /// A chunk from the batches before a barrier.
    fn chunk(&self, batches: Vec<RecordBatch>, last: Vec<String>) -> Result<Msg, String> {
        let Some(schema) = batches.first().map(|b| b.schema()) else {
            return Err("a barrier with no batch before it".into());
        };
        let batch = arrow_select::concat::concat_batches(&schema, &batches)
            .map_err(|e| format!("the batches before a barrier: {e}"))?;
        if !self.typed {
            return Ok(Msg::Raw(RawChunk {
                records: raw_records(&batch)?,
                last,
            }));
        }
        let rows = batch.num_rows();
        let mut arrays: Vec<ArrayRef> = batch.columns().to_vec();
        let is_id = schema.fields().last().map(|f| f.name().as_str()) == Some(ORCA_ID);
        let ids = arrays
            .pop()
            .filter(|_| is_id)
            .ok_or_else(|| format!("a typed batch ends without its {ORCA_ID} column"))?;
        Ok(Msg::Chunk {
            arrays,
            ids,
            last,
            rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::source::open::open_readers;
    use crate::source::plan::Start;
    use crate::source::postgres::cdc::SlotGauge;
    use crate::transport::pump;
    use crate::transport::wire::raw_schema;

    /// A scratch folder of JSON lines files, removed when dropped.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch() -> Scratch {
        let dir = std::env::temp_dir().join(format!("orca-edge-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(dir.join("orders")).expect("scratch dir");
        std::fs::write(
            dir.join("orders/2024-01.jsonl"),
            "{\"id\": 1, \"amount\": 2.5}\n{\"id\": 2}\nnot json\n",
        )
        .expect("file");
        std::fs::write(
            dir.join("orders/2024-02.jsonl"),
            "{\"id\": 3, \"note\": \"ünïcode\"}\n",
        )
        .expect("file");
        Scratch(dir)
    }

    fn plan(dir: &Path, after: Option<Vec<String>>) -> Plan {
        Plan {
            sync: "mirror".into(),
            source: orca_core::sync::Source::Files {
                url: dir.display().to_string().as_str().into(),
                format: orca_core::sync::FileFormat::Jsonl,
            },
            streams: vec![serde_json::from_value(json!({
                "name": "orders", "mode": "append", "primary_key": [],
                "schema_policy": "evolve", "delivery": "at_least_once",
                "pattern": "orders/*.jsonl",
            }))
            .expect("a stream")],
            slot: None,
            batch_rows: 2,
            start: vec![Start {
                name: "orders".into(),
                after,
                recorded: Vec::new(),
            }],
            // The files are in a scratch directory this plan may read.
            guard: crate::netguard::Scope {
                org: "acme".into(),
                allowlist: Some(vec![dir.display().to_string()]),
                store: None,
                warehouse: None,
            },
        }
    }

    /// What a reader hands the attempt, in a comparable form.
    fn drain(readers: Vec<Reader>) -> Vec<Result<String, String>> {
        let mut seen = Vec::new();
        for r in readers {
            loop {
                let said = match r.rx.recv() {
                    Ok(Ok(Msg::Raw(c))) => {
                        let records: Vec<String> = c
                            .records
                            .iter()
                            .map(|r| match r {
                                Ok(raw) => format!("{} {}", raw.position, raw.record),
                                Err((raw, why)) => {
                                    format!("{} {} ({why})", raw.position, raw.record)
                                }
                            })
                            .collect();
                        Ok(format!("{} up to {:?}", records.join(" | "), c.last))
                    }
                    Ok(Ok(Msg::End { bytes })) => Ok(format!("end {bytes}")),
                    Ok(Ok(Msg::Chunk { rows, .. })) => Ok(format!("{rows} typed rows")),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("hung up".into()),
                };
                let last = !matches!(said, Ok(ref s) if !s.starts_with("end"));
                seen.push(said);
                if last {
                    break;
                }
            }
        }
        seen
    }

    fn with_pump(dir: &Path, plan: &Plan, first_epoch: u64) -> Vec<Result<String, String>> {
        let mut edge = Edge::listen(&dir.join("edge.sock")).expect("listen");
        let path = dir.join("edge.sock");
        let pump = std::thread::spawn(move || {
            let gone = AtomicBool::new(false);
            pump::connect(&path, Duration::from_secs(10), &gone)
                .and_then(|c| pump::serve(c, &SlotGauge::default()))
        });
        let readers = edge.open(plan, first_epoch, || false).expect("open");
        let seen = drain(readers);
        let _ = pump.join();
        seen
    }

    #[test]
    fn the_edge_hands_over_what_the_engine_would_read_itself() {
        let s = scratch();
        for after in [
            None,
            Some(vec!["orders/2024-01.jsonl".to_string(), "35".to_string()]),
        ] {
            let p = plan(&s.0, after);
            let here = drain(open_readers(&p, None).expect("readers").0);
            let over_edge = with_pump(&s.0, &p, 7);
            assert_eq!(over_edge, here);
            assert!(here.iter().all(Result::is_ok), "{here:?}");
        }
        let all = drain(open_readers(&plan(&s.0, None), None).expect("readers").0);
        // Batches of two records, the line that is not JSON among them with
        // its reason, then the stream's end.
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(
            all[1].as_ref().is_ok_and(|c| c.contains("ünïcode")),
            "{all:?}"
        );
        assert!(
            all[0].as_ref().is_ok_and(|c| c.contains("\"amount\":2.5")),
            "{all:?}"
        );
    }

    #[test]
    fn a_source_the_pump_cannot_read_fails_the_stream_with_its_reason() {
        let s = scratch();
        let mut p = plan(&s.0, None);
        // A place outside what the plan's guard allows.
        p.source = orca_core::sync::Source::Files {
            url: "/etc/orca-not-allowed".into(),
            format: orca_core::sync::FileFormat::Jsonl,
        };
        let seen = with_pump(&s.0, &p, 1);
        assert_eq!(seen.len(), 1);
        let e = seen[0].as_ref().expect_err("an error");
        assert!(
            e.contains("the runner's source") && e.contains("/etc/orca-not-allowed"),
            "{e}"
        );
    }

    /// A hand-written pump that sends `frames` after the open frame.
    fn fake_pump(dir: &Path, frames: Vec<Frame>) -> Vec<Result<String, String>> {
        fake_pump_held_to(dir, frames, PENDING_BYTES_MAX)
    }

    fn fake_pump_held_to(
        dir: &Path,
        frames: Vec<Frame>,
        pending_max: usize,
    ) -> Vec<Result<String, String>> {
        let path = dir.join("edge.sock");
        let mut edge = Edge::listen(&path).expect("listen");
        edge.pending_max = pending_max;
        let pump = std::thread::spawn(move || {
            let gone = AtomicBool::new(false);
            let conn = pump::connect(&path, Duration::from_secs(10), &gone).expect("connect");
            let mut input = BufReader::new(conn.try_clone().expect("clone"));
            let open = read_frame(&mut input).expect("open frame");
            assert!(matches!(open, Some(Frame::Open { first_epoch: 5, .. })));
            let mut out = BufWriter::new(conn);
            for f in &frames {
                write_frame(&mut out, f).expect("write");
            }
            out.flush().expect("flush");
        });
        let readers = edge.open(&plan(dir, None), 5, || false).expect("open");
        pump.join().expect("fake pump");
        drain(readers)
    }

    /// A raw batch of one record.
    fn raw(position: &str) -> RecordBatch {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(arrow_array::StringArray::from(vec![position])),
            Arc::new(arrow_array::StringArray::from(vec!["{\"id\":1}"])),
            Arc::new(arrow_array::StringArray::from(vec![None::<&str>])),
        ];
        RecordBatch::try_new(Arc::new(raw_schema()), cols).expect("batch")
    }

    #[test]
    fn a_broken_edge_fails_the_stream_and_names_what_broke() {
        let s = scratch();
        let batch = |epoch| Frame::Batch {
            stream: 0,
            epoch,
            batch: raw("a:1"),
        };
        let barrier = |epoch| Frame::Barrier {
            stream: 0,
            epoch,
            position: vec!["a".into(), "1".into()],
        };
        // The pump goes away after one epoch.
        let seen = fake_pump(&s.0, vec![batch(5), barrier(5)]);
        assert!(seen[0].is_ok(), "{seen:?}");
        let e = seen[1].as_ref().expect_err("closed");
        assert!(e.contains("closed the edge before the stream ended"), "{e}");
        // A frame of an epoch that is not due.
        let seen = fake_pump(&s.0, vec![batch(5), barrier(5), batch(9)]);
        let e = seen[1].as_ref().expect_err("wrong epoch");
        assert!(
            e.contains("epoch 9") && e.contains("epoch 6 was due"),
            "{e}"
        );
        // A stream the plan does not have.
        let seen = fake_pump(
            &s.0,
            vec![Frame::End {
                stream: 3,
                bytes: 0,
            }],
        );
        let e = seen[0].as_ref().expect_err("unknown stream");
        assert!(e.contains("stream 3"), "{e}");
        // Rows after the last barrier, then the end.
        let seen = fake_pump(
            &s.0,
            vec![
                batch(5),
                Frame::End {
                    stream: 0,
                    bytes: 0,
                },
            ],
        );
        let e = seen[0].as_ref().expect_err("rows without a barrier");
        assert!(e.contains("after the stream's last barrier"), "{e}");
        // More rows without a barrier than the engine holds.
        let one = raw("a:1").get_array_memory_size();
        let seen = fake_pump_held_to(&s.0, (0..5).map(|_| batch(5)).collect(), one * 3);
        let e = seen[0].as_ref().expect_err("too much pending");
        assert!(
            e.contains(&format!("more than {} bytes", one * 3)) && e.contains("without a barrier"),
            "{e}"
        );
    }
}

#[cfg(test)]
mod describe_tests {
    use std::sync::atomic::AtomicBool;

    use serde_json::json;

    use super::*;
    use crate::transport::pump;

    /// A hand-written runner that answers one describe frame with `answer`.
    fn ask(answer: Frame) -> Result<Vec<PgTable>, EdgeError> {
        let dir = std::env::temp_dir().join(format!("orca-describe-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("edge.sock");
        let mut edge = Edge::listen(&path).expect("listen");
        let runner = std::thread::spawn(move || {
            let gone = AtomicBool::new(false);
            let conn = pump::connect(&path, Duration::from_secs(10), &gone).expect("connect");
            let mut input = BufReader::new(conn.try_clone().expect("clone"));
            let asked = read_frame(&mut input).expect("describe frame");
            assert!(
                matches!(&asked, Some(Frame::Describe { request }) if request["streams"][0]["name"] == "orders"),
                "{asked:?}"
            );
            let mut out = BufWriter::new(conn);
            write_frame(&mut out, &answer).expect("answer");
            out.flush().expect("flush");
        });
        let asked = Describe {
            source: orca_core::sync::Source::Postgres {
                url: "postgres://127.0.0.1/shop".into(),
                batch_rows: None,
            },
            streams: vec![serde_json::from_value(json!({
                "name": "orders", "mode": "append", "primary_key": ["id"],
                "schema_policy": "evolve", "delivery": "at_least_once",
                "table": "public.orders", "cursor": "updated_at",
            }))
            .expect("a stream")],
            guard: crate::netguard::Scope::default(),
        };
        let got = edge.describe(&asked, || false);
        runner.join().expect("runner");
        let _ = std::fs::remove_dir_all(dir);
        got
    }

    #[test]
    fn the_runner_describes_the_source_for_the_engine() {
        let table = json!([{
            "spec": {"name": "orders", "table": "public.orders", "cursor": "updated_at",
                     "primary_key": ["id"], "schema_policy": "evolve", "lookback": null},
            "columns": [{"name": "id", "kind": "Int8", "nullable": false},
                        {"name": "amount", "kind": {"Numeric": {"precision": 12, "scale": 2}},
                         "nullable": true}],
            "sql_types": ["bigint", "numeric(12,2)"],
            "as_text": [false, false],
            "key": [0]
        }]);
        let tables = ask(Frame::Catalog { tables: table }).expect("catalog");
        assert_eq!(tables.len(), 1);
        assert_eq!(tables[0].spec.table, "public.orders");
        assert_eq!(tables[0].columns[1].name, "amount");

        let e = ask(Frame::Error {
            stream: crate::transport::frame::ANY_STREAM,
            reason: "relation \"public.orders\" does not exist".into(),
        })
        .expect_err("a source the runner cannot describe");
        assert!(
            e.to_string().contains("the runner's source: relation"),
            "{e}"
        );

        let e = ask(Frame::Catalog {
            tables: json!({"not": "tables"}),
        })
        .expect_err("a catalog that is not tables");
        assert!(e.to_string().contains("the runner's catalog"), "{e}");
    }
}
