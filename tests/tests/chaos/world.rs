//! What one seed runs on: a private cluster (so that it can be crashed),
//! a database with the extension, two runners each behind its own fault
//! proxy, the probe pipeline's backfills and a continuous change stream
//! with a writer, and the faults sent to them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orca_tests::cluster::PrivateCluster;
use orca_tests::procs::{bin, processes_with_env, register, Runner};
use orca_tests::s3::S3Server;
use orca_tests::s3proxy::S3Proxy;
use orca_tests::*;
use serde_json::json;

use crate::disk::Disk;
use crate::events::{start_run, Events};
use crate::files::Drops;
use crate::proxy::Proxy;

/// The bucket of the store and the warehouse.
pub const BUCKET: &str = "chaos";

/// How long a lease lasts here: a runner cut off for longer loses its work.
pub const LEASE_SECONDS: u64 = 10;

pub struct World {
    pub cluster: PrivateCluster,
    pub db: TestDb,
    pub dir: PathBuf,
    /// Set in the environment of the runners (and so of their children):
    /// how this world's processes are told from other tests'.
    pub tag: String,
    pub runners: Vec<Option<Runner>>,
    pub proxies: Vec<Proxy>,
    /// The bucket the runners keep the syncs' store and the warehouse in,
    /// read by the checks directly, and the fault proxy they reach it by.
    pub s3: S3Server,
    pub s3_proxy: S3Proxy,
    /// The store's own disk, when the store is local.
    pub disk: Option<Disk>,
    /// The external connector's stream and its sync's runs.
    pub events: Events,
    /// The runs of the table sync into Parquet (`ledger`).
    pub ledger_runs: Vec<i64>,
    /// The files dropped for the files source's sync, and its runs.
    pub drops: Drops,
    writer: Option<(Arc<AtomicBool>, tokio::task::JoinHandle<u64>)>,
}

