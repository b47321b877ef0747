//! `orca register <binary>`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};
use postgres::Client;
use serde_json::Value;

use crate::db::explain;

/// Where a registered binary runs: in this image, at `dir/<file name>`
/// (what `orca push` put there), rather than at its path here.
pub struct InImage<'a> {
    pub reference: &'a str,
    pub dir: &'a str,
}

pub fn run(c: &mut Client, binary: &Path, image: Option<&InImage>) -> anyhow::Result<i32> {
    let binary = binary
        .canonicalize()
        .with_context(|| format!("no pipeline binary at {}", binary.display()))?;
    let out = Command::new(&binary)
        .args(["describe", "--json"])
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    if !out.status.success() {
        bail!(
            "{} describe --json failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut manifest: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{} describe --json printed no JSON", binary.display()))?;
    let sidecar = binary.with_file_name(format!(
        "{}.source.json",
        binary
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
    ));
    if let Ok(text) = std::fs::read_to_string(&sidecar) {
        let locations: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", sidecar.display()))?;
        if let Some(m) = manifest.as_object_mut() {
            m.insert("locations".into(), locations);
        }
    }
    // The binary is pinned by what this command hashed, whatever the binary
    // says of itself: runners run only a file with this sha256.
    let sha = sha256_of(&binary)?;
    if let Some(m) = manifest.as_object_mut() {
        m.insert("binary_sha256".into(), Value::String(sha));
    }
    if let (Some(img), Some(m)) = (image, manifest.as_object_mut()) {
        crate::image_ref::check_reference(img.reference)?;
        let file = binary
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        m.insert("image".into(), Value::String(img.reference.to_string()));
        m.insert(
            "binary".into(),
            Value::String(format!("{}/{file}", img.dir.trim_end_matches('/'))),
        );
    }
    // Checked here too, so that a bad manifest names its field before
    // anything is sent.
    let name = orca_core::manifest::parse(&manifest)
        .with_context(|| format!("{} describe --json", binary.display()))?
        .name;
    let id: i64 = c
        .query_one("SELECT orca.register($1)", &[&manifest])
        .map_err(explain)?
        .get(0);
    let row = c
        .query_one(
            "SELECT version, registry_hash FROM orca.pipeline_versions WHERE id = $1",
            &[&id],
        )
        .map_err(explain)?;
    let version: i32 = row.get(0);
    let hash: String = row.get(1);
    match image {
        Some(img) => println!(
            "registered {name} version {version} (registry hash {hash}) from {}, to run from image {}",
            binary.display(),
            img.reference
        ),
        None => println!(
            "registered {name} version {version} (registry hash {hash}) from {}",
            binary.display()
        ),
    }
    Ok(0)
}

pub fn sha256_of(path: &Path) -> anyhow::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut file =
        std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
