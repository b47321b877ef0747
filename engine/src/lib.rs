//! The engine of a sync. For now the frames of its data edges ([`frame`])
//! and its commit protocol's decisions, as pure code tested without storage: when an epoch may commit, what commits next,
//! which positions the source may acknowledge, and what an attempt does with
//! the epoch HEAD names when it starts. The I/O around them (barriers on the
//! data edges, the checkpoint records in object storage, `orca.advance_head`,
//! the destinations) is not built yet.

pub mod attempt;
pub mod dest;
pub mod files;
pub mod frame;
pub mod normalize;
pub mod parquet_dest;
pub mod pg_dest;
pub mod pgcopy;
pub mod pgsource;
pub mod protocol;
pub mod record;
pub mod recovery;
pub mod route;
pub mod store;
