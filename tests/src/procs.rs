//! Real processes for end-to-end tests: the workspace's binaries, and
//! runners that can be stopped with real signals.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;

/// The target directory this test executable was built into.
fn target_root() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // <target>/debug/deps/<test>
    exe.ancestors()
        .nth(3)
        .map(PathBuf::from)
        .expect("target directory")
}

/// The binaries are built into the target directory the tests were, with
/// the same profile: the dependencies (DataFusion most of all) are the
/// tests' own artifacts, so only the workspace's crates are compiled again
/// (those the fault-injection features change), and the quick start
/// (scripts/demo.sh) builds into the same place.
fn bin_target() -> PathBuf {
    target_root()
}

fn bin_dir() -> PathBuf {
    bin_target().join("debug")
}

/// Builds the binaries the end-to-end tests run, once per test process
/// (a no-op when they are up to date).
fn build() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        // What cargo sets for a test run (CARGO_MANIFEST_DIR, CARGO_PKG_*,
        // OUT_DIR...) would reach the build scripts of this build and differ
        // from a shell's build of the same packages (ring reruns on
        // CARGO_MANIFEST_DIR): each would undo the other's artifacts.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if (k.starts_with("CARGO_") && k != "CARGO_HOME") || k == "OUT_DIR" {
                cmd.env_remove(k);
            }
        }
        let status = cmd
            .args([
                "build",
                "-q",
                "-p",
                "orca-runner",
                "-p",
                "orca-cli",
                "-p",
                "orca-probe",
                "-p",
                "example-lake",
                "-p",
                "example-weather",
                "-p",
                "example-labels",
                "-p",
                "example-fanout",
                "-p",
                "orca-engine",
                "-p",
                "orca-ballista",
                // Not run by a test: scripts/test.sh runs the quick start
                // on these binaries.
                "-p",
                "example-onthisday",
                // The crash points tests aim at (ORCA_FAULT,
                // ORCA_ENGINE_CRASH_AFTER_HEAD): built into these binaries
                // only, never into what ships.
                "--features",
                "orca-probe/fault-injection,orca-engine/fault-injection",
            ])
            .arg("--target-dir")
            .arg(bin_target())
            .current_dir(crate::repo_root())
            .status()
            .expect("run cargo build");
        assert!(
            status.success(),
            "cargo build of the end-to-end binaries failed"
        );
    });
}

/// The path of a workspace binary (`orca-runner`, `orca`, `probe`, `lake`, `weather`, `labels`,
/// `orca-engine`).
pub fn bin(name: &str) -> PathBuf {
    build();
    let p = bin_dir().join(name);
    assert!(p.exists(), "{} was not built", p.display());
    p
}

/// A runner process, in a process group of its own so that killing the
/// group takes its children (the pipeline binaries) too, as a host crash would.
pub struct Runner {
    child: Option<Child>,
    pub name: String,
    pub log: PathBuf,
}

/// The login of the runners tests start: in `orca_runner` only, no org
/// membership (docs/security.md).
pub const RUNNER_LOGIN: &str = "orca_t_lp_runner";
/// The login a runner's children get: in `orca_attempt` only.
pub const ATTEMPT_LOGIN: &str = "orca_t_lp_attempt";

/// `url` with its user replaced by `user`.
pub fn url_as(url: &str, user: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('@') {
            Some((_, host)) => format!("{scheme}://{user}@{host}"),
            None => format!("{scheme}://{user}@{rest}"),
        },
        None => url.to_string(),
    }
}

/// The user a postgres URL logs in as.
fn url_user(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let (userinfo, _) = rest.split_once('@')?;
    Some(userinfo.split(':').next().unwrap_or(userinfo))
}

