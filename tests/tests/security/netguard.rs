//! Netguard: an operator of one org points a sync at what its org may not
//! reach (the control plane's own loopback, a metadata address, the runner
//! host's files, the installation's store) and is refused, at definition
//! time where the definition shows it and by the engine where a name must
//! be resolved first; only an admin's allowlist entry for that org lets it
//! through.

use super::*;

/// A sync definition's pieces as JSON.
fn pg_source(url: &str) -> Value {
    json!({"type": "postgres", "url": url, "batch_rows": 1000})
}

fn orders_stream() -> Value {
    json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
            "primary_key": ["id"]}])
}

async fn create_sync(
    c: &mut PgConnection,
    name: &str,
    source: &Value,
    destination: &Value,
    streams: &Value,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT orca.create_sync($1, $2, $3, $4, NULL, 'at_least_once', 'default', 0)",
    )
    .bind(name)
    .bind(source)
    .bind(destination)
    .bind(streams)
    .fetch_one(c)
    .await
}

/// The SQLSTATE and message of a failed call.
fn refusal(e: sqlx::Error) -> (String, String) {
    match e {
        sqlx::Error::Database(d) => (
            d.code().map(|c| c.to_string()).unwrap_or_default(),
            d.message().to_string(),
        ),
        other => (String::new(), other.to_string()),
    }
}

