//! `--launcher kubernetes`: a pod per attempt. The pod runs the version's
//! image with `orca-runner --one-attempt` and the lease (from a Secret of
//! its own: a pod's spec is readable by whoever may list pods, and a lease
//! reads the org's secrets while it lives), so the attempt is
//! run, kept and reported inside it as on any runner; this runner makes the
//! pod (sized from the attempt's resources, labelled, on the pool's nodes),
//! keeps the lease while the pod waits to be scheduled, and reports what
//! the pod's runner could not: a container OOMKilled (killed for memory, so
//! the next attempt is bigger), an image that cannot be pulled, an eviction
//! (handed back, no retry spent). Finished pods are deleted, failed ones
//! kept when asked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::attempt::{self, Outcome, Shared};
use crate::control::{self, ControlError, Lease};

/// How often a pod's state is read.
const POLL: Duration = Duration::from_secs(2);
/// How long, once the pod's runner reported, its pod may take to exit
/// before it is deleted anyway.
const EXIT_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, clap::Args)]
pub struct PodOptions {
    /// The namespace of the pods (default: the kubeconfig's, or the
    /// service account's).
    #[arg(long, env = "ORCA_POD_NAMESPACE")]
    pub pod_namespace: Option<String>,
    /// The image of versions registered without one.
    #[arg(long, env = "ORCA_POD_IMAGE")]
    pub pod_image: Option<String>,
    /// A Secret whose keys become each pod's environment: DATABASE_URL,
    /// ORCA_ATTEMPT_DATABASE_URL and ORCA_RUNNER_TOKEN (the pool's token),
    /// and what the pipelines read (AWS_*, ORCA_WAREHOUSE...).
    #[arg(long, env = "ORCA_POD_ENV_SECRET")]
    pub pod_env_secret: Option<String>,
    /// The pool's nodes: `key=value,key=value`.
    #[arg(long, env = "ORCA_POD_NODE_SELECTOR", value_parser = node_selector)]
    pub pod_node_selector: Option<BTreeMap<String, String>>,
    /// The pool's tolerations, as a JSON array of Kubernetes tolerations.
    #[arg(long, env = "ORCA_POD_TOLERATIONS", value_parser = tolerations)]
    pub pod_tolerations: Option<Value>,
    /// The pods' service account.
    #[arg(long, env = "ORCA_POD_SERVICE_ACCOUNT")]
    pub pod_service_account: Option<String>,
    /// Keep the pods of failed attempts (for `kubectl logs` and describe);
    /// finished pods are deleted otherwise.
    #[arg(long, env = "ORCA_KEEP_FAILED_PODS")]
    pub keep_failed_pods: bool,
}

fn node_selector(s: &str) -> Result<BTreeMap<String, String>, String> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(format!("node selector {p:?} is not key=value")),
        })
        .collect()
}

fn tolerations(s: &str) -> Result<Value, String> {
    let v: Value = serde_json::from_str(s).map_err(|e| format!("tolerations are not JSON: {e}"))?;
    let list = v
        .as_array()
        .ok_or("tolerations must be a JSON array of tolerations")?;
    // Checked as the API server would, so a bad list is refused at start
    // rather than by every pod.
    for t in list {
        serde_json::from_value::<k8s_openapi::api::core::v1::Toleration>(t.clone())
            .map_err(|e| format!("toleration {t}: {e}"))?;
    }
    Ok(v)
}

pub struct Launcher {
    pods: Api<Pod>,
    /// Each pod's lease, in a Secret named as the pod.
    secrets: Api<Secret>,
    namespace: String,
    options: PodOptions,
    runner: String,
    grace_seconds: u64,
}

