//! Checkpoint records: immutable JSON objects under
//! `{org}/{sync}/_checkpoints/`, one per epoch and attempt. HEAD (in
//! `orca.syncs`) names the current one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A stream's state after an epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamState {
    /// Where reading resumes: the cursor and key values of the last row read
    /// (absent: from the start).
    pub position: Option<Vec<String>>,
    /// Rows delivered up to and including this epoch.
    pub rows: u64,
    /// The stream's destination schema, as `name: type` pairs.
    pub schema: Vec<(String, String)>,
    /// A raw-record stream's keys whose destination column is named
    /// otherwise (key → column): named once, when first taken, and kept
    /// here, so a column's name never changes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub names: BTreeMap<String, String>,
    /// An `overwrite` stream's last refresh read the whole source and
    /// replaced the destination's rows: the next attempt begins another.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refreshed: bool,
    /// A backfill is reading the stream again from its start and has not
    /// reached the end: a destination that can skip rows by `_orca_id`
    /// skips the ones it holds (Postgres always does, Iceberg then).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rereading: bool,
}

/// What an epoch does to an `overwrite` stream's refresh: the first epoch
/// of a refresh empties its shadow, the last one (after the source ran out)
/// replaces the destination's rows with the shadow's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refresh {
    pub begins: bool,
    pub ends: bool,
}

/// A staged file: what lane 0 makes visible when it commits the epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Staged {
    pub stream: String,
    /// Relative to the sync's store.
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
    /// The writer lane that staged it (records before lanes had one: 0).
    #[serde(default)]
    pub lane: usize,
}

/// One lane's committable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaneCommittable {
    pub lane: usize,
    pub staged: Vec<Staged>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub sync: String,
    pub epoch: u64,
    pub generation: i32,
    /// The record of the epoch before (absent for epoch 1).
    pub previous: Option<String>,
    pub streams: BTreeMap<String, StreamState>,
    pub committables: Vec<LaneCommittable>,
    /// Quarantined record files written in this epoch.
    pub quarantined: Vec<String>,
    /// Files of cells the destination could not take, held for a release.
    #[serde(default)]
    pub held: Vec<String>,
    /// The refresh steps of the `overwrite` streams in this epoch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub refresh: BTreeMap<String, Refresh>,
    pub written_at: String,
}

/// Where a sync's objects live, relative to the store.
pub struct Layout {
    pub root: String,
}

impl Layout {
    pub fn new(org: &str, sync: &str) -> Layout {
        Layout {
            root: format!("{org}/{sync}"),
        }
    }

    pub fn record(&self, epoch: u64, generation: i32) -> String {
        format!("{}/_checkpoints/{epoch:010}-g{generation}.json", self.root)
    }

    /// Whether a record path is one of this sync's own records: HEAD comes
    /// from the control plane, which checks the same rule (orca._check_record),
    /// and a record never makes the engine read another sync's or org's
    /// objects, or leave the store.
    pub fn owns_record(&self, path: &str) -> bool {
        let prefix = format!("{}/_checkpoints/", self.root);
        path.strip_prefix(&prefix).is_some_and(|name| {
            !name.is_empty()
                && !name.starts_with('.')
                && !name.contains("..")
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        })
    }

    pub fn staged(&self, epoch: u64, generation: i32, stream: &str, lane: usize) -> String {
        format!(
            "{}/_staging/{epoch:010}-g{generation}/{stream}-lane{lane}.parquet",
            self.root
        )
    }

    pub fn held(&self, epoch: u64, generation: i32, stream: &str) -> String {
        format!(
            "{}/_held/{epoch:010}-g{generation}/{stream}.jsonl",
            self.root
        )
    }

    pub fn quarantine(&self, epoch: u64, generation: i32, stream: &str) -> String {
        format!(
            "{}/_quarantine/{epoch:010}-g{generation}/{stream}.jsonl",
            self.root
        )
    }

    pub fn log(&self, generation: i32) -> String {
        format!("{}/_logs/g{generation:06}.jsonl", self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_paths_sort_by_epoch() {
        let l = Layout::new("default", "shop");
        assert_eq!(
            l.record(7, 2),
            "default/shop/_checkpoints/0000000007-g2.json"
        );
        assert!(l.record(9, 3) < l.record(10, 1));
        assert!(l.owns_record(&l.record(7, 2)));
        for other in [
            "default/other/_checkpoints/0000000007-g2.json",
            "acme/shop/_checkpoints/0000000007-g2.json",
            "default/shop/_checkpoints/../../acme/shop/_checkpoints/x.json",
            "default/shop/_checkpoints/sub/x.json",
            "/etc/passwd",
            "default/shop/_staging/x.json",
            "default/shop/_checkpoints/",
        ] {
            assert!(!l.owns_record(other), "{other}");
        }
        let r = Record {
            sync: "shop".into(),
            epoch: 7,
            generation: 2,
            previous: Some(l.record(6, 2)),
            streams: [(
                "orders".to_string(),
                StreamState {
                    position: Some(vec!["2024-01-01T00:00:00Z".into(), "17".into()]),
                    rows: 170,
                    schema: vec![("order_id".into(), "Int64".into())],
                    names: BTreeMap::from([("Order Id".into(), "order_id".into())]),
                    refreshed: true,
                    rereading: false,
                },
            )]
            .into_iter()
            .collect(),
            committables: vec![LaneCommittable {
                lane: 0,
                staged: vec![Staged {
                    stream: "orders".into(),
                    path: l.staged(7, 2, "orders", 0),
                    rows: 10,
                    lane: 0,
                    bytes: 1234,
                }],
            }],
            quarantined: vec![],
            held: vec![],
            refresh: [(
                "orders".to_string(),
                Refresh {
                    begins: false,
                    ends: true,
                },
            )]
            .into_iter()
            .collect(),
            written_at: "2026-11-29T00:00:00Z".into(),
        };
        let text = serde_json::to_string(&r).expect("json");
        assert_eq!(serde_json::from_str::<Record>(&text).expect("parse"), r);
        // A record written before refreshes existed reads as none.
        let mut old: serde_json::Value = serde_json::from_str(&text).expect("json");
        if let Some(o) = old.as_object_mut() {
            o.remove("refresh");
        }
        if let Some(s) = old["streams"]["orders"].as_object_mut() {
            s.remove("refreshed");
            s.remove("names");
        }
        let old: Record = serde_json::from_value(old).expect("an older record");
        assert!(old.refresh.is_empty() && !old.streams["orders"].refreshed);
        // ... and one written before columns were named, as naming none.
        assert!(old.streams["orders"].names.is_empty());
    }
}
