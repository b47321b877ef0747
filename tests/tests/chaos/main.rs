//! The chaos suite: seeded rounds of real work under real faults, checked
//! after each round as a user would check them.
//!
//! Each seed gets a private cluster and two runners, each behind a fault
//! proxy of its own. The work: backfills of the probe pipeline's typed
//! steps, of `probe_tasks`, whose step fans tasks out to worker processes,
//! and of `probe_tables`, which commits to an Iceberg table; two continuous
//! change streams with a writer, merged into Postgres (with a change log)
//! and into an Iceberg table; and batch syncs run again after every fault:
//! an external connector (NATS JetStream) into Postgres, dropped JSON-lines
//! files into Postgres, a table into Parquet. Odd seeds keep the syncs'
//! store, the warehouse and the dropped files in an S3 bucket (moto's
//! server, behind an HTTP fault proxy: no real S3 is reachable here); even
//! seeds keep the store on a small disk of its own (a tmpfs) and the files
//! in a directory. Each round the seed picks faults and their moments:
//! SIGKILL of a runner (with everything it started, as a host dies), of a
//! pipeline binary or a task worker, of an engine, of a connector; a crash
//! of PostgreSQL (`pg_ctl -m immediate`); a runner cut off from the control
//! plane for longer than its lease; the bucket answering 500s, answering
//! too slowly or dropping connections (some after the request landed), or,
//! for a store on its own disk, that disk filling to the last byte. Then it
//! checks: every run finished, each succeeded step's output is what an
//! undisturbed run gave (a fan-out's, the sum its tasks must give; each
//! table commit made once), every change of the source landed exactly once
//! in the change log and the Postgres and Iceberg merges equal the source,
//! every message and file record landed exactly once and every table row at
//! least once, no lease or queued attempt is left, and an infrastructure
//! fault spent no retry (only a killed binary, worker or connector may).
//!
//! Budget (scripts/chaos.sh sets it): CHAOS_SEED replays one seed (1 by
//! default), CHAOS_SEEDS seeds (2 by default: one of each store),
//! CHAOS_ROUNDS rounds each (2), CHAOS_MINUTES runs seeds from a
//! time-derived one until that much time has passed.

mod checks;
mod disk;
mod events;
mod files;
mod proxy;
mod rng;
mod tables;
mod world;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rng::Rng;
use world::{World, LEASE_SECONDS};

/// What the suite prints at the end, and what a long run's note quotes.
#[derive(Default)]
pub struct Figures {
    pub seeds: u32,
    pub rounds: u32,
    pub faults: BTreeMap<&'static str, u32>,
    /// Faults the seed chose when nothing was there to hit (no binary ran).
    pub missed: u32,
    pub changes_checked: u64,
    /// Messages of the connector's stream, each seen landed exactly once.
    pub messages_checked: i64,
    /// Rows of the table sync, each seen in its Parquet files at least once.
    pub parquet_rows_checked: i64,
    /// Records of the dropped files, each seen in Postgres exactly once.
    pub file_records_checked: i64,
    /// Steps that fanned out tasks, each seen to sum its tasks' results.
    pub task_steps_checked: u64,
    /// A pipeline's Iceberg commits, each seen once with its rows.
    pub table_commits_checked: u64,
    pub outputs_checked: u64,
    pub longest_recovery: Duration,
    pub infra_retries: u32,
    /// Object-store requests the S3 proxy failed, and how many of them had
    /// reached the bucket first.
    pub s3_failed: usize,
    pub s3_landed: usize,
}

impl Figures {
    /// The figures on one line.
    fn line(&self) -> String {
        format!(
            "so far: {} seeds, {} rounds passed; faults {:?} ({} with no target); {} object-store requests failed ({} after landing); {} distinct changes, {} connector messages, {} file records, {} Parquet rows, {} step outputs, {} task fan-outs and {} table commits checked; longest recovery {:.1} s; retries spent by infrastructure faults {}",
            self.seeds,
            self.rounds,
            self.faults,
            self.missed,
            self.s3_failed,
            self.s3_landed,
            self.changes_checked,
            self.messages_checked,
            self.file_records_checked,
            self.parquet_rows_checked,
            self.outputs_checked,
            self.task_steps_checked,
            self.table_commits_checked,
            self.longest_recovery.as_secs_f64(),
            self.infra_retries
        )
    }
}

