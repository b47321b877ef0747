//! The manifest a pipeline binary prints with `describe --json` and
//! `orca.register(manifest)` takes. `docs/manifest.md` is its user-facing schema.
//!
//! Validation is by hand rather than by serde derive so that every error names
//! the field and the value that was wrong.

use serde_json::{Map, Value};

use crate::cron::Schedule;
use crate::error::{Error, Result};
use crate::keyed::{KEYS_PER_RUN_DEFAULT, KEYS_PER_RUN_MAX};

/// A bound on `backfill_per_run`: the default `orca.max_partitions`, which
/// bounds what one backfill names in all.
pub const BACKFILL_PER_RUN_MAX: i64 = 100_000;
use crate::partition::{Fills, PartitionKind, PartitionSet};

/// Longest name Postgres keeps without truncation, used for every identifier.
pub const NAME_MAX: usize = 63;
/// A bound on a step's own retries; more than this is a typo, not a policy.
pub const RETRIES_MAX: i64 = 100;
/// The longest string a manifest holds anywhere (a path, a URL, a hash, a
/// field a client adds): a manifest is stored with every version and read
/// by the org's viewers, so no field is a place for free text.
pub const STRING_MAX: usize = 4096;
/// The most fields, items and nesting a manifest holds.
pub const NODES_MAX: usize = 20_000;
pub const DEPTH_MAX: usize = 16;

/// A step as the control plane sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepDecl {
    pub name: String,
    pub kind: StepKind,
    pub after: Option<String>,
    pub retries: i64,
    /// The step's code hash, when the SDK wrote the manifest.
    pub code: Option<String>,
    /// Datasets (`namespace.table`) the step reads and writes.
    pub reads: Vec<String>,
    pub writes: Vec<String>,
}

/// Retries a task gets when its declaration names none: tasks are small and
/// run on other hosts, where a worker lost to its host is the common failure.
pub const TASK_RETRIES_DEFAULT: i64 = 3;
/// The first retry's delay when a task's declaration names none; each later
/// retry waits twice as long as the one before, up to a minute.
pub const TASK_BACKOFF_MS_DEFAULT: i64 = 1000;

/// A task the pipeline's steps fan out (`tasks` in the manifest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDecl {
    pub name: String,
    /// How many times a failed task is tried again.
    pub retries: i64,
    /// The delay before the first retry, in milliseconds.
    pub backoff_ms: i64,
    /// The task's code hash, when the SDK wrote the manifest.
    pub code: Option<String>,
    /// The Rust types it takes and returns, as the SDK names them.
    pub input: Option<String>,
    pub output: Option<String>,
}

/// Whether a dataset name is `namespace.table`, each part a name.
pub fn valid_dataset(d: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= NAME_MAX
            && p.chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    matches!(d.split_once('.'), Some((ns, t)) if part(ns) && part(t))
}

fn datasets(obj: &Map<String, Value>, at: &str, field: &str) -> Result<Vec<String>> {
    let field_at = format!("{at}.{field}");
    let items = match obj.get(field) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(bad(
                field_at,
                format!("must be a list of datasets, got {}", show(v)),
            ))
        }
    };
    let mut out: Vec<String> = Vec::new();
    for v in items {
        let d = v.as_str().filter(|d| valid_dataset(d)).ok_or_else(|| {
            bad(
                &field_at,
                format!(
                    "{} is not a dataset: write namespace.table in lowercase",
                    show(v)
                ),
            )
        })?;
        if !out.iter().any(|x| x == d) {
            out.push(d.to_string());
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    Mapped,
    Gather,
}

impl StepKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Mapped => "mapped",
            Self::Gather => "gather",
        }
    }
}

/// How a pipeline is partitioned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partitions {
    /// Months or days from a first one.
    Dated(PartitionSet),
    /// The distinct values of `column` in `dataset`'s current snapshot.
    Keyed { dataset: String, column: String },
}

impl Partitions {
    /// The manifest's spelling: `{"monthly": "2024-01"}` or
    /// `{"keyed": {"dataset": "lake.raw", "column": "origin"}}`.
    pub fn to_json(&self) -> Value {
        match self {
            Self::Dated(set) => serde_json::json!({ set.kind.name(): set.start.to_string() }),
            Self::Keyed { dataset, column } => {
                serde_json::json!({ "keyed": { "dataset": dataset, "column": column } })
            }
        }
    }

    pub fn is_keyed(&self) -> bool {
        matches!(self, Self::Keyed { .. })
    }
}

