//! Small helpers every part of the engine shares: a definition's missing
//! part, Postgres errors as text, SQL identifiers, the machine's cores.

/// A part a definition's stream must have for its source, missing.
#[derive(Debug, thiserror::Error)]
#[error("'{key}' is missing in {value}")]
pub struct Missing {
    pub key: String,
    /// The object, as JSON text.
    pub value: String,
}

impl Missing {
    /// `key` missing in a part of a typed definition, which the error shows
    /// as the JSON it is stored as.
    pub(crate) fn of(key: &str, part: &impl serde::Serialize) -> Missing {
        Missing {
            key: key.to_string(),
            value: serde_json::to_value(part)
                .map(|v| v.to_string())
                .unwrap_or_default(),
        }
    }
}

/// A Postgres error with the server's message and SQLSTATE, which the
/// error's own Display leaves out ("db error").
pub fn pg_text(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}

/// A Postgres identifier, quoted.
pub(crate) fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// The cores this process may use, asked once: on Linux the answer reads
/// the cgroup's CPU quota files.
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_missing_part_names_the_key_and_shows_the_part_as_stored() {
        let e = Missing::of(
            "cursor",
            &json!({"name": "orders", "table": "public.orders"}),
        );
        assert_eq!(
            e.to_string(),
            r#"'cursor' is missing in {"name":"orders","table":"public.orders"}"#
        );
    }

    #[test]
    fn identifiers_are_quoted_with_their_quotes_doubled() {
        assert_eq!(quote_ident("Order \"x\""), "\"Order \"\"x\"\"\"");
    }
}
