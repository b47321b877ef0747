//! The sweep from outside: every operation `orca serve`'s OpenAPI document
//! lists, called by each of org acme's API keys (viewer, operator, admin)
//! with org globex's ids and names, through a real server. An operation
//! added without a case here fails the test by name, and so does a string
//! query parameter a case does not fill. No answer holds globex's rows, no
//! call answers with a server error, and globex's rows are unchanged.

use std::collections::{BTreeMap, BTreeSet};

use orca_tests::serve::{api_key, serve_with};

use super::*;

/// Each operation ("METHOD /path" as the document writes it) with the calls
/// it is tried with: a path (with its query) and a body. {B_RUN},
/// {B_FAILED}, {B_HOOK}, {B_INCIDENT} and {KEY} (the caller's own key) are filled in.
fn http_cases() -> BTreeMap<&'static str, Vec<(&'static str, Option<Value>)>> {
    let partitions = || Some(json!({"partitions": "2024-01"}));
    [
        ("GET /healthz", vec![("/healthz", None)]),
        ("GET /session", vec![("/session", None)]),
        (
            "POST /session",
            vec![("/session", Some(json!({"key": "{KEY}"})))],
        ),
        ("DELETE /session", vec![("/session", None)]),
        ("GET /pipelines", vec![("/pipelines", None)]),
        (
            "GET /pipelines/{name}",
            vec![("/pipelines/globex_only", None)],
        ),
        (
            "POST /pipelines/{name}/runs",
            vec![("/pipelines/globex_only/runs", partitions())],
        ),
        (
            "POST /pipelines/{name}/backfill",
            vec![("/pipelines/globex_only/backfill", partitions())],
        ),
        (
            "GET /runs",
            vec![
                ("/runs", None),
                (
                    "/runs?pipeline=globex_only&status=failed&trigger=backfill&partition=2024-01\
                     &since=2000-01-01T00:00:00Z&until=2100-01-01T00:00:00Z",
                    None,
                ),
            ],
        ),
        ("GET /runs/{id}", vec![("/runs/{B_RUN}", None)]),
        (
            "POST /runs/{id}/cancel",
            vec![("/runs/{B_RUN}/cancel", None)],
        ),
        (
            "POST /runs/{id}/retry",
            vec![("/runs/{B_FAILED}/retry", None)],
        ),
        ("GET /runs/{id}/log", vec![("/runs/{B_RUN}/log", None)]),
        (
            "GET /runs/{id}/log/stream",
            vec![("/runs/{B_RUN}/log/stream", None)],
        ),
        ("GET /syncs", vec![("/syncs", None)]),
        (
            "POST /syncs/{name}/pause",
            vec![("/syncs/globex_sync/pause", None)],
        ),
        (
            "POST /syncs/{name}/resume",
            vec![("/syncs/globex_sync/resume", None)],
        ),
        (
            "POST /syncs/{name}/scale",
            vec![("/syncs/globex_sync/scale", Some(json!({"lanes": 2})))],
        ),
        (
            "GET /syncs/{name}/epochs",
            vec![("/syncs/globex_sync/epochs", None)],
        ),
        (
            "GET /events",
            vec![
                ("/events", None),
                ("/events?kind=run.created&after=0", None),
            ],
        ),
        ("GET /runners", vec![("/runners", None)]),
        ("GET /datasets", vec![("/datasets", None)]),
        (
            "GET /datasets/{name}",
            vec![
                ("/datasets/globex_only.clean", None),
                ("/datasets/globex_only_lake.events", None),
            ],
        ),
        (
            "POST /datasets/{name}/maintain",
            vec![
                ("/datasets/globex_only.clean/maintain", Some(json!({}))),
                (
                    "/datasets/globex_only_lake.events/maintain",
                    Some(json!({})),
                ),
            ],
        ),
        ("GET /lineage", vec![("/lineage", None)]),
        ("GET /sensors", vec![("/sensors", None)]),
        ("GET /webhooks", vec![("/webhooks", None)]),
        (
            "GET /webhooks/{id}/deliveries",
            vec![("/webhooks/{B_HOOK}/deliveries", None)],
        ),
        ("GET /metrics", vec![("/metrics", None)]),
        (
            "GET /incidents",
            vec![
                ("/incidents", None),
                ("/incidents?open=true&limit=10", None),
            ],
        ),
        (
            "GET /incidents/{id}",
            vec![("/incidents/{B_INCIDENT}", None)],
        ),
        (
            "POST /incidents/{id}/resolve",
            vec![(
                "/incidents/{B_INCIDENT}/resolve",
                Some(json!({"note": "planted"})),
            )],
        ),
    ]
    .into_iter()
    .collect()
}

