//! A pod per attempt (`orca-runner --launcher kubernetes`), sized, and an
//! attempt killed for memory coming back bigger.
//!
//! Two stand-ins, because neither a Kubernetes API server nor a container
//! runtime can run on this machine: the API is **a simulation**
//! (tests/py/fake_kube.py answers the pod API as kube-apiserver does and
//! records the conversation), and each pod's container is run by the test
//! from the pushed image, unpacked, in namespaces of its own
//! (orca_tests::oci), with the pod's command, arguments and environment and
//! the Secret's values the pod names (as the kubelet would); the test then
//! reports the container's exit as the pod's status. The launcher, the
//! image, the registry, the pod's runner, the pipeline binary and the
//! control plane are real.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use orca_tests::oci::{self, Bundle, Registry};
use orca_tests::procs::{bin, least_privilege, text, url_as, Runner, ATTEMPT_LOGIN, RUNNER_LOGIN};
use orca_tests::sqlx;
use orca_tests::*;
use serde_json::{json, Value};

struct FakeApi {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl FakeApi {
    fn start(dir: &Path) -> FakeApi {
        std::fs::create_dir_all(dir).expect("fake api dir");
        let child = Command::new("python3")
            .arg(repo_root().join("tests/py/fake_kube.py"))
            .arg(dir)
            .spawn()
            .expect("start fake_kube.py");
        let port_file = dir.join("port");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !port_file.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "fake_kube.py did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let port = std::fs::read_to_string(&port_file)
            .expect("port")
            .trim()
            .parse()
            .expect("a port");
        FakeApi {
            child,
            dir: dir.to_path_buf(),
            port,
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        let path = self.dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: http://127.0.0.1:{}\nusers:\n- name: launcher\n  user: {{}}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: launcher\n    namespace: orca\ncurrent-context: sim\n",
                self.port
            ),
        )
        .expect("kubeconfig");
        path
    }

