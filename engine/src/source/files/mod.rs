//! The files source: JSON lines or CSV files read in name order as raw
//! records ([`reader`]), which the attempt normalizes into columns
//! (`source::normalize`), or Parquet files read as typed columns
//! ([`parquet`], read by ranges with `orca_lake::ranged`). [`open`] starts
//! a plan's readers.

pub(crate) mod open;
pub(crate) mod parquet;
pub mod reader;

pub use reader::{FileReader, FilesError, Format};
