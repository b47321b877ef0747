//! Secrets: references to them in connector options, where they are kept,
//! and the envelope encryption the extension keeps them under.
//!
//! A connector option that would hold a password holds a reference instead,
//! `{"secret": "shop-db"}`. `orca.set_secret` encrypts each value with its
//! org's data key (AES-256-GCM, a fresh nonce per value, the org and name
//! bound in as associated data); data keys are wrapped by the installation's
//! key, a file outside the database (`orca.secrets_key_file`), so a dump or a
//! viewer's `SELECT` holds ciphertext only. References may also name a
//! cloud secret manager; those providers are parsed here and resolved by a
//! [`Resolver`] that knows them (none is built yet).

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A secret's name in its org (`orca.set_secret`).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'.')
        })
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("invalid secret reference {0:?}: {1}")]
    BadRef(String, &'static str),
    #[error("secret {0} is not resolved: the engine resolves secrets when its attempt starts")]
    Unresolved(String),
    #[error("secret {name}: {reason}")]
    Resolve { name: String, reason: String },
    #[error("the installation key is malformed: {0}")]
    BadKey(String),
    #[error("{0} cannot be decrypted: wrong key, or the ciphertext was altered or moved")]
    Decrypt(&'static str),
    #[error("encryption failed")]
    Encrypt,
}

/// Where a referenced secret lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// Kept by Orca, in the org (`orca.set_secret`).
    Local { name: String },
    /// `aws-sm://<secret id or ARN>[#json-key]`
    AwsSecretsManager { id: String },
    /// `gcp-sm://projects/<p>/secrets/<s>[/versions/<v>][#json-key]`
    GcpSecretManager { name: String, key: Option<String> },
    /// `azure-kv://<vault>/<name>[#json-key]`
    AzureKeyVault {
        vault: String,
        name: String,
        key: Option<String>,
    },
}

/// A reference and the JSON key after its `#`, if it names one.
fn split_key(reference: &str) -> (&str, Option<&str>) {
    match reference.rsplit_once('#') {
        Some((r, key)) if !key.is_empty() => (r, Some(key)),
        _ => (reference, None),
    }
}

/// A GCP project id (`[a-z][a-z0-9-]{4,28}[a-z0-9]`) or project number.
fn gcp_project(p: &str) -> bool {
    let b = p.as_bytes();
    (!b.is_empty() && b.len() <= 20 && b.iter().all(u8::is_ascii_digit))
        || ((6..=30).contains(&b.len())
            && b[0].is_ascii_lowercase()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[b.len() - 1] != b'-')
}

/// A Secret Manager secret id: 1 to 255 of `[A-Za-z0-9_-]`.
fn gcp_secret(s: &str) -> bool {
    (1..=255).contains(&s.len())
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

/// A Key Vault name: 3 to 24 of `[A-Za-z0-9-]`, starting with a letter,
/// not ending with '-' (it becomes `<vault>.vault.azure.net`).
fn azure_vault(v: &str) -> bool {
    let b = v.as_bytes();
    (3..=24).contains(&b.len())
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1] != b'-'
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

/// A Key Vault secret name: 1 to 127 of `[A-Za-z0-9-]`.
fn azure_secret(s: &str) -> bool {
    (1..=127).contains(&s.len()) && s.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
}

/// `{"secret": "<name or provider URL>"}` where an option's value would be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    pub secret: String,
}

