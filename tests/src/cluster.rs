//! A private PostgreSQL cluster for tests that need server settings of their
//! own (the background worker needs `shared_preload_libraries = 'orca'`).
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the
//! cluster is created and started as the `postgres` OS user.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn pg_bindir() -> PathBuf {
    let pg_config = std::env::var("ORCA_PG_CONFIG")
        .unwrap_or_else(|_| "/usr/lib/postgresql/15/bin/pg_config".to_string());
    let out = Command::new(&pg_config)
        .arg("--bindir")
        .output()
        .unwrap_or_else(|e| panic!("run {pg_config}: {e}"));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs a server binary, as `postgres` when we are root.
fn run_pg(bin: &Path, args: &[&str]) -> Output {
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(54_329)
}

pub struct PrivateCluster {
    pub dir: PathBuf,
    pub port: u16,
    bindir: PathBuf,
}

impl PrivateCluster {
    /// initdb, the given postgresql.conf lines, and start.
    pub fn start(conf: &[&str]) -> PrivateCluster {
        PrivateCluster::start_in(&pg_bindir(), conf)
    }

    /// The same, with the binaries (and so the installation) in `bindir`.
    pub fn start_in(bindir: &Path, conf: &[&str]) -> PrivateCluster {
        let bindir = bindir.to_path_buf();
        let dir = std::env::temp_dir().join(format!(
            "orca-cluster-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("cluster dir");
        if is_root() {
            let ok = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "chown {} to postgres", dir.display());
        }
        let data = dir.join("data");
        let data_s = data.to_string_lossy().to_string();
        let out = run_pg(
            &bindir.join("initdb"),
            &[
                "-D",
                &data_s,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let mut lines = vec![
            format!("port = {port}"),
            "listen_addresses = '127.0.0.1'".to_string(),
            format!("unix_socket_directories = '{}'", dir.display()),
            "fsync = off".to_string(),
            "shared_preload_libraries = 'orca'".to_string(),
        ];
        lines.extend(conf.iter().map(|s| s.to_string()));
        let conf_path = data.join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&conf_path).unwrap_or_default();
        text.push_str(&lines.join("\n"));
        text.push('\n');
        // Written by us (maybe root); the server only reads it.
        std::fs::write(&conf_path, text).expect("write postgresql.auto.conf");
        if is_root() {
            let _ = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&conf_path)
                .status();
        }
        let log = dir.join("server.log").to_string_lossy().to_string();
        let out = run_pg(
            &bindir.join("pg_ctl"),
            &["-D", &data_s, "-l", &log, "-w", "-t", "60", "start"],
        );
        let cluster = PrivateCluster { dir, port, bindir };
        assert!(
            out.status.success(),
            "pg_ctl start: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            cluster.log()
        );
        cluster
    }

    /// Restarts the server as an operator would (`pg_ctl restart -m fast`:
    /// sessions are ended, the preloaded library is loaded again).
    pub fn restart(&self) {
        let data = self.dir.join("data").to_string_lossy().to_string();
        let log = self.dir.join("server.log").to_string_lossy().to_string();
        let out = run_pg(
            &self.bindir.join("pg_ctl"),
            &[
                "-D", &data, "-l", &log, "-m", "fast", "-w", "-t", "60", "restart",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl restart: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// Crashes the server and starts it again (`pg_ctl stop -m immediate`,
    /// then start): every session ends at once with 57P01, nothing is
    /// checkpointed, and the server recovers from its WAL.
    pub fn crash_restart(&self) {
        let data = self.dir.join("data").to_string_lossy().to_string();
        let log = self.dir.join("server.log").to_string_lossy().to_string();
        for args in [
            vec!["-D", &data, "-m", "immediate", "-w", "-t", "60", "stop"],
            vec!["-D", &data, "-l", &log, "-w", "-t", "60", "start"],
        ] {
            let out = run_pg(&self.bindir.join("pg_ctl"), &args);
            assert!(
                out.status.success(),
                "pg_ctl {args:?}: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let data = self.dir.join("data").to_string_lossy().to_string();
        let _ = run_pg(
            &self.bindir.join("pg_ctl"),
            &["-D", &data, "-m", "immediate", "-w", "stop"],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
