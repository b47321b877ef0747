//! The lake as a source: tables of the org's own Iceberg catalog, read at a
//! snapshot and then by the snapshots appended after it ([`iceberg`]). The
//! engine reads them itself, with the org's catalog, never through a
//! runner's pump.

pub(crate) mod iceberg;
