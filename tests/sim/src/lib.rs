//! A simulation of the sync commit protocol: the engine's real coordinator
//! (`orca_engine::protocol`) and recovery decisions (`orca_engine::recovery`)
//! driven against **fake** parts — an exact-replay source, a staging area, a
//! checkpoint log, HEAD with its generation (what `orca.syncs` and
//! `orca.advance_head` keep), and a stage-and-apply destination with stream
//! markers and a fence. A seed picks batch sizes, lane order, crashes at each
//! step of the protocol, lost staged files and zombie attempts; the check is
//! that every record lands exactly once.
//!
//! This part checks the protocol's decisions and their order, fast enough
//! for tens of thousands of seeds; [`engine_sim`] runs the real engine's
//! attempts (in process, over its data edge, with a real control plane and
//! store) under seeded faults.

pub mod engine_sim;

use std::collections::{BTreeMap, BTreeSet};

use orca_engine::protocol::{Action, Committable, Coordinator, Positions};
use orca_engine::recovery::{decide, HeadState, Recovery};

/// xorshift64*: small, seeded, the same everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const STREAM: &str = "s";
const LANES: usize = 2;

/// The checkpoint record of an epoch.
#[derive(Clone, Debug)]
struct Record {
    committables: Vec<Committable>,
    /// Where the source resumes after this epoch.
    position: u64,
    /// The record before it in the log (what a rewind goes back to).
    prev: Option<String>,
}

/// HEAD and the generation, as the control plane keeps them.
#[derive(Default, Debug)]
struct Head {
    generation: u64,
    epoch: u64,
    record: Option<String>,
}

#[derive(Debug, PartialEq)]
enum Refused {
    Fenced,
    OutOfOrder,
}

impl Head {
    fn claim(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }
    fn advance(&mut self, generation: u64, epoch: u64, record: &str) -> Result<(), Refused> {
        if generation != self.generation {
            return Err(Refused::Fenced);
        }
        if epoch != self.epoch + 1 {
            return Err(Refused::OutOfOrder);
        }
        self.epoch = epoch;
        self.record = Some(record.to_string());
        Ok(())
    }
}

/// A stage-and-apply destination: staged rows become visible when an epoch
/// is applied, guarded by the stream marker and the fence.
#[derive(Default, Debug)]
struct Destination {
    rows: Vec<u64>,
    marker: u64,
    fence: u64,
}

#[derive(Debug, PartialEq)]
enum CommitError {
    Fenced,
    Lost,
}

#[derive(Default)]
struct World {
    source: Vec<u64>,
    staging: BTreeMap<String, Vec<u64>>,
    log: BTreeMap<String, Record>,
    head: Head,
    dest: Destination,
    acked: u64,
    /// A change stream's slot (`Shape::cdc`): what it confirmed is gone, and
    /// a read from before it starts there, as `START_REPLICATION` does.
    confirmed: u64,
    shape: Shape,
    trace: Vec<String>,
}

/// The kind of source a seed runs against.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Shape {
    /// A replication slot: it forgets what it was told to confirm.
    pub cdc: bool,
    /// The faulty family: the attempt confirms each position as soon as it
    /// read it, not when the protocol acknowledges it. Must lose records.
    pub early_ack: bool,
}

impl World {
    fn apply(&mut self, generation: u64, epoch: u64, record: &Record) -> Result<(), CommitError> {
        if generation < self.dest.fence {
            return Err(CommitError::Fenced);
        }
        if epoch <= self.dest.marker {
            return Ok(()); // Already applied: a commit is idempotent.
        }
        let mut rows: Vec<u64> = Vec::new();
        for c in &record.committables {
            rows.extend(
                self.staging
                    .get(&c.payload)
                    .ok_or(CommitError::Lost)?
                    .iter()
                    .copied(),
            );
        }
        self.dest.rows.extend(rows);
        self.dest.marker = epoch;
        Ok(())
    }

    fn head_record(&self) -> Option<Record> {
        self.head
            .record
            .as_ref()
            .and_then(|r| self.log.get(r))
            .cloned()
    }
}

