//! The attempt's log: JSON lines, kept under `_logs/` next to the checkpoint
//! log and echoed to stderr.

use std::io::Write as _;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::commit::store::{Store, StoreError};

pub(super) struct Log {
    path: String,
    lines: Vec<String>,
    generation: i32,
}

impl Log {
    /// An empty log of `generation`'s attempt, to be kept at `path`.
    pub(super) fn new(path: String, generation: i32) -> Log {
        Log {
            path,
            lines: Vec::new(),
            generation,
        }
    }

    pub(super) fn event(&mut self, event: &str, fields: Value) {
        let mut line = json!({
            "at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "generation": self.generation,
            "event": event,
        });
        if let (Some(l), Value::Object(f)) = (line.as_object_mut(), fields) {
            l.extend(f);
        }
        let text = line.to_string();
        // Stderr is the runner's pipe: once a runner died it is broken, and
        // the log must still reach the store (eprintln! would panic).
        let _ = writeln!(std::io::stderr(), "{text}");
        self.lines.push(text);
    }

    /// Writes the whole log so far to the store (it replaces what an
    /// earlier flush wrote).
    pub(super) fn flush(&self, store: &Store) -> Result<(), StoreError> {
        let mut body = self.lines.join("\n");
        body.push('\n');
        store.put(&self.path, Bytes::from(body))
    }
}
