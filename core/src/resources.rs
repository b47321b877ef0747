//! A pipeline's size (`resources` in its manifest): the CPU and memory an
//! attempt gets, and how far its memory grows when an attempt is killed for
//! memory. Quantities are written as Kubernetes writes them (`500m`, `2`,
//! `512Mi`, `4Gi`, `1G`); the manifest stores them as integers.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// The most memory an attempt may ask for: 16 TiB.
pub const MEMORY_MAX: i64 = 16 << 40;
/// The least: 16 MiB (less starts no pipeline binary).
pub const MEMORY_MIN: i64 = 16 << 20;
/// The most CPU: 1024 cores.
pub const CPU_MAX_MILLIS: i64 = 1024 * 1000;

/// What an attempt gets, and how its memory grows after a memory kill.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resources {
    pub cpu_millis: Option<i64>,
    pub memory_bytes: Option<i64>,
    /// The cap of the growth (default: 4x memory, within MEMORY_MAX).
    pub max_memory_bytes: Option<i64>,
    /// The factor memory grows by (default 2; 1 < factor <= 16).
    pub memory_growth: f64,
}

fn bad(field: &str, reason: impl Into<String>) -> Error {
    Error::BadManifest {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A CPU quantity in millicores: `500m`, `2`, `0.5`, or a number.
pub fn cpu_millis(field: &str, v: &Value) -> Result<i64> {
    let millis = match v {
        Value::Number(n) => n.as_f64().map(|c| (c * 1000.0).round()),
        Value::String(s) => match s.strip_suffix('m') {
            Some(m) => m.parse::<i64>().ok().map(|m| m as f64),
            None => s
                .parse::<f64>()
                .ok()
                .filter(|c| c.is_finite())
                .map(|c| (c * 1000.0).round()),
        },
        _ => None,
    }
    .ok_or_else(|| {
        bad(
            field,
            format!("must be a CPU quantity such as \"500m\" or \"2\", got {v}"),
        )
    })?;
    if !(1.0..=CPU_MAX_MILLIS as f64).contains(&millis) {
        return Err(bad(
            field,
            format!(
                "must be from 1m to {} cores, got {v}",
                CPU_MAX_MILLIS / 1000
            ),
        ));
    }
    Ok(millis as i64)
}

/// A memory quantity in bytes: `512Mi`, `4Gi`, `1G`, `1048576`.
pub fn memory_bytes(field: &str, v: &Value) -> Result<i64> {
    const UNITS: [(&str, i64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let bytes = match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let (digits, unit) = UNITS
                .iter()
                .find_map(|(suffix, unit)| s.strip_suffix(suffix).map(|d| (d, *unit)))
                .unwrap_or((s.as_str(), 1));
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                None
            } else {
                digits.parse::<i64>().ok().and_then(|d| d.checked_mul(unit))
            }
        }
        _ => None,
    }
    .ok_or_else(|| {
        bad(
            field,
            format!("must be a memory quantity such as \"512Mi\" or \"4Gi\", got {v}"),
        )
    })?;
    if !(MEMORY_MIN..=MEMORY_MAX).contains(&bytes) {
        return Err(bad(field, format!("must be from 16Mi to 16Ti, got {v}")));
    }
    Ok(bytes)
}

/// `resources` of a manifest (or of one of its steps, `at` naming it):
/// absent or null is no declared size.
pub fn parse(v: Option<&Value>, at: &str) -> Result<Option<Resources>> {
    let obj: &Map<String, Value> = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(bad(
                at,
                format!(
                "must be an object such as {{\"memory\": \"2Gi\", \"cpu\": \"1\"}}, got {other}"
            ),
            ))
        }
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !["cpu", "memory", "max_memory", "memory_growth"].contains(&k.as_str()))
    {
        return Err(bad(
            &format!("{at}.{k}"),
            "is not a resource: use cpu, memory, max_memory and memory_growth",
        ));
    }
    let cpu = obj
        .get("cpu")
        .filter(|v| !v.is_null())
        .map(|v| cpu_millis(&format!("{at}.cpu"), v))
        .transpose()?;
    let memory = obj
        .get("memory")
        .filter(|v| !v.is_null())
        .map(|v| memory_bytes(&format!("{at}.memory"), v))
        .transpose()?;
    let max = obj
        .get("max_memory")
        .filter(|v| !v.is_null())
        .map(|v| memory_bytes(&format!("{at}.max_memory"), v))
        .transpose()?;
    let growth = match obj.get("memory_growth") {
        None | Some(Value::Null) => 2.0,
        Some(v) => v
            .as_f64()
            .filter(|g| *g > 1.0 && *g <= 16.0)
            .ok_or_else(|| {
                bad(
                    &format!("{at}.memory_growth"),
                    format!("must be a number above 1 and at most 16, got {v}"),
                )
            })?,
    };
    let max = match (memory, max) {
        (None, Some(_)) => {
            return Err(bad(
                &format!("{at}.max_memory"),
                format!("needs {at}.memory: it caps how far memory grows from there"),
            ))
        }
        (Some(m), Some(x)) if x < m => {
            return Err(bad(
                &format!("{at}.max_memory"),
                format!("must be at least {at}.memory ({m} bytes), got {x} bytes"),
            ))
        }
        (Some(m), None) => Some(m.saturating_mul(4).min(MEMORY_MAX)),
        (_, x) => x,
    };
    Ok(Some(Resources {
        cpu_millis: cpu,
        memory_bytes: memory,
        max_memory_bytes: max,
        memory_growth: growth,
    }))
}

