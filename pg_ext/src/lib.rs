//! The `orca` PostgreSQL extension: Orca's control plane.
//!
//! Tables, row-level security and the SQL API are SQL (`sql/*.sql`, one file per
//! domain, included below in dependency order); Rust supplies what SQL does badly (cron maths in
//! time zones, partition specs, manifest validation, see `helpers`), the
//! settings (`gucs`) and the background worker that ticks (`worker`).

use pgrx::prelude::*;

mod gucs;
mod helpers;
mod netguard;
mod secrets;
mod worker;

::pgrx::pg_module_magic!(name, version);

extension_sql_file!("../../sql/schema.sql", name = "schema", bootstrap);
extension_sql_file!(
    "../../sql/catalog.sql",
    name = "catalog",
    requires = ["schema"]
);
// The SQL API, one file per domain. Each file requires the one before it, so
// the install script keeps this order; `base` also requires the Rust helpers
// (LANGUAGE sql functions are checked against them when created).
extension_sql_file!(
    "../../sql/base.sql",
    name = "base",
    requires = [
        "catalog",
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
        helpers::max_lost_per_tick,
        helpers::max_sensor_commits_per_tick,
        helpers::valid_key,
    ]
);
extension_sql_file!("../../sql/orgs.sql", name = "orgs", requires = ["base"]);
extension_sql_file!(
    "../../sql/security.sql",
    name = "security",
    requires = ["orgs"]
);
extension_sql_file!(
    "../../sql/pipelines.sql",
    name = "pipelines",
    requires = ["security"]
);
extension_sql_file!(
    "../../sql/runs.sql",
    name = "runs",
    requires = ["pipelines"]
);
extension_sql_file!(
    "../../sql/dispatch.sql",
    name = "dispatch",
    requires = ["runs"]
);
extension_sql_file!(
    "../../sql/datasets.sql",
    name = "datasets",
    requires = ["dispatch"]
);
extension_sql_file!(
    "../../sql/sensors.sql",
    name = "sensors",
    requires = ["datasets"]
);
extension_sql_file!(
    "../../sql/keyed.sql",
    name = "keyed",
    requires = ["sensors"]
);
extension_sql_file!(
    "../../sql/discovery.sql",
    name = "discovery",
    requires = ["keyed"]
);
extension_sql_file!(
    "../../sql/syncs.sql",
    name = "syncs",
    requires = ["discovery"]
);
extension_sql_file!("../../sql/tick.sql", name = "tick", requires = ["syncs"]);
extension_sql_file!(
    "../../sql/webhooks.sql",
    name = "webhooks",
    requires = ["tick"]
);
extension_sql_file!("../../sql/logs.sql", name = "logs", requires = ["webhooks"]);
extension_sql_file!("../../sql/epochs.sql", name = "epochs", requires = ["logs"]);
// retention.sql's orca.retention() is LANGUAGE sql: its helpers come first.
extension_sql_file!(
    "../../sql/retention.sql",
    name = "retention",
    requires = ["epochs", helpers::retain_seconds, helpers::retention_batch]
);
extension_sql_file!(
    "../../sql/views.sql",
    name = "views",
    requires = ["retention"]
);
extension_sql_file!("../../sql/cdc.sql", name = "cdc", requires = ["views"]);
extension_sql_file!(
    "../../sql/maintenance.sql",
    name = "maintenance",
    requires = ["cdc"]
);
extension_sql_file!(
    "../../sql/iceberg.sql",
    name = "iceberg",
    requires = ["maintenance"]
);
extension_sql_file!(
    "../../sql/tasks.sql",
    name = "tasks",
    requires = ["iceberg"]
);
extension_sql_file!(
    "../../sql/scaling.sql",
    name = "scaling",
    requires = ["tasks"]
);
extension_sql_file!(
    "../../sql/resume.sql",
    name = "resume",
    requires = ["scaling"]
);
extension_sql_file!(
    "../../sql/explain.sql",
    name = "explain",
    requires = ["resume"]
);
extension_sql_file!(
    "../../sql/incidents.sql",
    name = "incidents",
    requires = ["explain"]
);
extension_sql_file!("../../sql/grants.sql", name = "grants", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    gucs::init();
    worker::register();
}
