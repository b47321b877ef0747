//! The trust boundary around the SQL API, tried as an attacker would: with
//! ordinary logins (never admins) and, where the attack goes through them,
//! real runner and pipeline processes. Each attempt is refused with its
//! SQLSTATE and changes nothing. docs/security.md is the model.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use orca_tests::procs::{bin, outputs, Runner};
use orca_tests::sqlx::{self, Executor, PgConnection};
use orca_tests::*;
use serde_json::{json, Value};

/// A login that is in orca_runner and nothing else: no org membership.
const RUNNER_LOGIN: &str = "orca_t_sec_runner";
/// A login with what a lease allows only (a runner's children).
const ATTEMPT_LOGIN: &str = "orca_t_sec_attempt";
/// An operator of org acme.
const OPERATOR: &str = "orca_t_sec_operator";
/// A viewer of org acme.
const VIEWER: &str = "orca_t_sec_viewer";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "orca-security-{name}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

async fn code_of(c: &mut PgConnection, sql: &str) -> String {
    expect_error(&mut *c, sql).await.0
}

/// A session of the runner login presenting `token`.
async fn runner_session(db: &TestDb, token: &str) -> PgConnection {
    let mut c = db.connect_as(RUNNER_LOGIN).await;
    sqlx::query("SELECT set_config('orca.runner_token', $1, false)")
        .bind(token)
        .execute(&mut c)
        .await
        .expect("present the token");
    c
}

async fn roles(db: &TestDb) {
    ensure_role(db, RUNNER_LOGIN, &["orca_runner"]).await;
    ensure_role(db, ATTEMPT_LOGIN, &["orca_attempt"]).await;
    ensure_role(db, OPERATOR, &["orca_operator"]).await;
    ensure_role(db, VIEWER, &["orca_viewer"]).await;
}

/// Two orgs with a backfill queued in each: acme and globex.
async fn two_orgs(db: &TestDb) {
    for org in ["acme", "globex"] {
        sqlx::query("SELECT orca.create_org($1)")
            .bind(org)
            .execute(&db.pool)
            .await
            .expect("org");
        let mut c = connect_org(db, "postgres", org).await;
        let mut m = lake_manifest("lake");
        m["max_runs"] = json!(null);
        sqlx::query("SELECT orca.register($1)")
            .bind(&m)
            .execute(&mut c)
            .await
            .expect("register");
        c.execute("SELECT orca.backfill('lake', '2024-01..2024-06')")
            .await
            .expect("backfill");
    }
    db.pool
        .execute(
            format!(
                "SELECT orca.add_member('acme', '{OPERATOR}'), orca.add_member('acme', '{VIEWER}')"
            )
            .as_str(),
        )
        .await
        .expect("members");
}

async fn token(db: &TestDb, org: &str, pool: &str, name: &str) -> String {
    let mut c = connect_org(db, OPERATOR, "acme").await;
    if org != "acme" {
        c = connect_org(db, "postgres", org).await;
    }
    sqlx::query_scalar("SELECT orca.create_runner_token($1, $2)")
        .bind(pool)
        .bind(name)
        .fetch_one(&mut c)
        .await
        .expect("create a runner token")
}

async fn claim_leases(c: &mut PgConnection, runner: &str, max: i32) -> Vec<(uuid::Uuid, String)> {
    sqlx::query_as("SELECT lease, org FROM orca.claim($1, 'default', $2)")
        .bind(runner)
        .bind(max)
        .fetch_all(c)
        .await
        .expect("claim")
}

