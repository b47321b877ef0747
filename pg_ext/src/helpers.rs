//! SQL-callable wrappers over `orca-core`: cron maths, partitions, manifests.
//!
//! These are internal (`orca._*`, not granted to anyone): the SQL API (the
//! files of `sql/`) calls them. Functions that judge user input return an
//! envelope, `{"ok": ...}` or `{"error": {code, message, hint}}`, which
//! `orca._unwrap` raises with the error's own SQLSTATE; pgrx cannot raise
//! SQLSTATEs outside PostgreSQL's own list.

use chrono::{DateTime, Utc};
use orca_core::cron::{parse_tz, Schedule};
use orca_core::error::ok_envelope;
use orca_core::manifest;
use orca_core::partition::{Fills, PartitionKind, PartitionSet};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;

use crate::gucs;

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 UTC).
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

fn to_utc(t: TimestampWithTimeZone) -> DateTime<Utc> {
    if t.is_infinity() {
        return DateTime::<Utc>::MAX_UTC;
    }
    if t.is_neg_infinity() {
        return DateTime::<Utc>::MIN_UTC;
    }
    let pg_us: i64 = pg_sys::TimestampTz::from(t);
    DateTime::from_timestamp_micros(pg_us.saturating_add(PG_EPOCH_OFFSET_US))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn from_utc(t: DateTime<Utc>) -> TimestampWithTimeZone {
    let pg_us = t.timestamp_micros() - PG_EPOCH_OFFSET_US;
    TimestampWithTimeZone::try_from(pg_us)
        .unwrap_or_else(|_| TimestampWithTimeZone::positive_infinity())
}

fn envelope(r: orca_core::Result<Value>) -> JsonB {
    JsonB(match r {
        Ok(v) => ok_envelope(v),
        Err(e) => e.envelope(),
    })
}

/// How many parsed schedules a backend keeps (a few hundred bytes each).
const SCHEDULES_KEPT: usize = 4096;

thread_local! {
    /// Stored schedules parsed so far in this backend, by time zone and
    /// expression: a tick reads the same few expressions for every due
    /// schedule, and parsing one (with the search that proves it can fire)
    /// cost more than the fire's own maths.
    static SCHEDULES: std::cell::RefCell<std::collections::HashMap<String, Schedule>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// A stored schedule; the manifest check validated it, so failure here means
/// the row was edited by hand.
fn stored_schedule(cron: &str, tz: &str) -> Schedule {
    let key = format!("{tz}\u{0}{cron}");
    if let Some(s) = SCHEDULES.with(|m| m.borrow().get(&key).cloned()) {
        return s;
    }
    let parsed = Schedule::parse(cron, tz)
        .unwrap_or_else(|e| error!("stored schedule '{cron}' in {tz} is invalid: {e}"));
    SCHEDULES.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= SCHEDULES_KEPT {
            m.clear();
        }
        m.insert(key, parsed.clone());
    });
    parsed
}

fn partition_kind(kind: &str) -> PartitionKind {
    PartitionKind::parse_name(kind).unwrap_or_else(|| error!("unknown partition kind '{kind}'"))
}

#[pg_extern(immutable, parallel_safe, name = "_manifest_check")]
fn manifest_check(manifest: JsonB) -> JsonB {
    envelope(manifest::parse(&manifest.0).map(|m| m.normalized))
}

#[pg_extern(stable, parallel_safe, name = "_expand_partitions")]
fn expand_partitions(
    pipeline: &str,
    kind: &str,
    start: &str,
    tz: &str,
    spec: &str,
    now: TimestampWithTimeZone,
) -> JsonB {
    let result = (|| {
        let set = PartitionSet::new(partition_kind(kind), start)?;
        let current = set.current(to_utc(now), parse_tz(tz)?);
        let max = u64::try_from(gucs::MAX_PARTITIONS.get()).unwrap_or(0);
        let parts = set.expand(pipeline, spec, current, max)?;
        Ok(Value::Array(
            parts.iter().map(|p| Value::String(p.to_string())).collect(),
        ))
    })();
    envelope(result)
}

