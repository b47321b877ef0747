//! Netguard's rules in SQL (`orca_core::netguard` decides): the allowlist's
//! entries as `orca.allow` normalises them, and the judgement of a sync's
//! definition that `orca.create_sync` makes before anything is resolved.
//! Internal functions: `sql/security.sql` and `sql/syncs.sql` call them and
//! raise their envelopes' errors with `orca._unwrap`.

use orca_core::netguard::{self, Allowlist, NetguardError, Rule};
use orca_core::sqlstate;
use orca_core::sync::SyncDef;
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::json;

fn fail(code: sqlstate::SqlState, message: String, hint: &str) -> JsonB {
    JsonB(json!({"error": {"code": code.code, "message": message, "hint": hint}}))
}

/// An allowlist entry, normalised: `{"target": "10.0.0.0/8", "kind": "network"}`.
#[pg_extern(immutable, strict, parallel_safe, name = "_allow_rule")]
fn allow_rule(target: &str) -> JsonB {
    match target.parse::<Rule>() {
        Ok(r) => JsonB(json!({"ok": {"target": r.to_string(), "kind": r.kind()}})),
        Err(e) => fail(
            sqlstate::BAD_ALLOWLIST_ENTRY,
            e.to_string(),
            "a host (db.internal, *.corp.example), a network (10.0.0.0/8, 127.0.0.1) or an \
             absolute directory (/srv/data)",
        ),
    }
}

/// Refuses a definition whose hosts written as addresses, Unix sockets or
/// local paths the org's allowlist does not permit (`OR094`).
#[pg_extern(immutable, strict, parallel_safe, name = "_netguard_definition")]
fn netguard_definition(org: &str, definition: JsonB, allowlist: Vec<String>) -> JsonB {
    let def: SyncDef = match serde_json::from_value(definition.0) {
        Ok(d) => d,
        Err(e) => return fail(sqlstate::BAD_SYNC, format!("malformed sync: {e}"), ""),
    };
    let list = match Allowlist::new(org, &allowlist) {
        Ok(l) => l,
        Err(e) => return fail(sqlstate::BAD_ALLOWLIST_ENTRY, e.to_string(), ""),
    };
    match netguard::check_reaches(&list, &def.reaches()) {
        Ok(()) => JsonB(json!({"ok": null})),
        Err(e @ (NetguardError::Refused(_) | NetguardError::PathRefused(_))) => fail(
            sqlstate::NETGUARD_REFUSED,
            e.to_string(),
            "orca.allowlist lists what the org may reach besides public addresses; admins add \
             to it with orca.allow(org, target)",
        ),
        Err(e) => fail(sqlstate::BAD_SYNC, e.to_string(), ""),
    }
}

/// A source to discover (`orca.discover`), validated and normalized, and
/// judged by netguard as a definition's source is: `{"ok": source}`.
#[pg_extern(immutable, strict, parallel_safe, name = "_source_check")]
fn source_check(org: &str, name: &str, source: JsonB, allowlist: Vec<String>) -> JsonB {
    let src = match orca_core::sync::check_source(name, &source.0) {
        Ok(s) => s,
        Err(e) => return JsonB(e.envelope()),
    };
    let list = match Allowlist::new(org, &allowlist) {
        Ok(l) => l,
        Err(e) => return fail(sqlstate::BAD_ALLOWLIST_ENTRY, e.to_string(), ""),
    };
    match netguard::check_reaches(&list, &src.reaches()) {
        Ok(()) => JsonB(json!({"ok": serde_json::to_value(&src).unwrap_or_default()})),
        Err(e @ (NetguardError::Refused(_) | NetguardError::PathRefused(_))) => fail(
            sqlstate::NETGUARD_REFUSED,
            e.to_string(),
            "orca.allowlist lists what the org may reach besides public addresses; admins add \
             to it with orca.allow(org, target)",
        ),
        Err(e) => fail(sqlstate::BAD_SYNC, e.to_string(), ""),
    }
}

/// The allowlist entries that permit what a definition names as written
/// (the upgrade to 0.2.0 gives them to syncs that ran before netguard).
#[pg_extern(immutable, strict, parallel_safe, name = "_allowlist_for")]
fn allowlist_for(definition: JsonB) -> Vec<String> {
    match serde_json::from_value::<SyncDef>(definition.0) {
        Ok(def) => netguard::entries_for(&def.reaches())
            .iter()
            .map(Rule::to_string)
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Checks a webhook endpoint: its URL and event patterns (`OR095`), and its
/// host if written as an address (`OR094`; names are judged by the relay
/// when it resolves them).
#[pg_extern(immutable, parallel_safe, name = "_webhook_check")]
fn webhook_check(
    org: &str,
    url: Option<&str>,
    events: Option<Vec<String>>,
    allowlist: Vec<String>,
) -> JsonB {
    let bad = |m: String| {
        fail(
            sqlstate::BAD_WEBHOOK,
            m,
            "an http(s) URL without credentials, and events such as {run.failed} or {run.*}",
        )
    };
    let Some(url) = url else {
        return bad("webhook url must not be NULL".into());
    };
    let endpoint = match orca_core::webhook::endpoint(url) {
        Ok(e) => e,
        Err(e) => return bad(e.to_string()),
    };
    if let Err(e) = orca_core::webhook::events(&events.unwrap_or_default()) {
        return bad(e.to_string());
    }
    let list = match Allowlist::new(org, &allowlist) {
        Ok(l) => l,
        Err(e) => return fail(sqlstate::BAD_ALLOWLIST_ENTRY, e.to_string(), ""),
    };
    if let Ok(addr) = endpoint.host.parse::<std::net::IpAddr>() {
        if let Err(r) = list.check(&endpoint.host, addr) {
            return fail(
                sqlstate::NETGUARD_REFUSED,
                r.to_string(),
                "orca.allowlist lists what the org may reach besides public addresses",
            );
        }
    }
    JsonB(json!({"ok": null}))
}