/// Where an attempt may die.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Point {
    BeforeRecord,
    BeforeHead,
    BeforeCommit,
    AfterCommit,
}

/// What a dead attempt would do next if it were still running: a zombie's
/// next step, which must be refused.
#[derive(Debug)]
enum Pending {
    Head {
        generation: u64,
        epoch: u64,
        name: String,
    },
    Commit {
        generation: u64,
        epoch: u64,
        record: Record,
    },
}

struct Attempt<'a> {
    w: &'a mut World,
    rng: &'a mut Rng,
    generation: u64,
    crash_percent: u64,
    pending: Option<Pending>,
    /// The last record of the log as this attempt knows it.
    last_record: Option<String>,
}

impl Attempt<'_> {
    fn crash(&mut self, at: Point) -> bool {
        if self.rng.chance(self.crash_percent) {
            self.w
                .trace
                .push(format!("g{} crashes {at:?}", self.generation));
            return true;
        }
        false
    }

    /// Runs until the source is exhausted and everything is committed
    /// (`Ok(true)`), or until it crashes or is fenced (`Ok(false)`).
    fn run(&mut self) -> Result<bool, String> {
        let g = self.generation;
        self.w.dest.fence = self.w.dest.fence.max(g);
        let head = self.w.head.epoch;
        let record = self.w.head_record();
        let state = HeadState {
            epoch: head,
            streams: vec![STREAM.to_string()],
            markers: [(STREAM.to_string(), self.w.dest.marker)]
                .into_iter()
                .filter(|(_, m)| *m > 0)
                .collect(),
            committables_available: record.as_ref().is_some_and(|r| {
                r.committables
                    .iter()
                    .all(|c| self.w.staging.contains_key(&c.payload))
            }),
        };
        let decision = decide(&state).map_err(|e| format!("recovery refused: {e}"))?;
        self.w
            .trace
            .push(format!("g{g} claims at HEAD {head}: {decision:?}"));
        self.last_record = self.w.head.record.clone();
        let mut position = match (&decision, &record) {
            (Recovery::Resume { .. }, Some(r)) => r.position,
            (Recovery::Apply { epoch, .. }, Some(r)) => {
                self.w
                    .apply(g, *epoch, r)
                    .map_err(|e| format!("applying HEAD's epoch {epoch} failed: {e:?}"))?;
                r.position
            }
            (Recovery::Rewind { .. }, Some(r)) => {
                // Back to the preceding record: its epoch's data is read again
                // into the next epoch.
                self.last_record = r.prev.clone();
                match &r.prev {
                    Some(prev) => self
                        .w
                        .log
                        .get(prev)
                        .map(|p| p.position)
                        .ok_or_else(|| format!("the record before HEAD, {prev}, is missing"))?,
                    None => 0,
                }
            }
            (_, None) => 0,
        };
        if self.w.shape.cdc && position < self.w.confirmed {
            self.w.trace.push(format!(
                "g{g} resumes at {position}, the slot starts at {}",
                self.w.confirmed
            ));
            position = self.w.confirmed;
        }
        let mut k = Coordinator::new(LANES, head);
        let mut records: BTreeMap<u64, (String, Record)> = BTreeMap::new();
        let total = self.w.source.len() as u64;
        loop {
            if position < total {
                let take = 1 + self.rng.below(5);
                let end = (position + take).min(total);
                let rows: Vec<u64> = self.w.source[position as usize..end as usize].to_vec();
                let positions: Positions = [(STREAM.to_string(), end.to_string())].into();
                let epoch = k.request_barrier(positions);
                if self.w.shape.early_ack {
                    self.w.confirmed = self.w.confirmed.max(end);
                }
                let mut lanes: Vec<usize> = (0..LANES).collect();
                if self.rng.chance(50) {
                    lanes.reverse();
                }
                let mut actions = Vec::new();
                for lane in lanes {
                    let key = format!("g{g}-e{epoch}-l{lane}");
                    let mine: Vec<u64> = rows
                        .iter()
                        .copied()
                        .filter(|r| (*r as usize) % LANES == lane)
                        .collect();
                    self.w.staging.insert(key.clone(), mine);
                    actions.extend(
                        k.pre_committed(epoch, Committable { lane, payload: key })
                            .map_err(|e| e.to_string())?,
                    );
                }
                records.insert(
                    epoch,
                    (
                        format!("g{g}-r{epoch}"),
                        Record {
                            committables: Vec::new(),
                            position: end,
                            prev: None,
                        },
                    ),
                );
                position = end;
                if !self.carry_out(&mut k, &mut records, actions)? {
                    return Ok(false);
                }
            } else if k.last_committed() == self.w.head.epoch {
                return Ok(true);
            } else {
                return Err(format!(
                    "g{g} read everything but HEAD is at {} and lane 0 committed {}",
                    self.w.head.epoch,
                    k.last_committed()
                ));
            }
        }
    }

    /// Carries out the coordinator's actions; `Ok(false)` when the attempt
    /// dies or is fenced on the way.
    fn carry_out(
        &mut self,
        k: &mut Coordinator,
        records: &mut BTreeMap<u64, (String, Record)>,
        mut actions: Vec<Action>,
    ) -> Result<bool, String> {
        let g = self.generation;
        while !actions.is_empty() {
            let action = actions.remove(0);
            match action {
                Action::WriteRecord {
                    epoch,
                    committables,
                    positions,
                } => {
                    if self.crash(Point::BeforeRecord) {
                        return Ok(false);
                    }
                    let (name, rec) = records
                        .get_mut(&epoch)
                        .ok_or_else(|| format!("record {epoch} was never started"))?;
                    rec.committables = committables;
                    rec.prev = self.last_record.replace(name.clone());
                    let at: u64 = positions
                        .get(STREAM)
                        .and_then(|p| p.parse().ok())
                        .unwrap_or(0);
                    if at != rec.position {
                        return Err(format!(
                            "record {epoch} resumes at {at}, read up to {}",
                            rec.position
                        ));
                    }
                    self.w.log.insert(name.clone(), rec.clone());
                    if self.crash(Point::BeforeHead) {
                        self.pending = Some(Pending::Head {
                            generation: g,
                            epoch,
                            name: name.clone(),
                        });
                        return Ok(false);
                    }
                    match self.w.head.advance(g, epoch, name) {
                        Ok(()) => {}
                        Err(Refused::Fenced) => return Ok(false),
                        Err(Refused::OutOfOrder) => {
                            return Err(format!("g{g} moved HEAD to {epoch} out of order"))
                        }
                    }
                    self.w.trace.push(format!("g{g} HEAD -> {epoch}"));
                    actions.extend(k.head_moved(epoch).map_err(|e| e.to_string())?);
                }
                Action::Commit { epoch } => {
                    let rec = records
                        .get(&epoch)
                        .map(|(_, r)| r.clone())
                        .ok_or_else(|| format!("commit of unknown epoch {epoch}"))?;
                    if self.crash(Point::BeforeCommit) {
                        self.pending = Some(Pending::Commit {
                            generation: g,
                            epoch,
                            record: rec,
                        });
                        return Ok(false);
                    }
                    match self.w.apply(g, epoch, &rec) {
                        Ok(()) => {}
                        Err(CommitError::Fenced) => return Ok(false),
                        Err(CommitError::Lost) => {
                            return Err(format!("g{g} lost its own staged files of epoch {epoch}"))
                        }
                    }
                    self.w.trace.push(format!("g{g} committed {epoch}"));
                    if self.crash(Point::AfterCommit) {
                        return Ok(false);
                    }
                    actions.extend(k.committed(epoch).map_err(|e| e.to_string())?);
                }
                Action::Acknowledge { epoch, positions } => {
                    let at: u64 = positions
                        .get(STREAM)
                        .and_then(|p| p.parse().ok())
                        .unwrap_or(0);
                    if epoch >= self.w.dest.marker {
                        return Err(format!(
                            "acknowledged epoch {epoch} while only {} is visible",
                            self.w.dest.marker
                        ));
                    }
                    self.w.acked = self.w.acked.max(at);
                    if self.w.shape.cdc {
                        self.w.confirmed = self.w.confirmed.max(at);
                    }
                }
            }
        }
        Ok(true)
    }
}

