//! `orca serve`'s HTTP API, as a client sees it: a real server process over
//! a test database, called with API keys of two orgs and three roles.

use std::process::{Command, Stdio};

use orca_tests::serve::{api_key, serve};
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

/// One call: its status and JSON body.
async fn call(
    base: &str,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let client = reqwest::Client::new();
    let mut req = client.request(method, format!("{base}/api/v1{path}"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let json = serde_json::from_str(&text).unwrap_or_else(|_| json!({"raw": text}));
    (status, json)
}

async fn get(base: &str, path: &str, key: Option<&str>) -> (u16, Value) {
    call(base, reqwest::Method::GET, path, key, None).await
}

async fn post(base: &str, path: &str, key: &str, body: Value) -> (u16, Value) {
    call(base, reqwest::Method::POST, path, Some(key), Some(body)).await
}

#[tokio::test]
async fn the_api_answers_each_key_within_its_org_and_role() {
    let db = TestDb::new().await;
    db.pool
        .execute("SELECT orca.create_org('acme'), orca.create_org('globex')")
        .await
        .expect("orgs");
    for org in ["acme", "globex"] {
        let mut c = connect_org(&db, "postgres", org).await;
        let mut m = lake_manifest("lake");
        m["max_runs"] = json!(null);
        sqlx::query("SELECT orca.register($1)")
            .bind(&m)
            .execute(&mut c)
            .await
            .expect("register");
    }
    let viewer = api_key(&db, "acme", "dashboard", "viewer").await;
    let operator = api_key(&db, "acme", "deployer", "operator").await;
    let globex = api_key(&db, "globex", "theirs", "operator").await;
    let server = serve(&db).await;
    let base = server.base.as_str();

    // Who may call at all.
    let (status, body) = get(base, "/session", None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, body) = get(base, "/session", Some("orca_ak_forged")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("OR087")),
        "{body}"
    );
    let (status, body) = get(base, "/session", Some(&viewer)).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"org": "acme", "role": "viewer", "key": "dashboard"})
    );

    // A viewer reads, and may not write.
    let (status, body) = get(base, "/pipelines", Some(&viewer)).await;
    assert_eq!(status, 200);
    assert_eq!(body.as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(body[0]["pipeline"], "lake");
    let before = db.scalar_i64("SELECT count(*) FROM orca.runs").await;
    let (status, body) = post(
        base,
        "/pipelines/lake/backfill",
        &viewer,
        json!({"partitions": "2024-01..2024-03"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("42501")),
        "{body}"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.runs").await,
        before
    );

    // An operator queues; bad input is a 400 with the SQLSTATE, and nothing
    // is written.
    let (status, body) = post(
        base,
        "/pipelines/lake/backfill",
        &operator,
        json!({"partitions": "2024-01..2024-03"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let runs: Vec<i64> = body["runs"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    assert_eq!(runs.len(), 3, "{body}");
    for (path, partitions, code, want) in [
        ("/pipelines/lake/backfill", "2024-03..2024-01", "OR021", 400),
        ("/pipelines/lake/runs", "1999-01", "OR022", 400),
        ("/pipelines/nope/backfill", "2024-01", "OR010", 404),
    ] {
        let before = db.scalar_i64("SELECT count(*) FROM orca.runs").await;
        let (status, body) = post(base, path, &operator, json!({"partitions": partitions})).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (want, Some(code)),
            "{path} {partitions}: {body}"
        );
        assert!(body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert_eq!(
            db.scalar_i64("SELECT count(*) FROM orca.runs").await,
            before
        );
    }
    let (status, body) = post(
        base,
        "/pipelines/lake/backfill",
        &operator,
        json!({"range": 1}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{body}"
    );
    // Pages of runs, newest first, by cursor; filters.
    let (status, page) = get(base, "/runs?limit=2", Some(&viewer)).await;
    assert_eq!(status, 200);
    let ids = |p: &Value| -> Vec<i64> {
        p["items"]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["run"].as_i64()).collect())
            .unwrap_or_default()
    };
    let mut want = runs.clone();
    want.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(ids(&page), want[..2]);
    let cursor = page["next_cursor"].as_i64().expect("a next page");
    let (_, rest) = get(
        base,
        &format!("/runs?limit=2&cursor={cursor}"),
        Some(&viewer),
    )
    .await;
    assert_eq!(ids(&rest), want[2..]);
    assert!(rest.get("next_cursor").is_none(), "{rest}");
    let (_, feb) = get(base, "/runs?partition=2024-02", Some(&viewer)).await;
    assert_eq!(ids(&feb).len(), 1, "{feb}");
    let status = feb["items"][0]["status"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let (_, same) = get(
        base,
        &format!("/runs?partition=2024-02&status={status}"),
        Some(&viewer),
    )
    .await;
    assert_eq!(ids(&same), ids(&feb));
    let (_, none) = get(base, "/runs?partition=2024-02&status=failed", Some(&viewer)).await;
    assert_eq!(ids(&none).len(), 0, "{none}");
    let (status, body) = get(base, "/runs?limit=100000", Some(&viewer)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );

    // A run in full; cancel and retry.
    let one = runs[0];
    let (status, detail) = get(base, &format!("/runs/{one}"), Some(&viewer)).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["pipeline"], "lake");
    assert!(
        detail["steps"].as_array().is_some_and(|s| !s.is_empty()),
        "{detail}"
    );
    assert!(
        detail["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["kind"] == "run.queued")),
        "{detail}"
    );
    let (status, body) = post(base, &format!("/runs/{one}/cancel"), &operator, json!({})).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "{body}"
    );
    let (status, body) = post(base, &format!("/runs/{one}/retry"), &operator, json!({})).await;
    assert_eq!(status, 200, "{body}");

    // Runs of several months: per_run, and a bad one refused with its code.
    let (status, body) = post(
        base,
        "/pipelines/lake/backfill",
        &operator,
        json!({"partitions": "2024-04..2024-08", "per_run": 3}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let multi: Vec<i64> = body["runs"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    assert_eq!(
        db.strings(&format!(
            "SELECT array_to_string(partitions, ',') FROM orca.runs WHERE id IN ({}) ORDER BY id",
            multi
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ))
        .await,
        ["2024-04,2024-05,2024-06", "2024-07,2024-08"]
    );
    let before = db.scalar_i64("SELECT count(*) FROM orca.runs").await;
    let (status, body) = post(
        base,
        "/pipelines/lake/backfill",
        &operator,
        json!({"partitions": "2024-09", "per_run": 0}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("OR110")),
        "{body}"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.runs").await,
        before
    );
    let (status, body) = get(base, "/pipelines/lake", Some(&viewer)).await;
    assert_eq!(status, 200);
    assert_eq!(body["backfill_per_run"], Value::Null, "{body}");

    // Another org's key sees none of it, and reaches none of it.
    let (_, theirs) = get(base, "/runs", Some(&globex)).await;
    assert_eq!(ids(&theirs), Vec::<i64>::new(), "{theirs}");
    let (status, body) = get(base, &format!("/runs/{one}"), Some(&globex)).await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = post(
        base,
        &format!("/runs/{}/cancel", runs[1]),
        &globex,
        json!({}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM orca.runs WHERE id = {} AND status <> 'cancelled'",
            runs[1]
        ))
        .await,
        1,
        "globex's key cancelled acme's run"
    );

    // Events follow by id; a revoked key is refused at once.
    let (status, events) = get(base, "/events?limit=500", Some(&viewer)).await;
    assert_eq!(status, 200);
    assert!(events["items"]
        .as_array()
        .is_some_and(|e| e.iter().all(|e| e["kind"].is_string())));
    let mut acme = connect_org(&db, "postgres", "acme").await;
    acme.execute("SELECT orca.revoke_api_key('dashboard')")
        .await
        .expect("revoke");
    let (status, body) = get(base, "/pipelines", Some(&viewer)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("OR087")),
        "{body}"
    );
    let (status, body) = get(base, "/nowhere", Some(&operator)).await;
    assert_eq!(status, 404, "{body}");
    drop(server);
}

/// `/metrics` as a scraper reads it, through Prometheus' own parser.
fn parse_metrics(text: &str) -> Vec<Value> {
    use std::io::Write;
    let mut child = Command::new(orca_tests::s3::python())
        .arg(repo_root().join("tests/py/parse_metrics.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("parse");
    assert!(
        out.status.success(),
        "prometheus_client refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a sample"))
        .collect()
}

fn sample(samples: &[Value], name: &str, labels: Value) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s["name"] == name
                && labels
                    .as_object()
                    .is_some_and(|want| want.iter().all(|(k, v)| &s["labels"][k] == v))
        })
        .and_then(|s| s["value"].as_f64())
}

#[tokio::test]
async fn metrics_are_the_keys_orgs_in_prometheus_text() {
    let db = TestDb::new().await;
    db.pool
        .execute("SELECT orca.create_org('acme'), orca.create_org('globex')")
        .await
        .expect("orgs");
    for (org, months) in [("acme", "2024-01..2024-03"), ("globex", "2024-01..2024-05")] {
        let mut c = connect_org(&db, "postgres", org).await;
        let mut m = lake_manifest("lake");
        m["max_runs"] = json!(null);
        sqlx::query("SELECT orca.register($1)")
            .bind(&m)
            .execute(&mut c)
            .await
            .expect("register");
        sqlx::query("SELECT orca.backfill('lake', $1)")
            .bind(months)
            .execute(&mut c)
            .await
            .expect("backfill");
        c.execute("SELECT orca.tick()").await.expect("tick");
    }
    // acme: one attempt leased, two waiting.
    let mut c = connect_org(&db, "postgres", "acme").await;
    c.execute("SELECT orca.register_runner('r1', 'default', 2, 'host')")
        .await
        .expect("runner");
    assert_eq!(claim(&mut c, "r1", 1).await.len(), 1);
    let viewer = api_key(&db, "acme", "prometheus", "viewer").await;
    let server = serve(&db).await;

    let client = reqwest::Client::new();
    let url = format!("{}/metrics", server.base);
    let resp = client.get(&url).send().await.expect("scrape");
    assert_eq!(resp.status().as_u16(), 401, "no key, no metrics");
    let resp = client
        .get(&url)
        .bearer_auth(&viewer)
        .send()
        .await
        .expect("scrape");
    assert_eq!(resp.status().as_u16(), 200);
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let text = resp.text().await.expect("body");
    let samples = parse_metrics(&text);

    let runs = |status: &str| {
        sample(
            &samples,
            "orca_runs",
            json!({"pipeline": "lake", "kind": "pipeline", "status": status}),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(
        runs("running") + runs("queued"),
        3.0,
        "acme's three runs, not globex's five:\n{text}"
    );
    assert_eq!(
        sample(&samples, "orca_queue_depth", json!({"pool": "default"})),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&samples, "orca_leases", json!({"pool": "default"})),
        Some(1.0),
        "{text}"
    );
    let oldest = sample(
        &samples,
        "orca_queue_oldest_seconds",
        json!({"pool": "default"}),
    )
    .expect("the oldest queued age");
    assert!((0.0..600.0).contains(&oldest), "{oldest}");
    assert_eq!(
        sample(&samples, "orca_runner_slots", json!({"pool": "default"})),
        Some(2.0),
        "{text}"
    );
    assert!(
        samples
            .iter()
            .all(|s| s["type"] == "gauge" || s["type"] == "counter"),
        "{samples:?}"
    );

    // The lease lapses, and a counter counts it.
    let t: Value = sqlx::query_scalar("SELECT orca.tick(now() + interval '1 hour')")
        .fetch_one(&mut c)
        .await
        .expect("tick");
    assert_eq!(t["attempts_lost"], json!(1), "{t}");
    let text = client
        .get(&url)
        .bearer_auth(&viewer)
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    let samples = parse_metrics(&text);
    assert_eq!(
        sample(&samples, "orca_leases_lapsed_total", json!({})),
        Some(1.0),
        "{text}"
    );
    drop(server);
}

#[tokio::test]
async fn datasets_lineage_and_sensors_are_the_keys_orgs() {
    let db = TestDb::new().await;
    db.pool
        .execute("SELECT orca.create_org('acme'), orca.create_org('globex')")
        .await
        .expect("orgs");
    let mut c = connect_org(&db, "postgres", "acme").await;
    let mut m = lake_manifest("lake");
    m["max_runs"] = json!(null);
    m["steps"][0]["reads"] = json!(["lake.raw"]);
    m["steps"][0]["writes"] = json!(["lake.clean"]);
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut c)
        .await
        .expect("register");
    let watch = json!({
        "name": "watch",
        "steps": [{"name": "watch", "kind": "mapped", "reads": ["lake.clean"]}],
        "partitions": {"monthly": "2024-01"},
        "sensor": true,
        "pool": "sensing",
        "registry_hash": "watch",
        "binary": "/bin/true"
    });
    sqlx::query("SELECT orca.register($1)")
        .bind(&watch)
        .execute(&mut c)
        .await
        .expect("register the sensor");
    sqlx::query("SELECT orca.run('lake', '2024-03')")
        .execute(&mut c)
        .await
        .expect("run");
    c.execute("SELECT orca.tick()").await.expect("tick");
    let lease = claim(&mut c, "r1", 1).await.remove(0);
    sqlx::query("SELECT orca.pin_read($1, 'one', '2024-03', 'lake.raw', 7)")
        .bind(lease.lease)
        .execute(&mut c)
        .await
        .expect("pin");
    sqlx::query("SELECT orca.record_commit($1, 'one', '2024-03', 'lake.clean', 8, 1)")
        .bind(lease.lease)
        .execute(&mut c)
        .await
        .expect("commit");
    let viewer = api_key(&db, "acme", "looker", "viewer").await;
    let theirs = api_key(&db, "globex", "theirs", "viewer").await;
    let server = serve(&db).await;
    let base = server.base.as_str();

    let (status, body) = get(base, "/datasets", Some(&viewer)).await;
    assert_eq!(status, 200, "{body}");
    let clean = body
        .as_array()
        .and_then(|a| a.iter().find(|d| d["dataset"] == "lake.clean"))
        .unwrap_or_else(|| panic!("lake.clean: {body}"))
        .clone();
    assert_eq!(clean["writers"], json!(["lake"]), "{clean}");
    assert_eq!(clean["readers"], json!(["watch"]), "{clean}");
    assert_eq!(
        (clean["commits"].as_i64(), clean["last_snapshot"].as_i64()),
        (Some(1), Some(8))
    );

    let (status, detail) = get(base, "/datasets/lake.clean", Some(&viewer)).await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["snapshots"][0]["snapshot"], 8, "{detail}");
    assert_eq!(detail["snapshots"][0]["run"], lease.run, "{detail}");
    let up = detail["lineage"]
        .as_array()
        .and_then(|l| l.iter().find(|r| r["direction"] == "upstream"))
        .unwrap_or_else(|| panic!("lake.clean's upstream: {detail}"));
    assert_eq!(
        (up["related"].as_str(), up["read_snapshot"].as_i64()),
        (Some("lake.raw"), Some(7))
    );
    let (status, body) = get(base, "/datasets/lake.nothing", Some(&viewer)).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = get(base, "/datasets/Not%20a%20name", Some(&viewer)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("OR050")),
        "{body}"
    );

    let (status, graph) = get(base, "/lineage", Some(&viewer)).await;
    assert_eq!(status, 200, "{graph}");
    let edges = graph["edges"].as_array().cloned().unwrap_or_default();
    let edge = |from: &str, to: &str| {
        edges
            .iter()
            .find(|e| e["from"] == from && e["to"] == to)
            .cloned()
    };
    assert_eq!(
        edge("lake", "lake.clean").map(|e| e["recorded"].clone()),
        Some(json!(true))
    );
    assert_eq!(
        edge("lake.raw", "lake").map(|e| e["recorded"].clone()),
        Some(json!(true))
    );
    assert_eq!(
        edge("lake.clean", "watch").map(|e| e["recorded"].clone()),
        Some(json!(false))
    );
    assert_eq!(
        graph["datasets"],
        json!(["lake.clean", "lake.raw"]),
        "{graph}"
    );

    // The run shows what it read and committed.
    let (status, run) = get(base, &format!("/runs/{}", lease.run), Some(&viewer)).await;
    assert_eq!(status, 200, "{run}");
    let roles: Vec<(String, String, i64)> = run["snapshots"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x["role"].as_str().unwrap_or_default().to_string(),
                        x["dataset"].as_str().unwrap_or_default().to_string(),
                        x["snapshot"].as_i64().unwrap_or(-1),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        roles,
        [
            ("read".to_string(), "lake.raw".to_string(), 7),
            ("committed".to_string(), "lake.clean".to_string(), 8)
        ],
        "{run}"
    );
    let (status, sensors) = get(base, "/sensors", Some(&viewer)).await;
    assert_eq!(status, 200, "{sensors}");
    assert_eq!(sensors[0]["pipeline"], "watch", "{sensors}");
    assert!(sensors[0]["commit_cursor"].is_i64(), "{sensors}");

    // Another org's key sees none of it.
    for path in ["/datasets", "/sensors"] {
        let (status, body) = get(base, path, Some(&theirs)).await;
        assert_eq!((status, body.clone()), (200, json!([])), "{path}");
    }
    let (status, _) = get(base, "/datasets/lake.clean", Some(&theirs)).await;
    assert_eq!(status, 404);
    let (_, graph) = get(base, "/lineage", Some(&theirs)).await;
    assert_eq!(graph["edges"], json!([]), "{graph}");

    // Maintenance: an operator queues a run of a dataset (the one queued
    // already comes back), which its page then lists; a viewer may not, bad
    // options are a 400 naming them, and another org's key finds no dataset
    // of that name to maintain.
    let operator = api_key(&db, "acme", "ops", "operator").await;
    let (status, body) = post(base, "/datasets/lake.clean/maintain", &viewer, json!({})).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = post(
        base,
        "/datasets/lake.clean/maintain",
        &operator,
        json!({"compact": {"small_mb": "big"}}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("OR042")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("compact.small_mb")),
        "{body}"
    );
    let (status, queued) = post(
        base,
        "/datasets/lake.clean/maintain",
        &operator,
        json!({"orphans": false}),
    )
    .await;
    assert_eq!(status, 200, "{queued}");
    let m_run = queued["run"].as_i64().expect("a run");
    let (_, again) = post(base, "/datasets/lake.clean/maintain", &operator, json!({})).await;
    assert_eq!(again["run"], m_run, "the one queued already: {again}");
    let (status, detail) = get(base, "/datasets/lake.clean", Some(&viewer)).await;
    assert_eq!(status, 200, "{detail}");
    let runs = &detail["maintenance"]["runs"];
    assert_eq!(runs[0]["run"], m_run, "{detail}");
    assert_eq!(runs[0]["pipeline"], "lake", "{detail}");
    assert_eq!(runs[0]["trigger"], "manual", "{detail}");
    assert!(detail["maintenance"]["schedule"].is_null(), "{detail}");
    sqlx::query("SELECT orca.schedule_maintenance('lake.clean', '0 4 * * *')")
        .execute(&mut c)
        .await
        .expect("a schedule");
    let (_, detail) = get(base, "/datasets/lake.clean", Some(&viewer)).await;
    assert_eq!(
        detail["maintenance"]["schedule"]["cron"], "0 4 * * *",
        "{detail}"
    );
    assert_eq!(
        detail["maintenance"]["schedule"]["options"]["compact"]["min_files"], 5,
        "{detail}"
    );
    let their_operator = api_key(&db, "globex", "their-ops", "operator").await;
    let (status, body) = post(
        base,
        "/datasets/lake.clean/maintain",
        &their_operator,
        json!({}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("OR043")),
        "{body}"
    );
    let maintain_runs = db
        .scalar_i64("SELECT count(*) FROM orca.runs WHERE kind = 'maintain'")
        .await;
    assert_eq!(maintain_runs, 1, "only the one run was queued");
    drop(server);
}

#[tokio::test]
async fn a_console_session_is_a_cookie_and_writes_need_its_csrf_token() {
    let db = TestDb::new().await;
    let mut c = connect_org(&db, "postgres", "default").await;
    let mut m = lake_manifest("lake");
    m["max_runs"] = json!(null);
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut c)
        .await
        .expect("register");
    let key = api_key(&db, "default", "browser", "operator").await;
    let server = serve(&db).await;
    let base = server.base.as_str();
    let client = reqwest::Client::new();

    let resp = client
        .post(format!("{base}/api/v1/session"))
        .json(&json!({"key": "orca_ak_forged"}))
        .send()
        .await
        .expect("login");
    assert_eq!(resp.status().as_u16(), 401);
    assert!(resp.headers().get("set-cookie").is_none());

    let resp = client
        .post(format!("{base}/api/v1/session"))
        .json(&json!({"key": key}))
        .send()
        .await
        .expect("login");
    assert_eq!(resp.status().as_u16(), 200);
    let cookies: Vec<String> = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let key_cookie = cookies
        .iter()
        .find(|c| c.starts_with("orca_key="))
        .unwrap_or_else(|| panic!("{cookies:?}"));
    assert!(
        key_cookie.contains("HttpOnly")
            && key_cookie.contains("SameSite=Strict")
            && !key_cookie.contains("Secure"),
        "{key_cookie}"
    );
    // Behind TLS, the cookies are Secure.
    let tls = orca_tests::serve::serve_with(&db, &["--secure-cookies"]).await;
    let resp = client
        .post(format!("{}/api/v1/session", tls.base))
        .json(&json!({"key": key}))
        .send()
        .await
        .expect("login");
    assert!(resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .all(|c| c.ends_with("; Secure")));
    drop(tls);
    let csrf = cookies
        .iter()
        .find_map(|c| c.strip_prefix("orca_csrf="))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("{cookies:?}"))
        .to_string();
    let jar = format!("orca_key={key}; orca_csrf={csrf}");

    // Reads with the cookie alone.
    let who: Value = client
        .get(format!("{base}/api/v1/session"))
        .header("cookie", &jar)
        .send()
        .await
        .expect("whoami")
        .json()
        .await
        .expect("JSON");
    assert_eq!(who["key"], "browser", "{who}");
    // A write without the token (what another site could make a browser
    // send) is refused and writes nothing; with it, it goes through.
    let before = db.scalar_i64("SELECT count(*) FROM orca.runs").await;
    for token in [None, Some("not-the-token")] {
        let mut req = client
            .post(format!("{base}/api/v1/pipelines/lake/runs"))
            .header("cookie", &jar)
            .json(&json!({"partitions": "2024-03"}));
        if let Some(t) = token {
            req = req.header("x-csrf-token", t);
        }
        let resp = req.send().await.expect("a write");
        assert_eq!(resp.status().as_u16(), 403, "{token:?}");
        let body: Value = resp.json().await.expect("JSON");
        assert_eq!(body["error"]["code"], "csrf", "{body}");
    }
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.runs").await,
        before
    );
    let resp = client
        .post(format!("{base}/api/v1/pipelines/lake/runs"))
        .header("cookie", &jar)
        .header("x-csrf-token", &csrf)
        .json(&json!({"partitions": "2024-03"}))
        .send()
        .await
        .expect("a write with the token");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.runs").await,
        before + 1
    );

    // Revoking the key ends the session; logging out clears the cookies.
    c.execute("SELECT orca.revoke_api_key('browser')")
        .await
        .expect("revoke");
    let resp = client
        .get(format!("{base}/api/v1/session"))
        .header("cookie", &jar)
        .send()
        .await
        .expect("whoami");
    assert_eq!(resp.status().as_u16(), 401);
    let resp = client
        .delete(format!("{base}/api/v1/session"))
        .send()
        .await
        .expect("logout");
    assert_eq!(resp.status().as_u16(), 204);
    assert!(resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .all(|c| c.contains("Max-Age=0")));
    // The console itself is served, with a policy that allows no inline code.
    let resp = client
        .get(format!("{base}/console/"))
        .send()
        .await
        .expect("the console");
    assert_eq!(resp.status().as_u16(), 200);
    let policy = resp
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(policy.contains("default-src 'self'"), "{policy}");
    drop(server);
}

