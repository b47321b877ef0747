//! Partition keys: `Month`, `Day` and `Name`, the inputs of a pipeline's first
//! step.

use std::fmt;
use std::str::FromStr;

use chrono::{Datelike, NaiveDate};
use orca_core::partition::{Partition, PartitionKind};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::SdkError;

/// A partition key type. Keys travel as strings (`2024-01`, `2024-01-15`).
pub trait PartitionKey:
    Serialize + for<'de> Deserialize<'de> + fmt::Display + Clone + Send + 'static
{
    /// `monthly`, `daily` or `keyed`, as manifests spell it.
    const KIND: &'static str;
    fn parse(s: &str) -> Result<Self, SdkError>;
}

/// A calendar month, the key of a `Monthly` pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Month(NaiveDate);

/// A calendar day, the key of a `Daily` pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Day(NaiveDate);

impl Month {
    pub fn year(&self) -> i32 {
        self.0.year()
    }
    pub fn month(&self) -> u32 {
        self.0.month()
    }
    pub fn first_day(&self) -> NaiveDate {
        self.0
    }
    /// How many days the month has.
    pub fn days(&self) -> u32 {
        let next = self
            .0
            .checked_add_months(chrono::Months::new(1))
            .unwrap_or(NaiveDate::MAX);
        u32::try_from((next - self.0).num_days()).unwrap_or(0)
    }
    /// Its days, in order.
    pub fn each_day(&self) -> impl Iterator<Item = Day> {
        let first = self.0;
        (0..self.days()).filter_map(move |i| {
            first
                .checked_add_days(chrono::Days::new(u64::from(i)))
                .map(Day)
        })
    }
}

impl Day {
    pub fn date(&self) -> NaiveDate {
        self.0
    }
    /// The month the day falls in.
    pub fn month(&self) -> Month {
        Month(self.0.with_day(1).unwrap_or(self.0))
    }
}

/// A key of a keyed pipeline: 1 to 128 bytes of ASCII letters, digits and
/// `._:-`, checked when it is made.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(String);

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartitionKey for Name {
    const KIND: &'static str = "keyed";
    fn parse(s: &str) -> Result<Self, SdkError> {
        orca_core::keyed::check_key(s)
            .map(|k| Name(k.to_string()))
            .map_err(|e| SdkError::Usage(e.to_string()))
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn parse_kind(kind: PartitionKind, s: &str) -> Result<NaiveDate, SdkError> {
    match kind.parse(s) {
        Ok(Partition::Month(d)) | Ok(Partition::Day(d)) => Ok(d),
        Err(e) => Err(SdkError::Usage(e.to_string())),
    }
}

impl PartitionKey for Month {
    const KIND: &'static str = "monthly";
    fn parse(s: &str) -> Result<Self, SdkError> {
        parse_kind(PartitionKind::Monthly, s).map(Month)
    }
}

impl PartitionKey for Day {
    const KIND: &'static str = "daily";
    fn parse(s: &str) -> Result<Self, SdkError> {
        parse_kind(PartitionKind::Daily, s).map(Day)
    }
}

impl fmt::Display for Month {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}", self.0.year(), self.0.month())
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.format("%Y-%m-%d"))
    }
}

macro_rules! string_key {
    ($t:ty) => {
        impl FromStr for $t {
            type Err = SdkError;
            fn from_str(s: &str) -> Result<Self, SdkError> {
                <$t as PartitionKey>::parse(s)
            }
        }
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                <$t as PartitionKey>::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}
string_key!(Month);
string_key!(Day);
string_key!(Name);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_as_strings() {
        let m: Month = "2024-02".parse().expect("month");
        assert_eq!(m.days(), 29);
        assert_eq!(serde_json::to_string(&m).expect("json"), "\"2024-02\"");
        let back: Month = serde_json::from_str("\"2024-02\"").expect("back");
        assert_eq!(back, m);
        assert_eq!(m.each_day().count(), 29);
        let d: Day = "2024-02-29".parse().expect("day");
        assert_eq!(d.month(), m);
        assert!("2024-2".parse::<Month>().is_err());
    }

    #[test]
    fn names_are_checked() {
        let n: Name = "log-0001".parse().expect("name");
        assert_eq!(n.as_str(), "log-0001");
        assert_eq!(serde_json::to_string(&n).expect("json"), "\"log-0001\"");
        let e = "log 1".parse::<Name>().expect_err("space");
        assert!(e.to_string().contains("'log 1'"), "{e}");
        assert!(serde_json::from_str::<Name>("\"\"").is_err());
        assert!("x".repeat(129).parse::<Name>().is_err());
    }
}
