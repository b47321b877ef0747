//! Cron schedules matched on a time zone's wall clock.
//!
//! croner does the matching, including daylight-saving behaviour: a time a
//! spring-forward skips fires at the end of the gap, and a fixed time that a
//! fall-back repeats fires once (patterns with a wildcard hour fire in both
//! repeated hours, because those are distinct real hours).

use std::str::FromStr;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

use crate::error::{Error, Result};

/// A validated cron expression with its time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    tz: Tz,
}

/// Parses an IANA time zone name.
pub fn parse_tz(name: &str) -> Result<Tz> {
    Tz::from_str(name).map_err(|_| Error::UnknownTimeZone {
        tz: name.to_string(),
    })
}

impl Schedule {
    /// Parses five-field cron (or an `@daily`-style nickname) in `tz`, and
    /// refuses an expression that can never match.
    pub fn parse(expr: &str, tz: &str) -> Result<Self> {
        let tz = parse_tz(tz)?;
        let trimmed = expr.trim();
        let bad = |reason: String| Error::BadCron {
            expr: expr.to_string(),
            reason,
        };
        if !trimmed.starts_with('@') {
            let fields = trimmed.split_whitespace().count();
            if fields != 5 {
                return Err(bad(format!(
                    "expected 5 fields (minute hour day-of-month month day-of-week), found {fields}"
                )));
            }
        }
        let parser = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build();
        let cron = parser.parse(trimmed).map_err(|e| bad(e.to_string()))?;
        let schedule = Self { cron, tz };
        // croner accepts day/month combinations that never occur (30 February);
        // only a search reveals them. The search gives up after a bounded walk
        // (croner's own limit), which a pattern that matches at all never hits.
        let probe = DateTime::<Utc>::from_timestamp(0, 0).unwrap_or_default();
        let found = schedule
            .cron
            .find_next_occurrence(&probe.with_timezone(&tz), false);
        if found.is_err() {
            return Err(Error::ImpossibleCron {
                expr: expr.to_string(),
            });
        }
        Ok(schedule)
    }

    pub fn tz(&self) -> Tz {
        self.tz
    }

    /// The next fire strictly after `after`, if any.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&after.with_timezone(&self.tz), false)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }

