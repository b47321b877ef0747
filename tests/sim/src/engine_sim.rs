//! The real engine under seeded faults: `orca_engine::attempt::run` itself,
//! in process, against a real control plane (a private database with the
//! `orca` extension: `orca.claim_sync`, `orca.advance_head`), a real store
//! and Parquet destination in a scratch folder, and a **fake source**: a
//! pump that serves an exact-replay stream of numbered records over the
//! engine's real data edge.
//!
//! A seed picks the number of records, chunk sizes, writer lanes and a run
//! of faulty attempts before a clean one: the engine crashing at a point of
//! an epoch (`attempt::Crash`: staged, recorded, HEAD moved, applied), the
//! source dying or failing mid-stream, staged files lost after HEAD moved
//! (recovery must go back to the record before), and zombies: an attempt
//! stalled mid-stream while a newer one claims the sync and runs, then let
//! go (its next step must be fenced). The checks: the final attempt
//! succeeds, the destination holds every record exactly once, nothing stays
//! staged, and every zombie was fenced.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_array::{Array, ArrayRef, FixedSizeBinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use orca_engine::attempt::{self, pg_text, Crash, CrashPoint, EngineError, Options, Outcome};
use orca_engine::frame::{read_frame, write_frame, Frame};
use orca_engine::pump;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{json, Value};

use crate::Rng;

/// A private database with the extension, dropped with the value.
pub struct ControlPlane {
    admin: String,
    name: String,
    pub url: String,
}