/// Whether a cron expression parses and can match in a time zone: `{"ok":
/// null}`, or the error (OR030, OR031, OR032) for `orca._unwrap`.
#[pg_extern(immutable, parallel_safe, name = "_cron_check")]
fn cron_check(cron: &str, tz: &str) -> JsonB {
    envelope(Schedule::parse(cron, tz).map(|_| Value::Null))
}

#[pg_extern(immutable, parallel_safe, name = "_cron_fires")]
fn cron_fires(
    cron: &str,
    tz: &str,
    after: TimestampWithTimeZone,
    until: TimestampWithTimeZone,
    max: i32,
) -> Vec<TimestampWithTimeZone> {
    let max = usize::try_from(max).unwrap_or(0);
    stored_schedule(cron, tz)
        .fires_between(to_utc(after), to_utc(until), max)
        .into_iter()
        .map(from_utc)
        .collect()
}

#[pg_extern(immutable, parallel_safe, name = "_cron_last")]
fn cron_last(
    cron: &str,
    tz: &str,
    after: TimestampWithTimeZone,
    until: TimestampWithTimeZone,
) -> Option<TimestampWithTimeZone> {
    stored_schedule(cron, tz)
        .last_between(to_utc(after), to_utc(until))
        .map(from_utc)
}

#[pg_extern(immutable, parallel_safe, name = "_cron_next")]
fn cron_next(
    cron: &str,
    tz: &str,
    after: TimestampWithTimeZone,
    n: i32,
) -> Vec<TimestampWithTimeZone> {
    let n = usize::try_from(n).unwrap_or(0);
    stored_schedule(cron, tz)
        .next_n(to_utc(after), n)
        .into_iter()
        .map(from_utc)
        .collect()
}

#[pg_extern(immutable, parallel_safe, name = "_fire_partition")]
fn fire_partition(
    kind: &str,
    start: &str,
    fills: &str,
    tz: &str,
    fire_at: TimestampWithTimeZone,
) -> Option<String> {
    let set = PartitionSet::new(partition_kind(kind), start)
        .unwrap_or_else(|e| error!("stored partition start is invalid: {e}"));
    let fills = Fills::parse_name(fills).unwrap_or_else(|| error!("unknown fills '{fills}'"));
    let tz = parse_tz(tz).unwrap_or_else(|e| error!("{e}"));
    set.for_fire(to_utc(fire_at), tz, fills)
        .map(|p| p.to_string())
}

#[pg_extern(stable, parallel_safe, name = "_current_partition")]
fn current_partition(kind: &str, tz: &str, now: TimestampWithTimeZone) -> String {
    let tz = parse_tz(tz).unwrap_or_else(|e| error!("{e}"));
    partition_kind(kind)
        .containing(to_utc(now).with_timezone(&tz).date_naive())
        .to_string()
}

/// The partitions a sensor run covers: the upstream snapshot's partitions
/// mapped onto this pipeline's set, or, when the snapshot says none, the
/// partition the schedule would fill now, or the one now falls in.
#[pg_extern(stable, parallel_safe, name = "_sensor_partitions")]
fn sensor_partitions(
    kind: &str,
    start: &str,
    tz: &str,
    fills: &str,
    cron: Option<&str>,
    upstream: Vec<String>,
    now: TimestampWithTimeZone,
) -> Vec<String> {
    let set = PartitionSet::new(partition_kind(kind), start)
        .unwrap_or_else(|e| error!("stored partition start is invalid: {e}"));
    let zone = parse_tz(tz).unwrap_or_else(|e| error!("{e}"));
    let now = to_utc(now);
    let current = set.current(now, zone);
    let mapped = set.map_upstream(&upstream, current);
    if !mapped.is_empty() {
        return mapped.iter().map(ToString::to_string).collect();
    }
    let fallback = match cron {
        Some(_) => {
            let fills =
                Fills::parse_name(fills).unwrap_or_else(|| error!("unknown fills '{fills}'"));
            set.for_fire(now, zone, fills)
        }
        None => Some(current).filter(|p| *p >= set.start),
    };
    fallback.map(|p| vec![p.to_string()]).unwrap_or_default()
}

#[pg_extern(stable, parallel_safe, name = "_sense_seconds")]
fn sense_seconds() -> i32 {
    gucs::SENSE_SECONDS.get()
}

