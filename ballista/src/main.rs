//! `orca-ballista`: a Ballista scheduler or executor that knows Orca's
//! pinned Iceberg scans. A step's `ctx.sql` sends its query to the
//! scheduler (`ORCA_BALLISTA_URL=df://host:port`) with each table planned
//! by the step as a list of files; the executors read those files with the
//! storage settings of their environment (`ORCA_WAREHOUSE`, `AWS_*`...),
//! and nothing of the catalog or the control plane.
//!
//! A cluster that serves one org (`ORCA_BALLISTA_ORG`) refuses another
//! org's plans and any file outside `<ORCA_WAREHOUSE>/<org>/`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use clap::{Parser, Subcommand};
use orca_lake::datafusion::execution::session_state::SessionStateBuilder;
use orca_lake::datafusion_proto::logical_plan::LogicalExtensionCodec;
use orca_lake::datafusion_proto::physical_plan::PhysicalExtensionCodec;
use orca_lake::query::codec::{LogicalCodec, PhysicalCodec};
use orca_lake::query::write::OrcaQueryPlanner;
use orca_lake::query::Admission;

#[derive(Parser)]
#[command(
    name = "orca-ballista",
    version,
    about = "A Ballista scheduler or executor for Orca's distributed step queries"
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// The scheduler steps send their queries to.
    Scheduler {
        /// Where it listens for steps and executors (gRPC, and its REST API
        /// with /api/version).
        #[arg(long, default_value = "127.0.0.1:50050")]
        bind: SocketAddr,
        /// The host executors and steps reach it by.
        #[arg(long, default_value = "localhost")]
        external_host: String,
        /// An executor silent this long is dead: its tasks run elsewhere.
        #[arg(long, default_value_t = 30)]
        executor_timeout_seconds: u64,
    },
    /// An executor: reads the files of the stages it is given.
    Executor {
        /// The scheduler, host:port.
        #[arg(long, default_value = "127.0.0.1:50050")]
        scheduler: String,
        /// The address it listens on.
        #[arg(long, default_value = "127.0.0.1")]
        bind_host: String,
        /// Its Arrow Flight port (stage results are fetched from it).
        #[arg(long, default_value_t = 50051)]
        port: u16,
        /// Its gRPC port.
        #[arg(long, default_value_t = 50052)]
        grpc_port: u16,
        /// Tasks it runs at once (default: its cores).
        #[arg(long)]
        slots: Option<usize>,
        /// Where it keeps shuffle files.
        #[arg(long)]
        work_dir: Option<String>,
        /// Seconds between heartbeats to the scheduler.
        #[arg(long, default_value_t = 5)]
        heartbeat_seconds: u64,
    },
}

fn codecs(
    admission: &Admission,
) -> (
    Arc<dyn LogicalExtensionCodec>,
    Arc<dyn PhysicalExtensionCodec>,
) {
    (
        Arc::new(LogicalCodec::new(
            Arc::new(BallistaLogicalExtensionCodec::default()),
            admission.clone(),
        )),
        Arc::new(PhysicalCodec::new(
            Arc::new(BallistaPhysicalExtensionCodec::default()),
            admission.clone(),
        )),
    )
}

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let admission = Admission::from_env();
    match admission.serves() {
        Some(org) => log::info!("serving org {org} only"),
        None => log::warn!(
            "serving every org: set ORCA_BALLISTA_ORG (and ORCA_WAREHOUSE) to refuse other orgs' plans and files"
        ),
    }
    let (logical, physical) = codecs(&admission);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // DataFusion's planning recurses deeply on large plans.
        .thread_stack_size(32 * 1024 * 1024)
        .build()
        .context("starting the runtime")?;
    match cli.role {
        Role::Scheduler {
            bind,
            external_host,
            executor_timeout_seconds,
        } => {
            let config = SchedulerConfig {
                bind_host: bind.ip().to_string(),
                bind_port: bind.port(),
                external_host,
                executor_timeout_seconds,
                expire_dead_executor_interval_seconds: 5,
                override_logical_codec: Some(logical),
                override_physical_codec: Some(physical),
                // Ballista's session, with a planner that knows Orca's
                // writes (a step's result written by the executors).
                override_session_builder: Some(Arc::new(|config| {
                    let state = ballista_core::utils::default_session_builder(config)?;
                    Ok(SessionStateBuilder::new_from_existing(state)
                        .with_query_planner(Arc::new(OrcaQueryPlanner))
                        .build())
                })),
                ..SchedulerConfig::default()
            };
            rt.block_on(async {
                let cluster = BallistaCluster::new_from_config(&config)
                    .await
                    .context("the scheduler's cluster state")?;
                start_server(cluster, bind, Arc::new(config))
                    .await
                    .context("the scheduler")
            })
        }
        Role::Executor {
            scheduler,
            bind_host,
            port,
            grpc_port,
            slots,
            work_dir,
            heartbeat_seconds,
        } => {
            let Some((host, sport)) = scheduler.rsplit_once(':') else {
                bail!("--scheduler {scheduler:?}: expected host:port");
            };
            let scheduler_port: u16 = sport
                .parse()
                .with_context(|| format!("--scheduler {scheduler:?}: the port"))?;
            let mut config = ExecutorProcessConfig {
                bind_host: bind_host.clone(),
                external_host: Some(bind_host),
                port,
                grpc_port,
                scheduler_host: host.to_string(),
                scheduler_port,
                scheduler_connect_timeout_seconds: 30,
                work_dir,
                executor_heartbeat_interval_seconds: heartbeat_seconds,
                override_logical_codec: Some(logical),
                override_physical_codec: Some(physical),
                ..ExecutorProcessConfig::default()
            };
            if let Some(n) = slots {
                if n == 0 {
                    bail!("--slots 0: an executor runs at least one task");
                }
                config.concurrent_tasks = n;
            }
            rt.block_on(start_executor_process(Arc::new(config)))
                .context("the executor")
        }
    }
}
