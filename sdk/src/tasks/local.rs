//! Local mode: worker processes of this binary, each fed one task at a time
//! over a Unix socket of its own.
//!
//! A worker is started by executing the binary again in its worker role,
//! not by forking: the driver has threads and a database connection by the
//! time a worker dies and must be replaced, and a fork then would copy a
//! process whose locks other threads hold. A fresh process inherits neither.
//! A thread per worker reads its answers; a worker that dies has its task
//! tried again (as a failed try) and is replaced.

use std::collections::{HashMap, VecDeque};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use orca_core::tasks::{read_frame, write_frame, TaskRequest, TaskResponse, ROLE_ENV, SOCKET_ENV};
use serde_json::Value;

/// How long a new worker may take to connect.
const CONNECT_WITHIN: Duration = Duration::from_secs(30);
/// A retry waits at most this long, however many tries came before.
const BACKOFF_MAX: Duration = Duration::from_secs(60);

pub(crate) struct LocalPool {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    dir: PathBuf,
    binary: PathBuf,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    done: HashMap<u64, Done>,
    workers: Vec<Slot>,
    next_id: u64,
    /// Why the pool cannot run tasks any more (every worker gone and none
    /// could be started).
    broken: Option<String>,
}

#[derive(Default)]
struct Slot {
    conn: Option<UnixStream>,
    running: Option<Job>,
}

struct Job {
    id: u64,
    task: &'static str,
    input: Value,
    /// Tries so far.
    tries: u32,
    max_tries: u32,
    backoff_ms: u32,
    not_before: Instant,
}

/// A task that ended for good.
pub(crate) struct Done {
    pub task: &'static str,
    pub outcome: Result<Value, String>,
    pub tries: u32,
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A thread that panicked holding the lock left the state as it was
    // between two whole updates: go on with it.
    shared.state.lock().unwrap_or_else(|p| p.into_inner())
}

impl LocalPool {
    /// Starts `n` workers and waits for each to connect.
    pub(crate) fn start(n: usize) -> Result<LocalPool, String> {
        let binary = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
        let dir = std::env::temp_dir().join(format!(
            "orca-tasks-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            dir,
            binary,
        });
        lock(&shared).workers = (0..n).map(|_| Slot::default()).collect();
        for k in 0..n {
            let (child, conn) = spawn(&shared, k, 0)?;
            let s = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("orca-task-worker-{k}"))
                .spawn(move || watch(s, k, child, conn))
                .map_err(|e| format!("starting the thread of worker {k}: {e}"))?;
        }
        Ok(LocalPool { shared })
    }

    /// Queues tasks; returns their job ids in order.
    pub(crate) fn submit(
        &self,
        task: &'static str,
        retries: u32,
        backoff_ms: u32,
        inputs: Vec<Value>,
    ) -> Result<Vec<u64>, String> {
        let mut st = lock(&self.shared);
        if let Some(why) = &st.broken {
            return Err(why.clone());
        }
        let now = Instant::now();
        let mut ids = Vec::with_capacity(inputs.len());
        for input in inputs {
            let id = st.next_id;
            st.next_id += 1;
            st.queue.push_back(Job {
                id,
                task,
                input,
                tries: 0,
                max_tries: retries.saturating_add(1),
                backoff_ms,
                not_before: now,
            });
            ids.push(id);
        }
        dispatch(&mut st);
        Ok(ids)
    }

    /// Waits until every job ended; their outcomes in the order asked.
    pub(crate) fn wait(&self, ids: &[u64]) -> Result<Vec<Done>, String> {
        let mut st = lock(&self.shared);
        loop {
            if ids.iter().all(|id| st.done.contains_key(id)) {
                return Ok(ids.iter().filter_map(|id| st.done.remove(id)).collect());
            }
            if let Some(why) = &st.broken {
                return Err(why.clone());
            }
            // A retry whose backoff ran out is sent from here.
            dispatch(&mut st);
            st = self
                .shared
                .changed
                .wait_timeout(st, Duration::from_millis(20))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

impl Drop for LocalPool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.shared.dir);
    }
}

/// Sends queued tasks that are due to idle workers.
fn dispatch(st: &mut State) {
    let now = Instant::now();
    for k in 0..st.workers.len() {
        if st.workers[k].running.is_some() || st.workers[k].conn.is_none() {
            continue;
        }
        let Some(pos) = st.queue.iter().position(|j| j.not_before <= now) else {
            return;
        };
        let Some(job) = st.queue.remove(pos) else {
            return;
        };
        let req = TaskRequest {
            id: job.id,
            task: job.task.to_string(),
            input: job.input.clone(),
        };
        let sent = match st.workers[k].conn.as_mut() {
            Some(conn) => write_frame(conn, &req).is_ok(),
            None => false,
        };
        if sent {
            st.workers[k].running = Some(job);
        } else {
            // The worker is going; its thread replaces it.
            st.queue.push_front(job);
            st.workers[k].conn = None;
        }
    }
}

