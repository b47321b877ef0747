//! Releasing held cells: values the destination could not take when their
//! epoch committed (it got null; the value was kept under `_held/`) are
//! written into the rows they belong to, once the destination can take
//! them — its column became `bytea` — or the user chose how to make them
//! fit (`--nul strip` or `--nul replace=TEXT` for text columns).
//!
//! A cell is written only into the version of the row it was held from
//! (its `_orca_id`) and only while that cell is still null, so a row
//! replaced by a newer version, or fixed by hand, is left alone (counted as
//! skipped), and releasing twice changes nothing. Each file's cells are
//! written in one transaction, after which `{file}.released` records what
//! the release did; files with that record are not read again.

use std::collections::BTreeMap;

use bytes::Bytes;
use orca_core::sync::{Destination, SyncDef};
use serde_json::{json, Value};

use crate::commit::record::Layout;
use crate::commit::store::{Store, StoreError};
use crate::dest::postgres::ids_are_uuid;
use crate::netguard::{Guard, NetError, Scope};
use crate::util::{pg_text, quote_ident};

/// Why a release stopped. The texts are an attempt's own for the same
/// failures: a user reads them in the same log.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("postgres: {}", pg_text(.0))]
    Postgres(#[from] postgres::Error),
    #[error("sync definition: {0}")]
    Definition(String),
    #[error("HEAD names record {path}, which the store does not have")]
    NoRecord { path: String },
    #[error("record {path}: {reason}")]
    BadRecord { path: String, reason: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Netguard(#[from] NetError),
    #[error("control plane: {0}")]
    Control(#[from] orca_client::ClientError),
}

/// How text holding NUL is made to fit a text column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NulFix {
    /// NUL characters are removed.
    Strip,
    /// Each NUL character becomes this text.
    Replace(String),
}

impl NulFix {
    /// `strip` or `replace=TEXT`.
    pub fn parse(s: &str) -> Option<NulFix> {
        match s {
            "strip" => Some(NulFix::Strip),
            _ => s
                .strip_prefix("replace=")
                .map(|t| NulFix::Replace(t.to_string())),
        }
    }

    fn apply(&self, v: &str) -> String {
        match self {
            NulFix::Strip => v.replace('\0', ""),
            NulFix::Replace(t) => v.replace('\0', t),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ReleaseOptions {
    pub database_url: String,
    pub org: String,
    pub sync: String,
    pub store_url: String,
    /// Only this stream's cells.
    pub stream: Option<String>,
    pub nul: Option<NulFix>,
}

/// What a release did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Released {
    /// Held files read (those not released before).
    pub files: u64,
    pub cells: u64,
    /// Cells written into their rows.
    pub released: u64,
    /// Cells whose row version is gone or whose cell is no longer null.
    pub skipped: u64,
}

fn definition(e: &str) -> ReleaseError {
    ReleaseError::Definition(e.to_string())
}

/// A held cell as `_held/` keeps it.
struct Cell {
    stream: String,
    orca_id: String,
    column: String,
    value: String,
}

fn parse_cells(path: &str, body: &[u8]) -> Result<Vec<Cell>, ReleaseError> {
    let text = String::from_utf8_lossy(body);
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line).map_err(|e| ReleaseError::BadRecord {
                path: path.to_string(),
                reason: e.to_string(),
            })?;
            let field = |k: &str| {
                v.get(k)
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| ReleaseError::BadRecord {
                        path: path.to_string(),
                        reason: format!("a held cell without '{k}'"),
                    })
            };
            Ok(Cell {
                stream: field("stream")?,
                orca_id: field("_orca_id")?,
                column: field("column")?,
                value: field("value")?,
            })
        })
        .collect()
}

/// How a column takes a released value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Text,
    Bytes,
}

