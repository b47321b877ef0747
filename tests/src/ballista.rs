//! A real Ballista cluster for the Ballista tests: a scheduler and
//! executors, each an `orca-ballista` process (Ballista 53 from crates.io
//! with Orca's codecs) on free loopback ports, with their shuffle files in
//! the test's directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::stores::{free_port, wait_port};

pub struct BallistaCluster {
    scheduler: Child,
    executors: Vec<Option<Child>>,
    port: u16,
    dir: PathBuf,
}

impl BallistaCluster {
    /// A scheduler and `executors` executors of two task slots each, serving
    /// `org` only when given (with the warehouse its files must be under).
    pub fn start(dir: &Path, executors: usize, org: Option<(&str, &str)>) -> BallistaCluster {
        std::fs::create_dir_all(dir).expect("ballista dir");
        let port = free_port();
        let spawn = |args: &[String], log: &str| {
            let mut cmd = Command::new(crate::procs::bin("orca-ballista"));
            cmd.args(args)
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join(log)).expect("log"));
            if let Some((org, wh)) = org {
                cmd.env("ORCA_BALLISTA_ORG", org).env("ORCA_WAREHOUSE", wh);
            }
            cmd.spawn().expect("orca-ballista")
        };
        let scheduler = spawn(
            &[
                "scheduler".into(),
                "--bind".into(),
                format!("127.0.0.1:{port}"),
                "--external-host".into(),
                "127.0.0.1".into(),
                "--executor-timeout-seconds".into(),
                "8".into(),
            ],
            "scheduler.log",
        );
        wait_port(port, "the Ballista scheduler");
        let mut cluster = BallistaCluster {
            scheduler,
            executors: Vec::new(),
            port,
            dir: dir.to_path_buf(),
        };
        for i in 0..executors {
            cluster.add_executor(i, &spawn);
        }
        cluster
    }

    /// Starts executor `i` and waits for it to register. Under load the
    /// scheduler can call a new executor back before its gRPC server
    /// listens; the executor then exits (Ballista 53 gives up on a failed
    /// registration), and is started again on fresh ports, as a supervisor
    /// would restart it.
    fn add_executor(&mut self, i: usize, spawn: &dyn Fn(&[String], &str) -> Child) {
        let work = self.dir.join(format!("executor-{i}"));
        std::fs::create_dir_all(&work).expect("work dir");
        let want = self.live_executors() + 1;
        for attempt in 0..3 {
            let mut child = spawn(
                &[
                    "executor".into(),
                    "--scheduler".into(),
                    format!("127.0.0.1:{}", self.port),
                    "--port".into(),
                    free_port().to_string(),
                    "--grpc-port".into(),
                    free_port().to_string(),
                    "--slots".into(),
                    "2".into(),
                    "--heartbeat-seconds".into(),
                    "2".into(),
                    "--work-dir".into(),
                    work.to_string_lossy().to_string(),
                ],
                &format!("executor-{i}.{attempt}.log"),
            );
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(30) {
                if self.live_executors() >= want {
                    self.executors.push(Some(child));
                    return;
                }
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("executor {i} did not register: {}", self.logs());
    }

    /// `df://127.0.0.1:<port>`, what `ORCA_BALLISTA_URL` names.
    pub fn url(&self) -> String {
        format!("df://127.0.0.1:{}", self.port)
    }

    /// A GET of the scheduler's REST API.
    pub fn api(&self, path: &str) -> Value {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{}{path}", self.port)])
            .output()
            .expect("curl");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    pub fn live_executors(&self) -> usize {
        self.api("/api/executors").as_array().map_or(0, Vec::len)
    }

    /// The scheduler's jobs, as its REST API lists them.
    pub fn jobs(&self) -> Vec<Value> {
        self.api("/api/jobs")
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// SIGKILLs executor `i`, as a lost machine.
    pub fn kill_executor(&mut self, i: usize) {
        if let Some(mut c) = self.executors.get_mut(i).and_then(Option::take) {
            let _ = Command::new("kill")
                .args(["-KILL", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
    }

    /// The whole log of `scheduler` or `executor-<i>`.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// The last lines of each of the cluster's logs, for a failing
    /// assertion.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let mut names: Vec<_> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        names.sort();
        for p in names {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            out.push_str(&format!("--- {}\n", p.display()));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for BallistaCluster {
    fn drop(&mut self) {
        for c in self.executors.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.scheduler.kill();
        let _ = self.scheduler.wait();
    }
}
