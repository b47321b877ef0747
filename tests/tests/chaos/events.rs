//! The external connector's workload: a NATS JetStream stream (the
//! machine's NATS, on loopback) that a publisher feeds during each round,
//! read by the example `nats_jetstream` connector (connectors/python) into
//! Postgres by a batch sync run again and again, exactly once. Its fault:
//! the connector SIGKILLed mid-read (a program the runner cannot tell from
//! one that crashed, so its attempt fails and may spend a retry).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orca_tests::*;
use serde_json::json;

/// How many times a run of the sync may be tried: a killed connector
/// spends one.
pub const RUN_RETRIES: i32 = 3;

/// The program's path, as its command line shows it.
const PROGRAM: &str = "examples/nats_jetstream.py";

pub struct Events {
    /// The JetStream stream (and the subject prefix).
    pub stream: String,
    /// The connectors directory the runners are given.
    pub dir: PathBuf,
    /// The last message id published.
    published: Arc<AtomicI64>,
    publisher: Option<(Arc<AtomicBool>, tokio::task::JoinHandle<()>)>,
    /// Connectors killed so far: each may have failed one attempt.
    pub kills: u32,
    /// Every run of the sync started so far.
    pub runs: Vec<i64>,
}

fn publish_script() -> String {
    repo_root()
        .join("tests/py/connectors/nats_publish.py")
        .to_string_lossy()
        .into_owned()
}

/// Publishes ids `first..first + count`; false when it could not.
fn publish(stream: &str, first: i64, count: i64) -> bool {
    Command::new(orca_tests::s3::python())
        .args([
            &publish_script(),
            stream,
            &first.to_string(),
            &count.to_string(),
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Starts a run of batch sync `sync` unless one is queued or running.
pub async fn start_run(db: &TestDb, sync: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT orca.run($1, 'now')")
        .bind(sync)
        .fetch_optional(&db.pool)
        .await
        .ok()
        .flatten()
}

impl Events {
    /// A connectors directory under `world_dir` holding `nats_jetstream`,
    /// and a stream named for the world's tag.
    pub fn new(world_dir: &Path, tag: &str) -> Events {
        use std::os::unix::fs::PermissionsExt;
        let dir = world_dir.join("connectors");
        std::fs::create_dir_all(&dir).expect("connectors dir");
        let script = dir.join("nats_jetstream");
        let program = repo_root().join("connectors/python").join(PROGRAM);
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nexec {} {} \"$@\"\n",
                orca_tests::s3::python(),
                program.display()
            ),
        )
        .expect("connector script");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .expect("chmod connector");
        let stream = format!("ORCA_CHAOS_{}", tag.replace('-', "_").to_uppercase());
        // The stream exists before the sync first reads it.
        assert!(
            publish(&stream, 1, 200),
            "publish to NATS on 127.0.0.1:4222"
        );
        Events {
            stream,
            dir,
            published: Arc::new(AtomicI64::new(200)),
            publisher: None,
            kills: 0,
            runs: Vec::new(),
        }
    }

    pub async fn define(&self, db: &TestDb) {
        sqlx::query(
            "SELECT orca.create_sync('events', $1, $2, $3, NULL, 'exactly_once', 'default', $4)",
        )
        .bind(
            json!({"type": "connector", "connector": "nats_jetstream", "replay": "exact",
                         "batch_rows": 100, "config": {"servers": "nats://127.0.0.1:4222"}}),
        )
        .bind(json!({"type": "postgres", "url": db.url(), "schema": "raw"}))
        .bind(json!([{"name": "events", "config": {"stream": self.stream}}]))
        .bind(RUN_RETRIES)
        .execute(&db.pool)
        .await
        .expect("create_sync events");
    }

    /// Publishes a batch of 100 messages every half second until stopped.
    /// A batch that failed part way is published again (its messages are
    /// stored once: each carries its id as its `Nats-Msg-Id`) before the
    /// publisher stops, so that ids 1 to `published` are exactly what the
    /// stream holds.
    pub fn start_publishing(&mut self) {
        let stop = Arc::new(AtomicBool::new(false));
        let (s, published, stream) = (stop.clone(), self.published.clone(), self.stream.clone());
        let task = tokio::task::spawn_blocking(move || {
            let mut pending = false;
            while pending || !s.load(Ordering::Relaxed) {
                let first = published.load(Ordering::Acquire) + 1;
                pending = !publish(&stream, first, 100);
                if !pending {
                    published.store(first + 99, Ordering::Release);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        self.publisher = Some((stop, task));
    }

    /// Stops publishing; returns the last id published.
    pub async fn stop_publishing(&mut self) -> i64 {
        if let Some((stop, task)) = self.publisher.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = task.await;
        }
        self.published.load(Ordering::Acquire)
    }

    /// The last message id published.
    pub fn published(&self) -> i64 {
        self.published.load(Ordering::Acquire)
    }

    /// The connector processes of this world's runners.
    pub fn pids(&self, tag: &str) -> Vec<i32> {
        orca_tests::procs::processes_where(
            |cmdline| String::from_utf8_lossy(cmdline).contains(PROGRAM),
            &format!("ORCA_CHAOS_TAG={tag}"),
        )
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        if let Some((stop, _)) = &self.publisher {
            stop.store(true, Ordering::Relaxed);
        }
        let _ = Command::new(orca_tests::s3::python())
            .args([&publish_script(), &self.stream, "--delete"])
            .output();
    }
}
