//! Netguard: which addresses and local paths a connector may reach.
//!
//! A sync's definition names hosts (a Postgres source, a destination, an
//! S3 endpoint) and local paths, and its operator writes it; the runner's
//! host reaches what it names. So every outbound connection is checked after
//! the name is resolved, against the address itself: loopback, private,
//! shared, link-local, cloud metadata, unspecified, multicast and reserved
//! addresses are refused unless the org's allowlist (`orca.allowlist`,
//! managed by admins) permits the host or a network holding the address.
//! Public addresses are always reachable. Local paths are refused unless
//! they lie under a root the allowlist names, and never inside the
//! installation's own store or warehouse.
//!
//! This module decides; resolving names and canonicalising paths (I/O) is
//! the caller's, which then connects to the very address that was checked,
//! so a name cannot resolve to another address in between.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest host name a rule may hold (DNS's limit).
pub const HOST_LEN_MAX: usize = 253;
/// The longest path a rule may hold.
pub const PATH_LEN_MAX: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetguardError {
    #[error("invalid allowlist entry {0:?}: {1}")]
    BadRule(String, &'static str),
    #[error("{0}")]
    Refused(Refusal),
    #[error("{0}")]
    PathRefused(PathRefusal),
}

/// An allowlist entry: a host name, every subdomain of one, a network, or a
/// local directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// `db.internal`: that name, whatever it resolves to.
    Host(String),
    /// `*.corp.example`: every name under `corp.example` (not itself).
    Subdomains(String),
    /// `10.0.0.0/8`, `127.0.0.1`, `fd00::/8`.
    Network(Cidr),
    /// `/srv/data`: files under that directory.
    Path(PathBuf),
}

impl Rule {
    /// The rule's kind as `orca.allowlist` stores it.
    pub fn kind(&self) -> &'static str {
        match self {
            Rule::Host(_) | Rule::Subdomains(_) => "host",
            Rule::Network(_) => "network",
            Rule::Path(_) => "path",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Host(h) => f.write_str(h),
            Rule::Subdomains(h) => write!(f, "*.{h}"),
            Rule::Network(c) => write!(f, "{c}"),
            Rule::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

impl FromStr for Rule {
    type Err = NetguardError;

    fn from_str(s: &str) -> Result<Rule, NetguardError> {
        let bad = |why| NetguardError::BadRule(s.to_string(), why);
        if s.starts_with('/') {
            if s.len() > PATH_LEN_MAX {
                return Err(bad("a path is at most 4096 bytes"));
            }
            if lexically_plain(Path::new(s)).is_err() {
                return Err(bad("a path rule is absolute, without '.' or '..'"));
            }
            return Ok(Rule::Path(Path::new(s).components().collect()));
        }
        if s.contains('/') || s.parse::<IpAddr>().is_ok() {
            return s.parse::<Cidr>().map(Rule::Network);
        }
        if let Some(rest) = s.strip_prefix("*.") {
            return valid_host(rest)
                .then(|| Rule::Subdomains(rest.to_string()))
                .ok_or_else(|| bad(HOST_RULE));
        }
        valid_host(s)
            .then(|| Rule::Host(s.to_string()))
            .ok_or_else(|| bad(HOST_RULE))
    }
}

const HOST_RULE: &str = "a host is lowercase DNS labels (letters, digits, '-') joined by '.', \
                         optionally after '*.'; a network is an address or address/prefix; a \
                         path starts with '/'";

/// A DNS name in lowercase: labels of letters, digits and inner hyphens.
fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= HOST_LEN_MAX
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// A network: an address and how many leading bits of it count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                prefix_eq(u32::from(net).into(), u32::from(ip).into(), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(u128::from(net), u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, bits: u8, prefix: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let shift = u32::from(bits - prefix);
    (a >> shift) == (b >> shift)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = NetguardError;

    /// An address (a network of one) or `address/prefix`, with no host bits
    /// set beyond the prefix, as PostgreSQL's `cidr` type takes it.
    fn from_str(s: &str) -> Result<Cidr, NetguardError> {
        let bad = |why| NetguardError::BadRule(s.to_string(), why);
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = canonical(
            addr.parse::<IpAddr>()
                .map_err(|_| bad("not an IPv4 or IPv6 address"))?,
        );
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| bad("the prefix length is out of range"))?,
        };
        let value = match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        let host_bits = u32::from(bits - prefix);
        if host_bits > 0 && value & ((1u128 << host_bits) - 1) != 0 {
            return Err(bad("bits are set to the right of the prefix"));
        }
        Ok(Cidr { addr, prefix })
    }
}