#[tokio::test]
async fn runners_work_only_with_a_token_for_their_org_pool_and_leases() {
    let db = TestDb::new().await;
    roles(&db).await;
    two_orgs(&db).await;
    let acme = token(&db, "acme", "default", "host-a").await;
    let acme_b = token(&db, "acme", "default", "host-b").await;
    let gpu = token(&db, "acme", "gpu", "gpu-1").await;
    let globex = token(&db, "globex", "default", "g-1").await;
    assert_ne!(acme, acme_b);
    assert!(acme.len() >= 64 + 8, "{acme}");

    // No token: the login alone does nothing, whatever org it names.
    let mut bare = connect_org(&db, RUNNER_LOGIN, "acme").await;
    for sql in [
        "SELECT * FROM orca.claim('r')",
        "SELECT orca.register_runner('r')",
        "SELECT orca.heartbeat(gen_random_uuid())",
        "SELECT orca.finish(gen_random_uuid(), true)",
        "SELECT orca.release(gen_random_uuid())",
    ] {
        assert_eq!(code_of(&mut bare, sql).await, "OR080", "{sql}");
    }
    let mut forged = runner_session(&db, &format!("{acme}0")).await;
    assert_eq!(
        code_of(&mut forged, "SELECT * FROM orca.claim('r')").await,
        "OR080"
    );

    // A token is for its org and pool.
    let mut a = runner_session(&db, &acme).await;
    assert_eq!(
        code_of(&mut a, "SELECT * FROM orca.claim('r', 'gpu')").await,
        "OR081"
    );
    a.execute("SET orca.org = 'globex'").await.expect("set");
    assert_eq!(
        code_of(&mut a, "SELECT * FROM orca.claim('r')").await,
        "OR081"
    );
    a.execute("RESET orca.org").await.expect("reset");
    let mine = claim_leases(&mut a, "host-a", 2).await;
    assert_eq!(mine.len(), 2);
    assert!(mine.iter().all(|(_, org)| org == "acme"), "{mine:?}");
    let mut g = runner_session(&db, &globex).await;
    let theirs = claim_leases(&mut g, "g-1", 1).await;
    assert_eq!(theirs[0].1, "globex");
    let mut p = runner_session(&db, &gpu).await;
    assert!(
        sqlx::query("SELECT * FROM orca.claim('gpu-1', 'gpu')")
            .fetch_all(&mut p)
            .await
            .expect("gpu claim")
            .is_empty(),
        "the gpu pool has no work"
    );

    // Only leases its own token holds: another runner of the same org and
    // pool cannot heartbeat, finish or release them; another org's runner
    // does not even find them.
    let (lease, _) = mine[0];
    let mut b = runner_session(&db, &acme_b).await;
    for sql in [
        format!("SELECT orca.heartbeat('{lease}')"),
        format!("SELECT orca.finish('{lease}', true)"),
        format!("SELECT orca.finish('{lease}', false, 'x')"),
        format!("SELECT orca.release('{lease}')"),
        format!("SELECT orca.finish_many(ARRAY['{lease}'::uuid])"),
    ] {
        assert_eq!(code_of(&mut b, &sql).await, "OR082", "{sql}");
        assert_eq!(code_of(&mut g, &sql).await, "OR012", "{sql}");
    }
    let status: String = sqlx::query_scalar("SELECT status FROM orca.attempts WHERE lease = $1")
        .bind(lease)
        .fetch_one(&db.pool)
        .await
        .expect("status");
    assert_eq!(status, "leased", "nothing changed");
    a.execute(format!("SELECT orca.heartbeat('{lease}')").as_str())
        .await
        .expect("its own runner heartbeats it");

    // Tokens are listed, never read back: only their hashes are stored,
    // and a viewer cannot read those.
    let mut v = connect_org(&db, VIEWER, "acme").await;
    let listed: Vec<(String, String)> =
        sqlx::query_as("SELECT name, pool FROM orca.runner_tokens ORDER BY name")
            .fetch_all(&mut v)
            .await
            .expect("viewer lists tokens");
    assert_eq!(
        listed,
        [
            ("gpu-1".to_string(), "gpu".to_string()),
            ("host-a".into(), "default".into()),
            ("host-b".into(), "default".into())
        ]
    );
    assert_eq!(
        code_of(&mut v, "SELECT hash FROM orca.runner_tokens").await,
        "42501"
    );
    assert_eq!(
        code_of(&mut v, "SELECT lease FROM orca.attempts").await,
        "42501"
    );
    assert_eq!(
        code_of(&mut v, "SELECT lease FROM orca.leases").await,
        "42501"
    );
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orca.runner_tokens t \
         WHERE t.hash = sha256(convert_to($1, 'UTF8')) AND position($1 IN to_jsonb(t)::text) = 0",
    )
    .bind(&acme)
    .fetch_one(&db.pool)
    .await
    .expect("stored hashed");
    assert_eq!(stored, 1);
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    assert_eq!(
        code_of(
            &mut op,
            "SELECT orca.create_runner_token('default', 'host-a')"
        )
        .await,
        "OR050"
    );
    assert_eq!(
        code_of(&mut op, "SELECT orca.revoke_runner_token('g-1')").await,
        "OR083",
        "globex's token is not acme's to revoke"
    );

    // Rotation: the new secret works at once, the old one for its grace.
    let rotated: String =
        sqlx::query_scalar("SELECT orca.rotate_runner_token('host-b', interval '1 hour')")
            .fetch_one(&mut op)
            .await
            .expect("rotate");
    let mut b2 = runner_session(&db, &rotated).await;
    b2.execute("SELECT orca.register_runner('host-b')")
        .await
        .expect("new secret");
    b.execute("SELECT orca.register_runner('host-b')")
        .await
        .expect("old secret within its grace");
    sqlx::query("SELECT orca.rotate_runner_token('host-b', interval '0')")
        .fetch_one(&mut op)
        .await
        .expect("rotate without grace");
    assert_eq!(
        code_of(&mut b2, "SELECT orca.register_runner('host-b')").await,
        "OR080",
        "rotated out"
    );

    // Revocation: the next call fails and the token's leases lapse now.
    op.execute("SELECT orca.revoke_runner_token('host-a')")
        .await
        .expect("revoke");
    assert_eq!(
        code_of(&mut a, &format!("SELECT orca.heartbeat('{lease}')")).await,
        "OR080"
    );
    let t: Value = sqlx::query_scalar("SELECT orca.tick()")
        .fetch_one(&mut connect_org(&db, "postgres", "acme").await)
        .await
        .expect("tick");
    assert_eq!(t["attempts_lost"], json!(2), "{t}");
}

