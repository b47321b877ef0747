//! Tasks in fleet mode: this runner claims batches of its pool's tasks
//! (`orca.claim_tasks`), runs each task in a worker process of the batch's
//! binary, heartbeats the batches' leases and finishes each batch with its
//! tasks' results (`orca.finish_tasks`).
//!
//! A worker is the pipeline binary in its worker role
//! (`ORCA_TASK_ROLE=worker`), connected over a Unix socket of its own; a
//! binary gets `--task-workers` of them, kept between batches, not one
//! process per task. A worker that dies fails the task it was running (the
//! control plane tries it again, alone) and is replaced. A batch the control
//! plane takes back (its run ended, or its lease lapsed) is dropped: its
//! tasks not yet started are not run.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orca_core::tasks::{
    decode_body, encode_frame, frame_len, TaskRequest, TaskResponse, ROLE_ENV, SOCKET_ENV,
};
use serde_json::Value;
use sqlx::postgres::PgListener;
use sqlx::{PgPool, Row};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixListener;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};

use crate::attempt::{child_env, Shared, REPORT_FOR};

/// How long a new worker may take to connect.
const CONNECT_WITHIN: Duration = Duration::from_secs(30);
/// Workers of a binary that die this many times in a row without answering
/// once are not started again: the binary cannot serve tasks.
const DEATHS_MAX: u32 = 5;
/// Leases are heartbeaten at least this often, whatever their length: a
/// heartbeat is also how a runner learns that a batch's run ended.
const BEAT_MAX: Duration = Duration::from_secs(1);
/// A failed task's error carries the last lines its worker wrote to stderr
/// while it ran: this many, each cut to `LOG_LINE_MAX` bytes.
const LOG_LINES: usize = 20;
const LOG_LINE_MAX: usize = 300;
/// How long a failure waits for stderr lines still in the pipe: a worker
/// writes them before its answer, but they come by another pipe.
const LOG_DRAIN: Duration = Duration::from_millis(50);
/// Where an error's log lines begin.
const LOG_MARK: &str = "\n--- the task's last log lines";

pub struct Config {
    pub name: String,
    pub pool: String,
    /// Worker processes per binary.
    pub workers: usize,
    pub poll: Duration,
    /// After the runner is told to stop, how long batches in flight may
    /// finish before their leases are left to lapse.
    pub grace: Duration,
    /// How long a binary's workers may sit idle before they are stopped
    /// (the next batch of that binary starts them again).
    pub idle: Duration,
}

/// A batch this runner holds.
struct Batch {
    lease: uuid::Uuid,
    run: i64,
    task: String,
    binary: PathBuf,
    /// Each task's input until it is sent to a worker.
    inputs: Vec<Value>,
    outputs: Vec<Value>,
    errors: Vec<Option<String>>,
    millis: Vec<i32>,
    left: usize,
    /// The lease's length, and when to heartbeat it next.
    length: Duration,
    next_beat: Instant,
}

struct Worker {
    writer: Option<OwnedWriteHalf>,
    /// (batch, position in it) of the task it runs.
    running: Option<(i64, usize)>,
}

/// The workers of one binary, and the tasks waiting for them.
struct Group {
    workers: Vec<Worker>,
    queue: VecDeque<(i64, usize)>,
    /// Deaths since a worker last answered.
    deaths: u32,
    broken: Option<String>,
    org: String,
    generation: u32,
    /// Since when nothing of this binary waits or runs.
    idle_since: Option<Instant>,
    /// Which group of this binary it is: a worker of a group stopped for
    /// being idle may still report, and is not taken for this one's.
    id: u64,
}

/// Numbers the groups this runner starts.
static GROUPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

enum Event {
    Started {
        binary: PathBuf,
        group: u64,
        k: usize,
        writer: OwnedWriteHalf,
    },
    Answer {
        binary: PathBuf,
        group: u64,
        k: usize,
        resp: TaskResponse,
    },
    Died {
        binary: PathBuf,
        group: u64,
        k: usize,
        why: String,
    },
}

