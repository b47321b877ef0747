//! `aws-sm://` secrets: read from AWS Secrets Manager (GetSecretValue) with
//! the identity of the runner whose child asks (its `AWS_*` environment),
//! signed with Signature Version 4.
//!
//! An org reads only under its own prefix: the secret's name must start
//! with `ORCA_AWS_SECRET_PREFIX` (default `{org}/`, `{org}` the attempt's
//! org), so one runner identity shared by several orgs' runners does not
//! let one org name another's secrets.

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const SERVICE: &str = "secretsmanager";
const TARGET: &str = "secretsmanager.GetSecretValue";

/// Where and as whom requests go, from the environment the AWS SDKs read.
#[derive(Debug, Clone)]
pub struct AwsConfig {
    pub region: String,
    pub access_key: String,
    pub secret_key: String,
    pub session_token: Option<String>,
    /// `https://secretsmanager.<region>.amazonaws.com`, or
    /// `AWS_ENDPOINT_URL_SECRETS_MANAGER` / `AWS_ENDPOINT_URL`.
    pub endpoint: String,
}

impl AwsConfig {
    pub fn from_env() -> Result<AwsConfig, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let region = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let access_key = var("AWS_ACCESS_KEY_ID").ok_or(
            "no AWS credentials: the runner's environment has no AWS_ACCESS_KEY_ID (and \
             AWS_SECRET_ACCESS_KEY)",
        )?;
        let secret_key = var("AWS_SECRET_ACCESS_KEY")
            .ok_or("AWS_ACCESS_KEY_ID without AWS_SECRET_ACCESS_KEY")?;
        let endpoint = var("AWS_ENDPOINT_URL_SECRETS_MANAGER")
            .or_else(|| var("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://{SERVICE}.{region}.amazonaws.com"));
        Ok(AwsConfig {
            region,
            access_key,
            secret_key,
            session_token: var("AWS_SESSION_TOKEN"),
            endpoint: endpoint.trim_end_matches('/').to_string(),
        })
    }
}

/// The org's prefix: `ORCA_AWS_SECRET_PREFIX` with `{org}` replaced, else
/// `<org>/`.
pub fn prefix_for(org: &str) -> String {
    std::env::var("ORCA_AWS_SECRET_PREFIX")
        .map(|p| p.replace("{org}", org))
        .unwrap_or_else(|_| format!("{org}/"))
}

/// A reference's secret id and JSON key: `id[#key]`.
fn split(reference: &str) -> (&str, Option<&str>) {
    match reference.rsplit_once('#') {
        Some((id, key)) if !key.is_empty() => (id, Some(key)),
        _ => (reference, None),
    }
}

