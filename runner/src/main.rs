//! `orca-runner`: claims attempts of its pool from the orca control plane,
//! runs each pipeline binary as a child process, heartbeats its lease and
//! reports the result. Wakes on `NOTIFY orca_work` and polls as a fallback.
//! SIGTERM (or Ctrl-C): stop claiming, give running attempts a grace period,
//! then stop them and hand them back.

mod attempt;
mod control;
mod engine;
mod log;
mod pinned;
mod pods;
mod sizing;
mod tasks;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::Executor;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinSet;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Runs Orca attempts: claims, spawns pipeline binaries, heartbeats, reports"
)]
struct Args {
    /// The control plane's database.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// This runner's name (default: host-pid).
    #[arg(long, env = "ORCA_RUNNER_NAME")]
    name: Option<String>,
    /// The pool to take work from.
    #[arg(long, env = "ORCA_POOL", default_value = "default")]
    pool: String,
    /// How many attempts to run at once.
    #[arg(long, env = "ORCA_SLOTS", default_value_t = 2)]
    slots: u16,
    /// Where attempt logs go: <logs>/<org>/<pipeline>/run-<id>/attempt-<n>.log.
    #[arg(long, env = "ORCA_LOGS", default_value = "orca-logs")]
    logs: PathBuf,
    /// The org to work for (SET orca.org); default: the 'default' org.
    #[arg(long, env = "ORCA_ORG")]
    org: Option<String>,
    /// Poll this often when no notification arrives.
    #[arg(long, env = "ORCA_POLL_MS", default_value_t = 2000)]
    poll_ms: u64,
    /// On SIGTERM, how long running attempts may go on before they are handed back.
    #[arg(long, env = "ORCA_GRACE_SECONDS", default_value_t = 30)]
    grace_seconds: u64,
    /// The engine that runs syncs' attempts (default: `orca-engine` next to
    /// this binary, else on PATH).
    #[arg(long, env = "ORCA_ENGINE")]
    engine: Option<PathBuf>,
    /// Where syncs keep checkpoints and staged epochs: an absolute path or an
    /// object store's URL (s3://, az://, gs://), shared by every runner that
    /// runs syncs. Without it
    /// this runner leaves syncs to runners that have one.
    #[arg(long, env = "ORCA_STORE")]
    store: Option<String>,
    /// Where Iceberg tables' data and metadata go (default: ./warehouse of
    /// each pipeline binary): a path or an object store's URL (s3://, az://,
    /// gs://).
    #[arg(long, env = "ORCA_WAREHOUSE")]
    warehouse: Option<String>,
    /// Also call orca.tick() this often (0: leave it to the background worker).
    #[arg(long, env = "ORCA_TICK_MS", default_value_t = 0)]
    tick_ms: u64,
    /// The runner token (orca.create_runner_token) that binds this runner
    /// to its org and pool. Prefer --token-file: a command line is public.
    /// Without a token the login must be an admin's.
    #[arg(long, env = "ORCA_RUNNER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the runner token (readable by this user only).
    #[arg(long, env = "ORCA_RUNNER_TOKEN_FILE", conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// The directory of the pipeline binaries this runner may run: it runs
    /// only files under it whose sha256 is the one their version was
    /// registered with. Without it, this runner runs syncs only.
    #[arg(long, env = "ORCA_PIPELINES")]
    pipelines: Option<PathBuf>,
    /// Also run versions registered without a binary sha256 (before Orca
    /// 0.2.0), still only from under --pipelines. For upgrades: register
    /// them again and drop this.
    #[arg(long, env = "ORCA_ALLOW_UNPINNED")]
    allow_unpinned: bool,
    /// Hash the executables at the top of --pipelines (the 32 largest) when
    /// the runner starts, in the background, rather than when an attempt
    /// first names one: the first attempts of a runner just started do not
    /// wait for it (a release pipeline binary of 200 MB takes a core ~0.15
    /// s). Says so in one line when done.
    #[arg(long, env = "ORCA_HASH_AT_START")]
    hash_at_start: bool,
    /// The database URL pipeline binaries and engines get (default: this
    /// runner's). A login with orca_attempt only: what a lease allows.
    #[arg(long, env = "ORCA_ATTEMPT_DATABASE_URL")]
    attempt_database_url: Option<String>,
    /// The longest line of a child's output the runner takes (bytes): a
    /// child that writes a longer one is stopped and its attempt fails,
    /// rather than the runner buffering it without end.
    #[arg(long, env = "ORCA_OUTPUT_LINE_MAX", default_value_t = 1 << 20)]
    output_line_max: usize,
    /// The directory of the external connectors this runner may start for
    /// a sync's source (`{"type": "connector", "connector": NAME}` runs
    /// DIR/NAME): only the programs its operator installed there.
    #[arg(long, env = "ORCA_CONNECTORS")]
    connectors: Option<PathBuf>,
    /// Worker processes per pipeline binary for the pool's tasks (steps
    /// that fan out with ORCA_TASKS=fleet); default: this host's cores.
    /// 0: run no tasks.
    #[arg(long, env = "ORCA_TASK_WORKERS")]
    task_workers: Option<usize>,
    /// How long a pipeline binary's task workers may sit idle before they
    /// are stopped (the next batch of that binary starts them again).
    #[arg(long, env = "ORCA_TASK_IDLE_SECONDS", default_value_t = 60)]
    task_idle_seconds: u64,
    /// Run the one attempt whose lease (a row of orca.claim, as JSON) is in
    /// ORCA_ONE_ATTEMPT, then exit: what a pod the launcher made runs.
    #[arg(long)]
    one_attempt: bool,
    /// Where attempts run: `process` (a child of this runner) or
    /// `kubernetes` (a pod per attempt, made through the Kubernetes API
    /// this runner's kubeconfig or service account reaches).
    #[arg(long, env = "ORCA_LAUNCHER", default_value = "process")]
    launcher: Launcher,
    #[command(flatten)]
    pods: pods::PodOptions,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Launcher {
    Process,
    Kubernetes,
}

/// The runner token from --token or --token-file, if any.
fn token(args: &Args) -> anyhow::Result<Option<String>> {
    let raw = match (&args.token, &args.token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the runner token from {}", f.display()))?,
        (None, None) => return Ok(None),
    };
    let t = raw.trim().to_string();
    if t.is_empty() {
        anyhow::bail!("the runner token is empty");
    }
    Ok(Some(t))
}

fn default_engine() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("orca-engine")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("orca-engine"))
}

