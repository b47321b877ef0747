//! The one dispatcher of a [`Plan`]: it starts the readers of the source's
//! family (a Postgres table or change stream, files, an external
//! connector). The engine calls it when it reads a source itself, and a
//! runner's pump when it hosts the source.

use orca_core::sync::{FileFormat, Source};

use crate::netguard::Guard;
use crate::source::error::ReadError;
use crate::source::external::connector::{spawn_connector, ConnectorAcks};
use crate::source::files::open::open_files;
use crate::source::plan::{Describe, Plan};
use crate::source::postgres::cdc::{lowest_acknowledged, Acks, SlotGauge};
use crate::source::postgres::open::{open_cdc, open_tables};
use crate::source::postgres::table::PgTable;
use crate::source::readers::Reader;

/// Where the commit protocol's acknowledgements go, for a source that
/// confirms upstream what a committed checkpoint covers.
pub(crate) enum Upstream {
    /// A change stream's slot: the lowest acknowledged LSN of its streams.
    Slot(Acks),
    /// An external connector: ack frames on its socket.
    Connector(ConnectorAcks),
}

impl Upstream {
    /// Takes the acknowledged resume points (stream, the point's values
    /// joined by U+001F).
    pub(crate) fn acknowledge<'a>(&self, positions: impl IntoIterator<Item = (&'a str, &'a str)>) {
        match self {
            Upstream::Slot(acks) => {
                let recorded = positions.into_iter().map(|(_, p)| p);
                if let Some(lsn) = lowest_acknowledged(recorded) {
                    acks.fetch_max(lsn.0, std::sync::atomic::Ordering::AcqRel);
                }
            }
            Upstream::Connector(c) => c.acknowledge(positions),
        }
    }
}

/// The typed streams a [`Describe`] asks for, looked up where the source
/// keeps their columns: a Postgres catalog, or Parquet files' footers.
pub(crate) fn describe(request: &Describe) -> Result<Vec<PgTable>, ReadError> {
    match &request.source {
        Source::Files {
            format: FileFormat::Parquet,
            ..
        } => crate::source::files::open::describe(request),
        Source::Postgres { .. } | Source::PostgresCdc { .. } => {
            crate::source::postgres::open::describe(request)
        }
        other => Err(ReadError::Definition(format!(
            "a {} source has no columns of its own to describe",
            other.kind()
        ))),
    }
}

/// Starts a reader thread per stream of the plan, reading the source
/// itself, and, for a source that confirms upstream (a change stream, an
/// external connector), where its acknowledgements go. A change stream's
/// slot is measured into `gauge`, if one is given, while its readers read.
pub(crate) fn open_readers(
    plan: &Plan,
    gauge: Option<&SlotGauge>,
) -> Result<(Vec<Reader>, Option<Upstream>), ReadError> {
    let guard = Guard::new(&plan.guard)?;
    match &plan.source {
        Source::Connector { .. } => {
            let (readers, acks) = spawn_connector(plan, &guard)?;
            Ok((readers, Some(Upstream::Connector(acks))))
        }
        Source::PostgresCdc { .. } => {
            let (readers, acks) = open_cdc(plan, guard, gauge)?;
            Ok((readers, Some(Upstream::Slot(acks))))
        }
        Source::Postgres { .. } => Ok((open_tables(plan, guard)?, None)),
        Source::Files { .. } => Ok((open_files(plan, &guard)?, None)),
        // The org's catalog is the engine's to open, with its lease.
        Source::Iceberg { .. } => Err(ReadError::Definition(
            "an iceberg source is read by the engine itself, not by a runner's pump".into(),
        )),
    }
}