/// What a run of one seed did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub attempts: u64,
    pub zombies_refused: u64,
    pub rewinds: u64,
}

/// Runs one seed; an error carries the reason and the trace.
pub fn run(seed: u64) -> Result<Outcome, String> {
    run_shaped(seed, Shape::default())
}

/// Runs one seed against a source of the given shape.
pub fn run_shaped(seed: u64, shape: Shape) -> Result<Outcome, String> {
    let mut rng = Rng::new(seed);
    let n = 1 + rng.below(60);
    let mut w = World {
        source: (0..n).collect(),
        shape,
        ..World::default()
    };
    let crash_percent = rng.below(25);
    let mut out = Outcome::default();
    let mut zombie: Option<Pending> = None;
    let result = (|| -> Result<(), String> {
        for i in 0.. {
            if i > 200 {
                return Err("no attempt finished in 200 tries".into());
            }
            // Between attempts, staged files of unapplied epochs may vanish.
            if rng.chance(10) {
                let marker = w.dest.marker;
                let gone: Vec<String> = w
                    .staging
                    .keys()
                    .filter(|k| {
                        k.split("-e")
                            .nth(1)
                            .and_then(|e| e.split('-').next())
                            .and_then(|e| e.parse::<u64>().ok())
                            .is_some_and(|e| e > marker)
                    })
                    .cloned()
                    .collect();
                for k in &gone {
                    w.staging.remove(k);
                }
                if !gone.is_empty() {
                    w.trace.push(format!("staged files lost: {gone:?}"));
                }
            }
            let generation = w.head.claim();
            out.attempts += 1;
            // The previous attempt, not dead after all, takes its next step.
            if let Some(z) = zombie.take() {
                match z {
                    Pending::Head {
                        generation: zg,
                        epoch,
                        name,
                    } => {
                        if w.head.advance(zg, epoch, &name) != Err(Refused::Fenced) {
                            return Err(format!("zombie g{zg} moved HEAD to {epoch}"));
                        }
                    }
                    Pending::Commit {
                        generation: zg,
                        epoch,
                        record,
                    } => {
                        w.dest.fence = w.dest.fence.max(generation);
                        if w.apply(zg, epoch, &record) != Err(CommitError::Fenced) {
                            return Err(format!("zombie g{zg} committed epoch {epoch}"));
                        }
                    }
                }
                out.zombies_refused += 1;
                w.trace.push("zombie refused".into());
            }
            let last = i >= 20;
            let mut a = Attempt {
                w: &mut w,
                rng: &mut rng,
                generation,
                crash_percent: if last { 0 } else { crash_percent },
                pending: None,
                last_record: None,
            };
            let done = a.run()?;
            let pending = a.pending.take();
            if w.trace.iter().rev().take(3).any(|t| t.contains("Rewind")) {
                out.rewinds += 1;
            }
            if done {
                return Ok(());
            }
            zombie = pending.filter(|_| rng.chance(50));
        }
        Ok(())
    })();
    let check = result.and_then(|()| {
        let mut got = w.dest.rows.clone();
        got.sort_unstable();
        let want: Vec<u64> = (0..n).collect();
        if got != want {
            let seen: BTreeSet<u64> = w.dest.rows.iter().copied().collect();
            let lost: Vec<u64> = want.iter().copied().filter(|r| !seen.contains(r)).collect();
            return Err(format!(
                "the destination holds {} rows for {n} records (lost {lost:?}, duplicated {})",
                w.dest.rows.len(),
                w.dest.rows.len() + lost.len() - n as usize
            ));
        }
        if w.acked > n {
            return Err(format!("acknowledged position {} past the source", w.acked));
        }
        Ok(())
    });
    check
        .map(|()| out)
        .map_err(|e| format!("seed {seed}: {e}\ntrace:\n  {}", w.trace.join("\n  ")))
}
