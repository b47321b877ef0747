//! Opening a plan's files streams: a reader thread per stream, reading its
//! pattern's files as raw records from its resume point.

use std::path::PathBuf;

use orca_core::sync::Source;

use crate::commit::store::Store;
use crate::netguard::Guard;
use crate::source::error::ReadError;
use crate::source::files::parquet::{self, spawn_parquet_reader, Place};
use crate::source::files::reader::{FileReader, Format};
use crate::source::msg::Msg;
use crate::source::normalize::StreamSchema;
use crate::source::plan::Describe;
use crate::source::plan::{url_of, Plan};
use crate::source::postgres::table::PgTable;
use crate::source::readers::{spawn, Reader, Shape};
use crate::util::Missing;

/// A reader per files stream of the plan, in the plan's order.
pub(crate) fn open_files(plan: &Plan, guard: &Guard) -> Result<Vec<Reader>, ReadError> {
    let url = url_of(&plan.source)?;
    let format = match &plan.source {
        Source::Files { format, .. } => *format,
        other => {
            return Err(ReadError::Definition(format!(
                "a {} source is not files",
                other.kind()
            )))
        }
    };
    // The directory as netguard allowed it, links resolved: each file is
    // then read only if it lies under it (FileReader).
    let root = guard.place(url)?;
    let url = match &root {
        Some(real) => real.display().to_string(),
        None => url.to_string(),
    };
    if format == Format::Parquet {
        let place = Place::open(&url, root.clone())?;
        return plan
            .started()?
            .into_iter()
            .map(|(start, stream)| {
                let table = parquet::describe(&place, stream)?.under_policy(&start.recorded)?;
                spawn_parquet_reader(
                    url.clone(),
                    root.clone(),
                    table,
                    start.after.clone(),
                    plan.batch_rows,
                )
            })
            .collect();
    }
    plan.started()?
        .into_iter()
        .map(|(start, stream)| {
            let pattern = stream
                .pattern
                .clone()
                .ok_or_else(|| Missing::of("pattern", stream))?;
            spawn_file_reader(
                url.clone(),
                root.clone(),
                format,
                start.name.clone(),
                pattern,
                start.after.clone(),
                plan.batch_rows,
            )
        })
        .collect()
}

/// Reads a files stream as raw records, from its resume point.
fn spawn_file_reader(
    url: String,
    root: Option<PathBuf>,
    format: Format,
    name: String,
    pattern: String,
    after: Option<Vec<String>>,
    batch_rows: usize,
) -> Result<Reader, ReadError> {
    let stream = name.clone();
    spawn(name, Shape::Inferred(StreamSchema::default()), move |tx| {
        let store = Store::open_existing(&url)?;
        let root = root.or_else(|| store.local_dir().map(std::path::Path::to_path_buf));
        let mut r =
            FileReader::open_under(store, root, format, &stream, &pattern, after.as_deref())?;
        while let Some(chunk) = r.next_chunk(batch_rows)? {
            if tx.send(Ok(Msg::Raw(chunk))).is_err() {
                return Ok(());
            }
        }
        let _ = tx.send(Ok(Msg::End { bytes: 0 }));
        Ok(())
    })
}

/// The tables of a parquet files source's streams, as their files' footers
/// describe them, in the streams' order.
pub(crate) fn describe(request: &Describe) -> Result<Vec<PgTable>, ReadError> {
    let guard = Guard::new(&request.guard)?;
    let url = url_of(&request.source)?;
    let root = guard.place(url)?;
    let url = match &root {
        Some(real) => real.display().to_string(),
        None => url.to_string(),
    };
    let place = Place::open(&url, root)?;
    request
        .streams
        .iter()
        .map(|s| parquet::describe(&place, s))
        .collect()
}
