//! `orca serve`'s HTTP API, as a client sees it: a real server process over
//! a test database, called with API keys of two orgs and three roles.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use orca_tests::procs::bin;
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

/// The server's login: nothing of its own, the three roles to take.
const SERVE_LOGIN: &str = "orca_t_http_serve";

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn serve(db: &TestDb) -> Server {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(SERVE_LOGIN)
            .fetch_one(&db.pool)
            .await
            .expect("role lookup");
    if !exists {
        let _ = db
            .pool
            .execute(
                format!(
                    "CREATE ROLE {SERVE_LOGIN} LOGIN NOINHERIT \
                     IN ROLE orca_viewer, orca_operator, orca_admin, orca_relay"
                )
                .as_str(),
            )
            .await;
    }
    // A login made before relays had their role gets it now.
    let _ = db
        .pool
        .execute(format!("GRANT orca_relay TO {SERVE_LOGIN}").as_str())
        .await;
    let port = free_port();
    let url = db
        .url()
        .replacen("postgres@", &format!("{SERVE_LOGIN}@"), 1);
    let child = Command::new(bin("orca"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("DATABASE_URL", url)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start orca serve");
    let base = format!("http://127.0.0.1:{port}");
    let server = Server { child, base };
    let client = reqwest::Client::new();
    let health = format!("{}/healthz", server.base);
    wait_until(
        "orca serve to answer",
        Duration::from_secs(30),
        || {
            let (client, health) = (client.clone(), health.clone());
            async move {
                client
                    .get(&health)
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
                    .map(|_| ())
            }
        },
        String::new,
    )
    .await;
    server
}

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

async fn api_key(db: &TestDb, org: &str, name: &str, role: &str) -> String {
    let mut c = connect_org(db, "postgres", org).await;
    sqlx::query_scalar("SELECT orca.create_api_key($1, $2)")
        .bind(name)
        .bind(role)
        .fetch_one(&mut c)
        .await
        .expect("an API key")
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
