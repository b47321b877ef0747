//! TLS: every client of the control plane and every connector speaks TLS as
//! the connection string's `sslmode` says, against a server of the test's
//! own that refuses anything but TLS, with a certificate authority the test
//! makes. A certificate of another authority, or for another name, is
//! refused where the mode checks it.

use std::path::Path;

use orca_tests::cluster::{is_root, PrivateCluster};
use orca_tests::sqlx::Connection;

use super::*;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate it signed for localhost and 127.0.0.1, and a
/// CA that signed nothing of this server's.
fn certificates(dir: &Path) {
    for ca in ["ca", "other-ca"] {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=orca test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ],
        );
    }
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .expect("extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
    // The server reads its key as its own user, with no access for others.
    for f in ["server.key", "server.crt"] {
        let ok = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(dir.join(f))
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok || !is_root(), "chown {f}");
    }
    let ok = Command::new("chmod")
        .args(["600"])
        .arg(dir.join("server.key"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "chmod server.key");
}

/// A server that takes TLS connections only.
fn tls_cluster(dir: &Path) -> PrivateCluster {
    let hba = dir.join("pg_hba.conf");
    std::fs::write(
        &hba,
        "local all all trust\n\
         hostssl all all 127.0.0.1/32 trust\n\
         hostnossl all all 0.0.0.0/0 reject\n",
    )
    .expect("hba");
    let d = dir.display();
    PrivateCluster::start(&[
        "ssl = on",
        &format!("ssl_cert_file = '{d}/server.crt'"),
        &format!("ssl_key_file = '{d}/server.key'"),
        &format!("hba_file = '{d}/pg_hba.conf'"),
    ])
}

