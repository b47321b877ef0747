//! Object storage for a sync: the checkpoint log, staged epochs and attempt
//! logs under `{org}/{sync}/`, and the files of a parquet destination.
//!
//! A URL picks the store, read by `orca_lake::objstore` as the Iceberg
//! warehouse's is: a path or `file://` for the local file system,
//! `s3://bucket/prefix` for S3 (or an S3-compatible server; credentials,
//! region and endpoint from the usual `AWS_*` variables). The engine is
//! synchronous, so each call blocks on a small runtime of its own.

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

/// A store and the prefix everything of this use lives under.
pub struct Store {
    rt: tokio::runtime::Runtime,
    os: Arc<dyn ObjectStore>,
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
        let (os, prefix): (Arc<dyn ObjectStore>, Path) = match place {
            orca_lake::objstore::Place::Bucket { bucket, key } => (
                orca_lake::objstore::bucket_store(&bucket, &Default::default())
                    .map_err(|e| bad(e.message().to_string()))?,
                key,
            ),
            orca_lake::objstore::Place::Local => {
                let dir = url.strip_prefix("file://").unwrap_or(url);
                if !dir.starts_with('/') {
                    return Err(bad(
                        "a local store needs an absolute path (or s3://bucket/prefix)".into(),
                    ));
                }
                if create {
                    std::fs::create_dir_all(dir).map_err(|e| bad(e.to_string()))?;
                } else if !std::path::Path::new(dir).is_dir() {
                    return Err(bad("no such directory".into()));
                }
                let fs = LocalFileSystem::new_with_prefix(dir).map_err(|e| bad(e.to_string()))?;
                (Arc::new(fs), Path::default())
            }
        };
        Ok(Store {
            rt,
            os,
            prefix,
            url: url.trim_end_matches('/').to_string(),
        })
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

    /// Writes an object that must not exist yet.
    pub fn create(&self, rel: &str, data: Bytes) -> Result<(), StoreError> {
        let p = self.path(rel);
        let opts = PutOptions::from(PutMode::Create);
        match self
            .rt
            .block_on(self.os.put_opts(&p, PutPayload::from(data), opts))
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => Err(StoreError::Exists {
                path: p.to_string(),
            }),
            Err(e) => Err(Self::err("writing", &p)(e)),
        }
    }

    /// Writes (or replaces) an object.
    pub fn put(&self, rel: &str, data: Bytes) -> Result<(), StoreError> {
        let p = self.path(rel);
        self.rt
            .block_on(self.os.put(&p, PutPayload::from(data)))
            .map(|_| ())
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
}
