//! Where step states and outputs live: in memory for `run`, in the control
//! plane for `attempt`.

use std::collections::HashMap;

use serde_json::{json, Value};
use uuid::Uuid;

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
}

/// What the control plane says about a leased attempt.
#[derive(Debug, Clone)]
pub struct AttemptContext {
    pub org: String,
    pub pipeline: String,
    pub run: i64,
    pub attempt: i64,
    pub version: i64,
    pub registry_hash: String,
    pub partitions: Vec<String>,
}

/// States in the control plane, for an attempt a runner leased.
pub struct PgStore {
    client: postgres::Client,
    lease: Uuid,
    states: MemStore,
    pub context: AttemptContext,
}

impl PgStore {
    /// Connects, takes the attempt's context and records this binary's build.
    pub fn connect(
        url: &str,
        org: Option<&str>,
        lease: Uuid,
        build: &Value,
    ) -> Result<PgStore, SdkError> {
        let mut client = postgres::Client::connect(url, postgres::NoTls)?;
        if let Some(org) = org {
            client.execute("SELECT set_config('orca.org', $1, false)", &[&org])?;
        }
        let ctx: Value = client
            .query_one("SELECT orca.attempt_context($1, $2)", &[&lease, build])?
            .try_get(0)?;
        let field = |k: &str| ctx.get(k).cloned().unwrap_or(Value::Null);
        let context = AttemptContext {
            org: field("org").as_str().unwrap_or_default().to_string(),
            pipeline: field("pipeline").as_str().unwrap_or_default().to_string(),
            run: field("run").as_i64().unwrap_or_default(),
            attempt: field("attempt").as_i64().unwrap_or_default(),
            version: field("version").as_i64().unwrap_or_default(),
            registry_hash: field("registry_hash")
                .as_str()
                .unwrap_or_default()
                .to_string(),
            partitions: serde_json::from_value(field("partitions")).map_err(|e| {
                SdkError::Control(format!("attempt context has no partitions: {e}"))
            })?,
        };
        let mut states = MemStore::default();
        for s in field("states").as_array().into_iter().flatten() {
            let step = s["step"].as_str().unwrap_or_default();
            let partition = s["partition"].as_str().unwrap_or_default();
            states.states.insert(
                key(step, partition),
                StoredState {
                    status: s["status"].as_str().unwrap_or_default().to_string(),
                    attempts: u32::try_from(s["attempts"].as_i64().unwrap_or(0)).unwrap_or(0),
                    code: s["code"].as_str().map(str::to_string),
                    input_hash: s["input_hash"].as_str().map(str::to_string),
                    output: s.get("output").filter(|o| !o.is_null()).cloned(),
                },
            );
        }
        Ok(PgStore {
            client,
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
        let n: i32 = self
            .client
            .query_one(
                "SELECT orca.report_step($1, $2, $3, 'running')",
                &[&self.lease, &step, &partition],
            )?
            .try_get(0)?;
        let s = self.states.states.entry(key(step, partition)).or_default();
        s.status = "running".into();
        s.attempts = u32::try_from(n).unwrap_or(0);
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
        self.client.query_one(
            "SELECT orca.report_step($1, $2, $3, 'succeeded', output => $4, code => $5, input_hash => $6)",
            &[&self.lease, &step, &partition, output, &code, &input_hash],
        )?;
        self.states
            .succeeded(step, partition, code, input_hash, output)
    }

    fn failed(&mut self, step: &str, partition: &str, error: &str) -> Result<(), SdkError> {
        self.client.query_one(
            "SELECT orca.report_step($1, $2, $3, 'failed', error => $4)",
            &[&self.lease, &step, &partition, &error],
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
            .client
            .query_one(
                "SELECT orca.pin_read($1, $2, $3, $4, $5)",
                &[&self.lease, &step, &partition, &dataset, &current],
            )?
            .try_get(0)?)
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
        let n = i32::try_from(commit_no).unwrap_or(i32::MAX);
        self.client.execute(
            "SELECT orca.record_commit($1, $2, $3, $4, $5, $6, $7)",
            &[
                &self.lease,
                &step,
                &partition,
                &dataset,
                &snapshot,
                &n,
                &operation,
            ],
        )?;
        Ok(())
    }
}

/// The build metadata a binary reports with each attempt.
pub fn build_json(registry_hash: &str, build: &crate::pipeline::Build) -> Value {
    json!({
        "registry_hash": registry_hash,
        "source": build.source,
        "commit": build.commit,
        "dirty": build.dirty(),
        "image": build.image,
    })
}
