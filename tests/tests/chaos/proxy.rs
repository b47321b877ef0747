//! A fault proxy on loopback between one runner (and its children) and the
//! control plane. Cut, it goes silent as a partitioned network does: bytes
//! are held, not refused, so the runner learns of it only by its own
//! timeouts and lease. A connection that lived through a cut is dropped at
//! its first use after the heal, as a real connection would have died; new
//! connections go through.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct State {
    cut: AtomicBool,
    /// Bumped by each cut: a connection older than the last cut is dead.
    generation: AtomicU64,
}

pub struct Proxy {
    pub port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy listens");
        let port = listener.local_addr().expect("proxy address").port();
        let state = Arc::new(State::default());
        let s = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    while s.cut.load(Ordering::Acquire) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let born = s.generation.load(Ordering::Acquire);
                    let (dr, dw) = down.into_split();
                    let (ur, uw) = up.into_split();
                    tokio::select! {
                        _ = pump(dr, uw, &s, born) => {}
                        _ = pump(ur, dw, &s, born) => {}
                    }
                });
            }
        });
        Proxy { port, state, task }
    }

    pub fn cut(&self) {
        self.state.generation.fetch_add(1, Ordering::AcqRel);
        self.state.cut.store(true, Ordering::Release);
    }

    pub fn heal(&self) {
        self.state.cut.store(false, Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies one direction until either side closes; holds bytes while cut,
/// and ends the connection once it outlived a cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    s: &State,
    born: u64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while s.cut.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if s.generation.load(Ordering::Acquire) != born {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
