//! What a round must leave true, checked as a user would: the runs, their
//! outputs, the rows the stream moved, the leases and slots, the retries.
//! A failure names the seed's trace so far and how to replay it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use orca_tests::*;
use serde_json::{json, Value};

use crate::world::World;

/// (run's partitions, step, partition) -> the step's output.
pub type Outputs = BTreeMap<(String, String, String), Value>;

pub fn fail(w: &World, trace: &[String], what: &str) -> ! {
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
            let (source, lake) = lake_sets(w).await.unwrap_or_default();
            let lake_missing: Vec<&String> = source.difference(&lake).take(5).collect();
            let lake_extra: Vec<&String> = lake.difference(&source).take(5).collect();
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
                     missing {missing:?}, not logged or twice {extra:?}; the Iceberg table: \
                     {} rows of the source's {}, missing {lake_missing:?}, not in the source \
                     {lake_extra:?}",
                    logged.len(),
                    landed.len(),
                    lake.len(),
                    source.len()
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
    if logged != landed {
        return None;
    }
    // Last, being the slowest to read: the Iceberg table in the bucket.
    let (source, lake) = lake_sets(w).await?;
    (source == lake).then(|| {
        logged
            .iter()
            .filter_map(|l| l.rsplit_once(" x").and_then(|(_, n)| n.parse::<u64>().ok()))
            .sum()
    })
}

/// The source's rows and the Iceberg table's (`lake.orders`, read from the
/// bucket by PyIceberg, not through the fault proxy), each as
/// `id customer amount qty`; None while the table cannot be read.
async fn lake_sets(w: &World) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
    let source: Vec<(i64, String, Option<String>, Option<i32>)> =
        sqlx::query_as("SELECT id, customer, amount::text, qty FROM public.orders")
            .fetch_all(&w.db.pool)
            .await
            .ok()?;
    let source = source
        .into_iter()
        .map(|(id, c, a, q)| row_key(id, &c, a.as_deref(), q.map(i64::from)))
        .collect();
    let (url, warehouse) = (w.db.url(), w.warehouse());
    let read = python(w, "iceberg.py", &["read", &url, &warehouse, "lake.orders"])
        .await
        .ok()?;
    let text = |v: &Value| match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    };
    let lake = read["rows"]
        .as_array()?
        .iter()
        .map(|r| {
            row_key(
                r["id"].as_i64().unwrap_or(-1),
                r["customer"].as_str().unwrap_or("?"),
                text(&r["amount"]).as_deref(),
                r["qty"].as_i64(),
            )
        })
        .collect();
    Some((source, lake))
}

fn row_key(id: i64, customer: &str, amount: Option<&str>, qty: Option<i64>) -> String {
    format!(
        "{id} {customer} {} {}",
        amount.unwrap_or("null"),
        qty.map_or("null".into(), |q| q.to_string())
    )
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
    failed_only_with_retries_spent(w, runs, trace).await;
    got.len() as u64
}

/// How many tasks `probe_tasks` fans out in the chaos world (the runners'
/// `PROBE_TASKS`).
pub const TASKS: u64 = 40;

/// Every `probe_tasks` run ended, failed only with its retries spent, and
/// each succeeded fan-out returned the sum of the squares of 0..TASKS, as
/// every task ran once to its end however many workers died. Returns how
/// many fan-outs it compared.
pub async fn tasks_summed(w: &World, runs: &[i64], trace: &[String]) -> u64 {
    runs_finished(w, runs, trace, Duration::from_secs(240)).await;
    let want = (0..TASKS).map(|i| i * i).sum::<u64>();
    let got = outputs_of(w, runs).await;
    for (k, v) in &got {
        if v.as_u64() != Some(want) {
            fail(
                w,
                trace,
                &format!("{k:?}: the fan-out gave {v} under faults, not {want}"),
            );
        }
    }
    failed_only_with_retries_spent(w, runs, trace).await;
    got.len() as u64
}

/// Each of `runs` that did not succeed failed more attempts than it had
/// retries (the checks of failed attempts say what may fail one).
pub async fn failed_only_with_retries_spent(w: &World, runs: &[i64], trace: &[String]) {
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
}

/// Every failed attempt of every run was a killed binary, task worker,
/// engine or connector: the only faults that may spend a retry (no more
/// attempts failed on a connector than connectors were killed; a task
/// fails its step only when its every try's worker was killed). Returns
/// the count of the others (and fails the round if there is one).
pub async fn no_retry_spent_by_infrastructure(w: &World, trace: &[String]) -> u32 {
    let mut others: Vec<(i64, i32, Option<String>)> = sqlx::query_as(
        "SELECT a.run_id, a.number, a.error FROM orca.attempts a JOIN orca.runs r ON r.id = a.run_id
         WHERE a.status = 'failed' AND r.kind <> 'sense'
           AND coalesce(a.error, '') NOT LIKE 'killed by a signal%'
           AND coalesce(a.error, '') NOT LIKE '%task worker % died while running task %SIGKILL%'
         ORDER BY a.id",
    )
    .fetch_all(&w.db.pool)
    .await
    .expect("failed attempts");
    let connector = |e: &Option<String>| {
        e.as_deref()
            .is_some_and(|e| e.contains("connector nats_jetstream"))
    };
    let on_connector = others.iter().filter(|(_, _, e)| connector(e)).count();
    if on_connector <= w.events.kills as usize {
        others.retain(|(_, _, e)| !connector(e));
    }
    if !others.is_empty() {
        fail(
            w,
            trace,
            &format!("an infrastructure fault spent a retry: {others:?}"),
        );
    }
    others.len() as u32
}

