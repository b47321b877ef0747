//! The stream readers of an attempt: one thread per stream that cuts the
//! stream into chunks of `batch_rows` (each chunk's end is a resume point, so
//! barrier N sits after a stream's N-th chunk) and hands them over through a
//! channel of one, so a reader decodes the next chunk while the attempt
//! stages this one.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::source::error::ReadError;
pub(crate) use crate::source::msg::Msg;
use crate::source::normalize::StreamSchema;
use crate::source::postgres::table::PgTable;

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
pub(crate) fn spawn(
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
