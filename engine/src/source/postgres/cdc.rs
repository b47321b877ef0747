//! The Postgres change-data-capture source: every insert, update and delete
//! of a sync's tables, in commit order, from a logical replication slot the
//! sync owns (`pgoutput`, through `pgwire-replication`).
//!
//! One thread reads for every stream of the sync, since one slot carries
//! all their tables, and hands each stream a chunk per round (an empty one
//! when the round brought it nothing), so barrier N is the same point of
//! the change stream for every stream.
//!
//! A stream's resume point is where it stands in that stream:
//! - `["snapshot", L]`, `["snapshot", L, key...]`: its table's first read,
//!   after the row with that key; the changes after LSN `L` follow it;
//! - `["lsn", L]`: every transaction that committed before `L` is delivered;
//! - `["snapshot+", L, windows, key...]`, `["lsn+", L, windows]`: the same,
//!   with the [`Window`]s of a snapshot read in parts (JSON).
//!
//! The first attempt creates the slot with an exported snapshot and reads
//! each table in that snapshot, so the table's rows and the changes after
//! the slot's consistent point meet without a gap or an overlap. A
//! snapshot cut short by a crash, or a stream new to the sync, is read
//! (after its last key) in the exported snapshot of a temporary slot made
//! for it, at a later point L2. Under `REPLICA IDENTITY FULL` that part is
//! made to stand for the table at the stream's own point L (as_of.rs: the
//! keys that changed between are read as their first change's old row),
//! and every change after L follows. Otherwise those rows already show the
//! changes that committed before L2, so the change stream skips the
//! changes of their keys up to L2 (a window): no change is seen twice, but
//! a change log gets the later part's rows as they were at L2.
//!
//! An attempt reads up to the end of the WAL as it was when it started (a
//! logical message it writes marks the point) and ends there; replay from
//! a committed position returns the same transactions, so the source is
//! exact. What the slot may forget (its confirmed flush LSN) moves only
//! when the protocol acknowledges an epoch, one behind the committed one:
//! the attempt sets [`Acks`], and the thread passes it upstream.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{ArrayRef, StringArray};
use pgwire_replication::{ReplicationClient, ReplicationConfig, ReplicationEvent};

use orca_core::sync::SchemaPolicy;

use crate::netguard::{Guard, ReplicationTarget};
use crate::source::error::ReadError;
use crate::source::postgres::copy::{CopyReader, PgKind, TextRows};
use crate::source::postgres::pgoutput::{decode, Lsn, Message, RelColumn, Value};
use crate::source::postgres::table::{PgTable, CDC_COLUMNS};
use crate::source::readers::{Msg, Reader, Shape};
use crate::util::quote_ident;

mod as_of;
mod gauge;

pub use gauge::{SlotGauge, SlotReading};

/// The LSN up to which the source may tell the slot it can forget, as the
/// commit protocol acknowledged it (0: nothing yet).
pub type Acks = Arc<AtomicU64>;

/// Session settings that make the stream's text values the forms
/// [`TextRows`] reads.
const SESSION: &str =
    "-c DateStyle=ISO,YMD -c TimeZone=UTC -c extra_float_digits=3 -c bytea_output=hex";

/// How often the reader looks at the acknowledged position while it waits
/// for the change stream.
const POLL: Duration = Duration::from_millis(200);

/// A part of a table's snapshot read as of a later point than the slot's:
/// the rows after `after` (every row: None), up to where the next window
/// begins, were read in a snapshot at `lsn`, so the changes of their keys
/// that committed before `lsn` are in them already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub lsn: Lsn,
    pub after: Option<Vec<String>>,
}

/// A resume point's windows as its third value holds them.
fn windows_text(windows: &[Window]) -> String {
    serde_json::Value::Array(
        windows
            .iter()
            .map(|w| serde_json::json!([w.lsn.to_string(), w.after]))
            .collect(),
    )
    .to_string()
}

fn windows_parse(text: &str) -> Option<Vec<Window>> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v.as_array()?
        .iter()
        .map(|w| {
            let lsn = Lsn::parse(w.get(0)?.as_str()?)?;
            let after = match w.get(1)? {
                serde_json::Value::Null => None,
                a => Some(serde_json::from_value(a.clone()).ok()?),
            };
            Some(Window { lsn, after })
        })
        .collect()
}

/// A resume point with its windows (`["lsn+", L, windows]` and
/// `["snapshot+", L, windows, key...]`; plain points have none).
pub fn parse_resume(stream: &str, v: &[String]) -> Result<(Position, Vec<Window>), ReadError> {
    match v.first().map(String::as_str) {
        Some(kind @ ("lsn+" | "snapshot+")) if v.len() >= 3 => {
            let windows = windows_parse(&v[2]).ok_or_else(|| ReadError::Stream {
                stream: stream.to_string(),
                reason: format!("resume point {v:?} has no windows it can read"),
            })?;
            let mut plain = vec![kind.trim_end_matches('+').to_string(), v[1].clone()];
            plain.extend(v[3..].iter().cloned());
            Ok((Position::parse(stream, &plain)?, windows))
        }
        _ => Ok((Position::parse(stream, v)?, Vec::new())),
    }
}

/// A resume point as recorded: the position, with the windows that still
/// matter (a window's changes end once the stream passed its point).
pub fn resume_point(pos: &Position, windows: &[Window]) -> Vec<String> {
    let live = match pos {
        Position::Stream(at) => live_windows(windows, *at),
        Position::Snapshot { .. } => windows,
    };
    let mut v = pos.to_vec();
    if !live.is_empty() {
        v[0].push('+');
        v.insert(2, windows_text(live));
    }
    v
}

/// The windows that still matter once the stream stands at `at`. A window
/// ends where the next begins, so only the first may go once the stream
/// has passed its point: were a later one to go first (a part read as of
/// an earlier point than the one before it), the one before would reach
/// over its keys.
fn live_windows(windows: &[Window], at: Lsn) -> &[Window] {
    let gone = windows.iter().take_while(|w| w.lsn <= at).count();
    &windows[gone..]
}

/// Where a stream stands in the change stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    Snapshot {
        lsn: Lsn,
        after: Option<Vec<String>>,
    },
    Stream(Lsn),
}

