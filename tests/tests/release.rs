//! Released install scripts never change, and every released version upgrades
//! to exactly what a fresh install of the current version makes.
//!
//! `migrations/orca--V.sql` is the frozen install script of each released
//! version V (scripts/freeze-release.sh writes it), and
//! `migrations/orca--A--B.sql` the upgrade scripts; scripts/setup.sh installs
//! the old ones next to the current build.

use std::collections::BTreeSet;
use std::path::PathBuf;

use orca_tests::sqlx::{self, Connection, Executor, PgConnection};
use orca_tests::*;

fn repo() -> PathBuf {
    orca_tests::repo_root()
}

fn current_version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}

/// The statements of a pgrx install script as a set: pgrx does not keep the
/// order of its blocks stable, and comments carry source line numbers.
fn blocks(script: &str) -> BTreeSet<String> {
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

async fn sharedir(db: &TestDb) -> PathBuf {
    let dir: String = sqlx::query_scalar("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'")
        .fetch_one(&db.pool)
        .await
        .expect("pg_config");
    PathBuf::from(dir).join("extension")
}

/// Everything a user or client can observe of schema orca, one line per fact.
async fn catalog(c: &mut PgConnection) -> Vec<String> {
    let q = r#"
    SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' rls=' || c.relrowsecurity
           || ' acl=' || coalesce(c.relacl::text, '') || ' comment=' || coalesce(obj_description(c.oid), '')
    FROM pg_class c WHERE c.relnamespace = 'orca'::regnamespace
    UNION ALL
    SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || ' notnull=' || a.attnotnull || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
           || ' identity=' || a.attidentity::text || ' comment=' || coalesce(col_description(c.oid, a.attnum), '')
    FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    WHERE c.relnamespace = 'orca'::regnamespace
    UNION ALL
    SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'orca'::regnamespace
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relnamespace = 'orca'::regnamespace
    UNION ALL
    SELECT 'policy ' || polrelid::regclass || ' ' || polname || ' ' || coalesce(pg_get_expr(polqual, polrelid), '')
    FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid WHERE c.relnamespace = 'orca'::regnamespace
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure || ' acl=' || coalesce(p.proacl::text, '')
           || ' comment=' || coalesce(obj_description(p.oid, 'pg_proc'), '') || E'\n' || pg_get_functiondef(p.oid)
    FROM pg_proc p WHERE p.pronamespace = 'orca'::regnamespace
    UNION ALL
    SELECT 'view ' || c.relname || ' ' || pg_get_viewdef(c.oid) || ' options=' || coalesce(c.reloptions::text, '')
    FROM pg_class c WHERE c.relnamespace = 'orca'::regnamespace AND c.relkind = 'v'
    UNION ALL
    SELECT 'type ' || t.typname || ' ' || t.typtype::text FROM pg_type t
    WHERE t.typnamespace = 'orca'::regnamespace AND t.typrelid = 0 OR (t.typnamespace = 'orca'::regnamespace AND t.typtype = 'c'
      AND EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind = 'c'))
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

#[tokio::test]
async fn the_released_install_script_of_this_version_is_unchanged() {
    let db = TestDb::new().await;
    let version = current_version();
    let frozen_path = repo().join(format!("migrations/orca--{version}.sql"));
    let frozen = std::fs::read_to_string(&frozen_path).unwrap_or_else(|_| {
        panic!(
            "version {version} has no frozen install script at {}: run scripts/freeze-release.sh",
            frozen_path.display()
        )
    });
    let built = std::fs::read_to_string(sharedir(&db).await.join(format!("orca--{version}.sql")))
        .expect("the installed script of this version (run scripts/setup.sh)");
    let (frozen, built) = (blocks(&frozen), blocks(&built));
    let changed: Vec<_> = built.symmetric_difference(&frozen).collect();
    assert!(
        changed.is_empty(),
        "the schema changed after version {version} was released: bump the version in \
         Cargo.toml, write migrations/orca--{version}--NEW.sql and freeze the new version.\n\
         Differences:\n{}",
        changed
            .iter()
            .map(|b| b.chars().take(400).collect::<String>())
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
}

#[tokio::test]
async fn every_released_version_upgrades_to_a_fresh_install() {
    let fresh = TestDb::new().await;
    let mut c = fresh.connect().await;
    let expected = catalog(&mut c).await;
    assert!(expected.len() > 100, "the catalog dump sees the schema");
    let version = current_version();
    let mut old: Vec<String> = std::fs::read_dir(repo().join("migrations"))
        .expect("migrations/")
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|f| {
            let v = f.strip_prefix("orca--")?.strip_suffix(".sql")?;
            (!v.contains("--") && v != version).then(|| v.to_string())
        })
        .collect();
    old.sort();
    for v in old {
        let db = TestDb::new().await;
        let mut c = PgConnection::connect_with(&db.pool.connect_options())
            .await
            .expect("connect");
        c.execute("DROP EXTENSION orca").await.expect("drop");
        c.execute(format!("CREATE EXTENSION orca VERSION '{v}'").as_str())
            .await
            .unwrap_or_else(|e| panic!("install released version {v}: {e}"));
        c.execute("ALTER EXTENSION orca UPDATE")
            .await
            .unwrap_or_else(|e| panic!("upgrade {v} to {version}: {e}"));
        let got = catalog(&mut c).await;
        let missing: Vec<_> = expected.iter().filter(|l| !got.contains(l)).collect();
        let extra: Vec<_> = got.iter().filter(|l| !expected.contains(l)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{v} upgraded to {version} differs from a fresh install:\nmissing {missing:#?}\nextra {extra:#?}"
        );
    }
}

#[tokio::test]
async fn the_catalog_dump_tells_installs_apart() {
    // The comparison above must be able to fail: a dropped comment shows.
    let db = TestDb::new().await;
    let mut c = db.connect().await;
    let before = catalog(&mut c).await;
    c.execute("COMMENT ON FUNCTION orca.tick(timestamptz) IS NULL")
        .await
        .expect("comment");
    let after = catalog(&mut c).await;
    assert_ne!(before, after);
}
