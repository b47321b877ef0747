//! Spark applications as a step's work, on the user's own cluster.
//!
//! ```ignore
//! #[orca::step(mapped, reads = ["lake.flights"], writes = ["lake.by_carrier"])]
//! fn by_carrier(ctx: &mut Ctx, month: Month) -> Result<i64> {
//!     let flights = table(ctx, "lake.flights")?;
//!     let out = orca::spark::submit(ctx, Job::new("jobs/by_carrier.py").read(&flights))?;
//!     let t = ensure_table(ctx, "lake.by_carrier", TableSpec::new(out.schema()?))?;
//!     append(ctx, &t, out.batches()?)
//! }
//! ```
//!
//! [`submit`] pins the snapshots of the tables the job reads (recorded as
//! any read of the step is), writes them to a job file (each table's pinned
//! snapshot and its data files' paths, the run, step, partition and the
//! output directory) whose path the application finds in `ORCA_SPARK_JOB`,
//! and runs `spark-submit` in client mode against the master: the driver
//! runs in the step's process tree, so it dies with the step (a cancelled
//! run kills the application), and its exit status and telling last line
//! are the step's. The application reads the pinned files as Parquet and writes its
//! result as Parquet files into the output directory; the step commits them
//! ([`Output::batches`] + `append`), so a retry finds the commit and does not
//! make it twice.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::json;

use crate::pins::pinned;
use crate::tables::Table;
use crate::{Ctx, Result};

/// How many of the driver's last lines a failure logs.
const LAST_LINES: usize = 30;

/// A Spark application to run for a step.
pub struct Job<'t> {
    app: PathBuf,
    args: Vec<String>,
    conf: BTreeMap<String, String>,
    class: Option<String>,
    master: Option<String>,
    reads: Vec<&'t Table>,
}

impl<'t> Job<'t> {
    /// The application: a Python file, or a jar (then name its `class`).
    pub fn new(app: impl Into<PathBuf>) -> Job<'t> {
        Job {
            app: app.into(),
            args: Vec::new(),
            conf: BTreeMap::new(),
            class: None,
            master: None,
            reads: Vec::new(),
        }
    }

    /// The master (`spark://host:7077`, `local[2]`, ...); default
    /// `ORCA_SPARK_MASTER` from the runner's environment.
    pub fn master(mut self, master: impl Into<String>) -> Job<'t> {
        self.master = Some(master.into());
        self
    }

    /// An argument after the application.
    pub fn arg(mut self, arg: impl Into<String>) -> Job<'t> {
        self.args.push(arg.into());
        self
    }

    /// A Spark setting (`--conf key=value`).
    pub fn conf(mut self, key: impl Into<String>, value: impl Into<String>) -> Job<'t> {
        self.conf.insert(key.into(), value.into());
        self
    }

    /// A jar's main class.
    pub fn class(mut self, class: impl Into<String>) -> Job<'t> {
        self.class = Some(class.into());
        self
    }

    /// A table the application reads: its snapshot is pinned for the step
    /// and its data files' paths are in the job file.
    pub fn read(mut self, table: &'t Table) -> Job<'t> {
        self.reads.push(table);
        self
    }
}

/// What an application wrote: the Parquet files of its output directory.
#[derive(Debug)]
pub struct Output {
    pub dir: PathBuf,
}

impl Output {
    /// The Parquet files the application wrote, in name order (Spark's
    /// `part-*` files; its `_SUCCESS` and hidden files are not data).
    pub fn files(&self) -> Result<Vec<PathBuf>> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map_err(|e| format!("the Spark job's output {}: {e}", self.dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "parquet")
                    && !p
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(['.', '_']))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// The schema of the output (its first file's).
    pub fn schema(&self) -> Result<SchemaRef> {
        let first = self.files()?.into_iter().next().ok_or_else(|| {
            format!(
                "the Spark job wrote no Parquet file into {}",
                self.dir.display()
            )
        })?;
        let file = std::fs::File::open(&first)?;
        Ok(ParquetRecordBatchReaderBuilder::try_new(file)?
            .schema()
            .clone())
    }

    /// Every row the application wrote, as batches for `append`.
    pub fn batches(&self) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for path in self.files()? {
            let file = std::fs::File::open(&path)?;
            for batch in ParquetRecordBatchReaderBuilder::try_new(file)?.build()? {
                out.push(batch?);
            }
        }
        Ok(out)
    }
}