impl Position {
    pub fn parse(stream: &str, v: &[String]) -> Result<Position, ReadError> {
        let bad = || ReadError::Stream {
            stream: stream.to_string(),
            reason: format!(
                "resume point {v:?} is not a change stream's (\"snapshot\" or \"lsn\" and an LSN)"
            ),
        };
        let lsn = v.get(1).and_then(|l| Lsn::parse(l)).ok_or_else(bad)?;
        match v.first().map(String::as_str) {
            Some("lsn") if v.len() == 2 => Ok(Position::Stream(lsn)),
            Some("snapshot") => Ok(Position::Snapshot {
                lsn,
                after: (v.len() > 2).then(|| v[2..].to_vec()),
            }),
            _ => Err(bad()),
        }
    }

    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Position::Stream(l) => vec!["lsn".into(), l.to_string()],
            Position::Snapshot { lsn, after } => {
                let mut v = vec!["snapshot".into(), lsn.to_string()];
                v.extend(after.iter().flatten().cloned());
                v
            }
        }
    }

    /// The LSN the changes after this point start from.
    pub fn lsn(&self) -> Lsn {
        match self {
            Position::Snapshot { lsn, .. } | Position::Stream(lsn) => *lsn,
        }
    }
}

/// The LSN a resume point, as the commit protocol records it (its values
/// joined by U+001F), lets the slot forget up to.
pub fn acknowledged_lsn(recorded: &str) -> Option<Lsn> {
    let mut parts = recorded.split('\u{1f}');
    match (parts.next(), parts.next()) {
        (Some("lsn" | "snapshot" | "lsn+" | "snapshot+"), Some(l)) => Lsn::parse(l),
        _ => None,
    }
}

/// The lowest LSN among acknowledged resume points: every stream of a
/// change stream shares the slot, so the slot may forget only up to it.
/// None when one of them is not a change stream's point.
pub fn lowest_acknowledged<'a>(recorded: impl IntoIterator<Item = &'a str>) -> Option<Lsn> {
    recorded
        .into_iter()
        .map(acknowledged_lsn)
        .collect::<Option<Vec<Lsn>>>()?
        .into_iter()
        .min()
}

/// One stream's side of the reader.
struct Out {
    table: PgTable,
    tx: SyncSender<Result<Msg, ReadError>>,
    pos: Position,
    rows: TextRows,
    ids: Vec<String>,
    /// The relation columns it last saw, by name (a drop is told from an
    /// older change by a column it saw before).
    seen: Vec<String>,
    /// The parts of its snapshot read later than the slot's point, in key
    /// order.
    windows: Vec<Window>,
    /// Its key columns' collations, once a window or a part as of its
    /// point needs them.
    collations: Option<Vec<Option<String>>>,
}

impl Out {
    fn name(&self) -> &str {
        &self.table.spec.name
    }

    /// The table's own columns (the change stream's extra two left out).
    fn source_columns(
        &self,
    ) -> impl Iterator<Item = (usize, &crate::source::postgres::copy::PgColumn)> {
        self.table
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| !CDC_COLUMNS.contains(&c.name.as_str()))
    }

    /// Whether it reads `table` (`schema.name`).
    fn reads(&self, table: &str) -> bool {
        qualified(&self.table.spec.table) == qualified(table)
    }

    /// Where each of its columns is in a relation's tuples (None: a column
    /// the description lacks), once per description rather than per row.
    fn places(&self, columns: &[RelColumn]) -> Vec<Option<usize>> {
        self.source_columns()
            .map(|(_, c)| columns.iter().position(|r| r.name == c.name))
            .collect()
    }

    /// Its key columns' collations, read once.
    fn collations(
        &mut self,
        client: &mut postgres::Client,
    ) -> Result<Vec<Option<String>>, ReadError> {
        if self.collations.is_none() {
            self.collations = Some(self.key_collations(client)?);
        }
        Ok(self.collations.clone().unwrap_or_default())
    }

    /// Sends what this round brought (maybe nothing) up to the stream's
    /// position; false once the attempt stopped listening.
    fn send(&mut self) -> bool {
        let rows = self.rows.pending();
        let arrays = self.rows.take();
        let ids: ArrayRef = Arc::new(StringArray::from(std::mem::take(&mut self.ids)));
        if let Position::Stream(at) = self.pos {
            let gone = self.windows.len() - live_windows(&self.windows, at).len();
            self.windows.drain(..gone);
        }
        let msg = Msg::Chunk {
            arrays,
            ids,
            last: resume_point(&self.pos, &self.windows),
            rows,
        };
        self.tx.send(Ok(msg)).is_ok()
    }

    /// Takes a part of its snapshot read as of `lsn` after `after`. A part
    /// that begins where the last one did replaces it: nothing of that
    /// one was committed.
    fn read_from(&mut self, lsn: Lsn, after: Option<Vec<String>>) {
        if self.windows.last().is_some_and(|w| w.after == after) {
            self.windows.pop();
        }
        self.windows.push(Window { lsn, after });
    }

    fn end(&self) {
        let _ = self.tx.send(Ok(Msg::End { bytes: 0 }));
    }
}

/// What a change stream's transaction holds for the streams: rows in
/// commit order.
struct Change {
    out: usize,
    values: Vec<Option<String>>,
    deleted: bool,
}