impl World {
    pub async fn start(seed: u64) -> World {
        let cluster = PrivateCluster::start(&[
            "wal_level = logical",
            "max_wal_senders = 20",
            "max_replication_slots = 20",
        ]);
        let db = TestDb::at(&cluster.url("postgres")).await;
        for sql in [
            format!(
                "ALTER DATABASE \"{}\" SET orca.lease_seconds = {LEASE_SECONDS}",
                db.name
            ),
            // Lost attempts are what the faults make; they are counted, not a budget here.
            format!(
                "ALTER DATABASE \"{}\" SET orca.lost_attempts_max = 1000",
                db.name
            ),
        ] {
            sqlx::raw_sql(&sql)
                .execute(&db.pool)
                .await
                .expect("a database setting");
        }
        let dir = scratch(&format!("chaos-{seed}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("chaos dir");
        register(&db, "probe");
        register(&db, "probe_tasks");
        register(&db, "probe_tables");
        let s3 = S3Server::start(BUCKET);
        let s3_proxy = S3Proxy::start(s3.port());
        // Even seeds keep the store on a small disk of its own (and the
        // warehouse beside it), odd ones in the bucket.
        let disk = if seed.is_multiple_of(2) {
            Disk::mount(&dir.join("disk"))
        } else {
            None
        };
        let tag = format!("{seed}-{}", uuid::Uuid::new_v4().simple());
        let events = Events::new(&dir, &tag);
        // Files beside the store on disk seeds, else in the bucket.
        let drops = Drops::new(disk.is_some().then(|| dir.join("in")));
        let mut w = World {
            cluster,
            db,
            dir,
            tag,
            runners: Vec::new(),
            proxies: Vec::new(),
            s3,
            s3_proxy,
            disk,
            events,
            ledger_runs: Vec::new(),
            drops,
            writer: None,
        };
        for i in 0..2 {
            w.proxies.push(Proxy::start(w.cluster.port).await);
            w.runners.push(None);
            w.start_runner(i);
        }
        w
    }

    fn runner_name(i: usize) -> String {
        format!("chaos-r{i}")
    }

    /// (Re)starts runner `i` behind its proxy.
    pub fn start_runner(&mut self, i: usize) {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.proxies[i].port, self.db.name
        );
        let engine = bin("orca-engine").to_string_lossy().into_owned();
        // The bucket as the runners (and the engines and binaries they
        // start) reach it: through the fault proxy.
        let through = format!("http://127.0.0.1:{}", self.s3_proxy.port);
        let mut env: Vec<(&str, String)> = self
            .s3
            .env()
            .into_iter()
            .map(|(k, v)| {
                if k == "AWS_ENDPOINT" {
                    (k, through.clone())
                } else {
                    (k, v)
                }
            })
            .collect();
        env.extend([
            ("ORCA_STORE", self.store()),
            (
                "ORCA_CONNECTORS",
                self.events.dir.to_string_lossy().into_owned(),
            ),
            ("ORCA_WAREHOUSE", self.warehouse()),
            ("ORCA_ENGINE", engine),
            ("PROBE_SLEEP_MS", "800".into()),
            ("PROBE_TASKS", crate::checks::TASKS.to_string()),
            ("PROBE_TASK_SLEEP_MS", "100".into()),
            ("ORCA_CHAOS_TAG", self.tag.clone()),
        ]);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let runner = Runner::start(&url, &Self::runner_name(i), 3, &self.dir.join("logs"), &env);
        self.runners[i] = Some(runner);
    }

    /// Where the syncs keep their checkpoints and staged epochs.
    pub fn store(&self) -> String {
        match &self.disk {
            Some(d) => d.mount.join("store").to_string_lossy().into_owned(),
            None => format!("s3://{BUCKET}/store"),
        }
    }

    /// Where the table sync writes its Parquet files: on the store's disk,
    /// or in the bucket.
    pub fn parquet(&self) -> String {
        match &self.disk {
            Some(d) => d.mount.join("out").to_string_lossy().into_owned(),
            None => format!("s3://{BUCKET}/out"),
        }
    }

    /// Where the Iceberg tables live, as the runners name it: beside a
    /// local store, not on its disk (a full store must not stop the
    /// catalog's commits of what was staged before).
    pub fn warehouse(&self) -> String {
        match &self.disk {
            Some(_) => self.dir.join("warehouse").to_string_lossy().into_owned(),
            None => format!("s3://{BUCKET}/warehouse"),
        }
    }

    pub fn output(&self) -> String {
        self.runners
            .iter()
            .flatten()
            .map(|r| format!("--- {}\n{}", r.name, tail(&r.output(), 60)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The processes of this world whose program name ends with `program`.
    pub fn processes(&self, program: &str) -> Vec<i32> {
        processes_with_env(program, &format!("ORCA_CHAOS_TAG={}", self.tag))
    }

    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sql)
            .execute(&self.db.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The source table, its trigger's log of every change, and the
    /// continuous syncs that merge it (into Postgres, with a change log, and
    /// into an Iceberg table), with no retries of their runs: every fault
    /// they survive must spend none. And the external connector's sync.
    pub async fn define_stream(&self) {
        self.exec(
            "CREATE TABLE public.orders (id bigint PRIMARY KEY, customer text NOT NULL,
                                         amount numeric(12,2), qty integer);
             ALTER TABLE public.orders REPLICA IDENTITY FULL;
             INSERT INTO public.orders
             SELECT g, 'c' || (g % 97), (g * 1.25)::numeric(12,2), (g % 7)::int
             FROM generate_series(1, 2000) g;
             CREATE TABLE public.audit (seq bigserial PRIMARY KEY, op text, id bigint,
                                        amount numeric(12,2));
             CREATE FUNCTION public.audit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF TG_OP = 'DELETE' THEN
                     INSERT INTO public.audit (op, id, amount) VALUES ('D', OLD.id, NULL);
                 ELSE
                     INSERT INTO public.audit (op, id, amount) VALUES (left(TG_OP, 1), NEW.id, NEW.amount);
                 END IF;
                 RETURN NULL;
             END $$;
             CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON public.orders
                 FOR EACH ROW EXECUTE FUNCTION public.audit();
             CREATE TABLE public.ledger (id bigint PRIMARY KEY, amount bigint NOT NULL,
                 updated_at timestamptz NOT NULL DEFAULT clock_timestamp());",
        )
        .await;
        sqlx::query(
            "SELECT orca.create_sync('live', $1, $2, $3, NULL, 'exactly_once', 'default', 0)",
        )
        .bind(
            json!({"type": "postgres_cdc", "url": self.db.url(), "continuous": true,
                     "epoch_seconds": 1}),
        )
        .bind(json!({"type": "postgres", "url": self.db.url(), "schema": "raw"}))
        .bind(json!([
            {"name": "orders", "table": "public.orders", "primary_key": ["id"], "mode": "merge"},
            {"name": "changes", "table": "public.orders", "primary_key": ["id"], "mode": "append"}
        ]))
        .execute(&self.db.pool)
        .await
        .expect("create_sync");
        // The same changes merged into an Iceberg table in the bucket, its
        // checkpoints and staged epochs in the bucket too.
        sqlx::query(
            "SELECT orca.create_sync('lake', $1, $2, $3, NULL, 'exactly_once', 'default', 0)",
        )
        .bind(
            json!({"type": "postgres_cdc", "url": self.db.url(), "continuous": true,
                     "epoch_seconds": 2}),
        )
        .bind(json!({"type": "iceberg", "namespace": "lake"}))
        .bind(json!([
            {"name": "orders", "table": "public.orders", "primary_key": ["id"], "mode": "merge"}
        ]))
        .execute(&self.db.pool)
        .await
        .expect("create_sync lake");
        self.events.define(&self.db).await;
        // A table read by its cursor into Parquet files beside the store,
        // at least once (what a table into Parquet can promise: a file
        // cannot skip rows it holds), the writer appending a row to it in
        // each transaction; its runs may be retried (a killed engine
        // spends one).
        sqlx::query(
            "SELECT orca.create_sync('ledger', $1, $2, $3, NULL, 'at_least_once', 'default', $4)",
        )
        .bind(json!({"type": "postgres", "url": self.db.url()}))
        .bind(json!({"type": "parquet", "url": self.parquet()}))
        .bind(
            json!([{"name": "ledger", "table": "public.ledger", "cursor": "updated_at",
                      "primary_key": ["id"]}]),
        )
        .bind(crate::events::RUN_RETRIES)
        .execute(&self.db.pool)
        .await
        .expect("create_sync ledger");
        self.drops.define(&self.db).await;
    }

    /// Drops a file for the files source, and starts a run of each batch
    /// sync that has none queued or running.
    pub async fn run_batches(&mut self) {
        tokio::task::block_in_place(|| self.drops.drop_file(&self.s3));
        self.events.runs.extend(start_run(&self.db, "events").await);
        self.ledger_runs.extend(start_run(&self.db, "ledger").await);
        self.drops.runs.extend(start_run(&self.db, "drops").await);
    }

    /// Starts writing transactions of an insert, an update and a delete.
    pub fn start_writer(&mut self, from: u64) {
        let stop = Arc::new(AtomicBool::new(false));
        let url = self.db.url();
        let s = stop.clone();
        let task = tokio::spawn(async move { writer(url, s, from).await });
        self.writer = Some((stop, task));
    }

    /// Stops the writer; returns the transactions it committed.
    pub async fn stop_writer(&mut self) -> u64 {
        match self.writer.take() {
            Some((stop, task)) => {
                stop.store(true, Ordering::Relaxed);
                task.await.expect("the writer")
            }
            None => 0,
        }
    }

    pub fn crash_postgres(&self) {
        self.cluster.crash_restart();
    }
}

fn tail(s: &str, lines: usize) -> String {
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Writes until `stop`, going on through a crash of the server (a
/// transaction cut by it committed wholly or not at all, its audit rows
/// with it). Returns how many transactions it tried.
async fn writer(url: String, stop: Arc<AtomicBool>, from: u64) -> u64 {
    let mut n: u64 = 0;
    let mut pool: Option<sqlx::PgPool> = None;
    while !stop.load(Ordering::Relaxed) {
        let p = match &pool {
            Some(p) => p.clone(),
            None => match sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(2))
                .connect(&url)
                .await
            {
                Ok(p) => {
                    pool = Some(p.clone());
                    p
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        n += 1;
        let id = 1_000_000 + from + n;
        let sql = format!(
            "BEGIN;
             INSERT INTO public.orders (id, customer, amount, qty) VALUES ({id}, 'w', {n}, 1);
             UPDATE public.orders SET amount = amount + 1, qty = qty + 1 WHERE id = {};
             DELETE FROM public.orders WHERE id = {};
             INSERT INTO public.ledger (id, amount) VALUES ({id}, {n});
             COMMIT;",
            1 + (n * 37) % 2000,
            if n.is_multiple_of(3) {
                id - 2
            } else {
                2000 + from + n
            }
        );
        if sqlx::raw_sql(&sql).execute(&p).await.is_err() {
            pool = None;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    n
}