/// An IPv4 address written as IPv6 (mapped, compatible, NAT64 or 6to4) is
/// that IPv4 address: it reaches the same host.
pub fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let low32 = Ipv4Addr::from(((u32::from(s[6])) << 16) | u32::from(s[7]));
    // ::a.b.c.d (deprecated "compatible"), but not :: and ::1.
    if s[..6] == [0; 6] && u32::from(low32) > 1 {
        return IpAddr::V4(low32);
    }
    // 64:ff9b::/96, NAT64's well-known prefix.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return IpAddr::V4(low32);
    }
    // 2002:AABB:CCDD::/48, 6to4.
    if s[0] == 0x2002 {
        return IpAddr::V4(Ipv4Addr::from((u32::from(s[1]) << 16) | u32::from(s[2])));
    }
    IpAddr::V6(v6)
}

/// What kind of address something resolved to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Public,
    Loopback,
    Private,
    /// Carrier-grade NAT, 100.64.0.0/10.
    Shared,
    LinkLocal,
    /// A cloud provider's instance metadata service.
    Metadata,
    Unspecified,
    Multicast,
    /// Broadcast, documentation, benchmarking and future-use ranges.
    Reserved,
}

impl Class {
    fn noun(self) -> &'static str {
        match self {
            Class::Public => "a public address",
            Class::Loopback => "a loopback address",
            Class::Private => "a private address",
            Class::Shared => "a shared (carrier-grade NAT) address",
            Class::LinkLocal => "a link-local address",
            Class::Metadata => "a cloud metadata address",
            Class::Unspecified => "an unspecified address",
            Class::Multicast => "a multicast address",
            Class::Reserved => "a reserved address",
        }
    }
}

/// The ranges that are not public, most specific first: the first that
/// holds an address classifies it.
const V4_RANGES: &[([u8; 4], u8, Class)] = &[
    ([169, 254, 169, 254], 32, Class::Metadata), // AWS, GCP, Azure, OpenStack
    ([100, 100, 100, 200], 32, Class::Metadata), // Alibaba Cloud
    ([168, 63, 129, 16], 32, Class::Metadata),   // Azure's host agent
    ([0, 0, 0, 0], 8, Class::Unspecified),
    ([10, 0, 0, 0], 8, Class::Private),
    ([100, 64, 0, 0], 10, Class::Shared),
    ([127, 0, 0, 0], 8, Class::Loopback),
    ([169, 254, 0, 0], 16, Class::LinkLocal),
    ([172, 16, 0, 0], 12, Class::Private),
    ([192, 0, 0, 0], 24, Class::Reserved),
    ([192, 0, 2, 0], 24, Class::Reserved),
    ([192, 168, 0, 0], 16, Class::Private),
    ([198, 18, 0, 0], 15, Class::Reserved),
    ([198, 51, 100, 0], 24, Class::Reserved),
    ([203, 0, 113, 0], 24, Class::Reserved),
    ([224, 0, 0, 0], 4, Class::Multicast),
    ([240, 0, 0, 0], 4, Class::Reserved), // and 255.255.255.255
];

const V6_RANGES: &[([u16; 8], u8, Class)] = &[
    ([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128, Class::Metadata), // AWS over IPv6
    ([0, 0, 0, 0, 0, 0, 0, 0], 128, Class::Unspecified),
    ([0, 0, 0, 0, 0, 0, 0, 1], 128, Class::Loopback),
    ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, Class::Reserved), // discard
    ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, Class::Reserved), // documentation
    ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, Class::Private),  // unique local
    ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, Class::LinkLocal),
    ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, Class::Private), // site-local, deprecated
    ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, Class::Multicast),
];

/// An address's class, and the range that gave it.
pub fn classify(ip: IpAddr) -> (Class, Option<Cidr>) {
    let ip = canonical(ip);
    let found = match ip {
        IpAddr::V4(_) => V4_RANGES.iter().find_map(|(a, p, c)| {
            let net = Cidr {
                addr: IpAddr::V4(Ipv4Addr::from(*a)),
                prefix: *p,
            };
            net.contains(ip).then_some((*c, net))
        }),
        IpAddr::V6(_) => V6_RANGES.iter().find_map(|(a, p, c)| {
            let net = Cidr {
                addr: IpAddr::V6(Ipv6Addr::from(*a)),
                prefix: *p,
            };
            net.contains(ip).then_some((*c, net))
        }),
    };
    match found {
        Some((c, net)) => (c, Some(net)),
        None => (Class::Public, None),
    }
}

