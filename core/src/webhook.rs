//! Webhooks: what an endpoint may be, which events it asks for, and how a
//! delivery is signed (the Standard Webhooks spec,
//! <https://www.standardwebhooks.com>): the `webhook-id`,
//! `webhook-timestamp` and `webhook-signature` headers, the last
//! `v1,<base64 HMAC-SHA256 of "id.timestamp.body">` with the secret's bytes
//! (`whsec_<base64>`) as the key. Sending (HTTP, netguard) is the relay's.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The most event patterns an endpoint may ask for.
pub const EVENTS_MAX: usize = 64;
/// The longest URL an endpoint may have.
pub const URL_LEN_MAX: usize = 2048;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook url {url:?}: {why}")]
    Url { url: String, why: &'static str },
    #[error("webhook events: {0}")]
    Events(String),
    #[error("webhook secret: {0}")]
    Secret(&'static str),
}

/// An endpoint's URL, read: scheme, host (brackets off an IPv6 address)
/// and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub https: bool,
    pub host: String,
    pub port: u16,
}

/// Checks an endpoint URL: http or https, a host, no credentials (viewers
/// read endpoints), no fragment.
pub fn endpoint(url: &str) -> Result<Endpoint, WebhookError> {
    let bad = |why| WebhookError::Url {
        url: crate::conninfo::redact(url),
        why,
    };
    if url.len() > URL_LEN_MAX {
        return Err(bad("is longer than 2048 bytes"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("holds whitespace or control characters"));
    }
    let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(bad("must start with https:// or http://"));
    };
    if url.contains('#') {
        return Err(bad("may not have a fragment"));
    }
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(bad(
            "may not carry credentials: viewers read endpoints; the signature authenticates Orca",
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, tail) = v6
            .split_once(']')
            .ok_or_else(|| bad("has an unclosed '['"))?;
        (h.to_string(), tail.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(bad("names no host"));
    }
    let port = match port {
        None | Some("") => {
            if https {
                443
            } else {
                80
            }
        }
        Some(p) => p
            .parse()
            .map_err(|_| bad("has a port that is not a number"))?,
    };
    Ok(Endpoint {
        https,
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// Checks the event patterns an endpoint asks for: kinds (`run.failed`),
/// families (`run.*`) or `*`.
pub fn events(patterns: &[String]) -> Result<(), WebhookError> {
    if patterns.is_empty() {
        return Err(WebhookError::Events(
            "name at least one kind ('run.failed'), family ('run.*') or '*'".into(),
        ));
    }
    if patterns.len() > EVENTS_MAX {
        return Err(WebhookError::Events(format!(
            "at most {EVENTS_MAX} patterns, got {}",
            patterns.len()
        )));
    }
    for p in patterns {
        let body = p.strip_suffix(".*").unwrap_or(p);
        let ok = p == "*"
            || (!body.is_empty()
                && body.len() <= 64
                && body.split('.').all(|part| {
                    !part.is_empty()
                        && part
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                }));
        if !ok {
            return Err(WebhookError::Events(format!(
                "{p:?} is not an event kind ('run.failed'), a family ('run.*') or '*'"
            )));
        }
    }
    Ok(())
}

/// Whether an endpoint that asked for `patterns` wants an event of `kind`
/// (the SQL's orca._webhook_wants, for the relay's own checks).
pub fn wants(patterns: &[String], kind: &str) -> bool {
    patterns.iter().any(|p| {
        p == "*"
            || p == kind
            || p.strip_suffix('*')
                .is_some_and(|head| head.ends_with('.') && kind.starts_with(head))
    })
}

/// The bytes of a `whsec_<base64>` secret.
pub fn secret_bytes(secret: &str) -> Result<Vec<u8>, WebhookError> {
    let b = secret
        .strip_prefix("whsec_")
        .ok_or(WebhookError::Secret("does not start with whsec_"))?;
    B64.decode(b)
        .map_err(|_| WebhookError::Secret("is not base64 after whsec_"))
}

/// The `webhook-signature` header of a delivery.
pub fn signature(
    secret: &str,
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, WebhookError> {
    let key = secret_bytes(secret)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)
        .map_err(|_| WebhookError::Secret("cannot key an HMAC"))?;
    mac.update(msg_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(format!("v1,{}", B64.encode(mac.finalize().into_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_urls_without_credentials() {
        assert_eq!(
            endpoint("https://hooks.example.com/orca?x=1").expect("ok"),
            Endpoint {
                https: true,
                host: "hooks.example.com".into(),
                port: 443
            }
        );
        assert_eq!(endpoint("http://[::1]:8080/h").expect("ok").port, 8080);
        assert_eq!(
            endpoint("http://127.0.0.1/h").expect("ok").host,
            "127.0.0.1"
        );
        for bad in [
            "ftp://x/h",
            "hooks.example.com",
            "https:///h",
            "https://user:pw@h/x",
            "https://h/x#frag",
            "https://h:99999/x",
            "https://h/a b",
        ] {
            let e = endpoint(bad).expect_err(bad);
            assert!(!e.to_string().contains("pw@"), "{e}");
        }
    }

    #[test]
    fn event_patterns_are_kinds_families_or_everything() {
        let ps = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        events(&ps(&["run.failed", "sync.*", "*"])).expect("ok");
        for bad in [&[][..], &["run..x"], &["Run.failed"], &["run.*.x"], &[""]] {
            assert!(events(&ps(bad)).is_err(), "{bad:?}");
        }
        assert!(wants(&ps(&["run.*"]), "run.failed"));
        assert!(!wants(&ps(&["run.*"]), "runner.registered"));
        assert!(wants(&ps(&["*"]), "anything"));
        assert!(!wants(&ps(&["run.failed"]), "run.succeeded"));
    }

    #[test]
    fn a_signature_is_the_spec_s() {
        // The example of the Standard Webhooks spec and its libraries.
        let sig = signature(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        )
        .expect("sign");
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(signature("nope", "m", 1, b"").is_err());
    }
}