/// A validated manifest; `normalized` is the JSON stored with the version.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub name: String,
    pub steps: Vec<StepDecl>,
    pub tasks: Vec<TaskDecl>,
    pub partitions: Partitions,
    /// How many keys a run of a keyed pipeline covers.
    pub keys_per_run: Option<i64>,
    /// How many months or days one run of a backfill covers (the backfill
    /// policy); `None` is one a run.
    pub backfill_per_run: Option<i64>,
    pub schedule: Option<(String, String)>,
    pub fills: Fills,
    pub max_runs: Option<i64>,
    pub run_retries: i64,
    pub catchup: bool,
    pub registry_hash: String,
    pub binary: String,
    pub pool: String,
    /// Runs when a dataset it reads and does not write gets a new snapshot.
    pub sensor: bool,
    /// What each attempt gets: the pipeline's `resources` and its steps'
    /// together (the larger of each).
    pub resources: Option<crate::resources::Resources>,
    pub normalized: Value,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::BadManifest {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Shows a JSON value in an error, cut short so a huge value stays readable.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        let cut: String = s.chars().take(57).collect();
        format!("{cut}...")
    } else {
        s
    }
}

/// A pipeline, pool or step name: what appears in paths, URLs and logs.
fn check_name(field: &str, v: &Value) -> Result<String> {
    let s = v
        .as_str()
        .ok_or_else(|| bad(field, format!("must be a string, got {}", show(v))))?;
    let ok_first = s.chars().next().is_some_and(|c| c.is_ascii_lowercase());
    let ok_rest = s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if s.is_empty() || s.len() > NAME_MAX || !ok_first || !ok_rest {
        return Err(bad(
            field,
            format!(
                "'{s}' is not a valid name: use 1 to {NAME_MAX} lowercase letters, digits, '_' or '-', starting with a letter"
            ),
        ));
    }
    Ok(s.to_string())
}

fn get_str<'a>(obj: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(bad(field, format!("must be a string, got {}", show(v)))),
    }
}

fn get_int(obj: &Map<String, Value>, field: &str, min: i64, max: i64) -> Result<Option<i64>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(bad(
                field,
                format!("must be an integer from {min} to {max}, got {}", show(v)),
            )),
        },
    }
}

fn get_bool(obj: &Map<String, Value>, field: &str) -> Result<Option<bool>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(bad(
            field,
            format!("must be true or false, got {}", show(v)),
        )),
    }
}

fn parse_steps(v: Option<&Value>) -> Result<Vec<StepDecl>> {
    let arr = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad("steps", "must list at least one step")),
        None | Some(Value::Null) => return Err(bad("steps", "is required")),
        Some(other) => {
            return Err(bad(
                "steps",
                format!("must be an array, got {}", show(other)),
            ))
        }
    };
    let mut steps: Vec<StepDecl> = Vec::with_capacity(arr.len());
    for (i, sv) in arr.iter().enumerate() {
        let at = format!("steps[{i}]");
        let obj = sv
            .as_object()
            .ok_or_else(|| bad(&at, format!("must be an object, got {}", show(sv))))?;
        let name = check_name(
            &format!("{at}.name"),
            obj.get("name").unwrap_or(&Value::Null),
        )?;
        if steps.iter().any(|s| s.name == name) {
            return Err(bad(
                format!("{at}.name"),
                format!("step name '{name}' is used twice"),
            ));
        }
        let kind = match get_str(obj, "kind").map_err(|_| {
            bad(
                format!("{at}.kind"),
                format!(
                    "must be \"mapped\" or \"gather\", got {}",
                    show(&obj["kind"])
                ),
            )
        })? {
            Some("mapped") => StepKind::Mapped,
            Some("gather") => StepKind::Gather,
            Some(other) => {
                return Err(bad(
                    format!("{at}.kind"),
                    format!("must be \"mapped\" or \"gather\", got \"{other}\""),
                ))
            }
            None => return Err(bad(format!("{at}.kind"), "is required")),
        };
        let after = get_str(obj, "after").map_err(|e| match e {
            Error::BadManifest { reason, .. } => bad(format!("{at}.after"), reason),
            other => other,
        })?;
        let after = match (i, after) {
            (0, Some(a)) => {
                return Err(bad(
                    format!("{at}.after"),
                    format!("the first step '{name}' cannot follow '{a}'"),
                ))
            }
            (0, None) => None,
            (_, None) => steps.last().map(|s| s.name.clone()),
            (_, Some(a)) => {
                let Some(prev) = steps.iter().find(|s| s.name == a) else {
                    return Err(bad(
                        format!("{at}.after"),
                        format!(
                            "step '{name}' follows '{a}', which is not a step listed before it"
                        ),
                    ));
                };
                Some(prev.name.clone())
            }
        };
        if kind == StepKind::Mapped {
            if let Some(prev) = after
                .as_deref()
                .and_then(|a| steps.iter().find(|s| s.name == a))
            {
                if prev.kind == StepKind::Gather {
                    return Err(bad(
                        format!("{at}.after"),
                        format!(
                            "mapped step '{name}' cannot follow gather step '{}'",
                            prev.name
                        ),
                    ));
                }
            }
        }
        let code = get_str(obj, "code")
            .map_err(|e| match e {
                Error::BadManifest { reason, .. } => bad(format!("{at}.code"), reason),
                other => other,
            })?
            .map(str::to_string);
        if code.as_ref().is_some_and(|c| c.len() > 128) {
            return Err(bad(format!("{at}.code"), "must be at most 128 characters"));
        }
        let retries = get_int(obj, "retries", 0, RETRIES_MAX)
            .map_err(|e| match e {
                Error::BadManifest { reason, .. } => bad(format!("{at}.retries"), reason),
                other => other,
            })?
            .unwrap_or(0);
        let reads = datasets(obj, &at, "reads")?;
        let writes = datasets(obj, &at, "writes")?;
        steps.push(StepDecl {
            name,
            kind,
            after,
            retries,
            code,
            reads,
            writes,
        });
    }
    Ok(steps)
}

