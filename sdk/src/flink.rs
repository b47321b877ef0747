//! Flink jobs as a continuous step's work, on the user's session cluster.
//!
//! ```ignore
//! #[orca::step(mapped, retries = 3)]
//! fn enrich(ctx: &mut Ctx, day: Day) -> Result<orca::flink::Finished> {
//!     orca::flink::run(ctx, Job::new("jobs/enrich.jar").class("com.acme.Enrich").arg(day.to_string()))
//! }
//! ```
//!
//! [`run`] submits the jar to the cluster's REST API (`ORCA_FLINK_URL`),
//! from the step's resume point when it has one, and follows the job to
//! its end, asking the control plane between looks what it wants of the
//! attempt (`orca.attempt_state`):
//! - **pause** (`orca.pause`): the job is stopped with a savepoint under
//!   `ORCA_FLINK_SAVEPOINTS/<org>/<pipeline>/<step>/<partition>`, which is
//!   recorded as the step's resume point (`orca.record_resume_point`); the
//!   step waits, holding nothing on the cluster, and on `orca.unpause`
//!   submits the job again from that savepoint;
//! - **cancel** (`orca.cancel`): the job is stopped with a savepoint, which
//!   the next run of the pipeline resumes from;
//! - the job **finishing** ends the step (its resume point forgotten), the
//!   job **failing** fails it with the job's root exception.
//!
//! A runner kills a cancelled or fenced step at once. So that the job never
//! outlives its step, a guard process (this binary again, started by `run`)
//! holds a pipe from the step: when the step dies, the guard stops the job
//! with a savepoint and records it (the lease stays good for that for an
//! hour after a cancel or a loss), else cancels it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::store::AttemptState;
use crate::{Ctx, Result};

/// The variable that makes a pipeline binary a job's guard.
pub(crate) const GUARD_ENV: &str = "ORCA_FLINK_GUARD";

/// A Flink job to run for a step: a jar built against the cluster's Flink.
pub struct Job {
    jar: PathBuf,
    class: Option<String>,
    args: Vec<String>,
    parallelism: Option<u32>,
    cluster: Option<String>,
}

impl Job {
    /// The job's jar (its manifest's main class, or name one with `class`).
    pub fn new(jar: impl Into<PathBuf>) -> Job {
        Job {
            jar: jar.into(),
            class: None,
            args: Vec::new(),
            parallelism: None,
            cluster: None,
        }
    }

    /// The entry class.
    pub fn class(mut self, class: impl Into<String>) -> Job {
        self.class = Some(class.into());
        self
    }

    /// An argument of the job's `main`.
    pub fn arg(mut self, arg: impl Into<String>) -> Job {
        self.args.push(arg.into());
        self
    }

    /// The job's parallelism (default: the cluster's).
    pub fn parallelism(mut self, n: u32) -> Job {
        self.parallelism = Some(n);
        self
    }

    /// The session cluster's REST address (`http://host:8081`); default
    /// `ORCA_FLINK_URL` from the runner's environment.
    pub fn cluster(mut self, url: impl Into<String>) -> Job {
        self.cluster = Some(url.into());
        self
    }
}

/// How a step's Flink job ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    /// The last job's id (each resume is a new job on the cluster).
    pub job: String,
    /// Its final state: FINISHED.
    pub state: String,
    /// The savepoint the step's first job resumed from, if any.
    pub resumed_from: Option<String>,
    /// The savepoints the step stopped its jobs with (one per pause).
    pub savepoints: Vec<String>,
}

/// The cluster's REST API.
#[derive(Clone)]
struct Rest {
    base: String,
}

