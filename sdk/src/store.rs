//! Where step states and outputs live: in memory for `run`, in the control
//! plane for `attempt`.

use std::collections::HashMap;

use orca_client::Control;
use orca_core::api::{LeaseToken, StepStatus};
use serde_json::Value;

use crate::error::SdkError;

/// What is known of one (step, partition).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredState {
    pub status: String,
    pub attempts: u32,
    pub code: Option<String>,
    pub input_hash: Option<String>,
    pub output: Option<Value>,
}

/// The states of a run's (step, partition) pairs.
pub trait Store {
    fn state(&self, step: &str, partition: &str) -> Option<&StoredState>;
    /// Records a new attempt of the pair; returns its number, from 1.
    fn started(&mut self, step: &str, partition: &str) -> Result<u32, SdkError>;
    fn succeeded(
        &mut self,
        step: &str,
        partition: &str,
        code: &str,
        input_hash: &str,
        output: &Value,
    ) -> Result<(), SdkError>;
    fn failed(&mut self, step: &str, partition: &str, error: &str) -> Result<(), SdkError>;
    /// Pins the snapshot a (step, partition) reads of a dataset: `current` on
    /// the first read of the run, the pinned one ever after.
    fn pin_read(
        &mut self,
        step: &str,
        partition: &str,
        dataset: &str,
        current: Option<i64>,
    ) -> Result<Option<i64>, SdkError>;
    /// Records a snapshot a (step, partition) committed, as its n-th commit.
    fn record_commit(
        &mut self,
        step: &str,
        partition: &str,
        dataset: &str,
        snapshot: i64,
        commit_no: u32,
        operation: &str,
    ) -> Result<(), SdkError>;
    /// What the control plane asks of this attempt now. An in-memory run
    /// is never paused or cancelled from outside.
    fn attempt_state(&mut self) -> Result<AttemptState, SdkError> {
        Ok(AttemptState::Running)
    }
    /// Where a (step, partition)'s long-running work resumes, kept across
    /// runs of the pipeline.
    fn resume_point(&mut self, step: &str, partition: &str) -> Result<Option<String>, SdkError>;
    /// Records (or, with `None`, forgets) where it resumes.
    fn record_resume_point(
        &mut self,
        step: &str,
        partition: &str,
        location: Option<&str>,
    ) -> Result<(), SdkError>;
}

/// What the control plane asks of a running attempt (`orca.attempt_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptState {
    /// Go on.
    Running,
    /// The pipeline is paused: stop at a resume point and wait.
    Paused,
    /// The run was cancelled: stop.
    Cancelled,
    /// The lease is no longer live (lost, finished, handed back): stop.
    Ended,
}

impl AttemptState {
    fn parse(s: &str) -> Result<AttemptState, SdkError> {
        Ok(match s {
            "running" => AttemptState::Running,
            "paused" => AttemptState::Paused,
            "cancelled" => AttemptState::Cancelled,
            "ended" => AttemptState::Ended,
            other => {
                return Err(SdkError::Control(format!(
                    "orca.attempt_state said {other:?}, which this SDK does not know"
                )))
            }
        })
    }
}

fn key(step: &str, partition: &str) -> (String, String) {
    (step.to_string(), partition.to_string())
}

/// States in memory: an in-memory run, and tests. Reads are pinned across
/// the run's retries; commits are kept but, with no run id, never recognised.
#[derive(Debug, Default, Clone)]
pub struct MemStore {
    pub states: HashMap<(String, String), StoredState>,
    pub pins: HashMap<(String, String, String), Option<i64>>,
    pub commits: Vec<(String, String, String, i64, u32)>,
    pub resume: HashMap<(String, String), String>,
}

impl Store for MemStore {
    fn state(&self, step: &str, partition: &str) -> Option<&StoredState> {
        self.states.get(&key(step, partition))
    }

    fn started(&mut self, step: &str, partition: &str) -> Result<u32, SdkError> {
        let s = self.states.entry(key(step, partition)).or_default();
        s.status = "running".into();
        s.attempts += 1;
        Ok(s.attempts)
    }

    fn succeeded(
        &mut self,
        step: &str,
        partition: &str,
        code: &str,
        input_hash: &str,
        output: &Value,
    ) -> Result<(), SdkError> {
        let s = self.states.entry(key(step, partition)).or_default();
        s.status = "succeeded".into();
        s.code = Some(code.into());
        s.input_hash = Some(input_hash.into());
        s.output = Some(output.clone());
        Ok(())
    }

    fn failed(&mut self, step: &str, partition: &str, _error: &str) -> Result<(), SdkError> {
        self.states.entry(key(step, partition)).or_default().status = "failed".into();
        Ok(())
    }

