//! `orca::main::<P>()`: the command line every pipeline binary has.

use std::path::PathBuf;

use chrono::Utc;
use clap::{Parser, Subcommand};
use orca_client::Control;
use orca_core::api::LeaseToken;
use orca_core::cron::{parse_tz, Schedule};
use orca_core::partition::{Fills as CoreFills, PartitionKind, PartitionSet};
use serde_json::Value;

use crate::ctx::LogSink;
use crate::driver::{execute, Outcome, StepResult};
use crate::error::SdkError;
use crate::manifest::validate;
use crate::pipeline::{registry_hash, Fills, Partitioning, Pipeline};
use crate::store::{MemStore, PgStore};

#[derive(Parser, Debug)]
#[command(about = "An Orca pipeline binary", disable_version_flag = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Describe the pipeline; --json prints the manifest orca.register takes.
    Describe {
        #[arg(long)]
        json: bool,
    },
    /// Run the pipeline in memory, without a control plane.
    Run {
        /// 2024-01, 2024-01,2024-03, 2024-01..2024-06, @all or @file:path.
        #[arg(long)]
        partitions: String,
        /// Where the run's log file goes.
        #[arg(long, env = "ORCA_LOGS", default_value = "orca-logs")]
        logs: PathBuf,
    },
    /// The next fires of the schedule and the partitions they fill.
    Fires {
        #[arg(default_value_t = 10)]
        n: usize,
    },
    /// Poll the datasets a sensor watches and report their new snapshots
    /// (the runner calls this for a sensor pipeline).
    Sense {
        #[arg(long, env = "ORCA_LEASE")]
        lease: LeaseToken,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, env = "ORCA_ORG")]
        org: Option<String>,
    },
    /// Print the keys of a keyed pipeline: the snapshot of its keys dataset
    /// read, then one key a line. With --lease (the runner calls it so),
    /// report them to the control plane instead.
    Keys {
        #[arg(long, env = "ORCA_LEASE")]
        lease: Option<LeaseToken>,
        #[arg(long, env = "DATABASE_URL")]
        database_url: Option<String>,
        #[arg(long, env = "ORCA_ORG")]
        org: Option<String>,
    },
    /// Run an attempt a runner leased (the runner calls this).
    Attempt {
        #[arg(long, env = "ORCA_LEASE")]
        lease: LeaseToken,
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, env = "ORCA_ORG")]
        org: Option<String>,
    },
}

/// Exit codes: what a runner and a shell can tell apart.
const EXIT_STEP_FAILED: i32 = 1;
const EXIT_USAGE: i32 = 2;
const EXIT_CONTROL: i32 = 3;
/// The object store did not answer (or the warehouse's disk is full): the
/// runner hands the attempt back instead of failing it, as it does for
/// `orca-engine`'s same code.
const EXIT_STORE_UNAVAILABLE: i32 = 4;

fn binary_path() -> String {
    std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| std::env::args().next().unwrap_or_default())
}

/// Hands the binary's command line to the SDK; never returns.
pub fn main<P: Pipeline>() -> ! {
    // A task worker (a step's local worker, or a runner's) takes no command
    // line: it serves the tasks it is sent.
    if std::env::var(orca_core::tasks::ROLE_ENV).as_deref() == Ok("worker") {
        let code = match crate::tasks::worker::serve(&P::tasks()) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("{} task worker: {e}", P::NAME);
                EXIT_USAGE
            }
        };
        std::process::exit(code)
    }
    // A Flink job's guard (orca::flink) stops the job when its step dies.
    if let Ok(spec) = std::env::var(crate::flink::GUARD_ENV) {
        std::process::exit(crate::flink::guard(&spec))
    }
    let cli = Cli::parse();
    let binary = binary_path();
    let code = match run_cli::<P>(cli.cmd, &binary) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{}: {e}", P::NAME);
            match e {
                SdkError::Control(_) => EXIT_CONTROL,
                SdkError::StepFailed { .. } => EXIT_STEP_FAILED,
                SdkError::StoreUnavailable(_) => EXIT_STORE_UNAVAILABLE,
                _ => EXIT_USAGE,
            }
        }
    };
    std::process::exit(code)
}

