//! PostgreSQL connection strings, in both forms libpq takes: a URL
//! (`postgres://user:pw@host:5432/db?sslmode=require`) and key=value
//! conninfo (`host=db user=app password='a b' sslmode=verify-full`).
//!
//! One reading of them for everything that looks inside: redaction for
//! messages, finding passwords (refused in sync definitions), the hosts a
//! connector will reach (netguard), and the TLS settings that the Rust
//! clients do not parse themselves.

/// A parameter of a connection string, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    pub key: String,
    pub value: String,
}

/// A host a connection string names, with the address it pins (`hostaddr`)
/// and port, where given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub hostaddr: Option<String>,
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnInfoError {
    #[error("malformed connection string: {0}")]
    Malformed(&'static str),
}

/// A URL: `scheme://...` (libpq's are `postgres://` and `postgresql://`; a
/// files source's `s3://user:key@...` is read the same way for passwords).
fn is_url(conn: &str) -> bool {
    conn.trim_start()
        .split_once("://")
        .is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A URL's parts: scheme, userinfo, hosts, path and query, as written.
struct UrlParts<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    hosts: &'a str,
    rest: &'a str,
    query: Option<&'a str>,
}

fn url_parts(conn: &str) -> UrlParts<'_> {
    let c = conn.trim();
    let (scheme, after) = c.split_once("://").unwrap_or(("", c));
    let (before_query, query) = match after.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (after, None),
    };
    let (authority, rest) = match before_query.find('/') {
        Some(i) => (&before_query[..i], &before_query[i..]),
        None => (before_query, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    UrlParts {
        scheme,
        userinfo,
        hosts,
        rest,
        query,
    }
}

fn query_params(query: Option<&str>) -> Vec<Param> {
    query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Param {
                key: percent_decode(k),
                value: percent_decode(v),
            }
        })
        .collect()
}

/// The key=value pairs of a conninfo string, in order.
fn keyword_params(conn: &str) -> Result<Vec<Param>, ConnInfoError> {
    let mut out = Vec::new();
    let mut chars = conn.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(ConnInfoError::Malformed("a keyword without '=value'"));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(ConnInfoError::Malformed("an unterminated quoted value")),
                    Some('\'') => break,
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => return Err(ConnInfoError::Malformed("a trailing backslash")),
                    },
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(n) = chars.next() {
                        value.push(n);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        out.push(Param { key, value });
    }
}

/// Every parameter the string sets: a URL's query (and its user and
/// password, as `user` and `password`), or a conninfo string's pairs.
pub fn params(conn: &str) -> Result<Vec<Param>, ConnInfoError> {
    if !is_url(conn) {
        return keyword_params(conn);
    }
    let u = url_parts(conn);
    let mut out = Vec::new();
    if let Some(info) = u.userinfo {
        let (user, password) = match info.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (info, None),
        };
        if !user.is_empty() {
            out.push(Param {
                key: "user".into(),
                value: percent_decode(user),
            });
        }
        if let Some(p) = password {
            out.push(Param {
                key: "password".into(),
                value: percent_decode(p),
            });
        }
    }
    out.extend(query_params(u.query));
    Ok(out)
}

/// Whether the string carries a password (`user:password@` in a URL, or a
/// `password` parameter in either form). A string that does not parse is
/// looked at word by word, so a password cannot hide behind a syntax error.
pub fn has_password(conn: &str) -> bool {
    match params(conn) {
        Ok(ps) => ps.iter().any(|p| p.key.eq_ignore_ascii_case("password")),
        Err(_) => conn
            .split(|c: char| c.is_whitespace() || c == '&' || c == '?')
            .any(|w| w.trim().to_ascii_lowercase().starts_with("password")),
    }
}