impl SecretRef {
    pub fn provider(&self) -> Result<Provider, SecretError> {
        let r = &self.secret;
        let bad = |why| SecretError::BadRef(r.clone(), why);
        if let Some(id) = r.strip_prefix("aws-sm://") {
            if id.is_empty() {
                return Err(bad("aws-sm:// needs a secret id or ARN"));
            }
            return Ok(Provider::AwsSecretsManager { id: id.to_string() });
        }
        if let Some(rest) = r.strip_prefix("gcp-sm://") {
            let (name, key) = split_key(rest);
            let parts: Vec<&str> = name.split('/').collect();
            let ok = match parts.as_slice() {
                ["projects", p, "secrets", s] => gcp_project(p) && gcp_secret(s),
                ["projects", p, "secrets", s, "versions", v] => {
                    gcp_project(p)
                        && gcp_secret(s)
                        && (*v == "latest"
                            || (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())))
                }
                _ => false,
            };
            if !ok {
                return Err(bad(
                    "gcp-sm:// takes projects/<project>/secrets/<secret>[/versions/<number or \
                     latest>][#json-key]: a project id or number, a secret id of letters, digits, \
                     '_' and '-'",
                ));
            }
            return Ok(Provider::GcpSecretManager {
                name: name.to_string(),
                key: key.map(str::to_string),
            });
        }
        if let Some(rest) = r.strip_prefix("azure-kv://") {
            let (path, key) = split_key(rest);
            return match path.split_once('/') {
                Some((vault, name)) if azure_vault(vault) && azure_secret(name) => {
                    Ok(Provider::AzureKeyVault {
                        vault: vault.to_string(),
                        name: name.to_string(),
                        key: key.map(str::to_string),
                    })
                }
                _ => Err(bad(
                    "azure-kv:// takes <vault>/<secret name>[#json-key]: a vault name of 3 to 24 \
                     letters, digits and '-', a secret name of 1 to 127",
                )),
            };
        }
        if r.contains("://") {
            return Err(bad(
                "providers are aws-sm://, gcp-sm:// and azure-kv://; a plain name is Orca's own",
            ));
        }
        if !valid_name(r) {
            return Err(bad(
                "a name is 1 to 128 lowercase letters, digits, '_', '-' or '.'",
            ));
        }
        Ok(Provider::Local { name: r.clone() })
    }
}

/// An option's value: given in the definition, or a secret's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Setting {
    Plain(String),
    Secret(SecretRef),
}

impl Setting {
    /// The value, once resolved ([`Resolver`]).
    pub fn plain(&self) -> Result<&str, SecretError> {
        match self {
            Setting::Plain(s) => Ok(s),
            Setting::Secret(r) => Err(SecretError::Unresolved(r.secret.clone())),
        }
    }

    /// The value to show: a secret's reference, never its value.
    pub fn shown(&self) -> String {
        match self {
            Setting::Plain(s) => s.clone(),
            Setting::Secret(r) => format!("{{secret: {}}}", r.secret),
        }
    }

    /// Replaces a reference with the secret's value.
    pub fn resolve(&mut self, resolver: &mut dyn Resolver) -> Result<(), SecretError> {
        if let Setting::Secret(r) = self {
            let value = resolver.resolve(&r.provider()?)?;
            *self = Setting::Plain(value);
        }
        Ok(())
    }
}

impl From<&str> for Setting {
    fn from(s: &str) -> Self {
        Setting::Plain(s.to_string())
    }
}

/// Reads referenced secrets: Orca's own through the SQL API under an
/// attempt's lease; a cloud provider's through its client.
pub trait Resolver {
    fn resolve(&mut self, provider: &Provider) -> Result<String, SecretError>;
}

/// Whether a connection string carries a password: `user:password@` in a
/// URL, or `password=` in a key=value conninfo string.
pub fn has_inline_password(conn: &str) -> bool {
    crate::conninfo::has_password(conn)
}

/// The JSON paths of a definition's inline passwords (for warnings about
/// definitions made before they were refused).
pub fn inline_passwords(side: &str, options: &Value) -> Vec<String> {
    options
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| v.as_str().is_some_and(has_inline_password))
        .map(|(k, _)| format!("{side}.{k}"))
        .collect()
}

// --- Envelope encryption ---------------------------------------------------

/// A 256-bit key.
pub type KeyBytes = [u8; 32];

/// An installation key as its file holds it: 64 hex digits (`openssl rand
/// -hex 32`), surrounding whitespace allowed.
pub fn parse_key(text: &str) -> Result<KeyBytes, SecretError> {
    let t = text.trim();
    if t.len() != 64 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(SecretError::BadKey(format!(
            "expected 64 hex digits (openssl rand -hex 32), got {} characters",
            t.len()
        )));
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&t[2 * i..2 * i + 2], 16)
            .map_err(|e| SecretError::BadKey(e.to_string()))?;
    }
    Ok(key)
}

/// Which installation key wrapped a data key: the first 8 bytes of a
/// sha256 of the key, stored in front of the wrapped key.
pub fn key_id(key: &KeyBytes) -> [u8; 8] {
    use sha2::{Digest, Sha256};
    let h = Sha256::new()
        .chain_update(b"orca installation key id\0")
        .chain_update(key)
        .finalize();
    let mut out = [0u8; 8];
    out.copy_from_slice(&h[..8]);
    out
}

fn random<const N: usize>() -> Result<[u8; N], SecretError> {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).map_err(|_| SecretError::Encrypt)?;
    Ok(b)
}

