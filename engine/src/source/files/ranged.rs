//! A Parquet file read by byte ranges (an object store's object, an Iceberg
//! table's data file), a column chunk at a time.
//!
//! The synchronous Parquet reader asks its [`ChunkReader`] for a reader at
//! every page header and for the bytes of every page. Fetching "the rest of
//! the file" for each header, or one request per page, would move the file
//! many times over or make thousands of requests; fetching the whole file
//! first makes memory follow the file's size. Here the footer's tail is
//! fetched once, then each column chunk whole when the reader first touches
//! it, and the chunks of a row group are let go when the reader moves to
//! the next: memory follows the compressed row group the reader is in (as
//! in arrow's asynchronous reader and DataFusion), each byte is fetched
//! about once, and a file costs about a request per column chunk.

use std::io::Read;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::{Buf, Bytes};
use parquet::errors::{ParquetError, Result as ParquetResult};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, Length};

/// What a fetch of a byte range fails with.
pub(crate) type FetchError = Box<dyn std::error::Error + Send + Sync>;

/// Fetches a byte range of the file.
pub(crate) type Fetch = dyn Fn(Range<u64>) -> Result<Bytes, FetchError> + Send + Sync;

/// The bytes at the end of a file fetched with its first read there: the
/// footer's length and, most often, the whole footer in one request.
const TAIL: u64 = 64 * 1024;

/// A read outside every column chunk (a header the layout does not name)
/// fetches this much at a time.
const BLOCK: u64 = 64 * 1024;

/// A Parquet file read by ranges; clones share the file and what is held
/// of it.
#[derive(Clone)]
pub(crate) struct Ranged {
    inner: Arc<Inner>,
}

struct Inner {
    len: u64,
    fetch: Box<Fetch>,
    /// The file's column chunks, sorted by where they start, each with its
    /// row group; known once the footer is read ([`Ranged::learn`]).
    layout: OnceLock<Vec<Chunk>>,
    held: Mutex<Held>,
}

#[derive(Clone, Copy)]
struct Chunk {
    bytes: (u64, u64),
    group: usize,
}

#[derive(Default)]
struct Held {
    /// The file's last bytes and where they start.
    tail: Option<(u64, Bytes)>,
    /// The row group whose chunks are held.
    group: usize,
    /// Held column chunks of that row group: (start, bytes).
    chunks: Vec<(u64, Bytes)>,
}

impl Ranged {
    /// A file of `len` bytes that `fetch` reads by ranges.
    pub(crate) fn new(len: u64, fetch: Box<Fetch>) -> Ranged {
        Ranged {
            inner: Arc::new(Inner {
                len,
                fetch,
                layout: OnceLock::new(),
                held: Mutex::new(Held::default()),
            }),
        }
    }

    /// Takes the file's column chunks from its footer; until then every read
    /// fetches what it asks for. A chunk whose offsets are negative or lie
    /// past the file's end (a broken footer) is left out: reads in it fetch
    /// only what they ask for, and the Parquet reader names the damage.
    pub(crate) fn learn(&self, meta: &ParquetMetaData) {
        let mut chunks = Vec::new();
        for (group, rg) in meta.row_groups().iter().enumerate() {
            for col in rg.columns() {
                let start = col
                    .dictionary_page_offset()
                    .unwrap_or_else(|| col.data_page_offset());
                let (Ok(start), Ok(size)) =
                    (u64::try_from(start), u64::try_from(col.compressed_size()))
                else {
                    continue;
                };
                if start
                    .checked_add(size)
                    .is_some_and(|end| end <= self.inner.len)
                    && size > 0
                {
                    chunks.push(Chunk {
                        bytes: (start, start + size),
                        group,
                    });
                }
            }
        }
        chunks.sort_by_key(|c| c.bytes.0);
        let _ = self.inner.layout.set(chunks);
    }

    /// The column chunk that holds `at`, if the layout is known.
    fn chunk_at(&self, at: u64) -> Option<Chunk> {
        let layout = self.inner.layout.get()?;
        let i = layout.partition_point(|c| c.bytes.0 <= at).checked_sub(1)?;
        let c = layout[i];
        (at < c.bytes.1).then_some(c)
    }

    fn fetch(&self, range: Range<u64>) -> ParquetResult<Bytes> {
        let want = range.end - range.start;
        let got = (self.inner.fetch)(range.clone()).map_err(ParquetError::External)?;
        if got.len() as u64 != want {
            return Err(ParquetError::General(format!(
                "bytes {}..{} of a {}-byte file came back as {} bytes",
                range.start,
                range.end,
                self.inner.len,
                got.len()
            )));
        }
        Ok(got)
    }

