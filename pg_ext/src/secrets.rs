//! Envelope encryption of secrets (`orca_core::secret`), with the
//! installation's key read from the file `orca.secrets_key_file` names — a
//! file outside the database, so that neither a dump nor any `SELECT` holds
//! a key that opens the ciphertext. Internal functions: `sql/security.sql`
//! calls them. Each returns an envelope (`{"ok": ...}` or `{"error": ...}`)
//! that `orca._unwrap` raises with its SQLSTATE; bytes travel as hex.

use orca_core::secret::{self, KeyBytes, Keys, SecretError};
use orca_core::sqlstate;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::{json, Value};

use crate::gucs;

fn fail(code: sqlstate::SqlState, message: String, hint: &str) -> JsonB {
    JsonB(json!({"error": {"code": code.code, "message": message, "hint": hint}}))
}

fn ok(v: Value) -> JsonB {
    JsonB(json!({ "ok": v }))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn read_key(path: &str) -> Result<KeyBytes, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the key file {path}: {e}"))?;
    secret::parse_key(&text).map_err(|e| format!("{path}: {e}"))
}

/// The installation keys this server is configured with.
fn keys() -> Result<Keys, JsonB> {
    let hint = "an admin writes 32 random bytes as hex to a file the server can read \
                (openssl rand -hex 32) and sets orca.secrets_key_file to it; docs/security.md";
    let Some(path) = gucs::SECRETS_KEY_FILE.get() else {
        return Err(fail(
            sqlstate::SECRETS_NOT_SET_UP,
            "secrets are not set up: orca.secrets_key_file is not set".into(),
            hint,
        ));
    };
    let path = path.to_string_lossy().to_string();
    let current = read_key(&path).map_err(|m| fail(sqlstate::SECRETS_NOT_SET_UP, m, hint))?;
    let previous = match gucs::SECRETS_PREVIOUS_KEY_FILE.get() {
        Some(p) => Some(
            read_key(&p.to_string_lossy())
                .map_err(|m| fail(sqlstate::SECRETS_NOT_SET_UP, m, hint))?,
        ),
        None => None,
    };
    Ok(Keys { current, previous })
}

fn secret_error(e: SecretError) -> JsonB {
    fail(
        sqlstate::SECRET_UNREADABLE,
        e.to_string(),
        "docs/security.md: rotating the installation key",
    )
}

/// A new data key for an org, wrapped by the installation key (hex).
#[pg_extern(volatile, name = "_new_data_key")]
fn new_data_key(org: i64) -> JsonB {
    match keys() {
        Err(e) => e,
        Ok(k) => match secret::new_wrapped_data_key(&k.current, org) {
            Ok(w) => ok(json!(hex(&w))),
            Err(e) => secret_error(e),
        },
    }
}

/// A secret's value sealed with its org's data key (hex).
#[pg_extern(volatile, name = "_seal_secret")]
fn seal_secret(wrapped: &[u8], org: i64, name: &str, value: &str) -> JsonB {
    match keys() {
        Err(e) => e,
        Ok(k) => match k.seal(wrapped, org, name, value) {
            Ok(s) => ok(json!(hex(&s))),
            Err(e) => secret_error(e),
        },
    }
}

/// A secret's value.
#[pg_extern(volatile, name = "_open_secret")]
fn open_secret(wrapped: &[u8], org: i64, name: &str, sealed: &[u8]) -> JsonB {
    match keys() {
        Err(e) => e,
        Ok(k) => match k.open(wrapped, org, name, sealed) {
            Ok(v) => ok(json!(v)),
            Err(e) => secret_error(e),
        },
    }
}

/// The org's data key wrapped by the current installation key (hex), and
/// whether it had to change.
#[pg_extern(volatile, name = "_rewrap_data_key")]
fn rewrap_data_key(wrapped: &[u8], org: i64) -> JsonB {
    match keys() {
        Err(e) => e,
        Ok(k) if k.is_current(wrapped) => ok(json!({"wrapped": hex(wrapped), "changed": false})),
        Ok(k) => match k.rewrap(wrapped, org) {
            Ok(w) => ok(json!({"wrapped": hex(&w), "changed": true})),
            Err(e) => secret_error(e),
        },
    }
}

/// Where a stored sync definition keeps a password in plain text.
#[pg_extern(immutable, parallel_safe, name = "_inline_passwords")]
fn inline_passwords(definition: JsonB) -> Vec<String> {
    let d = &definition.0;
    let mut at = secret::inline_passwords("source", d.get("source").unwrap_or(&Value::Null));
    at.extend(secret::inline_passwords(
        "destination",
        d.get("destination").unwrap_or(&Value::Null),
    ));
    at
}