#[tokio::test]
async fn a_lease_allows_its_attempt_s_calls_and_nothing_else() {
    let db = TestDb::new().await;
    roles(&db).await;
    two_orgs(&db).await;
    let acme = token(&db, "acme", "default", "host-a").await;
    let mut r = runner_session(&db, &acme).await;
    let leases = claim_leases(&mut r, "host-a", 2).await;
    let (lease, other) = (leases[0].0, leases[1].0);

    // The child's login is in no org: the lease says which attempt it is.
    let mut child = db.connect_as(ATTEMPT_LOGIN).await;
    let ctx: Value = sqlx::query_scalar("SELECT orca.attempt_context($1)")
        .bind(lease)
        .fetch_one(&mut child)
        .await
        .expect("its own context");
    assert_eq!(ctx["pipeline"], "lake", "{ctx}");
    let part = ctx["partitions"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    sqlx::query("SELECT orca.report_step($1, 'one', $2, 'running')")
        .bind(lease)
        .bind(&part)
        .execute(&mut child)
        .await
        .expect("reports its step");
    // Nothing a runner or operator does, and no table.
    for sql in [
        "SELECT * FROM orca.claim('x')".to_string(),
        "SELECT orca.tick()".to_string(),
        format!("SELECT orca.finish('{other}', true)"),
        format!("SELECT orca.finish('{lease}', true)"),
        format!("SELECT orca.heartbeat('{other}')"),
        "SELECT count(*) FROM orca.runs".to_string(),
        "SELECT count(*) FROM orca.attempts".to_string(),
        "SELECT orca.backfill('lake', '2024-01')".to_string(),
        "SELECT orca.create_runner_token('default')".to_string(),
    ] {
        assert_eq!(code_of(&mut child, &sql).await, "42501", "{sql}");
    }
    // A made-up lease, or one named in another org, is unknown.
    assert_eq!(
        code_of(
            &mut child,
            &format!("SELECT orca.attempt_context('{}')", uuid::Uuid::new_v4())
        )
        .await,
        "OR012"
    );
    child.execute("SET orca.org = 'globex'").await.expect("set");
    assert_eq!(
        code_of(
            &mut child,
            &format!("SELECT orca.attempt_context('{lease}')")
        )
        .await,
        "OR012"
    );
    child.execute("RESET orca.org").await.expect("reset");
    // It stops working when the lease ends.
    r.execute(format!("SELECT orca.finish('{lease}', true)").as_str())
        .await
        .expect("the runner finishes it");
    assert_eq!(
        code_of(
            &mut child,
            &format!("SELECT orca.report_step('{lease}', 'one', '{part}', 'succeeded')")
        )
        .await,
        "OR014"
    );
}

#[tokio::test]
async fn only_admins_move_the_clock() {
    let db = TestDb::new().await;
    roles(&db).await;
    two_orgs(&db).await;
    let mut c = connect_org(&db, "postgres", "acme").await;
    sqlx::query("SELECT orca.register($1)")
        .bind(daily_manifest("daily", "0 6 * * *", "UTC"))
        .execute(&mut c)
        .await
        .expect("a scheduled pipeline");
    c.execute("SELECT orca.tick()").await.expect("tick now");
    let runs = "SELECT count(*) FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
                WHERE p.name = 'daily'";
    let before = db.scalar_i64(runs).await;
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    for sql in [
        "SELECT orca.tick(now() + interval '30 days')",
        "SELECT orca.tick('2100-01-01')",
        "SELECT orca.tick(now() - interval '1 day')",
    ] {
        let (code, msg) = expect_error(&mut op, sql).await;
        assert_eq!(code, "OR086", "{sql}: {msg}");
    }
    assert_eq!(db.scalar_i64(runs).await, before, "no schedule fired early");
    op.execute("SELECT orca.tick(now())")
        .await
        .expect("the transaction's time is anyone's");
    let t: Value = sqlx::query_scalar("SELECT orca.tick(now() + interval '30 days')")
        .fetch_one(&mut c)
        .await
        .expect("an admin moves the clock");
    assert!(db.scalar_i64(runs).await > before, "{t}");
}

#[tokio::test]
async fn a_sync_s_head_moves_only_under_its_lease_and_within_its_prefix() {
    let db = TestDb::new().await;
    roles(&db).await;
    two_orgs(&db).await;
    let mut admin = connect_org(&db, "postgres", "acme").await;
    for name in ["shop", "other"] {
        sqlx::query(
            "SELECT orca.create_sync($1, '{\"type\": \"files\", \"url\": \"/in\", \"format\": \"jsonl\"}', \
             '{\"type\": \"parquet\", \"url\": \"/out\"}', '[{\"name\": \"events\", \"pattern\": \"*.jsonl\"}]')",
        )
        .bind(name)
        .execute(&mut admin)
        .await
        .expect("create a sync");
    }
    let head = "SELECT generation::bigint * 1000 + head_epoch FROM orca.syncs WHERE name = 'shop'";
    // An operator (runner rights included) cannot fence or move it by hand.
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    db.pool
        .execute(format!("GRANT orca_attempt TO {OPERATOR}").as_str())
        .await
        .expect("grant");
    for sql in [
        "SELECT orca.claim_sync('shop')",
        "SELECT orca.advance_head('shop', 1, 1, 'acme/shop/_checkpoints/x.json')",
        "SELECT orca.rewind_head('shop', 1, 0, NULL)",
    ] {
        assert_eq!(code_of(&mut op, sql).await, "OR084", "{sql}");
    }
    // With the lease of the sync's own run only.
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&mut admin)
        .await
        .expect("run the sync");
    let acme = token(&db, "acme", "default", "host-a").await;
    let mut r = runner_session(&db, &acme).await;
    let leases: Vec<(uuid::Uuid, i64)> = sqlx::query_as(
        "SELECT lease, run FROM orca.claim('host-a', 'default', 100, ARRAY['sync'])",
    )
    .fetch_all(&mut r)
    .await
    .expect("claim the sync's attempt");
    let lease = leases
        .iter()
        .find(|(_, id)| *id == run)
        .map(|(l, _)| *l)
        .expect("the sync's attempt");
    assert_eq!(
        code_of(
            &mut op,
            &format!("SELECT orca.claim_sync('other', '{lease}')")
        )
        .await,
        "OR084"
    );
    let claimed: Value = sqlx::query_scalar("SELECT orca.claim_sync('shop', $1)")
        .bind(lease)
        .fetch_one(&mut op)
        .await
        .expect("claim with the lease");
    let generation = claimed["generation"].as_i64().unwrap_or_default();
    let before = db.scalar_i64(head).await;
    // Records name the sync's own checkpoints, nothing else.
    for record in [
        "acme/other/_checkpoints/0000000001-g1.json",
        "globex/shop/_checkpoints/0000000001-g1.json",
        "acme/shop/_checkpoints/../../../globex/shop/_checkpoints/x.json",
        "acme/shop/_checkpoints/sub/x.json",
        "/etc/passwd",
        "acme/shop/_staging/x.json",
    ] {
        let (code, msg) = expect_error(
            &mut op,
            &format!("SELECT orca.advance_head('shop', {generation}, 1, '{record}', '{lease}')"),
        )
        .await;
        assert_eq!(code, "OR085", "{record}: {msg}");
        assert!(msg.contains(record), "{msg}");
    }
    assert_eq!(db.scalar_i64(head).await, before, "HEAD did not move");
    op.execute(
        format!(
            "SELECT orca.advance_head('shop', {generation}, 1, \
             'acme/shop/_checkpoints/0000000001-g{generation}.json', '{lease}')"
        )
        .as_str(),
    )
    .await
    .expect("its own record, under its lease");
    // Once the attempt has ended, its lease moves nothing.
    r.execute(format!("SELECT orca.finish('{lease}', true)").as_str())
        .await
        .expect("finish");
    assert_eq!(
        code_of(
            &mut op,
            &format!(
                "SELECT orca.advance_head('shop', {generation}, 2, \
                 'acme/shop/_checkpoints/0000000002-g{generation}.json', '{lease}')"
            )
        )
        .await,
        "OR014"
    );
}

