//! What crosses the SQL boundary, as types: the rows and JSON documents the
//! SQL API returns and takes (docs/sql.md), and newtypes for the ids,
//! generations, epochs and lease tokens that travel between SQL, the runner,
//! the pipeline binaries and the engine.
//!
//! Clients read every answer into these types with [`from_json`]: a
//! malformed answer is an error that names the field and the document, never
//! a default. A sync's definition is [`crate::sync::SyncDef`].

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

pub use crate::sync::SyncDef;

/// A document from the control plane that does not have the shape its type
/// says: which document, and serde's account of the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {document} from the control plane: {reason}")]
pub struct Malformed {
    pub document: &'static str,
    pub reason: String,
}

/// Reads `document` (named in the error) into `T`.
pub fn from_json<T: DeserializeOwned>(document: &'static str, v: Value) -> Result<T, Malformed> {
    serde_json::from_value(v).map_err(|e| Malformed {
        document,
        reason: e.to_string(),
    })
}

/// The bound the control plane holds an error or reason text to
/// (`orca.finish`, `orca.report_step`, `orca.release`, a delivery's error):
/// clients cut what they send to it ([`clip`]) rather than be refused.
pub const ERROR_TEXT_MAX: usize = 65536;
/// The longest log line the control plane keeps (`orca.append_log`).
pub const LOG_LINE_MAX: usize = 8192;

/// `text` cut to at most `max` bytes at a character boundary, saying so at
/// its end.
pub fn clip(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let note = format!(" ... [{} bytes cut]", text.len());
    let mut end = max.saturating_sub(note.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}{note}", &text[..end]))
}

/// Whether `name` is an org's name as `orca.create_org` takes it:
/// `[a-z][a-z0-9_-]{0,62}`.
pub fn valid_org_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 63
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

macro_rules! id {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = std::num::ParseIntError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.parse().map($name)
            }
        }
    };
}

id!(
    /// `orca.runs.id`.
    RunId(i64)
);
id!(
    /// `orca.attempts.id` (not the attempt's number within its run).
    AttemptId(i64)
);
id!(
    /// `orca.pipeline_versions.id`.
    VersionId(i64)
);
id!(
    /// A sync's generation: each claim raises it, and fences every attempt
    /// of an older one.
    Generation(i32)
);
id!(
    /// A sync's epoch: HEAD's is the last committed one; 0 before the first.
    Epoch(u64)
);

impl Epoch {
    /// The epoch as SQL's bigint.
    pub fn sql(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

/// A lease token: the capability to act on one leased attempt. Its random
/// half makes it unguessable; its last 64 bits are the attempt's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseToken(pub Uuid);

impl LeaseToken {
    /// The attempt the token names (what `orca._lease_attempt` reads).
    pub fn attempt(self) -> AttemptId {
        let b = self.0.as_bytes();
        let mut tail = [0u8; 8];
        tail.copy_from_slice(&b[8..]);
        AttemptId(i64::from_be_bytes(tail))
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for LeaseToken {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s.trim()).map(LeaseToken)
    }
}

/// What a runner runs for a leased attempt (`orca.lease.command`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Command {
    /// `<binary> attempt`: the run's steps.
    Attempt,
    /// `<binary> sense`: a sensor's poll for outside snapshots.
    Sense,
    /// `<binary> keys`: a keyed pipeline's keys task.
    Keys,
    /// `orca-engine sync`: an attempt of a sync.
    Sync,
    /// `orca-engine discover`: reads a source's catalog for
    /// `orca.discover`.
    Discover,
    /// `orca-engine maintain`: a dataset's table maintenance for
    /// `orca.maintain`.
    Maintain,
}

impl Command {
    pub fn name(self) -> &'static str {
        match self {
            Command::Attempt => "attempt",
            Command::Sense => "sense",
            Command::Keys => "keys",
            Command::Sync => "sync",
            Command::Discover => "discover",
            Command::Maintain => "maintain",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One attempt `orca.claim` leased: a row of type `orca.lease`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub attempt: AttemptId,
    pub run: RunId,
    pub lease: LeaseToken,
    pub pipeline: String,
    pub version: VersionId,
    pub binary_path: String,
    pub partitions: Vec<String>,
    /// The attempt's number within its run, from 1.
    pub attempt_number: i32,
    pub deadline: DateTime<Utc>,
    pub registry_hash: String,
    pub pool: String,
    pub org: String,
    pub command: Command,
    /// The sha256 of the version's binary, which the runner checks before
    /// it runs it (absent from a 0.1.0 control plane, NULL for a version
    /// registered without one, and for syncs).
    #[serde(default)]
    pub binary_sha256: Option<String>,
    /// The attempt's size, when its version declares one (absent from a
    /// control plane before 0.3.0).
    #[serde(default)]
    pub resources: Option<AttemptSize>,
    /// The image the version runs from, when it was registered with one:
    /// what a pod launcher starts the attempt in.
    #[serde(default)]
    pub image: Option<String>,
}

/// The size an attempt got (`orca.attempts.resources`): what its runner
/// holds the child to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AttemptSize {
    #[serde(default)]
    pub cpu_millis: Option<i64>,
    #[serde(default)]
    pub memory_bytes: Option<i64>,
}

/// Why an attempt died, when the runner knows (`orca.finish`'s
/// `killed_for`): killed for memory is retried with more.
pub const KILLED_FOR_MEMORY: &str = "memory";

/// The state of one (step, partition) of a run (`orca.step_states.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Skipped,
    Cancelled,
}

