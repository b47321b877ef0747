//! Fleet mode: tasks become rows of the control plane, added in batches
//! under the attempt's lease (`orca.add_tasks`) and claimed by the runners
//! of the pipeline's pool; the driver reads their results
//! (`orca.task_results`) when `NOTIFY orca_task_results` says a batch
//! finished, and polls as a fallback.

use std::collections::HashMap;
use std::time::Duration;

use orca_client::Control;
use orca_core::api::LeaseToken;
use serde_json::Value;

use crate::error::{Error, SdkError};

/// Tasks are sent in batches of at most this many: one row, one event and
/// one call each.
const BATCH_MAX: usize = 500;
/// How long the driver waits for a notification before it asks for results
/// anyway: from the first wait up to the last, doubling.
const POLL_FIRST: Duration = Duration::from_millis(2);
const POLL_MAX: Duration = Duration::from_millis(250);
/// How long without a new result before the driver reads every result again
/// (a batch can commit below the seq it has read).
const REREAD_AFTER: Duration = Duration::from_secs(2);

pub(crate) struct Fleet {
    control: Control,
    lease: LeaseToken,
    step: String,
    partition: String,
    /// Submitted and not yet sent: (task, index, input), in index order.
    unsent: Vec<(&'static str, u32, Value)>,
    /// Results read so far: index -> (task, outcome, tries).
    results: HashMap<u32, (Result<Value, String>, u32)>,
    /// Task names by index, for the errors.
    names: HashMap<u32, &'static str>,
    /// The largest result seq read.
    seq: i64,
}

impl Fleet {
    /// A connection of its own: the step's store keeps the attempt's.
    pub(crate) fn connect(
        database_url: &str,
        org: Option<&str>,
        lease: LeaseToken,
        step: &str,
        partition: &str,
    ) -> Result<Fleet, Error> {
        let control = Control::connect(database_url, org).map_err(SdkError::from)?;
        Ok(Fleet {
            control,
            lease,
            step: step.to_string(),
            partition: partition.to_string(),
            unsent: Vec::new(),
            results: HashMap::new(),
            names: HashMap::new(),
            seq: 0,
        })
    }

    pub(crate) fn submit(
        &mut self,
        task: &'static str,
        first: u32,
        inputs: Vec<Value>,
    ) -> Result<(), Error> {
        for (k, input) in inputs.into_iter().enumerate() {
            let index = first + k as u32;
            self.names.insert(index, task);
            self.unsent.push((task, index, input));
        }
        if self.unsent.len() >= BATCH_MAX {
            self.flush()?;
        }
        Ok(())
    }

    /// Sends what was submitted, a batch per run of the same task.
    fn flush(&mut self) -> Result<(), Error> {
        let unsent = std::mem::take(&mut self.unsent);
        let mut rest = unsent.as_slice();
        while let Some((task, first, _)) = rest.first() {
            let n = rest
                .iter()
                .take(BATCH_MAX)
                .take_while(|(t, _, _)| t == task)
                .count();
            let inputs = Value::Array(rest[..n].iter().map(|(_, _, v)| v.clone()).collect());
            self.control
                .add_tasks(
                    self.lease,
                    &self.step,
                    &self.partition,
                    task,
                    *first,
                    &inputs,
                )
                .map_err(SdkError::from)?;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Waits for the results of `indexes`: (task, index, outcome, tries).
    #[allow(clippy::type_complexity)]
    pub(crate) fn wait(
        &mut self,
        indexes: &[u32],
    ) -> Result<Vec<(String, u32, Result<Value, String>, u32)>, Error> {
        self.flush()?;
        let mut pause = POLL_FIRST;
        let mut last_new = std::time::Instant::now();
        while !indexes.iter().all(|i| self.results.contains_key(i)) {
            // Batches finishing at once take their seqs in one order and may
            // commit in the other: a batch that committed after a higher seq
            // was read is below `seq`. Waiting a while for nothing, the
            // driver reads everything again and keeps what it lacked.
            let from = if last_new.elapsed() >= REREAD_AFTER {
                last_new = std::time::Instant::now();
                0
            } else {
                self.seq
            };
            let got: Vec<_> = self
                .control
                .task_results(self.lease, &self.step, &self.partition, from)
                .map_err(SdkError::from)?
                .into_iter()
                .filter(|r| !self.results.contains_key(&r.index))
                .collect();
            if got.is_empty() {
                // A finished batch of this run (or another) notifies; the
                // wait is also the fallback poll's pause.
                if !self
                    .control
                    .wait_for("orca_task_results", pause)
                    .map_err(SdkError::from)?
                {
                    pause = (pause * 2).min(POLL_MAX);
                }
                continue;
            }
            pause = POLL_FIRST;
            last_new = std::time::Instant::now();
            for r in got {
                self.seq = self.seq.max(r.seq);
                self.results.insert(r.index, (r.outcome, r.tries));
            }
        }
        Ok(indexes
            .iter()
            .map(|i| {
                let (outcome, tries) = self
                    .results
                    .get(i)
                    .cloned()
                    .unwrap_or((Err("no result".into()), 0));
                let task = self.names.get(i).copied().unwrap_or("?").to_string();
                (task, *i, outcome, tries)
            })
            .collect())
    }
}
