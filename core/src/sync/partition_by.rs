//! How an Iceberg destination's table is partitioned: a stream's
//! `partition_by`, each field written as Iceberg and Spark write a
//! partition transform (`day(updated_at)`, `bucket(16, id)`,
//! `truncate(4, name)`, or a bare column for its value itself).

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a partition value is made from a column's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionTransform {
    /// The value itself.
    Identity,
    Year,
    Month,
    Day,
    Hour,
    /// A hash of the value into this many buckets.
    Bucket(u32),
    /// The value cut to this width (text: its first N characters).
    Truncate(u32),
}

/// One field of a table's partitioning: a destination column and its
/// transform, kept as written (`day(updated_at)`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PartitionBy {
    pub column: String,
    pub transform: PartitionTransform,
}

/// The most partition fields a stream's table may have.
pub const PARTITION_FIELDS_MAX: usize = 8;

/// What a transform's argument count may be.
const ARG_MAX: u32 = i32::MAX as u32;

impl PartitionBy {
    /// Reads `day(updated_at)`, `bucket(16, id)`, `truncate(4, name)` or a
    /// bare column; the error says what is wrong with the text.
    pub fn parse(text: &str) -> Result<PartitionBy, String> {
        let text = text.trim();
        let (name, args) = match text.split_once('(') {
            None => ("identity", text),
            Some((name, rest)) => {
                let args = rest
                    .strip_suffix(')')
                    .ok_or_else(|| format!("{text:?} opens a parenthesis it does not close"))?;
                (name.trim(), args)
            }
        };
        let args: Vec<&str> = args.split(',').map(str::trim).collect();
        let one = |t: PartitionTransform| match args.as_slice() {
            [column] => Ok((t, *column)),
            _ => Err(format!(
                "{text:?}: {name} takes one column, such as {name}(updated_at)"
            )),
        };
        let sized = |make: fn(u32) -> PartitionTransform| match args.as_slice() {
            [n, column] => n
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=ARG_MAX).contains(n))
                .map(|n| (make(n), *column))
                .ok_or_else(|| {
                    format!("{text:?}: {n:?} is not a whole number from 1 to {ARG_MAX}")
                }),
            _ => Err(format!(
                "{text:?}: {name} takes a number and a column, such as {name}(16, id)"
            )),
        };
        let (transform, column) = match name.to_ascii_lowercase().as_str() {
            "identity" => one(PartitionTransform::Identity)?,
            "year" | "years" => one(PartitionTransform::Year)?,
            "month" | "months" => one(PartitionTransform::Month)?,
            "day" | "days" => one(PartitionTransform::Day)?,
            "hour" | "hours" => one(PartitionTransform::Hour)?,
            "bucket" => sized(PartitionTransform::Bucket)?,
            "truncate" => sized(PartitionTransform::Truncate)?,
            other => {
                return Err(format!(
                    "{text:?}: {other:?} is not a partition transform (identity, year, month, \
                     day, hour, bucket(N, column), truncate(N, column))"
                ))
            }
        };
        if column.is_empty()
            || column.chars().count() > 255
            || column.contains(['(', ')', ',', '"'])
        {
            return Err(format!("{text:?}: {column:?} is not a column name"));
        }
        Ok(PartitionBy {
            column: column.to_string(),
            transform,
        })
    }

    /// Two fields that would give the table the same partition field.
    pub fn same_field(&self, other: &PartitionBy) -> bool {
        self.column == other.column
            && std::mem::discriminant(&self.transform) == std::mem::discriminant(&other.transform)
    }
}

impl fmt::Display for PartitionBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.column;
        match self.transform {
            PartitionTransform::Identity => write!(f, "{c}"),
            PartitionTransform::Year => write!(f, "year({c})"),
            PartitionTransform::Month => write!(f, "month({c})"),
            PartitionTransform::Day => write!(f, "day({c})"),
            PartitionTransform::Hour => write!(f, "hour({c})"),
            PartitionTransform::Bucket(n) => write!(f, "bucket({n}, {c})"),
            PartitionTransform::Truncate(n) => write!(f, "truncate({n}, {c})"),
        }
    }
}

impl TryFrom<String> for PartitionBy {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        PartitionBy::parse(&text)
    }
}

impl From<PartitionBy> for String {
    fn from(p: PartitionBy) -> String {
        p.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transforms_read_as_iceberg_writes_them_and_print_back() {
        for (text, column, transform, printed) in [
            (
                "day(updated_at)",
                "updated_at",
                PartitionTransform::Day,
                "day(updated_at)",
            ),
            (
                "  Month( at ) ",
                "at",
                PartitionTransform::Month,
                "month(at)",
            ),
            ("years(at)", "at", PartitionTransform::Year, "year(at)"),
            ("hour(at)", "at", PartitionTransform::Hour, "hour(at)"),
            ("region", "region", PartitionTransform::Identity, "region"),
            (
                "identity(region)",
                "region",
                PartitionTransform::Identity,
                "region",
            ),
            (
                "bucket(16, id)",
                "id",
                PartitionTransform::Bucket(16),
                "bucket(16, id)",
            ),
            (
                "truncate(4,name)",
                "name",
                PartitionTransform::Truncate(4),
                "truncate(4, name)",
            ),
        ] {
            let p = PartitionBy::parse(text).expect(text);
            assert_eq!(
                (p.column.as_str(), p.transform),
                (column, transform),
                "{text}"
            );
            assert_eq!(p.to_string(), printed);
            assert_eq!(PartitionBy::parse(printed).expect("printed"), p);
        }
    }

    #[test]
    fn malformed_fields_are_refused_naming_the_text() {
        for (text, says) in [
            ("week(at)", "is not a partition transform"),
            ("day(at", "does not close"),
            ("day(a, b)", "takes one column"),
            ("bucket(id)", "takes a number and a column"),
            ("bucket(0, id)", "is not a whole number"),
            ("truncate(x, id)", "is not a whole number"),
            ("day()", "is not a column name"),
            ("", "is not a column name"),
            ("day(a\"b)", "is not a column name"),
        ] {
            let e = PartitionBy::parse(text).expect_err(text);
            assert!(e.contains(says), "{text}: {e}");
        }
        let e = serde_json::from_value::<PartitionBy>(serde_json::json!("week(at)"))
            .expect_err("refused");
        assert!(e.to_string().contains("week"), "{e}");
    }

    #[test]
    fn the_same_field_is_the_same_column_and_kind_of_transform() {
        let p = |t| PartitionBy::parse(t).expect(t);
        assert!(p("bucket(4, id)").same_field(&p("bucket(8, id)")));
        assert!(!p("day(at)").same_field(&p("month(at)")));
        assert!(!p("day(at)").same_field(&p("day(other)")));
    }
}