/// The string without its password, for messages and logs.
pub fn redact(conn: &str) -> String {
    if is_url(conn) {
        let u = url_parts(conn);
        let mut out = format!("{}://", u.scheme);
        if let Some(info) = u.userinfo {
            let user = info.split(':').next().unwrap_or_default();
            out.push_str(user);
            if info.contains(':') {
                out.push_str(":***");
            }
            out.push('@');
        }
        out.push_str(u.hosts);
        out.push_str(u.rest);
        if let Some(q) = u.query {
            let kept: Vec<String> = q
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if percent_decode(k).eq_ignore_ascii_case("password") => {
                        format!("{k}=***")
                    }
                    _ => kv.to_string(),
                })
                .collect();
            out.push('?');
            out.push_str(&kept.join("&"));
        }
        return out;
    }
    match keyword_params(conn) {
        Ok(ps) => ps
            .iter()
            .map(|p| {
                if p.key.eq_ignore_ascii_case("password") {
                    format!("{}=***", p.key)
                } else {
                    format!("{}={}", p.key, quote(&p.value))
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
        // Unparsable: show nothing of it rather than a password.
        Err(_) => "(a malformed connection string)".to_string(),
    }
}

fn quote(v: &str) -> String {
    if !v.is_empty() && !v.contains(|c: char| c.is_whitespace() || c == '\'' || c == '\\') {
        return v.to_string();
    }
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// The string without the parameters named by `keys`, and their values:
/// what a client that does not parse those parameters is handed.
pub fn take(conn: &str, keys: &[&str]) -> Result<(String, Vec<Param>), ConnInfoError> {
    let wanted = |k: &str| keys.iter().any(|w| w.eq_ignore_ascii_case(k));
    let mut taken = Vec::new();
    if is_url(conn) {
        let u = url_parts(conn);
        let Some(q) = u.query else {
            return Ok((conn.trim().to_string(), taken));
        };
        let mut kept = Vec::new();
        for kv in q.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            if wanted(&percent_decode(k)) {
                taken.push(Param {
                    key: percent_decode(k),
                    value: percent_decode(v),
                });
            } else {
                kept.push(kv);
            }
        }
        let head = conn.trim().split_once('?').map_or(conn.trim(), |(h, _)| h);
        let rest = if kept.is_empty() {
            head.to_string()
        } else {
            format!("{head}?{}", kept.join("&"))
        };
        return Ok((rest, taken));
    }
    let mut kept = Vec::new();
    for p in keyword_params(conn)? {
        if wanted(&p.key) {
            taken.push(p);
        } else {
            kept.push(format!("{}={}", p.key, quote(&p.value)));
        }
    }
    Ok((kept.join(" "), taken))
}

/// The hosts the string names, in order: a URL's authority
/// (`h1:5432,[::1]:5433`) or `host=`, with `hostaddr=` and `port=` lists
/// matched to them one by one as libpq does. A host that is a directory
/// (`/var/run/postgresql`) is a Unix socket.
pub fn hosts(conn: &str) -> Result<Vec<Host>, ConnInfoError> {
    let ps = params(conn)?;
    let get = |k: &str| {
        ps.iter()
            .rev()
            .find(|p| p.key.eq_ignore_ascii_case(k))
            .map(|p| p.value.clone())
    };
    let list = |v: Option<String>| -> Vec<String> {
        v.map(|s| s.split(',').map(|x| x.trim().to_string()).collect())
            .unwrap_or_default()
    };
    let mut names: Vec<(String, Option<String>)> = Vec::new();
    if is_url(conn) {
        let u = url_parts(conn);
        for h in u.hosts.split(',').filter(|h| !h.is_empty()) {
            let (name, port) = if let Some(rest) = h.strip_prefix('[') {
                let (addr, tail) = rest
                    .split_once(']')
                    .ok_or(ConnInfoError::Malformed("an IPv6 host without ']'"))?;
                (addr.to_string(), tail.strip_prefix(':').map(str::to_string))
            } else {
                match h.rsplit_once(':') {
                    Some((n, p)) => (n.to_string(), Some(p.to_string())),
                    None => (h.to_string(), None),
                }
            };
            names.push((percent_decode(&name), port));
        }
    }
    // A query's or conninfo's host= replaces the authority's hosts.
    let host_param = list(get("host"));
    if !host_param.is_empty() {
        names = host_param.into_iter().map(|h| (h, None)).collect();
    }
    let addrs = list(get("hostaddr"));
    if names.is_empty() {
        names = addrs.iter().map(|a| (a.clone(), None)).collect();
    }
    let ports = list(get("port"));
    let port_of = |i: usize, own: Option<String>| -> Result<Option<u16>, ConnInfoError> {
        let p = own.or_else(|| match ports.len() {
            0 => None,
            1 => ports.first().cloned(),
            _ => ports.get(i).cloned(),
        });
        match p {
            None => Ok(None),
            Some(p) if p.is_empty() => Ok(None),
            Some(p) => p
                .parse()
                .map(Some)
                .map_err(|_| ConnInfoError::Malformed("a port that is not a number")),
        }
    };
    names
        .into_iter()
        .enumerate()
        .map(|(i, (name, port))| {
            Ok(Host {
                name,
                hostaddr: addrs.get(i).cloned().filter(|a| !a.is_empty()),
                port: port_of(i, port)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_found_in_either_form() {
        for yes in [
            "postgres://app:pw@db/shop",
            "postgresql://app:@db/shop",
            "postgres://app@db/shop?password=pw",
            "postgres://db/shop?sslmode=require&PASSWORD=pw",
            "host=db password=pw",
            "host=db password = 'a b'",
            "host=db PassWord=x",
            "host='unterminated password=x",
        ] {
            assert!(has_password(yes), "{yes}");
        }
        for no in [
            "postgres://app@db/shop",
            "postgres://db/shop?sslmode=require",
            "host=db user=app",
            "host=db application_name='password=x'",
        ] {
            assert!(!has_password(no), "{no}");
        }
    }

    #[test]
    fn redaction_keeps_everything_but_the_password() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/shop?sslmode=require&password=x"),
            "postgres://app:***@db:5432/shop?sslmode=require&password=***"
        );
        assert_eq!(redact("postgres://app@db/shop"), "postgres://app@db/shop");
        assert_eq!(
            redact("host=db user=app password='s3 cret' dbname=shop"),
            "host=db user=app password=*** dbname=shop"
        );
        assert_eq!(
            redact("host=db password=s3cret application_name='a b'"),
            "host=db password=*** application_name='a b'"
        );
        assert!(!redact("host='db password=s3cret").contains("s3cret"));
    }

    #[test]
    fn parameters_can_be_taken_out_of_either_form() {
        let (rest, taken) = take(
            "postgres://u@h/db?sslmode=verify-full&application_name=x&sslrootcert=%2Fca.pem",
            &["sslmode", "sslrootcert"],
        )
        .expect("url");
        assert_eq!(rest, "postgres://u@h/db?application_name=x");
        assert_eq!(
            taken,
            [
                Param {
                    key: "sslmode".into(),
                    value: "verify-full".into()
                },
                Param {
                    key: "sslrootcert".into(),
                    value: "/ca.pem".into()
                }
            ]
        );
        let (rest, taken) = take("postgres://u@h/db?sslmode=require", &["sslmode"]).expect("url");
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(taken.len(), 1);
        let (rest, taken) = take(
            "host=h sslmode=verify-ca user='a b' sslrootcert=/x",
            &["sslmode", "sslrootcert"],
        )
        .expect("conninfo");
        assert_eq!(rest, "host=h user='a b'");
        assert_eq!(taken.len(), 2);
        assert!(take("host='h", &["sslmode"]).is_err());
    }

    #[test]
    fn hosts_come_from_the_authority_or_the_parameters() {
        let h = hosts("postgres://u:p@db1:5433,[::1]:5434,db3/x").expect("url");
        assert_eq!(
            h.iter()
                .map(|h| (h.name.as_str(), h.port))
                .collect::<Vec<_>>(),
            [("db1", Some(5433)), ("::1", Some(5434)), ("db3", None)]
        );
        let h = hosts("postgres://%2Fvar%2Frun%2Fpostgresql/x").expect("socket");
        assert_eq!(h[0].name, "/var/run/postgresql");
        let h = hosts("postgres:///x?host=10.0.0.1&port=6000").expect("query host");
        assert_eq!((h[0].name.as_str(), h[0].port), ("10.0.0.1", Some(6000)));
        let h = hosts("host=db.internal,db2 hostaddr=10.0.0.5,10.0.0.6 port=5432").expect("kv");
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].hostaddr.as_deref(), Some("10.0.0.6"));
        assert_eq!(h[1].port, Some(5432));
        let h = hosts("hostaddr=127.0.0.1 dbname=x").expect("hostaddr only");
        assert_eq!(h[0].name, "127.0.0.1");
        assert!(hosts("postgres://db:notaport/x").is_err());
        assert!(hosts("postgres://[::1/x").is_err());
    }
}
