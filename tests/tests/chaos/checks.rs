//! What a round must leave true, checked as a user would: the runs, their
//! outputs, the rows the stream moved, the leases and slots, the retries.
//! A failure names the seed's trace so far and how to replay it.

use std::collections::BTreeMap;
use std::time::Duration;

use orca_tests::*;
use serde_json::Value;

use crate::world::World;

/// (run's partitions, step, partition) -> the step's output.
pub type Outputs = BTreeMap<(String, String, String), Value>;

fn fail(w: &World, trace: &[String], what: &str) -> ! {
    let seed = trace
        .first()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("?");
    panic!(
        "chaos: {what}\nreplay: CHAOS_SEED={seed} scripts/chaos.sh\ntrace:\n{}\nrunners:\n{}",
        trace.join("\n"),
        w.output()
    );
}

async fn outputs_of(w: &World, runs: &[i64]) -> Outputs {
    let rows: Vec<(String, String, String, Option<Value>)> = sqlx::query_as(
        "SELECT array_to_string(r.partitions, ','), s.step, s.partition, s.output
         FROM orca.step_states s JOIN orca.runs r ON r.id = s.run_id
         WHERE r.id = ANY ($1) AND r.status = 'succeeded'",
    )
    .bind(runs)
    .fetch_all(&w.db.pool)
    .await
    .expect("step outputs");
    rows.into_iter()
        .map(|(p, s, part, o)| ((p, s, part), o.unwrap_or(Value::Null)))
        .collect()
}

/// An undisturbed backfill of every month a round may run, and its outputs.
pub async fn reference(w: &World) -> Outputs {
    let runs: Vec<i64> = sqlx::query_scalar("SELECT orca.backfill('probe', '2024-01..2024-09')")
        .fetch_all(&w.db.pool)
        .await
        .expect("the reference backfill");
    runs_finished(w, &runs, &[], Duration::from_secs(240)).await;
    let failed =
        w.db.scalar_i64(&format!(
            "SELECT count(*) FROM orca.runs WHERE id IN ({}) AND status <> 'succeeded'",
            runs.iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ))
        .await;
    if failed > 0 {
        fail(w, &[], "the undisturbed reference backfill did not succeed");
    }
    outputs_of(w, &runs).await
}

