//! A table read's connection: `tokio_postgres` on a runtime of the reading
//! thread's own, so a COPY is taken a socket read at a time. The blocking
//! `postgres` client enters its runtime for every CopyData message, which
//! Postgres sends one per row: about 15 % of a read's time in profiles of
//! benches/sync. Here the rows one read of the socket brought are taken
//! without entering the runtime; it runs only when they are used up.

use std::cell::Cell;
use std::io::{self, BufRead, Read};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::{Stream, StreamExt};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;
use tokio_postgres::{CopyOutStream, Row};

use crate::netguard::{Guard, NetError};

/// How long a closing connection may take to tell the server goodbye.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// A connection to a source database, for one thread.
pub struct PgReader {
    rt: Runtime,
    client: Option<tokio_postgres::Client>,
    conn: Option<JoinHandle<()>>,
    /// The connection's own error, when it failed: the client only sees
    /// that it closed.
    failed: Arc<Mutex<Option<tokio_postgres::Error>>>,
    /// A COPY was left before its end: the connection would read the rest
    /// of it before it could say goodbye, so it is closed without one.
    abandoned: Cell<bool>,
}

impl PgReader {
    /// Connects to `url` as [`Guard::postgres`] does: the address netguard
    /// pinned, TLS as its `sslmode` says.
    pub fn connect(guard: &Guard, url: &str) -> Result<PgReader, NetError> {
        let p = guard.postgres_config(url)?;
        let refused = |source| NetError::Connect {
            url: orca_core::conninfo::redact(url),
            source,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(NetError::Runtime)?;
        let (client, connection) = rt.block_on(p.config.connect(p.tls)).map_err(refused)?;
        let failed = Arc::new(Mutex::new(None));
        let slot = failed.clone();
        let conn = rt.spawn(async move {
            if let Err(e) = connection.await {
                if let Ok(mut f) = slot.lock() {
                    *f = Some(e);
                }
            }
        });
        Ok(PgReader {
            rt,
            client: Some(client),
            conn: Some(conn),
            failed,
            abandoned: Cell::new(false),
        })
    }

    fn client(&self) -> &tokio_postgres::Client {
        match &self.client {
            Some(c) => c,
            None => unreachable!("a reader's client is taken only when it is dropped"),
        }
    }

    pub fn query_one(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        self.rt
            .block_on(self.client().query_one(sql, params))
            .map_err(|e| self.reason(e))
    }

    /// Starts `COPY ... TO STDOUT`; its data is read from what this returns.
    pub fn copy_out(&mut self, sql: &str) -> Result<CopyOut<'_>, tokio_postgres::Error> {
        let stream = self
            .rt
            .block_on(self.client().copy_out(sql))
            .map_err(|e| self.reason(e))?;
        Ok(CopyOut {
            reader: self,
            stream: Box::pin(stream),
            cur: Bytes::new(),
            ended: false,
        })
    }

    /// `e`, or the connection's own error when `e` only says it closed.
    fn reason(&self, e: tokio_postgres::Error) -> tokio_postgres::Error {
        if !e.is_closed() {
            return e;
        }
        let own = self.failed.lock().ok().and_then(|mut f| f.take());
        own.unwrap_or(e)
    }
}

impl Drop for PgReader {
    /// Closes the connection with a goodbye to the server (the connection
    /// sends it once its client is gone), waiting for it a little.
    fn drop(&mut self) {
        drop(self.client.take());
        if self.abandoned.get() {
            return;
        }
        if let Some(conn) = self.conn.take() {
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(CLOSE_WAIT, conn).await });
        }
    }
}

/// The data of a `COPY ... TO STDOUT`, read as a [`BufRead`].
pub struct CopyOut<'a> {
    reader: &'a PgReader,
    stream: Pin<Box<CopyOutStream>>,
    cur: Bytes,
    ended: bool,
}

impl Drop for CopyOut<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.reader.abandoned.set(true);
        }
    }
}

impl CopyOut<'_> {
    /// The next message of the COPY: taken without the runtime when the
    /// connection already received it, else waited for on the runtime
    /// (which reads the socket meanwhile).
    fn next_message(&mut self) -> Option<Result<Bytes, tokio_postgres::Error>> {
        let mut cx = Context::from_waker(Waker::noop());
        match self.stream.as_mut().poll_next(&mut cx) {
            Poll::Ready(next) => next,
            Poll::Pending => self.reader.rt.block_on(self.stream.next()),
        }
    }
}

impl BufRead for CopyOut<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while !self.cur.has_remaining() && !self.ended {
            match self.next_message() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => {
                    self.ended = true;
                    return Err(io::Error::other(self.reader.reason(e)));
                }
                None => {
                    self.ended = true;
                    break;
                }
            }
        }
        Ok(&self.cur)
    }

    fn consume(&mut self, amt: usize) {
        self.cur.advance(amt.min(self.cur.len()));
    }
}

impl Read for CopyOut<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = {
            let have = self.fill_buf()?;
            let n = have.len().min(buf.len());
            buf[..n].copy_from_slice(&have[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netguard::Scope;

    fn guard(allow: &[&str]) -> Guard {
        Guard::new(&Scope {
            org: "acme".into(),
            allowlist: Some(allow.iter().map(|s| s.to_string()).collect()),
            store: Some("/nonexistent/store".into()),
            warehouse: None,
        })
        .expect("guard")
    }

    /// The reader's connection goes through netguard as the blocking
    /// client's does: refused before anything is sent.
    #[test]
    fn a_reader_connects_only_where_netguard_allows() {
        let g = guard(&[]);
        for (url, refused) in [
            ("postgres://app@127.0.0.1:1/shop", "127.0.0.1"),
            (
                "host=metadata hostaddr=169.254.169.254 dbname=x",
                "169.254.169.254",
            ),
        ] {
            match PgReader::connect(&g, url) {
                Err(e @ NetError::Refused(_)) => {
                    assert!(e.to_string().contains(refused), "{url}: {e}")
                }
                Err(e) => panic!("{url}: refused for another reason: {e}"),
                Ok(_) => panic!("{url}: connected"),
            }
        }
        assert!(matches!(
            PgReader::connect(&g, "host=/var/run/postgresql dbname=x"),
            Err(NetError::PathRefused(_))
        ));
        // Allowed: the check passes and the connect itself fails (nothing
        // listens on port 1), named with the URL, its password hidden.
        let g = guard(&["127.0.0.1"]);
        match PgReader::connect(
            &g,
            "postgres://app:s3cret@127.0.0.1:1/shop?connect_timeout=2",
        ) {
            Err(e @ NetError::Connect { .. }) => {
                let text = e.to_string();
                assert!(text.contains("127.0.0.1:1"), "{text}");
                assert!(!text.contains("s3cret"), "{text}");
            }
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("connected to port 1"),
        }
    }
}
