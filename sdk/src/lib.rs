//! The Orca SDK: what a pipeline author writes against.
//!
//! ```ignore
//! use orca::{Ctx, Month, Result};
//!
//! #[orca::step(mapped)]
//! fn days(ctx: &mut Ctx, m: Month) -> Result<u32> { Ok(m.days()) }
//!
//! #[orca::step(gather, after = days)]
//! fn total(ctx: &mut Ctx, days: Vec<u32>) -> Result<u32> { Ok(days.iter().sum()) }
//!
//! orca::pipeline! {
//!     Lake = "lake" [days, total],
//!     partitions = Monthly("2024-01"),
//!     schedule = Cron("0 3 2 * *"),
//! }
//!
//! fn main() { orca::main::<Lake>() }
//! ```
//!
//! A step is a function `fn(&mut Ctx, Input) -> Result<Output>`; `mapped`
//! steps run once per partition, `gather` steps once per run over every
//! partition's output. The compiler checks every edge between steps
//! ([`check`]); the binary's command line ([`main`]) describes the pipeline,
//! runs it in memory, lists its fires and runs the attempts a runner leases.

#[cfg(feature = "ballista")]
pub mod ballista;
pub mod check;
mod cli;
mod ctx;
mod driver;
mod error;
pub mod flink;
mod keys;
mod manifest;
mod partitioning;
mod pins;
mod pipeline;
pub mod query;
pub mod spark;
mod step;
mod store;
pub mod tables;
mod tasks;

pub use cli::main;
pub use ctx::{Ctx, LogSink};
pub use driver::{execute, Outcome, StepReport, StepResult};
pub use error::{Error, Result, SdkError};
pub use keys::{Day, Month, Name, PartitionKey};
pub use orca_lake::{TableSpec, Transform};
pub use orca_macros::{pipeline, step, task};
pub use pipeline::{Build, Fills, Params, Partitioning, Pipeline, Resources, StepInfo};
pub use query::{Batches, IntoBatches, Query, Scan, SqlParams};
pub use step::{AfterOr, Gather, Kind, Mapped, Previous, Step};
pub use store::{AttemptState, MemStore, PgStore, Store, StoredState};
pub use tables::{append, commit, ensure_table, files, scan, table, write_files, Table};
pub use tasks::{Has, ObjectRef, Runtime, Task, TaskFailed, TaskInfo, TaskSet};

/// Declares a set of tasks a step may fan out: `orca::tasks!(FanoutTasks =
/// [Trips, Weigh]);`. A step asks for its runtime with
/// `ctx.runtime::<FanoutTasks>()`, which submits only these (another is a
/// compile error), and the pipeline lists the set (`tasks = FanoutTasks`).
#[macro_export]
macro_rules! tasks {
    ($vis:vis $set:ident = [$($task:ty),* $(,)?]) => {
        $vis struct $set;
        impl $crate::TaskSet for $set {
            const NAME: &'static str = ::core::stringify!($set);
            fn tasks() -> ::std::vec::Vec<$crate::TaskInfo> {
                ::std::vec![$($crate::TaskInfo::of::<$task>()),*]
            }
        }
        $(impl $crate::Has<$task> for $set {})*
    };
}

/// DataFusion, at the version the SDK is built with: its expressions
/// (`col`, `lit`) filter scans, its DataFrame API goes on from a
/// [`Query`].
pub use orca_lake::datafusion;
/// What a filter is written with: `col("month").eq(lit("2013-05"))`.
pub use orca_lake::datafusion::prelude::{col, lit};

/// The Arrow crates the table functions take and return, at the versions the
/// SDK is built with.
pub use arrow_array;
pub use arrow_schema;

#[doc(hidden)]
pub use step::run_erased as __run;
