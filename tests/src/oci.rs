//! OCI images on a machine without a Docker engine: a real registry
//! (Debian's `docker-registry`), buildah's storage kept per test, images
//! read back with skopeo and unpacked with umoci, and an unpacked image run
//! in namespaces of its own. That last part stands in for a container
//! runtime, which cannot run here (`podman run` fails on setrlimit): it
//! gives the image's program its own root, PID, mount, UTS and IPC
//! namespaces, /proc and the device nodes a runtime creates, the image's
//! user, working directory and environment, and the host's network (as a
//! pod with hostNetwork).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// Whether a command is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The tools the image tests need, missing ones named.
pub fn missing_tools() -> Vec<&'static str> {
    ["buildah", "skopeo", "umoci", "docker-registry", "unshare"]
        .into_iter()
        .filter(|t| !have(t))
        .collect()
}

/// Whether the image tests cannot run here: without root they are skipped,
/// saying so; a missing tool fails them, named.
pub fn unavailable() -> bool {
    if !crate::cluster::is_root() {
        eprintln!("SKIPPED: buildah, umoci and the namespaces need root (CI runs as root)");
        return true;
    }
    let missing = missing_tools();
    assert!(
        missing.is_empty(),
        "{missing:?} missing: scripts/setup.sh --tests installs them"
    );
    false
}