/// Starts the source's reader thread: a reader per stream, in `streams`'
/// order, each from its resume point (none: its first read), and the
/// acknowledgement cell the attempt moves.
pub(crate) fn spawn_cdc(
    guard: Guard,
    url: String,
    slot: String,
    streams: Vec<(PgTable, Option<Vec<String>>)>,
    batch_rows: usize,
    continuous: Option<Duration>,
    gauge: Option<&SlotGauge>,
) -> Result<(Vec<Reader>, Acks), ReadError> {
    let acks: Acks = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::with_capacity(streams.len());
    let mut outs = Vec::with_capacity(streams.len());
    for (t, start) in streams {
        let (pos, windows) = match start {
            Some(s) => {
                let (p, w) = parse_resume(&t.spec.name, &s)?;
                (Some(p), w)
            }
            None => (None, Vec::new()),
        };
        let (tx, rx): (_, Receiver<Result<Msg, ReadError>>) = sync_channel(1);
        readers.push(Reader {
            name: t.spec.name.clone(),
            shape: Shape::Table(t.clone()),
            rx,
            handle: None,
            done: false,
        });
        let source: Vec<_> = t.columns.clone();
        outs.push((
            Out {
                rows: TextRows::new(source),
                table: t,
                tx,
                pos: Position::Stream(Lsn(0)),
                ids: Vec::new(),
                seen: Vec::new(),
                windows,
                collations: None,
            },
            pos,
        ));
    }
    let ack = acks.clone();
    let read_done = Arc::new(AtomicBool::new(false));
    if let Some(gauge) = gauge {
        gauge::watch(
            guard.clone(),
            url.clone(),
            slot.clone(),
            gauge,
            read_done.clone(),
        )
        .map_err(|e| ReadError::Cdc(format!("starting its slot gauge: {e}")))?;
    }
    // Set when the reading thread ends, or was never started.
    let ended = SetOnDrop(read_done);
    let handle = std::thread::Builder::new()
        .name("read-cdc".into())
        .spawn(move || {
            let _ended = ended;
            let (mut outs, starts): (Vec<Out>, Vec<Option<Position>>) = outs.into_iter().unzip();
            let r = Cdc {
                guard,
                url,
                slot,
                batch_rows,
                ack,
                continuous,
            }
            .run(&mut outs, starts);
            if let Err(e) = r {
                let text = e.to_string();
                for o in &outs {
                    // A restart stays one: the attempt hands itself back.
                    let each = match &e {
                        ReadError::Restart(why) => ReadError::Restart(why.clone()),
                        _ => ReadError::Stream {
                            stream: o.name().to_string(),
                            reason: text.clone(),
                        },
                    };
                    let _ = o.tx.send(Err(each));
                }
            }
        })
        .map_err(|e| ReadError::Cdc(format!("starting its thread: {e}")))?;
    if let Some(first) = readers.first_mut() {
        first.handle = Some(handle);
    }
    Ok((readers, acks))
}

/// Sets its flag when dropped: the reading thread ended, however it ended.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct Cdc {
    guard: Guard,
    url: String,
    slot: String,
    batch_rows: usize,
    ack: Acks,
    /// A continuous sync's epoch interval: the stream goes on, a round at
    /// least this often, instead of ending at the WAL's end.
    continuous: Option<Duration>,
}

/// Tries `f` for up to 10 s: the session of an attempt that died may hold
/// a slot (the sync's, or its temporary one) for a moment.
fn while_a_dead_session_lets_go<T>(
    mut f: impl FnMut() -> Result<T, ReadError>,
) -> Result<T, ReadError> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match f() {
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(200)),
            done => return done,
        }
    }
}

/// How often an attempt ends the session that holds its slot before it
/// gives up.
const TAKE_OVER_TRIES: u32 = 5;

