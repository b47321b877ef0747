//! The Postgres sources: a table read by its cursor as binary COPY decoded
//! into Arrow ([`table`], [`copy`]), a big read over several connections by
//! ranges of the cursor ([`splits`]), and every change of a sync's tables
//! from its logical replication slot ([`cdc`], decoding [`pgoutput`]).
//! [`open`] starts a plan's readers; a table read's connection is a
//! [`conn::PgReader`].

pub mod cdc;
pub mod conn;
pub mod copy;
pub(crate) mod open;
pub mod pgoutput;
pub mod splits;
pub mod table;
