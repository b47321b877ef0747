//! Object storage for a sync: the checkpoint log, staged epochs and attempt
//! logs under `{org}/{sync}/`, and the files of a parquet destination.
//!
//! A URL picks the store, read by `orca_lake::objstore` as the Iceberg
//! warehouse's is: a path or `file://` for the local file system,
//! `s3://bucket/prefix` for S3 (or an S3-compatible server),
//! `az://container/prefix` for Azure Blob Storage, `gs://bucket/prefix`
//! for Google Cloud Storage, each with the credentials of the runner's
//! environment. Records are created with a conditional write (S3's
//! `If-None-Match`, Azure's and GCS's preconditions), so two engines
//! cannot both commit one epoch. The engine is synchronous, so each call
//! blocks on a small runtime of its own.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("{op} {path}: {source}")]
    Object {
        op: &'static str,
        path: String,
        source: object_store::Error,
    },
    #[error("{path} exists already: records are immutable")]
    Exists { path: String },
    #[error("starting the store's runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

impl StoreError {
    /// Whether the store did not answer, after its client's own retries
    /// ([`orca_lake::objstore::unavailable`]): the attempt failed for the
    /// store's sake, not its work's.
    pub fn unavailable(&self) -> bool {
        match self {
            StoreError::Object { source, .. } => orca_lake::objstore::unavailable(source),
            _ => false,
        }
    }
}

/// How long a write waits for a full local disk to have room again before
/// the attempt stops (and is handed back): as long as an object store's
/// client retries a store that does not answer, and under the minute after
/// which a silent replication connection is dropped.
pub const FULL_DISK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(45);

/// A store and the prefix everything of this use lives under.
pub struct Store {
    rt: tokio::runtime::Runtime,
    os: Arc<dyn ObjectStore>,
    /// The same store when it is a local directory, for what a file system
    /// does better than objects (publishing by a hard link).
    local: Option<Arc<LocalFileSystem>>,
    /// The local directory, its links resolved when the store was opened.
    dir: Option<std::path::PathBuf>,
    prefix: Path,
    url: String,
}

impl Store {
    /// Opens a store to write to; a local directory is made if missing.
    pub fn open(url: &str) -> Result<Store, StoreError> {
        Self::open_with(url, true)
    }

    /// Opens a store to read from; a local directory must exist.
    pub fn open_existing(url: &str) -> Result<Store, StoreError> {
        Self::open_with(url, false)
    }

    fn open_with(url: &str, create: bool) -> Result<Store, StoreError> {
        let bad = |reason: String| StoreError::Url {
            url: url.to_string(),
            reason,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let place = orca_lake::objstore::place(url).map_err(|e| bad(e.message().to_string()))?;
        let mut local = None;
        let mut real = None;
        let (os, prefix): (Arc<dyn ObjectStore>, Path) = match place {
            orca_lake::objstore::Place::Bucket {
                cloud, bucket, key, ..
            } => (
                orca_lake::objstore::bucket_store(&cloud, &bucket, &Default::default())
                    .map_err(|e| bad(e.message().to_string()))?,
                key,
            ),
            orca_lake::objstore::Place::Local => {
                let dir = url.strip_prefix("file://").unwrap_or(url);
                if !dir.starts_with('/') {
                    return Err(bad(
                        "a local store needs an absolute path (or an object store's URL: s3://, az://, gs://)"
                            .into(),
                    ));
                }
                if create {
                    std::fs::create_dir_all(dir).map_err(|e| bad(e.to_string()))?;
                } else if !std::path::Path::new(dir).is_dir() {
                    return Err(bad("no such directory".into()));
                }
                let fs = Arc::new(
                    LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(e.to_string()))?,
                );
                local = Some(fs.clone());
                real = Some(std::fs::canonicalize(dir).map_err(|e| bad(e.to_string()))?);
                (fs, Path::default())
            }
        };
        Ok(Store {
            rt,
            os,
            local,
            dir: real,
            prefix,
            url: url.trim_end_matches('/').to_string(),
        })
    }