/// What a failed REST call says: Flink's `errors`, or the transport's.
fn rest_error(what: &str, e: ureq::Error) -> String {
    match e {
        ureq::Error::Status(code, resp) => {
            let body = resp.into_string().unwrap_or_default();
            let errors = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v.get("errors").cloned())
                .and_then(|v| v.as_array().cloned())
                .map(|a| {
                    a.iter()
                        .filter_map(|e| e.as_str())
                        .map(|e| e.lines().next().unwrap_or(e).to_string())
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .unwrap_or(body);
            format!("{what}: HTTP {code}: {errors}")
        }
        other => format!("{what}: {other}"),
    }
}

impl Rest {
    fn new(url: &str) -> Result<Rest> {
        let base = url.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) || base.contains(' ') {
            return Err(format!(
                "Flink cluster {url:?}: give its REST address as http://host:port or https://host:port"
            )
            .into());
        }
        Ok(Rest {
            base: base.to_string(),
        })
    }

    fn get(&self, path: &str) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        Ok(ureq::get(&url)
            .timeout(Duration::from_secs(30))
            .call()
            .map_err(|e| rest_error(&format!("GET {url}"), e))?
            .into_json()?)
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        Ok(ureq::post(&url)
            .timeout(Duration::from_secs(60))
            .send_json(body)
            .map_err(|e| rest_error(&format!("POST {url}"), e))?
            .into_json()?)
    }

    /// Uploads a jar; returns its id on the cluster.
    fn upload(&self, jar: &Path) -> Result<String> {
        let bytes =
            std::fs::read(jar).map_err(|e| format!("the job's jar {}: {e}", jar.display()))?;
        let name = jar
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| n.ends_with(".jar") && !n.contains(['"', '\r', '\n']))
            .ok_or_else(|| format!("the job's jar {}: not a .jar file name", jar.display()))?;
        let boundary = format!("orca-{:016x}", rand_u64());
        let mut body = Vec::with_capacity(bytes.len() + 256);
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"jarfile\"; filename=\"{name}\"\r\nContent-Type: application/x-java-archive\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(&bytes);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let url = format!("{}/jars/upload", self.base);
        let answer: Value = ureq::post(&url)
            .timeout(Duration::from_secs(300))
            .set(
                "Content-Type",
                &format!("multipart/form-data; boundary={boundary}"),
            )
            .send_bytes(&body)
            .map_err(|e| rest_error(&format!("uploading {} to {url}", jar.display()), e))?
            .into_json()?;
        answer
            .get("filename")
            .and_then(Value::as_str)
            .and_then(|f| f.rsplit('/').next())
            .map(str::to_string)
            .ok_or_else(|| {
                format!("the Flink cluster's answer to an upload names no jar: {answer}").into()
            })
    }

    fn state(&self, job: &str) -> Result<String> {
        Ok(self
            .get(&format!("/jobs/{job}"))?
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or("UNKNOWN")
            .to_string())
    }

    /// The job's root exception, in one line: its class and message.
    fn root_exception(&self, job: &str) -> String {
        let Ok(v) = self.get(&format!("/jobs/{job}/exceptions")) else {
            return "(the cluster did not say why)".into();
        };
        let history = v
            .pointer("/exceptionHistory/entries/0")
            .and_then(|e| e.get("stacktrace").or_else(|| e.get("exceptionName")))
            .and_then(Value::as_str);
        let root = history
            .or_else(|| v.get("root-exception").and_then(Value::as_str))
            .unwrap_or("(the cluster did not say why)");
        telling_line(root)
    }

    /// Stops a job with a savepoint under `dir`; returns the savepoint's
    /// location once the job has finished.
    fn stop_with_savepoint(&self, job: &str, dir: &str, within: Duration) -> Result<String> {
        let trigger = self.post(
            &format!("/jobs/{job}/stop"),
            &json!({"targetDirectory": dir, "drain": false}),
        )?;
        let rid = trigger
            .get("request-id")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                format!("the Flink cluster's answer to a stop names no request: {trigger}")
            })?
            .to_string();
        let start = Instant::now();
        loop {
            let status = self.get(&format!("/jobs/{job}/savepoints/{rid}"))?;
            if status.pointer("/status/id").and_then(Value::as_str) == Some("COMPLETED") {
                if let Some(loc) = status
                    .pointer("/operation/location")
                    .and_then(Value::as_str)
                {
                    return Ok(loc.to_string());
                }
                let cause = status
                    .pointer("/operation/failure-cause/stack-trace")
                    .and_then(Value::as_str)
                    .map(telling_line)
                    .unwrap_or_else(|| status.to_string());
                return Err(
                    format!("stopping Flink job {job} with a savepoint failed: {cause}").into(),
                );
            }
            if start.elapsed() > within {
                return Err(format!(
                    "stopping Flink job {job} with a savepoint did not finish within {within:?}"
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn cancel(&self, job: &str) -> Result<()> {
        let url = format!("{}/jobs/{job}?mode=cancel", self.base);
        ureq::request("PATCH", &url)
            .timeout(Duration::from_secs(30))
            .call()
            .map_err(|e| rest_error(&format!("PATCH {url}"), e))?;
        Ok(())
    }
}

/// The line of a Java stack trace that says what went wrong: the deepest
/// `Caused by:` (the root cause), else the first line.
fn telling_line(trace: &str) -> String {
    trace
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Caused by: "))
        .next_back()
        .or_else(|| trace.lines().next())
        .unwrap_or("")
        .trim()
        .to_string()
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&uuid::Uuid::new_v4().as_bytes()[..8]);
    u64::from_le_bytes(b)
}

/// A partition as a path segment: `*` (gather) and `/` cannot be one.
fn segment(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '*' => '_',
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '=') => c,
            _ => '_',
        })
        .collect()
}

