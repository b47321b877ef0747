//! Cron fires through `orca.tick(now => ...)` at exact instants, including
//! daylight-saving transitions, fills, catchup and idempotency.

use orca_tests::sqlx::{self, Executor};
use orca_tests::*;
use serde_json::json;

/// (fire_at in UTC, partition) of every scheduled run of a pipeline.
async fn fired(db: &TestDb, pipeline: &str) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT to_char(r.fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'), r.partitions[1] \
         FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
         WHERE p.name = $1 AND r.trigger = 'schedule' ORDER BY r.fire_at",
    )
    .bind(pipeline)
    .fetch_all(&db.pool)
    .await
    .expect("scheduled runs")
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[tokio::test]
async fn new_york_spring_forward_fires_at_the_end_of_the_gap() {
    let db = TestDb::new().await;
    db.register(&daily_manifest("ny", "30 2 * * *", "America/New_York"))
        .await;
    // The first tick starts the schedule's clock; nothing before it fires.
    let t = db.tick("2024-03-09 12:00-05").await;
    assert_eq!(t["runs_created"], 0, "{t}");
    // 02:30 does not exist on 10 March 2024: the fire is 03:00 EDT = 07:00Z.
    db.tick("2024-03-10 06:59:59Z").await;
    assert!(
        fired(&db, "ny").await.is_empty(),
        "not before the end of the gap"
    );
    db.tick("2024-03-10 07:00Z").await;
    db.tick("2024-03-11 12:00-04").await;
    assert_eq!(
        fired(&db, "ny").await,
        pairs(&[
            ("2024-03-10 07:00", "2024-03-09"),
            ("2024-03-11 06:30", "2024-03-10"),
        ])
    );
}

#[tokio::test]
async fn new_york_fall_back_fires_a_repeated_time_once() {
    let db = TestDb::new().await;
    db.register(&daily_manifest("ny", "30 1 * * *", "America/New_York"))
        .await;
    db.register(&daily_manifest("hourly", "0 * * * *", "America/New_York"))
        .await;
    db.tick("2024-11-02 12:00-04").await;
    // 01:30 happens twice on 3 November 2024 (EDT, then EST): one fire, the first.
    db.tick("2024-11-04 00:00-05").await;
    assert_eq!(
        fired(&db, "ny").await,
        pairs(&[("2024-11-03 05:30", "2024-11-02")])
    );
    // An hourly schedule fires in both 01:00s: they are different hours.
    let n = db
        .scalar_i64(
            "SELECT count(*) FROM orca.runs r JOIN orca.pipelines p ON p.id = r.pipeline_id \
             WHERE p.name = 'hourly' AND r.fire_at >= '2024-11-03 00:00-04' \
               AND r.fire_at < '2024-11-04 00:00-05'",
        )
        .await;
    assert_eq!(n, 25);
}

#[tokio::test]
async fn london_utc_and_kolkata() {
    let db = TestDb::new().await;
    db.register(&daily_manifest("london", "30 1 * * *", "Europe/London"))
        .await;
    db.register(&daily_manifest("utc", "15 4 * * *", "UTC"))
        .await;
    let mut kolkata = daily_manifest("kolkata", "30 0 * * *", "Asia/Kolkata");
    kolkata["fills"] = json!("current");
    db.register(&kolkata).await;
    db.tick("2024-03-30 12:00Z").await;
    db.tick("2024-03-31 12:00Z").await;
    // 01:30 GMT does not exist on 31 March 2024: 02:00 BST = 01:00Z.
    assert_eq!(
        fired(&db, "london").await,
        pairs(&[("2024-03-31 01:00", "2024-03-30")])
    );
    assert_eq!(
        fired(&db, "utc").await,
        pairs(&[("2024-03-31 04:15", "2024-03-30")])
    );
    // 00:30 IST on 31 March is 19:00Z on the 30th; fills=current is the local day.
    assert_eq!(
        fired(&db, "kolkata").await,
        pairs(&[("2024-03-30 19:00", "2024-03-31")])
    );
}

