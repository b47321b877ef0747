//! `Ctx`: what a step knows about where it runs, and its way to the tables.

use std::collections::HashMap;
use std::fmt::Display;
use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::partitioning::Partitioning;
use crate::store::Store;
use orca_lake::query::ScanLog;
use orca_lake::LakeCell;

/// Where `ctx.log` lines go besides standard output.
#[derive(Clone, Default)]
pub struct LogSink {
    file: Option<Arc<Mutex<std::fs::File>>>,
}

impl LogSink {
    /// Standard output only: a runner captures it into the attempt's log file.
    pub fn stdout() -> Self {
        LogSink { file: None }
    }

    /// Standard output and a file (an in-memory `run` has no runner).
    pub fn with_file(file: std::fs::File) -> Self {
        LogSink {
            file: Some(Arc::new(Mutex::new(file))),
        }
    }

    pub fn line(&self, line: &str) {
        println!("{line}");
        if let Some(f) = &self.file {
            if let Ok(mut f) = f.lock() {
                let _ = writeln!(f, "{line}");
            }
        }
    }
}

/// What a step's table operations need: the store that pins reads and
/// records commits, the catalog, and what the step declared.
pub(crate) struct StepIo<'a> {
    pub store: &'a mut dyn Store,
    pub tables: &'a LakeCell,
    pub reads: &'static [&'static str],
    pub writes: &'static [&'static str],
    pub registry_hash: &'a str,
    /// Commits made so far in this call, per dataset: the next commit's number.
    pub commits: HashMap<String, u32>,
    /// Snapshots this call read, per dataset: recorded with its commits.
    pub read: HashMap<String, Option<i64>>,
    /// The pipeline's partitioning, which a table it creates follows.
    pub partitioning: Option<Partitioning>,
    /// The step's query session (scans and SQL), made on first use.
    pub session: Option<datafusion::prelude::SessionContext>,
    /// The plans of the scans its queries made, until they are logged.
    pub scans: ScanLog,
}

/// A step's context.
pub struct Ctx<'a> {
    /// The pipeline's name.
    pub pipeline: &'static str,
    /// The step running.
    pub step: &'static str,
    /// This step's partition key, or `*` for a gather step.
    pub partition: String,
    /// Every partition of the run, in order.
    pub partitions: Vec<String>,
    /// Which attempt of this (step, partition) this is, from 1.
    pub attempt: u32,
    /// The run's id in the control plane (`None` for an in-memory run).
    pub run: Option<i64>,
    pub(crate) log: LogSink,
    pub(crate) io: StepIo<'a>,
    /// Numbers the tasks this call submits.
    pub(crate) tasks: crate::tasks::Scope,
}

impl Ctx<'_> {
    /// Writes a line tagged with the step and partition to standard output
    /// and to the attempt's log.
    pub fn log(&self, message: impl Display) {
        self.log.line(&format!("{} {message}", self.tag()));
    }

    /// The runtime of a set of tasks (`orca::tasks!`): submit them with
    /// `remote`, gather their outputs with `get`. Refused when the pipeline
    /// does not declare every task of the set (`tasks = ...`).
    pub fn runtime<S: crate::tasks::TaskSet>(&self) -> crate::Result<crate::tasks::Runtime<S>> {
        crate::tasks::runtime::<S>(self.step, &self.partition, self.tasks.clone())
    }

    /// What each of its log lines starts with: `[step partition #attempt]`.
    pub(crate) fn tag(&self) -> String {
        format!("[{} {} #{}]", self.step, self.partition, self.attempt)
    }
}