/// Re-labels an error of a nested field with the field's full path.
fn at_field(at: String) -> impl FnOnce(Error) -> Error {
    move |e| match e {
        Error::BadManifest { reason, .. } => bad(at, reason),
        other => other,
    }
}

fn parse_tasks(v: Option<&Value>) -> Result<Vec<TaskDecl>> {
    let arr = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(bad(
                "tasks",
                format!("must be an array of tasks, got {}", show(other)),
            ))
        }
    };
    let mut tasks: Vec<TaskDecl> = Vec::with_capacity(arr.len());
    for (i, tv) in arr.iter().enumerate() {
        let at = format!("tasks[{i}]");
        let obj = tv
            .as_object()
            .ok_or_else(|| bad(&at, format!("must be an object, got {}", show(tv))))?;
        let name = check_name(
            &format!("{at}.name"),
            obj.get("name").unwrap_or(&Value::Null),
        )?;
        if tasks.iter().any(|t| t.name == name) {
            return Err(bad(
                format!("{at}.name"),
                format!("task name '{name}' is used twice"),
            ));
        }
        let retries = get_int(obj, "retries", 0, RETRIES_MAX)
            .map_err(at_field(format!("{at}.retries")))?
            .unwrap_or(TASK_RETRIES_DEFAULT);
        let backoff_ms = get_int(obj, "backoff_ms", 0, 3_600_000)
            .map_err(at_field(format!("{at}.backoff_ms")))?
            .unwrap_or(TASK_BACKOFF_MS_DEFAULT);
        let code = get_str(obj, "code")
            .map_err(at_field(format!("{at}.code")))?
            .map(str::to_string);
        if code.as_ref().is_some_and(|c| c.len() > 128) {
            return Err(bad(format!("{at}.code"), "must be at most 128 characters"));
        }
        let input = get_str(obj, "input")
            .map_err(at_field(format!("{at}.input")))?
            .map(str::to_string);
        let output = get_str(obj, "output")
            .map_err(at_field(format!("{at}.output")))?
            .map(str::to_string);
        tasks.push(TaskDecl {
            name,
            retries,
            backoff_ms,
            code,
            input,
            output,
        });
    }
    Ok(tasks)
}

/// A column name as Iceberg schemas spell them.
fn check_column(field: &str, v: &Value) -> Result<String> {
    let s = v
        .as_str()
        .ok_or_else(|| bad(field, format!("must be a column name, got {}", show(v))))?;
    let ok = !s.is_empty()
        && s.len() <= NAME_MAX
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        return Err(bad(
            field,
            format!("'{s}' is not a column name: use 1 to {NAME_MAX} letters, digits or '_', starting with a letter or '_'"),
        ));
    }
    Ok(s.to_string())
}

fn parse_keyed(v: &Value) -> Result<Partitions> {
    let obj = v.as_object().ok_or_else(|| {
        bad(
            "partitions.keyed",
            format!(
                "must be an object such as {{\"dataset\": \"lake.raw\", \"column\": \"origin\"}}, got {}",
                show(v)
            ),
        )
    })?;
    if let Some(extra) = obj.keys().find(|k| *k != "dataset" && *k != "column") {
        return Err(bad(
            "partitions.keyed",
            format!("unknown field \"{extra}\" (it takes dataset and column)"),
        ));
    }
    let dataset = match obj.get("dataset") {
        Some(Value::String(d)) if valid_dataset(d) => d.clone(),
        None | Some(Value::Null) => return Err(bad("partitions.keyed.dataset", "is required")),
        Some(other) => {
            return Err(bad(
                "partitions.keyed.dataset",
                format!(
                    "{} is not a dataset: write namespace.table in lowercase",
                    show(other)
                ),
            ))
        }
    };
    let column = match obj.get("column") {
        None | Some(Value::Null) => return Err(bad("partitions.keyed.column", "is required")),
        Some(c) => check_column("partitions.keyed.column", c)?,
    };
    Ok(Partitions::Keyed { dataset, column })
}

