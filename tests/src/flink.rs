//! A real Flink session cluster for the Flink test: a JobManager and a
//! TaskManager (2 slots) from the jars PyPI's `apache-flink-libraries`
//! ships (`scripts/setup.sh --tests` installs it into a virtualenv of its
//! own), on Debian's Java 17, each a process of its own on free loopback
//! ports. The wheel has no start scripts, so this starts the two entry
//! points the scripts would, with the JVM settings they would compute.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The virtualenv `scripts/setup.sh --tests` installs Flink's jars into.
fn venv() -> PathBuf {
    std::env::var("ORCA_TEST_FLINK_PYTHON")
        .map(|p| {
            PathBuf::from(p)
                .parent()
                .and_then(Path::parent)
                .map(Path::to_path_buf)
                .unwrap_or_default()
        })
        .unwrap_or_else(|_| PathBuf::from("/var/tmp/orca-flink"))
}

/// Flink's home: the pyflink package's directory (its `lib/` and `bin/`).
pub fn home() -> Option<PathBuf> {
    let lib = venv().join("lib");
    let home = std::fs::read_dir(&lib)
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages/pyflink"))
        .find(|p| p.join("bin/bash-java-utils.jar").exists())?;
    let dist = std::fs::read_dir(home.join("lib"))
        .ok()?
        .flatten()
        .any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("flink-dist-"))
        });
    dist.then_some(home)
}

/// Why the Flink tier cannot run here, said loudly; None when it can.
pub fn unavailable() -> Option<String> {
    if home().is_none() {
        return Some(format!(
            "SKIPPED: no apache-flink-libraries in {} (scripts/setup.sh --tests installs it)",
            venv().display()
        ));
    }
    for tool in ["java", "javac", "jar"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!(
                "SKIPPED: no {tool} on PATH (Debian's openjdk-17-jdk-headless)"
            ));
        }
    }
    None
}

/// The JVM options Flink's default configuration gives every process
/// (`env.java.opts.all`): what its code needs opened on Java 17.
const JAVA_OPTS: &[&str] = &[
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.text=ALL-UNNAMED",
    "--add-opens=java.base/java.time=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED",
];

