//! Committing an epoch: every lane pre-commits its staged files, the record
//! is written and HEAD moves to it (the commit point), then the destination
//! applies the epoch and its staged files go, as the coordinator says.

use std::collections::VecDeque;

use bytes::Bytes;
use orca_core::api::{Epoch, Generation};
use orca_core::sqlstate;
use serde_json::json;

use crate::attempt::state::{Attempt, Progress};
use crate::commit::protocol::CrashPoint;
use crate::commit::protocol::{Action, Committable, ProtocolError};
use crate::commit::record::{Record, Staged};
use crate::dest::destination::How;
use crate::dest::error::DestError;
use crate::error::EngineError;

/// A test hook: the epoch at whose commit point the engine aborts, after
/// HEAD moved and before lane 0 commits, as a crash would
/// (`ORCA_ENGINE_CRASH_AFTER_HEAD`). Only in a build with the
/// `fault-injection` feature (the end-to-end tests'): a shipping engine
/// ignores the variable.
#[cfg(feature = "fault-injection")]
pub(super) fn crash_after_head() -> Option<u64> {
    std::env::var("ORCA_ENGINE_CRASH_AFTER_HEAD")
        .ok()
        .and_then(|v| v.parse().ok())
}

#[cfg(not(feature = "fault-injection"))]
pub(super) fn crash_after_head() -> Option<u64> {
    None
}

impl Attempt {
    /// Commits `record`'s epoch through the coordinator: each lane
    /// pre-commits, then the actions that follow are carried out in order
    /// (write the record and move HEAD, then apply it).
    pub(super) fn commit(
        &mut self,
        p: &mut Progress,
        record: Record,
        crash_after: Option<u64>,
    ) -> Result<(), EngineError> {
        let epoch = record.epoch;
        // Every lane crossed barrier N with its files staged: each
        // pre-commits, and the record is written once the last one has.
        let mut actions: VecDeque<Action> = VecDeque::new();
        for c in &record.committables {
            let payload = serde_json::to_string(c).unwrap_or_default();
            actions.extend(p.coord.pre_committed(
                epoch,
                Committable {
                    lane: c.lane,
                    payload,
                },
            )?);
        }
        p.pending.insert(epoch, record);
        self.crash_point(CrashPoint::Staged, epoch)?;
        while let Some(action) = actions.pop_front() {
            match action {
                Action::WriteRecord { epoch, .. } => {
                    let record = p
                        .pending
                        .get(&epoch)
                        .ok_or(ProtocolError::UnknownEpoch { epoch })?;
                    let record = record.clone();
                    let path = self.write_record(&record)?;
                    self.crash_point(CrashPoint::HeadMoved, epoch)?;
                    if crash_after == Some(epoch) {
                        // A test hook: die at the commit point, after HEAD
                        // moved and before lane 0 commits, as a crash would.
                        eprintln!("orca-engine: ORCA_ENGINE_CRASH_AFTER_HEAD={epoch}: aborting");
                        std::process::abort();
                    }
                    p.previous = Some(path);
                    p.out.to_epoch = epoch;
                    self.report(|s| s.head = epoch);
                    actions.extend(p.coord.head_moved(epoch)?);
                }
                Action::Commit { epoch } => {
                    let record = p
                        .pending
                        .remove(&epoch)
                        .ok_or(ProtocolError::UnknownEpoch { epoch })?;
                    let streams = self.streams.clone();
                    self.apply(&record, &streams)?;
                    let rows = p.out.rows;
                    self.report(|s| {
                        s.committed = epoch;
                        s.rows = rows;
                        for (name, st) in &record.streams {
                            let e = s.streams.entry(name.clone()).or_default();
                            e.position.clone_from(&st.position);
                        }
                        for staged in record.committables.iter().flat_map(|c| &c.staged) {
                            if let Some(e) = s.streams.get_mut(&staged.stream) {
                                e.rows += staged.rows;
                            }
                        }
                    });
                    actions.extend(p.coord.committed(epoch)?);
                }
                // A change stream may let its slot forget what a
                // committed epoch holds, an external connector its source;
                // a table has nothing to tell.
                Action::Acknowledge { .. } if !self.takes_acks => {}
                Action::Acknowledge { epoch, positions } => {
                    // A pump reads ack frames only from such a source.
                    if let Some(edge) = &self.edge {
                        edge.acknowledge(&positions);
                    }
                    if let Some(acks) = &self.acks {
                        acks.acknowledge(positions.iter().map(|(s, p)| (s.as_str(), p.as_str())));
                    }
                    self.log.event(
                        "acknowledged",
                        json!({"epoch": epoch, "positions": positions}),
                    );
                }
            }
        }
        Ok(())
    }