/// Whether `program` can be run: a path to an executable file, or a bare
/// name found on PATH.
fn runnable(program: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 {
        return executable(program);
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| executable(&d.join(program))))
}

/// What this runner can run, and a line for each kind of work it leaves to
/// other runners, naming what it lacks.
fn commands(
    pipelines: Option<&std::path::Path>,
    store: Option<&str>,
    engine: &std::path::Path,
) -> (Vec<&'static str>, Vec<String>) {
    let mut can = Vec::new();
    let mut not = Vec::new();
    match pipelines {
        Some(_) => can.extend(["attempt", "sense", "keys"]),
        None => not.push(
            "not running pipelines: no --pipelines (ORCA_PIPELINES), the directory of the \
             binaries it may run"
                .to_string(),
        ),
    }
    // A discovery needs the engine only: it reads a catalog, stores nothing;
    // so does table maintenance (it works in the warehouse).
    if runnable(engine) {
        can.extend(["discover", "maintain"]);
    } else {
        not.push(format!(
            "not discovering sources nor maintaining tables: the engine {} cannot be run (--engine, ORCA_ENGINE)",
            engine.display()
        ));
    }
    match store {
        None => not.push(
            "not running syncs: no --store (ORCA_STORE), where syncs keep their checkpoints"
                .to_string(),
        ),
        Some(_) if !runnable(engine) => not.push(format!(
            "not running syncs: the engine {} cannot be run (--engine, ORCA_ENGINE)",
            engine.display()
        )),
        Some(_) => can.push("sync"),
    }
    (can, not)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

/// The executables of the pipeline root `--hash-at-start` hashes, at most
/// (largest first): a root of many binaries leaves the rest to the
/// attempts that name them.
const WARM_MOST: usize = 32;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let host = host_name();
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{host}-{}", std::process::id()));
    let slots = usize::from(args.slots.max(1));
    let connect: PgConnectOptions = args
        .database_url
        .parse()
        .context("DATABASE_URL is not a PostgreSQL URL")?;
    let connect = connect.application_name(&format!("orca-runner {name}"));
    let org = args.org.clone();
    let runner_token = token(&args)?;
    let db = PgPoolOptions::new()
        .max_connections(u32::from(args.slots) + 2)
        .after_connect(move |conn, _| {
            let org = org.clone();
            let runner_token = runner_token.clone();
            Box::pin(async move {
                if let Some(org) = org {
                    sqlx::query("SELECT set_config('orca.org', $1, false)")
                        .bind(org)
                        .execute(&mut *conn)
                        .await?;
                }
                if let Some(t) = runner_token {
                    sqlx::query("SELECT set_config('orca.runner_token', $1, false)")
                        .bind(t)
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            })
        })
        .connect_with(connect.clone())
        .await
        .context("connecting to the control plane")?;
    db.execute("SELECT 1")
        .await
        .context("control plane check")?;
    control::register_runner(&db, &name, &args.pool, i32::from(args.slots), &host)
        .await
        .context("registering the runner")?;
    let engine = args.engine.clone().unwrap_or_else(default_engine);
    let connectors = match &args.connectors {
        Some(dir) => {
            let dir = dir
                .canonicalize()
                .with_context(|| format!("connectors directory {}", dir.display()))?;
            orca_engine::source::external::connector::set_directory(dir.clone());
            Some(dir)
        }
        None => None,
    };
    let pins = match &args.pipelines {
        Some(root) => Some(
            pinned::Pins::new(root, args.allow_unpinned)
                .with_context(|| format!("pipeline root {}", root.display()))?,
        ),
        None => None,
    };
    let (can, cannot) = commands(
        pins.as_ref().map(pinned::Pins::root),
        args.store.as_deref(),
        &engine,
    );
    let (can, cannot) = if args.launcher == Launcher::Kubernetes && !args.one_attempt {
        // Pods run pipeline binaries from their images; syncs, discovery
        // and maintenance need this host's engine and store.
        (
            vec!["attempt", "sense", "keys"],
            vec!["not running syncs, discovery or maintenance: it launches pods".to_string()],
        )
    } else {
        (can, cannot)
    };
    println!(
        "orca-runner {name}: pool {}, {slots} slots, logs in {}; runs {}",
        args.pool,
        args.logs.display(),
        can.join(", ")
    );
    for line in &cannot {
        println!("orca-runner {name}: {line}");
    }

    // Socket paths are short (108 bytes at most), so not under the logs.
    // A fresh directory of an unguessable name that only this user can
    // enter, as mkdtemp makes: nobody else can connect to an engine's
    // sockets or put one in their place.
    let sockets = std::env::temp_dir().join(format!(
        "orca-runner-{}-{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&sockets)
            .with_context(|| format!("creating {}", sockets.display()))?;
    }
    let shared = Arc::new(attempt::Shared {
        db: db.clone(),
        database_url: args
            .attempt_database_url
            .clone()
            .unwrap_or_else(|| args.database_url.clone()),
        pins,
        logs: args.logs.clone(),
        engine,
        sockets: sockets.clone(),
        store: args.store.clone(),
        warehouse: args.warehouse.clone(),
        connectors,
        output_line_max: args.output_line_max.max(1024),
    });
    let (release_tx, release_rx) = watch::channel(false);
    if args.one_attempt {
        let grace = Duration::from_secs(args.grace_seconds);
        return one_attempt(shared, release_tx, release_rx, &sockets, grace).await;
    }
    // A pod's one attempt listens for no work: only a runner that claims does.
    let mut listener = PgListener::connect_with(&db)
        .await
        .context("LISTEN connection")?;
    listener
        .listen("orca_work")
        .await
        .context("LISTEN orca_work")?;
    let launcher = match args.launcher {
        Launcher::Process => None,
        Launcher::Kubernetes => Some(Arc::new(
            pods::Launcher::new(&args.pods, &name, args.grace_seconds)
                .await
                .context("the Kubernetes API")?,
        )),
    };
    if let Some(l) = &launcher {
        println!(
            "orca-runner {name}: launches a pod per attempt in namespace {}",
            l.namespace()
        );
    }
    // A pod launcher runs binaries from images, not from this root. A
    // thread of its own, not the runtime's blocking pool, whose shutdown
    // would wait for it: a runner stopped while hashing exits at once.
    if args.hash_at_start && launcher.is_none() && shared.pins.is_some() {
        let (shared, name) = (shared.clone(), name.clone());
        let spawned = std::thread::Builder::new()
            .name("hash-at-start".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                if let Some(pins) = &shared.pins {
                    let (n, bytes) = pins.warm(WARM_MOST);
                    println!(
                        "orca-runner {name}: hashed {n} {} of the pipeline root ({} MiB) in {} ms",
                        if n == 1 { "binary" } else { "binaries" },
                        bytes >> 20,
                        started.elapsed().as_millis()
                    );
                }
            });
        if let Err(e) = spawned {
            eprintln!("orca-runner: not hashing the pipeline root at start: {e}");
        }
    }
    let (stop_tasks, stop_tasks_rx) = watch::channel(false);
    let task_workers = args
        .task_workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let task_server = if shared.pins.is_some() && task_workers > 0 && launcher.is_none() {
        println!("orca-runner {name}: runs the pool's tasks, {task_workers} worker(s) per binary");
        Some(tokio::spawn(tasks::serve(
            shared.clone(),
            tasks::Config {
                name: name.clone(),
                pool: args.pool.clone(),
                workers: task_workers,
                poll: Duration::from_millis(args.poll_ms.max(10)),
                grace: Duration::from_secs(args.grace_seconds),
                idle: Duration::from_secs(args.task_idle_seconds.max(1)),
            },
            stop_tasks_rx,
        )))
    } else {
        None
    };
    let mut running: JoinSet<attempt::Outcome> = JoinSet::new();
    let mut poll = tokio::time::interval(Duration::from_millis(args.poll_ms.max(10)));
    let tick_every = Duration::from_millis(if args.tick_ms == 0 {
        3_600_000
    } else {
        args.tick_ms
    });
    let mut tick = tokio::time::interval(tick_every);
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut want_claim = true;

    loop {
        if want_claim && running.len() < slots {
            let free = i32::try_from(slots - running.len()).unwrap_or(1);
            match control::claim(&db, &name, &args.pool, free, &can).await {
                Ok(leases) => {
                    for l in leases {
                        println!(
                            "claimed attempt {} of run {} ({} {})",
                            l.attempt_number,
                            l.run,
                            l.pipeline,
                            l.partitions.join(",")
                        );
                        match &launcher {
                            Some(k) => running.spawn(pods::run(
                                shared.clone(),
                                k.clone(),
                                l,
                                release_rx.clone(),
                            )),
                            None => {
                                running.spawn(attempt::run(shared.clone(), l, release_rx.clone()))
                            }
                        };
                    }
                }
                Err(e) => eprintln!("orca-runner: claim failed: {e}"),
            }
        }
        want_claim = false;
        tokio::select! {
            n = listener.recv() => match n {
                Ok(n) => want_claim = n.payload() == args.pool,
                Err(e) => {
                    eprintln!("orca-runner: notification connection: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            },
            _ = poll.tick() => want_claim = true,
            Some(done) = running.join_next(), if !running.is_empty() => {
                match done {
                    Ok(outcome) => println!("attempt ended: {outcome}"),
                    Err(e) => eprintln!("orca-runner: attempt task failed: {e}"),
                }
                want_claim = true;
            }
            _ = tick.tick(), if args.tick_ms > 0 => {
                if let Err(e) = control::tick(&db).await {
                    eprintln!("orca-runner: tick failed: {e}");
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }

    println!(
        "orca-runner {name}: stopping; {} attempt(s) running, grace {} s",
        running.len(),
        args.grace_seconds
    );
    let _ = stop_tasks.send(true);
    let grace = tokio::time::sleep(Duration::from_secs(args.grace_seconds));
    tokio::pin!(grace);
    let mut released = false;
    while !running.is_empty() {
        tokio::select! {
            done = running.join_next() => {
                if let Some(Ok(outcome)) = done {
                    println!("attempt ended: {outcome}");
                }
            }
            _ = &mut grace, if !released => {
                released = true;
                let _ = release_tx.send(true);
            }
        }
    }
    if let Some(t) = task_server {
        let _ = t.await;
    }
    let _ = std::fs::remove_dir_all(&sockets);
    println!("orca-runner {name}: stopped");
    Ok(())
}

/// `--one-attempt`: the attempt in ORCA_ONE_ATTEMPT, run as any claimed
/// attempt is (the binary pinned, the lease kept, the result reported), then
/// exit. SIGTERM (its pod deleted) lets it go on for the grace period and
/// then hands it back, as a runner stopping does.
async fn one_attempt(
    shared: Arc<attempt::Shared>,
    release_tx: watch::Sender<bool>,
    release_rx: watch::Receiver<bool>,
    sockets: &std::path::Path,
    grace: Duration,
) -> anyhow::Result<()> {
    let raw = std::env::var("ORCA_ONE_ATTEMPT")
        .context("--one-attempt takes the lease from ORCA_ONE_ATTEMPT")?;
    let value: serde_json::Value =
        serde_json::from_str(&raw).context("ORCA_ONE_ATTEMPT is not JSON")?;
    let lease: control::Lease = orca_core::api::from_json("ORCA_ONE_ATTEMPT", value)?;
    println!(
        "orca-runner: running attempt {} of run {} ({} {})",
        lease.attempt_number,
        lease.run,
        lease.pipeline,
        lease.partitions.join(",")
    );
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let work = tokio::spawn(attempt::run(shared, lease, release_rx));
    tokio::pin!(work);
    let outcome = tokio::select! {
        done = &mut work => done,
        _ = term.recv() => {
            println!("orca-runner: stopping; the attempt may go on for {} s", grace.as_secs());
            tokio::select! {
                done = &mut work => done,
                _ = tokio::time::sleep(grace) => {
                    let _ = release_tx.send(true);
                    work.await
                }
            }
        }
    };
    let _ = std::fs::remove_dir_all(sockets);
    match outcome.context("the attempt's task")? {
        attempt::Outcome::Unreported(why) => anyhow::bail!("attempt not reported: {why}"),
        done => {
            println!("attempt ended: {done}");
            Ok(())
        }
    }
}