/// Why a connection was refused: the host, the address it resolved to, and
/// the rule that refuses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub org: String,
    pub host: String,
    pub addr: IpAddr,
    pub class: Class,
    pub range: Option<Cidr>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "netguard refused {} at {}: {}",
            self.host,
            self.addr,
            self.class.noun()
        )?;
        if let Some(r) = self.range {
            write!(f, " ({r})")?;
        }
        write!(
            f,
            ", which org '{}' may reach only if its allowlist permits the host or a network \
             holding the address; an admin adds one with SELECT orca.allow('{}', '{}')",
            self.org, self.org, self.host
        )
    }
}

/// Why a local path was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRefusal {
    pub org: String,
    pub path: String,
    pub why: String,
}

impl fmt::Display for PathRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "netguard refused the local path {}: {}",
            self.path, self.why
        )
    }
}

/// One org's allowlist, as an attempt reads it with its sync's definition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    pub org: String,
    pub rules: Vec<Rule>,
}

impl Allowlist {
    /// Parses the entries `orca.allowlist` holds (the claim hands them over).
    pub fn new(org: &str, entries: &[String]) -> Result<Allowlist, NetguardError> {
        Ok(Allowlist {
            org: org.to_string(),
            rules: entries
                .iter()
                .map(|e| e.parse())
                .collect::<Result<_, _>>()?,
        })
    }

