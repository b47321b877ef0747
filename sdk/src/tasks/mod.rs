//! Tasks: small typed functions a step fans out and gathers (docs/tasks.md).
//!
//! ```ignore
//! #[orca::task(Trips, retries = 2)]
//! fn trips(day: orca::Day) -> orca::Result<i64> { ... }
//!
//! orca::tasks!(FanoutTasks = [Trips]);
//!
//! #[orca::step(mapped)]
//! fn month_trips(ctx: &mut orca::Ctx, m: orca::Month) -> orca::Result<i64> {
//!     let rt = ctx.runtime::<FanoutTasks>()?;
//!     let refs = rt.remote_all::<Trips>(m.days())?;
//!     Ok(rt.get_all(refs)?.into_iter().sum())
//! }
//!
//! orca::pipeline! { Fanout = "fanout" [month_trips], partitions = Monthly("2024-01"), tasks = FanoutTasks }
//! ```
//!
//! Where they run: `local` (the default) is worker processes of the step's
//! own binary (`ORCA_WORKERS` of them, default the machine's cores); `fleet`
//! (`ORCA_TASKS=fleet`) is the runners of the pipeline's pool, through the
//! control plane (`orca.add_tasks`, claimed in batches by runners). Either
//! way a worker is the pipeline binary in its worker role
//! ([`worker::serve`]), started with nothing of its parent but its
//! environment: no database connection, no thread.

mod fleet;
mod local;
pub(crate) mod worker;

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use orca_core::api::LeaseToken;
use orca_core::tasks::{MODE_ENV, WORKERS_ENV};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use fleet::Fleet;
use local::LocalPool;

/// A task, as `#[orca::task]` declares it.
pub trait Task: 'static {
    type Input: Serialize + DeserializeOwned;
    type Output: Serialize + DeserializeOwned;
    /// Its name in the manifest and the control plane: the function's name.
    const NAME: &'static str;
    /// A hash of the function's code, retries and backoff.
    const CODE: &'static str;
    /// How many more tries a failed task gets.
    const RETRIES: u32;
    /// The wait before the first retry; each later one waits twice as long.
    const BACKOFF_MS: u32;
    fn call(input: Self::Input) -> crate::Result<Self::Output>;
}

/// A set of tasks a step may fan out, as `orca::tasks!` declares it.
pub trait TaskSet: 'static {
    const NAME: &'static str;
    fn tasks() -> Vec<TaskInfo>;
}

/// That task `T` is one of the set's: what `Runtime::remote::<T>` asks for.
#[diagnostic::on_unimplemented(
    message = "task `{T}` is not one of the tasks of `{Self}`",
    label = "this runtime runs only the tasks its set lists",
    note = "list it where the set is declared: `orca::tasks!({Self} = [..., {T}])`, and the set in the pipeline's `tasks = ...`"
)]
pub trait Has<T: Task> {}

/// A task with its types erased, for workers and the manifest.
#[derive(Clone, Debug)]
pub struct TaskInfo {
    pub name: &'static str,
    pub code: &'static str,
    pub retries: u32,
    pub backoff_ms: u32,
    pub input: &'static str,
    pub output: &'static str,
    pub run: fn(Value) -> Result<Value, String>,
}

impl TaskInfo {
    pub fn of<T: Task>() -> Self {
        TaskInfo {
            name: T::NAME,
            code: T::CODE,
            retries: T::RETRIES,
            backoff_ms: T::BACKOFF_MS,
            input: std::any::type_name::<T::Input>(),
            output: std::any::type_name::<T::Output>(),
            run: run_erased::<T>,
        }
    }
}

/// Calls a task on JSON, the form its input and output travel in.
fn run_erased<T: Task>(input: Value) -> Result<Value, String> {
    let input: T::Input = serde_json::from_value(input)
        .map_err(|e| format!("task {}: cannot decode its input: {e}", T::NAME))?;
    let output = T::call(input).map_err(|e| crate::error::task_error_text(e.as_ref()))?;
    serde_json::to_value(output)
        .map_err(|e| format!("task {}: cannot encode its output: {e}", T::NAME))
}

/// A task submitted and not yet gathered: `Runtime::get` turns it into its
/// output. Its number is its submission index within the (step, partition).
pub struct ObjectRef<T> {
    index: u32,
    _out: PhantomData<fn() -> T>,
}

impl<T> ObjectRef<T> {
    /// The task's submission index within its (step, partition), from 0.
    pub fn index(&self) -> u32 {
        self.index
    }
}

impl<T> std::fmt::Debug for ObjectRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectRef({})", self.index)
    }
}

