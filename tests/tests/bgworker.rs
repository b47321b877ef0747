//! The background worker in a private cluster with the extension preloaded:
//! it ticks on its own, survives a reload (SIGHUP) and a failing tick.

use std::time::{Duration, Instant};

use orca_tests::cluster::PrivateCluster;
use orca_tests::sqlx::{self, Connection, Executor, PgConnection};
use orca_tests::*;

async fn worker_pid(c: &mut PgConnection) -> Option<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE backend_type = 'orca scheduler'")
        .fetch_optional(c)
        .await
        .expect("pg_stat_activity")
}

/// Claims the pending attempt and lets its one-second lease lapse; returns
/// whether the worker declared it lost within `within`.
async fn lease_lapses(c: &mut PgConnection, within: Duration) -> bool {
    let l = claim(&mut *c, "runner", 1).await;
    assert_eq!(l.len(), 1, "an attempt to claim");
    let t0 = Instant::now();
    while t0.elapsed() < within {
        let status: String = sqlx::query_scalar("SELECT status FROM orca.attempts WHERE id = $1")
            .bind(l[0].attempt)
            .fetch_one(&mut *c)
            .await
            .expect("attempt");
        if status == "lost" {
            return true;
        }
        // Not wait_until: the answer "not lost within the window" is one
        // this test needs too (a failing tick must not commit).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn the_worker_ticks_survives_sighup_and_a_failing_tick() {
    let cluster = PrivateCluster::start(&[
        "orca.databases = 'orca_bg'",
        "orca.tick_ms = 100",
        "orca.lease_seconds = 1",
        "orca.lost_attempts_max = 100",
    ]);
    let mut admin = PgConnection::connect(&cluster.url("postgres"))
        .await
        .expect("connect");
    admin
        .execute("CREATE DATABASE orca_bg")
        .await
        .expect("create db");
    let mut c = PgConnection::connect(&cluster.url("orca_bg"))
        .await
        .expect("connect orca_bg");
    c.execute("CREATE EXTENSION orca").await.expect("extension");
    let m = daily_manifest("bg", "0 3 * * *", "UTC");
    sqlx::query("SELECT orca.register($1)")
        .bind(&m)
        .execute(&mut c)
        .await
        .expect("register");
    c.execute("SELECT orca.run('bg', '2024-01-01')")
        .await
        .expect("run");

    // The database did not exist when the server started: the worker retries
    // every few seconds until it does.
    let c = tokio::sync::Mutex::new(c);
    let pid = wait_until(
        "the worker to run",
        Duration::from_secs(20),
        || async { worker_pid(&mut *c.lock().await).await },
        || cluster.log(),
    )
    .await;
    let mut c = c.into_inner();
    assert!(
        lease_lapses(&mut c, Duration::from_secs(10)).await,
        "the worker did not reclaim a lapsed lease\n{}",
        cluster.log()
    );
    // Its ticks are counted and timed (track_functions, reported after
    // each tick), and the lapsed leases counted, in orca.metrics().
    let c = tokio::sync::Mutex::new(c);
    wait_until(
        "the worker's ticks in orca.metrics()",
        Duration::from_secs(20),
        || async {
            let got: Vec<(String, f64)> = sqlx::query_as(
                "SELECT metric, value FROM orca.metrics() \
                 WHERE metric IN ('orca_ticks_total', 'orca_tick_seconds_total', \
                                  'orca_leases_lapsed_total')",
            )
            .fetch_all(&mut *c.lock().await)
            .await
            .expect("metrics");
            let value = |m: &str| got.iter().find(|g| g.0 == m).map_or(0.0, |g| g.1);
            (value("orca_ticks_total") >= 1.0
                && value("orca_tick_seconds_total") > 0.0
                && value("orca_leases_lapsed_total") >= 1.0)
                .then_some(())
        },
        || cluster.log(),
    )
    .await;
    let mut c = c.into_inner();

    // A reload reaches the worker, which keeps running and ticking.
    c.execute("ALTER SYSTEM SET orca.tick_ms = 150")
        .await
        .expect("alter");
    c.execute("SELECT pg_reload_conf()").await.expect("reload");
    // A tick after the reload (the lease it lapses) shows the worker read
    // it; the same pid shows it did not restart to do so.
    assert!(
        lease_lapses(&mut c, Duration::from_secs(10)).await,
        "no ticks after SIGHUP"
    );
    assert_eq!(
        worker_pid(&mut c).await,
        Some(pid),
        "the worker restarted on SIGHUP"
    );

    // A tick that fails is rolled back, and the worker lives on. The broken
    // schedule is made due, or the tick would not read it.
    c.execute("UPDATE orca.schedules SET cron = 'not a cron', next_fire_at = '-infinity'")
        .await
        .expect("break the schedule");
    assert!(
        !lease_lapses(&mut c, Duration::from_secs(3)).await,
        "a failing tick must not commit anything"
    );
    assert_eq!(
        worker_pid(&mut c).await,
        Some(pid),
        "the worker died on a bad tick"
    );
    assert!(
        cluster
            .log()
            .contains("tick in database orca_bg failed and was rolled back"),
        "{}",
        cluster.log()
    );
    c.execute("UPDATE orca.schedules SET cron = '0 3 * * *'")
        .await
        .expect("mend the schedule");
    let c = tokio::sync::Mutex::new(c);
    wait_until(
        "ticks to resume after the schedule was mended",
        Duration::from_secs(10),
        || async {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM orca.attempts WHERE status = 'leased'")
                    .fetch_one(&mut *c.lock().await)
                    .await
                    .expect("count");
            (n == 0).then_some(())
        },
        || cluster.log(),
    )
    .await;
}
