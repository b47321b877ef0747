//! What an attempt holds from its claim to its end, and what its epochs
//! carry from one to the next.

use std::collections::{BTreeMap, BTreeSet};

use crate::attempt::log::Log;
use crate::attempt::options::{Options, Outcome};
use crate::commit::protocol::Coordinator;
use crate::commit::protocol::CrashPoint;
use crate::commit::record::{Layout, Record, StreamState};
use crate::commit::store::Store;
use crate::dest::destination::Dest;
use crate::dest::error::DestError;
use crate::error::EngineError;
use crate::source::normalize::{ColType, Policy};
use crate::source::postgres::table::PgTable;
use crate::transport::control::{Control, Status};
use crate::transport::edge::Edge;

pub(super) struct Attempt {
    pub(super) opts: Options,
    pub(super) control: orca_client::Control,
    pub(super) store: Store,
    pub(super) dest: Dest,
    pub(super) layout: Layout,
    pub(super) generation: i32,
    pub(super) log: Log,
    pub(super) streams: Vec<String>,
    /// The streams written with `overwrite`: each attempt refreshes them.
    pub(super) overwrite: BTreeSet<String>,
    /// The control channel, when a runner asked for one.
    pub(super) channel: Option<Control>,
    /// The data edge the runner's source pump connects to, when a runner
    /// hosts the source.
    pub(super) edge: Option<Edge>,
    /// A source read here that confirms upstream (a change stream, an
    /// external connector): where the commit protocol's acknowledgements
    /// go (with a runner's pump, they go over the edge).
    pub(super) acks: Option<crate::source::open::Upstream>,
    /// The source takes acknowledgements (a change stream, an external
    /// connector).
    pub(super) takes_acks: bool,
}

impl Attempt {
    /// Stops dead here if the injected crash says so.
    pub(super) fn crash_point(&self, at: CrashPoint, epoch: u64) -> Result<(), EngineError> {
        match self.opts.crash {
            Some(c) if c.at == at && c.epoch == epoch => Err(EngineError::Crashed { at, epoch }),
            _ => Ok(()),
        }
    }

    /// Tells the control channel, if there is one, how the attempt goes.
    pub(super) fn report(&self, f: impl FnOnce(&mut Status)) {
        if let Some(c) = &self.channel {
            c.update(f);
        }
    }

    pub(super) fn stop_requested(&self) -> bool {
        self.channel.as_ref().is_some_and(Control::stop_requested)
    }

    /// A newer attempt claimed the sync: this one stops without committing.
    pub(super) fn fenced(&self) -> EngineError {
        EngineError::Fenced {
            sync: self.opts.sync.clone(),
            generation: self.generation,
        }
    }

    /// A destination's error as the attempt's: its fence is the attempt's
    /// `Fenced`, whatever generation raised it.
    pub(super) fn dest_error(&self, e: DestError) -> EngineError {
        match e {
            DestError::Fenced { .. } => self.fenced(),
            other => other.into(),
        }
    }
}

/// Where the streams come from.
pub(super) enum Source {
    /// A Postgres table per stream, with its own types.
    Tables(Vec<PgTable>),
    /// Raw records (files, an external connector), made columns by what
    /// each stream declares and what its records hold.
    Raw(Vec<RawStream>),
}

/// A stream of raw records.
pub(super) struct RawStream {
    pub(super) name: String,
    pub(super) policy: Policy,
    /// The column types the definition declares.
    pub(super) declared: Vec<(String, ColType)>,
}

/// What each epoch leaves to the next.
pub(super) struct Progress {
    pub(super) out: Outcome,
    pub(super) coord: Coordinator,
    /// Records written or to be written, not yet committed, by epoch.
    pub(super) pending: BTreeMap<u64, Record>,
    /// Each stream's state after the last epoch staged.
    pub(super) states: BTreeMap<String, StreamState>,
    /// The last record written: the next record's `previous`.
    pub(super) previous: Option<String>,
    /// The `overwrite` streams whose refresh begins with the next epoch that
    /// says anything about them.
    pub(super) begins: BTreeSet<String>,
}