    /// The next `n` fires strictly after `after`.
    pub fn next_n(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n.min(1024));
        let mut t = after;
        while out.len() < n {
            match self.next_after(t) {
                Some(next) => {
                    out.push(next);
                    t = next;
                }
                None => break,
            }
        }
        out
    }

    /// The latest fire in `(after, until]`, if any.
    pub fn last_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        self.cron
            .find_previous_occurrence(&until.with_timezone(&self.tz), true)
            .ok()
            .map(|t| t.with_timezone(&Utc))
            .filter(|t| *t > after)
    }

    /// Fires in `(after, until]`, oldest first, at most `max` of them.
    pub fn fires_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        max: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut t = after;
        while out.len() < max {
            match self.next_after(t) {
                Some(next) if next <= until => {
                    out.push(next);
                    t = next;
                }
                _ => break,
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, 0)
            .single()
            .expect("valid time")
    }

    #[test]
    fn refuses_bad_and_impossible_expressions() {
        let code = |e: &str, tz: &str| Schedule::parse(e, tz).expect_err(e).sqlstate();
        assert_eq!(code("0 0 30 2 *", "UTC"), "OR031");
        assert_eq!(code("0 0 31 4,6,9,11 *", "UTC"), "OR031");
        assert_eq!(code("* * *", "UTC"), "OR030");
        assert_eq!(code("0 0 0 * * *", "UTC"), "OR030");
        assert_eq!(code("61 * * * *", "UTC"), "OR030");
        assert_eq!(code("0 0 * * FUNDAY", "UTC"), "OR030");
        assert_eq!(code("@fortnightly", "UTC"), "OR030");
        assert_eq!(code("0 0 * * *", "Mars/Olympus"), "OR032");
        // Leap day exists, however rarely.
        assert!(Schedule::parse("0 0 29 2 *", "UTC").is_ok());
    }

    #[test]
    fn accepts_lists_ranges_steps_names_and_nicknames() {
        for e in [
            "0,30 9-17/2 * JAN-MAR mon-fri",
            "*/15 * * * *",
            "@yearly",
            "@monthly",
            "@weekly",
            "@daily",
            "@hourly",
            "0 3 2 * *",
        ] {
            assert!(Schedule::parse(e, "UTC").is_ok(), "{e}");
        }
        let s = Schedule::parse("0,30 9-17/4 * * mon-fri", "UTC").expect("valid");
        // Monday 2024-03-04.
        let got = s.fires_between(utc(2024, 3, 4, 0, 0), utc(2024, 3, 5, 0, 0), 100);
        let hours: Vec<String> = got.iter().map(|t| t.format("%H:%M").to_string()).collect();
        assert_eq!(
            hours,
            ["09:00", "09:30", "13:00", "13:30", "17:00", "17:30"]
        );
    }

    #[test]
    fn new_york_spring_forward_fires_at_the_end_of_the_gap() {
        let s = Schedule::parse("30 2 * * *", "America/New_York").expect("valid");
        let got = s.fires_between(utc(2024, 3, 9, 12, 0), utc(2024, 3, 11, 12, 0), 10);
        // 02:30 EST on the 9th is 07:30Z; on the 10th 02:30 does not exist, so
        // the fire is 03:00 EDT = 07:00Z; on the 11th 02:30 EDT = 06:30Z.
        assert_eq!(got, [utc(2024, 3, 10, 7, 0), utc(2024, 3, 11, 6, 30)]);
    }

    #[test]
    fn new_york_fall_back_fires_a_fixed_time_once() {
        let s = Schedule::parse("30 1 * * *", "America/New_York").expect("valid");
        let got = s.fires_between(utc(2024, 11, 2, 12, 0), utc(2024, 11, 4, 12, 0), 10);
        assert_eq!(got, [utc(2024, 11, 3, 5, 30), utc(2024, 11, 4, 6, 30)]);
        let hourly = Schedule::parse("0 * * * *", "America/New_York").expect("valid");
        let day = hourly.fires_between(utc(2024, 11, 3, 4, 0), utc(2024, 11, 4, 5, 0), 100);
        assert_eq!(day.len(), 25, "the repeated hour is a real hour: {day:?}");
    }

    #[test]
    fn london_and_kolkata() {
        let s = Schedule::parse("30 1 * * *", "Europe/London").expect("valid");
        let got = s.fires_between(utc(2024, 3, 30, 12, 0), utc(2024, 3, 31, 12, 0), 10);
        // 01:30 GMT does not exist on 31 March: 02:00 BST = 01:00Z.
        assert_eq!(got, [utc(2024, 3, 31, 1, 0)]);
        let k = Schedule::parse("0 9 * * *", "Asia/Kolkata").expect("valid");
        assert_eq!(
            k.next_after(utc(2024, 3, 1, 0, 0)),
            Some(utc(2024, 3, 1, 3, 30))
        );
    }

    #[test]
    fn last_between_finds_the_latest_fire_only() {
        let s = Schedule::parse("0 3 * * *", "UTC").expect("valid");
        assert_eq!(
            s.last_between(utc(2024, 1, 1, 0, 0), utc(2024, 1, 10, 12, 0)),
            Some(utc(2024, 1, 10, 3, 0))
        );
        assert_eq!(
            s.last_between(utc(2024, 1, 10, 3, 0), utc(2024, 1, 10, 12, 0)),
            None
        );
        assert_eq!(
            s.last_between(utc(2024, 1, 10, 2, 0), utc(2024, 1, 10, 3, 0)),
            Some(utc(2024, 1, 10, 3, 0))
        );
    }

    #[test]
    fn bounded_by_max() {
        let s = Schedule::parse("* * * * *", "UTC").expect("valid");
        assert_eq!(
            s.fires_between(utc(2024, 1, 1, 0, 0), utc(2025, 1, 1, 0, 0), 7)
                .len(),
            7
        );
        assert_eq!(s.next_n(utc(2024, 1, 1, 0, 0), 3).len(), 3);
    }
}
