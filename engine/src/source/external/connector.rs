//! External connectors: a program of the host's connectors directory
//! (`orca-runner --connectors DIR`, `ORCA_CONNECTORS`) that reads a source
//! and speaks the connector protocol (docs/connectors.md).
//!
//! The host runs `PROGRAM spec` (what the connector promises and which of
//! its config options name servers, which netguard checks), then starts
//! `PROGRAM read` with `ORCA_CONNECTOR_SOCKET` naming a Unix socket it
//! listens on. The connector connects, takes an **open** frame (its config
//! with secrets resolved, its streams and where each resumes) and sends the
//! data edge's frames: per stream in turn, **batch** frames of raw records
//! then a **barrier** with the resume point after them (one chunk, the
//! stream's part of one epoch), an **end** when a stream has no more, an
//! **error** when it cannot go on. The host checks every frame and hands
//! the chunks to the stream readers the attempt takes them from; anything
//! else (a frame out of turn, a malformed one, silence past the timeout, an
//! exit before every stream ended) fails the attempt with the reason and
//! kills the connector. The connector dies with its host (a parent-death
//! signal), so a killed engine or runner leaves none behind.

use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orca_core::sync::{ConnectorReplay, Source, CONNECTOR_TIMEOUT_DEFAULT};
use serde_json::{json, Value};

use crate::netguard::Guard;
use crate::source::error::ReadError;
use crate::source::msg::RawChunk;
use crate::source::plan::Plan;
use crate::source::readers::{fed_readers, Msg, Reader, Sender};
use crate::transport::frame::{read_frame, write_frame, Frame, FrameError, ANY_STREAM};
use crate::transport::wire::{raw_records, raw_schema};

/// Where a host keeps its connectors (the runner sets it from
/// `--connectors`).
pub const CONNECTORS_ENV: &str = "ORCA_CONNECTORS";
/// The socket a started connector connects to.
pub const SOCKET_ENV: &str = "ORCA_CONNECTOR_SOCKET";
/// The protocol version this host speaks.
pub const PROTOCOL: u64 = 1;

/// The host service's socket, beside the connector's in its private
/// directory.
pub(crate) const HOST_SOCKET: &str = "host.sock";
/// How long `spec` and the connection after `read` may take.
const START_WAIT: Duration = Duration::from_secs(30);
/// How much of a connector's stderr a failure quotes.
const LAST_WORDS: usize = 2000;

static DIRECTORY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Sets this process's connectors directory (a runner's `--connectors`),
/// over `ORCA_CONNECTORS`. Only the first call counts.
pub fn set_directory(dir: PathBuf) {
    let _ = DIRECTORY.set(dir);
}

/// The program of connector `name` in the host's connectors directory.
pub fn program(name: &str) -> Result<PathBuf, ReadError> {
    let fail = |why: String| ReadError::Connector {
        name: name.to_string(),
        reason: why,
    };
    if !orca_core::sync::is_connector_name(name) {
        return Err(fail("is not a connector's name".into()));
    }
    let dir = DIRECTORY
        .get()
        .cloned()
        .or_else(|| {
            std::env::var_os(CONNECTORS_ENV)
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
        })
        .ok_or_else(|| {
            fail(format!(
                "this host runs no external connectors: start its runner with --connectors DIR \
                 (or set {CONNECTORS_ENV}) and install the connector there"
            ))
        })?;
    let path = dir.join(name);
    let meta = std::fs::metadata(&path).map_err(|e| {
        fail(format!(
            "is not installed in this host's connectors directory {} ({e})",
            dir.display()
        ))
    })?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(fail(format!(
            "{} is not an executable file",
            path.display()
        )));
    }
    Ok(path)
}

/// What a connector's `spec` says of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// What a read again returns (a source connector's).
    pub replay: Option<String>,
    /// What its commits promise (a destination connector's).
    pub commits: Option<String>,
    /// The write modes it takes (a destination connector's).
    pub modes: Vec<String>,
    /// The config options that name servers (`host:port` or URLs).
    pub reaches: Vec<String>,
    pub raw: Value,
}

