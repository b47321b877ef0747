//! The engine of a sync (`orca-engine`). [`attempt`] runs one attempt end
//! to end; around it: the stream readers (a Postgres table as binary COPY
//! decoded by [`pgcopy`] and [`pgsource`]; files by [`files`], normalized by
//! [`normalize`]), the checkpoint log and staging in object storage
//! ([`store`], [`record`]), the destinations ([`dest`]: [`parquet_dest`],
//! Iceberg through the SDK, [`pg_dest`]), and the commit protocol's decisions
//! as pure code tested without storage ([`protocol`], [`recovery`]), and
//! the control channel a runner talks to ([`control`]). [`frame`] and
//! [`route`] are the data-edge frames and the writer-lane routing, built and
//! tested but not used by the attempt yet (one lane, no data edges).

pub mod attempt;
pub mod control;
pub mod dest;
pub mod files;
pub mod frame;
pub mod normalize;
pub mod parquet_dest;
pub mod pg_dest;
pub mod pgcopy;
pub mod pgsource;
pub mod protocol;
mod readers;
pub mod record;
pub mod recovery;
pub mod route;
pub mod store;