impl Launcher {
    pub async fn new(
        options: &PodOptions,
        runner: &str,
        grace_seconds: u64,
    ) -> anyhow::Result<Launcher> {
        // More than one TLS backend is linked (sqlx's and kube's): the
        // process picks ring, as sqlx does.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = kube::Client::try_default().await?;
        let namespace = options
            .pod_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        Ok(Launcher {
            pods: Api::namespaced(client.clone(), &namespace),
            secrets: Api::namespaced(client, &namespace),
            namespace,
            options: options.clone(),
            runner: runner.to_string(),
            grace_seconds,
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}

/// A DNS label: lower-case letters, digits and '-', at most 63.
fn dns_label(s: &str) -> String {
    let mut out: String = s
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    out.truncate(63);
    out.trim_matches('-').to_string()
}

/// A label value: at most 63 of [A-Za-z0-9._-], starting and ending
/// alphanumeric.
fn label_value(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    out.truncate(63);
    out.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Bytes as a Kubernetes quantity, in Mi or Gi when they divide it.
fn memory_quantity(b: i64) -> String {
    if b % (1 << 30) == 0 {
        format!("{}Gi", b >> 30)
    } else if b % (1 << 20) == 0 {
        format!("{}Mi", b >> 20)
    } else {
        b.to_string()
    }
}

/// The pod of an attempt: the image's runner in one-attempt mode with the
/// lease, sized (memory as request and limit, CPU as request), labelled,
/// on the pool's nodes.
pub fn render(l: &Lease, image: &str, o: &PodOptions, runner: &str, grace_seconds: u64) -> Value {
    let name = pod_name(l);
    let labels = labels(l);
    let mut requests = serde_json::Map::new();
    let mut limits = serde_json::Map::new();
    if let Some(size) = l.resources {
        if let Some(b) = size.memory_bytes {
            requests.insert("memory".into(), memory_quantity(b).into());
            limits.insert("memory".into(), memory_quantity(b).into());
        }
        if let Some(m) = size.cpu_millis {
            requests.insert("cpu".into(), format!("{m}m").into());
        }
    }
    let env = vec![
        json!({"name": "ORCA_ONE_ATTEMPT",
               "valueFrom": {"secretKeyRef": {"name": name, "key": LEASE_KEY}}}),
        json!({"name": "ORCA_RUNNER_NAME", "value": runner}),
        json!({"name": "ORCA_POOL", "value": l.pool}),
        json!({"name": "ORCA_ORG", "value": l.org}),
        json!({"name": "ORCA_GRACE_SECONDS", "value": grace_seconds.to_string()}),
    ];
    let mut container = json!({
        "name": "attempt",
        "image": image,
        "command": ["/usr/bin/orca-runner"],
        "args": ["--one-attempt"],
        "env": env,
        "resources": {"requests": requests, "limits": limits},
        "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true},
    });
    if let (Some(secret), Some(c)) = (&o.pod_env_secret, container.as_object_mut()) {
        c.insert("envFrom".into(), json!([{"secretRef": {"name": secret}}]));
    }
    let mut spec = json!({
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": grace_seconds + 15,
        "automountServiceAccountToken": false,
        "containers": [container],
    });
    if let Some(s) = spec.as_object_mut() {
        if let Some(n) = &o.pod_node_selector {
            s.insert("nodeSelector".into(), json!(n));
        }
        if let Some(t) = &o.pod_tolerations {
            s.insert("tolerations".into(), t.clone());
        }
        if let Some(a) = &o.pod_service_account {
            s.insert("serviceAccountName".into(), a.clone().into());
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    })
}

/// The key of the lease in the pod's Secret.
const LEASE_KEY: &str = "lease";

/// An attempt's pod's name (and its Secret's).
fn pod_name(l: &Lease) -> String {
    let name = dns_label(&format!(
        "orca-{}-{}-r{}-a{}",
        l.org, l.pipeline, l.run, l.attempt_number
    ));
    // The attempt's id keeps the name unique where org and pipeline were cut.
    format!(
        "{}-{}",
        &name[..name.len().min(50)].trim_end_matches('-'),
        l.attempt.0
    )
}

/// The labels of an attempt's pod and Secret.
fn labels(l: &Lease) -> Value {
    json!({
        "app.kubernetes.io/managed-by": "orca-runner",
        "orca.dev/org": label_value(&l.org),
        "orca.dev/pipeline": label_value(&l.pipeline),
        "orca.dev/run": l.run.0.to_string(),
        "orca.dev/attempt": l.attempt.0.to_string(),
        "orca.dev/try": l.attempt_number.to_string(),
        "orca.dev/pool": label_value(&l.pool),
    })
}

/// The Secret that holds an attempt's lease for its pod.
pub fn render_secret(l: &Lease) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": pod_name(l), "labels": labels(l)},
        "type": "Opaque",
        "stringData": {LEASE_KEY: serde_json::to_string(l).unwrap_or_default()},
    })
}

/// What a pod's state says of its attempt.
#[derive(Debug, PartialEq)]
pub enum PodState {
    /// Waiting to be scheduled or started, or running.
    Going,
    /// Its container exited: its exit code, reason and message.
    Exited {
        code: i32,
        reason: String,
        message: String,
    },
    /// It cannot start: an image that cannot be pulled, a bad spec.
    Broken(String),
    /// Taken away by the cluster (evicted, preempted): no fault of the
    /// attempt's.
    Evicted(String),
}

/// Reasons a container waits for ever.
const BROKEN: [&str; 5] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

pub fn state(pod: &Pod) -> PodState {
    let Some(status) = &pod.status else {
        return PodState::Going;
    };
    if status.phase.as_deref() == Some("Failed") {
        let reason = status.reason.clone().unwrap_or_default();
        if matches!(
            reason.as_str(),
            "Evicted" | "Preempting" | "NodeLost" | "Shutdown" | "Terminated"
        ) {
            return PodState::Evicted(format!(
                "{reason}: {}",
                status.message.clone().unwrap_or_default()
            ));
        }
    }
    for c in status.container_statuses.iter().flatten() {
        let Some(st) = &c.state else { continue };
        if let Some(t) = &st.terminated {
            return PodState::Exited {
                code: t.exit_code,
                reason: t.reason.clone().unwrap_or_default(),
                message: t.message.clone().unwrap_or_default(),
            };
        }
        if let Some(w) = &st.waiting {
            let reason = w.reason.clone().unwrap_or_default();
            if BROKEN.contains(&reason.as_str()) {
                return PodState::Broken(format!(
                    "{reason}: {}",
                    w.message.clone().unwrap_or_default()
                ));
            }
        }
    }
    PodState::Going
}

/// Runs an attempt in a pod, to its end.
pub async fn run(
    shared: Arc<Shared>,
    k: Arc<Launcher>,
    l: Lease,
    mut release: watch::Receiver<bool>,
) -> Outcome {
    let prefix = format!(
        "[{} run {} attempt {}]",
        l.pipeline, l.run, l.attempt_number
    );
    let Some(image) = l.image.clone().or_else(|| k.options.pod_image.clone()) else {
        let why = format!(
            "version {} of {} has no image to run in: register it with `orca push --register` \
             or `orca register --image`, or give the launcher --pod-image",
            l.version.0, l.pipeline
        );
        println!("{prefix} {why}");
        return attempt::report(&shared, &l, false, Some(why)).await;
    };
    let spec = render(&l, &image, &k.options, &k.runner, k.grace_seconds);
    let made = serde_json::from_value::<Pod>(spec).and_then(|pod| {
        serde_json::from_value::<Secret>(render_secret(&l)).map(|secret| (pod, secret))
    });
    let (pod, secret) = match made {
        Ok(p) => p,
        Err(e) => return attempt::report(&shared, &l, false, Some(format!("pod spec: {e}"))).await,
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    // The cluster may refuse either (quota, admission): the attempt is
    // handed back, so another runner or a later try makes it, without a
    // retry spent.
    let refused = |what: &str, e: kube::Error| {
        let why = format!("creating {what} {name} in namespace {}: {e}", k.namespace);
        println!("{prefix} {why}");
        why
    };
    let created = match k.secrets.create(&PostParams::default(), &secret).await {
        Err(e) => Err(refused("secret", e)),
        Ok(_) => match k.pods.create(&PostParams::default(), &pod).await {
            Err(e) => {
                delete_secret(&k, &name, &prefix).await;
                Err(refused("pod", e))
            }
            Ok(made) => Ok(made),
        },
    };
    let made = match created {
        Ok(p) => p,
        Err(why) => {
            return match control::release(&shared.db, l.lease, &why).await {
                Ok(()) => Outcome::Released,
                Err(e) => Outcome::Unreported(e.to_string()),
            }
        }
    };
    // The Secret belongs to its pod: deleted with it by the cluster's
    // garbage collector, should this runner not live to delete it.
    if let Some(uid) = made.metadata.uid {
        let owner = json!({"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}
        ]}});
        if let Err(e) = k
            .secrets
            .patch(&name, &PatchParams::default(), &Patch::Merge(&owner))
            .await
        {
            eprintln!("{prefix} giving secret {name} to its pod: {e}");
        }
    }
    println!("{prefix} pod {name} created ({image})");
    let outcome = follow(&shared, &k, &l, &name, &prefix, &mut release).await;
    // The lease is done with, whatever became of the pod.
    delete_secret(&k, &name, &prefix).await;
    outcome
}

