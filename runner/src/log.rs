//! An attempt's log: every line goes to the file on this host (all of it,
//! always) and is shipped to the control plane (`orca.append_log`) in
//! batches while the attempt runs, so that the API and the console show and
//! follow logs without reaching this host.
//!
//! Shipping never slows the child: lines wait in a bounded queue, and when
//! the control plane falls behind, the lines that do not fit are left to
//! the file and counted; the last shipped line says how many.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use orca_core::api::LeaseToken;
use sqlx::PgPool;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::control::{self, ControlError};

/// Lines waiting to be shipped, at most.
const QUEUE: usize = 10_000;
/// Lines one call ships, at most (orca.append_log takes up to 1000).
const BATCH: usize = 500;
/// How long a line waits for others to share its call.
const LINGER: Duration = Duration::from_millis(500);
/// How long the end of an attempt waits for its last lines to be shipped.
const FLUSH_FOR: Duration = Duration::from_secs(5);

pub struct AttemptLog {
    file: tokio::sync::Mutex<tokio::fs::File>,
    ship: Mutex<Option<mpsc::Sender<String>>>,
    unshipped: AtomicU64,
    shipper: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl AttemptLog {
    /// A log writing to `file` and shipping under `lease`.
    pub fn new(file: tokio::fs::File, db: PgPool, lease: LeaseToken) -> AttemptLog {
        let (tx, rx) = mpsc::channel(QUEUE);
        let shipper = tokio::spawn(ship(db, lease, rx));
        AttemptLog {
            file: tokio::sync::Mutex::new(file),
            ship: Mutex::new(Some(tx)),
            unshipped: AtomicU64::new(0),
            shipper: Mutex::new(Some(shipper)),
        }
    }

    /// Writes a line to the file and queues it for the control plane.
    pub async fn line(&self, line: &str) -> std::io::Result<()> {
        {
            let tx = self.ship.lock().ok().and_then(|g| g.clone());
            if let Some(tx) = tx {
                if tx.try_send(line.to_string()).is_err() {
                    self.unshipped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let mut f = self.file.lock().await;
        f.write_all(line.as_bytes()).await?;
        f.write_all(b"\n").await
    }

    /// Ships what is queued (before the attempt is reported: after that the
    /// lease no longer takes lines), waiting at most a few seconds.
    pub async fn flush(&self) {
        let tx = self.ship.lock().ok().and_then(|mut g| g.take());
        if let Some(tx) = tx {
            let n = self.unshipped.load(Ordering::Relaxed);
            if n > 0 {
                let _ = tx
                    .send(format!(
                        "orca-runner: {n} lines were not shipped to the control plane (it fell \
                         behind); the log file on the runner's host has every line"
                    ))
                    .await;
            }
        }
        let handle = self.shipper.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = handle {
            let _ = tokio::time::timeout(FLUSH_FOR, h).await;
        }
    }
}

async fn ship(db: PgPool, lease: LeaseToken, mut rx: mpsc::Receiver<String>) {
    let mut seq: i32 = 1;
    let mut batch: Vec<String> = Vec::with_capacity(BATCH);
    loop {
        let Some(first) = rx.recv().await else {
            return;
        };
        batch.push(first);
        let until = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(line)) => batch.push(line),
                Ok(None) | Err(_) => break,
            }
        }
        match send(&db, lease, seq, &batch).await {
            Ok(()) => {}
            // The lease is gone (lost, finished, fenced): nothing more is taken.
            Err(ControlError::Fenced { .. }) => return,
            Err(e) if older_control_plane(&e) => {
                eprintln!(
                    "orca-runner: the control plane takes no log lines (orca.append_log is \
                     newer than it); logs stay in the files on this host"
                );
                return;
            }
            Err(e) => eprintln!("orca-runner: shipping log lines failed, the file keeps them: {e}"),
        }
        seq = seq.saturating_add(i32::try_from(batch.len()).unwrap_or(i32::MAX));
        batch.clear();
    }
}

/// PostgreSQL's SQLSTATE for a call no function matches: an extension
/// older than this runner.
fn older_control_plane(e: &ControlError) -> bool {
    matches!(e, ControlError::Db(sqlx::Error::Database(d)) if d.code().as_deref() == Some("42883"))
}

/// One batch, tried again once: the lines are numbered, so a batch that
/// arrived although its answer was lost is kept once.
async fn send(
    db: &PgPool,
    lease: LeaseToken,
    seq: i32,
    batch: &[String],
) -> Result<(), ControlError> {
    match control::append_log(db, lease, seq, batch).await {
        Err(e @ ControlError::Fenced { .. }) => Err(e),
        Err(e) if older_control_plane(&e) => Err(e),
        Err(_) => {
            tokio::time::sleep(Duration::from_millis(500)).await;
            control::append_log(db, lease, seq, batch).await
        }
        done => done,
    }
}
