//! `aws-sm://` secrets: read from AWS Secrets Manager (GetSecretValue) with
//! the identity of the runner whose child asks (its `AWS_*` environment),
//! signed with Signature Version 4.
//!
//! An org reads only under its own prefix: the secret's name must start
//! with `ORCA_AWS_SECRET_PREFIX` (default `{org}/`, `{org}` the attempt's
//! org), so one runner identity shared by several orgs' runners does not
//! let one org name another's secrets.

use hmac::{Hmac, Mac};

use super::{agent, env};
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
    /// The region, endpoint and credentials of the runner's environment.
    /// Credentials are read as the AWS SDKs read them: keys
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`);
    /// else a web identity (`AWS_ROLE_ARN` and `AWS_WEB_IDENTITY_TOKEN_FILE`:
    /// IRSA on EKS), exchanged at STS; else the container's credentials
    /// endpoint (`AWS_CONTAINER_CREDENTIALS_FULL_URI` or `..._RELATIVE_URI`:
    /// ECS, EKS Pod Identity); else the instance profile (IMDSv2).
    pub fn from_env() -> Result<AwsConfig, String> {
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .unwrap_or_else(|| "us-east-1".into());
        let endpoint = env("AWS_ENDPOINT_URL_SECRETS_MANAGER")
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://{SERVICE}.{region}.amazonaws.com"));
        let (access_key, secret_key, session_token) = credentials(&region)?;
        Ok(AwsConfig {
            region,
            access_key,
            secret_key,
            session_token,
            endpoint: endpoint.trim_end_matches('/').to_string(),
        })
    }
}

type Credentials = (String, String, Option<String>);

fn credentials(region: &str) -> Result<Credentials, String> {
    if let Some(key) = env("AWS_ACCESS_KEY_ID") {
        let secret = env("AWS_SECRET_ACCESS_KEY")
            .ok_or("AWS_ACCESS_KEY_ID without AWS_SECRET_ACCESS_KEY")?;
        return Ok((key, secret, env("AWS_SESSION_TOKEN")));
    }
    if let (Some(role), Some(file)) = (env("AWS_ROLE_ARN"), env("AWS_WEB_IDENTITY_TOKEN_FILE")) {
        return web_identity(region, &role, &file);
    }
    if let Some(url) = env("AWS_CONTAINER_CREDENTIALS_FULL_URI").or_else(|| {
        env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").map(|p| format!("http://169.254.170.2{p}"))
    }) {
        let mut req = agent().get(&url);
        let token = match env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
            Some(f) => Some(
                std::fs::read_to_string(&f)
                    .map_err(|e| format!("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {f}: {e}"))?
                    .trim()
                    .to_string(),
            ),
            None => env("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
        };
        if let Some(t) = token {
            req = req.set("authorization", &t);
        }
        return json_credentials(req.call(), &format!("the container credentials at {url}"));
    }
    instance_profile().map_err(|e| {
        format!(
            "no AWS credentials: the runner's environment has no AWS_ACCESS_KEY_ID, no web \
             identity (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE) and no container credentials, \
             and the instance profile answered: {e}"
        )
    })
}

/// Temporary credentials for a role, from STS for the web identity token
/// in `file` (AssumeRoleWithWebIdentity needs no signature).
fn web_identity(region: &str, role: &str, file: &str) -> Result<Credentials, String> {
    let token = std::fs::read_to_string(file)
        .map_err(|e| format!("AWS_WEB_IDENTITY_TOKEN_FILE {file}: {e}"))?;
    let sts = env("AWS_ENDPOINT_URL_STS")
        .or_else(|| env("AWS_ENDPOINT_URL"))
        .unwrap_or_else(|| format!("https://sts.{region}.amazonaws.com"));
    let session = env("AWS_ROLE_SESSION_NAME").unwrap_or_else(|| "orca-runner".into());
    let answer = agent()
        .post(&format!("{}/", sts.trim_end_matches('/')))
        .send_form(&[
            ("Action", "AssumeRoleWithWebIdentity"),
            ("Version", "2011-06-15"),
            ("RoleArn", role),
            ("RoleSessionName", &session),
            ("WebIdentityToken", token.trim()),
        ]);
    let body = match answer {
        Ok(r) => r
            .into_string()
            .map_err(|e| format!("STS at {sts} answered nothing readable: {e}"))?,
        Err(ureq::Error::Status(code, r)) => {
            let body = r.into_string().unwrap_or_default();
            return Err(format!(
                "STS refused the web identity of {role} ({code} {}): {}",
                xml_value(&body, "Code").unwrap_or("error"),
                xml_value(&body, "Message").unwrap_or("")
            ));
        }
        Err(e) => return Err(format!("STS at {sts}: {e}")),
    };
    let field = |tag: &str| {
        xml_value(&body, tag)
            .map(str::to_string)
            .ok_or_else(|| format!("STS answered no {tag} for {role}"))
    };
    Ok((
        field("AccessKeyId")?,
        field("SecretAccessKey")?,
        Some(field("SessionToken")?),
    ))
}

/// The text of the first `<tag>` of an XML answer (STS's are flat).
fn xml_value<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let start = xml.find(&format!("<{tag}>"))? + tag.len() + 2;
    let len = xml[start..].find(&format!("</{tag}>"))?;
    Some(xml[start..start + len].trim())
}

/// Credentials as the container endpoint and IMDS give them.
fn json_credentials(
    answer: Result<ureq::Response, ureq::Error>,
    what: &str,
) -> Result<Credentials, String> {
    let v: serde_json::Value = match answer {
        Ok(r) => r
            .into_json()
            .map_err(|e| format!("{what} answered no JSON: {e}"))?,
        Err(e) => return Err(format!("{what}: {e}")),
    };
    let field = |k: &str| {
        v[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{what} answered no {k}"))
    };
    Ok((
        field("AccessKeyId")?,
        field("SecretAccessKey")?,
        v["Token"].as_str().map(str::to_string),
    ))
}

/// The instance profile's credentials from IMDSv2 (a session token first).
fn instance_profile() -> Result<Credentials, String> {
    const IMDS: &str = "http://169.254.169.254/latest";
    let imds = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(2))
        .build();
    let text = |r: Result<ureq::Response, ureq::Error>| -> Result<String, String> {
        r.map_err(|e| format!("IMDS: {e}"))?
            .into_string()
            .map_err(|e| format!("IMDS: {e}"))
    };
    let token = text(
        imds.put(&format!("{IMDS}/api/token"))
            .set("x-aws-ec2-metadata-token-ttl-seconds", "300")
            .call(),
    )?;
    let base = format!("{IMDS}/meta-data/iam/security-credentials/");
    let roles = text(
        imds.get(&base)
            .set("x-aws-ec2-metadata-token", &token)
            .call(),
    )?;
    let role = roles.lines().next().unwrap_or_default().trim();
    json_credentials(
        imds.get(&format!("{base}{role}"))
            .set("x-aws-ec2-metadata-token", &token)
            .call(),
        "IMDS",
    )
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
    let mut req = agent().post(&format!("{}/", cfg.endpoint));
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
    fn an_sts_answer_is_read() {
        let xml = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult>\
                   <Credentials><AccessKeyId>ASIA1</AccessKeyId><SecretAccessKey>s</SecretAccessKey>\
                   <SessionToken>t</SessionToken></Credentials></AssumeRoleWithWebIdentityResult>\
                   </AssumeRoleWithWebIdentityResponse>";
        assert_eq!(xml_value(xml, "AccessKeyId"), Some("ASIA1"));
        assert_eq!(xml_value(xml, "SessionToken"), Some("t"));
        assert_eq!(xml_value(xml, "Expiration"), None);
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
