//! A snapshot's later part made to stand for the table at the stream's own
//! point.
//!
//! A snapshot cut short by a crash (or a stream new to the sync) is read on
//! in a later snapshot, at L2, than the point L its change stream starts
//! after. Read as it is, that part would show the changes between L and L2
//! already, and a change log would lose the ones it folds (a row inserted
//! and deleted in between is in neither). Under `REPLICA IDENTITY FULL` the
//! WAL between the two points says how each key that changed was at L: the
//! old row of its first change (an update or a delete), or no row (an
//! insert). Those keys' rows at L2 are left out of the read and their rows
//! at L put in their place, so the part is the table at L, and every change
//! after L follows it once.

use std::collections::{HashMap, HashSet};

use postgres::fallible_iterator::FallibleIterator;

use super::{cdc, qualified, slot_holder, Cdc, Change, Out, Position, TAKE_OVER_TRIES};
use crate::source::error::ReadError;
use crate::source::postgres::pgoutput::{decode, Lsn, Message};

/// A stream's later part as of its own point.
pub(super) struct AsOf {
    /// The key of every row that changed between the two points.
    pub changed: Vec<Vec<Option<String>>>,
    /// Those rows after the part's first key that existed at the stream's
    /// point, as they were then (values of the table's own columns).
    pub rows: Vec<Vec<Option<String>>>,
    /// Each key column's collation, for the part's order.
    pub collate: Vec<Option<String>>,
}

/// One key's first change in a transaction: how the row was before it
/// (None: there was none).
struct First {
    out: usize,
    key: Vec<Option<String>>,
    before: Option<Change>,
}

impl Cdc {
    /// For each stream still in its snapshot whose table's replica identity
    /// is full (and was, for every change after the stream's point), its
    /// part read at `upto` as of its own point (None: a stream this does not
    /// apply to, whose part is a window instead).
    pub(super) fn as_of(
        &self,
        client: &mut postgres::Client,
        outs: &mut [Out],
        upto: Lsn,
    ) -> Result<Vec<Option<AsOf>>, ReadError> {
        let mut since: Vec<Option<Lsn>> = vec![None; outs.len()];
        for (i, o) in outs.iter().enumerate() {
            let Position::Snapshot { lsn, .. } = o.pos else {
                continue;
            };
            let full: Option<bool> = client
                .query_opt(
                    "SELECT relreplident = 'f' FROM pg_class WHERE oid = to_regclass($1)",
                    &[&qualified(&o.table.spec.table)],
                )?
                .map(|r| r.get(0));
            if lsn < upto && full == Some(true) {
                since[i] = Some(lsn);
            }
        }
        if since.iter().all(Option::is_none) {
            return Ok(outs.iter().map(|_| None).collect());
        }
        let firsts = self.first_changes(client, outs, &since, upto)?;
        let mut parts = Vec::with_capacity(outs.len());
        for (i, seen) in firsts.into_iter().enumerate() {
            let (Some(_), Some(seen), Position::Snapshot { after, .. }) =
                (since[i], seen, outs[i].pos.clone())
            else {
                parts.push(None);
                continue;
            };
            let mut changed = Vec::with_capacity(seen.len());
            let mut before = Vec::new();
            for f in seen {
                changed.push(f.key);
                before.extend(f.before);
            }
            // Rows up to the part's first key were read already (their
            // changes follow in the stream).
            let keep: Vec<usize> = match &after {
                Some(after) => outs[i].above(client, after, before.iter())?,
                None => (0..before.len()).collect(),
            };
            let rows = keep
                .into_iter()
                .filter_map(|n| before.get(n).map(|c| c.values.clone()))
                .collect();
            parts.push(Some(AsOf {
                changed,
                rows,
                collate: outs[i].collations(client)?,
            }));
        }
        Ok(parts)
    }

