//! Iceberg storage on object stores, through the `object_store` crate:
//! iceberg 0.10 itself ships only local and in-memory storage.
//!
//! A warehouse (or a sync's store) names its store by its URL:
//! - `s3://bucket/prefix` (or `s3a://`): S3 or an S3-compatible server.
//!   Credentials, region and endpoint come from the usual `AWS_*` variables
//!   (`AWS_ENDPOINT`, `AWS_ALLOW_HTTP` for an endpoint without TLS), or from
//!   the catalog's `s3.*` properties, which win.
//! - `az://container/prefix` (or `azure://`), or
//!   `abfss://container@account.dfs.core.windows.net/prefix` (also `abfs`,
//!   `wasb`, `wasbs` with `.blob.`): Azure Blob Storage. The account, key,
//!   SAS token or Azure AD identity come from the `AZURE_*` variables the
//!   Azure SDKs read (`AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`,
//!   `AZURE_CLIENT_ID`/`AZURE_TENANT_ID`/`AZURE_FEDERATED_TOKEN_FILE` for
//!   workload identity, `AZURE_STORAGE_USE_EMULATOR` for azurite), or the
//!   catalog's `adls.*` properties, which win. A URL that names an account
//!   must name the configured one: the runner's credentials reach its own
//!   account only.
//! - `gs://bucket/prefix`: Google Cloud Storage, with the service account
//!   of `GOOGLE_SERVICE_ACCOUNT` (a key file), `GOOGLE_SERVICE_ACCOUNT_KEY`
//!   (the key itself) or the application default credentials (on GKE, the
//!   workload's identity from the metadata server).
//!
//! Paths without a scheme or with `file:` stay on the local file system;
//! any other scheme is refused.

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
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
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

/// Storage that sends object-store URLs to their store and every other
/// path to the local file system.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ObjectStorage {
    props: HashMap<String, String>,
    /// One client per bucket (by its root URL), made on first use.
    #[serde(skip)]
    stores: Arc<Mutex<HashMap<String, Arc<dyn ObjectStore>>>>,
}

fn io_error(what: &str, path: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unexpected, format!("{what} {path}: {e}"))
}

/// How a store's client retries a request the store failed (a 5xx, a
/// dropped connection): from 200 ms apart up to 15 s, until 45 s have
/// passed. object_store's default (10 times from 100 ms) spends its
/// retries in a few seconds of a store's outage (its waits are drawn at
/// random and grow slowly), and so would any count: the time bounds it.
/// This rides out most of a minute before the work stops (a sync's attempt
/// is then handed back, spending no retry; a run handed back 10 times in
/// 10 minutes fails, so about 8 minutes of outage are ridden out). Not
/// longer: a sync's change stream waits while its engine does, and a
/// replication connection left silent for a minute (`wal_sender_timeout`)
/// is dropped by its server.
fn patience() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 1000,
        retry_timeout: std::time::Duration::from_secs(45),
        backoff: object_store::BackoffConfig {
            init_backoff: std::time::Duration::from_millis(200),
            max_backoff: std::time::Duration::from_secs(15),
            base: 2.0,
        },
    }
}

/// Whether an error, or one it was caused by, is a file system's "no space
/// left on the device" (or "disk quota exceeded").
pub fn disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            )
        }) {
            return true;
        }
        next = err.source();
    }
    false
}

/// A store's error, kept as the source (so that [`crate::LakeError::unavailable`]
/// can tell an outage). Not marked retryable: iceberg's commit would try
/// its whole transaction again on top of the client's own retries.
fn os_error(what: &str, path: &str, e: object_store::Error) -> Error {
    Error::new(ErrorKind::Unexpected, format!("{what} {path}")).with_source(e)
}

