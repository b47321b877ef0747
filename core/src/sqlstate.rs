//! Every SQLSTATE the control plane raises, once, with what it means.
//!
//! The codes live in class `OR`, which SQL leaves to implementations. The SQL
//! files raise them with `RAISE ... USING ERRCODE`, the Rust helpers through
//! [`crate::error::Error::sqlstate`], clients match on them by name here, and
//! `docs/errors.md` documents each with the same meaning; a test below holds
//! the four together.

/// One SQLSTATE of class `OR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlState {
    pub code: &'static str,
    /// What it means, as `docs/errors.md` says it.
    pub meaning: &'static str,
}

impl SqlState {
    /// Whether a server error's code is this one.
    pub fn is(&self, code: &str) -> bool {
        self.code == code
    }
}

impl std::fmt::Display for SqlState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code)
    }
}

macro_rules! sqlstates {
    ($($name:ident = $code:literal: $meaning:literal;)*) => {
        $(pub const $name: SqlState = SqlState { code: $code, meaning: $meaning };)*
        /// Every code, in code order.
        pub const ALL: &[SqlState] = &[$($name),*];
        /// The constant's name of each code, for messages and the test below.
        pub const NAMES: &[(&str, &str)] = &[$((stringify!($name), $code)),*];
    };
}

sqlstates! {
    UNKNOWN_ORG = "OR001": "unknown org in `orca.org`";
    NOT_A_MEMBER = "OR002": "the session's role is not a member of the org";
    BAD_ORG_NAME = "OR003": "invalid or duplicate org name";
    BAD_MEMBER = "OR004": "unknown role, or not a member, in member management";
    UNKNOWN_PIPELINE = "OR010": "unknown pipeline";
    UNKNOWN_RUN = "OR011": "unknown run";
    UNKNOWN_LEASE = "OR012": "unknown lease token (never given out in this org)";
    RUN_STATE = "OR013": "the run's state does not allow it";
    LEASE_NOT_ACTIVE = "OR014": "the lease is no longer active (lost, finished, released)";
    RUN_CANCELLED = "OR015": "the lease's run was cancelled: stop the attempt";
    UNKNOWN_STEP = "OR016": "unknown step or partition for `report_step`";
    UNDECLARED_DATASET = "OR017": "a step read or wrote a dataset it does not declare";
    MALFORMED_PARTITION = "OR020": "malformed partition";
    MALFORMED_SPEC = "OR021": "malformed partition list or range";
    OUTSIDE_SET = "OR022": "partition outside the pipeline's set";
    TOO_MANY_PARTITIONS = "OR023": "more partitions than `orca.max_partitions`";
    NOT_A_KEY = "OR024": "a keyed pipeline's name is not a current key (or its keys were never read)";
    BAD_CRON = "OR030": "unparsable cron expression";
    IMPOSSIBLE_CRON = "OR031": "cron expression that can never match";
    UNKNOWN_TIME_ZONE = "OR032": "unknown time zone";
    BAD_MANIFEST = "OR040": "malformed manifest";
    DATASET_CYCLE = "OR041": "a registration would close a cycle of datasets across pipelines";
    BAD_MAINTENANCE = "OR042": "malformed dataset or options of table maintenance";
    NO_WRITER = "OR043": "no pipeline or sync of the org reads or writes the dataset, so none can maintain it";
    BAD_CATALOG_WRITE = "OR044": "a bad name, location or property in a write to the Iceberg catalog (`orca.catalog_*`)";
    NO_CATALOG_ENTRY = "OR045": "no such namespace or table in the org's Iceberg catalog, or the table exists already";
    INVALID_ARGUMENT = "OR050": "invalid argument";
    TOO_LARGE = "OR051": "an input over its size bound";
    UNKNOWN_CONNECTOR = "OR060": "unknown sync connector";
    MISSING_OPTION = "OR061": "a sync connector's required option is missing";
    IMPOSSIBLE_DELIVERY = "OR062": "a sync stream cannot reach the required delivery level";
    BAD_SYNC = "OR063": "malformed sync definition";
    UNKNOWN_SYNC = "OR064": "unknown sync";
    NAME_TAKEN = "OR065": "a sync and a pipeline cannot share a name";
    SYNC_BUSY = "OR066": "the sync has a run queued or running";
    SLOT_IN_USE = "OR067": "the sync's replication slot is held by a live session";
    FENCED = "OR070": "fenced: a newer attempt claimed the sync";
    EPOCH_OUT_OF_ORDER = "OR071": "an epoch that does not follow the sync's HEAD";
    NO_RUNNER_TOKEN = "OR080": "no valid runner token: none presented, unknown, rotated out or revoked";
    WRONG_RUNNER_SCOPE = "OR081": "the runner token is for another org or pool";
    NOT_LEASE_HOLDER = "OR082": "the lease is held by another runner's token";
    UNKNOWN_RUNNER_TOKEN = "OR083": "unknown (or revoked) runner token name";
    NOT_SYNC_LEASE = "OR084": "a sync's HEAD call without the live lease of an attempt of its run";
    RECORD_OUTSIDE_SYNC = "OR085": "a checkpoint record outside the sync's own prefix";
    CLOCK_ADMIN_ONLY = "OR086": "only the installation's superuser passes orca.tick a time other than the transaction's";
    API_KEY_REFUSED = "OR087": "the API key is unknown or revoked (or none was presented)";
    UNKNOWN_API_KEY = "OR088": "unknown API key name";
    SECRETS_NOT_SET_UP = "OR090": "secrets are not set up: no readable installation key (`orca.secrets_key_file`)";
    UNKNOWN_SECRET = "OR091": "unknown secret, or an invalid secret name";
    SECRET_UNREADABLE = "OR092": "a secret or data key cannot be decrypted with the installation keys";
    BAD_ALLOWLIST_ENTRY = "OR093": "invalid allowlist entry, or an entry the org does not have";
    NETGUARD_REFUSED = "OR094": "netguard refused an address or local path a sync's definition or a webhook names";
    BAD_WEBHOOK = "OR095": "invalid webhook endpoint or event list";
    UNKNOWN_WEBHOOK = "OR096": "unknown webhook";
    UNDECLARED_TASK = "OR100": "a task the pipeline's version does not declare (`tasks` in its manifest)";
    TASK_INDEX_GAP = "OR101": "tasks added with a gap in their numbering";
    UNKNOWN_POOL = "OR102": "`orca.pool_backlog` of a pool nothing in the org names";
    UNKNOWN_BACKLOG_KIND = "OR103": "`orca.pool_backlog` of a kind other than attempts or tasks";
    BAD_RESUME_POINT = "OR104": "a resume point's location with control characters or a `..` segment";
    BAD_PLAYBOOK = "OR105": "a playbook with an unknown incident kind or action, an action the kind cannot take, or bad options";
    UNKNOWN_PLAYBOOK = "OR106": "unknown playbook (or another org's)";
    UNKNOWN_INCIDENT = "OR107": "unknown incident (or another org's)";
    INCIDENT_RESOLVED = "OR108": "the incident is already resolved";
    BAD_INCIDENT_THRESHOLD = "OR109": "unknown incident threshold, or a value below 1";
    BAD_PER_RUN = "OR110": "a backfill's per_run out of bounds, or given for a sync";
}

