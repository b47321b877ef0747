//! Netguard at the connectors' edge: every connection a source or
//! destination makes, and every place it names, is checked against the
//! org's allowlist (`orca_core::netguard` decides) before anything is sent.
//!
//! A Postgres host's name is resolved here, every address it resolves to is
//! checked, and the connection goes to the first of them (`hostaddr`), so the
//! name cannot resolve elsewhere between the check and the connect; TLS still
//! verifies the certificate against the name. A local place is checked after
//! its symlinks are resolved, and never may lie inside (or hold) the
//! installation's store or warehouse; an object store's place (`s3://`,
//! `az://`, `gs://`) may not overlap them either, and a configured endpoint
//! it goes to (an S3-compatible server, azurite, a GCS emulator) is checked
//! like a host.
//!
//! The engine builds a [`Scope`] from its sync's claim and hands it to a
//! runner's source pump with the plan, so a source the runner hosts is held
//! to the same rules.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Component, Path, PathBuf};

use orca_core::netguard::{self, Allowlist, NetguardError, PathRefusal, Refusal};
use orca_lake::objstore::{self, Cloud};
use postgres::config::Host;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{0}")]
    Refused(Refusal),
    #[error("{0}")]
    PathRefused(PathRefusal),
    #[error("netguard: cannot resolve {host}: {reason}")]
    Resolve { host: String, reason: String },
    #[error("netguard: {0}")]
    Rules(NetguardError),
    #[error("netguard: {0}")]
    Unpinnable(String),
    #[error("starting a connection's runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Tls(#[from] orca_client::tls::TlsError),
    #[error("postgres {url}: {}", crate::util::pg_text(.source))]
    Connect {
        url: String,
        source: postgres::Error,
    },
}

/// What an attempt's connectors may reach, as the claim gave it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Scope {
    pub org: String,
    /// The org's allowlist; none when the control plane predates netguard
    /// (0.1.0), whose connections are not checked.
    pub allowlist: Option<Vec<String>>,
    /// The installation's store and warehouse, which no connector may name.
    pub store: Option<String>,
    pub warehouse: Option<String>,
}

/// A replication session's target, as netguard allowed it.
#[derive(Debug, Clone)]
pub struct ReplicationTarget {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub database: String,
    pub tls: pgwire_replication::TlsConfig,
}

/// An installation place, as a connector's place is compared with it.
#[derive(Debug, Clone)]
enum Place {
    Local(PathBuf),
    Bucket {
        /// The store, with the Azure account resolved where it can be.
        cloud: Cloud,
        bucket: String,
        key: String,
        /// The URL up to the key, for messages.
        root: String,
    },
    /// A URL no store reads: why.
    Unreadable(String),
}

fn place_of(url: &str) -> Place {
    match objstore::place(url) {
        Ok(objstore::Place::Bucket {
            cloud,
            bucket,
            key,
            root,
        }) => {
            // An Azure URL without its account is in the configured one.
            let cloud = match cloud {
                Cloud::Azure { account: None } => Cloud::Azure {
                    account: objstore::azure_account(&Default::default()),
                },
                other => other,
            };
            Place::Bucket {
                cloud,
                bucket,
                key: key.as_ref().to_string(),
                root,
            }
        }
        Ok(objstore::Place::Local) => Place::Local(canonical(Path::new(
            netguard::local_path(url).unwrap_or(url),
        ))),
        Err(e) => Place::Unreadable(e.message().to_string()),
    }
}

/// Whether two places' buckets are in one store: the same cloud, and for
/// Azure the same account, or an account not known (then it may be).
fn same_store(a: &Cloud, b: &Cloud) -> bool {
    match (a, b) {
        (Cloud::Azure { account: x }, Cloud::Azure { account: y }) => {
            x.is_none() || y.is_none() || x == y
        }
        _ => a == b,
    }
}

