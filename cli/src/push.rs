//! `orca push`: the project's image. Each pipeline binary goes to
//! `/opt/orca/pipelines/<name>` of an image built FROM the runner image,
//! with `orca locate`'s output beside it and the source, commit and
//! binaries' hashes as labels; buildah builds and pushes it (no Docker
//! engine), and `--register` records the pushed digest on each version.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::image_ref::{check_reference, repository};

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