/// What [`batches_landed_once`] checked.
pub struct Landed {
    /// Rows of the table sync, each in its Parquet files at least once.
    pub parquet_rows: i64,
    /// Records of the dropped files, each in Postgres exactly once.
    pub file_records: i64,
}

/// Every run of each batch sync (the connector's, the table's, the files')
/// ended, failed only with its retries spent on kills; then one more run
/// of each, with no fault, succeeds; and each message published (ids 1 to
/// `published`) is in the connector's table exactly once, each record of
/// the dropped files in theirs exactly once, each row of the table in the
/// Parquet files at least once, as declared (read by pyarrow, from the
/// bucket or the disk, not through the fault proxy).
pub async fn batches_landed_once(w: &mut World, published: i64, trace: &[String]) -> Landed {
    let (events, ledger, drops) = (
        w.events.runs.clone(),
        w.ledger_runs.clone(),
        w.drops.runs.clone(),
    );
    for runs in [&events, &ledger, &drops] {
        runs_finished(w, runs, trace, Duration::from_secs(240)).await;
        failed_only_with_retries_spent(w, runs, trace).await;
    }
    for sync in ["events", "ledger", "drops"] {
        let Some(last) = crate::events::start_run(&w.db, sync).await else {
            fail(w, trace, &format!("no run of sync {sync} could be started"));
        };
        runs_finished(w, &[last], trace, Duration::from_secs(240)).await;
        let status: String = sqlx::query_scalar("SELECT status FROM orca.runs WHERE id = $1")
            .bind(last)
            .fetch_one(&w.db.pool)
            .await
            .expect("the last run");
        if status != "succeeded" {
            fail(
                w,
                trace,
                &format!("sync {sync}'s run {last}, with no fault, ended {status}"),
            );
        }
    }
    ids_landed_once(
        w,
        trace,
        "raw.events",
        "d.id",
        published,
        "the connector's messages",
    )
    .await;
    // A files stream's columns are inferred: the id is read as the record has it.
    let written = w.drops.written();
    ids_landed_once(
        w,
        trace,
        "raw.drops",
        "(to_jsonb(d) ->> 'id')::bigint",
        written,
        "the dropped files' records",
    )
    .await;
    let source: (i64, Option<i64>, Option<i64>) =
        sqlx::query_as("SELECT count(*), min(id), max(id) FROM public.ledger")
            .fetch_one(&w.db.pool)
            .await
            .expect("public.ledger");
    let landed = parquet_ids(w, &format!("{}/ledger", w.parquet())).await;
    let want = json!({"ids": source.0, "min": source.1, "max": source.2});
    let got = json!({"ids": landed["ids"], "min": landed["min"], "max": landed["max"]});
    let rows = landed["rows"].as_i64().unwrap_or(-1);
    if got != want || rows < source.0 {
        fail(
            w,
            trace,
            &format!(
                "the table's rows did not land in Parquet at least once each: {got} of {want} \
                 ({landed})"
            ),
        );
    }
    Landed {
        parquet_rows: source.0,
        file_records: written,
    }
}

/// Fails unless `table` (aliased `d`) holds ids 1..=`n` by `id`, each once.
async fn ids_landed_once(w: &World, trace: &[String], table: &str, id: &str, n: i64, what: &str) {
    let (rows, ids, min, max): (i64, i64, Option<i64>, Option<i64>) = sqlx::query_as(&format!(
        "SELECT count(*), count(DISTINCT {id}), min({id}), max({id}) FROM {table} d"
    ))
    .fetch_one(&w.db.pool)
    .await
    .unwrap_or_else(|e| panic!("{table}: {e}"));
    if (rows, ids, min, max) != (n, n, Some(1), Some(n)) {
        fail(
            w,
            trace,
            &format!(
                "{what} 1..{n} did not land once each: {rows} rows, {ids} ids, from {min:?} to {max:?}"
            ),
        );
    }
}

/// What `tests/py/parquet_ids.py` reads of the Parquet files under `folder`.
async fn parquet_ids(w: &World, folder: &str) -> Value {
    python(w, "parquet_ids.py", &[folder])
        .await
        .unwrap_or_else(|e| json!({ "error": e }))
}

/// What a reader of `tests/py/` printed, as JSON, or why it could not. It
/// reaches the bucket directly, not through the fault proxy.
pub async fn python(w: &World, script: &str, args: &[&str]) -> Result<Value, String> {
    let script = repo_root().join("tests/py").join(script);
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let env = w.s3.env();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(orca_tests::s3::python())
            .arg(script)
            .args(args)
            .envs(env)
            .output()
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
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
