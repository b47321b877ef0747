//! The files source: JSON lines or CSV files under a path or an object store's
//! prefix, read in name order and resumable by file and byte offset.
//!
//! Files are taken to be immutable once written (exact replay): reading
//! again from a resume point returns exactly the records after it. A file
//! that appears later with a name before the resume point is not read; name
//! files so that new ones sort last (a date or sequence prefix).

use bytes::Bytes;
use serde_json::{Map, Value};

/// The files' format, as the definition gives it.
pub use orca_core::sync::FileFormat as Format;

use crate::commit::store::{Store, StoreError};
use crate::source::msg::RawChunk;
use crate::source::normalize::Raw;

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stream {stream}: pattern {pattern:?}: {reason}")]
    Pattern {
        stream: String,
        pattern: String,
        reason: String,
    },
    #[error("{file} vanished while the stream was reading it")]
    Vanished { file: String },
    #[error(
        "{file}: refused: it resolves outside the source's directory {root} (a files \
         source reads what lies under its directory, links resolved)"
    )]
    Outside { file: String, root: String },
    #[error("{file}: {reason}")]
    Local { file: String, reason: String },
    #[error(
        "stream {stream}: parquet files are read as typed columns, not as records (a reader of \
         JSON lines or CSV was asked to read them)"
    )]
    NotRecords { stream: String },
    #[error("resume point {0:?} is not [file, byte offset]")]
    BadPosition(Vec<String>),
    #[error("{file}: the CSV header cannot be read: {reason}")]
    Header { file: String, reason: String },
    #[error(
        "{file}: the record at byte {offset} is longer than {limit} bytes (a line without its \
         end?): the files source reads records of at most that size"
    )]
    RecordTooLarge {
        file: String,
        offset: usize,
        limit: usize,
    },
}

/// One stream's reader.
pub struct FileReader {
    store: Store,
    /// A local store's directory (links resolved): every file is opened
    /// and then checked to lie under it, on the opened file itself.
    root: Option<std::path::PathBuf>,
    /// The local file being read, as opened and checked.
    opened: Option<(String, std::fs::File)>,
    format: Records,
    /// The stream's files in name order, from the resume point's file on.
    files: Vec<String>,
    next_file: usize,
    /// The file being read, a window of it, where the next record starts.
    current: Option<Open>,
    /// The longest record (or CSV header) read; a longer one fails the
    /// stream rather than growing the window without end.
    record_max: usize,
    /// How many bytes a read fetches at least.
    window: usize,
}

/// The formats read as records.
#[derive(Debug, Clone, Copy)]
enum Records {
    Jsonl,
    Csv,
}

/// A file being read through a window of its bytes: files are read in
/// ranges, never whole, so their size does not matter.
struct Open {
    file: String,
    size: usize,
    /// Bytes `base..base + data.len()` of the file.
    data: Bytes,
    base: usize,
    /// Where the next record starts (absolute).
    offset: usize,
    /// A CSV file's header.
    header: Vec<String>,
}

/// Bytes fetched per read unless a record needs more.
pub const WINDOW: usize = 8 << 20;
/// The longest record a files source reads: a file with no line ends (or
/// a CSV quote left open) must not make the reader hold all of it.
pub const RECORD_BYTES_MAX: usize = 64 << 20;

impl FileReader {
    /// A reader of `store`'s files; a local store's are read only if they
    /// lie under its directory (links resolved when it was opened).
    pub fn open(
        store: Store,
        format: Format,
        stream: &str,
        pattern: &str,
        after: Option<&[String]>,
    ) -> Result<FileReader, FilesError> {
        let root = store.local_dir().map(std::path::Path::to_path_buf);
        Self::open_under(store, root, format, stream, pattern, after)
    }