/// Runs `PROGRAM spec` and reads its answer.
pub fn spec(name: &str, path: &Path) -> Result<Spec, ReadError> {
    let fail = |why: String| ReadError::Connector {
        name: name.to_string(),
        reason: why,
    };
    let mut child = command(path, "spec")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start {} spec: {e}", path.display())))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < START_WAIT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(format!("spec gave no answer within {START_WAIT:?}")));
            }
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if !status.success() {
        return Err(fail(format!("spec failed ({status}): {}", tail(&err))));
    }
    let raw: Value = out
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| fail(format!("spec printed no JSON object: {}", tail(&out))))?;
    if raw.get("protocol").and_then(Value::as_u64) != Some(PROTOCOL) {
        return Err(fail(format!(
            "speaks protocol {}, this host speaks {PROTOCOL}",
            raw.get("protocol").unwrap_or(&Value::Null)
        )));
    }
    let replay = raw
        .get("replay")
        .and_then(Value::as_str)
        .filter(|r| matches!(*r, "exact" | "superset"))
        .map(str::to_string);
    let commits = raw
        .get("commits")
        .and_then(Value::as_str)
        .filter(|c| matches!(*c, "atomic" | "at_least_once"))
        .map(str::to_string);
    if replay.is_none() && commits.is_none() {
        return Err(fail(format!(
            "spec names neither a replay (exact or superset: a source) nor commits (atomic or \
             at_least_once: a destination): {raw}"
        )));
    }
    let reaches = strings(&raw, "reaches");
    let modes = strings(&raw, "modes");
    Ok(Spec {
        replay,
        commits,
        modes,
        reaches,
        raw,
    })
}

pub(crate) fn command(path: &Path, verb: &str) -> Command {
    let mut c = Command::new(path);
    c.arg(verb).stdin(Stdio::null());
    // SAFETY: prctl is async-signal-safe; the closure touches nothing else.
    unsafe {
        c.pre_exec(|| {
            // The connector dies with the process that hosts it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c
}

/// The last of a text, for an error.
pub(crate) fn tail(text: &str) -> String {
    let t = text.trim();
    let cut = t.len().saturating_sub(LAST_WORDS);
    let start = (cut..t.len()).find(|&i| t.is_char_boundary(i)).unwrap_or(0);
    match t {
        "" => "(nothing)".into(),
        _ => t[start..].to_string(),
    }
}

/// The servers a config option names: `host:port`, `scheme://host:port/..`,
/// or a list of them (a port is required unless the scheme implies one).
fn endpoints(v: &Value) -> Result<Vec<(String, u16)>, String> {
    let one = |s: &str| -> Result<(String, u16), String> {
        let (scheme, rest) = match s.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, s),
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') && !p.contains(']') => (h, Some(p)),
            _ => (authority, None),
        };
        let port = match (port, scheme) {
            (Some(p), _) => p.parse().map_err(|_| format!("{s:?} has no valid port"))?,
            (None, Some("http" | "ws")) => 80,
            (None, Some("https" | "wss")) => 443,
            (None, Some("nats" | "tls")) => 4222,
            _ => return Err(format!("{s:?} names no port")),
        };
        if host.is_empty() {
            return Err(format!("{s:?} names no host"));
        }
        Ok((host.to_string(), port))
    };
    match v {
        Value::String(s) => s.split(',').map(|p| one(p.trim())).collect(),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().ok_or_else(|| format!("{x} is not a server")))
            .map(|r| r.and_then(one))
            .collect(),
        other => Err(format!("{other} is not a server")),
    }
}

/// Checks the servers `spec` says the configs' options name against the
/// org's allowlist, before the connector is started with them.
pub(crate) fn check_reaches<'a>(
    name: &str,
    spec: &Spec,
    configs: impl Iterator<Item = (String, &'a Value)>,
    guard: &Guard,
) -> Result<(), ReadError> {
    for (at, cfg) in configs {
        for key in &spec.reaches {
            let Some(v) = cfg.get(key) else { continue };
            let servers = endpoints(v).map_err(|e| ReadError::Connector {
                name: name.to_string(),
                reason: format!("{at}.{key}: {e}"),
            })?;
            for (host, port) in servers {
                guard.endpoint(&host, port)?;
            }
        }
    }
    Ok(())
}

/// A list of strings of a connector's answer (empty when absent).
fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The longest a connector's `discover` may take.
const DISCOVER_WAIT: Duration = Duration::from_secs(120);

