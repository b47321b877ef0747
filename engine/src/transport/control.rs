//! The engine's control channel: a Unix socket the engine listens on and its
//! runner (or anyone with access to the socket file) talks to, one JSON
//! request per line and one JSON response per line, in order.
//!
//! ```text
//! → {"id": 1, "method": "hello"}
//! ← {"id": 1, "ok": true, "result": {"protocol": 1, "engine": "0.1.0", "sync": "shop", "pid": 4242}}
//! → {"id": 2, "method": "status"}
//! ← {"id": 2, "ok": true, "result": {"phase": "streaming", "generation": 3, "head": 7,
//!                                    "committed": 7, "rows": 14000, "stop_requested": false,
//!                                    "streams": {"orders": {"rows": 14000, "position": ["2024-05-01 …", "14000"]}}}}
//! → {"id": 3, "method": "stop"}
//! ← {"id": 3, "ok": true, "result": {"stopping": true, "phase": "streaming"}}
//! → {"id": 4, "method": "rewind"}
//! ← {"id": 4, "ok": false, "error": "unknown method \"rewind\" (hello, status, stop)"}
//! ```
//!
//! `stop` is graceful: the attempt takes no new chunk from its sources,
//! finishes the epoch in flight (HEAD moves and lane 0 commits it), and exits
//! 0 with `"stopped": true` in its outcome. Where it stopped is a resume
//! point, so the sync's next attempt goes on from there with nothing to
//! recover. The runner sends it when a run is cancelled or the runner shuts
//! down, and kills the engine only if it has not exited within its grace.
//!
//! The decisions (what a request line gets) are in [`answer`], tested without
//! a socket; [`Control`] is the listener around them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Value};

/// The control protocol's version, in `hello`'s answer.
pub const PROTOCOL: u32 = 1;
/// The longest request line the engine reads (a bound on what a client can
/// make it buffer).
pub const MAX_LINE: usize = 64 * 1024;
/// The most clients served at once (the runner needs one; each takes a
/// thread): another is answered with an error and hung up on.
pub const CONNECTIONS_MAX: usize = 8;
/// A client that sends nothing for this long is hung up on, so idle
/// connections cannot hold every place.
pub const IDLE_MAX: Duration = Duration::from_secs(60);

/// What the attempt is doing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    #[default]
    Claiming,
    Recovering,
    Streaming,
    Done,
    Stopped,
    Failed,
}

/// One stream's progress in this attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StreamStatus {
    /// Rows read by this attempt and committed or in flight.
    pub rows: u64,
    /// The stream's resume position after its last committed chunk (the
    /// cursor and key values, or the file and offset).
    pub position: Option<Vec<String>>,
}

/// What `status` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Status {
    pub phase: Phase,
    pub sync: String,
    pub generation: i32,
    /// The epoch HEAD names (the last commit point this attempt saw).
    pub head: u64,
    /// The last epoch made visible in the destination.
    pub committed: u64,
    /// Rows this attempt moved.
    pub rows: u64,
    pub stop_requested: bool,
    pub streams: BTreeMap<String, StreamStatus>,
    /// Why the attempt failed, once it has.
    pub error: Option<String>,
}

/// What answering a request asks of the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    None,
    Stop,
}

/// The response line (without its newline) to one request line, given the
/// attempt's status, and what the attempt must do about it.
pub fn answer(line: &str, status: &Status) -> (Value, Effect) {
    let req: Value = match serde_json::from_str(line) {
        Ok(v @ Value::Object(_)) => v,
        Ok(other) => {
            return (
                json!({"id": null, "ok": false,
                       "error": format!("a request is a JSON object, got {other}")}),
                Effect::None,
            )
        }
        Err(e) => {
            return (
                json!({"id": null, "ok": false,
                       "error": format!("a request is one line of JSON: {e}")}),
                Effect::None,
            )
        }
    };
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    let fail = |error: String| (json!({"id": id, "ok": false, "error": error}), Effect::None);
    let Some(method) = req.get("method").and_then(Value::as_str) else {
        return fail(format!(
            "a request names its method as a string, got {}",
            req.get("method").unwrap_or(&Value::Null)
        ));
    };
    let ok = |result: Value| json!({"id": id, "ok": true, "result": result});
    match method {
        "hello" => (
            ok(
                json!({"protocol": PROTOCOL, "engine": env!("CARGO_PKG_VERSION"),
                      "sync": status.sync, "pid": std::process::id()}),
            ),
            Effect::None,
        ),
        "status" => (
            ok(serde_json::to_value(status).unwrap_or(Value::Null)),
            Effect::None,
        ),
        "stop" => {
            let running = matches!(
                status.phase,
                Phase::Claiming | Phase::Recovering | Phase::Streaming
            );
            (
                ok(json!({"stopping": running, "phase": status.phase})),
                if running { Effect::Stop } else { Effect::None },
            )
        }
        other => fail(format!(
            "unknown method {} (hello, status, stop)",
            Value::from(other)
        )),
    }
}

