//! Reading a sync's source: a Postgres table ([`pg_table`]) as binary COPY
//! decoded into Arrow ([`pg_copy`]); files as raw records ([`files`]),
//! normalized into columns ([`normalize`]); one reader thread per stream
//! (`readers`) for the streams a [`plan::Plan`] asks for.

pub mod connector;
pub mod error;
pub mod files;
pub mod host_http;
mod msg;
pub mod normalize;
pub mod pg_cdc;
pub mod pg_copy;
pub mod pg_table;
pub mod pgoutput;
pub mod plan;
pub mod read_plan;
pub(crate) mod readers;
pub mod splits;
