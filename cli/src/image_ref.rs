//! Image references as registries take them, checked before anything is
//! built, pushed or recorded.

/// An image reference as registries take it: `[host[:port]/]path[:tag]`
/// and an optional `@sha256:<64 hex>`, lower-case path components.
pub fn check_reference(r: &str) -> anyhow::Result<()> {
    let bad = |why: &str| anyhow::anyhow!("image reference {r:?} {why}");
    if r.is_empty() || r.len() > 512 {
        return Err(bad("must be 1 to 512 characters"));
    }
    let (name, digest) = match r.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (r, None),
    };
    if let Some(d) = digest {
        let hex = d
            .strip_prefix("sha256:")
            .ok_or_else(|| bad("has a digest that is not sha256:<64 hex digits>"))?;
        if hex.len() != 64
            || !hex
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        {
            return Err(bad("has a digest that is not sha256:<64 hex digits>"));
        }
    }
    let last = name.rsplit('/').next().unwrap_or(name);
    let (path, tag) = match last.split_once(':') {
        Some((_, t)) => (&name[..name.len() - t.len() - 1], Some(t)),
        None => (name, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        if !ok {
            return Err(bad(
                "has a tag that is not [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}",
            ));
        }
    }
    let mut parts: Vec<&str> = path.split('/').collect();
    // A first part with a dot or a port, or localhost, is a registry host.
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        let ok = host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c));
        if !ok {
            return Err(bad(
                "has a registry host that is not a host name or address",
            ));
        }
    }
    for p in &parts {
        let ok = !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            && p.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && p.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
        if !ok {
            return Err(bad(
                "has a name that is not lower-case letters, digits and . _ - between slashes",
            ));
        }
    }
    Ok(())
}

/// The repository of a reference: without its tag or digest.
pub fn repository(r: &str) -> &str {
    let name = r.split('@').next().unwrap_or(r);
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rfind(':') {
        Some(i) => &name[..name.len() - last.len() + i],
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_registries_take_pass_and_others_are_named() {
        for ok in [
            "127.0.0.1:5001/acme/pipelines:2024-12-04",
            "localhost/orca-runner:0.3.0",
            "ghcr.io/acme/etl",
            "registry.example.com/a/b@sha256:0d72d34e726fad19c713d5506dbe872204f46359cf25cca1c3ebae0f93507df1",
            "orca-runner",
        ] {
            assert!(check_reference(ok).is_ok(), "{ok}");
        }
        for (bad, says) in [
            ("", "1 to 512"),
            ("ghcr.io/Acme/etl", "lower-case"),
            ("ghcr.io/acme/etl:bad tag", "tag"),
            ("ghcr.io/acme/etl@sha256:abc", "digest"),
            ("ghcr.io/acme//etl", "lower-case"),
            ("ghcr.io/acme/etl;rm -rf /", "lower-case"),
            ("http://ghcr.io/acme/etl", "lower-case"),
        ] {
            let e = check_reference(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                e.contains(says) && e.contains(&format!("{bad:?}")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_repository_is_its_reference_without_tag_or_digest() {
        assert_eq!(
            repository("127.0.0.1:5001/acme/p:1"),
            "127.0.0.1:5001/acme/p"
        );
        assert_eq!(repository("127.0.0.1:5001/acme/p"), "127.0.0.1:5001/acme/p");
        assert_eq!(repository("ghcr.io/a/p@sha256:00"), "ghcr.io/a/p");
    }
}