    /// The first change of each key of each stream in `since` (by the
    /// stream's place) that committed after its point and before `upto`,
    /// read from the sync's slot without moving it.
    fn first_changes(
        &self,
        client: &mut postgres::Client,
        outs: &[Out],
        since: &[Option<Lsn>],
        upto: Lsn,
    ) -> Result<Firsts, ReadError> {
        let mut took_over = 0u32;
        loop {
            let upto_text = upto.to_string();
            let rows = client.query_raw(
                "SELECT data FROM pg_logical_slot_peek_binary_changes(
                     $1, $2::text::pg_lsn, NULL, 'proto_version', '1', 'publication_names', $3)",
                [
                    &self.slot as &(dyn postgres::types::ToSql + Sync),
                    &upto_text,
                    &self.slot,
                ],
            );
            // The session of an earlier attempt, cut off and fenced, may
            // still hold the slot.
            let held = |e: postgres::Error| match holder(&e) {
                Some(pid) if took_over < TAKE_OVER_TRIES => Ok(pid),
                _ => Err(ReadError::from(e)),
            };
            let pid = match rows.map(|rows| read_changes(rows, outs, since)) {
                Ok(read) => match read? {
                    Ok(firsts) => return Ok(firsts),
                    Err(e) => held(e)?,
                },
                Err(e) => held(e)?,
            };
            self.end_holder(client, pid)?;
            took_over += 1;
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

/// Each stream's first changes (by its place; None: its part cannot be
/// rebuilt).
type Firsts = Vec<Option<Vec<First>>>;

/// The streams that read a relation, each with the place of each of its
/// columns in the relation's tuples.
type Readers = Vec<(usize, Vec<Option<usize>>)>;

/// The session holding the slot, from the server's refusal to decode it.
fn holder(e: &postgres::Error) -> Option<i32> {
    e.as_db_error().and_then(|d| slot_holder(d.message()))
}

/// The first change of each key of each stream in `since` among the
/// slot's transactions in `rows` (Err inside: the server's error while it
/// decoded them). None for a stream whose old rows the WAL after its point
/// does not hold whole: a change made under another replica identity, or a
/// truncate.
fn read_changes(
    mut rows: postgres::RowIter<'_>,
    outs: &[Out],
    since: &[Option<Lsn>],
) -> Result<Result<Firsts, postgres::Error>, ReadError> {
    let mut firsts: Firsts = outs.iter().map(|_| Some(Vec::new())).collect();
    let mut seen: Vec<HashSet<Vec<Option<String>>>> = outs.iter().map(|_| HashSet::new()).collect();
    let mut rels: HashMap<u32, Rel> = HashMap::new();
    let mut txn: Vec<First> = Vec::new();
    // The streams a change of this transaction left without a whole old row.
    let mut partial: Vec<usize> = Vec::new();
    loop {
        let row = match rows.next() {
            Ok(Some(row)) => row,
            Ok(None) => break,
            Err(e) => return Ok(Err(e)),
        };
        let data: &[u8] = row.get(0);
        if let Some(end) = commit_end(data) {
            let after = |o: usize| since[o].is_some_and(|l| end > l);
            for o in partial.drain(..) {
                if after(o) {
                    firsts[o] = None;
                }
            }
            for f in txn.drain(..) {
                let o = f.out;
                if !after(o) || !seen[o].insert(f.key.clone()) {
                    continue;
                }
                if let Some(list) = firsts[o].as_mut() {
                    list.push(f);
                }
            }
            continue;
        }
        match decode(data).map_err(cdc)? {
            Message::Relation {
                id,
                namespace,
                name,
                columns,
                full,
            } => {
                let table = format!("{namespace}.{name}");
                let mut readers = Vec::new();
                for (i, o) in outs.iter().enumerate() {
                    if since[i].is_some() && o.reads(&table) {
                        readers.push((i, o.places(&columns)));
                    }
                }
                rels.insert(
                    id,
                    Rel {
                        table,
                        full,
                        readers,
                    },
                );
            }
            Message::Insert { rel, new } => {
                let Some(r) = rels.get(&rel) else { continue };
                for (i, at) in &r.readers {
                    let row = outs[*i].row(*i, &r.table, at, &new, None, false)?;
                    txn.push(first(&outs[*i], row, false));
                }
            }
            Message::Update { rel, old, new } => {
                let Some(r) = rels.get(&rel) else { continue };
                for (i, at) in &r.readers {
                    let o = &outs[*i];
                    let (Some(old), true) = (&old, r.full) else {
                        partial.push(*i);
                        continue;
                    };
                    let was = o.row(*i, &r.table, at, old, None, false)?;
                    let now = o.row(*i, &r.table, at, &new, Some(old), false)?;
                    let moved = o.key_of(&was) != o.key_of(&now);
                    txn.push(first(o, was, true));
                    // The key the update moved the row to had no row.
                    if moved {
                        txn.push(first(o, now, false));
                    }
                }
            }
            Message::Delete { rel, old } => {
                let Some(r) = rels.get(&rel) else { continue };
                for (i, at) in &r.readers {
                    if !r.full {
                        partial.push(*i);
                        continue;
                    }
                    let was = outs[*i].row(*i, &r.table, at, &old, None, false)?;
                    txn.push(first(&outs[*i], was, true));
                }
            }
            Message::Truncate { rels: truncated } => {
                for r in truncated.iter().filter_map(|t| rels.get(t)) {
                    partial.extend(r.readers.iter().map(|(i, _)| *i));
                }
            }
            Message::Other(_) => {}
        }
    }
    Ok(Ok(firsts))
}

/// A relation as the slot described it.
struct Rel {
    table: String,
    /// Its replica identity was FULL when the changes after it were made.
    full: bool,
    readers: Readers,
}

/// A change's key, and the row before it if `existed`.
fn first(o: &Out, row: Change, existed: bool) -> First {
    let key = o.key_of(&row).into_iter().cloned().collect();
    First {
        out: row.out,
        key,
        before: existed.then_some(row),
    }
}

/// The end of a commit message's transaction (pgoutput `C`: flags, commit
/// LSN, end LSN, time); None for any other message.
fn commit_end(data: &[u8]) -> Option<Lsn> {
    if data.first() != Some(&b'C') {
        return None;
    }
    let end: [u8; 8] = data.get(10..18)?.try_into().ok()?;
    Some(Lsn(u64::from_be_bytes(end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_message_tells_its_transactions_end() {
        let mut c = vec![b'C', 0];
        c.extend(0x10_u64.to_be_bytes());
        c.extend(0x1_0000_0020_u64.to_be_bytes());
        c.extend(7_u64.to_be_bytes());
        assert_eq!(commit_end(&c), Some(Lsn(0x1_0000_0020)));
        assert_eq!(commit_end(&c[..12]), None, "cut short");
        assert_eq!(commit_end(b"B\0\0"), None);
        assert_eq!(commit_end(&[]), None);
    }
}