/// Makes the least-privileged logins (once per cluster; tests run at once)
/// and a runner token of `org` and `pool` named after the runner, through
/// the superuser's `url`. Returns the token.
pub fn least_privilege(url: &str, org: &str, pool: &str, name: &str) -> String {
    let (url, org, pool, name) = (
        url.to_string(),
        org.to_string(),
        pool.to_string(),
        name.to_string(),
    );
    let made = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async move {
            use sqlx::{Connection, Executor};
            let mut c = sqlx::PgConnection::connect(&url)
                .await
                .expect("connect as the superuser");
            for (login, group) in [
                (RUNNER_LOGIN, "orca_runner"),
                (ATTEMPT_LOGIN, "orca_attempt"),
            ] {
                let exists: bool =
                    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
                        .bind(login)
                        .fetch_one(&mut c)
                        .await
                        .expect("role lookup");
                if !exists {
                    // Another test may make it at the same moment.
                    let _ = c
                        .execute(format!("CREATE ROLE {login} LOGIN IN ROLE {group}").as_str())
                        .await;
                }
            }
            sqlx::query("SELECT set_config('orca.org', $1, false)")
                .bind(&org)
                .execute(&mut c)
                .await
                .expect("the runner's org");
            sqlx::query_scalar::<_, String>("SELECT orca.create_runner_token($1, $2)")
                .bind(&pool)
                .bind(format!("{name}-{}", uuid::Uuid::new_v4().simple()))
                .fetch_one(&mut c)
                .await
                .expect("a runner token")
        })
    });
    made.join().expect("least-privilege setup")
}

