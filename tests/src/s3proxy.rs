//! A fault proxy on loopback in front of the S3 server, speaking just
//! enough HTTP/1.1 to fail one request at a time: the object store failing
//! as S3 does, between Orca's processes and the bucket. (The bucket is
//! moto's S3 server, [`crate::s3`]: no real S3 is reachable here.)
//!
//! Each connection carries one request (the proxy asks both sides to close
//! after it), so that a fault hits exactly one request. During a fault's
//! window ([`S3Proxy::fail`]) each request is, by the fault's kind:
//! - `Error`: answered `500 InternalError`; every other one only after the
//!   request was forwarded, so that the write landed while its client was
//!   told it failed (a retried put-if-absent then finds its own object);
//! - `Slow`: forwarded, and the answer held for longer than a client's
//!   request timeout (object_store's is 30 s);
//! - `Drop`: the connection closed with no answer; every other one after
//!   the request was forwarded.
//!
//! [`S3Proxy::fail_conditional_puts`] aims a fault at the writes that must
//! not find their object there (`If-None-Match: *`) only, for as long as it
//! is set: `Error` answers 500 to each such write that landed (its retry is
//! let through), `Slow` holds each one's answer.
//!
//! A request whose body is chunked is passed through untouched.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a slow answer is held unless told otherwise: longer than
/// object_store's request timeout, so that the client gives up on it.
pub const SLOW: Duration = Duration::from_secs(35);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Error,
    Slow,
    Drop,
}

struct State {
    window: Mutex<Option<(Fault, Instant)>>,
    /// The fault every conditional write meets, while set.
    conditional: Mutex<Option<Fault>>,
    hold: Mutex<Duration>,
    /// Requests that met a fault in a window: odd and even ones are failed
    /// before and after they reach the server.
    hit: AtomicU64,
    /// Requests failed, and how many of them the server had carried out.
    failed: AtomicUsize,
    landed: AtomicUsize,
}

impl State {
    fn fault(&self) -> Option<Fault> {
        let w = self.window.lock().ok()?;
        w.filter(|(_, until)| Instant::now() < *until)
            .map(|(f, _)| f)
    }

    fn hold(&self) -> Duration {
        self.hold.lock().map_or(SLOW, |h| *h)
    }
}

pub struct S3Proxy {
    pub port: u16,
    state: Arc<State>,
    /// The proxy's own runtime: it answers while its caller blocks (a test
    /// waiting for an engine it started).
    rt: Option<tokio::runtime::Runtime>,
}

