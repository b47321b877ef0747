//! The engine of a sync (`orca-engine`). [`attempt`] runs one attempt end
//! to end; around it: the stream readers (a Postgres table as binary COPY
//! decoded by [`pgcopy`] and [`pgsource`]; files by [`files`], normalized by
//! [`normalize`]), the writer lanes' routing by key group ([`route`]), the
//! checkpoint log and staging in object storage ([`store`], [`record`]), the
//! destinations ([`dest`]: [`parquet_dest`], Iceberg through the SDK,
//! [`pg_dest`]), the commit protocol's decisions as pure code tested without
//! storage ([`protocol`], [`recovery`]), the control channel a runner talks
//! to ([`control`]), the data edge over which a runner's source pump
//! ([`pump`]) sends what it reads to the engine ([`edge`], in [`frame`]s),
//! and [`release`] of held cells.

pub mod attempt;
pub mod control;
pub mod dest;
pub mod edge;
pub mod files;
pub mod frame;
pub mod normalize;
pub mod parquet_dest;
pub mod pg_dest;
pub mod pgcopy;
pub mod pgsource;
pub mod protocol;
pub mod pump;
mod readers;
pub mod record;
pub mod recovery;
pub mod release;
pub mod route;
pub mod store;
mod util;