const FAULTS: [&str; 10] = [
    "kill-runner",
    "kill-binary",
    "kill-engine",
    "kill-connector",
    "crash-postgres",
    "cut-runner",
    "s3-errors",
    "s3-slow",
    "s3-drop",
    "s3-outage",
];

struct Budget {
    seeds: Vec<u64>,
    rounds: u32,
    until: Option<Instant>,
    first: u64,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn budget() -> Budget {
    let until = env_u64("CHAOS_MINUTES").map(|m| Instant::now() + Duration::from_secs(m * 60));
    // A time budget explores new seeds; the default budget (CI's) is
    // seeds 1 and 2, so that a red CI names a seed anyone can replay.
    let first = env_u64("CHAOS_SEED").unwrap_or_else(|| match until {
        Some(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() % 100_000),
        None => 1,
    });
    let count = if until.is_some() {
        u64::MAX / 2
    } else if std::env::var("CHAOS_SEED").is_ok() && env_u64("CHAOS_SEEDS").is_none() {
        1
    } else {
        env_u64("CHAOS_SEEDS").unwrap_or(2)
    };
    Budget {
        seeds: (0..count.min(1_000_000)).map(|i| first + i).collect(),
        rounds: env_u64("CHAOS_ROUNDS").map_or(2, |r| r as u32),
        until,
        first,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_rounds_of_work_under_faults_keep_every_row_once_and_spend_no_retry_on_infrastructure(
) {
    let b = budget();
    let mut figures = Figures::default();
    println!(
        "chaos: seeds from {}, {} rounds each{}",
        b.first,
        b.rounds,
        b.until
            .map_or(String::new(), |_| ", until the time budget".into())
    );
    for &seed in &b.seeds {
        if b.until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        one_seed(seed, b.rounds, &mut figures).await;
        figures.seeds += 1;
        // So far, for a long run whose later seed fails.
        println!("chaos: {}", figures.line());
    }
    println!("chaos figures:");
    println!("  seeds passed:            {}", figures.seeds);
    println!("  rounds passed:           {}", figures.rounds);
    for (k, n) in &figures.faults {
        println!("  faults {k:<17} {n}");
    }
    println!("  faults with no target:   {}", figures.missed);
    println!(
        "  object-store requests failed: {} ({} after they landed)",
        figures.s3_failed, figures.s3_landed
    );
    println!("  distinct changes checked: {}", figures.changes_checked);
    println!("  connector messages checked: {}", figures.messages_checked);
    println!(
        "  file records checked:    {}",
        figures.file_records_checked
    );
    println!(
        "  table rows checked in Parquet: {}",
        figures.parquet_rows_checked
    );
    println!("  step outputs checked:    {}", figures.outputs_checked);
    println!("  task fan-outs checked:   {}", figures.task_steps_checked);
    println!(
        "  table commits checked:   {}",
        figures.table_commits_checked
    );
    println!(
        "  longest recovery:        {:.1} s",
        figures.longest_recovery.as_secs_f64()
    );
    println!(
        "  retries spent by infrastructure faults: {}",
        figures.infra_retries
    );
    assert!(figures.rounds >= 1, "no round ran");
}

async fn one_seed(seed: u64, rounds: u32, figures: &mut Figures) {
    let mut rng = Rng::new(seed);
    let mut trace: Vec<String> = Vec::new();
    let t0 = Instant::now();
    let say = |trace: &mut Vec<String>, line: String| {
        let line = format!("seed {seed} +{:.1}s {line}", t0.elapsed().as_secs_f64());
        println!("chaos: {line}");
        trace.push(line);
    };
    let mut w = World::start(seed).await;
    let mut changes = 0;
    let mut commits = 0;
    let mut landed = checks::Landed {
        parquet_rows: 0,
        file_records: 0,
    };
    // The reference: one undisturbed backfill of every month a round may run.
    let reference = checks::reference(&w).await;
    say(
        &mut trace,
        format!("reference backfill: {} step outputs", reference.len()),
    );
    tables::create_source(&w).await;
    w.define_stream().await;
    checks::stream_converged(&w, &trace, Duration::from_secs(120)).await;
    say(&mut trace, "the change stream's snapshot landed".into());
    for round in 0..rounds {
        let months = rng.between(4, 9);
        let faults = rng.between(2, 4);
        say(
            &mut trace,
            format!("round {round}: backfill 2024-01..2024-0{months}, {faults} faults"),
        );
        w.start_writer(u64::from(round) * 100_000);
        w.events.start_publishing();
        w.run_batches().await;
        let runs: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT orca.backfill('probe', '2024-01..2024-0{months}')"
        ))
        .fetch_all(&w.db.pool)
        .await
        .expect("backfill");
        // Steps that fan out tasks to worker processes of their binary.
        let task_runs: Vec<i64> =
            sqlx::query_scalar("SELECT orca.backfill('probe_tasks', '2024-01..2024-02')")
                .fetch_all(&w.db.pool)
                .await
                .expect("backfill probe_tasks");
        // A pipeline committing to Iceberg tables in the failing store.
        let table_runs: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT orca.backfill('probe_tables', '{}')",
            tables::MONTHS
        ))
        .fetch_all(&w.db.pool)
        .await
        .expect("backfill probe_tables");
        for _ in 0..faults {
            tokio::time::sleep(Duration::from_millis(rng.between(500, 4000))).await;
            let mut kind = *rng.pick(&FAULTS);
            // A store on a disk of its own has no bucket to fail: its disk
            // fills instead.
            if w.disk.is_some() && kind.starts_with("s3-") {
                kind = if kind == "s3-outage" {
                    "disk-full-long"
                } else {
                    "disk-full"
                };
            }
            let hit = inject(&mut w, kind, &mut rng).await;
            match hit {
                Some(target) => {
                    *figures.faults.entry(kind).or_default() += 1;
                    say(&mut trace, format!("round {round}: {kind} {target}"));
                }
                None => {
                    figures.missed += 1;
                    say(&mut trace, format!("round {round}: {kind}: nothing to hit"));
                }
            }
            w.run_batches().await;
        }
        let healed = Instant::now();
        checks::runs_finished(&w, &runs, &trace, Duration::from_secs(240)).await;
        figures.task_steps_checked += checks::tasks_summed(&w, &task_runs, &trace).await;
        commits = tables::committed_once(&w, &table_runs, &trace).await;
        let written = w.stop_writer().await;
        let published = w.events.stop_publishing().await;
        changes = checks::stream_converged(&w, &trace, Duration::from_secs(240)).await;
        landed = checks::batches_landed_once(&mut w, published, &trace).await;
        let recovery = healed.elapsed();
        figures.longest_recovery = figures.longest_recovery.max(recovery);
        figures.outputs_checked +=
            checks::outputs_as_undisturbed(&w, &runs, &reference, &trace).await;
        figures.infra_retries += checks::no_retry_spent_by_infrastructure(&w, &trace).await;
        checks::nothing_left_behind(&w, &trace, false).await;
        figures.rounds += 1;
        say(
            &mut trace,
            format!(
                "round {round} passed: {written} transactions written, {changes} changes checked, {published} messages and {} file records landed once and {} table rows at least once, recovered in {:.1} s",
                landed.file_records,
                landed.parquet_rows,
                recovery.as_secs_f64()
            ),
        );
    }
    // Each round checks every change so far again: the seed's last count is
    // how many distinct changes it checked.
    figures.changes_checked += changes;
    figures.messages_checked += w.events.published();
    figures.parquet_rows_checked += landed.parquet_rows;
    figures.table_commits_checked += commits;
    figures.file_records_checked += landed.file_records;
    let (failed, landed) = w.s3_proxy.hits();
    figures.s3_failed += failed;
    figures.s3_landed += landed;
    w.exec("SELECT orca.pause_sync('live'), orca.pause_sync('lake')")
        .await;
    checks::nothing_left_behind(&w, &trace, true).await;
    say(
        &mut trace,
        "paused: no lease, queued attempt or live slot session left".into(),
    );
}