    /// A reader that reads a local file only if, once opened, it lies under
    /// `root`: the directory as netguard allowed it, so that a directory
    /// swapped since cannot move where reads may go.
    pub fn open_under(
        store: Store,
        root: Option<std::path::PathBuf>,
        format: Format,
        stream: &str,
        pattern: &str,
        after: Option<&[String]>,
    ) -> Result<FileReader, FilesError> {
        let format = match format {
            Format::Jsonl => Records::Jsonl,
            Format::Csv => Records::Csv,
            Format::Parquet => {
                return Err(FilesError::NotRecords {
                    stream: stream.to_string(),
                })
            }
        };
        let files = matching(&store, stream, pattern)?;
        let mut reader = FileReader {
            store,
            root,
            opened: None,
            format,
            files: Vec::new(),
            next_file: 0,
            current: None,
            window: WINDOW,
            record_max: RECORD_BYTES_MAX,
        };
        match after {
            None => reader.files = files,
            Some([file, offset]) => {
                let offset: usize = offset
                    .parse()
                    .map_err(|_| FilesError::BadPosition(vec![file.clone(), offset.clone()]))?;
                reader.files = files.into_iter().filter(|f| f > file).collect();
                reader.open_file(file, offset)?;
            }
            Some(other) => return Err(FilesError::BadPosition(other.to_vec())),
        }
        Ok(reader)
    }

    /// Reads windows of at least `window` bytes (tests use small ones).
    pub fn with_window(mut self, window: usize) -> Self {
        self.window = window.max(1);
        self
    }

    /// Reads records of at most `max` bytes (tests use small limits).
    pub fn with_record_max(mut self, max: usize) -> Self {
        self.record_max = max.max(1);
        self
    }

    fn too_large(&self, file: &str, offset: usize) -> FilesError {
        FilesError::RecordTooLarge {
            file: file.to_string(),
            offset,
            limit: self.record_max,
        }
    }