impl Runner {
    /// A runner as docs/security.md recommends, which is how tests run
    /// them: given the test database's (superuser's) URL, it logs in as
    /// [`RUNNER_LOGIN`] with a runner token of its org (`ORCA_ORG` in
    /// `env`, else `default`) and pool (`ORCA_POOL`, else `default`), and
    /// its children log in as [`ATTEMPT_LOGIN`]. A URL of another login,
    /// or an `env` that brings its own token, is used as it is.
    pub fn start(
        url: &str,
        name: &str,
        slots: u32,
        logs: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Runner {
        let given = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
        let own_token =
            given("ORCA_RUNNER_TOKEN").is_some() || given("ORCA_RUNNER_TOKEN_FILE").is_some();
        if own_token || url_user(url) != Some("postgres") {
            return Self::start_as(url, name, slots, logs, env);
        }
        let token = least_privilege(
            url,
            given("ORCA_ORG").unwrap_or("default"),
            given("ORCA_POOL").unwrap_or("default"),
            name,
        );
        std::fs::create_dir_all(logs).expect("logs dir");
        let file = logs.join(format!("{name}.token"));
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&file)
                .expect("the token file");
            f.write_all(token.as_bytes()).expect("write the token");
        }
        let file_s = file.to_string_lossy().into_owned();
        let attempt_url = url_as(url, ATTEMPT_LOGIN);
        let mut all: Vec<(&str, &str)> = env.to_vec();
        all.push(("ORCA_RUNNER_TOKEN_FILE", &file_s));
        if given("ORCA_ATTEMPT_DATABASE_URL").is_none() {
            all.push(("ORCA_ATTEMPT_DATABASE_URL", &attempt_url));
        }
        Self::start_as(&url_as(url, RUNNER_LOGIN), name, slots, logs, &all)
    }

    /// A runner on the superuser's login, without a token: the exception,
    /// for a test that says why it needs one.
    pub fn start_superuser(
        url: &str,
        name: &str,
        slots: u32,
        logs: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Runner {
        Self::start_as(url, name, slots, logs, env)
    }

    /// A runner on `url`'s login, with `env` as given.
    pub fn start_as(
        url: &str,
        name: &str,
        slots: u32,
        logs: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Runner {
        Self::start_under(&[], url, name, slots, logs, env)
    }

    /// A runner started through `prefix` (a command that runs the rest of
    /// its arguments, such as `unshare`), otherwise as [`Self::start_as`].
    pub fn start_under(
        prefix: &[&str],
        url: &str,
        name: &str,
        slots: u32,
        logs: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Runner {
        use std::os::unix::process::CommandExt;
        let log = logs.join(format!("{name}.out"));
        std::fs::create_dir_all(logs).expect("logs dir");
        let out = std::fs::File::create(&log).expect("runner log");
        let err = out.try_clone().expect("runner log");
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin("orca-runner"));
                c
            }
            None => Command::new(bin("orca-runner")),
        };
        cmd.args([
            "--database-url",
            url,
            "--name",
            name,
            "--slots",
            &slots.to_string(),
        ])
        .arg("--logs")
        .arg(logs)
        // The workspace's binaries are the pipelines tests register.
        .arg("--pipelines")
        .arg(bin_dir())
        .args([
            "--poll-ms",
            "200",
            "--tick-ms",
            "200",
            "--grace-seconds",
            "5",
        ])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
        // The examples read their data from this repository, not from the one
        // their binary was first built in.
        cmd.env(
            "ORCA_EXAMPLE_DATA",
            crate::repo_root().join("examples/data"),
        );
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start orca-runner");
        Runner {
            child: Some(child),
            name: name.to_string(),
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn signal_group(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([sig, "--", &format!("-{}", c.id())])
                .status();
        }
    }

    /// SIGKILL to the runner and everything it started.
    pub fn kill(&mut self) {
        self.signal_group("-KILL");
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// SIGTERM to the runner only, then waits for it to exit.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let status = c.wait().ok();
        self.child = None;
        status
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The output of each runner so far, for a failing test's message.
pub fn outputs(runners: &[&Runner]) -> String {
    runners
        .iter()
        .map(|r| format!("--- {}\n{}", r.name, r.output()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// (step, partition) -> how many times the probe pipeline's step function
/// ran, from the `calls.log` it keeps in its `PROBE_DIR`.
pub fn probe_calls(dir: &std::path::Path) -> std::collections::HashMap<(String, String), usize> {
    let mut out = std::collections::HashMap::new();
    for line in std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 2 {
            *out.entry((f[0].to_string(), f[1].to_string())).or_default() += 1;
        }
    }
    out
}

/// A finished process's exit status and output, for a failed assertion.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs the `orca` CLI against a test database.
pub fn orca(db: &crate::TestDb, args: &[&str]) -> Output {
    Command::new(bin("orca"))
        .args(args)
        .env("DATABASE_URL", db.url())
        .output()
        .expect("run orca")
}

/// Registers a workspace binary (`orca register`), which must succeed.
pub fn register(db: &crate::TestDb, binary: &str) {
    let out = orca(db, &["register", bin(binary).to_str().unwrap_or_default()]);
    assert!(
        out.status.success(),
        "orca register {binary}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits up to 90 s for a run to reach `status`, showing the runner's
/// output when it does not.
pub async fn wait_run(db: &crate::TestDb, run: i64, status: &str, runner: &Runner) {
    crate::wait_for_sql(
        db,
        &format!("run {run} to be {status}"),
        &format!("SELECT status = '{status}' FROM orca.runs WHERE id = {run}"),
        std::time::Duration::from_secs(90),
        || runner.output(),
    )
    .await
}

/// A run's attempts in order: each one's status and error.
pub async fn attempts_of(db: &crate::TestDb, run: i64) -> Vec<(String, Option<String>)> {
    sqlx::query_as("SELECT status, error FROM orca.attempts WHERE run_id = $1 ORDER BY number")
        .bind(run)
        .fetch_all(&db.pool)
        .await
        .expect("the run's attempts")
}

/// Runs `tests/py/iceberg.py` (PyIceberg, which scripts/setup.sh installs)
/// and returns what it printed, as JSON.
pub fn pyiceberg(args: &[&str]) -> serde_json::Value {
    let out = Command::new(crate::s3::python())
        .arg(crate::repo_root().join("tests/py/iceberg.py"))
        .args(args)
        .output()
        .expect("run PyIceberg (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "pyiceberg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("pyiceberg JSON")
}

/// A runner whose sync attempts run this build's orca-engine on `store`.
pub fn sync_runner(db: &crate::TestDb, store: &std::path::Path, logs: &std::path::Path) -> Runner {
    sync_runner_with(db, store, logs, &[])
}

/// The same, with more environment for the engines (such as a warehouse).
pub fn sync_runner_with(
    db: &crate::TestDb,
    store: &std::path::Path,
    logs: &std::path::Path,
    extra: &[(&str, &str)],
) -> Runner {
    let engine_bin = bin("orca-engine");
    let store_s = store.to_string_lossy().into_owned();
    let mut env = vec![
        ("ORCA_STORE", store_s.as_str()),
        ("ORCA_ENGINE", engine_bin.to_str().unwrap_or_default()),
    ];
    env.extend_from_slice(extra);
    Runner::start(&db.url(), "r1", 1, logs, &env)
}

/// A table read by [`pyiceberg`], as sorted lines of its `columns`: what
/// two tables are compared by, whatever order their files come in.
pub fn table_lines(
    db: &crate::TestDb,
    warehouse: &str,
    dataset: &str,
    columns: &[&str],
) -> Vec<String> {
    let table = pyiceberg(&["read", &db.url(), warehouse, dataset]);
    let mut out: Vec<String> = table["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            columns
                .iter()
                .map(|c| r[*c].to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    out.sort();
    out
}

/// Checks that `step` pinned `dataset` for each of `partitions` (in order)
/// and recorded the snapshot it read, as every read is.
pub async fn assert_pinned(db: &crate::TestDb, step: &str, dataset: &str, partitions: &[&str]) {
    let pinned: Vec<(String, Option<i64>)> = sqlx::query_as(
        "SELECT partition, snapshot_id FROM orca.reads
         WHERE step = $1 AND dataset = $2 ORDER BY partition",
    )
    .bind(step)
    .bind(dataset)
    .fetch_all(&db.pool)
    .await
    .expect("reads");
    assert_eq!(
        pinned.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(),
        partitions,
        "{pinned:?}"
    );
    assert!(pinned.iter().all(|(_, s)| s.is_some()), "{pinned:?}");
}

/// Starts a run of `pipeline` for `partition`, waits up to 300 s for it to
/// fail, and returns its last attempt's error.
pub async fn run_to_failure(
    db: &crate::TestDb,
    pipeline: &str,
    partition: &str,
    runner: &Runner,
) -> String {
    let run: i64 = sqlx::query_scalar("SELECT orca.run($1, $2)")
        .bind(pipeline)
        .bind(partition)
        .fetch_one(&db.pool)
        .await
        .expect("run");
    crate::wait_for_sql(
        db,
        "the run to fail",
        &format!("SELECT status = 'failed' FROM orca.runs WHERE id = {run}"),
        std::time::Duration::from_secs(300),
        || runner.output(),
    )
    .await;
    sqlx::query_scalar("SELECT error FROM orca.attempts WHERE run_id = $1 ORDER BY id DESC LIMIT 1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("the attempt's error")
}

/// The processes on this machine whose program name ends with `program`
/// and whose environment holds `entry` (`NAME=value`): how a test finds the
/// children a runner started with that entry, to send them a fault.
pub fn processes_with_env(program: &str, entry: &str) -> Vec<i32> {
    processes_where(
        |cmdline| {
            cmdline
                .split(|b| *b == 0)
                .next()
                .is_some_and(|argv0| argv0.ends_with(program.as_bytes()))
        },
        entry,
    )
}

/// The processes whose command line (NUL-separated) `named` accepts and
/// whose environment holds `entry`.
pub fn processes_where(named: impl Fn(&[u8]) -> bool, entry: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if !named(&cmdline) {
            continue;
        }
        let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|v| v == entry.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}