/// The stderr lines a worker wrote since it last answered: what its
/// current task logged.
#[derive(Default)]
struct LogTail {
    lines: VecDeque<String>,
    /// Lines dropped from the front, told in the error.
    dropped: usize,
}

impl LogTail {
    fn push(&mut self, mut line: String) {
        if line.len() > LOG_LINE_MAX {
            let mut cut = LOG_LINE_MAX;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        if self.lines.len() == LOG_LINES {
            self.lines.pop_front();
            self.dropped += 1;
        }
        self.lines.push_back(line);
    }

    /// The error with the lines appended (and the tail emptied).
    fn attach(&mut self, error: String) -> String {
        if self.lines.is_empty() {
            return error;
        }
        let mut out = error;
        out.push_str(LOG_MARK);
        if self.dropped > 0 {
            out.push_str(&format!(" ({} earlier ones left out)", self.dropped));
        }
        out.push_str(" ---");
        for l in self.lines.drain(..) {
            out.push('\n');
            out.push_str(&l);
        }
        self.dropped = 0;
        out
    }

    fn clear(&mut self) {
        self.lines.clear();
        self.dropped = 0;
    }
}

/// Reads a worker's stderr lines into `tail`, copying each to the runner's
/// own stderr (prefixed with the worker's pid) as before.
fn tail_stderr(
    stderr: tokio::process::ChildStderr,
    pid: u32,
    tail: Arc<std::sync::Mutex<LogTail>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("[task worker {pid}] {line}");
            if let Ok(mut t) = tail.lock() {
                t.push(line);
            }
        }
    })
}