fn register(db: &TestDb, binary: &std::path::Path) {
    let out = Command::new(bin("orca"))
        .arg("register")
        .arg(binary)
        .env("DATABASE_URL", db.url())
        .output()
        .expect("run orca");
    assert!(
        out.status.success(),
        "orca register: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The environment of the process that was given this lease, if one runs.
fn child_with_lease(lease: &uuid::Uuid) -> Option<String> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let environ = String::from_utf8_lossy(&environ).replace('\0', "\n");
            environ
                .lines()
                .any(|l| l == format!("ORCA_LEASE={lease}"))
                .then_some(environ)
        })
}

fn url_as(db: &TestDb, user: &str) -> String {
    db.url().replacen("postgres@", &format!("{user}@"), 1)
}

/// The whole way through: a runner logged in as an ordinary role with a
/// token runs the registered binary, and refuses any other file.
#[tokio::test]
async fn a_runner_runs_only_the_pinned_binary_and_hides_its_secrets() {
    let db = TestDb::new().await;
    roles(&db).await;
    register(&db, &bin("probe"));
    let probe_sha: String = sqlx::query_scalar("SELECT binary_sha256 FROM orca.pipeline_versions")
        .fetch_one(&db.pool)
        .await
        .expect("orca register pinned the binary");
    assert_eq!(probe_sha.len(), 64);
    let token: String = sqlx::query_scalar("SELECT orca.create_runner_token('default', 'r1')")
        .fetch_one(&db.pool)
        .await
        .expect("token");
    let logs = scratch("pinned");
    let token_file = logs.join("token");
    std::fs::write(&token_file, &token).expect("token file");
    let probe_dir = logs.to_string_lossy().to_string();
    let token_path = token_file.to_string_lossy().to_string();
    let env = [
        ("PROBE_DIR", probe_dir.as_str()),
        ("PROBE_SLEEP_MS", "1500"),
        ("ORCA_RUNNER_TOKEN_FILE", token_path.as_str()),
    ];
    let runner = Runner::start(&url_as(&db, RUNNER_LOGIN), "r1", 2, &logs, &env);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('probe', '2024-01')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    // While it runs: the lease is on no command line, and the child has no
    // runner token in its environment.
    let lease: uuid::Uuid = wait_until(
        "the attempt to be leased",
        Duration::from_secs(60),
        || async {
            sqlx::query_scalar::<_, uuid::Uuid>(
                "SELECT lease FROM orca.attempts WHERE run_id = $1 AND status = 'leased'",
            )
            .bind(run)
            .fetch_optional(&db.pool)
            .await
            .ok()
            .flatten()
        },
        || outputs(&[&runner]),
    )
    .await;
    let child_env = wait_until(
        "the pipeline binary to start with its lease",
        Duration::from_secs(60),
        || async { child_with_lease(&lease) },
        || outputs(&[&runner]),
    )
    .await;
    assert!(
        !child_env.contains(&token) && !child_env.contains("ORCA_RUNNER_TOKEN"),
        "the child sees the runner's token"
    );
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            !cmdline.contains(&lease.to_string()),
            "the lease is on a command line: {cmdline}"
        );
    }
    wait_for_sql(
        &db,
        "the pinned run to succeed",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(120),
        || outputs(&[&runner]),
    )
    .await;

    // An operator points versions at other files: none of them runs.
    let outside = logs.join("evil.sh");
    std::fs::write(&outside, "#!/bin/sh\ntouch \"$0.ran\"\n").expect("script");
    let sha_of = |p: &std::path::Path| {
        use sha2::{Digest, Sha256};
        let bytes = std::fs::read(p).expect("read");
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let cases = [
        (
            "outside",
            outside.display().to_string(),
            sha_of(&outside),
            "outside this runner's pipeline root",
        ),
        (
            "shell",
            "/bin/sh".to_string(),
            sha_of(std::path::Path::new("/bin/sh")),
            "outside this runner's pipeline root",
        ),
        (
            "bare",
            "true".to_string(),
            probe_sha.clone(),
            "No such file",
        ),
        (
            "escape",
            "../../../../../../bin/true".to_string(),
            probe_sha.clone(),
            "outside this runner's pipeline root",
        ),
        (
            "other_hash",
            bin("probe").display().to_string(),
            "0".repeat(64),
            "but version",
        ),
    ];
    for (name, binary, sha, _) in &cases {
        let mut m = lake_manifest(&format!("evil_{name}"));
        m["binary"] = json!(binary);
        m["binary_sha256"] = json!(sha);
        m["run_retries"] = json!(0);
        db.register(&m).await;
        db.pool
            .execute(format!("SELECT orca.run('evil_{name}', '2024-01')").as_str())
            .await
            .expect("queue it");
    }
    for (name, binary, sha, says) in &cases {
        let error: String = wait_until(
            &format!("evil_{name} to fail"),
            Duration::from_secs(60),
            || async {
                sqlx::query_scalar::<_, Option<String>>(
                    "SELECT r.error FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
                     WHERE p.name = $1 AND r.status = 'failed'",
                )
                .bind(format!("evil_{name}"))
                .fetch_optional(&db.pool)
                .await
                .ok()
                .flatten()
                .flatten()
            },
            || outputs(&[&runner]),
        )
        .await;
        assert!(error.contains(says), "evil_{name}: {error}");
        if *name == "other_hash" {
            assert!(
                error.contains(&probe_sha)
                    && error.contains(sha.as_str())
                    && error.contains(binary.as_str()),
                "names the path and both hashes: {error}"
            );
        }
    }
    assert!(!logs.join("evil.sh.ran").exists(), "the script ran");
    drop(runner);
    let _ = std::fs::remove_dir_all(&logs);
}

