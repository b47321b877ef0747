//! Barrier N: one chunk from each stream still open, each chunk ending at a
//! resume point, so that every epoch before the barrier's is a resume point
//! too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow_array::ArrayRef;

use crate::commit::protocol::Positions;
use crate::commit::record::StreamState;
use crate::error::EngineError;
use crate::source::normalize::Raw;
use crate::source::postgres::table::destination_schema;
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

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{sync_channel, SyncSender};

    use serde_json::json;

    use super::*;
    use crate::source::error::ReadError;
    use crate::source::msg::RawChunk;
    use crate::source::normalize::StreamSchema;

    type Tx = SyncSender<Result<Msg, ReadError>>;

    /// A reader of a files stream whose messages the test sends.
    fn reader(name: &str) -> (Reader, Tx) {
        let (tx, rx) = sync_channel(4);
        let r = Reader {
            name: name.into(),
            shape: Shape::Inferred(StreamSchema::default()),
            rx,
            handle: None,
            done: false,
        };
        (r, tx)
    }

    fn raw(tx: &Tx, last: &[&str]) {
        let chunk = RawChunk {
            records: vec![Ok(Raw {
                position: last.join(":"),
                seq: 0,
                record: json!({"id": 1}),
            })],
            last: last.iter().map(|s| s.to_string()).collect(),
        };
        tx.send(Ok(Msg::Raw(chunk))).expect("send");
    }

    fn end(tx: &Tx, bytes: u64) {
        tx.send(Ok(Msg::End { bytes })).expect("send");
    }

    fn names(round: &Round) -> Vec<&str> {
        round.chunks.iter().map(|c| c.stream.as_str()).collect()
    }

    #[test]
    fn a_barrier_takes_one_chunk_per_open_stream_and_records_where_each_resumes() {
        let (a, ta) = reader("a");
        let (b, tb) = reader("b");
        let (c, tc) = reader("c");
        let mut readers = vec![a, b, c];
        raw(&ta, &["2024-01.jsonl", "35"]);
        raw(&ta, &["2024-02.jsonl", "10"]);
        end(&tb, 7);
        raw(&tc, &["x.jsonl", "4"]);
        let overwrite = BTreeSet::from(["b".to_string()]);
        let none = BTreeMap::new();

        let round = take_round(&mut readers, &none, &overwrite).expect("round");
        // One chunk of each stream, not two of a; b's end ends its refresh.
        assert_eq!(names(&round), ["a", "c"]);
        assert_eq!(round.ended, ["b"]);
        assert_eq!(round.source_bytes, 7);
        assert!(!round.is_empty());
        let positions = round.positions();
        assert_eq!(positions["a"], "2024-01.jsonl\u{1f}35");
        assert_eq!(positions["c"], "x.jsonl\u{1f}4");
        assert!(!positions.contains_key("b"));

        // b is done and is not asked again, though its reader is gone.
        drop(tb);
        end(&tc, 0);
        let round = take_round(&mut readers, &none, &overwrite).expect("round");
        assert_eq!(names(&round), ["a"]);
        assert!(round.ended.is_empty(), "c neither refreshes nor backfills");

        end(&ta, 0);
        let round = take_round(&mut readers, &none, &overwrite).expect("round");
        assert!(round.is_empty(), "the source has no more rows");
    }

    #[test]
    fn a_backfill_ends_with_its_stream_even_when_nothing_else_is_read() {
        let (a, ta) = reader("a");
        let mut readers = vec![a];
        end(&ta, 0);
        let mut states = BTreeMap::new();
        states.insert(
            "a".to_string(),
            StreamState {
                rereading: true,
                ..StreamState::default()
            },
        );
        let round = take_round(&mut readers, &states, &BTreeSet::new()).expect("round");
        assert_eq!(round.ended, ["a"]);
        assert!(!round.is_empty(), "an epoch says the backfill ended");
    }

    #[test]
    fn a_stream_whose_reader_fails_or_vanishes_fails_the_attempt_with_its_name() {
        let (a, ta) = reader("a");
        let mut readers = vec![a];
        ta.send(Err(ReadError::Stream {
            stream: "a".into(),
            reason: "the runner's source: gone".into(),
        }))
        .expect("send");
        let e = take_round(&mut readers, &BTreeMap::new(), &BTreeSet::new())
            .err()
            .expect("an error");
        assert!(
            matches!(&e, EngineError::Reader { stream, .. } if stream == "a"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "stream a: the runner's source: gone");

        drop(ta);
        let e = take_round(&mut readers, &BTreeMap::new(), &BTreeSet::new())
            .err()
            .expect("an error");
        assert_eq!(
            e.to_string(),
            "stream a: its reader stopped without saying why"
        );
    }
}
