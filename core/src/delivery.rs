//! Delivery levels: the guarantee each stream of a sync can keep, worked out
//! from the destination's class, the source's replay, the write mode and the
//! primary key, and checked against the level the sync requires.
//!
//! The four rules, strongest first:
//! 1. an exact source into a stage-and-apply or transactional destination is
//!    exactly once: the commit protocol alone keeps every record to one commit;
//! 2. a superset source written with merge into a stage-and-apply or
//!    transactional destination is effectively once: a repeat lands on the same
//!    key, guarded by `_orca_seq`, so the table ends up the same;
//! 3. a superset source written with append or overwrite into a destination
//!    that can skip rows by `_orca_id` when it applies is exactly once, when
//!    the sync requires more than at least once;
//! 4. a destination that delivers and acknowledges, and anything else, is at
//!    least once.

use std::fmt;

/// How a destination makes data visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestClass {
    /// Stages an epoch's data invisibly and applies it at commit (Parquet
    /// files, Iceberg tables).
    StageAndApply,
    /// Writes an epoch's rows and its marker in one transaction (Postgres).
    Transactional,
    /// Delivers as it goes and acknowledges (queues, webhooks).
    DeliverAndAck,
}

/// What a source returns when it reads again from a resume point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Exactly the records it returned before (immutable files by offset).
    Exact,
    /// At least those records, possibly more or newer versions of them (a
    /// table read by a cursor column, whose rows may change).
    Superset,
    /// Nothing can be read again.
    None,
}

/// How a stream's rows land in the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    Append,
    Merge,
    Overwrite,
}

/// A delivery guarantee, weakest first: the order is the strength.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    AtLeastOnce,
    EffectivelyOnce,
    ExactlyOnce,
}

impl Delivery {
    pub fn name(self) -> &'static str {
        match self {
            Self::AtLeastOnce => "at_least_once",
            Self::EffectivelyOnce => "effectively_once",
            Self::ExactlyOnce => "exactly_once",
        }
    }

    pub fn parse_name(s: &str) -> Option<Self> {
        match s {
            "at_least_once" => Some(Self::AtLeastOnce),
            "effectively_once" => Some(Self::EffectivelyOnce),
            "exactly_once" => Some(Self::ExactlyOnce),
            _ => None,
        }
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl WriteMode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Append => "append",
            Self::Merge => "merge",
            Self::Overwrite => "overwrite",
        }
    }

    pub fn parse_name(s: &str) -> Option<Self> {
        match s {
            "append" => Some(Self::Append),
            "merge" => Some(Self::Merge),
            "overwrite" => Some(Self::Overwrite),
            _ => None,
        }
    }
}

/// What one stream of a sync brings to the question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamFacts {
    pub class: DestClass,
    pub replay: Replay,
    pub mode: WriteMode,
    pub has_primary_key: bool,
    /// The destination can leave out rows whose `_orca_id` it already holds
    /// when it applies an epoch.
    pub skips_by_id: bool,
}

/// The strongest guarantee the stream can keep when the sync requires
/// `required`: rule 3 only applies when more than at least once is asked for,
/// because skipping by id costs the destination a lookup per row.
pub fn achievable(f: StreamFacts, required: Delivery) -> Delivery {
    let applies = matches!(f.class, DestClass::StageAndApply | DestClass::Transactional);
    match (f.replay, f.mode) {
        (Replay::Exact, _) if applies => Delivery::ExactlyOnce,
        (Replay::Superset, WriteMode::Merge) if applies && f.has_primary_key => {
            Delivery::EffectivelyOnce
        }
        (Replay::Superset, WriteMode::Append | WriteMode::Overwrite)
            if applies && f.skips_by_id && required > Delivery::AtLeastOnce =>
        {
            Delivery::ExactlyOnce
        }
        _ => Delivery::AtLeastOnce,
    }
}

/// Whether the stream keeps what the sync requires; the error says what it
/// can keep instead and why.
pub fn check(f: StreamFacts, required: Delivery) -> Result<Delivery, String> {
    let got = achievable(f, required);
    if got >= required {
        return Ok(got);
    }
    let why = match (f.class, f.replay, f.mode) {
        (DestClass::DeliverAndAck, _, _) => {
            "the destination delivers as it goes and cannot take an epoch back".to_string()
        }
        (_, Replay::None, _) => "the source cannot read anything again".to_string(),
        (_, Replay::Superset, WriteMode::Merge) if !f.has_primary_key => {
            "a merge needs a primary key to land a repeat on the same row".to_string()
        }
        (_, Replay::Superset, _) if !f.skips_by_id => format!(
            "the source may read rows again and the destination cannot skip rows it holds \
             ({} would need merge with a primary key)",
            Delivery::EffectivelyOnce
        ),
        _ => "no rule gives more".to_string(),
    };
    Err(format!("can keep at most {got}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(class: DestClass, replay: Replay, mode: WriteMode) -> StreamFacts {
        StreamFacts {
            class,
            replay,
            mode,
            has_primary_key: true,
            skips_by_id: false,
        }
    }

    #[test]
    fn the_four_rules() {
        use Delivery::*;
        // 1. exact source into stage-and-apply or transactional.
        for class in [DestClass::StageAndApply, DestClass::Transactional] {
            let f = facts(class, Replay::Exact, WriteMode::Append);
            assert_eq!(achievable(f, ExactlyOnce), ExactlyOnce);
        }
        // 2. superset + merge with a key.
        let f = facts(DestClass::StageAndApply, Replay::Superset, WriteMode::Merge);
        assert_eq!(achievable(f, ExactlyOnce), EffectivelyOnce);
        let no_key = StreamFacts {
            has_primary_key: false,
            ..f
        };
        assert_eq!(achievable(no_key, EffectivelyOnce), AtLeastOnce);
        // 3. superset + append into a destination that skips by id, when more
        //    than at least once is required.
        let skip = StreamFacts {
            skips_by_id: true,
            ..facts(
                DestClass::StageAndApply,
                Replay::Superset,
                WriteMode::Append,
            )
        };
        assert_eq!(achievable(skip, ExactlyOnce), ExactlyOnce);
        assert_eq!(achievable(skip, AtLeastOnce), AtLeastOnce);
        // 4. deliver-and-acknowledge, and anything else.
        let ack = facts(DestClass::DeliverAndAck, Replay::Exact, WriteMode::Append);
        assert_eq!(achievable(ack, ExactlyOnce), AtLeastOnce);
        let none = facts(DestClass::Transactional, Replay::None, WriteMode::Append);
        assert_eq!(achievable(none, ExactlyOnce), AtLeastOnce);
    }

    #[test]
    fn a_requirement_too_strong_is_refused_with_the_reason() {
        let f = facts(
            DestClass::StageAndApply,
            Replay::Superset,
            WriteMode::Append,
        );
        let e = check(f, Delivery::ExactlyOnce).expect_err("refused");
        assert!(e.starts_with("can keep at most at_least_once"), "{e}");
        assert!(e.contains("cannot skip rows"), "{e}");
        assert_eq!(check(f, Delivery::AtLeastOnce), Ok(Delivery::AtLeastOnce));
        let m = StreamFacts {
            has_primary_key: false,
            ..facts(DestClass::Transactional, Replay::Superset, WriteMode::Merge)
        };
        let e = check(m, Delivery::EffectivelyOnce).expect_err("no key");
        assert!(e.contains("primary key"), "{e}");
        assert_eq!(
            Delivery::parse_name("exactly_once"),
            Some(Delivery::ExactlyOnce)
        );
        assert_eq!(Delivery::parse_name("once"), None);
    }
}