/// Whether an object store's error says that the store did not answer,
/// after its client's own retries: a connection refused, dropped or timed
/// out, or a status a server sends when it is failing or overloaded (5xx,
/// 429, 408); or that a local store's disk is full. Such a failure is the
/// store's, not the work's: the work may be tried again as it was. A
/// refusal (403, 404, a failed precondition) is not one.
pub fn unavailable(e: &object_store::Error) -> bool {
    if disk_full(e) {
        return true;
    }
    let object_store::Error::Generic { source, .. } = e else {
        return false;
    };
    // The client's transport errors carry the HTTP client's error: a
    // connection refused, dropped or timed out is the store's; a request
    // that could not be built, or an answer that could not be read as one,
    // is not.
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(err) = next {
        if let Some(r) = err.downcast_ref::<reqwest::Error>() {
            return r.is_timeout() || r.is_connect() || r.is_request() || r.is_body();
        }
        next = err.source();
    }
    // A status the client gave up on is named only in its text: the
    // error's type is private to object_store. 501 (a store without a
    // feature) and the other 5xx that no retry mends are not outages.
    let text = e.to_string();
    [
        "status code: 500",
        "status code: 502",
        "status code: 503",
        "status code: 504",
        "status code: 429",
        "status code: 408",
    ]
    .iter()
    .any(|s| text.contains(s))
}

/// The object stores a URL can name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cloud {
    S3,
    /// Azure Blob Storage, and the storage account the URL names, if it
    /// names one (else the configured account).
    Azure {
        account: Option<String>,
    },
    Gcs,
}

/// Where a URL lives: a bucket and a key in it, or the local file system.
/// The one reading of store URLs: the Iceberg storage below, the engine's
/// store and netguard all use it.
pub enum Place {
    Bucket {
        cloud: Cloud,
        /// The bucket, or Azure's container.
        bucket: String,
        key: Path,
        /// The URL up to the key (`s3://bucket/`): a listed key is this
        /// plus the key.
        root: String,
    },
    Local,
}

const SCHEMES: &str = "s3://, az:// (abfss://, wasbs://), gs:// and local paths";

/// Reads a store URL: `s3://`/`s3a://`, `az://`/`azure://`/`abfs[s]://`/
/// `wasb[s]://` and `gs://` name a bucket; a path or `file://` is local;
/// any other scheme is refused.
pub fn place(path: &str) -> Result<Place> {
    let Some((scheme, rest)) = path.split_once("://") else {
        return Ok(Place::Local);
    };
    let cloud_of = |authority: &str| -> Result<(Cloud, String)> {
        match scheme {
            "s3" | "s3a" => Ok((Cloud::S3, authority.to_string())),
            "gs" => Ok((Cloud::Gcs, authority.to_string())),
            "az" | "azure" | "abfs" | "abfss" | "wasb" | "wasbs" => {
                let Some((container, host)) = authority.split_once('@') else {
                    return Ok((Cloud::Azure { account: None }, authority.to_string()));
                };
                let account = [".dfs.core.windows.net", ".blob.core.windows.net"]
                    .iter()
                    .find_map(|suffix| host.strip_suffix(suffix))
                    .filter(|a| {
                        !a.is_empty() && a.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                    })
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::DataInvalid,
                            format!(
                                "{path}: an Azure URL names its account as \
                                 <container>@<account>.dfs.core.windows.net (or .blob.), not {host:?}"
                            ),
                        )
                    })?;
                Ok((
                    Cloud::Azure {
                        account: Some(account.to_string()),
                    },
                    container.to_string(),
                ))
            }
            _ => Err(Error::new(
                ErrorKind::FeatureUnsupported,
                format!("{path}: the stores Orca reads and writes are {SCHEMES}"),
            )),
        }
    };
    if scheme == "file" {
        return Ok(Place::Local);
    }
    let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
    let (cloud, bucket) = cloud_of(authority)?;
    if bucket.is_empty() {
        return Err(Error::new(
            ErrorKind::DataInvalid,
            format!("{path} names no bucket"),
        ));
    }
    Ok(Place::Bucket {
        cloud,
        bucket,
        key: Path::parse(key).map_err(|e| io_error("bad object path", path, e))?,
        root: format!("{scheme}://{authority}/"),
    })
}
impl ObjectStorage {
    fn store(&self, cloud: &Cloud, bucket: &str, root: &str) -> Result<Arc<dyn ObjectStore>> {
        let mut stores = self
            .stores
            .lock()
            .map_err(|_| Error::new(ErrorKind::Unexpected, "object store cache poisoned"))?;
        if let Some(s) = stores.get(root) {
            return Ok(s.clone());
        }
        let store = bucket_store(cloud, bucket, &self.props)?;
        stores.insert(root.to_string(), store.clone());
        Ok(store)
    }

