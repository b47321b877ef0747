//! Barrier N: one chunk from each stream still open, each chunk ending at a
//! resume point, so that every epoch before the barrier's is a resume point
//! too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::ArrayRef;

use crate::attempt::error::EngineError;
use crate::commit::protocol::Positions;
use crate::commit::record::StreamState;
use crate::source::normalize::Raw;
use crate::source::pg_table::destination_schema;
use crate::source::readers::{Msg, Reader, Shape};

/// A chunk of one stream at a barrier, before it is staged.
pub(super) enum Taken {
    Typed {
        schema: Arc<arrow_schema::Schema>,
        arrays: Vec<ArrayRef>,
        ids: ArrayRef,
        rows: usize,
    },
    Raw(Vec<Result<Raw, (Raw, String)>>),
}

/// A stream's chunk, and the resume point after it.
pub(super) struct Chunk {
    pub(super) stream: String,
    pub(super) taken: Taken,
    pub(super) last: Vec<String>,
}

/// What one round over the readers brought.
pub(super) struct Round {
    pub(super) chunks: Vec<Chunk>,
    /// `overwrite` streams whose source ran out, and backfills read to
    /// their end: their refresh or backfill ends with this epoch.
    pub(super) ended: Vec<String>,
    /// Bytes of the source read by the streams that ended.
    pub(super) source_bytes: u64,
}

impl Round {
    /// Nothing was read and nothing ended: the source has no more rows.
    pub(super) fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.ended.is_empty()
    }

    /// Each stream's resume point at this barrier, as the coordinator
    /// records it.
    pub(super) fn positions(&self) -> Positions {
        self.chunks
            .iter()
            .map(|c| (c.stream.clone(), c.last.join("\u{1f}")))
            .collect()
    }
}

/// Takes the next chunk of every stream not yet done, in the readers'
/// order (the order a pump sends them in), waiting for each.
pub(super) fn take_round(
    readers: &mut [Reader],
    states: &BTreeMap<String, StreamState>,
    overwrite: &BTreeSet<String>,
) -> Result<Round, EngineError> {
    let mut round = Round {
        chunks: Vec::new(),
        ended: Vec::new(),
        source_bytes: 0,
    };
    for r in readers.iter_mut().filter(|r| !r.done) {
        match r.rx.recv() {
            Ok(Ok(Msg::Chunk {
                arrays,
                ids,
                last,
                rows,
            })) => {
                let Shape::Table(table) = &r.shape else {
                    return Err(EngineError::Reader {
                        stream: r.name.clone(),
                        reason: "typed rows from an untyped stream".into(),
                    });
                };
                let taken = Taken::Typed {
                    schema: destination_schema(table),
                    arrays,
                    ids,
                    rows,
                };
                round.chunks.push(Chunk {
                    stream: r.name.clone(),
                    taken,
                    last,
                });
            }
            Ok(Ok(Msg::Raw(chunk))) => round.chunks.push(Chunk {
                stream: r.name.clone(),
                taken: Taken::Raw(chunk.records),
                last: chunk.last,
            }),
            Ok(Ok(Msg::End { bytes })) => {
                r.done = true;
                round.source_bytes += bytes;
                // A refresh ends, or a backfill's read again: an epoch
                // says so even when no other stream read anything.
                let rereading = states.get(&r.name).is_some_and(|s| s.rereading);
                if overwrite.contains(&r.name) || rereading {
                    round.ended.push(r.name.clone());
                }
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => {
                return Err(EngineError::Reader {
                    stream: r.name.clone(),
                    reason: "its reader stopped without saying why".into(),
                })
            }
        }
    }
    Ok(round)
}
