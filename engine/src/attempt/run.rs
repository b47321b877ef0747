//! An attempt from its claim to its end, and what it reports then.

use serde_json::json;

use crate::attempt::claim::{claim, Claimed};
use crate::attempt::epochs::stream_epochs;
use crate::attempt::options::{Options, Outcome};
use crate::error::EngineError;
use crate::transport::control::Phase;

/// Runs one attempt of a sync until its source has no more rows.
pub fn run(opts: &Options) -> Result<Outcome, EngineError> {
    let Claimed {
        mut attempt,
        plan,
        source,
        lanes,
        head_epoch,
        head_record,
        full,
    } = claim(opts)?;
    let a = &mut attempt;
    let result = stream_epochs(a, plan, source, lanes, head_epoch, head_record, full);
    if let Err(EngineError::Crashed { .. }) = result {
        // A crash leaves nothing behind: no last log line, no report.
        return result;
    }
    match &result {
        Err(e) => {
            a.log.event("failed", json!({"error": e.to_string()}));
            a.report(|s| {
                s.phase = Phase::Failed;
                s.error = Some(e.to_string());
            });
        }
        Ok(o) => a.report(|s| {
            s.phase = if o.stopped {
                Phase::Stopped
            } else {
                Phase::Done
            }
        }),
    }
    match result {
        Ok(o) => {
            a.log.flush(&a.store)?;
            Ok(o)
        }
        // The attempt's own error is what it ends with: a store that fails
        // the log's last write too (it may be why the attempt failed) must
        // not put its error in that one's place.
        Err(e) => {
            let _ = a.log.flush(&a.store);
            Err(e)
        }
    }
}