    fn fetch(
        &self,
        file: &str,
        start: usize,
        len: usize,
        size: usize,
    ) -> Result<Bytes, FilesError> {
        let end = (start + len).min(size);
        if start >= end {
            return Ok(Bytes::new());
        }
        if let Some((name, f)) = &self.opened {
            if name == file {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; end - start];
                f.read_exact_at(&mut buf, start as u64)
                    .map_err(|e| FilesError::Local {
                        file: file.to_string(),
                        reason: format!("reading bytes {start}..{end}: {e}"),
                    })?;
                return Ok(Bytes::from(buf));
            }
        }
        Ok(self.store.get_range(file, start as u64, end as u64)?)
    }

    /// A local file's size, opened and checked to lie under the store's
    /// directory: the check is made on the opened file (its path as the
    /// kernel has it), so a link swapped in between a check and the open
    /// cannot lead the read outside.
    fn open_local(&mut self, root: &std::path::Path, file: &str) -> Result<usize, FilesError> {
        let (f, size) = open_checked(root, file)?;
        self.opened = Some((file.to_string(), f));
        Ok(size)
    }

    fn open_file(&mut self, file: &str, offset: usize) -> Result<(), FilesError> {
        self.opened = None;
        let size = match self.root.clone() {
            Some(root) => self.open_local(&root, file)?,
            None => self.store.size(file)?.ok_or_else(|| FilesError::Vanished {
                file: file.to_string(),
            })? as usize,
        };
        let (header, start) = match self.format {
            Records::Jsonl => (Vec::new(), 0),
            Records::Csv => {
                // The header is the first record: read a window that holds it.
                let mut len = self.window;
                let head = loop {
                    let head = self.fetch(file, 0, len, size)?;
                    if head.contains(&b'\n') || head.len() >= size {
                        break head;
                    }
                    if len > self.record_max {
                        return Err(self.too_large(file, 0));
                    }
                    len *= 2;
                };
                let mut r = csv::ReaderBuilder::new()
                    .has_headers(false)
                    .flexible(true)
                    .from_reader(&head[..]);
                let mut rec = csv::ByteRecord::new();
                let got = r
                    .read_byte_record(&mut rec)
                    .map_err(|e| FilesError::Header {
                        file: file.to_string(),
                        reason: e.to_string(),
                    })?;
                let header = if got {
                    rec.iter()
                        .map(|h| String::from_utf8_lossy(h).trim().to_string())
                        .collect()
                } else {
                    Vec::new()
                };
                (header, r.position().byte() as usize)
            }
        };
        let offset = offset.max(start);
        self.current = Some(Open {
            file: file.to_string(),
            size,
            data: self.fetch(file, offset, self.window, size)?,
            base: offset,
            offset,
            header,
        });
        Ok(())
    }

    /// Reads up to `max` records; `None` when every file is read.
    pub fn next_chunk(&mut self, max: usize) -> Result<Option<RawChunk>, FilesError> {
        let mut records = Vec::new();
        let mut last = Vec::new();
        while records.len() < max {
            if self.current.is_none() {
                let Some(file) = self.files.get(self.next_file).cloned() else {
                    break;
                };
                self.next_file += 1;
                self.open_file(&file, 0)?;
            }
            let Some(o) = self.current.as_mut() else {
                break;
            };
            let want = max - records.len();
            let rel = o.offset - o.base;
            let complete = o.base + o.data.len() >= o.size;
            let window = &o.data[rel..];
            let used = match self.format {
                Records::Jsonl => {
                    read_jsonl(&o.file, window, o.offset, complete, want, &mut records)
                }
                Records::Csv => read_csv(
                    &o.file,
                    window,
                    o.offset,
                    complete,
                    &o.header,
                    want,
                    &mut records,
                ),
            };
            o.offset += used;
            last = vec![o.file.clone(), o.offset.to_string()];
            if o.offset >= o.size {
                self.current = None;
            } else if records.len() < max {
                // The window ran out before a whole record: read on from
                // where the next one starts, twice as far if a single record
                // did not fit.
                let pending = o.data.len() - rel;
                if used == 0 && pending > self.record_max {
                    let (file, offset) = (o.file.clone(), o.offset);
                    return Err(self.too_large(&file, offset));
                }
                let len = if used == 0 { pending.max(1) * 2 } else { 0 }.max(self.window);
                let (file, offset, size) = (o.file.clone(), o.offset, o.size);
                let data = self.fetch(&file, offset, len, size)?;
                if let Some(o) = self.current.as_mut() {
                    o.data = data;
                    o.base = offset;
                }
            }
        }
        Ok((!records.is_empty()).then_some(RawChunk { records, last }))
    }
}

/// A local file of a files source, opened and checked to lie under the
/// source's directory (`root`, links resolved): the check is made on the
/// opened file itself (its path as the kernel has it), so a link swapped in
/// between a check and the open cannot lead the read outside. Returns the
/// file and its size.
pub(crate) fn open_checked(
    root: &std::path::Path,
    file: &str,
) -> Result<(std::fs::File, usize), FilesError> {
    use std::os::fd::AsRawFd;
    let local = |reason: String| FilesError::Local {
        file: file.to_string(),
        reason,
    };
    if file
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return Err(local("a file's name may not hold '.', '..' or '//'".into()));
    }
    let path = root.join(file);
    let vanished = || FilesError::Vanished {
        file: file.to_string(),
    };
    // Only regular files are opened, and without blocking: a FIFO or a
    // device put in the directory is refused, not waited on.
    match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(local("it is not a regular file".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(vanished()),
        Err(e) => return Err(local(format!("looking it up: {e}"))),
    }
    let f = {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(vanished()),
            Err(e) => return Err(local(format!("opening it: {e}"))),
        }
    };
    let real = std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .map_err(|e| local(format!("resolving the opened file: {e}")))?;
    if !real.starts_with(root) {
        return Err(FilesError::Outside {
            file: file.to_string(),
            root: root.display().to_string(),
        });
    }
    let meta = f
        .metadata()
        .map_err(|e| local(format!("reading its size: {e}")))?;
    if !meta.is_file() {
        return Err(local("it is not a regular file".into()));
    }
    Ok((f, meta.len() as usize))
}

