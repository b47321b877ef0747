//! The slot gauge: how a change stream's slot stands on its source server,
//! measured while an attempt reads it.
//!
//! The control plane's tick measures the slots of its own server itself; a
//! source on another server is seen only from here. A thread of its own
//! measures (not the reading thread), so the measures go on while the
//! reading is held back by an engine that stopped taking chunks, which is
//! when the slot falls behind. The runner takes the latest measure at each
//! heartbeat and reports it (`orca.report_slot`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::netguard::Guard;

/// How often the slot is measured.
pub const MEASURE_EVERY: Duration = Duration::from_secs(10);

/// One measure of a slot, in the names of `pg_replication_slots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotReading {
    pub slot: String,
    /// reserved, extended, unreserved or lost.
    pub wal_status: Option<String>,
    /// WAL that may still be written before the server may invalidate the
    /// slot (null without max_slot_wal_keep_size).
    pub safe_wal_size: Option<i64>,
    /// How far the confirmed position is behind the server's WAL.
    pub lag_bytes: Option<i64>,
    /// WAL the slot keeps (from its restart position).
    pub retained_bytes: Option<i64>,
    pub confirmed_flush_lsn: Option<String>,
    /// The source server's clock when it was measured (RFC 3339, UTC).
    pub measured_at: String,
    /// The server holds no such slot (dropped there, or lost in a
    /// failover): the control plane forgets its last measure.
    pub absent: bool,
}

/// The latest measure, shared by the thread that measures and whoever
/// reports it; the thread ends once no one holds the gauge.
#[derive(Debug, Clone, Default)]
pub struct SlotGauge(Arc<Mutex<Option<SlotReading>>>);

impl SlotGauge {
    /// The measure taken since the last call, if any.
    pub fn take(&self) -> Option<SlotReading> {
        self.0.lock().map(|mut r| r.take()).unwrap_or(None)
    }

    fn set(cell: &Mutex<Option<SlotReading>>, reading: SlotReading) {
        if let Ok(mut r) = cell.lock() {
            *r = Some(reading);
        }
    }
}

/// Measures `slot` on the server at `url` every [`MEASURE_EVERY`], first
/// at once, until `done` turns true or no one holds `gauge`. A measure that
/// fails (the server restarting, say) is skipped: the next one tries again
/// with a new session.
pub(crate) fn watch(
    guard: Guard,
    url: String,
    slot: String,
    gauge: &SlotGauge,
    done: Arc<AtomicBool>,
) -> std::io::Result<()> {
    let cell: Weak<Mutex<Option<SlotReading>>> = Arc::downgrade(&gauge.0);
    std::thread::Builder::new()
        .name("slot-gauge".into())
        .spawn(move || {
            let mut client = None;
            loop {
                let Some(held) = cell.upgrade() else { return };
                if done.load(Ordering::Relaxed) {
                    return;
                }
                if client.is_none() {
                    client = guard.postgres(&url).ok().and_then(|mut c| {
                        // A source that hangs must not hold the gauge.
                        c.batch_execute(
                            "SET statement_timeout = '10s'; \
                             SET application_name = 'orca slot gauge'",
                        )
                        .ok()
                        .map(|_| c)
                    });
                }
                match client.as_mut().map(|c| measure(c, &slot)) {
                    Some(Ok(r)) => SlotGauge::set(&held, r),
                    Some(Err(_)) => client = None,
                    None => {}
                }
                drop(held);
                let next = Instant::now() + MEASURE_EVERY;
                while Instant::now() < next {
                    if done.load(Ordering::Relaxed) || cell.strong_count() == 0 {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        })
        .map(|_| ())
}

/// The slot as its server sees it now.
fn measure(client: &mut postgres::Client, slot: &str) -> Result<SlotReading, postgres::Error> {
    let r = client.query_one(
        "SELECT s.wal_status, s.safe_wal_size,
                pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint,
                pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint,
                s.confirmed_flush_lsn::text,
                to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                s.slot_name IS NULL
         FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = $1",
        &[&slot],
    )?;
    Ok(SlotReading {
        slot: slot.to_string(),
        wal_status: r.get(0),
        safe_wal_size: r.get(1),
        lag_bytes: r.get(2),
        retained_bytes: r.get(3),
        confirmed_flush_lsn: r.get(4),
        measured_at: r.get(5),
        absent: r.get(6),
    })
}