#[tokio::test]
async fn no_operation_of_the_http_api_returns_or_changes_another_orgs() {
    let db = TestDb::new().await;
    let globex: i64 = {
        db.pool
            .execute("SELECT orca.create_org('acme')")
            .await
            .expect("acme");
        sqlx::query_scalar("SELECT orca.create_org('globex')")
            .fetch_one(&db.pool)
            .await
            .expect("globex")
    };
    populate_org(&db, "acme", "acme_only").await;
    let (b_runs, b_lease, b_failed, _) = populate_org(&db, "globex", "globex_only").await;
    let b_hook = db
        .scalar_i64(&format!(
            "SELECT id FROM orca.webhooks WHERE org_id = {globex}"
        ))
        .await;
    let b_incident = db
        .scalar_i64(&format!(
            "SELECT id FROM orca.incidents WHERE org_id = {globex} AND resolved_at IS NULL LIMIT 1"
        ))
        .await;
    let markers = [
        "\"globex\"".to_string(),
        b_lease.to_string(),
        "/w/globex/".to_string(),
        "globex/globex_sync/_checkpoints".to_string(),
        "hooks.example.com/globex".to_string(),
        "globex_only".to_string(),
        "globex_sync".to_string(),
    ];
    let mut keys = Vec::new();
    for role in ["viewer", "operator", "admin"] {
        keys.push((
            role,
            api_key(&db, "acme", &format!("http-{role}"), role).await,
        ));
    }
    // Without its webhook relay: globex's failing endpoint would be retried
    // in the background and change globex's deliveries while acme sweeps.
    let server = serve_with(&db, &["--no-relay"]).await;
    let doc: Value = reqwest::get(format!("{}/api/v1/openapi.json", server.base))
        .await
        .expect("the document")
        .json()
        .await
        .expect("JSON");
    let cases = http_cases();
    let mut listed = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        let path = path.strip_prefix("/api/v1").unwrap_or(path);
        for (method, op) in item.as_object().into_iter().flatten() {
            let key = format!("{} {path}", method.to_uppercase());
            let Some(calls) = cases.get(key.as_str()) else {
                listed.insert(key);
                continue;
            };
            // Every string query parameter is filled by some call: a
            // filter by name is where another org's names would get in.
            for p in op["parameters"].as_array().into_iter().flatten() {
                let named = p["name"].as_str().unwrap_or_default();
                if p["in"] == "query" && p["schema"]["type"] == "string" {
                    assert!(
                        calls.iter().any(|(c, _)| c.contains(&format!("{named}="))),
                        "{key}: no case fills its query parameter {named}"
                    );
                }
            }
        }
    }
    assert!(
        listed.is_empty(),
        "operations of the API without a case in the HTTP sweep: {listed:?}"
    );
    let before = org_snapshot(&db, globex).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client");
    for (role, key) in &keys {
        for (op, calls) in &cases {
            let method: reqwest::Method = op
                .split(' ')
                .next()
                .and_then(|m| m.parse().ok())
                .expect("a method");
            for (path, body) in calls {
                let path = path
                    .replace("{B_RUN}", &b_runs[0].to_string())
                    .replace("{B_FAILED}", &b_failed.to_string())
                    .replace("{B_HOOK}", &b_hook.to_string())
                    .replace("{B_INCIDENT}", &b_incident.to_string());
                let mut req = client
                    .request(method.clone(), format!("{}/api/v1{path}", server.base))
                    .bearer_auth(key);
                if let Some(b) = body {
                    let b = b.to_string().replace("{KEY}", key);
                    req = req.header("content-type", "application/json").body(b);
                }
                let resp = req.send().await;
                // A log stream of a run the key cannot see ends at once; one
                // it could see would stay open, and its first bytes suffice.
                let (status, text) = match resp {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let text =
                            match tokio::time::timeout(Duration::from_secs(3), r.text()).await {
                                Ok(t) => t.unwrap_or_default(),
                                Err(_) => String::new(),
                            };
                        (status, text)
                    }
                    Err(e) => panic!("{role} key: {op} {path}: {e}"),
                };
                assert!(status < 500, "{role} key: {op} {path}: {status} {text}");
                for m in &markers {
                    assert!(
                        !text.contains(m.as_str()) || (status >= 400 && m.starts_with("globex_")),
                        "{role} key: {op} {path} answered with globex's {m}: {status} {text}"
                    );
                }
            }
        }
        assert_eq!(
            org_snapshot(&db, globex).await,
            before,
            "acme's {role} key changed globex"
        );
    }
}
