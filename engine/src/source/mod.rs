//! Reading a sync's source, by family:
//! - [`postgres`]: a table as binary COPY decoded into Arrow, split over
//!   several connections for a big read, or a change stream from a slot;
//! - [`files`]: JSON lines or CSV files as raw records, Parquet files as
//!   typed columns;
//! - [`lake`]: tables of the org's own Iceberg catalog, by snapshot;
//! - [`external`]: an external connector program on a Unix socket.
//!
//! What the families share: the [`plan`] an engine asks to read (typed by
//! `orca_core::sync`), the one dispatcher ([`open`]), a reader thread per
//! stream (`readers`) and what it hands the attempt (`msg`), raw records
//! [`normalize`]d into columns, Arrow columns conformed to the kinds a
//! table's travel as (`typed`), and why reading failed ([`error`]).

pub mod error;
pub mod external;
pub mod files;
pub(crate) mod lake;
pub(crate) mod msg;
pub mod normalize;
pub(crate) mod open;
pub mod plan;
pub mod postgres;
pub(crate) mod readers;
pub(crate) mod typed;
