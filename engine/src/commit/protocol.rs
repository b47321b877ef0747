//! The coordinator of the commit protocol, as a state machine with no I/O.
//!
//! For each epoch N:
//! 1. the coordinator requests barrier N; the source pump places it after each
//!    split's next resume point;
//! 2. each writer lane, once all its streams crossed barrier N, pre-commits and
//!    hands back a committable (its data is durable, not yet visible);
//! 3. with every lane's committable, the coordinator writes record N and moves
//!    HEAD to it: the commit point;
//! 4. lane 0 commits N (idempotently) and makes it visible;
//! 5. the source may acknowledge the positions of the epoch before N: one
//!    checkpoint behind, so that a replay from record N-1 never needs what was
//!    acknowledged.
//!
//! Commits happen one at a time, in epoch order, while later barriers go on.
//! The caller feeds events in and carries out the [`Action`]s that come out.

use std::collections::BTreeMap;

/// What a lane hands back at a barrier: enough to make its staged data
/// visible later, by this attempt or by the next one's recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committable {
    pub lane: usize,
    /// Opaque to the coordinator: staged file references, a transaction id.
    pub payload: String,
}

/// The source's resume point for each split at a barrier.
pub type Positions = BTreeMap<String, String>;

/// What the caller must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write checkpoint record N with these committables and resume points,
    /// then move HEAD to it (`orca.advance_head`) and report
    /// [`Coordinator::head_moved`].
    WriteRecord {
        epoch: u64,
        committables: Vec<Committable>,
        positions: Positions,
    },
    /// Lane 0 commits epoch N; report [`Coordinator::committed`] when done.
    Commit { epoch: u64 },
    /// The source may acknowledge these positions upstream.
    Acknowledge { epoch: u64, positions: Positions },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("barrier {epoch} was never requested")]
    UnknownEpoch { epoch: u64 },
    #[error("lane {lane} does not exist (the sync has {lanes} lanes)")]
    UnknownLane { lane: usize, lanes: usize },
    #[error("lane {lane} pre-committed epoch {epoch} twice")]
    DuplicatePreCommit { lane: usize, epoch: u64 },
    #[error("epoch {epoch} reported {what} out of order (expected epoch {expected})")]
    OutOfOrder {
        epoch: u64,
        what: &'static str,
        expected: u64,
    },
}

#[derive(Debug, Default)]
struct Epoch {
    positions: Positions,
    committables: BTreeMap<usize, Committable>,
    recorded: bool,
}

/// The coordinator of one attempt.
#[derive(Debug)]
pub struct Coordinator {
    lanes: usize,
    /// The next barrier to request.
    next_barrier: u64,
    /// Epochs whose barrier was requested and that are not committed yet.
    open: BTreeMap<u64, Epoch>,
    /// The epoch the next record write is for (records go in order).
    next_record: u64,
    /// The epoch being committed by lane 0, if any.
    committing: Option<u64>,
    /// The last epoch lane 0 committed.
    last_committed: u64,
    /// Its positions, acknowledged when the next epoch commits.
    held_ack: Option<(u64, Positions)>,
}

impl Coordinator {
    /// A coordinator for an attempt that recovered to HEAD epoch `head`.
    pub fn new(lanes: usize, head: u64) -> Self {
        Coordinator {
            lanes: lanes.max(1),
            next_barrier: head + 1,
            open: BTreeMap::new(),
            next_record: head + 1,
            committing: None,
            last_committed: head,
            held_ack: None,
        }
    }

    /// Requests the next barrier; the source places it after each split's
    /// next resume point, given here. Returns its epoch.
    pub fn request_barrier(&mut self, positions: Positions) -> u64 {
        let epoch = self.next_barrier;
        self.next_barrier += 1;
        self.open.insert(
            epoch,
            Epoch {
                positions,
                ..Epoch::default()
            },
        );
        epoch
    }

