//! Secrets: encrypted at rest, read only under a live lease of their org,
//! and surviving a rotation of the installation key.

use super::*;

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
    acme_admin
        .execute("SELECT orca.allow('acme', '/in')")
        .await
        .expect("allow the files source's directory");
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

#[tokio::test]
async fn the_cli_sets_secrets_from_standard_input_and_never_shows_them() {
    use std::io::Write;
    let db = TestDb::new().await;
    let mut set = Command::new(bin("orca"))
        .args(["secrets", "set", "shop-db"])
        .env("DATABASE_URL", db.url())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("orca secrets set");
    set.stdin
        .take()
        .expect("stdin")
        .write_all(b"postgres://app:hunter2@db/shop\n")
        .expect("write the value");
    let out = set.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sealed = db
        .scalar_i64(
            "SELECT count(*) FROM orca.secrets WHERE name = 'shop-db' \
             AND position('hunter2' in encode(sealed, 'escape')) = 0",
        )
        .await;
    assert_eq!(sealed, 1, "the secret is kept, encrypted");
    let list = Command::new(bin("orca"))
        .args(["secrets", "list"])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca secrets list");
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(
        text.contains("shop-db") && !text.contains("hunter2"),
        "{text}"
    );
    let dropped = Command::new(bin("orca"))
        .args(["secrets", "drop", "shop-db"])
        .env("DATABASE_URL", db.url())
        .output()
        .expect("orca secrets drop");
    assert!(dropped.status.success());
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.secrets").await, 0);
}

/// public.orders with `rows` rows, the source of the cloud secrets' syncs.
async fn orders(db: &TestDb, rows: i64) {
    sqlx::raw_sql(&format!(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, amount int);
         INSERT INTO public.orders SELECT g, '2024-01-01'::timestamptz + g * interval '1 second', g
         FROM generate_series(1, {rows}) g;"
    ))
    .execute(&db.pool)
    .await
    .expect("source table");
}

/// The password the syncs' URL holds (`hunter2`) is nowhere but where it
/// was used: not in events, errors or the runner's output.
async fn unleaked(db: &TestDb, runner: &Runner) {
    let leaked = db
        .scalar_i64(
            "SELECT (SELECT count(*) FROM orca.events WHERE data::text LIKE '%hunter2%') \
                  + (SELECT count(*) FROM orca.runs WHERE coalesce(error, '') LIKE '%hunter2%')",
        )
        .await;
    assert_eq!(leaked, 0);
    assert!(!runner.output().contains("hunter2"));
}

/// Sync `name`: public.orders into the schema `raw_<name>` (made here),
/// its source's URL the secret `source`, its destination's `destination`.
async fn secret_sync(db: &TestDb, name: &str, source: &str, destination: &str) {
    sqlx::raw_sql(&format!("CREATE SCHEMA raw_{name}"))
        .execute(&db.pool)
        .await
        .expect("schema");
    sqlx::query(&format!(
        "SELECT orca.create_sync('{name}', '{{\"type\": \"postgres\", \"url\": {{\"secret\": \"{source}\"}}, \"batch_rows\": 1000}}', \
         '{{\"type\": \"postgres\", \"url\": {{\"secret\": \"{destination}\"}}, \"schema\": \"raw_{name}\"}}', \
         '[{{\"name\": \"orders\", \"table\": \"public.orders\", \"cursor\": \"updated_at\", \"primary_key\": [\"id\"]}}]', run_retries => 0)"
    ))
    .execute(&db.pool)
    .await
    .unwrap_or_else(|e| panic!("sync {name}: {e}"));
}