    /// A column chunk's bytes, fetched when first asked for; asking for a
    /// chunk of another row group lets the held ones go.
    fn chunk(&self, c: Chunk) -> ParquetResult<Bytes> {
        let mut held = self.lock();
        if held.group != c.group {
            held.group = c.group;
            held.chunks.clear();
        }
        if let Some((_, b)) = held.chunks.iter().find(|(s, _)| *s == c.bytes.0) {
            return Ok(b.clone());
        }
        let b = self.fetch(c.bytes.0..c.bytes.1)?;
        held.chunks.push((c.bytes.0, b.clone()));
        Ok(b)
    }

    /// `start..end` from the held tail, fetching the tail by the first read
    /// that ends at the file's end.
    fn in_tail(&self, start: u64, end: u64) -> ParquetResult<Option<Bytes>> {
        let mut held = self.lock();
        if held.tail.is_none() && end == self.inner.len {
            let from = self.inner.len.saturating_sub(TAIL).min(start);
            held.tail = Some((from, self.fetch(from..self.inner.len)?));
        }
        Ok(match &held.tail {
            Some((from, b)) if start >= *from && end <= self.inner.len => {
                Some(b.slice((start - from) as usize..(end - from) as usize))
            }
            _ => None,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // A panic elsewhere while holding it leaves only a cache behind.
        self.inner
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The bytes of column chunks held now.
    #[cfg(test)]
    fn held_bytes(&self) -> usize {
        self.lock().chunks.iter().map(|(_, b)| b.len()).sum()
    }
}

impl Length for Ranged {
    fn len(&self) -> u64 {
        self.inner.len
    }
}

impl ChunkReader for Ranged {
    type T = Box<dyn Read + Send>;

    fn get_read(&self, start: u64) -> ParquetResult<Self::T> {
        if let Some(c) = self.chunk_at(start) {
            let b = self.chunk(c)?;
            return Ok(Box::new(b.slice((start - c.bytes.0) as usize..).reader()));
        }
        Ok(Box::new(Blocks {
            file: self.clone(),
            at: start,
            buf: Bytes::new(),
        }))
    }

    fn get_bytes(&self, start: u64, length: usize) -> ParquetResult<Bytes> {
        let end = start
            .checked_add(length as u64)
            .filter(|&end| end <= self.inner.len)
            .ok_or_else(|| {
                ParquetError::EOF(format!(
                    "{length} bytes at {start} of a {}-byte file",
                    self.inner.len
                ))
            })?;
        if let Some(c) = self.chunk_at(start).filter(|c| end <= c.bytes.1) {
            let b = self.chunk(c)?;
            let from = (start - c.bytes.0) as usize;
            return Ok(b.slice(from..from + length));
        }
        if let Some(b) = self.in_tail(start, end)? {
            return Ok(b);
        }
        self.fetch(start..end)
    }
}

/// A reader from an offset the layout does not cover, fetching a block at
/// a time as it is read.
struct Blocks {
    file: Ranged,
    at: u64,
    buf: Bytes,
}

impl Read for Blocks {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.buf.is_empty() {
            let len = self.file.inner.len;
            if self.at >= len || out.is_empty() {
                return Ok(0);
            }
            let end = (self.at + BLOCK.max(out.len() as u64)).min(len);
            self.buf = self
                .file
                .get_bytes(self.at, (end - self.at) as usize)
                .map_err(std::io::Error::other)?;
            self.at = end;
        }
        let n = out.len().min(self.buf.len());
        self.buf.copy_to_slice(&mut out[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;

    /// A file of `groups` row groups of 20,000 rows, three columns, small
    /// pages (hundreds of them).
    fn file(groups: usize) -> (Bytes, Vec<RecordBatch>) {
        let rows = 20_000;
        let batches: Vec<RecordBatch> = (0..groups)
            .map(|g| {
                let base = (g * rows) as i64;
                let ids: ArrayRef =
                    Arc::new(Int64Array::from_iter_values(base..base + rows as i64));
                let names: ArrayRef = Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("name-{}-{}", g, i * 7919 % 1000)),
                ));
                let scores: ArrayRef = Arc::new(Int64Array::from_iter_values(
                    (0..rows as i64).map(|i| i * i % 977),
                ));
                RecordBatch::try_from_iter([("id", ids), ("name", names), ("score", scores)])
                    .expect("batch")
            })
            .collect();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(rows))
            .set_data_page_size_limit(2048)
            .build();
        let mut w =
            ArrowWriter::try_new(Vec::new(), batches[0].schema(), Some(props)).expect("writer");
        for b in &batches {
            w.write(b).expect("write");
        }
        (Bytes::from(w.into_inner().expect("close")), batches)
    }

    struct Counted {
        file: Ranged,
        requests: Arc<AtomicU64>,
        fetched: Arc<AtomicU64>,
    }

    fn counted(bytes: Bytes) -> Counted {
        let requests = Arc::new(AtomicU64::new(0));
        let fetched = Arc::new(AtomicU64::new(0));
        let (r, f) = (requests.clone(), fetched.clone());
        let len = bytes.len() as u64;
        let file = Ranged::new(
            len,
            Box::new(move |range: Range<u64>| {
                r.fetch_add(1, Ordering::Relaxed);
                f.fetch_add(range.end - range.start, Ordering::Relaxed);
                Ok(bytes.slice(range.start as usize..range.end as usize))
            }),
        );
        Counted {
            file,
            requests,
            fetched,
        }
    }

    #[test]
    fn a_file_read_by_ranges_is_fetched_about_once_a_chunk_at_a_time() {
        let groups = 4;
        let (bytes, written) = file(groups);
        let c = counted(bytes.clone());
        let b = ParquetRecordBatchReaderBuilder::try_new(c.file.clone()).expect("footer");
        // The footer: one request for the file's tail.
        assert_eq!(c.requests.load(Ordering::Relaxed), 1);
        let meta = b.metadata().clone();
        c.file.learn(&meta);
        let mut most_held = 0;
        let mut read = Vec::new();
        for batch in b.with_batch_size(5000).build().expect("reader") {
            read.push(batch.expect("a batch"));
            most_held = most_held.max(c.file.held_bytes());
        }
        // Every row as written.
        let read =
            arrow_select::concat::concat_batches(&written[0].schema(), &read).expect("concat");
        let written =
            arrow_select::concat::concat_batches(&written[0].schema(), &written).expect("concat");
        assert_eq!(read, written);
        // Each column chunk fetched once, whole, and the tail: about the
        // file's size, in a request per chunk.
        let chunks = groups * 3;
        assert_eq!(c.requests.load(Ordering::Relaxed), 1 + chunks as u64);
        assert!(c.fetched.load(Ordering::Relaxed) <= bytes.len() as u64 + TAIL);
        // Never more than one row group's chunks held.
        let biggest = meta
            .row_groups()
            .iter()
            .map(|rg| rg.compressed_size() as usize)
            .max()
            .unwrap_or(0);
        assert!(
            most_held > 0 && most_held <= biggest,
            "{most_held} > {biggest}"
        );
    }

    #[test]
    fn a_resumed_read_and_a_file_without_its_layout_read_the_same_rows() {
        let (bytes, written) = file(3);
        let all =
            arrow_select::concat::concat_batches(&written[0].schema(), &written).expect("concat");
        // Without learn: every page header through a block reader.
        let c = counted(bytes.clone());
        let rows: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(c.file.clone())
            .expect("footer")
            .with_offset(25_000)
            .build()
            .expect("reader")
            .collect::<Result<_, _>>()
            .expect("batches");
        let rows = arrow_select::concat::concat_batches(&all.schema(), &rows).expect("concat");
        assert_eq!(rows, all.slice(25_000, all.num_rows() - 25_000));
    }

    #[test]
    fn a_short_answer_or_a_failed_fetch_is_an_error_naming_the_range() {
        let short = Ranged::new(
            100,
            Box::new(|_r: Range<u64>| Ok(Bytes::from_static(b"abc"))),
        );
        let e = short.get_bytes(10, 20).expect_err("short");
        assert!(
            e.to_string()
                .contains("bytes 10..30 of a 100-byte file came back as 3 bytes"),
            "{e}"
        );
        let past = short.get_bytes(90, 20).expect_err("past the end");
        assert!(
            past.to_string()
                .contains("20 bytes at 90 of a 100-byte file"),
            "{past}"
        );
        let failing = Ranged::new(
            100,
            Box::new(|_r: Range<u64>| Err("the store is down".into())),
        );
        let e = failing.get_bytes(0, 10).expect_err("failed");
        assert!(e.to_string().contains("the store is down"), "{e}");
        let mut r = failing.get_read(0).expect("a reader");
        let mut buf = [0u8; 4];
        assert!(r.read(&mut buf).is_err());
    }
}