/// The session that holds a slot, from the server's refusal to stream from
/// it ("replication slot \"x\" is active for PID 123").
fn slot_holder(error: &str) -> Option<i32> {
    let (_, rest) = error.split_once("is active for PID ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn cdc(reason: impl std::fmt::Display) -> ReadError {
    ReadError::Cdc(reason.to_string())
}

fn text(v: &Option<bytes::Bytes>) -> String {
    v.as_ref()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

impl Cdc {
    fn run(&self, outs: &mut [Out], starts: Vec<Option<Position>>) -> Result<(), ReadError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| cdc(format!("starting its runtime: {e}")))?;
        let target = self.guard.replication(&self.url)?;
        let mut client = self.guard.postgres(&self.url)?;
        self.publish(&mut client, outs)?;
        let confirmed = self.slot_position(&mut client)?;
        let fresh = starts.iter().all(Option::is_none);
        if confirmed.is_none() && !fresh {
            return Err(cdc(format!(
                "replication slot {} is gone: the changes since the last committed epoch are \
                 lost; drop and create the sync again (a new snapshot)",
                self.slot
            )));
        }
        let (base, exported, gate) = match confirmed {
            Some(_) if !fresh => (None, None, None),
            // A slot no committed epoch depends on (an attempt that died
            // before its first commit made it) is made again, so that the
            // first read is the exported snapshot's.
            found => {
                if found.is_some() {
                    self.drop_slot(&mut client)?;
                }
                let (lsn, snapshot, gate) = self.exporting_slot(&rt, &target, &self.slot, false)?;
                (Some(lsn), Some(snapshot), Some(gate))
            }
        };
        // Where each stream starts: its own point, or (a stream new to the
        // sync, or every stream the first time) a snapshot before the point
        // the other streams stand at.
        let shared = starts
            .iter()
            .flatten()
            .map(Position::lsn)
            .min()
            .or(base)
            .or(confirmed)
            .unwrap_or_default();
        for (o, s) in outs.iter_mut().zip(starts) {
            o.pos = s.unwrap_or(Position::Snapshot {
                lsn: base.unwrap_or(shared),
                after: None,
            });
        }
        if !self.snapshot(&rt, &target, &mut client, outs, exported.as_deref())? {
            return Ok(());
        }
        drop(gate);
        self.stream(&rt, &target, &mut client, outs, confirmed.or(base))
    }

    /// Makes the sync's publication hold every stream's table.
    fn publish(&self, client: &mut postgres::Client, outs: &[Out]) -> Result<(), ReadError> {
        let have: Option<Vec<String>> = client
            .query_opt(
                "SELECT coalesce((SELECT array_agg(t.schemaname || '.' || t.tablename)
                                  FROM pg_publication_tables t WHERE t.pubname = p.pubname), '{}')
                 FROM pg_publication p WHERE p.pubname = $1",
                &[&self.slot],
            )?
            .map(|r| r.get(0));
        let mut tables: Vec<String> = outs
            .iter()
            .map(|o| qualified(&o.table.spec.table))
            .collect();
        tables.sort();
        tables.dedup();
        match have {
            None => {
                client.batch_execute(&format!(
                    "CREATE PUBLICATION {} FOR TABLE {}",
                    quote_ident(&self.slot),
                    tables.join(", ")
                ))?;
            }
            Some(have) => {
                let have: Vec<String> = have.iter().map(|t| qualified(t)).collect();
                let missing: Vec<&String> = tables.iter().filter(|t| !have.contains(t)).collect();
                if !missing.is_empty() {
                    client.batch_execute(&format!(
                        "ALTER PUBLICATION {} ADD TABLE {}",
                        quote_ident(&self.slot),
                        missing
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))?;
                }
            }
        }
        Ok(())
    }

    /// The slot's confirmed flush LSN, if the slot exists.
    fn slot_position(&self, client: &mut postgres::Client) -> Result<Option<Lsn>, ReadError> {
        let row = client.query_opt(
            "SELECT confirmed_flush_lsn::text, plugin::text, database::text = current_database()
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&self.slot],
        )?;
        let Some(row) = row else { return Ok(None) };
        let (lsn, plugin, here): (Option<String>, Option<String>, Option<bool>) =
            (row.get(0), row.get(1), row.get(2));
        if plugin.as_deref() != Some("pgoutput") || here != Some(true) {
            return Err(cdc(format!(
                "replication slot {} exists but is not a pgoutput slot of this database",
                self.slot
            )));
        }
        Ok(lsn.as_deref().and_then(Lsn::parse))
    }

    /// Ends the session `pid` if it is the one holding this sync's slot
    /// (and no other).
    fn end_holder(&self, client: &mut postgres::Client, pid: i32) -> Result<(), ReadError> {
        let ended: Option<bool> = client
            .query_opt(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
                 WHERE slot_name = $1 AND active_pid = $2",
                &[&self.slot, &pid],
            )
            .map_err(|e| {
                cdc(format!(
                    "slot {} is held by session {pid} (an earlier attempt's, fenced) and it \
                     could not be ended: {e} (grant this role pg_signal_backend, or end it)",
                    self.slot
                ))
            })?
            .map(|r| r.get(0));
        eprintln!(
            "orca-engine: slot {} was held by session {pid}, an earlier attempt's: {}",
            self.slot,
            match ended {
                Some(true) => "ended it",
                Some(false) => "it could not be ended",
                None => "it has let go",
            }
        );
        Ok(())
    }

    fn drop_slot(&self, client: &mut postgres::Client) -> Result<(), ReadError> {
        while_a_dead_session_lets_go(|| {
            client
                .execute("SELECT pg_drop_replication_slot($1)", &[&self.slot])
                .map(|_| ())
                .map_err(ReadError::from)
        })
    }

    fn config(&self, target: &ReplicationTarget) -> ReplicationConfig {
        ReplicationConfig::new(
            target.host.clone(),
            target.user.clone(),
            target.password.clone(),
            target.database.clone(),
            self.slot.clone(),
            self.slot.clone(),
        )
        .with_port(target.port)
        .with_tls(target.tls.clone())
        .with_options(SESSION)
        .with_application_name(format!("orca {}", self.slot))
    }

    /// A slot made on a replication session of its own, with the snapshot
    /// its consistent point stands for (valid while the session lives); a
    /// temporary one goes with the session.
    fn exporting_slot(
        &self,
        rt: &tokio::runtime::Runtime,
        target: &ReplicationTarget,
        name: &str,
        temporary: bool,
    ) -> Result<(Lsn, String, ReplicationClient), ReadError> {
        let repl = |e: pgwire_replication::PgWireError| {
            let why = if temporary {
                " (a snapshot read after the slot's own, resumed or of a new stream, needs \
                 one more replication slot and WAL sender while it reads: \
                 max_replication_slots, max_wal_senders)"
            } else {
                ""
            };
            cdc(format!("replication session for slot {name}: {e}{why}"))
        };
        rt.block_on(async {
            let mut gate = ReplicationClient::connect_gated(self.config(target))
                .await
                .map_err(repl)?;
            let rows = gate
                .simple_query(&format!(
                    "CREATE_REPLICATION_SLOT {}{} LOGICAL pgoutput (SNAPSHOT 'export')",
                    quote_ident(name),
                    if temporary { " TEMPORARY" } else { "" }
                ))
                .await
                .map_err(repl)?;
            let row = rows
                .first()
                .ok_or_else(|| cdc("CREATE_REPLICATION_SLOT returned no row"))?;
            let lsn = row
                .get(1)
                .map(text)
                .and_then(|l| Lsn::parse(&l))
                .ok_or_else(|| cdc("CREATE_REPLICATION_SLOT returned no consistent point"))?;
            let snapshot = row.get(2).map(text).unwrap_or_default();
            Ok((lsn, snapshot, gate))
        })
    }

    /// Reads the tables of the streams still in their snapshot, one after
    /// the other, in one snapshot; each round one stream's chunk and the
    /// others' empty ones. False once the attempt stopped listening.
    fn snapshot(
        &self,
        rt: &tokio::runtime::Runtime,
        target: &ReplicationTarget,
        client: &mut postgres::Client,
        outs: &mut [Out],
        exported: Option<&str>,
    ) -> Result<bool, ReadError> {
        if !outs
            .iter()
            .any(|o| matches!(o.pos, Position::Snapshot { .. }))
        {
            return Ok(true);
        }
        // Not the slot's own snapshot (a snapshot resumed, a stream new to
        // the sync): a temporary slot's, whose point the rows read in it
        // stand for; its session stays until they are read.
        let (later, _gate) = match exported {
            Some(_) => (None, None),
            None => {
                // Slot names are at most 63 characters.
                let name = format!("{}_read", &self.slot[..self.slot.len().min(58)]);
                let (lsn, snapshot, gate) =
                    while_a_dead_session_lets_go(|| self.exporting_slot(rt, target, &name, true))?;
                (Some((lsn, snapshot)), Some(gate))
            }
        };
        // Under REPLICA IDENTITY FULL a later part is read as of the
        // stream's own point (as_of.rs); otherwise it is a window.
        let as_of = match &later {
            Some((at, _)) => self.as_of(client, outs, *at)?,
            None => Vec::new(),
        };
        let mut tx = client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        let snapshot = exported.or(later.as_ref().map(|(_, s)| s.as_str()));
        if let Some(name) = snapshot.filter(|n| !n.is_empty()) {
            tx.batch_execute(&format!(
                "SET TRANSACTION SNAPSHOT '{}'",
                name.replace('\'', "")
            ))?;
        }
        for i in 0..outs.len() {
            let Position::Snapshot { lsn, after } = outs[i].pos.clone() else {
                continue;
            };
            let t = outs[i].table.clone();
            // The rows carry the point they stand for.
            let query = match (&later, as_of.get(i).and_then(Option::as_ref)) {
                (Some(_), Some(part)) => {
                    // It ends the window an earlier part's began.
                    if !outs[i].windows.is_empty() {
                        outs[i].read_from(lsn, after.clone());
                    }
                    t.copy_query_as_of(
                        after.as_deref(),
                        lsn.0,
                        &part.changed,
                        &part.rows,
                        &part.collate,
                    )?
                }
                (Some((at, _)), None) => {
                    outs[i].read_from(*at, after.clone());
                    t.copy_query_at(after.as_deref(), at.0)?
                }
                (None, _) => t.copy_query_at(after.as_deref(), lsn.0)?,
            };
            let stream = t.spec.name.clone();
            let copy = |source| ReadError::Copy {
                stream: stream.clone(),
                source,
            };
            let input = tx.copy_out(query.as_str())?;
            let mut r = CopyReader::new(input, t.columns.clone())
                .map_err(copy)?
                .with_ids(&stream, &t.key);
            loop {
                let more = r.read_row().map_err(copy)?;
                if r.pending() > 0 && (!more || r.pending() >= self.batch_rows) {
                    let rows = r.pending();
                    let ids = r.take_ids().ok_or_else(|| cdc("no record ids"))?;
                    let arrays = r.take();
                    let key = t.position_at(&arrays, rows - 1)?;
                    outs[i].pos = Position::Snapshot {
                        lsn,
                        after: Some(key),
                    };
                    let msg = Msg::Chunk {
                        arrays,
                        ids,
                        // With its windows: a later attempt skips by them.
                        last: resume_point(&outs[i].pos, &outs[i].windows),
                        rows,
                    };
                    if outs[i].tx.send(Ok(msg)).is_err() {
                        return Ok(false);
                    }
                    for (j, o) in outs.iter_mut().enumerate() {
                        if j != i && !o.send() {
                            return Ok(false);
                        }
                    }
                }
                if !more {
                    break;
                }
            }
            outs[i].pos = Position::Stream(lsn);
        }
        tx.commit()?;
        Ok(true)
    }

    /// Streams the changes after the streams' point up to the WAL's end as
    /// the attempt found it, then ends every stream.
    fn stream(
        &self,
        rt: &tokio::runtime::Runtime,
        target: &ReplicationTarget,
        client: &mut postgres::Client,
        outs: &mut [Out],
        confirmed: Option<Lsn>,
    ) -> Result<(), ReadError> {
        let from = outs.iter().map(|o| o.pos.lsn()).min().unwrap_or_default();
        let prefix = format!("orca.stop.{}", self.slot);
        // A logical message marks where the attempt stops, or (continuous)
        // each epoch's end: a point of the stream every transaction before
        // which has come through.
        let mark = |client: &mut postgres::Client, what: &str| -> Result<Lsn, ReadError> {
            let at: String = client
                .query_one(
                    "SELECT pg_logical_emit_message(false, $1, $2)::text",
                    &[&prefix, &what],
                )?
                .get(0);
            Lsn::parse(&at).ok_or_else(|| cdc(format!("message LSN {at}")))
        };
        let stop = match self.continuous {
            Some(_) => Lsn(u64::MAX),
            None => mark(client, "end of an attempt")?,
        };
        let mut next_epoch = self.continuous.map(|every| Instant::now() + every);
        let cfg = self
            .config(target)
            .with_start_lsn(pgwire_replication::Lsn::from_u64(from.0))
            // Where the streams start is HEAD's committed epoch (recovery
            // ran before the plan came): the slot may forget up to there.
            .with_ack_lsn(pgwire_replication::Lsn::from_u64(
                confirmed.map_or(from, |c| c.max(from)).0,
            ))
            .with_status_interval(Duration::from_millis(500))
            .with_wakeup_interval(Duration::from_secs(1))
            // Only for `feedback_pending_since`: the end waits for the last
            // acknowledgement to reach the server.
            .with_feedback_observer(pgwire_replication::FeedbackObserver::new(|_| {}));
        let repl_err = |e: pgwire_replication::PgWireError| {
            cdc(format!("replication from slot {}: {e}", self.slot))
        };
        let mut repl = rt
            .block_on(ReplicationClient::connect(cfg.clone()))
            .map_err(repl_err)?;
        // Sessions of this attempt's stream whose start found the slot held.
        let mut took_over = 0u32;
        let mut streaming = false;
        let mut acked = 0u64;
        let mut rels: BTreeMap<u32, Relation> = BTreeMap::new();
        let mut txn: Vec<Change> = Vec::new();
        let mut pending = 0usize;
        let mut last = from;
        let result = loop {
            let a = self.ack.load(Ordering::Acquire);
            if a > acked {
                repl.update_applied_lsn(pgwire_replication::Lsn::from_u64(a));
                acked = a;
            }
            if let (Some(due), Some(every)) = (next_epoch, self.continuous) {
                if Instant::now() >= due {
                    mark(client, "end of an epoch")?;
                    next_epoch = Some(Instant::now() + every);
                }
            }
            let ev = match rt.block_on(async { tokio::time::timeout(POLL, repl.recv()).await }) {
                Err(_) => continue,
                Ok(Err(e)) => {
                    // The slot is still read by an earlier attempt of this
                    // sync: one cut off from its runner, fenced since this
                    // attempt claimed the sync, so that it can commit (and
                    // acknowledge) nothing more. Its session is ended and
                    // the stream starts again; nothing was read yet.
                    match slot_holder(&e.to_string()) {
                        Some(pid) if !streaming && took_over < TAKE_OVER_TRIES => {
                            self.end_holder(client, pid)?;
                            took_over += 1;
                            std::thread::sleep(Duration::from_millis(200));
                            repl = rt
                                .block_on(ReplicationClient::connect(cfg.clone()))
                                .map_err(repl_err)?;
                            continue;
                        }
                        _ => break Err(repl_err(e)),
                    }
                }
                Ok(Ok(None)) => {
                    break Err(cdc("the replication session ended before its stop point"))
                }
                Ok(Ok(Some(ev))) => {
                    streaming = true;
                    ev
                }
            };
            match ev {
                ReplicationEvent::Begin { .. } => txn.clear(),
                ReplicationEvent::XLogData { data, .. } => {
                    match self.change(&decode(&data).map_err(cdc)?, outs, &mut rels, &mut txn)? {
                        Step::Go => {}
                        // The next attempt reads the table's new shape and
                        // resumes at this transaction; a continuous one
                        // asks its runner for that attempt now, spending no
                        // retry of its run.
                        Step::Evolve(why) if self.continuous.is_some() => {
                            break Err(ReadError::Restart(format!(
                                "{why}: the attempt ends before it, and the next reads it"
                            )));
                        }
                        Step::Evolve(why) => {
                            eprintln!("orca-engine: {why}: the attempt ends before it");
                            txn.clear();
                            break Ok(last);
                        }
                    }
                }
                ReplicationEvent::Commit { end_lsn, .. } => {
                    let end = Lsn(end_lsn.as_u64());
                    if end > from {
                        pending += txn.len();
                        self.apply(client, end, std::mem::take(&mut txn), outs)?;
                        last = last.max(end);
                        if pending >= self.batch_rows {
                            pending = 0;
                            if !round(outs, last) {
                                return Ok(());
                            }
                        }
                    }
                    txn.clear();
                }
                ReplicationEvent::Message { prefix: p, lsn, .. } if p == prefix => {
                    let at = Lsn(lsn.as_u64());
                    if at >= stop {
                        break Ok(last.max(at));
                    }
                    if self.continuous.is_some() && at > from {
                        pending = 0;
                        last = last.max(at);
                        if !round(outs, last) {
                            return Ok(());
                        }
                    }
                }
                _ => {}
            }
        };
        let end = result?;
        let a = self.ack.load(Ordering::Acquire);
        if a > acked {
            repl.update_applied_lsn(pgwire_replication::Lsn::from_u64(a));
        }
        // The acknowledged position goes upstream before the session ends
        // (within a status interval), or the slot keeps WAL it could free.
        let until = Instant::now() + Duration::from_secs(2);
        while repl.feedback_pending_since().is_some() && Instant::now() < until {
            rt.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
        }
        repl.stop();
        let _ =
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(2), repl.join()).await });
        if (end > from || pending > 0) && !round(outs, end) {
            return Ok(());
        }
        for o in outs.iter() {
            o.end();
        }
        Ok(())
    }

    /// Takes one message of a transaction in.
    fn change(
        &self,
        m: &Message,
        outs: &mut [Out],
        rels: &mut BTreeMap<u32, Relation>,
        txn: &mut Vec<Change>,
    ) -> Result<Step, ReadError> {
        match m {
            Message::Relation {
                id,
                namespace,
                name,
                columns,
                ..
            } => {
                let table = format!("{namespace}.{name}");
                let mut rel = Relation {
                    table: table.clone(),
                    outs: Vec::new(),
                };
                for (i, o) in outs.iter_mut().enumerate() {
                    if !o.reads(&table) {
                        continue;
                    }
                    if let Some(why) = o.fit(columns)? {
                        return Ok(Step::Evolve(why));
                    }
                    rel.outs.push((i, o.places(columns)));
                }
                rels.insert(*id, rel);
            }
            Message::Insert { rel, new } => {
                let r = described(rels, *rel)?;
                for (i, at) in &r.outs {
                    txn.push(outs[*i].row(*i, &r.table, at, new, None, false)?);
                }
            }
            Message::Update { rel, old, new } => {
                let r = described(rels, *rel)?;
                for (i, at) in &r.outs {
                    let (i, o) = (*i, &outs[*i]);
                    if let Some(old) = old {
                        let before = o.row(i, &r.table, at, old, None, true)?;
                        let after = o.row(i, &r.table, at, new, Some(old), false)?;
                        // The key changed: the old key's row is gone.
                        if o.key_of(&before) != o.key_of(&after) {
                            txn.push(before);
                        }
                        txn.push(after);
                    } else {
                        txn.push(o.row(i, &r.table, at, new, None, false)?);
                    }
                }
            }
            Message::Delete { rel, old } => {
                let r = described(rels, *rel)?;
                for (i, at) in &r.outs {
                    txn.push(outs[*i].row(*i, &r.table, at, old, None, true)?);
                }
            }
            Message::Truncate { rels: truncated } => {
                let names: Vec<&str> = truncated
                    .iter()
                    .filter_map(|r| rels.get(r))
                    .filter(|r| !r.outs.is_empty())
                    .map(|r| r.table.as_str())
                    .collect();
                if !names.is_empty() {
                    // Truncates are not replicated (docs/syncs.md): the
                    // destination keeps its rows until a backfill.
                    eprintln!(
                        "orca-engine: TRUNCATE of {} is not replicated; the destination keeps \
                         its rows (run a backfill of the stream to match the source)",
                        names.join(", ")
                    );
                }
            }
            Message::Other(_) => {}
        }
        Ok(Step::Go)
    }

    /// A committed transaction's rows, into each stream's round.
    fn apply(
        &self,
        client: &mut postgres::Client,
        end: Lsn,
        txn: Vec<Change>,
        outs: &mut [Out],
    ) -> Result<(), ReadError> {
        let lsn = (end.0 as i64).to_string();
        let skip = shown_already(client, outs, end, &txn)?;
        for (n, c) in txn.into_iter().enumerate() {
            if skip[n] {
                continue;
            }
            let o = &mut outs[c.out];
            let mut values: Vec<Option<&str>> = c.values.iter().map(|v| v.as_deref()).collect();
            values.push(Some(if c.deleted { "t" } else { "f" }));
            values.push(Some(&lsn));
            o.rows.push(&values).map_err(|source| ReadError::Copy {
                stream: o.name().to_string(),
                source,
            })?;
            o.ids.push(crate::ids::text(end.0, n as u64));
            o.pos = Position::Stream(end);
        }
        Ok(())
    }
}