/// The secret's name, from a name or an ARN
/// (`arn:aws:secretsmanager:<region>:<account>:secret:<name>-<6 chars>`).
fn name_of(id: &str) -> &str {
    match id.split_once(":secret:") {
        Some((arn, name)) if arn.starts_with("arn:") => name,
        _ => id,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    // HMAC takes a key of any length: new_from_slice cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return Vec::new(),
    };
    mac.update(data.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// The headers of a signed GetSecretValue request (Signature Version 4).
pub fn signed_headers(
    cfg: &AwsConfig,
    host: &str,
    body: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<(String, String)> {
    let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
    let day = now.format("%Y%m%d").to_string();
    let mut headers = vec![
        (
            "content-type".to_string(),
            "application/x-amz-json-1.1".to_string(),
        ),
        ("host".to_string(), host.to_string()),
        ("x-amz-date".to_string(), amz_date.clone()),
        ("x-amz-target".to_string(), TARGET.to_string()),
    ];
    if let Some(t) = &cfg.session_token {
        headers.push(("x-amz-security-token".to_string(), t.clone()));
    }
    headers.sort();
    let names: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    let signed = names.join(";");
    let canonical = format!(
        "POST\n/\n\n{}\n{signed}\n{}",
        headers
            .iter()
            .map(|(k, v)| format!("{k}:{}\n", v.trim()))
            .collect::<String>(),
        hex(&Sha256::digest(body.as_bytes()))
    );
    let scope = format!("{day}/{}/{SERVICE}/aws4_request", cfg.region);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let k_date = hmac(format!("AWS4{}", cfg.secret_key).as_bytes(), &day);
    let k_region = hmac(&k_date, &cfg.region);
    let k_service = hmac(&k_region, SERVICE);
    let k_signing = hmac(&k_service, "aws4_request");
    let signature = hex(&hmac(&k_signing, &to_sign));
    headers.push((
        "authorization".to_string(),
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            cfg.access_key
        ),
    ));
    headers
}

/// The value of `aws-sm://<reference>` for `org`: the secret's string, or
/// one key of it when it is a JSON object and the reference names one.
pub fn read(reference: &str, org: &str) -> Result<String, String> {
    let (id, key) = split(reference);
    let prefix = prefix_for(org);
    if !name_of(id).starts_with(&prefix) {
        return Err(format!(
            "aws-sm://{id} is outside org {org}'s secrets: its name must start with {prefix:?} \
             (ORCA_AWS_SECRET_PREFIX)"
        ));
    }
    let cfg = AwsConfig::from_env()?;
    let host = cfg
        .endpoint
        .split_once("://")
        .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
        .unwrap_or(&cfg.endpoint)
        .to_string();
    let body = json!({ "SecretId": id }).to_string();
    let mut req = super::agent().post(&format!("{}/", cfg.endpoint));
    for (k, v) in signed_headers(&cfg, &host, &body, chrono::Utc::now()) {
        if k != "host" {
            req = req.set(&k, &v);
        }
    }
    let answer: Value = match req.send_string(&body) {
        Ok(r) => r
            .into_json()
            .map_err(|e| format!("AWS Secrets Manager answered no JSON: {e}"))?,
        Err(ureq::Error::Status(code, r)) => {
            let v: Value = r.into_json().unwrap_or(Value::Null);
            return Err(format!(
                "AWS Secrets Manager refused aws-sm://{id} ({code} {}): {}",
                v["__type"].as_str().unwrap_or("error"),
                v["message"]
                    .as_str()
                    .or_else(|| v["Message"].as_str())
                    .unwrap_or("")
            ));
        }
        Err(e) => return Err(format!("AWS Secrets Manager at {}: {e}", cfg.endpoint)),
    };
    let value = answer["SecretString"].as_str().ok_or_else(|| {
        format!("aws-sm://{id} holds no SecretString (a binary secret is not read)")
    })?;
    super::json_key(&format!("aws-sm://{id}"), value.to_string(), key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_signed_as_aws_documents_it() {
        // AWS's Signature Version 4 test vector's credentials and time
        // (the get-vanilla suite's key, date and region).
        let cfg = AwsConfig {
            region: "us-east-1".into(),
            access_key: "AKIDEXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
            endpoint: "https://secretsmanager.us-east-1.amazonaws.com".into(),
        };
        let now = chrono::DateTime::parse_from_rfc3339("2015-08-30T12:36:00Z")
            .map(|t| t.with_timezone(&chrono::Utc))
            .expect("time");
        let h = signed_headers(&cfg, "secretsmanager.us-east-1.amazonaws.com", "{}", now);
        let auth = &h
            .iter()
            .find(|(k, _)| k == "authorization")
            .expect("auth")
            .1;
        assert!(auth.starts_with(
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/secretsmanager/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature="
        ));
        // The signing key of that date and region, as AWS's documentation
        // derives it for service iam; the same chain here for secretsmanager.
        let k = hmac(
            &hmac(
                &hmac(
                    &hmac(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20150830"),
                    "us-east-1",
                ),
                "iam",
            ),
            "aws4_request",
        );
        assert_eq!(
            hex(&k),
            "c4afb1cc5771d871763a393e44b703571b55cc28424d1a5e86da6ed3c154a4b9"
        );
    }

    #[test]
    fn an_org_reads_only_under_its_prefix() {
        assert_eq!(split("acme/db#password"), ("acme/db", Some("password")));
        assert_eq!(split("acme/db"), ("acme/db", None));
        assert_eq!(
            name_of("arn:aws:secretsmanager:us-east-1:123456789012:secret:acme/db-AbCdEf"),
            "acme/db-AbCdEf"
        );
        let e = read("globex/db", "acme").err().unwrap_or_default();
        assert!(
            e.contains("outside org acme's secrets") && e.contains("\"acme/\""),
            "{e}"
        );
        let e = read(
            "arn:aws:secretsmanager:us-east-1:1:secret:globex/db-AbCdEf",
            "acme",
        )
        .err()
        .unwrap_or_default();
        assert!(e.contains("outside"), "{e}");
    }
}
