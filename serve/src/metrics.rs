//! `/metrics`: `orca.metrics()` of the caller's org in Prometheus' text
//! exposition format (version 0.0.4). Scrape it with the org's API key
//! (`authorization: {credentials: <key>}` in a scrape config): the series
//! are the org's, as every other answer is.
//!
//! Runners and engines have no endpoint of their own: they report through
//! Postgres (claims and heartbeats, leases, a sync's HEAD), so one scrape
//! of the control plane sees them all, and a runner behind NAT needs no
//! inbound port.

use std::collections::BTreeMap;
use std::fmt::Write;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use sqlx::FromRow;

use crate::error::ApiError;
use crate::session::Session;

/// One series, as `orca.metrics()` returns it.
#[derive(Debug, Clone, FromRow)]
pub struct Series {
    pub metric: String,
    pub kind: String,
    pub help: String,
    pub labels: serde_json::Value,
    pub value: f64,
}

/// The key's org's metrics in Prometheus' text format.
#[utoipa::path(get, path = "/metrics", tag = "server",
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4",
         content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
        (status = 401, description = "No key, or a key refused", body = crate::error::ErrorBody),
    ))]
pub async fn metrics(mut s: Session) -> Result<Response, ApiError> {
    let series: Vec<Series> =
        sqlx::query_as("SELECT metric, kind, help, labels, value FROM orca.metrics()")
            .fetch_all(&mut *s.tx)
            .await?;
    s.commit().await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(&series),
    )
        .into_response())
}

/// The text format: each family's HELP and TYPE once, then its samples.
pub fn render(series: &[Series]) -> String {
    let mut families: BTreeMap<&str, Vec<&Series>> = BTreeMap::new();
    for s in series {
        families.entry(s.metric.as_str()).or_default().push(s);
    }
    let mut out = String::new();
    for (name, samples) in families {
        let first = samples[0];
        let _ = writeln!(out, "# HELP {name} {}", escape_help(&first.help));
        let kind = if first.kind == "counter" {
            "counter"
        } else {
            "gauge"
        };
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for s in samples {
            let _ = writeln!(out, "{name}{} {}", labels(&s.labels), number(s.value));
        }
    }
    out
}

fn labels(v: &serde_json::Value) -> String {
    let Some(map) = v.as_object().filter(|m| !m.is_empty()) else {
        return String::new();
    };
    let parts: Vec<String> = map
        .iter()
        .filter(|(k, _)| valid_label_name(k))
        .map(|(k, v)| {
            let text = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            format!("{k}=\"{}\"", escape_label(&text))
        })
        .collect();
    format!("{{{}}}", parts.join(","))
}

fn valid_label_name(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s(metric: &str, kind: &str, labels: serde_json::Value, value: f64) -> Series {
        Series {
            metric: metric.into(),
            kind: kind.into(),
            help: "Help with a \\ and\na newline.".into(),
            labels,
            value,
        }
    }

    #[test]
    fn families_are_grouped_and_labels_escaped() {
        let text = render(&[
            s(
                "orca_runs",
                "gauge",
                json!({"pipeline": "a\"b\\c\nd", "status": "queued"}),
                3.0,
            ),
            s("orca_leases_lapsed_total", "counter", json!({}), 7.0),
            s(
                "orca_runs",
                "gauge",
                json!({"pipeline": "x", "status": "failed"}),
                0.5,
            ),
        ]);
        assert_eq!(
            text,
            "# HELP orca_leases_lapsed_total Help with a \\\\ and\\na newline.\n\
             # TYPE orca_leases_lapsed_total counter\n\
             orca_leases_lapsed_total 7\n\
             # HELP orca_runs Help with a \\\\ and\\na newline.\n\
             # TYPE orca_runs gauge\n\
             orca_runs{pipeline=\"a\\\"b\\\\c\\nd\",status=\"queued\"} 3\n\
             orca_runs{pipeline=\"x\",status=\"failed\"} 0.5\n"
        );
    }

    #[test]
    fn odd_values_and_label_names() {
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(
            labels(&json!({"ok": 1, "9bad": "x", "web-hook": "y"})),
            "{ok=\"1\"}"
        );
    }
}
