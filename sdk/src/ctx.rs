//! `Ctx`: what a step knows about where it runs.

use std::fmt::Display;
use std::io::Write;
use std::sync::{Arc, Mutex};

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

/// A step's context.
pub struct Ctx {
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
}

impl Ctx {
    /// Writes a line tagged with the step and partition to standard output
    /// and to the attempt's log.
    pub fn log(&self, message: impl Display) {
        self.log.line(&format!(
            "[{} {} #{}] {message}",
            self.step, self.partition, self.attempt
        ));
    }
}
