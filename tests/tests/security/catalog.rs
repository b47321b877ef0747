//! The Iceberg catalog: a lease sees and writes its own org's tables only;
//! nobody writes its tables directly, every write is a function that takes
//! the org from the lease (or the session); an org's admin API key is its
//! org's, not the installation's.

use super::*;

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
    // No direct write, of any org's rows: the catalog is written through
    // functions only.
    for sql in [
        "UPDATE public.iceberg_tables SET metadata_location = 'file:///evil.json' \
         WHERE catalog_name = 'globex'",
        "DELETE FROM public.iceberg_tables WHERE catalog_name = 'globex'",
        "INSERT INTO public.iceberg_tables (catalog_name, table_namespace, table_name, \
         metadata_location) VALUES ('globex', 'lake', 'planted', 'file:///evil.json')",
        "UPDATE public.iceberg_tables SET catalog_name = 'globex' WHERE catalog_name = 'acme'",
        "UPDATE public.iceberg_tables SET metadata_location = 'file:///w/acme/lake/raw/metadata/2.json' \
         WHERE catalog_name = 'acme'",
    ] {
        assert_eq!(code_of(&mut child, sql).await, "42501", "{sql}");
    }
    // The functions take the org from the lease: globex's catalog is not
    // the lease's to name.
    for sql in [
        format!("SELECT orca.catalog_commit('globex', 'lake', 'raw', \
                 'file:///w/globex/lake/raw/metadata/1.json', 'file:///evil.json', '{lease}')"),
        format!("SELECT orca.catalog_drop_table('globex', 'lake', 'raw', '{lease}')"),
        format!("SELECT orca.catalog_create_table('globex', 'lake', 'planted', 'file:///evil.json', '{lease}')"),
        format!("SELECT orca.catalog_create_namespace('globex', 'planted', '{{}}', '{lease}')"),
    ] {
        assert_eq!(code_of(&mut child, &sql).await, "42501", "{sql}");
    }
    // Without a lease, an attempt's login is nobody's member.
    let mut bare = db.connect_as(ATTEMPT_LOGIN).await;
    assert_eq!(
        code_of(
            &mut bare,
            "SELECT orca.catalog_commit('acme', 'lake', 'raw', \
             'file:///w/acme/lake/raw/metadata/1.json', 'file:///w/acme/lake/raw/metadata/2.json')"
        )
        .await,
        "OR002"
    );
    // Its own org's table moves, as a compare-and-swap.
    let cas = |expected: &str| {
        format!(
            "SELECT orca.catalog_commit('acme', 'lake', 'raw', '{expected}', \
             'file:///w/acme/lake/raw/metadata/2.json', '{lease}')"
        )
    };
    for (expected, moved) in [
        ("file:///w/acme/lake/raw/metadata/1.json", true),
        ("file:///w/acme/lake/raw/metadata/1.json", false),
    ] {
        let got: bool = sqlx::query_scalar(&cas(expected))
            .fetch_one(&mut child)
            .await
            .expect("commit acme's table");
        assert_eq!(got, moved, "{expected}");
    }
    let made: bool = sqlx::query_scalar(&format!(
        "SELECT orca.catalog_create_namespace('acme', 'gold', '{{\"owner\": \"data\"}}', '{lease}')"
    ))
    .fetch_one(&mut child)
    .await
    .expect("a namespace");
    assert!(made);
    let (code, msg) = expect_error(
        &mut child,
        &format!("SELECT orca.catalog_create_table('acme', 'lake', 'raw', 'file:///w/acme/x.json', '{lease}')"),
    )
    .await;
    assert_eq!(code, "OR045", "{msg}");
    assert!(msg.contains("exists already"), "{msg}");
    // A made-up lease shows nothing.
    let mut forged = db.connect_as(ATTEMPT_LOGIN).await;
    sqlx::query("SELECT set_config('orca.lease', $1, false)")
        .bind(uuid::Uuid::new_v4().to_string())
        .execute(&mut forged)
        .await
        .expect("a made-up lease");
    assert_eq!(seen(&mut forged, tables).await, "");
    // Viewers see their org's catalog, and write it through nothing.
    let mut v = connect_org(&db, VIEWER, "acme").await;
    assert_eq!(seen(&mut v, tables).await, "acme");
    assert_eq!(
        code_of(
            &mut v,
            "SELECT orca.catalog_drop_table('acme', 'lake', 'raw')"
        )
        .await,
        "42501"
    );
    // An operator of acme writes acme's catalog without a lease.
    let mut op = connect_org(&db, OPERATOR, "acme").await;
    let dropped: bool =
        sqlx::query_scalar("SELECT orca.catalog_drop_table('acme', 'gold', 'none')")
            .fetch_one(&mut op)
            .await
            .expect("an operator writes its org's catalog");
    assert!(!dropped);
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
