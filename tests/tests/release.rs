//! Releases hold: a released install script never changes (its bytes match
//! the checksum in `migrations/RELEASES`), `migrations/` holds only released
//! install scripts and upgrade scripts, and every released version upgrades
//! to exactly what a fresh install of the current version makes.
//!
//! scripts/setup.sh installs the released scripts and the upgrade scripts
//! next to the current build; scripts/release.sh cuts a release. The upgrade
//! with work in flight is tests/tests/upgrade.rs.

use std::path::PathBuf;

use orca_tests::releases::{self, catalog, catalog_difference, current_version, Release};
use orca_tests::sqlx::{self, Connection, Executor, PgConnection};
use orca_tests::*;
use sha2::{Digest, Sha256};

fn script(version: &str) -> PathBuf {
    releases::migrations_dir().join(format!("orca--{version}.sql"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn released_install_scripts_are_unchanged_byte_for_byte() {
    let released = releases::releases();
    assert!(
        released.iter().any(|r| r.version == "0.1.0"),
        "RELEASES lists the first release"
    );
    for Release {
        version, sha256, ..
    } in &released
    {
        let path = script(version);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "released version {version} has no install script at {}: {e}",
                path.display()
            )
        });
        let got = sha256_hex(&bytes);
        assert_eq!(
            &got,
            sha256,
            "{} changed after version {version} was released (sha256 {got}, released as \
             {sha256}). A released script never changes: restore it with `git checkout \
             <release commit> -- {}` and put the schema change into the next \
             orca--A--B.sql upgrade script.",
            path.display(),
            path.display()
        );
    }
}

#[test]
fn the_checksum_test_can_fail() {
    // The comparison above must see a one-byte change.
    let bytes = std::fs::read(script("0.1.0")).expect("0.1.0 script");
    let mut changed = bytes.clone();
    changed.push(b'\n');
    assert_ne!(sha256_hex(&bytes), sha256_hex(&changed));
}

#[test]
fn migrations_hold_released_scripts_and_upgrades_only() {
    let released = releases::releases();
    let versions: Vec<&str> = released.iter().map(|r| r.version.as_str()).collect();
    let current = current_version();
    let mut sorted = released.clone();
    sorted.sort_by_key(|r| releases::parse_version(&r.version));
    assert_eq!(sorted, released, "RELEASES lists versions oldest first");
    for entry in std::fs::read_dir(releases::migrations_dir()).expect("migrations/") {
        let name = entry
            .expect("entry")
            .file_name()
            .into_string()
            .expect("utf-8 name");
        if name == "RELEASES" {
            continue;
        }
        let Some(v) = name
            .strip_prefix("orca--")
            .and_then(|n| n.strip_suffix(".sql"))
        else {
            panic!("migrations/{name} is neither an install nor an upgrade script");
        };
        match v.split_once("--") {
            Some((from, to)) => {
                assert!(
                    versions.contains(&from),
                    "migrations/{name} upgrades from {from}, which RELEASES does not list"
                );
                assert!(
                    to == current || versions.contains(&to),
                    "migrations/{name} upgrades to {to}, neither released nor the current {current}"
                );
            }
            None => assert!(
                versions.contains(&v),
                "migrations/{name} is the install script of {v}, which was not released: the \
                 current version's install script is built from sql/, and only \
                 scripts/release.sh puts one into migrations/"
            ),
        }
    }
    for r in &released {
        if r.version != current {
            assert!(
                releases::upgrade_path(&r.version, &current).is_some(),
                "no chain of upgrade scripts leads from released {} to {current}",
                r.version
            );
        }
    }
}

/// The objects a script creates, as "KIND name" (a policy with its table):
/// every statement that starts a line (or a DO block's line) with CREATE.
fn created(script: &str) -> Vec<String> {
    const KINDS: [&str; 10] = [
        "FUNCTION", "VIEW", "POLICY", "TABLE", "INDEX", "TYPE", "TRIGGER", "SEQUENCE", "ROLE",
        "SCHEMA",
    ];
    let mut out = Vec::new();
    for line in script.lines() {
        let indent = line.len() - line.trim_start().len();
        let words: Vec<&str> = line.split_whitespace().collect();
        if indent > 12 || words.first() != Some(&"CREATE") {
            continue;
        }
        let mut w = words[1..]
            .iter()
            .copied()
            .skip_while(|x| ["OR", "REPLACE", "UNIQUE", "MATERIALIZED"].contains(x));
        let Some(kind) = w.next().filter(|k| KINDS.contains(k)) else {
            continue;
        };
        let mut rest: Vec<&str> = w.collect();
        if rest.starts_with(&["IF", "NOT", "EXISTS"]) {
            rest.drain(..3);
        }
        let Some(name) = rest.first() else { continue };
        // pgrx's functions are unqualified and quoted; they land in orca.
        let name = name.split('(').next().unwrap_or(name).replace('"', "");
        let name = name.strip_prefix("orca.").unwrap_or(&name).to_string();
        let on = match (kind, rest.iter().position(|x| *x == "ON")) {
            ("POLICY", Some(i)) => format!(" ON {}", rest.get(i + 1).unwrap_or(&"")),
            _ => String::new(),
        };
        out.push(format!("{kind} {name}{on}"));
    }
    out
}

