//! The harness's settings, from the environment its CONTRIBUTING_ADAPTERS.md
//! names, and Orca's own.

use anyhow::{Context, Result};
use orca_bench_common::env_num;

/// The harness's settings, read once.
#[derive(Clone, Debug)]
pub struct Config {
    pub url: String,
    pub depth_target: bool,
    pub rate: f64,
    pub rate_file: Option<String>,
    pub harness_pacing: bool,
    pub batch_max: usize,
    pub batch_ms: u64,
    pub target_depth: i64,
    pub workers: usize,
    pub payload_bytes: usize,
    pub work_ms: u64,
    pub sample_every_s: u64,
    pub driver_lease_s: usize,
}

impl Config {
    pub fn from_env() -> Result<Config> {
        let text = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mode = text("PRODUCER_MODE").unwrap_or_else(|| "fixed".into());
        let depth_target = match mode.as_str() {
            "fixed" => false,
            "depth-target" => true,
            other => anyhow::bail!("PRODUCER_MODE={other}: expected fixed or depth-target"),
        };
        Ok(Config {
            url: text("DATABASE_URL").context("DATABASE_URL is required")?,
            depth_target,
            rate: env_num("PRODUCER_RATE", 100)? as f64,
            rate_file: text("PRODUCER_RATE_CONTROL_FILE"),
            harness_pacing: text("PRODUCER_PACING").as_deref() == Some("harness"),
            batch_max: env_num("PRODUCER_BATCH_MAX", 128)?.clamp(1, 10_000),
            batch_ms: env_num("PRODUCER_BATCH_MS", 25)?.max(1) as u64,
            target_depth: env_num("TARGET_DEPTH", 1000)? as i64,
            workers: env_num("WORKER_COUNT", 32)?.max(1),
            payload_bytes: env_num("JOB_PAYLOAD_BYTES", 256)?,
            work_ms: env_num("JOB_WORK_MS", 1)? as u64,
            sample_every_s: env_num("SAMPLE_EVERY_S", 5)?.max(1) as u64,
            driver_lease_s: env_num("ORCA_DRIVER_LEASE_S", 300)?.clamp(1, 86_400),
        })
    }
}
