//! Parquet files as a typed source: a stream's columns are the union of its
//! files' columns, read from their footers, in the types a Postgres table's
//! would travel in (so the attempt, the data edge and every destination
//! take them as they take a table's); its rows are read in file-name order,
//! resumable by file and row, each with an `_orca_id` of its file and row.
//!
//! Files are taken to be immutable once written, as for JSON lines and CSV:
//! reading again from a resume point returns exactly the rows after it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{new_null_array, Array, ArrayRef, RecordBatch, StringArray};
use arrow_cast::cast::{can_cast_types, cast_with_options, CastOptions};
use arrow_cast::display::{ArrayFormatter, FormatOptions};
use arrow_schema::DataType;
use bytes::{Buf, Bytes};
use orca_core::sync::Stream;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::reader::{ChunkReader, Length};

use crate::commit::store::Store;
use crate::source::error::ReadError;
use crate::source::files::reader::{matching, open_checked, FilesError};
use crate::source::msg::Msg;
use crate::source::normalize::record_id;
use crate::source::postgres::copy::{PgColumn, PgKind};
use crate::source::postgres::table::{PgTable, StreamSpec};
use crate::source::readers::{spawn, Reader, Shape};
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

    fn chunks(&self, file: &str) -> Result<Chunks, ReadError> {
        match &self.root {
            Some(root) => Ok(Chunks::Local(open_checked(root, file)?.0)),
            None => {
                let size = self.store.size(file)?.ok_or_else(|| FilesError::Vanished {
                    file: file.to_string(),
                })?;
                Ok(Chunks::Remote {
                    store: self.store.clone(),
                    file: file.to_string(),
                    size,
                })
            }
        }
    }

    fn reader(&self, file: &str) -> Result<ParquetRecordBatchReaderBuilder<Chunks>, ReadError> {
        ParquetRecordBatchReaderBuilder::try_new(self.chunks(file)?).map_err(|e| {
            ReadError::Files(FilesError::Local {
                file: file.to_string(),
                reason: format!("not a Parquet file it can read: {e}"),
            })
        })
    }
}

/// A Parquet file's bytes: a local file (opened and checked), or an
/// object's ranges fetched as the reader asks for them.
enum Chunks {
    Local(std::fs::File),
    Remote {
        store: Arc<Store>,
        file: String,
        size: u64,
    },
}

impl Length for Chunks {
    fn len(&self) -> u64 {
        match self {
            Chunks::Local(f) => Length::len(f),
            Chunks::Remote { size, .. } => *size,
        }
    }
}

impl ChunkReader for Chunks {
    type T = Box<dyn std::io::Read + Send>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match self {
            Chunks::Local(f) => Ok(Box::new(f.get_read(start)?)),
            Chunks::Remote { size, .. } => Ok(Box::new(
                self.get_bytes(start, (size.saturating_sub(start)) as usize)?
                    .reader(),
            )),
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match self {
            Chunks::Local(f) => f.get_bytes(start, length),
            Chunks::Remote { store, file, .. } => store
                .get_range(file, start, start + length as u64)
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e))),
        }
    }
}

/// The kind a Parquet column travels as: the types a Postgres column
/// travels in, widened where Arrow has more (unsigned integers, half
/// floats, other units of time); what none holds (lists, structs, maps,
/// times of day, intervals) travels as its text.
fn kind_of(t: &DataType) -> PgKind {
    match t {
        DataType::Boolean => PgKind::Bool,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => PgKind::Int2,
        DataType::Int32 | DataType::UInt16 => PgKind::Int4,
        DataType::Int64 | DataType::UInt32 => PgKind::Int8,
        DataType::UInt64 => PgKind::Numeric {
            precision: 20,
            scale: 0,
        },
        DataType::Float16 | DataType::Float32 => PgKind::Float4,
        DataType::Float64 => PgKind::Float8,
        DataType::Decimal32(p, s) | DataType::Decimal64(p, s) | DataType::Decimal128(p, s) => {
            PgKind::Numeric {
                precision: *p,
                scale: *s,
            }
        }
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => PgKind::Bytea,
        DataType::Date32 | DataType::Date64 => PgKind::Date,
        DataType::Timestamp(_, None) => PgKind::Timestamp,
        DataType::Timestamp(_, Some(_)) => PgKind::TimestampTz,
        DataType::Dictionary(_, values) => kind_of(values),
        _ => PgKind::Text,
    }
}

/// The SQL name of a kind, as a table's catalog would give it.
pub(crate) fn sql_type(k: PgKind) -> String {
    match k {
        PgKind::Bool => "boolean".into(),
        PgKind::Int2 => "smallint".into(),
        PgKind::Int4 => "integer".into(),
        PgKind::Int8 => "bigint".into(),
        PgKind::Float4 => "real".into(),
        PgKind::Float8 => "double precision".into(),
        PgKind::Text => "text".into(),
        PgKind::Jsonb => "jsonb".into(),
        PgKind::Bytea => "bytea".into(),
        PgKind::Date => "date".into(),
        PgKind::Timestamp => "timestamp without time zone".into(),
        PgKind::TimestampTz => "timestamp with time zone".into(),
        PgKind::Uuid => "uuid".into(),
        PgKind::Numeric { precision, scale } => format!("numeric({precision},{scale})"),
    }
}

/// The kind that holds both, for a column two files give different types:
/// a wider integer, a float for integers and floats; None for anything
/// else.
fn widen(a: PgKind, b: PgKind) -> Option<PgKind> {
    use PgKind::*;
    let rank = |k: PgKind| match k {
        Int2 => Some(1),
        Int4 => Some(2),
        Int8 => Some(3),
        Float4 => Some(4),
        Float8 => Some(5),
        _ => None,
    };
    if a == b {
        return Some(a);
    }
    match (rank(a)?, rank(b)?) {
        (x, y) if x <= 3 && y <= 3 => Some(if x > y { a } else { b }),
        (4, 4) => Some(Float4),
        _ => Some(Float8),
    }
}