/// Every stream's round up to `at`; false once the attempt stopped
/// listening.
fn round(outs: &mut [Out], at: Lsn) -> bool {
    for o in outs.iter_mut() {
        o.pos = Position::Stream(at);
        if !o.send() {
            return false;
        }
    }
    true
}

/// Which changes of a transaction that committed at `end` a snapshot's
/// window already shows: those of keys read in a window at a later point.
/// Which window a key falls in is the database's call (its comparison of
/// the key's type, as the snapshot's `WHERE key > after` made it).
fn shown_already(
    client: &mut postgres::Client,
    outs: &mut [Out],
    end: Lsn,
    txn: &[Change],
) -> Result<Vec<bool>, ReadError> {
    let mut skip = vec![false; txn.len()];
    for (oi, o) in outs.iter_mut().enumerate() {
        if !o.windows.iter().any(|w| end <= w.lsn) {
            continue;
        }
        let mine: Vec<usize> = (0..txn.len()).filter(|&n| txn[n].out == oi).collect();
        if mine.is_empty() {
            continue;
        }
        let mut inside: Vec<Option<usize>> = vec![None; mine.len()];
        for j in 0..o.windows.len() {
            let above: Vec<usize> = match o.windows[j].after.clone() {
                None => (0..mine.len()).collect(),
                Some(after) => o.above(client, &after, mine.iter().map(|&n| &txn[n]))?,
            };
            for a in above {
                inside[a] = Some(j);
            }
        }
        for (k, &n) in mine.iter().enumerate() {
            skip[n] = inside[k].is_some_and(|j| end <= o.windows[j].lsn);
        }
    }
    Ok(skip)
}

