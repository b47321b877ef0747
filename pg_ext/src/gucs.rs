//! The extension's settings, all under the reserved prefix `orca.`.
//!
//! The SQL API reads the numeric ones through small getter functions
//! (`orca._lease_seconds()` and friends) so that one definition, here, holds
//! each default.

use std::ffi::CString;

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::pg_sys;

/// The org the session acts in; unset means `default`. A user setting, like
/// `search_path`: membership, not this value, is what protects an org.
pub static ORG: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// The runner token a runner's session presents (docs/security.md): which
/// org and pool its claims, heartbeats and finishes act for. Kept out of
/// SHOW ALL and pg_settings' listings, like any secret a session holds.
pub static RUNNER_TOKEN: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// The lease token a pipeline binary's or engine's catalog connection
/// presents: row-level security on the Iceberg catalog shows it its
/// attempt's org only.
pub static LEASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// The API key a session presents: `orca serve` sets it per request to its
/// caller's key, and then the key alone decides the session's org and
/// whether it is an admin (orca._may_use_org, orca._is_admin).
pub static API_KEY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// The installation's key for secrets: a file of 64 hex digits outside the
/// database. Superusers set it (postgresql.conf or ALTER SYSTEM).
pub static SECRETS_KEY_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// The key before the current one, while orca.rewrap_data_keys() moves the
/// orgs' data keys to the new one.
pub static SECRETS_PREVIOUS_KEY_FILE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);

/// How often the background worker ticks. Short enough that a cron fire is
/// late by at most this much; each tick is one small transaction.
pub static TICK_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// The databases the background worker ticks in. Fixed at server start
/// because each database needs a worker registered by the postmaster.
pub static DATABASES: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));

/// How long a lease lasts without a heartbeat. Runners heartbeat at a third of
/// it; a lease that lapses is reclaimed by the next tick and retried.
pub static LEASE_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(30);

/// The longest a relay waits before it tries a failing webhook endpoint
/// again: its waits double from a second up to this.
pub static WEBHOOK_BACKOFF_MAX_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(3600);

/// How long a webhook endpoint may fail without a delivery getting through
/// before it is disabled (with a webhook.disabled event): long enough for
/// an outage, short enough that a dead endpoint stops costing retries.
pub static WEBHOOK_DISABLE_AFTER_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(3 * 86_400);

/// How long orca.tick keeps finished runs (with their attempts, step states,
/// reads and commits), events, webhook delivery rows and runners not seen
/// since; 0 keeps them forever. Runs are kept forever unless asked: they
/// are the history the console, reports and BI tools read, and an upgrade
/// must not start deleting it on its own. Events, delivery tries and
/// departed runners are operational records: a month.
pub static RETAIN_RUNS_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(0);
pub static RETAIN_EVENTS_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(30 * 86_400);
pub static RETAIN_WEBHOOK_DELIVERIES_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(30 * 86_400);
pub static RETAIN_RUNNERS_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(30 * 86_400);
/// How long the task rows of a finished run are kept before they are
/// summarised into their step's record: a step may fan out thousands, and
/// the summary (counts, durations, the first failures) is what a run's page
/// shows after a week.
pub static RETAIN_TASKS_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(7 * 86_400);

/// How many lines of an attempt's log the control plane keeps (the runner's
/// file has them all): enough for the console's view of a failure, bounded
/// so that a chatty step cannot fill the database.
pub static LOG_LINES_MAX: GucSetting<i32> = GucSetting::<i32>::new(20_000);

/// A bound on the rows one tick prunes per table, so that turning retention
/// on over a long history prunes it over many small transactions.
pub static RETENTION_BATCH: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// How many lost attempts (leases that lapsed) a run survives before it
/// fails. Separate from a pipeline's run_retries, which count failures its
/// own code reported, because a lost lease is usually the host's fault.
pub static LOST_ATTEMPTS_MAX: GucSetting<i32> = GucSetting::<i32>::new(3);

/// A bound on the fires one tick turns into runs per schedule, so a schedule
/// that was not ticked for a long time catches up over several ticks instead
/// of in one giant transaction.
pub static MAX_FIRES_PER_TICK: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// A bound on the lapsed leases one tick declares lost, so that the first tick
/// after an outage (when every runner's leases lapsed at once) stays a
/// transaction of bounded size; the rest are lost by the ticks after it.
pub static MAX_LOST_PER_TICK: GucSetting<i32> = GucSetting::<i32>::new(10_000);

/// A bound on the commits one tick looks at for one sensor, so that a sensor
/// registered beside a long history of commits catches up over several ticks
/// instead of in one long transaction.
pub static MAX_SENSOR_COMMITS_PER_TICK: GucSetting<i32> = GucSetting::<i32>::new(1000);

/// How often a sensor pipeline's datasets are polled for snapshots that
/// writers outside Orca made: each poll is an attempt a runner runs.
pub static SENSE_SECONDS: GucSetting<i32> = GucSetting::<i32>::new(60);

/// A bound on the partitions one orca.run or orca.backfill call may name.
pub static MAX_PARTITIONS: GucSetting<i32> = GucSetting::<i32>::new(100_000);

