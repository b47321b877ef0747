//! `orca push`: the project's image. Each pipeline binary goes to
//! `/opt/orca/pipelines/<name>` of an image built FROM the runner image,
//! with `orca locate`'s output beside it and the source, commit and
//! binaries' hashes as labels; buildah builds and pushes it (no Docker
//! engine), and `--register` records the pushed digest on each version.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// Where pipeline binaries live in an image (the runner image's
/// `ORCA_PIPELINES`).
pub const PIPELINES_DIR: &str = "/opt/orca/pipelines";

pub struct Push<'a> {
    pub image: &'a str,
    pub from: &'a str,
    pub root: &'a Path,
    pub binaries: &'a [PathBuf],
    pub insecure_registry: bool,
}

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
fn repository(r: &str) -> &str {
    let name = r.split('@').next().unwrap_or(r);
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rfind(':') {
        Some(i) => &name[..name.len() - last.len() + i],
        None => name,
    }
}

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A repository URL fit for a public label: no user or password.
fn public_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (host_part, path) = rest.split_once('/').unwrap_or((rest, ""));
            let host = host_part.rsplit('@').next().unwrap_or(host_part);
            if path.is_empty() {
                format!("{scheme}://{host}")
            } else {
                format!("{scheme}://{host}/{path}")
            }
        }
        None => url.to_string(),
    }
}

fn buildah(args: &[String]) -> anyhow::Result<String> {
    let out = Command::new("buildah").args(args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!(
                "buildah is missing: orca push builds images with it (apt-get install buildah)"
            )
        } else {
            anyhow::anyhow!("cannot run buildah: {e}")
        }
    })?;
    if !out.status.success() {
        bail!(
            "buildah {} failed: {}",
            args.first().map(String::as_str).unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The pushed image, `repository@sha256:…`, and the copies of the binaries
/// as they went into it (with their `.source.json` beside them), kept
/// until the returned guard is dropped.
pub struct Pushed {
    pub reference: String,
    pub binaries: Vec<PathBuf>,
    _scratch: Scratch,
}

pub fn run(p: &Push) -> anyhow::Result<Pushed> {
    check_reference(p.image)?;
    check_reference(p.from).context("--from")?;
    if p.binaries.is_empty() {
        bail!("name at least one pipeline binary to put in the image");
    }
    let root = p
        .root
        .canonicalize()
        .with_context(|| format!("no source tree at {}", p.root.display()))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let ctx = std::env::temp_dir().join(format!("orca-push-{}-{nanos}", std::process::id()));
    let scratch = Scratch(ctx.clone());
    let dir = ctx.join("pipelines");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;

    let mut names = Vec::new();
    let mut copies = Vec::new();
    let mut labels = Vec::new();
    for b in p.binaries {
        let meta = std::fs::metadata(b)
            .with_context(|| format!("no pipeline binary at {}", b.display()))?;
        let name = b
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| {
                !n.is_empty()
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            })
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: a pipeline binary's file name must be letters, digits and . _ -",
                    b.display()
                )
            })?
            .to_string();
        if !meta.is_file() {
            bail!("{} is not a file", b.display());
        }
        if names.contains(&name) {
            bail!("two binaries named {name}: each goes to {PIPELINES_DIR}/{name}");
        }
        let copy = dir.join(&name);
        std::fs::copy(b, &copy)
            .with_context(|| format!("cannot copy {} into the image", b.display()))?;
        // Where each step is in the source, beside the binary in the image
        // (and read by --register from here).
        crate::locate::run(&copy, &root)?;
        labels.push(format!(
            "dev.orca.pipeline.{name}.sha256={}",
            crate::register::sha256_of(&copy)?
        ));
        names.push(name);
        copies.push(copy);
    }
    labels.push(format!("dev.orca.pipelines={}", names.join(",")));
    // The base's title and description would say orca-runner.
    let title = repository(p.image).rsplit('/').next().unwrap_or(p.image);
    labels.push(format!("org.opencontainers.image.title={title}"));
    labels.push(format!(
        "org.opencontainers.image.description=Orca pipelines: {}",
        names.join(", ")
    ));
    labels.push(format!("org.opencontainers.image.base.name={}", p.from));
    if let Some(url) = git(&root, &["remote", "get-url", "origin"]) {
        labels.push(format!(
            "org.opencontainers.image.source={}",
            public_url(&url)
        ));
    }
    if let Some(commit) = git(&root, &["rev-parse", "HEAD"]) {
        labels.push(format!("org.opencontainers.image.revision={commit}"));
        let dirty = git(&root, &["status", "--porcelain", "--untracked-files=no"])
            .is_some_and(|s| !s.is_empty());
        labels.push(format!("dev.orca.dirty={dirty}"));
    }
    std::fs::write(
        ctx.join("Containerfile"),
        format!("FROM {}\nCOPY pipelines/ {PIPELINES_DIR}/\n", p.from),
    )
    .context("cannot write the Containerfile")?;

    let tls = format!("--tls-verify={}", !p.insecure_registry);
    let mut args: Vec<String> = vec!["bud".into(), "-q".into(), tls.clone()];
    for l in &labels {
        args.push("--label".into());
        args.push(l.clone());
    }
    args.extend(["-t".into(), p.image.to_string()]);
    args.push("-f".into());
    args.push(ctx.join("Containerfile").display().to_string());
    args.push(ctx.display().to_string());
    buildah(&args)?;
    let digest_file = ctx.join("digest");
    buildah(&[
        "push".into(),
        "-q".into(),
        tls,
        "--digestfile".into(),
        digest_file.display().to_string(),
        p.image.to_string(),
        format!("docker://{}", p.image),
    ])?;
    let digest = std::fs::read_to_string(&digest_file)
        .context("buildah push wrote no digest")?
        .trim()
        .to_string();
    let reference = format!("{}@{digest}", repository(p.image));
    check_reference(&reference)?;
    println!(
        "pushed {} ({reference}): {}",
        p.image,
        names
            .iter()
            .map(|n| format!("{PIPELINES_DIR}/{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(Pushed {
        reference,
        binaries: copies,
        _scratch: scratch,
    })
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

    #[test]
    fn labels_carry_no_credentials_of_a_source_url() {
        assert_eq!(
            public_url("https://ci:ghp_secret@github.com/acme/etl.git"),
            "https://github.com/acme/etl.git"
        );
        assert_eq!(
            public_url("git@github.com:acme/etl.git"),
            "git@github.com:acme/etl.git"
        );
    }
}