/// The files of a stream's pattern in `store`, in name order.
pub(crate) fn matching(
    store: &Store,
    stream: &str,
    pattern: &str,
) -> Result<Vec<String>, FilesError> {
    let glob = glob::Pattern::new(pattern).map_err(|e| FilesError::Pattern {
        stream: stream.to_string(),
        pattern: pattern.to_string(),
        reason: e.to_string(),
    })?;
    let opts = glob::MatchOptions {
        require_literal_separator: true,
        ..glob::MatchOptions::new()
    };
    let mut files: Vec<String> = store
        .list("")?
        .into_iter()
        .filter(|f| glob.matches_with(f, opts))
        .collect();
    files.sort();
    Ok(files)
}

fn raw(file: &str, offset: usize, record: Value) -> Raw {
    Raw {
        position: format!("{file}@{offset}"),
        seq: 0,
        record,
    }
}

/// Reads whole JSON lines from a window starting at file offset `at0`
/// (`complete`: the window reaches the end of the file); returns the bytes
/// used.
fn read_jsonl(
    file: &str,
    data: &[u8],
    at0: usize,
    complete: bool,
    want: usize,
    out: &mut Vec<Result<Raw, (Raw, String)>>,
) -> usize {
    let mut taken = 0;
    let mut used = 0;
    while used < data.len() && taken < want {
        let rest = &data[used..];
        let len = match rest.iter().position(|b| *b == b'\n') {
            Some(p) => p + 1,
            // The last line of the file may lack its newline; anywhere else
            // the rest of the line is in the next window.
            None if complete => rest.len(),
            None => break,
        };
        let line = &rest[..len];
        let at = at0 + used;
        used += len;
        let text = String::from_utf8_lossy(line);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        taken += 1;
        match serde_json::from_str::<Value>(text) {
            Ok(v) => out.push(Ok(raw(file, at, v))),
            Err(e) => out.push(Err((
                raw(file, at, Value::String(text.to_string())),
                format!("not JSON: {e}"),
            ))),
        }
    }
    used
}