/// A task that failed after its last try.
#[derive(Debug, thiserror::Error)]
#[error("task {task} #{index} failed after {tries} tr{}: {error}", if *.tries == 1 { "y" } else { "ies" })]
pub struct TaskFailed {
    pub task: String,
    pub index: u32,
    pub tries: u32,
    pub error: String,
    /// The object store did not answer the task: the step that gathers it
    /// hands its attempt back rather than failing it.
    #[source]
    pub outage: Option<crate::error::SdkError>,
}

impl TaskFailed {
    pub fn new(task: String, index: u32, tries: u32, error: String) -> Self {
        let outage = crate::error::task_outage(&error);
        TaskFailed {
            task,
            index,
            tries,
            error,
            outage,
        }
    }
}

/// Where this process's tasks run, set up by the binary's command line
/// before the steps run.
pub(crate) struct TaskEnv {
    /// The tasks the pipeline declares.
    pub declared: Vec<TaskInfo>,
    pub mode: Mode,
}

pub(crate) enum Mode {
    /// Worker processes of this binary.
    Local(Arc<LocalPool>),
    /// The runners of the pool, through the control plane, with the lease
    /// of the attempt this process runs.
    Fleet {
        database_url: String,
        org: Option<String>,
        lease: LeaseToken,
    },
}

static ENV: OnceLock<Result<TaskEnv, String>> = OnceLock::new();

/// Sets up where a pipeline's tasks run, before anything else of the run:
/// local workers start now, so they come up while the driver connects.
/// `fleet` is the attempt's connection and lease, for `ORCA_TASKS=fleet`.
pub(crate) fn start(declared: Vec<TaskInfo>, fleet: Option<(String, Option<String>, LeaseToken)>) {
    if declared.is_empty() {
        return;
    }
    let mode = std::env::var(MODE_ENV).unwrap_or_else(|_| "local".into());
    let env = match (mode.as_str(), fleet) {
        ("fleet", Some((database_url, org, lease))) => Ok(TaskEnv {
            declared,
            mode: Mode::Fleet {
                database_url,
                org,
                lease,
            },
        }),
        ("fleet", None) => Err(format!(
            "{MODE_ENV}=fleet runs tasks on the pool's runners, which only an attempt a runner \
             leased has; an in-memory run uses {MODE_ENV}=local"
        )),
        ("local", _) => workers().and_then(|n| {
            LocalPool::start(n)
                .map(|pool| TaskEnv {
                    declared,
                    mode: Mode::Local(Arc::new(pool)),
                })
                .map_err(|e| format!("starting {n} task workers: {e}"))
        }),
        (other, _) => Err(format!("{MODE_ENV} is local or fleet, got {other:?}")),
    };
    let _ = ENV.set(env);
}

/// `ORCA_WORKERS`, or the machine's cores.
fn workers() -> Result<usize, String> {
    match std::env::var(WORKERS_ENV) {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => Err(format!("{WORKERS_ENV} must be from 1 to 1024, got {v:?}")),
        },
        Err(_) => Ok(std::thread::available_parallelism().map_or(2, |n| n.get())),
    }
}

/// The submission counter of one (step, partition) call: tasks are
/// numbered from 0 in the order the step submits them, across every
/// runtime it asks for.
#[derive(Clone, Default)]
pub(crate) struct Scope {
    next: Arc<std::sync::atomic::AtomicU32>,
}

impl Scope {
    fn take(&self, n: u32) -> u32 {
        self.next.fetch_add(n, std::sync::atomic::Ordering::SeqCst)
    }
}

/// The runtime of a step's tasks: submit with [`Runtime::remote`], gather
/// with [`Runtime::get`]. `S` is the set of tasks it may run.
pub struct Runtime<S: TaskSet> {
    backend: Backend,
    scope: Scope,
    _set: PhantomData<fn() -> S>,
}

enum Backend {
    Local {
        pool: Arc<LocalPool>,
        /// Submission index -> the pool's job.
        jobs: std::cell::RefCell<HashMap<u32, u64>>,
    },
    Fleet(Box<std::cell::RefCell<Fleet>>),
}