impl StepStatus {
    pub fn name(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Running => "running",
            StepStatus::Succeeded => "succeeded",
            StepStatus::Failed => "failed",
            StepStatus::Skipped => "skipped",
            StepStatus::Cancelled => "cancelled",
        }
    }
}

/// One (step, partition) as `orca.attempt_context` gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepState {
    pub step: String,
    /// `*` for a gather step.
    pub partition: String,
    pub status: StepStatus,
    pub attempts: u32,
    /// What it succeeded with: the step's code hash and its input's hash.
    pub code: Option<String>,
    pub input_hash: Option<String>,
    pub output: Option<Value>,
}

/// What a pipeline binary needs to run a leased attempt
/// (`orca.attempt_context`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptContext {
    pub org: String,
    pub pipeline: String,
    pub run: RunId,
    /// The attempt's number within its run.
    pub attempt: i32,
    /// The version's number within its pipeline.
    pub version: i32,
    pub registry_hash: String,
    pub partitions: Vec<String>,
    pub states: Vec<StepState>,
}

/// What a sensor's poll looks at (`orca.sense_context`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SenseContext {
    pub pipeline: String,
    /// When the sensor started watching: older snapshots count as seen.
    pub since: DateTime<Utc>,
    pub datasets: Vec<String>,
}

/// A snapshot a sensor's poll found (`orca.report_snapshots` takes a list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotSeen {
    pub dataset: String,
    pub snapshot: i64,
    pub timestamp_ms: i64,
    /// The snapshot's `orca.partitions` property, a comma list.
    pub partitions: Option<String>,
    /// The snapshot's `orca.run` property: Orca's own commit.
    pub orca_run: Option<String>,
}

/// What a keys task asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeysMode {
    /// Queue runs for every key that is not done.
    All,
    /// Queue runs for the keys a sensor's snapshot added.
    New,
    /// Only read the keys.
    Refresh,
}

impl KeysMode {
    pub fn name(self) -> &'static str {
        match self {
            KeysMode::All => "all",
            KeysMode::New => "new",
            KeysMode::Refresh => "refresh",
        }
    }
}

/// What a keys task reads and does (`orca.keys_context`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeysContext {
    pub pipeline: String,
    pub run: RunId,
    pub attempt: i32,
    pub registry_hash: String,
    pub mode: KeysMode,
    pub dataset: String,
    pub column: String,
}

/// What `orca.report_keys` did with a keys task's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysReport {
    /// How many keys are current now.
    pub keys: i64,
    /// How many of them the report added.
    pub new: i64,
    /// Whether a newer snapshot had been reported already (the keys stayed).
    pub stale: bool,
    /// The runs the task queued.
    pub runs: Vec<RunId>,
}

/// How a sync's run reads: from its checkpoint, or everything again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// A backfill: every stream read again from its start.
    Full,
}

/// A sync run's request (`orca.runs.request`): `{}` or `{"mode": "full"}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SyncMode>,
}

impl SyncRequest {
    pub fn full(&self) -> bool {
        self.mode == Some(SyncMode::Full)
    }
}

/// What `orca.claim_sync` returns: the new generation and what to recover
/// from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimedSync {
    pub sync: String,
    pub generation: Generation,
    /// HEAD: the last committed epoch and its checkpoint record.
    pub epoch: Epoch,
    pub record: Option<String>,
    pub definition: SyncDef,
    /// The run whose attempt claimed, when a lease was given.
    pub run: Option<RunId>,
    pub request: SyncRequest,
    /// The org's netguard allowlist (`orca.allowlist`): what its connectors
    /// may reach besides public addresses. Absent from a control plane that
    /// predates netguard (0.1.0), whose connections go unchecked; an empty
    /// list refuses every non-public address and every local path.
    #[serde(default)]
    pub allowlist: Option<Vec<String>>,
    /// The catalog version the sync's streams were planned from
    /// (`orca.discover`), which the attempt checks the source against:
    /// `{"version": N, "streams": [...]}`. Absent when none was.
    #[serde(default)]
    pub catalog: Option<Value>,
}

/// What a discovery task (`orca.discovery`) reads: the source of the
/// sync-to-be, as `orca.discover` stored it, and the org's allowlist.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Discovery {
    pub name: String,
    pub source: crate::sync::Source,
    pub allowlist: Vec<String>,
    pub run: RunId,
}