/// Sends one fault; returns what it hit, or None when nothing was there.
async fn inject(w: &mut World, kind: &str, rng: &mut Rng) -> Option<String> {
    match kind {
        "kill-runner" => {
            let i = rng.between(0, 1) as usize;
            if let Some(mut r) = w.runners[i].take() {
                r.kill();
            }
            tokio::time::sleep(Duration::from_millis(rng.between(200, 3000))).await;
            w.start_runner(i);
            Some(format!("chaos-r{i} (restarted)"))
        }
        "kill-binary" | "kill-engine" => {
            // A pipeline binary: a step's process, or one of its task
            // workers (the same binary in its worker role).
            let programs: &[&str] = if kind == "kill-binary" {
                &["probe", "probe_tasks", "probe_tables"]
            } else {
                &["orca-engine"]
            };
            let pid = kill_one(
                || programs.iter().flat_map(|p| w.processes(p)).collect(),
                rng,
            )
            .await?;
            Some(format!("{} pid {pid}", programs.join(" or ")))
        }
        "kill-connector" => {
            let pid = kill_one(|| w.events.pids(&w.tag), rng).await?;
            w.events.kills += 1;
            Some(format!("nats_jetstream pid {pid}"))
        }
        "crash-postgres" => {
            tokio::task::block_in_place(|| w.crash_postgres());
            Some("the control plane and the source".into())
        }
        "cut-runner" => {
            let i = rng.between(0, 1) as usize;
            w.proxies[i].cut();
            tokio::time::sleep(Duration::from_secs(LEASE_SECONDS + 5)).await;
            w.proxies[i].heal();
            Some(format!("chaos-r{i} for {} s", LEASE_SECONDS + 5))
        }
        "s3-errors" | "s3-slow" | "s3-drop" | "s3-outage" => {
            let (fault, seconds) = match kind {
                "s3-errors" => (orca_tests::s3proxy::Fault::Error, rng.between(2, 10)),
                "s3-slow" => (orca_tests::s3proxy::Fault::Slow, rng.between(1, 4)),
                "s3-drop" => (orca_tests::s3proxy::Fault::Drop, rng.between(2, 8)),
                // Longer than the clients' retries: attempts are handed back.
                _ => (orca_tests::s3proxy::Fault::Error, rng.between(50, 70)),
            };
            w.s3_proxy.fail(fault, Duration::from_secs(seconds));
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            Some(format!("every object-store request for {seconds} s"))
        }
        "disk-full" | "disk-full-long" => {
            let disk = w.disk.as_ref()?;
            let seconds = if kind == "disk-full" {
                rng.between(2, 12)
            } else {
                // Longer than a write waits for room: attempts are handed back.
                rng.between(50, 70)
            };
            let filler = disk.fill();
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            let _ = std::fs::remove_file(filler);
            Some(format!("the store's disk for {seconds} s"))
        }
        _ => None,
    }
}

/// SIGKILLs one of the processes `find` finds, now or within two seconds
/// (between two attempts); None when there is none.
async fn kill_one(find: impl Fn() -> Vec<i32>, rng: &mut Rng) -> Option<i32> {
    let mut pids = find();
    for _ in 0..20 {
        if !pids.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        pids = find();
    }
    if pids.is_empty() {
        return None;
    }
    let pid = *rng.pick(&pids);
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    Some(pid)
}
