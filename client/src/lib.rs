//! The control plane's SQL API as typed calls, for the processes a runner
//! starts: pipeline binaries (through the SDK) and `orca-engine`.
//!
//! A [`Control`] is one connection that survives a restart of the server:
//! a call that fails because the server went away (a restart, a failover, a
//! dropped connection) reconnects, sets the session's org again and tries
//! once more, with backoff, for up to [`Control::retry_for`]. Every call here
//! is safe to repeat: the SQL functions either change nothing the second
//! time (`pin_read`, `record_commit`, `report_snapshots`, `advance_head` and
//! `rewind_head` with the same arguments) or only count once more (a step's
//! `running` report whose answer was lost). Answers are read into the types
//! of [`orca_core::api`]; a malformed one is an error naming the field.

use std::time::{Duration, Instant};

use orca_core::api::{
    self, AttemptContext, ClaimedSync, Epoch, Generation, KeysContext, KeysReport, LeaseToken,
    SenseContext, SnapshotSeen,
};
use orca_core::sqlstate::{self, SqlState};
use postgres::types::ToSql;
use postgres::{Client, Row};
use serde_json::Value;

pub mod cloud_secrets;
pub mod discover;
pub mod tls;

/// How long a call keeps trying while the server is unreachable: longer than
/// a restart takes, shorter than a lease (30 s by default), so that a binary
/// whose control plane is gone for good gives up while its attempt is still
/// its own.
pub const RETRY_FOR_DEFAULT: Duration = Duration::from_secs(25);
/// The first wait before trying again; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error: the SQLSTATE says which.
    #[error("{what}: {}", refusal(source))]
    Refused {
        what: &'static str,
        #[source]
        source: postgres::Error,
    },
    /// The server could not be reached for the whole retry window.
    #[error("{what}: the control plane was unreachable for {waited:?}: {last}")]
    Unreachable {
        what: &'static str,
        waited: Duration,
        last: postgres::Error,
    },
    #[error(transparent)]
    Malformed(#[from] api::Malformed),
    /// The connection string's TLS settings cannot be honoured.
    #[error(transparent)]
    Tls(tls::TlsError),
    /// Not a channel name of the control plane's.
    #[error("{0:?} is not a notification channel (lowercase letters and '_')")]
    BadChannel(&'static str),
}

/// A server error as its message and SQLSTATE (the driver's own text is
/// only "db error").
fn refusal(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => e.to_string(),
    }
}

impl ClientError {
    /// The SQLSTATE of a refusal (`OR012`, `42501`, ...).
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Refused { source, .. } => source.code().map(|c| c.code()),
            _ => None,
        }
    }

    /// Whether the refusal is this state.
    pub fn is(&self, state: SqlState) -> bool {
        self.code().is_some_and(|c| state.is(c))
    }

    /// Whether the refusal takes the lease away: the attempt must stop.
    pub fn lease_gone(&self) -> bool {
        self.code().is_some_and(sqlstate::lease_gone)
    }

    /// The server's message, without the driver's prefix.
    pub fn message(&self) -> String {
        match self {
            ClientError::Refused { source, .. } => source
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| source.to_string()),
            other => other.to_string(),
        }
    }
}

/// Whether an error means the connection, not the call, failed: the server
/// is restarting or shutting down, or the socket broke.
pub fn is_transient(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(c) = e.code() {
        // Class 08: connection exception; 57P01-03: the server shut down or
        // restarts (admin_shutdown, crash_shutdown, cannot_connect_now).
        return c.code().starts_with("08") || matches!(c.code(), "57P01" | "57P02" | "57P03");
    }
    // The driver's own I/O: a refused connection while the server is down,
    // a reset socket. (A value that does not convert is not transient.)
    std::error::Error::source(e).is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some())
}

/// Whether the server rolled the call back for a conflict with another
/// transaction (a deadlock, a serialization failure): nothing of it was
/// done, and the same call may be made again. An upgrade of the extension
/// (ALTER EXTENSION orca UPDATE, which alters tables) with work in flight
/// can cause one.
pub fn is_conflict(e: &postgres::Error) -> bool {
    e.code()
        .is_some_and(|c| matches!(c.code(), "40P01" | "40001"))
}

/// One connection to the control plane, in one org.
pub struct Control {
    /// The connection string read once: its config and TLS connector.
    config: postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    org: Option<String>,
    client: Option<Client>,
    retry_for: Duration,
    /// Channels this connection LISTENs on, listened to again after a
    /// reconnect.
    listening: Vec<&'static str>,
}

