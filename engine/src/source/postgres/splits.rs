//! A table read split over several connections: the cursor's range is cut
//! at values taken from the table's statistics, each split reads its range
//! in resume order on a connection (and a decoding thread) of its own, and
//! the stream's chunk at each barrier is one chunk of every split still
//! reading, so barriers stay aligned across splits.
//!
//! While a split read is under way the stream's resume point is the list
//! of splits, each with its range and its own resume point (encoded by
//! [`encode`]), so a crash resumes every split where its checkpoint says.
//! When every split has read to its end, the resume point becomes the
//! single one of the last row in cursor order, as an unsplit read would
//! leave it: the next read starts from there (and splits again only if
//! what is left is big).

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver};

use arrow_array::{new_empty_array, ArrayRef};
use serde::{Deserialize, Serialize};

use crate::netguard::Guard;
use crate::source::error::ReadError;
use crate::source::msg::Msg;
use crate::source::postgres::conn::PgReader;
use crate::source::postgres::copy::CopyReader;
use crate::source::postgres::table::{qualified, quote_literal, PgTable, Range, SourceError};

/// The first value of a resume point that is a list of splits.
const TAG: &str = "splits";

/// A split is only worth its connection for at least this many epochs'
/// worth of rows.
const EPOCHS_PER_SPLIT: f64 = 2.0;

/// One split of a table's read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Split {
    #[serde(flatten)]
    pub range: Range,
    /// The split's own resume point (None: from its range's start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Vec<String>>,
}

/// The resume point of a split read.
pub fn encode(splits: &[Split]) -> Result<Vec<String>, ReadError> {
    let json = serde_json::to_string(splits)
        .map_err(|e| ReadError::Definition(format!("encoding a split read's position: {e}")))?;
    Ok(vec![TAG.to_string(), json])
}

/// The splits a resume point holds, if it is a split read's.
pub fn decode(position: &[String]) -> Option<Vec<Split>> {
    match position {
        [tag, json] if tag == TAG => serde_json::from_str(json).ok(),
        _ => None,
    }
}

/// The resume point an unsplit read would have after every split read to
/// its end: the last split's that read anything (the ranges follow the
/// cursor's order). None: no split read a row.
fn collapsed(splits: &[Split]) -> Option<Vec<String>> {
    splits.iter().rev().find_map(|s| s.after.clone())
}

/// The connections a stream's read splits over unless it says: the
/// machine's cores (at most 8). A split is a server backend and a decoding
/// thread. Half the cores was the default (one on a 2-core host) until a
/// read took a socket read of rows at a time and an epoch's Parquet was
/// encoded on all cores; since then two connections beat one on
/// benches/sync's 2-core machine in most runs (not for wide text, whose
/// time is the engine's own encoding; docs/syncs.md, Benchmark).
pub fn default_splits() -> usize {
    crate::util::cores().clamp(1, 8)
}

