//! What an attempt is asked to do, and what it did.

use crate::commit::protocol::CrashPoint;

/// Rows per stream per epoch unless the source's `batch_rows` says otherwise.
pub const DEFAULT_BATCH_ROWS: usize = 100_000;

/// What an attempt needs to know.
#[derive(Debug, Clone)]
pub struct Options {
    /// The control plane (the database with the orca extension).
    pub database_url: String,
    pub org: String,
    pub sync: String,
    /// Where checkpoints, staged epochs and logs live.
    pub store_url: String,
    /// Overrides the source's `batch_rows`.
    pub batch_rows: Option<usize>,
    /// Overrides the destination's `lanes` (writer lanes, default 1).
    pub lanes: Option<usize>,
    /// The lease of the run's attempt, when a runner started this one.
    pub lease: Option<String>,
    /// Where to listen for the control channel (`control`), if anywhere.
    pub control: Option<std::path::PathBuf>,
    /// Where to listen for the runner's source pump (`edge`): the runner
    /// reads the source and sends it over this data edge. Without one the
    /// engine reads the source itself.
    pub edge: Option<std::path::PathBuf>,
    /// A fault to inject: the attempt stops dead at that point of that
    /// epoch, without cleaning anything up, as a crash would (the
    /// simulation's; None otherwise).
    pub crash: Option<Crash>,
}

impl Options {
    /// The lease as a token (the claim refused a malformed one already).
    pub fn lease_token(&self) -> Option<orca_core::api::LeaseToken> {
        self.lease.as_deref().and_then(|l| l.parse().ok())
    }

    /// The org's lake, as an Iceberg destination or source opens it: the
    /// catalog in `ORCA_CATALOG_URL` (else the control plane), the
    /// warehouse `ORCA_WAREHOUSE`.
    pub fn lake_config(&self) -> orca_lake::LakeConfig {
        let mut config = orca_lake::LakeConfig::from_env(Some(&self.database_url));
        config.org = self.org.clone();
        config
    }
}

/// An injected crash: at `at` of epoch `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crash {
    pub at: CrashPoint,
    pub epoch: u64,
}

/// What an attempt did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub generation: i32,
    /// What recovery decided for HEAD's epoch.
    pub recovery: String,
    /// The epoch HEAD named when the attempt started, and when it ended.
    pub from_epoch: u64,
    pub to_epoch: u64,
    pub rows: u64,
    /// Bytes of binary COPY read from the source.
    pub source_bytes: u64,
    /// Bytes of Parquet staged.
    pub staged_bytes: u64,
    /// Records set aside under `_quarantine/`.
    pub quarantined: u64,
    /// Cells held under `_held/` (the destination got null).
    pub held: u64,
    /// The attempt stopped on a `stop` request, at a resume point, before the
    /// source ran out of rows.
    pub stopped: bool,
    /// Where the epochs' time went.
    pub spent: Spent,
}

/// Where an attempt's epochs spent their time on its main thread. The
/// readers run on threads of their own meanwhile (up to a bounded queue
/// ahead), so `waiting` is the time the epochs had nothing to do but wait
/// for rows: a source slower than the engine shows there.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spent {
    /// Waiting for each epoch's chunks from the readers.
    pub waiting: std::time::Duration,
    /// Making the epochs' batches and staging them as files.
    pub staging: std::time::Duration,
    /// Writing the records and making the epochs visible (and, for a
    /// continuous sync, taking the lanes its definition asks for now).
    pub committing: std::time::Duration,
}

impl Spent {
    /// The three parts in milliseconds, as the outcome and the log's
    /// `done` event say them.
    pub fn millis(&self) -> serde_json::Map<String, serde_json::Value> {
        let ms = |d: std::time::Duration| serde_json::Value::from(d.as_millis() as u64);
        serde_json::Map::from_iter([
            ("waiting_ms".to_string(), ms(self.waiting)),
            ("staging_ms".to_string(), ms(self.staging)),
            ("committing_ms".to_string(), ms(self.committing)),
        ])
    }
}