impl Control {
    /// Connects (retrying while the server is unreachable) and sets the
    /// session's org.
    pub fn connect(url: &str, org: Option<&str>) -> Result<Control, ClientError> {
        let p = tls::prepare(url).map_err(ClientError::Tls)?;
        let mut c = Control {
            config: p.config,
            tls: p.tls,
            org: org.map(str::to_string),
            client: None,
            retry_for: RETRY_FOR_DEFAULT,
            listening: Vec::new(),
        };
        c.with_retry("connecting to the control plane", |_| Ok(()))?;
        Ok(c)
    }

    /// The org this connection acts in.
    pub fn org(&self) -> &str {
        self.org.as_deref().unwrap_or("default")
    }

    /// How long calls keep trying while the server is unreachable.
    pub fn retry_for(mut self, d: Duration) -> Control {
        self.retry_for = d;
        self
    }

    fn open(&self) -> Result<Client, postgres::Error> {
        let mut client = self.config.connect(self.tls.clone())?;
        if let Some(org) = &self.org {
            client.execute("SELECT set_config('orca.org', $1, false)", &[org])?;
        }
        for channel in &self.listening {
            client.batch_execute(&format!("LISTEN {channel}"))?;
        }
        Ok(client)
    }

    /// Runs `f` on a live connection; on a transient failure reconnects and
    /// runs it again, with backoff, until `retry_for` has passed.
    fn with_retry<T>(
        &mut self,
        what: &'static str,
        mut f: impl FnMut(&mut Client) -> Result<T, postgres::Error>,
    ) -> Result<T, ClientError> {
        let t0 = Instant::now();
        let mut wait = BACKOFF_FIRST;
        let mut lost: Option<String> = None;
        loop {
            let attempt = match self.client.as_mut() {
                Some(c) => f(c),
                None => self.open().and_then(|mut c| {
                    let r = f(&mut c);
                    self.client = Some(c);
                    r
                }),
            };
            match attempt {
                Ok(v) => {
                    if let Some(first) = lost {
                        // Said where the attempt's log shows it: the call
                        // went on, and why it took longer.
                        eprintln!(
                            "orca: {what}: the control plane was unreachable for {:?} ({first}); \
                             went on on a new connection",
                            t0.elapsed()
                        );
                    }
                    return Ok(v);
                }
                Err(e) if is_transient(&e) => {
                    lost.get_or_insert_with(|| e.to_string());
                    self.client = None;
                    if t0.elapsed() >= self.retry_for {
                        return Err(ClientError::Unreachable {
                            what,
                            waited: t0.elapsed(),
                            last: e,
                        });
                    }
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(BACKOFF_MAX);
                }
                Err(e) if is_conflict(&e) && t0.elapsed() < self.retry_for => {
                    eprintln!("orca: {what}: rolled back by the server ({e}); trying it again");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(BACKOFF_MAX);
                }
                Err(source) => return Err(ClientError::Refused { what, source }),
            }
        }
    }