/// moto's server (its Secrets Manager and STS) with each of `names` a JSON
/// secret whose `url` is `url`.
fn moto_with_secrets(url: &str, names: &[&str]) -> orca_tests::s3::S3Server {
    let aws = orca_tests::s3::S3Server::start("unused");
    let made = Command::new(orca_tests::s3::python())
        .args([
            "-c",
            &format!(
                "import boto3, json\n\
                 c = boto3.client('secretsmanager', endpoint_url='{}', aws_access_key_id='orca-test', \
                 aws_secret_access_key='orca-test-secret', region_name='us-east-1')\n\
                 for name in {names:?}:\n    \
                 c.create_secret(Name=name, SecretString=json.dumps({{'url': '{url}', 'user': 'app'}}))\n",
                aws.endpoint
            ),
        ])
        .output()
        .expect("boto3");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    aws
}

/// `aws-sm://` secrets: read by the engine from AWS Secrets Manager (moto's,
/// for real over its HTTP API: no AWS is reachable from CI) with the
/// runner's own credentials, one key of a JSON secret; an org names only
/// secrets under its prefix, so another org's are refused before any
/// request.
#[tokio::test]
async fn a_sync_reads_its_url_from_aws_secrets_manager_under_its_org_s_prefix() {
    let db = TestDb::new().await;
    orders(&db, 2000).await;
    let url = db.url().replacen("postgres@", "postgres:hunter2@", 1);
    let aws = moto_with_secrets(&url, &["default/shop", "globex/shop"]);
    for (name, secret) in [
        ("shop", "aws-sm://default/shop#url"),
        ("stolen", "aws-sm://globex/shop#url"),
        ("missing", "aws-sm://default/nothing#url"),
    ] {
        secret_sync(&db, name, secret, "aws-sm://default/shop#url").await;
    }
    let logs = scratch("aws-sm");
    let store = logs.join("store").to_string_lossy().to_string();
    let engine = bin("orca-engine");
    let endpoint = aws.endpoint.clone();
    let env = [
        ("ORCA_STORE", store.as_str()),
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
        ("AWS_ACCESS_KEY_ID", "orca-test"),
        ("AWS_SECRET_ACCESS_KEY", "orca-test-secret"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT_URL_SECRETS_MANAGER", endpoint.as_str()),
    ];
    let runner = Runner::start(&db.url(), "r1", 1, &logs, &env);
    let mut runs = Vec::new();
    for name in ["shop", "stolen", "missing"] {
        let run: i64 = sqlx::query_scalar(&format!("SELECT orca.run('{name}', 'now')"))
            .fetch_one(&db.pool)
            .await
            .expect("run");
        runs.push(run);
    }
    for (run, status) in runs.iter().zip(["succeeded", "failed", "failed"]) {
        wait_for_sql(
            &db,
            &format!("run {run} to be {status}"),
            &format!("SELECT status = '{status}' FROM orca.runs WHERE id = {run}"),
            Duration::from_secs(120),
            || outputs(&[&runner]),
        )
        .await;
    }
    let copied = db.scalar_i64("SELECT count(*) FROM raw_shop.orders").await;
    assert_eq!(copied, 2000);
    let error = |run: i64| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT error FROM orca.runs WHERE id = $1")
                .bind(run)
                .fetch_one(&pool)
                .await
                .expect("error")
        }
    };
    let stolen = error(runs[1]).await;
    assert!(
        stolen.contains("outside org default's secrets") && stolen.contains("globex/shop"),
        "{stolen}\n{}",
        runner.output()
    );
    let missing = error(runs[2]).await;
    assert!(missing.contains("ResourceNotFoundException"), "{missing}");
    unleaked(&db, &runner).await;
    drop(runner);
    let _ = std::fs::remove_dir_all(&logs);
}