impl Resources {
    /// What an attempt running both needs: the larger of each (one process
    /// runs all of a pipeline's steps).
    pub fn max(self, other: Resources) -> Resources {
        let most = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Resources {
            cpu_millis: most(self.cpu_millis, other.cpu_millis),
            memory_bytes: most(self.memory_bytes, other.memory_bytes),
            max_memory_bytes: most(self.max_memory_bytes, other.max_memory_bytes),
            memory_growth: self.memory_growth.max(other.memory_growth),
        }
    }

    /// As the manifest stores it.
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        if let Some(c) = self.cpu_millis {
            o.insert("cpu_millis".into(), c.into());
        }
        if let Some(m) = self.memory_bytes {
            o.insert("memory_bytes".into(), m.into());
            o.insert("max_memory_bytes".into(), json!(self.max_memory_bytes));
            o.insert("memory_growth".into(), json!(self.memory_growth));
        }
        Value::Object(o)
    }
}

/// Bytes as a person reads them: `512 MiB`, `1.5 GiB`.
pub fn show_bytes(b: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_read_as_kubernetes_writes_them() {
        assert_eq!(cpu_millis("c", &json!("500m")).ok(), Some(500));
        assert_eq!(cpu_millis("c", &json!("2")).ok(), Some(2000));
        assert_eq!(cpu_millis("c", &json!(0.25)).ok(), Some(250));
        assert_eq!(memory_bytes("m", &json!("512Mi")).ok(), Some(512 << 20));
        assert_eq!(memory_bytes("m", &json!("4Gi")).ok(), Some(4 << 30));
        assert_eq!(memory_bytes("m", &json!("1G")).ok(), Some(1_000_000_000));
        assert_eq!(memory_bytes("m", &json!(67108864)).ok(), Some(64 << 20));
    }

    #[test]
    fn bad_sizes_are_named() {
        let e = |v: Value| {
            parse(Some(&v), "resources")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(e(json!({"memory": "lots"})).contains("resources.memory"));
        assert!(e(json!({"memory": "1Mi"})).contains("16Mi to 16Ti"));
        assert!(e(json!({"memory": "-5Gi"})).contains("memory quantity"));
        assert!(e(json!({"cpu": "0m"})).contains("1m to 1024 cores"));
        assert!(e(json!({"cpu": "fast"})).contains("CPU quantity"));
        assert!(e(json!({"memory": "1Gi", "max_memory": "512Mi"})).contains("at least"));
        assert!(e(json!({"max_memory": "1Gi"})).contains("needs resources.memory"));
        assert!(e(json!({"memory": "1Gi", "memory_growth": 1})).contains("above 1"));
        assert!(e(json!({"gpu": 1})).contains("resources.gpu"));
        assert!(e(json!("2Gi")).contains("must be an object"));
    }

    #[test]
    fn memory_grows_to_four_times_by_default() {
        let r = parse(Some(&json!({"memory": "1Gi"})), "resources")
            .ok()
            .flatten();
        assert_eq!(
            r.map(|r| r.to_json()),
            Some(
                json!({"memory_bytes": 1_i64 << 30, "max_memory_bytes": 4_i64 << 30, "memory_growth": 2.0})
            )
        );
        assert_eq!(show_bytes(1536 << 20), "1.5 GiB");
        assert_eq!(show_bytes(512 << 20), "512 MiB");
    }
}