/// Ends a try of a job: done for good, or queued again after its backoff.
fn tried(st: &mut State, mut job: Job, outcome: Result<Value, String>) {
    job.tries += 1;
    match outcome {
        Err(_) if job.tries < job.max_tries => {
            let wait = Duration::from_millis(u64::from(job.backoff_ms))
                .saturating_mul(1u32 << (job.tries - 1).min(20))
                .min(BACKOFF_MAX);
            job.not_before = Instant::now() + wait;
            st.queue.push_back(job);
        }
        outcome => {
            st.done.insert(
                job.id,
                Done {
                    task: job.task,
                    outcome,
                    tries: job.tries,
                },
            );
        }
    }
}

/// Starts worker `k` (its `generation`-th process) and waits for it to
/// connect to a socket of its own.
fn spawn(shared: &Shared, k: usize, generation: u32) -> Result<(Child, UnixStream), String> {
    let path = shared.dir.join(format!("w{k}-{generation}.sock"));
    let _ = std::fs::remove_file(&path);
    let listener =
        UnixListener::bind(&path).map_err(|e| format!("listening on {}: {e}", path.display()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut child = Command::new(&shared.binary)
        .env(ROLE_ENV, "worker")
        .env(SOCKET_ENV, &path)
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", shared.binary.display()))?;
    let conn = accept(&listener, &mut child, &path);
    let _ = std::fs::remove_file(&path);
    match conn {
        Ok(c) => Ok((child, c)),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

fn accept(listener: &UnixListener, child: &mut Child, path: &Path) -> Result<UnixStream, String> {
    let t0 = Instant::now();
    loop {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                return Ok(conn);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!(
                        "a task worker exited before it connected ({status})"
                    ));
                }
                if t0.elapsed() > CONNECT_WITHIN {
                    return Err(format!(
                        "a task worker did not connect within {CONNECT_WITHIN:?}"
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(format!("accepting on {}: {e}", path.display())),
        }
    }
}

/// The thread of worker slot `k`: reads its answers; when it dies, tries
/// its task again and starts another.
fn watch(shared: Arc<Shared>, k: usize, mut child: Child, conn: UnixStream) {
    let mut generation = 0;
    let mut reader = conn.try_clone();
    {
        let mut st = lock(&shared);
        st.workers[k].conn = Some(conn);
        dispatch(&mut st);
    }
    loop {
        let answer = match reader.as_mut() {
            Ok(r) => read_frame::<TaskResponse>(r),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        };
        match answer {
            Ok(Some(resp)) => {
                let mut st = lock(&shared);
                match st.workers[k].running.take() {
                    Some(job) if job.id == resp.id => {
                        let outcome = match resp.error {
                            Some(e) => Err(e),
                            None => Ok(resp.output.unwrap_or(Value::Null)),
                        };
                        tried(&mut st, job, outcome);
                    }
                    other => st.workers[k].running = other,
                }
                dispatch(&mut st);
                shared.changed.notify_all();
            }
            Ok(None) | Err(_) => {
                let pid = child.id();
                let status = child
                    .wait()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                {
                    let mut st = lock(&shared);
                    st.workers[k].conn = None;
                    if let Some(job) = st.workers[k].running.take() {
                        let why = format!(
                            "task worker {pid} died while running task {} ({status})",
                            job.task
                        );
                        tried(&mut st, job, Err(why));
                    }
                    shared.changed.notify_all();
                }
                generation += 1;
                match spawn(&shared, k, generation) {
                    Ok((c, conn)) => {
                        child = c;
                        reader = conn.try_clone();
                        let mut st = lock(&shared);
                        st.workers[k].conn = Some(conn);
                        dispatch(&mut st);
                    }
                    Err(e) => {
                        let mut st = lock(&shared);
                        if st.workers.iter().all(|w| w.conn.is_none()) {
                            let why = format!("no task worker is left: {e}");
                            let queued: Vec<Job> = st.queue.drain(..).collect();
                            for job in queued {
                                st.done.insert(
                                    job.id,
                                    Done {
                                        task: job.task,
                                        outcome: Err(why.clone()),
                                        tries: job.tries,
                                    },
                                );
                            }
                            st.broken = Some(why);
                        }
                        shared.changed.notify_all();
                        return;
                    }
                }
            }
        }
    }
}