fn seal_with(key: &KeyBytes, plain: &[u8], aad: &[u8]) -> Result<Vec<u8>, SecretError> {
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    let nonce = random::<12>()?;
    let ct = cipher
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: plain, aad })
        .map_err(|_| SecretError::Encrypt)?;
    let mut out = nonce.to_vec();
    out.extend_from_slice(&ct);
    Ok(out)
}

fn open_with(
    key: &KeyBytes,
    sealed: &[u8],
    aad: &[u8],
    what: &'static str,
) -> Result<Vec<u8>, SecretError> {
    if sealed.len() < 12 + 16 {
        return Err(SecretError::Decrypt(what));
    }
    let cipher = Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key));
    cipher
        .decrypt(
            Nonce::from_slice(&sealed[..12]),
            Payload {
                msg: &sealed[12..],
                aad,
            },
        )
        .map_err(|_| SecretError::Decrypt(what))
}

fn data_key_aad(org: i64) -> Vec<u8> {
    format!("orca data key of org {org}").into_bytes()
}

fn secret_aad(org: i64, name: &str) -> Vec<u8> {
    format!("orca secret {name} of org {org}").into_bytes()
}

/// A new data key for an org, wrapped by the installation key:
/// `key id (8) || nonce (12) || ciphertext and tag`.
pub fn new_wrapped_data_key(installation: &KeyBytes, org: i64) -> Result<Vec<u8>, SecretError> {
    let data_key = random::<32>()?;
    wrap(installation, &data_key, org)
}

fn wrap(installation: &KeyBytes, data_key: &KeyBytes, org: i64) -> Result<Vec<u8>, SecretError> {
    let mut out = key_id(installation).to_vec();
    out.extend(seal_with(installation, data_key, &data_key_aad(org))?);
    Ok(out)
}

/// The installation keys a server knows: the current one, and the one
/// before it while data keys are rewrapped.
pub struct Keys {
    pub current: KeyBytes,
    pub previous: Option<KeyBytes>,
}

impl Keys {
    fn unwrap_data_key(&self, wrapped: &[u8], org: i64) -> Result<KeyBytes, SecretError> {
        if wrapped.len() < 8 {
            return Err(SecretError::Decrypt("the org's data key"));
        }
        let id = &wrapped[..8];
        let key = if id == key_id(&self.current) {
            &self.current
        } else if let Some(p) = self.previous.as_ref().filter(|p| id == key_id(p)) {
            p
        } else {
            return Err(SecretError::BadKey(
                "the org's data key was wrapped by another installation key: set \
                 orca.secrets_previous_key_file to it and call orca.rewrap_data_keys()"
                    .into(),
            ));
        };
        let plain = open_with(key, &wrapped[8..], &data_key_aad(org), "the org's data key")?;
        plain
            .try_into()
            .map_err(|_| SecretError::Decrypt("the org's data key"))
    }

    /// Encrypts a secret's value with the org's data key.
    pub fn seal(
        &self,
        wrapped: &[u8],
        org: i64,
        name: &str,
        value: &str,
    ) -> Result<Vec<u8>, SecretError> {
        let dk = self.unwrap_data_key(wrapped, org)?;
        seal_with(&dk, value.as_bytes(), &secret_aad(org, name))
    }

    /// Decrypts a secret's value.
    pub fn open(
        &self,
        wrapped: &[u8],
        org: i64,
        name: &str,
        sealed: &[u8],
    ) -> Result<String, SecretError> {
        let dk = self.unwrap_data_key(wrapped, org)?;
        let plain = open_with(&dk, sealed, &secret_aad(org, name), "the secret")?;
        String::from_utf8(plain).map_err(|_| SecretError::Decrypt("the secret"))
    }

    /// The data key wrapped by the current installation key (values stay as
    /// they are: they are encrypted with the data key, which does not change).
    pub fn rewrap(&self, wrapped: &[u8], org: i64) -> Result<Vec<u8>, SecretError> {
        let dk = self.unwrap_data_key(wrapped, org)?;
        wrap(&self.current, &dk, org)
    }

