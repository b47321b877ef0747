//! What the benchmarks share: their settings from the environment,
//! percentiles as the peer harness computes them, and the runner login
//! their workers claim as.

use anyhow::{Context, Result};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Executor, PgConnection};

/// A number from the environment, or `default` when unset or empty.
pub fn env_num(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v
            .parse()
            .with_context(|| format!("{name}={v} is not a number")),
        _ => Ok(default),
    }
}

/// The `p`-th percentile of sorted samples, nearest rank (as the peers').
pub fn pct(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1) - 1;
    sorted[rank.min(sorted.len() - 1)]
}

/// The login the workers claim and finish as, as docs/security.md has a
/// runner: in orca_runner only, presenting a runner token.
pub const RUNNER_LOGIN: &str = "orca_bench_runner";

/// The workers' connection: the runner login with a token of the default
/// org and pool (made here), as a runner's own connections are.
pub async fn runner_options(setup: &mut PgConnection, url: &str) -> Result<PgConnectOptions> {
    let made = setup
        .execute(format!("CREATE ROLE {RUNNER_LOGIN} LOGIN IN ROLE orca_runner").as_str())
        .await;
    if let Err(e) = made {
        // Replicas starting together race to make it: the loser sees the
        // catalog's unique index instead of "already exists".
        let msg = e.to_string();
        if !msg.contains("already exists") && !msg.contains("pg_authid_rolname_index") {
            return Err(e).context("the runner login");
        }
    }
    let token: String = sqlx::query_scalar(
        "SELECT orca.create_runner_token('default', 'bench-' || md5(clock_timestamp()::text))",
    )
    .fetch_one(&mut *setup)
    .await
    .context("a runner token")?;
    let opts: PgConnectOptions = url.parse().context("BENCH_DB_URL")?;
    Ok(opts
        .username(RUNNER_LOGIN)
        .options([("orca.runner_token", token.as_str())]))
}