    /// A lane pre-committed epoch N.
    pub fn pre_committed(
        &mut self,
        epoch: u64,
        committable: Committable,
    ) -> Result<Vec<Action>, ProtocolError> {
        if committable.lane >= self.lanes {
            return Err(ProtocolError::UnknownLane {
                lane: committable.lane,
                lanes: self.lanes,
            });
        }
        let e = self
            .open
            .get_mut(&epoch)
            .ok_or(ProtocolError::UnknownEpoch { epoch })?;
        if e.committables.contains_key(&committable.lane) {
            return Err(ProtocolError::DuplicatePreCommit {
                lane: committable.lane,
                epoch,
            });
        }
        e.committables.insert(committable.lane, committable);
        Ok(self.record_ready())
    }

    /// HEAD now names record N: the epoch is committed as far as the log is
    /// concerned, and lane 0 may make it visible once earlier ones are.
    pub fn head_moved(&mut self, epoch: u64) -> Result<Vec<Action>, ProtocolError> {
        let expected = self.next_record;
        let e = self
            .open
            .get_mut(&epoch)
            .ok_or(ProtocolError::UnknownEpoch { epoch })?;
        if epoch != expected || e.committables.len() < self.lanes {
            return Err(ProtocolError::OutOfOrder {
                epoch,
                what: "its HEAD move",
                expected,
            });
        }
        e.recorded = true;
        self.next_record += 1;
        let mut actions = self.commit_next();
        actions.extend(self.record_ready());
        Ok(actions)
    }

    /// Lane 0 finished committing epoch N.
    pub fn committed(&mut self, epoch: u64) -> Result<Vec<Action>, ProtocolError> {
        if self.committing != Some(epoch) {
            return Err(ProtocolError::OutOfOrder {
                epoch,
                what: "its commit",
                expected: self.committing.unwrap_or(self.last_committed + 1),
            });
        }
        self.committing = None;
        self.last_committed = epoch;
        let done = self.open.remove(&epoch).unwrap_or_default();
        let mut actions = Vec::new();
        // One checkpoint behind: what epoch N-1 read may be let go now that N
        // is visible, because a recovery never goes back before record N-1.
        if let Some((prev, positions)) = self.held_ack.replace((epoch, done.positions)) {
            actions.push(Action::Acknowledge {
                epoch: prev,
                positions,
            });
        }
        actions.extend(self.commit_next());
        Ok(actions)
    }

    /// Changes the number of writer lanes, between epochs only: every epoch
    /// whose barrier was requested must be committed first. Each epoch's
    /// record lists its own lanes' committables, so a recovery applies an
    /// epoch as it was staged whatever the lanes are now.
    pub fn set_lanes(&mut self, lanes: usize) -> Result<(), ProtocolError> {
        if let Some(epoch) = self.open.keys().next() {
            return Err(ProtocolError::OutOfOrder {
                epoch: *epoch,
                what: "a change of lanes",
                expected: self.last_committed + 1,
            });
        }
        self.lanes = lanes.max(1);
        Ok(())
    }

    /// The last epoch made visible.
    pub fn last_committed(&self) -> u64 {
        self.last_committed
    }

    /// The record to write next, when its epoch has every lane's committable.
    fn record_ready(&mut self) -> Vec<Action> {
        match self.open.get(&self.next_record) {
            Some(e) if !e.recorded && e.committables.len() == self.lanes => {
                vec![Action::WriteRecord {
                    epoch: self.next_record,
                    committables: e.committables.values().cloned().collect(),
                    positions: e.positions.clone(),
                }]
            }
            _ => Vec::new(),
        }
    }

    /// Lane 0's next commit, one at a time and in order.
    fn commit_next(&mut self) -> Vec<Action> {
        if self.committing.is_some() {
            return Vec::new();
        }
        let next = self.last_committed + 1;
        match self.open.get(&next) {
            Some(e) if e.recorded => {
                self.committing = Some(next);
                vec![Action::Commit { epoch: next }]
            }
            _ => Vec::new(),
        }
    }
}

