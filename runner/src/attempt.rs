//! Runs one leased attempt: spawns the pipeline binary, streams its output to
//! the attempt's log file, heartbeats the lease and reports the result. A
//! sync's attempt runs the engine, and this runner hosts the sync's source:
//! its source pump reads the source and sends it over the engine's data
//! edge.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::control::{self, ControlError, Lease};
use crate::engine;
use crate::log::AttemptLog;
use orca_core::api::Command as Work;

use orca_engine::pump::{self, PumpError, Pumped, SlotGauge};

/// What the runner shares with every attempt it runs.
pub struct Shared {
    pub db: PgPool,
    /// What the children log in with: the runner's own login unless
    /// --attempt-database-url names another. Never the runner's token.
    pub database_url: String,
    /// The pipeline root and the hashes of the binaries run from it (None:
    /// this runner runs syncs only).
    pub pins: Option<crate::pinned::Pins>,
    pub logs: PathBuf,
    /// What runs a sync's attempts (`orca-engine`).
    pub engine: PathBuf,
    /// Where the engines' control sockets and data edges go (one each per
    /// sync attempt).
    pub sockets: PathBuf,
    /// The syncs' store and the Iceberg warehouse, handed to the children.
    pub store: Option<String>,
    pub warehouse: Option<String>,
    /// The external connectors' directory (`--connectors`), handed to the
    /// engines, which start destination connectors themselves.
    pub connectors: Option<PathBuf>,
    /// The longest line of a child's output taken (`--output-line-max`).
    pub output_line_max: usize,
}

/// How an attempt ended, from the runner's point of view.
#[derive(Debug)]
pub enum Outcome {
    /// Reported with orca.finish; the run's status afterwards.
    Finished(String),
    /// The control plane took the lease away; the child was stopped.
    Fenced(String),
    /// The runner is shutting down and handed the attempt back.
    Released,
    /// The result could not be reported; the lease will lapse and tick retries it.
    Unreported(String),
    /// Its pod's runner reported it (a pod launcher's attempt).
    InPod(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Finished(status) => write!(f, "reported; the run is {status}"),
            Outcome::Fenced(why) => write!(f, "stopped by the control plane: {why}"),
            Outcome::Released => write!(f, "handed back to the control plane"),
            Outcome::Unreported(why) => write!(f, "not reported ({why}); its lease will lapse"),
            Outcome::InPod(how) => write!(f, "ended in its pod: {how}"),
        }
    }
}

/// Never heartbeat more often than this, whatever the lease length.
pub(crate) const HEARTBEAT_MIN: Duration = Duration::from_millis(200);
/// How long a result is retried while the control plane is unreachable (a
/// server restart): about a lease's length, after which the lease has lapsed
/// and the attempt is another's anyway.
pub(crate) const REPORT_FOR: Duration = Duration::from_secs(25);
const REPORT_BACKOFF_FIRST: Duration = Duration::from_millis(200);
const REPORT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long an engine asked to stop may take to finish its epoch in flight
/// before it is killed (killing it is safe too: the next attempt recovers).
const ENGINE_STOP_GRACE: Duration = Duration::from_secs(15);
/// How long the source pump waits for its engine's data edge.
const EDGE_CONNECT_WAIT: Duration = Duration::from_secs(60);
/// How long, once the engine exited, the runner waits for its source pump's
/// last word.
const PUMP_LAST_WORD: Duration = Duration::from_secs(2);

pub(crate) fn log_path(root: &Path, l: &Lease) -> PathBuf {
    root.join(&l.org)
        .join(&l.pipeline)
        .join(format!("run-{}", l.run))
        .join(format!("attempt-{}.log", l.attempt_number))
}