/// Syncs are paused, resumed and scaled through the API by an operator of
/// their org; a viewer may only look, another org's key finds no such sync,
/// and bad lanes are refused naming the value.
#[tokio::test]
async fn syncs_are_paused_resumed_and_scaled_by_their_org_s_operators() {
    let db = TestDb::new().await;
    db.pool
        .execute("SELECT orca.create_org('globex')")
        .await
        .expect("org");
    let root = scratch_root();
    sqlx::query("SELECT orca.create_sync('mirror', $1, $2, $3)")
        .bind(json!({"type": "files", "url": format!("{root}/http-sync-in"), "format": "jsonl"}))
        .bind(json!({"type": "parquet", "url": format!("{root}/http-sync-out")}))
        .bind(json!([{"name": "events", "pattern": "*.jsonl"}]))
        .execute(&db.pool)
        .await
        .expect("a sync");
    let operator = api_key(&db, "default", "ops", "operator").await;
    let viewer = api_key(&db, "default", "look", "viewer").await;
    let globex = api_key(&db, "globex", "theirs", "operator").await;
    let server = serve(&db).await;
    let base = server.base.as_str();
    let mirror = |body: &Value| {
        body.as_array()
            .and_then(|a| a.iter().find(|s| s["sync"] == "mirror").cloned())
            .unwrap_or_else(|| panic!("mirror in {body}"))
    };

    let (status, body) = post(base, "/syncs/mirror/scale", &operator, json!({"lanes": 3})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"sync": "mirror", "lanes": 3, "was": 1}));
    let (status, body) = get(base, "/syncs", Some(&viewer)).await;
    assert_eq!(status, 200, "{body}");
    let m = mirror(&body);
    assert_eq!(
        (m["lanes"].clone(), m["paused"].clone(), m["drift"].clone()),
        (json!(3), json!(false), Value::Null)
    );
    let lanes: i64 = sqlx::query_scalar(
        "SELECT (definition->'destination'->>'lanes')::bigint FROM orca.syncs WHERE name = 'mirror'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("lanes");
    assert_eq!(lanes, 3);

    for (body, code, says) in [
        (json!({"lanes": 0}), "OR063", "got 0"),
        (json!({"lanes": 99}), "OR063", "got 99"),
    ] {
        let (status, out) = post(base, "/syncs/mirror/scale", &operator, body).await;
        assert_eq!(
            (status, out["error"]["code"].as_str()),
            (400, Some(code)),
            "{out}"
        );
        assert!(
            out["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(says)),
            "{out}"
        );
    }
    let (status, out) = post(
        base,
        "/syncs/mirror/scale",
        &operator,
        json!({"lanes": "x"}),
    )
    .await;
    assert_eq!(status, 400, "{out}");
    let (status, out) = post(base, "/syncs/nope/scale", &operator, json!({"lanes": 2})).await;
    assert_eq!(
        (status, out["error"]["code"].as_str()),
        (404, Some("OR064")),
        "{out}"
    );

    // Who may: not a viewer, not another org.
    for (key, path, want) in [
        (&viewer, "/syncs/mirror/pause", 403),
        (&viewer, "/syncs/mirror/scale", 403),
        (&globex, "/syncs/mirror/pause", 404),
        (&globex, "/syncs/mirror/resume", 404),
        (&globex, "/syncs/mirror/scale", 404),
    ] {
        let (status, out) = post(base, path, key, json!({"lanes": 2})).await;
        assert_eq!(status, want, "{path}: {out}");
    }

    let (status, body) = post(base, "/syncs/mirror/pause", &operator, json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"sync": "mirror", "paused": true, "run": null}));
    let (_, body) = get(base, "/syncs", Some(&viewer)).await;
    assert_eq!(mirror(&body)["paused"], true);
    let (status, body) = post(base, "/syncs/mirror/resume", &operator, json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"sync": "mirror", "paused": false, "run": null})
    );
    let lanes: i64 = sqlx::query_scalar(
        "SELECT (definition->'destination'->>'lanes')::bigint FROM orca.syncs WHERE name = 'mirror'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("lanes");
    assert_eq!(lanes, 3, "globex's and the viewer's calls changed nothing");
}