/// Waits for a run to fail and returns its last attempt's error.
async fn failed(db: &TestDb, run: i64, runner: &Runner) -> String {
    wait_for_sql(
        db,
        &format!("run {run} to fail"),
        &format!("SELECT status = 'failed' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(120),
        || outputs(&[runner]),
    )
    .await;
    sqlx::query_scalar(
        "SELECT coalesce(error, '') FROM orca.attempts WHERE run_id = $1 ORDER BY id DESC LIMIT 1",
    )
    .bind(run)
    .fetch_one(&db.pool)
    .await
    .expect("the attempt's error")
}

#[tokio::test]
async fn netguard_refuses_what_the_org_s_allowlist_does_not_permit() {
    let db = TestDb::new().await;
    roles(&db).await;
    db.pool
        .execute(
            format!(
                "SELECT orca.create_org('acme'), orca.create_org('globex');
                 SELECT orca.add_member('acme', '{OPERATOR}')"
            )
            .as_str(),
        )
        .await
        .expect("two orgs");
    sqlx::raw_sql(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, amount int);
         INSERT INTO public.orders SELECT g, '2024-01-01'::timestamptz + g * interval '1 second', g
         FROM generate_series(1, 3000) g;
         CREATE SCHEMA raw;",
    )
    .execute(&db.pool)
    .await
    .expect("source table");
    let dir = scratch("netguard");
    let store = dir.join("store");
    let inbox = dir.join("inbox");
    std::fs::create_dir_all(&inbox).expect("inbox");
    std::fs::write(inbox.join("a.jsonl"), "{\"id\": 1}\n").expect("a file");
    // A symlink under an allowed root that leads out of it.
    std::os::unix::fs::symlink("/etc", inbox.join("etc")).expect("symlink");
    let url_127 = db.url(); // postgres://postgres@127.0.0.1:5432/<db>
    let url_localhost = url_127.replacen("127.0.0.1", "localhost", 1);
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    let parquet = json!({"type": "parquet", "url": dir.join("out").to_string_lossy()});

    // What the definition shows is judged at once, and nothing is written.
    let files = |url: &str| json!({"type": "files", "url": url, "format": "jsonl"});
    let events = json!([{"name": "events", "pattern": "*.jsonl"}]);
    for (source, destination, streams, says) in [
        (
            pg_source(&url_127),
            parquet.clone(),
            orders_stream(),
            "at 127.0.0.1: a loopback address",
        ),
        (
            pg_source("postgres://app@169.254.169.254/latest"),
            parquet.clone(),
            orders_stream(),
            "a cloud metadata address",
        ),
        (
            pg_source("host=db.internal hostaddr=10.1.2.3 dbname=shop"),
            parquet.clone(),
            orders_stream(),
            "at 10.1.2.3: a private address (10.0.0.0/8)",
        ),
        (
            pg_source("postgres://app@[::ffff:127.0.0.1]/shop"),
            parquet.clone(),
            orders_stream(),
            "a loopback address",
        ),
        (
            pg_source("host=/var/run/postgresql dbname=shop"),
            parquet.clone(),
            orders_stream(),
            "no local roots",
        ),
        (
            files("/etc"),
            parquet.clone(),
            events.clone(),
            "no local roots",
        ),
        (
            pg_source(&url_localhost),
            json!({"type": "postgres", "url": url_127, "schema": "raw"}),
            orders_stream(),
            "a loopback address",
        ),
    ] {
        let before = db.table_counts().await;
        let (code, msg) = refusal(
            create_sync(&mut op, "shop", &source, &destination, &streams)
                .await
                .expect_err("refused"),
        );
        assert_eq!(code, "OR094", "{source}: {msg}");
        assert!(msg.contains(says), "{source}: {msg}");
        assert_eq!(db.table_counts().await, before, "{source} wrote something");
    }
    // Only admins change an allowlist: not acme's operator, for acme or globex.
    for sql in [
        "SELECT orca.allow('acme', '127.0.0.1')",
        "SELECT orca.allow('globex', '0.0.0.0/0')",
        "SELECT orca.disallow('acme', '127.0.0.1')",
        "INSERT INTO orca.allowlist (org_id, target, kind) VALUES (1, '127.0.0.1/32', 'network')",
    ] {
        assert_eq!(code_of(&mut op, sql).await, "42501", "{sql}");
    }
    let mut admin = db.connect().await;
    assert_eq!(
        code_of(&mut admin, "SELECT orca.allow('acme', '10.0.0.1/8')").await,
        "OR093"
    );
    assert_eq!(
        code_of(&mut admin, "SELECT orca.allow('nowhere', '10.0.0.0/8')").await,
        "OR001"
    );
    // Another org's entry does not carry over.
    sqlx::query("SELECT orca.allow('globex', '127.0.0.1'), orca.allow('globex', '::1')")
        .execute(&mut admin)
        .await
        .expect("allow globex");
    let (code, _) = refusal(
        create_sync(
            &mut op,
            "shop",
            &pg_source(&url_127),
            &parquet,
            &orders_stream(),
        )
        .await
        .expect_err("globex's entry is not acme's"),
    );
    assert_eq!(code, "OR094");
    // A change stream reaches its host as a table source does: globex's
    // entry does not let acme's CDC sync read this machine's cluster.
    let (code, msg) = refusal(
        create_sync(
            &mut op,
            "shop",
            &json!({"type": "postgres_cdc", "url": url_127}),
            &parquet,
            &json!([{"name": "orders", "table": "public.orders", "primary_key": ["id"]}]),
        )
        .await
        .expect_err("a CDC source on loopback"),
    );
    assert_eq!(code, "OR094", "{msg}");
    assert!(msg.contains("a loopback address"), "{msg}");
    let seen: Vec<String> = sqlx::query_scalar("SELECT target FROM orca.allowlist")
        .fetch_all(&mut op)
        .await
        .expect("acme reads its allowlist");
    assert!(seen.is_empty(), "acme sees globex's entries: {seen:?}");

    // A name is judged when the engine resolves it: the definition passes,
    // the attempt is refused before anything is read or written.
    create_sync(
        &mut op,
        "shop",
        &pg_source(&url_localhost),
        &json!({"type": "postgres", "url": url_localhost, "schema": "raw"}),
        &orders_stream(),
    )
    .await
    .expect("a host name passes the definition");
    let token = token(&db, "acme", "default", "acme-runner").await;
    let logs = dir.join("logs");
    let (engine, store_s) = (bin("orca-engine"), store.to_string_lossy().to_string());
    let env = [
        ("ORCA_STORE", store_s.as_str()),
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
        ("ORCA_RUNNER_TOKEN", token.as_str()),
    ];
    let runner = Runner::start(&url_as(&db, RUNNER_LOGIN), "acme-runner", 1, &logs, &env);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&mut op)
        .await
        .expect("run");
    let error = failed(&db, run, &runner).await;
    assert!(
        error.contains("netguard refused localhost at")
            && error.contains("a loopback address")
            && error.contains("orca.allow('acme', 'localhost')"),
        "{error}\n{}",
        outputs(&[&runner])
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM pg_tables WHERE schemaname = 'raw'")
            .await,
        0,
        "the refused attempt wrote to its destination"
    );

    // The admin allows acme's loopback: the same sync runs.
    sqlx::query("SELECT orca.allow('acme', 'localhost', note => 'the test cluster')")
        .execute(&mut admin)
        .await
        .expect("allow acme");
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&mut op)
        .await
        .expect("run again");
    wait_for_sql(
        &db,
        "the allowed sync to succeed",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(120),
        || outputs(&[&runner]),
    )
    .await;
    assert_eq!(db.scalar_i64("SELECT count(*) FROM raw.orders").await, 3000);

    // Local paths: under an allowed root, but not through a symlink out of
    // it, and never into the installation's store.
    sqlx::query("SELECT orca.allow('acme', $1)")
        .bind(dir.to_string_lossy().to_string())
        .execute(&mut admin)
        .await
        .expect("allow acme's scratch directory");
    for (name, source, says) in [
        (
            "through_a_link",
            files(&inbox.join("etc").to_string_lossy()),
            "it resolves to /etc",
        ),
        (
            "into_the_store",
            files(&store_s),
            "the installation's store",
        ),
    ] {
        create_sync(&mut op, name, &source, &parquet, &events)
            .await
            .expect("the definition is under the allowed root as written");
        let run: i64 = sqlx::query_scalar("SELECT orca.run($1, 'now')")
            .bind(name)
            .fetch_one(&mut op)
            .await
            .expect("run");
        let error = failed(&db, run, &runner).await;
        assert!(
            error.contains("netguard refused the local path") && error.contains(says),
            "{name}: {error}"
        );
    }
    drop(runner);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_cli_keeps_allowlists_for_admins_and_shows_them_to_members() {
    let db = TestDb::new().await;
    roles(&db).await;
    db.pool
        .execute(
            format!("SELECT orca.create_org('acme'); SELECT orca.add_member('acme', '{OPERATOR}')")
                .as_str(),
        )
        .await
        .expect("an org");
    let orca = |url: String, org: &str, args: &[&str]| {
        Command::new(bin("orca"))
            .args(args)
            .env("DATABASE_URL", url)
            .env("ORCA_ORG", org)
            .output()
            .expect("run orca")
    };
    let out = orca(
        db.url(),
        "acme",
        &[
            "allowlist",
            "add",
            "acme",
            "10.20.0.1",
            "--note",
            "the warehouse",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("org acme may reach 10.20.0.1/32"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A member sees the entry; only an admin changes the list.
    let listed = orca(url_as(&db, OPERATOR), "acme", &["allowlist", "list"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && text.contains("10.20.0.1/32") && text.contains("the warehouse"),
        "{text}{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    for args in [
        ["allowlist", "add", "acme", "0.0.0.0/0"],
        ["allowlist", "remove", "acme", "10.20.0.1"],
    ] {
        let out = orca(url_as(&db, OPERATOR), "acme", &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("42501"),
            "{args:?}: {err}"
        );
    }
    let bad = orca(
        db.url(),
        "acme",
        &["allowlist", "add", "acme", "10.0.0.1/8"],
    );
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("OR093"), "{err}");
    let out = orca(
        db.url(),
        "acme",
        &["allowlist", "remove", "acme", "10.20.0.1"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM orca.allowlist a JOIN orca.orgs o ON o.id = a.org_id \
             WHERE o.name = 'acme'"
        )
        .await,
        0
    );
}

/// An external connector's config names servers (its spec says which
/// options do): the attempt checks them against the org's allowlist before
/// the connector reads, so acme's operator cannot aim a connector at what
/// acme may not reach; once the admin allows it, the connector runs.
#[tokio::test]
async fn a_connector_s_servers_are_judged_by_the_org_s_allowlist_before_it_reads() {
    let db = TestDb::new().await;
    roles(&db).await;
    db.pool
        .execute(
            format!(
                "SELECT orca.create_org('acme');
                 SELECT orca.add_member('acme', '{OPERATOR}')"
            )
            .as_str(),
        )
        .await
        .expect("acme");
    let dir = scratch("netguard-connector");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).expect("out");
    let mut admin = db.connect().await;
    sqlx::query("SELECT orca.allow('acme', $1)")
        .bind(out.to_string_lossy().to_string())
        .execute(&mut admin)
        .await
        .expect("acme may write its directory");
    // The connectors directory: the test's misbehaving connector, whose spec
    // says its `servers` option names servers; it logs every read it starts.
    use std::os::unix::fs::PermissionsExt;
    let conns = dir.join("connectors");
    std::fs::create_dir_all(&conns).expect("connectors");
    let script = repo_root().join("tests/py/connectors/misbehave.py");
    std::fs::write(
        conns.join("misbehave"),
        format!(
            "#!/bin/sh\nexec {} {} crash \"$@\"\n",
            orca_tests::s3::python(),
            script.display()
        ),
    )
    .expect("connector");
    std::fs::set_permissions(
        conns.join("misbehave"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    let reads = dir.join("reads.log");

    let mut op = connect_org(&db, OPERATOR, "acme").await;
    create_sync(
        &mut op,
        "feed",
        &json!({"type": "connector", "connector": "misbehave", "replay": "exact",
                "config": {"servers": "nats://127.0.0.1:4222"}}),
        &json!({"type": "parquet", "url": out.to_string_lossy()}),
        &json!([{"name": "events"}]),
    )
    .await
    .expect("the definition names no server netguard knows of");
    let token = token(&db, "acme", "default", "acme-runner").await;
    let (engine, store) = (bin("orca-engine"), dir.join("store"));
    let (store_s, conns_s, reads_s) = (
        store.to_string_lossy().to_string(),
        conns.to_string_lossy().to_string(),
        reads.to_string_lossy().to_string(),
    );
    let env = [
        ("ORCA_STORE", store_s.as_str()),
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
        ("ORCA_RUNNER_TOKEN", token.as_str()),
        ("ORCA_CONNECTORS", conns_s.as_str()),
        ("MISBEHAVE_LOG", reads_s.as_str()),
    ];
    let runner = Runner::start(
        &url_as(&db, RUNNER_LOGIN),
        "acme-runner",
        1,
        &dir.join("logs"),
        &env,
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.run('feed', 'now')")
        .fetch_one(&mut op)
        .await
        .expect("run");
    let error = failed(&db, run, &runner).await;
    assert!(
        error.contains("netguard refused 127.0.0.1") && error.contains("a loopback address"),
        "{error}\n{}",
        outputs(&[&runner])
    );
    assert!(
        !reads.exists(),
        "the connector started reading: {:?}",
        std::fs::read_to_string(&reads)
    );

    // Allowed by the admin, the connector reads (and this one then fails
    // its own way).
    sqlx::query("SELECT orca.allow('acme', '127.0.0.1')")
        .execute(&mut admin)
        .await
        .expect("allow acme");
    let run: i64 = sqlx::query_scalar("SELECT orca.run('feed', 'now')")
        .fetch_one(&mut op)
        .await
        .expect("run again");
    let error = failed(&db, run, &runner).await;
    assert!(
        error.contains("connector misbehave") && error.contains("the source fell over"),
        "{error}\n{}",
        outputs(&[&runner])
    );
    assert!(
        std::fs::read_to_string(&reads)
            .unwrap_or_default()
            .contains("crash read"),
        "the allowed connector read"
    );
    drop(runner);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_discovery_is_judged_by_the_org_s_allowlist_and_its_catalog_stays_in_its_org() {
    let db = TestDb::new().await;
    roles(&db).await;
    db.pool
        .execute(
            format!(
                "SELECT orca.create_org('acme'), orca.create_org('globex');
                 SELECT orca.add_member('acme', '{OPERATOR}')"
            )
            .as_str(),
        )
        .await
        .expect("two orgs");
    sqlx::raw_sql(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)",
    )
    .execute(&db.pool)
    .await
    .expect("source table");
    let mut admin = db.connect().await;
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    let url_localhost = db.url().replacen("127.0.0.1", "localhost", 1);
    let runs = || db.scalar_i64("SELECT count(*) FROM orca.runs WHERE kind = 'discover'");

    // An address in the source is judged at once: no run is queued.
    let e = sqlx::query("SELECT orca.discover('shop', $1)")
        .bind(pg_source(&db.url()))
        .execute(&mut op)
        .await
        .expect_err("acme may not reach the control plane's loopback");
    let (code, message) = refusal(e);
    assert_eq!(code, "OR094", "{message}");
    assert!(message.contains("127.0.0.1"), "{message}");
    assert_eq!(runs().await, 0);
    // Plain-text passwords and sources with no catalog are refused too.
    for (source, code) in [
        (pg_source("postgres://app:hunter2@db.example/shop"), "OR063"),
        (
            json!({"type": "files", "url": "/in", "format": "jsonl"}),
            "OR063",
        ),
        (json!({"type": "ftp", "url": "ftp://x"}), "OR060"),
    ] {
        let e = sqlx::query("SELECT orca.discover('shop', $1)")
            .bind(&source)
            .execute(&mut op)
            .await
            .expect_err("refused");
        assert_eq!(refusal(e).0, code, "{source}");
    }
    assert_eq!(runs().await, 0);

    // A name is judged when the runner's engine resolves it.
    let dir = scratch("netguard-discover");
    let token = token(&db, "acme", "default", "acme-runner").await;
    let engine = bin("orca-engine");
    let env = [
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
        ("ORCA_RUNNER_TOKEN", token.as_str()),
    ];
    let runner = Runner::start(
        &url_as(&db, RUNNER_LOGIN),
        "acme-runner",
        1,
        &dir.join("logs"),
        &env,
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.discover('shop', $1)")
        .bind(pg_source(&url_localhost))
        .fetch_one(&mut op)
        .await
        .expect("a host name passes");
    let error = failed(&db, run, &runner).await;
    assert!(
        error.contains("netguard refused localhost at") && error.contains("a loopback address"),
        "{error}\n{}",
        outputs(&[&runner])
    );
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.catalogs").await, 0);

    // Allowed by the admin, the same discovery stores acme's catalog, which
    // globex neither sees nor plans from.
    sqlx::query("SELECT orca.allow('acme', 'localhost')")
        .execute(&mut admin)
        .await
        .expect("allow acme");
    let run: i64 = sqlx::query_scalar("SELECT orca.discover('shop', $1)")
        .bind(pg_source(&url_localhost))
        .fetch_one(&mut op)
        .await
        .expect("discover again");
    wait_for_sql(
        &db,
        "the allowed discovery to succeed",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(120),
        || outputs(&[&runner]),
    )
    .await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT s->>'table' FROM orca.catalogs c, jsonb_array_elements(c.catalog->'streams') s
         WHERE c.name = 'shop' ORDER BY 1",
    )
    .fetch_all(&mut op)
    .await
    .expect("acme's catalog");
    assert!(tables.contains(&"public.orders".to_string()), "{tables:?}");
    const GLOBEX_OP: &str = "orca_t_sec_globex_operator";
    ensure_role(&db, GLOBEX_OP, &["orca_operator"]).await;
    sqlx::query("SELECT orca.add_member('globex', $1)")
        .bind(GLOBEX_OP)
        .execute(&mut admin)
        .await
        .expect("globex's operator");
    let mut globex = connect_org(&db, GLOBEX_OP, "globex").await;
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM orca.catalogs")
        .fetch_one(&mut globex)
        .await
        .expect("globex's catalogs");
    assert_eq!(seen, 0, "globex sees acme's catalog");
    let e = sqlx::query(
        "SELECT orca.create_sync('shop', $1, '{\"type\": \"parquet\", \"url\": \"/out\"}', '{\"catalog\": true}')",
    )
    .bind(json!({"type": "postgres", "url": "postgres://db.example/shop"}))
    .execute(&mut globex)
    .await
    .expect_err("globex has no catalog named shop");
    let (code, message) = refusal(e);
    assert_eq!(code, "OR063", "{message}");
    assert!(message.contains("no catalog"), "{message}");
    drop(runner);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_destination_connector_s_servers_are_judged_before_it_writes() {
    let db = TestDb::new().await;
    roles(&db).await;
    db.pool
        .execute(
            format!(
                "SELECT orca.create_org('acme');
                 SELECT orca.add_member('acme', '{OPERATOR}')"
            )
            .as_str(),
        )
        .await
        .expect("acme");
    let dir = scratch("netguard-dest-connector");
    let inbox = dir.join("in");
    std::fs::create_dir_all(&inbox).expect("inbox");
    std::fs::write(inbox.join("a.jsonl"), "{\"id\": 1}\n{\"id\": 2}\n").expect("a file");
    let mut admin = db.connect().await;
    sqlx::query("SELECT orca.allow('acme', $1)")
        .bind(inbox.to_string_lossy().to_string())
        .execute(&mut admin)
        .await
        .expect("acme may read its directory");
    use std::os::unix::fs::PermissionsExt;
    let conns = dir.join("connectors");
    std::fs::create_dir_all(&conns).expect("connectors");
    let script = repo_root().join("connectors/python/examples/redis_hash.py");
    std::fs::write(
        conns.join("redis_hash"),
        format!(
            "#!/bin/sh\nexec {} {} \"$@\"\n",
            orca_tests::s3::python(),
            script.display()
        ),
    )
    .expect("connector");
    std::fs::set_permissions(
        conns.join("redis_hash"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    let prefix = format!("orca_t_ng_{}:", uuid::Uuid::new_v4().simple());
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    create_sync(
        &mut op,
        "feed",
        &json!({"type": "files", "url": inbox.to_string_lossy(), "format": "jsonl"}),
        &json!({"type": "connector", "connector": "redis_hash", "commits": "atomic",
                "config": {"url": "redis://127.0.0.1:6379/0", "prefix": prefix}}),
        &json!([{"name": "events", "pattern": "*.jsonl"}]),
    )
    .await
    .expect("the definition names no server netguard knows of");
    let token = token(&db, "acme", "default", "acme-runner").await;
    let (engine, store) = (bin("orca-engine"), dir.join("store"));
    let (store_s, conns_s) = (
        store.to_string_lossy().to_string(),
        conns.to_string_lossy().to_string(),
    );
    let env = [
        ("ORCA_STORE", store_s.as_str()),
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
        ("ORCA_RUNNER_TOKEN", token.as_str()),
        ("ORCA_CONNECTORS", conns_s.as_str()),
    ];
    let runner = Runner::start(
        &url_as(&db, RUNNER_LOGIN),
        "acme-runner",
        1,
        &dir.join("logs"),
        &env,
    );
    let keys = || {
        let o = std::process::Command::new(orca_tests::s3::python())
            .args([
                "-c",
                "import redis, sys; print(len(list(redis.Redis().scan_iter(sys.argv[1] + '*'))))",
                &prefix,
            ])
            .output()
            .expect("redis");
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let run: i64 = sqlx::query_scalar("SELECT orca.run('feed', 'now')")
        .fetch_one(&mut op)
        .await
        .expect("run");
    let error = failed(&db, run, &runner).await;
    assert!(
        error.contains("netguard refused 127.0.0.1") && error.contains("a loopback address"),
        "{error}\n{}",
        outputs(&[&runner])
    );
    assert_eq!(keys(), "0", "the refused connector wrote");

    // Allowed by the admin, the same sync writes its rows.
    sqlx::query("SELECT orca.allow('acme', '127.0.0.1')")
        .execute(&mut admin)
        .await
        .expect("allow acme");
    let run: i64 = sqlx::query_scalar("SELECT orca.run('feed', 'now')")
        .fetch_one(&mut op)
        .await
        .expect("run again");
    wait_for_sql(
        &db,
        "the allowed sync to succeed",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(120),
        || outputs(&[&runner]),
    )
    .await;
    // The list, the fence and the marker.
    assert_eq!(keys(), "3", "{}", outputs(&[&runner]));
    drop(runner);
    let _ = std::process::Command::new(orca_tests::s3::python())
        .args([
            "-c",
            "import redis, sys; r = redis.Redis(); [r.delete(k) for k in r.scan_iter(sys.argv[1] + '*')]",
            &prefix,
        ])
        .output();
    let _ = std::fs::remove_dir_all(dir);
}

/// A database with org acme (OPERATOR its member) and a table of orders on
/// the control plane's own cluster, which acme may not reach.
async fn acme_with_orders() -> TestDb {
    let db = TestDb::new().await;
    roles(&db).await;
    db.pool
        .execute(
            format!(
                "SELECT orca.create_org('acme');
                 SELECT orca.add_member('acme', '{OPERATOR}')"
            )
            .as_str(),
        )
        .await
        .expect("an org");
    sqlx::raw_sql(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, amount int);
         INSERT INTO public.orders SELECT g, now(), g FROM generate_series(1, 10) g;",
    )
    .execute(&db.pool)
    .await
    .expect("a table on the control plane's cluster");
    db
}

/// An address pinned to an allowed name (`hostaddr`) is judged by itself,
/// when the definition shows it and again when the engine connects (the
/// string in a secret, which the definition cannot see): an entry for
/// `db.internal` does not carry `hostaddr=127.0.0.1` to the control plane's
/// own database, for a sync or a discovery. And a files source reads
/// nothing a link leads to outside its directory.
#[tokio::test]
async fn a_pinned_address_and_a_link_out_of_a_files_source_are_refused() {
    let db = acme_with_orders().await;
    let dir = scratch("pinned");
    let root = dir.join("in");
    let outside = dir.join("outside");
    std::fs::create_dir_all(&root).expect("in");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(root.join("a.jsonl"), "{\"id\": 1}\n").expect("a file");
    std::fs::write(
        outside.join("secret.jsonl"),
        "{\"id\": 2, \"what\": \"TOPSECRET\"}\n",
    )
    .expect("a file outside");
    std::os::unix::fs::symlink(outside.join("secret.jsonl"), root.join("b.jsonl"))
        .expect("a link out of the root");
    std::os::unix::fs::symlink(&outside, root.join("sub")).expect("a directory link out");
    let mut admin = db.connect().await;
    for target in [
        "db.internal".to_string(),
        root.to_string_lossy().to_string(),
        dir.join("out").to_string_lossy().to_string(),
    ] {
        sqlx::query("SELECT orca.allow('acme', $1)")
            .bind(target)
            .execute(&mut admin)
            .await
            .expect("acme's allowlist");
    }
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    let parquet = json!({"type": "parquet", "url": dir.join("out").to_string_lossy()});
    let pinned = format!(
        "host=db.internal hostaddr=127.0.0.1 port=5432 dbname={} user=postgres",
        db.name
    );

    // Written in the definition: refused at once, in either form.
    for url in [
        pinned.clone(),
        format!(
            "postgres://postgres@db.internal:5432/{}?hostaddr=127.0.0.1",
            db.name
        ),
        format!(
            "host=db.internal hostaddr=169.254.169.254 dbname={}",
            db.name
        ),
    ] {
        let (code, msg) = refusal(
            create_sync(
                &mut op,
                "shop",
                &pg_source(&url),
                &parquet,
                &orders_stream(),
            )
            .await
            .expect_err("a pinned address the allowlist does not permit"),
        );
        assert_eq!(code, "OR094", "{url}: {msg}");
        assert!(
            msg.contains("127.0.0.1") || msg.contains("169.254.169.254"),
            "{msg}"
        );
        let e = sqlx::query("SELECT orca.discover('probe', $1)")
            .bind(pg_source(&url))
            .execute(&mut op)
            .await
            .expect_err("a discovery through the pinned address");
        assert_eq!(refusal(e).0, "OR094", "{url}");
    }
    // In a secret, it is judged when the engine connects.
    sqlx::query("SELECT orca.set_secret('cp', $1)")
        .bind(&pinned)
        .execute(&mut op)
        .await
        .expect("a secret");
    let hidden = json!({"type": "postgres", "url": {"secret": "cp"}, "batch_rows": 1000});
    create_sync(&mut op, "shop", &hidden, &parquet, &orders_stream())
        .await
        .expect("the definition cannot see into a secret");
    let store = dir.join("store");
    let runner = sync_runner_with(&db, &store, &dir.join("logs"), &[("ORCA_ORG", "acme")]);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&mut op)
        .await
        .expect("run");
    let error = failed(&db, run, &runner).await;
    assert!(
        error.contains("netguard refused") && error.contains("127.0.0.1"),
        "{error}\n{}",
        outputs(&[&runner])
    );
    let run: i64 = sqlx::query_scalar("SELECT orca.discover('shop')")
        .fetch_one(&mut op)
        .await
        .expect("a discovery of the secret's source");
    let error = failed(&db, run, &runner).await;
    assert!(
        error.contains("netguard refused") && error.contains("127.0.0.1"),
        "{error}\n{}",
        outputs(&[&runner])
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.catalogs").await,
        0,
        "a catalog of the control plane's database was stored"
    );

    // A files source: a link in its directory to a file outside it, and a
    // directory link out of it, fail the stream; nothing is delivered.
    let files = json!({"type": "files", "url": root.to_string_lossy(), "format": "jsonl"});
    for (name, pattern, listed) in [
        ("linked_file", "*.jsonl", "b.jsonl"),
        ("linked_dir", "sub/*.jsonl", "sub/secret.jsonl"),
    ] {
        create_sync(
            &mut op,
            name,
            &files,
            &parquet,
            &json!([{"name": "events", "pattern": pattern}]),
        )
        .await
        .expect("the files source's directory is allowed");
        let run: i64 = sqlx::query_scalar("SELECT orca.run($1, 'now')")
            .bind(name)
            .fetch_one(&mut op)
            .await
            .expect("run");
        let error = failed(&db, run, &runner).await;
        assert!(
            error.contains("outside the source's directory") && error.contains(listed),
            "{name}: {error}\n{}",
            outputs(&[&runner])
        );
        // The refusal does not say where outside the link leads.
        assert!(!error.contains(&*outside.to_string_lossy()), "{error}");
    }
    let leaked = walk(&dir.join("out"))
        .into_iter()
        .chain(walk(&store))
        .filter(|f| std::fs::read(f).is_ok_and(|b| b.windows(9).any(|w| w == b"TOPSECRET")))
        .collect::<Vec<_>>();
    assert!(
        leaked.is_empty(),
        "the file outside was delivered: {leaked:?}"
    );
    drop(runner);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}

/// A name is judged by what it resolves to where and when the engine
/// connects, not where the sync was defined: on the runner's host (here a
/// mount namespace whose /etc/hosts the test writes) `rebind.test`
/// resolves to the control plane's loopback, which acme's allowlist (a
/// private network the name was meant to be in) does not permit.
#[tokio::test]
async fn a_name_is_judged_by_what_it_resolves_to_when_the_engine_connects() {
    let db = acme_with_orders().await;
    let dir = scratch("rebind");
    let out = dir.join("out");
    let hosts = dir.join("hosts");
    let mut text = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    text.push_str("\n127.0.0.1 rebind.test\n");
    std::fs::write(&hosts, text).expect("the runner host's hosts file");
    let mut admin = db.connect().await;
    for target in ["10.9.9.0/24".to_string(), out.to_string_lossy().to_string()] {
        sqlx::query("SELECT orca.allow('acme', $1)")
            .bind(target)
            .execute(&mut admin)
            .await
            .expect("acme's allowlist");
    }
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    let source = pg_source(&format!(
        "host=rebind.test port=5432 dbname={} user=postgres",
        db.name
    ));
    create_sync(
        &mut op,
        "shop",
        &source,
        &json!({"type": "parquet", "url": out.to_string_lossy()}),
        &orders_stream(),
    )
    .await
    .expect("a name passes the definition: it is judged where it is resolved");
    let token = token(&db, "acme", "default", "rebind-runner").await;
    let (engine, store_s) = (
        bin("orca-engine"),
        dir.join("store").to_string_lossy().to_string(),
    );
    let attempt_url = url_as(&db, ATTEMPT_LOGIN);
    let env = [
        ("ORCA_STORE", store_s.as_str()),
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
        ("ORCA_RUNNER_TOKEN", token.as_str()),
        ("ORCA_ATTEMPT_DATABASE_URL", attempt_url.as_str()),
    ];
    let mount = format!(
        "mount --bind '{}' /etc/hosts && exec \"$0\" \"$@\"",
        hosts.display()
    );
    let runner = Runner::start_under(
        &["unshare", "-m", "sh", "-c", &mount],
        &url_as(&db, RUNNER_LOGIN),
        "rebind-runner",
        1,
        &dir.join("logs"),
        &env,
    );
    for sql in [
        "SELECT orca.run('shop', 'now')",
        "SELECT orca.discover('shop')",
    ] {
        let run: i64 = sqlx::query_scalar(sql)
            .fetch_one(&mut op)
            .await
            .expect("a run");
        let error = failed(&db, run, &runner).await;
        assert!(
            error.contains("netguard refused rebind.test at 127.0.0.1")
                && error.contains("a loopback address"),
            "{sql}: {error}\n{}",
            outputs(&[&runner])
        );
    }
    assert!(
        walk(&out).is_empty(),
        "the refused sync wrote {:?}",
        walk(&out)
    );
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.catalogs").await, 0);
    drop(runner);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An object store destination is judged like a host and a path: the
/// installation's store in Azure Blob Storage (azurite, an emulator of its
/// API: no Azure is reachable here) is refused in another spelling of its
/// URL, a URL naming another storage account is refused before anything
/// is sent, and the store's endpoint is a host the org's allowlist must
/// permit.
#[tokio::test]
async fn an_azure_destination_stays_out_of_the_installation_s_store_and_other_accounts() {
    use orca_tests::stores::ObjectServer;
    let db = acme_with_orders().await;
    let azurite = orca_tests::stores::Azurite::start("orca");
    let dir = scratch("az-netguard");
    let inbox = dir.join("inbox");
    std::fs::create_dir_all(&inbox).expect("inbox");
    std::fs::write(inbox.join("a.jsonl"), "{\"id\": 1}\n{\"id\": 2}\n").expect("a file");
    let mut admin = db.connect().await;
    sqlx::query("SELECT orca.allow('acme', $1)")
        .bind(inbox.to_string_lossy().to_string())
        .execute(&mut admin)
        .await
        .expect("acme's inbox");
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    let files = json!({"type": "files", "url": inbox.to_string_lossy(), "format": "jsonl"});
    let events = json!([{"name": "events", "pattern": "*.jsonl"}]);
    let env: Vec<(&str, String)> = azurite
        .env()
        .into_iter()
        .chain([("ORCA_ORG", "acme".to_string())])
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let runner = sync_runner_with(
        &db,
        std::path::Path::new("az://orca/store"),
        &dir.join("logs"),
        &env,
    );
    async fn run(
        op: &mut PgConnection,
        name: &str,
        url: &str,
        files: &Value,
        events: &Value,
    ) -> i64 {
        create_sync(
            op,
            name,
            files,
            &json!({"type": "parquet", "url": url}),
            events,
        )
        .await
        .expect("an object store's place passes the definition");
        sqlx::query_scalar::<_, i64>("SELECT orca.run($1, 'now')")
            .bind(name)
            .fetch_one(op)
            .await
            .expect("run")
    }
    // azurite listens on loopback, which acme's allowlist does not permit.
    let r = run(&mut op, "out", "az://orca/out", &files, &events).await;
    let error = failed(&db, r, &runner).await;
    assert!(
        error.contains("netguard refused 127.0.0.1") && error.contains("a loopback address"),
        "{error}"
    );
    sqlx::query("SELECT orca.allow('acme', '127.0.0.1')")
        .execute(&mut admin)
        .await
        .expect("allow azurite");
    for (name, url, says) in [
        (
            "into_the_store",
            "abfss://orca@devstoreaccount1.dfs.core.windows.net/store/acme/x",
            "overlaps the installation's store (az://orca/store)",
        ),
        (
            "the_container",
            "wasbs://orca@devstoreaccount1.blob.core.windows.net",
            "overlaps the installation's store",
        ),
        (
            "another_account",
            "abfss://orca@globexdata.dfs.core.windows.net/out",
            "names storage account \"globexdata\"",
        ),
    ] {
        let r = run(&mut op, name, url, &files, &events).await;
        let error = failed(&db, r, &runner).await;
        assert!(error.contains(says), "{name}: {error}");
    }
    let r = run(&mut op, "allowed", "az://orca/out", &files, &events).await;
    wait_for_sql(
        &db,
        "the allowed sync to succeed",
        &format!("SELECT status = 'succeeded' FROM orca.runs WHERE id = {r}"),
        Duration::from_secs(120),
        || outputs(&[&runner]),
    )
    .await;
    let written = azurite.keys("orca", "out/events/");
    assert!(
        written.iter().any(|k| k.ends_with(".parquet")),
        "{written:?}"
    );
    // Nothing of the refused ones reached the container.
    assert!(azurite.keys("orca", "store/acme/x").is_empty());
    drop(runner);
    let _ = std::fs::remove_dir_all(&dir);
}