fn parse_partitions(v: Option<&Value>) -> Result<Partitions> {
    let obj = match v {
        Some(Value::Object(o)) => o,
        None | Some(Value::Null) => return Err(bad("partitions", "is required")),
        Some(other) => {
            return Err(bad(
                "partitions",
                format!(
                    "must be an object such as {{\"monthly\": \"2024-01\"}}, got {}",
                    show(other)
                ),
            ))
        }
    };
    if obj.len() != 1 {
        return Err(bad(
            "partitions",
            format!(
                "must have exactly one of \"monthly\", \"daily\" or \"keyed\", got {}",
                show(&Value::Object(obj.clone()))
            ),
        ));
    }
    let Some((key, start)) = obj.iter().next() else {
        return Err(bad("partitions", "is empty"));
    };
    if key == "keyed" {
        return parse_keyed(start);
    }
    let kind = PartitionKind::parse_name(key).ok_or_else(|| {
        bad(
            "partitions",
            format!("unknown partition kind \"{key}\" (use \"monthly\", \"daily\" or \"keyed\")"),
        )
    })?;
    let start = start.as_str().ok_or_else(|| {
        bad(
            format!("partitions.{key}"),
            format!(
                "must be the first partition as a string, got {}",
                show(start)
            ),
        )
    })?;
    PartitionSet::new(kind, start).map(Partitions::Dated)
}

/// Validates a manifest and fills in defaults.
/// Where in a manifest a URL carries a password (`https://user:token@...`),
/// by its JSON path.
fn password_at(path: &str, v: &Value) -> Option<String> {
    match v {
        Value::String(s) if s.contains("://") && crate::conninfo::has_password(s) => {
            Some(if path.is_empty() {
                "manifest".into()
            } else {
                path.to_string()
            })
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, x)| password_at(&format!("{path}[{i}]"), x)),
        Value::Object(m) => m.iter().find_map(|(k, x)| {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            password_at(&p, x)
        }),
        _ => None,
    }
}

/// A step into a manifest: a field or an item.
enum Step<'a> {
    Field(&'a str),
    Item(usize),
}

/// The first place in `v` over the manifest's bounds, with why: the path
/// comes back innermost step first (built only for the place that fails).
fn over_bounds<'a>(
    v: &'a Value,
    depth: usize,
    nodes: &mut usize,
) -> Option<(Vec<Step<'a>>, String)> {
    *nodes += 1;
    if *nodes > NODES_MAX {
        return Some((
            Vec::new(),
            format!("the manifest holds more than {NODES_MAX} fields and items"),
        ));
    }
    if depth > DEPTH_MAX {
        return Some((
            Vec::new(),
            format!("is nested more than {DEPTH_MAX} levels deep"),
        ));
    }
    let long = |what: &str, s: &str| {
        (s.len() > STRING_MAX)
            .then(|| format!("{what} is {} bytes, more than {STRING_MAX}", s.len()))
    };
    match v {
        Value::String(s) => long("the value", s).map(|why| (Vec::new(), why)),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, x)| {
            over_bounds(x, depth + 1, nodes).map(|(mut path, why)| {
                path.push(Step::Item(i));
                (path, why)
            })
        }),
        Value::Object(m) => m.iter().find_map(|(k, x)| {
            if let Some(why) = long("the key", k) {
                return Some((Vec::new(), why));
            }
            over_bounds(x, depth + 1, nodes).map(|(mut path, why)| {
                path.push(Step::Field(k));
                (path, why)
            })
        }),
        _ => None,
    }
}

