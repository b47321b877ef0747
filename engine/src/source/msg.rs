//! What a stream's reader hands the attempt: a chunk of rows (typed
//! columns or raw records), or the end of the stream.

use arrow_array::ArrayRef;

use crate::source::normalize::Raw;

/// Records read, or lines that are not records with the reason.
pub type RawRecords = Vec<Result<Raw, (Raw, String)>>;

/// What a chunk of a source that sends raw records (files, an external
/// connector, a runner's pump) read: the records (or the reason a line is
/// not a record) and the resume point after the last of them.
pub struct RawChunk {
    pub records: RawRecords,
    pub last: Vec<String>,
}

pub(crate) enum Msg {
    /// Typed columns from a source that declares its types.
    Chunk {
        arrays: Vec<ArrayRef>,
        ids: ArrayRef,
        last: Vec<String>,
        rows: usize,
    },
    /// Raw records (or lines that are not records) to normalize.
    Raw(RawChunk),
    End {
        bytes: u64,
    },
}