/// What a maintenance run's attempt does (`orca.maintenance_task`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaintenanceTask {
    pub run: RunId,
    pub attempt: i32,
    pub pipeline: String,
    pub dataset: String,
    pub options: MaintenanceOptions,
    /// Snapshots runs that may still read the dataset pinned.
    pub pinned: Vec<i64>,
    /// Sensors watching the dataset, and what each saw.
    pub watchers: Vec<MaintenanceWatcher>,
}

/// The operations of a maintenance run, as `orca._maintenance_options`
/// normalized them: each its settings, or `false` (skipped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaintenanceOptions {
    pub expire: Switch<ExpireSettings>,
    pub orphans: Switch<OrphanSettings>,
    pub compact: Switch<CompactSettings>,
}

/// An operation's settings, or `false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Switch<T> {
    On(T),
    Off(bool),
}

impl<T> Switch<T> {
    pub fn on(&self) -> Option<&T> {
        match self {
            Switch::On(t) => Some(t),
            Switch::Off(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExpireSettings {
    pub keep_last: u64,
    pub older_than_seconds: u64,
    pub grace_seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OrphanSettings {
    pub older_than_seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactSettings {
    pub small_bytes: u64,
    pub min_files: u64,
}

/// A sensor watching a dataset: since when (milliseconds since the epoch),
/// and the snapshots of it it saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaintenanceWatcher {
    pub pipeline: String,
    pub since_ms: i64,
    pub seen: Vec<i64>,
}

/// What one `orca.tick` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TickReport {
    pub now: DateTime<Utc>,
    pub fires: i64,
    pub runs_created: i64,
    pub fires_skipped: i64,
    pub fires_missed: i64,
    pub attempts_lost: i64,
    pub runs_started: i64,
    pub sensor_runs: i64,
    pub sense_polls: i64,
}

#[cfg(test)]
mod tests {
    #[test]
    fn clipped_text_fits_its_bound_and_says_it_was_cut() {
        assert_eq!(clip("short", 10), "short");
        let long = "é".repeat(40_000);
        let c = clip(&long, ERROR_TEXT_MAX);
        assert!(c.len() <= ERROR_TEXT_MAX, "{}", c.len());
        assert!(c.ends_with("[80000 bytes cut]"), "{}", &c[c.len() - 40..]);
        assert!(clip(&"x".repeat(100), 5).len() <= 100);
    }

    use serde_json::json;

    use super::*;

    #[test]
    fn a_lease_token_names_its_attempt() {
        let t: LeaseToken = "6f1c2d3e4f506172000000000000002a".parse().expect("token");
        assert_eq!(t.attempt(), AttemptId(42));
        assert_eq!(t.to_string().parse::<LeaseToken>().expect("round trip"), t);
        assert!("not-a-token".parse::<LeaseToken>().is_err());
    }

    #[test]
    fn a_lease_row_reads_as_sql_writes_it() {
        let row = json!({
            "attempt": 7, "run": 3, "lease": "6f1c2d3e-4f50-6172-0000-000000000007",
            "pipeline": "lake", "version": 2, "binary_path": "/opt/lake",
            "partitions": ["2024-01"], "attempt_number": 1,
            "deadline": "2026-12-01T05:38:50.630226+00:00", "registry_hash": "h",
            "pool": "default", "org": "default", "command": "attempt"
        });
        let l: Lease = from_json("orca.lease", row).expect("lease");
        assert_eq!(l.run, RunId(3));
        assert_eq!(l.lease.attempt(), l.attempt);
        assert_eq!(l.command, Command::Attempt);
    }

    #[test]
    fn a_malformed_answer_names_the_field_never_defaults() {
        let e = from_json::<AttemptContext>(
            "orca.attempt_context",
            json!({"org": "default", "pipeline": "lake", "run": "seven", "attempt": 1,
                   "version": 1, "registry_hash": "h", "partitions": [], "states": []}),
        )
        .expect_err("a run id that is not a number");
        assert_eq!(e.document, "orca.attempt_context");
        assert!(e.reason.contains("seven"), "{e}");
        let e = from_json::<AttemptContext>(
            "orca.attempt_context",
            json!({"org": "default", "pipeline": "lake", "run": 7, "attempt": 1,
                   "version": 1, "partitions": [], "states": []}),
        )
        .expect_err("no registry hash");
        assert!(e.to_string().contains("registry_hash"), "{e}");
        let e = from_json::<StepState>(
            "orca.attempt_context",
            json!({"step": "a", "partition": "*", "status": "done", "attempts": 1,
                   "code": null, "input_hash": null, "output": null}),
        )
        .expect_err("an unknown status");
        assert!(e.reason.contains("done"), "{e}");
    }

    #[test]
    fn a_sync_request_is_empty_or_full() {
        let r: SyncRequest = from_json("request", json!({})).expect("empty");
        assert!(!r.full());
        let r: SyncRequest = from_json("request", json!({"mode": "full"})).expect("full");
        assert!(r.full());
        assert!(from_json::<SyncRequest>("request", json!({"mode": "half"})).is_err());
    }
}