/// How to split the read of `table` after `after` into at most `want`
/// splits, from the table's statistics (its histogram of the cursor, or a
/// sample if it was never analyzed); None: not worth splitting (few rows
/// left, or a cursor with too few distinct values).
pub fn plan(
    client: &mut PgReader,
    table: &PgTable,
    after: Option<&[String]>,
    want: usize,
    batch_rows: usize,
) -> Result<Option<Vec<Split>>, SourceError> {
    let Some(&first) = table.key.first() else {
        return Ok(None);
    };
    if want < 2 || table.spec.cdc || table.as_text[first] {
        return Ok(None);
    }
    let pg = |source| SourceError::Postgres {
        table: table.spec.table.clone(),
        source,
    };
    let name = &table.spec.table;
    let column = &table.columns[first].name;
    let ty = &table.sql_types[first];
    let from: Option<String> = after.and_then(|a| a.first().cloned());
    // The histogram's bounds past the resume point, and how many it has in
    // all: the share of the rows left to read.
    let row = client
        .query_one(
            &format!(
                "SELECT c.reltuples::float8,
                        (SELECT cardinality(s.histogram_bounds::text::text[])
                         FROM pg_stats s
                         WHERE s.schemaname = n.nspname AND s.tablename = c.relname
                           AND s.attname = $2),
                        (SELECT array_agg(b::text ORDER BY o)
                         FROM pg_stats s,
                              unnest(s.histogram_bounds::text::{ty}[]) WITH ORDINALITY u(b, o)
                         WHERE s.schemaname = n.nspname AND s.tablename = c.relname
                           AND s.attname = $2 AND ($3::text IS NULL OR b > $3::{ty})),
                        pg_relation_size(c.oid) / current_setting('block_size')::int
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = to_regclass($1)"
            ),
            &[&qualified(name), column, &from],
        )
        .map_err(pg)?;
    let reltuples: f64 = row.get(0);
    let all: Option<i32> = row.get(1);
    let left: Option<Vec<String>> = row.get(2);
    let pages: i64 = row.get(3);
    let (rows_left, bounds) = match (all, left) {
        (Some(all), left) if reltuples >= 0.0 && all > 1 => {
            let left = left.unwrap_or_default();
            let share = left.len() as f64 / f64::from(all - 1);
            (reltuples * share.min(1.0), left)
        }
        // Never analyzed: a repeatable sample of about 64 pages.
        _ if reltuples < 0.0 && pages >= 64 => {
            let percent = (6400.0 / pages as f64).clamp(0.01, 100.0);
            let fractions: Vec<f64> = (1..32).map(|k| f64::from(k) / 32.0).collect();
            let col = crate::util::quote_ident(column);
            let row = client
                .query_one(
                    &format!(
                        "SELECT count(*)::float8,
                                (percentile_disc($1::float8[]) WITHIN GROUP (ORDER BY {col}))::text[]
                         FROM {} TABLESAMPLE SYSTEM ({percent}) REPEATABLE (0)
                         WHERE $2::text IS NULL OR {col} > $2::{ty}",
                        qualified(name)
                    ),
                    &[&fractions, &from],
                )
                .map_err(pg)?;
            let sampled: f64 = row.get(0);
            let cuts: Option<Vec<Option<String>>> = row.get(1);
            let cuts = cuts.unwrap_or_default().into_iter().flatten().collect();
            (sampled * 100.0 / percent, cuts)
        }
        _ => return Ok(None),
    };
    let n = want.min((rows_left / (EPOCHS_PER_SPLIT * batch_rows as f64)) as usize);
    let mut cuts: Vec<String> = Vec::new();
    for k in 1..n {
        if let Some(b) = bounds.get(bounds.len() * k / n) {
            if cuts.last() != Some(b) {
                cuts.push(b.clone());
            }
        }
    }
    if cuts.is_empty() {
        return Ok(None);
    }
    // The cuts are values of the column in the histogram's order, which is
    // the column's: each range is [previous cut, next cut).
    let mut splits = Vec::with_capacity(cuts.len() + 1);
    let mut lo = None;
    for cut in cuts {
        splits.push(Split {
            range: Range {
                lo: lo.take(),
                hi: Some(cut.clone()),
            },
            after: None,
        });
        lo = Some(cut);
    }
    splits.push(Split {
        range: Range { lo, hi: None },
        after: None,
    });
    // The rows up to the resume point are read: they are all in the first
    // range (every cut is past the resume point's cursor).
    splits[0].after = after.map(<[String]>::to_vec);
    Ok(Some(splits))
}

/// A split's chunk of rows, or its end.
struct Piece {
    arrays: Vec<ArrayRef>,
    ids: Option<ArrayRef>,
    rows: usize,
    ended: bool,
    bytes: u64,
}

/// What the stream's reader holds of one split: the pieces its thread sent
/// and the stream has not taken yet.
struct Lane {
    rx: Receiver<Result<Piece, ReadError>>,
    buf: VecDeque<(Vec<ArrayRef>, ArrayRef)>,
    /// Rows of the front piece already taken.
    off: usize,
    buffered: usize,
    ended: bool,
}