/// Builds the runner image (scripts/image.sh) from the binaries the tests
/// built and pushes it to `<registry>/orca-runner:<tag>`. Returns what the
/// script printed: the local name, then the pushed reference.
pub fn push_runner_image(registry: &str, tag: &str, env: &[(String, String)]) -> String {
    let orca = crate::procs::bin("orca");
    let bins = orca.parent().expect("bin dir");
    let out = Command::new(crate::repo_root().join("scripts/image.sh"))
        .args([
            "runner",
            "--tag",
            &format!("localhost/orca-runner:{tag}"),
            "--bins",
        ])
        .arg(bins)
        .args([
            "--push",
            &format!("{registry}/orca-runner:{tag}"),
            "--insecure-registry",
        ])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run scripts/image.sh");
    assert!(
        out.status.success(),
        "scripts/image.sh runner: {}",
        crate::procs::text(&out)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A registry on loopback, storing under the test's directory, stopped
/// when dropped.
pub struct Registry {
    child: Child,
    pub addr: String,
}

impl Registry {
    pub fn start(dir: &Path) -> Registry {
        std::fs::create_dir_all(dir).expect("registry dir");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("addr").port()
        };
        let conf = dir.join("registry.yml");
        std::fs::write(
            &conf,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.join("data").display()
            ),
        )
        .expect("registry config");
        let log = std::fs::File::create(dir.join("registry.log")).expect("registry log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&conf)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let addr = format!("127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the registry did not listen on {addr}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Registry { child, addr }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The environment that keeps buildah's images under `dir` (vfs, chroot
/// isolation: what works on this machine), for buildah and what runs it
/// (scripts/image.sh, `orca push`).
pub fn buildah_env(dir: &Path) -> Vec<(String, String)> {
    std::fs::create_dir_all(dir).expect("storage dir");
    let conf = dir.join("storage.conf");
    std::fs::write(
        &conf,
        format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            dir.join("graph").display(),
            dir.join("run").display()
        ),
    )
    .expect("storage.conf");
    vec![
        ("CONTAINERS_STORAGE_CONF".into(), conf.display().to_string()),
        ("STORAGE_DRIVER".into(), "vfs".into()),
        ("BUILDAH_ISOLATION".into(), "chroot".into()),
    ]
}

/// What `skopeo inspect` says of an image in the registry.
pub fn inspect(reference: &str) -> Value {
    let out = Command::new("skopeo")
        .args(["inspect", "--tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .output()
        .expect("skopeo inspect");
    assert!(
        out.status.success(),
        "skopeo inspect {reference}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("skopeo's JSON")
}

/// An image unpacked as a runtime bundle: `rootfs/` and the runtime
/// configuration umoci wrote from the image's (`config.json`).
pub struct Bundle {
    pub dir: PathBuf,
    pub rootfs: PathBuf,
    pub config: Value,
}

/// Copies an image from the registry into an OCI layout and unpacks it.
pub fn unpack(reference: &str, dir: &Path) -> Bundle {
    std::fs::create_dir_all(dir).expect("unpack dir");
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    let out = Command::new("skopeo")
        .args(["copy", "-q", "--src-tls-verify=false"])
        .arg(format!("docker://{reference}"))
        .arg(format!("oci:{}:image", layout.display()))
        .output()
        .expect("skopeo copy");
    assert!(
        out.status.success(),
        "skopeo copy {reference}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:image", layout.display()))
        .arg(&bundle)
        .output()
        .expect("umoci unpack");
    assert!(
        out.status.success(),
        "umoci unpack: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(bundle.join("config.json")).expect("config.json"),
    )
    .expect("config.json is JSON");
    Bundle {
        rootfs: bundle.join("rootfs"),
        dir: bundle,
        config,
    }
}

/// Every file and link of a root, relative, sorted.
pub fn files(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if is_dir {
                walk(root, &p, out);
            } else if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// Runs the bundle's program as a container runtime would (see the module
/// note): its args, user, working directory and environment from
/// config.json, `env` added as a pod spec's env would be. Output goes to
/// `log`.
pub fn run(bundle: &Bundle, env: &[(&str, &str)], log: &Path) -> Container {
    run_as(bundle, None, env, log)
}

/// [`run`], with the program and its arguments a pod's container gives
/// (its command and args) instead of the image's.
pub fn run_as(
    bundle: &Bundle,
    argv: Option<&[String]>,
    env: &[(&str, &str)],
    log: &Path,
) -> Container {
    let process = &bundle.config["process"];
    let dev = bundle.rootfs.join("dev");
    std::fs::create_dir_all(&dev).expect("rootfs/dev");
    // The device nodes every runtime creates.
    for (name, minor) in [("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)] {
        let node = dev.join(name);
        if !node.exists() {
            let ok = Command::new("mknod")
                .args(["-m", "666"])
                .arg(&node)
                .args(["c", "1", &minor.to_string()])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "mknod {}", node.display());
        }
    }
    let args: Vec<String> = match argv {
        Some(a) => a.to_vec(),
        None => process["args"]
            .as_array()
            .expect("process.args")
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect(),
    };
    assert!(!args.is_empty(), "the image has no entrypoint");
    let uid = process["user"]["uid"].as_u64().unwrap_or(0).to_string();
    let gid = process["user"]["gid"].as_u64().unwrap_or(0).to_string();
    let cwd = process["cwd"].as_str().unwrap_or("/");
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--pid",
        "--fork",
        "--kill-child=SIGTERM",
        "--mount",
        "--uts",
        "--ipc",
    ])
    .arg("--mount-proc")
    .arg(format!("--root={}", bundle.rootfs.display()))
    .arg(format!("--wd={cwd}"))
    .args(["--setuid", &uid, "--setgid", &gid])
    .args(&args)
    .env_clear();
    for kv in process["env"].as_array().into_iter().flatten() {
        if let Some((k, v)) = kv.as_str().and_then(|s| s.split_once('=')) {
            cmd.env(k, v);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = std::fs::File::create(log).expect("container log");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out)
        .spawn()
        .expect("start the image's program");
    Container { child: Some(child) }
}

/// The image's program running: `unshare` waiting on it (the program is
/// its child, PID 1 of the container's PID namespace).
pub struct Container {
    child: Option<Child>,
}

impl Container {
    /// The program's pid, as the host sees it.
    fn init(&self) -> Option<u32> {
        let pid = self.child.as_ref()?.id();
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn signal_init(&self, sig: &str) {
        if let Some(pid) = self.init() {
            let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
        }
    }

    /// Waits for the program to exit by itself.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child
            .take()
            .expect("a running container")
            .wait()
            .expect("the container's exit")
    }

    /// Stops it as a runtime does: SIGTERM to the program (unshare itself
    /// ignores it), then waits for it to exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.signal_init("-TERM");
        self.wait()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.signal_init("-KILL");
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