/// The codes that take a lease away from its holder: the attempt must stop,
/// because another runner may already hold it (`orca.heartbeat` and the
/// calls a pipeline binary makes under its lease).
pub const LEASE_GONE: [SqlState; 3] = [UNKNOWN_LEASE, LEASE_NOT_ACTIVE, RUN_CANCELLED];

/// Whether a server error's code takes the lease away ([`LEASE_GONE`]).
pub fn lease_gone(code: &str) -> bool {
    LEASE_GONE.iter().any(|s| s.is(code))
}

/// The state of a code, if it is one of ours.
pub fn lookup(code: &str) -> Option<SqlState> {
    ALL.iter().copied().find(|s| s.code == code)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    use super::*;

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// `ORnnn` codes at each `ERRCODE = 'ORnnn'` of the SQL files.
    fn raised_in_sql() -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let dir = repo().join("sql");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "sql"))
            .collect();
        files.sort();
        assert!(files.len() > 5, "found the SQL files in {}", dir.display());
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            for (i, part) in text.split("ERRCODE").enumerate().skip(1) {
                let after = part.trim_start().trim_start_matches('=').trim_start();
                let Some(code) = after.strip_prefix('\'').and_then(|s| s.get(..5)) else {
                    continue;
                };
                if code.starts_with("OR") {
                    out.entry(code.to_string()).or_default().push(format!(
                        "{} (ERRCODE #{i})",
                        f.file_name()
                            .map(|n| n.to_string_lossy())
                            .unwrap_or_default()
                    ));
                }
            }
        }
        out
    }

    /// The codes `Error::sqlstate` maps to, by the constants error.rs names,
    /// and those the extension's own helpers (`pg_ext/src/*.rs`) raise.
    fn raised_in_rust() -> BTreeSet<String> {
        let mut src = include_str!("error.rs").to_string();
        let dir = repo().join("pg_ext/src");
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "rs") {
                src.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        NAMES
            .iter()
            .filter(|(name, _)| src.contains(&format!("sqlstate::{name}")))
            .map(|(_, code)| code.to_string())
            .collect()
    }

    /// The table of docs/errors.md: code -> meaning.
    fn documented() -> BTreeMap<String, String> {
        let path = repo().join("docs/errors.md");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        text.lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let code = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                code.starts_with("OR").then(|| {
                    (
                        code.to_string(),
                        cells.get(2).copied().unwrap_or("").to_string(),
                    )
                })
            })
            .collect()
    }

    #[test]
    fn every_code_is_listed_once_raised_and_documented_alike() {
        let listed: BTreeSet<&str> = ALL.iter().map(|s| s.code).collect();
        assert_eq!(listed.len(), ALL.len(), "a code is listed twice");
        let mut sorted: Vec<&str> = ALL.iter().map(|s| s.code).collect();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            ALL.iter().map(|s| s.code).collect::<Vec<_>>(),
            "ALL is in code order"
        );

        let sql = raised_in_sql();
        let rust = raised_in_rust();
        let raised: BTreeSet<&str> = sql
            .keys()
            .map(String::as_str)
            .chain(rust.iter().map(String::as_str))
            .collect();
        let unlisted: Vec<_> = raised.iter().filter(|c| !listed.contains(**c)).collect();
        assert!(
            unlisted.is_empty(),
            "raised but not listed in core::sqlstate: {unlisted:?} (at {:?})",
            unlisted
                .iter()
                .map(|c| sql.get(**c).cloned().unwrap_or_default())
                .collect::<Vec<_>>()
        );
        let unraised: Vec<_> = listed.iter().filter(|c| !raised.contains(**c)).collect();
        assert!(
            unraised.is_empty(),
            "listed in core::sqlstate but raised nowhere (no ERRCODE in sql/, no \
             sqlstate:: constant in error.rs): {unraised:?}"
        );

        let docs = documented();
        for s in ALL {
            match docs.get(s.code) {
                None => panic!("{} is not documented in docs/errors.md", s.code),
                Some(m) => assert_eq!(
                    m, s.meaning,
                    "docs/errors.md says {} means {m:?}, core::sqlstate says {:?}",
                    s.code, s.meaning
                ),
            }
        }
        let extra: Vec<_> = docs
            .keys()
            .filter(|c| !listed.contains(c.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "docs/errors.md documents codes core::sqlstate does not list: {extra:?}"
        );
    }

    #[test]
    fn the_scan_of_the_sql_files_finds_codes() {
        // The comparison above must see the SQL: these are raised there.
        let sql = raised_in_sql();
        for code in ["OR012", "OR050", "OR070"] {
            assert!(sql.contains_key(code), "{code} not found in sql/");
        }
        assert!(raised_in_rust().contains("OR030"), "error.rs's codes seen");
    }

    #[test]
    fn lease_gone_is_the_lease_codes() {
        assert!(lease_gone("OR012") && lease_gone("OR014") && lease_gone("OR015"));
        assert!(!lease_gone("OR070") && !lease_gone("40001"));
        assert_eq!(lookup("OR070"), Some(FENCED));
        assert_eq!(lookup("XX000"), None);
    }
}