/// Serves tasks until `stop` turns true and the batches in flight are
/// finished (or the grace ran out).
pub async fn serve(shared: Arc<Shared>, cfg: Config, mut stop: watch::Receiver<bool>) {
    let mut listener = match PgListener::connect_with(&shared.db).await {
        Ok(mut l) => match l.listen("orca_tasks").await {
            Ok(()) => Some(l),
            Err(e) => {
                eprintln!("orca-runner: LISTEN orca_tasks: {e}; polling only");
                None
            }
        },
        Err(e) => {
            eprintln!("orca-runner: task notifications: {e}; polling only");
            None
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let mut batches: HashMap<i64, Batch> = HashMap::new();
    let mut groups: HashMap<PathBuf, Group> = HashMap::new();
    let mut poll = tokio::time::interval(cfg.poll);
    let mut beat = tokio::time::interval(Duration::from_millis(250));
    let mut want_claim = true;
    let mut stopping: Option<Instant> = None;
    let capacity = cfg.workers.max(1) * 4;
    loop {
        if stopping.is_some() {
            let over = stopping.is_some_and(|t| t.elapsed() > cfg.grace);
            if batches.is_empty() || over {
                break;
            }
        }
        let queued: usize = batches.values().map(|b| b.left).sum();
        if want_claim && stopping.is_none() && queued < capacity {
            let room = i32::try_from(capacity - queued).unwrap_or(1);
            match claim(&shared.db, &cfg.name, &cfg.pool, room).await {
                Ok(claimed) => {
                    for c in claimed {
                        take(&shared, &cfg, &tx, &mut batches, &mut groups, c).await;
                    }
                }
                Err(e) => eprintln!("orca-runner: claiming tasks failed: {e}"),
            }
        }
        want_claim = false;
        tokio::select! {
            Some(ev) = rx.recv() => {
                want_claim = handle(&shared, &tx, &mut batches, &mut groups, ev).await;
            }
            n = async { match listener.as_mut() { Some(l) => l.recv().await, None => std::future::pending().await } } => {
                match n {
                    Ok(n) => want_claim = n.payload() == cfg.pool,
                    Err(e) => {
                        eprintln!("orca-runner: task notifications: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
            _ = poll.tick() => want_claim = true,
            _ = beat.tick() => {
                heartbeat(&shared.db, &mut batches, &mut groups).await;
                reap_idle(&cfg, &batches, &mut groups);
            }
            r = stop.changed(), if stopping.is_none() => {
                if r.is_err() || *stop.borrow() {
                    stopping = Some(Instant::now());
                }
            }
        }
    }
    if !batches.is_empty() {
        println!(
            "orca-runner {}: stopping with {} task batch(es) unfinished: their leases lapse and the control plane hands them on",
            cfg.name,
            batches.len()
        );
    }
}

/// A batch as `orca.claim_tasks` hands it out.
struct Claimed {
    batch: i64,
    lease: uuid::Uuid,
    run: i64,
    pipeline: String,
    version: i64,
    binary_path: String,
    binary_sha256: Option<String>,
    task: String,
    inputs: Vec<Value>,
    indexes: Vec<i32>,
    deadline: chrono::DateTime<chrono::Utc>,
    org: String,
}

async fn claim(db: &PgPool, name: &str, pool: &str, max: i32) -> Result<Vec<Claimed>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT batch, lease, run, pipeline, version_id, binary_path, binary_sha256, task, \
                indexes, inputs, deadline, org \
         FROM orca.claim_tasks($1, $2, $3)",
    )
    .bind(name)
    .bind(pool)
    .bind(max)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            let inputs: Value = r.try_get("inputs")?;
            Ok(Claimed {
                batch: r.try_get("batch")?,
                lease: r.try_get("lease")?,
                run: r.try_get("run")?,
                pipeline: r.try_get("pipeline")?,
                version: r.try_get("version_id")?,
                binary_path: r.try_get("binary_path")?,
                binary_sha256: r.try_get("binary_sha256")?,
                task: r.try_get("task")?,
                inputs: match inputs {
                    Value::Array(a) => a,
                    other => vec![other],
                },
                indexes: r.try_get("indexes")?,
                deadline: r.try_get("deadline")?,
                org: r.try_get("org")?,
            })
        })
        .collect()
}

/// Takes a claimed batch: its tasks wait for a worker of its binary.
async fn take(
    shared: &Arc<Shared>,
    cfg: &Config,
    tx: &mpsc::UnboundedSender<Event>,
    batches: &mut HashMap<i64, Batch>,
    groups: &mut HashMap<PathBuf, Group>,
    c: Claimed,
) {
    let n = c.indexes.len();
    let binary = match &shared.pins {
        Some(pins) => pins
            .verify_binary(
                &c.binary_path,
                c.binary_sha256.as_deref(),
                c.version,
                &c.pipeline,
            )
            .map(|v| v.path)
            .map_err(|e| e.to_string()),
        None => Err(
            "this runner has no pipeline root (--pipelines) and runs no pipeline binaries".into(),
        ),
    };
    let binary = match binary {
        Ok(b) => b,
        Err(why) => {
            eprintln!(
                "orca-runner: task batch {} of {}: {why}",
                c.batch, c.pipeline
            );
            let errors = vec![Some(why); n];
            finish(
                shared.db.clone(),
                c.batch,
                c.lease,
                vec![Value::Null; n],
                errors,
                vec![0; n],
            );
            return;
        }
    };
    let length = (c.deadline - chrono::Utc::now())
        .to_std()
        .unwrap_or(Duration::from_secs(1));
    if c.inputs.len() != n {
        let why = format!(
            "batch {} holds {} inputs for {n} tasks",
            c.batch,
            c.inputs.len()
        );
        finish(
            shared.db.clone(),
            c.batch,
            c.lease,
            vec![Value::Null; n],
            vec![Some(why); n],
            vec![0; n],
        );
        return;
    }
    println!(
        "claimed task batch {} of run {} ({} {}, {n} task(s))",
        c.batch, c.run, c.pipeline, c.task
    );
    let group = groups.entry(binary.clone()).or_insert_with(|| Group {
        workers: (0..cfg.workers.max(1))
            .map(|_| Worker {
                writer: None,
                running: None,
            })
            .collect(),
        queue: VecDeque::new(),
        deaths: 0,
        broken: None,
        org: c.org.clone(),
        generation: 0,
        idle_since: None,
        id: GROUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    });
    if group.generation == 0 {
        group.generation = 1;
        for k in 0..group.workers.len() {
            start_worker(
                shared,
                tx,
                &binary,
                group.id,
                k,
                group.generation,
                &group.org,
            );
        }
    }
    for pos in 0..n {
        group.queue.push_back((c.batch, pos));
    }
    batches.insert(
        c.batch,
        Batch {
            lease: c.lease,
            run: c.run,
            task: c.task.clone(),
            binary: binary.clone(),
            inputs: c.inputs,
            outputs: vec![Value::Null; n],
            errors: vec![None; n],
            millis: vec![0; n],
            left: n,
            length,
            next_beat: Instant::now() + (length / 3).min(BEAT_MAX),
        },
    );
    if let Some(why) = group.broken.clone() {
        fail_queued(&shared.db, batches, group, &why);
    } else {
        dispatch(batches, group).await;
    }
}

/// Stops the workers of binaries with nothing to do for `cfg.idle`: a
/// version that is not run again does not keep its processes for the
/// runner's life. Dropping a group hangs up on its workers, which exit.
fn reap_idle(cfg: &Config, batches: &HashMap<i64, Batch>, groups: &mut HashMap<PathBuf, Group>) {
    let now = Instant::now();
    let mut gone = Vec::new();
    for (binary, g) in groups.iter_mut() {
        let busy = !g.queue.is_empty()
            || g.workers.iter().any(|w| w.running.is_some())
            || batches.values().any(|b| &b.binary == binary);
        if busy {
            g.idle_since = None;
            continue;
        }
        let since = *g.idle_since.get_or_insert(now);
        if now.duration_since(since) >= cfg.idle {
            gone.push(binary.clone());
        }
    }
    for binary in gone {
        if let Some(g) = groups.remove(&binary) {
            println!(
                "stopping the {} idle task worker(s) of {} (idle for {:?})",
                g.workers.iter().filter(|w| w.writer.is_some()).count(),
                binary.display(),
                cfg.idle
            );
        }
    }
}

/// Sends waiting tasks to the group's idle workers.
async fn dispatch(batches: &mut HashMap<i64, Batch>, group: &mut Group) {
    for k in 0..group.workers.len() {
        if group.workers[k].running.is_some() || group.workers[k].writer.is_none() {
            continue;
        }
        // Tasks of batches the control plane took back are dropped here.
        let next = loop {
            match group.queue.pop_front() {
                Some((b, pos)) if batches.contains_key(&b) => break Some((b, pos)),
                Some(_) => continue,
                None => break None,
            }
        };
        let Some((b, pos)) = next else { return };
        let Some(batch) = batches.get_mut(&b) else {
            continue;
        };
        let req = TaskRequest {
            id: (u64::try_from(b).unwrap_or(0) << 20) | pos as u64,
            task: batch.task.clone(),
            input: std::mem::take(&mut batch.inputs[pos]),
        };
        let sent = match group.workers[k].writer.as_mut() {
            Some(w) => write_frame(w, &req).await.is_ok(),
            None => false,
        };
        if sent {
            group.workers[k].running = Some((b, pos));
        } else {
            // Its reader will say it died; the task waits for another.
            batch.inputs[pos] = req.input;
            group.queue.push_front((b, pos));
            group.workers[k].writer = None;
        }
    }
}

/// Handles a worker's event; returns whether to claim more.
async fn handle(
    shared: &Arc<Shared>,
    tx: &mpsc::UnboundedSender<Event>,
    batches: &mut HashMap<i64, Batch>,
    groups: &mut HashMap<PathBuf, Group>,
    ev: Event,
) -> bool {
    match ev {
        Event::Started {
            binary,
            group,
            k,
            writer,
        } => {
            if let Some(g) = groups.get_mut(&binary).filter(|g| g.id == group) {
                g.workers[k].writer = Some(writer);
                dispatch(batches, g).await;
            }
            false
        }
        Event::Answer {
            binary,
            group,
            k,
            resp,
        } => {
            let Some(g) = groups.get_mut(&binary).filter(|g| g.id == group) else {
                return false;
            };
            g.deaths = 0;
            let running = g.workers[k].running.take();
            if let Some((b, pos)) = running {
                let outcome = match resp.error {
                    Some(e) => Err(e),
                    None => Ok(resp.output.unwrap_or(Value::Null)),
                };
                let millis = i32::try_from(resp.millis).unwrap_or(i32::MAX);
                done(&shared.db, batches, b, pos, outcome, millis);
            }
            dispatch(batches, g).await;
            true
        }
        Event::Died {
            binary,
            group,
            k,
            why,
        } => {
            let Some(g) = groups.get_mut(&binary).filter(|g| g.id == group) else {
                return false;
            };
            g.workers[k].writer = None;
            g.deaths += 1;
            if let Some((b, pos)) = g.workers[k].running.take() {
                eprintln!("orca-runner: {why}");
                done(&shared.db, batches, b, pos, Err(why.clone()), 0);
            }
            if g.deaths >= DEATHS_MAX {
                let why = format!(
                    "the task workers of {} died {} times in a row without answering: {why}",
                    binary.display(),
                    g.deaths
                );
                g.broken = Some(why.clone());
                fail_queued(&shared.db, batches, g, &why);
            } else {
                g.generation += 1;
                start_worker(shared, tx, &binary, g.id, k, g.generation, &g.org);
            }
            true
        }
    }
}

/// Records a task's outcome; a batch whose last task ended is finished.
fn done(
    db: &PgPool,
    batches: &mut HashMap<i64, Batch>,
    b: i64,
    pos: usize,
    outcome: Result<Value, String>,
    millis: i32,
) {
    let Some(batch) = batches.get_mut(&b) else {
        return;
    };
    match outcome {
        Ok(v) => batch.outputs[pos] = v,
        Err(e) => {
            batch.outputs[pos] = Value::Null;
            batch.errors[pos] = Some(e);
        }
    }
    batch.millis[pos] = millis;
    batch.left = batch.left.saturating_sub(1);
    if batch.left == 0 {
        if let Some(mut batch) = batches.remove(&b) {
            fit_errors(&mut batch.errors);
            let failed = batch.errors.iter().filter(|e| e.is_some()).count();
            println!(
                "task batch {b} of run {} ended: {} succeeded, {failed} failed",
                batch.run,
                batch.errors.len() - failed
            );
            finish(
                db.clone(),
                b,
                batch.lease,
                batch.outputs,
                batch.errors,
                batch.millis,
            );
        }
    }
}

/// What a batch's errors may take together, below `orca.finish_tasks`'
/// 16 MiB bound on them.
const ERRORS_MAX: usize = 12 << 20;

/// Keeps a batch's errors within `ERRORS_MAX`: past it, errors lose their
/// log lines (each keeps its first line), so that the batch can finish.
fn fit_errors(errors: &mut [Option<String>]) {
    let total: usize = errors.iter().flatten().map(String::len).sum();
    if total <= ERRORS_MAX {
        return;
    }
    for e in errors.iter_mut().flatten() {
        if let Some(at) = e.find(LOG_MARK) {
            e.truncate(at);
            e.push_str(" (its log lines left out: the batch's errors were over 12 MiB)");
        }
    }
}

/// Fails every waiting task of a group that cannot run them.
fn fail_queued(db: &PgPool, batches: &mut HashMap<i64, Batch>, g: &mut Group, why: &str) {
    while let Some((b, pos)) = g.queue.pop_front() {
        done(db, batches, b, pos, Err(why.to_string()), 0);
    }
}

/// Reports a batch in the background, retrying while the control plane
/// is unreachable.
fn finish(
    db: PgPool,
    batch: i64,
    lease: uuid::Uuid,
    outputs: Vec<Value>,
    errors: Vec<Option<String>>,
    millis: Vec<i32>,
) {
    tokio::spawn(async move {
        let t0 = Instant::now();
        let mut wait = Duration::from_millis(100);
        let errors: Vec<Option<String>> = errors
            .into_iter()
            .map(|e| {
                e.map(|e| orca_core::api::clip(&e, orca_core::api::ERROR_TEXT_MAX).into_owned())
            })
            .collect();
        let all_ok = errors.iter().all(Option::is_none);
        let outputs = Value::Array(outputs);
        loop {
            let r = sqlx::query("SELECT orca.finish_tasks($1, $2, $3, $4)")
                .bind(lease)
                .bind(&outputs)
                .bind(if all_ok { None } else { Some(&errors) })
                .bind(&millis)
                .execute(&db)
                .await;
            match r {
                Ok(_) => return,
                Err(sqlx::Error::Database(d)) => {
                    // Taken back (lapsed, cancelled) or refused: nothing to retry.
                    eprintln!("orca-runner: finishing task batch {batch}: {}", d.message());
                    return;
                }
                Err(e) if t0.elapsed() < REPORT_FOR => {
                    eprintln!("orca-runner: finishing task batch {batch} failed, retrying: {e}");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    eprintln!(
                        "orca-runner: task batch {batch} not finished ({e}); its lease will lapse"
                    );
                    return;
                }
            }
        }
    });
}

/// Heartbeats the leases that are due; drops the batches the control plane
/// took back.
async fn heartbeat(
    db: &PgPool,
    batches: &mut HashMap<i64, Batch>,
    groups: &mut HashMap<PathBuf, Group>,
) {
    let now = Instant::now();
    let due: Vec<uuid::Uuid> = batches
        .values()
        .filter(|b| b.next_beat <= now)
        .map(|b| b.lease)
        .collect();
    if due.is_empty() {
        return;
    }
    let gone: Vec<(uuid::Uuid, String)> =
        match sqlx::query_as("SELECT lease, status FROM orca.heartbeat_tasks($1)")
            .bind(&due)
            .fetch_all(db)
            .await
        {
            Ok(g) => g,
            Err(e) => {
                eprintln!("orca-runner: task heartbeat failed: {e}");
                return;
            }
        };
    for b in batches.values_mut() {
        if due.contains(&b.lease) {
            b.next_beat = now + (b.length / 3).min(BEAT_MAX);
        }
    }
    for (lease, status) in gone {
        let id = batches
            .iter()
            .find(|(_, b)| b.lease == lease)
            .map(|(id, _)| *id);
        if let Some(id) = id {
            if let Some(b) = batches.remove(&id) {
                println!(
                    "task batch {id} of run {} was taken back ({status}): dropping its tasks",
                    b.run
                );
                if let Some(g) = groups.get_mut(&b.binary) {
                    g.queue.retain(|(x, _)| *x != id);
                }
            }
        }
    }
}

/// Starts worker `k` of a binary in the background: it reports when it is
/// connected, each answer, and its death.
#[allow(clippy::too_many_arguments)]
fn start_worker(
    shared: &Arc<Shared>,
    tx: &mpsc::UnboundedSender<Event>,
    binary: &Path,
    group: u64,
    k: usize,
    generation: u32,
    org: &str,
) {
    let shared = Arc::clone(shared);
    let tx = tx.clone();
    let binary = binary.to_path_buf();
    let org = org.to_string();
    tokio::spawn(async move {
        let socket = shared.sockets.join(format!(
            "t{}-{k}-{generation}.sock",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        let (mut child, reader, writer) = match connect(&shared, &binary, &socket, &org).await {
            Ok(c) => c,
            Err(why) => {
                let _ = tx.send(Event::Died {
                    binary,
                    group,
                    k,
                    why,
                });
                return;
            }
        };
        let pid = child.id().unwrap_or(0);
        let tail = Arc::new(std::sync::Mutex::new(LogTail::default()));
        let stderr_done = child
            .stderr
            .take()
            .map(|e| tail_stderr(e, pid, Arc::clone(&tail)));
        if tx
            .send(Event::Started {
                binary: binary.clone(),
                group,
                k,
                writer,
            })
            .is_err()
        {
            return;
        }
        let mut reader = reader;
        while let Ok(Some(mut resp)) = read_frame(&mut reader).await {
            if let Some(e) = resp.error.take() {
                tokio::time::sleep(LOG_DRAIN).await;
                resp.error = Some(match tail.lock() {
                    Ok(mut t) => t.attach(e),
                    Err(_) => e,
                });
            } else if let Ok(mut t) = tail.lock() {
                t.clear();
            }
            if tx
                .send(Event::Answer {
                    binary: binary.clone(),
                    group,
                    k,
                    resp,
                })
                .is_err()
            {
                return;
            }
        }
        let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
            Ok(Ok(s)) => s.to_string(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => {
                let _ = child.kill().await;
                "it hung up and was killed".to_string()
            }
        };
        // Its last lines (a panic's message, say) are read to the end.
        if let Some(done) = stderr_done {
            let _ = tokio::time::timeout(Duration::from_secs(1), done).await;
        }
        let why = format!(
            "task worker {pid} of {} died while running a task ({status})",
            binary.display()
        );
        let why = match tail.lock() {
            Ok(mut t) => t.attach(why),
            Err(_) => why,
        };
        let _ = tx.send(Event::Died {
            binary,
            group,
            k,
            why,
        });
    });
}

async fn connect(
    shared: &Shared,
    binary: &Path,
    socket: &Path,
    org: &str,
) -> Result<(Child, OwnedReadHalf, OwnedWriteHalf), String> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)
        .map_err(|e| format!("listening on {}: {e}", socket.display()))?;
    let mut cmd = Command::new(binary);
    // A worker gets no lease: the tasks it runs are its binary's code and
    // their inputs.
    child_env(&mut cmd, shared, org);
    cmd.env_remove("ORCA_LEASE")
        .env(ROLE_ENV, "worker")
        .env(SOCKET_ENV, socket)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting task worker {}: {e}", binary.display()))?;
    let accepted = tokio::select! {
        a = listener.accept() => a.map(|(s, _)| s).map_err(|e| format!("accepting a task worker: {e}")),
        s = child.wait() => Err(format!(
            "task worker {} exited before it connected ({})",
            binary.display(),
            s.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string())
        )),
        _ = tokio::time::sleep(CONNECT_WITHIN) => Err(format!(
            "task worker {} did not connect within {CONNECT_WITHIN:?}",
            binary.display()
        )),
    };
    let _ = std::fs::remove_file(socket);
    let stream = accepted?;
    let (r, w) = stream.into_split();
    Ok((child, r, w))
}

async fn write_frame(w: &mut OwnedWriteHalf, msg: &TaskRequest) -> std::io::Result<()> {
    w.write_all(&encode_frame(msg)?).await
}

async fn read_frame(r: &mut OwnedReadHalf) -> std::io::Result<Option<TaskResponse>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; frame_len(len)?];
    r.read_exact(&mut body).await?;
    decode_body(&body).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_carries_the_last_lines_of_its_task_only() {
        let mut t = LogTail::default();
        t.push("of the task before".into());
        t.clear();
        for i in 0..(LOG_LINES + 3) {
            t.push(format!("line {i}"));
        }
        let e = t.attach("boom".into());
        assert!(e.starts_with(
            "boom\n--- the task's last log lines (3 earlier ones left out) ---\nline 3\n"
        ));
        assert!(e.ends_with(&format!("line {}", LOG_LINES + 2)));
        assert!(!e.contains("of the task before"));
        // Taken once: the next failure starts empty.
        assert_eq!(t.attach("again".into()), "again");
    }

    #[test]
    fn a_long_line_is_cut_on_a_character_boundary() {
        let mut t = LogTail::default();
        t.push("é".repeat(LOG_LINE_MAX));
        let e = t.attach("x".into());
        let line = e.lines().last().unwrap_or_default();
        assert!(line.ends_with('…'));
        assert!(line.len() <= LOG_LINE_MAX + '…'.len_utf8());
    }

    #[test]
    fn errors_over_the_bound_lose_their_log_lines_not_their_message() {
        let log = "y".repeat(LOG_LINE_MAX);
        let one = format!("failed\n--- the task's last log lines ---\n{log}");
        let mut errors = vec![Some(one.clone()); (ERRORS_MAX / one.len()) + 10];
        errors.push(None);
        fit_errors(&mut errors);
        let total: usize = errors.iter().flatten().map(String::len).sum();
        assert!(total < ERRORS_MAX);
        assert!(errors[0]
            .as_deref()
            .is_some_and(|e| e.starts_with("failed (its log lines left out")));
        assert!(errors.last().is_some_and(Option::is_none));
        let mut few = vec![Some(one.clone())];
        fit_errors(&mut few);
        assert_eq!(few[0].as_deref(), Some(one.as_str()));
    }
}