/// A path with its symlinks resolved as far as it exists; the rest (a
/// directory a destination will make) is appended as written.
fn canonical(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(c) = std::fs::canonicalize(&existing) {
            let mut out = c;
            out.extend(rest.iter().rev());
            return out;
        }
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Whether two object keys overlap: one is the other or under it.
fn keys_overlap(a: &str, b: &str) -> bool {
    let under = |x: &str, y: &str| y.is_empty() || x == y || x.starts_with(&format!("{y}/"));
    under(a, b) || under(b, a)
}

/// The checks of one attempt.
#[derive(Debug, Clone)]
pub struct Guard {
    /// None: the control plane predates netguard.
    list: Option<Allowlist>,
    roots: Vec<PathBuf>,
    inside: Vec<(&'static str, Place)>,
}

impl Guard {
    pub fn new(scope: &Scope) -> Result<Guard, NetError> {
        let list = scope
            .allowlist
            .as_ref()
            .map(|entries| Allowlist::new(&scope.org, entries))
            .transpose()
            .map_err(NetError::Rules)?;
        let roots = list.iter().flat_map(|l| l.roots()).map(canonical).collect();
        let inside = [("store", &scope.store), ("warehouse", &scope.warehouse)]
            .into_iter()
            .filter_map(|(what, url)| url.as_deref().map(|u| (what, place_of(u))))
            .collect();
        Ok(Guard {
            list,
            roots,
            inside,
        })
    }

    /// Whether connections are checked (the control plane has an allowlist).
    pub fn enforced(&self) -> bool {
        self.list.is_some()
    }

    /// Connects to a Postgres database a connector names, TLS as its
    /// `sslmode` says, to an address netguard checked.
    pub fn postgres(&self, conn: &str) -> Result<postgres::Client, NetError> {
        let p = self.postgres_config(conn)?;
        postgres::Config::from(p.config)
            .connect(p.tls)
            .map_err(|source| NetError::Connect {
                url: orca_core::conninfo::redact(conn),
                source,
            })
    }

    /// What [`Self::postgres`] connects with, for a `tokio_postgres` client:
    /// the config pinned to the address netguard checked, and the TLS
    /// connector its `sslmode` asks for.
    pub fn postgres_config(
        &self,
        conn: &str,
    ) -> Result<orca_client::tls::Prepared<tokio_postgres::Config>, NetError> {
        let mut p = orca_client::tls::prepare_async(conn)?;
        if let Some(list) = &self.list {
            self.pin(list, &mut p.config)?;
        }
        Ok(p)
    }

    /// Where a logical replication session to the database `conn` names
    /// goes, checked as [`Self::postgres`] checks a connection: the address
    /// netguard pinned, the port, the credentials, and the TLS the
    /// `sslmode` asks for (`prefer` and `disable`: none, as the replication
    /// client cannot fall back).
    pub fn replication(&self, conn: &str) -> Result<ReplicationTarget, NetError> {
        let p = self.postgres_config(conn)?;
        let c = &p.config;
        let unix = c.get_hosts().iter().find_map(|h| match h {
            Host::Unix(dir) => Some(dir.display().to_string()),
            Host::Tcp(_) => None,
        });
        let host = match (c.get_hostaddrs().first(), c.get_hosts().first(), unix) {
            (Some(a), _, _) => a.to_string(),
            (None, _, Some(dir)) => dir,
            (None, Some(Host::Tcp(name)), None) => name.clone(),
            _ => "localhost".to_string(),
        };
        use orca_client::tls::Mode;
        Ok(ReplicationTarget {
            host,
            port: c.get_ports().first().copied().unwrap_or(5432),
            user: c.get_user().unwrap_or("postgres").to_string(),
            password: c
                .get_password()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .unwrap_or_default(),
            database: c
                .get_dbname()
                .or(c.get_user())
                .unwrap_or("postgres")
                .to_string(),
            tls: match p.mode {
                Mode::Disable | Mode::Prefer => pgwire_replication::TlsConfig::disabled(),
                Mode::Require => pgwire_replication::TlsConfig::require(),
                Mode::VerifyCa => pgwire_replication::TlsConfig::verify_ca(None),
                Mode::VerifyFull => pgwire_replication::TlsConfig::verify_full(None),
            },
        })
    }

    fn pin(&self, list: &Allowlist, config: &mut tokio_postgres::Config) -> Result<(), NetError> {
        let hosts = config.get_hosts().to_vec();
        let ports = config.get_ports().to_vec();
        let given = config.get_hostaddrs().to_vec();
        // A pinned address is the connection, whatever host it comes with
        // (a Unix socket's directory included: the client connects by TCP
        // to a hostaddr): each is judged as a host of its own.
        for a in &given {
            list.check(&a.to_string(), *a).map_err(NetError::Refused)?;
        }
        if hosts.is_empty() {
            return Ok(());
        }
        let unix = hosts.iter().filter(|h| matches!(h, Host::Unix(_))).count();
        if unix > 0 {
            if unix < hosts.len() {
                return Err(NetError::Unpinnable(
                    "a connection string that mixes Unix sockets with TCP hosts cannot be \
                     checked host by host; name one kind"
                        .into(),
                ));
            }
            for h in &hosts {
                if let Host::Unix(dir) = h {
                    self.local(list, dir)?;
                }
            }
            return Ok(());
        }
        let mut pinned = Vec::new();
        for (i, h) in hosts.iter().enumerate() {
            let Host::Tcp(name) = h else { continue };
            if given.get(i).is_some() {
                // Judged above, by itself.
                continue;
            }
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            pinned.push(self.resolve(list, name, port)?.ip());
        }
        if given.is_empty() {
            for a in pinned {
                config.hostaddr(a);
            }
        }
        Ok(())
    }

    /// Checks a host and port a connector outside the engine will reach
    /// (an external connector's server): every address the host resolves
    /// to must be allowed. The connector resolves the name again itself, so
    /// this is weaker than the pinned connections of the built-in
    /// connectors.
    pub fn endpoint(&self, host: &str, port: u16) -> Result<(), NetError> {
        match &self.list {
            Some(list) => self.resolve(list, host, port).map(|_| ()),
            None => Ok(()),
        }
    }

    /// The address to connect to for `host:port`, once every address the
    /// name resolves to passed; None when nothing is enforced (connect by
    /// name).
    pub fn address(&self, host: &str, port: u16) -> Result<Option<SocketAddr>, NetError> {
        match &self.list {
            Some(list) => self.resolve(list, host, port).map(Some),
            None => Ok(None),
        }
    }

    /// Resolves a host and checks every address it resolves to; returns the
    /// first, which the caller connects to.
    fn resolve(&self, list: &Allowlist, host: &str, port: u16) -> Result<SocketAddr, NetError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => (bare, port)
                .to_socket_addrs()
                .map_err(|e| NetError::Resolve {
                    host: host.to_string(),
                    reason: e.to_string(),
                })?
                .collect(),
        };
        for a in &addrs {
            list.check(host, a.ip()).map_err(NetError::Refused)?;
        }
        addrs.first().copied().ok_or_else(|| NetError::Resolve {
            host: host.to_string(),
            reason: "no addresses".into(),
        })
    }

    fn local(&self, list: &Allowlist, path: &Path) -> Result<PathBuf, NetError> {
        let refuse = |why: &str| {
            NetError::PathRefused(PathRefusal {
                org: list.org.clone(),
                path: path.display().to_string(),
                why: why.to_string(),
            })
        };
        netguard::lexically_plain(path).map_err(refuse)?;
        let real = canonical(path);
        if real
            .components()
            .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
        {
            return Err(refuse("it does not resolve to a plain absolute path"));
        }
        let inside: Vec<(&str, PathBuf)> = self
            .inside
            .iter()
            .filter_map(|(what, p)| match p {
                Place::Local(dir) => Some((*what, dir.clone())),
                Place::Bucket { .. } | Place::Unreadable(_) => None,
            })
            .collect();
        list.check_path(&real, &self.roots, &inside)
            .map_err(|mut r| {
                if real != path {
                    r.why = format!("{} (it resolves to {})", r.why, real.display());
                }
                r.path = path.display().to_string();
                NetError::PathRefused(r)
            })?;
        Ok(real)
    }

    /// Checks a files source's or Parquet destination's place: a local
    /// path under an allowed root, or an object store's prefix outside the
    /// installation's own and through an endpoint netguard permits. A
    /// local place comes back with its links resolved, as it was allowed:
    /// open that, not the place as written, which a link swapped since
    /// could lead elsewhere.
    pub fn place(&self, url: &str) -> Result<Option<PathBuf>, NetError> {
        let Some(list) = &self.list else {
            return Ok(None);
        };
        let refuse = |why: String| {
            NetError::PathRefused(PathRefusal {
                org: list.org.clone(),
                path: url.to_string(),
                why,
            })
        };
        match place_of(url) {
            Place::Local(_) => {
                let path = netguard::local_path(url).unwrap_or(url);
                self.local(list, Path::new(path)).map(Some)
            }
            Place::Unreadable(why) => Err(refuse(why)),
            Place::Bucket {
                cloud, bucket, key, ..
            } => {
                for (what, p) in &self.inside {
                    if let Place::Bucket {
                        cloud: c,
                        bucket: b,
                        key: k,
                        root,
                    } = p
                    {
                        if same_store(c, &cloud) && *b == bucket && keys_overlap(&key, k) {
                            return Err(refuse(format!(
                                "it overlaps the installation's {what} ({root}{k})"
                            )));
                        }
                    }
                }
                // The clouds' own endpoints are public; a configured one
                // (an S3-compatible server, azurite, a GCS emulator) is
                // checked like any host.
                let endpoint = match cloud {
                    Cloud::S3 => ["AWS_ENDPOINT", "AWS_ENDPOINT_URL"]
                        .iter()
                        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty())),
                    Cloud::Azure { .. } => objstore::azure_endpoint(),
                    Cloud::Gcs => objstore::gcs_endpoint(),
                };
                match endpoint {
                    Some(e) => self.url_endpoint(list, &e).map(|()| None),
                    None => Ok(None),
                }
            }
        }
    }

    /// Checks the host and port of an endpoint URL.
    fn url_endpoint(&self, list: &Allowlist, endpoint: &str) -> Result<(), NetError> {
        let (scheme, rest) = endpoint.split_once("://").unwrap_or(("https", endpoint));
        let authority = rest.split('/').next().unwrap_or(rest);
        let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, tail) = v6.split_once(']').unwrap_or((v6, ""));
            (
                h.to_string(),
                tail.strip_prefix(':').and_then(|p| p.parse().ok()),
            )
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().ok()),
                None => (authority.to_string(), None),
            }
        };
        let port = port.unwrap_or(if scheme == "http" { 80 } else { 443 });
        self.resolve(list, &host, port).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(allow: &[&str], store: &str) -> Scope {
        Scope {
            org: "acme".into(),
            allowlist: Some(allow.iter().map(|s| s.to_string()).collect()),
            store: Some(store.into()),
            warehouse: Some("s3://lake/warehouse".into()),
        }
    }

    #[test]
    fn postgres_hosts_are_checked_before_anything_is_sent() {
        let g = Guard::new(&scope(&[], "/nonexistent/store")).expect("guard");
        let e = g
            .postgres("postgres://app@127.0.0.1:1/shop")
            .err()
            .expect("loopback");
        assert!(matches!(e, NetError::Refused(_)), "{e}");
        assert!(e.to_string().contains("127.0.0.1"), "{e}");
        let e = g
            .postgres("host=metadata hostaddr=169.254.169.254 dbname=x")
            .err()
            .expect("metadata");
        assert!(e.to_string().contains("metadata"), "{e}");
        let e = g
            .postgres("host=/var/run/postgresql dbname=x")
            .err()
            .expect("a socket");
        assert!(matches!(e, NetError::PathRefused(_)), "{e}");
        // Allowed: the check passes and the connect itself fails (nothing
        // listens on port 1).
        let g = Guard::new(&scope(&["127.0.0.1"], "/nonexistent/store")).expect("guard");
        let e = g
            .postgres("postgres://app@localhost:1/shop?connect_timeout=2")
            .err()
            .expect("nothing listens");
        assert!(
            matches!(e, NetError::Connect { .. }) || matches!(e, NetError::Refused(_)),
            "{e}"
        );
        // Unchecked when the control plane has no netguard.
        let none = Guard::new(&Scope::default()).expect("guard");
        assert!(!none.enforced());
        assert!(matches!(
            none.postgres("postgres://app@127.0.0.1:1/shop"),
            Err(NetError::Connect { .. })
        ));
    }

    #[test]
    fn places_stay_under_their_roots_and_out_of_the_installation() {
        let dir = std::env::temp_dir().join(format!("orca-netguard-{}", std::process::id()));
        let root = dir.join("data");
        let store = dir.join("store");
        std::fs::create_dir_all(root.join("in")).expect("dirs");
        std::fs::create_dir_all(&store).expect("dirs");
        let link = root.join("escape");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/etc", &link).expect("symlink");
        let root_s = root.display().to_string();
        let g =
            Guard::new(&scope(&[root_s.as_str()], &store.display().to_string())).expect("guard");
        g.place(&format!("{root_s}/in")).expect("under the root");
        g.place(&format!("file://{root_s}/out/new"))
            .expect("not made yet");
        for bad in [
            format!("{root_s}/escape/passwd"),
            format!("{root_s}/../store"),
            store.display().to_string(),
            "/etc".to_string(),
            "s3://lake/warehouse/globex".to_string(),
            "s3://lake".to_string(),
        ] {
            let e = g.place(&bad).expect_err(&bad);
            assert!(matches!(e, NetError::PathRefused(_)), "{bad}: {e}");
        }
        // Another bucket, or a sibling prefix, is not the installation's.
        g.place("s3://lake/warehouse2/x").expect("sibling prefix");
        // The same names in another store are another place.
        g.place("gs://lake/warehouse/x").expect("a GCS bucket");
        g.place("az://lake/warehouse/x")
            .expect("an Azure container");
        // A store no client reads is refused by name.
        let e = g.place("hdfs://lake/x").expect_err("hdfs");
        assert!(e.to_string().contains("hdfs://lake/x"), "{e}");

        // An installation in Azure Blob Storage and in GCS: its places are
        // refused in every spelling of their URL.
        for (store, bad, fine) in [
            (
                "abfss://orca@acct1.dfs.core.windows.net/store",
                vec![
                    "abfss://orca@acct1.dfs.core.windows.net/store/globex/sync",
                    "wasbs://orca@acct1.blob.core.windows.net/store",
                    // No account named: it may be the installation's.
                    "az://orca/store/x",
                    "azure://orca",
                ],
                vec![
                    "az://orca/out",
                    "abfss://orca@acct2.dfs.core.windows.net/store",
                    "abfss://other@acct1.dfs.core.windows.net/store",
                ],
            ),
            (
                "gs://orca/store",
                vec!["gs://orca/store/globex", "gs://orca"],
                vec!["gs://orca/store2", "s3://orca/store"],
            ),
        ] {
            let g = Guard::new(&Scope {
                org: "acme".into(),
                allowlist: Some(vec![root_s.clone()]),
                store: Some(store.into()),
                warehouse: None,
            })
            .expect("guard");
            for b in bad {
                let e = g.place(b).expect_err(b);
                assert!(
                    e.to_string().contains("overlaps the installation's store"),
                    "{b}: {e}"
                );
            }
            for f in fine {
                g.place(f).expect(f);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every form a Postgres connection string can name a host in, at
    /// connection time: each refused before anything is sent when what it
    /// reaches is not allowed, whatever name an allowed entry covers.
    #[test]
    fn every_form_of_a_connection_string_is_judged_when_it_connects() {
        let g = Guard::new(&scope(
            &["db.internal", "*.corp.example", "10.1.0.0/16"],
            "/nonexistent",
        ))
        .expect("guard");
        for conn in [
            "postgres://app@127.0.0.1:1/shop",
            "postgresql://app@127.0.0.1/shop",
            "postgres://app@[::1]:1/shop",
            "postgres://app@[::ffff:127.0.0.1]:1/shop",
            "postgres://app@localhost:1/shop",
            "postgres://app@%31%32%37.0.0.1:1/shop",
            "postgres://app@10.1.0.1:1,127.0.0.1:1/shop",
            "postgres://app@db.internal:1/shop?hostaddr=127.0.0.1",
            "postgres://app@10.1.0.1:1/shop?host=127.0.0.1",
            "postgres:///shop?host=127.0.0.1&port=1",
            "postgres://app@/shop?host=/var/run/postgresql",
            "host=127.0.0.1 port=1 dbname=shop",
            "host=localhost port=1 dbname=shop",
            "host=db.internal hostaddr=127.0.0.1 port=1 dbname=shop",
            "host=db.internal hostaddr=169.254.169.254 port=1 dbname=shop",
            "host=x.corp.example hostaddr=::1 port=1 dbname=shop",
            "host=db.internal,db.internal hostaddr=10.1.0.5,127.0.0.1 port=1 dbname=shop",
            "hostaddr=127.0.0.1 port=1 dbname=shop",
            "hostaddr=0.0.0.0 port=1 dbname=shop",
            "host=/var/run/postgresql dbname=shop",
            "host='/tmp' dbname=shop",
        ] {
            let e = g
                .postgres(conn)
                .err()
                .unwrap_or_else(|| panic!("{conn} connected"));
            assert!(
                matches!(
                    e,
                    NetError::Refused(_) | NetError::PathRefused(_) | NetError::Unpinnable(_)
                ),
                "{conn}: {e}"
            );
        }
        // A socket directory that is allowed does not carry an address
        // pinned beside it: the client would connect to the address by TCP.
        let g2 = Guard::new(&scope(&["/var/run/postgresql"], "/nonexistent")).expect("guard");
        for conn in [
            "host=/var/run/postgresql hostaddr=169.254.169.254 port=80 dbname=shop",
            "host=/var/run/postgresql hostaddr=127.0.0.1 port=1 dbname=shop",
        ] {
            let e = g2
                .postgres(conn)
                .err()
                .unwrap_or_else(|| panic!("{conn} connected"));
            assert!(matches!(e, NetError::Refused(_)), "{conn}: {e}");
            let e = g2
                .replication(conn)
                .err()
                .unwrap_or_else(|| panic!("{conn} replicated"));
            assert!(matches!(e, NetError::Refused(_)), "{conn}: {e}");
        }
        // An allowed network's address passes the check (and the connect
        // then fails: nothing listens there).
        let e = g
            .postgres("host=db.internal hostaddr=10.1.0.9 port=1 dbname=shop connect_timeout=1")
            .err()
            .expect("nothing listens");
        assert!(!matches!(e, NetError::Refused(_)), "{e}");
    }
}
