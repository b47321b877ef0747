//! Keyed partitions: a pipeline partitioned by the distinct values of a
//! column in a dataset rather than by dates. A key is a `Name`: 1 to 128 bytes
//! of ASCII letters, digits and `._:-`, so that it is safe in a file name, a
//! URL and a comma list.

use crate::error::{Error, Result};

/// The longest key, in bytes.
pub const KEY_MAX: usize = 128;
/// How many keys one run covers when the pipeline does not say.
pub const KEYS_PER_RUN_DEFAULT: i64 = 100;
/// A bound on `keys_per_run`: more keys than this in one run is one run too big.
pub const KEYS_PER_RUN_MAX: i64 = 100_000;

/// What a key must look like, for messages.
pub const KEY_SHAPE: &str = "a key: 1 to 128 bytes of letters, digits and ._:-";

/// Whether `s` is a valid key.
pub fn valid_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= KEY_MAX
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Checks one key, with an error that names it.
pub fn check_key(s: &str) -> Result<&str> {
    if valid_key(s) {
        Ok(s)
    } else {
        Err(Error::MalformedPartition {
            value: s.to_string(),
            expected: KEY_SHAPE,
        })
    }
}

/// The keys a spec names for a keyed pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// `@all`: every key of the dataset's current snapshot.
    All,
    /// Named keys, in the order given, without repeats.
    Names(Vec<String>),
}

/// Parses `a,b,c` or `@all`. Ranges mean nothing for keys and are refused;
/// whether each name is a key is for the caller, who knows the keys, to check
/// (`known` answers it: a name that is not a key but contains `..` is reported
/// as a range).
pub fn parse_spec(spec: &str, known: impl Fn(&str) -> bool) -> Result<KeySpec> {
    let malformed = |reason: String| Error::MalformedKeys {
        spec: spec.to_string(),
        reason,
    };
    if spec.trim().is_empty() {
        return Err(malformed("it names no key".into()));
    }
    let mut names: Vec<String> = Vec::new();
    let items: Vec<&str> = spec.split(',').map(str::trim).collect();
    if items.contains(&"@all") {
        if items.len() > 1 {
            return Err(malformed(
                "@all already names every key; give it alone".into(),
            ));
        }
        return Ok(KeySpec::All);
    }
    for item in items {
        if item.is_empty() {
            return Err(malformed("an item between commas is empty".into()));
        }
        if item.starts_with('@') {
            return Err(malformed(format!(
                "unknown keyword '{item}' (the only one is @all)"
            )));
        }
        if item.contains("..") && !known(item) {
            return Err(malformed(format!(
                "'{item}' is a range, and a keyed pipeline's keys have no order: name each key"
            )));
        }
        check_key(item)?;
        if !names.iter().any(|n| n == item) {
            names.push(item.to_string());
        }
    }
    Ok(KeySpec::Names(names))
}

/// Splits keys into runs of at most `per_run`, in order.
pub fn chunks(keys: &[String], per_run: usize) -> Vec<Vec<String>> {
    keys.chunks(per_run.max(1))
        .map(<[String]>::to_vec)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_short_safe_names() {
        assert!(valid_key("log-0001"));
        assert!(valid_key("a.b_c:d-E9"));
        assert!(valid_key(&"x".repeat(128)));
        assert!(!valid_key(&"x".repeat(129)));
        assert!(!valid_key(""));
        assert!(!valid_key("with space"));
        assert!(!valid_key("slash/no"));
        assert!(!valid_key("é"));
        let e = check_key("bad key").expect_err("refused");
        assert_eq!(e.sqlstate(), "OR020");
        assert!(e.to_string().contains("'bad key'"), "{e}");
    }

    #[test]
    fn specs_name_keys_or_all() {
        let none = |_: &str| false;
        assert_eq!(parse_spec("@all", none), Ok(KeySpec::All));
        assert_eq!(
            parse_spec(" b, a ,b", none),
            Ok(KeySpec::Names(vec!["b".into(), "a".into()]))
        );
        let range = parse_spec("a..c", none).expect_err("a range");
        assert_eq!(range.sqlstate(), "OR021");
        assert!(range.to_string().contains("'a..c' is a range"), "{range}");
        // A key that happens to contain `..` is still a key.
        assert_eq!(
            parse_spec("v1..2", |k| k == "v1..2"),
            Ok(KeySpec::Names(vec!["v1..2".into()]))
        );
        assert_eq!(
            parse_spec("a,,b", none).map_err(|e| e.sqlstate()),
            Err("OR021")
        );
        assert_eq!(
            parse_spec("@all,a", none).map_err(|e| e.sqlstate()),
            Err("OR021")
        );
        assert_eq!(
            parse_spec("@some", none).map_err(|e| e.sqlstate()),
            Err("OR021")
        );
        assert_eq!(parse_spec("", none).map_err(|e| e.sqlstate()), Err("OR021"));
        assert_eq!(
            parse_spec("a b", none).map_err(|e| e.sqlstate()),
            Err("OR020")
        );
    }

    #[test]
    fn chunks_keep_order() {
        let keys: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
        let c = chunks(&keys, 2);
        assert_eq!(c.len(), 3);
        assert_eq!(c[2], vec!["k4".to_string()]);
    }
}
