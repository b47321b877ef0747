//! The manifest `describe --json` prints and `orca.register` takes
//! (docs/manifest.md), checked with the control plane's own validation.

use serde_json::{json, Value};

use crate::error::SdkError;
use crate::pipeline::{registry_hash, Fills, Partitioning, Pipeline};

/// The manifest of pipeline `P` whose binary lives at `binary`.
pub fn manifest<P: Pipeline>(binary: &str) -> Value {
    let params = P::params();
    let steps = P::steps();
    let tasks = P::tasks();
    let (partitions, fills) = match params.partitions {
        Partitioning::Dated { kind, start } => (
            json!({ kind: start }),
            json!(match params.fills {
                Fills::Previous => "previous",
                Fills::Current => "current",
            }),
        ),
        Partitioning::Keyed { dataset, column } => (
            json!({ "keyed": { "dataset": dataset, "column": column } }),
            Value::Null,
        ),
    };
    let mut m = json!({
        "name": P::NAME,
        "steps": steps.iter().map(|s| json!({
            "name": s.name,
            "kind": s.kind,
            "after": s.after,
            "retries": s.retries,
            "code": s.code,
            "reads": s.reads,
            "writes": s.writes,
        })).collect::<Vec<_>>(),
        "partitions": partitions,
        "keys_per_run": params.keys_per_run,
        "schedule": params.schedule.map(|(cron, tz)| json!({"cron": cron, "tz": tz})),
        "fills": fills,
        "max_runs": params.max_runs,
        "run_retries": params.run_retries,
        "catchup": params.catchup,
        "pool": params.pool,
        "sensor": params.sensor,
        "registry_hash": registry_hash(&steps, &tasks),
        "binary": binary,
    });
    if let (Some(obj), Some(n)) = (m.as_object_mut(), params.backfill_per_run) {
        obj.insert("backfill_per_run".into(), n.into());
    }
    let r = params.resources;
    if let (Some(obj), true) = (
        m.as_object_mut(),
        r.cpu.is_some()
            || r.memory.is_some()
            || r.max_memory.is_some()
            || r.memory_growth.is_some(),
    ) {
        let mut res = serde_json::Map::new();
        for (k, v) in [
            ("cpu", r.cpu),
            ("memory", r.memory),
            ("max_memory", r.max_memory),
        ] {
            if let Some(v) = v {
                res.insert(k.into(), v.into());
            }
        }
        if let Some(g) = r.memory_growth {
            res.insert("memory_growth".into(), json!(g));
        }
        obj.insert("resources".into(), Value::Object(res));
    }
    let b = params.build;
    if let (Some(obj), false) = (m.as_object_mut(), tasks.is_empty()) {
        obj.insert(
            "tasks".into(),
            tasks
                .iter()
                .map(|t| {
                    json!({
                        "name": t.name,
                        "retries": t.retries,
                        "backoff_ms": t.backoff_ms,
                        "code": t.code,
                        "input": t.input,
                        "output": t.output,
                    })
                })
                .collect(),
        );
    }
    if let Some(obj) = m.as_object_mut() {
        for (k, v) in [
            ("source", b.source),
            ("commit", b.commit),
            ("image", b.image),
        ] {
            if let Some(v) = v {
                obj.insert(k.into(), Value::String(v.to_string()));
            }
        }
        if let Some(d) = b.dirty() {
            obj.insert("dirty".into(), Value::Bool(d));
        }
    }
    m
}

/// What the compiler could not check, checked before anything runs: the
/// partition start, the cron expression and its time zone, the bounds.
pub fn validate<P: Pipeline>(binary: &str) -> Result<Value, SdkError> {
    let m = manifest::<P>(binary);
    orca_core::manifest::parse(&m)
        .map(|_| m)
        .map_err(|e| SdkError::Invalid {
            pipeline: P::NAME.to_string(),
            reason: e.to_string(),
        })
}