/// Runs connector `name`'s `discover` with `config` (secrets resolved) on
/// its stdin, once netguard allowed what the config names, and returns
/// what it printed: `{"streams": [...]}`.
pub fn discover(name: &str, config: &Value, guard: &Guard) -> Result<Value, ReadError> {
    let fail = |why: String| ReadError::Connector {
        name: name.to_string(),
        reason: why,
    };
    let path = program(name)?;
    let spec = spec(name, &path)?;
    check_reaches(
        name,
        &spec,
        std::iter::once(("source.config".to_string(), config)),
        guard,
    )?;
    // The host's HTTP service, for a connector that calls its API through
    // the host; its socket goes with the directory when discover ends.
    let dir = private_dir()?;
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(dir.clone());
    crate::source::external::host_http::serve(name, &dir.join(HOST_SOCKET), guard).map_err(fail)?;
    let mut child = command(&path, "discover")
        .env(
            crate::source::external::host_http::HOST_SOCKET_ENV,
            dir.join(HOST_SOCKET),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start {} discover: {e}", path.display())))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A connector that does not read its config is its own business:
        // what it prints decides.
        let _ = stdin.write_all(config.to_string().as_bytes());
    }
    // Read while it runs: a catalog larger than a pipe's buffer would
    // otherwise stall it.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < DISCOVER_WAIT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(format!(
                    "discover gave no answer within {DISCOVER_WAIT:?}"
                )));
            }
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if !status.success() {
        return Err(fail(format!("discover failed ({status}): {}", tail(&err))));
    }
    let found: Value = serde_json::from_str(out.trim())
        .map_err(|e| fail(format!("discover printed no JSON ({e}): {}", tail(&out))))?;
    if !found.get("streams").is_some_and(Value::is_array) {
        return Err(fail(format!(
            "discover printed no streams list: {}",
            tail(&out)
        )));
    }
    Ok(found)
}

/// Starts the connector of `plan` and returns a reader per stream, in the
/// plan's order, and where the commit protocol's acknowledgements go.
pub(crate) fn spawn_connector(
    plan: &Plan,
    guard: &Guard,
) -> Result<(Vec<Reader>, ConnectorAcks), ReadError> {
    let Source::Connector {
        connector: name,
        config,
        replay: promised,
        timeout_seconds,
        ..
    } = &plan.source
    else {
        return Err(ReadError::Definition(format!(
            "a {} source is not an external connector",
            plan.source.kind()
        )));
    };
    let name = name.clone();
    let fail = |why: String| ReadError::Connector {
        name: name.clone(),
        reason: why,
    };
    let path = program(&name)?;
    let spec = spec(&name, &path)?;
    let Some(replay) = spec.replay.as_deref() else {
        return Err(fail(
            "is not a source: its spec names no replay (a destination connector's names commits)"
                .into(),
        ));
    };
    if *promised == ConnectorReplay::Exact && replay != "exact" {
        return Err(fail(format!(
            "the sync takes its replay for exact, and the connector's spec says {replay}: \
             redefine the sync with \"replay\": \"superset\""
        )));
    }
    let config = Value::Object(config.clone());
    // What the org's allowlist must allow before the connector starts: the
    // servers its spec says its options name, in the source's config and in
    // each stream's.
    let started = plan.started()?;
    let stream_configs: Vec<(String, Value)> = started
        .iter()
        .map(|(s, d)| {
            let config = Value::Object(d.config.clone().unwrap_or_default());
            (s.name.clone(), config)
        })
        .collect();
    let configs = std::iter::once(("source.config".to_string(), &config)).chain(
        stream_configs
            .iter()
            .map(|(n, c)| (format!("stream \"{n}\"'s config"), c)),
    );
    check_reaches(&name, &spec, configs, guard)?;

    let dir = private_dir()?;
    let socket = dir.join("connector.sock");
    let listener = UnixListener::bind(&socket)
        .map_err(|e| fail(format!("cannot listen on {}: {e}", socket.display())))?;
    crate::source::external::host_http::serve(&name, &dir.join(HOST_SOCKET), guard)
        .map_err(fail)?;
    let timeout = Duration::from_secs(timeout_seconds.unwrap_or(CONNECTOR_TIMEOUT_DEFAULT));
    let open = json!({
        "protocol": PROTOCOL,
        "sync": plan.sync,
        "config": config,
        "batch_rows": plan.batch_rows,
        "streams": plan.start.iter().zip(&stream_configs).map(|(s, (_, config))| json!({
            "name": s.name,
            "config": config,
            "after": s.after,
        })).collect::<Vec<_>>(),
    });
    let (senders, readers) = fed_readers(plan.start.iter().map(|s| s.name.clone()));
    let names: Vec<String> = plan.start.iter().map(|s| s.name.clone()).collect();
    let pending: Pending = Arc::new((Mutex::new((None, false)), std::sync::Condvar::new()));
    let relay = Relay {
        name: name.clone(),
        names,
        senders,
        timeout,
        words: Arc::new(LastWords::default()),
        pending: pending.clone(),
    };
    // The connector is started by this thread, which lives as long as it
    // does: its parent-death signal follows the thread that started it, not
    // the process. Not joined by the attempt (no reader holds its handle):
    // after the streams end it waits for the attempt to be done with the
    // connector, which is after the attempt joins its readers. What goes
    // wrong before the first frame reaches the first stream as its error.
    std::thread::Builder::new()
        .name(format!("connector-{name}"))
        .spawn(move || {
            let started = relay.start(&path, &socket, dir, &listener, open);
            match started {
                // Killed when this ends, however it ends.
                Ok((conn, mut running)) => relay.run(conn, &mut running),
                Err(reason) => relay.fail(0, reason),
            }
        })
        .map_err(|e| fail(format!("starting its thread: {e}")))?;
    Ok((readers, ConnectorAcks { pending }))
}