/// Copies a child's output, line by line, to the log file and our stdout.
/// A line longer than `line_max` bytes is not taken: `overlong` is told,
/// and the attempt stops the child.
fn pump<R: AsyncRead + Unpin + Send + 'static>(
    stream: R,
    prefix: String,
    log: Arc<AttemptLog>,
    last: Arc<Mutex<Option<String>>>,
    line_max: usize,
    overlong: tokio::sync::mpsc::Sender<String>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let limit = u64::try_from(line_max)
                .unwrap_or(u64::MAX)
                .saturating_add(1);
            match (&mut reader).take(limit).read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if buf.len() > line_max && buf.last() != Some(&b'\n') {
                let _ = overlong
                    .send(format!(
                        "the child wrote a line of more than {line_max} bytes to its output; \
                         the runner takes lines of at most that (--output-line-max) and stopped it"
                    ))
                    .await;
                break;
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']).to_string();
            println!("{prefix} {line}");
            let _ = log.line(&line).await;
            if !line.trim().is_empty() {
                if let Ok(mut l) = last.lock() {
                    // A failed allocation is why the child dies: the
                    // backtrace it may print after it is not.
                    if !l.as_deref().is_some_and(crate::sizing::is_alloc_failure) {
                        *l = Some(line);
                    }
                }
            }
        }
    })
}

/// `orca-engine sync`'s exit status for "start a new attempt at HEAD", and a
/// pipeline binary's for "the object store did not answer".
const ENGINE_RESTART: i32 = 4;