#[pg_extern(stable, parallel_safe, name = "_lease_seconds")]
fn lease_seconds() -> i32 {
    gucs::LEASE_SECONDS.get()
}

#[pg_extern(stable, parallel_safe, name = "_webhook_backoff_max")]
fn webhook_backoff_max() -> i32 {
    gucs::WEBHOOK_BACKOFF_MAX_SECONDS.get()
}

#[pg_extern(stable, parallel_safe, name = "_webhook_disable_after")]
fn webhook_disable_after() -> i32 {
    gucs::WEBHOOK_DISABLE_AFTER_SECONDS.get()
}

/// The orca.retain_* setting for one kind of history, in seconds (0: forever).
#[pg_extern(stable, parallel_safe, name = "_retain_seconds")]
fn retain_seconds(what: &str) -> i32 {
    match what {
        "runs" => gucs::RETAIN_RUNS_SECONDS.get(),
        "events" => gucs::RETAIN_EVENTS_SECONDS.get(),
        "webhook_deliveries" => gucs::RETAIN_WEBHOOK_DELIVERIES_SECONDS.get(),
        "runners" => gucs::RETAIN_RUNNERS_SECONDS.get(),
        "tasks" => gucs::RETAIN_TASKS_SECONDS.get(),
        other => pgrx::error!(
            "no retention setting for '{other}' (runs, events, webhook_deliveries, runners, tasks)"
        ),
    }
}

#[pg_extern(stable, parallel_safe, name = "_log_lines_max")]
fn log_lines_max() -> i32 {
    gucs::LOG_LINES_MAX.get()
}

#[pg_extern(stable, parallel_safe, name = "_retention_batch")]
fn retention_batch() -> i32 {
    gucs::RETENTION_BATCH.get()
}

#[pg_extern(stable, parallel_safe, name = "_lost_attempts_max")]
fn lost_attempts_max() -> i32 {
    gucs::LOST_ATTEMPTS_MAX.get()
}

#[pg_extern(stable, parallel_safe, name = "_max_partitions")]
fn max_partitions() -> i32 {
    gucs::MAX_PARTITIONS.get()
}

#[pg_extern(stable, parallel_safe, name = "_max_fires_per_tick")]
fn max_fires_per_tick() -> i32 {
    gucs::MAX_FIRES_PER_TICK.get()
}

#[pg_extern(stable, parallel_safe, name = "_max_lost_per_tick")]
fn max_lost_per_tick() -> i32 {
    gucs::MAX_LOST_PER_TICK.get()
}

#[pg_extern(stable, parallel_safe, name = "_max_sensor_commits_per_tick")]
fn max_sensor_commits_per_tick() -> i32 {
    gucs::MAX_SENSOR_COMMITS_PER_TICK.get()
}

/// Whether a text is a key of a keyed pipeline: the one rule
/// (`orca_core::keyed::valid_key`), for the keys table's check and the keys
/// a keys task reports.
#[pg_extern(immutable, strict, parallel_safe, name = "_valid_key")]
fn valid_key(key: &str) -> bool {
    orca_core::keyed::valid_key(key)
}

/// A keyed pipeline's spec: `{"all": true}` or `{"names": [...]}`. `known` is
/// the spec's items that are current keys, so that a key with `..` in it is
/// not mistaken for a range.
#[pg_extern(immutable, parallel_safe, name = "_key_spec")]
fn key_spec(spec: &str, known: Vec<String>) -> JsonB {
    use orca_core::keyed::{parse_spec, KeySpec};
    envelope(
        parse_spec(spec, |k| known.iter().any(|x| x == k)).map(|s| match s {
            KeySpec::All => serde_json::json!({ "all": true }),
            KeySpec::Names(names) => serde_json::json!({ "names": names }),
        }),
    )
}

/// A sync's definition, validated and normalized (`orca.create_sync`).
#[pg_extern(immutable, parallel_safe, name = "_sync_check")]
fn sync_check(
    name: &str,
    source: JsonB,
    destination: JsonB,
    streams: JsonB,
    schedule: Option<&str>,
    delivery: &str,
) -> JsonB {
    envelope(
        orca_core::sync::check(
            name,
            &source.0,
            &destination.0,
            &streams.0,
            schedule,
            delivery,
        )
        .map(|def| def.to_json()),
    )
}