/// The newest acknowledgement not yet written to the connector, and
/// whether the attempt is done with it. Two threads wait on the condvar
/// (the writer, and the relay once every stream ended): notify all.
type Pending = Arc<(Mutex<(Option<Value>, bool)>, std::sync::Condvar)>;

/// Writes the commit protocol's acknowledgements to a connector as **ack**
/// frames (`{"<stream>": [resume point], ...}`), on a thread of its own and
/// newest first: a connector that does not read them holds back only that
/// thread, never the attempt, and one that reads late gets the newest
/// (acknowledgements are cumulative).
pub(crate) struct ConnectorAcks {
    pending: Pending,
}

/// Starts the thread that writes a connector's acknowledgements.
fn spawn_ack_writer(name: &str, conn: UnixStream, pending: Pending) -> Result<(), String> {
    let p = pending;
    std::thread::Builder::new()
        .name(format!("connector-{name}-acks"))
        .spawn(move || {
            let mut w = BufWriter::new(conn);
            let (cell, ready) = &*p;
            loop {
                let Ok(mut state) = cell.lock() else { return };
                while state.0.is_none() && !state.1 {
                    state = match ready.wait(state) {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                }
                let Some(positions) = state.0.take() else {
                    return; // done with, nothing left to write
                };
                drop(state);
                // A connector gone: the attempt hears of it from its
                // streams.
                if write_frame(&mut w, &Frame::Ack { positions })
                    .and_then(|()| w.flush().map_err(FrameError::from))
                    .is_err()
                {
                    return;
                }
            }
        })
        .map_err(|e| format!("starting its acknowledgement thread: {e}"))?;
    Ok(())
}

impl ConnectorAcks {
    /// Takes the acknowledged resume points (stream, the point's values
    /// joined by U+001F) for the connector.
    pub(crate) fn acknowledge<'a>(&self, positions: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let ack: serde_json::Map<String, Value> = positions
            .into_iter()
            .map(|(s, p)| (s.to_string(), json!(p.split('\u{1f}').collect::<Vec<_>>())))
            .collect();
        if ack.is_empty() {
            return;
        }
        let (cell, ready) = &*self.pending;
        if let Ok(mut state) = cell.lock() {
            state.0 = Some(Value::Object(ack));
            ready.notify_all();
        }
    }
}

impl Drop for ConnectorAcks {
    fn drop(&mut self) {
        let (cell, ready) = &*self.pending;
        if let Ok(mut state) = cell.lock() {
            state.1 = true;
            ready.notify_all();
        }
    }
}

/// A directory only this process can enter, for the connector's socket.
pub(crate) fn private_dir() -> Result<PathBuf, ReadError> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("orca-connector-{}-{stamp}", std::process::id()));
    std::fs::create_dir(&dir)
        .and_then(|_| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| ReadError::Stream {
            stream: "*".into(),
            reason: format!("making {}: {e}", dir.display()),
        })?;
    Ok(dir)
}

/// The tail of a connector's stderr, kept by a reader thread per started
/// process.
#[derive(Default)]
pub(crate) struct LastWords {
    /// The text, and how many readers have not reached the end of theirs.
    state: Mutex<(String, usize)>,
    drained: std::sync::Condvar,
}