/// Follows an attempt's pod to its end: keeps the lease while it waits or
/// runs, and reports what its runner could not.
async fn follow(
    shared: &Arc<Shared>,
    k: &Launcher,
    l: &Lease,
    name: &str,
    prefix: &str,
    release: &mut watch::Receiver<bool>,
) -> Outcome {
    let ttl = (l.deadline - chrono::Utc::now())
        .to_std()
        .unwrap_or(Duration::from_secs(1));
    let mut beat = tokio::time::interval((ttl / 3).max(attempt::HEARTBEAT_MIN));
    beat.tick().await;
    let mut poll = tokio::time::interval(POLL);
    let mut reported: Option<String> = None;
    let mut reported_at = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = beat.tick(), if reported.is_none() => match control::heartbeat(&shared.db, l.lease).await {
                Ok(_) => {}
                // The pod's runner reported the attempt (or the control plane
                // took it away): the pod is left to exit.
                Err(ControlError::Fenced { message, .. }) => {
                    reported = Some(message);
                    reported_at = tokio::time::Instant::now();
                }
                Err(e) => eprintln!("{prefix} heartbeat failed: {e}"),
            },
            _ = poll.tick() => {
                let pod = match k.pods.get(name).await {
                    Ok(p) => p,
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        let why = format!("pod {name} was deleted by someone else");
                        return end(shared, l, reported, Some(why), None, prefix).await;
                    }
                    Err(e) => {
                        eprintln!("{prefix} reading pod {name}: {e}");
                        continue;
                    }
                };
                match state(&pod) {
                    PodState::Going if reported.is_some() && reported_at.elapsed() > EXIT_WAIT => {
                        delete(k, name, prefix).await;
                        return Outcome::InPod(reported.unwrap_or_default());
                    }
                    PodState::Going => {}
                    PodState::Exited { code, reason, message } => {
                        let failed = code != 0;
                        if !failed || !k.options.keep_failed_pods {
                            delete(k, name, prefix).await;
                        }
                        let memory = reason == "OOMKilled";
                        let why = if memory {
                            let limit = l
                                .resources
                                .and_then(|r| r.memory_bytes)
                                .map(orca_core::resources::show_bytes)
                                .unwrap_or_else(|| "no declared size".into());
                            format!("killed for memory: pod {name} was OOMKilled (exit {code}) at its limit of {limit}")
                        } else {
                            format!("pod {name}: its container exited with {code} ({reason}) {message}").trim_end().to_string()
                        };
                        let killed = memory.then_some(orca_core::api::KILLED_FOR_MEMORY);
                        return end(shared, l, reported, Some(why), killed, prefix).await;
                    }
                    PodState::Broken(why) => {
                        if !k.options.keep_failed_pods {
                            delete(k, name, prefix).await;
                        }
                        let why = format!("pod {name} cannot start: {why}");
                        return end(shared, l, reported, Some(why), None, prefix).await;
                    }
                    PodState::Evicted(why) => {
                        delete(k, name, prefix).await;
                        let why = format!("pod {name} was taken away by the cluster: {why}");
                        println!("{prefix} {why}");
                        if reported.is_some() {
                            return Outcome::InPod(why);
                        }
                        return match control::release(&shared.db, l.lease, &why).await {
                            Ok(()) => Outcome::Released,
                            Err(e) => Outcome::Unreported(e.to_string()),
                        };
                    }
                }
            }
            changed = release.changed() => {
                if changed.is_err() || *release.borrow() {
                    // The pod's runner gets SIGTERM and hands the attempt
                    // back itself after its grace period.
                    println!("{prefix} runner stopping: deleting pod {name}");
                    delete(k, name, prefix).await;
                    return Outcome::Released;
                }
            }
        }
    }
}

