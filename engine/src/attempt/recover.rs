//! Recovery: what becomes of the epoch HEAD names (resumed from, applied
//! then resumed from, or rewound past), and where each stream resumes.

use std::collections::{BTreeMap, BTreeSet};

use orca_core::api::{Epoch, Generation};
use orca_core::sqlstate;
use serde_json::json;

use crate::attempt::state::Attempt;
use crate::commit::record::{Record, StreamState};
use crate::commit::recovery::{decide, HeadState, Recovery};
use crate::error::EngineError;

/// Where an attempt resumes after recovery.
pub(super) struct Recovered {
    pub(super) said: String,
    /// HEAD's epoch after recovery (one less after a rewind).
    pub(super) head: u64,
    pub(super) states: BTreeMap<String, StreamState>,
    /// The record resumed from: the next record's `previous`.
    pub(super) record: Option<String>,
}

impl Attempt {
    pub(super) fn read_record(&self, path: &str) -> Result<Record, EngineError> {
        if !self.layout.owns_record(path) {
            return Err(EngineError::BadRecord {
                path: path.to_string(),
                reason: format!(
                    "not a checkpoint record of this sync (they are {}/_checkpoints/<name>)",
                    self.layout.root
                ),
            });
        }
        let bytes = self.store.get(path)?.ok_or_else(|| EngineError::NoRecord {
            path: self.store.url_of(path),
        })?;
        serde_json::from_slice(&bytes).map_err(|e| EngineError::BadRecord {
            path: self.store.url_of(path),
            reason: e.to_string(),
        })
    }

    /// What to do with the epoch HEAD names; returns the stream states to
    /// resume from.
    pub(super) fn recover(
        &mut self,
        head_epoch: u64,
        head_record: Option<String>,
    ) -> Result<Recovered, EngineError> {
        // No record: nothing to resume from. HEAD's epoch is more than 0
        // for a sync defined again after a drop, whose epochs go on from
        // the dropped one's (its destination's markers know them).
        let Some(path) = head_record.filter(|_| head_epoch > 0) else {
            return Ok(Recovered {
                said: "fresh".into(),
                head: head_epoch,
                states: BTreeMap::new(),
                record: None,
            });
        };
        let record = self.read_record(&path)?;
        // Only streams that read something in HEAD's epoch, or whose refresh
        // begins or ends in it, have anything of it to make visible (the
        // epoch before was committed before this one was recorded).
        let staged: BTreeSet<&str> = record
            .committables
            .iter()
            .flat_map(|c| c.staged.iter().map(|f| f.stream.as_str()))
            .chain(record.refresh.keys().map(String::as_str))
            .collect();
        // The staged files first, the markers after: an older attempt that
        // moved HEAD may be applying the epoch right now, and it writes the
        // marker before it deletes the files, so files found gone mean the
        // marker read next already says the epoch is in. (The other order
        // took an epoch applied meanwhile for lost, and read it again.)
        let mut available = true;
        for f in record.committables.iter().flat_map(|c| c.staged.iter()) {
            available &= self.store.exists(&f.path)?;
        }
        let mut markers = BTreeMap::new();
        for s in &staged {
            markers.insert(s.to_string(), self.dest.marker(s)?);
        }
        let decision = decide(&HeadState {
            epoch: head_epoch,
            streams: staged.iter().map(|s| s.to_string()).collect(),
            markers,
            committables_available: available,
        })?;
        let said = match &decision {
            Recovery::Resume { epoch } => format!("resume from epoch {epoch}"),
            Recovery::Apply { epoch, streams } => {
                format!("apply epoch {epoch} to {}, then resume", streams.join(", "))
            }
            Recovery::Rewind { to } => format!("rewind to epoch {to}"),
        };
        self.log.event(
            "recovered",
            json!({"head": head_epoch, "decision": said.clone()}),
        );
        match decision {
            Recovery::Resume { .. } => {}
            Recovery::Apply { streams, .. } => self.apply(&record, &streams)?,
            Recovery::Rewind { to } => {
                // Nothing of the lost epoch is visible: read it again from
                // the record before, which HEAD names again.
                let previous = record.previous.clone().filter(|_| to > 0);
                let states = match &previous {
                    Some(p) => self.read_record(p)?.streams,
                    None => BTreeMap::new(),
                };
                let r = self.control.rewind_head(
                    &self.opts.sync,
                    Generation(self.generation),
                    Epoch(to),
                    previous.as_deref(),
                    self.opts.lease_token(),
                );
                match r {
                    Ok(()) => {}
                    Err(e) if e.is(sqlstate::FENCED) => return Err(self.fenced()),
                    Err(e) => return Err(e.into()),
                }
                return Ok(Recovered {
                    said,
                    head: to,
                    states,
                    record: previous,
                });
            }
        }
        Ok(Recovered {
            said,
            head: head_epoch,
            states: record.streams,
            record: Some(path),
        })
    }

