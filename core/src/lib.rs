//! Orca's control-plane logic that needs no database: cron schedules in time
//! zones, partition keys and the spec syntax that names them, manifest and
//! sync validation, the types of everything that crosses the SQL boundary
//! (`api`) and every SQLSTATE the control plane raises (`sqlstate`). The extension (`pg_ext`) is a thin shell over this crate, so
//! plain `cargo test` exercises the logic without a running Postgres.

pub mod api;
pub mod catalog;
pub mod conninfo;
pub mod cron;
pub mod delivery;
pub mod error;
pub mod keyed;
pub mod manifest;
pub mod netguard;
pub mod partition;
pub mod resources;
pub mod secret;
pub mod sqlstate;
pub mod sync;
pub mod tasks;
pub mod webhook;

pub use error::{Error, Result};