enum Step {
    Go,
    /// The table changed shape in a way the stream's policy follows: the
    /// attempt ends before this transaction.
    Evolve(String),
}

/// A relation as the change stream described it, and the streams that read
/// its table, each with the tuple position of each of its columns (None: a
/// column the change predates).
struct Relation {
    table: String,
    outs: Vec<(usize, Vec<Option<usize>>)>,
}

/// The relation a change names; pgoutput describes one before its first
/// change in a session.
fn described(rels: &BTreeMap<u32, Relation>, rel: u32) -> Result<&Relation, ReadError> {
    rels.get(&rel)
        .ok_or_else(|| cdc(format!("a change of relation {rel} before its description")))
}

impl Out {
    /// Checks a relation's columns against the stream's table: a new column
    /// or a changed type under `evolve` ends the attempt (the next one reads
    /// the new shape), under `discard` a new column is left out, under
    /// `freeze` either is an error; a column that was there and is gone is
    /// always an error.
    fn fit(&mut self, columns: &[RelColumn]) -> Result<Option<String>, ReadError> {
        let policy = self.table.spec.schema_policy;
        let stream = self.name().to_string();
        let table = self.table.spec.table.clone();
        let err = |reason: String| ReadError::Stream {
            stream: stream.clone(),
            reason,
        };
        let names: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
        if let Some(gone) = self.seen.iter().find(|c| !names.contains(c)) {
            return Err(err(format!(
                "column {gone} of {table} was dropped or renamed; the stream stops here (its \
                 resume point stays before the change)"
            )));
        }
        for c in columns {
            let have = self.source_columns().find(|(_, t)| t.name == c.name);
            let Some((i, col)) = have else {
                match policy {
                    SchemaPolicy::Discard => continue,
                    SchemaPolicy::Evolve => {
                        return Ok(Some(format!("{table} has a new column {}", c.name)));
                    }
                    SchemaPolicy::Freeze => {
                        return Err(err(format!(
                            "{table} has a new column {} and the stream's schema policy is freeze",
                            c.name
                        )))
                    }
                }
            };
            let kind = if self.table.as_text[i] {
                None
            } else {
                Some(col.kind)
            };
            if PgKind::of(c.type_oid, c.typmod) != kind {
                if policy == SchemaPolicy::Evolve {
                    return Ok(Some(format!(
                        "column {} of {table} changed its type",
                        c.name
                    )));
                }
                return Err(err(format!(
                    "column {} of {table} changed its type and the stream's schema policy is \
                     {}",
                    c.name,
                    policy.name()
                )));
            }
        }
        self.seen = names;
        Ok(None)
    }