    /// Whether the current installation key wrapped this data key.
    pub fn is_current(&self, wrapped: &[u8]) -> bool {
        wrapped.len() >= 8 && wrapped[..8] == key_id(&self.current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_name_a_provider_or_are_refused() {
        let p = |s: &str| SecretRef { secret: s.into() }.provider();
        assert_eq!(
            p("shop-db"),
            Ok(Provider::Local {
                name: "shop-db".into()
            })
        );
        assert!(matches!(
            p("aws-sm://prod/shop"),
            Ok(Provider::AwsSecretsManager { .. })
        ));
        assert!(matches!(
            p("gcp-sm://projects/shop-prod/secrets/shop/versions/3"),
            Ok(Provider::GcpSecretManager { .. })
        ));
        assert!(matches!(
            p("azure-kv://vault1/shop"),
            Ok(Provider::AzureKeyVault { .. })
        ));
        assert_eq!(
            p("gcp-sm://projects/shop-prod/secrets/acme--db#password"),
            Ok(Provider::GcpSecretManager {
                name: "projects/shop-prod/secrets/acme--db".into(),
                key: Some("password".into())
            })
        );
        assert_eq!(
            p("azure-kv://shop-vault/acme--db"),
            Ok(Provider::AzureKeyVault {
                vault: "shop-vault".into(),
                name: "acme--db".into(),
                key: None
            })
        );
        for bad in [
            "",
            "Shop",
            "vault://x",
            "gcp-sm://shop",
            "gcp-sm://projects/../secrets/x",
            "gcp-sm://projects/p1/secrets/a.b",
            "gcp-sm://projects/shop-prod/secrets/x/versions/../../y",
            "azure-kv://vault",
            "azure-kv://evil.example.com#/x",
            "azure-kv://evil.example.com/x",
            "azure-kv://vault1/a_b",
            "azure-kv://v/x",
            "a/b",
            "aws-sm://",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        let s: Setting = serde_json::from_value(json!({"secret": "shop-db"})).expect("setting");
        assert_eq!(
            s,
            Setting::Secret(SecretRef {
                secret: "shop-db".into()
            })
        );
        assert!(s.plain().is_err());
        let s: Setting = serde_json::from_value(json!("postgres://db/shop")).expect("setting");
        assert_eq!(s.plain(), Ok("postgres://db/shop"));
        assert!(serde_json::from_value::<Setting>(json!({"secret": "x", "more": 1})).is_err());
    }

    #[test]
    fn inline_passwords_are_found_in_urls_and_conninfo() {
        for with in [
            "postgres://app:hunter2@db/shop",
            "postgresql://app:@db/shop",
            "postgres://db/shop?user=app&password=hunter2",
            "host=db user=app password=hunter2",
            "host=db PASSWORD=x",
        ] {
            assert!(has_inline_password(with), "{with}");
        }
        for without in [
            "postgres://app@db/shop",
            "postgres://db/shop?sslmode=require",
            "host=db user=app",
            "/var/data/in",
            "s3://bucket/events",
        ] {
            assert!(!has_inline_password(without), "{without}");
        }
    }

    #[test]
    fn secrets_open_with_their_org_and_name_only_and_survive_a_rewrap() {
        let k1 = parse_key(&"ab".repeat(32)).expect("key");
        let k2 = parse_key(&format!("{}\n", "cd".repeat(32))).expect("key");
        assert!(parse_key("abc").is_err());
        let keys = Keys {
            current: k1,
            previous: None,
        };
        let wrapped = new_wrapped_data_key(&k1, 7).expect("data key");
        let sealed = keys
            .seal(&wrapped, 7, "shop-db", "postgres://app:pw@db/shop")
            .expect("seal");
        assert!(!String::from_utf8_lossy(&sealed).contains("pw@db"));
        assert_eq!(
            keys.open(&wrapped, 7, "shop-db", &sealed).expect("open"),
            "postgres://app:pw@db/shop"
        );
        // Another org's or name's row cannot be swapped in.
        assert!(keys.open(&wrapped, 8, "shop-db", &sealed).is_err());
        assert!(keys.open(&wrapped, 7, "other", &sealed).is_err());
        let again = keys
            .seal(&wrapped, 7, "shop-db", "postgres://app:pw@db/shop")
            .expect("seal");
        assert_ne!(sealed, again, "a fresh nonce per value");
        // A new installation key: data keys are rewrapped, values untouched.
        let rotated = Keys {
            current: k2,
            previous: Some(k1),
        };
        assert!(!rotated.is_current(&wrapped));
        let rewrapped = rotated.rewrap(&wrapped, 7).expect("rewrap");
        assert!(rotated.is_current(&rewrapped));
        let only_new = Keys {
            current: k2,
            previous: None,
        };
        assert_eq!(
            only_new
                .open(&rewrapped, 7, "shop-db", &sealed)
                .expect("open"),
            "postgres://app:pw@db/shop"
        );
        assert!(matches!(
            only_new.open(&wrapped, 7, "shop-db", &sealed),
            Err(SecretError::BadKey(_))
        ));
    }
}