    fn resolve(&self, path: &str) -> Result<Option<(Arc<dyn ObjectStore>, Path)>> {
        match place(path)? {
            Place::Local => Ok(None),
            Place::Bucket {
                cloud,
                bucket,
                key,
                root,
            } => Ok(Some((self.store(&cloud, &bucket, &root)?, key))),
        }
    }
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// Whether `AZURE_STORAGE_USE_EMULATOR` asks for azurite.
pub fn azure_emulator() -> bool {
    env("AZURE_STORAGE_USE_EMULATOR").is_some_and(|v| matches!(v.as_str(), "true" | "1"))
}

/// The Azure storage account the runner's credentials are for: the
/// `adls.account-name` property, else `AZURE_STORAGE_ACCOUNT_NAME`, else
/// azurite's account when the emulator is asked for.
pub fn azure_account(props: &HashMap<String, String>) -> Option<String> {
    props
        .get("adls.account-name")
        .filter(|v| !v.is_empty())
        .cloned()
        .or_else(|| env("AZURE_STORAGE_ACCOUNT_NAME"))
        .or_else(|| azure_emulator().then(|| "devstoreaccount1".to_string()))
}

/// The account a URL's Azure place is in: the one it names, which must be
/// the configured one when one is configured, else the configured one.
pub fn azure_account_of(named: Option<&str>, props: &HashMap<String, String>) -> Result<String> {
    match (named, azure_account(props)) {
        (Some(n), Some(c)) if n != c => Err(Error::new(
            ErrorKind::DataInvalid,
            format!(
                "the URL names storage account {n:?}, but this runner's Azure credentials are \
                 for {c:?} (AZURE_STORAGE_ACCOUNT_NAME): it reaches no other account"
            ),
        )),
        (Some(n), _) => Ok(n.to_string()),
        (None, Some(c)) => Ok(c),
        (None, None) => Err(Error::new(
            ErrorKind::DataInvalid,
            "an az:// URL needs the storage account: set AZURE_STORAGE_ACCOUNT_NAME, or name it \
             as abfss://<container>@<account>.dfs.core.windows.net/",
        )),
    }
}

/// A bucket's client. S3 (or S3-compatible): credentials, region and
/// endpoint from the usual `AWS_*` variables, or from `s3.*` properties,
/// which win. Azure: the `AZURE_*` variables, or `adls.*` properties.
/// GCS: the `GOOGLE_*` variables.
pub fn bucket_store(
    cloud: &Cloud,
    bucket: &str,
    props: &HashMap<String, String>,
) -> Result<Arc<dyn ObjectStore>> {
    let prop = |k: &str| props.get(k).filter(|v| !v.is_empty());
    let failed = |e: object_store::Error| io_error("cannot open bucket", bucket, e);
    match cloud {
        Cloud::S3 => {
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(patience());
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
            Ok(Arc::new(b.build().map_err(failed)?))
        }
        Cloud::Azure { account } => {
            let account = azure_account_of(account.as_deref(), props)?;
            let mut b = MicrosoftAzureBuilder::from_env()
                .with_retry(patience())
                .with_container_name(bucket)
                .with_account(account);
            if let Some(v) = prop("adls.account-key") {
                b = b.with_access_key(v);
            }
            if let Some(v) = prop("adls.sas-token") {
                b = b.with_config(
                    object_store::azure::AzureConfigKey::SasKey,
                    v.trim_start_matches('?'),
                );
            }
            for (p, key) in [
                (
                    "adls.tenant-id",
                    object_store::azure::AzureConfigKey::AuthorityId,
                ),
                (
                    "adls.client-id",
                    object_store::azure::AzureConfigKey::ClientId,
                ),
                (
                    "adls.client-secret",
                    object_store::azure::AzureConfigKey::ClientSecret,
                ),
            ] {
                if let Some(v) = prop(p) {
                    b = b.with_config(key, v);
                }
            }
            Ok(Arc::new(b.build().map_err(failed)?))
        }
        Cloud::Gcs => Ok(Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_retry(patience())
                .with_bucket_name(bucket)
                .build()
                .map_err(failed)?,
        )),
    }
}