impl S3Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub fn start(upstream: u16) -> S3Proxy {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the S3 proxy's runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("S3 proxy listens");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().expect("S3 proxy address").port();
        let state = Arc::new(State {
            window: Mutex::default(),
            conditional: Mutex::default(),
            hold: Mutex::new(SLOW),
            hit: AtomicU64::default(),
            failed: AtomicUsize::default(),
            landed: AtomicUsize::default(),
        });
        let s = state.clone();
        rt.spawn(async move {
            let Ok(listener) = TcpListener::from_std(listener) else {
                return;
            };
            while let Ok((down, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let _ = serve(down, upstream, &s).await;
                });
            }
        });
        S3Proxy {
            port,
            state,
            rt: Some(rt),
        }
    }

    /// Every request for `how_long` meets `fault`.
    pub fn fail(&self, fault: Fault, how_long: Duration) {
        if let Ok(mut w) = self.state.window.lock() {
            *w = Some((fault, Instant::now() + how_long));
        }
    }

    /// Every conditional write meets `fault` from now on (None: none does).
    pub fn fail_conditional_puts(&self, fault: Option<Fault>) {
        if let Ok(mut c) = self.state.conditional.lock() {
            *c = fault;
        }
    }

    /// How long a slow answer is held (35 s unless set).
    pub fn hold(&self, how_long: Duration) {
        if let Ok(mut h) = self.state.hold.lock() {
            *h = how_long;
        }
    }

    /// How many requests met a fault so far, and how many of those the
    /// server had carried out (answered 2xx) first.
    pub fn hits(&self) -> (usize, usize) {
        (
            self.state.failed.load(Ordering::Acquire),
            self.state.landed.load(Ordering::Acquire),
        )
    }
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Where the head of a message ends (after its blank line).
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The head's lines without any `Connection` header, plus
/// `Connection: close`; and the body's length, or None when it is chunked.
fn rewrite_head(head: &[u8]) -> (Vec<u8>, Option<usize>) {
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    let mut length = Some(0);
    let mut chunked = false;
    for (i, line) in text.split("\r\n").filter(|l| !l.is_empty()).enumerate() {
        let lower = line.to_ascii_lowercase();
        if i > 0 && lower.starts_with("connection:") {
            continue;
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok();
        }
        chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    (out.into_bytes(), if chunked { None } else { length })
}

/// Whether a head has a header (its name lower-cased, with the colon).
fn head_has(head: &[u8], name: &str) -> bool {
    String::from_utf8_lossy(head)
        .split("\r\n")
        .any(|l| l.to_ascii_lowercase().starts_with(name))
}

async fn read_head<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Option<usize> {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(end) = head_end(buf) {
            return Some(end);
        }
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// S3's answer to a request it failed inside.
fn error_500() -> Vec<u8> {
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message></Error>";
    format!(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\n\
Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn serve(mut down: TcpStream, upstream: u16, s: &State) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let Some(end) = read_head(&mut down, &mut buf).await else {
        return Ok(());
    };
    let (head, length) = rewrite_head(&buf[..end]);
    let mut up = TcpStream::connect(("127.0.0.1", upstream)).await?;
    let Some(length) = length else {
        // Chunked: passed through as bytes, no fault.
        up.write_all(&buf).await?;
        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
        return Ok(());
    };
    let mut body = buf[end..].to_vec();
    let mut chunk = [0u8; 64 * 1024];
    while body.len() < length {
        let n = down.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    let conditional = (head.starts_with(b"PUT ") && head_has(&head, "if-none-match:"))
        .then(|| s.conditional.lock().ok().and_then(|c| *c))
        .flatten();
    let fault = conditional.or_else(|| s.fault());
    let after = match (conditional, fault) {
        // An aimed error meets only the writes that land; a slow answer
        // is always forwarded first.
        (Some(_), _) | (_, Some(Fault::Slow)) => true,
        (None, Some(_)) => s.hit.fetch_add(1, Ordering::AcqRel) % 2 == 1,
        (None, None) => false,
    };
    let forward = fault.is_none() || after;
    let mut answer = Vec::new();
    if forward {
        up.write_all(&head).await?;
        up.write_all(&body).await?;
        up.read_to_end(&mut answer).await?;
    }
    let landed = answer.starts_with(b"HTTP/1.1 2") || answer.starts_with(b"HTTP/1.0 2");
    // An aimed error lets a write that did not land (a retry finding its
    // object) through.
    let fault = match (conditional, fault) {
        (Some(Fault::Error), _) if !landed => None,
        (_, f) => f,
    };
    if fault.is_some() {
        s.failed.fetch_add(1, Ordering::AcqRel);
        s.landed.fetch_add(usize::from(landed), Ordering::AcqRel);
    }
    match fault {
        Some(Fault::Error) => down.write_all(&error_500()).await?,
        Some(Fault::Drop) => {}
        Some(Fault::Slow) | None => {
            if fault.is_some() {
                tokio::time::sleep(s.hold()).await;
            }
            let Some(end) = head_end(&answer) else {
                return Ok(());
            };
            let (head, _) = rewrite_head(&answer[..end]);
            down.write_all(&head).await?;
            down.write_all(&answer[end..]).await?;
        }
    }
    down.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_told_to_close_and_its_body_measured() {
        let (head, n) = rewrite_head(
            b"PUT /b/k HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 12\r\n\r\n",
        );
        assert_eq!(
            String::from_utf8_lossy(&head),
            "PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(n, Some(12));
        let (_, n) = rewrite_head(b"PUT /b/k HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(n, None);
        let (_, n) = rewrite_head(
            b"PUT /b/k HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        );
        assert_eq!(n, None, "chunked wins, whatever the order");
        let e = error_500();
        let end = head_end(&e).unwrap_or(0);
        let (_, n) = rewrite_head(&e[..end]);
        assert_eq!(n, Some(e.len() - end));
    }
}