    /// Where each stream reads from in this attempt, given where recovery
    /// left it: a backfill (`full`) reads every stream again from its start,
    /// and an `overwrite` stream begins a new refresh unless one was cut
    /// short. Returns the streams whose refresh begins. Whatever is still
    /// staged is let go.
    pub(super) fn resume(
        &mut self,
        states: &mut BTreeMap<String, StreamState>,
        full: bool,
    ) -> Result<BTreeSet<String>, EngineError> {
        if full {
            read_again(states, &self.streams);
            self.log.event("full", json!({"streams": self.streams}));
        }
        let begins = begin_refreshes(states, &self.overwrite, full);
        if !self.overwrite.is_empty() {
            self.log.event(
                "refresh",
                json!({"begins": begins,
                       "continues": self.overwrite.difference(&begins).collect::<Vec<_>>()}),
            );
        }
        // Whatever is still staged now belongs to epochs that are applied or
        // that will be read again: none of it is needed.
        for f in self.store.list(&format!("{}/_staging", self.layout.root))? {
            self.store.delete(&f)?;
        }
        Ok(begins)
    }
}

/// A backfill: every stream from its start, in epochs after HEAD.
fn read_again(states: &mut BTreeMap<String, StreamState>, streams: &[String]) {
    for s in streams {
        let st = states.entry(s.clone()).or_default();
        st.position = None;
        st.rereading = true;
    }
}

/// An `overwrite` stream whose last refresh finished (or that never began
/// one) reads its source again from the start into a fresh shadow; one cut
/// short by a crash or a stop goes on where it was. Returns the streams
/// that begin.
fn begin_refreshes(
    states: &mut BTreeMap<String, StreamState>,
    overwrite: &BTreeSet<String>,
    full: bool,
) -> BTreeSet<String> {
    let mut begins = BTreeSet::new();
    for name in overwrite {
        let st = states.entry(name.clone()).or_default();
        if full || st.refreshed || st.position.is_none() {
            st.position = None;
            st.refreshed = false;
            begins.insert(name.clone());
        }
    }
    begins
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(position: &[&str]) -> StreamState {
        StreamState {
            position: Some(position.iter().map(|s| s.to_string()).collect()),
            rows: 10,
            ..StreamState::default()
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_refresh_begins_again_once_the_last_one_finished_and_goes_on_when_cut_short() {
        let mut states = BTreeMap::new();
        // Finished its last refresh: begins another from the start.
        states.insert(
            "done".to_string(),
            StreamState {
                refreshed: true,
                ..at(&["9"])
            },
        );
        // Cut short by a crash or a stop: goes on where it was.
        states.insert("midway".to_string(), at(&["4"]));
        // Not `overwrite`: untouched.
        states.insert("appended".to_string(), at(&["7"]));
        let overwrite = set(&["done", "midway", "never"]);

        let begins = begin_refreshes(&mut states, &overwrite, false);
        assert_eq!(begins, set(&["done", "never"]));
        assert_eq!(states["done"].position, None);
        assert!(!states["done"].refreshed);
        assert_eq!(states["midway"], at(&["4"]));
        assert_eq!(states["appended"], at(&["7"]));
        assert_eq!(states["never"].position, None, "a stream new to the log");
    }

    #[test]
    fn a_backfill_reads_every_stream_again_and_restarts_every_refresh() {
        let mut states = BTreeMap::new();
        states.insert("orders".to_string(), at(&["9", "3"]));
        states.insert("midway".to_string(), at(&["4"]));
        read_again(&mut states, &["orders".to_string(), "midway".to_string()]);
        let begins = begin_refreshes(&mut states, &set(&["midway"]), true);
        assert_eq!(begins, set(&["midway"]));
        for s in ["orders", "midway"] {
            assert_eq!(states[s].position, None, "{s}");
            assert!(states[s].rereading, "{s}");
            // What was delivered stays counted.
            assert_eq!(states[s].rows, 10, "{s}");
        }
    }
}
