//! Partitions: the months or days a pipeline runs over, and the spec syntax
//! (`2024-01`, `2024-01,2024-03`, `2024-01..2024-06`, `@all`) that names them.

use std::fmt;

use chrono::{DateTime, Datelike, Months, NaiveDate, Utc};
use chrono_tz::Tz;

use crate::error::{Error, Result};

/// How a pipeline divides time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionKind {
    Monthly,
    Daily,
}

/// One partition key: a month or a day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Partition {
    Month(NaiveDate),
    Day(NaiveDate),
}

impl PartitionKind {
    /// `monthly` or `daily`, as manifests and the `pipeline_versions` table spell them.
    pub fn parse_name(name: &str) -> Option<Self> {
        match name {
            "monthly" => Some(Self::Monthly),
            "daily" => Some(Self::Daily),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Monthly => "monthly",
            Self::Daily => "daily",
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Self::Monthly => "a month written YYYY-MM",
            Self::Daily => "a day written YYYY-MM-DD",
        }
    }

    /// Parses one key strictly: zero-padded, a real calendar date.
    pub fn parse(self, text: &str) -> Result<Partition> {
        let bad = || Error::MalformedPartition {
            value: text.to_string(),
            expected: self.expected(),
        };
        let b = text.as_bytes();
        let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
        let num = |r: std::ops::Range<usize>| -> u32 {
            b[r].iter().fold(0, |n, d| n * 10 + u32::from(d - b'0'))
        };
        match self {
            Self::Monthly => {
                if b.len() != 7 || b[4] != b'-' || !digits(0..4) || !digits(5..7) {
                    return Err(bad());
                }
                let (y, m) = (num(0..4), num(5..7));
                NaiveDate::from_ymd_opt(y as i32, m, 1)
                    .filter(|_| y >= 1)
                    .map(Partition::Month)
                    .ok_or_else(bad)
            }
            Self::Daily => {
                if b.len() != 10
                    || b[4] != b'-'
                    || b[7] != b'-'
                    || !digits(0..4)
                    || !digits(5..7)
                    || !digits(8..10)
                {
                    return Err(bad());
                }
                let (y, m, d) = (num(0..4), num(5..7), num(8..10));
                NaiveDate::from_ymd_opt(y as i32, m, d)
                    .filter(|_| y >= 1)
                    .map(Partition::Day)
                    .ok_or_else(bad)
            }
        }
    }

    /// The partition a calendar date falls in.
    pub fn containing(self, date: NaiveDate) -> Partition {
        match self {
            Self::Monthly => Partition::Month(date.with_day(1).unwrap_or(date)),
            Self::Daily => Partition::Day(date),
        }
    }
}

impl Partition {
    pub fn kind(self) -> PartitionKind {
        match self {
            Self::Month(_) => PartitionKind::Monthly,
            Self::Day(_) => PartitionKind::Daily,
        }
    }

    /// The first day the partition covers.
    pub fn first_day(self) -> NaiveDate {
        match self {
            Self::Month(d) | Self::Day(d) => d,
        }
    }

    pub fn succ(self) -> Option<Self> {
        match self {
            Self::Month(d) => d.checked_add_months(Months::new(1)).map(Self::Month),
            Self::Day(d) => d.succ_opt().map(Self::Day),
        }
    }

    pub fn pred(self) -> Option<Self> {
        match self {
            Self::Month(d) => d.checked_sub_months(Months::new(1)).map(Self::Month),
            Self::Day(d) => d.pred_opt().map(Self::Day),
        }
    }

    /// How many partitions lie from `self` to `to`, both included (0 if reversed).
    pub fn count_to(self, to: Self) -> u64 {
        if to < self {
            return 0;
        }
        let (a, b) = (self.first_day(), to.first_day());
        let n = match self {
            Self::Month(_) => {
                i64::from(b.year() - a.year()) * 12 + i64::from(b.month()) - i64::from(a.month())
            }
            Self::Day(_) => (b - a).num_days(),
        };
        u64::try_from(n).map_or(0, |n| n + 1)
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Month(d) => write!(f, "{:04}-{:02}", d.year(), d.month()),
            Self::Day(d) => write!(f, "{:04}-{:02}-{:02}", d.year(), d.month(), d.day()),
        }
    }
}

/// A pipeline's partitions: every key from `start` on, up to the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSet {
    pub kind: PartitionKind,
    pub start: Partition,
}

/// Which partition a scheduled fire fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fills {
    /// The partition before the one the fire falls in (yesterday, last month).
    Previous,
    /// The partition the fire falls in.
    Current,
}

impl Fills {
    pub fn parse_name(name: &str) -> Option<Self> {
        match name {
            "previous" => Some(Self::Previous),
            "current" => Some(Self::Current),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Previous => "previous",
            Self::Current => "current",
        }
    }
}

impl PartitionSet {
    pub fn new(kind: PartitionKind, start: &str) -> Result<Self> {
        Ok(Self {
            kind,
            start: kind.parse(start)?,
        })
    }

