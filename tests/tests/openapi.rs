//! The OpenAPI document `orca serve` publishes, and the API fuzzed from it by
//! schemathesis (PyPI): no 5xx, and no answer that contradicts the
//! document (status, content type, body schema), over a database with runs.

use std::process::Command;

use orca_tests::serve::{api_key, serve};
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

/// schemathesis lives in a virtualenv of its own (scripts/setup.sh), apart
/// from PyIceberg's and moto's dependencies.
fn schemathesis() -> String {
    std::env::var("ORCA_TEST_SCHEMATHESIS")
        .unwrap_or_else(|_| "/var/tmp/orca-st/bin/schemathesis".into())
}

#[tokio::test]
async fn the_document_describes_the_api_and_the_api_keeps_to_it() {
    let db = TestDb::new().await;
    db.pool
        .execute("SELECT orca.create_org('acme')")
        .await
        .expect("org");
    let mut c = connect_org(&db, "postgres", "acme").await;
    let mut m = lake_manifest("lake");
    m["max_runs"] = json!(null);
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut c)
        .await
        .expect("register");
    sqlx::query("SELECT orca.backfill('lake', '2024-01..2024-06')")
        .execute(&mut c)
        .await
        .expect("backfill");
    c.execute("SELECT orca.tick()").await.expect("tick");
    let leases = claim(&mut c, "r1", 2).await;
    sqlx::query("SELECT orca.finish($1, false, 'failed on purpose')")
        .bind(leases[0].lease)
        .execute(&mut c)
        .await
        .expect("fail one");
    let operator = api_key(&db, "acme", "fuzzer", "operator").await;
    let server = serve(&db).await;

    let doc: Value = reqwest::get(format!("{}/api/v1/openapi.json", server.base))
        .await
        .expect("the document")
        .json()
        .await
        .expect("JSON");
    assert_eq!(doc["openapi"], "3.1.0", "{doc}");
    let paths: Vec<&str> = doc["paths"]
        .as_object()
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    for p in [
        "/api/v1/session",
        "/api/v1/pipelines",
        "/api/v1/pipelines/{name}",
        "/api/v1/pipelines/{name}/runs",
        "/api/v1/pipelines/{name}/backfill",
        "/api/v1/runs",
        "/api/v1/runs/{id}",
        "/api/v1/runs/{id}/cancel",
        "/api/v1/runs/{id}/retry",
        "/api/v1/syncs",
        "/api/v1/syncs/{name}/pause",
        "/api/v1/syncs/{name}/resume",
        "/api/v1/syncs/{name}/scale",
        "/api/v1/events",
        "/api/v1/runners",
        "/api/v1/datasets",
        "/api/v1/datasets/{name}",
        "/api/v1/lineage",
        "/api/v1/sensors",
        "/api/v1/webhooks",
        "/api/v1/webhooks/{id}/deliveries",
        "/api/v1/runs/{id}/log",
        "/api/v1/runs/{id}/log/stream",
        "/metrics",
        "/healthz",
    ] {
        assert!(paths.contains(&p), "{p} is not in the document: {paths:?}");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["api_key"]["scheme"],
        "bearer"
    );

    let fuzz = |extra: &[&str]| {
        let out = Command::new(schemathesis())
            .args([
                "run",
                &format!("{}/api/v1/openapi.json", server.base),
                "--header",
                &format!("Authorization: Bearer {operator}"),
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,\
                 response_schema_conformance",
                "--seed",
                "20261201",
                // One worker: hypothesis parses lambda sources with ast.parse,
                // which CPython 3.11 can fail at from two threads at once
                // ("AST constructor recursion depth mismatch").
                "--workers",
                "1",
                "--request-timeout",
                "30",
            ])
            .args(extra)
            // Its cache and reports go to a scratch directory, not the clone.
            .current_dir(scratch("schemathesis"))
            .env("NO_COLOR", "1")
            .output()
            .expect("run schemathesis (scripts/setup.sh installs it)");
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "schemathesis found problems:\n{text}");
        // It did test the operations (and not, say, skip them all).
        assert!(text.contains("passed"), "{text}");
    };
    // Everything but following a log, which lasts as long as its attempt.
    fuzz(&[
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        "40",
        "--exclude-path",
        "/api/v1/runs/{id}/log/stream",
    ]);
    // Following the log of a run that has ended: its events keep to the
    // document too.
    sqlx::query(
        "SELECT orca.cancel(id) FROM orca.runs WHERE id = 1 AND status IN ('queued', 'running')",
    )
    .execute(&mut c)
    .await
    .expect("cancel run 1");
    fuzz(&[
        "--phases",
        "examples",
        "--include-path",
        "/api/v1/runs/{id}/log/stream",
    ]);
    drop(server);
}