/// Where a step's savepoints go: `<root>/<org>/<pipeline>/<step>/<partition>`.
fn savepoint_dir(root: &str, org: &str, pipeline: &str, step: &str, partition: &str) -> String {
    format!(
        "{}/{}/{}/{}/{}",
        root.trim_end_matches('/'),
        segment(org),
        segment(pipeline),
        segment(step),
        segment(partition)
    )
}

/// A `file:` URI as a path: Flink writes `file:/a/b` where a user writes
/// `file:///a/b`. Other schemes are left as they are.
fn local_form(uri: &str) -> &str {
    match uri.strip_prefix("file://") {
        Some(rest) if rest.starts_with('/') => rest,
        _ => match uri.strip_prefix("file:") {
            Some(rest) if rest.starts_with('/') && !rest.starts_with("//") => rest,
            _ => uri,
        },
    }
}

/// A resume point is this step's own: under its savepoint directory, with
/// no `..`. Anything else (another directory root, another step's or org's
/// savepoint) is refused rather than restored.
fn own_resume_point(location: &str, dir: &str) -> Result<()> {
    let inside = local_form(location)
        .strip_prefix(local_form(dir))
        .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1);
    if !inside || location.split('/').any(|s| s == "..") {
        return Err(format!(
            "the recorded resume point {location:?} is not under this step's savepoint directory {dir}: refusing to restore it (forget it with orca.record_resume_point or move ORCA_FLINK_SAVEPOINTS back)"
        )
        .into());
    }
    Ok(())
}

fn env_duration(name: &str, default: Duration) -> Duration {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_millis)
        .unwrap_or(default)
}

/// What the guard is told on its command line (an environment variable).
#[derive(Serialize, Deserialize)]
struct GuardSpec {
    url: String,
    dir: String,
    step: String,
    partition: String,
}

/// The guard of a step's jobs: told on its stdin each job's id, and
/// "idle" when no job of the step runs.
struct Guard {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Guard {
    fn start(spec: &GuardSpec) -> Result<Guard> {
        let exe = std::env::current_exe()?;
        let log = std::env::temp_dir().join(format!("orca-flink-guard-{}.log", std::process::id()));
        let mut cmd = Command::new(exe);
        cmd.env(GUARD_ENV, serde_json::to_string(spec)?)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        // SAFETY: setsid is async-signal-safe and touches nothing else.
        unsafe {
            use std::os::unix::process::CommandExt;
            // Its own session: a terminal's Ctrl-C to the step must leave
            // the guard to stop the job.
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        Ok(Guard { child, stdin })
    }

    fn tell(&mut self, line: &str) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s, "{line}");
            let _ = s.flush();
        }
    }

    fn follow(&mut self, job: &str) {
        self.tell(&format!("job {job}"));
    }

    fn idle(&mut self) {
        self.tell("idle");
    }
}