/// The peak resident memory of the largest child this process waited for
/// (the driver's JVM, with local executors: `local[N]` runs them in it).
fn children_peak_kib() -> u64 {
    // SAFETY: getrusage writes into the struct it is given and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return 0;
    }
    u64::try_from(usage.ru_maxrss).unwrap_or(0)
}

/// Whether a driver's line names the error: `RuntimeError: ...`,
/// `org.apache.spark.SparkException: ...` at the start of a line (not a
/// stack frame's `at ...` nor a `Caused by:`), the last of which is the
/// step's error.
fn is_telling(line: &str) -> bool {
    let Some((kind, _)) = line.split_once(": ") else {
        return false;
    };
    !kind.is_empty()
        && (kind.ends_with("Error") || kind.ends_with("Exception"))
        && kind
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '$')
}

/// A data file's path as Spark's Hadoop file systems name it.
fn spark_path(path: &str) -> String {
    match path.strip_prefix("s3://") {
        Some(rest) => format!("s3a://{rest}"),
        None if path.starts_with('/') => format!("file://{path}"),
        None => path.to_string(),
    }
}

/// `<pipeline>-<run>-<step>` (`local` for an in-memory run): what the
/// application's name and its staging directory start with.
fn app_name(ctx: &Ctx<'_>) -> String {
    let run = ctx
        .run
        .map_or_else(|| "local".to_string(), |r| r.to_string());
    format!("{}-{run}-{}", ctx.pipeline, ctx.step)
}

/// Where the job file and the output go: `ORCA_SPARK_STAGING` (a
/// directory the driver and every executor reach, for a cluster of several
/// hosts), else the system's temporary directory.
fn staging(ctx: &Ctx<'_>) -> PathBuf {
    let root = std::env::var_os("ORCA_SPARK_STAGING")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("orca-spark"));
    root.join(format!(
        "{}-{}-{}",
        app_name(ctx),
        ctx.partition.replace(['*', '/'], "all"),
        ctx.attempt
    ))
}