/// How long a failure waits for a connector's stderr to be read to its end:
/// the process can be seen to exit before its last lines are read.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Keeps the last of a connector's stderr, and passes each line on to
/// ours (the attempt's log).
pub(crate) fn keep_last_words(name: &str, err: std::process::ChildStderr, words: Arc<LastWords>) {
    let name = name.to_string();
    if let Ok(mut s) = words.state.lock() {
        s.1 += 1;
    }
    let reader = words.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("connector-{name}-stderr"))
        .spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                eprintln!("connector {name}: {line}");
                if let Ok(mut s) = reader.state.lock() {
                    let w = &mut s.0;
                    w.push_str(&line);
                    w.push('\n');
                    let over = w.len().saturating_sub(4 * LAST_WORDS);
                    if over > 0 {
                        let cut = (over..w.len())
                            .find(|&i| w.is_char_boundary(i))
                            .unwrap_or(0);
                        w.replace_range(..cut, "");
                    }
                }
            }
            reader.ended();
        });
    if spawned.is_err() {
        words.ended();
    }
}

impl LastWords {
    fn ended(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.1 = s.1.saturating_sub(1);
        }
        self.drained.notify_all();
    }
}

/// The tail of what the connector wrote to stderr, once what it wrote
/// before exiting has been read (or [`DRAIN_WAIT`] has passed: a process
/// it started may hold its stderr open).
pub(crate) fn last_words(words: &LastWords) -> String {
    let Ok(s) = words.state.lock() else {
        return tail("");
    };
    let text = match words.drained.wait_timeout_while(s, DRAIN_WAIT, |s| s.1 > 0) {
        Ok((s, _)) => s.0.clone(),
        Err(poisoned) => poisoned.into_inner().0 .0.clone(),
    };
    tail(&text)
}

/// A started connector: killed, and its socket's directory removed, when
/// dropped.
pub(crate) struct Running {
    pub(crate) child: Option<Child>,
    pub(crate) dir: PathBuf,
}

