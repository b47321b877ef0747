//! A destination connector: a program of the host's connectors directory
//! (`PROGRAM write`, docs/connectors.md) that takes each epoch's rows of a
//! stream as batch frames and makes them visible when asked to commit.
//! The engine holds one connection to it for the attempt, and every call is
//! a request frame answered by a reply frame within the definition's
//! `timeout_seconds`: raise the fence, read a stream's marker, commit an
//! epoch. The commit protocol needs no more of a destination than that; what
//! the connector's commits promise (`atomic`: rows and marker together)
//! decides the delivery level the definition could claim.

use std::io::{BufReader, BufWriter, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use orca_core::delivery::WriteMode;
use orca_core::sync::{ConnectorCommits, Stream};
use serde_json::{json, Map, Value};

use crate::dest::error::DestError;
use crate::netguard::Guard;
use crate::source::error::ReadError;
use crate::source::external::connector::{
    accept, check_reaches, command, keep_last_words, last_words, private_dir, program, spec,
    LastWords, Running, HOST_SOCKET, PROTOCOL, SOCKET_ENV,
};
use crate::transport::frame::{read_frame, write_frame, Frame};

/// The most rows one batch frame carries (a frame's payload is bounded).
const FRAME_ROWS: usize = 65_536;

pub struct ConnectorDest {
    name: String,
    /// The streams, in the open frame's order: a stream's index is its
    /// number in the batch frames.
    streams: Vec<String>,
    reader: BufReader<UnixStream>,
    writer: BufWriter<UnixStream>,
    words: Arc<LastWords>,
    /// How long an answer may take.
    timeout: Duration,
    /// Killed, and its socket's directory removed, when the attempt drops
    /// the destination.
    running: Running,
}

fn failed(name: &str, reason: impl Into<String>) -> DestError {
    DestError::Connector {
        name: name.to_string(),
        reason: reason.into(),
    }
}

impl From<ReadError> for DestError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Connector { name, reason } => DestError::Connector { name, reason },
            ReadError::Netguard(n) => DestError::Netguard(n),
            other => DestError::Definition(other.to_string()),
        }
    }
}

impl ConnectorDest {
    /// Starts `PROGRAM write`, once its spec promises what the definition
    /// relies on and netguard allowed what its config names, and opens it.
    pub fn open(
        name: &str,
        commits: ConnectorCommits,
        config: &Map<String, Value>,
        timeout_seconds: Option<u64>,
        guard: &Guard,
        sync: &str,
        streams: &[Stream],
    ) -> Result<ConnectorDest, DestError> {
        let path = program(name)?;
        let spec = spec(name, &path)?;
        match spec.commits.as_deref() {
            None => {
                return Err(failed(
                    name,
                    "is not a destination: its spec names no commits (a source connector's \
                     names a replay)",
                ))
            }
            Some("at_least_once") if commits == ConnectorCommits::Atomic => {
                return Err(failed(
                    name,
                    "the sync takes its commits for atomic, and the connector's spec says \
                     at_least_once: redefine the sync with \"commits\": \"at_least_once\"",
                ))
            }
            Some(_) => {}
        }
        for s in streams {
            let mode = s.mode.name();
            if !spec.modes.iter().any(|m| m == mode) {
                return Err(failed(
                    name,
                    format!(
                        "stream {} is written with {mode}, and the connector's spec takes {:?}",
                        s.name, spec.modes
                    ),
                ));
            }
        }
        let config = Value::Object(config.clone());
        check_reaches(
            name,
            &spec,
            std::iter::once(("destination.config".to_string(), &config)),
            guard,
        )?;
        let dir = private_dir()?;
        let socket = dir.join("connector.sock");
        let listener = UnixListener::bind(&socket)
            .map_err(|e| failed(name, format!("cannot listen on {}: {e}", socket.display())))?;
        crate::source::external::host_http::serve(name, &socket.with_file_name(HOST_SOCKET), guard)
            .map_err(|r| failed(name, r))?;
        let mut child = command(&path, "write")
            .env(SOCKET_ENV, &socket)
            .env(
                crate::source::external::host_http::HOST_SOCKET_ENV,
                socket.with_file_name(HOST_SOCKET),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(name, format!("cannot start {} write: {e}", path.display())))?;
        let words = Arc::new(LastWords::default());
        if let Some(err) = child.stderr.take() {
            keep_last_words(name, err, words.clone());
        }
        let mut running = Running {
            child: Some(child),
            dir,
        };
        let conn = accept(&listener, &mut running, &words).map_err(|r| failed(name, r))?;
        let timeout = Duration::from_secs(
            timeout_seconds.unwrap_or(orca_core::sync::CONNECTOR_TIMEOUT_DEFAULT),
        );
        let io = |e: std::io::Error| failed(name, e.to_string());
        conn.set_read_timeout(Some(timeout)).map_err(io)?;
        let writer = BufWriter::new(conn.try_clone().map_err(io)?);
        let mut d = ConnectorDest {
            name: name.to_string(),
            streams: streams.iter().map(|s| s.name.clone()).collect(),
            reader: BufReader::new(conn),
            writer,
            words,
            timeout,
            running,
        };
        let open = json!({
            "protocol": PROTOCOL,
            "sync": sync,
            "config": config,
            "commits": commits.name(),
            "streams": streams.iter().map(|s| json!({
                "name": s.name,
                "mode": s.mode.name(),
                "primary_key": s.primary_key,
                "config": s.config.clone().unwrap_or_default(),
            })).collect::<Vec<_>>(),
        });
        d.send(&Frame::Open {
            first_epoch: 0,
            plan: open,
        })?;
        d.answer("open")?;
        Ok(d)
    }

