//! orca.append_log as a runner calls it: numbered lines kept once, bounded
//! per attempt and per line, refused once the lease is gone.

use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::json;

async fn code(c: &mut sqlx::PgConnection, sql: &str) -> String {
    match c.execute(sql).await {
        Ok(_) => "ok".into(),
        Err(sqlx::Error::Database(d)) => d.code().map(|c| c.to_string()).unwrap_or_default(),
        Err(e) => panic!("{sql}: {e}"),
    }
}

#[tokio::test]
async fn lines_are_kept_once_bounded_and_only_under_a_live_lease() {
    let db = TestDb::new().await;
    let mut c = connect_org(&db, "postgres", "default").await;
    let mut m = lake_manifest("lake");
    m["max_runs"] = json!(null);
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut c)
        .await
        .expect("register");
    sqlx::query("SELECT orca.run('lake', '2024-01')")
        .execute(&mut c)
        .await
        .expect("run");
    c.execute("SELECT orca.tick()").await.expect("tick");
    let l = claim(&mut c, "r1", 1).await.remove(0);
    let append = |first: i32, lines: Vec<String>| {
        sqlx::query_scalar::<_, i32>("SELECT orca.append_log($1, $2, $3)")
            .bind(l.lease)
            .bind(first)
            .bind(lines)
    };
    let kept = append(1, vec!["one".into(), "two".into()])
        .fetch_one(&mut c)
        .await
        .expect("append");
    assert_eq!(kept, 2);
    // The same batch again (a retry after a lost answer) is kept once.
    let again = append(1, vec!["one".into(), "two".into()])
        .fetch_one(&mut c)
        .await
        .expect("append again");
    assert_eq!(again, 0);
    // A line is cut at 8 KiB; lines past orca.log_lines_max are not kept.
    c.execute("SET orca.log_lines_max = 4").await.expect("set");
    let kept = append(3, vec!["x".repeat(20_000), "four".into(), "five".into()])
        .fetch_one(&mut c)
        .await
        .expect("append");
    assert_eq!(kept, 2);
    let lines: Vec<(i32, i32)> = sqlx::query_as(
        "SELECT seq, length(line) FROM orca.attempt_logs WHERE attempt_id = $1 ORDER BY seq",
    )
    .bind(l.attempt)
    .fetch_all(&mut c)
    .await
    .expect("lines");
    assert_eq!(lines, [(1, 3), (2, 3), (3, 8192), (4, 4)]);

    // Bad input is refused by name, and nothing is written.
    let lease = l.lease;
    for (sql, want) in [
        (
            format!("SELECT orca.append_log('{lease}', 0, ARRAY['x'])"),
            "OR050",
        ),
        (
            format!("SELECT orca.append_log('{lease}', NULL, ARRAY['x'])"),
            "OR050",
        ),
        (
            format!("SELECT orca.append_log('{lease}', 9, NULL)"),
            "OR050",
        ),
        (
            format!("SELECT orca.append_log('{lease}', 9, array_fill('x'::text, ARRAY[1001]))"),
            "OR050",
        ),
    ] {
        assert_eq!(code(&mut c, &sql).await, want, "{sql}");
    }
    // Once the attempt is finished its lease takes no more lines.
    sqlx::query("SELECT orca.finish($1, true)")
        .bind(lease)
        .execute(&mut c)
        .await
        .expect("finish");
    assert_eq!(
        code(
            &mut c,
            &format!("SELECT orca.append_log('{lease}', 5, ARRAY['late'])")
        )
        .await,
        "OR014"
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.attempt_logs")
            .await,
        4
    );
}
