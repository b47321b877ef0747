//! What an attempt does with the epoch HEAD names, after it claimed the sync
//! and raised the destination's fence to its generation.
//!
//! HEAD's epoch is committed as far as the log is concerned, but lane 0 may
//! not have made it visible before the previous attempt died. The destination
//! keeps, per stream, the last epoch it applied (its stream markers). So the
//! epoch is:
//! - **applied** when every stream's marker reached it: resume from record N;
//! - **recoverable** when some stream lacks it and the record's committables
//!   are all still there: apply them (idempotently, the markers skip streams
//!   already done), then resume from record N;
//! - **lost** when a committable needed is gone (its staged files expired or
//!   were cleaned up): go back to the preceding record and read epoch N again
//!   from there. That is only safe when nothing of epoch N became visible.

use std::collections::BTreeMap;

/// What the checkpoint record at HEAD says, and what the destination and the
/// staging area say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadState {
    /// HEAD's epoch (0: nothing committed yet).
    pub epoch: u64,
    /// The streams the record covers.
    pub streams: Vec<String>,
    /// The last epoch the destination applied, per stream (absent: none).
    pub markers: BTreeMap<String, u64>,
    /// Whether every committable of the record can still be applied.
    pub committables_available: bool,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing to do: resume reading from the record of `epoch`.
    Resume { epoch: u64 },
    /// Apply the record's committables for these streams, then resume from it.
    Apply { epoch: u64, streams: Vec<String> },
    /// The epoch cannot be applied: resume from the preceding record.
    Rewind { to: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    #[error(
        "stream {stream} shows epoch {marker} applied, past HEAD epoch {head}: \
         the destination was written by an attempt the log does not know"
    )]
    MarkerAheadOfHead {
        stream: String,
        marker: u64,
        head: u64,
    },
    #[error(
        "epoch {epoch} is partly visible (streams {applied:?}) and its other \
         committables are gone: rewinding would deliver those streams twice"
    )]
    PartlyAppliedAndLost { epoch: u64, applied: Vec<String> },
}

/// Decides what to do with HEAD's epoch.
pub fn decide(h: &HeadState) -> Result<Recovery, RecoveryError> {
    if let Some((stream, marker)) = h.markers.iter().find(|(_, m)| **m > h.epoch) {
        return Err(RecoveryError::MarkerAheadOfHead {
            stream: stream.clone(),
            marker: *marker,
            head: h.epoch,
        });
    }
    if h.epoch == 0 {
        return Ok(Recovery::Resume { epoch: 0 });
    }
    let applied = |s: &String| h.markers.get(s).is_some_and(|m| *m >= h.epoch);
    let missing: Vec<String> = h.streams.iter().filter(|s| !applied(s)).cloned().collect();
    if missing.is_empty() {
        return Ok(Recovery::Resume { epoch: h.epoch });
    }
    if h.committables_available {
        return Ok(Recovery::Apply {
            epoch: h.epoch,
            streams: missing,
        });
    }
    let done: Vec<String> = h.streams.iter().filter(|s| applied(s)).cloned().collect();
    if !done.is_empty() {
        return Err(RecoveryError::PartlyAppliedAndLost {
            epoch: h.epoch,
            applied: done,
        });
    }
    Ok(Recovery::Rewind { to: h.epoch - 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(epoch: u64, markers: &[(&str, u64)], available: bool) -> HeadState {
        HeadState {
            epoch,
            streams: vec!["orders".into(), "users".into()],
            markers: markers.iter().map(|(s, m)| (s.to_string(), *m)).collect(),
            committables_available: available,
        }
    }

    #[test]
    fn applied_recoverable_or_lost() {
        assert_eq!(
            decide(&head(7, &[("orders", 7), ("users", 7)], false)),
            Ok(Recovery::Resume { epoch: 7 })
        );
        assert_eq!(
            decide(&head(7, &[("orders", 7), ("users", 6)], true)),
            Ok(Recovery::Apply {
                epoch: 7,
                streams: vec!["users".into()]
            })
        );
        assert_eq!(
            decide(&head(7, &[("orders", 6)], true)),
            Ok(Recovery::Apply {
                epoch: 7,
                streams: vec!["orders".into(), "users".into()]
            })
        );
        assert_eq!(
            decide(&head(7, &[("orders", 6), ("users", 6)], false)),
            Ok(Recovery::Rewind { to: 6 })
        );
        assert_eq!(
            decide(&head(0, &[], false)),
            Ok(Recovery::Resume { epoch: 0 })
        );
    }

    #[test]
    fn impossible_states_are_errors_not_guesses() {
        assert!(matches!(
            decide(&head(7, &[("orders", 8)], true)),
            Err(RecoveryError::MarkerAheadOfHead { marker: 8, .. })
        ));
        assert_eq!(
            decide(&head(7, &[("orders", 7), ("users", 6)], false)),
            Err(RecoveryError::PartlyAppliedAndLost {
                epoch: 7,
                applied: vec!["orders".into()]
            })
        );
    }
}
