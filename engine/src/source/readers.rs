//! The stream readers of an attempt: one thread per stream that cuts the
//! stream into chunks of `batch_rows` (each chunk's end is a resume point, so
//! barrier N sits after a stream's N-th chunk) and hands them over through a
//! channel of one, so a reader decodes the next chunk while the attempt
//! stages this one.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::commit::store::Store;
use crate::netguard::Guard;
use crate::source::error::ReadError;
use crate::source::files::{FileReader, Format};
pub(crate) use crate::source::msg::Msg;
use crate::source::normalize::StreamSchema;
use crate::source::pg_copy::CopyReader;
use crate::source::pg_table::PgTable;
use crate::source::splits;

/// What a stream's rows become columns by.
pub(crate) enum Shape {
    /// The source table's own types.
    Table(PgTable),
    /// Inferred from the records and only ever widened.
    Inferred(StreamSchema),
}

pub(crate) struct Reader {
    pub name: String,
    pub shape: Shape,
    pub rx: Receiver<Result<Msg, ReadError>>,
    pub handle: Option<JoinHandle<()>>,
    /// The stream's end came through.
    pub done: bool,
}

/// Where a reader sends its chunks.
pub(crate) type Sender = SyncSender<Result<Msg, ReadError>>;

/// A reader per stream whose chunks come from elsewhere (a data edge, an
/// external connector), untyped until the attempt says, and the senders
/// that feed them, in the streams' order.
pub(crate) fn fed_readers(names: impl Iterator<Item = String>) -> (Vec<Sender>, Vec<Reader>) {
    names
        .map(|name| {
            let (tx, rx) = sync_channel(1);
            let r = Reader {
                name,
                shape: Shape::Inferred(StreamSchema::default()),
                rx,
                handle: None,
                done: false,
            };
            (tx, r)
        })
        .unzip()
}

/// Starts a stream's reader thread: `read` sends chunks until the stream
/// ends (or the attempt stops listening); an error it returns goes down the
/// same channel. One chunk waits in the channel while the next is read.
fn spawn(
    name: String,
    shape: Shape,
    read: impl FnOnce(&Sender) -> Result<(), ReadError> + Send + 'static,
) -> Result<Reader, ReadError> {
    let (tx, rx) = sync_channel(1);
    let handle = std::thread::Builder::new()
        .name(format!("read-{name}"))
        .spawn(move || {
            if let Err(e) = read(&tx) {
                let _ = tx.send(Err(e));
            }
        })
        .map_err(|e| ReadError::Stream {
            stream: name.clone(),
            reason: format!("starting its thread: {e}"),
        })?;
    Ok(Reader {
        name,
        shape,
        rx,
        handle: Some(handle),
        done: false,
    })
}

/// Reads a files stream as raw records, from its resume point.
pub(crate) fn spawn_file_reader(
    url: String,
    root: Option<std::path::PathBuf>,
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

/// Reads a table over a connection of its own, as binary COPY into Arrow,
/// from its resume point; a big read (or one a split read left off) over
/// several connections, split by ranges of the cursor.
pub(crate) fn spawn_reader(
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
        let mut client = guard.postgres(&url)?;
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
