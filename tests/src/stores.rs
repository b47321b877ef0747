//! The object stores the store and warehouse tests run against, one trait
//! over each: moto's S3 server ([`crate::s3::S3Server`]) and azurite (npm,
//! an Azure Blob Storage server). Each is an emulator of its cloud's HTTP
//! API, because no cloud is reachable from CI; each is read back by another
//! client than Orca's (boto3, azure-storage-blob). GCS has none here that
//! speaks the XML API the `object_store` client uses (docs/deploy.md).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::s3::{python, S3Server};

/// An object store server with one bucket (or container) made.
pub trait ObjectServer {
    /// The URL scheme Orca names this store's places with (`s3`, `az`).
    fn scheme(&self) -> &'static str;
    /// The environment an Orca process needs to reach it.
    fn env(&self) -> Vec<(&'static str, String)>;
    /// Every key under a prefix of a bucket, read by another client.
    fn keys(&self, bucket: &str, prefix: &str) -> Vec<String>;
    /// Copies an object to a local file, by another client.
    fn download(&self, bucket: &str, key: &str, to: &Path);
    /// Writes an object, by another client.
    fn put(&self, bucket: &str, key: &str, data: &[u8]);
    /// `<scheme>://<bucket>/<key>`.
    fn url(&self, bucket: &str, key: &str) -> String {
        format!("{}://{bucket}/{key}", self.scheme())
    }
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Waits up to 30 s for something to listen on a loopback port.
pub fn wait_port(port: u16, what: &str) {
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{what} did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs Python code; returns what it printed.
fn py(code: &str) -> String {
    let out = Command::new(python())
        .args(["-c", code])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

impl ObjectServer for S3Server {
    fn scheme(&self) -> &'static str {
        "s3"
    }
    fn env(&self) -> Vec<(&'static str, String)> {
        S3Server::env(self)
    }
    fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        S3Server::keys(self, bucket, prefix)
    }
    fn download(&self, bucket: &str, key: &str, to: &Path) {
        self.boto(&format!(
            "s.download_file('{bucket}', '{key}', '{}')",
            to.display()
        ));
    }
    fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        self.boto(&format!(
            "s.put_object(Bucket='{bucket}', Key='{key}', Body=bytes.fromhex('{}'))",
            hex(data)
        ));
    }
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// azurite's account and key: the well-known ones of Azure's emulators.
const AZURITE_ACCOUNT: &str = "devstoreaccount1";
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// azurite's Blob service in a process of its own, its data in a scratch
/// directory.
pub struct Azurite {
    child: Child,
    dir: std::path::PathBuf,
    pub endpoint: String,
}

/// Where `scripts/setup.sh --tests` installed azurite.
pub fn azurite_bin() -> String {
    std::env::var("ORCA_TEST_AZURITE")
        .unwrap_or_else(|_| "/var/tmp/orca-azurite/node_modules/.bin/azurite-blob".into())
}

impl Azurite {
    /// Starts azurite on a free port and creates `container` in it.
    pub fn start(container: &str) -> Azurite {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("orca-azurite-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("azurite dir");
        let child = Command::new(azurite_bin())
            .args([
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--location",
                &dir.to_string_lossy(),
                "--silent",
                "--skipApiVersionCheck",
                "--loose",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start azurite (scripts/setup.sh --tests installs it)");
        let server = Azurite {
            child,
            dir,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        wait_port(port, "azurite");
        server.blob(&format!("s.create_container('{container}')"));
        server
    }

    /// Runs Python with azure-storage-blob's client `s` for this server.
    pub fn blob(&self, code: &str) -> String {
        py(&format!(
            "from azure.storage.blob import BlobServiceClient\n\
             s = BlobServiceClient.from_connection_string('DefaultEndpointsProtocol=http;\
             AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};\
             BlobEndpoint={}/{AZURITE_ACCOUNT};')\n{code}\n",
            self.endpoint
        ))
    }
}

impl ObjectServer for Azurite {
    fn scheme(&self) -> &'static str {
        "az"
    }
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
            ("AZURITE_BLOB_STORAGE_URL", self.endpoint.clone()),
        ]
    }
    fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        self.blob(&format!(
            "for b in s.get_container_client('{bucket}').list_blobs(name_starts_with='{prefix}'):\n    \
             print(b.name)"
        ))
        .lines()
        .map(str::to_string)
        .collect()
    }
    fn download(&self, bucket: &str, key: &str, to: &Path) {
        self.blob(&format!(
            "open('{}', 'wb').write(s.get_blob_client('{bucket}', '{key}').download_blob().readall())",
            to.display()
        ));
    }
    fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        self.blob(&format!(
            "s.get_blob_client('{bucket}', '{key}').upload_blob(bytes.fromhex('{}'))",
            hex(data)
        ));
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
