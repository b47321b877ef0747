//! `orca`: the command line of the Orca control plane. Every command is a
//! client of the extension's SQL API.

mod allowlist;
mod api_keys;
mod backfill;
mod db;
mod discover;
mod image_ref;
mod listing;
mod locate;
mod maintain;
mod push;
mod register;
mod secrets;
mod show;
mod syncs;
mod tokens;
mod webhooks;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(version, about = "Orca: register pipelines, queue runs, watch them")]
struct Cli {
    /// The control plane's database.
    #[arg(
        long,
        env = "DATABASE_URL",
        global = true,
        default_value = "postgres://postgres@127.0.0.1:5432/orca"
    )]
    database_url: String,
    /// The org to act in (default: the 'default' org).
    #[arg(long, env = "ORCA_ORG", global = true)]
    org: Option<String>,
    /// Listings as JSON (an array of objects, one per row) instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Register a pipeline binary: its `describe --json`, plus <binary>.source.json if present.
    Register {
        /// The pipeline binary (built on the Orca SDK).
        binary: PathBuf,
        /// The image the binary runs from (REGISTRY/NAME@sha256:...): recorded
        /// on the version, whose binary is then at --image-dir/<file name>.
        #[arg(long)]
        image: Option<String>,
        /// Where pipeline binaries are in that image.
        #[arg(long, default_value = push::PIPELINES_DIR, requires = "image")]
        image_dir: String,
    },
    /// Build the project's image FROM the runner image, with these pipeline
    /// binaries at /opt/orca/pipelines/<name>, their `orca locate` output and
    /// the source and commit as labels, and push it (buildah, no Docker engine).
    Push {
        /// Where to push it: REGISTRY/NAME:TAG.
        #[arg(long)]
        image: String,
        /// The image to build on: an orca-runner image (scripts/image.sh runner).
        #[arg(long, env = "ORCA_RUNNER_IMAGE")]
        from: String,
        /// The source tree the binaries were built from (for orca locate and
        /// the source and commit labels).
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// The registry speaks plain HTTP or has a certificate not to verify
        /// (a registry on loopback).
        #[arg(long)]
        insecure_registry: bool,
        /// Also register each binary, recording the pushed image's digest on
        /// its version (needs DATABASE_URL).
        #[arg(long)]
        register: bool,
        /// The pipeline binaries.
        #[arg(required = true)]
        binaries: Vec<PathBuf>,
    },
    /// Queue one run per partition and follow them until they finish.
    Backfill {
        /// The pipeline's name.
        pipeline: String,
        /// 2024-01..2024-06, 2024-01,2024-03, @all, or @file:path (one partition a line).
        partitions: String,
        /// Up to this many partitions a run (default: the pipeline's
        /// backfill_per_run, else one): each run is one attempt.
        #[arg(long, value_name = "N")]
        per_run: Option<i32>,
        /// Queue and return at once instead of following the runs.
        #[arg(long)]
        detach: bool,
    },
    /// List runs, newest first.
    Runs {
        /// Only this pipeline's runs.
        #[arg(long)]
        pipeline: Option<String>,
        /// Only runs in this state.
        #[arg(long, value_parser = ["queued", "running", "succeeded", "failed", "cancelled"])]
        status: Option<String>,
        /// How many runs at most.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
    },
    /// One run: its steps by partition, its attempts, and the tail of its log.
    Run {
        /// The run's id (`orca runs` lists them).
        id: i64,
        /// Where runners on this host write attempt logs.
        #[arg(long, env = "ORCA_LOGS", default_value = "orca-logs")]
        logs: PathBuf,
    },
    /// The next fires of a pipeline's schedule.
    Fires {
        /// The pipeline's name.
        pipeline: String,
        /// How many fires.
        #[arg(default_value_t = 10, value_parser = clap::value_parser!(i32).range(0..=10_000))]
        n: i32,
    },
    /// A keyed pipeline's current keys: done or not, and the run that has them.
    Keys {
        /// The keyed pipeline's name.
        pipeline: String,
        /// Only the keys that are not done.
        #[arg(long)]
        not_done: bool,
        /// Read the keys dataset again first (queues a keys task and waits for it).
        #[arg(long)]
        refresh: bool,
    },
    /// List the syncs: delivery, HEAD, generation and their last run.
    Syncs,
    /// Read a Postgres source's catalog (tables, columns, keys, replica
    /// identity, whether a change stream can read each) and the streams
    /// orca.create_sync could take. Connects to the source, not the control
    /// plane.
    Discover {
        /// The source, as a sync's definition has it:
        /// '{"type": "postgres_cdc", "url": "postgres://..."}'.
        source: String,
    },
    /// Queue a run of a sync (from its checkpoint; --backfill: everything
    /// again from the start) and follow it until it finishes.
    Sync {
        /// The sync's name (`orca syncs` lists them).
        name: String,
        /// Read every stream again from its start (orca.backfill '@all').
        #[arg(long)]
        backfill: bool,
        /// Queue and return at once instead of following the run.
        #[arg(long)]
        detach: bool,
    },
    /// Queue a dataset's table maintenance (orca.maintain: compact small
    /// files, expire old snapshots, remove orphan files), follow the run and
    /// print what each operation did.
    Maintain {
        /// The dataset (namespace.table).
        dataset: String,
        /// The operations' settings as JSON, e.g.
        /// '{"expire": {"keep_last": 5}, "compact": false}' (docs/tables.md).
        #[arg(long, default_value = "{}")]
        options: String,
        /// Queue and return at once instead of following the run.
        #[arg(long)]
        detach: bool,
    },
    /// Pause a sync: its schedule makes no runs, and a running attempt
    /// stops at its next epoch boundary (orca.pause_sync).
    SyncPause {
        /// The sync's name.
        name: String,
    },
    /// Resume a paused sync from its HEAD; a continuous sync gets its run
    /// back (orca.resume_sync).
    SyncResume {
        /// The sync's name.
        name: String,
    },
    /// Set a sync's writer lanes, 1 to 64; a continuous sync's attempt
    /// takes them at its next epoch boundary, without a stop
    /// (orca.scale_sync).
    SyncScale {
        /// The sync's name.
        name: String,
        /// Writer lanes.
        lanes: i32,
    },
    /// Why a run is not running or not finished (orca.explain): what holds
    /// it, who holds that, since when and until when.
    Explain {
        /// The run's id.
        id: i64,
    },
    /// The org's incidents: the open ones, or with --all every one, newest first.
    Incidents {
        /// Resolved incidents too.
        #[arg(long)]
        all: bool,
    },
    /// Resolve an open incident by hand (orca.resolve_incident).
    ResolveIncident {
        /// The incident's id.
        id: i64,
        /// Why it is resolved.
        #[arg(long)]
        note: Option<String>,
    },
    /// Cancel a queued or running run.
    Cancel {
        /// The run's id.
        id: i64,
    },
    /// Queue a failed or cancelled run again.
    Retry {
        /// The run's id.
        id: i64,
    },
    /// Secrets of the org: values kept encrypted, named by connector options.
    Secrets {
        #[command(subcommand)]
        cmd: SecretsCmd,
    },
    /// What the org's connectors may reach besides public addresses (netguard).
    Allowlist {
        #[command(subcommand)]
        cmd: AllowlistCmd,
    },
    /// API keys of the org: each lets callers of `orca serve` act in it with a role.
    ApiKeys {
        #[command(subcommand)]
        cmd: KeysCmd,
    },
    /// Webhook endpoints of the org: its events, signed, delivered by relays.
    Webhooks {
        #[command(subcommand)]
        cmd: WebhooksCmd,
    },
    /// Runner tokens of the org: each binds a runner to the org and a pool.
    Tokens {
        #[command(subcommand)]
        cmd: TokensCmd,
    },
    /// Serve the HTTP API (/api/v1) over the control plane, acting with each caller's API key.
    Serve {
        /// Where to listen.
        #[arg(long, env = "ORCA_LISTEN", default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Connections to the control plane at most.
        #[arg(long, env = "ORCA_SERVE_CONNECTIONS", default_value_t = 16)]
        connections: u32,
        /// Do not relay webhooks from this server (run `orca relay` instead).
        #[arg(long)]
        no_relay: bool,
        /// Mark the console's session cookies Secure (when it is reached over
        /// TLS, directly or through a proxy).
        #[arg(long, env = "ORCA_SECURE_COOKIES")]
        secure_cookies: bool,
    },
    /// Deliver webhooks: the outbox to each endpoint, signed, at least once.
    Relay {
        /// This relay's name in the delivery rows (default: relay-<pid>).
        #[arg(long, env = "ORCA_RELAY_NAME")]
        name: Option<String>,
        /// How long to wait, in milliseconds, when no endpoint is due.
        #[arg(long, env = "ORCA_RELAY_IDLE_MS", default_value_t = 500)]
        idle_ms: u64,
    },
    /// Find each step's and the pipeline's source line; writes <binary>.source.json.
    Locate {
        /// The pipeline binary.
        binary: PathBuf,
        /// Where its source tree is.
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum SecretsCmd {
    /// Set a secret to the value on standard input (never on the command line).
    Set {
        /// Its name: lowercase letters, digits, '_', '-', '.'.
        name: String,
    },
    /// List the org's secrets (names and dates, never values).
    List,
    /// Drop a secret.
    Drop {
        /// Its name.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum AllowlistCmd {
    /// The org's entries (--org, or ORCA_ORG).
    List,
    /// Let an org reach a host, '*.domain', a network or a local directory (admins).
    Add {
        /// The org the entry is for.
        org: String,
        /// 'db.internal', '*.corp.example', '10.0.0.0/8', '127.0.0.1' or '/srv/data'.
        target: String,
        /// Why it is there, for whoever reads the list later.
        #[arg(long)]
        note: Option<String>,
    },
    /// Remove an entry (admins).
    Remove {
        /// The org the entry is for.
        org: String,
        /// The entry, as added or as listed.
        target: String,
    },
}

#[derive(Subcommand, Debug)]
enum KeysCmd {
    /// Create a key; prints it once (or writes it to --out).
    Create {
        /// Its name in the list.
        name: String,
        /// viewer (read), operator (read and run) or admin (operator and the org's admin calls).
        #[arg(long, default_value = "viewer")]
        role: String,
        /// Write the key to this new file (mode 600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// List the org's keys (never the keys themselves).
    List,
    /// Revoke a key: its next request is refused.
    Revoke {
        /// Its name.
        name: String,
    },
}

#[derive(Subcommand, Debug)]
enum WebhooksCmd {
    /// Deliver events to a URL; prints the signing secret once (or writes it to --out).
    Create {
        /// An http(s) URL without credentials.
        url: String,
        /// Event kinds ('run.failed'), families ('run.*') or '*'; comma separated.
        #[arg(long, value_delimiter = ',', default_value = "*")]
        events: Vec<String>,
        /// What it is for.
        #[arg(long)]
        description: Option<String>,
        /// Write the secret to this new file (mode 600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// The org's endpoints: state, cursor, last delivery.
    List,
    /// A new signing secret for an endpoint.
    Rotate {
        /// The endpoint's id.
        id: i64,
        /// Write the secret to this new file (mode 600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Stop delivering to an endpoint (its cursor stays).
    Disable {
        /// The endpoint's id.
        id: i64,
    },
    /// Deliver to an endpoint again, from its cursor on.
    Enable {
        /// The endpoint's id.
        id: i64,
    },
    /// Drop an endpoint and its delivery history.
    Drop {
        /// The endpoint's id.
        id: i64,
    },
}

#[derive(Subcommand, Debug)]
enum TokensCmd {
    /// Create a token for a pool; prints it once (or writes it to --out).
    Create {
        /// The pool its runner takes work from.
        pool: String,
        /// Its name in the list (default: runner-<8 hex digits>).
        #[arg(long)]
        name: Option<String>,
        /// Write the token to this new file (mode 600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// List the org's tokens (never their secrets).
    List,
    /// Give a token a new secret; the old one works for --grace-seconds more.
    Rotate {
        /// The token's name.
        name: String,
        /// How long the old secret keeps working (at most 7 days).
        #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(i64).range(0..=604_800))]
        grace_seconds: i64,
        /// Write the new token to this new file (mode 600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Revoke a token: its runner's next call is refused, its leases lapse.
    Revoke {
        /// The token's name.
        name: String,
    },
}

fn relay_options(name: Option<String>, idle_ms: u64) -> orca_serve::relay::RelayOptions {
    orca_serve::relay::RelayOptions {
        name: name.unwrap_or_else(|| format!("relay-{}", std::process::id())),
        idle: std::time::Duration::from_millis(idle_ms.max(10)),
    }
}

/// Runs the HTTP server until SIGINT or SIGTERM.
fn serve(opts: orca_serve::Options) -> anyhow::Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(orca_serve::serve(opts))?;
    Ok(0)
}

fn main() {
    let cli = Cli::parse();
    let json = cli.json;
    let result = match cli.cmd {
        Cmd::Locate { binary, root } => locate::run(&binary, &root),
        Cmd::Push {
            image,
            from,
            root,
            insecure_registry,
            register,
            binaries,
        } => push::run(&push::Push {
            image: &image,
            from: &from,
            root: &root,
            binaries: &binaries,
            insecure_registry,
        })
        .and_then(|pushed| {
            if !register {
                return Ok(0);
            }
            let mut c = db::connect(&cli.database_url, cli.org.as_deref())?;
            let at = register::InImage {
                reference: &pushed.reference,
                dir: push::PIPELINES_DIR,
            };
            for b in &pushed.binaries {
                register::run(&mut c, b, Some(&at))?;
            }
            Ok(0)
        }),
        Cmd::Discover { source } => discover::run(&source, json),
        Cmd::Serve {
            listen,
            connections,
            no_relay,
            secure_cookies,
        } => serve(orca_serve::Options {
            database_url: cli.database_url.clone(),
            listen,
            connections,
            relay: (!no_relay).then(|| relay_options(None, 500)),
            secure_cookies,
        }),
        Cmd::Relay { name, idle_ms } => {
            let opts = relay_options(name, idle_ms);
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| {
                    rt.block_on(orca_serve::relay_only(&cli.database_url, opts))
                        .map_err(anyhow::Error::from)
                })
                .map(|()| 0)
        }
        cmd => db::connect(&cli.database_url, cli.org.as_deref()).and_then(|mut c| match cmd {
            Cmd::Register {
                binary,
                image,
                image_dir,
            } => register::run(
                &mut c,
                &binary,
                image
                    .as_deref()
                    .map(|reference| register::InImage {
                        reference,
                        dir: &image_dir,
                    })
                    .as_ref(),
            ),
            Cmd::Backfill {
                pipeline,
                partitions,
                per_run,
                detach,
            } => backfill::run(&mut c, &pipeline, &partitions, per_run, detach),
            Cmd::Runs {
                pipeline,
                status,
                limit,
            } => show::runs(&mut c, pipeline.as_deref(), status.as_deref(), limit, json),
            Cmd::Run { id, logs } => show::run(&mut c, id, &logs),
            Cmd::Fires { pipeline, n } => show::fires(&mut c, &pipeline, n, json),
            Cmd::Keys {
                pipeline,
                not_done,
                refresh,
            } => show::keys(&mut c, &pipeline, not_done, refresh, json),
            Cmd::Syncs => syncs::list(&mut c, json),
            Cmd::Sync {
                name,
                backfill,
                detach,
            } => syncs::run(&mut c, &name, backfill, detach),
            Cmd::Maintain {
                dataset,
                options,
                detach,
            } => maintain::run(&mut c, &dataset, &options, detach),
            Cmd::SyncPause { name } => syncs::pause(&mut c, &name),
            Cmd::SyncResume { name } => syncs::resume(&mut c, &name),
            Cmd::SyncScale { name, lanes } => syncs::scale(&mut c, &name, lanes),
            Cmd::Explain { id } => show::why(&mut c, id, json),
            Cmd::Incidents { all } => show::incidents(&mut c, all, json),
            Cmd::ResolveIncident { id, note } => {
                show::resolve_incident(&mut c, id, note.as_deref())
            }
            Cmd::Cancel { id } => show::cancel(&mut c, id),
            Cmd::Retry { id } => show::retry(&mut c, id),
            Cmd::Secrets { cmd } => match cmd {
                SecretsCmd::Set { name } => secrets::set(&mut c, &name),
                SecretsCmd::List => secrets::list(&mut c, json),
                SecretsCmd::Drop { name } => secrets::drop(&mut c, &name),
            },
            Cmd::Allowlist { cmd } => match cmd {
                AllowlistCmd::List => allowlist::list(&mut c, json),
                AllowlistCmd::Add { org, target, note } => {
                    allowlist::add(&mut c, &org, &target, note.as_deref())
                }
                AllowlistCmd::Remove { org, target } => allowlist::remove(&mut c, &org, &target),
            },
            Cmd::ApiKeys { cmd } => match cmd {
                KeysCmd::Create { name, role, out } => {
                    api_keys::create(&mut c, &name, &role, out.as_deref())
                }
                KeysCmd::List => api_keys::list(&mut c, json),
                KeysCmd::Revoke { name } => api_keys::revoke(&mut c, &name),
            },
            Cmd::Webhooks { cmd } => match cmd {
                WebhooksCmd::Create {
                    url,
                    events,
                    description,
                    out,
                } => webhooks::create(
                    &mut c,
                    &url,
                    &events,
                    description.as_deref(),
                    out.as_deref(),
                ),
                WebhooksCmd::List => webhooks::list(&mut c, json),
                WebhooksCmd::Rotate { id, out } => webhooks::rotate(&mut c, id, out.as_deref()),
                WebhooksCmd::Disable { id } => webhooks::set_enabled(&mut c, id, false),
                WebhooksCmd::Enable { id } => webhooks::set_enabled(&mut c, id, true),
                WebhooksCmd::Drop { id } => webhooks::drop(&mut c, id),
            },
            Cmd::Tokens { cmd } => match cmd {
                TokensCmd::Create { pool, name, out } => {
                    tokens::create(&mut c, &pool, name.as_deref(), out.as_deref())
                }
                TokensCmd::List => tokens::list(&mut c, json),
                TokensCmd::Rotate {
                    name,
                    grace_seconds,
                    out,
                } => tokens::rotate(&mut c, &name, grace_seconds, out.as_deref()),
                TokensCmd::Revoke { name } => tokens::revoke(&mut c, &name),
            },
            Cmd::Locate { .. }
            | Cmd::Push { .. }
            | Cmd::Serve { .. }
            | Cmd::Relay { .. }
            | Cmd::Discover { .. } => Ok(0),
        }),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("orca: {e:#}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn every_command_and_argument_says_what_it_is() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let mut missing = Vec::new();
        for arg in cli.get_arguments() {
            if arg.get_help().is_none() && arg.get_id() != "help" && arg.get_id() != "version" {
                missing.push(format!("orca --{}", arg.get_id()));
            }
        }
        for sub in cli.get_subcommands() {
            if sub.get_about().is_none() {
                missing.push(format!("orca {}", sub.get_name()));
            }
            for arg in sub.get_arguments() {
                if arg.get_help().is_none() && arg.get_id() != "help" {
                    missing.push(format!("orca {} {}", sub.get_name(), arg.get_id()));
                }
            }
        }
        assert!(missing.is_empty(), "no help text: {missing:?}");
    }

    #[test]
    fn every_command_is_in_the_cli_reference() {
        // docs/cli.md names each command (and each subcommand of a family)
        // as `orca <command>` or, beside its family, `<subcommand>`.
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md"),
        )
        .expect("docs/cli.md");
        let mut missing = Vec::new();
        for sub in Cli::command().get_subcommands() {
            let name = sub.get_name();
            let listed = doc.contains(&format!("`orca {name}"))
                || doc.contains(&format!("`{name} <"))
                || doc.contains(&format!("/ `{name}"));
            if !listed {
                missing.push(format!("orca {name}"));
            }
            for leaf in sub.get_subcommands() {
                let leaf = leaf.get_name();
                let row = doc
                    .lines()
                    .filter(|l| l.contains(&format!("`orca {name}")))
                    .any(|l| {
                        l.contains(&format!("{name} {leaf}")) || l.contains(&format!("`{leaf}"))
                    });
                if !row {
                    missing.push(format!("orca {name} {leaf}"));
                }
            }
        }
        assert!(missing.is_empty(), "docs/cli.md does not name: {missing:?}");
    }
}