/// Runs a Spark application for this step, to its end; its output is
/// returned for the step to commit. A failure is the step's, with the
/// driver's telling line (its last lines go to the attempt's log).
pub fn submit(ctx: &mut Ctx<'_>, job: Job<'_>) -> Result<Output> {
    let home = std::env::var_os("ORCA_SPARK_HOME")
        .or_else(|| std::env::var_os("SPARK_HOME"))
        .map(PathBuf::from)
        .ok_or(
            "no Spark: set SPARK_HOME (or ORCA_SPARK_HOME) on the runner to a Spark installation",
        )?;
    let master = job
        .master
        .clone()
        .or_else(|| std::env::var("ORCA_SPARK_MASTER").ok())
        .ok_or("no Spark master: give the job one, or set ORCA_SPARK_MASTER on the runner")?;
    let mut inputs = serde_json::Map::new();
    for t in job.reads.iter().copied() {
        let (fresh, snapshot) = pinned(ctx, t)?;
        let files = match snapshot.and_then(|id| fresh.metadata().snapshot_by_id(id).cloned()) {
            Some(s) => orca_lake::table::live_data_files(ctx.io.tables.get()?, &fresh, &s)?,
            None => Vec::new(),
        };
        let paths: Vec<String> = files.iter().map(|f| spark_path(f.file_path())).collect();
        inputs.insert(
            t.dataset().to_string(),
            json!({"snapshot": snapshot, "files": paths}),
        );
    }
    let dir = staging(ctx);
    let output = dir.join("output");
    // A retry starts from nothing: what an earlier attempt wrote is not this one's.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let job_file = dir.join("job.json");
    std::fs::write(
        &job_file,
        serde_json::to_vec_pretty(&json!({
            "pipeline": ctx.pipeline,
            "run": ctx.run,
            "step": ctx.step,
            "partition": ctx.partition,
            "attempt": ctx.attempt,
            "inputs": inputs,
            "output": output,
        }))?,
    )?;
    let name = format!("orca-{}-{}", app_name(ctx), ctx.partition);
    let mut cmd = Command::new(home.join("bin").join("spark-submit"));
    cmd.args([
        "--master",
        &master,
        "--deploy-mode",
        "client",
        "--name",
        &name,
    ]);
    if let Some(c) = &job.class {
        cmd.args(["--class", c]);
    }
    for (k, v) in &job.conf {
        cmd.arg("--conf").arg(format!("{k}={v}"));
    }
    cmd.arg(&job.app)
        .args(&job.args)
        .env("ORCA_SPARK_JOB", &job_file)
        .env("SPARK_HOME", &home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: prctl is async-signal-safe; the closure touches nothing else.
    unsafe {
        cmd.pre_exec(|| {
            // The driver dies with the step's process: a cancelled or
            // killed attempt takes its application with it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    ctx.log(format!(
        "submitting {} to {master} as {name}, reading {}",
        job.app.display(),
        if job.reads.is_empty() {
            "no table".to_string()
        } else {
            job.reads
                .iter()
                .map(|t| t.dataset().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    ));
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "starting {}: {e}",
            home.join("bin").join("spark-submit").display()
        )
    })?;
    let (tx, rx) = mpsc::channel::<(bool, String)>();
    let mut readers = Vec::new();
    for (is_err, pipe) in [
        (
            false,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ),
        (
            true,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn std::io::Read + Send>),
        ),
    ] {
        let Some(pipe) = pipe else { continue };
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(|l| l.ok()) {
                if tx.send((is_err, line)).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    let mut last: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    let mut telling: Option<String> = None;
    for (is_err, line) in rx {
        if is_telling(&line) {
            telling = Some(line.clone());
        }
        // The driver's own output, and Spark's warnings and errors, go to
        // the attempt's log; its INFO chatter only to the failure's tail.
        if !is_err || line.contains(" WARN ") || line.contains(" ERROR ") {
            ctx.log(format!("spark: {line}"));
        }
        if last.len() == LAST_LINES {
            last.pop_front();
        }
        last.push_back(line);
    }
    for r in readers {
        let _ = r.join();
    }
    let status = child.wait()?;
    if !status.success() {
        // The whole tail to the attempt's log; the error itself is one line
        // (a runner shows a failed binary's last line), the most telling.
        for line in &last {
            ctx.log(format!("spark: {line}"));
        }
        let telling = telling
            .or_else(|| last.back().cloned())
            .map(|l| l.trim().to_string())
            .unwrap_or_default();
        return Err(format!("the Spark application {name} failed ({status}): {telling}").into());
    }
    ctx.log(format!(
        "the Spark application {name} finished; its driver's peak memory {} MiB",
        children_peak_kib().div_ceil(1024)
    ));
    Ok(Output { dir: output })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_files_are_named_as_spark_reads_them() {
        assert_eq!(
            spark_path("s3://lake/wh/a.parquet"),
            "s3a://lake/wh/a.parquet"
        );
        assert_eq!(spark_path("/var/wh/a.parquet"), "file:///var/wh/a.parquet");
        assert_eq!(
            spark_path("file:///var/wh/a.parquet"),
            "file:///var/wh/a.parquet"
        );
        assert_eq!(
            spark_path("abfss://lake@acct.dfs.core.windows.net/a.parquet"),
            "abfss://lake@acct.dfs.core.windows.net/a.parquet"
        );
    }

    #[test]
    fn the_telling_line_is_an_error_s_not_a_frame_s() {
        assert!(is_telling(
            "RuntimeError: probe: the Spark job was asked to fail"
        ));
        assert!(is_telling(
            "py4j.protocol.Py4JJavaError: An error occurred while calling z:x."
        ));
        assert!(!is_telling("\tat org.apache.spark.Foo.bar(Foo.scala:1)"));
        assert!(!is_telling(
            "Caused by: org.apache.spark.SparkException: Job aborted"
        ));
        assert!(!is_telling(
            "26/12/05 03:40:12 INFO ShutdownHookManager: Deleting directory"
        ));
        assert!(!is_telling("    raise RuntimeError(\"x\")"));
    }

    #[test]
    fn an_output_is_its_parquet_files_only() {
        let dir = std::env::temp_dir().join(format!("orca-spark-out-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        for f in [
            "part-00001.parquet",
            "part-00000.parquet",
            "_SUCCESS",
            ".part-00000.parquet.crc",
        ] {
            std::fs::write(dir.join(f), b"").expect("file");
        }
        let out = Output { dir: dir.clone() };
        let names: Vec<String> = out
            .files()
            .expect("files")
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().to_string()))
            .collect();
        assert_eq!(names, ["part-00000.parquet", "part-00001.parquet"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