fn run_cli<P: Pipeline>(cmd: Cmd, binary: &str) -> Result<i32, SdkError> {
    // What the compiler could not check is checked before anything runs.
    let manifest = validate::<P>(binary)?;
    match cmd {
        Cmd::Describe { json: true } => {
            let text = serde_json::to_string_pretty(&manifest)
                .map_err(|e| SdkError::Usage(e.to_string()))?;
            println!("{text}");
            Ok(0)
        }
        Cmd::Describe { json: false } => {
            describe::<P>(&manifest);
            Ok(0)
        }
        Cmd::Fires { n } => fires::<P>(n),
        Cmd::Run { partitions, logs } => run_in_memory::<P>(&partitions, &logs),
        Cmd::Attempt {
            lease,
            database_url,
            org,
        } => attempt::<P>(lease, &database_url, org.as_deref()),
        Cmd::Sense {
            lease,
            database_url,
            org,
        } => sense::<P>(lease, &database_url, org.as_deref()),
        Cmd::Keys {
            lease,
            database_url,
            org,
        } => keys::<P>(lease, database_url.as_deref(), org.as_deref()),
    }
}

fn describe<P: Pipeline>(m: &Value) {
    let params = P::params();
    let steps = P::steps();
    println!(
        "pipeline {} (registry hash {})",
        P::NAME,
        registry_hash(&steps, &P::tasks())
    );
    match params.partitions {
        Partitioning::Dated { kind, start } => match params.backfill_per_run {
            Some(n) => println!("  partitions  {kind} from {start}, backfilled {n} a run"),
            None => println!("  partitions  {kind} from {start}"),
        },
        Partitioning::Keyed { dataset, column } => println!(
            "  partitions  keyed by {dataset}.{column}, {} keys a run",
            params
                .keys_per_run
                .unwrap_or(orca_core::keyed::KEYS_PER_RUN_DEFAULT)
        ),
    }
    match params.schedule {
        Some((cron, tz)) => println!(
            "  schedule    {cron} ({tz}), fills the {} partition{}",
            match params.fills {
                Fills::Previous => "previous",
                Fills::Current => "current",
            },
            if params.catchup {
                ", catches up"
            } else {
                ", no catch-up"
            }
        ),
        None => println!("  schedule    none"),
    }
    println!(
        "  max_runs    {}   run_retries {}   pool {}",
        params
            .max_runs
            .map_or_else(|| "no cap".to_string(), |n| n.to_string()),
        params.run_retries,
        params.pool
    );
    println!("  steps");
    for s in &steps {
        println!(
            "    {:<16} {:<7} {:<24} retries {}  code {}",
            s.name,
            s.kind,
            s.after.map(|a| format!("after {a}")).unwrap_or_default(),
            s.retries,
            s.code
        );
        if !s.reads.is_empty() || !s.writes.is_empty() {
            println!(
                "    {:<16} reads {}  writes {}",
                "",
                if s.reads.is_empty() {
                    "-".to_string()
                } else {
                    s.reads.join(", ")
                },
                if s.writes.is_empty() {
                    "-".to_string()
                } else {
                    s.writes.join(", ")
                }
            );
        }
    }
    let tasks = P::tasks();
    if !tasks.is_empty() {
        println!("  tasks");
        for t in &tasks {
            println!(
                "    {:<16} {} -> {}   retries {}  backoff {} ms  code {}",
                t.name, t.input, t.output, t.retries, t.backoff_ms, t.code
            );
        }
    }
    let b = params.build;
    println!(
        "  built from  {} {}{}",
        b.source.unwrap_or("(no ORCA_SOURCE)"),
        b.commit.unwrap_or("(no ORCA_COMMIT)"),
        if b.dirty() == Some(true) {
            " (dirty)"
        } else {
            ""
        }
    );
    println!("  binary      {}", m["binary"].as_str().unwrap_or_default());
}

