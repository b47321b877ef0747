//! API keys: how `orca serve` acts for its callers. The server's login
//! (NOINHERIT, able to take the viewer, operator and admin roles) presents
//! the caller's key and takes the key's role; the key alone decides the org,
//! and grants decide what the role may call. Tried here at the SQL boundary
//! the server uses, with ordinary logins.

use super::*;

/// The server's login: nothing of its own, the three roles to take.
const SERVE_LOGIN: &str = "orca_t_sec_serve";

async fn serve_login(db: &TestDb) {
    orca_tests::serve::serve_login(db, SERVE_LOGIN).await;
}

/// A session as `orca serve` opens it for a request with `key`: the key
/// presented, then its role taken. Returns the session and the key's role.
async fn key_session(db: &TestDb, key: &str) -> (PgConnection, String) {
    let mut c = db.connect_as(SERVE_LOGIN).await;
    c.execute("SET ROLE orca_viewer")
        .await
        .expect("take the viewer role");
    sqlx::query("SELECT set_config('orca.api_key', $1, false)")
        .bind(key)
        .execute(&mut c)
        .await
        .expect("present the key");
    let session: Value = sqlx::query_scalar("SELECT orca.api_session()")
        .fetch_one(&mut c)
        .await
        .expect("the key's session");
    let role = session["role"].as_str().unwrap_or_default().to_string();
    c.execute(format!("SET ROLE orca_{role}").as_str())
        .await
        .expect("take the key's role");
    (c, role)
}

async fn key(c: &mut PgConnection, name: &str, role: &str) -> String {
    sqlx::query_scalar("SELECT orca.create_api_key($1, $2)")
        .bind(name)
        .bind(role)
        .fetch_one(c)
        .await
        .unwrap_or_else(|e| panic!("create {role} key {name}: {e}"))
}

#[tokio::test]
async fn an_api_key_acts_in_its_org_with_its_role_only() {
    let db = TestDb::new().await;
    roles(&db).await;
    serve_login(&db).await;
    two_orgs(&db).await;
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    let viewer = key(&mut op, "dashboard", "viewer").await;
    let operator = key(&mut op, "deployer", "operator").await;
    assert!(
        viewer.starts_with("orca_ak_") && viewer.len() == 8 + 64,
        "{viewer}"
    );
    // Operators make viewer and operator keys; admin keys are admins'.
    assert_eq!(
        code_of(&mut op, "SELECT orca.create_api_key('root', 'admin')").await,
        "42501"
    );
    assert_eq!(
        code_of(&mut op, "SELECT orca.create_api_key('x', 'superuser')").await,
        "OR050"
    );
    let runs = |org: &str| {
        format!(
            "SELECT count(*) FROM orca.runs r JOIN orca.orgs o ON o.id = r.org_id \
             WHERE o.name = '{org}'"
        )
    };

    // The server's login holds nothing without a role taken.
    let mut bare = db.connect_as(SERVE_LOGIN).await;
    assert_eq!(
        code_of(&mut bare, "SELECT count(*) FROM orca.runs").await,
        "42501"
    );

    // A viewer key: its org's rows, no writes, no other org.
    let (mut v, role) = key_session(&db, &viewer).await;
    assert_eq!(role, "viewer");
    let seen: i64 = sqlx::query_scalar(&runs("acme"))
        .fetch_one(&mut v)
        .await
        .expect("runs");
    assert_eq!(seen, 6, "acme's six runs");
    let other: i64 = sqlx::query_scalar(&runs("globex"))
        .fetch_one(&mut v)
        .await
        .expect("runs");
    assert_eq!(other, 0, "the viewer key sees globex's runs");
    for sql in [
        "SELECT orca.backfill('lake', '2024-07')",
        "SELECT orca.create_api_key('more', 'viewer')",
        "SELECT hash FROM orca.api_keys",
    ] {
        assert_eq!(code_of(&mut v, sql).await, "42501", "{sql}");
    }
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM orca.api_keys ORDER BY name")
        .fetch_all(&mut v)
        .await
        .expect("names");
    assert_eq!(names, ["dashboard", "deployer"]);
    v.execute("SET orca.org = 'globex'").await.expect("set");
    let (code, msg) = expect_error(&mut v, "SELECT count(*) FROM orca.runs").await;
    assert_eq!(code, "OR002");
    assert!(
        msg.contains("API key 'dashboard' is for org 'acme'"),
        "{msg}"
    );

    // An operator key writes in its org.
    let (mut o, role) = key_session(&db, &operator).await;
    assert_eq!(role, "operator");
    sqlx::query("SELECT orca.backfill('lake', '2024-07')")
        .execute(&mut o)
        .await
        .expect("the operator key backfills");
    assert_eq!(
        code_of(&mut o, "SELECT orca.create_api_key('root', 'admin')").await,
        "42501"
    );
    assert_eq!(db.scalar_i64(&runs("acme")).await, 7);
    assert_eq!(db.scalar_i64(&runs("globex")).await, 6, "globex changed");

    // An admin key is an admin of its own org only: no other org, and no
    // administration of the installation.
    let mut admin = connect_org(&db, "postgres", "acme").await;
    let root = key(&mut admin, "root", "admin").await;
    let (mut a, role) = key_session(&db, &root).await;
    assert_eq!(role, "admin");
    let other: i64 = sqlx::query_scalar(&runs("globex"))
        .fetch_one(&mut a)
        .await
        .expect("runs");
    assert_eq!(other, 0, "the admin key sees globex's runs");
    for sql in [
        "SELECT orca.create_org('mine')",
        "SELECT orca.add_member('globex', 'orca_t_sec_operator')",
        "SELECT orca.allow('acme', '10.0.0.0/8')",
        "SELECT orca.rewrap_data_keys()",
    ] {
        assert_eq!(code_of(&mut a, sql).await, "42501", "{sql}");
    }

    // Revoked, forged or no key: refused at the next call.
    op.execute("SELECT orca.revoke_api_key('dashboard')")
        .await
        .expect("revoke");
    let mut v2 = db.connect_as(SERVE_LOGIN).await;
    v2.execute("SET ROLE orca_viewer").await.expect("role");
    for k in [viewer.as_str(), "orca_ak_0000", ""] {
        sqlx::query("SELECT set_config('orca.api_key', $1, false)")
            .bind(k)
            .execute(&mut v2)
            .await
            .expect("present");
        assert_eq!(
            code_of(&mut v2, "SELECT orca.api_session()").await,
            "OR087",
            "{k:?}"
        );
    }
    v.execute("RESET orca.org").await.expect("reset");
    let (code, msg) = expect_error(&mut v, "SELECT count(*) FROM orca.runs").await;
    assert_eq!(code, "OR087");
    assert!(msg.contains("'dashboard' was revoked"), "{msg}");
    assert_eq!(
        code_of(&mut op, "SELECT orca.revoke_api_key('nope')").await,
        "OR088"
    );
    let events = db
        .scalar_i64(
            "SELECT count(*) FROM orca.events WHERE kind IN ('api_key.created', 'api_key.revoked')",
        )
        .await;
    assert_eq!(events, 4, "three keys made, one revoked");
}