impl Drop for Guard {
    /// The step is done with its job, or leaves it on an error: the pipe
    /// closes, and a guard still following a job stops it (waited for, so
    /// that its savepoint is recorded before the attempt ends).
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// Runs a job's guard (the pipeline binary started with `ORCA_FLINK_GUARD`):
/// when its stdin ends while it follows a job, the step died or left the
/// job on an error, and the job is stopped with a savepoint (recorded with
/// the attempt's lease) or, failing that, cancelled. Returns the exit code.
pub(crate) fn guard(spec: &str) -> i32 {
    let say = |m: &str| {
        let _ = writeln!(std::io::stderr(), "orca flink guard: {m}");
    };
    let spec: GuardSpec = match serde_json::from_str(spec) {
        Ok(s) => s,
        Err(e) => {
            say(&format!("bad {GUARD_ENV}: {e}"));
            return 2;
        }
    };
    let rest = match Rest::new(&spec.url) {
        Ok(r) => r,
        Err(e) => {
            say(&e.to_string());
            return 2;
        }
    };
    let mut job: Option<String> = None;
    let mut line = String::new();
    let mut stdin = BufReader::new(std::io::stdin());
    loop {
        line.clear();
        match stdin.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        match line.trim() {
            "idle" => job = None,
            l => {
                if let Some(id) = l.strip_prefix("job ") {
                    job = Some(id.to_string());
                }
            }
        }
    }
    let Some(job) = job else { return 0 };
    say(&format!(
        "the step is gone; stopping job {job} with a savepoint"
    ));
    let within = env_duration("ORCA_FLINK_STOP_TIMEOUT_MS", Duration::from_secs(120));
    match rest.stop_with_savepoint(&job, &spec.dir, within) {
        Ok(loc) => {
            say(&format!("job {job} stopped with savepoint {loc}"));
            if let Err(e) = record_from_guard(&spec, &loc) {
                say(&format!("could not record the resume point {loc}: {e}"));
            }
            0
        }
        Err(e) => {
            say(&format!("{e}; cancelling job {job}"));
            if let Err(e) = rest.cancel(&job) {
                say(&format!("cancelling job {job}: {e}"));
                return 1;
            }
            0
        }
    }
}

/// Records a guard's savepoint with the lease the runner gave the step.
fn record_from_guard(spec: &GuardSpec, location: &str) -> std::result::Result<(), String> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "no DATABASE_URL (an in-memory run)")?;
    let lease: orca_core::api::LeaseToken = std::env::var("ORCA_LEASE")
        .map_err(|_| "no ORCA_LEASE")?
        .parse()
        .map_err(|e| format!("ORCA_LEASE: {e}"))?;
    let org = std::env::var("ORCA_ORG").ok();
    let mut control =
        orca_client::Control::connect(&url, org.as_deref()).map_err(|e| e.to_string())?;
    control
        .record_resume_point(lease, &spec.step, &spec.partition, Some(location))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs a Flink job for this step, to its end, as the module says.