    /// Whether `host`, resolved to `addr`, may be reached.
    pub fn check(&self, host: &str, addr: IpAddr) -> Result<(), Refusal> {
        let (class, range) = classify(addr);
        if class == Class::Public {
            return Ok(());
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let permitted = self.rules.iter().any(|r| match r {
            Rule::Host(h) => h == host,
            Rule::Subdomains(s) => host
                .strip_suffix(s.as_str())
                .is_some_and(|head| head.ends_with('.') && head.len() > 1),
            Rule::Network(n) => n.contains(addr),
            Rule::Path(_) => false,
        });
        if permitted {
            return Ok(());
        }
        Err(Refusal {
            org: self.org.clone(),
            host: host.to_string(),
            addr: canonical(addr),
            class,
            range,
        })
    }

    /// The directories local files may be under.
    pub fn roots(&self) -> impl Iterator<Item = &Path> {
        self.rules.iter().filter_map(|r| match r {
            Rule::Path(p) => Some(p.as_path()),
            _ => None,
        })
    }

    /// Whether a local path may be read or written: `path` and the roots are
    /// as the caller canonicalised them (symlinks resolved), and `inside`
    /// lists the installation's own places (the store, the warehouse), which
    /// no connector may name even under an allowed root.
    pub fn check_path(
        &self,
        path: &Path,
        roots: &[PathBuf],
        inside: &[(&str, PathBuf)],
    ) -> Result<(), PathRefusal> {
        let refuse = |why: String| PathRefusal {
            org: self.org.clone(),
            path: path.display().to_string(),
            why,
        };
        lexically_plain(path).map_err(|w| refuse(w.to_string()))?;
        for (what, place) in inside {
            if path.starts_with(place) || place.starts_with(path) {
                return Err(refuse(format!(
                    "it is inside, or holds, the installation's {what} ({})",
                    place.display()
                )));
            }
        }
        if roots.iter().any(|r| path.starts_with(r)) {
            return Ok(());
        }
        let named: Vec<String> = self.roots().map(|r| r.display().to_string()).collect();
        Err(refuse(if named.is_empty() {
            format!(
                "org '{}' has no local roots; an admin allows a directory with \
                 SELECT orca.allow('{}', '/that/dir')",
                self.org, self.org
            )
        } else {
            format!(
                "it is not under a root org '{}' may use ({})",
                self.org,
                named.join(", ")
            )
        }))
    }
}

/// What a connector option reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach<'a> {
    /// A Postgres connection string.
    Postgres(&'a str),
    /// A files source's or Parquet destination's place: a local path, a
    /// `file://` URL or an object store's prefix (`s3://`, `az://`, `gs://`).
    Place(&'a str),
}

/// The URL schemes of object stores (`orca_lake::objstore` reads them):
/// S3, Azure Blob Storage and Google Cloud Storage.
pub const OBJECT_STORE_SCHEMES: &[&str] = &[
    "s3", "s3a", "az", "azure", "abfs", "abfss", "wasb", "wasbs", "gs",
];

/// The local directory a place names, if it is local (any other scheme
/// stays a path, which is refused for not being absolute).
pub fn local_path(place: &str) -> Option<&str> {
    if let Some((scheme, _)) = place.split_once("://") {
        if OBJECT_STORE_SCHEMES.contains(&scheme) {
            return None;
        }
    }
    Some(place.strip_prefix("file://").unwrap_or(place))
}

/// What can be judged of a definition before anything is resolved: hosts
/// written as addresses, Unix sockets and local paths (names are judged
/// when the attempt resolves them). `reaches` pairs each option's place in
/// the definition (`source.url`) with what it reaches; options that name a
/// secret are judged when the attempt reads it.
pub fn check_reaches(list: &Allowlist, reaches: &[(&str, Reach<'_>)]) -> Result<(), NetguardError> {
    let roots: Vec<PathBuf> = list.roots().map(Path::to_path_buf).collect();
    for (at, reach) in reaches {
        match *reach {
            Reach::Postgres(conn) => {
                let hosts = crate::conninfo::hosts(conn).map_err(|e| {
                    NetguardError::BadRule(
                        format!("{at}: {}", crate::conninfo::redact(conn)),
                        bad_conn(e),
                    )
                })?;
                for h in hosts {
                    // A pinned address (hostaddr) is where the connection
                    // goes, whatever the name beside it, a Unix socket's
                    // directory included (libpq and the engine connect by
                    // TCP to a hostaddr): it is judged as a host of its own,
                    // so that an allowed name or directory cannot carry it.
                    if h.name.starts_with('/') && h.hostaddr.is_none() {
                        list.check_path(Path::new(&h.name), &roots, &[])
                            .map_err(NetguardError::PathRefused)?;
                        continue;
                    }
                    let written = h.hostaddr.as_deref().unwrap_or(h.name.as_str());
                    let bare = written.trim_start_matches('[').trim_end_matches(']');
                    match bare.parse::<IpAddr>() {
                        Ok(addr) => list.check(bare, addr).map_err(NetguardError::Refused)?,
                        Err(_) if h.hostaddr.is_some() => {
                            return Err(NetguardError::BadRule(
                                format!("{at}: {}", crate::conninfo::redact(conn)),
                                "hostaddr must be a numeric address",
                            ))
                        }
                        Err(_) => {}
                    }
                }
            }
            Reach::Place(place) => {
                if let Some(p) = local_path(place) {
                    list.check_path(Path::new(p), &roots, &[])
                        .map_err(NetguardError::PathRefused)?;
                }
            }
        }
    }
    Ok(())
}

fn bad_conn(e: crate::conninfo::ConnInfoError) -> &'static str {
    match e {
        crate::conninfo::ConnInfoError::Malformed(why) => why,
    }
}

/// The allowlist entries that would permit what `reaches` names as it is
/// written: each host (an address as its network of one), Unix socket
/// directory and local path. The upgrade to 0.2.0 gives existing syncs these,
/// so that what ran before keeps running.
pub fn entries_for(reaches: &[(&str, Reach<'_>)]) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    let mut push = |r: Result<Rule, NetguardError>| {
        if let Ok(r) = r {
            if !out.contains(&r) {
                out.push(r);
            }
        }
    };
    for (_, reach) in reaches {
        match *reach {
            Reach::Postgres(conn) => {
                for h in crate::conninfo::hosts(conn).unwrap_or_default() {
                    if let Some(a) = &h.hostaddr {
                        push(a.parse());
                    }
                    push(h.name.to_ascii_lowercase().parse());
                }
            }
            Reach::Place(place) => {
                if let Some(p) = local_path(place) {
                    push(p.parse());
                }
            }
        }
    }
    out
}

/// A path a connector names must be absolute and plain: no `.` or `..`.
pub fn lexically_plain(path: &Path) -> Result<(), &'static str> {
    if !path.is_absolute() {
        return Err("a local path must be absolute");
    }
    // By the text: Path::components drops inner '.' segments unseen.
    let text = path.to_string_lossy();
    if text.split('/').any(|seg| seg == "." || seg == "..") {
        return Err("a local path may not hold '.' or '..'");
    }
    if path
        .components()
        .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err("a local path may not hold '.' or '..'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    fn list(entries: &[&str]) -> Allowlist {
        let entries: Vec<String> = entries.iter().map(|s| s.to_string()).collect();
        Allowlist::new("acme", &entries).expect("allowlist")
    }

    #[test]
    fn addresses_are_classified_by_what_they_reach() {
        for (a, c) in [
            ("8.8.8.8", Class::Public),
            ("2606:4700::1111", Class::Public),
            ("127.0.0.1", Class::Loopback),
            ("127.255.0.9", Class::Loopback),
            ("::1", Class::Loopback),
            ("10.1.2.3", Class::Private),
            ("172.31.255.255", Class::Private),
            ("172.32.0.1", Class::Public),
            ("192.168.0.1", Class::Private),
            ("fd12::1", Class::Private),
            ("100.64.0.1", Class::Shared),
            ("169.254.169.254", Class::Metadata),
            ("fd00:ec2::254", Class::Metadata),
            ("169.254.1.1", Class::LinkLocal),
            ("fe80::1", Class::LinkLocal),
            ("0.0.0.0", Class::Unspecified),
            ("::", Class::Unspecified),
            ("224.0.0.1", Class::Multicast),
            ("ff02::1", Class::Multicast),
            ("255.255.255.255", Class::Reserved),
            ("2001:db8::1", Class::Reserved),
            // IPv4 in IPv6 clothing reaches the IPv4 host.
            ("::ffff:127.0.0.1", Class::Loopback),
            ("::ffff:169.254.169.254", Class::Metadata),
            ("::10.0.0.1", Class::Private),
            ("64:ff9b::a00:1", Class::Private),
            ("2002:7f00:1::1", Class::Loopback),
        ] {
            assert_eq!(classify(ip(a)).0, c, "{a}");
        }
    }

    #[test]
    fn rules_parse_or_are_refused_with_a_reason() {
        assert_eq!(
            list(&["db.internal"]).rules,
            [Rule::Host("db.internal".into())]
        );
        assert_eq!(
            list(&["*.corp.example"]).rules,
            [Rule::Subdomains("corp.example".into())]
        );
        assert_eq!(
            list(&["/srv/data/"]).rules,
            [Rule::Path(PathBuf::from("/srv/data"))]
        );
        assert_eq!(list(&["127.0.0.1"]).rules[0].to_string(), "127.0.0.1/32");
        assert_eq!(list(&["10.0.0.0/8"]).rules[0].to_string(), "10.0.0.0/8");
        assert_eq!(
            list(&["::ffff:10.0.0.1"]).rules[0].to_string(),
            "10.0.0.1/32"
        );
        for bad in [
            "",
            "DB.internal",
            "-db.x",
            "db..x",
            "*.",
            "a b",
            "10.0.0.1/8",
            "10.0.0.0/33",
            "::1/129",
            "1.2.3/8",
            "/srv/../etc",
            "/srv/./x",
            "http://db",
        ] {
            assert!(bad.parse::<Rule>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn public_addresses_pass_and_the_rest_need_a_rule() {
        let none = list(&[]);
        none.check("example.com", ip("93.184.216.34"))
            .expect("public");
        let r = none
            .check("db.internal", ip("10.0.0.5"))
            .expect_err("private");
        let msg = r.to_string();
        for part in [
            "db.internal",
            "10.0.0.5",
            "private",
            "10.0.0.0/8",
            "orca.allow('acme'",
        ] {
            assert!(msg.contains(part), "{msg} lacks {part}");
        }
        let meta = none
            .check("metadata.google.internal", ip("169.254.169.254"))
            .expect_err("metadata");
        assert_eq!(meta.class, Class::Metadata);

        let some = list(&["127.0.0.1", "db.internal", "*.corp.example", "fd00::/8"]);
        some.check("localhost", ip("127.0.0.1")).expect("network");
        some.check("localhost", ip("::ffff:127.0.0.1"))
            .expect("mapped");
        some.check("localhost", ip("127.0.0.2")).expect_err("a /32");
        some.check("DB.Internal.", ip("10.9.9.9"))
            .expect("the host");
        some.check("pg.corp.example", ip("10.1.1.1"))
            .expect("a subdomain");
        some.check("corp.example", ip("10.1.1.1"))
            .expect_err("not itself");
        some.check("evilcorp.example", ip("10.1.1.1"))
            .expect_err("not a suffix of a label");
        some.check("[fd00::5]", ip("fd00::5")).expect("v6 network");
        some.check("elsewhere", ip("169.254.169.254"))
            .expect_err("metadata");
    }

    #[test]
    fn local_paths_must_be_under_a_root_and_outside_the_installation() {
        let l = list(&["/srv/data", "/tmp"]);
        let roots: Vec<PathBuf> = l.roots().map(Path::to_path_buf).collect();
        let inside = [("store", PathBuf::from("/tmp/orca/store"))];
        l.check_path(Path::new("/srv/data/in"), &roots, &inside)
            .expect("under a root");
        l.check_path(Path::new("/tmp/other"), &roots, &inside)
            .expect("under /tmp");
        for (p, why) in [
            ("/etc/passwd", "not under a root"),
            ("/srv/database", "not under a root"),
            ("/tmp/orca/store/globex", "store"),
            ("/tmp/orca", "store"),
            ("/srv/data/../../etc", "'..'"),
            ("relative/path", "absolute"),
        ] {
            let e = l
                .check_path(Path::new(p), &roots, &inside)
                .expect_err(p)
                .to_string();
            assert!(e.contains(why) && e.contains(p), "{p}: {e}");
        }
        let e = list(&[])
            .check_path(Path::new("/srv/x"), &[], &[])
            .expect_err("no roots")
            .to_string();
        assert!(e.contains("no local roots"), "{e}");
    }

    #[test]
    fn a_definition_is_judged_by_what_it_names_as_written() {
        let list = list(&["10.1.0.0/16", "/srv/in"]);
        let ok = [
            (
                "source.url",
                Reach::Postgres("postgres://app@10.1.2.3/shop"),
            ),
            (
                "source.url",
                Reach::Postgres("postgres://app@db.internal/shop"),
            ),
            ("destination.url", Reach::Place("/srv/in/out")),
            ("destination.url", Reach::Place("s3://bucket/out")),
        ];
        check_reaches(&list, &ok).expect("allowed, or judged later");
        for bad in [
            Reach::Postgres("postgres://app@10.2.0.1/shop"),
            Reach::Postgres("host=db.internal hostaddr=169.254.169.254"),
            Reach::Postgres("postgres://[::1]:5432/shop"),
            Reach::Postgres("host=/var/run/postgresql dbname=shop"),
            Reach::Place("/etc"),
            Reach::Place("file:///srv/in/../../etc"),
        ] {
            let e = check_reaches(&list, &[("source.url", bad)]).expect_err("refused");
            assert!(
                matches!(e, NetguardError::Refused(_) | NetguardError::PathRefused(_)),
                "{bad:?}: {e}"
            );
        }
        let entries: Vec<String> = entries_for(&[
            (
                "source.url",
                Reach::Postgres("postgres://app@127.0.0.1:5432/shop"),
            ),
            (
                "destination.url",
                Reach::Postgres("host=DB.internal,127.0.0.1"),
            ),
            ("destination.url", Reach::Place("/tmp/out")),
        ])
        .iter()
        .map(Rule::to_string)
        .collect();
        assert_eq!(entries, ["127.0.0.1/32", "db.internal", "/tmp/out"]);
    }

    #[test]
    fn a_pinned_address_is_judged_as_a_host_of_its_own() {
        // db.internal is allowed whatever it resolves to, but hostaddr is
        // where the connection goes: it must be allowed itself.
        let list = list(&["db.internal", "10.1.0.0/16", "/srv/in"]);
        for bad in [
            "host=db.internal hostaddr=169.254.169.254 dbname=x",
            "host=db.internal hostaddr=127.0.0.1",
            "host=db.internal hostaddr=::1",
            "host=db.internal hostaddr=::ffff:127.0.0.1",
            "postgres://app@db.internal/shop?hostaddr=10.2.0.9",
            "host=db.internal,db.internal hostaddr=10.1.0.5,127.0.0.1",
            "host=/srv/in hostaddr=169.254.169.254 port=80",
            "host=/srv/in hostaddr=127.0.0.1",
        ] {
            let e = check_reaches(&list, &[("source.url", Reach::Postgres(bad))])
                .expect_err("a pinned address the allowlist does not permit");
            assert!(matches!(e, NetguardError::Refused(_)), "{bad}: {e}");
        }
        for ok in [
            "host=db.internal hostaddr=10.1.2.3 dbname=x",
            "host=db.internal dbname=x",
            "host=other.example hostaddr=10.1.0.7",
        ] {
            check_reaches(&list, &[("source.url", Reach::Postgres(ok))]).expect(ok);
        }
        let e = check_reaches(
            &list,
            &[(
                "source.url",
                Reach::Postgres("host=db.internal hostaddr=metadata.internal"),
            )],
        )
        .expect_err("hostaddr must be an address");
        assert!(e.to_string().contains("numeric"), "{e}");
    }
}
