//! A plain pg_dump of a control-plane database restores into a working one:
//! every row of every orca table, and ids that go on where they left off.

use std::process::Command;

use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::Value;

fn url(db: &TestDb) -> String {
    let base = base_url();
    let (head, _) = base.rsplit_once('/').unwrap_or((&base, ""));
    format!("{head}/{}", db.name)
}

async fn everything(db: &TestDb) -> Value {
    let tables = db
        .strings("SELECT tablename::text FROM pg_tables WHERE schemaname = 'orca' ORDER BY 1")
        .await;
    let mut out = serde_json::Map::new();
    for t in tables {
        // The default org comes with the extension, so its creation time is the restore's.
        let row = if t == "orgs" {
            "jsonb_build_object('id', x.id, 'name', x.name)"
        } else {
            "to_jsonb(x)"
        };
        let rows: Value = sqlx::query_scalar(&format!(
            "SELECT coalesce(jsonb_agg({row} ORDER BY {row}::text), '[]') FROM orca.\"{t}\" x"
        ))
        .fetch_one(&db.pool)
        .await
        .expect("rows");
        out.insert(t, rows);
    }
    Value::Object(out)
}

#[tokio::test]
async fn pg_dump_and_restore_keep_the_control_plane() {
    let src = TestDb::new().await;
    src.register(&lake_manifest("lake")).await;
    src.pool
        .execute("SELECT orca.create_org('acme'); SELECT orca.backfill('lake', '2024-01..2024-04')")
        .await
        .expect("populate");
    let l = claim(&src.pool, "r", 1).await;
    sqlx::query("SELECT orca.finish($1, true)")
        .bind(l[0].lease)
        .execute(&src.pool)
        .await
        .expect("finish");

    let dump = Command::new("pg_dump")
        .arg(url(&src))
        .output()
        .expect("run pg_dump");
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );

    let dst = TestDb::new().await;
    dst.pool
        .execute("DROP EXTENSION orca; DROP SCHEMA orca")
        .await
        .expect("an empty target database");
    let file = std::env::temp_dir().join(format!("{}.sql", src.name));
    std::fs::write(&file, &dump.stdout).expect("write dump");
    let restore = Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d"])
        .arg(url(&dst))
        .arg("-f")
        .arg(&file)
        .output()
        .expect("run psql");
    let _ = std::fs::remove_file(&file);
    assert!(
        restore.status.success(),
        "{}",
        String::from_utf8_lossy(&restore.stderr)
    );

    let (restored, original) = (everything(&dst).await, everything(&src).await);
    let differ: Vec<_> = original
        .as_object()
        .map(|o| {
            o.keys()
                .filter(|t| restored.get(*t) != original.get(*t))
                .collect()
        })
        .unwrap_or_default();
    assert!(differ.is_empty(), "restored tables differ: {differ:?}");
    assert_eq!(
        restored.as_object().map(|o| o.len()),
        original.as_object().map(|o| o.len())
    );
    // Ids continue after the restored ones.
    let run: i64 = sqlx::query_scalar("SELECT orca.run('lake', '2024-05')")
        .fetch_one(&dst.pool)
        .await
        .expect("a new run after restore");
    let max_before: i64 = src.scalar_i64("SELECT max(id) FROM orca.runs").await;
    assert!(run > max_before);
    dst.pool
        .execute("SELECT orca.create_org('globex')")
        .await
        .expect("a new org after restore");
}