/// Waits until each of `runs` has ended.
pub async fn runs_finished(w: &World, runs: &[i64], trace: &[String], within: Duration) {
    let t0 = std::time::Instant::now();
    loop {
        let open: Vec<(i64, String)> = sqlx::query_as(
            "SELECT id, status FROM orca.runs
             WHERE id = ANY ($1) AND status NOT IN ('succeeded', 'failed', 'cancelled')",
        )
        .bind(runs)
        .fetch_all(&w.db.pool)
        .await
        .expect("runs");
        if open.is_empty() {
            return;
        }
        if t0.elapsed() > within {
            let why: Vec<(String, String)> =
                sqlx::query_as("SELECT code, message FROM orca.explain($1)")
                    .bind(open[0].0)
                    .fetch_all(&w.db.pool)
                    .await
                    .unwrap_or_default();
            fail(
                w,
                trace,
                &format!("runs still open {within:?} after the faults: {open:?}; why: {why:?}"),
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until the merge equals the source and the change log holds every
/// change the source's trigger logged, each once; returns how many.
pub async fn stream_converged(w: &World, trace: &[String], within: Duration) -> u64 {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(n) = converged(w).await {
            return n;
        }
        if t0.elapsed() > within {
            let (logged, landed) = change_log_sets(&w.db.pool).await.unwrap_or_default();
            let missing: Vec<&String> = logged
                .iter()
                .filter(|x| !landed.contains(x))
                .take(5)
                .collect();
            let extra: Vec<&String> = landed
                .iter()
                .filter(|x| !logged.contains(x))
                .take(5)
                .collect();
            fail(
                w,
                trace,
                &format!(
                    "the stream did not converge in {within:?}: {} logged, {} landed; \
                     missing {missing:?}, not logged or twice {extra:?}",
                    logged.len(),
                    landed.len()
                ),
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn converged(w: &World) -> Option<u64> {
    let differences: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM public.orders o FULL JOIN raw.orders r USING (id)
         WHERE o.id IS NULL OR r.id IS NULL
            OR (o.customer, o.amount, o.qty) IS DISTINCT FROM (r.customer, r.amount, r.qty)",
    )
    .fetch_one(&w.db.pool)
    .await
    .ok()?;
    if differences != 0 {
        return None;
    }
    let (logged, landed) = change_log_sets(&w.db.pool).await.ok()?;
    (logged == landed).then(|| {
        logged
            .iter()
            .filter_map(|l| l.rsplit_once(" x").and_then(|(_, n)| n.parse::<u64>().ok()))
            .sum()
    })
}

/// Each succeeded run's step outputs are the undisturbed run's; a run that
/// failed did so only with its retries spent on killed binaries. Returns
/// how many outputs were compared.
pub async fn outputs_as_undisturbed(
    w: &World,
    runs: &[i64],
    reference: &Outputs,
    trace: &[String],
) -> u64 {
    let got = outputs_of(w, runs).await;
    for (k, v) in &got {
        match reference.get(k) {
            Some(want) if want == v => {}
            other => fail(
                w,
                trace,
                &format!("{k:?} output {v} under faults, {other:?} undisturbed"),
            ),
        }
    }
    let failed: Vec<(i64, i32, i64)> = sqlx::query_as(
        "SELECT r.id, r.run_retries,
                (SELECT count(*) FROM orca.attempts a WHERE a.run_id = r.id AND a.status = 'failed')
         FROM orca.runs r WHERE r.id = ANY ($1) AND r.status <> 'succeeded'",
    )
    .bind(runs)
    .fetch_all(&w.db.pool)
    .await
    .expect("failed runs");
    for (run, retries, failed_attempts) in failed {
        if failed_attempts <= i64::from(retries) {
            fail(
                w,
                trace,
                &format!("run {run} ended unsucceeded with {failed_attempts} failed attempts and {retries} retries"),
            );
        }
    }
    got.len() as u64
}

/// Every failed attempt of every run was a killed binary or engine: the
/// only fault that may spend a retry. Returns the count of the others (and
/// fails the round if there is one).
pub async fn no_retry_spent_by_infrastructure(w: &World, trace: &[String]) -> u32 {
    let others: Vec<(i64, i32, Option<String>)> = sqlx::query_as(
        "SELECT a.run_id, a.number, a.error FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id
         WHERE a.status = 'failed' AND r.kind <> 'sense'
           AND coalesce(a.error, '') NOT LIKE 'killed by a signal%'
         ORDER BY a.id",
    )
    .fetch_all(&w.db.pool)
    .await
    .expect("failed attempts");
    if !others.is_empty() {
        fail(
            w,
            trace,
            &format!("an infrastructure fault spent a retry: {others:?}"),
        );
    }
    others.len() as u32
}

/// No lease or queued attempt outlives its run; once the stream is paused,
/// none at all, and no session reads its slot.
pub async fn nothing_left_behind(w: &World, trace: &[String], paused: bool) {
    let t0 = std::time::Instant::now();
    loop {
        let (leases, queued, senders): (i64, i64, i64) = sqlx::query_as(&format!(
            "SELECT (SELECT count(*) FROM orca.leases l JOIN orca.attempts a ON a.id = l.attempt_id
                     JOIN orca.runs r ON r.id = a.run_id
                     WHERE {paused} OR r.status <> 'running' OR r.kind <> 'sync'),
                    (SELECT count(*) FROM orca.queue q JOIN orca.attempts a ON a.id = q.attempt_id
                     JOIN orca.runs r ON r.id = a.run_id
                     WHERE {paused} OR r.status <> 'running' OR r.kind <> 'sync'),
                    (SELECT count(*) FROM pg_stat_replication x, orca.cdc_slots s
                     WHERE {paused} AND x.application_name = 'orca ' || s.slot)"
        ))
        .fetch_one(&w.db.pool)
        .await
        .expect("leases and queue");
        if leases == 0 && queued == 0 && senders == 0 {
            return;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            fail(
                w,
                trace,
                &format!("left behind: {leases} leases, {queued} queued attempts, {senders} slot sessions"),
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
