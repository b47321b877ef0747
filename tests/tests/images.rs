//! Images without a Docker engine (docs/deploy.md): the runner and
//! extension images built with buildah (scripts/image.sh), a project's
//! image built FROM the runner image and pushed by `orca push --register`
//! to a real registry (Debian's docker-registry), read back with skopeo and
//! unpacked with umoci. The pushed image's runner then executes a real
//! attempt of the control plane, run in namespaces of its own: that stands
//! in for a container runtime, which cannot run on this machine
//! (orca_tests::oci says what it gives the program).

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use orca_tests::oci::{self, Registry};
use orca_tests::procs::{bin, least_privilege, text, url_as, ATTEMPT_LOGIN, RUNNER_LOGIN};
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;

fn with_env(cmd: &mut Command, env: &[(String, String)]) -> Output {
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

fn ok(cmd: &mut Command, env: &[(String, String)]) -> String {
    let out = with_env(cmd, env);
    assert!(out.status.success(), "{cmd:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The last line a script printed (scripts/image.sh prints the local name,
/// then the pushed reference).
fn last_line(s: &str) -> String {
    s.lines().last().unwrap_or_default().trim().to_string()
}

#[tokio::test]
async fn a_pushed_pipeline_image_runs_an_attempt_of_the_control_plane() {
    if oci::unavailable() {
        return;
    }
    let dir = scratch("images");
    let registry = Registry::start(&dir.join("registry"));
    let env = oci::buildah_env(&dir.join("storage"));
    let r = &registry.addr;

    // The runner image, pushed.
    let out = oci::push_runner_image(r, "test", &env);
    let runner_ref = last_line(&out);
    assert!(
        runner_ref.starts_with(&format!("{r}/orca-runner@sha256:")),
        "{out}"
    );
    let runner = oci::inspect(&format!("{r}/orca-runner:test"));
    assert_eq!(
        runner["Labels"]["org.opencontainers.image.title"],
        "orca-runner"
    );

    // A project's image FROM it, pushed and registered in one command.
    let db = TestDb::new().await;
    let probe = bin("probe");
    let out = ok(
        Command::new(bin("orca"))
            .args(["push", "--register", "--insecure-registry"])
            .args(["--image", &format!("{r}/acme/pipelines:1")])
            .args(["--from", &format!("{r}/orca-runner:test")])
            .arg("--root")
            .arg(repo_root())
            .arg(&probe)
            .env("DATABASE_URL", db.url()),
        &env,
    );
    assert!(out.contains("registered probe version 1"), "{out}");
    let image = oci::inspect(&format!("{r}/acme/pipelines:1"));
    let digest = image["Digest"].as_str().expect("digest").to_string();
    let pushed = format!("{r}/acme/pipelines@{digest}");
    assert!(
        out.contains(&format!("pushed {r}/acme/pipelines:1 ({pushed})")),
        "{out}"
    );
    let labels = &image["Labels"];
    assert_eq!(labels["dev.orca.pipelines"], "probe");
    assert_eq!(labels["org.opencontainers.image.title"], "pipelines");
    let head = Command::new("git")
        .arg("-C")
        .arg(repo_root())
        .args(["rev-parse", "HEAD"])
        .output()
        .expect("git");
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        String::from_utf8_lossy(&head.stdout).trim()
    );
    // The version records the image and the binary's place in it.
    let (image_col, path, sha): (String, String, String) = sqlx::query_as(
        "SELECT image, binary_path, binary_sha256 FROM orca.pipeline_versions v \
         JOIN orca.pipelines p ON p.id = v.pipeline_id WHERE p.name = 'probe'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("the version");
    assert_eq!(image_col, pushed);
    assert_eq!(path, "/opt/orca/pipelines/probe");
    assert_eq!(labels["dev.orca.pipeline.probe.sha256"], sha.as_str());

    // Read back and unpacked: the runner image's files and nothing else,
    // the pipeline and where its steps are beside it.
    let bundle = oci::unpack(&pushed, &dir.join("unpacked"));
    let files = oci::files(&bundle.rootfs);
    for want in [
        "usr/bin/orca-runner",
        "usr/bin/orca",
        "usr/bin/orca-engine",
        "etc/ssl/certs/ca-certificates.crt",
        "opt/orca/pipelines/probe",
        "opt/orca/pipelines/probe.source.json",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} not in {files:?}");
    }
    for f in &files {
        assert!(
            f.starts_with("usr/bin/")
                || f.starts_with("lib")
                || f.starts_with("etc/")
                || f.starts_with("opt/orca/pipelines/"),
            "the image holds {f}, which no runner needs"
        );
    }
    assert!(!files.iter().any(|f| f.ends_with("bin/sh")), "a shell");
    assert_eq!(bundle.config["process"]["user"]["uid"], 10001, "not root");
    assert_eq!(bundle.config["process"]["args"][0], "/usr/bin/orca-runner");

    // A run queued, and the image's runner, as a pod would start it with a
    // runner token in its environment, executes it.
    db.pool
        .execute("SELECT orca.backfill('probe', '2024-01')")
        .await
        .expect("backfill");
    let token = least_privilege(&db.url(), "default", "default", "image-runner");
    let runner_url = url_as(&db.url(), RUNNER_LOGIN);
    let attempt_url = url_as(&db.url(), ATTEMPT_LOGIN);
    let log = dir.join("container.log");
    let mut container = oci::run(
        &bundle,
        &[
            ("DATABASE_URL", &runner_url),
            ("ORCA_ATTEMPT_DATABASE_URL", &attempt_url),
            ("ORCA_RUNNER_TOKEN", &token),
            ("ORCA_RUNNER_NAME", "image-runner"),
            ("ORCA_POLL_MS", "200"),
            ("ORCA_TICK_MS", "200"),
        ],
        &log,
    );
    let container_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for_sql(
        &db,
        "the run to succeed",
        "SELECT status = 'succeeded' FROM orca.runs",
        Duration::from_secs(90),
        container_log,
    )
    .await;
    let by = db
        .strings("SELECT DISTINCT runner FROM orca.attempts")
        .await;
    assert_eq!(by, ["image-runner"]);
    let run = db.scalar_i64("SELECT id FROM orca.runs").await;
    // The attempt's log, written in the image's root by its user.
    let attempt_log = bundle.rootfs.join(format!(
        "var/log/orca/default/probe/run-{run}/attempt-1.log"
    ));
    assert!(
        attempt_log.is_file(),
        "{}: {}",
        attempt_log.display(),
        container_log()
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&attempt_log).expect("log").uid(), 10001);
    // Stopped as a runtime stops it: the runner exits cleanly on SIGTERM.
    let status = container.stop();
    assert!(status.success(), "{status}: {}", container_log());
    drop(registry);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_extension_image_holds_the_library_and_every_script_in_cloudnativepg_s_layout() {
    if oci::unavailable() {
        return;
    }
    let dir = scratch("ext-image");
    let registry = Registry::start(&dir.join("registry"));
    let env = oci::buildah_env(&dir.join("storage"));
    let r = &registry.addr;
    let out = ok(
        Command::new(repo_root().join("scripts/image.sh")).args([
            "extension",
            "--tag",
            "localhost/orca-extension:test",
            "--push",
            &format!("{r}/orca-extension:test"),
            "--insecure-registry",
        ]),
        &env,
    );
    let pushed = last_line(&out);
    let bundle = oci::unpack(&pushed, &dir.join("unpacked"));
    let files = oci::files(&bundle.rootfs);
    let mut scripts: Vec<String> = std::fs::read_dir(repo_root().join("migrations"))
        .expect("migrations")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".sql"))
        .map(|n| format!("share/extension/{n}"))
        .collect();
    let version = env!("CARGO_PKG_VERSION");
    scripts.push(format!("share/extension/orca--{version}.sql"));
    scripts.push("share/extension/orca.control".into());
    scripts.push("lib/orca.so".into());
    scripts.sort();
    scripts.dedup();
    assert_eq!(files, scripts, "exactly the library and the scripts");
    // The library is the one this machine's PostgreSQL loads.
    let installed = std::fs::read(orca_tests::install::installed_library()).expect("orca.so");
    let packed = std::fs::read(bundle.rootfs.join("lib/orca.so")).expect("image's orca.so");
    assert_eq!(packed.len(), installed.len());
    let labels = oci::inspect(&format!("{r}/orca-extension:test"))["Labels"].clone();
    assert_eq!(labels["dev.orca.postgresql"], "15");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn push_and_register_refuse_a_bad_image_reference_and_push_nothing() {
    if oci::unavailable() {
        return;
    }
    let dir = scratch("bad-ref");
    let env = oci::buildah_env(&dir.join("storage"));
    let probe = bin("probe");
    for bad in [
        "Acme/Pipelines:1",
        "127.0.0.1:5000/acme/p:bad tag",
        "acme/p;rm -rf /",
    ] {
        let out = with_env(
            Command::new(bin("orca"))
                .args([
                    "push",
                    "--from",
                    "localhost/orca-runner:test",
                    "--image",
                    bad,
                ])
                .arg(&probe),
            &env,
        );
        assert!(!out.status.success(), "{bad}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
    }
    let db = TestDb::new().await;
    let out = Command::new(bin("orca"))
        .args(["register", "--image", "ghcr.io/acme/etl@sha256:abc"])
        .arg(&probe)
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca register");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("digest"));
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.pipeline_versions")
            .await,
        0
    );
    assert!(!Path::new(&dir.join("storage/graph"))
        .join("vfs-images")
        .exists());
    let _ = std::fs::remove_dir_all(&dir);
}