/// Where in an epoch an injected crash strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// The epoch's files are staged; its record is not written.
    Staged,
    /// The record is in the store; HEAD has not moved to it.
    Recorded,
    /// HEAD moved (the commit point); lane 0 has not committed.
    HeadMoved,
    /// The destination applied the epoch; its staged files are still there.
    Applied,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(split: &str, pos: &str) -> Positions {
        [(split.to_string(), pos.to_string())].into()
    }

    fn c(lane: usize, epoch: u64) -> Committable {
        Committable {
            lane,
            payload: format!("lane{lane}-epoch{epoch}"),
        }
    }

    #[test]
    fn an_epoch_records_after_every_lane_and_commits_after_head() {
        let mut k = Coordinator::new(2, 0);
        let e1 = k.request_barrier(at("s", "10"));
        assert_eq!(e1, 1);
        assert_eq!(k.pre_committed(1, c(1, 1)), Ok(vec![]));
        let a = k.pre_committed(1, c(0, 1)).expect("second lane");
        assert_eq!(
            a,
            vec![Action::WriteRecord {
                epoch: 1,
                committables: vec![c(0, 1), c(1, 1)],
                positions: at("s", "10"),
            }]
        );
        assert_eq!(k.head_moved(1), Ok(vec![Action::Commit { epoch: 1 }]));
        // Nothing to acknowledge yet: one checkpoint behind.
        assert_eq!(k.committed(1), Ok(vec![]));
        assert_eq!(k.last_committed(), 1);
    }

    #[test]
    fn commits_go_one_at_a_time_in_order_while_barriers_go_on() {
        let mut k = Coordinator::new(1, 4);
        let e5 = k.request_barrier(at("s", "50"));
        let e6 = k.request_barrier(at("s", "60"));
        let e7 = k.request_barrier(at("s", "70"));
        assert_eq!((e5, e6, e7), (5, 6, 7));
        // Epoch 6's lane finishes first: its record waits for epoch 5's.
        assert_eq!(k.pre_committed(6, c(0, 6)), Ok(vec![]));
        let a = k.pre_committed(5, c(0, 5)).expect("5");
        assert!(
            matches!(a[..], [Action::WriteRecord { epoch: 5, .. }]),
            "{a:?}"
        );
        // Moving HEAD to 5 starts its commit and lets record 6 be written.
        let a = k.head_moved(5).expect("head 5");
        assert_eq!(a[0], Action::Commit { epoch: 5 });
        assert!(
            matches!(a[1], Action::WriteRecord { epoch: 6, .. }),
            "{a:?}"
        );
        // HEAD reaches 6 while 5 is still committing: 6 waits its turn.
        assert_eq!(k.head_moved(6), Ok(vec![]));
        assert_eq!(k.committed(5), Ok(vec![Action::Commit { epoch: 6 }]));
        // 6 visible: the source may let go of what epoch 5 read.
        let a = k.committed(6).expect("6");
        assert_eq!(
            a,
            vec![Action::Acknowledge {
                epoch: 5,
                positions: at("s", "50")
            }]
        );
        assert_eq!(k.last_committed(), 6);
        // Epoch 7 goes on as usual.
        let a = k.pre_committed(7, c(0, 7)).expect("7");
        assert!(matches!(a[..], [Action::WriteRecord { epoch: 7, .. }]));
    }

    #[test]
    fn reports_out_of_place_are_refused() {
        let mut k = Coordinator::new(1, 0);
        assert_eq!(
            k.pre_committed(3, c(0, 3)),
            Err(ProtocolError::UnknownEpoch { epoch: 3 })
        );
        k.request_barrier(Positions::new());
        k.request_barrier(Positions::new());
        assert_eq!(
            k.pre_committed(1, c(2, 1)),
            Err(ProtocolError::UnknownLane { lane: 2, lanes: 1 })
        );
        k.pre_committed(1, c(0, 1)).expect("1");
        assert_eq!(
            k.pre_committed(1, c(0, 1)),
            Err(ProtocolError::DuplicatePreCommit { lane: 0, epoch: 1 })
        );
        // HEAD cannot skip an epoch, nor move before every lane pre-committed.
        k.pre_committed(2, c(0, 2)).expect("2");
        assert!(matches!(
            k.head_moved(2),
            Err(ProtocolError::OutOfOrder { expected: 1, .. })
        ));
        // A commit that was not asked for.
        assert!(k.committed(1).is_err());
    }
}