async fn delete_secret(k: &Launcher, name: &str, prefix: &str) {
    match k.secrets.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => eprintln!("{prefix} deleting secret {name}: {e}"),
    }
}

async fn delete(k: &Launcher, name: &str, prefix: &str) {
    if let Err(e) = k.pods.delete(name, &DeleteParams::default()).await {
        eprintln!("{prefix} deleting pod {name}: {e}");
    }
}

/// The end of a pod: nothing to report when its runner reported; else the
/// failure its state says.
async fn end(
    shared: &Shared,
    l: &Lease,
    reported: Option<String>,
    why: Option<String>,
    killed_for: Option<&str>,
    prefix: &str,
) -> Outcome {
    if let Some(how) = reported {
        return Outcome::InPod(how);
    }
    if let Some(w) = &why {
        println!("{prefix} {w}");
    }
    attempt::report_why(shared, l, false, why, killed_for).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use orca_core::api::{AttemptId, AttemptSize, Command, LeaseToken, RunId, VersionId};

    fn lease() -> Lease {
        Lease {
            attempt: AttemptId(42),
            run: RunId(7),
            lease: "00000000-0000-0000-0000-00000000002a"
                .parse::<LeaseToken>()
                .expect("token"),
            pipeline: "probe_memory".into(),
            version: VersionId(3),
            binary_path: "/opt/orca/pipelines/probe_memory".into(),
            partitions: vec!["2024-01".into()],
            attempt_number: 2,
            deadline: chrono::Utc::now(),
            registry_hash: "h".into(),
            pool: "gpu".into(),
            org: "Acme Corp".into(),
            command: Command::Attempt,
            binary_sha256: None,
            resources: Some(AttemptSize {
                cpu_millis: Some(500),
                memory_bytes: Some(384 << 20),
            }),
            image: Some("registry.example.com/acme/pipelines@sha256:00".into()),
        }
    }

    #[test]
    fn a_pod_is_sized_labelled_and_placed_as_the_pool_says() {
        let o = PodOptions {
            pod_namespace: None,
            pod_image: None,
            pod_env_secret: Some("orca-runner-env".into()),
            pod_node_selector: node_selector("pool=gpu,zone=a").ok(),
            pod_tolerations: tolerations(
                r#"[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]"#,
            )
            .ok(),
            pod_service_account: Some("orca-attempt".into()),
            keep_failed_pods: false,
        };
        let p = render(&lease(), "img", &o, "launcher-1", 30);
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        assert_eq!(name, "orca-acme-corp-probe-memory-r7-a2-42");
        let labels = &p["metadata"]["labels"];
        assert_eq!(labels["orca.dev/org"], "Acme_Corp");
        assert_eq!(labels["orca.dev/run"], "7");
        assert_eq!(labels["orca.dev/attempt"], "42");
        assert_eq!(labels["orca.dev/try"], "2");
        let c = &p["spec"]["containers"][0];
        assert_eq!(c["resources"]["limits"]["memory"], "384Mi");
        assert_eq!(c["resources"]["requests"]["cpu"], "500m");
        assert_eq!(c["args"][0], "--one-attempt");
        assert_eq!(c["envFrom"][0]["secretRef"]["name"], "orca-runner-env");
        assert_eq!(p["spec"]["nodeSelector"]["pool"], "gpu");
        assert_eq!(p["spec"]["tolerations"][0]["key"], "gpu");
        assert_eq!(p["spec"]["restartPolicy"], "Never");
        // It parses as a Pod, as the API server will read it.
        assert!(serde_json::from_value::<Pod>(p).is_ok());
        assert!(node_selector("pool").is_err());
        assert!(tolerations(r#"{"key": "gpu"}"#).is_err());
        assert!(tolerations(r#"[{"tolerationSeconds": "soon"}]"#).is_err());
    }

    fn pod(status: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).expect("pod")
    }

    #[test]
    fn a_pod_s_state_says_how_its_attempt_ended() {
        let oom = pod(
            json!({"phase": "Failed", "containerStatuses": [{"name": "attempt", "image": "i",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}),
        );
        assert_eq!(
            state(&oom),
            PodState::Exited {
                code: 137,
                reason: "OOMKilled".into(),
                message: String::new()
            }
        );
        let pull = pod(
            json!({"phase": "Pending", "containerStatuses": [{"name": "attempt", "image": "i",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]}),
        );
        assert!(matches!(state(&pull), PodState::Broken(w) if w.contains("ImagePullBackOff")));
        let evicted =
            pod(json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}));
        assert!(matches!(state(&evicted), PodState::Evicted(w) if w.contains("low on memory")));
        assert_eq!(state(&pod(json!({"phase": "Pending"}))), PodState::Going);
    }
}
