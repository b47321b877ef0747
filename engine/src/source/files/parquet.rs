//! Parquet files as a typed source: a stream's columns are the union of its
//! files' columns, read from their footers, in the types a Postgres table's
//! would travel in ([`crate::source::typed`]: so the attempt, the data edge
//! and every destination take them as they take a table's); its rows are
//! read in file-name order, resumable by file and row, each with an
//! `_orca_id` of its file and row.
//!
//! Files are taken to be immutable once written, as for JSON lines and CSV:
//! reading again from a resume point returns exactly the rows after it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use orca_core::sync::Stream;
use orca_lake::ranged::{starting_at, Ranged};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use crate::commit::store::Store;
use crate::source::error::ReadError;
use crate::source::files::reader::{matching, open_checked, FilesError};
use crate::source::msg::Msg;
use crate::source::postgres::copy::PgColumn;
use crate::source::postgres::table::PgTable;
use crate::source::readers::{spawn, Reader, Shape};
use crate::source::typed::{chunk_of, columns_of, sql_type, table_of, widen};
use crate::util::Missing;

/// Where a stream's files are: the store, and for a local directory its
/// path as netguard allowed it (every file is opened and checked to lie
/// under it).
pub(crate) struct Place {
    pub store: Arc<Store>,
    pub root: Option<PathBuf>,
}

impl Place {
    /// Opens the place a files source names.
    pub(crate) fn open(url: &str, root: Option<PathBuf>) -> Result<Place, ReadError> {
        let store = Store::open_existing(url)?;
        let root = root.or_else(|| store.local_dir().map(Path::to_path_buf));
        Ok(Place {
            store: Arc::new(store),
            root,
        })
    }

    /// A file of the place, read by ranges: a local one (opened and checked
    /// under the directory) by positioned reads, an object by ranged GETs.
    fn file(&self, file: &str) -> Result<Ranged, ReadError> {
        match &self.root {
            Some(root) => {
                let f = open_checked(root, file)?.0;
                let len = f
                    .metadata()
                    .map_err(|e| FilesError::Local {
                        file: file.to_string(),
                        reason: format!("looking it up: {e}"),
                    })?
                    .len();
                Ok(Ranged::new(
                    len,
                    Box::new(move |r: std::ops::Range<u64>| {
                        use std::os::unix::fs::FileExt;
                        let mut buf = vec![0; (r.end - r.start) as usize];
                        f.read_exact_at(&mut buf, r.start)?;
                        Ok(Bytes::from(buf))
                    }),
                ))
            }
            None => {
                let size = self.store.size(file)?.ok_or_else(|| FilesError::Vanished {
                    file: file.to_string(),
                })?;
                let (store, name) = (self.store.clone(), file.to_string());
                Ok(Ranged::new(
                    size,
                    Box::new(move |r: std::ops::Range<u64>| {
                        Ok(store.get_range(&name, r.start, r.end)?)
                    }),
                ))
            }
        }
    }

    fn reader(&self, file: &str) -> Result<ParquetRecordBatchReaderBuilder<Ranged>, ReadError> {
        self.file(file)?.reader().map_err(|e| {
            ReadError::Files(FilesError::Local {
                file: file.to_string(),
                reason: format!("not a Parquet file it can read: {e}"),
            })
        })
    }
}

/// A stream of Parquet files, described: its columns, the union of its
/// files' columns in the order first seen (each nullable, since a file may
/// lack it), but for those with the engine's reserved prefix `_orca_`.
pub(crate) fn describe(place: &Place, stream: &Stream) -> Result<PgTable, ReadError> {
    let pattern = stream
        .pattern
        .clone()
        .ok_or_else(|| Missing::of("pattern", stream))?;
    let files = matching(&place.store, &stream.name, &pattern)?;
    let mut columns: Vec<PgColumn> = Vec::new();
    // Where each column got its kind, to name both files when one disagrees.
    let mut from: BTreeMap<String, String> = BTreeMap::new();
    for file in &files {
        let schema = place.reader(file)?.schema().clone();
        // An earlier sync's own columns (`_orca_id`, ...) are left out.
        for col in columns_of(&schema) {
            let kind = col.kind;
            match columns.iter_mut().find(|c| c.name == col.name) {
                None => {
                    from.insert(col.name.clone(), file.clone());
                    columns.push(col);
                }
                Some(c) => {
                    c.kind = widen(c.kind, kind).ok_or_else(|| ReadError::Stream {
                        stream: stream.name.clone(),
                        reason: format!(
                            "column {} is {} in {} and {} in {file}: a column of a parquet \
                             stream keeps one type (integers and floats widen)",
                            c.name,
                            sql_type(c.kind),
                            from.get(&c.name).map_or("an earlier file", String::as_str),
                            sql_type(kind),
                        ),
                    })?;
                }
            }
        }
    }
    if let Some(k) = stream
        .primary_key
        .iter()
        .find(|k| !columns.iter().any(|c| &c.name == *k))
    {
        return Err(ReadError::Stream {
            stream: stream.name.clone(),
            reason: format!(
                "its primary key column {k} is in none of its {} files ({pattern})",
                files.len()
            ),
        });
    }
    Ok(table_of(stream, &pattern, columns))
}

/// Reads a Parquet stream from its resume point (`[file, rows read of it]`)
/// in chunks of at most `batch_rows` rows; a chunk never spans two files.
pub(crate) fn spawn_parquet_reader(
    url: String,
    root: Option<PathBuf>,
    table: PgTable,
    after: Option<Vec<String>>,
    batch_rows: usize,
) -> Result<Reader, ReadError> {
    let name = table.spec.name.clone();
    let t = table.clone();
    spawn(name.clone(), Shape::Table(table), move |tx| {
        let place = Place::open(&url, root)?;
        let (from_file, mut skip) = match after.as_deref() {
            None => (None, 0usize),
            Some([file, row]) => (
                Some(file.clone()),
                row.parse()
                    .map_err(|_| FilesError::BadPosition(vec![file.clone(), row.clone()]))?,
            ),
            Some(other) => return Err(FilesError::BadPosition(other.to_vec()).into()),
        };
        let files: Vec<String> = matching(&place.store, &name, &t.spec.table)?
            .into_iter()
            .filter(|f| from_file.as_ref().is_none_or(|from| f >= from))
            .collect();
        for file in files {
            // Only the resume point's own file starts past its first row.
            let offset = match &from_file {
                Some(from) if *from == file => std::mem::take(&mut skip),
                _ => 0,
            };
            let batches = starting_at(
                place.reader(&file)?.with_batch_size(batch_rows.max(1)),
                offset,
            )
            .build()
            .map_err(|e| FilesError::Local {
                file: file.clone(),
                reason: format!("reading it: {e}"),
            })?;
            let mut row = offset;
            for b in batches {
                let b = b.map_err(|e| FilesError::Local {
                    file: file.clone(),
                    reason: format!("reading row {row} on: {e}"),
                })?;
                let rows = b.num_rows();
                if rows == 0 {
                    continue;
                }
                let chunk = chunk_of(&t, &b, &file, row, |next| {
                    vec![file.clone(), next.to_string()]
                })?;
                row += rows;
                if tx.send(Ok(chunk)).is_err() {
                    return Ok(());
                }
            }
        }
        let _ = tx.send(Ok(Msg::End { bytes: 0 }));
        Ok(())
    })
}
