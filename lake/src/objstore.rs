//! Iceberg storage on object stores, through the `object_store` crate:
//! iceberg 0.10 itself ships only local and in-memory storage.
//!
//! A warehouse `s3://bucket/prefix` keeps data and metadata in that bucket.
//! Credentials, region and endpoint come from the usual `AWS_*` variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ENDPOINT`, `AWS_ALLOW_HTTP` for an endpoint without TLS), or from the
//! catalog's `s3.*` properties, which win. Paths without a scheme or with
//! `file:` stay on the local file system.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};

/// Builds [`ObjectStorage`] for the catalog's FileIO.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ObjectStoreFactory;

#[typetag::serde]
impl StorageFactory for ObjectStoreFactory {
    fn build(&self, config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(ObjectStorage {
            props: config.props().clone(),
            stores: Arc::default(),
        }))
    }
}

/// Storage that sends `s3://` paths to S3 (or an S3-compatible server) and
/// every other path to the local file system.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObjectStorage {
    props: HashMap<String, String>,
    /// One client per bucket, made on first use.
    #[serde(skip)]
    stores: Arc<Mutex<HashMap<String, Arc<dyn ObjectStore>>>>,
}

fn io_error(what: &str, path: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unexpected, format!("{what} {path}: {e}"))
}

/// Where a URL lives: a bucket and a key in it, or the local file system.
/// The one reading of store URLs: the Iceberg storage below and the
/// engine's store both use it.
pub enum Place {
    Bucket { bucket: String, key: Path },
    Local,
}

/// `s3://bucket/key` (or `s3a://`) is a bucket; a path or `file://` is local;
/// any other scheme is refused.
pub fn place(path: &str) -> Result<Place> {
    let Some(rest) = path
        .strip_prefix("s3://")
        .or_else(|| path.strip_prefix("s3a://"))
    else {
        if path.contains("://") && !path.starts_with("file://") {
            return Err(Error::new(
                ErrorKind::FeatureUnsupported,
                format!("{path}: only s3:// object stores and local paths are supported"),
            ));
        }
        return Ok(Place::Local);
    };
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(Error::new(
            ErrorKind::DataInvalid,
            format!("{path} names no bucket"),
        ));
    }
    Ok(Place::Bucket {
        bucket: bucket.to_string(),
        key: Path::parse(key).map_err(|e| io_error("bad object path", path, e))?,
    })
}

