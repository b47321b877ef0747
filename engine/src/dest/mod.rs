//! The destinations a sync writes: Parquet files ([`parquet`]), Postgres
//! tables ([`postgres`]), Iceberg tables, behind one face
//! ([`destination`]).

pub mod destination;
pub mod parquet;
pub mod postgres;

pub use destination::{Dest, How};
