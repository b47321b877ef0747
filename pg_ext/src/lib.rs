//! The `orca` PostgreSQL extension: Orca's control plane.
//!
//! Tables, row-level security and the SQL API are SQL (`sql/*.sql`, included
//! below in dependency order); Rust supplies what SQL does badly (cron maths in
//! time zones, partition specs, manifest validation, see `helpers`), the
//! settings (`gucs`) and the background worker that ticks (`worker`).

use pgrx::prelude::*;

mod gucs;
mod helpers;
mod worker;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!(
    "../../sql/internal.sql",
    name = "internal",
    requires = [
        "schema",
        helpers::manifest_check,
        helpers::expand_partitions,
        helpers::cron_fires,
        helpers::cron_next,
        helpers::cron_last,
        helpers::fire_partition,
        helpers::current_partition,
        helpers::lease_seconds,
        helpers::lost_attempts_max,
        helpers::max_fires_per_tick,
        helpers::sensor_partitions,
        helpers::sense_seconds,
    ]
);
extension_sql_file!("../../sql/api.sql", name = "api", requires = ["internal"]);
extension_sql_file!("../../sql/views.sql", name = "views", requires = ["api"]);
extension_sql_file!("../../sql/grants.sql", name = "grants", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::init();
    worker::register();
}