impl ObjectStorage {
    fn store(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>> {
        let mut stores = self
            .stores
            .lock()
            .map_err(|_| Error::new(ErrorKind::Unexpected, "object store cache poisoned"))?;
        if let Some(s) = stores.get(bucket) {
            return Ok(s.clone());
        }
        let store = bucket_store(bucket, &self.props)?;
        stores.insert(bucket.to_string(), store.clone());
        Ok(store)
    }

    fn resolve(&self, path: &str) -> Result<Option<(Arc<dyn ObjectStore>, Path)>> {
        match place(path)? {
            Place::Local => Ok(None),
            Place::Bucket { bucket, key } => Ok(Some((self.store(&bucket)?, key))),
        }
    }
}

/// An S3 (or S3-compatible) bucket: credentials, region and endpoint from the
/// usual `AWS_*` variables, or from `s3.*` properties, which win.
pub fn bucket_store(bucket: &str, props: &HashMap<String, String>) -> Result<Arc<dyn ObjectStore>> {
    let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let prop = |k: &str| props.get(k).filter(|v| !v.is_empty());
    if let Some(v) = prop("s3.endpoint") {
        b = b
            .with_endpoint(v)
            .with_allow_http(v.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    }
    if let Some(v) = prop("s3.access-key-id") {
        b = b.with_access_key_id(v);
    }
    if let Some(v) = prop("s3.secret-access-key") {
        b = b.with_secret_access_key(v);
    }
    if let Some(v) = prop("s3.session-token") {
        b = b.with_token(v);
    }
    if let Some(v) = prop("s3.region").or_else(|| prop("client.region")) {
        b = b.with_region(v);
    }
    Ok(Arc::new(
        b.build()
            .map_err(|e| io_error("cannot open bucket", bucket, e))?,
    ))
}

struct ObjectRead {
    store: Arc<dyn ObjectStore>,
    key: Path,
}

#[async_trait]
impl FileRead for ObjectRead {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.store
            .get_range(&self.key, range)
            .await
            .map_err(|e| io_error("cannot read", self.key.as_ref(), e))
    }
}

/// Buffers a file and uploads it whole on close (metadata and data files of
/// pipeline steps are small; a multipart upload is a later refinement).
struct ObjectWrite {
    store: Arc<dyn ObjectStore>,
    key: Path,
    buf: Vec<u8>,
    closed: bool,
}

#[async_trait]
impl FileWrite for ObjectWrite {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        self.buf.extend_from_slice(&bs);
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        if self.closed {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("{} is already closed", self.key),
            ));
        }
        self.closed = true;
        let body = Bytes::from(std::mem::take(&mut self.buf));
        self.store
            .put(&self.key, body.into())
            .await
            .map_err(|e| io_error("cannot write", self.key.as_ref(), e))?;
        Ok(())
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for ObjectStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().exists(path).await;
        };
        match store.head(&key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(io_error("cannot look up", path, e)),
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().metadata(path).await;
        };
        let meta = store
            .head(&key)
            .await
            .map_err(|e| io_error("cannot look up", path, e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().read(path).await;
        };
        store
            .get(&key)
            .await
            .map_err(|e| io_error("cannot read", path, e))?
            .bytes()
            .await
            .map_err(|e| io_error("cannot read", path, e))
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().reader(path).await;
        };
        Ok(Box::new(ObjectRead { store, key }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().write(path, bs).await;
        };
        store
            .put(&key, bs.into())
            .await
            .map_err(|e| io_error("cannot write", path, e))?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().writer(path).await;
        };
        Ok(Box::new(ObjectWrite {
            store,
            key,
            buf: Vec::new(),
            closed: false,
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().delete(path).await;
        };
        match store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io_error("cannot delete", path, e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().delete_prefix(path).await;
        };
        let keys: Vec<Path> = store
            .list(Some(&key))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(|e| io_error("cannot list", path, e))?;
        for k in keys {
            store
                .delete(&k)
                .await
                .map_err(|e| io_error("cannot delete", k.as_ref(), e))?;
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(p) = paths.next().await {
            self.delete(&p).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// A file a listing found: its path (in the listed location's spelling),
/// size and when it was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub path: String,
    pub size: u64,
    pub modified_ms: i64,
}

/// Every file under `location` (a table's directory, or its prefix in a
/// bucket), found by walking the directory or listing the prefix. A
/// location that does not exist holds nothing.
pub async fn list(
    location: &str,
    props: &HashMap<String, String>,
) -> std::result::Result<Vec<Listed>, crate::LakeError> {
    let failed =
        |e: &dyn std::fmt::Display| crate::LakeError::Table(format!("listing {location}: {e}"));
    match place(location).map_err(|e| failed(&e))? {
        Place::Bucket { bucket, key } => {
            let store = bucket_store(&bucket, props).map_err(|e| failed(&e))?;
            // A prefix ends at a separator: lake/raw must not list lake/raw2.
            let prefix = Path::parse(format!("{}/", key.as_ref().trim_end_matches('/')))
                .map_err(|e| failed(&e))?;
            store
                .list(Some(&prefix))
                .map_ok(|m| Listed {
                    path: format!("s3://{bucket}/{}", m.location),
                    size: m.size,
                    modified_ms: m.last_modified.timestamp_millis(),
                })
                .try_collect()
                .await
                .map_err(|e| failed(&e))
        }
        Place::Local => {
            let (scheme, root) = match location.strip_prefix("file://") {
                Some(rest) => ("file://", rest),
                None => ("", location.strip_prefix("file:").unwrap_or(location)),
            };
            let mut out = Vec::new();
            let mut dirs = vec![std::path::PathBuf::from(root)];
            while let Some(dir) = dirs.pop() {
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(failed(&format!("{}: {e}", dir.display()))),
                };
                for entry in entries {
                    let entry = entry.map_err(|e| failed(&e))?;
                    let meta = entry.metadata().map_err(|e| failed(&e))?;
                    if meta.is_dir() {
                        dirs.push(entry.path());
                        continue;
                    }
                    let modified_ms = meta
                        .modified()
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                    out.push(Listed {
                        path: format!("{scheme}{}", entry.path().display()),
                        size: meta.len(),
                        modified_ms,
                    });
                }
            }
            out.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_go_to_their_bucket_or_stay_local() {
        match place("s3://lake/wh/lake/clean/metadata/v1.json") {
            Ok(Place::Bucket { bucket, key }) => {
                assert_eq!(bucket, "lake");
                assert_eq!(key.as_ref(), "wh/lake/clean/metadata/v1.json");
            }
            _ => panic!("an s3 path is in a bucket"),
        }
        assert!(matches!(place("/tmp/wh/x"), Ok(Place::Local)));
        assert!(matches!(place("file:///tmp/wh/x"), Ok(Place::Local)));
        assert!(place("s3:///x").is_err());
        let e = place("gs://b/x")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("only s3://"), "{e}");
    }
}