/// The listening side of the control channel, for the life of an attempt.
/// Dropping it removes the socket file.
pub struct Control {
    path: PathBuf,
    status: Arc<Mutex<Status>>,
    stop: Arc<AtomicBool>,
}

/// Binds a Unix socket at `path`, a file the engine owns: one an engine
/// that died left behind is replaced; anything else there is an error.
pub(crate) fn bind_owned(path: &Path) -> std::io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; not replacing it",
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(path)?;
    }
    // Bound under another name and renamed into place: the file appears only
    // once the socket listens, so a client that sees it can connect (bind
    // makes the file a moment before listen, and a connect in between is
    // refused).
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(name);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    std::fs::rename(&tmp, path)?;
    Ok(listener)
}

impl Control {
    /// Listens on `path`, a socket file this engine owns: one left behind by
    /// an engine that died is replaced; anything else there is an error.
    pub fn listen(path: &Path, sync: &str) -> std::io::Result<Control> {
        let listener = bind_owned(path)?;
        let status = Arc::new(Mutex::new(Status {
            sync: sync.to_string(),
            ..Status::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (status.clone(), stop.clone());
        let open = Arc::new(AtomicUsize::new(0));
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                for mut conn in listener.incoming().flatten() {
                    if let Err(why) = crate::transport::peer::check_same_user(&conn) {
                        let r = json!({"id": null, "ok": false, "error": why});
                        let _ = writeln!(conn, "{r}");
                        continue;
                    }
                    if open.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
                        open.fetch_sub(1, Ordering::SeqCst);
                        let r = json!({"id": null, "ok": false,
                                       "error": format!("the engine serves at most {CONNECTIONS_MAX} clients at once")});
                        let _ = writeln!(conn, "{r}");
                        continue;
                    }
                    let _ = conn.set_read_timeout(Some(IDLE_MAX));
                    // Gives the place back however the client's thread ends
                    // (or if it cannot start).
                    let slot = Slot(open.clone());
                    let (st, sp) = (st.clone(), sp.clone());
                    // A client that never sends must not hold up the others.
                    let _ = std::thread::Builder::new()
                        .name("control-conn".into())
                        .spawn(move || {
                            let _slot = slot;
                            serve(conn, &st, &sp);
                        });
                }
            })?;
        Ok(Control {
            path: path.to_path_buf(),
            status,
            stop,
        })
    }