fn partition_set<P: Pipeline>() -> Result<(PartitionSet, chrono_tz::Tz), SdkError> {
    let params = P::params();
    let Partitioning::Dated { kind, start } = params.partitions else {
        return Err(SdkError::Usage(format!(
            "{} is keyed: its partitions are keys, not months or days",
            P::NAME
        )));
    };
    let kind = PartitionKind::parse_name(kind)
        .ok_or_else(|| SdkError::Usage(format!("unknown partitions {kind}")))?;
    let set = PartitionSet::new(kind, start).map_err(|e| SdkError::Usage(e.to_string()))?;
    let tz = parse_tz(params.schedule.map_or("UTC", |(_, tz)| tz))
        .map_err(|e| SdkError::Usage(e.to_string()))?;
    Ok((set, tz))
}

fn fires<P: Pipeline>(n: usize) -> Result<i32, SdkError> {
    let params = P::params();
    let Some((cron, tz)) = params.schedule else {
        println!("{} has no schedule", P::NAME);
        return Ok(0);
    };
    let schedule = Schedule::parse(cron, tz).map_err(|e| SdkError::Usage(e.to_string()))?;
    let (set, tz) = partition_set::<P>()?;
    let fills = match params.fills {
        Fills::Previous => CoreFills::Previous,
        Fills::Current => CoreFills::Current,
    };
    for t in schedule.next_n(Utc::now(), n.min(10_000)) {
        let local = t.with_timezone(&tz);
        match set.for_fire(t, tz, fills) {
            Some(p) => println!("{}  fills {p}", local.format("%Y-%m-%d %H:%M %Z")),
            None => println!(
                "{}  (before the first partition)",
                local.format("%Y-%m-%d %H:%M %Z")
            ),
        }
    }
    Ok(0)
}

/// The partitions a spec names: a list, a range, @all, or @file:path.
fn expand_spec<P: Pipeline>(spec: &str) -> Result<Vec<String>, SdkError> {
    let spec = match spec.strip_prefix("@file:") {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| SdkError::Io {
                what: format!("reading partitions from {path}"),
                error: e,
            })?;
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .collect::<Vec<_>>()
                .join(",")
        }
        None => spec.to_string(),
    };
    if let Partitioning::Keyed { dataset, column } = P::params().partitions {
        return expand_keys::<P>(&spec, dataset, column);
    }
    let (set, tz) = partition_set::<P>()?;
    let current = set.current(Utc::now(), tz);
    set.expand(P::NAME, &spec, current, 100_000)
        .map(|v| v.iter().map(ToString::to_string).collect())
        .map_err(|e| SdkError::Usage(e.to_string()))
}

