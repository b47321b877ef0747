//! An Iceberg source reads the org's own tables only: an org that points
//! its catalog at another org's table must not get that table's rows.

use super::*;

#[tokio::test]
async fn an_iceberg_source_pointed_at_another_orgs_table_is_refused_and_reads_nothing() {
    let db = TestDb::new().await;
    for org in ["acme", "globex"] {
        sqlx::query("SELECT orca.create_org($1)")
            .bind(org)
            .execute(&db.pool)
            .await
            .expect("org");
    }
    let wh = scratch("lake-reads-wh");
    let whs = wh.to_string_lossy().to_string();
    let acme_wh = format!("{whs}/acme");
    let py = |args: &[&str]| {
        let out = Command::new(orca_tests::s3::python())
            .arg(repo_root().join("tests/py/iceberg.py"))
            .args(args)
            .env("ORCA_TEST_CATALOG", "acme")
            .output()
            .expect("run PyIceberg");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    py(&[
        "create",
        &db.url(),
        &acme_wh,
        "lake.secret",
        &json!([{"id": 1, "card": "4111-1111"}]).to_string(),
    ]);
    // globex points its own catalog's lake.secret at acme's metadata (an
    // attempt of globex may write its org's catalog rows as it likes).
    let acme_metadata: String = sqlx::query_scalar(
        "SELECT metadata_location FROM public.iceberg_tables WHERE catalog_name = 'acme'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("acme's table");
    sqlx::query(
        "INSERT INTO public.iceberg_namespace_properties VALUES ('globex', 'lake', 'exists', 'true')",
    )
    .execute(&db.pool)
    .await
    .expect("namespace");
    sqlx::query(
        "INSERT INTO public.iceberg_tables (catalog_name, table_namespace, table_name, \
         metadata_location, iceberg_type) VALUES ('globex', 'lake', 'secret', $1, 'TABLE')",
    )
    .bind(&acme_metadata)
    .execute(&db.pool)
    .await
    .expect("globex's row");
    let out = scratch("lake-reads-out");
    let mut g = connect_org(&db, "postgres", "globex").await;
    sqlx::query(
        "SELECT orca.allow('globex', $1), orca.create_sync('steal', '{\"type\": \"iceberg\"}', \
         jsonb_build_object('type', 'parquet', 'url', $1::text), \
         '[{\"name\": \"secret\", \"table\": \"lake.secret\"}]')",
    )
    .bind(out.to_string_lossy().to_string())
    .execute(&mut g)
    .await
    .expect("globex's sync");
    let store = scratch("lake-reads-store");
    let o = Command::new(bin("orca-engine"))
        .args(["sync", "steal", "--org", "globex", "--store"])
        .arg(&store)
        .env("DATABASE_URL", db.url())
        .env("ORCA_WAREHOUSE", &whs)
        .output()
        .expect("engine");
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("is not under its org's warehouse")
            && err.contains("a sync reads only the org's own tables"),
        "{err}"
    );
    let written: Vec<PathBuf> = std::fs::read_dir(&out)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(written.is_empty(), "globex read acme's rows: {written:?}");
    let head = db
        .scalar_i64("SELECT head_epoch FROM orca.syncs WHERE name = 'steal'")
        .await;
    assert_eq!(head, 0);
}