impl ControlPlane {
    /// `ORCA_SIM_PG` (default `postgres://postgres@127.0.0.1:5432`) is the
    /// server; the database is made fresh.
    pub fn new() -> Result<ControlPlane, String> {
        let base = std::env::var("ORCA_SIM_PG")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let base = base.trim_end_matches('/').to_string();
        let name = format!("orca_sim_{}", std::process::id());
        let admin = format!("{base}/postgres");
        let pg = |e: postgres::Error| pg_text(&e);
        let mut c = postgres::Client::connect(&admin, postgres::NoTls).map_err(pg)?;
        // One statement each: DROP and CREATE DATABASE refuse a transaction.
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .map_err(pg)?;
        c.batch_execute(&format!("CREATE DATABASE {name}"))
            .map_err(pg)?;
        let url = format!("{base}/{name}");
        let mut db = postgres::Client::connect(&url, postgres::NoTls).map_err(pg)?;
        db.batch_execute("CREATE EXTENSION orca").map_err(pg)?;
        // The simulation's sources and destinations are on this machine:
        // netguard lets its org reach loopback and the temporary directory.
        let tmp = std::fs::canonicalize(std::env::temp_dir()).map_err(|e| e.to_string())?;
        db.execute(
            "SELECT orca.allow('default', '127.0.0.1'), orca.allow('default', $1)",
            &[&tmp.to_string_lossy().trim_end_matches('/')],
        )
        .map_err(pg)?;
        Ok(ControlPlane { admin, name, url })
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// What a seed did.
#[derive(Debug, Default, Clone, Copy)]
pub struct EngineOutcome {
    /// Seeds that merged a table's changes (effectively once); the others
    /// appended records (exactly once).
    pub merges: u32,
    pub records: u64,
    pub attempts: u32,
    pub crashes: u32,
    pub source_failures: u32,
    pub zombies_fenced: u32,
    pub rewinds: u32,
}

/// How the fake source misbehaves in one attempt.
#[derive(Default)]
struct Misbehave {
    /// Closes the edge before sending chunk k.
    die_before: Option<u32>,
    /// Sends an error frame before chunk k.
    fail_before: Option<u32>,
    /// Stalls before chunk k: says so on the first channel, then waits for
    /// the second.
    stall_before: Option<(u32, Sender<()>, Receiver<()>)>,
}

/// What the fake source serves.
#[derive(Clone)]
enum Stream {
    /// Records 1..=n as JSON lines records `{"id": n}` (a files source,
    /// raw), record n at position `n`.
    Records(u64),
    /// A table's changes in cursor order: version i (from 0) sets row `id`
    /// to `v` at cursor `at` = i + 1 (a Postgres table source, typed
    /// columns `id`, `v`, `at`), at position `[at, id]`.
    Changes(Arc<Vec<(i64, i64)>>),
}

impl Stream {
    fn len(&self) -> u64 {
        match self {
            Stream::Records(n) => *n,
            Stream::Changes(c) => c.len() as u64,
        }
    }

    /// Items `from+1..=last` as a batch on the edge, and the resume point
    /// after them.
    fn chunk(&self, from: u64, last: u64) -> Result<(RecordBatch, Vec<String>), String> {
        match self {
            Stream::Records(_) => {
                let ids: Vec<u64> = (from + 1..=last).collect();
                let positions: Vec<String> = ids.iter().map(u64::to_string).collect();
                let records: Vec<String> =
                    ids.iter().map(|i| json!({"id": i}).to_string()).collect();
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(StringArray::from(positions)),
                    Arc::new(StringArray::from(records)),
                    Arc::new(StringArray::from(vec![None::<&str>; ids.len()])),
                ];
                let batch = RecordBatch::try_new(Arc::new(pump::raw_schema()), columns)
                    .map_err(|e| e.to_string())?;
                Ok((batch, vec![last.to_string()]))
            }
            Stream::Changes(c) => {
                let part = &c[from as usize..last as usize];
                let at: Vec<i64> = (from as i64 + 1..=last as i64).collect();
                // Ids as a table's reader makes them: 16 bytes, here of
                // the change's place and key.
                let ids = FixedSizeBinaryArray::try_from_iter(
                    part.iter()
                        .zip(&at)
                        .map(|((id, _), at)| orca_engine::ids::bytes(*at as u64, *id as u64)),
                )
                .map_err(|e| e.to_string())?;
                let schema = Schema::new(vec![
                    Field::new("id", DataType::Int64, true),
                    Field::new("v", DataType::Int64, true),
                    Field::new("at", DataType::Int64, true),
                    orca_engine::ids::IdForm::Bytes.field(),
                ]);
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(Int64Array::from_iter_values(part.iter().map(|p| p.0))),
                    Arc::new(Int64Array::from_iter_values(part.iter().map(|p| p.1))),
                    Arc::new(Int64Array::from(at)),
                    Arc::new(ids),
                ];
                let batch =
                    RecordBatch::try_new(Arc::new(schema), columns).map_err(|e| e.to_string())?;
                let last_id = part.last().map_or(0, |p| p.0);
                Ok((batch, vec![last.to_string(), last_id.to_string()]))
            }
        }
    }
}

