//! `orca locate <binary> --root .`: where each step function, each task
//! function and the pipeline declaration are in the source tree, written
//! beside the binary as `<binary>.source.json` for `orca register` to
//! record.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use serde_json::{json, Map, Value};

/// Folders that hold no sources of the pipeline's own.
const SKIP: &[&str] = &["target", ".git", "node_modules", ".orca"];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if p.is_dir() {
            if !SKIP.contains(&name.as_str()) {
                sources(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// (file, line) of `fn <name>` that follows an attribute starting with
/// `attribute` (`#[orca::step`, `#[orca::task`).
fn find_fn(files: &[(PathBuf, String)], attribute: &str, name: &str) -> Option<(PathBuf, usize)> {
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if !l.trim_start().starts_with(attribute) {
                continue;
            }
            for (j, next) in lines.iter().enumerate().skip(i + 1).take(8) {
                let t = next.trim_start();
                let t = t.strip_prefix("pub ").unwrap_or(t);
                let t = t.strip_prefix("pub(crate) ").unwrap_or(t);
                if let Some(rest) = t.strip_prefix("fn ") {
                    if rest
                        .split(|c: char| !c.is_alphanumeric() && c != '_')
                        .next()
                        == Some(name)
                    {
                        return Some((path.clone(), j + 1));
                    }
                    break;
                }
            }
        }
    }
    None
}

/// (file, line) of the `orca::pipeline!` that names the pipeline.
fn find_pipeline(files: &[(PathBuf, String)], name: &str) -> Option<(PathBuf, usize)> {
    let quoted = format!("\"{name}\"");
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains("orca::pipeline!")
                && lines.iter().skip(i).take(4).any(|n| n.contains(&quoted))
            {
                return Some((path.clone(), i + 1));
            }
        }
    }
    None
}

pub fn run(binary: &Path, root: &Path) -> anyhow::Result<i32> {
    let root = root
        .canonicalize()
        .with_context(|| format!("no source tree at {}", root.display()))?;
    let out = Command::new(binary)
        .args(["describe", "--json"])
        .output()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    if !out.status.success() {
        bail!("{} describe --json failed", binary.display());
    }
    let printed: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{} describe --json printed no JSON", binary.display()))?;
    let manifest = orca_core::manifest::parse(&printed)
        .with_context(|| format!("{} describe --json", binary.display()))?;
    let mut paths = Vec::new();
    sources(&root, &mut paths);
    let files: Vec<(PathBuf, String)> = paths
        .into_iter()
        .filter_map(|p| std::fs::read_to_string(&p).ok().map(|t| (p, t)))
        .collect();
    let rel = |p: &Path| p.strip_prefix(&root).unwrap_or(p).display().to_string();
    let mut steps = Map::new();
    let mut missing = Vec::new();
    for s in &manifest.steps {
        let name = s.name.as_str();
        match find_fn(&files, "#[orca::step", name) {
            Some((p, line)) => {
                steps.insert(name.into(), json!({"file": rel(&p), "line": line}));
            }
            None => missing.push(format!("step {name}")),
        }
    }
    let mut tasks = Map::new();
    for t in &manifest.tasks {
        let name = t.name.as_str();
        match find_fn(&files, "#[orca::task", name) {
            Some((p, line)) => {
                tasks.insert(name.into(), json!({"file": rel(&p), "line": line}));
            }
            None => missing.push(format!("task {name}")),
        }
    }
    let pname = manifest.name.as_str();
    let pipeline =
        find_pipeline(&files, pname).map(|(p, line)| json!({"file": rel(&p), "line": line}));
    let mut located =
        json!({"root": root.display().to_string(), "pipeline": pipeline, "steps": steps});
    if let (false, Some(o)) = (tasks.is_empty(), located.as_object_mut()) {
        o.insert("tasks".into(), Value::Object(tasks.clone()));
    }
    let target = binary.with_file_name(format!(
        "{}.source.json",
        binary
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("pipeline")
    ));
    std::fs::write(&target, serde_json::to_string_pretty(&located)?)
        .with_context(|| format!("cannot write {}", target.display()))?;
    for (name, at) in steps.iter().chain(&tasks) {
        println!(
            "{name:<18} {}:{}",
            at["file"].as_str().unwrap_or_default(),
            at["line"]
        );
    }
    if let Some(p) = &pipeline {
        println!(
            "{:<18} {}:{}",
            format!("pipeline {pname}"),
            p["file"].as_str().unwrap_or_default(),
            p["line"]
        );
    }
    println!("wrote {}", target.display());
    if !missing.is_empty() || pipeline.is_none() {
        eprintln!(
            "orca: not found under {}: {}",
            root.display(),
            missing
                .iter()
                .cloned()
                .chain(pipeline.is_none().then(|| format!("pipeline {pname}")))
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Ok(1);
    }
    Ok(0)
}
