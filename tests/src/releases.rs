//! The extension's releases as `migrations/RELEASES` lists them, and the
//! files of `migrations/`.

use std::path::PathBuf;

/// One released version: its install script's checksum and the commit its
/// library was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub version: String,
    pub sha256: String,
    pub commit: String,
}

pub fn migrations_dir() -> PathBuf {
    crate::repo_root().join("migrations")
}

/// The releases, oldest first. Panics with the offending line on a line that
/// is not `version sha256 commit`.
pub fn releases() -> Vec<Release> {
    let path = migrations_dir().join("RELEASES");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [v, sha, commit]
                    if sha.len() == 64 && commit.len() == 40 && parse_version(v).is_some() =>
                {
                    Release {
                        version: v.to_string(),
                        sha256: sha.to_string(),
                        commit: commit.to_string(),
                    }
                }
                _ => panic!(
                    "{}: expected `version sha256 commit`, got {l:?}",
                    path.display()
                ),
            }
        })
        .collect()
}

/// `major.minor.patch` as numbers, for ordering versions.
pub fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    let parsed = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(parsed)
}

/// The version this build of the extension installs by default.
pub fn current_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// The upgrade scripts in migrations/, as (from, to).
pub fn upgrade_scripts() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(migrations_dir())
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter_map(|f| {
                    let (a, b) = f
                        .strip_prefix("orca--")?
                        .strip_suffix(".sql")?
                        .split_once("--")?;
                    Some((a.to_string(), b.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The chain of upgrade scripts from `from` to `to`, if there is one.
pub fn upgrade_path(from: &str, to: &str) -> Option<Vec<(String, String)>> {
    let scripts = upgrade_scripts();
    let mut path = Vec::new();
    let mut at = from.to_string();
    while at != to {
        let step = scripts.iter().find(|(a, _)| *a == at)?.clone();
        at = step.1.clone();
        path.push(step);
        if path.len() > scripts.len() {
            return None;
        }
    }
    Some(path)
}

/// Everything a user or client can observe of schema orca and the
/// extension's other tables (the Iceberg catalog's), one line per fact:
/// relations with their grants, RLS flag and comments; columns; constraints;
/// indexes; triggers; policies; functions with their grants, comments and
/// whole definitions; views; types; what pg_dump keeps; extension members.
pub async fn catalog(c: &mut sqlx::PgConnection) -> Vec<String> {
    let q = r#"
    WITH rel AS (
        -- Schema orca, and the extension's tables elsewhere (the Iceberg catalog's).
        SELECT c.oid, c.relname::text AS relname, c.relkind, c.relrowsecurity, c.reloptions, c.relacl,
               c.relnamespace
        FROM pg_class c
        WHERE c.relnamespace = 'orca'::regnamespace
           OR EXISTS (SELECT 1 FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                      WHERE e.extname = 'orca' AND d.refclassid = 'pg_extension'::regclass
                        AND d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e')
    )
    SELECT 'relation ' || c.relnamespace::regnamespace || '.' || c.relname || ' ' || c.relkind::text
           || ' rls=' || c.relrowsecurity
           || ' options=' || coalesce(c.reloptions::text, '')
           || ' acl=' || coalesce(c.relacl::text, '') || ' comment=' || coalesce(obj_description(c.oid), '')
    FROM rel c
    UNION ALL
    SELECT 'column ' || c.relname || '.' || a.attname
           || ' #' || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum)
           || ' ' || format_type(a.atttypid, a.atttypmod)
           || ' notnull=' || a.attnotnull || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
           || ' identity=' || a.attidentity::text || ' acl=' || coalesce(a.attacl::text, '')
           || ' comment=' || coalesce(col_description(c.oid, a.attnum), '')
    FROM rel c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    UNION ALL
    SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'orca'::regnamespace OR conrelid IN (SELECT oid FROM rel)
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index i
    WHERE i.indrelid IN (SELECT oid FROM rel)
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' enabled=' || t.tgenabled::text
    FROM pg_trigger t WHERE t.tgrelid IN (SELECT oid FROM rel) AND NOT t.tgisinternal
    UNION ALL
    SELECT 'policy ' || polrelid::regclass || ' ' || polname || ' cmd=' || polcmd::text
           || ' permissive=' || polpermissive || ' roles=' || polroles::regrole[]::text
           || ' using=' || coalesce(pg_get_expr(polqual, polrelid), '')
           || ' check=' || coalesce(pg_get_expr(polwithcheck, polrelid), '')
    FROM pg_policy p WHERE p.polrelid IN (SELECT oid FROM rel)
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure || ' acl=' || coalesce(p.proacl::text, '')
           || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '') || E'\n' || pg_get_functiondef(p.oid)
    FROM pg_proc p WHERE p.pronamespace = 'orca'::regnamespace
    UNION ALL
    SELECT 'view ' || c.relname || ' ' || pg_get_viewdef(c.oid)
    FROM rel c WHERE c.relkind = 'v'
    UNION ALL
    SELECT 'type ' || t.typname || ' ' || t.typtype::text || ' ' || coalesce((
               SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
               FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped), '')
    FROM pg_type t
    WHERE t.typnamespace = 'orca'::regnamespace
      AND (t.typrelid = 0 OR EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind = 'c'))
    UNION ALL
    SELECT 'dumped ' || x::regclass || ' ' || coalesce(e.extcondition[i], '')
    FROM pg_extension e, unnest(e.extconfig) WITH ORDINALITY AS u(x, i) WHERE e.extname = 'orca'
    UNION ALL
    SELECT 'member ' || pg_describe_object(classid, objid, objsubid) FROM pg_depend
    WHERE refclassid = 'pg_extension'::regclass
      AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'orca') AND deptype = 'e'
    "#;
    let mut rows: Vec<String> = sqlx::query_scalar(q).fetch_all(c).await.expect("catalog");
    rows.sort();
    rows
}

/// What one catalog has that the other lacks, both ways, for a message.
pub fn catalog_difference(expected: &[String], got: &[String]) -> Option<String> {
    let missing: Vec<_> = expected.iter().filter(|l| !got.contains(l)).collect();
    let extra: Vec<_> = got.iter().filter(|l| !expected.contains(l)).collect();
    if missing.is_empty() && extra.is_empty() {
        return None;
    }
    Some(format!(
        "missing (in a fresh install, not after the upgrade):\n{}\n\nextra (after the upgrade, not in a fresh install):\n{}",
        missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n\n"),
        extra.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n\n")
    ))
}
