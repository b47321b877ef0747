//! The Debian packages (scripts/package.sh), installed with dpkg into this
//! machine as an operator installs them (docs/deploy.md): the extension's
//! under a clean private cluster, the binaries' runner started as its
//! systemd unit says, a pipeline run through it; then the packages removed
//! and purged, and the data still there.
//!
//! systemd is not PID 1 on this machine, so the test stands in for it: it
//! reads the unit's `User`, `EnvironmentFile`, `WorkingDirectory` and
//! `ExecStart` and starts the runner that way (`setpriv` to the unit's user,
//! the environment only the unit gives). `systemd-analyze verify` checks the
//! units themselves.
//!
//! It needs root (dpkg). The packages put the extension over the one
//! scripts/setup.sh installed: those files are put back afterwards, and what
//! the packages created on the machine (the orca user, /etc/orca, /opt/orca,
//! /var/lib/orca, /var/log/orca) is removed when it was not there before.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use orca_tests::cluster::{is_root, PrivateCluster};
use orca_tests::oci::have;
use orca_tests::procs::{bin, text};
use orca_tests::sqlx::{self, Connection, Executor, PgConnection};
use orca_tests::{repo_root, scratch};

const PACKAGES: [&str; 2] = ["orca", "postgresql-15-orca"];
/// What the packages create beside their files, removed afterwards when the
/// machine did not have it.
const CREATED: [&str; 4] = ["/etc/orca", "/opt/orca", "/var/lib/orca", "/var/log/orca"];

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", text(&out));
    out
}

/// The machine as the test found it: the files the packages overwrite,
/// copied aside, and whether the user and directories they create existed.
struct Machine {
    saved: PathBuf,
    files: Vec<PathBuf>,
    had_user: bool,
    had: Vec<&'static str>,
}

impl Machine {
    fn take(debs: &[PathBuf], saved: PathBuf) -> Machine {
        let mut files = Vec::new();
        for deb in debs {
            // `dpkg-deb -c` lists as `tar -tv` does, the path last.
            let out = run(Command::new("dpkg-deb").arg("-c").arg(deb));
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let Some(path) = line.split_whitespace().last() else {
                    continue;
                };
                let p = PathBuf::from(path.trim_start_matches('.'));
                if !path.ends_with('/') && p.is_file() {
                    files.push(p);
                }
            }
        }
        for (i, f) in files.iter().enumerate() {
            std::fs::copy(f, saved.join(i.to_string()))
                .unwrap_or_else(|e| panic!("save {}: {e}", f.display()));
        }
        Machine {
            saved,
            files,
            had_user: Command::new("getent")
                .args(["passwd", "orca"])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false),
            had: CREATED
                .into_iter()
                .filter(|d| Path::new(d).exists())
                .collect(),
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").arg("--purge").args(PACKAGES).output();
        for (i, f) in self.files.iter().enumerate() {
            if let Some(dir) = f.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = std::fs::copy(self.saved.join(i.to_string()), f);
        }
        for d in CREATED {
            if !self.had.contains(&d) {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        if !self.had_user {
            let _ = Command::new("deluser").args(["--system", "orca"]).output();
            let _ = Command::new("delgroup").args(["--system", "orca"]).output();
        }
    }
}

/// A systemd unit's `[Service]` settings, each key's values in order.
fn service_section(unit: &Path) -> BTreeMap<String, Vec<String>> {
    let body = std::fs::read_to_string(unit).unwrap_or_else(|e| panic!("{}: {e}", unit.display()));
    let mut keys: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut in_service = false;
    for line in body.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                keys.entry(k.to_string()).or_default().push(v.to_string());
            }
        }
    }
    keys
}

/// An EnvironmentFile as systemd reads it: KEY=VALUE lines, comments and
/// blank lines skipped, quotes around a value removed.
fn environment_file(path: &Path) -> Vec<(String, String)> {
    let body = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    body.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.trim().to_string(), v.to_string())
        })
        .collect()
}

/// Starts a unit's service as systemd would (standing in for it): as its
/// user, in its working directory, with only its environment.
fn start_unit(unit: &Path, log: &Path) -> std::process::Child {
    let s = service_section(unit);
    let one = |k: &str| {
        s.get(k)
            .and_then(|v| v.last())
            .unwrap_or_else(|| panic!("{} has no {k}=", unit.display()))
            .clone()
    };
    let user = one("User");
    let exec = one("ExecStart");
    let mut argv = exec.split_whitespace();
    let program = argv.next().expect("ExecStart's program");
    let mut cmd = Command::new("setpriv");
    cmd.args([
        &format!("--reuid={user}"),
        &format!("--regid={}", one("Group")),
        "--init-groups",
        "--",
        program,
    ])
    .args(argv)
    .current_dir(one("WorkingDirectory"))
    .env_clear()
    .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin")
    .env("HOME", one("WorkingDirectory"))
    .env("USER", &user)
    .env("LOGNAME", &user);
    for assignment in s.get("Environment").into_iter().flatten() {
        if let Some((k, v)) = assignment.split_once('=') {
            cmd.env(k, v);
        }
    }
    for file in s.get("EnvironmentFile").into_iter().flatten() {
        for (k, v) in environment_file(Path::new(file.trim_start_matches('-'))) {
            cmd.env(k, v);
        }
    }
    let out = std::fs::File::create(log).expect("runner log");
    let err = out.try_clone().expect("runner log");
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start the unit's ExecStart")
}

