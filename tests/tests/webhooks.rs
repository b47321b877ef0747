//! Webhooks end to end: real relays (`orca relay`) deliver the outbox to a
//! receiver that verifies every delivery with the official Standard
//! Webhooks library, fails the first ones, and is killed and started again
//! mid-stream. Every event arrives, signed; two relays never deliver one
//! event twice while nothing fails; a tampered or old delivery is refused by
//! the library; a dead endpoint is disabled; netguard holds for each org.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use orca_tests::procs::bin;
use orca_tests::s3::python;
use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::Value;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn receiver_script() -> PathBuf {
    repo_root().join("tests/py/webhook_receiver.py")
}

fn receiver(port: u16, secret: &str, dir: &Path, fail_first: u32) -> Proc {
    Proc(
        Command::new(python())
            .arg(receiver_script())
            .args(["serve", &port.to_string(), secret])
            .arg(dir)
            .arg(fail_first.to_string())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the receiver"),
    )
}

fn relay(db: &TestDb, name: &str) -> Proc {
    Proc(
        Command::new(bin("orca"))
            .args(["relay", "--name", name, "--idle-ms", "100"])
            .env("DATABASE_URL", db.url())
            .stdout(Stdio::null())
            .spawn()
            .expect("start a relay"),
    )
}

/// The event ids the receiver accepted, with how often each.
fn accepted(dir: &Path) -> BTreeMap<i64, usize> {
    let mut out = BTreeMap::new();
    for line in std::fs::read_to_string(dir.join("accepted"))
        .unwrap_or_default()
        .lines()
    {
        if let Some(id) = line.split_whitespace().next().and_then(|s| s.parse().ok()) {
            *out.entry(id).or_default() += 1;
        }
    }
    out
}

async fn run_events(db: &TestDb, after: i64) -> BTreeSet<i64> {
    sqlx::query_scalar::<_, i64>(
        "SELECT e.id FROM orca.events e JOIN orca.orgs o ON o.id = e.org_id \
         WHERE o.name = 'default' AND e.kind LIKE 'run.%' AND e.id > $1",
    )
    .bind(after)
    .fetch_all(&db.pool)
    .await
    .expect("events")
    .into_iter()
    .collect()
}

async fn wait_all(db: &TestDb, dir: &Path, after: i64, what: &str) {
    wait_until(
        what,
        Duration::from_secs(120),
        || async {
            let want = run_events(db, after).await;
            let got: BTreeSet<i64> = accepted(dir).keys().copied().collect();
            want.is_subset(&got).then_some(())
        },
        || {
            format!(
                "accepted {:?}",
                accepted(dir).keys().copied().collect::<Vec<_>>()
            )
        },
    )
    .await;
}

