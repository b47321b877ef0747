//! A Parquet file read by byte ranges (an object store's object, an Iceberg
//! table's data file), a column chunk at a time: the engine's Parquet and
//! Iceberg sources, and the sync tables' reads of their own files.
//!
//! The synchronous Parquet reader asks its [`ChunkReader`] for a reader at
//! every page header and for the bytes of every page. Fetching "the rest of
//! the file" for each header, or one request per page, would move the file
//! many times over or make thousands of requests; fetching the whole file
//! first makes memory follow the file's size. Here the footer's tail is
//! fetched once, then each column chunk whole when the reader first touches
//! it, one held a column: the reader reads each column forward on its own
//! (a batch that straddles two row groups has some columns in the next one
//! while others finish the last), so a column's chunk is let go when that
//! column moves to its next row group. Memory follows about one compressed
//! row group (as in arrow's asynchronous reader and DataFusion), each byte
//! is fetched about once, and a file costs about a request per column chunk
//! (a small file's chunks come with its tail: one request).

use std::io::Read;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::{Buf, Bytes};
use iceberg::io::FileIO;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::errors::{ParquetError, Result as ParquetResult};
use parquet::file::metadata::ParquetMetaData;
use parquet::file::reader::{ChunkReader, Length};

/// What a fetch of a byte range fails with.
pub type FetchError = Box<dyn std::error::Error + Send + Sync>;

/// Fetches a byte range of the file.
pub type Fetch = dyn Fn(Range<u64>) -> Result<Bytes, FetchError> + Send + Sync;

/// The bytes at the end of a file fetched with its first read there: the
/// footer's length and, most often, the whole footer in one request.
const TAIL: u64 = 64 * 1024;

/// A read outside every column chunk (a header the layout does not name)
/// fetches this much at a time.
const BLOCK: u64 = 64 * 1024;

/// A Parquet file read by ranges; clones share the file and what is held
/// of it.
#[derive(Clone)]
pub struct Ranged {
    inner: Arc<Inner>,
}

struct Inner {
    len: u64,
    fetch: Box<Fetch>,
    /// The file's column chunks, sorted by where they start, each with its
    /// column; known once the footer is read ([`Ranged::learn`]).
    layout: OnceLock<Vec<Chunk>>,
    held: Mutex<Held>,
}

#[derive(Clone, Copy)]
struct Chunk {
    bytes: (u64, u64),
    column: usize,
}

#[derive(Default)]
struct Held {
    /// The file's last bytes and where they start.
    tail: Option<(u64, Bytes)>,
    /// The chunk held of each column: (column, start, bytes).
    chunks: Vec<(usize, u64, Bytes)>,
}

impl Ranged {
    /// A file of `len` bytes that `fetch` reads by ranges.
    pub fn new(len: u64, fetch: Box<Fetch>) -> Ranged {
        Ranged {
            inner: Arc::new(Inner {
                len,
                fetch,
                layout: OnceLock::new(),
                held: Mutex::new(Held::default()),
            }),
        }
    }

    /// A reader of the file: its footer read (with the tail, most often in
    /// one request) and its column chunks learned from it.
    pub fn reader(self) -> ParquetResult<ParquetRecordBatchReaderBuilder<Ranged>> {
        let b = ParquetRecordBatchReaderBuilder::try_new(self.clone())?;
        self.learn(b.metadata());
        Ok(b)
    }

