//! The Helm chart (deploy/helm/orca), rendered and read as a cluster would
//! take it. helm itself cannot be installed here (neither Debian, PyPI nor
//! npm has it), so tests/py/helm_render.py stands in for `helm template`:
//! the part of Go templates and Helm's functions the chart uses, refusing
//! anything else. The KEDA query the chart renders is run against the
//! control plane.

use std::process::Command;

use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

/// The rendered documents: (template, document).
fn render(values: &Value) -> Result<Vec<(String, Value)>, String> {
    let out = Command::new(orca_tests::s3::python())
        .arg(repo_root().join("tests/py/helm_render.py"))
        .arg(repo_root().join("deploy/helm/orca"))
        .args([
            "--release",
            "acme",
            "--json",
            "--set-json",
            &values.to_string(),
        ])
        .output()
        .expect("run helm_render.py");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).to_string());
    }
    let docs: Vec<Value> = serde_json::from_slice(&out.stdout).expect("rendered JSON");
    Ok(docs
        .into_iter()
        .map(|d| {
            (
                d["template"].as_str().unwrap_or_default().to_string(),
                d["doc"].clone(),
            )
        })
        .collect())
}

fn find<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn runner(name: &str, pool: &str, launcher: &str, keda: bool) -> Value {
    json!({"name": name, "pool": pool, "org": "acme", "slots": 4, "replicas": 1,
           "launcher": launcher, "secret": format!("orca-runner-{name}"), "image": "",
           "graceSeconds": 30, "nodeSelector": {"orca.dev/pool": pool},
           "tolerations": [{"key": "orca", "operator": "Exists", "effect": "NoSchedule"}],
           "resources": {"requests": {"cpu": "250m"}},
           "keda": {"enabled": keda, "minReplicas": 0, "maxReplicas": 8}})
}

#[test]
fn the_default_chart_is_orca_serve_and_one_runner_with_no_rights() {
    let docs = render(&json!({})).expect("render");
    for (t, d) in &docs {
        assert!(
            d["apiVersion"].is_string()
                && d["kind"].is_string()
                && d["metadata"]["name"].is_string(),
            "{t}: not an object a cluster takes: {d}"
        );
    }
    let kinds: Vec<String> = docs
        .iter()
        .map(|(_, d)| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or(""),
                d["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "Deployment/acme-runner-default",
            "Deployment/acme-serve",
            "Service/acme-serve"
        ],
        "no RBAC and no scaler unless asked"
    );
    let serve = find(&docs, "Deployment", "acme-serve").expect("serve");
    let c = &serve["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["command"], json!(["/usr/bin/orca", "serve"]));
    assert_eq!(c["envFrom"][0]["secretRef"]["name"], "orca-serve");
    let r = find(&docs, "Deployment", "acme-runner-default").expect("runner");
    let spec = &r["spec"]["template"]["spec"];
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["terminationGracePeriodSeconds"], 45);
    // The selector picks the pods the template makes.
    let selector = r["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector");
    for (k, v) in selector {
        assert_eq!(&r["spec"]["template"]["metadata"]["labels"][k], v, "{k}");
    }
}

#[tokio::test]
async fn a_pod_launcher_gets_only_pod_rights_and_keda_scales_on_the_pool_backlog() {
    let values = json!({"runners": [
        runner("batch", "batch", "process", false),
        runner("gpu", "gpu", "kubernetes", true),
    ]});
    let docs = render(&values).expect("render");
    let role = find(&docs, "Role", "acme-launcher").expect("the launcher's role");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "patch", "delete"]}
        ])
    );
    let binding = find(&docs, "RoleBinding", "acme-launcher").expect("binding");
    assert_eq!(binding["subjects"][0]["name"], "acme-launcher");
    assert!(find(&docs, "ServiceAccount", "acme-launcher").is_some());
    let gpu = find(&docs, "Deployment", "acme-runner-gpu").expect("gpu runners");
    let spec = &gpu["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "acme-launcher");
    assert_eq!(spec["nodeSelector"]["orca.dev/pool"], "gpu");
    assert_eq!(spec["tolerations"][0]["key"], "orca");
    let env = spec["containers"][0]["env"].as_array().expect("env");
    let var = |k: &str| {
        env.iter()
            .find(|e| e["name"] == k)
            .map(|e| e["value"].clone())
    };
    assert_eq!(var("ORCA_LAUNCHER"), Some(json!("kubernetes")));
    assert_eq!(var("ORCA_POD_ENV_SECRET"), Some(json!("orca-runner-gpu")));
    assert_eq!(var("ORCA_POOL"), Some(json!("gpu")));
    // The process runners get no service account token at all.
    let batch = find(&docs, "Deployment", "acme-runner-batch").expect("batch runners");
    assert_eq!(
        batch["spec"]["template"]["spec"]["automountServiceAccountToken"],
        false
    );
    assert!(find(&docs, "ScaledObject", "acme-runner-batch").is_none());

    // KEDA: the gpu runners scale on the backlog of their pool, a runner
    // per four slots' worth; the query is one the control plane answers.
    let scaled = find(&docs, "ScaledObject", "acme-runner-gpu").expect("scaled object");
    assert_eq!(scaled["spec"]["scaleTargetRef"]["name"], "acme-runner-gpu");
    assert_eq!(scaled["spec"]["minReplicaCount"], 0);
    let trigger = &scaled["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "postgresql");
    assert_eq!(trigger["metadata"]["targetQueryValue"], "4");
    assert!(find(&docs, "TriggerAuthentication", "acme-keda").is_some());
    let query = trigger["metadata"]["query"]
        .as_str()
        .expect("query")
        .to_string();
    let db = TestDb::new().await;
    db.pool
        .execute("SELECT orca.create_runner_token('gpu', 'gpu-1')")
        .await
        .expect("a token of the pool");
    let backlog: i64 = sqlx::query_scalar(&query)
        .fetch_one(&db.pool)
        .await
        .unwrap_or_else(|e| panic!("{query}: {e}"));
    assert_eq!(backlog, 0);
}

#[test]
fn the_stand_in_for_helm_refuses_what_it_does_not_render() {
    let dir = scratch("helm-chart");
    let chart = dir.join("orca");
    let copy = Command::new("cp")
        .arg("-r")
        .arg(repo_root().join("deploy/helm/orca"))
        .arg(&chart)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(copy);
    std::fs::write(
        chart.join("templates/extra.yaml"),
        "metadata:\n  name: {{ include \"orca.fullname\" . }}\n",
    )
    .expect("template");
    let out = Command::new(orca_tests::s3::python())
        .arg(repo_root().join("tests/py/helm_render.py"))
        .arg(&chart)
        .output()
        .expect("run helm_render.py");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("include"));
    let _ = std::fs::remove_dir_all(&dir);
}
