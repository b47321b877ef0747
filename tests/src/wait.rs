//! Waiting for something a test can observe, instead of sleeping and hoping.

use std::future::Future;
use std::time::{Duration, Instant};

use sqlx::{Executor, PgConnection};

use crate::TestDb;

/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(20);

/// Polls `check` until it gives a value, and returns it; after `within`,
/// panics naming `what`, with `context()` (runner output, a server log) for
/// the reader of the failure.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    within: Duration,
    mut check: F,
    context: impl Fn() -> String,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let t0 = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if t0.elapsed() > within {
            panic!(
                "timed out after {within:?} waiting for {what}\n{}",
                context()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until a boolean query on the test's database is true.
pub async fn wait_for_sql(
    db: &TestDb,
    what: &str,
    sql: &str,
    within: Duration,
    context: impl Fn() -> String,
) {
    wait_until(
        what,
        within,
        || async {
            let done: bool = sqlx::query_scalar(sql)
                .fetch_one(&db.pool)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            done.then_some(())
        },
        context,
    )
    .await
}

/// A new connection to the test's database as `role`, acting in `org`
/// (`SET orca.org`).
pub async fn connect_org(db: &TestDb, role: &str, org: &str) -> PgConnection {
    let mut c = db.connect_as(role).await;
    c.execute(sqlx::query("SELECT set_config('orca.org', $1, false)").bind(org))
        .await
        .unwrap_or_else(|e| panic!("{role} in org {org}: {e}"));
    c
}