    fn send(&mut self, frame: &Frame) -> Result<(), DestError> {
        write_frame(&mut self.writer, frame)
            .and_then(|_| self.writer.flush().map_err(Into::into))
            .map_err(|e| self.gone(format!("writing to it: {e}")))
    }

    /// What went wrong, with the connector's last words if it exited.
    fn gone(&mut self, reason: String) -> DestError {
        let exited = self
            .running
            .status(Duration::from_millis(200))
            .map(|s| {
                format!(
                    "; it exited ({s}), its last words: {}",
                    last_words(&self.words)
                )
            })
            .unwrap_or_default();
        failed(&self.name, format!("{reason}{exited}"))
    }

    /// The reply to the last request: `{"ok": true, ...}`, or the
    /// connector's error.
    fn answer(&mut self, what: &str) -> Result<Value, DestError> {
        let frame = match read_frame(&mut self.reader) {
            Ok(Some(f)) => f,
            Ok(None) => return Err(self.gone(format!("closed its socket before answering {what}"))),
            Err(crate::transport::frame::FrameError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(self.gone(format!(
                    "sent no answer to {what} within {:?} (timeout_seconds)",
                    self.timeout
                )))
            }
            Err(e) => return Err(self.gone(format!("answering {what}: {e}"))),
        };
        let Frame::Reply { reply } = frame else {
            return Err(failed(
                &self.name,
                format!("answered {what} with a frame that is not a reply"),
            ));
        };
        if reply.get("ok") == Some(&Value::Bool(true)) {
            return Ok(reply);
        }
        if let Some(fence) = reply.get("fenced").and_then(Value::as_i64) {
            return Err(DestError::Fenced {
                fence: i32::try_from(fence).unwrap_or(i32::MAX),
                mine: reply.get("generation").and_then(Value::as_i64).unwrap_or(0) as i32,
            });
        }
        Err(failed(
            &self.name,
            format!(
                "refused {what}: {}",
                reply
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
            ),
        ))
    }

    fn request(&mut self, request: Value) -> Result<Value, DestError> {
        let what = request["op"].as_str().unwrap_or("a request").to_string();
        self.send(&Frame::Request { request })?;
        self.answer(&what)
    }

    pub fn raise_fence(&mut self, generation: i32) -> Result<(), DestError> {
        match self.request(json!({"op": "fence", "generation": generation})) {
            Err(DestError::Fenced { fence, .. }) => Err(DestError::Fenced {
                fence,
                mine: generation,
            }),
            other => other.map(|_| ()),
        }
    }

    /// The last epoch committed to a stream (0: none).
    pub fn marker(&mut self, stream: &str) -> Result<u64, DestError> {
        let reply = self.request(json!({"op": "marker", "stream": stream}))?;
        reply.get("epoch").and_then(Value::as_u64).ok_or_else(|| {
            failed(
                &self.name,
                format!("answered the marker of {stream} without an epoch: {reply}"),
            )
        })
    }

    /// Sends an epoch's rows of a stream and asks the connector to commit
    /// them; a connector answers an epoch at or below its marker with ok
    /// and changes nothing.
    pub fn commit(
        &mut self,
        generation: i32,
        epoch: u64,
        stream: &str,
        batches: &[RecordBatch],
        mode: WriteMode,
    ) -> Result<(), DestError> {
        let index = self
            .streams
            .iter()
            .position(|s| s == stream)
            .and_then(|i| u16::try_from(i).ok())
            .ok_or_else(|| DestError::Definition(format!("stream {stream} is not defined")))?;
        let frame_epoch = u32::try_from(epoch).unwrap_or(u32::MAX);
        let mut rows = 0usize;
        for b in batches {
            // Protocol 1 has always given connectors text ids.
            let b = &crate::ids::in_form(b, crate::ids::IdForm::Hex)
                .map_err(|e| failed(&self.name, e.to_string()))?;
            let mut at = 0;
            while at < b.num_rows() {
                let n = FRAME_ROWS.min(b.num_rows() - at);
                self.send(&Frame::Batch {
                    stream: index,
                    epoch: frame_epoch,
                    batch: b.slice(at, n),
                })?;
                at += n;
                rows += n;
            }
        }
        let reply = self.request(json!({
            "op": "commit", "stream": stream, "generation": generation, "epoch": epoch,
            "mode": mode.name(), "rows": rows,
        }))?;
        match reply.get("rows").and_then(Value::as_u64) {
            Some(n) if n as usize != rows && !reply["skipped"].as_bool().unwrap_or(false) => {
                Err(failed(
                    &self.name,
                    format!("committed {n} rows of {stream}'s epoch {epoch}, and was sent {rows}"),
                ))
            }
            _ => Ok(()),
        }
    }
}