    /// A change's row: the table's columns from the tuple (a column the
    /// change predates is null; an unchanged TOASTed value comes from the
    /// old row, when the replica identity is full).
    fn row(
        &self,
        out: usize,
        table: &str,
        at: &[Option<usize>],
        tuple: &[Value],
        old: Option<&Vec<Value>>,
        deleted: bool,
    ) -> Result<Change, ReadError> {
        let mut values = Vec::with_capacity(at.len());
        for ((_, col), j) in self.source_columns().zip(at) {
            let v = match j.and_then(|j| tuple.get(j).map(|v| (j, v))) {
                None | Some((_, Value::Null)) => None,
                Some((_, Value::Text(t))) => Some(t.clone()),
                Some((j, Value::Unchanged)) => match old.and_then(|o| o.get(j)) {
                    Some(Value::Text(t)) => Some(t.clone()),
                    Some(Value::Null) => None,
                    _ => {
                        return Err(ReadError::Stream {
                            stream: self.name().to_string(),
                            reason: format!(
                                "an update left the TOASTed value of column {} of {} out of the \
                                 change stream; ALTER TABLE {} REPLICA IDENTITY FULL makes it \
                                 send the whole row",
                                col.name, table, self.table.spec.table
                            ),
                        })
                    }
                },
            };
            values.push(v);
        }
        Ok(Change {
            out,
            values,
            deleted,
        })
    }

    /// Which of `changes` (by their place in it) have a key after `after`,
    /// in the key's order as the database compares it.
    fn above<'a>(
        &mut self,
        client: &mut postgres::Client,
        after: &[String],
        changes: impl Iterator<Item = &'a Change>,
    ) -> Result<Vec<usize>, ReadError> {
        use crate::source::postgres::table::quote_literal;
        if after.len() != self.table.key.len() {
            return Err(ReadError::Stream {
                stream: self.name().to_string(),
                reason: format!(
                    "a snapshot window after {after:?} does not fit the key ({} columns)",
                    self.table.key.len()
                ),
            });
        }
        let collate: Vec<String> = self
            .collations(client)?
            .iter()
            .map(|c| {
                c.as_ref()
                    .map(|c| format!(" COLLATE {c}"))
                    .unwrap_or_default()
            })
            .collect();
        let t = &self.table;
        let typed = |v: Option<&str>, k: usize| match v {
            Some(v) => format!("{}::{}", quote_literal(v), t.sql_types[k]),
            None => format!("NULL::{}", t.sql_types[k]),
        };
        let cols: Vec<String> = (0..t.key.len()).map(|i| format!("c{i}")).collect();
        let bound: Vec<String> = t
            .key
            .iter()
            .zip(after)
            .map(|(&k, v)| typed(Some(v), k))
            .collect();
        let rows: Vec<String> = changes
            .enumerate()
            .map(|(n, c)| {
                let mut r = vec![n.to_string()];
                r.extend(
                    t.key
                        .iter()
                        .map(|&k| typed(c.values.get(k).and_then(|v| v.as_deref()), k)),
                );
                format!("({})", r.join(", "))
            })
            .collect();
        let mut out = Vec::new();
        for part in rows.chunks(1000) {
            let q = format!(
                "SELECT x.i FROM (VALUES {}) AS x(i, {}) WHERE ({}) > ({})",
                part.join(", "),
                cols.join(", "),
                // The column's own collation, as the snapshot's WHERE
                // compared in it.
                cols.iter()
                    .zip(&collate)
                    .map(|(c, k)| format!("x.{c}{k}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                bound.join(", ")
            );
            for row in client.query(q.as_str(), &[])? {
                let i: i32 = row.get(0);
                out.push(i as usize);
            }
        }
        Ok(out)
    }

    /// Each key column's collation (None: a type without one), qualified
    /// and quoted.
    fn key_collations(
        &self,
        client: &mut postgres::Client,
    ) -> Result<Vec<Option<String>>, ReadError> {
        let names: Vec<String> = self
            .table
            .key
            .iter()
            .map(|&k| self.table.columns[k].name.clone())
            .collect();
        let rows = client.query(
            "SELECT (SELECT quote_ident(n.nspname) || '.' || quote_ident(c.collname)
                     FROM pg_collation c JOIN pg_namespace n ON n.oid = c.collnamespace
                     WHERE c.oid = a.attcollation)
             FROM unnest($2::text[]) WITH ORDINALITY AS k(name, i)
             JOIN pg_attribute a ON a.attrelid = $1::text::regclass AND a.attname = k.name
             ORDER BY k.i",
            &[&qualified(&self.table.spec.table), &names],
        )?;
        if rows.len() != names.len() {
            return Err(ReadError::Stream {
                stream: self.name().to_string(),
                reason: format!(
                    "key columns {names:?} of {} are not all there any more",
                    self.table.spec.table
                ),
            });
        }
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// A row's key values.
    fn key_of<'a>(&self, c: &'a Change) -> Vec<&'a Option<String>> {
        self.table
            .key
            .iter()
            .filter_map(|&k| c.values.get(k))
            .collect()
    }
}