impl Lane {
    /// Waits for the split's next piece unless rows are buffered or the
    /// split ended; returns the bytes it read if it just ended.
    fn refill(&mut self, stream: &str, i: usize) -> Result<u64, ReadError> {
        while self.buffered == 0 && !self.ended {
            let piece = match self.rx.recv() {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(ReadError::Stream {
                        stream: stream.to_string(),
                        reason: format!("split {i}'s reader stopped without saying why"),
                    })
                }
            };
            if piece.rows > 0 {
                let ids = piece.ids.ok_or_else(|| ReadError::Stream {
                    stream: stream.to_string(),
                    reason: "no record ids".into(),
                })?;
                self.buf.push_back((piece.arrays, ids));
                self.buffered += piece.rows;
            }
            if piece.ended {
                self.ended = true;
                return Ok(piece.bytes);
            }
        }
        Ok(0)
    }

    /// Takes up to `n` rows in the split's order, as slices of its pieces.
    fn take(&mut self, n: usize, out: &mut Vec<(Vec<ArrayRef>, ArrayRef)>) -> usize {
        let mut taken = 0;
        while taken < n {
            let Some((arrays, ids)) = self.buf.front() else {
                break;
            };
            let len = ids.len() - self.off;
            let k = len.min(n - taken);
            out.push((
                arrays.iter().map(|a| a.slice(self.off, k)).collect(),
                ids.slice(self.off, k),
            ));
            taken += k;
            self.off += k;
            if self.off == ids.len() {
                self.buf.pop_front();
                self.off = 0;
            }
        }
        self.buffered -= taken;
        taken
    }

    fn drained(&self) -> bool {
        self.ended && self.buffered == 0
    }
}

/// Reads every split of `table` on a connection of its own and sends the
/// stream's chunks of `batch_rows` rows (as an unsplit read does), taken
/// from the splits in turn, so every split keeps reading; the resume point
/// is the list of splits, each at the last row taken from it. `first` is a
/// connection already open (it reads the first split).
pub(crate) fn read_split(
    tx: &std::sync::mpsc::SyncSender<Result<Msg, ReadError>>,
    guard: &Guard,
    url: &str,
    first: PgReader,
    table: &PgTable,
    mut splits: Vec<Split>,
    batch_rows: usize,
) -> Result<(), ReadError> {
    let stream = table.spec.name.clone();
    let batch_rows = batch_rows.max(1);
    let per = (batch_rows / splits.len()).max(1);
    let resumed_split = splits.iter().any(|s| s.after.is_some());
    let mut first = Some(first);
    let mut lanes: Vec<Lane> = Vec::with_capacity(splits.len());
    for (i, s) in splits.iter().enumerate() {
        let client = match first.take() {
            Some(c) => c,
            None => PgReader::connect(guard, url)?,
        };
        let query = table.copy_query_in(s.after.as_deref(), &s.range, 0)?;
        let (ptx, prx) = sync_channel(1);
        let t = table.clone();
        std::thread::Builder::new()
            .name(format!("read-{stream}-{i}"))
            .spawn(move || {
                if let Err(e) = read_one(client, &query, &t, per, &ptx) {
                    let _ = ptx.send(Err(e));
                }
            })
            .map_err(|e| ReadError::Stream {
                stream: stream.clone(),
                reason: format!("starting split {i}'s thread: {e}"),
            })?;
        lanes.push(Lane {
            rx: prx,
            buf: VecDeque::new(),
            off: 0,
            buffered: 0,
            ended: false,
        });
    }
    let schema = table.schema();
    let mut bytes = 0u64;
    let mut sent = false;
    loop {
        // A chunk of batch_rows rows (fewer only at the end): an equal share
        // from every split with rows, what one lacks from the others.
        let mut parts: Vec<(Vec<ArrayRef>, ArrayRef)> = Vec::new();
        let mut rows = 0usize;
        loop {
            for (i, lane) in lanes.iter_mut().enumerate() {
                bytes += lane.refill(&stream, i)?;
            }
            let open: Vec<usize> = (0..lanes.len())
                .filter(|&i| lanes[i].buffered > 0)
                .collect();
            if open.is_empty() || rows == batch_rows {
                break;
            }
            let share = ((batch_rows - rows) / open.len()).max(1);
            for &i in &open {
                let want = share.min(batch_rows - rows);
                let k = lanes[i].take(want, &mut parts);
                if let Some((arrays, ids)) = parts.last().filter(|_| k > 0) {
                    splits[i].after = Some(table.position_at(arrays, ids.len() - 1)?);
                }
                rows += k;
            }
        }
        let done = lanes.iter().all(Lane::drained);
        let last = match done {
            true => match collapsed(&splits) {
                Some(last) => last,
                None => break,
            },
            false => encode(&splits)?,
        };
        // Nothing was left to read: only a split read's position to close.
        if rows == 0 && (sent || !resumed_split) {
            break;
        }
        let concat = |columns: Vec<&dyn arrow_array::Array>| {
            arrow_select::concat::concat(&columns).map_err(|e| ReadError::Stream {
                stream: stream.clone(),
                reason: format!("joining its splits' rows: {e}"),
            })
        };
        let (arrays, ids) = match parts.len() {
            0 => (
                schema
                    .fields()
                    .iter()
                    .map(|f| new_empty_array(f.data_type()))
                    .collect(),
                new_empty_array(&arrow_schema::DataType::Utf8),
            ),
            1 => parts.remove(0),
            _ => (
                (0..schema.fields().len())
                    .map(|c| concat(parts.iter().map(|p| p.0[c].as_ref()).collect()))
                    .collect::<Result<Vec<_>, _>>()?,
                concat(parts.iter().map(|p| p.1.as_ref()).collect())?,
            ),
        };
        let msg = Msg::Chunk {
            arrays,
            ids,
            last,
            rows,
        };
        if tx.send(Ok(msg)).is_err() {
            return Ok(());
        }
        sent = true;
        if done {
            break;
        }
    }
    let _ = tx.send(Ok(Msg::End { bytes }));
    Ok(())
}