impl Running {
    /// How it ended, if it has: waits up to `wait` for it.
    pub(crate) fn status(&mut self, wait: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if started.elapsed() < wait => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => return None,
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits for the started connector to connect, or to exit.
pub(crate) fn accept(
    listener: &UnixListener,
    running: &mut Running,
    words: &LastWords,
) -> Result<UnixStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let started = Instant::now();
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false).map_err(|e| e.to_string())?;
                return Ok(conn);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("accepting its connection: {e}")),
        }
        if let Some(status) = running.status(Duration::ZERO) {
            return Err(format!(
                "exited ({status}) without connecting to {SOCKET_ENV}; its last words: {}",
                last_words(words)
            ));
        }
        if started.elapsed() > START_WAIT {
            return Err(format!(
                "did not connect to {SOCKET_ENV} within {START_WAIT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Hands what a connector sends to the stream readers.
struct Relay {
    name: String,
    names: Vec<String>,
    senders: Vec<Sender>,
    timeout: Duration,
    words: Arc<LastWords>,
    /// The acknowledgements still to come: the connector hears them until
    /// the attempt is done with it.
    pending: Pending,
}

/// How long a connector whose streams all ended waits for the attempt to
/// be done with it (its last acknowledgements) before its socket closes.
const ACKS_WAIT: Duration = Duration::from_secs(120);

impl Relay {
    /// Starts `PROGRAM read`, waits for it to connect, sends it the open
    /// frame and starts its acknowledgement writer.
    fn start(
        &self,
        path: &Path,
        socket: &Path,
        dir: PathBuf,
        listener: &UnixListener,
        open: Value,
    ) -> Result<(BufReader<UnixStream>, Running), String> {
        let mut child = command(path, "read")
            .env(SOCKET_ENV, socket)
            .env(
                crate::source::external::host_http::HOST_SOCKET_ENV,
                socket.with_file_name(HOST_SOCKET),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {} read: {e}", path.display()))?;
        if let Some(err) = child.stderr.take() {
            keep_last_words(&self.name, err, self.words.clone());
        }
        let mut running = Running {
            child: Some(child),
            dir,
        };
        let conn = accept(listener, &mut running, &self.words)?;
        conn.set_read_timeout(Some(self.timeout))
            .map_err(|e| e.to_string())?;
        let clone = || conn.try_clone().map_err(|e| e.to_string());
        let mut w = BufWriter::new(clone()?);
        write_frame(
            &mut w,
            &Frame::Open {
                first_epoch: 0,
                plan: open,
            },
        )
        .and_then(|_| w.flush().map_err(FrameError::from))
        .map_err(|e| format!("sending it the open frame: {e}"))?;
        spawn_ack_writer(&self.name, clone()?, self.pending.clone())?;
        Ok((BufReader::new(conn), running))
    }

    /// Fails the attempt: the stream whose chunk it waits for (`turn`) gets
    /// the error, and the others if they have room.
    fn fail(&self, turn: usize, reason: String) {
        let e = || ReadError::Connector {
            name: self.name.clone(),
            reason: reason.clone(),
        };
        if let Some(tx) = self.senders.get(turn) {
            let _ = tx.send(Err(e()));
        }
        for (i, tx) in self.senders.iter().enumerate() {
            if i != turn {
                let _ = tx.try_send(Err(e()));
            }
        }
    }

    /// Waits until the attempt is done with the connector (every
    /// acknowledgement it made handed to the writer), or `ACKS_WAIT`.
    fn wait_done(&self) {
        let (cell, ready) = &*self.pending;
        let Ok(state) = cell.lock() else { return };
        let _ = ready.wait_timeout_while(state, ACKS_WAIT, |s| !(s.1 && s.0.is_none()));
    }

    fn run(&self, mut r: BufReader<UnixStream>, running: &mut Running) {
        let n = self.names.len();
        let mut ended = vec![false; n];
        let mut turn = 0usize;
        let mut chunk: Vec<_> = Vec::new();
        loop {
            if ended.iter().all(|e| *e) {
                // Every stream ended: the connector hears the attempt's
                // last acknowledgements, then its socket closes and it
                // should exit by itself.
                self.wait_done();
                let _ = r.get_ref().shutdown(std::net::Shutdown::Both);
                if running.status(Duration::from_secs(10)).is_none() {
                    eprintln!(
                        "connector {}: still running after its streams ended; killed",
                        self.name
                    );
                }
                return;
            }
            // A connector killed with acknowledgements unread resets the
            // socket rather than closing it: the same end.
            let read = match read_frame(&mut r) {
                Err(FrameError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    Ok(None)
                }
                other => other,
            };
            let frame = match read {
                Ok(Some(f)) => f,
                Ok(None) => {
                    let status = running
                        .status(Duration::from_secs(5))
                        .map_or("still running".to_string(), |s| s.to_string());
                    return self.fail(
                        turn,
                        format!(
                            "closed its socket ({status}) before stream {} ended; its last \
                             words: {}",
                            self.names[turn],
                            last_words(&self.words)
                        ),
                    );
                }
                Err(FrameError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return self.fail(
                        turn,
                        format!(
                            "sent nothing for {:?} (its source's timeout_seconds) while stream \
                             {} waited: taken for hung and killed",
                            self.timeout, self.names[turn]
                        ),
                    );
                }
                Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    let status = running
                        .status(Duration::from_secs(5))
                        .map_or("still running".to_string(), |s| s.to_string());
                    return self.fail(
                        turn,
                        format!(
                            "closed its socket in the middle of a frame ({status}); its last \
                             words: {}",
                            last_words(&self.words)
                        ),
                    );
                }
                Err(e) => return self.fail(turn, format!("sent a malformed frame: {e}")),
            };
            let stream = match &frame {
                Frame::Batch { stream, .. }
                | Frame::Barrier { stream, .. }
                | Frame::End { stream, .. }
                | Frame::Error { stream, .. } => *stream,
                other => {
                    return self.fail(
                        turn,
                        format!(
                            "sent a {} frame, which only the host sends",
                            kind_name(other)
                        ),
                    )
                }
            };
            if let Frame::Error { reason, .. } = &frame {
                let on = match stream {
                    ANY_STREAM => "its source".to_string(),
                    i => format!(
                        "stream {}",
                        self.names.get(usize::from(i)).map_or("?", |s| s.as_str())
                    ),
                };
                return self.fail(turn, format!("{on}: {reason}"));
            }
            if usize::from(stream) != turn {
                let got = self
                    .names
                    .get(usize::from(stream))
                    .cloned()
                    .unwrap_or_else(|| format!("#{stream} (there are {n})"));
                return self.fail(
                    turn,
                    format!(
                        "sent a frame of stream {got} out of turn: stream {}'s chunk or end \
                         comes first (a round of the streams at a time, in the open frame's \
                         order)",
                        self.names[turn]
                    ),
                );
            }
            match frame {
                Frame::Batch { batch, .. } => {
                    if batch.schema().fields() != raw_schema().fields() {
                        return self.fail(
                            turn,
                            format!(
                                "sent stream {} a batch of columns {:?}; a batch holds raw \
                                 records: position, record (JSON text), error (text or null)",
                                self.names[turn],
                                batch
                                    .schema()
                                    .fields()
                                    .iter()
                                    .map(|f| format!("{}: {}", f.name(), f.data_type()))
                                    .collect::<Vec<_>>()
                            ),
                        );
                    }
                    match raw_records(&batch) {
                        Ok(records) => chunk.extend(records),
                        Err(e) => {
                            return self.fail(
                                turn,
                                format!("sent stream {} a bad record: {e}", self.names[turn]),
                            )
                        }
                    }
                }
                Frame::Barrier { position, .. } => {
                    if chunk.is_empty() {
                        return self.fail(
                            turn,
                            format!(
                                "sent stream {} a barrier after no records: a chunk holds at \
                                 least one (send end when the stream has no more)",
                                self.names[turn]
                            ),
                        );
                    }
                    let records = std::mem::take(&mut chunk);
                    let msg = Msg::Raw(RawChunk {
                        records,
                        last: position,
                    });
                    if self.senders[turn].send(Ok(msg)).is_err() {
                        // The attempt stopped listening: the connector goes.
                        return;
                    }
                    turn = next(&ended, turn);
                }
                Frame::End { bytes, .. } => {
                    if !chunk.is_empty() {
                        return self.fail(
                            turn,
                            format!(
                                "ended stream {} with records after its last barrier",
                                self.names[turn]
                            ),
                        );
                    }
                    ended[turn] = true;
                    let _ = self.senders[turn].send(Ok(Msg::End { bytes }));
                    if !ended.iter().all(|e| *e) {
                        turn = next(&ended, turn);
                    }
                }
                _ => {}
            }
        }
    }
}

/// The next stream not ended after `turn`, round the streams.
fn next(ended: &[bool], turn: usize) -> usize {
    let n = ended.len();
    (1..=n)
        .map(|k| (turn + k) % n)
        .find(|&i| !ended[i])
        .unwrap_or(turn)
}

fn kind_name(f: &Frame) -> &'static str {
    match f {
        Frame::Open { .. } => "open",
        Frame::Describe { .. } => "describe",
        Frame::Catalog { .. } => "catalog",
        Frame::Ack { .. } => "ack",
        Frame::Request { .. } => "request",
        Frame::Reply { .. } => "reply",
        _ => "data",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_read_from_urls_host_ports_and_lists() {
        assert_eq!(
            endpoints(&json!("nats://127.0.0.1:4222")),
            Ok(vec![("127.0.0.1".to_string(), 4222)])
        );
        assert_eq!(
            endpoints(&json!("nats://user@a.example, b.example:4333")),
            Ok(vec![
                ("a.example".to_string(), 4222),
                ("b.example".to_string(), 4333)
            ])
        );
        assert_eq!(
            endpoints(&json!(["https://api.example/v1?x=1", "10.0.0.1:80"])),
            Ok(vec![
                ("api.example".to_string(), 443),
                ("10.0.0.1".to_string(), 80)
            ])
        );
        assert!(endpoints(&json!("db.example")).is_err(), "no port");
        assert!(endpoints(&json!(7)).is_err());
    }

    #[test]
    fn turns_go_round_the_streams_not_ended() {
        assert_eq!(next(&[false, false, false], 0), 1);
        assert_eq!(next(&[false, false, false], 2), 0);
        assert_eq!(next(&[false, true, false], 0), 2);
        assert_eq!(next(&[true, false, true], 1), 1);
    }

    #[test]
    fn a_connector_name_that_is_a_path_is_refused_before_anything_runs() {
        for bad in ["../bin/sh", "/bin/sh", "a/b", "", "Sh"] {
            let e = program(bad).expect_err("refused");
            assert!(e.to_string().contains("is not a connector's name"), "{e}");
        }
    }
}