/// Runs ALTER SYSTEM (which no transaction block may hold) and reloads.
async fn alter_system(c: &mut PgConnection, setting: &str) {
    c.execute(format!("ALTER SYSTEM {setting}").as_str())
        .await
        .unwrap_or_else(|e| panic!("ALTER SYSTEM {setting}: {e}"));
    c.execute("SELECT pg_reload_conf()").await.expect("reload");
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// The catalog names (orgs) a session sees rows of, by `sql`.
async fn seen(c: &mut PgConnection, sql: &str) -> String {
    sqlx::query_scalar(sql)
        .fetch_one(c)
        .await
        .expect("read the catalog")
}

#[tokio::test]
async fn the_iceberg_catalog_shows_a_lease_its_own_org_only() {
    let db = TestDb::new().await;
    roles(&db).await;
    two_orgs(&db).await;
    for org in ["acme", "globex"] {
        sqlx::query(
            "INSERT INTO public.iceberg_tables (catalog_name, table_namespace, table_name, \
             metadata_location, iceberg_type) VALUES ($1, 'lake', 'raw', $2, 'TABLE')",
        )
        .bind(org)
        .bind(format!("file:///w/{org}/lake/raw/metadata/1.json"))
        .execute(&db.pool)
        .await
        .expect("a table of each org");
        sqlx::query(
            "INSERT INTO public.iceberg_namespace_properties VALUES ($1, 'lake', 'exists', 'true')",
        )
        .bind(org)
        .execute(&db.pool)
        .await
        .expect("a namespace of each org");
    }
    let acme = token(&db, "acme", "default", "host-a").await;
    let mut r = runner_session(&db, &acme).await;
    let lease = claim_leases(&mut r, "host-a", 1).await[0].0;
    let tables = "SELECT coalesce(string_agg(catalog_name, ',' ORDER BY catalog_name), '') \
                  FROM public.iceberg_tables";
    let namespaces = "SELECT coalesce(string_agg(catalog_name, ',' ORDER BY catalog_name), '') \
                      FROM public.iceberg_namespace_properties";

    // A child without its lease sees no catalog at all.
    let mut child = db.connect_as(ATTEMPT_LOGIN).await;
    assert_eq!(seen(&mut child, tables).await, "");
    // With it, its attempt's org only, whatever catalog name it asks for.
    sqlx::query("SELECT set_config('orca.lease', $1, false)")
        .bind(lease.to_string())
        .execute(&mut child)
        .await
        .expect("present the lease");
    assert_eq!(seen(&mut child, tables).await, "acme");
    assert_eq!(seen(&mut child, namespaces).await, "acme");
    let repoint = child
        .execute(
            "UPDATE public.iceberg_tables SET metadata_location = 'file:///evil.json' \
             WHERE catalog_name = 'globex'",
        )
        .await
        .expect("update");
    assert_eq!(repoint.rows_affected(), 0, "repointed globex's table");
    let dropped = child
        .execute("DELETE FROM public.iceberg_tables WHERE catalog_name = 'globex'")
        .await
        .expect("delete");
    assert_eq!(dropped.rows_affected(), 0, "dropped globex's table");
    for sql in [
        "INSERT INTO public.iceberg_tables (catalog_name, table_namespace, table_name, \
         metadata_location) VALUES ('globex', 'lake', 'planted', 'file:///evil.json')",
        "UPDATE public.iceberg_tables SET catalog_name = 'globex' WHERE catalog_name = 'acme'",
    ] {
        assert_eq!(code_of(&mut child, sql).await, "42501", "{sql}");
    }
    child
        .execute(
            "UPDATE public.iceberg_tables SET metadata_location = 'file:///w/acme/lake/raw/metadata/2.json' \
             WHERE catalog_name = 'acme'",
        )
        .await
        .expect("its own org's table moves");
    // A made-up lease shows nothing.
    let mut forged = db.connect_as(ATTEMPT_LOGIN).await;
    sqlx::query("SELECT set_config('orca.lease', $1, false)")
        .bind(uuid::Uuid::new_v4().to_string())
        .execute(&mut forged)
        .await
        .expect("a made-up lease");
    assert_eq!(seen(&mut forged, tables).await, "");
    // Viewers see their org's catalog.
    let mut v = connect_org(&db, VIEWER, "acme").await;
    assert_eq!(seen(&mut v, tables).await, "acme");
    // When the attempt ends, its lease shows nothing more.
    r.execute(format!("SELECT orca.finish('{lease}', true)").as_str())
        .await
        .expect("finish");
    assert_eq!(seen(&mut child, tables).await, "");
    let globex: String = sqlx::query_scalar(
        "SELECT metadata_location FROM public.iceberg_tables WHERE catalog_name = 'globex'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("globex's table");
    assert_eq!(globex, "file:///w/globex/lake/raw/metadata/1.json");
}

/// Secrets are kept encrypted, read only under a live lease of their org,
/// and the installation key can be rotated without re-encrypting values. A
/// private cluster, whose key files this test owns.
#[tokio::test]
async fn secrets_are_encrypted_read_under_their_org_s_lease_and_survive_key_rotation() {
    use orca_tests::cluster::PrivateCluster;
    use sqlx::Connection;
    let keys = scratch("keys");
    let key_a = keys.join("a.key");
    let key_b = keys.join("b.key");
    std::fs::write(&key_a, "11".repeat(32)).expect("key a");
    std::fs::write(&key_b, format!("{}\n", "22".repeat(32))).expect("key b");
    let cluster = PrivateCluster::start(&[]);
    let mut admin = PgConnection::connect(&cluster.url("postgres"))
        .await
        .expect("connect");
    admin
        .execute("CREATE EXTENSION orca")
        .await
        .expect("extension");
    for (role, grants) in [
        (ATTEMPT_LOGIN, "orca_attempt"),
        (OPERATOR, "orca_operator"),
        (VIEWER, "orca_viewer"),
        (RUNNER_LOGIN, "orca_runner"),
    ] {
        admin
            .execute(format!("CREATE ROLE {role} LOGIN IN ROLE {grants}").as_str())
            .await
            .expect("role");
    }
    let connect_as = |user: &'static str, org: &'static str| {
        let url = cluster
            .url("postgres")
            .replacen("postgres@", &format!("{user}@"), 1);
        async move {
            let mut c = PgConnection::connect(&url).await.expect("connect");
            c.execute(format!("SET orca.org = '{org}'").as_str())
                .await
                .expect("org");
            c
        }
    };
    admin
        .execute(
            format!(
                "SELECT orca.create_org('acme'), orca.create_org('globex'); \
                 SELECT orca.add_member('acme', '{OPERATOR}'), orca.add_member('acme', '{VIEWER}')"
            )
            .as_str(),
        )
        .await
        .expect("orgs");
    let mut op = connect_as(OPERATOR, "acme").await;
    // Without an installation key there are no secrets.
    assert_eq!(
        code_of(&mut op, "SELECT orca.set_secret('shop-db', 'x')").await,
        "OR090"
    );
    alter_system(
        &mut admin,
        &format!("SET orca.secrets_key_file = '{}'", key_a.display()),
    )
    .await;
    let mut op = connect_as(OPERATOR, "acme").await;
    let value = "postgres://app:hunter2@db.internal/shop";
    sqlx::query("SELECT orca.set_secret('shop-db', $1)")
        .bind(value)
        .execute(&mut op)
        .await
        .expect("set a secret");
    for (sql, code) in [
        ("SELECT orca.set_secret('Shop DB', 'x')", "OR091"),
        ("SELECT orca.set_secret('empty', '')", "OR050"),
        ("SELECT orca.drop_secret('nope')", "OR091"),
        ("SELECT orca.attempt_secret(NULL, 'shop-db')", "42501"),
    ] {
        assert_eq!(code_of(&mut op, sql).await, code, "{sql}");
    }
    // Stored as ciphertext only: not in the table, not in a dump.
    let plain_rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orca.secrets s, orca.org_keys k \
         WHERE position(convert_to('hunter2', 'UTF8') IN s.sealed) > 0 \
            OR position(convert_to('hunter2', 'UTF8') IN k.wrapped) > 0",
    )
    .fetch_one(&mut admin)
    .await
    .expect("look for the value");
    assert_eq!(plain_rows, 0);
    let dump = Command::new(orca_tests::cluster::pg_bindir().join("pg_dump"))
        .arg(cluster.url("postgres"))
        .output()
        .expect("pg_dump");
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains("shop-db"), "the dump keeps the secret's row");
    assert!(
        !dump.contains("hunter2"),
        "the dump holds the value in clear"
    );
    // Viewers see names, never ciphertext.
    let mut v = connect_as(VIEWER, "acme").await;
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM orca.secrets")
        .fetch_all(&mut v)
        .await
        .expect("names");
    assert_eq!(names, ["shop-db"]);
    assert_eq!(
        code_of(&mut v, "SELECT sealed FROM orca.secrets").await,
        "42501"
    );
    assert_eq!(
        code_of(&mut v, "SELECT wrapped FROM orca.org_keys").await,
        "42501"
    );

    // An attempt of acme reads it under its lease; nothing else does.
    let mut acme_admin = connect_as("postgres", "acme").await;
    let mut m = lake_manifest("lake");
    m["max_runs"] = json!(null);
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut acme_admin)
        .await
        .expect("register");
    acme_admin
        .execute("SELECT orca.backfill('lake', '2024-01..2024-02')")
        .await
        .expect("backfill");
    let leases: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT lease FROM orca.claim('r', max => 2)")
        .fetch_all(&mut acme_admin)
        .await
        .expect("claim");
    let mut globex_admin = connect_as("postgres", "globex").await;
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut globex_admin)
        .await
        .expect("register");
    globex_admin
        .execute("SELECT orca.run('lake', '2024-01')")
        .await
        .expect("run");
    let g_lease: uuid::Uuid = sqlx::query_scalar("SELECT lease FROM orca.claim('r')")
        .fetch_one(&mut globex_admin)
        .await
        .expect("claim");
    let url = cluster
        .url("postgres")
        .replacen("postgres@", &format!("{ATTEMPT_LOGIN}@"), 1);
    let mut child = PgConnection::connect(&url).await.expect("child");
    let got: String = sqlx::query_scalar("SELECT orca.attempt_secret($1, 'shop-db')")
        .bind(leases[0])
        .fetch_one(&mut child)
        .await
        .expect("read under the lease");
    assert_eq!(got, value);
    for (sql, code) in [
        (
            format!("SELECT orca.attempt_secret('{g_lease}', 'shop-db')"),
            "OR091",
        ),
        (
            "SELECT orca.attempt_secret(NULL, 'shop-db')".to_string(),
            "OR012",
        ),
        (
            format!(
                "SELECT orca.attempt_secret('{}', 'shop-db')",
                uuid::Uuid::new_v4()
            ),
            "OR012",
        ),
    ] {
        assert_eq!(code_of(&mut child, &sql).await, code, "{sql}");
    }
    acme_admin
        .execute(format!("SELECT orca.finish('{}', true)", leases[0]).as_str())
        .await
        .expect("finish");
    assert_eq!(
        code_of(
            &mut child,
            &format!("SELECT orca.attempt_secret('{}', 'shop-db')", leases[0])
        )
        .await,
        "OR014"
    );
    let reads: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orca.events WHERE kind = 'secret.read' AND data->>'name' = 'shop-db'",
    )
    .fetch_one(&mut acme_admin)
    .await
    .expect("events");
    assert_eq!(reads, 1, "each read is an event");

    // Definitions name secrets; passwords in them are refused.
    let files = r#"{"type": "files", "url": "/in", "format": "jsonl"}"#;
    let streams = r#"[{"name": "events", "pattern": "*.jsonl"}]"#;
    for (dest, code) in [
        (
            format!(r#"{{"type": "postgres", "url": "{value}"}}"#),
            "OR063",
        ),
        (
            r#"{"type": "postgres", "url": "host=db user=app password=hunter2"}"#.to_string(),
            "OR063",
        ),
        (
            r#"{"type": "postgres", "url": {"secret": "vault://x"}}"#.to_string(),
            "OR063",
        ),
        (
            r#"{"type": "postgres", "url": {"secret": "shop-db", "x": 1}}"#.to_string(),
            "OR063",
        ),
    ] {
        let (c, msg) = expect_error(
            &mut op,
            &format!("SELECT orca.create_sync('shop', '{files}', '{dest}', '{streams}', delivery => 'at_least_once')"),
        )
        .await;
        assert_eq!(c, code, "{dest}: {msg}");
        assert!(
            !msg.contains("hunter2"),
            "the error repeats the password: {msg}"
        );
    }
    for dest in [
        r#"{"type": "postgres", "url": {"secret": "shop-db"}}"#,
        r#"{"type": "postgres", "url": {"secret": "aws-sm://prod/shop"}}"#,
    ] {
        op.execute(
            format!("SELECT orca.create_sync('shop', '{files}', '{dest}', '{streams}', delivery => 'at_least_once')")
                .as_str(),
        )
        .await
        .unwrap_or_else(|e| panic!("{dest}: {e}"));
    }
    // A definition stored before passwords were refused still runs, warned.
    acme_admin
        .execute(
            format!(
                "UPDATE orca.syncs SET definition = jsonb_set(definition, '{{destination,url}}', to_jsonb('{value}'::text))"
            )
            .as_str(),
        )
        .await
        .expect("an old definition");
    acme_admin
        .execute("SELECT orca.claim_sync('shop')")
        .await
        .expect("claimed as before");
    let warned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orca.events WHERE kind = 'sync.inline_password' \
         AND data->'at' = '[\"destination.url\"]'",
    )
    .fetch_one(&mut acme_admin)
    .await
    .expect("warning");
    assert_eq!(warned, 1);

    // Rotation: the new key wraps the data keys again; values stay as they are.
    let before: (Vec<u8>, Vec<u8>) = sqlx::query_as(
        "SELECT s.sealed, k.wrapped FROM orca.secrets s JOIN orca.org_keys k USING (org_id)",
    )
    .fetch_one(&mut admin)
    .await
    .expect("before");
    alter_system(
        &mut admin,
        &format!("SET orca.secrets_key_file = '{}'", key_b.display()),
    )
    .await;
    let mut acme_admin = connect_as("postgres", "acme").await;
    assert_eq!(
        code_of(
            &mut acme_admin,
            "SELECT orca.attempt_secret(NULL, 'shop-db')"
        )
        .await,
        "OR092",
        "key b alone cannot open what key a wrapped"
    );
    assert_eq!(
        code_of(&mut acme_admin, "SELECT orca.rewrap_data_keys()").await,
        "OR092"
    );
    alter_system(
        &mut admin,
        &format!("SET orca.secrets_previous_key_file = '{}'", key_a.display()),
    )
    .await;
    let mut acme_admin = connect_as("postgres", "acme").await;
    let n: i32 = sqlx::query_scalar("SELECT orca.rewrap_data_keys()")
        .fetch_one(&mut acme_admin)
        .await
        .expect("rewrap");
    assert_eq!(n, 1);
    let n: i32 = sqlx::query_scalar("SELECT orca.rewrap_data_keys()")
        .fetch_one(&mut acme_admin)
        .await
        .expect("rewrap again");
    assert_eq!(n, 0, "nothing left to rewrap");
    alter_system(&mut admin, "RESET orca.secrets_previous_key_file").await;
    let mut acme_admin = connect_as("postgres", "acme").await;
    let got: String = sqlx::query_scalar("SELECT orca.attempt_secret(NULL, 'shop-db')")
        .fetch_one(&mut acme_admin)
        .await
        .expect("read with key b only");
    assert_eq!(got, value);
    let after: (Vec<u8>, Vec<u8>) = sqlx::query_as(
        "SELECT s.sealed, k.wrapped FROM orca.secrets s JOIN orca.org_keys k USING (org_id)",
    )
    .fetch_one(&mut admin)
    .await
    .expect("after");
    assert_eq!(after.0, before.0, "values were not re-encrypted");
    assert_ne!(after.1, before.1, "the data key was wrapped again");
    let _ = std::fs::remove_dir_all(&keys);
}

