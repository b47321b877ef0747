//! `gcp-sm://` secrets: read from GCP Secret Manager (`versions.access`)
//! with the runner's Google identity, in this order:
//! - `GOOGLE_OAUTH_ACCESS_TOKEN`, a token given as it is;
//! - `GOOGLE_APPLICATION_CREDENTIALS`, a service account's key file: a JWT
//!   signed with its key (RS256) is exchanged at its `token_uri` (OAuth 2.0
//!   JWT bearer grant);
//! - else the metadata server (`GCE_METADATA_HOST`, default
//!   `metadata.google.internal`): the VM's or, on GKE, the workload
//!   identity's service account.
//!
//! `CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER` (gcloud's variable) sends
//! requests elsewhere. An org reads only secrets whose id starts with its
//! prefix (`ORCA_GCP_SECRET_PREFIX`, default `<org>--`).

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use serde_json::{json, Value};

use super::{agent, dashed_prefix, env, get_with_token, json_key, owned, token_from};

const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

/// The value of `gcp-sm://<name>[#key]` for `org`; `name` is
/// `projects/<p>/secrets/<s>[/versions/<v>]` (checked when it was parsed).
pub fn read(name: &str, key: Option<&str>, org: &str) -> Result<String, String> {
    let shown = format!("gcp-sm://{name}");
    let secret = name.split('/').nth(3).unwrap_or_default();
    let prefix = dashed_prefix("ORCA_GCP_SECRET_PREFIX", org);
    if !owned(secret, &prefix) {
        return Err(format!(
            "{shown} is outside org {org}'s secrets: its id must be {prefix}<name> \
             (ORCA_GCP_SECRET_PREFIX), <name> without \"--\""
        ));
    }
    let version = if name.contains("/versions/") {
        name.to_string()
    } else {
        format!("{name}/versions/latest")
    };
    let endpoint = env("CLOUDSDK_API_ENDPOINT_OVERRIDES_SECRETMANAGER")
        .unwrap_or_else(|| "https://secretmanager.googleapis.com/".into());
    let url = format!("{}/v1/{version}:access", endpoint.trim_end_matches('/'));
    let token = token()?;
    let answer = get_with_token("GCP Secret Manager", &url, &token, &shown, "status")?;
    let data = answer["payload"]["data"]
        .as_str()
        .ok_or_else(|| format!("{shown}: the answer holds no payload"))?;
    let bytes = STANDARD
        .decode(data)
        .map_err(|e| format!("{shown}: the payload is not base64: {e}"))?;
    let value =
        String::from_utf8(bytes).map_err(|_| format!("{shown} is not text (a binary secret)"))?;
    json_key(&shown, value, key)
}

/// An access token for the runner's Google identity.
fn token() -> Result<String, String> {
    if let Some(t) = env("GOOGLE_OAUTH_ACCESS_TOKEN") {
        return Ok(t);
    }
    if let Some(path) = env("GOOGLE_APPLICATION_CREDENTIALS") {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("GOOGLE_APPLICATION_CREDENTIALS {path}: {e}"))?;
        let key: Value = serde_json::from_str(&text)
            .map_err(|e| format!("GOOGLE_APPLICATION_CREDENTIALS {path} is not JSON: {e}"))?;
        if key["type"] != "service_account" {
            return Err(format!(
                "GOOGLE_APPLICATION_CREDENTIALS {path} is a {} key: only a service account's \
                 is read",
                key["type"].as_str().unwrap_or("typeless")
            ));
        }
        return service_account_token(&key, chrono::Utc::now().timestamp());
    }
    let host = env("GCE_METADATA_HOST").unwrap_or_else(|| "metadata.google.internal".into());
    let url = format!("http://{host}/computeMetadata/v1/instance/service-accounts/default/token");
    token_from(
        agent().get(&url).set("Metadata-Flavor", "Google").call(),
        &format!("the metadata server at {host}"),
    )
}

/// A service account key's token: its signed JWT exchanged at its
/// `token_uri`.
fn service_account_token(key: &Value, now: i64) -> Result<String, String> {
    let field = |k: &str| {
        key[k]
            .as_str()
            .ok_or_else(|| format!("the service account key has no {k}"))
    };
    let token_uri = key["token_uri"].as_str().unwrap_or(TOKEN_URI);
    let assertion = signed_jwt(
        field("client_email")?,
        field("private_key_id")?,
        field("private_key")?,
        token_uri,
        now,
    )?;
    token_from(
        agent().post(token_uri).send_form(&[
            ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
            ("assertion", &assertion),
        ]),
        &format!("Google's token endpoint {token_uri}"),
    )
}

/// The JWT a service account asserts itself with: RS256 over its claims.
pub fn signed_jwt(
    email: &str,
    key_id: &str,
    pem: &str,
    audience: &str,
    now: i64,
) -> Result<String, String> {
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": key_id});
    let claims = json!({
        "iss": email, "scope": SCOPE, "aud": audience, "iat": now, "exp": now + 3600,
    });
    let body = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let der: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::trim)
        .collect();
    let der = STANDARD
        .decode(der)
        .map_err(|e| format!("the service account's private key is not PEM: {e}"))?;
    let pair = ring::signature::RsaKeyPair::from_pkcs8(&der)
        .map_err(|e| format!("the service account's private key is not an RSA PKCS#8 key: {e}"))?;
    let mut sig = vec![0; pair.public().modulus_len()];
    pair.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        body.as_bytes(),
        &mut sig,
    )
    .map_err(|_| "signing the service account's JWT failed".to_string())?;
    Ok(format!("{body}.{}", URL_SAFE_NO_PAD.encode(sig)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_org_reads_only_its_own_secret_ids() {
        for (name, org) in [
            ("projects/shop-prod/secrets/globex--db", "acme"),
            ("projects/shop-prod/secrets/acme--x--db/versions/2", "acme"),
            ("projects/shop-prod/secrets/db", "acme"),
        ] {
            let e = read(name, None, org).err().unwrap_or_default();
            assert!(e.contains("outside org acme's secrets"), "{name}: {e}");
        }
    }

    #[test]
    fn a_key_that_is_not_rsa_pkcs8_is_named() {
        let e = signed_jwt(
            "a@b",
            "k",
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----",
            "x",
            0,
        )
        .err()
        .unwrap_or_default();
        assert!(e.contains("not an RSA PKCS#8 key"), "{e}");
    }
}