    /// Takes the file's column chunks from its footer; until then every read
    /// fetches what it asks for. A chunk whose offsets are negative or lie
    /// past the file's end (a broken footer) is left out: reads in it fetch
    /// only what they ask for, and the Parquet reader names the damage.
    fn learn(&self, meta: &ParquetMetaData) {
        let mut chunks = Vec::new();
        for rg in meta.row_groups() {
            for (column, col) in rg.columns().iter().enumerate() {
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
                        column,
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

    /// A column chunk's bytes: sliced from the tail when it lies there,
    /// else fetched when first asked for, in place of the chunk held of
    /// its column.
    fn chunk(&self, c: Chunk) -> ParquetResult<Bytes> {
        let mut held = self.lock();
        if let Some((from, tail)) = &held.tail {
            if c.bytes.0 >= *from {
                return Ok(tail.slice((c.bytes.0 - from) as usize..(c.bytes.1 - from) as usize));
            }
        }
        match held.chunks.iter().position(|(col, _, _)| *col == c.column) {
            Some(i) if held.chunks[i].1 == c.bytes.0 => Ok(held.chunks[i].2.clone()),
            found => {
                // The column's earlier chunk goes before the next is fetched.
                if let Some(i) = found {
                    held.chunks.swap_remove(i);
                }
                let b = self.fetch(c.bytes.0..c.bytes.1)?;
                held.chunks.push((c.column, c.bytes.0, b.clone()));
                Ok(b)
            }
        }
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
            // get_bytes checked that `end` lies within the file.
            Some((from, b)) if start >= *from => {
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
        self.lock().chunks.iter().map(|(_, _, b)| b.len()).sum()
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

/// A data file read by ranges through the table's file I/O, a column chunk
/// at a time (memory follows a row group, not the file), its footer found
/// by `size`, the manifest's. A manifest whose size is wrong (some older
/// writers recorded other figures) is answered by the object's own size,
/// looked up once the footer is not where the manifest says.
pub fn open_data_file(
    rt: &tokio::runtime::Runtime,
    io: &FileIO,
    file: &str,
    size: u64,
) -> Result<ParquetRecordBatchReaderBuilder<Ranged>, ParquetError> {
    let external = |e: iceberg::Error| ParquetError::External(Box::new(e));
    let input = io.new_input(file).map_err(external)?;
    let open = |size: u64| -> Result<ParquetRecordBatchReaderBuilder<Ranged>, ParquetError> {
        let read = rt.block_on(input.reader()).map_err(external)?;
        let handle = rt.handle().clone();
        Ranged::new(
            size,
            Box::new(move |r: std::ops::Range<u64>| Ok(handle.block_on(read.read(r))?)),
        )
        .reader()
    };
    match open(size) {
        Ok(b) => Ok(b),
        Err(e) => match rt.block_on(input.metadata()) {
            Ok(m) if m.size != size => open(m.size),
            _ => Err(e),
        },
    }
}

/// `b` started `offset` rows into its file: the row groups wholly before
/// that row are left out, so their chunks are never fetched (skipping rows
/// reads their pages), and the rest of the offset is skipped by rows.
pub fn starting_at<T: ChunkReader + 'static>(
    b: ParquetRecordBatchReaderBuilder<T>,
    offset: usize,
) -> ParquetRecordBatchReaderBuilder<T> {
    let mut skip = offset;
    let mut groups = Vec::new();
    for (i, rg) in b.metadata().row_groups().iter().enumerate() {
        let rows = usize::try_from(rg.num_rows()).unwrap_or(0);
        if groups.is_empty() && skip >= rows {
            skip -= rows;
        } else {
            groups.push(i);
        }
    }
    b.with_row_groups(groups).with_offset(skip)
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
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;

    /// A file of `groups` row groups of `rows` rows, three columns, small
    /// pages (hundreds of them in a file of 20,000-row groups).
    fn file(groups: usize, rows: usize) -> (Bytes, Vec<RecordBatch>) {
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

    fn concat(batches: &[RecordBatch]) -> RecordBatch {
        arrow_select::concat::concat_batches(&batches[0].schema(), batches).expect("concat")
    }

    /// The most bytes one chunk of each column can hold: the sum over the
    /// columns of their biggest chunk.
    fn one_chunk_a_column(meta: &ParquetMetaData) -> usize {
        (0..meta.row_group(0).num_columns())
            .map(|col| {
                meta.row_groups()
                    .iter()
                    .map(|rg| rg.column(col).compressed_size() as usize)
                    .max()
                    .unwrap_or(0)
            })
            .sum()
    }

    #[test]
    fn a_file_read_by_ranges_is_fetched_about_once_a_chunk_at_a_time() {
        let groups = 4;
        let (bytes, written) = file(groups, 20_000);
        let c = counted(bytes.clone());
        let b = ParquetRecordBatchReaderBuilder::try_new(c.file.clone()).expect("footer");
        // The footer: one request for the file's tail.
        assert_eq!(c.requests.load(Ordering::Relaxed), 1);
        let meta = b.metadata().clone();
        c.file.learn(&meta);
        let mut most_held = 0;
        let mut read = Vec::new();
        // 7,000 rows a batch: batches straddle the row groups, so columns
        // move to the next row group one after another.
        for batch in b.with_batch_size(7000).build().expect("reader") {
            read.push(batch.expect("a batch"));
            most_held = most_held.max(c.file.held_bytes());
        }
        // Every row as written.
        assert_eq!(concat(&read), concat(&written));
        // Each column chunk fetched once at most, whole, and the tail:
        // about the file's size, in a request per chunk at most.
        let chunks = (groups * 3) as u64;
        let requests = c.requests.load(Ordering::Relaxed);
        assert!(
            requests > chunks / 2 && requests <= 1 + chunks,
            "{requests} requests"
        );
        let fetched = c.fetched.load(Ordering::Relaxed);
        assert!(
            fetched <= bytes.len() as u64 + TAIL,
            "{fetched} of {}",
            bytes.len()
        );
        // Never more than a chunk of each column held.
        let bound = one_chunk_a_column(&meta);
        assert!(most_held > 0 && most_held <= bound, "{most_held} > {bound}");
    }

    #[test]
    fn a_projected_read_fetches_only_its_columns_chunks() {
        let (bytes, written) = file(4, 20_000);
        let c = counted(bytes.clone());
        let b = ParquetRecordBatchReaderBuilder::try_new(c.file.clone()).expect("footer");
        let meta = b.metadata().clone();
        c.file.learn(&meta);
        let mask = parquet::arrow::ProjectionMask::columns(b.parquet_schema(), ["score"]);
        let rows: Vec<RecordBatch> = b
            .with_projection(mask)
            .build()
            .expect("reader")
            .collect::<Result<_, _>>()
            .expect("batches");
        let (read, want) = (concat(&rows), concat(&written));
        assert_eq!(read.column(0), want.column(2));
        // The scores' chunks and the tail: not the ids' and names'.
        let scores: u64 = meta
            .row_groups()
            .iter()
            .map(|rg| rg.column(2).compressed_size() as u64)
            .sum();
        let fetched = c.fetched.load(Ordering::Relaxed);
        assert!(
            fetched <= scores + TAIL,
            "{fetched} fetched, the scores' chunks {scores}"
        );
        assert!(
            fetched < bytes.len() as u64 / 4,
            "{fetched} of {}",
            bytes.len()
        );
    }

    #[test]
    fn a_resumed_read_fetches_nothing_of_the_row_groups_before_it() {
        let (bytes, written) = file(3, 20_000);
        let all = concat(&written);
        let c = counted(bytes.clone());
        let b = ParquetRecordBatchReaderBuilder::try_new(c.file.clone()).expect("footer");
        let meta = b.metadata().clone();
        c.file.learn(&meta);
        let rows: Vec<RecordBatch> = starting_at(b, 25_000)
            .build()
            .expect("reader")
            .collect::<Result<_, _>>()
            .expect("batches");
        assert_eq!(concat(&rows), all.slice(25_000, all.num_rows() - 25_000));
        let first = meta.row_group(0).compressed_size() as u64;
        let fetched = c.fetched.load(Ordering::Relaxed);
        assert!(
            fetched <= bytes.len() as u64 - first + TAIL,
            "{fetched} fetched, the first row group ({first}) among them"
        );
        // Past the end: nothing.
        let b = ParquetRecordBatchReaderBuilder::try_new(c.file.clone()).expect("footer");
        assert_eq!(starting_at(b, 60_000).build().expect("reader").count(), 0);
    }

    #[test]
    fn a_file_without_its_layout_reads_the_same_rows_through_blocks() {
        let (bytes, written) = file(3, 20_000);
        let all = concat(&written);
        let c = counted(bytes.clone());
        let rows: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(c.file.clone())
            .expect("footer")
            .with_offset(25_000)
            .build()
            .expect("reader")
            .collect::<Result<_, _>>()
            .expect("batches");
        assert_eq!(concat(&rows), all.slice(25_000, all.num_rows() - 25_000));
    }

    #[test]
    fn a_small_file_is_one_request() {
        let (bytes, written) = file(2, 500);
        assert!((bytes.len() as u64) < TAIL);
        let c = counted(bytes.clone());
        let b = ParquetRecordBatchReaderBuilder::try_new(c.file.clone()).expect("footer");
        c.file.learn(b.metadata());
        let rows: Vec<RecordBatch> = b
            .build()
            .expect("reader")
            .collect::<Result<_, _>>()
            .expect("batches");
        assert_eq!(concat(&rows), concat(&written));
        assert_eq!(c.requests.load(Ordering::Relaxed), 1);
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

    #[test]
    fn a_data_file_whose_manifest_size_is_wrong_is_read_by_its_own_size() {
        let dir = std::env::temp_dir().join(format!("orca-iceberg-size-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch");
        let path = dir.join("00000.parquet");
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..50_000));
        let batch = RecordBatch::try_from_iter([("id", ids)]).expect("batch");
        let mut w = ArrowWriter::try_new(Vec::new(), batch.schema(), None).expect("writer");
        w.write(&batch).expect("write");
        let bytes = w.into_inner().expect("close");
        std::fs::write(&path, &bytes).expect("write the file");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let io = FileIO::new_with_fs();
        let url = format!("file://{}", path.display());
        let real = bytes.len() as u64;
        for size in [real, real * 2, real - 100] {
            let rows: usize = open_data_file(&rt, &io, &url, size)
                .and_then(|b| starting_at(b, 10).build())
                .unwrap_or_else(|e| panic!("size {size} of {real}: {e}"))
                .map(|b| b.map(|b| b.num_rows()))
                .sum::<Result<usize, _>>()
                .expect("rows");
            assert_eq!(rows, 50_000 - 10, "size {size} of {real}");
        }
        // An object that is not there is an error naming it, not a panic.
        let gone = format!("file://{}", dir.join("gone.parquet").display());
        assert!(open_data_file(&rt, &io, &gone, real).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