/// The whole way: a sync whose source and destination are a secret runs on
/// a runner; the engine reads the secret under its lease, and the value is
/// nowhere a viewer can look.
#[tokio::test]
async fn a_sync_connects_with_a_secret_its_engine_reads_under_its_lease() {
    let db = TestDb::new().await;
    sqlx::raw_sql(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, amount int);
         INSERT INTO public.orders SELECT g, '2024-01-01'::timestamptz + g * interval '1 second', g
         FROM generate_series(1, 5000) g;
         CREATE SCHEMA raw;",
    )
    .execute(&db.pool)
    .await
    .expect("source table");
    // The URL as an operator would keep it: with a password (this server
    // trusts local logins, so it is not checked, only carried).
    let url = db.url().replacen("postgres@", "postgres:hunter2@", 1);
    sqlx::query("SELECT orca.set_secret('shop-db', $1)")
        .bind(&url)
        .execute(&db.pool)
        .await
        .expect("set the secret (scripts/setup.sh configures the installation key)");
    sqlx::query(
        "SELECT orca.create_sync('shop', '{\"type\": \"postgres\", \"url\": {\"secret\": \"shop-db\"}, \"batch_rows\": 1000}', \
         '{\"type\": \"postgres\", \"url\": {\"secret\": \"shop-db\"}, \"schema\": \"raw\"}', \
         '[{\"name\": \"orders\", \"table\": \"public.orders\", \"cursor\": \"updated_at\", \"primary_key\": [\"id\"]}]')",
    )
    .execute(&db.pool)
    .await
    .expect("a sync that names the secret");
    let logs = scratch("secret-sync");
    let store = logs.join("store");
    let store_s = store.to_string_lossy().to_string();
    let engine = bin("orca-engine");
    let env = [
        ("ORCA_STORE", store_s.as_str()),
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
    ];
    let runner = Runner::start(&db.url(), "r1", 1, &logs, &env);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    wait_for_sql(
        &db,
        "the sync's run to succeed",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(120),
        || outputs(&[&runner]),
    )
    .await;
    assert_eq!(db.scalar_i64("SELECT count(*) FROM raw.orders").await, 5000);
    let reads = db
        .scalar_i64("SELECT count(*) FROM orca.events WHERE kind = 'secret.read' AND attempt_id IS NOT NULL")
        .await;
    assert!(reads >= 1, "the engine read the secret under its lease");
    // Nowhere in the control plane's rows, the attempt's log or the runner's output.
    let leaked = db
        .scalar_i64(
            "SELECT (SELECT count(*) FROM orca.syncs WHERE definition::text LIKE '%hunter2%') \
                  + (SELECT count(*) FROM orca.events WHERE data::text LIKE '%hunter2%') \
                  + (SELECT count(*) FROM orca.runs WHERE coalesce(error, '') LIKE '%hunter2%')",
        )
        .await;
    assert_eq!(leaked, 0);
    let log = std::fs::read_to_string(logs.join(format!("default/shop/run-{run}/attempt-1.log")))
        .unwrap_or_default();
    assert!(!log.is_empty() && !log.contains("hunter2"), "{log}");
    assert!(!runner.output().contains("hunter2"));
    drop(runner);
    let _ = std::fs::remove_dir_all(&logs);
}