/// Reads whole CSV records, with the file's header, from a window starting
/// at file offset `at0` (`complete`: the window reaches the end of the file);
/// returns the bytes used. Values are strings (a CSV declares no types) and
/// empty fields are null.
fn read_csv(
    file: &str,
    data: &[u8],
    at0: usize,
    complete: bool,
    header: &[String],
    want: usize,
    out: &mut Vec<Result<Raw, (Raw, String)>>,
) -> usize {
    let mut r = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(data);
    let mut rec = csv::ByteRecord::new();
    let mut taken = 0;
    let mut used = 0;
    while taken < want {
        let at = at0 + used;
        match r.read_byte_record(&mut rec) {
            Ok(false) => {
                if complete {
                    used = data.len();
                }
                break;
            }
            Ok(true) => {
                let after = r.position().byte() as usize;
                // A record that reaches the window's end may go on in the
                // next one: read it again from there.
                if !complete && after >= data.len() {
                    break;
                }
                used = after;
                taken += 1;
                if rec.len() != header.len() {
                    let text: Vec<String> = rec
                        .iter()
                        .map(|f| String::from_utf8_lossy(f).into_owned())
                        .collect();
                    out.push(Err((
                        raw(file, at, Value::from(text)),
                        format!("{} fields, the header has {}", rec.len(), header.len()),
                    )));
                    continue;
                }
                let mut obj = Map::new();
                for (h, f) in header.iter().zip(rec.iter()) {
                    let v = if f.is_empty() {
                        Value::Null
                    } else {
                        Value::String(String::from_utf8_lossy(f).into_owned())
                    };
                    obj.insert(h.clone(), v);
                }
                out.push(Ok(raw(file, at, Value::Object(obj))));
            }
            Err(_) if !complete => break,
            Err(e) => {
                // The CSV reader cannot go on past a broken record.
                used = data.len();
                out.push(Err((
                    raw(file, at, Value::Null),
                    format!("unreadable CSV from here to the end of the file: {e}"),
                )));
                break;
            }
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with(files: &[(&str, &str)]) -> (Store, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("orca-files-{}", uuid::Uuid::new_v4().simple()));
        let _ = std::fs::remove_dir_all(&dir);
        let s = Store::open(dir.to_str().expect("utf-8")).expect("store");
        for (name, body) in files {
            s.put(name, Bytes::from(body.to_string())).expect("put");
        }
        (s, dir)
    }

    fn positions(chunk: &RawChunk) -> Vec<String> {
        chunk
            .records
            .iter()
            .map(|r| match r {
                Ok(raw) => raw.position.clone(),
                Err((raw, why)) => format!("{} ({why})", raw.position),
            })
            .collect()
    }

    #[test]
    fn a_file_that_resolves_outside_the_directory_is_refused_when_opened() {
        let (store, dir) = store_with(&[("in/a.jsonl", "{\"x\":1}\n")]);
        drop(store);
        let outside = dir.with_extension("outside");
        std::fs::create_dir_all(&outside).expect("outside");
        std::fs::write(outside.join("secret.jsonl"), "{\"secret\":1}\n").expect("secret");
        std::os::unix::fs::symlink(outside.join("secret.jsonl"), dir.join("in/b.jsonl"))
            .expect("a link out");
        // A link that stays inside is read.
        std::os::unix::fs::symlink(dir.join("in/a.jsonl"), dir.join("in/c.jsonl"))
            .expect("a link in");
        let store = Store::open_existing(dir.to_str().expect("utf-8")).expect("store");
        let mut r =
            FileReader::open(store, Format::Jsonl, "events", "in/*.jsonl", None).expect("open");
        let c = r.next_chunk(1).expect("a.jsonl").expect("chunk");
        assert_eq!(positions(&c), ["in/a.jsonl@0"]);
        let e = r
            .next_chunk(10)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("in/b.jsonl") && e.contains("outside the source's directory"),
            "{e}"
        );
        // A link that stays inside the directory reads.
        let store = Store::open_existing(dir.to_str().expect("utf-8")).expect("store");
        let r = FileReader::open(store, Format::Jsonl, "events", "in/c.jsonl", None)
            .and_then(|mut r| r.next_chunk(10));
        assert!(
            matches!(r, Ok(Some(_))),
            "a link inside the directory reads"
        );
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&outside);
    }

    #[test]
    fn jsonl_files_resume_by_file_and_offset() {
        let (store, dir) = store_with(&[
            ("in/a.jsonl", "{\"x\":1}\n{\"x\":2}\n\nnot json\n"),
            ("in/b.jsonl", "{\"x\":3}"),
            ("other/c.jsonl", "{\"x\":4}\n"),
        ]);
        let dir_s = dir.to_str().expect("utf-8").to_string();
        let mut r =
            FileReader::open(store, Format::Jsonl, "events", "in/*.jsonl", None).expect("open");
        let c = r.next_chunk(2).expect("read").expect("chunk");
        assert_eq!(positions(&c), ["in/a.jsonl@0", "in/a.jsonl@8"]);
        assert_eq!(c.last, ["in/a.jsonl", "16"]);
        let c = r.next_chunk(5).expect("read").expect("chunk");
        let p = positions(&c);
        assert!(p[0].starts_with("in/a.jsonl@17 (not JSON"), "{p:?}");
        assert_eq!(p[1], "in/b.jsonl@0");
        assert_eq!(c.last, ["in/b.jsonl", "7"]);
        assert!(r.next_chunk(5).expect("read").is_none());

        // Resuming inside a.jsonl reads the rest of it, then b.
        let store = Store::open(&dir_s).expect("store");
        let mut r = FileReader::open(
            store,
            Format::Jsonl,
            "events",
            "in/*.jsonl",
            Some(&["in/a.jsonl".into(), "8".into()]),
        )
        .expect("open");
        let c = r.next_chunk(10).expect("read").expect("chunk");
        assert_eq!(positions(&c).len(), 3, "x=2, the bad line, x=3");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn tiny_windows_read_the_same_records_as_whole_files() {
        let jsonl: String = (0..200)
            .map(|i| format!("{{\"id\": {i}, \"pad\": \"{}\"}}\n", "x".repeat(i % 37)))
            .collect();
        let csv: String = std::iter::once("id,text\n".to_string())
            .chain((0..200).map(|i| format!("{i},\"a, {}\nb\"\n", "y".repeat(i % 29))))
            .collect();
        let (store, dir) = store_with(&[("w/a.jsonl", &jsonl), ("w/b.csv", &csv)]);
        let dir_s = dir.to_str().expect("utf-8").to_string();
        for (format, pattern) in [(Format::Jsonl, "w/*.jsonl"), (Format::Csv, "w/*.csv")] {
            let read = |window: usize| {
                let store = Store::open(&dir_s).expect("store");
                let mut r = FileReader::open(store, format, "s", pattern, None)
                    .expect("open")
                    .with_window(window);
                let mut all = Vec::new();
                while let Some(c) = r.next_chunk(7).expect("read") {
                    all.extend(c.records.into_iter().map(|r| match r {
                        Ok(raw) => (raw.position, raw.record),
                        Err((raw, why)) => (raw.position, Value::String(why)),
                    }));
                }
                all
            };
            let whole = read(1 << 20);
            assert_eq!(whole.len(), 200, "{format:?}");
            for window in [1, 5, 16, 100] {
                assert_eq!(
                    read(window),
                    whole,
                    "{format:?} through windows of {window} bytes"
                );
            }
        }
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_record_longer_than_the_limit_fails_the_stream_without_reading_on() {
        let long = format!(
            "{{\"id\": 1}}\n{{\"id\": 2, \"pad\": \"{}\"}}\n",
            "x".repeat(5000)
        );
        let (store, dir) = store_with(&[("l/a.jsonl", &long), ("l/b.csv", &"h".repeat(5000))]);
        let dir_s = dir.to_str().expect("utf-8").to_string();
        for (format, pattern) in [(Format::Jsonl, "l/*.jsonl"), (Format::Csv, "l/*.csv")] {
            let store = Store::open(&dir_s).expect("store");
            let mut r = FileReader::open(store, format, "s", pattern, None).and_then(|r| {
                let mut r = r.with_window(64).with_record_max(1024);
                // The first record fits; the second does not.
                while r.next_chunk(10)?.is_some() {}
                Ok(r)
            });
            let e = match r.as_mut() {
                Ok(_) => panic!("{format:?}: read a record over the limit"),
                Err(e) => e.to_string(),
            };
            assert!(e.contains("longer than 1024 bytes"), "{format:?}: {e}");
        }
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn csv_rows_are_objects_by_header_and_resume_after_the_header() {
        let (store, dir) = store_with(&[("c/a.csv", "id,name\n1,\"a, b\"\n2,\n3,x,extra\n")]);
        let dir_s = dir.to_str().expect("utf-8").to_string();
        let mut r = FileReader::open(store, Format::Csv, "people", "c/*.csv", None).expect("open");
        let c = r.next_chunk(10).expect("read").expect("chunk");
        let ok: Vec<&Value> = c
            .records
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|r| &r.record)
            .collect();
        assert_eq!(ok[0], &serde_json::json!({"id": "1", "name": "a, b"}));
        assert_eq!(ok[1], &serde_json::json!({"id": "2", "name": null}));
        assert!(
            matches!(&c.records[2], Err((_, why)) if why.contains("3 fields, the header has 2"))
        );
        let store = Store::open(&dir_s).expect("store");
        let mut r = FileReader::open(
            store,
            Format::Csv,
            "people",
            "c/*.csv",
            Some(&["c/a.csv".into(), "8".into()]),
        )
        .expect("open");
        let c = r.next_chunk(1).expect("read").expect("chunk");
        assert_eq!(
            c.records[0].as_ref().ok().map(|r| r.record.clone()),
            Some(serde_json::json!({"id": "1", "name": "a, b"}))
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
