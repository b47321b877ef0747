//! Opening a plan's Postgres streams: a table read by its cursor (one
//! reader thread per stream, several connections for a big read), or every
//! stream of a change stream from the sync's slot (one thread for all).

use std::time::Duration;

use orca_core::sync::{Source, Stream, EPOCH_SECONDS_DEFAULT};

use crate::netguard::Guard;
use crate::source::error::ReadError;
use crate::source::msg::Msg;
use crate::source::plan::{url_of, Describe, Plan};
use crate::source::postgres::cdc::{spawn_cdc, Acks, SlotGauge};
use crate::source::postgres::conn::PgReader;
use crate::source::postgres::copy::CopyReader;
use crate::source::postgres::splits;
use crate::source::postgres::table::{self, PgTable, SourceError, StreamSpec};
use crate::source::readers::{spawn, Reader, Shape};
use crate::util::Missing;

/// A reader per table stream of the plan, in the plan's order.
pub(crate) fn open_tables(plan: &Plan, guard: Guard) -> Result<Vec<Reader>, ReadError> {
    let url = url_of(&plan.source)?;
    let mut probe = guard.postgres(url)?;
    plan.started()?
        .into_iter()
        .map(|(start, stream)| {
            let spec = table_spec(stream, false)?;
            let table = table::describe(&mut probe, &spec)?.under_policy(&start.recorded)?;
            spawn_table_reader(
                guard.clone(),
                url.to_string(),
                table,
                start.after.clone(),
                plan.batch_rows,
            )
        })
        .collect()
}

/// The change stream of the plan's streams, read from the sync's slot: a
/// reader per stream, in the plan's order, and the acknowledgements the
/// slot is told of. Its slot is measured into `gauge`, if one is given.
pub(crate) fn open_cdc(
    plan: &Plan,
    guard: Guard,
    gauge: Option<&SlotGauge>,
) -> Result<(Vec<Reader>, Acks), ReadError> {
    let url = url_of(&plan.source)?;
    let slot = plan.slot.clone().ok_or_else(|| {
        ReadError::Definition("the plan names no slot for a change stream".into())
    })?;
    let mut probe = guard.postgres(url)?;
    let mut streams = Vec::new();
    for (start, stream) in plan.started()? {
        let spec = table_spec(stream, true)?;
        streams.push((
            cdc_table(&mut probe, &spec, &start.recorded)?,
            start.after.clone(),
        ));
    }
    drop(probe);
    let continuous = match &plan.source {
        Source::PostgresCdc {
            continuous: Some(true),
            epoch_seconds,
            ..
        } => Some(Duration::from_secs(
            epoch_seconds.unwrap_or(EPOCH_SECONDS_DEFAULT),
        )),
        _ => None,
    };
    spawn_cdc(
        guard,
        url.to_string(),
        slot,
        streams,
        plan.batch_rows,
        continuous,
        gauge,
    )
}

/// The tables a [`Describe`] asks for, looked up in the source's catalog,
/// in the streams' order.
pub(crate) fn describe(request: &Describe) -> Result<Vec<PgTable>, ReadError> {
    let specs = table_specs(&request.streams, request.source.is_cdc())?;
    let mut client = Guard::new(&request.guard)?.postgres(url_of(&request.source)?)?;
    specs
        .iter()
        .map(|spec| Ok(table::describe(&mut client, spec)?))
        .collect()
}

/// A change stream's table, looked up, under the schema it delivered
/// before: a column that is gone stops it whatever its policy (a change
/// stream cannot tell a dropped column's later rows from nulls).
fn cdc_table(
    client: &mut postgres::Client,
    spec: &StreamSpec,
    recorded: &[(String, String)],
) -> Result<PgTable, ReadError> {
    let t = table::describe(client, spec)?;
    let gone: Vec<&str> = recorded
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !n.starts_with("_orca_") && !t.columns.iter().any(|c| c.name == *n))
        .collect();
    if !gone.is_empty() {
        return Err(ReadError::Table(SourceError::SchemaChanged {
            stream: spec.name.clone(),
            table: spec.table.clone(),
            policy: spec.schema_policy.name().to_string(),
            added: String::new(),
            missing: gone.join(", "),
        }));
    }
    Ok(t.under_policy(recorded)?)
}

/// The streams of a Postgres source: each needs its table, and a cursor
/// unless it is a change stream.
pub(crate) fn table_specs(streams: &[Stream], cdc: bool) -> Result<Vec<StreamSpec>, Missing> {
    streams.iter().map(|s| table_spec(s, cdc)).collect()
}

fn table_spec(s: &Stream, cdc: bool) -> Result<StreamSpec, Missing> {
    Ok(StreamSpec {
        name: s.name.clone(),
        table: s.table.clone().ok_or_else(|| Missing::of("table", s))?,
        cursor: match cdc {
            true => String::new(),
            false => s.cursor.clone().ok_or_else(|| Missing::of("cursor", s))?,
        },
        primary_key: s.primary_key.clone(),
        schema_policy: s.schema_policy,
        lookback: s.lookback.as_ref().map(|l| l.as_str().to_string()),
        cdc,
        splits: s.splits.and_then(|n| u8::try_from(n).ok()),
    })
}

/// Reads a table over a connection of its own, as binary COPY into Arrow,
/// from its resume point; a big read (or one a split read left off) over
/// several connections, split by ranges of the cursor.
fn spawn_table_reader(
    guard: Guard,
    url: String,
    table: PgTable,
    after: Option<Vec<String>>,
    batch_rows: usize,
) -> Result<Reader, ReadError> {
    let resumed = after.as_deref().and_then(splits::decode);
    let query = match resumed {
        Some(_) => String::new(),
        None => table.copy_query(after.as_deref())?,
    };
    let t = table.clone();
    let stream = table.spec.name.clone();
    spawn(stream.clone(), Shape::Table(table), move |tx| {
        let copy = |source| ReadError::Copy {
            stream: stream.clone(),
            source,
        };
        let mut client = PgReader::connect(&guard, &url)?;
        let planned = match resumed {
            Some(s) => Some(s),
            None => {
                let want = t
                    .spec
                    .splits
                    .map_or_else(splits::default_splits, usize::from);
                splits::plan(&mut client, &t, after.as_deref(), want, batch_rows)?
            }
        };
        if let Some(s) = planned {
            return splits::read_split(tx, &guard, &url, client, &t, s, batch_rows);
        }
        let input = client.copy_out(query.as_str())?;
        let mut r = CopyReader::new(input, t.columns.clone())
            .map_err(copy)?
            .with_ids(&stream, &t.key);
        loop {
            let more = r.read_row().map_err(copy)?;
            if r.pending() > 0 && (!more || r.pending() >= batch_rows) {
                let rows = r.pending();
                let ids = r.take_ids().ok_or_else(|| ReadError::Stream {
                    stream: stream.clone(),
                    reason: "no record ids".into(),
                })?;
                let arrays = r.take();
                let last = t.position_at(&arrays, rows - 1)?;
                let msg = Msg::Chunk {
                    arrays,
                    ids,
                    last,
                    rows,
                };
                if tx.send(Ok(msg)).is_err() {
                    return Ok(());
                }
            }
            if !more {
                let _ = tx.send(Ok(Msg::End { bytes: r.bytes }));
                return Ok(());
            }
        }
    })
}
