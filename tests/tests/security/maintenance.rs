//! Table maintenance deletes files, so it is an attack surface: an org
//! that points its catalog at another org's table must not get that
//! table's snapshots expired or its files deleted.

use super::*;

fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn maintenance_of_a_table_pointed_at_another_orgs_files_is_refused_and_deletes_nothing() {
    let db = TestDb::new().await;
    for org in ["acme", "globex"] {
        sqlx::query("SELECT orca.create_org($1)")
            .bind(org)
            .execute(&db.pool)
            .await
            .expect("org");
    }
    let wh = scratch("maintain-wh");
    let whs = wh.to_string_lossy().to_string();
    // acme's table, three snapshots, in acme's part of the warehouse.
    let acme_wh = format!("{whs}/acme");
    py_as(
        "acme",
        &[
            "create",
            &db.url(),
            &acme_wh,
            "lake.raw",
            &json!([{"n": 1}]).to_string(),
        ],
    );
    for n in 2..=3 {
        py_as(
            "acme",
            &[
                "append",
                &db.url(),
                &acme_wh,
                "lake.raw",
                &json!([{"n": n}]).to_string(),
            ],
        );
    }
    let victim = py_as("acme", &["read", &db.url(), &acme_wh, "lake.raw"]);
    let location = victim["location"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("file://")
        .to_string();
    assert!(location.starts_with(&acme_wh), "{location}");
    // An old file nothing references: an orphan removal of acme's table
    // would take it, which is how the test sees one happen.
    let bait = PathBuf::from(&location).join("data/old-unreferenced.parquet");
    std::fs::create_dir_all(bait.parent().expect("data dir")).expect("data dir");
    std::fs::write(&bait, b"not parquet").expect("bait");
    assert!(Command::new("touch")
        .args(["-d", "2 days ago"])
        .arg(&bait)
        .status()
        .expect("touch")
        .success());
    let before = files_under(std::path::Path::new(&location));

    // globex has a pipeline that reads lake.raw, and points its own
    // catalog's lake.raw at acme's metadata (a globex attempt may write its
    // org's catalog rows as it likes).
    let mut g = connect_org(&db, "postgres", "globex").await;
    let mut m = lake_manifest("keeper");
    m["steps"][0]["reads"] = json!(["lake.raw"]);
    if let Some(o) = m.as_object_mut() {
        o.remove("schedule");
    }
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut g)
        .await
        .expect("register");
    point_catalog_at(&db, "acme", "globex", "lake", "raw").await;
    let run: i64 = sqlx::query_scalar(
        r#"SELECT orca.maintain('lake.raw', '{"expire": {"keep_last": 1, "older_than": "0 seconds",
             "grace": "0 seconds"}, "orphans": {"older_than": "1 hour"}}')"#,
    )
    .fetch_one(&mut g)
    .await
    .expect("maintain");
    let logs = scratch("maintain-logs");
    let runner = Runner::start(
        &db.url(),
        "g",
        1,
        &logs,
        &[("ORCA_WAREHOUSE", whs.as_str()), ("ORCA_ORG", "globex")],
    );
    wait_for_sql(
        &db,
        "the maintenance run to fail",
        &format!("SELECT status = 'failed' FROM orca.runs WHERE id = {run}"),
        Duration::from_secs(90),
        || runner.output(),
    )
    .await;
    let errors = db
        .strings(&format!(
            "SELECT coalesce(error, '') FROM orca.attempts WHERE run_id = {run} ORDER BY number"
        ))
        .await;
    let out = runner.output();
    assert!(
        out.contains("is not under its org's warehouse"),
        "{errors:?}\n{out}"
    );
    // Nothing of acme's changed: every file is there, the bait too, and its
    // snapshots are all still in its metadata.
    assert_eq!(files_under(std::path::Path::new(&location)), before);
    let after = py_as("acme", &["read", &db.url(), &acme_wh, "lake.raw"]);
    assert_eq!(after["snapshots"], victim["snapshots"]);
    assert_eq!(after["rows"], victim["rows"]);
}
