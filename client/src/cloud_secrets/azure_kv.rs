//! `azure-kv://` secrets: read from Azure Key Vault (Get Secret) with the
//! runner's Azure AD identity, in this order:
//! - workload identity (AKS): `AZURE_CLIENT_ID`, `AZURE_TENANT_ID` and
//!   `AZURE_FEDERATED_TOKEN_FILE`, the file's token given as a client
//!   assertion;
//! - a service principal: `AZURE_CLIENT_ID`, `AZURE_TENANT_ID` and
//!   `AZURE_CLIENT_SECRET`;
//! - else the VM's managed identity from the instance metadata service
//!   (`AZURE_CLIENT_ID` picks a user-assigned one).
//!
//! `AZURE_AUTHORITY_HOST` names another Azure AD (a sovereign cloud's);
//! `ORCA_AZURE_KEY_VAULT_URL` another vault address (`{vault}` is the
//! vault's name; default `https://{vault}.vault.azure.net`). An org reads
//! only secrets whose name starts with its prefix (`ORCA_AZURE_SECRET_PREFIX`,
//! default `<org>--`).

use super::{agent, dashed_prefix, env, get_with_token, json_key, owned, token_from};

const API_VERSION: &str = "7.4";
const SCOPE: &str = "https://vault.azure.net/.default";
const IMDS: &str = "http://169.254.169.254/metadata/identity/oauth2/token";

/// The value of `azure-kv://<vault>/<name>[#key]` for `org`; the vault and
/// name were checked when the reference was parsed.
pub fn read(vault: &str, name: &str, key: Option<&str>, org: &str) -> Result<String, String> {
    let shown = format!("azure-kv://{vault}/{name}");
    let prefix = dashed_prefix("ORCA_AZURE_SECRET_PREFIX", org);
    if !owned(name, &prefix) {
        return Err(format!(
            "{shown} is outside org {org}'s secrets: its name must be {prefix}<name> \
             (ORCA_AZURE_SECRET_PREFIX), <name> without \"--\""
        ));
    }
    let base = env("ORCA_AZURE_KEY_VAULT_URL")
        .unwrap_or_else(|| "https://{vault}.vault.azure.net".into())
        .replace("{vault}", vault);
    let url = format!(
        "{}/secrets/{name}?api-version={API_VERSION}",
        base.trim_end_matches('/')
    );
    let token = token()?;
    let answer = get_with_token("Azure Key Vault", &url, &token, &shown, "code")?;
    let value = answer["value"]
        .as_str()
        .ok_or_else(|| format!("{shown}: the answer holds no value"))?;
    json_key(&shown, value.to_string(), key)
}

/// An access token for Key Vault, as the runner's Azure AD identity.
fn token() -> Result<String, String> {
    let client = env("AZURE_CLIENT_ID");
    if let (Some(client), Some(tenant)) = (&client, env("AZURE_TENANT_ID")) {
        let authority = env("AZURE_AUTHORITY_HOST")
            .unwrap_or_else(|| "https://login.microsoftonline.com".into());
        let url = format!(
            "{}/{tenant}/oauth2/v2.0/token",
            authority.trim_end_matches('/')
        );
        let what = format!("Azure AD at {url}");
        let mut form = vec![
            ("grant_type", "client_credentials".to_string()),
            ("client_id", client.clone()),
            ("scope", SCOPE.to_string()),
        ];
        if let Some(file) = env("AZURE_FEDERATED_TOKEN_FILE") {
            let assertion = std::fs::read_to_string(&file)
                .map_err(|e| format!("AZURE_FEDERATED_TOKEN_FILE {file}: {e}"))?;
            form.push((
                "client_assertion_type",
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".into(),
            ));
            form.push(("client_assertion", assertion.trim().to_string()));
        } else if let Some(secret) = env("AZURE_CLIENT_SECRET") {
            form.push(("client_secret", secret));
        } else {
            return Err(
                "AZURE_CLIENT_ID and AZURE_TENANT_ID without AZURE_FEDERATED_TOKEN_FILE or \
                 AZURE_CLIENT_SECRET: no Azure AD credential to read Key Vault with"
                    .into(),
            );
        }
        let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        return token_from(agent().post(&url).send_form(&pairs), &what);
    }
    let mut req = agent()
        .get(IMDS)
        .query("api-version", "2018-02-01")
        .query("resource", "https://vault.azure.net")
        .set("Metadata", "true");
    if let Some(c) = &client {
        req = req.query("client_id", c);
    }
    token_from(req.call(), "the managed identity endpoint (IMDS)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_org_reads_only_its_own_secret_names() {
        for name in ["globex--db", "acme--x--db", "db", "acme---db"] {
            let e = read("shop-vault", name, None, "acme")
                .err()
                .unwrap_or_default();
            assert!(e.contains("outside org acme's secrets"), "{name}: {e}");
        }
    }
}
