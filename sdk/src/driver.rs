//! The run's driver: runs the steps in order over the run's partitions,
//! skipping (step, partition) pairs that already succeeded with the same code
//! and input, and handing each step the stored outputs of the step it follows.

use std::panic::{catch_unwind, AssertUnwindSafe};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ctx::{Ctx, LogSink, StepIo};
use crate::error::SdkError;
use crate::pipeline::{registry_hash, Partitioning, StepInfo};
use crate::step::StepError;
use crate::store::Store;
use crate::tasks::TaskInfo;
use orca_lake::{LakeCell, LakeConfig};

/// The partition a gather step's state is kept under.
pub const GATHER: &str = "*";

#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    /// Ran and succeeded, after this many attempts of this run attempt.
    Ran {
        attempts: u32,
    },
    /// Succeeded before with the same code and input: not run again.
    Skipped,
    Failed {
        attempts: u32,
        error: String,
    },
}

#[derive(Debug, Clone)]
pub struct StepReport {
    pub step: &'static str,
    pub partition: String,
    pub result: StepResult,
}

/// How a run (or an attempt of one) went.
#[derive(Debug)]
pub struct Outcome {
    pub reports: Vec<StepReport>,
    pub error: Option<SdkError>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

fn input_hash(input: &Value) -> String {
    // serde_json keeps object keys sorted, so equal values hash equally.
    let mut h = Sha256::new();
    h.update(input.to_string().as_bytes());
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The stored output of a (step, partition) that must have succeeded.
fn output_of(store: &dyn Store, step: &str, partition: &str) -> Result<Value, SdkError> {
    store
        .state(step, partition)
        .filter(|s| s.status == "succeeded")
        .and_then(|s| s.output.clone())
        .ok_or_else(|| {
            SdkError::Control(format!("no stored output of step {step} for {partition}"))
        })
}

/// The inputs of one step: (partition, input) pairs.
fn inputs(
    step: &StepInfo,
    steps: &[StepInfo],
    partitions: &[String],
    store: &dyn Store,
) -> Result<Vec<(String, Value)>, SdkError> {
    let prev = match step.after {
        None => None,
        Some(a) => Some(
            steps
                .iter()
                .find(|s| s.name == a)
                .ok_or_else(|| SdkError::Invalid {
                    pipeline: String::new(),
                    reason: format!("step {} follows unknown step {a}", step.name),
                })?,
        ),
    };
    Ok(match (step.is_mapped(), prev) {
        (true, None) => partitions
            .iter()
            .map(|p| (p.clone(), Value::String(p.clone())))
            .collect(),
        (false, None) => vec![(
            GATHER.to_string(),
            Value::Array(partitions.iter().cloned().map(Value::String).collect()),
        )],
        (true, Some(prev)) if prev.is_mapped() => partitions
            .iter()
            .map(|p| Ok((p.clone(), output_of(store, prev.name, p)?)))
            .collect::<Result<_, SdkError>>()?,
        (false, Some(prev)) if prev.is_mapped() => vec![(
            GATHER.to_string(),
            Value::Array(
                partitions
                    .iter()
                    .map(|p| output_of(store, prev.name, p))
                    .collect::<Result<_, _>>()?,
            ),
        )],
        (false, Some(prev)) => vec![(GATHER.to_string(), output_of(store, prev.name, GATHER)?)],
        (true, Some(prev)) => {
            return Err(SdkError::Invalid {
                pipeline: String::new(),
                reason: format!(
                    "mapped step {} cannot follow gather step {}",
                    step.name, prev.name
                ),
            })
        }
    })
}

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// What every step of one run shares.
struct RunEnv<'a> {
    pipeline: &'static str,
    partitions: &'a [String],
    log: &'a LogSink,
    run: Option<i64>,
    registry_hash: String,
    tables: LakeCell,
    partitioning: Option<Partitioning>,
}

/// Runs one (step, partition) with its retries.
fn run_pair(
    env: &RunEnv<'_>,
    step: &StepInfo,
    partition: &str,
    input: &Value,
    store: &mut dyn Store,
) -> Result<StepResult, SdkError> {
    let log = env.log;
    let hash = input_hash(input);
    if let Some(s) = store.state(step.name, partition) {
        if s.status == "succeeded"
            && s.code.as_deref() == Some(step.code)
            && s.input_hash.as_deref() == Some(hash.as_str())
        {
            log.line(&format!(
                "[{} {partition}] succeeded before with the same code and input: skipped",
                step.name
            ));
            return Ok(StepResult::Skipped);
        }
    }
    let mut tries = 0;
    loop {
        tries += 1;
        let attempt = store.started(step.name, partition)?;
        let mut ctx = Ctx {
            pipeline: env.pipeline,
            step: step.name,
            partition: partition.to_string(),
            partitions: env.partitions.to_vec(),
            attempt,
            run: env.run,
            log: log.clone(),
            io: StepIo {
                store: &mut *store,
                tables: &env.tables,
                reads: step.reads,
                writes: step.writes,
                registry_hash: &env.registry_hash,
                commits: Default::default(),
                read: Default::default(),
                partitioning: env.partitioning,
                session: None,
                scans: Default::default(),
            },
            tasks: Default::default(),
        };
        let result = catch_unwind(AssertUnwindSafe(|| (step.run)(&mut ctx, input.clone())))
            .unwrap_or_else(|p| {
                Err(StepError::Failed(format!(
                    "panicked: {}",
                    panic_message(p.as_ref())
                )))
            });
        drop(ctx);
        let tag = format!("[{} {partition} #{attempt}]", step.name);
        match result {
            Ok(output) => {
                store.succeeded(step.name, partition, step.code, &hash, &output)?;
                return Ok(StepResult::Ran { attempts: tries });
            }
            Err(StepError::Codec(e)) => {
                let msg = e.to_string();
                log.line(&format!("{tag} failed: {msg}"));
                store.failed(step.name, partition, &msg)?;
                return Ok(StepResult::Failed {
                    attempts: tries,
                    error: msg,
                });
            }
            Err(StepError::StoreUnavailable(msg)) => {
                // Left running: the next attempt runs it again, as it does a
                // step whose process was killed.
                log.line(&format!(
                    "{tag} the object store did not answer: {msg}; handing the attempt back"
                ));
                return Err(SdkError::StoreUnavailable(msg));
            }
            Err(StepError::Failed(msg)) => {
                if tries <= step.retries {
                    log.line(&format!(
                        "{tag} failed, retrying ({} of {} retries): {msg}",
                        tries, step.retries
                    ));
                    continue;
                }
                log.line(&format!("{tag} failed: {msg}"));
                store.failed(step.name, partition, &msg)?;
                return Ok(StepResult::Failed {
                    attempts: tries,
                    error: msg,
                });
            }
        }
    }
}

/// The most memory this process has held (its peak resident set), in KiB,
/// where the system says (Linux's `/proc/self/status`).
pub fn peak_memory_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Runs every step over `partitions`. A step that fails for some partition
/// stops the run after the step has been tried for every partition.
/// `partitioning` is the pipeline's, which tables its steps create follow.
/// `tasks` are the pipeline's, part of its registry hash. The log's last
/// line says the process's peak memory.
#[allow(clippy::too_many_arguments)]
pub fn execute(
    pipeline: &'static str,
    partitioning: Option<Partitioning>,
    steps: &[StepInfo],
    tasks: &[TaskInfo],
    partitions: &[String],
    store: &mut dyn Store,
    log: &LogSink,
    run: Option<i64>,
) -> Outcome {
    let outcome = execute_steps(
        pipeline,
        partitioning,
        steps,
        tasks,
        partitions,
        store,
        log,
        run,
    );
    if let Some(kib) = peak_memory_kib() {
        log.line(&format!("peak memory {} MiB", kib.div_ceil(1024)));
    }
    outcome
}

#[allow(clippy::too_many_arguments)]
fn execute_steps(
    pipeline: &'static str,
    partitioning: Option<Partitioning>,
    steps: &[StepInfo],
    tasks: &[TaskInfo],
    partitions: &[String],
    store: &mut dyn Store,
    log: &LogSink,
    run: Option<i64>,
) -> Outcome {
    let env = RunEnv {
        pipeline,
        partitions,
        log,
        run,
        registry_hash: registry_hash(steps, tasks),
        tables: LakeCell::new(LakeConfig::from_env(None)),
        partitioning,
    };
    let mut reports = Vec::new();
    for step in steps {
        let pairs = match inputs(step, steps, partitions, store) {
            Ok(p) => p,
            Err(e) => {
                return Outcome {
                    reports,
                    error: Some(e),
                }
            }
        };
        let mut first_failure = None;
        for (partition, input) in pairs {
            let result = match run_pair(&env, step, &partition, &input, store) {
                Ok(r) => r,
                Err(e) => {
                    return Outcome {
                        reports,
                        error: Some(e),
                    }
                }
            };
            if let (StepResult::Failed { error, .. }, None) = (&result, &first_failure) {
                first_failure = Some(SdkError::StepFailed {
                    step: step.name.to_string(),
                    partition: partition.clone(),
                    error: error.clone(),
                });
            }
            reports.push(StepReport {
                step: step.name,
                partition,
                result,
            });
        }
        if let Some(e) = first_failure {
            return Outcome {
                reports,
                error: Some(e),
            };
        }
    }
    Outcome {
        reports,
        error: None,
    }
}