fn twice(objects: &[String]) -> Vec<String> {
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for o in objects {
        *seen.entry(o.as_str()).or_default() += 1;
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(o, n)| format!("{o} ({n} times)"))
        .collect()
}

#[test]
fn unreleased_scripts_create_each_object_once() {
    // What a reader sees first is what runs: the install script's sources
    // and each upgrade script not yet released define each function,
    // view, policy, table, index and type once.
    let current = current_version();
    let mut sources = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("sql"))
        .expect("sql/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    let install: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).expect("sql/*.sql"))
        .collect::<Vec<_>>()
        .join("\n");
    sources.push(("sql/*.sql".to_string(), install));
    for (from, to) in releases::upgrade_scripts() {
        if to == current {
            let name = format!("orca--{from}--{to}.sql");
            let text = std::fs::read_to_string(releases::migrations_dir().join(&name))
                .expect("an upgrade script");
            sources.push((format!("migrations/{name}"), text));
        }
    }
    for (name, text) in &sources {
        let objects = created(text);
        assert!(
            objects.len() > 20 || name.starts_with("migrations/"),
            "{name}: {objects:?}"
        );
        let dup = twice(&objects);
        assert!(
            dup.is_empty(),
            "{name} creates these more than once (define each once, in dependency order): {dup:?}"
        );
    }
}

#[test]
fn the_once_check_can_fail() {
    let script = "CREATE FUNCTION orca.tick(now timestamptz) RETURNS jsonb\n\
                  CREATE OR REPLACE FUNCTION orca.tick(now timestamptz) RETURNS jsonb\n\
                  CREATE  FUNCTION \"_cron_check\"(\n\
                  CREATE POLICY org_scope ON orca.runs USING (true);\n\
                  CREATE POLICY org_scope ON orca.pipelines USING (true);\n\
                      CREATE TABLE public.iceberg_tables (\n";
    assert_eq!(
        created(script),
        [
            "FUNCTION tick",
            "FUNCTION tick",
            "FUNCTION _cron_check",
            "POLICY org_scope ON orca.runs",
            "POLICY org_scope ON orca.pipelines",
            "TABLE public.iceberg_tables"
        ]
    );
    assert_eq!(twice(&created(script)), ["FUNCTION tick (2 times)"]);
}

/// The statements of a pgrx install script as a set: pgrx does not keep the
/// order of its blocks stable, and comments carry source line numbers.
fn blocks(script: &str) -> std::collections::BTreeSet<String> {
    script
        .split("/* <begin connected objects> */")
        .map(|block| {
            block
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("--"))
                .filter(|l| !l.starts_with("/*") && !l.starts_with("*/"))
                .filter(|l| {
                    !l.contains("connected objects")
                        && !l.starts_with("This file is")
                        && !l.starts_with("The ordering")
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|b| !b.is_empty())
        .collect()
}

#[tokio::test]
async fn a_released_current_version_builds_its_released_script() {
    // Between scripts/release.sh and the bump to the next version, the build
    // must still make exactly the released script.
    let current = current_version();
    if !releases::releases().iter().any(|r| r.version == current) {
        return;
    }
    let db = TestDb::new().await;
    let dir: String = sqlx::query_scalar("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'")
        .fetch_one(&db.pool)
        .await
        .expect("pg_config");
    let built =
        std::fs::read_to_string(PathBuf::from(dir).join(format!("extension/orca--{current}.sql")))
            .expect("the installed script of this version (run scripts/setup.sh)");
    let frozen = std::fs::read_to_string(script(&current)).expect("released script");
    let (frozen, built) = (blocks(&frozen), blocks(&built));
    let changed: Vec<_> = built.symmetric_difference(&frozen).collect();
    assert!(
        changed.is_empty(),
        "the schema changed after version {current} was released: bump the version and write \
         migrations/orca--{current}--NEW.sql (scripts/release.sh --next does both).\n{changed:#?}"
    );
}

#[tokio::test]
async fn every_released_version_upgrades_to_a_fresh_install() {
    let fresh = TestDb::new().await;
    let mut c = fresh.connect().await;
    let expected = catalog(&mut c).await;
    assert!(expected.len() > 100, "the catalog dump sees the schema");
    let current = current_version();
    for r in releases::releases() {
        if r.version == current {
            continue;
        }
        let db = TestDb::new().await;
        let mut c = PgConnection::connect_with(&db.pool.connect_options())
            .await
            .expect("connect");
        c.execute("DROP EXTENSION orca").await.expect("drop");
        c.execute(format!("CREATE EXTENSION orca VERSION '{}'", r.version).as_str())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "install released version {}: {e} (scripts/setup.sh installs it)",
                    r.version
                )
            });
        c.execute("ALTER EXTENSION orca UPDATE")
            .await
            .unwrap_or_else(|e| panic!("upgrade {} to {current}: {e}", r.version));
        let version: String =
            sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'orca'")
                .fetch_one(&mut c)
                .await
                .expect("extversion");
        assert_eq!(version, current);
        let got = catalog(&mut c).await;
        if let Some(diff) = catalog_difference(&expected, &got) {
            panic!(
                "{} upgraded to {current} differs from a fresh install of {current}:\n{diff}",
                r.version
            );
        }
    }
}