/// Where GCS requests go when not to Google: the `gcs_base_url` of the
/// configured service account key (an emulator's).
pub fn gcs_endpoint() -> Option<String> {
    let key = env("GOOGLE_SERVICE_ACCOUNT_KEY").or_else(|| {
        ["GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH"]
            .iter()
            .find_map(|k| env(k))
            .and_then(|path| std::fs::read_to_string(path).ok())
    });
    key.and_then(|k| serde_json::from_str::<serde_json::Value>(&k).ok())
        .and_then(|v| v["gcs_base_url"].as_str().map(str::to_string))
}

/// Where Azure Blob Storage requests go when not to Azure's
/// `<account>.blob.core.windows.net`: azurite's URL with the emulator, or a
/// configured endpoint.
pub fn azure_endpoint() -> Option<String> {
    if azure_emulator() {
        return Some(
            env("AZURITE_BLOB_STORAGE_URL").unwrap_or_else(|| "http://127.0.0.1:10000".into()),
        );
    }
    env("AZURE_STORAGE_ENDPOINT").or_else(|| env("AZURE_ENDPOINT"))
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
            .map_err(|e| os_error("cannot read", self.key.as_ref(), e))
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
            .map_err(|e| os_error("cannot write", self.key.as_ref(), e))?;
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
            Err(e) => Err(os_error("cannot look up", path, e)),
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().metadata(path).await;
        };
        let meta = store
            .head(&key)
            .await
            .map_err(|e| os_error("cannot look up", path, e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        let Some((store, key)) = self.resolve(path)? else {
            return LocalFsStorage::new().read(path).await;
        };
        store
            .get(&key)
            .await
            .map_err(|e| os_error("cannot read", path, e))?
            .bytes()
            .await
            .map_err(|e| os_error("cannot read", path, e))
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
            .map_err(|e| os_error("cannot write", path, e))?;
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
            Err(e) => Err(os_error("cannot delete", path, e)),
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
            .map_err(|e| os_error("cannot list", path, e))?;
        for k in keys {
            store
                .delete(&k)
                .await
                .map_err(|e| os_error("cannot delete", k.as_ref(), e))?;
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
        Place::Bucket {
            cloud,
            bucket,
            key,
            root,
        } => {
            let store = bucket_store(&cloud, &bucket, props).map_err(|e| failed(&e))?;
            // A prefix ends at a separator: lake/raw must not list lake/raw2.
            let prefix = Path::parse(format!("{}/", key.as_ref().trim_end_matches('/')))
                .map_err(|e| failed(&e))?;
            store
                .list(Some(&prefix))
                .map_ok(|m| Listed {
                    path: format!("{root}{}", m.location),
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

    fn bucket(url: &str) -> (Cloud, String, String, String) {
        match place(url) {
            Ok(Place::Bucket {
                cloud,
                bucket,
                key,
                root,
            }) => (cloud, bucket, key.as_ref().to_string(), root),
            Ok(Place::Local) => panic!("{url} is not local"),
            Err(e) => panic!("{url}: {e}"),
        }
    }

    #[tokio::test]
    async fn a_store_that_refuses_connections_is_unavailable_and_a_missing_object_is_not() {
        // A loopback port nothing listens on: every connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let store = AmazonS3Builder::new()
            .with_bucket_name("b")
            .with_region("us-east-1")
            .with_access_key_id("k")
            .with_secret_access_key("s")
            .with_endpoint(format!("http://127.0.0.1:{port}"))
            .with_allow_http(true)
            .with_retry(object_store::RetryConfig {
                max_retries: 1,
                retry_timeout: std::time::Duration::from_secs(5),
                backoff: Default::default(),
            })
            .build()
            .expect("an S3 client");
        let Err(e) = store.get(&Path::from("k")).await else {
            panic!("nothing listens, yet a read succeeded");
        };
        assert!(unavailable(&e), "{e}");
        let missing = object_store::Error::NotFound {
            path: "k".into(),
            source: "no such key".into(),
        };
        assert!(!unavailable(&missing));
        let refused = object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 403 Forbidden".into(),
        };
        assert!(!unavailable(&refused));
        let failing = object_store::Error::Generic {
            store: "S3",
            source: "Error performing PUT k - Server returned non-2xx status code: 503 Slow Down"
                .into(),
        };
        assert!(unavailable(&failing));
        let lacking = object_store::Error::Generic {
            store: "S3",
            source: "Server returned non-2xx status code: 501 Not Implemented".into(),
        };
        assert!(!unavailable(&lacking), "a missing feature is no outage");
        // Through an Iceberg error, as the warehouse's storage reports it.
        let lake = crate::LakeError::Iceberg {
            what: "commit".into(),
            source: Box::new(os_error("cannot write", "k", e)),
        };
        assert!(lake.unavailable(), "{lake}");
        let full = object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(std::io::Error::from(std::io::ErrorKind::StorageFull)),
        };
        assert!(disk_full(&full) && unavailable(&full));
    }

    #[test]
    fn paths_go_to_their_bucket_or_stay_local() {
        assert_eq!(
            bucket("s3://lake/wh/lake/clean/metadata/v1.json"),
            (
                Cloud::S3,
                "lake".into(),
                "wh/lake/clean/metadata/v1.json".into(),
                "s3://lake/".into()
            )
        );
        assert_eq!(
            bucket("gs://lake/wh/x").0,
            Cloud::Gcs,
            "gs:// is Google Cloud Storage"
        );
        assert_eq!(
            bucket("az://lake/wh/x"),
            (
                Cloud::Azure { account: None },
                "lake".into(),
                "wh/x".into(),
                "az://lake/".into()
            )
        );
        assert_eq!(
            bucket("abfss://lake@acme1.dfs.core.windows.net/wh/x"),
            (
                Cloud::Azure {
                    account: Some("acme1".into())
                },
                "lake".into(),
                "wh/x".into(),
                "abfss://lake@acme1.dfs.core.windows.net/".into()
            )
        );
        assert!(matches!(place("/tmp/wh/x"), Ok(Place::Local)));
        assert!(matches!(place("file:///tmp/wh/x"), Ok(Place::Local)));
        for bad in [
            "s3:///x",
            "az:///x",
            "abfss://lake@evil.example.com/x",
            "abfss://lake@.dfs.core.windows.net/x",
            "abfss://lake@a.b.dfs.core.windows.net/x",
        ] {
            assert!(place(bad).is_err(), "{bad}");
        }
        let e = place("hdfs://b/x")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("hdfs://b/x") && e.contains("az://"), "{e}");
    }

    #[test]
    fn every_scheme_netguard_knows_names_a_bucket_here() {
        for scheme in orca_core::netguard::OBJECT_STORE_SCHEMES {
            let url = format!("{scheme}://b/k");
            assert!(matches!(place(&url), Ok(Place::Bucket { .. })), "{url}");
        }
    }

    #[test]
    fn an_azure_url_reaches_the_configured_account_only() {
        let props: HashMap<String, String> =
            [("adls.account-name".to_string(), "acme1".to_string())].into();
        assert_eq!(
            azure_account_of(Some("acme1"), &props).ok(),
            Some("acme1".into())
        );
        assert_eq!(azure_account_of(None, &props).ok(), Some("acme1".into()));
        let e = azure_account_of(Some("globex"), &props)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("\"globex\"") && e.contains("\"acme1\""), "{e}");
    }
}