/// A path as the manifest's errors name fields (`steps[0].reads`), cut to
/// 200 characters.
fn path_text(innermost_first: &[Step<'_>]) -> String {
    let mut out = String::new();
    for step in innermost_first.iter().rev() {
        match step {
            Step::Field(k) if out.is_empty() => out.push_str(k),
            Step::Field(k) => {
                out.push('.');
                out.push_str(k);
            }
            Step::Item(i) => out.push_str(&format!("[{i}]")),
        }
        if out.len() > 200 {
            let cut: String = out.chars().take(197).collect();
            return format!("{cut}...");
        }
    }
    out
}

pub fn parse(manifest: &Value) -> Result<Manifest> {
    let obj = manifest.as_object().ok_or_else(|| {
        bad(
            "manifest",
            format!("must be a JSON object, got {}", show(manifest)),
        )
    })?;
    if let Some((path, why)) = over_bounds(manifest, 0, &mut 0) {
        return Err(bad(path_text(&path), why));
    }
    if let Some(at) = password_at("", manifest) {
        return Err(bad(
            &at,
            "holds a URL with a password; a manifest is stored with the version and read by \
             the org's viewers: leave credentials out of it (a source repository's URL \
             included), and keep connection strings in secrets (orca.set_secret)",
        ));
    }
    let name = match obj.get("name") {
        None | Some(Value::Null) => return Err(bad("name", "is required")),
        Some(v) => check_name("name", v)?,
    };
    let steps = parse_steps(obj.get("steps"))?;
    let tasks = parse_tasks(obj.get("tasks"))?;
    let partitions = parse_partitions(obj.get("partitions"))?;

    let schedule = match obj.get("schedule") {
        None | Some(Value::Null) => None,
        Some(Value::Object(s)) => {
            let cron = get_str(s, "cron")
                .map_err(|_| bad("schedule.cron", "must be a string"))?
                .ok_or_else(|| bad("schedule.cron", "is required"))?;
            let tz = get_str(s, "tz")
                .map_err(|_| bad("schedule.tz", "must be a string"))?
                .unwrap_or("UTC");
            Schedule::parse(cron, tz)?;
            Some((cron.trim().to_string(), tz.to_string()))
        }
        Some(other) => {
            return Err(bad(
                "schedule",
                format!(
                "must be an object such as {{\"cron\": \"0 3 * * *\", \"tz\": \"UTC\"}}, got {}",
                show(other)
            ),
            ))
        }
    };
    let keyed = match &partitions {
        Partitions::Keyed { dataset, .. } => Some(dataset.clone()),
        Partitions::Dated(_) => None,
    };
    if keyed.is_some() && schedule.is_some() {
        return Err(bad(
            "schedule",
            "a keyed pipeline has no schedule: it runs by hand, by backfill or as a sensor",
        ));
    }
    if keyed.is_some() && get_str(obj, "fills")?.is_some() {
        return Err(bad(
            "fills",
            "a keyed pipeline has no fills: fills chooses the month or day a schedule's fire fills",
        ));
    }
    let keys_per_run = get_int(obj, "keys_per_run", 1, KEYS_PER_RUN_MAX)?;
    let keys_per_run = match (&keyed, keys_per_run) {
        (Some(_), n) => Some(n.unwrap_or(KEYS_PER_RUN_DEFAULT)),
        (None, None) => None,
        (None, Some(_)) => {
            return Err(bad(
                "keys_per_run",
                "only a keyed pipeline (partitions {\"keyed\": ...}) has keys_per_run",
            ))
        }
    };
    let backfill_per_run = get_int(obj, "backfill_per_run", 1, BACKFILL_PER_RUN_MAX)?;
    if keyed.is_some() && backfill_per_run.is_some() {
        return Err(bad(
            "backfill_per_run",
            "a keyed pipeline's runs cover keys_per_run keys: set keys_per_run instead",
        ));
    }
    if let Some(ds) = &keyed {
        if let Some(w) = steps.iter().find(|s| s.writes.contains(ds)) {
            return Err(bad(
                "partitions.keyed.dataset",
                format!(
                    "step '{}' writes {ds}, the dataset the pipeline's keys come from: its own runs would change its keys",
                    w.name
                ),
            ));
        }
    }
    let fills = match get_str(obj, "fills")? {
        None => Fills::Previous,
        Some(f) => Fills::parse_name(f).ok_or_else(|| {
            bad(
                "fills",
                format!("must be \"previous\" or \"current\", got \"{f}\""),
            )
        })?,
    };
    let max_runs = get_int(obj, "max_runs", 1, 1_000_000)?;
    let run_retries = get_int(obj, "run_retries", 0, RETRIES_MAX)?.unwrap_or(0);
    let catchup = get_bool(obj, "catchup")?.unwrap_or(true);
    let registry_hash = get_str(obj, "registry_hash")?
        .filter(|h| !h.trim().is_empty())
        .ok_or_else(|| bad("registry_hash", "is required (the hash of the steps' code)"))?
        .to_string();
    let binary = get_str(obj, "binary")?
        .filter(|b| !b.trim().is_empty())
        .ok_or_else(|| bad("binary", "is required (the path of the pipeline binary)"))?
        .to_string();
    let pool = match obj.get("pool") {
        None | Some(Value::Null) => "default".to_string(),
        Some(v) => check_name("pool", v)?,
    };
    let sensor = get_bool(obj, "sensor")?.unwrap_or(false);
    if sensor
        && keyed.is_none()
        && !steps
            .iter()
            .flat_map(|s| &s.reads)
            .any(|d| !steps.iter().any(|s| s.writes.contains(d)))
    {
        return Err(bad(
            "sensor",
            "a sensor pipeline must read a dataset that it does not write itself",
        ));
    }
    if let Some(h) = get_str(obj, "binary_sha256")? {
        if h.len() != 64
            || !h
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad(
                "binary_sha256",
                format!("must be 64 lowercase hex digits (the binary's sha256), got \"{h}\""),
            ));
        }
    }
    for field in ["source", "commit", "image"] {
        get_str(obj, field)?;
    }
    get_bool(obj, "dirty")?;

    let mut resources = crate::resources::parse(obj.get("resources"), "resources")?;
    let mut step_resources = Vec::new();
    if let Some(raw) = obj.get("steps").and_then(Value::as_array) {
        for (i, s) in raw.iter().enumerate() {
            let declared =
                crate::resources::parse(s.get("resources"), &format!("steps[{i}].resources"))?;
            if let Some(r) = declared {
                resources = Some(match resources {
                    Some(p) => p.max(r),
                    None => r,
                });
            }
            step_resources.push(declared);
        }
    }

    let mut normalized = obj.clone();
    normalized.insert(
        "steps".into(),
        Value::Array(
            steps
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let mut step = serde_json::json!({
                        "name": s.name,
                        "kind": s.kind.name(),
                        "after": s.after,
                        "retries": s.retries,
                    });
                    if let (Some(o), Some(Some(r))) = (step.as_object_mut(), step_resources.get(i))
                    {
                        o.insert("resources".into(), r.to_json());
                    }
                    if let Some(o) = step.as_object_mut() {
                        if let Some(code) = &s.code {
                            o.insert("code".into(), code.clone().into());
                        }
                        o.insert("reads".into(), s.reads.clone().into());
                        o.insert("writes".into(), s.writes.clone().into());
                    }
                    step
                })
                .collect(),
        ),
    );
    // Only a pipeline that declares tasks gets the field: a manifest without
    // them stays as it was, so registering it again makes no new version.
    if tasks.is_empty() {
        normalized.remove("tasks");
    } else {
        normalized.insert(
            "tasks".into(),
            Value::Array(
                tasks
                    .iter()
                    .map(|t| {
                        let mut task = serde_json::json!({
                            "name": t.name,
                            "retries": t.retries,
                            "backoff_ms": t.backoff_ms,
                        });
                        if let (Some(o), Some(code)) = (task.as_object_mut(), &t.code) {
                            o.insert("code".into(), code.clone().into());
                        }
                        for (field, ty) in [("input", &t.input), ("output", &t.output)] {
                            if let (Some(o), Some(ty)) = (task.as_object_mut(), ty) {
                                o.insert(field.into(), ty.clone().into());
                            }
                        }
                        task
                    })
                    .collect(),
            ),
        );
    }
    normalized.insert("partitions".into(), partitions.to_json());
    normalized.insert("keys_per_run".into(), keys_per_run.into());
    // Only a pipeline with a backfill policy gets the field, so that the
    // manifests of those without one stay as they were registered.
    match backfill_per_run {
        Some(n) => normalized.insert("backfill_per_run".into(), n.into()),
        None => normalized.remove("backfill_per_run"),
    };
    normalized.insert(
        "schedule".into(),
        match &schedule {
            Some((cron, tz)) => serde_json::json!({ "cron": cron, "tz": tz }),
            None => Value::Null,
        },
    );
    normalized.insert(
        "fills".into(),
        if keyed.is_some() {
            Value::Null
        } else {
            fills.name().into()
        },
    );
    normalized.insert("max_runs".into(), max_runs.into());
    normalized.insert("run_retries".into(), run_retries.into());
    normalized.insert("catchup".into(), catchup.into());
    normalized.insert("pool".into(), pool.clone().into());
    normalized.insert("sensor".into(), sensor.into());
    // Only a pipeline that declares a size gets the field (as tasks).
    match &resources {
        Some(r) => normalized.insert("resources".into(), r.to_json()),
        None => normalized.remove("resources"),
    };

    Ok(Manifest {
        name,
        steps,
        tasks,
        partitions,
        keys_per_run,
        backfill_per_run,
        schedule,
        fills,
        max_runs,
        run_retries,
        catchup,
        registry_hash,
        binary,
        pool,
        sensor,
        resources,
        normalized: Value::Object(normalized),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lake() -> Value {
        json!({"name":"lake","steps":[{"name":"one","kind":"mapped"},{"name":"two","kind":"gather","after":"one","retries":2}],
        "partitions":{"monthly":"2024-01"},"schedule":{"cron":"0 3 2 * *","tz":"UTC"},
        "fills":"previous","max_runs":2,"run_retries":3,"catchup":true,
        "registry_hash":"abc","binary":"/path/to/lake"})
    }

    #[test]
    fn accepts_the_documented_shape() {
        let m = parse(&lake()).expect("valid");
        assert_eq!(m.name, "lake");
        assert_eq!(m.steps.len(), 2);
        assert_eq!(m.steps[1].after.as_deref(), Some("one"));
        assert_eq!(m.max_runs, Some(2));
        assert_eq!(m.normalized["pool"], "default");
    }

    fn refused(patch: impl FnOnce(&mut Value)) -> String {
        let mut m = lake();
        patch(&mut m);
        let e = parse(&m).expect_err("refused");
        e.to_string()
    }

    #[test]
    fn no_field_of_a_manifest_holds_free_text_beyond_its_bound() {
        let big = "x".repeat(STRING_MAX + 1);
        let e = refused(|m| m["description"] = json!(big));
        assert!(e.contains("description") && e.contains("4097 bytes"), "{e}");
        assert!(!e.contains("xxxx"), "the value is not echoed: {e}");
        let e = refused(|m| m["steps"][0]["notes"] = json!({"deep": [big.clone()]}));
        assert!(e.contains("steps[0].notes.deep[0]"), "{e}");
        let e = refused(|m| m[big.as_str()] = json!(1));
        assert!(e.contains("the key is 4097 bytes"), "{e}");
        let mut deep = json!(1);
        for _ in 0..(DEPTH_MAX + 2) {
            deep = json!([deep]);
        }
        assert!(refused(|m| m["extra"] = deep).contains("nested"));
        let many: Vec<u32> = (0..(NODES_MAX as u32)).collect();
        assert!(refused(|m| m["extra"] = json!(many)).contains("more than"));
        let at_bound = "y".repeat(STRING_MAX);
        let mut m = lake();
        m["source"] = json!(at_bound);
        parse(&m).expect("a string of exactly the bound is taken");
    }

    #[test]
    fn a_url_with_a_password_anywhere_is_refused_by_its_path() {
        let e = refused(|m| m["source"] = json!("https://ci:ghp_token@github.com/acme/lake.git"));
        assert!(e.contains("source") && e.contains("password"), "{e}");
        assert!(
            !e.contains("ghp_token"),
            "the error shows the password: {e}"
        );
        let e = refused(|m| m["steps"][0]["meta"] = json!({"dsn": "postgres://app:pw@db/shop"}));
        assert!(e.contains("steps[0].meta.dsn"), "{e}");
        let mut ok = lake();
        ok["source"] = json!("https://github.com/acme/lake.git");
        ok["description"] = json!("asks for the password= of nobody");
        parse(&ok).expect("no password in a URL");
    }

    #[test]
    fn names_the_field_and_value() {
        assert!(refused(|m| m["max_runs"] = json!("two")).contains("max_runs"));
        assert!(refused(|m| m["max_runs"] = json!(0)).contains("got 0"));
        assert!(refused(|m| m["name"] = json!("Lake!")).contains("'Lake!'"));
        assert!(refused(|m| m["steps"][1]["kind"] = json!("reduce")).contains("\"reduce\""));
        assert!(refused(|m| m["steps"][1]["after"] = json!("zero")).contains("'zero'"));
        assert!(refused(|m| m["steps"][1]["name"] = json!("one")).contains("used twice"));
        assert!(refused(|m| m["fills"] = json!("next")).contains("\"next\""));
        assert!(refused(|m| m["partitions"] = json!({"weekly":"2024-01"})).contains("weekly"));
        assert!(refused(|m| m["partitions"] = json!({"monthly":"2024-1"})).contains("2024-1"));
        assert!(refused(|m| {
            if let Some(o) = m.as_object_mut() {
                o.remove("registry_hash");
            }
        })
        .contains("registry_hash"));
        let e = refused(|m| {
            m["steps"] = json!([{"name":"g","kind":"gather"},{"name":"m","kind":"mapped"}])
        });
        assert!(e.contains("cannot follow gather step 'g'"), "{e}");
    }

    #[test]
    fn schedule_errors_keep_their_own_codes() {
        let mut m = lake();
        m["schedule"] = json!({"cron":"0 0 30 2 *"});
        assert_eq!(parse(&m).expect_err("impossible").sqlstate(), "OR031");
        m["schedule"] = json!({"cron":"0 0 * * *", "tz": "Nowhere/City"});
        assert_eq!(parse(&m).expect_err("tz").sqlstate(), "OR032");
        m["schedule"] = json!({"cron":"every day"});
        assert_eq!(parse(&m).expect_err("cron").sqlstate(), "OR030");
    }

    #[test]
    fn steps_declare_datasets() {
        let mut m = lake();
        m["steps"][0]["writes"] = json!(["lake.raw", "lake.raw"]);
        m["steps"][1]["reads"] = json!(["lake.raw"]);
        let p = parse(&m).expect("valid");
        assert_eq!(p.steps[0].writes, ["lake.raw"]);
        assert_eq!(p.normalized["steps"][1]["reads"], json!(["lake.raw"]));
        m["steps"][1]["reads"] = json!(["Lake.Raw"]);
        assert!(parse(&m)
            .expect_err("bad dataset")
            .to_string()
            .contains("\"Lake.Raw\""));
        m["steps"][1]["reads"] = json!(["raw"]);
        assert!(parse(&m).is_err());
    }

    #[test]
    fn unknown_fields_are_kept() {
        let mut m = lake();
        m["reads"] = json!(["lake.raw"]);
        let p = parse(&m).expect("valid");
        assert_eq!(p.normalized["reads"], json!(["lake.raw"]));
    }

    fn labels() -> Value {
        json!({"name":"labels","steps":[{"name":"label","kind":"mapped","reads":["lake.raw"]},
                                       {"name":"score","kind":"gather"}],
        "partitions":{"keyed":{"dataset":"lake.raw","column":"origin"}},"sensor":true,
        "registry_hash":"abc","binary":"/path/to/labels"})
    }

    #[test]
    fn keyed_pipelines_name_a_dataset_and_column() {
        let m = parse(&labels()).expect("valid");
        assert_eq!(
            m.partitions,
            Partitions::Keyed {
                dataset: "lake.raw".into(),
                column: "origin".into()
            }
        );
        assert_eq!(m.keys_per_run, Some(KEYS_PER_RUN_DEFAULT));
        assert_eq!(m.normalized["fills"], Value::Null);
        assert_eq!(m.normalized["keys_per_run"], json!(100));
        assert_eq!(
            m.normalized["partitions"],
            json!({"keyed":{"dataset":"lake.raw","column":"origin"}})
        );
        // The keys dataset is what a keyed sensor watches, read by a step or not.
        let mut no_reads = labels();
        no_reads["steps"][0]["reads"] = json!([]);
        assert!(parse(&no_reads).is_ok());
    }

    #[test]
    fn keyed_pipelines_refuse_what_does_not_apply() {
        let with = |patch: &dyn Fn(&mut Value)| {
            let mut m = labels();
            patch(&mut m);
            parse(&m).expect_err("refused").to_string()
        };
        let e = with(&|m| m["schedule"] = json!({"cron":"0 3 * * *"}));
        assert!(
            e.contains("schedule: a keyed pipeline has no schedule"),
            "{e}"
        );
        let e = with(&|m| m["fills"] = json!("previous"));
        assert!(e.contains("fills: a keyed pipeline has no fills"), "{e}");
        let e = with(&|m| m["keys_per_run"] = json!(0));
        assert!(e.contains("keys_per_run") && e.contains("got 0"), "{e}");
        let e = with(&|m| m["partitions"]["keyed"]["dataset"] = json!("raw"));
        assert!(e.contains("\"raw\" is not a dataset"), "{e}");
        let e = with(&|m| m["partitions"]["keyed"]["column"] = json!("log id"));
        assert!(e.contains("'log id' is not a column name"), "{e}");
        let e = with(&|m| m["steps"][1]["writes"] = json!(["lake.raw"]));
        assert!(e.contains("step 'score' writes lake.raw"), "{e}");
        let mut dated = lake();
        dated["keys_per_run"] = json!(10);
        let e = parse(&dated).expect_err("dated").to_string();
        assert!(e.contains("only a keyed pipeline"), "{e}");
    }

    #[test]
    fn a_backfill_policy_is_a_number_of_partitions_per_run() {
        let plain = parse(&lake()).expect("valid");
        assert_eq!(plain.backfill_per_run, None);
        assert!(plain.normalized.get("backfill_per_run").is_none());
        let mut m = lake();
        m["backfill_per_run"] = json!(12);
        let p = parse(&m).expect("valid");
        assert_eq!(p.backfill_per_run, Some(12));
        assert_eq!(p.normalized["backfill_per_run"], json!(12));
        for bad in [json!(0), json!(-3), json!("12"), json!(100_001)] {
            m["backfill_per_run"] = bad.clone();
            let e = parse(&m).expect_err("refused").to_string();
            assert!(
                e.contains("backfill_per_run: must be an integer from 1 to 100000"),
                "{bad}: {e}"
            );
        }
        let mut keyed = labels();
        keyed["backfill_per_run"] = json!(4);
        let e = parse(&keyed).expect_err("keyed").to_string();
        assert!(e.contains("set keys_per_run instead"), "{e}");
    }

    #[test]
    fn tasks_are_declared_by_name_with_retries_and_backoff() {
        let mut m = lake();
        m["tasks"] = json!([
            {"name": "trips", "input": "Day", "output": "i64"},
            {"name": "weigh", "retries": 0, "backoff_ms": 50, "code": "abc"}
        ]);
        let p = parse(&m).expect("valid");
        assert_eq!(p.tasks.len(), 2);
        assert_eq!(p.tasks[0].retries, TASK_RETRIES_DEFAULT);
        assert_eq!(p.tasks[0].backoff_ms, TASK_BACKOFF_MS_DEFAULT);
        assert_eq!(p.tasks[1].retries, 0);
        assert_eq!(
            p.normalized["tasks"],
            json!([
                {"name": "trips", "retries": 3, "backoff_ms": 1000, "input": "Day", "output": "i64"},
                {"name": "weigh", "retries": 0, "backoff_ms": 50, "code": "abc"}
            ])
        );
        // A pipeline without tasks keeps the manifest it had.
        let plain = parse(&lake()).expect("valid");
        assert!(plain.tasks.is_empty());
        assert!(plain.normalized.get("tasks").is_none());
        let mut empty = lake();
        empty["tasks"] = json!([]);
        assert!(parse(&empty)
            .expect("valid")
            .normalized
            .get("tasks")
            .is_none());
    }

    #[test]
    fn bad_task_declarations_name_the_field() {
        let with = |tasks: Value| {
            let mut m = lake();
            m["tasks"] = tasks;
            parse(&m).expect_err("refused").to_string()
        };
        let e = with(json!({"name": "trips"}));
        assert!(e.contains("tasks: must be an array"), "{e}");
        let e = with(json!([{"name": "Trips"}]));
        assert!(e.contains("tasks[0].name") && e.contains("'Trips'"), "{e}");
        let e = with(json!([{"name": "a"}, {"name": "a"}]));
        assert!(
            e.contains("tasks[1].name: task name 'a' is used twice"),
            "{e}"
        );
        let e = with(json!([{"name": "a", "retries": 101}]));
        assert!(
            e.contains("tasks[0].retries") && e.contains("got 101"),
            "{e}"
        );
        let e = with(json!([{"name": "a", "backoff_ms": -1}]));
        assert!(e.contains("tasks[0].backoff_ms"), "{e}");
        let e = with(json!([{"name": "a", "input": 3}]));
        assert!(e.contains("tasks[0].input: must be a string"), "{e}");
        let e = with(json!(["a"]));
        assert!(e.contains("tasks[0]: must be an object"), "{e}");
    }
}