/// `schema.table` (a bare name is in `public`), quoted.
fn qualified(table: &str) -> String {
    let parts: Vec<&str> = table.split('.').collect();
    let (schema, name) = match parts.as_slice() {
        [name] => ("public", *name),
        [schema, name, ..] => (*schema, *name),
        [] => ("public", ""),
    };
    format!("{}.{}", quote_ident(schema), quote_ident(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_points_round_trip_and_name_the_lsn_to_acknowledge() {
        for p in [
            Position::Stream(Lsn(0x1_0000_0010)),
            Position::Snapshot {
                lsn: Lsn(7),
                after: None,
            },
            Position::Snapshot {
                lsn: Lsn(7),
                after: Some(vec!["42".into()]),
            },
        ] {
            let v = p.to_vec();
            assert_eq!(Position::parse("s", &v).expect("parses"), p);
            assert_eq!(acknowledged_lsn(&v.join("\u{1f}")), Some(p.lsn()));
        }
        assert_eq!(
            Position::Stream(Lsn(0x1_0000_0010)).to_vec(),
            ["lsn", "1/10"]
        );
        let e = Position::parse("orders", &["2024-01-01".into(), "7".into()]).expect_err("bad");
        assert!(e.to_string().contains("stream orders"), "{e}");
        assert_eq!(acknowledged_lsn("2024-01-01\u{1f}7"), None);
    }

    #[test]
    fn windows_ride_in_the_resume_point_until_the_stream_passes_them() {
        let windows = vec![
            Window {
                lsn: Lsn(0x20),
                after: Some(vec!["1000".into(), "a\u{1f}b".into()]),
            },
            Window {
                lsn: Lsn(0x30),
                after: Some(vec!["2000".into(), "c".into()]),
            },
        ];
        let snap = Position::Snapshot {
            lsn: Lsn(0x10),
            after: Some(vec!["2500".into(), "d".into()]),
        };
        let v = resume_point(&snap, &windows);
        assert_eq!(v[0], "snapshot+");
        assert_eq!(v[3..], ["2500", "d"]);
        assert_eq!(
            parse_resume("s", &v).expect("parses"),
            (snap.clone(), windows.clone())
        );
        assert_eq!(acknowledged_lsn(&v.join("\u{1f}")), Some(Lsn(0x10)));
        // Past the first window's point only the second is left; past both,
        // the plain form.
        let v = resume_point(&Position::Stream(Lsn(0x20)), &windows);
        assert_eq!(
            parse_resume("s", &v).expect("parses"),
            (Position::Stream(Lsn(0x20)), windows[1..].to_vec())
        );
        assert_eq!(
            resume_point(&Position::Stream(Lsn(0x30)), &windows),
            ["lsn", "0/30"]
        );
        let whole = vec![Window {
            lsn: Lsn(0x20),
            after: None,
        }];
        let v = resume_point(&Position::Stream(Lsn(0x10)), &whole);
        assert_eq!(
            parse_resume("s", &v).expect("parses"),
            (Position::Stream(Lsn(0x10)), whole)
        );
        // A part read as of an earlier point after one read later: the
        // later one's window stays until the stream passes the earlier
        // one's, so it cannot reach over the earlier part's keys.
        let mixed = vec![
            windows[1].clone(),
            Window {
                lsn: Lsn(0x10),
                after: Some(vec!["2500".into(), "d".into()]),
            },
        ];
        let v = resume_point(&Position::Stream(Lsn(0x18)), &mixed);
        assert_eq!(
            parse_resume("s", &v).expect("parses"),
            (Position::Stream(Lsn(0x18)), mixed.clone())
        );
        assert_eq!(
            resume_point(&Position::Stream(Lsn(0x30)), &mixed),
            ["lsn", "0/30"]
        );
        let bad = vec!["lsn+".to_string(), "0/10".into(), "not json".into()];
        let e = parse_resume("orders", &bad).expect_err("bad windows");
        assert!(e.to_string().contains("no windows"), "{e}");
    }

    #[test]
    fn the_session_holding_a_slot_is_read_from_the_refusal() {
        assert_eq!(
            slot_holder(
                "server error: replication slot \"orca_live_7d\" is active for PID 12700 (SQLSTATE 55006)"
            ),
            Some(12700)
        );
        assert_eq!(slot_holder("replication slot \"x\" does not exist"), None);
        assert_eq!(slot_holder("is active for PID abc"), None);
    }

    #[test]
    fn tables_compare_by_schema_and_name() {
        assert_eq!(qualified("orders"), qualified("public.orders"));
        assert_ne!(qualified("shop.orders"), qualified("public.orders"));
    }
}