/// Writes the held cells of a sync back into its Postgres destination.
pub fn release(opts: &ReleaseOptions) -> Result<Released, ReleaseError> {
    let mut control = orca_client::tls::connect(&opts.database_url)?;
    control.execute("SELECT set_config('orca.org', $1, false)", &[&opts.org])?;
    let def: Value = control
        .query_opt(
            "SELECT definition FROM orca.syncs WHERE name = $1",
            &[&opts.sync],
        )?
        .map(|r| r.get(0))
        .ok_or_else(|| {
            ReleaseError::Definition(format!(
                "no sync named '{}' in org '{}'",
                opts.sync, opts.org
            ))
        })?;
    let def: SyncDef = serde_json::from_value(def)
        .map_err(|e| definition(&format!("sync '{}': {e}", opts.sync)))?;
    let Destination::Postgres { url, schema, .. } = &def.destination else {
        return Err(definition(&format!(
            "sync '{}' writes to {}: releasing held cells is built for the postgres destination only",
            opts.sync,
            def.destination.kind()
        )));
    };
    let url = url
        .plain()
        .map_err(|e| definition(&format!("destination.url: {e}")))?;
    let schema = schema.as_deref().unwrap_or("public");
    // The destination under the org's netguard, as the sync's attempts
    // reach it.
    let allowlist: Vec<String> = control
        .query("SELECT target FROM orca.allowlist ORDER BY target", &[])?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let guard = Guard::new(&Scope {
        org: opts.org.clone(),
        allowlist: Some(allowlist),
        store: Some(opts.store_url.clone()),
        warehouse: None,
    })?;
    let mut pg = guard.postgres(url)?;
    let store = Store::open_existing(&opts.store_url)?;
    let layout = Layout::new(&opts.org, &opts.sync);
    let all = store.list(&format!("{}/_held", layout.root))?;
    let files: Vec<&String> = all
        .iter()
        .filter(|f| f.ends_with(".jsonl"))
        .filter(|f| !all.contains(&format!("{f}.released")))
        .collect();
    let mut out = Released::default();
    let mut targets: BTreeMap<(String, String), Target> = BTreeMap::new();
    let mut id_types: BTreeMap<String, &'static str> = BTreeMap::new();
    for path in files {
        let body = store.get(path)?.ok_or_else(|| ReleaseError::NoRecord {
            path: store.url_of(path),
        })?;
        let cells: Vec<Cell> = parse_cells(&store.url_of(path), &body)?
            .into_iter()
            .filter(|c| opts.stream.as_ref().is_none_or(|s| *s == c.stream))
            .collect();
        if cells.is_empty() {
            continue;
        }
        let mut tx = pg.transaction()?;
        let (mut released, mut skipped) = (0u64, 0u64);
        for c in &cells {
            // A cell that names no row (nothing to match) is skipped, as a
            // row since replaced is.
            if c.orca_id.is_empty() {
                skipped += 1;
                continue;
            }
            let table = format!("{}.{}", quote_ident(schema), quote_ident(&c.stream));
            let key = (c.stream.clone(), c.column.clone());
            let target = match targets.get(&key) {
                Some(t) => *t,
                None => {
                    let t = target_of(&mut tx, schema, c, &table, opts.nul.as_ref())?;
                    targets.insert(key, t);
                    t
                }
            };
            let id_type = match id_types.get(&c.stream) {
                Some(t) => *t,
                None => {
                    // Only these two spellings ever reach the statement.
                    let t = if ids_are_uuid(&mut tx, &table)? {
                        "uuid"
                    } else {
                        "text"
                    };
                    id_types.insert(c.stream.clone(), t);
                    t
                }
            };
            let col = quote_ident(&c.column);
            // The held id is 32 hex digits, which Postgres reads as either
            // form; cast to the column's own type, so its index is used.
            let sql = format!(
                "UPDATE {table} SET {col} = $1 WHERE _orca_id = $2::text::{id_type} AND {col} IS NULL"
            );
            let n = match (target, &opts.nul) {
                (Target::Bytes, _) => tx.execute(&sql, &[&c.value.as_bytes(), &c.orca_id]),
                (Target::Text, Some(fix)) => tx.execute(&sql, &[&fix.apply(&c.value), &c.orca_id]),
                (Target::Text, None) => tx.execute(&sql, &[&c.value, &c.orca_id]),
            }
            .map_err(|e| {
                ReleaseError::Definition(format!(
                    "releasing {schema}.{}.{} of record {}: {}",
                    c.stream,
                    c.column,
                    c.orca_id,
                    pg_text(&e)
                ))
            })?;
            if n == 1 {
                released += 1;
            } else {
                skipped += 1;
            }
        }
        tx.commit()?;
        let note = json!({
            "released_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "cells": cells.len(), "released": released, "skipped": skipped,
        });
        // A file released only in part (one stream of several) stays to be
        // read again; its released cells are skipped then.
        if opts.stream.is_none() {
            store.put(&format!("{path}.released"), Bytes::from(note.to_string()))?;
        }
        out.files += 1;
        out.cells += cells.len() as u64;
        out.released += released;
        out.skipped += skipped;
    }
    Ok(out)
}

/// How the column of a held cell takes its value now; an error that says
/// what to do when it cannot.
fn target_of(
    tx: &mut postgres::Transaction<'_>,
    schema: &str,
    c: &Cell,
    table: &str,
    nul: Option<&NulFix>,
) -> Result<Target, ReleaseError> {
    let ty: Option<String> = tx
        .query_opt(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
             WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped",
            &[&table, &c.column],
        )?
        .map(|r| r.get(0));
    let at = format!("{schema}.{}.{}", c.stream, c.column);
    match ty.as_deref() {
        None => Err(definition(&format!(
            "column {at} of a held cell does not exist in the destination"
        ))),
        Some("bytea") => Ok(Target::Bytes),
        Some(t) if t == "text" || t.starts_with("character") => {
            if nul.is_none() && c.value.contains('\0') {
                Err(definition(&format!(
                    "column {at} is {t}, which cannot hold NUL (\\u0000): pass --nul strip or \
                     --nul replace=TEXT, or make the column bytea \
                     (ALTER TABLE ... ALTER COLUMN ... TYPE bytea USING convert_to(..., 'UTF8'))"
                )))
            } else {
                Ok(Target::Text)
            }
        }
        Some(t) => Err(definition(&format!(
            "column {at} is {t}; held cells are released into text and bytea columns"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_fixes_parse_and_apply() {
        assert_eq!(NulFix::parse("strip"), Some(NulFix::Strip));
        assert_eq!(
            NulFix::parse("replace= "),
            Some(NulFix::Replace(" ".into()))
        );
        assert_eq!(NulFix::parse("drop"), None);
        assert_eq!(NulFix::Strip.apply("a\0b\0"), "ab");
        assert_eq!(NulFix::Replace("?".into()).apply("a\0b"), "a?b");
    }

    #[test]
    fn held_files_parse_and_name_a_bad_line() {
        let body = b"{\"stream\":\"events\",\"_orca_id\":\"x1\",\"column\":\"note\",\"value\":\"a\\u0000\"}\n\n";
        let cells = parse_cells("h.jsonl", body).expect("cells");
        assert_eq!(cells.len(), 1);
        assert_eq!(
            (cells[0].stream.as_str(), cells[0].value.as_str()),
            ("events", "a\0")
        );
        let e = parse_cells("h.jsonl", b"{\"stream\":\"events\"}\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("h.jsonl") && e.contains("'_orca_id'"), "{e}");
    }
}
