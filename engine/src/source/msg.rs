//! What a stream's reader hands the attempt: a chunk of rows (typed
//! columns or raw records), or the end of the stream.

use arrow_array::ArrayRef;

use crate::source::files::FileChunk;

pub(crate) enum Msg {
    /// Typed columns from a source that declares its types.
    Chunk {
        arrays: Vec<ArrayRef>,
        ids: ArrayRef,
        last: Vec<String>,
        rows: usize,
    },
    /// Raw records (or lines that are not records) to normalize.
    Raw(FileChunk),
    End {
        bytes: u64,
    },
}
