//! Small helpers every part of the engine shares: reading a sync
//! definition's JSON, Postgres errors as text, SQL identifiers.

use serde_json::Value;

/// A key a definition's object must have, missing (or not a string).
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

/// A string in a definition's object.
pub(crate) fn str_of(v: &Value, key: &str) -> Result<String, Missing> {
    v.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| Missing {
            key: key.to_string(),
            value: v.to_string(),
        })
}

/// A list of strings in a definition's object (empty when absent).
pub(crate) fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
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

/// Two lanes of an id as 32 lowercase hex digits, as `{:016x}{:016x}`.
pub(crate) fn id_hex(a: u64, b: u64) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, lane) in [a, b].into_iter().enumerate() {
        for j in 0..16 {
            out[i * 16 + j] = DIGITS[((lane >> (60 - 4 * j)) & 0xf) as usize];
        }
    }
    out
}

/// The same, as a string.
pub(crate) fn id_text(a: u64, b: u64) -> String {
    String::from_utf8_lossy(&id_hex(a, b)).into_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_missing_key_names_the_key_and_the_object() {
        let v = json!({"type": "files", "n": 3});
        assert_eq!(str_of(&v, "type").ok().as_deref(), Some("files"));
        // Not a string counts as missing: a definition's url is text.
        let e = str_of(&v, "n").expect_err("n is a number");
        assert_eq!(e.to_string(), r#"'n' is missing in {"n":3,"type":"files"}"#);
        assert_eq!(strings(&json!({"k": ["a", 1, "b"]}), "k"), ["a", "b"]);
        assert!(strings(&v, "k").is_empty());
    }

    #[test]
    fn identifiers_are_quoted_with_their_quotes_doubled() {
        assert_eq!(quote_ident("Order \"x\""), "\"Order \"\"x\"\"\"");
    }
}