pub fn init() {
    GucRegistry::define_string_guc(
        c"orca.org",
        c"The org this session acts in (default: 'default').",
        c"Every orca function and every row-level security policy scopes to this org.",
        &ORG,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"orca.runner_token",
        c"The runner token this session works with (orca.create_runner_token).",
        c"Binds orca.claim, orca.heartbeat, orca.finish and orca.release to the token's org and pool.",
        &RUNNER_TOKEN,
        GucContext::Userset,
        GucFlags::NO_SHOW_ALL | GucFlags::DISALLOW_IN_FILE,
    );
    GucRegistry::define_string_guc(
        c"orca.lease",
        c"The lease token this session works under (a pipeline binary's or engine's).",
        c"The Iceberg catalog's tables show such a session its attempt's org only.",
        &LEASE,
        GucContext::Userset,
        GucFlags::NO_SHOW_ALL | GucFlags::DISALLOW_IN_FILE,
    );
    GucRegistry::define_string_guc(
        c"orca.api_key",
        c"The API key this session acts with (orca.create_api_key): orca serve's caller's.",
        c"With a key set, the key decides the org and the admin rights, not the login.",
        &API_KEY,
        GucContext::Userset,
        GucFlags::NO_SHOW_ALL | GucFlags::DISALLOW_IN_FILE,
    );
    GucRegistry::define_string_guc(
        c"orca.secrets_key_file",
        c"The file holding the installation's key for secrets (64 hex digits).",
        c"Org data keys are wrapped by it; it stays outside the database.",
        &SECRETS_KEY_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"orca.secrets_previous_key_file",
        c"The installation key before the current one, while data keys are rewrapped.",
        c"Set it, call orca.rewrap_data_keys(), then unset it.",
        &SECRETS_PREVIOUS_KEY_FILE,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_int_guc(
        c"orca.tick_ms",
        c"How often the background worker calls orca.tick().",
        c"Takes effect on reload (SIGHUP).",
        &TICK_MS,
        10,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"orca.lease_seconds",
        c"How long an attempt's lease lasts without a heartbeat.",
        c"orca.claim and orca.heartbeat set the deadline this far ahead.",
        &LEASE_SECONDS,
        1,
        86_400,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"orca.webhook_backoff_max_seconds",
        c"The longest wait before a failing webhook endpoint is tried again.",
        c"Waits double from one second up to this, each within 50 to 150 percent.",
        &WEBHOOK_BACKOFF_MAX_SECONDS,
        1,
        86_400,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"orca.webhook_disable_after_seconds",
        c"How long a webhook endpoint may fail before it is disabled.",
        c"Counted from its first failed delivery since the last one that got through.",
        &WEBHOOK_DISABLE_AFTER_SECONDS,
        1,
        30 * 86_400,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    for (name, short, setting) in [
        (
            c"orca.retain_runs",
            c"How long finished runs, with their attempts and step states, are kept (0: forever).",
            &RETAIN_RUNS_SECONDS,
        ),
        (
            c"orca.retain_events",
            c"How long events are kept (0: forever); undelivered webhook events stay.",
            &RETAIN_EVENTS_SECONDS,
        ),
        (
            c"orca.retain_webhook_deliveries",
            c"How long webhook delivery tries are kept (0: forever).",
            &RETAIN_WEBHOOK_DELIVERIES_SECONDS,
        ),
        (
            c"orca.retain_runners",
            c"How long a runner not seen since is kept (0: forever).",
            &RETAIN_RUNNERS_SECONDS,
        ),
        (
            c"orca.retain_tasks",
            c"How long a finished run's tasks are kept before they are summarised into their step's record (0: as long as the run).",
            &RETAIN_TASKS_SECONDS,
        ),
    ] {
        GucRegistry::define_int_guc(
            name,
            short,
            c"orca.tick prunes older rows in batches of orca.retention_batch; see orca.retention().",
            setting,
            0,
            i32::MAX,
            GucContext::Suset,
            GucFlags::UNIT_S,
        );
    }
    GucRegistry::define_int_guc(
        c"orca.log_lines_max",
        c"How many lines of each attempt's log the control plane keeps.",
        c"Runners ship the lines of the attempts they run (orca.append_log); later lines stay in the runner's file only.",
        &LOG_LINES_MAX,
        0,
        10_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"orca.retention_batch",
        c"The most rows orca.tick prunes per table per tick.",
        c"",
        &RETENTION_BATCH,
        1,
        1_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"orca.lost_attempts_max",
        c"How many lost attempts a run is retried after before it fails.",
        c"",
        &LOST_ATTEMPTS_MAX,
        0,
        1000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"orca.max_fires_per_tick",
        c"The most fires one tick turns into runs for one schedule.",
        c"",
        &MAX_FIRES_PER_TICK,
        1,
        1_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"orca.max_lost_per_tick",
        c"The most lapsed leases one tick declares lost.",
        c"The rest are declared lost by the following ticks.",
        &MAX_LOST_PER_TICK,
        1,
        10_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"orca.max_sensor_commits_per_tick",
        c"The most commits one tick looks at for one sensor.",
        c"A sensor behind by more catches up over the following ticks.",
        &MAX_SENSOR_COMMITS_PER_TICK,
        1,
        10_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"orca.sense_seconds",
        c"How often sensor pipelines poll their datasets for outside snapshots.",
        c"",
        &SENSE_SECONDS,
        1,
        86_400,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"orca.max_partitions",
        c"The most partitions one orca.run or orca.backfill call may name.",
        c"",
        &MAX_PARTITIONS,
        1,
        10_000_000,
        GucContext::Suset,
        GucFlags::default(),
    );
    // SAFETY: read-only access to a flag Postgres sets while it loads
    // shared_preload_libraries, in the single-threaded postmaster or backend.
    if unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        GucRegistry::define_string_guc(
            c"orca.databases",
            c"Comma-separated databases the background worker ticks in.",
            c"One worker per database; needs a server restart to change.",
            &DATABASES,
            GucContext::Postmaster,
            GucFlags::default(),
        );
    }
    // SAFETY: called from _PG_init with a static, NUL-terminated prefix.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"orca".as_ptr()) };
}
