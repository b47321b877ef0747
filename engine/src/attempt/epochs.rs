//! The epochs of an attempt: recover, open the streams from their resume
//! points, then barrier, stage and commit one epoch after the other until
//! the source has no more rows or a stop is asked for.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::json;

use crate::attempt::apply::crash_after_head;
use crate::attempt::barrier::take_round;
use crate::attempt::open::Opened;
use crate::attempt::options::Outcome;
use crate::attempt::recover::Recovered;
use crate::attempt::state::{Attempt, Progress, Source};
use crate::commit::protocol::Coordinator;
use crate::error::EngineError;
use crate::source::plan::Plan;
use crate::transport::control::Phase;

/// Reads every stream from where recovery left it, in epochs, until the
/// source has no more rows (or a stop is asked for, at a resume point).
pub(super) fn stream_epochs(
    a: &mut Attempt,
    plan: Plan,
    source: Source,
    lanes: usize,
    head_epoch: u64,
    head_record: Option<String>,
    full: bool,
) -> Result<Outcome, EngineError> {
    let Recovered {
        said,
        head,
        mut states,
        record: previous,
    } = a.recover(head_epoch, head_record)?;
    let begins = a.resume(&mut states, full)?;
    let crash_after = crash_after_head();
    // A continuous attempt follows the definition's lanes between epochs
    // (orca.scale_sync), unless the command line fixed them.
    let follows_lanes = plan.source.continuous().is_some() && a.opts.lanes.is_none();
    let mut opened = a.open(plan, source, lanes, head, &states)?;
    let mut p = Progress {
        out: Outcome {
            generation: a.generation,
            recovery: said,
            from_epoch: head,
            to_epoch: head,
            ..Outcome::default()
        },
        coord: Coordinator::new(lanes, head),
        pending: BTreeMap::new(),
        states,
        previous,
        begins,
    };
    a.report(|s| {
        s.phase = Phase::Streaming;
        s.head = head;
        s.committed = head;
    });
    loop {
        // Every epoch before this point is committed: a resume point.
        if a.stop_requested() {
            p.out.stopped = true;
            a.log
                .event("stopped", json!({"epoch": p.coord.last_committed()}));
            break;
        }
        // Barrier N sits after each stream's next chunk: a resume point.
        let started = Instant::now();
        let round = take_round(&mut opened.readers, &p.states, &a.overwrite)?;
        p.out.spent.waiting += started.elapsed();
        p.out.source_bytes += round.source_bytes;
        if round.is_empty() {
            break;
        }
        let epoch = p.coord.request_barrier(round.positions());
        let synced_at = chrono::Utc::now().timestamp_micros();
        let started = Instant::now();
        let staging = a.stage(&mut p, epoch, synced_at, round.chunks, &mut opened)?;
        let record = a.record(&mut p, epoch, staging, &round.ended);
        p.out.spent.staging += started.elapsed();
        let started = Instant::now();
        a.commit(&mut p, record, crash_after)?;
        if follows_lanes {
            a.follow_lanes(&mut p, &mut opened)?;
        }
        a.log.flush(&a.store)?;
        p.out.spent.committing += started.elapsed();
    }
    if p.out.stopped {
        // A reader still going fails at its next send once its channel is
        // gone, and ends with the process; nothing waits for it.
        drop(opened);
    } else {
        for r in &mut opened.readers {
            if let Some(h) = r.handle.take() {
                let _ = h.join();
            }
        }
    }
    let mut done = json!({"epoch": p.out.to_epoch, "rows": p.out.rows,
                          "source_bytes": p.out.source_bytes, "stopped": p.out.stopped});
    if let Some(d) = done.as_object_mut() {
        d.extend(p.out.spent.millis());
    }
    a.log.event("done", done);
    Ok(p.out)
}

impl Attempt {
    /// Takes the lanes the definition asks for now, at an epoch boundary
    /// (every epoch so far is committed): the routers split the next
    /// epoch's rows over them, and the coordinator waits for as many
    /// pre-commits.
    fn follow_lanes(&mut self, p: &mut Progress, opened: &mut Opened) -> Result<(), EngineError> {
        let asked = self.control.sync_lanes(
            &self.opts.sync,
            orca_core::api::Generation(self.generation),
            self.opts.lease_token(),
        )?;
        let lanes = asked
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(1)
            .clamp(1, orca_core::sync::MAX_LANES as usize);
        if lanes == opened.lanes {
            return Ok(());
        }
        p.coord.set_lanes(lanes)?;
        for r in opened.routers.values_mut() {
            *r = r.with_lanes(lanes);
        }
        self.log.event(
            "scaled",
            json!({"lanes": lanes, "was": opened.lanes, "after_epoch": p.coord.last_committed()}),
        );
        opened.lanes = lanes;
        Ok(())
    }
}