    /// A local store's directory, its links resolved when it was opened.
    pub fn local_dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref()
    }

    fn path(&self, rel: &str) -> Path {
        rel.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.prefix.clone(), |p, part| p.child(part))
    }

    /// The URL of an object, for messages and records.
    pub fn url_of(&self, rel: &str) -> String {
        format!("{}/{rel}", self.url)
    }

    fn err<'a>(
        op: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(object_store::Error) -> StoreError + 'a {
        move |source| StoreError::Object {
            op,
            path: path.to_string(),
            source,
        }
    }

    /// Writes an object, waiting out a local store's full disk: a write
    /// that finds no space is made again, at growing intervals, for up to
    /// [`FULL_DISK_PATIENCE`] (as long as an object store's client retries
    /// a failing store), each wait said on stderr, the attempt's log.
    fn put_patiently(
        &self,
        p: &Path,
        data: &Bytes,
        opts: PutOptions,
    ) -> Result<(), object_store::Error> {
        let t0 = std::time::Instant::now();
        let mut wait = std::time::Duration::from_millis(250);
        loop {
            let put = self
                .os
                .put_opts(p, PutPayload::from(data.clone()), opts.clone());
            match self.rt.block_on(put) {
                Ok(_) => return Ok(()),
                Err(e)
                    if self.local.is_some()
                        && orca_lake::objstore::disk_full(&e)
                        && t0.elapsed() + wait < FULL_DISK_PATIENCE =>
                {
                    let line = serde_json::json!({
                        "at": chrono::Utc::now()
                            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                        "event": "store_disk_full",
                        "path": self.url_of(p.as_ref()),
                        "waiting_ms": wait.as_millis() as u64,
                    });
                    // Stderr may be a dead runner's pipe: eprintln! would panic.
                    let _ = writeln!(std::io::stderr(), "{line}");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(std::time::Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes an object that must not exist yet.
    ///
    /// An object store's client retries a write whose answer it did not
    /// get (a 500, a dropped connection), and the write may have landed the
    /// first time: the retry then finds the object there. One holding
    /// exactly these bytes is this write's own, and the write succeeded;
    /// one holding others is another writer's.
    pub fn create(&self, rel: &str, data: Bytes) -> Result<(), StoreError> {
        let p = self.path(rel);
        let opts = PutOptions::from(PutMode::Create);
        match self.put_patiently(&p, &data, opts) {
            Ok(()) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => match self.get(rel)? {
                Some(there) if there == data => Ok(()),
                _ => Err(StoreError::Exists {
                    path: p.to_string(),
                }),
            },
            Err(e) => Err(Self::err("writing", &p)(e)),
        }
    }

    /// Writes (or replaces) an object.
    pub fn put(&self, rel: &str, data: Bytes) -> Result<(), StoreError> {
        let p = self.path(rel);
        self.put_patiently(&p, &data, PutOptions::default())
            .map_err(Self::err("writing", &p))
    }

    /// Reads an object; `None` when there is none.
    pub fn get(&self, rel: &str) -> Result<Option<Bytes>, StoreError> {
        let p = self.path(rel);
        self.rt.block_on(async {
            match self.os.get(&p).await {
                Ok(r) => r.bytes().await.map(Some).map_err(Self::err("reading", &p)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(Self::err("reading", &p)(e)),
            }
        })
    }

    /// An object's size; `None` when there is none.
    pub fn size(&self, rel: &str) -> Result<Option<u64>, StoreError> {
        let p = self.path(rel);
        match self.rt.block_on(self.os.head(&p)) {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(Self::err("looking up", &p)(e)),
        }
    }

    /// Bytes `start..end` of an object.
    pub fn get_range(&self, rel: &str, start: u64, end: u64) -> Result<Bytes, StoreError> {
        let p = self.path(rel);
        self.rt
            .block_on(self.os.get_range(&p, start..end))
            .map_err(Self::err("reading", &p))
    }

    pub fn exists(&self, rel: &str) -> Result<bool, StoreError> {
        let p = self.path(rel);
        match self.rt.block_on(self.os.head(&p)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(Self::err("looking up", &p)(e)),
        }
    }

    pub fn delete(&self, rel: &str) -> Result<(), StoreError> {
        let p = self.path(rel);
        match self.rt.block_on(self.os.delete(&p)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Self::err("deleting", &p)(e)),
        }
    }

    /// Writes (or replaces) `rel` with the bytes of `source`'s `from`, and
    /// says whether `from` was there. Between two directories of one local
    /// file system that is a hard link (the bytes are not written a second
    /// time), made under a hidden name and renamed over `rel`, so a reader
    /// sees the old object or the new one; otherwise a read and a write.
    pub fn put_from(&self, source: &Store, from: &str, rel: &str) -> Result<bool, StoreError> {
        if let (Some(dst), Some(src)) = (&self.local, &source.local) {
            let (to, origin) = (self.path(rel), source.path(from));
            if let (Ok(to_file), Ok(from_file)) =
                (dst.path_to_filesystem(&to), src.path_to_filesystem(&origin))
            {
                match link_over(&from_file, &to_file) {
                    Ok(()) => return Ok(true),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && !from_file.exists() => {
                        return Ok(false)
                    }
                    // Another device, a file system without links: copied.
                    Err(_) => {}
                }
            }
        }
        match source.get(from)? {
            Some(data) => self.put(rel, data).map(|()| true),
            None => Ok(false),
        }
    }

    /// The objects under a folder, as paths relative to the store.
    pub fn list(&self, rel: &str) -> Result<Vec<String>, StoreError> {
        let p = self.path(rel);
        let found: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(self.os.list(Some(&p)).try_collect())
            .map_err(Self::err("listing", &p))?;
        let base = self.prefix.as_ref();
        let mut out: Vec<String> = found
            .into_iter()
            .map(|m| {
                let s = m.location.to_string();
                s.strip_prefix(base)
                    .map(|r| r.trim_start_matches('/').to_string())
                    .unwrap_or(s)
            })
            .collect();
        out.sort();
        Ok(out)
    }
}

/// Links `from` as `to`: under a hidden name beside `to` first, then
/// renamed over it (atomic, and it replaces what was there).
fn link_over(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    let dir = to
        .parent()
        .ok_or_else(|| std::io::Error::other("an object path has a folder"))?;
    std::fs::create_dir_all(dir)?;
    let name = to
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.link-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::fs::hard_link(from, &tmp)?;
    if let Err(e) = std::fs::rename(&tmp, to) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_immutable_and_missing_objects_are_none() {
        let dir = std::env::temp_dir().join(format!("orca-store-{}", std::process::id()));
        let s = Store::open(dir.to_str().expect("utf-8 temp dir")).expect("store");
        assert_eq!(s.get("a/b/c.json").expect("get"), None);
        s.create("a/b/c.json", Bytes::from_static(b"1"))
            .expect("create");
        assert!(matches!(
            s.create("a/b/c.json", Bytes::from_static(b"2")),
            Err(StoreError::Exists { .. })
        ));
        // The same bytes again: a client's retry of a write that landed.
        s.create("a/b/c.json", Bytes::from_static(b"1"))
            .expect("a write that finds its own bytes succeeded");
        assert_eq!(
            s.get("a/b/c.json").expect("get"),
            Some(Bytes::from_static(b"1"))
        );
        s.put("a/d", Bytes::from_static(b"x")).expect("put");
        assert_eq!(s.list("a").expect("list"), vec!["a/b/c.json", "a/d"]);
        s.delete("a/d").expect("delete");
        s.delete("a/d").expect("deleting twice is fine");
        assert!(!s.exists("a/d").expect("exists"));
        assert!(Store::open("relative/path").is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn publishing_between_local_stores_links_and_replaces() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("orca-store-link-{}", std::process::id()));
        let open = |d: &str| Store::open(dir.join(d).to_str().expect("utf-8")).expect("store");
        let (staging, out) = (open("staging"), open("out"));
        staging
            .put(
                "_staging/1-g1/orders-lane0.parquet",
                Bytes::from_static(b"new"),
            )
            .expect("stage");
        out.put("orders/part-1.parquet", Bytes::from_static(b"old"))
            .expect("an earlier try's file");
        assert!(out
            .put_from(
                &staging,
                "_staging/1-g1/orders-lane0.parquet",
                "orders/part-1.parquet"
            )
            .expect("publish"));
        assert_eq!(
            out.get("orders/part-1.parquet").expect("get"),
            Some(Bytes::from_static(b"new"))
        );
        let ino = |p: &str| std::fs::metadata(dir.join(p)).expect("metadata").ino();
        assert_eq!(
            ino("staging/_staging/1-g1/orders-lane0.parquet"),
            ino("out/orders/part-1.parquet"),
            "one file, linked"
        );
        assert_eq!(
            out.list("orders").expect("list"),
            vec!["orders/part-1.parquet"]
        );
        assert!(!out
            .put_from(
                &staging,
                "_staging/9-g1/gone.parquet",
                "orders/part-9.parquet"
            )
            .expect("a missing staged file"));
        assert!(!out.exists("orders/part-9.parquet").expect("exists"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
