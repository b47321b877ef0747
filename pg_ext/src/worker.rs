//! The background worker: calls `orca.tick()` every `orca.tick_ms` in each
//! database named by `orca.databases`, each tick in its own transaction.
//!
//! It stays minimal on purpose: all periodic work is the SQL function, so the
//! worker and a test calling `orca.tick(now => ...)` do exactly the same thing.
//! A failing tick is logged and rolled back, and the next one runs as usual.

use std::time::Duration;

use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::pg_sys::panic::CaughtError;
use pgrx::prelude::*;

use crate::gucs;

/// If the worker itself dies (it should not), the postmaster starts it again.
const RESTART_AFTER: Duration = Duration::from_secs(5);

/// Registers one worker per database; only possible while the postmaster
/// loads shared_preload_libraries.
pub fn register() {
    // SAFETY: read-only access to a flag set by the single-threaded postmaster.
    if !unsafe { pg_sys::process_shared_preload_libraries_in_progress } {
        return;
    }
    let databases = gucs::DATABASES
        .get()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    for db in databases
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        BackgroundWorkerBuilder::new(&format!("orca scheduler {db}"))
            .set_type("orca scheduler")
            .set_library("orca")
            .set_function("orca_worker_main")
            .set_extra(db)
            .enable_spi_access()
            .set_start_time(BgWorkerStartTime::RecoveryFinished)
            .set_restart_time(Some(RESTART_AFTER))
            .load();
    }
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn orca_worker_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let db = BackgroundWorker::get_extra().to_string();
    BackgroundWorker::connect_worker_to_spi(Some(&db), None);
    log!("orca scheduler started in database {db}");
    loop {
        let every = u64::try_from(gucs::TICK_MS.get()).unwrap_or(1000);
        if !BackgroundWorker::wait_latch(Some(Duration::from_millis(every))) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: the documented way for a background process to reload
            // its configuration after SIGHUP, outside any transaction.
            unsafe {
                pg_sys::ConfigReloadPending = 0;
                pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
            }
        }
        tick_once(&db);
    }
    log!("orca scheduler in database {db} is stopping");
}

/// Runs one tick in its own transaction; an error rolls it back and is logged.
fn tick_once(db: &str) {
    // SAFETY: a standby cannot write; ask Postgres, which tracks it in shared memory.
    if unsafe { pg_sys::RecoveryInProgress() } {
        return;
    }
    // SAFETY: the transaction calls pgrx's BackgroundWorker::transaction makes,
    // split so that a caught error can abort instead of commit.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let outcome: Result<(), String> = PgTryBuilder::new(|| {
        let installed = Spi::get_one::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'orca')",
        );
        match installed {
            // track_functions: orca.metrics() reports the ticks' time from
            // pg_stat_user_functions (unless the server tracks more already).
            Ok(Some(true)) => Spi::run(
                "SELECT CASE WHEN current_setting('track_functions') = 'none' \
                 THEN set_config('track_functions', 'pl', false) END; SELECT orca.tick()",
            )
            .map_err(|e| e.to_string()),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    })
    .catch_others(|e| {
        Err(match e {
            CaughtError::PostgresError(r) | CaughtError::ErrorReport(r) => r.message().to_string(),
            CaughtError::RustPanic { ereport, .. } => ereport.message().to_string(),
        })
    })
    .execute();
    match outcome {
        Ok(()) => unsafe {
            // SAFETY: pairs with the Push/Start above on the success path.
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
            // A background worker reports its statistics itself (a backend
            // does it when idle): without this the tick's table changes never
            // reach autovacuum's counts, nor its time pg_stat_user_functions.
            pg_sys::pgstat_report_stat(false);
        },
        Err(message) => {
            warning!("orca: tick in database {db} failed and was rolled back: {message}");
            // SAFETY: aborting releases the snapshot and everything the
            // failed transaction held; the error state was already flushed.
            unsafe { pg_sys::AbortCurrentTransaction() };
        }
    }
}