    /// Waits up to `timeout` for a notification on `channel` (one of the
    /// control plane's, such as `orca_task_results`), LISTENing on it from
    /// the first call; whether one came. A connection lost while waiting is
    /// not an error: the next call reconnects and listens again.
    pub fn wait_for(
        &mut self,
        channel: &'static str,
        timeout: Duration,
    ) -> Result<bool, ClientError> {
        if !channel.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return Err(ClientError::BadChannel(channel));
        }
        if !self.listening.contains(&channel) {
            let sql = format!("LISTEN {channel}");
            self.with_retry("LISTEN", |c| c.batch_execute(&sql))?;
            self.listening.push(channel);
        }
        let Some(c) = self.client.as_mut() else {
            std::thread::sleep(timeout);
            return Ok(false);
        };
        use postgres::fallible_iterator::FallibleIterator;
        let got = {
            let mut notes = c.notifications();
            let mut waiting = notes.timeout_iter(timeout);
            waiting.next().map(|n| n.is_some())
        };
        match got {
            Ok(came) => Ok(came),
            Err(e) if is_transient(&e) => {
                self.client = None;
                Ok(false)
            }
            Err(source) => Err(ClientError::Refused {
                what: "waiting for a notification",
                source,
            }),
        }
    }

    /// One row of a statement, retried as [`Control`] says.
    pub fn query_one(
        &mut self,
        what: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, ClientError> {
        self.with_retry(what, |c| c.query_one(sql, params))
    }

    /// A statement whose rows do not matter, retried as [`Control`] says.
    pub fn execute(
        &mut self,
        what: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), ClientError> {
        self.with_retry(what, |c| c.execute(sql, params).map(|_| ()))
    }

    fn json(
        &mut self,
        what: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Value, ClientError> {
        self.with_retry(what, |c| c.query_one(sql, params)?.try_get::<_, Value>(0))
    }

    /// `orca.attempt_context`: the run, its partitions and every (step,
    /// partition) state; records the binary's build on the attempt.
    pub fn attempt_context(
        &mut self,
        lease: LeaseToken,
        build: &Value,
    ) -> Result<AttemptContext, ClientError> {
        const WHAT: &str = "orca.attempt_context";
        let v = self.json(
            WHAT,
            "SELECT orca.attempt_context($1, $2)",
            &[&lease.0, build],
        )?;
        Ok(api::from_json(WHAT, v)?)
    }

    /// `orca.report_step`; returns the pair's attempt count.
    #[allow(clippy::too_many_arguments)]
    pub fn report_step(
        &mut self,
        lease: LeaseToken,
        step: &str,
        partition: &str,
        status: api::StepStatus,
        error: Option<&str>,
        output: Option<&Value>,
        code: Option<&str>,
        input_hash: Option<&str>,
    ) -> Result<u32, ClientError> {
        let status = status.name();
        let error = error.map(|e| api::clip(e, api::ERROR_TEXT_MAX));
        let error = error.as_deref();
        let n: i32 = self.with_retry("orca.report_step", |c| {
            c.query_one(
                "SELECT orca.report_step($1, $2, $3, $4, $5, $6, $7, $8)",
                &[
                    &lease.0,
                    &step,
                    &partition,
                    &status,
                    &error,
                    &output,
                    &code,
                    &input_hash,
                ],
            )?
            .try_get(0)
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// `orca.pin_read`: the snapshot the (step, partition) reads, pinned on
    /// its first read.
    pub fn pin_read(
        &mut self,
        lease: LeaseToken,
        step: &str,
        partition: &str,
        dataset: &str,
        current: Option<i64>,
    ) -> Result<Option<i64>, ClientError> {
        self.with_retry("orca.pin_read", |c| {
            c.query_one(
                "SELECT orca.pin_read($1, $2, $3, $4, $5)",
                &[&lease.0, &step, &partition, &dataset, &current],
            )?
            .try_get(0)
        })
    }

    /// `orca.attempt_state`: `running`, `paused`, `cancelled` or `ended`.
    pub fn attempt_state(&mut self, lease: LeaseToken) -> Result<String, ClientError> {
        self.with_retry("orca.attempt_state", |c| {
            c.query_one("SELECT orca.attempt_state($1)", &[&lease.0])?
                .try_get(0)
        })
    }

    /// `orca.resume_point`: where a (step, partition) resumes, if anywhere.
    pub fn resume_point(
        &mut self,
        lease: LeaseToken,
        step: &str,
        partition: &str,
    ) -> Result<Option<String>, ClientError> {
        self.with_retry("orca.resume_point", |c| {
            c.query_one(
                "SELECT orca.resume_point($1, $2, $3)",
                &[&lease.0, &step, &partition],
            )?
            .try_get(0)
        })
    }

    /// `orca.record_resume_point` (`None` forgets it); false when a later
    /// attempt recorded one since.
    pub fn record_resume_point(
        &mut self,
        lease: LeaseToken,
        step: &str,
        partition: &str,
        location: Option<&str>,
    ) -> Result<bool, ClientError> {
        self.with_retry("orca.record_resume_point", |c| {
            c.query_one(
                "SELECT orca.record_resume_point($1, $2, $3, $4)",
                &[&lease.0, &step, &partition, &location],
            )?
            .try_get(0)
        })
    }

    /// `orca.record_commit`.
    #[allow(clippy::too_many_arguments)]
    pub fn record_commit(
        &mut self,
        lease: LeaseToken,
        step: &str,
        partition: &str,
        dataset: &str,
        snapshot: i64,
        commit_no: u32,
        operation: &str,
    ) -> Result<(), ClientError> {
        let n = i32::try_from(commit_no).unwrap_or(i32::MAX);
        self.execute(
            "orca.record_commit",
            "SELECT orca.record_commit($1, $2, $3, $4, $5, $6, $7)",
            &[
                &lease.0, &step, &partition, &dataset, &snapshot, &n, &operation,
            ],
        )
    }

    /// `orca.add_tasks`: a batch of tasks of a (step, partition), numbered
    /// from `first_index`; returns how many were new (a resumed driver's
    /// earlier ones are not).
    pub fn add_tasks(
        &mut self,
        lease: LeaseToken,
        step: &str,
        partition: &str,
        task: &str,
        first_index: u32,
        inputs: &Value,
    ) -> Result<u32, ClientError> {
        let first = i32::try_from(first_index).unwrap_or(i32::MAX);
        let n: i32 = self.with_retry("orca.add_tasks", |c| {
            c.query_one(
                "SELECT orca.add_tasks($1, $2, $3, $4, $5, $6)",
                &[&lease.0, &step, &partition, &task, &first, inputs],
            )?
            .try_get(0)
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// `orca.task_results`: the tasks of a (step, partition) that ended for
    /// good in batches finished after `after`.
    pub fn task_results(
        &mut self,
        lease: LeaseToken,
        step: &str,
        partition: &str,
        after: i64,
    ) -> Result<Vec<orca_core::tasks::TaskResult>, ClientError> {
        let rows = self.with_retry("orca.task_results", |c| {
            c.query(
                "SELECT index, ok, output, error, try, seq FROM orca.task_results($1, $2, $3, $4)",
                &[&lease.0, &step, &partition, &after],
            )
        })?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let read = |e: postgres::Error| ClientError::Refused {
                what: "orca.task_results",
                source: e,
            };
            let index: i32 = r.try_get(0).map_err(read)?;
            let ok: bool = r.try_get(1).map_err(read)?;
            let output: Option<Value> = r.try_get(2).map_err(read)?;
            let error: Option<String> = r.try_get(3).map_err(read)?;
            let tries: i32 = r.try_get(4).map_err(read)?;
            let seq: i64 = r.try_get(5).map_err(read)?;
            out.push(orca_core::tasks::TaskResult {
                index: u32::try_from(index).unwrap_or(0),
                outcome: if ok {
                    Ok(output.unwrap_or(Value::Null))
                } else {
                    Err(error.unwrap_or_else(|| "the task failed without a message".into()))
                },
                tries: u32::try_from(tries).unwrap_or(0),
                seq,
            });
        }
        Ok(out)
    }

    /// `orca.sense_context`: what a sensor's poll looks at.
    pub fn sense_context(&mut self, lease: LeaseToken) -> Result<SenseContext, ClientError> {
        const WHAT: &str = "orca.sense_context";
        let v = self.json(WHAT, "SELECT orca.sense_context($1)", &[&lease.0])?;
        Ok(api::from_json(WHAT, v)?)
    }

    /// `orca.report_snapshots`; returns how many runs it started.
    pub fn report_snapshots(
        &mut self,
        lease: LeaseToken,
        seen: &[SnapshotSeen],
    ) -> Result<i32, ClientError> {
        let list = serde_json::to_value(seen).unwrap_or(Value::Null);
        self.with_retry("orca.report_snapshots", |c| {
            c.query_one("SELECT orca.report_snapshots($1, $2)", &[&lease.0, &list])?
                .try_get(0)
        })
    }

    /// `orca.keys_context`: what a keys task reads and does.
    pub fn keys_context(&mut self, lease: LeaseToken) -> Result<KeysContext, ClientError> {
        const WHAT: &str = "orca.keys_context";
        let v = self.json(WHAT, "SELECT orca.keys_context($1)", &[&lease.0])?;
        Ok(api::from_json(WHAT, v)?)
    }

    /// `orca.report_keys`: the keys of the snapshot a keys task read.
    pub fn report_keys(
        &mut self,
        lease: LeaseToken,
        snapshot: Option<i64>,
        snapshot_ms: Option<i64>,
        keys: &[String],
    ) -> Result<KeysReport, ClientError> {
        const WHAT: &str = "orca.report_keys";
        let v = self.json(
            WHAT,
            "SELECT orca.report_keys($1, $2, $3, $4)",
            &[&lease.0, &snapshot, &snapshot_ms, &keys],
        )?;
        Ok(api::from_json(WHAT, v)?)
    }

    /// `orca.claim_sync`: a new generation, which fences every older attempt.
    pub fn claim_sync(
        &mut self,
        sync: &str,
        lease: Option<LeaseToken>,
    ) -> Result<ClaimedSync, ClientError> {
        const WHAT: &str = "orca.claim_sync";
        let lease = lease.map(|l| l.0);
        let v = self.json(WHAT, "SELECT orca.claim_sync($1, $2)", &[&sync, &lease])?;
        Ok(api::from_json(WHAT, v)?)
    }

    /// `orca.advance_head`: the commit point of an epoch, under the lease of
    /// the sync's run (required by 0.2.0 except for admins).
    pub fn advance_head(
        &mut self,
        sync: &str,
        generation: Generation,
        epoch: Epoch,
        record: &str,
        lease: Option<LeaseToken>,
    ) -> Result<(), ClientError> {
        let lease = lease.map(|l| l.0);
        let r = self.execute(
            "orca.advance_head",
            "SELECT orca.advance_head($1, $2, $3, $4, $5)",
            &[&sync, &generation.0, &epoch.sql(), &record, &lease],
        );
        match r {
            Err(e) if e.code() == Some(UNDEFINED_FUNCTION) => self.execute(
                "orca.advance_head",
                "SELECT orca.advance_head($1, $2, $3, $4)",
                &[&sync, &generation.0, &epoch.sql(), &record],
            ),
            other => other,
        }
    }

    /// `orca.record_epoch`: what a committed epoch moved, for the API and the
    /// console. A control plane older than this (no such function) is not
    /// an error: the checkpoint record holds the same figures.
    pub fn record_epoch(
        &mut self,
        sync: &str,
        generation: Generation,
        epoch: Epoch,
        stats: &Value,
        lease: Option<LeaseToken>,
    ) -> Result<(), ClientError> {
        let lease = lease.map(|l| l.0);
        match self.execute(
            "orca.record_epoch",
            "SELECT orca.record_epoch($1, $2, $3, $4, $5)",
            &[&sync, &generation.0, &epoch.sql(), stats, &lease],
        ) {
            Err(e) if e.code() == Some(UNDEFINED_FUNCTION) => Ok(()),
            other => other,
        }
    }

    /// `orca.rewind_head`: back to the epoch before a lost one.
    pub fn rewind_head(
        &mut self,
        sync: &str,
        generation: Generation,
        epoch: Epoch,
        record: Option<&str>,
        lease: Option<LeaseToken>,
    ) -> Result<(), ClientError> {
        let lease = lease.map(|l| l.0);
        let r = self.execute(
            "orca.rewind_head",
            "SELECT orca.rewind_head($1, $2, $3, $4, $5)",
            &[&sync, &generation.0, &epoch.sql(), &record, &lease],
        );
        match r {
            Err(e) if e.code() == Some(UNDEFINED_FUNCTION) => self.execute(
                "orca.rewind_head",
                "SELECT orca.rewind_head($1, $2, $3, $4)",
                &[&sync, &generation.0, &epoch.sql(), &record],
            ),
            other => other,
        }
    }
}

impl Control {
    /// `orca.maintenance_task`: what a maintenance run's attempt does, under
    /// its lease.
    pub fn maintenance_task(
        &mut self,
        lease: LeaseToken,
    ) -> Result<api::MaintenanceTask, ClientError> {
        const WHAT: &str = "orca.maintenance_task";
        let v = self.json(WHAT, "SELECT orca.maintenance_task($1)", &[&lease.0])?;
        Ok(api::from_json(WHAT, v)?)
    }

    /// `orca.report_maintenance`: what a maintenance attempt did.
    pub fn report_maintenance(
        &mut self,
        lease: LeaseToken,
        report: &Value,
    ) -> Result<(), ClientError> {
        self.with_retry("orca.report_maintenance", |c| {
            c.execute(
                "SELECT orca.report_maintenance($1, $2)",
                &[&lease.0, report],
            )
            .map(|_| ())
        })
    }

    /// `orca.discovery`: what a discovery task reads, under its lease.
    pub fn discovery(&mut self, lease: LeaseToken) -> Result<api::Discovery, ClientError> {
        const WHAT: &str = "orca.discovery";
        let v = self.json(WHAT, "SELECT orca.discovery($1)", &[&lease.0])?;
        Ok(api::from_json(WHAT, v)?)
    }

    /// `orca.store_catalog`: a discovery task's result; returns the
    /// catalog's version (a new one only when the catalog changed).
    pub fn store_catalog(
        &mut self,
        lease: LeaseToken,
        catalog: &Value,
    ) -> Result<i32, ClientError> {
        self.with_retry("orca.store_catalog", |c| {
            c.query_one("SELECT orca.store_catalog($1, $2)", &[&lease.0, catalog])?
                .try_get::<_, i32>(0)
        })
    }

    /// `orca.report_drift`: what an attempt found changed in its source
    /// since the catalog its streams were planned from (empty: nothing).
    pub fn report_drift(
        &mut self,
        sync: &str,
        generation: Generation,
        drift: &Value,
        lease: Option<LeaseToken>,
    ) -> Result<(), ClientError> {
        let lease = lease.map(|l| l.0);
        self.execute(
            "orca.report_drift",
            "SELECT orca.report_drift($1, $2, $3, $4)",
            &[&sync, &generation.0, drift, &lease],
        )
    }

    /// `orca.sync_lanes`: the writer lanes the sync's definition asks for
    /// now (None: the destination names none), for a continuous attempt
    /// that follows a scaling between epochs.
    pub fn sync_lanes(
        &mut self,
        sync: &str,
        generation: Generation,
        lease: Option<LeaseToken>,
    ) -> Result<Option<i32>, ClientError> {
        let lease = lease.map(|l| l.0);
        self.with_retry("orca.sync_lanes", |c| {
            c.query_one(
                "SELECT orca.sync_lanes($1, $2, $3)",
                &[&sync, &generation.0, &lease],
            )?
            .try_get::<_, Option<i32>>(0)
        })
    }

    /// `orca.attempt_secret`: a secret's value, under the attempt's lease.
    pub fn attempt_secret(
        &mut self,
        lease: Option<LeaseToken>,
        name: &str,
    ) -> Result<String, ClientError> {
        let lease = lease.map(|l| l.0);
        self.with_retry("orca.attempt_secret", |c| {
            c.query_one("SELECT orca.attempt_secret($1, $2)", &[&lease, &name])?
                .try_get::<_, String>(0)
        })
    }
}

/// Resolves the secrets a definition references: Orca's own through
/// `orca.attempt_secret` under the attempt's lease; a cloud secret
/// manager's with the runner's identity, under the org's prefix
/// ([`cloud_secrets`]).
pub struct Secrets<'a> {
    control: &'a mut Control,
    lease: Option<LeaseToken>,
}

impl<'a> Secrets<'a> {
    pub fn new(control: &'a mut Control, lease: Option<LeaseToken>) -> Self {
        Secrets { control, lease }
    }
}

impl orca_core::secret::Resolver for Secrets<'_> {
    fn resolve(
        &mut self,
        provider: &orca_core::secret::Provider,
    ) -> Result<String, orca_core::secret::SecretError> {
        match provider {
            orca_core::secret::Provider::Local { name } => self
                .control
                .attempt_secret(self.lease, name)
                .map_err(|e| orca_core::secret::SecretError::Resolve {
                    name: name.clone(),
                    reason: e.to_string(),
                }),
            orca_core::secret::Provider::AwsSecretsManager { id } => {
                cloud_secrets::aws_sm::read(id, self.control.org()).map_err(|reason| {
                    orca_core::secret::SecretError::Resolve {
                        name: format!("aws-sm://{id}"),
                        reason,
                    }
                })
            }
            orca_core::secret::Provider::GcpSecretManager { name, key } => {
                cloud_secrets::gcp_sm::read(name, key.as_deref(), self.control.org()).map_err(
                    |reason| orca_core::secret::SecretError::Resolve {
                        name: format!("gcp-sm://{name}"),
                        reason,
                    },
                )
            }
            orca_core::secret::Provider::AzureKeyVault { vault, name, key } => {
                cloud_secrets::azure_kv::read(vault, name, key.as_deref(), self.control.org())
                    .map_err(|reason| orca_core::secret::SecretError::Resolve {
                        name: format!("azure-kv://{vault}/{name}"),
                        reason,
                    })
            }
        }
    }
}

/// PostgreSQL's SQLSTATE for a call no function matches: a control plane
/// older than the call (0.1.0 has HEAD calls without the lease).
const UNDEFINED_FUNCTION: &str = "42883";