/// What `Ctx::runtime` does: the runtime of set `S`, refused when the
/// pipeline does not declare every task of it.
pub(crate) fn runtime<S: TaskSet>(
    step: &'static str,
    partition: &str,
    scope: Scope,
) -> Result<Runtime<S>, Error> {
    let env = match ENV.get() {
        Some(Ok(env)) => env,
        Some(Err(e)) => return Err(e.clone().into()),
        None => {
            return Err(format!(
                "step {step} asked for the runtime of {}, but its pipeline declares no tasks \
                 (tasks = {} in orca::pipeline!), or it runs outside a pipeline binary",
                S::NAME,
                S::NAME
            )
            .into())
        }
    };
    if let Some(t) = S::tasks().iter().find(|t| {
        !env.declared
            .iter()
            .any(|d| d.name == t.name && d.code == t.code)
    }) {
        return Err(format!(
            "step {step} asked for the runtime of {}, whose task {} its pipeline does not declare \
             (tasks = ... in orca::pipeline!)",
            S::NAME,
            t.name
        )
        .into());
    }
    let backend = match &env.mode {
        Mode::Local(pool) => Backend::Local {
            pool: Arc::clone(pool),
            jobs: Default::default(),
        },
        Mode::Fleet {
            database_url,
            org,
            lease,
        } => Backend::Fleet(Box::new(std::cell::RefCell::new(Fleet::connect(
            database_url,
            org.as_deref(),
            *lease,
            step,
            partition,
        )?))),
    };
    Ok(Runtime {
        backend,
        scope,
        _set: PhantomData,
    })
}

impl<S: TaskSet> Runtime<S> {
    /// Submits task `T` with its input; returns at once.
    pub fn remote<T: Task>(&self, input: T::Input) -> Result<ObjectRef<T::Output>, Error>
    where
        S: Has<T>,
    {
        let mut refs = self.remote_all::<T>(std::iter::once(input))?;
        refs.pop()
            .ok_or_else(|| Error::from("the task was not submitted"))
    }

    /// Submits task `T` once per input, in order; returns at once.
    pub fn remote_all<T: Task>(
        &self,
        inputs: impl IntoIterator<Item = T::Input>,
    ) -> Result<Vec<ObjectRef<T::Output>>, Error>
    where
        S: Has<T>,
    {
        let values = inputs
            .into_iter()
            .map(|i| {
                serde_json::to_value(i)
                    .map_err(|e| format!("task {}: cannot encode its input: {e}", T::NAME))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let n = u32::try_from(values.len()).map_err(|_| "too many tasks at once")?;
        let first = self.scope.take(n);
        match &self.backend {
            Backend::Local { pool, jobs } => {
                let ids = pool.submit(T::NAME, T::RETRIES, T::BACKOFF_MS, values)?;
                let mut jobs = jobs.borrow_mut();
                for (k, id) in ids.into_iter().enumerate() {
                    jobs.insert(first + k as u32, id);
                }
            }
            Backend::Fleet(f) => f.borrow_mut().submit(T::NAME, first, values)?,
        }
        Ok((first..first + n)
            .map(|index| ObjectRef {
                index,
                _out: PhantomData,
            })
            .collect())
    }

    /// Waits for a task's output; a task that failed after its last try is
    /// an error naming it.
    pub fn get<O: DeserializeOwned>(&self, r: ObjectRef<O>) -> Result<O, Error> {
        let mut all = self.get_all(std::iter::once(r))?;
        all.pop().ok_or_else(|| Error::from("no output"))
    }

    /// Waits for every task's output, in the order of `refs`.
    pub fn get_all<O: DeserializeOwned>(
        &self,
        refs: impl IntoIterator<Item = ObjectRef<O>>,
    ) -> Result<Vec<O>, Error> {
        let indexes: Vec<u32> = refs.into_iter().map(|r| r.index).collect();
        let outcomes: Vec<(String, u32, Result<Value, String>, u32)> = match &self.backend {
            Backend::Local { pool, jobs } => {
                let ids = {
                    let jobs = jobs.borrow();
                    indexes
                        .iter()
                        .map(|i| {
                            jobs.get(i).copied().ok_or_else(|| {
                                format!("task #{i} was not submitted through this runtime")
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?
                };
                let done = pool.wait(&ids)?;
                indexes
                    .iter()
                    .zip(done)
                    .map(|(i, d)| (d.task.to_string(), *i, d.outcome, d.tries))
                    .collect()
            }
            Backend::Fleet(f) => f.borrow_mut().wait(&indexes)?,
        };
        outcomes
            .into_iter()
            .map(|(task, index, outcome, tries)| match outcome {
                Ok(v) => serde_json::from_value(v).map_err(|e| {
                    Error::from(format!(
                        "task {task} #{index}: its output does not decode as {}: {e}",
                        std::any::type_name::<O>()
                    ))
                }),
                Err(error) => Err(Error::from(TaskFailed::new(task, index, tries, error))),
            })
            .collect()
    }
}