#[tokio::test]
async fn an_upgrade_adopts_the_iceberg_catalog_a_client_made_with_its_rows() {
    // Under 0.1.0 the first client made the catalog's tables: PyIceberg's
    // layout has no iceberg_type column. The upgrade adopts them, rows and
    // all, and the result is a fresh install's.
    let fresh = TestDb::new().await;
    let expected = catalog(&mut fresh.connect().await).await;
    let db = TestDb::new().await;
    let mut c = db.connect().await;
    for sql in [
        "DROP EXTENSION orca",
        "CREATE EXTENSION orca VERSION '0.1.0'",
        "CREATE TABLE iceberg_tables (catalog_name VARCHAR(255) NOT NULL,
             table_namespace VARCHAR(255) NOT NULL, table_name VARCHAR(255) NOT NULL,
             metadata_location VARCHAR(1000), previous_metadata_location VARCHAR(1000),
             PRIMARY KEY (catalog_name, table_namespace, table_name))",
        "CREATE TABLE iceberg_namespace_properties (catalog_name VARCHAR(255) NOT NULL,
             namespace VARCHAR(255) NOT NULL, property_key VARCHAR(255),
             property_value VARCHAR(1000), PRIMARY KEY (catalog_name, namespace, property_key))",
        "INSERT INTO iceberg_tables VALUES ('default', 'lake', 'raw', 'file:///w/lake/raw/m.json', NULL)",
        "INSERT INTO iceberg_namespace_properties VALUES ('default', 'lake', 'exists', 'true')",
        // What a client that made the tables could leave on them, which
        // the catalog's functions would run as the extension's owner.
        "CREATE FUNCTION public.planted() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'planted'; END $$",
        "CREATE TRIGGER planted BEFORE INSERT OR UPDATE ON iceberg_tables \
         FOR EACH ROW EXECUTE FUNCTION public.planted()",
        "ALTER TABLE iceberg_namespace_properties ALTER COLUMN property_value SET DEFAULT 'x'",
        "ALTER EXTENSION orca UPDATE",
    ] {
        c.execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let kept: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT metadata_location, iceberg_type FROM iceberg_tables")
            .fetch_all(&mut c)
            .await
            .expect("catalog rows");
    assert_eq!(kept, [("file:///w/lake/raw/m.json".to_string(), None)]);
    let planted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_trigger \
         WHERE tgrelid = 'public.iceberg_tables'::regclass AND NOT tgisinternal",
    )
    .fetch_one(&mut c)
    .await
    .expect("triggers");
    assert_eq!(planted, 0, "the client's trigger came along");
    if let Some(diff) = catalog_difference(&expected, &catalog(&mut c).await) {
        panic!("the adopted catalog differs from a fresh install's:\n{diff}");
    }
    // The extension owns them now: dropping it takes them.
    c.execute("DROP EXTENSION orca").await.expect("drop");
    let left: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('public.iceberg_tables')::text")
            .fetch_one(&mut c)
            .await
            .expect("regclass");
    assert_eq!(left, None);
}

#[tokio::test]
async fn the_catalog_dump_tells_installs_apart() {
    // The comparison above must be able to fail: a dropped comment, a
    // changed grant and a changed function body each show.
    let db = TestDb::new().await;
    let mut c = db.connect().await;
    let before = catalog(&mut c).await;
    for change in [
        "COMMENT ON FUNCTION orca.tick(timestamptz) IS NULL",
        "GRANT EXECUTE ON FUNCTION orca.run(text, text) TO orca_viewer",
        "CREATE OR REPLACE FUNCTION orca._lease_attempt(p_lease uuid) RETURNS bigint \
         LANGUAGE sql IMMUTABLE STRICT AS $$ SELECT 0::bigint $$",
    ] {
        let mut tx = c.begin().await.expect("begin");
        tx.execute(change).await.expect(change);
        let after = catalog(&mut tx).await;
        assert!(
            catalog_difference(&before, &after).is_some(),
            "the catalog dump misses: {change}"
        );
        drop(tx);
    }
}
