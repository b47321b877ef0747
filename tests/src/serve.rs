//! A real `orca serve` process over a test database, for the tests of the
//! HTTP API, its OpenAPI document and the console.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sqlx::Executor;

use crate::procs::bin;
use crate::{connect_org, wait_until, TestDb};

/// The server's login: nothing of its own, the three roles to take.
const SERVE_LOGIN: &str = "orca_t_http_serve";

pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:<port>`
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes `login` a login like orca serve's (NOINHERIT, able to take the
/// viewer, operator and admin roles, and a relay's), once per cluster:
/// tests run at once, so another may make it at the same moment.
pub async fn serve_login(db: &TestDb, login: &str) {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(login)
            .fetch_one(&db.pool)
            .await
            .expect("role lookup");
    if !exists {
        let _ = db
            .pool
            .execute(
                format!(
                    "CREATE ROLE {login} LOGIN NOINHERIT \
                     IN ROLE orca_viewer, orca_operator, orca_admin, orca_relay"
                )
                .as_str(),
            )
            .await;
    }
    // A login made before relays had their role gets it now.
    let _ = db
        .pool
        .execute(format!("GRANT orca_relay TO {login}").as_str())
        .await;
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub async fn serve(db: &TestDb) -> Server {
    serve_with(db, &[]).await
}

/// `orca serve` with more arguments (`--secure-cookies`, ...).
pub async fn serve_with(db: &TestDb, args: &[&str]) -> Server {
    serve_login(db, SERVE_LOGIN).await;
    let port = free_port();
    let url = db
        .url()
        .replacen("postgres@", &format!("{SERVE_LOGIN}@"), 1);
    let child = Command::new(bin("orca"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .env("DATABASE_URL", url)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start orca serve");
    let base = format!("http://127.0.0.1:{port}");
    let server = Server { child, base };
    let client = reqwest::Client::new();
    let health = format!("{}/healthz", server.base);
    wait_until(
        "orca serve to answer",
        Duration::from_secs(30),
        || {
            let (client, health) = (client.clone(), health.clone());
            async move {
                client
                    .get(&health)
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
                    .map(|_| ())
            }
        },
        String::new,
    )
    .await;
    server
}

/// An API key of `org` with `role`, made by the superuser.
pub async fn api_key(db: &TestDb, org: &str, name: &str, role: &str) -> String {
    let mut c = connect_org(db, "postgres", org).await;
    sqlx::query_scalar("SELECT orca.create_api_key($1, $2)")
        .bind(name)
        .bind(role)
        .fetch_one(&mut c)
        .await
        .expect("an API key")
}