/// The keys a spec names, checked against the keys dataset's current
/// snapshot (read through the catalog in `ORCA_CATALOG_URL` or `DATABASE_URL`).
fn expand_keys<P: Pipeline>(
    spec: &str,
    dataset: &str,
    column: &str,
) -> Result<Vec<String>, SdkError> {
    use orca_core::keyed::{parse_spec, KeySpec};
    let read = std::cell::OnceCell::new();
    let keys = || -> Result<&orca_lake::KeysRead, SdkError> {
        if read.get().is_none() {
            let tables = orca_lake::LakeCell::new(orca_lake::LakeConfig::from_env(None));
            let _ = read.set(tables.get()?.read_keys(dataset, column)?);
        }
        read.get()
            .ok_or_else(|| SdkError::Tables("the keys were not read".into()))
    };
    let known =
        |k: &str| keys().is_ok_and(|r| r.keys.binary_search_by(|x| x.as_str().cmp(k)).is_ok());
    let names = match parse_spec(spec, known).map_err(|e| SdkError::Usage(e.to_string()))? {
        KeySpec::All => keys()?.keys.clone(),
        KeySpec::Names(names) => {
            let read = keys()?;
            let unknown: Vec<&String> = names
                .iter()
                .filter(|n| read.keys.binary_search(n).is_err())
                .collect();
            if let Some(first) = unknown.first() {
                return Err(SdkError::Usage(format!(
                    "'{first}' is not a key of {} ({} of {dataset}.{column} at snapshot {}{})",
                    P::NAME,
                    read.keys.len(),
                    read.snapshot
                        .map_or_else(|| "(none)".to_string(), |s| s.to_string()),
                    if unknown.len() > 1 {
                        format!("; {} more names are not keys either", unknown.len() - 1)
                    } else {
                        String::new()
                    }
                )));
            }
            names
        }
    };
    if names.is_empty() {
        return Err(SdkError::Usage(format!(
            "{} has no keys: {dataset} holds no {column} values",
            P::NAME
        )));
    }
    Ok(names)
}

/// `keys`: prints the keys, or reports them for a keys task the runner leased.
fn keys<P: Pipeline>(
    lease: Option<LeaseToken>,
    url: Option<&str>,
    org: Option<&str>,
) -> Result<i32, SdkError> {
    let Partitioning::Keyed { dataset, column } = P::params().partitions else {
        return Err(SdkError::Usage(format!(
            "{} is not keyed: its partitions are months or days (describe shows them)",
            P::NAME
        )));
    };
    let tables = orca_lake::LakeCell::new(orca_lake::LakeConfig::from_env(url));
    let Some(lease) = lease else {
        let read = tables.get()?.read_keys(dataset, column)?;
        match read.snapshot {
            Some(s) => println!(
                "# {dataset} snapshot {s}: {} keys in {column}",
                read.keys.len()
            ),
            None => println!("# {dataset} has no snapshot: no keys"),
        }
        for k in &read.keys {
            println!("{k}");
        }
        return Ok(0);
    };
    let url = url.ok_or_else(|| SdkError::Usage("keys --lease needs DATABASE_URL".into()))?;
    let mut control = Control::connect(url, org)?;
    let ctx = control.keys_context(lease)?;
    if ctx.dataset != dataset || ctx.column != column {
        return Err(SdkError::Control(format!(
            "this binary takes keys from {dataset}.{column}, but the registered version of {} takes them from {}.{}: register this binary",
            P::NAME,
            ctx.dataset,
            ctx.column
        )));
    }
    let read = tables.get()?.read_keys(dataset, column)?;
    let done = control.report_keys(lease, read.snapshot, read.timestamp_ms, &read.keys)?;
    println!(
        "{}: {} keys in {dataset}.{column} at snapshot {}; {} new; runs queued: {:?} ({} mode)",
        P::NAME,
        read.keys.len(),
        read.snapshot
            .map_or_else(|| "(none)".to_string(), |s| s.to_string()),
        done.new,
        done.runs.iter().map(|r| r.0).collect::<Vec<_>>(),
        ctx.mode.name()
    );
    Ok(0)
}

fn summary(outcome: &Outcome) {
    for r in &outcome.reports {
        let what = match &r.result {
            StepResult::Ran { attempts: 1 } => "succeeded".to_string(),
            StepResult::Ran { attempts } => format!("succeeded after {attempts} tries"),
            StepResult::Skipped => "skipped (succeeded before)".to_string(),
            StepResult::Failed { attempts, error } => {
                format!("FAILED after {attempts} tries: {error}")
            }
        };
        println!("  {:<16} {:<12} {what}", r.step, r.partition);
    }
}