    pub fn update(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

/// A client's place among [`CONNECTIONS_MAX`], given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(conn: UnixStream, status: &Mutex<Status>, stop: &AtomicBool) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = match (&mut reader)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut buf)
        {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let response = if n > MAX_LINE {
            // The rest of an overlong line cannot be told from the next
            // request: answer and hang up.
            let r = json!({"id": null, "ok": false,
                           "error": format!("a request line is at most {MAX_LINE} bytes")});
            let _ = writeln!(out, "{r}");
            return;
        } else {
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let snapshot = match status.lock() {
                Ok(s) => s.clone(),
                Err(_) => return,
            };
            let (response, effect) = answer(line, &snapshot);
            if effect == Effect::Stop {
                stop.store(true, Ordering::SeqCst);
                if let Ok(mut s) = status.lock() {
                    s.stop_requested = true;
                }
            }
            response
        };
        if writeln!(out, "{response}").is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streaming() -> Status {
        Status {
            phase: Phase::Streaming,
            sync: "shop".into(),
            generation: 2,
            head: 5,
            committed: 4,
            rows: 10,
            ..Status::default()
        }
    }

    #[test]
    fn status_answers_with_the_attempts_progress_and_keeps_the_id() {
        let (r, e) = answer(r#"{"id": 7, "method": "status"}"#, &streaming());
        assert_eq!(e, Effect::None);
        assert_eq!(r["id"], 7);
        assert_eq!(r["ok"], true);
        assert_eq!(r["result"]["phase"], "streaming");
        assert_eq!(r["result"]["head"], 5);
        assert_eq!(r["result"]["committed"], 4);
        assert_eq!(r["result"]["generation"], 2);
    }

    #[test]
    fn hello_names_the_protocol_and_the_sync() {
        let (r, _) = answer(r#"{"id": "a", "method": "hello"}"#, &streaming());
        assert_eq!(r["id"], "a");
        assert_eq!(r["result"]["protocol"], PROTOCOL);
        assert_eq!(r["result"]["sync"], "shop");
    }

    #[test]
    fn stop_stops_a_running_attempt_and_is_a_no_op_once_it_ended() {
        let (r, e) = answer(r#"{"id": 1, "method": "stop"}"#, &streaming());
        assert_eq!(
            (r["result"]["stopping"].clone(), e),
            (json!(true), Effect::Stop)
        );
        let done = Status {
            phase: Phase::Done,
            ..streaming()
        };
        let (r, e) = answer(r#"{"id": 1, "method": "stop"}"#, &done);
        assert_eq!(
            (r["result"]["stopping"].clone(), e),
            (json!(false), Effect::None)
        );
        assert_eq!(r["result"]["phase"], "done");
    }

    #[test]
    fn bad_requests_get_an_error_naming_what_is_wrong() {
        let s = streaming();
        let (r, e) = answer(r#"{"id": 3, "method": "rewind"}"#, &s);
        assert_eq!((r["ok"].clone(), e), (json!(false), Effect::None));
        assert_eq!(r["id"], 3);
        assert!(
            r["error"]
                .as_str()
                .unwrap_or_default()
                .contains("\"rewind\""),
            "{r}"
        );
        let (r, _) = answer("stop", &s);
        assert!(
            r["error"]
                .as_str()
                .unwrap_or_default()
                .contains("one line of JSON"),
            "{r}"
        );
        let (r, _) = answer("[1]", &s);
        assert!(
            r["error"]
                .as_str()
                .unwrap_or_default()
                .contains("JSON object, got [1]"),
            "{r}"
        );
        let (r, _) = answer(r#"{"id": 4, "method": 5}"#, &s);
        assert!(
            r["error"].as_str().unwrap_or_default().contains("got 5"),
            "{r}"
        );
    }

    #[test]
    fn the_socket_answers_in_order_and_a_stop_reaches_the_attempt() {
        let dir = std::env::temp_dir().join(format!("orca-control-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("e.sock");
        // A stale socket file from a dead engine is replaced.
        drop(UnixListener::bind(&path).expect("stale socket"));
        let c = Control::listen(&path, "shop").expect("listen");
        c.update(|s| s.phase = Phase::Streaming);
        let mut conn = UnixStream::connect(&path).expect("connect");
        writeln!(conn, r#"{{"id": 1, "method": "status"}}"#).expect("write");
        writeln!(conn, r#"{{"id": 2, "method": "stop"}}"#).expect("write");
        let mut lines = BufReader::new(conn.try_clone().expect("clone")).lines();
        let first: Value =
            serde_json::from_str(&lines.next().expect("line").expect("read")).expect("json");
        let second: Value =
            serde_json::from_str(&lines.next().expect("line").expect("read")).expect("json");
        assert_eq!(
            (first["id"].clone(), second["id"].clone()),
            (json!(1), json!(2))
        );
        assert_eq!(first["result"]["phase"], "streaming");
        assert!(c.stop_requested());
        drop(c);
        assert!(!path.exists(), "the socket file goes with the listener");
        // Not a socket: refused, and left alone.
        std::fs::write(&path, b"data").expect("file");
        let err = Control::listen(&path, "shop").err().expect("refused");
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read(&path).expect("kept"), b"data");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_socket_serves_a_bounded_number_of_clients_of_its_own_user() {
        let dir = std::env::temp_dir().join(format!("orca-control-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("e.sock");
        let c = Control::listen(&path, "shop").expect("listen");
        // Idle clients take every place; the next is told so and hung up on.
        let idle: Vec<UnixStream> = (0..CONNECTIONS_MAX)
            .map(|_| UnixStream::connect(&path).expect("connect"))
            .collect();
        // Each took its place once it was answered.
        for mut conn in idle.iter().map(|c| c.try_clone().expect("clone")) {
            writeln!(conn, r#"{{"id": 1, "method": "hello"}}"#).expect("write");
            let mut line = String::new();
            BufReader::new(conn).read_line(&mut line).expect("read");
            assert!(line.contains("\"ok\":true"), "{line}");
        }
        let extra = UnixStream::connect(&path).expect("connect");
        let mut line = String::new();
        BufReader::new(extra).read_line(&mut line).expect("read");
        assert!(line.contains("at most 8 clients"), "{line}");
        drop(idle);
        // The places come back once the clients leave.
        let again = wait_for_place(&path);
        assert!(again.contains("\"ok\":true"), "{again}");

        // Another user may not stop the attempt, even with the socket in
        // reach (only root can be another user here).
        if crate::transport::peer::own_uid() == 0 {
            let _ = std::process::Command::new("chmod")
                .args(["755"])
                .arg(&dir)
                .status();
            let _ = std::process::Command::new("chmod")
                .args(["777"])
                .arg(&path)
                .status();
            let out = std::process::Command::new("runuser")
                .args(["-u", "nobody", "--", "python3", "-c"])
                .arg(
                    "import socket,sys\n\
                     s = socket.socket(socket.AF_UNIX)\n\
                     s.connect(sys.argv[1])\n\
                     try:\n    s.sendall(b'{\"id\": 1, \"method\": \"stop\"}\\n')\n\
                     except OSError:\n    pass\n\
                     print(s.makefile().readline())",
                )
                .arg(&path)
                .output()
                .expect("runuser");
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                said.contains("refused a connection from user"),
                "{said} {out:?}"
            );
            assert!(!c.stop_requested(), "another user stopped the attempt");
        }
        drop(c);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The answer to a hello once the engine has a place again.
    fn wait_for_place(path: &Path) -> String {
        for _ in 0..200 {
            let mut conn = UnixStream::connect(path).expect("connect");
            let _ = writeln!(conn, r#"{{"id": 1, "method": "hello"}}"#);
            let mut line = String::new();
            let _ = BufReader::new(conn).read_line(&mut line);
            if line.contains("\"ok\":true") {
                return line;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        "no place came back".into()
    }
}