#[tokio::test]
async fn monthly_fill_previous_and_idempotent_ticks() {
    let db = TestDb::new().await;
    let mut m = lake_manifest("lake");
    m["max_runs"] = json!(null);
    db.register(&m).await;
    db.tick("2024-02-01 00:00Z").await;
    // 0 3 2 * * on 2 February fills January; the fire is due at exactly 03:00.
    let t = db.tick("2024-02-02 03:00Z").await;
    assert_eq!(t["runs_created"], 1, "{t}");
    let before = db.table_counts().await;
    let again = db.tick("2024-02-02 03:00Z").await;
    assert_eq!(again["runs_created"], 0, "{again}");
    assert_eq!(
        db.table_counts().await,
        before,
        "the same now changes nothing"
    );
    // Time going backwards makes nothing either.
    db.tick("2024-01-15 00:00Z").await;
    assert_eq!(db.table_counts().await, before);
    assert_eq!(
        fired(&db, "lake").await,
        pairs(&[("2024-02-02 03:00", "2024-01")])
    );
    // orca.fires shows the same schedule ahead of time.
    let ahead: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT to_char(fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'), partition \
         FROM orca.fires('lake', 3, '2024-01-01 00:00Z')",
    )
    .fetch_all(&db.pool)
    .await
    .expect("fires");
    assert_eq!(
        ahead,
        vec![
            ("2024-01-02 03:00".to_string(), None),
            ("2024-02-02 03:00".to_string(), Some("2024-01".to_string())),
            ("2024-03-02 03:00".to_string(), Some("2024-02".to_string())),
        ]
    );
}

#[tokio::test]
async fn a_fire_before_the_first_partition_is_skipped() {
    let db = TestDb::new().await;
    db.register(&lake_manifest("lake")).await; // monthly from 2024-01, fills previous
    db.tick("2024-01-01 00:00Z").await;
    let t = db.tick("2024-01-03 00:00Z").await;
    assert_eq!(t["fires_skipped"], 1, "{t}");
    assert_eq!(t["runs_created"], 0, "{t}");
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.events WHERE kind = 'fire.skipped'")
            .await,
        1
    );
}

#[tokio::test]
async fn catchup_makes_every_missed_fire_or_only_the_latest() {
    let db = TestDb::new().await;
    db.register(&daily_manifest("all", "0 3 * * *", "UTC"))
        .await;
    let mut latest = daily_manifest("latest", "0 3 * * *", "UTC");
    latest["catchup"] = json!(false);
    db.register(&latest).await;
    db.tick("2024-05-01 00:00Z").await;
    // Nothing ticked for five days.
    db.tick("2024-05-06 00:00Z").await;
    assert_eq!(fired(&db, "all").await.len(), 5);
    assert_eq!(
        fired(&db, "latest").await,
        pairs(&[("2024-05-05 03:00", "2024-05-04")])
    );
    let missed: serde_json::Value =
        sqlx::query_scalar("SELECT data FROM orca.events WHERE kind = 'schedule.missed'")
            .fetch_one(&db.pool)
            .await
            .expect("missed event");
    assert_eq!(missed["missed"], 4);
}

#[tokio::test]
async fn a_long_backlog_catches_up_over_several_ticks() {
    let db = TestDb::new().await;
    db.register(&daily_manifest("minutely", "* * * * *", "UTC"))
        .await;
    let mut c = db.connect().await;
    c.execute("SET orca.max_fires_per_tick = 100")
        .await
        .expect("set");
    c.execute("SELECT orca.tick('2024-05-01 00:00Z')")
        .await
        .expect("first tick");
    let mut made = 0;
    for _ in 0..3 {
        let t: serde_json::Value = sqlx::query_scalar("SELECT orca.tick('2024-05-01 02:30Z')")
            .fetch_one(&mut c)
            .await
            .expect("tick");
        made += t["runs_created"].as_i64().unwrap_or(-1000);
    }
    // 150 fires in (00:00, 02:30]: 100, then 50, then none.
    assert_eq!(made, 150);
    assert_eq!(fired(&db, "minutely").await.len(), 150);
}