fn run_in_memory<P: Pipeline>(spec: &str, logs: &std::path::Path) -> Result<i32, SdkError> {
    // Workers first: they start with nothing of this process.
    crate::tasks::start(P::tasks(), None);
    let partitions = expand_spec::<P>(spec)?;
    let dir = logs.join(P::NAME);
    std::fs::create_dir_all(&dir).map_err(|e| SdkError::Io {
        what: format!("creating {}", dir.display()),
        error: e,
    })?;
    let path = dir.join(format!(
        "local-{}.log",
        Utc::now().format("%Y%m%dT%H%M%S%.3fZ")
    ));
    let file = std::fs::File::create(&path).map_err(|e| SdkError::Io {
        what: format!("creating {}", path.display()),
        error: e,
    })?;
    let log = LogSink::with_file(file);
    log.line(&format!("{} run over {}", P::NAME, partitions.join(",")));
    let mut store = MemStore::default();
    let steps = P::steps();
    let outcome = execute(
        P::NAME,
        Some(P::params().partitions),
        &steps,
        &P::tasks(),
        &partitions,
        &mut store,
        &log,
        None,
    );
    summary(&outcome);
    if let Some(last) = steps.last() {
        let key = if last.is_mapped() { None } else { Some("*") };
        for p in key.map(|k| vec![k.to_string()]).unwrap_or(partitions) {
            if let Some(out) = store
                .states
                .get(&(last.name.to_string(), p.clone()))
                .and_then(|s| s.output.as_ref())
            {
                println!("{} {p}: {out}", last.name);
            }
        }
    }
    println!("log: {}", path.display());
    match outcome.error {
        None => Ok(0),
        Some(e) => Err(e),
    }
}

/// The most snapshots of one dataset a poll reports.
const SENSE_MAX_SNAPSHOTS: usize = 100;

fn sense<P: Pipeline>(lease: LeaseToken, url: &str, org: Option<&str>) -> Result<i32, SdkError> {
    let mut control = Control::connect(url, org)?;
    let ctx = control.sense_context(lease)?;
    let since = ctx.since;
    let tables = orca_lake::LakeCell::new(orca_lake::LakeConfig::from_env(Some(url)));
    let mut report = Vec::new();
    for dataset in &ctx.datasets {
        report.extend(tables.get()?.snapshots_since(
            dataset,
            since.timestamp_millis(),
            SENSE_MAX_SNAPSHOTS,
        )?);
    }
    let started = control.report_snapshots(lease, &report)?;
    println!(
        "{}: {} snapshot(s) since {since} in {}; {started} run(s) started",
        P::NAME,
        report.len(),
        ctx.datasets.join(", ")
    );
    Ok(0)
}

fn attempt<P: Pipeline>(lease: LeaseToken, url: &str, org: Option<&str>) -> Result<i32, SdkError> {
    // Workers first: they start with nothing of this process, before it
    // connects anywhere.
    let tasks = P::tasks();
    crate::tasks::start(
        tasks.clone(),
        Some((url.to_string(), org.map(str::to_string), lease)),
    );
    let steps = P::steps();
    let hash = registry_hash(&steps, &tasks);
    let params = P::params();
    let mut store = PgStore::connect(url, org, lease, &params.build.to_json(&hash))?;
    let ctx = store.context.clone();
    if ctx.registry_hash != hash {
        return Err(SdkError::Control(format!(
            "this binary's code (registry hash {hash}) is not version {} of {} that run {} was queued with (registry hash {}): register this binary and retry the run",
            ctx.version, ctx.pipeline, ctx.run, ctx.registry_hash
        )));
    }
    let log = LogSink::stdout();
    log.line(&format!(
        "{} run {} attempt {} over {}",
        P::NAME,
        ctx.run,
        ctx.attempt,
        ctx.partitions.join(",")
    ));
    let outcome = execute(
        P::NAME,
        Some(P::params().partitions),
        &steps,
        &tasks,
        &ctx.partitions,
        &mut store,
        &log,
        Some(ctx.run.0),
    );
    summary(&outcome);
    match outcome.error {
        None => Ok(0),
        Some(e) => Err(e),
    }
}
