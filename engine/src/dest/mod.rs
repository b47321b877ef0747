//! The destinations a sync writes: Parquet files ([`parquet`]), Postgres
//! tables ([`postgres`]), Iceberg tables ([`iceberg`]), an external
//! connector's `write` ([`connector`]), behind one face ([`destination`]).

pub mod connector;
pub mod destination;
pub mod error;
pub mod held;
pub mod iceberg;
pub mod parquet;
pub mod postgres;
mod staged;

pub use destination::{Dest, How};