/// A tick at a boundary where more schedules fire than one statement takes
/// (a thousand): every one makes its run, started at once unless its
/// pipeline is capped, none for a paused one, and a fire before the first
/// partition is skipped as ever.
#[tokio::test]
async fn a_tick_where_thousands_fire_makes_each_run_once_and_starts_it() {
    let db = TestDb::new().await;
    db.pool
        .execute(
            "SELECT count(orca.register(jsonb_build_object(
                 'name', 'p' || i,
                 'steps', jsonb_build_array(jsonb_build_object('name', 'load', 'kind', 'mapped')),
                 'partitions', jsonb_build_object('daily', '2019-01-01'),
                 'schedule', jsonb_build_object('cron', '* * * * *', 'tz', 'UTC'),
                 'fills', 'previous', 'registry_hash', 'h', 'binary', '/bin/true')))
             FROM generate_series(1, 1500) AS i",
        )
        .await
        .expect("register 1500");
    let mut capped = daily_manifest("capped", "* * * * *", "UTC");
    capped["max_runs"] = json!(1);
    capped["partitions"] = json!({"daily": "2019-01-01"});
    db.register(&capped).await;
    let mut early = daily_manifest("early", "* * * * *", "UTC");
    early["partitions"] = json!({"daily": "2030-01-01"});
    db.register(&early).await;
    db.pool
        .execute("SELECT orca.pause('p7')")
        .await
        .expect("pause");
    db.tick("2020-01-01 00:00:30Z").await;
    for (i, at) in ["2020-01-01 00:01:00Z", "2020-01-01 00:02:00Z"]
        .iter()
        .enumerate()
    {
        let t = db.tick(at).await;
        // 1500 - 1 paused + capped; early's fire falls before its first partition.
        assert_eq!(t["runs_created"], 1500, "{t}");
        assert_eq!(t["fires"], 1501, "{t}");
        assert_eq!(t["fires_skipped"], 1, "{t}");
        let runs = db
            .scalar_i64("SELECT count(*) FROM orca.runs WHERE trigger = 'schedule'")
            .await;
        assert_eq!(runs, 1500 * (i as i64 + 1));
    }
    let repeat = db.tick("2020-01-01 00:02:00Z").await;
    assert_eq!(repeat["runs_created"], 0, "idempotent: {repeat}");
    // Uncapped runs run, each with its pending attempt in the queue and its
    // events in order; the capped pipeline's second run waits.
    let by_status = db
        .strings(
            "SELECT p.name || ':' || r.status FROM orca.runs r \
             JOIN orca.pipelines p ON p.id = r.pipeline_id \
             WHERE p.name IN ('capped', 'p1', 'p7', 'early') ORDER BY r.id",
        )
        .await;
    assert_eq!(
        by_status,
        [
            "p1:running",
            "capped:running",
            "p1:running",
            "capped:queued"
        ]
    );
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.queue").await,
        2999,
        "an attempt queued for every running run"
    );
    assert_eq!(
        db.scalar_i64(
            "SELECT count(*) FROM orca.runs r WHERE r.status = 'running' AND \
             (r.attempts <> 1 OR r.started_at IS NULL OR NOT EXISTS \
              (SELECT 1 FROM orca.step_states s WHERE s.run_id = r.id AND s.status = 'pending'))"
        )
        .await,
        0
    );
    let order = db
        .strings(
            "SELECT string_agg(e.kind, ',' ORDER BY e.id) FROM orca.events e \
             JOIN orca.pipelines p ON p.id = e.pipeline_id WHERE p.name = 'p1' \
             AND e.kind LIKE 'run.%' GROUP BY e.run_id ORDER BY e.run_id",
        )
        .await;
    assert_eq!(order, ["run.queued,run.started", "run.queued,run.started"]);
    assert_eq!(
        db.scalar_i64("SELECT count(*) FROM orca.events WHERE kind = 'fire.skipped'")
            .await,
        2
    );
}
