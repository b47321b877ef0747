//! The errors users see, each with its own SQLSTATE.
//!
//! The extension turns an [`Error`] into an envelope that the SQL layer raises
//! with `RAISE ... USING ERRCODE`, because pgrx can only raise the SQLSTATEs
//! PostgreSQL itself defines. The codes live in class `OR`, which SQL leaves to
//! implementations; [`crate::sqlstate`] lists them once and `docs/errors.md`
//! documents them.

use serde_json::{json, Value};

use crate::sqlstate::{self, SqlState};

/// Every error the control plane's pure logic can report about user input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("malformed partition '{value}': expected {expected}")]
    MalformedPartition {
        value: String,
        expected: &'static str,
    },

    #[error("malformed partition list '{spec}': {reason}")]
    MalformedSpec { spec: String, reason: String },

    #[error("malformed key list '{spec}': {reason}")]
    MalformedKeys { spec: String, reason: String },

    #[error("partition '{value}' is outside the partitions of pipeline '{pipeline}' ({set})")]
    OutsideSet {
        value: String,
        pipeline: String,
        set: String,
    },

    #[error("'{spec}' names {count} partitions, more than the limit of {max}")]
    TooManyPartitions { spec: String, count: u64, max: u64 },

    #[error("unparsable cron expression '{expr}': {reason}")]
    BadCron { expr: String, reason: String },

    #[error("cron expression '{expr}' can never match")]
    ImpossibleCron { expr: String },

    #[error("unknown time zone '{tz}'")]
    UnknownTimeZone { tz: String },

    #[error("malformed manifest: {field}: {reason}")]
    BadManifest { field: String, reason: String },

    #[error("unknown {side} connector '{name}' (built in: {known})")]
    UnknownConnector {
        side: &'static str,
        name: String,
        known: String,
    },

    #[error("the {connector} {side} needs option '{option}'")]
    MissingOption {
        side: &'static str,
        connector: &'static str,
        option: String,
    },

    #[error("stream '{stream}' cannot be delivered {required} from the {from} source to the {to} destination: {reason}")]
    ImpossibleDelivery {
        stream: String,
        required: &'static str,
        from: &'static str,
        to: &'static str,
        reason: String,
    },

    #[error("malformed sync: {field}: {reason}")]
    BadSync { field: String, reason: String },
}

impl Error {
    /// The SQLSTATE the SQL API raises this error with.
    pub fn state(&self) -> SqlState {
        match self {
            Error::MalformedPartition { .. } => sqlstate::MALFORMED_PARTITION,
            Error::MalformedSpec { .. } | Error::MalformedKeys { .. } => sqlstate::MALFORMED_SPEC,
            Error::OutsideSet { .. } => sqlstate::OUTSIDE_SET,
            Error::TooManyPartitions { .. } => sqlstate::TOO_MANY_PARTITIONS,
            Error::BadCron { .. } => sqlstate::BAD_CRON,
            Error::ImpossibleCron { .. } => sqlstate::IMPOSSIBLE_CRON,
            Error::UnknownTimeZone { .. } => sqlstate::UNKNOWN_TIME_ZONE,
            Error::BadManifest { .. } => sqlstate::BAD_MANIFEST,
            Error::UnknownConnector { .. } => sqlstate::UNKNOWN_CONNECTOR,
            Error::MissingOption { .. } => sqlstate::MISSING_OPTION,
            Error::ImpossibleDelivery { .. } => sqlstate::IMPOSSIBLE_DELIVERY,
            Error::BadSync { .. } => sqlstate::BAD_SYNC,
        }
    }

    /// The code of [`Error::state`], as the SQL layer raises it.
    pub fn sqlstate(&self) -> &'static str {
        self.state().code
    }

    /// A hint that tells the user how to fix the input, where one helps.
    pub fn hint(&self) -> Option<String> {
        match self {
            Error::MalformedPartition { .. } | Error::MalformedSpec { .. } => Some(
                "write one partition ('2024-01'), a comma list ('2024-01,2024-03'), \
                 an inclusive range ('2024-01..2024-06') or '@all'"
                    .into(),
            ),
            Error::MalformedKeys { .. } => {
                Some("name keys separated by commas ('log-0001,log-0002') or give '@all'".into())
            }
            Error::TooManyPartitions { .. } => {
                Some("split the request, or raise orca.max_partitions".into())
            }
            Error::BadCron { .. } => Some(
                "use five fields (minute hour day-of-month month day-of-week) \
                 or one of @yearly @monthly @weekly @daily @hourly"
                    .into(),
            ),
            Error::ImpossibleCron { .. } => {
                Some("the fields name a date that does not exist, such as 30 February".into())
            }
            Error::UnknownTimeZone { .. } => Some(
                "use an IANA time zone name such as 'UTC', 'Europe/London' or 'America/New_York'"
                    .into(),
            ),
            Error::BadManifest { .. } => Some("docs/manifest.md describes every field".into()),
            Error::ImpossibleDelivery { .. } => Some(
                "ask for a weaker delivery, or write with merge and a primary key, or pick a destination that applies epochs".into(),
            ),
            Error::UnknownConnector { .. }
            | Error::MissingOption { .. }
            | Error::BadSync { .. } => Some("docs/syncs.md lists the connectors and their options".into()),
            Error::OutsideSet { .. } => None,
        }
    }

    /// The envelope the SQL layer unwraps: `{"error": {code, message, hint}}`.
    pub fn envelope(&self) -> Value {
        json!({ "error": {
            "code": self.sqlstate(),
            "message": self.to_string(),
            "hint": self.hint(),
        }})
    }
}

/// Wraps a successful value the way [`Error::envelope`] wraps a failure.
pub fn ok_envelope(value: Value) -> Value {
    json!({ "ok": value })
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
