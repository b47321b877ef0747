//! Secrets kept in a cloud's secret manager, read with the identity of the
//! runner whose child asks: AWS Secrets Manager ([`aws_sm`]), GCP Secret
//! Manager ([`gcp_sm`]) and Azure Key Vault ([`azure_kv`]).
//!
//! One runner identity may serve several orgs' runners, so a reference is
//! read only when the secret's name is under the attempt's org's prefix:
//! an org cannot name another's secrets, whatever the identity could read.

pub mod aws_sm;
pub mod azure_kv;
pub mod gcp_sm;

use std::time::Duration;

use serde_json::Value;

/// How long one request to a secret manager or a token endpoint may take.
const TIMEOUT: Duration = Duration::from_secs(15);

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new().timeout(TIMEOUT).build()
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// The org's prefix for a secret manager whose names allow no `/`: the
/// variable's value with `{org}` replaced, else `<org>--`.
fn dashed_prefix(var: &str, org: &str) -> String {
    env(var)
        .map(|p| p.replace("{org}", org))
        .unwrap_or_else(|| format!("{org}--"))
}

/// Whether secret `name` is the org's under `prefix`. What follows the
/// prefix holds no `--` and does not start with `-`: org names may hold
/// `-`, so without that rule org `acme` would reach org `acme--x`'s
/// `acme--x--db` (or org `acme-`'s `acme---db`).
fn owned(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('-') && !rest.contains("--"))
}

/// The secret's value, or one key of it when it is a JSON object and the
/// reference names one.
fn json_key(shown: &str, value: String, key: Option<&str>) -> Result<String, String> {
    let Some(k) = key else {
        return Ok(value);
    };
    let obj: Value = serde_json::from_str(&value)
        .map_err(|_| format!("{shown} is not a JSON object, so it has no key {k:?}"))?;
    match &obj[k] {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Err(format!("{shown} has no key {k:?}")),
        other => Ok(other.to_string()),
    }
}

/// GETs `url` with a bearer token from a secret manager whose errors are
/// `{"error": {<code field>: ..., "message": ...}}` (GCP's and Azure's).
fn get_with_token(
    service: &str,
    url: &str,
    token: &str,
    shown: &str,
    code_field: &str,
) -> Result<Value, String> {
    match agent()
        .get(url)
        .set("authorization", &format!("Bearer {token}"))
        .call()
    {
        Ok(r) => r
            .into_json()
            .map_err(|e| format!("{service} answered no JSON: {e}")),
        Err(ureq::Error::Status(code, r)) => {
            let v: Value = r.into_json().unwrap_or(Value::Null);
            Err(format!(
                "{service} refused {shown} ({code} {}): {}",
                v["error"][code_field].as_str().unwrap_or("error"),
                v["error"]["message"].as_str().unwrap_or("")
            ))
        }
        Err(e) => Err(format!("{service}: {e}")),
    }
}

/// An OAuth 2.0 token endpoint's answer: the access token, or its error.
fn token_from(answer: Result<ureq::Response, ureq::Error>, what: &str) -> Result<String, String> {
    let v: Value = match answer {
        Ok(r) => r
            .into_json()
            .map_err(|e| format!("{what} answered no JSON: {e}"))?,
        Err(ureq::Error::Status(code, r)) => {
            let v: Value = r.into_json().unwrap_or(Value::Null);
            return Err(format!(
                "{what} refused ({code}): {} {}",
                v["error"].as_str().unwrap_or("error"),
                v["error_description"].as_str().unwrap_or("")
            ));
        }
        Err(e) => return Err(format!("{what}: {e}")),
    };
    v["access_token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{what} answered no access_token"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dashed_prefix_belongs_to_one_org() {
        assert!(owned("acme--db", "acme--"));
        assert!(owned("acme--shop-db", "acme--"));
        // Org acme--x's and org acme-'s secrets are not acme's.
        assert!(!owned("acme--x--db", "acme--"));
        assert!(!owned("acme---db", "acme--"));
        assert!(owned("acme---db", "acme---"));
        assert!(!owned("acme--", "acme--"));
        assert!(!owned("globex--db", "acme--"));
    }

    #[test]
    fn a_key_of_a_json_secret() {
        let v = r#"{"url": "postgres://x", "port": 5432}"#.to_string();
        assert_eq!(
            json_key("s", v.clone(), Some("url")).ok(),
            Some("postgres://x".into())
        );
        assert_eq!(
            json_key("s", v.clone(), Some("port")).ok(),
            Some("5432".into())
        );
        assert!(json_key("s", v.clone(), Some("nope")).is_err());
        assert_eq!(json_key("s", v.clone(), None).ok(), Some(v));
        assert!(json_key("s", "plain".into(), Some("url")).is_err());
    }
}
