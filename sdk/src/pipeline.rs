//! The `Pipeline` trait that `orca::pipeline!` implements, and what a
//! pipeline says about itself at run time.

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ctx::Ctx;
use crate::keys::PartitionKey;
pub use crate::partitioning::Partitioning;
use crate::step::{Kind, Step, StepError};
use crate::tasks::TaskInfo;

/// Which partition a scheduled fire fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fills {
    /// The partition before the fire's (a run on the 2nd fills last month).
    Previous,
    /// The partition the fire falls in.
    Current,
}

/// Where the binary was built from, set at build time by the environment
/// variables `ORCA_SOURCE`, `ORCA_COMMIT`, `ORCA_DIRTY` and `ORCA_IMAGE`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Build {
    pub source: Option<&'static str>,
    pub commit: Option<&'static str>,
    pub dirty: Option<&'static str>,
    pub image: Option<&'static str>,
}

impl Build {
    pub fn dirty(&self) -> Option<bool> {
        self.dirty.map(|d| matches!(d.trim(), "1" | "true" | "yes"))
    }

    /// What a binary reports of itself with each attempt
    /// (`orca.attempt_context`'s build).
    pub fn to_json(&self, registry_hash: &str) -> serde_json::Value {
        serde_json::json!({
            "registry_hash": registry_hash,
            "source": self.source,
            "commit": self.commit,
            "dirty": self.dirty(),
            "image": self.image,
        })
    }
}

/// A pipeline's parameters, as declared next to its steps.
#[derive(Debug, Clone)]
pub struct Params {
    pub partitions: Partitioning,
    /// How many keys one run of a keyed pipeline covers (default 100).
    pub keys_per_run: Option<i64>,
    /// How many months or days one run of a backfill covers (default one):
    /// each run is one attempt, whose steps go through its partitions in
    /// turn, so the process, the lease and the tables' metadata are paid
    /// once per run rather than once per partition.
    pub backfill_per_run: Option<i64>,
    /// (cron expression, time zone).
    pub schedule: Option<(&'static str, &'static str)>,
    pub fills: Fills,
    pub max_runs: Option<i64>,
    pub run_retries: i64,
    pub catchup: bool,
    pub pool: &'static str,
    /// Runs when a dataset it reads, and does not write, gets a new snapshot.
    pub sensor: bool,
    pub resources: Resources,
    pub build: Build,
}

/// The size of each attempt (`memory = "2Gi"`, `cpu = "1"`, `max_memory`,
/// `memory_growth` in `orca::pipeline!`), as Kubernetes writes quantities.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resources {
    pub cpu: Option<&'static str>,
    pub memory: Option<&'static str>,
    pub max_memory: Option<&'static str>,
    pub memory_growth: Option<f64>,
}

/// A pipeline, as `orca::pipeline!` declares it.
pub trait Pipeline {
    type Key: PartitionKey;
    const NAME: &'static str;
    fn params() -> Params;
    fn steps() -> Vec<StepInfo>;
    /// The tasks its steps may fan out (`tasks = ...`).
    fn tasks() -> Vec<TaskInfo> {
        Vec::new()
    }
}

/// A step with its types erased, for the driver.
#[derive(Clone)]
pub struct StepInfo {
    pub name: &'static str,
    pub id: &'static str,
    pub kind: &'static str,
    /// The step it follows (resolved: the one listed before, unless `after`).
    pub after: Option<&'static str>,
    pub retries: u32,
    pub code: &'static str,
    pub reads: &'static [&'static str],
    pub writes: &'static [&'static str],
    pub run: fn(&mut Ctx<'_>, Value) -> Result<Value, StepError>,
}

impl StepInfo {
    pub fn of<S: Step>(after: Option<&'static str>) -> Self {
        StepInfo {
            name: S::NAME,
            id: S::ID,
            kind: <S::Kind as Kind>::NAME,
            after,
            retries: S::RETRIES,
            code: S::CODE,
            reads: S::READS,
            writes: S::WRITES,
            run: crate::step::run_erased::<S>,
        }
    }

    pub fn is_mapped(&self) -> bool {
        self.kind == "mapped"
    }
}

/// The registry hash: every step's code, kind and edge, in order, then
/// every task's name and code. Build metadata (source, commit, dirty,
/// image) is not part of it; a pipeline without tasks hashes as it did
/// before tasks existed.
pub fn registry_hash(steps: &[StepInfo], tasks: &[TaskInfo]) -> String {
    let mut h = Sha256::new();
    for s in steps {
        h.update(s.name.as_bytes());
        h.update(b"\0");
        h.update(s.kind.as_bytes());
        h.update(b"\0");
        h.update(s.after.unwrap_or("").as_bytes());
        h.update(b"\0");
        h.update(s.code.as_bytes());
        h.update(b"\n");
    }
    for t in tasks {
        h.update(b"task\0");
        h.update(t.name.as_bytes());
        h.update(b"\0");
        h.update(t.code.as_bytes());
        h.update(b"\n");
    }
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