    /// The pods created so far, by name.
    fn pods(&self) -> Vec<(String, Value)> {
        let mut out: Vec<(String, Value)> = std::fs::read_dir(self.dir.join("pods"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| {
                        let name = e
                            .file_name()
                            .to_string_lossy()
                            .strip_suffix(".json")?
                            .to_string();
                        let v =
                            serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok()?;
                        Some((name, v))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by_key(|(_, p)| {
            p["metadata"]["labels"]["orca.dev/attempt"]
                .as_str()
                .and_then(|a| a.parse::<i64>().ok())
                .unwrap_or(0)
        });
        out
    }

    /// Reports a pod's status as its kubelet would.
    fn set_status(&self, pod: &str, status: Value) {
        let path = self.dir.join("status").join(format!("{pod}.json"));
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, status.to_string()).expect("status");
        std::fs::rename(tmp, path).expect("status");
    }

    /// A Secret as the launcher left it (created, then patched).
    fn secret(&self, name: &str) -> Value {
        std::fs::read_to_string(self.dir.join("secrets").join(format!("{name}.json")))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(self.dir.join("requests.log")).unwrap_or_default()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn terminated(code: i32, reason: &str) -> Value {
    json!({
        "phase": if code == 0 { "Succeeded" } else { "Failed" },
        "containerStatuses": [{"name": "attempt", "image": "", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": code, "reason": reason}}}]
    })
}

/// Waits for the launcher's `n`th pod.
async fn nth_pod(api: &FakeApi, n: usize, runner: &Runner) -> (String, Value) {
    wait_until(
        &format!("pod {n} to be created"),
        Duration::from_secs(60),
        || async { api.pods().into_iter().nth(n - 1) },
        || format!("{}\n{}", runner.output(), api.requests()),
    )
    .await
}

/// Runs a pod's container from the image, as the kubelet would, to its end:
/// its environment from the pod's spec, a `secretKeyRef` read from its
/// Secret in the (simulated) API.
fn run_pod(
    api: &FakeApi,
    bundle: &Bundle,
    pod: &Value,
    secret: &[(&str, &str)],
    log: &Path,
) -> std::process::ExitStatus {
    let c = &pod["spec"]["containers"][0];
    let mut argv: Vec<String> = Vec::new();
    for part in ["command", "args"] {
        for a in c[part].as_array().into_iter().flatten() {
            argv.push(a.as_str().unwrap_or_default().to_string());
        }
    }
    let env: Vec<(String, String)> = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let value = match e["valueFrom"]["secretKeyRef"].as_object() {
                Some(r) => {
                    let name = r["name"].as_str().unwrap_or_default();
                    let key = r["key"].as_str().unwrap_or_default();
                    let value = api.secret(name)["stringData"][key].clone();
                    assert!(value.is_string(), "no key {key} in secret {name}");
                    value
                }
                None => e["value"].clone(),
            };
            (
                e["name"].as_str().unwrap_or_default().to_string(),
                value.as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(c["envFrom"][0]["secretRef"]["name"], "orca-env");
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    all.extend_from_slice(secret);
    let mut container = oci::run_as(bundle, Some(&argv), &all, log);
    container.wait()
}

#[tokio::test]
async fn pods_are_launched_sized_and_a_pod_killed_for_memory_comes_back_bigger() {
    if oci::unavailable() {
        return;
    }
    let dir = scratch("pods");
    let registry = Registry::start(&dir.join("registry"));
    let env = oci::buildah_env(&dir.join("storage"));
    let r = registry.addr.clone();

    // The runner image and a project's image with probe_memory, registered
    // with its digest.
    oci::push_runner_image(&r, "pods", &env);
    let db = TestDb::new().await;
    let out = Command::new(bin("orca"))
        .args(["push", "--register", "--insecure-registry"])
        .args(["--image", &format!("{r}/acme/hungry:1")])
        .args(["--from", &format!("{r}/orca-runner:pods")])
        .arg("--root")
        .arg(repo_root())
        .arg(bin("probe_memory"))
        .env("DATABASE_URL", db.url())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("orca push");
    assert!(out.status.success(), "{}", text(&out));
    let image: String = sqlx::query_scalar("SELECT image FROM orca.pipeline_versions")
        .fetch_one(&db.pool)
        .await
        .expect("the version's image");
    let bundle = oci::unpack(&image, &dir.join("unpacked"));

    // The launcher: a runner with a token, talking to the (simulated) API.
    let api = FakeApi::start(&dir.join("api"));
    let kubeconfig = api.kubeconfig();
    let kubeconfig = kubeconfig.to_string_lossy().to_string();
    let logs = dir.join("logs");
    let tolerations = r#"[{"key": "orca", "operator": "Exists", "effect": "NoSchedule"}]"#;
    // The pool's runner token: the launcher's, and (through the Secret)
    // its pods', which keep and report the leases it claimed.
    let token = least_privilege(&db.url(), "default", "default", "pods");
    let runner_url = url_as(&db.url(), RUNNER_LOGIN);
    let attempt_url = url_as(&db.url(), ATTEMPT_LOGIN);
    let launcher = Runner::start(
        &runner_url,
        "launcher",
        2,
        &logs,
        &[
            ("ORCA_RUNNER_TOKEN", &token),
            ("ORCA_ATTEMPT_DATABASE_URL", &attempt_url),
            ("ORCA_LAUNCHER", "kubernetes"),
            ("KUBECONFIG", &kubeconfig),
            ("ORCA_POD_ENV_SECRET", "orca-env"),
            ("ORCA_POD_NODE_SELECTOR", "orca.dev/pool=default"),
            ("ORCA_POD_TOLERATIONS", tolerations),
        ],
    );
    // What the pods' Secret holds.
    let secret = [
        ("DATABASE_URL", runner_url.as_str()),
        ("ORCA_ATTEMPT_DATABASE_URL", attempt_url.as_str()),
        ("ORCA_RUNNER_TOKEN", token.as_str()),
    ];

    // 1. A run: its first pod, at 96 MiB, is killed for memory by its
    //    runner's limit inside the container, and reported so.
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe_memory', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let (first, pod) = nth_pod(&api, 1, &launcher).await;
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["image"], image.as_str());
    assert_eq!(c["resources"]["limits"]["memory"], "96Mi");
    assert_eq!(c["resources"]["requests"]["memory"], "96Mi");
    assert_eq!(pod["spec"]["nodeSelector"]["orca.dev/pool"], "default");
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "orca");
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    let labels = &pod["metadata"]["labels"];
    assert_eq!(labels["orca.dev/org"], "default");
    assert_eq!(labels["orca.dev/pipeline"], "probe_memory");
    assert_eq!(labels["orca.dev/run"], run.to_string());
    assert_eq!(labels["orca.dev/try"], "1");
    // The lease is in a Secret of the pod's own, not in the pod's spec
    // (which whoever may list pods reads), and the Secret is the pod's,
    // for the garbage collector to delete with it.
    let held = wait_until(
        "the pod's secret to be given to the pod",
        Duration::from_secs(20),
        || async {
            let held = api.secret(&first);
            held["metadata"]["ownerReferences"]
                .is_array()
                .then_some(held)
        },
        || format!("{}\n{}", launcher.output(), api.requests()),
    )
    .await;
    let lease: Value = serde_json::from_str(held["stringData"]["lease"].as_str().unwrap_or("{}"))
        .expect("the lease in the secret");
    let token = lease["lease"].as_str().expect("a lease token");
    assert!(
        !pod.to_string().contains(token),
        "the lease is in the pod's spec"
    );
    assert_eq!(held["metadata"]["labels"], pod["metadata"]["labels"]);
    let owner = &held["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Pod");
    assert_eq!(owner["uid"], pod["metadata"]["uid"]);
    let exit = run_pod(&api, &bundle, &pod, &secret, &dir.join("pod-1.log"));
    assert!(
        exit.success(),
        "pod 1's runner: {}",
        std::fs::read_to_string(dir.join("pod-1.log")).unwrap_or_default()
    );
    api.set_status(&first, terminated(0, "Completed"));

    // 2. The next pod is four times bigger, and the run succeeds in it.
    let (second, pod) = nth_pod(&api, 2, &launcher).await;
    let c = &pod["spec"]["containers"][0];
    assert_eq!(c["resources"]["limits"]["memory"], "384Mi");
    assert_eq!(pod["metadata"]["labels"]["orca.dev/try"], "2");
    let exit = run_pod(&api, &bundle, &pod, &secret, &dir.join("pod-2.log"));
    assert!(
        exit.success(),
        "pod 2's runner: {}",
        std::fs::read_to_string(dir.join("pod-2.log")).unwrap_or_default()
    );
    api.set_status(&second, terminated(0, "Completed"));
    orca_tests::procs::wait_run(&db, run, "succeeded", &launcher).await;
    let seen: Vec<(i32, Value, Option<String>)> = sqlx::query_as(
        "SELECT number, resources, killed_for FROM orca.attempts WHERE run_id = $1 ORDER BY number",
    )
    .bind(run)
    .fetch_all(&db.pool)
    .await
    .expect("attempts");
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].1["memory_bytes"], 96 << 20);
    assert_eq!(seen[0].2.as_deref(), Some("memory"));
    assert_eq!(seen[1].1["memory_bytes"], 384 << 20);
    let failures = db
        .scalar_i64(&format!(
            "SELECT failures::bigint FROM orca.runs WHERE id = {run}"
        ))
        .await;
    assert_eq!(failures, 0, "killed for memory spends no retry");

    // 3. A pod the kernel OOMKilled (the container never reported): the
    //    launcher reports it killed for memory, and the next pod is bigger.
    let run2: i64 = sqlx::query_scalar("SELECT orca.run('probe_memory', '2024-02')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let (third, pod) = nth_pod(&api, 3, &launcher).await;
    assert_eq!(pod["metadata"]["labels"]["orca.dev/run"], run2.to_string());
    api.set_status(&third, terminated(137, "OOMKilled"));
    let (fourth, pod) = nth_pod(&api, 4, &launcher).await;
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["limits"]["memory"],
        "384Mi"
    );
    let error: String =
        sqlx::query_scalar("SELECT error FROM orca.attempts WHERE run_id = $1 AND number = 1")
            .bind(run2)
            .fetch_one(&db.pool)
            .await
            .expect("the killed attempt");
    assert!(
        error.contains("OOMKilled") && error.contains("96 MiB"),
        "{error}"
    );
    let exit = run_pod(&api, &bundle, &pod, &secret, &dir.join("pod-4.log"));
    assert!(exit.success());
    api.set_status(&fourth, terminated(0, "Completed"));
    orca_tests::procs::wait_run(&db, run2, "succeeded", &launcher).await;

    // Finished pods are deleted, and their leases' Secrets.
    let said = api.requests();
    for p in [&first, &second, &third, &fourth] {
        wait_until(
            &format!("pod {p} to be deleted"),
            Duration::from_secs(20),
            || async {
                let said = api.requests();
                (said.contains(&format!("DELETE /api/v1/namespaces/orca/pods/{p}"))
                    && said.contains(&format!("DELETE /api/v1/namespaces/orca/secrets/{p}")))
                .then_some(())
            },
            || format!("{said}\n{}", launcher.output()),
        )
        .await;
    }
    drop(launcher);
    drop(api);
    drop(registry);
    let _ = std::fs::remove_dir_all(&dir);
}
