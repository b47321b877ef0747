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
    py_as(
        "acme",
        &[
            "create",
            &db.url(),
            &acme_wh,
            "lake.secret",
            &json!([{"id": 1, "card": "4111-1111"}]).to_string(),
        ],
    );
    // globex points its own catalog's lake.secret at acme's metadata (an
    // attempt of globex may write its org's catalog rows as it likes).
    point_catalog_at(&db, "acme", "globex", "lake", "secret").await;
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