pub fn run(ctx: &mut Ctx<'_>, job: Job) -> Result<Finished> {
    let url = job
        .cluster
        .clone()
        .or_else(|| std::env::var("ORCA_FLINK_URL").ok())
        .ok_or("no Flink cluster: give the job one, or set ORCA_FLINK_URL on the runner")?;
    let rest = Rest::new(&url)?;
    let root = std::env::var("ORCA_FLINK_SAVEPOINTS").map_err(|_| {
        "no savepoint directory: set ORCA_FLINK_SAVEPOINTS on the runner (a directory or URI the cluster's JobManager writes, such as file:///srv/flink/savepoints or s3://bucket/savepoints)"
    })?;
    let org = std::env::var("ORCA_ORG").unwrap_or_else(|_| "default".into());
    let dir = savepoint_dir(&root, &org, ctx.pipeline, ctx.step, &ctx.partition);
    let poll = env_duration("ORCA_FLINK_POLL_MS", Duration::from_secs(1));
    let stop_within = env_duration("ORCA_FLINK_STOP_TIMEOUT_MS", Duration::from_secs(120));

    let resumed_from = ctx.io.store.resume_point(ctx.step, &ctx.partition)?;
    if let Some(loc) = &resumed_from {
        own_resume_point(loc, &dir)?;
    }
    let jar = rest.upload(&job.jar)?;
    let submit = |savepoint: Option<&str>| -> Result<String> {
        let mut body = json!({
            "programArgsList": job.args,
            "allowNonRestoredState": false,
        });
        if let Some(c) = &job.class {
            body["entryClass"] = json!(c);
        }
        if let Some(p) = job.parallelism {
            body["parallelism"] = json!(p);
        }
        if let Some(s) = savepoint {
            body["savepointPath"] = json!(s);
        }
        let answer = rest.post(&format!("/jars/{jar}/run"), &body)?;
        answer
            .get("jobid")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                format!("the Flink cluster's answer to a run names no job: {answer}").into()
            })
    };
    let mut guard = Guard::start(&GuardSpec {
        url: url.clone(),
        dir: dir.clone(),
        step: ctx.step.to_string(),
        partition: ctx.partition.clone(),
    })?;
    let mut id = submit(resumed_from.as_deref())?;
    guard.follow(&id);
    ctx.log(format!(
        "submitted {} to the Flink cluster at {url} as job {id}{}",
        job.jar.display(),
        resumed_from
            .as_deref()
            .map(|s| format!(", resuming from {s}"))
            .unwrap_or_default()
    ));
    let mut savepoints = Vec::new();
    let mut last_state = String::new();
    let mut checkpoints: Option<i64> = None;
    let mut last_progress = Instant::now();
    let mut unanswered = 0u32;
    loop {
        std::thread::sleep(poll);
        // A cluster that does not answer for a while (a JobManager
        // failing over) is waited for; one that stays silent fails the
        // step, and the guard stops the job.
        let state = match rest.state(&id) {
            Ok(s) => {
                unanswered = 0;
                s
            }
            Err(e) if unanswered < 30 => {
                unanswered += 1;
                if unanswered == 1 {
                    ctx.log(format!(
                        "the Flink cluster did not answer ({e}); trying again"
                    ));
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        if state != last_state {
            if state == "RESTARTING" {
                // The cluster's restart strategy decides; the step says why.
                ctx.log(format!(
                    "Flink job {id} is RESTARTING after {}",
                    rest.root_exception(&id)
                ));
            } else {
                ctx.log(format!("Flink job {id} is {state}"));
            }
            last_state = state.clone();
        }
        match state.as_str() {
            "FINISHED" => {
                // Done: the next run starts afresh, not from an old savepoint.
                ctx.io
                    .store
                    .record_resume_point(ctx.step, &ctx.partition, None)?;
                guard.idle();
                return Ok(Finished {
                    job: id,
                    state,
                    resumed_from,
                    savepoints,
                });
            }
            "FAILED" => {
                guard.idle();
                return Err(
                    format!("the Flink job {id} failed: {}", rest.root_exception(&id)).into(),
                );
            }
            "CANCELED" => {
                guard.idle();
                return Err(format!("the Flink job {id} was cancelled on the cluster").into());
            }
            _ => {}
        }
        if last_progress.elapsed() >= Duration::from_secs(10) {
            last_progress = Instant::now();
            if let Ok(c) = rest.get(&format!("/jobs/{id}/checkpoints")) {
                let n = c.pointer("/counts/completed").and_then(Value::as_i64);
                if n.is_some() && n != checkpoints {
                    checkpoints = n;
                    ctx.log(format!(
                        "Flink job {id}: {} checkpoints completed",
                        n.unwrap_or(0)
                    ));
                }
            }
        }
        match ctx.io.store.attempt_state()? {
            AttemptState::Running => {}
            AttemptState::Paused => {
                let loc = rest.stop_with_savepoint(&id, &dir, stop_within)?;
                guard.idle();
                ctx.io
                    .store
                    .record_resume_point(ctx.step, &ctx.partition, Some(&loc))?;
                savepoints.push(loc.clone());
                ctx.log(format!(
                    "the pipeline is paused: stopped Flink job {id} with savepoint {loc}; waiting for orca.unpause"
                ));
                loop {
                    std::thread::sleep(poll);
                    match ctx.io.store.attempt_state()? {
                        AttemptState::Paused => continue,
                        AttemptState::Running => break,
                        stop => {
                            return Err(format!(
                                "the run was {} while paused; the next run resumes from {loc}",
                                if stop == AttemptState::Cancelled {
                                    "cancelled"
                                } else {
                                    "taken back"
                                }
                            )
                            .into())
                        }
                    }
                }
                id = submit(Some(&loc))?;
                guard.follow(&id);
                last_state.clear();
                ctx.log(format!("unpaused: resumed from {loc} as Flink job {id}"));
            }
            stop => {
                let loc = rest.stop_with_savepoint(&id, &dir, stop_within)?;
                guard.idle();
                // A cancelled or lost lease may still say where it stopped.
                let recorded =
                    ctx.io
                        .store
                        .record_resume_point(ctx.step, &ctx.partition, Some(&loc));
                return Err(format!(
                    "the run was {}: stopped Flink job {id} with savepoint {loc}{}",
                    if stop == AttemptState::Cancelled {
                        "cancelled"
                    } else {
                        "taken from this attempt"
                    },
                    match recorded {
                        Ok(()) => ", which the next run resumes from".to_string(),
                        Err(e) => format!(" (not recorded: {e})"),
                    }
                )
                .into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn a_resume_point_must_be_the_step_s_own() {
        let dir = savepoint_dir("file:///sp/", "acme", "stream", "enrich", "2024-01");
        assert_eq!(dir, "file:///sp/acme/stream/enrich/2024-01");
        assert!(own_resume_point(&format!("{dir}/savepoint-a1b2c3-0123456789ab"), &dir).is_ok());
        // Flink names a local savepoint file:/..., a user file:///...
        assert!(own_resume_point("file:/sp/acme/stream/enrich/2024-01/savepoint-1", &dir).is_ok());
        assert!(own_resume_point("/sp/acme/stream/enrich/2024-01/savepoint-1", &dir).is_ok());
        for bad in [
            "file:///sp/globex/stream/enrich/2024-01/savepoint-1".to_string(),
            format!("{dir}-other/savepoint-1"),
            format!("{dir}/../../../globex/stream/enrich/2024-01/savepoint-1"),
            format!("{dir}/"),
            "s3://elsewhere/savepoint-1".to_string(),
        ] {
            let e = own_resume_point(&bad, &dir).expect_err(&bad).to_string();
            assert!(e.contains(&bad), "{e}");
        }
    }

    #[test]
    fn a_partition_is_one_path_segment() {
        assert_eq!(segment("*"), "_");
        assert_eq!(segment("a/../b"), "a_.._b");
        assert_eq!(segment("2024-01-05"), "2024-01-05");
        let d = savepoint_dir("/sp", "acme", "p", "s", "../x");
        assert_eq!(d, "/sp/acme/p/s/.._x");
    }

    #[test]
    fn the_telling_line_is_the_root_cause() {
        let trace = "org.apache.flink.runtime.JobException: Recovery is suppressed\n\tat x.y(Z.java:1)\nCaused by: java.lang.RuntimeException: outer\n\tat a.b\nCaused by: java.lang.IllegalStateException: probe: the job was asked to fail\n\tat c.d";
        assert_eq!(
            telling_line(trace),
            "java.lang.IllegalStateException: probe: the job was asked to fail"
        );
        assert_eq!(
            telling_line("java.lang.Error: one line"),
            "java.lang.Error: one line"
        );
    }

    #[test]
    fn a_cluster_is_an_http_address() {
        assert!(Rest::new("http://127.0.0.1:8081/").is_ok());
        for bad in [
            "127.0.0.1:8081",
            "file:///etc/passwd",
            "ftp://x",
            "http://a b",
        ] {
            let e = Rest::new(bad).err().expect(bad).to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn an_upload_is_one_multipart_jar() {
        // A one-shot HTTP server on loopback that records the request and
        // answers as Flink's /jars/upload does.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .expect("timeout");
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while let Ok(n) = s.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
                if buf.windows(4).any(|w| w == b"--\r\n") {
                    break;
                }
            }
            let body =
                r#"{"filename":"/tmp/flink-web/flink-web-upload/0d1e_job.jar","status":"success"}"#;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            String::from_utf8_lossy(&buf).to_string()
        });
        let dir = std::env::temp_dir().join(format!("orca-flink-up-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let jar = dir.join("job.jar");
        std::fs::write(&jar, b"PK-not-really").expect("jar");
        let id = Rest::new(&format!("http://127.0.0.1:{port}"))
            .expect("rest")
            .upload(&jar)
            .expect("upload");
        assert_eq!(id, "0d1e_job.jar");
        let request = server.join().expect("server");
        assert!(request.starts_with("POST /jars/upload"), "{request}");
        assert!(
            request.contains("name=\"jarfile\"; filename=\"job.jar\""),
            "{request}"
        );
        assert!(request.contains("PK-not-really"), "{request}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