/// An org's admin API key, over orca serve's login or over an operator's or
/// a runner's own login, is its org's admin: it neither reads nor repoints
/// another org's Iceberg tables, moves nobody's clock, takes no other org's
/// webhook to relay, and its tick lapses no other org's lease.
#[tokio::test]
async fn an_orgs_admin_key_is_not_the_installations_admin() {
    let db = TestDb::new().await;
    roles(&db).await;
    serve_login(&db).await;
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
        let mut c = connect_org(&db, "postgres", org).await;
        sqlx::query("SELECT orca.create_webhook($1, '{run.*}')")
            .bind(format!("https://hooks.example.com/{org}"))
            .execute(&mut c)
            .await
            .expect("a webhook of each org");
    }
    // globex's runner holds a live lease.
    let mut g = connect_org(&db, "postgres", "globex").await;
    let held: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("SELECT lease, org FROM orca.claim('globex-runner', 'default', 1)")
            .fetch_all(&mut g)
            .await
            .expect("globex claims");
    assert_eq!(held.len(), 1);
    let mut admin = connect_org(&db, "postgres", "acme").await;
    let root = key(&mut admin, "root", "admin").await;
    let (served, _) = key_session(&db, &root).await;
    let mut sessions = vec![("orca serve's login", served)];
    for login in [OPERATOR, RUNNER_LOGIN] {
        let mut c = db.connect_as(login).await;
        sqlx::query("SELECT set_config('orca.api_key', $1, false)")
            .bind(&root)
            .execute(&mut c)
            .await
            .expect("present the key");
        sessions.push((login, c));
    }
    for (who, mut c) in sessions {
        let cats: Vec<String> =
            sqlx::query_scalar("SELECT DISTINCT catalog_name::text FROM public.iceberg_tables")
                .fetch_all(&mut c)
                .await
                .unwrap_or_default();
        assert!(!cats.contains(&"globex".to_string()), "{who}: {cats:?}");
        for sql in [
            "UPDATE public.iceberg_tables SET metadata_location = 'file:///w/acme/evil.json' \
             WHERE catalog_name = 'globex'",
            "SELECT orca.catalog_commit('globex', 'lake', 'raw', \
             'file:///w/globex/lake/raw/metadata/1.json', 'file:///w/acme/evil.json')",
            "SELECT orca.relay_take(10)",
        ] {
            assert_eq!(code_of(&mut c, sql).await, "42501", "{who}: {sql}");
        }
        assert_eq!(
            code_of(&mut c, "SELECT orca.tick(now() + interval '1 day')").await,
            "OR086",
            "{who} moved the clock"
        );
        // A tick at the current time is its org's, whatever the login.
        let _ = c.execute("SELECT orca.tick()").await;
    }
    let (status, location): (String, String) = sqlx::query_as(
        "SELECT a.status, (SELECT metadata_location FROM public.iceberg_tables \
                           WHERE catalog_name = 'globex') \
         FROM orca.attempts a WHERE a.lease = $1",
    )
    .bind(held[0].0)
    .fetch_one(&db.pool)
    .await
    .expect("globex's attempt and table");
    assert_eq!(status, "leased", "globex's lease lapsed");
    assert_eq!(location, "file:///w/globex/lake/raw/metadata/1.json");
}
