//! The Iceberg catalog: a lease sees and writes its own org's tables only.

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
