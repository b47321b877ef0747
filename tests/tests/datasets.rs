//! Datasets in the control plane: declared reads and writes, pinned reads,
//! recorded commits, lineage, and cycles refused at registration.

use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::{json, Value};

/// direction, depth, related, via, pipeline, read snapshot, commit snapshot.
type LineageRow = (
    String,
    i32,
    String,
    String,
    String,
    Option<i64>,
    Option<i64>,
);

fn pipeline(name: &str, reads: &[&str], writes: &[&str]) -> Value {
    json!({
        "name": name,
        "steps": [{"name": "work", "kind": "mapped", "reads": reads, "writes": writes}],
        "partitions": {"monthly": "2024-01"},
        "registry_hash": format!("hash-{name}"),
        "binary": "/bin/true"
    })
}

async fn leased(db: &TestDb, name: &str, month: &str) -> Lease {
    let run: i64 = sqlx::query_scalar("SELECT orca.run($1, $2)")
        .bind(name)
        .bind(month)
        .fetch_one(&db.pool)
        .await
        .expect("run");
    let l = claim(&db.pool, "r", 10).await;
    l.into_iter()
        .find(|l| l.run == run)
        .expect("lease of the run")
}

async fn pin(db: &TestDb, l: &Lease, dataset: &str, snapshot: Option<i64>) -> Option<i64> {
    sqlx::query_scalar("SELECT orca.pin_read($1, 'work', $2, $3, $4)")
        .bind(l.lease)
        .bind(&l.partitions[0])
        .bind(dataset)
        .bind(snapshot)
        .fetch_one(&db.pool)
        .await
        .expect("pin")
}

async fn commit(db: &TestDb, l: &Lease, dataset: &str, snapshot: i64, n: i32) {
    sqlx::query("SELECT orca.record_commit($1, 'work', $2, $3, $4, $5)")
        .bind(l.lease)
        .bind(&l.partitions[0])
        .bind(dataset)
        .bind(snapshot)
        .bind(n)
        .execute(&db.pool)
        .await
        .expect("commit");
}

#[tokio::test]
async fn a_read_stays_pinned_across_attempts_of_a_run() {
    let db = TestDb::new().await;
    let mut m = pipeline("clean", &["lake.raw"], &["lake.clean"]);
    m["run_retries"] = json!(1);
    db.register(&m).await;
    let first = leased(&db, "clean", "2024-01").await;
    assert_eq!(pin(&db, &first, "lake.raw", Some(11)).await, Some(11));
    // The table moved on, the attempt failed: the retry reads snapshot 11.
    sqlx::query("SELECT orca.finish($1, false, 'boom')")
        .bind(first.lease)
        .execute(&db.pool)
        .await
        .expect("fail");
    let second = claim(&db.pool, "r", 1).await.remove(0);
    assert_eq!(second.number, 2);
    assert_eq!(pin(&db, &second, "lake.raw", Some(99)).await, Some(11));
    // A table with no snapshot pins "nothing", which later reads keep.
    let other = leased(&db, "clean", "2024-02").await;
    assert_eq!(pin(&db, &other, "lake.raw", None).await, None);
    assert_eq!(pin(&db, &other, "lake.raw", Some(5)).await, None);
    // An undeclared dataset is refused, naming the step and the dataset.
    let before = db.table_counts().await;
    let (code, msg) = expect_error(
        &db.pool,
        &format!(
            "SELECT orca.pin_read('{}', 'work', '2024-01', 'lake.gold', 1)",
            second.lease
        ),
    )
    .await;
    assert_eq!(code, "OR017");
    assert!(
        msg.contains("step work does not declare dataset 'lake.gold' in its reads"),
        "{msg}"
    );
    assert_eq!(db.table_counts().await, before);
}

#[tokio::test]
async fn commits_are_recorded_once_and_lineage_walks_them() {
    let db = TestDb::new().await;
    db.register(&pipeline("load", &["src.files"], &["lake.raw"]))
        .await;
    db.register(&pipeline("clean", &["lake.raw"], &["lake.clean"]))
        .await;
    db.register(&pipeline("report", &["lake.clean"], &["bi.monthly"]))
        .await;
    let l = leased(&db, "load", "2024-01").await;
    pin(&db, &l, "src.files", Some(1)).await;
    commit(&db, &l, "lake.raw", 100, 1).await;
    commit(&db, &l, "lake.raw", 100, 1).await; // a retry recording it again
    let c = leased(&db, "clean", "2024-01").await;
    pin(&db, &c, "lake.raw", Some(100)).await;
    commit(&db, &c, "lake.clean", 200, 1).await;
    let r = leased(&db, "report", "2024-01").await;
    pin(&db, &r, "lake.clean", Some(200)).await;
    commit(&db, &r, "bi.monthly", 300, 1).await;
    assert_eq!(db.scalar_i64("SELECT count(*) FROM orca.commits").await, 3);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.events WHERE kind = 'dataset.committed'")
            .await,
        3
    );
    let (code, _) = expect_error(
        &db.pool,
        &format!(
            "SELECT orca.record_commit('{}', 'work', '2024-01', 'lake.raw', 1, 1)",
            c.lease
        ),
    )
    .await;
    assert_eq!(code, "OR017", "clean does not write lake.raw");

    let rows: Vec<LineageRow> = sqlx::query_as(
        "SELECT direction, depth, related, via, pipeline, read_snapshot, commit_snapshot
         FROM orca.lineage('lake.clean')",
    )
    .fetch_all(&db.pool)
    .await
    .expect("lineage");
    let got: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {} {} <- {} by {} read {:?} made {:?}",
                r.0, r.1, r.2, r.3, r.4, r.5, r.6
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            "upstream 1 lake.raw <- lake.clean by clean read Some(100) made Some(200)",
            "upstream 2 src.files <- lake.raw by load read Some(1) made Some(100)",
            "downstream 1 bi.monthly <- lake.clean by report read Some(200) made Some(300)",
        ]
    );
}

#[tokio::test]
async fn a_registration_that_closes_a_cycle_across_pipelines_is_refused() {
    let db = TestDb::new().await;
    db.register(&pipeline("a", &["x.in"], &["x.mid"])).await;
    db.register(&pipeline("b", &["x.mid"], &["x.out"])).await;
    // Reading and writing the same dataset within one pipeline is fine.
    db.register(&pipeline("compact", &["x.out"], &["x.out"]))
        .await;
    let before = db.table_counts().await;
    let bad = pipeline("c", &["x.out"], &["x.in"]);
    let (code, msg) =
        expect_error(&db.pool, &format!("SELECT orca.register('{}'::jsonb)", bad)).await;
    assert_eq!(code, "OR041");
    assert!(msg.contains("'c' would close a cycle"), "{msg}");
    assert!(
        msg.contains("c -[x.in]-> a -[x.mid]-> b -[x.out]-> c"),
        "{msg}"
    );
    assert_eq!(db.table_counts().await, before, "nothing written");
    db.pool
        .execute("SELECT 1")
        .await
        .expect("connection still fine");
}