fn verify(secret: &str, dir: &Path, what: &str) -> String {
    let out = Command::new(python())
        .arg(receiver_script())
        .args(["verify", secret])
        .arg(dir.join("sample.json"))
        .arg(what)
        .output()
        .expect("verify");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn relays_deliver_every_event_signed_at_least_once() {
    let db = TestDb::new().await;
    // Quick backoff and a short patience for the dead endpoint below, yet
    // longer than the receiver's restart takes on a busy machine (Python
    // starting), or the live endpoint is disabled too.
    db.pool
        .execute(
            format!(
                "ALTER DATABASE \"{}\" SET orca.webhook_backoff_max_seconds = 1; \
                 ALTER DATABASE \"{}\" SET orca.webhook_disable_after_seconds = 8",
                db.name, db.name
            )
            .as_str(),
        )
        .await
        .expect("settings");
    let mut m = lake_manifest("lake");
    m["max_runs"] = serde_json::json!(null);
    db.register(&m).await;
    let dir = std::env::temp_dir().join(format!("orca-webhooks-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let port = free_port();
    let mut c = db.connect().await;
    let hook: Value =
        sqlx::query_scalar("SELECT orca.create_webhook($1, '{run.*}', 'the test receiver')")
            .bind(format!("http://127.0.0.1:{port}/hook"))
            .fetch_one(&mut c)
            .await
            .expect("create a webhook");
    let secret = hook["secret"].as_str().expect("a secret").to_string();
    assert!(secret.starts_with("whsec_"), "{secret}");
    let start: i64 = db.scalar_i64("SELECT max(id) FROM orca.events").await;
    // A receiver that fails its first three deliveries, and two relays.
    let r = receiver(port, &secret, &dir, 3);
    orca_tests::stores::wait_port(port, "the webhook receiver");
    let relays = [relay(&db, "relay-a"), relay(&db, "relay-b")];
    c.execute("SELECT orca.backfill('lake', '2024-01..2024-12')")
        .await
        .expect("backfill");
    wait_all(&db, &dir, start, "every run event to arrive").await;
    let got = accepted(&dir);
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "delivered twice while nothing failed: {twice:?}"
    );
    let failed = db
        .scalar_i64("SELECT count(*) FROM orca.webhook_deliveries WHERE status = 'failed' AND response = 500")
        .await;
    assert_eq!(
        failed, 3,
        "the first three tries failed and were tried again"
    );
    // In order: the receiver saw each endpoint's events by id.
    let order: Vec<i64> = std::fs::read_to_string(dir.join("accepted"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().and_then(|s| s.parse().ok()))
        .collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(order, sorted, "delivered out of order");

    // The library refuses a tampered body and an old timestamp.
    assert_eq!(verify(&secret, &dir, "as-is"), "ok");
    assert!(verify(&secret, &dir, "body").starts_with("refused"));
    assert!(verify(&secret, &dir, "old").starts_with("refused"));

    // The receiver dies mid-stream and comes back: nothing is lost.
    let mark = db.scalar_i64("SELECT max(id) FROM orca.events").await;
    c.execute("SELECT orca.backfill('lake', '2025-01..2025-12')")
        .await
        .expect("backfill");
    drop(r);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _r = receiver(port, &secret, &dir, 0);
    orca_tests::stores::wait_port(port, "the restarted webhook receiver");
    wait_all(&db, &dir, mark, "the events after the receiver's restart").await;

    // A dead endpoint is disabled, with an event, once it failed long enough.
    let dead: Value = sqlx::query_scalar("SELECT orca.create_webhook($1, '{run.*}')")
        .bind(format!("http://127.0.0.1:{}/nobody", free_port()))
        .fetch_one(&mut c)
        .await
        .expect("a dead endpoint");
    let dead_id = dead["id"].as_i64().expect("id");
    c.execute("SELECT orca.run('lake', '2026-01')")
        .await
        .expect("run");
    wait_for_sql(
        &db,
        "the dead endpoint to be disabled",
        &format!("SELECT NOT enabled FROM orca.webhooks WHERE id = {dead_id}"),
        Duration::from_secs(60),
        String::new,
    )
    .await;
    assert_eq!(
        db.scalar_i64(&format!(
            "SELECT count(*) FROM orca.events WHERE kind = 'webhook.disabled' \
             AND (data->>'webhook')::bigint = {dead_id}"
        ))
        .await,
        1
    );

    // The CLI lists them, the dead one disabled with its reason.
    let listed = Command::new(bin("orca"))
        .args(["webhooks", "list"])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca webhooks list");
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.contains(&format!("127.0.0.1:{port}/hook"))
            && text.contains("disabled")
            && text.contains("failing since"),
        "{text}"
    );
    // And as JSON for scripts: the same rows, typed.
    let listed = Command::new(bin("orca"))
        .args(["webhooks", "list", "--json"])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca webhooks list --json");
    let rows: Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let dead = rows
        .as_array()
        .and_then(|a| a.iter().find(|w| w["state"] == "disabled"))
        .unwrap_or_else(|| panic!("the disabled endpoint: {rows}"));
    assert!(dead["id"].is_i64() && dead["events"].is_array(), "{dead}");
    assert!(
        dead["note"]
            .as_str()
            .is_some_and(|n| n.contains("failing since")),
        "{dead}"
    );

    // Netguard: another org's endpoint on a loopback name is refused by the
    // relay, and its delivery row says why.
    c.execute("SELECT orca.create_org('acme')")
        .await
        .expect("org");
    let mut acme = connect_org(&db, "postgres", "acme").await;
    let theirs: Value = sqlx::query_scalar("SELECT orca.create_webhook($1, '{*}')")
        .bind(format!("http://localhost:{port}/hook"))
        .fetch_one(&mut acme)
        .await
        .expect("a name passes at creation");
    let theirs_id = theirs["id"].as_i64().expect("id");
    acme.execute("SELECT orca.create_api_key('k', 'viewer')")
        .await
        .expect("an event in acme");
    let error: String = wait_until(
        "the relay to refuse acme's loopback endpoint",
        Duration::from_secs(60),
        || async {
            sqlx::query_scalar::<_, String>(
                "SELECT error FROM orca.webhook_deliveries WHERE webhook_id = $1 LIMIT 1",
            )
            .bind(theirs_id)
            .fetch_optional(&db.pool)
            .await
            .ok()
            .flatten()
        },
        String::new,
    )
    .await;
    assert!(
        error.contains("netguard refused localhost") && error.contains("org 'acme'"),
        "{error}"
    );
    drop(relays);
    let _ = std::fs::remove_dir_all(&dir);
}
