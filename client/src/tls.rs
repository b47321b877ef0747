//! Connections of the `postgres` crate with TLS (rustls), as libpq's
//! `sslmode` and `sslrootcert` say: the control plane's, the engine's
//! connectors' and the CLI's. The crate itself knows only `disable`,
//! `prefer` and `require`, and never verifies a certificate; this module
//! reads those settings out of the connection string (either form) and
//! builds the verifier they ask for:
//!
//! | sslmode | encrypted | certificate checked |
//! |---|---|---|
//! | `disable` | no | - |
//! | `allow`, `prefer` (the default) | if the server offers it | no |
//! | `require` | yes | no (as `verify-ca` when `sslrootcert` is given, as libpq does) |
//! | `verify-ca` | yes | signed by a root of `sslrootcert` |
//! | `verify-full` | yes | that, and issued for the host connected to |
//!
//! `sslrootcert` is a PEM file of root certificates, or `system` for the
//! operating system's store; without it the verifying modes read
//! `~/.postgresql/root.crt`, as libpq does.

use std::path::PathBuf;
use std::sync::Arc;

use orca_core::conninfo;
use postgres::config::SslMode;
use postgres::{Client, Config};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres_rustls::MakeRustlsConnect;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("connection string: {0}")]
    ConnInfo(#[from] conninfo::ConnInfoError),
    #[error("sslmode={0} is not a mode (disable, allow, prefer, require, verify-ca, verify-full)")]
    Mode(String),
    #[error("sslmode={mode} checks the server's certificate and needs roots to check it with: set sslrootcert=/path/to/ca.pem (or sslrootcert=system); {default} does not exist")]
    NoRoots { mode: String, default: String },
    #[error("sslrootcert {path}: {reason}")]
    Roots { path: String, reason: String },
    #[error("{0} (client certificates) is not supported yet")]
    ClientCert(String),
    #[error("the connection string: {0}")]
    Parse(postgres::Error),
    #[error("TLS: {0}")]
    Rustls(String),
}

/// What the string asked of TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(s: &str) -> Result<Mode, TlsError> {
        Ok(match s {
            "disable" => Mode::Disable,
            "allow" | "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            other => return Err(TlsError::Mode(other.to_string())),
        })
    }
}

/// A connection string read for the `postgres` crate: its config without
/// the TLS settings the crate does not know, and the connector they ask for.
/// `C` is the blocking crate's config, or `tokio_postgres`'s for a client
/// that drives its own runtime (see [`prepare_async`]).
pub struct Prepared<C = Config> {
    pub config: C,
    pub tls: MakeRustlsConnect,
    pub mode: Mode,
}

/// Reads `conn` (a URL or conninfo) and builds its TLS connector.
pub fn prepare(conn: &str) -> Result<Prepared, TlsError> {
    let p = prepare_async(conn)?;
    Ok(Prepared {
        config: Config::from(p.config),
        tls: p.tls,
        mode: p.mode,
    })
}

/// [`prepare`] for `tokio_postgres`: the same settings and connector.
pub fn prepare_async(conn: &str) -> Result<Prepared<tokio_postgres::Config>, TlsError> {
    let (rest, taken) = conninfo::take(
        conn,
        &["sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword"],
    )?;
    let get = |k: &str| {
        taken
            .iter()
            .rev()
            .find(|p| p.key.eq_ignore_ascii_case(k))
            .map(|p| p.value.clone())
    };
    for k in ["sslcert", "sslkey", "sslpassword"] {
        if get(k).is_some() {
            return Err(TlsError::ClientCert(k.to_string()));
        }
    }
    let mut mode = match get("sslmode") {
        Some(m) => Mode::parse(&m)?,
        None => Mode::Prefer,
    };
    let root = get("sslrootcert");
    // libpq: require with a root certificate checks it as verify-ca does.
    if mode == Mode::Require && root.is_some() {
        mode = Mode::VerifyCa;
    }
    let mut config: tokio_postgres::Config = rest.parse().map_err(TlsError::Parse)?;
    config.ssl_mode(match mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
    });
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        Mode::Disable | Mode::Prefer | Mode::Require => Arc::new(Unverified(provider.clone())),
        Mode::VerifyCa | Mode::VerifyFull => {
            let roots = roots(root.as_deref(), mode)?;
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| TlsError::Rustls(e.to_string()))?;
            if mode == Mode::VerifyFull {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            }
        }
    };
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Prepared {
        config,
        tls: MakeRustlsConnect::new(client),
        mode,
    })
}

/// Connects as the string says, TLS included.
pub fn connect(conn: &str) -> Result<Client, crate::ClientError> {
    let p = prepare(conn).map_err(crate::ClientError::Tls)?;
    p.config
        .connect(p.tls)
        .map_err(|source| crate::ClientError::Refused {
            what: "connecting",
            source,
        })
}

fn roots(root: Option<&str>, mode: Mode) -> Result<RootCertStore, TlsError> {
    let mode_s = if mode == Mode::VerifyFull {
        "verify-full"
    } else {
        "verify-ca"
    };
    let mut store = RootCertStore::empty();
    if root == Some("system") {
        let found = rustls_native_certs::load_native_certs();
        for c in found.certs {
            let _ = store.add(c);
        }
        if store.is_empty() {
            return Err(TlsError::Roots {
                path: "system".into(),
                reason: "the system's certificate store is empty".into(),
            });
        }
        return Ok(store);
    }
    let path = match root {
        Some(p) => PathBuf::from(p),
        None => {
            let default = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default()
                .join(".postgresql/root.crt");
            if !default.exists() {
                return Err(TlsError::NoRoots {
                    mode: mode_s.into(),
                    default: default.display().to_string(),
                });
            }
            default
        }
    };
    let bad = |reason: String| TlsError::Roots {
        path: path.display().to_string(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(&path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    for c in certs {
        store.add(c).map_err(|e| bad(e.to_string()))?;
    }
    Ok(store)
}

/// Encrypts without checking the certificate (`prefer`, `require`): what
/// libpq does in those modes. The handshake's signatures are still checked,
/// so the session is with the holder of the key the certificate names.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a root, whatever name it was issued for.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_read_out_of_either_form() {
        let p = prepare("postgres://u@127.0.0.1/db?sslmode=require").expect("url");
        assert_eq!(p.mode, Mode::Require);
        assert_eq!(p.config.get_ssl_mode(), SslMode::Require);
        let p = prepare("host=127.0.0.1 dbname=db sslmode=disable").expect("conninfo");
        assert_eq!(p.mode, Mode::Disable);
        let p = prepare("postgres://u@127.0.0.1/db").expect("default");
        assert_eq!(p.mode, Mode::Prefer);
        let e = prepare("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
            .err()
            .expect("no such file");
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
        let e = prepare("postgres://u@h/db?sslmode=sometimes")
            .err()
            .expect("bad mode");
        assert!(e.to_string().contains("sometimes"), "{e}");
        let e = prepare("host=h sslcert=/c.pem").err().expect("client cert");
        assert!(e.to_string().contains("sslcert"), "{e}");
    }
}