    /// The partition that `now` falls in on the wall clock of `tz`.
    pub fn current(&self, now: DateTime<Utc>, tz: Tz) -> Partition {
        self.kind.containing(now.with_timezone(&tz).date_naive())
    }

    /// The partition a fire at `fire_at` fills, or `None` when that partition
    /// comes before the pipeline's first one.
    pub fn for_fire(&self, fire_at: DateTime<Utc>, tz: Tz, fills: Fills) -> Option<Partition> {
        let here = self.current(fire_at, tz);
        let p = match fills {
            Fills::Current => Some(here),
            Fills::Previous => here.pred(),
        }?;
        (p >= self.start).then_some(p)
    }

    /// Maps the partitions an upstream snapshot holds onto this set: a day
    /// goes to the month that contains it (monthly), a month to each of its
    /// days (daily). Values that are neither, and partitions outside the set
    /// (before `start`, after `current`), are left out.
    pub fn map_upstream(&self, upstream: &[String], current: Partition) -> Vec<Partition> {
        let mut out = Vec::new();
        for u in upstream.iter().map(|u| u.trim()) {
            let mapped: Vec<Partition> =
                if let Ok(Partition::Day(d)) = PartitionKind::Daily.parse(u) {
                    vec![self.kind.containing(d)]
                } else if let Ok(Partition::Month(m)) = PartitionKind::Monthly.parse(u) {
                    match self.kind {
                        PartitionKind::Monthly => vec![Partition::Month(m)],
                        PartitionKind::Daily => {
                            let mut days = Vec::new();
                            let mut d = Some(Partition::Day(m));
                            while let Some(day) = d.filter(|x| x.first_day().month() == m.month()) {
                                days.push(day);
                                d = day.succ();
                            }
                            days
                        }
                    }
                } else {
                    Vec::new()
                };
            out.extend(
                mapped
                    .into_iter()
                    .filter(|p| *p >= self.start && *p <= current),
            );
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    fn describe(&self, current: Partition) -> String {
        format!("{} from {} to {}", self.kind.name(), self.start, current)
    }

    /// Expands a spec into sorted, distinct partitions, all inside the set
    /// (from `start` to `current`), at most `max` of them.
    pub fn expand(
        &self,
        pipeline: &str,
        spec: &str,
        current: Partition,
        max: u64,
    ) -> Result<Vec<Partition>> {
        let malformed = |reason: String| Error::MalformedSpec {
            spec: spec.to_string(),
            reason,
        };
        let inside = |p: Partition| -> Result<Partition> {
            if p < self.start || p > current {
                Err(Error::OutsideSet {
                    value: p.to_string(),
                    pipeline: pipeline.to_string(),
                    set: self.describe(current),
                })
            } else {
                Ok(p)
            }
        };
        if spec.trim().is_empty() {
            return Err(malformed("it names no partition".into()));
        }
        let mut ranges: Vec<(Partition, Partition)> = Vec::new();
        for item in spec.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(malformed("an item between commas is empty".into()));
            }
            if item == "@all" {
                if current < self.start {
                    return Err(malformed(format!(
                        "@all is empty: the pipeline starts at {}, after the current partition {}",
                        self.start, current
                    )));
                }
                ranges.push((self.start, current));
            } else if let Some((a, b)) = item.split_once("..") {
                let (a, b) = (a.trim(), b.trim());
                if a.is_empty() || b.is_empty() {
                    return Err(malformed(format!(
                        "range '{item}' needs a partition on both sides of '..'"
                    )));
                }
                let (a, b) = (self.kind.parse(a)?, self.kind.parse(b)?);
                if b < a {
                    return Err(malformed(format!(
                        "range '{item}' ends before it starts; write it as {b}..{a}"
                    )));
                }
                ranges.push((inside(a)?, inside(b)?));
            } else if item.starts_with('@') {
                return Err(malformed(format!(
                    "unknown keyword '{item}' (the only one is @all)"
                )));
            } else {
                let p = inside(self.kind.parse(item)?)?;
                ranges.push((p, p));
            }
        }
        let count: u64 = ranges.iter().map(|(a, b)| a.count_to(*b)).sum();
        if count > max {
            return Err(Error::TooManyPartitions {
                spec: spec.to_string(),
                count,
                max,
            });
        }
        let mut out = Vec::new();
        for (a, b) in ranges {
            let mut p = Some(a);
            while let Some(cur) = p.filter(|x| *x <= b) {
                out.push(cur);
                p = cur.succ();
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn month(s: &str) -> Partition {
        PartitionKind::Monthly.parse(s).expect("valid month")
    }

    fn names(v: &[Partition]) -> Vec<String> {
        v.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn parses_strictly() {
        assert_eq!(month("2024-01").to_string(), "2024-01");
        for bad in [
            "2024-1",
            "2024-13",
            "2024-00",
            "24-01",
            "2024/01",
            "2024-01-01",
            "0000-01",
        ] {
            let e = PartitionKind::Monthly.parse(bad).expect_err(bad);
            assert_eq!(e.sqlstate(), "OR020", "{bad}");
            assert!(e.to_string().contains(bad));
        }
        assert!(PartitionKind::Daily.parse("2024-02-29").is_ok());
        for bad in [
            "2023-02-29",
            "2024-02-30",
            "2024-2-01",
            "2024-02-1",
            "2024-02",
        ] {
            assert_eq!(
                PartitionKind::Daily.parse(bad).expect_err(bad).sqlstate(),
                "OR020"
            );
        }
    }

    #[test]
    fn expands_ranges_lists_and_all() {
        let set = PartitionSet::new(PartitionKind::Monthly, "2024-01").expect("set");
        let cur = month("2024-08");
        let got = set
            .expand("lake", "2024-01..2024-06", cur, 100)
            .expect("range");
        assert_eq!(
            names(&got),
            ["2024-01", "2024-02", "2024-03", "2024-04", "2024-05", "2024-06"]
        );
        let got = set
            .expand("lake", " 2024-03 , 2024-01,2024-03", cur, 100)
            .expect("list");
        assert_eq!(names(&got), ["2024-01", "2024-03"]);
        let got = set.expand("lake", "@all", cur, 100).expect("all");
        assert_eq!(got.len(), 8);
        assert_eq!(
            got.last().map(ToString::to_string).as_deref(),
            Some("2024-08")
        );
    }

    #[test]
    fn refuses_bad_specs() {
        let set = PartitionSet::new(PartitionKind::Monthly, "2024-01").expect("set");
        let cur = month("2024-08");
        let code = |spec: &str| set.expand("lake", spec, cur, 5).expect_err(spec).sqlstate();
        assert_eq!(code(""), "OR021");
        assert_eq!(code("2024-01,,2024-02"), "OR021");
        assert_eq!(code("2024-06..2024-01"), "OR021");
        assert_eq!(code("2024-01.."), "OR021");
        assert_eq!(code("@everything"), "OR021");
        assert_eq!(code("2024-1"), "OR020");
        assert_eq!(code("2023-12"), "OR022");
        assert_eq!(code("2024-09"), "OR022");
        assert_eq!(code("2023-11..2024-02"), "OR022");
        assert_eq!(code("@all"), "OR023");
        let e = set.expand("lake", "2023-12", cur, 5).expect_err("outside");
        assert_eq!(
            e.to_string(),
            "partition '2023-12' is outside the partitions of pipeline 'lake' (monthly from 2024-01 to 2024-08)"
        );
    }

    #[test]
    fn counts_without_iterating_huge_ranges() {
        let set = PartitionSet::new(PartitionKind::Daily, "0001-01-01").expect("set");
        let cur = PartitionKind::Daily.parse("9999-12-31").expect("day");
        let e = set
            .expand("d", "0001-01-01..9999-12-31", cur, 100_000)
            .expect_err("too many");
        assert_eq!(e.sqlstate(), "OR023");
        assert!(e.to_string().contains("3652059"), "{e}");
    }

    #[test]
    fn upstream_days_map_to_months_and_months_to_days() {
        let monthly = PartitionSet::new(PartitionKind::Monthly, "2024-01").expect("set");
        let cur = month("2024-06");
        let got = monthly.map_upstream(
            &[
                "2024-02-03".into(),
                "2024-02-28".into(),
                "2024-03".into(),
                "*".into(),
                "2023-12-31".into(),
            ],
            cur,
        );
        assert_eq!(names(&got), ["2024-02", "2024-03"]);
        let daily = PartitionSet::new(PartitionKind::Daily, "2024-02-27").expect("set");
        let today = PartitionKind::Daily.parse("2024-06-01").expect("day");
        let got = daily.map_upstream(&["2024-02".into()], today);
        assert_eq!(names(&got), ["2024-02-27", "2024-02-28", "2024-02-29"]);
    }

    #[test]
    fn fires_fill_previous_or_current_in_the_schedule_zone() {
        let set = PartitionSet::new(PartitionKind::Daily, "2024-01-01").expect("set");
        let kolkata: Tz = "Asia/Kolkata".parse().expect("tz");
        // 19:00 UTC on 9 March is 00:30 on 10 March in Kolkata.
        let fire = Utc
            .with_ymd_and_hms(2024, 3, 9, 19, 0, 0)
            .single()
            .expect("time");
        let cur = set.for_fire(fire, kolkata, Fills::Current).expect("inside");
        assert_eq!(cur.to_string(), "2024-03-10");
        let prev = set
            .for_fire(fire, kolkata, Fills::Previous)
            .expect("inside");
        assert_eq!(prev.to_string(), "2024-03-09");
        let before = Utc
            .with_ymd_and_hms(2024, 1, 1, 3, 0, 0)
            .single()
            .expect("time");
        assert_eq!(set.for_fire(before, Tz::UTC, Fills::Previous), None);
    }
}