#[tokio::test]
async fn clients_and_connectors_speak_tls_as_sslmode_says() {
    let dir = scratch("tls");
    // The server (as postgres) reads these.
    let _ = Command::new("chmod").args(["755"]).arg(&dir).status();
    certificates(&dir);
    let cluster = tls_cluster(&dir);
    let base = format!("postgres://postgres@127.0.0.1:{}/postgres", cluster.port);
    let ca = dir.join("ca.pem").display().to_string();
    let other = dir.join("other-ca.pem").display().to_string();

    // sqlx (the runner, the catalog, the tests): the server refuses plain
    // connections; require encrypts; verify-full checks the chain and name.
    let plain = PgConnection::connect(&format!("{base}?sslmode=disable")).await;
    assert!(plain.is_err(), "the server took a connection without TLS");
    for url in [
        format!("{base}?sslmode=require"),
        format!("{base}?sslmode=verify-full&sslrootcert={ca}"),
        format!(
            "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={ca}",
            cluster.port
        ),
    ] {
        let mut c = PgConnection::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let ssl: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&mut c)
                .await
                .expect("pg_stat_ssl");
        assert!(ssl, "{url} is not encrypted");
    }
    let wrong =
        PgConnection::connect(&format!("{base}?sslmode=verify-full&sslrootcert={other}")).await;
    assert!(
        wrong.is_err(),
        "verify-full took a certificate of another CA"
    );

    // The postgres crate (engines, connectors, the CLI), through
    // orca_client::tls: URL and key=value forms alike.
    let port = cluster.port;
    let cases: Vec<(String, bool)> = vec![
        (format!("{base}?sslmode=require"), true),
        (
            format!("host=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=require"),
            true,
        ),
        (format!("{base}?sslmode=verify-ca&sslrootcert={ca}"), true),
        (format!("{base}?sslmode=verify-full&sslrootcert={ca}"), true),
        (
            format!(
                "host=localhost port={port} user=postgres dbname=postgres sslmode=verify-full \
                 sslrootcert='{ca}'"
            ),
            true,
        ),
        // libpq: require with a root certificate checks the chain.
        (format!("{base}?sslmode=require&sslrootcert={other}"), false),
        (
            format!("{base}?sslmode=verify-ca&sslrootcert={other}"),
            false,
        ),
        (
            format!("{base}?sslmode=verify-full&sslrootcert={other}"),
            false,
        ),
        // Another name at the same address: verify-full refuses it,
        // verify-ca (chain only) takes it.
        (
            format!(
                "postgres://postgres@db.elsewhere.example:{port}/postgres?hostaddr=127.0.0.1&\
                 sslmode=verify-full&sslrootcert={ca}"
            ),
            false,
        ),
        (
            format!(
                "postgres://postgres@db.elsewhere.example:{port}/postgres?hostaddr=127.0.0.1&\
                 sslmode=verify-ca&sslrootcert={ca}"
            ),
            true,
        ),
        (format!("{base}?sslmode=disable"), false),
    ];
    for (url, works) in cases {
        let got = tokio::task::spawn_blocking({
            let url = url.clone();
            move || {
                orca_client::tls::connect(&url).and_then(|mut c| {
                    c.query_one(
                        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                        &[],
                    )
                    .map(|r| r.get::<_, bool>(0))
                    .map_err(|source| orca_client::ClientError::Refused {
                        what: "query",
                        source,
                    })
                })
            }
        })
        .await
        .expect("join");
        match (works, got) {
            (true, Ok(ssl)) => assert!(ssl, "{url} is not encrypted"),
            (true, Err(e)) => panic!("{url}: {e}"),
            (false, Ok(_)) => panic!("{url} connected"),
            (false, Err(_)) => {}
        }
    }

    // The whole path over TLS: a runner (sqlx), its engine (the postgres
    // crate) and the sync's Postgres source, against the TLS-only server.
    let mut admin = PgConnection::connect(&format!("{base}?sslmode=require"))
        .await
        .expect("admin");
    admin
        .execute("CREATE DATABASE orca")
        .await
        .expect("database");
    let url =
        format!("postgres://postgres@127.0.0.1:{port}/orca?sslmode=verify-full&sslrootcert={ca}");
    let mut c = PgConnection::connect(&url).await.expect("connect");
    let out = dir.join("out");
    sqlx::raw_sql(&format!(
        "CREATE EXTENSION orca;
         CREATE TABLE public.orders (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, amount int);
         INSERT INTO public.orders SELECT g, '2024-01-01'::timestamptz + g * interval '1 second', g
         FROM generate_series(1, 2000) g;
         SELECT orca.allow('default', '127.0.0.1'), orca.allow('default', '{}');",
        dir.display()
    ))
    .execute(&mut c)
    .await
    .expect("the control plane");
    sqlx::query("SELECT orca.create_sync('shop', $1, $2, $3, NULL, 'at_least_once')")
        .bind(json!({"type": "postgres", "url": url, "batch_rows": 500}))
        .bind(json!({"type": "parquet", "url": out.to_string_lossy()}))
        .bind(
            json!([{"name": "orders", "table": "public.orders", "cursor": "updated_at",
                      "primary_key": ["id"]}]),
        )
        .execute(&mut c)
        .await
        .expect("create_sync");
    let logs = dir.join("logs");
    let store = dir.join("store").to_string_lossy().to_string();
    let engine = bin("orca-engine");
    let env = [
        ("ORCA_STORE", store.as_str()),
        ("ORCA_ENGINE", engine.to_str().unwrap_or_default()),
    ];
    let runner = Runner::start(&url, "tls-runner", 1, &logs, &env);
    let run: i64 = sqlx::query_scalar("SELECT orca.run('shop', 'now')")
        .fetch_one(&mut c)
        .await
        .expect("run");
    let done = wait_until(
        "the sync's run over TLS to end",
        Duration::from_secs(120),
        || async {
            let mut c = PgConnection::connect(&url).await.ok()?;
            sqlx::query_scalar::<_, String>("SELECT status FROM orca.runs WHERE id = $1")
                .bind(run)
                .fetch_one(&mut c)
                .await
                .ok()
                .filter(|s| s == "succeeded" || s == "failed")
        },
        || format!("{}\n{}", outputs(&[&runner]), cluster.log()),
    )
    .await;
    assert_eq!(done, "succeeded", "{}", outputs(&[&runner]));
    let files = std::fs::read_dir(out.join("orders"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(files > 0, "the sync wrote no Parquet over TLS");

    // The CLI connects the same way, and its messages never show a
    // password, in either form of connection string.
    let ok = Command::new(bin("orca"))
        .args(["runs"])
        .env("DATABASE_URL", &url)
        .output()
        .expect("orca runs");
    assert!(
        ok.status.success(),
        "orca runs over verify-full: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for bad in [
        format!("postgres://postgres:s3cret@127.0.0.1:{port}/orca?sslmode=verify-full&sslrootcert={other}"),
        format!("host=127.0.0.1 port={port} user=postgres password=s3cret dbname=orca sslmode=disable"),
    ] {
        let out = Command::new(bin("orca"))
            .args(["runs"])
            .env("DATABASE_URL", &bad)
            .output()
            .expect("orca runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad} connected");
        assert!(
            err.contains("cannot connect to the control plane") && !err.contains("s3cret"),
            "{err}"
        );
    }
    drop(runner);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
