//! The engine of a sync (`orca-engine`). [`attempt`] runs one attempt end
//! to end. Around it:
//! - [`source`]: the stream readers: a Postgres table as binary COPY, or
//!   files normalized into columns;
//! - [`dest`]: the destinations: Parquet files, Postgres tables, Iceberg
//!   tables through the SDK;
//! - [`commit`]: the commit protocol's decisions as pure code tested without
//!   storage, the checkpoint log and staging in object storage, and the
//!   writer lanes' routing by key group;
//! - [`transport`]: the control channel a runner talks to, and the data edge
//!   over which a runner's source pump sends what it reads to the engine;
//! - [`netguard`]: what the connectors may reach (the org's allowlist);
//! - [`error`]: why an attempt (or a discovery or maintenance task)
//!   stopped, each part's own error in it;
//! - [`release`] of held cells;
//! - [`ids`]: a row's `_orca_id` in its two forms.

pub mod attempt;
pub mod commit;
pub mod dest;
pub mod discover;
pub mod error;
pub mod ids;
pub mod maintain;
pub mod netguard;
pub mod release;
pub mod source;
pub mod transport;
mod util;

// The paths other crates name: the runner and the bench pump a source
// (`pump`), the simulation speaks frames and checks the protocol's
// decisions (`frame`, `protocol`, `recovery`).
pub use commit::{protocol, recovery};
pub use transport::{frame, pump};
