//! An S3-compatible server for the object-store warehouse tests: moto's S3
//! server (PyPI `moto[server]`, installed by `scripts/setup.sh`) in a process
//! of its own. It speaks the S3 HTTP API that `object_store` and PyIceberg
//! use; it is an emulator, because no real S3 is reachable from CI.

use std::process::{Child, Command, Stdio};

pub struct S3Server {
    child: Child,
    pub endpoint: String,
}

/// The Python that has PyIceberg, boto3 and moto.
pub fn python() -> String {
    std::env::var("ORCA_TEST_PYTHON").unwrap_or_else(|_| "/var/tmp/orca-py/bin/python".into())
}

impl S3Server {
    /// Starts a server on a free port and creates `bucket` in it.
    pub fn start(bucket: &str) -> S3Server {
        let port = crate::stores::free_port();
        let child = Command::new(python())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto's S3 server (scripts/setup.sh installs it)");
        let server = S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        crate::stores::wait_port(port, "the S3 server");
        let made = server.boto(&format!("s.create_bucket(Bucket='{bucket}')"));
        assert!(made.is_empty() || made.contains("orca"), "{made}");
        server
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.endpoint
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the S3 server's endpoint ends with its port")
    }

    /// The `AWS_*` environment a client of this server needs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "orca-test".into()),
            ("AWS_SECRET_ACCESS_KEY", "orca-test-secret".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Runs Python with boto3 client `s` for this server; returns what it printed.
    pub fn boto(&self, code: &str) -> String {
        let script = format!(
            "import boto3\ns = boto3.client('s3', endpoint_url='{}', aws_access_key_id='orca-test', \
             aws_secret_access_key='orca-test-secret', region_name='us-east-1')\n{code}\n",
            self.endpoint
        );
        let out = Command::new(python())
            .args(["-c", &script])
            .output()
            .expect("run boto3");
        assert!(
            out.status.success(),
            "boto3: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Every key in a bucket under a prefix.
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        self.boto(&format!(
            "p = s.get_paginator('list_objects_v2')\n\
             for page in p.paginate(Bucket='{bucket}', Prefix='{prefix}'):\n    \
             for o in page.get('Contents', []):\n        print(o['Key'])"
        ))
        .lines()
        .map(str::to_string)
        .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