    /// Writes record N, moves HEAD to it (the commit point).
    pub(super) fn write_record(&mut self, record: &Record) -> Result<String, EngineError> {
        let path = self.layout.record(record.epoch, self.generation);
        let body = serde_json::to_vec_pretty(record).map_err(|e| EngineError::BadRecord {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        self.store.create(&path, Bytes::from(body))?;
        self.crash_point(CrashPoint::Recorded, record.epoch)?;
        let r = self.control.advance_head(
            &self.opts.sync,
            Generation(self.generation),
            Epoch(record.epoch),
            &path,
            self.opts.lease_token(),
        );
        match r {
            Ok(()) => {
                self.report_epoch(record);
                Ok(path)
            }
            Err(e) if e.is(sqlstate::FENCED) => {
                self.log.event("fenced", json!({"epoch": record.epoch}));
                Err(self.fenced())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Copies the committed epoch's figures to the control plane
    /// (`orca.record_epoch`). Best effort: HEAD has moved, the record holds
    /// the same figures, and a failure here must not fail the epoch.
    fn report_epoch(&mut self, record: &Record) {
        let mut rows: std::collections::BTreeMap<&str, u64> =
            record.streams.keys().map(|s| (s.as_str(), 0)).collect();
        for staged in record.committables.iter().flat_map(|c| &c.staged) {
            *rows.entry(staged.stream.as_str()).or_default() += staged.rows;
        }
        let stats = json!({
            "rows": rows,
            "quarantined": record.quarantined.len(),
            "held": record.held.len(),
        });
        if let Err(e) = self.control.record_epoch(
            &self.opts.sync,
            Generation(self.generation),
            Epoch(record.epoch),
            &stats,
            self.opts.lease_token(),
        ) {
            self.log.event(
                "epoch.figures_not_recorded",
                json!({"epoch": record.epoch, "error": e.to_string()}),
            );
        }
    }

    /// Makes a recorded epoch visible for these streams and lets its staged
    /// files go.
    pub(super) fn apply(&mut self, record: &Record, streams: &[String]) -> Result<(), EngineError> {
        let staged: Vec<&Staged> = record
            .committables
            .iter()
            .flat_map(|c| c.staged.iter())
            .collect();
        for s in streams {
            let files: Vec<&Staged> = staged.iter().copied().filter(|f| &f.stream == s).collect();
            let how = How {
                refresh: record.refresh.get(s).copied(),
                skip_known: record.streams.get(s).is_some_and(|st| st.rereading),
            };
            let applied =
                self.dest
                    .apply(&self.store, self.generation, record.epoch, s, &files, how);
            // An older attempt that moved HEAD before this one claimed may
            // have been applying the same epoch meanwhile: it deletes the
            // staged files once its marker is written, so files gone with the
            // marker at the epoch mean the epoch is in.
            let applied = match applied {
                Err(DestError::StagedGone { .. }) if self.dest.marker(s)? >= record.epoch => {
                    self.log.event(
                        "epoch.applied_by_another",
                        json!({"epoch": record.epoch, "stream": s}),
                    );
                    Ok(())
                }
                other => other,
            };
            applied.map_err(|e| self.dest_error(e))?;
        }
        self.crash_point(CrashPoint::Applied, record.epoch)?;
        for f in staged {
            self.store.delete(&f.path)?;
        }
        self.log.event(
            "epoch.committed",
            json!({"epoch": record.epoch, "streams": streams}),
        );
        Ok(())
    }
}

#[cfg(all(test, not(feature = "fault-injection")))]
mod shipping {
    /// A build without the `fault-injection` feature (every build but the
    /// end-to-end tests') never aborts for the variable.
    #[test]
    fn a_build_without_fault_injection_ignores_the_crash_variable() {
        std::env::set_var("ORCA_ENGINE_CRASH_AFTER_HEAD", "1");
        assert_eq!(super::crash_after_head(), None);
    }
}