    fn pin_read(
        &mut self,
        step: &str,
        partition: &str,
        dataset: &str,
        current: Option<i64>,
    ) -> Result<Option<i64>, SdkError> {
        Ok(*self
            .pins
            .entry((step.to_string(), partition.to_string(), dataset.to_string()))
            .or_insert(current))
    }

    fn record_commit(
        &mut self,
        step: &str,
        partition: &str,
        dataset: &str,
        snapshot: i64,
        commit_no: u32,
        _operation: &str,
    ) -> Result<(), SdkError> {
        self.commits.push((
            step.to_string(),
            partition.to_string(),
            dataset.to_string(),
            snapshot,
            commit_no,
        ));
        Ok(())
    }

    fn resume_point(&mut self, step: &str, partition: &str) -> Result<Option<String>, SdkError> {
        Ok(self.resume.get(&key(step, partition)).cloned())
    }

    fn record_resume_point(
        &mut self,
        step: &str,
        partition: &str,
        location: Option<&str>,
    ) -> Result<(), SdkError> {
        match location {
            Some(l) => self.resume.insert(key(step, partition), l.to_string()),
            None => self.resume.remove(&key(step, partition)),
        };
        Ok(())
    }
}

/// What the control plane says about a leased attempt.
pub use orca_core::api::AttemptContext;

/// States in the control plane, for an attempt a runner leased. Its
/// connection outlives a server restart (`orca_client::Control`).
pub struct PgStore {
    control: Control,
    lease: LeaseToken,
    states: MemStore,
    pub context: AttemptContext,
}

impl PgStore {
    /// Connects, takes the attempt's context and records this binary's build.
    pub fn connect(
        url: &str,
        org: Option<&str>,
        lease: LeaseToken,
        build: &Value,
    ) -> Result<PgStore, SdkError> {
        let mut control = Control::connect(url, org)?;
        let context = control.attempt_context(lease, build)?;
        let mut states = MemStore::default();
        for s in &context.states {
            states.states.insert(
                key(&s.step, &s.partition),
                StoredState {
                    status: s.status.name().to_string(),
                    attempts: s.attempts,
                    code: s.code.clone(),
                    input_hash: s.input_hash.clone(),
                    output: s.output.clone().filter(|o| !o.is_null()),
                },
            );
        }
        Ok(PgStore {
            control,
            lease,
            states,
            context,
        })
    }
}

impl Store for PgStore {
    fn state(&self, step: &str, partition: &str) -> Option<&StoredState> {
        self.states.state(step, partition)
    }

    fn started(&mut self, step: &str, partition: &str) -> Result<u32, SdkError> {
        let n = self.control.report_step(
            self.lease,
            step,
            partition,
            StepStatus::Running,
            None,
            None,
            None,
            None,
        )?;
        let s = self.states.states.entry(key(step, partition)).or_default();
        s.status = "running".into();
        s.attempts = n;
        Ok(s.attempts)
    }

    fn succeeded(
        &mut self,
        step: &str,
        partition: &str,
        code: &str,
        input_hash: &str,
        output: &Value,
    ) -> Result<(), SdkError> {
        self.control.report_step(
            self.lease,
            step,
            partition,
            StepStatus::Succeeded,
            None,
            Some(output),
            Some(code),
            Some(input_hash),
        )?;
        self.states
            .succeeded(step, partition, code, input_hash, output)
    }

    fn failed(&mut self, step: &str, partition: &str, error: &str) -> Result<(), SdkError> {
        self.control.report_step(
            self.lease,
            step,
            partition,
            StepStatus::Failed,
            Some(error),
            None,
            None,
            None,
        )?;
        self.states.failed(step, partition, error)
    }

    fn pin_read(
        &mut self,
        step: &str,
        partition: &str,
        dataset: &str,
        current: Option<i64>,
    ) -> Result<Option<i64>, SdkError> {
        Ok(self
            .control
            .pin_read(self.lease, step, partition, dataset, current)?)
    }

    fn record_commit(
        &mut self,
        step: &str,
        partition: &str,
        dataset: &str,
        snapshot: i64,
        commit_no: u32,
        operation: &str,
    ) -> Result<(), SdkError> {
        Ok(self.control.record_commit(
            self.lease, step, partition, dataset, snapshot, commit_no, operation,
        )?)
    }

    fn attempt_state(&mut self) -> Result<AttemptState, SdkError> {
        AttemptState::parse(&self.control.attempt_state(self.lease)?)
    }

    fn resume_point(&mut self, step: &str, partition: &str) -> Result<Option<String>, SdkError> {
        Ok(self.control.resume_point(self.lease, step, partition)?)
    }

    fn record_resume_point(
        &mut self,
        step: &str,
        partition: &str,
        location: Option<&str>,
    ) -> Result<(), SdkError> {
        self.control
            .record_resume_point(self.lease, step, partition, location)?;
        Ok(())
    }
}