/// The fake source: serves `stream` in chunks of 1..=max_chunk items;
/// exact replay from the plan's resume point.
fn fake_pump(
    edge: PathBuf,
    stream: Stream,
    max_chunk: u64,
    seed: u64,
    misbehave: Misbehave,
) -> JoinHandle<Result<u32, String>> {
    std::thread::spawn(move || {
        let gone = AtomicBool::new(false);
        let conn =
            pump::connect(&edge, Duration::from_secs(30), &gone).map_err(|e| e.to_string())?;
        let mut input = std::io::BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
        let mut out = std::io::BufWriter::new(conn);
        let (first, plan) = loop {
            match read_frame(&mut input) {
                // The table's catalog is the real one (the rows are not).
                Ok(Some(Frame::Describe { request })) => {
                    let tables = pump::describe(&request).map_err(|e| e.to_string())?;
                    write_frame(&mut out, &Frame::Catalog { tables }).map_err(|e| e.to_string())?;
                    std::io::Write::flush(&mut out).map_err(|e| e.to_string())?;
                }
                Ok(Some(Frame::Open { first_epoch, plan })) => break (first_epoch, plan),
                // The engine went before it opened the edge.
                _ => return Ok(0),
            }
        };
        let mut from: u64 = match &plan["start"][0]["after"] {
            Value::Array(p) => p
                .first()
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("resume point {p:?} is not a record number"))?,
            _ => 0,
        };
        let mut rng = Rng::new(seed);
        let mut k = 0u32;
        let rows = stream.len();
        loop {
            if from >= rows {
                let _ = write_frame(
                    &mut out,
                    &Frame::End {
                        stream: 0,
                        bytes: 0,
                    },
                );
                let _ = std::io::Write::flush(&mut out);
                return Ok(k);
            }
            if misbehave.die_before == Some(k) {
                return Ok(k);
            }
            if misbehave.fail_before == Some(k) {
                let _ = write_frame(
                    &mut out,
                    &Frame::Error {
                        stream: 0,
                        reason: "sim: the source failed".into(),
                    },
                );
                let _ = std::io::Write::flush(&mut out);
                return Ok(k);
            }
            if let Some((at, said, go)) = &misbehave.stall_before {
                if *at == k {
                    let _ = said.send(());
                    let _ = go.recv();
                }
            }
            let last = (from + 1 + rng.below(max_chunk)).min(rows);
            let (batch, position) = stream.chunk(from, last)?;
            let epoch = first + k;
            let sent = write_frame(
                &mut out,
                &Frame::Batch {
                    stream: 0,
                    epoch,
                    batch,
                },
            )
            .and_then(|()| {
                write_frame(
                    &mut out,
                    &Frame::Barrier {
                        stream: 0,
                        epoch,
                        position,
                    },
                )
            })
            .and_then(|()| std::io::Write::flush(&mut out).map_err(Into::into));
            if sent.is_err() {
                // The engine is gone (crashed, fenced): so is its source.
                return Ok(k);
            }
            from = last;
            k += 1;
        }
    })
}

/// One seed's world: a sync of its own in the shared control plane.
struct World<'a> {
    cp: &'a ControlPlane,
    dir: PathBuf,
    sync: String,
    stream: Stream,
    max_chunk: u64,
    lanes: usize,
    attempts: u32,
    trace: Vec<String>,
}

impl World<'_> {
    fn options(&self, crash: Option<Crash>) -> Options {
        Options {
            database_url: self.cp.url.clone(),
            org: "default".into(),
            sync: self.sync.clone(),
            store_url: self.dir.join("store").display().to_string(),
            batch_rows: Some(self.max_chunk as usize),
            lanes: Some(self.lanes),
            lease: None,
            control: None,
            edge: Some(self.dir.join(format!("edge-{}.sock", self.attempts))),
            crash,
        }
    }

    /// Starts an attempt's source and returns it with the attempt's
    /// options.
    fn start(
        &mut self,
        seed: u64,
        crash: Option<Crash>,
        misbehave: Misbehave,
    ) -> (Options, JoinHandle<Result<u32, String>>) {
        self.attempts += 1;
        let opts = self.options(crash);
        let edge = opts.edge.clone().unwrap_or_default();
        let pump = fake_pump(
            edge,
            self.stream.clone(),
            self.max_chunk,
            seed ^ (u64::from(self.attempts) << 32),
            misbehave,
        );
        (opts, pump)
    }

    fn say(&mut self, line: String) {
        self.trace.push(line);
    }

    fn head(&self) -> Result<i64, String> {
        let mut c =
            postgres::Client::connect(&self.cp.url, postgres::NoTls).map_err(|e| e.to_string())?;
        c.query_one(
            "SELECT head_epoch FROM orca.syncs WHERE name = $1",
            &[&self.sync],
        )
        .map(|r| r.get(0))
        .map_err(|e| e.to_string())
    }

    fn fail(&self, what: String) -> String {
        format!("{what}\ntrace:\n  {}", self.trace.join("\n  "))
    }
}

