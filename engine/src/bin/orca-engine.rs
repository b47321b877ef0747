//! `orca-engine`: runs one attempt of a sync, of a source's discovery or of
//! a table's maintenance, or releases a sync's held cells.
//!
//! ```text
//! orca-engine sync shop --store /var/lib/orca/store
//! orca-engine discover --lease <lease>      (what a runner runs for orca.discover)
//! orca-engine maintain --lease <lease>      (what a runner runs for orca.maintain)
//! orca-engine release shop --store /var/lib/orca/store --nul strip
//! ```
//! Exit status 0 when the source had no more rows and every epoch committed
//! (or a `stop` on the control channel ended it at a resume point: the
//! outcome says `"stopped": true`), 3 when a newer attempt fenced this one (it stopped without committing),
//! 4 when the source asked for a new attempt at HEAD (a continuous change
//! stream met a table's new shape: a runner hands the attempt back, which
//! spends none of the run's retries), 1 on any other error. The outcome is printed as one JSON object.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use orca_engine::attempt::{self, EngineError, Options};
use orca_engine::release::{self, NulFix, ReleaseOptions};

#[derive(Parser)]
#[command(name = "orca-engine", about = "The data engine of Orca syncs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs one attempt of a sync: claim, recover, then epochs until the
    /// source has no more rows.
    Sync {
        /// The sync's name (orca.create_sync); a runner passes it as
        /// ORCA_PIPELINE.
        #[arg(env = "ORCA_PIPELINE")]
        name: String,
        /// The lease of the run's attempt, when a runner started this one (it
        /// heartbeats the lease and reports the exit status).
        #[arg(long, env = "ORCA_LEASE")]
        lease: Option<String>,
        #[command(flatten)]
        at: Where,
        /// Rows per stream per epoch (default: the source's batch_rows, else
        /// 100000).
        #[arg(long)]
        batch_rows: Option<usize>,
        /// Writer lanes (default: the destination's `lanes`, else 1): each
        /// stages its key groups' rows, encoding at the same time.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
        lanes: Option<u16>,
        /// Listen on this Unix socket for the control channel (hello, status,
        /// stop; docs/syncs.md, "The control channel"); a runner passes one per attempt.
        #[arg(long, env = "ORCA_ENGINE_CONTROL")]
        control: Option<std::path::PathBuf>,
        /// Listen on this Unix socket for the runner's source pump, which
        /// reads the source and sends it as frames (docs/syncs.md, "Data
        /// edges"); without it the engine reads the source itself.
        #[arg(long)]
        edge: Option<std::path::PathBuf>,
    },
    /// Reads a source's catalog for a discovery task (`orca.discover`) and
    /// stores it: what a runner runs for a discovery's lease.
    Discover {
        /// The lease of the discovery's attempt.
        #[arg(long, env = "ORCA_LEASE")]
        lease: String,
        /// The control plane: the database with the orca extension.
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, env = "ORCA_ORG", default_value = "default")]
        org: String,
    },
    /// Maintains a dataset's table for a maintenance run (`orca.maintain`):
    /// compacts small files, expires old snapshots, removes orphan files.
    Maintain {
        /// The lease of the maintenance run's attempt.
        #[arg(long, env = "ORCA_LEASE")]
        lease: String,
        /// The control plane: the database with the orca extension.
        #[arg(long, env = "DATABASE_URL")]
        database_url: String,
        #[arg(long, env = "ORCA_ORG", default_value = "default")]
        org: String,
    },
    /// Writes the cells the destination could not take (kept under
    /// `_held/`) into their rows, where they are still null.
    Release {
        /// The sync's name.
        name: String,
        #[command(flatten)]
        at: Where,
        /// Only this stream's cells.
        #[arg(long)]
        stream: Option<String>,
        /// How text holding NUL fits a text column: `strip`, or
        /// `replace=TEXT` (a bytea column takes it as it is).
        #[arg(long, value_parser = parse_nul)]
        nul: Option<NulFix>,
    },
}

/// Where a sync's control plane and store are.
#[derive(clap::Args)]
struct Where {
    /// The control plane: the database with the orca extension.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    #[arg(long, env = "ORCA_ORG", default_value = "default")]
    org: String,
    /// Where checkpoints, staged epochs, held cells and logs live: an
    /// absolute path or an object store's URL (s3://, az://, gs://).
    #[arg(long, env = "ORCA_STORE")]
    store: String,
}

fn parse_nul(s: &str) -> Result<NulFix, String> {
    NulFix::parse(s).ok_or_else(|| format!("'{s}' is not strip or replace=TEXT"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Discover {
            lease,
            database_url,
            org,
        } => {
            let opts = orca_engine::discover::DiscoverOptions {
                database_url,
                org,
                lease,
            };
            match orca_engine::discover::run(&opts) {
                Ok(v) => {
                    println!("{v}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("orca-engine: discover: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Maintain {
            lease,
            database_url,
            org,
        } => {
            let opts = orca_engine::maintain::MaintainOptions {
                database_url,
                org,
                lease,
            };
            match orca_engine::maintain::run(&opts) {
                Ok(v) => {
                    println!("{v}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("orca-engine: maintain: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Release {
            name,
            at,
            stream,
            nul,
        } => {
            let opts = ReleaseOptions {
                database_url: at.database_url,
                org: at.org,
                sync: name,
                store_url: at.store,
                stream,
                nul,
            };
            match release::release(&opts) {
                Ok(r) => {
                    let mut v = serde_json::json!(r);
                    v["sync"] = serde_json::json!(opts.sync);
                    println!("{v}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("orca-engine: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Sync {
            name,
            at,
            batch_rows,
            lanes,
            lease,
            control,
            edge,
        } => {
            let opts = Options {
                database_url: at.database_url,
                org: at.org,
                sync: name,
                store_url: at.store,
                batch_rows,
                lanes: lanes.map(usize::from),
                lease,
                control,
                edge,
                crash: None,
            };
            match attempt::run(&opts) {
                Ok(o) => {
                    let mut outcome = serde_json::json!({
                        "sync": opts.sync,
                        "generation": o.generation,
                        "recovery": o.recovery,
                        "from_epoch": o.from_epoch,
                        "to_epoch": o.to_epoch,
                        "rows": o.rows,
                        "source_bytes": o.source_bytes,
                        "staged_bytes": o.staged_bytes,
                        "quarantined": o.quarantined,
                        "held": o.held,
                        "stopped": o.stopped,
                    });
                    if let Some(m) = outcome.as_object_mut() {
                        m.extend(o.spent.millis());
                    }
                    println!("{outcome}");
                    ExitCode::SUCCESS
                }
                Err(e @ EngineError::Fenced { .. }) => {
                    eprintln!("orca-engine: {e}");
                    ExitCode::from(3)
                }
                Err(e @ EngineError::Restart(_)) => {
                    eprintln!("orca-engine: {e}");
                    ExitCode::from(4)
                }
                Err(e) if e.store_unavailable() => {
                    eprintln!(
                        "orca-engine: the object store did not answer: {e}; what was committed \
                         stays, and the next attempt goes on from HEAD"
                    );
                    ExitCode::from(4)
                }
                Err(e) => {
                    eprintln!("orca-engine: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