fn owner_name(path: &Path) -> String {
    let uid = std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .uid();
    let out = run(Command::new("getent").args(["passwd", &uid.to_string()]));
    String::from_utf8_lossy(&out.stdout)
        .split(':')
        .next()
        .unwrap_or_default()
        .to_string()
}

fn installed(package: &str) -> String {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status} ${Version}", package])
        .output()
        .expect("dpkg-query");
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[tokio::test]
async fn the_packages_install_run_a_pipeline_through_the_units_and_leave_the_data_when_removed() {
    if !is_root() {
        eprintln!("SKIPPED: installing packages with dpkg needs root (CI runs as root)");
        return;
    }
    for tool in [
        "dpkg-deb",
        "dpkg",
        "dpkg-shlibdeps",
        "setpriv",
        "cargo-pgrx",
    ] {
        assert!(
            have(tool),
            "{tool} is missing: scripts/setup.sh installs what packaging needs"
        );
    }
    if PACKAGES
        .iter()
        .any(|p| installed(p).contains("ok installed"))
    {
        panic!(
            "{PACKAGES:?} are installed on this machine: this test installs and removes its own (dpkg --purge them first)"
        );
    }

    // 1. Build both packages, the binaries being the ones the tests built.
    let dir = scratch("packages");
    let bins = bin("orca");
    let bins = bins.parent().expect("bin dir");
    let out = run(Command::new(repo_root().join("scripts/package.sh"))
        .arg("--out")
        .arg(dir.join("dist"))
        .arg("--bins")
        .arg(bins));
    let debs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.ends_with(".deb"))
        .map(PathBuf::from)
        .collect();
    assert_eq!(debs.len(), 2, "two packages: {}", text(&out));
    let saved = dir.join("saved");
    std::fs::create_dir_all(&saved).expect("saved dir");
    let machine = Machine::take(&debs, saved);

    // 2. Install them.
    run(Command::new("dpkg").arg("-i").args(&debs));
    let version = env!("CARGO_PKG_VERSION");
    for p in PACKAGES {
        let status = installed(p);
        assert!(
            status.starts_with(&format!("install ok installed {version}")),
            "{p}: {status}"
        );
    }
    for b in ["orca", "orca-runner", "orca-engine"] {
        assert!(Path::new("/usr/bin").join(b).is_file(), "/usr/bin/{b}");
    }
    let out = run(Command::new("/usr/bin/orca").arg("--version"));
    assert!(text(&out).contains(version), "{}", text(&out));
    assert_eq!(owner_name(Path::new("/var/log/orca")), "orca");
    assert_eq!(owner_name(Path::new("/opt/orca/pipelines")), "root");
    for conf in ["/etc/orca/runner.env", "/etc/orca/serve.env"] {
        let mode = std::fs::metadata(conf).expect(conf).permissions().mode();
        assert_eq!(mode & 0o777, 0o640, "{conf} may hold a password");
    }
    let units = [
        "/lib/systemd/system/orca-runner.service",
        "/lib/systemd/system/orca-runner@.service",
        "/lib/systemd/system/orca-serve.service",
    ];
    if have("systemd-analyze") {
        // Offline: it checks the units' syntax, their binaries and users.
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .args(units)
            .output()
            .expect("systemd-analyze");
        let said = text(&out);
        let complaints: Vec<&str> = said
            .lines()
            .filter(|l| l.contains("orca") && !l.contains("runner-%i.env"))
            .collect();
        assert!(complaints.is_empty(), "systemd-analyze verify: {said}");
    } else {
        eprintln!("NOT CHECKED: systemd-analyze is missing, the units were not verified");
    }

    // 3. A clean private cluster creates the packaged extension.
    let cluster = PrivateCluster::start(&["orca.databases = 'orca'", "orca.tick_ms = 200"]);
    let mut admin = PgConnection::connect(&cluster.url("postgres"))
        .await
        .expect("connect");
    admin
        .execute("CREATE DATABASE orca")
        .await
        .expect("create db");
    let url = cluster.url("orca");
    let mut c = PgConnection::connect(&url).await.expect("connect orca");
    c.execute("CREATE EXTENSION orca").await.expect("extension");
    let ext: String =
        sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'orca'")
            .fetch_one(&mut c)
            .await
            .expect("extversion");
    assert_eq!(ext, version);
    // Every released version's scripts came along: the oldest release is
    // there to upgrade from.
    assert!(Path::new("/usr/share/postgresql/15/extension/orca--0.1.0.sql").is_file());
    assert!(Path::new("/usr/share/postgresql/15/extension/orca--0.2.0--0.3.0.sql").is_file());

    // 4. The operator's setup, as docs/deploy.md says: logins, a runner
    //    token in /etc/orca, the pipeline under /opt/orca/pipelines, the
    //    runner's settings in /etc/orca/runner.env.
    c.execute(
        "CREATE ROLE orca_pkg_runner LOGIN IN ROLE orca_runner;
         CREATE ROLE orca_pkg_attempt LOGIN IN ROLE orca_attempt",
    )
    .await
    .expect("logins");
    let token: String =
        sqlx::query_scalar("SELECT orca.create_runner_token('default', name => 'pkg-host')")
            .fetch_one(&mut c)
            .await
            .expect("runner token");
    std::fs::write("/etc/orca/runner-token", &token).expect("token file");
    run(Command::new("chgrp").args(["orca", "/etc/orca/runner-token"]));
    std::fs::set_permissions("/etc/orca/runner-token", PermissionsExt::from_mode(0o640))
        .expect("token mode");
    std::fs::copy(bin("probe"), "/opt/orca/pipelines/probe").expect("install the pipeline");
    run(Command::new("/usr/bin/orca")
        .args(["register", "/opt/orca/pipelines/probe"])
        .env("DATABASE_URL", &url));
    let port = cluster.port;
    let mut env = std::fs::read_to_string("/etc/orca/runner.env").expect("runner.env");
    env.push_str(&format!(
        "DATABASE_URL=postgres://orca_pkg_runner@127.0.0.1:{port}/orca\n\
         ORCA_ATTEMPT_DATABASE_URL=postgres://orca_pkg_attempt@127.0.0.1:{port}/orca\n\
         ORCA_RUNNER_NAME=pkg-host\n\
         ORCA_POLL_MS=200\n\
         ORCA_GRACE_SECONDS=5\n"
    ));
    std::fs::write("/etc/orca/runner.env", env).expect("runner.env");

    // 5. The runner as its unit starts it; a backfill through it.
    let log = dir.join("runner.out");
    let mut runner = start_unit(Path::new(units[0]), &log);
    let runner_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let out = Command::new("/usr/bin/orca")
        .args(["backfill", "probe", "2024-01..2024-02"])
        .env("DATABASE_URL", &url)
        .output()
        .expect("orca backfill");
    assert!(
        out.status.success() && text(&out).contains("2/2 done: 2 succeeded"),
        "orca backfill: {}\nrunner:\n{}",
        text(&out),
        runner_log()
    );
    let by: Vec<String> = sqlx::query_scalar("SELECT DISTINCT runner FROM orca.attempts")
        .fetch_all(&mut c)
        .await
        .expect("attempts");
    assert_eq!(by, ["pkg-host"]);
    let runs: Vec<i64> = sqlx::query_scalar("SELECT id FROM orca.runs ORDER BY id")
        .fetch_all(&mut c)
        .await
        .expect("runs");
    let attempt_log = PathBuf::from(format!(
        "/var/log/orca/default/probe/run-{}/attempt-1.log",
        runs[0]
    ));
    assert!(
        attempt_log.is_file(),
        "{}: {}",
        attempt_log.display(),
        runner_log()
    );
    assert_eq!(owner_name(&attempt_log), "orca");
    // systemd stops it with SIGTERM to the runner alone (KillMode=mixed).
    run(Command::new("kill").args(["-TERM", &runner.id().to_string()]));
    let status = runner.wait().expect("runner exit");
    assert!(
        status.success(),
        "runner stopped with {status}: {}",
        runner_log()
    );

    // 6. Removed: the programs go, the data and the configuration stay.
    run(Command::new("dpkg").arg("--remove").args(PACKAGES));
    for gone in [
        "/usr/bin/orca",
        "/usr/bin/orca-runner",
        "/usr/lib/postgresql/15/lib/orca.so",
    ] {
        assert!(!Path::new(gone).exists(), "{gone} is still there");
    }
    for kept in [
        "/etc/orca/runner.env",
        "/etc/orca/runner-token",
        "/opt/orca/pipelines/probe",
    ] {
        assert!(Path::new(kept).exists(), "{kept} went with the package");
    }
    assert!(
        attempt_log.is_file(),
        "the attempt's log went with the package"
    );
    // The running server loaded the library at its start; the control
    // plane's rows are the database's, untouched.
    let mut c = PgConnection::connect(&url).await.expect("connect again");
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orca.runs WHERE status = 'succeeded'")
            .fetch_one(&mut c)
            .await
            .expect("runs after removal");
    assert_eq!(succeeded, 2);

    // 7. Purged: the package's configuration goes; what the operator put
    //    there and the logs stay.
    run(Command::new("dpkg").arg("--purge").args(PACKAGES));
    assert!(!Path::new("/etc/orca/runner.env").exists());
    assert!(Path::new("/etc/orca/runner-token").exists());
    assert!(
        attempt_log.is_file(),
        "the attempt's log went with the purge"
    );
    drop(c);
    drop(admin);
    drop(cluster);
    drop(machine);
}