/// The columns of one schema as a stream's, each nullable, but for those
/// with the engine's reserved prefix `_orca_` (an earlier sync's own).
pub(crate) fn columns_of(schema: &arrow_schema::Schema) -> Vec<PgColumn> {
    schema
        .fields()
        .iter()
        .filter(|f| !f.name().starts_with("_orca_"))
        .map(|f| PgColumn {
            name: f.name().clone(),
            kind: kind_of(f.data_type()),
            nullable: true,
        })
        .collect()
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
        // An earlier sync's own columns (`_orca_id`, ...) are its, not the
        // rows': this sync adds its own.
        for f in schema
            .fields()
            .iter()
            .filter(|f| !f.name().starts_with("_orca_"))
        {
            let kind = kind_of(f.data_type());
            match columns.iter_mut().find(|c| c.name == *f.name()) {
                None => {
                    from.insert(f.name().clone(), file.clone());
                    columns.push(PgColumn {
                        name: f.name().clone(),
                        kind,
                        nullable: true,
                    });
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
    let n = columns.len();
    Ok(PgTable {
        spec: StreamSpec {
            name: stream.name.clone(),
            table: pattern,
            cursor: String::new(),
            primary_key: stream.primary_key.clone(),
            schema_policy: stream.schema_policy,
            lookback: None,
            cdc: false,
            splits: None,
        },
        sql_types: columns.iter().map(|c| sql_type(c.kind)).collect(),
        columns,
        as_text: vec![false; n],
        key: Vec::new(),
    })
}

/// A batch's columns as the stream's: each cast to its kind's type (a
/// value that does not fit is an error naming it, never a silent null),
/// one the file lacks as nulls, one that travels as text formatted.
pub(crate) fn conform(
    batch: &RecordBatch,
    table: &PgTable,
    file: &str,
) -> Result<Vec<ArrayRef>, ReadError> {
    let strict = CastOptions {
        safe: false,
        ..CastOptions::default()
    };
    let fail = |column: &str, reason: String| ReadError::Stream {
        stream: table.spec.name.clone(),
        reason: format!("{file}: column {column}: {reason}"),
    };
    table
        .columns
        .iter()
        .map(|c| {
            let want = c.kind.data_type();
            let Some(a) = batch.column_by_name(&c.name) else {
                return Ok(new_null_array(&want, batch.num_rows()));
            };
            if a.data_type() == &want {
                return Ok(a.clone());
            }
            if c.kind == PgKind::Text && !can_cast_types(a.data_type(), &want) {
                let opts = FormatOptions::default();
                let f = ArrayFormatter::try_new(a.as_ref(), &opts)
                    .map_err(|e| fail(&c.name, e.to_string()))?;
                let text: StringArray = (0..a.len())
                    .map(|i| a.is_valid(i).then(|| f.value(i).to_string()))
                    .collect();
                return Ok(Arc::new(text) as ArrayRef);
            }
            cast_with_options(a, &want, &strict).map_err(|e| {
                fail(
                    &c.name,
                    format!("{} does not fit {}: {e}", a.data_type(), sql_type(c.kind)),
                )
            })
        })
        .collect()
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
            let batches = place
                .reader(&file)?
                .with_batch_size(batch_rows.max(1))
                .with_offset(offset)
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
                let arrays = conform(&b, &t, &file)?;
                let ids: StringArray = (row..row + rows)
                    .map(|r| Some(record_id(&name, &format!("{file}\u{1f}{r}"))))
                    .collect();
                row += rows;
                let chunk = Msg::Chunk {
                    arrays,
                    ids: Arc::new(ids),
                    last: vec![file.clone(), row.to_string()],
                    rows,
                };
                if tx.send(Ok(chunk)).is_err() {
                    return Ok(());
                }
            }
        }
        let _ = tx.send(Ok(Msg::End { bytes: 0 }));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrow_types_travel_as_the_kinds_a_table_would() {
        use arrow_schema::TimeUnit;
        for (t, k) in [
            (DataType::Int32, PgKind::Int4),
            (DataType::UInt32, PgKind::Int8),
            (
                DataType::UInt64,
                PgKind::Numeric {
                    precision: 20,
                    scale: 0,
                },
            ),
            (DataType::LargeUtf8, PgKind::Text),
            (
                DataType::Timestamp(TimeUnit::Nanosecond, Some("+02:00".into())),
                PgKind::TimestampTz,
            ),
            (
                DataType::Timestamp(TimeUnit::Millisecond, None),
                PgKind::Timestamp,
            ),
            (DataType::Date64, PgKind::Date),
            (
                DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
                PgKind::Text,
            ),
            (
                DataType::List(Arc::new(arrow_schema::Field::new(
                    "x",
                    DataType::Int64,
                    true,
                ))),
                PgKind::Text,
            ),
        ] {
            assert_eq!(kind_of(&t), k, "{t}");
        }
    }

    #[test]
    fn integers_and_floats_widen_and_nothing_else_does() {
        use PgKind::*;
        assert_eq!(widen(Int2, Int8), Some(Int8));
        assert_eq!(widen(Int8, Int4), Some(Int8));
        assert_eq!(widen(Int8, Float4), Some(Float8));
        assert_eq!(widen(Float4, Float4), Some(Float4));
        assert_eq!(widen(Float4, Float8), Some(Float8));
        assert_eq!(widen(Text, Text), Some(Text));
        assert_eq!(widen(Int8, Text), None);
        assert_eq!(widen(Timestamp, TimestampTz), None);
    }
}