/// What to run for a lease: this runner's engine for a sync, a discovery
/// or a table's maintenance, else the
/// version's pinned binary under the pipeline root.
fn program(shared: &Shared, l: &Lease) -> Result<PathBuf, String> {
    if matches!(l.command, Work::Sync | Work::Discover | Work::Maintain) {
        return Ok(shared.engine.clone());
    }
    let Some(pins) = &shared.pins else {
        return Err(format!(
            "this runner has no pipeline root (--pipelines) and runs no pipeline binaries, \
             but claimed {}",
            l.binary_path
        ));
    };
    match pins.verify(l) {
        Ok(v) => {
            if v.unpinned {
                println!(
                    "[{} run {} attempt {}] running {} unpinned (--allow-unpinned): version {} \
                     has no registered sha256",
                    l.pipeline,
                    l.run,
                    l.attempt_number,
                    v.path.display(),
                    l.version.0
                );
            }
            Ok(v.path)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// What every child of the runner gets (a pipeline binary, an engine, a task
/// worker): the attempt login, its org and the warehouse; never the runner's
/// token, which stays with the runner.
pub(crate) fn child_env(cmd: &mut Command, shared: &Shared, org: &str) {
    cmd.env_remove("ORCA_RUNNER_TOKEN")
        .env_remove("ORCA_RUNNER_TOKEN_FILE")
        .env("DATABASE_URL", &shared.database_url)
        .env("ORCA_ORG", org);
    if let Some(warehouse) = &shared.warehouse {
        cmd.env("ORCA_WAREHOUSE", warehouse);
    }
}

fn spawn_child(
    shared: &Shared,
    l: &Lease,
    program: &Path,
    log: &Path,
    socket: Option<&Path>,
    edge: Option<&Path>,
) -> std::io::Result<Child> {
    let mut cmd = Command::new(program);
    cmd.arg(l.command.name());
    if let Some(s) = socket {
        cmd.arg("--control").arg(s);
    }
    if let Some(e) = edge {
        cmd.arg("--edge").arg(e);
    }
    // The lease goes in the environment, which only this user can read, not
    // on the command line, which `ps` shows everyone.
    child_env(&mut cmd, shared, &l.org);
    cmd.env("ORCA_LEASE", l.lease.to_string())
        .env("ORCA_RUN", l.run.to_string())
        .env("ORCA_ATTEMPT", l.attempt_number.to_string())
        .env("ORCA_PIPELINE", &l.pipeline)
        .env("ORCA_PARTITIONS", l.partitions.join(","))
        .env("ORCA_LOG_FILE", log);
    if let Some(store) = &shared.store {
        cmd.env("ORCA_STORE", store);
    }
    if let Some(dir) = &shared.connectors {
        cmd.env(
            orca_engine::source::external::connector::CONNECTORS_ENV,
            dir,
        );
    }
    if let Some(bytes) = l.resources.and_then(|r| r.memory_bytes) {
        crate::sizing::limit_memory(&mut cmd, bytes);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
}

pub(crate) async fn report(shared: &Shared, l: &Lease, ok: bool, error: Option<String>) -> Outcome {
    report_why(shared, l, ok, error, None).await
}

/// [`report`], saying why the attempt died when the runner knows.
pub(crate) async fn report_why(
    shared: &Shared,
    l: &Lease,
    ok: bool,
    error: Option<String>,
    killed_for: Option<&str>,
) -> Outcome {
    let t0 = std::time::Instant::now();
    let mut wait = REPORT_BACKOFF_FIRST;
    loop {
        match control::finish(&shared.db, l.lease, ok, error.as_deref(), killed_for).await {
            Ok(status) => return Outcome::Finished(status),
            Err(ControlError::Fenced { message, .. }) => return Outcome::Fenced(message),
            Err(e) if t0.elapsed() < REPORT_FOR => {
                eprintln!(
                    "orca-runner: reporting attempt {} failed, retrying: {e}",
                    l.attempt
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(REPORT_BACKOFF_MAX);
            }
            Err(e) => {
                return Outcome::Unreported(format!(
                    "could not report attempt {} for {REPORT_FOR:?}: {e}",
                    l.attempt
                ))
            }
        }
    }
}

/// Stops a child: an engine is asked over its control channel to finish
/// the epoch in flight and exit, and killed if it does not within
/// [`ENGINE_STOP_GRACE`]; anything else is killed.
async fn stop_child(child: &mut Child, socket: Option<&Path>, prefix: &str) {
    if let Some(s) = socket {
        match engine::call(s, "stop").await {
            Ok(_) => match tokio::time::timeout(ENGINE_STOP_GRACE, child.wait()).await {
                Ok(_) => {
                    println!("{prefix} the engine stopped at a resume point");
                    return;
                }
                Err(_) => println!(
                    "{prefix} the engine did not stop within {ENGINE_STOP_GRACE:?}; killing it"
                ),
            },
            Err(e) => println!("{prefix} could not ask the engine to stop ({e}); killing it"),
        }
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// Runs the source pump of a sync's attempt on a thread of its own (its
/// readers block on the source), connecting to the engine's data edge once
/// the engine listens. `gone` turns true when the engine exited.
fn start_source_pump(
    edge: PathBuf,
    gone: Arc<AtomicBool>,
    gauge: SlotGauge,
) -> tokio::sync::oneshot::Receiver<Result<Pumped, PumpError>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("source-pump".into())
        .spawn(move || {
            let done =
                pump::connect(&edge, EDGE_CONNECT_WAIT, &gone).and_then(|c| pump::serve(c, &gauge));
            let _ = tx.send(done);
        });
    if let Err(e) = spawned {
        eprintln!("orca-runner: cannot start the source pump: {e}");
    }
    rx
}

/// Sets a flag when dropped: the engine is gone, however the attempt ended.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Writes a line of the runner's own to the attempt's log and our stdout.
async fn say(prefix: &str, log: &AttemptLog, line: &str) {
    println!("{prefix} {line}");
    let _ = log.line(line).await;
}

/// The engine's progress, written to the attempt's log and our stdout when
/// it committed another epoch since the last look.
async fn engine_progress(socket: &Path, seen: &mut Option<u64>, prefix: &str, log: &AttemptLog) {
    // Not listening yet, or gone: the next heartbeat looks again.
    let Ok(status) = engine::call(socket, "status").await else {
        return;
    };
    let committed = status["committed"].as_u64();
    if committed.is_none() || committed == *seen || status["phase"] != "streaming" {
        return;
    }
    *seen = committed;
    let line = format!(
        "runner: engine at epoch {} (committed), {} rows this attempt",
        committed.unwrap_or(0),
        status["rows"].as_u64().unwrap_or(0)
    );
    say(prefix, log, &line).await;
}

/// Runs the attempt to its end. `release` turning true asks it to stop the
/// child and hand the attempt back.
pub async fn run(shared: Arc<Shared>, l: Lease, mut release: watch::Receiver<bool>) -> Outcome {
    let log = log_path(&shared.logs, &l);
    let prefix = format!(
        "[{} run {} attempt {}]",
        l.pipeline, l.run, l.attempt_number
    );
    if let Some(dir) = log.parent() {
        let _ = tokio::fs::create_dir_all(dir).await;
    }
    let file = match tokio::fs::File::create(&log).await {
        Ok(f) => Arc::new(AttemptLog::new(f, shared.db.clone(), l.lease)),
        Err(e) => {
            let msg = format!("cannot create log file {}: {e}", log.display());
            return report(&shared, &l, false, Some(msg)).await;
        }
    };
    let socket = (l.command == Work::Sync)
        .then(|| shared.sockets.join(format!("attempt-{}.sock", l.attempt)));
    let socket = socket.as_deref();
    let edge = (l.command == Work::Sync)
        .then(|| shared.sockets.join(format!("attempt-{}.edge", l.attempt)));
    let program = match program(&shared, &l) {
        Ok(p) => p,
        Err(msg) => {
            println!("{prefix} refused: {msg}");
            let _ = file
                .line(&format!("orca-runner refused to run it: {msg}"))
                .await;
            file.flush().await;
            return report(&shared, &l, false, Some(msg)).await;
        }
    };
    // Read only for a sized attempt: only a sized one can die for memory.
    let oom_before = l
        .resources
        .and_then(|r| r.memory_bytes)
        .and_then(|_| crate::sizing::oom_kills());
    let mut child = match spawn_child(&shared, &l, &program, &log, socket, edge.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("cannot start {}: {e}", program.display());
            println!("{prefix} {msg}");
            return report(&shared, &l, false, Some(msg)).await;
        }
    };
    let engine_gone = SetOnDrop(Arc::new(AtomicBool::new(false)));
    // A change stream's slot as the pump measures it on its source server,
    // reported at each heartbeat: the control plane sees no slot of
    // another server itself.
    let gauge = SlotGauge::default();
    let source_pump = edge.map(|e| start_source_pump(e, engine_gone.0.clone(), gauge.clone()));
    let mut slot_unreported = false;
    let last = Arc::new(Mutex::new(None));
    let (overlong_tx, mut overlong) = tokio::sync::mpsc::channel::<String>(2);
    let mut pumps = Vec::new();
    let max = shared.output_line_max;
    if let Some(out) = child.stdout.take() {
        pumps.push(pump(
            out,
            prefix.clone(),
            file.clone(),
            last.clone(),
            max,
            overlong_tx.clone(),
        ));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(pump(
            err,
            prefix.clone(),
            file.clone(),
            last.clone(),
            max,
            overlong_tx,
        ));
    }

    let ttl = (l.deadline - chrono::Utc::now())
        .to_std()
        .unwrap_or(Duration::from_secs(1));
    let mut deadline = l.deadline;
    let mut beat = tokio::time::interval((ttl / 3).max(HEARTBEAT_MIN));
    beat.tick().await;
    let mut seen = None;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            Some(why) = overlong.recv() => {
                println!("{prefix} {why}");
                let _ = file.line(&format!("orca-runner: {why}")).await;
                stop_child(&mut child, None, &prefix).await;
                for p in pumps {
                    p.abort();
                }
                file.flush().await;
                return report(&shared, &l, false, Some(why)).await;
            }
            _ = beat.tick() => match control::heartbeat(&shared.db, l.lease).await {
                Ok(d) => {
                    deadline = d;
                    // Before the engine is asked: a stopped engine's
                    // silence must not hold back the slot's report.
                    if let Some(r) = gauge.take() {
                        if let Err(e) = control::report_slot(&shared.db, l.lease, &r).await {
                            // Said once an attempt: the next report may
                            // well go through.
                            if !std::mem::replace(&mut slot_unreported, true) {
                                say(&prefix, &file, &format!("runner: cannot report slot {}: {e}", r.slot)).await;
                            }
                        }
                    }
                    if let Some(s) = socket {
                        engine_progress(s, &mut seen, &prefix, &file).await;
                    }
                }
                Err(ControlError::Fenced { message, .. }) => {
                    println!("{prefix} stopping: {message}");
                    stop_child(&mut child, socket, &prefix).await;
                    return Outcome::Fenced(message);
                }
                Err(e) => {
                    eprintln!("{prefix} heartbeat failed: {e}");
                    if chrono::Utc::now() > deadline {
                        // Someone else may hold the attempt by now: no grace.
                        stop_child(&mut child, None, &prefix).await;
                        return Outcome::Fenced("the lease lapsed while the control plane was unreachable".into());
                    }
                }
            },
            changed = release.changed() => {
                if changed.is_err() || *release.borrow() {
                    println!("{prefix} runner stopping: handing the attempt back");
                    stop_child(&mut child, socket, &prefix).await;
                    return match control::release(&shared.db, l.lease, "its runner stopped").await {
                        Ok(()) => Outcome::Released,
                        Err(e) => Outcome::Unreported(e.to_string()),
                    };
                }
            }
        }
    };
    for p in pumps {
        let _ = p.await;
    }
    drop(engine_gone);
    if let Some(rx) = source_pump {
        let line = match tokio::time::timeout(PUMP_LAST_WORD, rx).await {
            Ok(Ok(Ok(p))) => format!(
                "runner: source pump sent {} rows in {} chunks of {} streams",
                p.rows, p.chunks, p.streams
            ),
            Ok(Ok(Err(e))) => format!("runner: source pump: {e}"),
            Ok(Err(_)) => "runner: source pump: its thread ended without a word".into(),
            Err(_) => "runner: source pump: still reading as the engine exited".into(),
        };
        say(&prefix, &file, &line).await;
    }
    file.flush().await;
    match status {
        Ok(s) if s.success() => report(&shared, &l, true, None).await,
        // The engine asks for a new attempt at HEAD (a continuous change
        // stream met a table's new shape, or an object store did not
        // answer): handed back, not failed, so the run's retries are not
        // spent on what the next attempt takes or the store's outage. A
        // pipeline binary's steps met the same outage.
        Ok(s)
            if matches!(l.command, Work::Sync | Work::Attempt)
                && s.code() == Some(ENGINE_RESTART) =>
        {
            let last = last.lock().ok().and_then(|g| g.clone());
            let why = match (l.command, last) {
                (Work::Sync, Some(line)) => line,
                (Work::Sync, None) => "the engine asked for a new attempt".into(),
                // Its error (stderr) may be read before its summary
                // (stdout): the line that says why, else what the code means.
                (_, Some(line)) if line.contains("did not answer") => line,
                _ => format!("{}: the object store did not answer", l.pipeline),
            };
            say(
                &prefix,
                &file,
                &format!("runner: handing the attempt back: {why}"),
            )
            .await;
            file.flush().await;
            match control::release(&shared.db, l.lease, &why).await {
                Ok(()) => Outcome::Released,
                Err(e) => {
                    report(
                        &shared,
                        &l,
                        false,
                        Some(format!("{why} (and handing it back failed: {e})")),
                    )
                    .await
                }
            }
        }
        Ok(s) => {
            let last = last.lock().ok().and_then(|g| g.clone());
            let limit = l.resources.and_then(|r| r.memory_bytes);
            if let Some(why) =
                crate::sizing::killed_for_memory(&s, last.as_deref(), limit, oom_before)
            {
                println!("{prefix} {why}");
                return report_why(
                    &shared,
                    &l,
                    false,
                    Some(why),
                    Some(orca_core::api::KILLED_FOR_MEMORY),
                )
                .await;
            }
            let msg = match (s.code(), last) {
                (Some(c), Some(line)) => format!("exit code {c}: {line}"),
                (Some(c), None) => format!("exit code {c}"),
                (None, Some(line)) => format!("killed by a signal: {line}"),
                (None, None) => "killed by a signal".to_string(),
            };
            report(&shared, &l, false, Some(msg)).await
        }
        Err(e) => {
            report(
                &shared,
                &l,
                false,
                Some(format!("waiting for the child failed: {e}")),
            )
            .await
        }
    }
}