/// Builds the test's job (tests/flink/OrcaNumbers.java) into a jar in `dir`.
pub fn build_job(dir: &Path) -> PathBuf {
    let home = home().expect("Flink's jars (scripts/setup.sh --tests)");
    let classes = dir.join("classes");
    std::fs::create_dir_all(&classes).expect("classes dir");
    let src = crate::repo_root().join("tests/flink/OrcaNumbers.java");
    let out = Command::new("javac")
        .arg("-cp")
        .arg(format!("{}/lib/*", home.display()))
        .arg("-d")
        .arg(&classes)
        .arg(&src)
        .output()
        .expect("javac");
    assert!(
        out.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jar = dir.join("orca-numbers.jar");
    let out = Command::new("jar")
        .arg("cfe")
        .arg(&jar)
        .arg("OrcaNumbers")
        .arg("-C")
        .arg(&classes)
        .arg(".")
        .output()
        .expect("jar");
    assert!(
        out.status.success(),
        "jar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    jar
}

pub struct FlinkCluster {
    jobmanager: Child,
    taskmanager: Child,
    /// The REST API: `http://127.0.0.1:<port>`.
    pub rest: String,
    /// Where the cluster's logs go.
    pub dir: PathBuf,
}

fn get(url: &str) -> Value {
    Command::new("curl")
        .args(["-sf", "--max-time", "10", url])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or(Value::Null)
}

impl FlinkCluster {
    /// Starts a JobManager and one TaskManager and waits for the
    /// TaskManager to register.
    pub fn start(dir: &Path) -> FlinkCluster {
        let home = home().expect("Flink's jars (scripts/setup.sh --tests)");
        let conf = dir.join("conf");
        std::fs::create_dir_all(&conf).expect("conf dir");
        let port = |_: ()| crate::stores::free_port();
        let (rpc, rest, blob, tm_rpc, tm_data) = (port(()), port(()), port(()), port(()), port(()));
        let config = format!(
            "jobmanager.rpc.address: 127.0.0.1\n\
             jobmanager.rpc.port: {rpc}\n\
             jobmanager.bind-host: 127.0.0.1\n\
             jobmanager.memory.process.size: 1024m\n\
             taskmanager.bind-host: 127.0.0.1\n\
             taskmanager.host: 127.0.0.1\n\
             taskmanager.rpc.port: {tm_rpc}\n\
             taskmanager.data.port: {tm_data}\n\
             taskmanager.memory.process.size: 1024m\n\
             taskmanager.numberOfTaskSlots: 2\n\
             blob.server.port: {blob}\n\
             rest.address: 127.0.0.1\n\
             rest.bind-address: 127.0.0.1\n\
             rest.port: {rest}\n\
             web.tmpdir: {tmp}\n\
             io.tmp.dirs: {tmp}\n",
            tmp = dir.join("tmp").display(),
        );
        std::fs::create_dir_all(dir.join("tmp")).expect("tmp dir");
        std::fs::write(conf.join("config.yaml"), config).expect("config.yaml");
        let classpath = format!("{}/lib/*", home.display());
        let log = |name: &str| std::fs::File::create(dir.join(name)).expect("log");
        let jobmanager = Command::new("java")
            .args(JAVA_OPTS)
            .args(["-Xmx512m", "-Xms512m", "-cp", &classpath])
            .arg("org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint")
            .arg("--configDir")
            .arg(&conf)
            .stdout(log("jobmanager.out"))
            .stderr(log("jobmanager.err"))
            .spawn()
            .expect("java (JobManager)");
        // The TaskManager's memory settings, as Flink's scripts compute them.
        let params = Command::new("java")
            .arg("-cp")
            .arg(format!(
                "{classpath}:{}/bin/bash-java-utils.jar",
                home.display()
            ))
            .arg("org.apache.flink.runtime.util.bash.BashJavaUtils")
            .arg("GET_TM_RESOURCE_PARAMS")
            .arg("--configDir")
            .arg(&conf)
            .output()
            .expect("BashJavaUtils");
        let text = String::from_utf8_lossy(&params.stdout);
        let lines: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("BASH_JAVA_UTILS_EXEC_RESULT:"))
            .collect();
        assert!(
            lines.len() >= 2,
            "BashJavaUtils: {text}\n{}",
            String::from_utf8_lossy(&params.stderr)
        );
        let taskmanager = Command::new("java")
            .args(JAVA_OPTS)
            .args(lines[0].split_whitespace())
            .args(["-cp", &classpath])
            .arg("org.apache.flink.runtime.taskexecutor.TaskManagerRunner")
            .arg("--configDir")
            .arg(&conf)
            .args(lines[1].split_whitespace())
            .stdout(log("taskmanager.out"))
            .stderr(log("taskmanager.err"))
            .spawn()
            .expect("java (TaskManager)");
        let cluster = FlinkCluster {
            jobmanager,
            taskmanager,
            rest: format!("http://127.0.0.1:{rest}"),
            dir: dir.to_path_buf(),
        };
        let t0 = Instant::now();
        while cluster.overview()["slots-available"].as_i64().unwrap_or(0) < 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "the Flink TaskManager did not register: {}",
                cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        cluster
    }

    /// `/overview`: version, TaskManagers, slots, jobs by state.
    pub fn overview(&self) -> Value {
        get(&format!("{}/overview", self.rest))
    }

    /// Every job the cluster knows: (id, name, state), oldest first.
    pub fn jobs(&self) -> Vec<(String, String, String)> {
        let v = get(&format!("{}/jobs/overview", self.rest));
        let mut jobs: Vec<(i64, String, String, String)> = v["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|j| {
                (
                    j["start-time"].as_i64().unwrap_or(0),
                    j["jid"].as_str().unwrap_or("").to_string(),
                    j["name"].as_str().unwrap_or("").to_string(),
                    j["state"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        jobs.sort();
        jobs.into_iter().map(|(_, id, n, s)| (id, n, s)).collect()
    }

    /// The ids of the jobs running now.
    pub fn running(&self) -> Vec<String> {
        self.jobs()
            .into_iter()
            .filter(|(_, _, s)| s == "RUNNING" || s == "CREATED" || s == "INITIALIZING")
            .map(|(id, _, _)| id)
            .collect()
    }

    /// A job's checkpoint statistics (`/jobs/{id}/checkpoints`).
    pub fn checkpoints(&self, job: &str) -> Value {
        get(&format!("{}/jobs/{job}/checkpoints", self.rest))
    }

    /// The ends of the cluster's logs, for a failure's message.
    pub fn logs(&self) -> String {
        [
            "jobmanager.err",
            "taskmanager.err",
            "jobmanager.out",
            "taskmanager.out",
        ]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            format!(
                "--- {f}\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
    }
}

impl Drop for FlinkCluster {
    fn drop(&mut self) {
        for c in [&mut self.taskmanager, &mut self.jobmanager] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