/// `gcp-sm://` and `azure-kv://` secrets: read by the engine with the
/// runner's own identity, against a stand-in for both clouds' APIs
/// (tests/py/cloud_secrets.py: neither service has an emulator that runs
/// here; this one checks the service account's RS256 JWT with its public
/// key and the service principal's secret, as the real token endpoints do).
/// An org names only secrets under its prefix (`<org>--`), so another org's
/// are refused before any request; a missing one is named.
#[tokio::test]
async fn syncs_read_their_urls_from_simulated_gcp_secret_manager_and_azure_key_vault() {
    let db = TestDb::new().await;
    orders(&db, 500).await;
    let url = db.url().replacen("postgres@", "postgres:hunter2@", 1);
    let dir = scratch("cloud-secrets");
    std::fs::create_dir_all(&dir).expect("dir");
    let value = json!({"url": url, "user": "app"}).to_string();
    std::fs::write(
        dir.join("secrets.json"),
        json!({
            "gcp": {
                "projects/shop-prod/secrets/default--shop": value,
                "projects/shop-prod/secrets/globex--shop": value,
            },
            "azure": {"shop-vault/default--shop": value, "shop-vault/globex--shop": value},
            "azure_client": ["runner-app", "s3cret-of-the-runner", "tenant-1"],
        })
        .to_string(),
    )
    .expect("secrets.json");
    let port = orca_tests::stores::free_port();
    let key_file = dir.join("service-account.json");
    let mut server = Command::new(orca_tests::s3::python())
        .arg(orca_tests::repo_root().join("tests/py/cloud_secrets.py"))
        .arg(port.to_string())
        .arg(dir.join("secrets.json"))
        .arg(&key_file)
        .spawn()
        .expect("the stand-in");
    // The stand-in writes the key file before it listens.
    orca_tests::stores::wait_port(port, "the stand-in");
    let cases = [
        (
            "gcp",
            "gcp-sm://projects/shop-prod/secrets/default--shop#url",
            "succeeded",
        ),
        (
            "azure",
            "azure-kv://shop-vault/default--shop#url",
            "succeeded",
        ),
        (
            "gcp_stolen",
            "gcp-sm://projects/shop-prod/secrets/globex--shop#url",
            "failed",
        ),
        (
            "azure_stolen",
            "azure-kv://shop-vault/globex--shop#url",
            "failed",
        ),
        (
            "gcp_missing",
            "gcp-sm://projects/shop-prod/secrets/default--gone#url",
            "failed",
        ),
        (
            "azure_missing",
            "azure-kv://shop-vault/default--gone#url",
            "failed",
        ),
    ];
    for (name, secret, _) in cases {
        secret_sync(&db, name, secret, secret).await;
    }
    let store = dir.join("store").to_string_lossy().to_string();
    let engine = bin("orca-engine");
    let base = format!("http://127.0.0.1:{port}");
    let kv = format!("{base}/kv/{{vault}}");
    let env = [
        ("ORCA_STORE", store.as_str()),
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
        (
            "GOOGLE_APPLICATION_CREDENTIALS",
            key_file.to_str().unwrap_or_default(),
        ),
        (
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER",
            base.as_str(),
        ),
        ("AZURE_CLIENT_ID", "runner-app"),
        ("AZURE_CLIENT_SECRET", "s3cret-of-the-runner"),
        ("AZURE_TENANT_ID", "tenant-1"),
        ("AZURE_AUTHORITY_HOST", base.as_str()),
        ("ORCA_AZURE_KEY_VAULT_URL", kv.as_str()),
    ];
    let runner = Runner::start(&db.url(), "r1", 1, &dir, &env);
    let mut runs = Vec::new();
    for (name, _, status) in cases {
        let run: i64 = sqlx::query_scalar(&format!("SELECT orca.run('{name}', 'now')"))
            .fetch_one(&db.pool)
            .await
            .expect("run");
        runs.push((name, run, status));
    }
    let mut errors = std::collections::BTreeMap::new();
    for (name, run, status) in &runs {
        wait_for_sql(
            &db,
            &format!("run {run} ({name}) to be {status}"),
            &format!("SELECT status = '{status}' FROM orca.runs WHERE id = {run}"),
            Duration::from_secs(120),
            || outputs(&[&runner]),
        )
        .await;
        let error: Option<String> = sqlx::query_scalar("SELECT error FROM orca.runs WHERE id = $1")
            .bind(run)
            .fetch_one(&db.pool)
            .await
            .expect("error");
        errors.insert(*name, error.unwrap_or_default());
    }
    for name in ["gcp", "azure"] {
        let copied = db
            .scalar_i64(&format!("SELECT count(*) FROM raw_{name}.orders"))
            .await;
        assert_eq!(copied, 500, "{name}");
    }
    for (name, shown) in [
        (
            "gcp_stolen",
            "gcp-sm://projects/shop-prod/secrets/globex--shop",
        ),
        ("azure_stolen", "azure-kv://shop-vault/globex--shop"),
    ] {
        let e = &errors[name];
        assert!(
            e.contains("outside org default's secrets") && e.contains(shown),
            "{name}: {e}"
        );
    }
    assert!(
        errors["gcp_missing"].contains("NOT_FOUND")
            && errors["gcp_missing"].contains("default--gone"),
        "{}",
        errors["gcp_missing"]
    );
    assert!(
        errors["azure_missing"].contains("SecretNotFound"),
        "{}",
        errors["azure_missing"]
    );
    // Another org's secrets were never asked for.
    let asked = reqwest::get(format!("{base}/_requests"))
        .await
        .expect("requests")
        .text()
        .await
        .expect("requests");
    assert!(asked.contains("default--shop"), "{asked}");
    assert!(!asked.contains("globex"), "{asked}");
    unleaked(&db, &runner).await;
    drop(runner);
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A runner on EKS has no keys, only its pod's web identity (IRSA): the
/// engine exchanges the token for the role's credentials at STS and reads
/// the secret with them (moto's STS and Secrets Manager, for real over
/// their HTTP APIs; moto does not check the token's signature). Without a
/// readable token the attempt fails naming the file.
#[tokio::test]
async fn a_runner_with_a_web_identity_reads_aws_secrets_as_its_role() {
    let db = TestDb::new().await;
    orders(&db, 300).await;
    let url = db.url().replacen("postgres@", "postgres:hunter2@", 1);
    let aws = moto_with_secrets(&url, &["default/shop"]);
    secret_sync(
        &db,
        "irsa",
        "aws-sm://default/shop#url",
        "aws-sm://default/shop#url",
    )
    .await;
    let dir = scratch("irsa");
    std::fs::create_dir_all(&dir).expect("dir");
    // A projected service account token, as EKS mounts it.
    let token_file = dir.join("token");
    std::fs::write(
        &token_file,
        "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6b3JjYTpydW5uZXIifQ.c2ln",
    )
    .expect("token");
    let store = dir.join("store").to_string_lossy().to_string();
    let engine = bin("orca-engine");
    let run_with = |token: &std::path::Path| {
        let token = token.to_string_lossy().to_string();
        let env = vec![
            ("ORCA_STORE", store.clone()),
            ("ORCA_ENGINE", engine.to_string_lossy().to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            ("AWS_ENDPOINT_URL", aws.endpoint.clone()),
            (
                "AWS_ROLE_ARN",
                "arn:aws:iam::123456789012:role/orca-runner".to_string(),
            ),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token),
        ];
        let env: Vec<(&str, String)> = env;
        let refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Runner::start(&db.url(), "r1", 1, &dir.join("logs"), &refs)
    };
    let runner = run_with(&token_file);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('irsa', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    orca_tests::procs::wait_run(&db, run, "succeeded", &runner).await;
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM raw_irsa.orders").await,
        300
    );
    unleaked(&db, &runner).await;
    drop(runner);

    let gone = dir.join("no-such-token");
    let runner = run_with(&gone);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('irsa', 'now')")
        .fetch_one(&db.pool)
        .await
        .expect("run");
    orca_tests::procs::wait_run(&db, run, "failed", &runner).await;
    let error: String = sqlx::query_scalar("SELECT error FROM orca.runs WHERE id = $1")
        .bind(run)
        .fetch_one(&db.pool)
        .await
        .expect("error");
    assert!(
        error.contains("AWS_WEB_IDENTITY_TOKEN_FILE") && error.contains("no-such-token"),
        "{error}"
    );
    drop(runner);
    let _ = std::fs::remove_dir_all(&dir);
}
