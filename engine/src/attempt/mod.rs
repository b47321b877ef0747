//! One attempt of a sync, end to end: claim the sync (a new generation),
//! raise the destination's fence, recover the epoch HEAD names, then read
//! every stream from its resume point in epochs until the source has no more
//! rows, committing each epoch through the protocol's coordinator.
//!
//! Each stream is read by its own thread (`source::readers`): a Postgres
//! table over its own connection (binary COPY into Arrow), or files through
//! the object store (raw records, normalized here). Those threads run in the
//! runner when one hosts the source ([`crate::transport::pump`]), their
//! chunks coming over the data edge ([`crate::transport::edge`]), or here.
//! The attempt's thread holds cells the destination cannot take, stages,
//! records, moves HEAD and commits, one epoch after the other.
//!
//! The phases, in order, each in its file:
//! - `claim`: listen for the runner, claim, look the streams up, open the
//!   store and the destination, raise the fence;
//! - `recover`: decide what becomes of HEAD's epoch, and where each stream
//!   resumes;
//! - `open`: a reader and a lane router per stream;
//! - then, per epoch (`epochs`): `barrier` (a chunk of each stream), `stage`
//!   (batches, held cells, each lane's Parquet, the record) and `apply`
//!   (record, HEAD, the destination).

mod apply;
mod barrier;
mod claim;
mod epochs;
mod log;
mod open;
mod options;
mod recover;
mod run;
mod stage;
mod state;

pub use crate::commit::protocol::CrashPoint;
pub use crate::error::EngineError;
pub use crate::util::pg_text;
pub use options::{Crash, Options, Outcome, Spent, DEFAULT_BATCH_ROWS};
pub use run::run;