fn describe(r: &Result<Outcome, EngineError>) -> String {
    match r {
        Ok(o) => format!(
            "ok g{} {} epochs {}..{} rows {}",
            o.generation, o.recovery, o.from_epoch, o.to_epoch, o.rows
        ),
        Err(e) => format!("error: {e}"),
    }
}

/// Counts an attempt that went back to the record before HEAD's.
fn rewound(out: &mut EngineOutcome, r: &Result<Outcome, EngineError>) {
    if r.as_ref().is_ok_and(|o| o.recovery.starts_with("rewind")) {
        out.rewinds += 1;
    }
}

/// Runs one seed.
pub fn run(cp: &ControlPlane, seed: u64) -> Result<EngineOutcome, String> {
    let mut rng = Rng::new(seed ^ 0x005e_ede9);
    let dir = std::env::temp_dir().join(format!("orca-sim-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let sync = format!("sim{seed}");
    let mut c = postgres::Client::connect(&cp.url, postgres::NoTls).map_err(|e| e.to_string())?;
    // Half the seeds append numbered records from files into Parquet
    // (exactly once); the other half merge a table's changes into Postgres
    // by primary key (effectively once: the final rows must be right).
    let merge = rng.chance(50);
    let (stream, source, destination, streams, delivery) = if merge {
        let keys = 1 + rng.below(40) as i64;
        let changes: Vec<(i64, i64)> = (0..1 + rng.below(240))
            .map(|_| {
                (
                    1 + rng.below(keys as u64) as i64,
                    rng.below(1_000_000) as i64,
                )
            })
            .collect();
        // The engine asks the source's catalog for the table's columns;
        // the rows come from the fake source.
        c.batch_execute(&format!(
            "CREATE TABLE public.{sync}_src (id bigint PRIMARY KEY, v bigint NOT NULL, at bigint NOT NULL)"
        ))
        .map_err(|e| pg_text(&e))?;
        (
            Stream::Changes(Arc::new(changes)),
            json!({"type": "postgres", "url": cp.url}),
            json!({"type": "postgres", "url": cp.url, "schema": sync}),
            json!([{"name": "s", "table": format!("public.{sync}_src"), "cursor": "at",
                    "primary_key": ["id"], "mode": "merge"}]),
            "effectively_once",
        )
    } else {
        (
            Stream::Records(1 + rng.below(240)),
            json!({"type": "files", "format": "jsonl", "url": dir.join("in").display().to_string()}),
            json!({"type": "parquet", "url": dir.join("out").display().to_string()}),
            json!([{"name": "s", "pattern": "*.jsonl"}]),
            "exactly_once",
        )
    };
    let mut w = World {
        cp,
        sync,
        stream,
        max_chunk: 1 + rng.below(60),
        lanes: 1 + rng.below(2) as usize,
        attempts: 0,
        trace: Vec::new(),
        dir,
    };
    c.execute(
        "SELECT orca.create_sync($1, $2, $3, $4, NULL, $5)",
        &[&w.sync, &source, &destination, &streams, &delivery],
    )
    .map_err(|e| pg_text(&e))?;
    let (items, max_chunk, lanes) = (w.stream.len(), w.max_chunk, w.lanes);
    w.say(format!(
        "seed {seed}: {items} {}, chunks of 1..={max_chunk}, {lanes} lanes",
        if merge {
            "changes merged into postgres"
        } else {
            "records into parquet"
        }
    ));
    let mut out = EngineOutcome {
        merges: u32::from(merge),
        records: w.stream.len(),
        ..EngineOutcome::default()
    };
    for _ in 0..rng.below(5) {
        let head = w.head()?.max(0) as u64;
        match rng.below(5) {
            0 => {
                let at = [
                    CrashPoint::Staged,
                    CrashPoint::Recorded,
                    CrashPoint::HeadMoved,
                    CrashPoint::Applied,
                ][rng.below(4) as usize];
                let crash = Crash {
                    at,
                    epoch: head + 1 + rng.below(4),
                };
                let (opts, pump) = w.start(seed, Some(crash), Misbehave::default());
                let r = attempt::run(&opts);
                rewound(&mut out, &r);
                let _ = pump.join();
                w.say(format!("crash {crash:?}: {}", describe(&r)));
                match r {
                    Err(EngineError::Crashed { .. }) => out.crashes += 1,
                    // The source ran out before the crash's epoch.
                    Ok(_) => {}
                    Err(e) => return Err(w.fail(format!("a crash attempt failed otherwise: {e}"))),
                }
            }
            kind @ (1 | 2) => {
                let k = rng.below(4) as u32;
                let misbehave = if kind == 1 {
                    Misbehave {
                        die_before: Some(k),
                        ..Misbehave::default()
                    }
                } else {
                    Misbehave {
                        fail_before: Some(k),
                        ..Misbehave::default()
                    }
                };
                let (opts, pump) = w.start(seed, None, misbehave);
                let r = attempt::run(&opts);
                rewound(&mut out, &r);
                let _ = pump.join();
                let what = if kind == 1 { "dies" } else { "fails" };
                w.say(format!("source {what} before chunk {k}: {}", describe(&r)));
                match r {
                    Err(EngineError::Reader { reason, .. })
                        if reason.contains("closed the edge")
                            || reason.contains("sim: the source failed") =>
                    {
                        out.source_failures += 1
                    }
                    Ok(_) => {}
                    Err(e) => return Err(w.fail(format!("a failing source ended otherwise: {e}"))),
                }
            }
            3 => {
                let k = 1 + rng.below(3) as u32;
                let (said_tx, said_rx) = channel();
                let (go_tx, go_rx) = channel();
                let (opts, pump) = w.start(
                    seed,
                    None,
                    Misbehave {
                        stall_before: Some((k, said_tx, go_rx)),
                        ..Misbehave::default()
                    },
                );
                let zombie = std::thread::spawn(move || attempt::run(&opts));
                if said_rx.recv_timeout(Duration::from_secs(60)).is_err() {
                    // The source ran out before the stall.
                    let r = zombie
                        .join()
                        .map_err(|_| "the attempt panicked".to_string())?;
                    let _ = pump.join();
                    w.say(format!("no stall before chunk {k}: {}", describe(&r)));
                    continue;
                }
                w.say(format!("g? stalls before chunk {k}; a newer attempt runs"));
                let crash = rng.chance(50).then(|| Crash {
                    at: CrashPoint::HeadMoved,
                    epoch: head + k as u64 + 1 + rng.below(3),
                });
                let (opts, newer_pump) = w.start(seed, crash, Misbehave::default());
                let newer = attempt::run(&opts);
                rewound(&mut out, &newer);
                let _ = newer_pump.join();
                w.say(format!("newer ({crash:?}): {}", describe(&newer)));
                if let Err(e) = &newer {
                    if !matches!(e, EngineError::Crashed { .. }) {
                        return Err(w.fail(format!("the newer attempt failed: {e}")));
                    }
                }
                let _ = go_tx.send(());
                let r = zombie
                    .join()
                    .map_err(|_| "the zombie panicked".to_string())?;
                let _ = pump.join();
                w.say(format!("zombie let go: {}", describe(&r)));
                match r {
                    Err(EngineError::Fenced { .. }) => out.zombies_fenced += 1,
                    other => {
                        return Err(w.fail(format!("a zombie was not fenced: {}", describe(&other))))
                    }
                }
            }
            _ => {
                // HEAD moves, then the epoch's staged files are lost.
                let crash = Crash {
                    at: CrashPoint::HeadMoved,
                    epoch: head + 1,
                };
                let (opts, pump) = w.start(seed, Some(crash), Misbehave::default());
                let r = attempt::run(&opts);
                rewound(&mut out, &r);
                let _ = pump.join();
                let staging = w.dir.join(format!("store/default/{}/_staging", w.sync));
                let lost = std::fs::remove_dir_all(&staging).is_ok();
                w.say(format!("staged files lost ({lost}) after {}", describe(&r)));
            }
        }
    }
    // The clean attempt.
    let (opts, pump) = w.start(seed, None, Misbehave::default());
    let r = attempt::run(&opts);
    rewound(&mut out, &r);
    let _ = pump.join();
    w.say(format!("clean: {}", describe(&r)));
    if let Err(e) = &r {
        return Err(w.fail(format!("the clean attempt failed: {e}")));
    }
    out.attempts = w.attempts;
    match &w.stream {
        Stream::Records(n) => check(&w, *n),
        Stream::Changes(changes) => check_merged(&mut c, &w.sync, changes),
    }
    .and_then(|()| nothing_staged(&w))
    .map_err(|e| w.fail(e))?;
    let _ = std::fs::remove_dir_all(&w.dir);
    Ok(out)
}

/// The destination table holds exactly each key's last version.
fn check_merged(
    c: &mut postgres::Client,
    sync: &str,
    changes: &[(i64, i64)],
) -> Result<(), String> {
    let mut want = std::collections::BTreeMap::new();
    for (at, (id, v)) in changes.iter().enumerate() {
        want.insert(*id, (*v, at as i64 + 1));
    }
    let got: std::collections::BTreeMap<i64, (i64, i64)> = c
        .query(&format!("SELECT id, v, at FROM {sync}.s ORDER BY id"), &[])
        .map_err(|e| pg_text(&e))?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    if got != want {
        let wrong: Vec<_> = want
            .iter()
            .filter(|(k, v)| got.get(k) != Some(v))
            .take(5)
            .map(|(k, v)| format!("id {k}: want {v:?}, got {:?}", got.get(k)))
            .collect();
        return Err(format!(
            "the merged table holds {} rows for {} keys; {wrong:?}",
            got.len(),
            want.len()
        ));
    }
    Ok(())
}

/// Every record once in the published files.
fn check(w: &World, rows: u64) -> Result<(), String> {
    let mut ids = Vec::new();
    let mut orca_ids = std::collections::HashSet::new();
    for f in files(&w.dir.join("out/s")) {
        let file = std::fs::File::open(&f).map_err(|e| e.to_string())?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| format!("{}: {e}", f.display()))?;
        for b in reader {
            let b = b.map_err(|e| e.to_string())?;
            let id = b
                .column_by_name("id")
                .and_then(|c| c.as_any().downcast_ref::<Int64Array>())
                .ok_or("no id column")?;
            let oid = b
                .column_by_name("_orca_id")
                .and_then(|c| c.as_any().downcast_ref::<FixedSizeBinaryArray>())
                .ok_or("no _orca_id column of 16 bytes")?;
            for i in 0..b.num_rows() {
                ids.push(id.value(i));
                orca_ids.insert(oid.value(i).to_vec());
            }
        }
    }
    ids.sort_unstable();
    let want: Vec<i64> = (1..=rows as i64).collect();
    if ids != want {
        let dup = ids.windows(2).find(|p| p[0] == p[1]).map(|p| p[0]);
        return Err(format!(
            "the destination holds {} rows for {} records (first duplicate: {dup:?})",
            ids.len(),
            rows
        ));
    }
    if orca_ids.len() != ids.len() {
        return Err(format!(
            "{} _orca_ids for {} rows",
            orca_ids.len(),
            ids.len()
        ));
    }
    Ok(())
}

/// Nothing stays staged once the clean attempt ended.
fn nothing_staged(w: &World) -> Result<(), String> {
    let staged = files(&w.dir.join(format!("store/default/{}/_staging", w.sync)));
    if staged.is_empty() {
        Ok(())
    } else {
        Err(format!("staged files left: {staged:?}"))
    }
}

/// The Parquet files under a folder, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else if p.extension().is_some_and(|x| x == "parquet") {
            out.push(p);
        }
    }
    out.sort();
    out
}