/// One split's COPY, in pieces of `per` rows.
fn read_one(
    mut client: PgReader,
    query: &str,
    table: &PgTable,
    per: usize,
    tx: &std::sync::mpsc::SyncSender<Result<Piece, ReadError>>,
) -> Result<(), ReadError> {
    let stream = &table.spec.name;
    let copy = |source| ReadError::Copy {
        stream: stream.clone(),
        source,
    };
    let input = client.copy_out(query)?;
    let mut r = CopyReader::new(input, table.columns.clone())
        .map_err(copy)?
        .with_ids(stream, &table.key);
    loop {
        let more = r.read_row().map_err(copy)?;
        if more && r.pending() < per {
            continue;
        }
        let rows = r.pending();
        let (arrays, ids) = match rows {
            0 => (Vec::new(), None),
            _ => {
                let ids = r.take_ids();
                (r.take(), ids)
            }
        };
        let piece = Piece {
            arrays,
            ids,
            rows,
            ended: !more,
            bytes: r.bytes,
        };
        if tx.send(Ok(piece)).is_err() || !more {
            return Ok(());
        }
    }
}

/// The splits' ranges, for logs and tests.
pub fn ranges(splits: &[Split]) -> String {
    splits
        .iter()
        .map(|s| {
            format!(
                "[{}, {})",
                s.range
                    .lo
                    .as_deref()
                    .map(quote_literal)
                    .unwrap_or("-".into()),
                s.range
                    .hi
                    .as_deref()
                    .map(quote_literal)
                    .unwrap_or("-".into())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(lo: Option<&str>, hi: Option<&str>, after: Option<&[&str]>) -> Split {
        Split {
            range: Range {
                lo: lo.map(str::to_string),
                hi: hi.map(str::to_string),
            },
            after: after.map(|a| a.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn a_split_reads_position_round_trips_and_an_unsplit_one_is_not_taken_for_it() {
        let splits = vec![
            split(None, Some("100"), Some(&["42", "42"])),
            split(Some("100"), None, None),
        ];
        let pos = encode(&splits).expect("encode");
        assert_eq!(pos[0], "splits");
        assert_eq!(decode(&pos), Some(splits));
        // A cursor and key, even a text cursor whose value is "splits".
        assert_eq!(decode(&["2024-01-01".into(), "7".into()]), None);
        assert_eq!(decode(&["splits".into(), "7".into()]), None);
    }

    #[test]
    fn after_every_split_ended_the_resume_point_is_the_last_row_in_cursor_order() {
        let splits = vec![
            split(None, Some("100"), Some(&["99", "1"])),
            split(Some("100"), Some("200"), Some(&["150", "2"])),
            split(Some("200"), None, None),
        ];
        assert_eq!(
            collapsed(&splits),
            Some(vec!["150".to_string(), "2".to_string()])
        );
        assert_eq!(collapsed(&[split(None, None, None)]), None);
        assert_eq!(ranges(&splits), "[-, '100') ['100', '200') ['200', -)");
    }
}
