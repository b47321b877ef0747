//! A real Spark standalone cluster for the Spark test: a master and a
//! worker from the jars PyPI's `pyspark` ships (`scripts/setup.sh --tests`
//! installs it into a virtualenv of its own), on Debian's Java 17, each a
//! process of its own on free loopback ports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The Python that has pyspark (and runs the applications' drivers and
/// workers).
pub fn python() -> String {
    std::env::var("ORCA_TEST_SPARK_PYTHON")
        .unwrap_or_else(|_| "/var/tmp/orca-spark/bin/python".into())
}

/// Spark's home: the pyspark package's directory (its `bin/` and `jars/`).
pub fn home() -> Option<PathBuf> {
    let out = Command::new(python())
        .args([
            "-c",
            "import os, pyspark; print(os.path.dirname(pyspark.__file__))",
        ])
        .output()
        .ok()?;
    let home = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && home.join("bin/spark-submit").exists()).then_some(home)
}

/// Why the Spark tier cannot run here, said loudly; None when it can.
pub fn unavailable() -> Option<String> {
    if home().is_none() {
        return Some(format!(
            "SKIPPED: no pyspark in {} (scripts/setup.sh --tests installs it)",
            python()
        ));
    }
    if Command::new("java").arg("-version").output().is_err() {
        return Some("SKIPPED: no java on PATH (Debian's openjdk-17)".into());
    }
    None
}

pub struct SparkCluster {
    master: Child,
    worker: Child,
    /// `spark://127.0.0.1:<port>`.
    pub url: String,
    /// The master's web UI, whose `/json/` says what runs.
    pub ui: String,
    pub home: PathBuf,
}

fn free_port() -> u16 {
    crate::stores::free_port()
}

impl SparkCluster {
    /// Starts a master and one worker (2 cores, 1 GiB) and waits for the
    /// worker to register.
    pub fn start(dir: &Path) -> SparkCluster {
        let home = home().expect("pyspark (scripts/setup.sh --tests)");
        std::fs::create_dir_all(dir.join("work")).expect("spark dir");
        let (port, ui_port, worker_ui) = (free_port(), free_port(), free_port());
        let class = |args: &[&str], log: &str| {
            Command::new(home.join("bin/spark-class"))
                .args(args)
                .env("SPARK_HOME", &home)
                .env("SPARK_LOCAL_IP", "127.0.0.1")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join(log)).expect("log"))
                .spawn()
                .expect("spark-class")
        };
        let master = class(
            &[
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--webui-port",
                &ui_port.to_string(),
            ],
            "master.log",
        );
        let url = format!("spark://127.0.0.1:{port}");
        crate::stores::wait_port(ui_port, "the Spark master");
        let worker = class(
            &[
                "org.apache.spark.deploy.worker.Worker",
                &url,
                "--cores",
                "2",
                "--memory",
                "1g",
                "--webui-port",
                &worker_ui.to_string(),
                "--work-dir",
                &dir.join("work").to_string_lossy(),
            ],
            "worker.log",
        );
        let cluster = SparkCluster {
            master,
            worker,
            url,
            ui: format!("http://127.0.0.1:{ui_port}"),
            home,
        };
        let t0 = Instant::now();
        while cluster.state()["aliveworkers"].as_i64() != Some(1) {
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "the Spark worker did not register: {}",
                std::fs::read_to_string(dir.join("worker.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        cluster
    }

    /// The master's state: workers, active and completed applications.
    pub fn state(&self) -> Value {
        let out = Command::new("curl")
            .args(["-sf", &format!("{}/json/", self.ui)])
            .output();
        out.ok()
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or(Value::Null)
    }

    /// The names of the applications running now.
    pub fn active(&self) -> Vec<String> {
        self.state()["activeapps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["name"].as_str().map(str::to_string))
            .collect()
    }

    /// What a runner needs to submit applications here.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ORCA_SPARK_MASTER", self.url.clone()),
            ("SPARK_HOME", self.home.to_string_lossy().to_string()),
            ("SPARK_LOCAL_IP", "127.0.0.1".into()),
            ("PYSPARK_PYTHON", python()),
        ]
    }
}

impl Drop for SparkCluster {
    fn drop(&mut self) {
        for c in [&mut self.worker, &mut self.master] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