#[tokio::test]
async fn incidents_are_listed_shown_with_their_timeline_and_resolved_by_operators() {
    let db = TestDb::new().await;
    db.pool
        .execute("SELECT orca.create_org('acme'), orca.create_org('globex')")
        .await
        .expect("orgs");
    let mut c = connect_org(&db, "postgres", "acme").await;
    // A pipeline that writes lake.clean, read by a second one writing lake.gold.
    for (name, reads, writes) in [
        ("clean", json!([]), json!(["lake.clean"])),
        ("gold", json!(["lake.clean"]), json!(["lake.gold"])),
    ] {
        sqlx::query("SELECT orca.register($1)")
            .bind(json!({
                "name": name,
                "steps": [{"name": "work", "kind": "mapped", "reads": reads, "writes": writes}],
                "partitions": {"monthly": "2024-01"},
                "registry_hash": format!("hash-{name}"),
                "binary": "/bin/true"
            }))
            .execute(&mut c)
            .await
            .expect("register");
    }
    c.execute("SELECT orca.create_playbook('run_failed', 'page')")
        .await
        .expect("playbook");
    // gold's run records that it read lake.clean (lineage), then clean's fails.
    let gold: i64 = sqlx::query_scalar("SELECT orca.run('gold', '2024-01')")
        .fetch_one(&mut c)
        .await
        .expect("run");
    let l = claim(&mut c, "r1", 1).await.remove(0);
    assert_eq!(l.run, gold);
    sqlx::query(
        "SELECT orca.pin_read($1, 'work', '2024-01', 'lake.clean', 3), \
                orca.record_commit($1, 'work', '2024-01', 'lake.gold', 4, 1), orca.finish($1, true)",
    )
    .bind(l.lease)
    .execute(&mut c)
    .await
    .expect("gold");
    let clean: i64 = sqlx::query_scalar("SELECT orca.run('clean', '2024-01')")
        .fetch_one(&mut c)
        .await
        .expect("run");
    let l = claim(&mut c, "r1", 1).await.remove(0);
    assert_eq!(l.run, clean);
    sqlx::query("SELECT orca.finish($1, false, 'the source is gone')")
        .bind(l.lease)
        .execute(&mut c)
        .await
        .expect("fail");
    let viewer = api_key(&db, "acme", "dashboard", "viewer").await;
    let operator = api_key(&db, "acme", "deployer", "operator").await;
    let other = api_key(&db, "globex", "theirs", "admin").await;
    let server = serve(&db).await;

    let (st, open) = get(&server.base, "/incidents?open=true", Some(&viewer)).await;
    assert_eq!(st, 200, "{open}");
    assert_eq!(open.as_array().map(Vec::len), Some(1), "{open}");
    let id = open[0]["id"].as_i64().expect("id");
    assert_eq!(open[0]["kind"], "run_failed");
    assert!(
        open[0]["summary"]
            .as_str()
            .is_some_and(|s| s.contains("the source is gone")),
        "{open}"
    );
    let (st, x) = get(&server.base, &format!("/incidents/{id}"), Some(&viewer)).await;
    assert_eq!(st, 200, "{x}");
    let kinds: Vec<&str> = x["timeline"]
        .as_array()
        .expect("timeline")
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["incident.opened", "incident.page", "incident.action"],
        "{x}"
    );
    let affected: Vec<(&str, i64)> = x["affected"]
        .as_array()
        .expect("affected")
        .iter()
        .map(|a| {
            (
                a["dataset"].as_str().unwrap_or(""),
                a["depth"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(affected, [("lake.clean", 0), ("lake.gold", 1)], "{x}");
    // Another org sees none of it.
    let (st, _) = get(&server.base, &format!("/incidents/{id}"), Some(&other)).await;
    assert_eq!(st, 404);
    let (_, theirs) = get(&server.base, "/incidents", Some(&other)).await;
    assert_eq!(theirs, json!([]));
    // Viewers cannot resolve it; operators can, once.
    let (st, _) = post(
        &server.base,
        &format!("/incidents/{id}/resolve"),
        &viewer,
        json!({}),
    )
    .await;
    assert_eq!(st, 403);
    let (st, done) = post(
        &server.base,
        &format!("/incidents/{id}/resolve"),
        &operator,
        json!({"note": "source restored"}),
    )
    .await;
    assert_eq!(st, 200, "{done}");
    assert!(
        done["resolution"]
            .as_str()
            .is_some_and(|r| r.ends_with(": source restored")),
        "{done}"
    );
    let (st, again) = post(
        &server.base,
        &format!("/incidents/{id}/resolve"),
        &operator,
        json!({}),
    )
    .await;
    assert_eq!(st, 409, "{again}");
    assert_eq!(again["error"]["code"], "OR108", "{again}");
}
