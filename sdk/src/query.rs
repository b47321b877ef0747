//! Reading tables from steps: the [`scan`] builder (filter, columns, a
//! stream of batches or all of them) and SQL over tables
//! ([`Ctx::sql`]), both at the snapshots the step pinned, both through
//! DataFusion over `orca-lake`'s pruned Iceberg scans.
//!
//! Every table a query names is checked against the step's `reads` before
//! anything is read, pinned like any scan (the same snapshot on every retry
//! and resume of the run) and recorded as read, so lineage sees it. Each
//! scan's plan (files read of the snapshot's files) goes to the attempt log.

use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::dataframe::DataFrame;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use orca_lake::query::{self as lake_query, PinnedTable, Reference, ScanLog};
use orca_lake::{Lake, LakeError, ScanStats};

use crate::ctx::{Ctx, LogSink};
use crate::error::{context, Result};
use crate::keys::{Day, Month, Name};
use crate::pins::pinned;
use orca_lake::Table;

/// Rows per batch a scan or query yields unless told otherwise.
pub const BATCH_ROWS: usize = 8192;

/// The step's query session, made on first use.
fn session<'s>(ctx: &'s mut Ctx<'_>) -> Result<&'s SessionContext> {
    if ctx.io.session.is_none() {
        ctx.io.session = Some(lake_query::session(BATCH_ROWS)?);
    }
    ctx.io
        .session
        .as_ref()
        .ok_or_else(|| "no query session".into())
}

/// The table pinned for this (run, step, partition), registered in the
/// step's session under its dataset name. A dataset the step does not read
/// is refused before anything is loaded.
fn register_pinned(ctx: &mut Ctx<'_>, dataset: &str) -> Result<()> {
    crate::pins::declared(ctx, dataset, true)?;
    let t = ctx.io.tables.get()?;
    let handle = orca_lake::table::load(t, dataset)?;
    let (fresh, snapshot) = pinned(ctx, &handle)?;
    let provider = PinnedTable::new(fresh, dataset, snapshot, ctx.io.scans.clone())?;
    lake_query::register(session(ctx)?, dataset, Arc::new(provider))?;
    Ok(())
}

/// A query over pinned tables, not yet run: collect it, stream it, append
/// it to a table, or go on with DataFusion's DataFrame API ([`Query::map`]).
pub struct Query<'a> {
    lake: &'a Lake,
    df: DataFrame,
    log: LogSink,
    tag: String,
    scans: ScanLog,
    place: Place,
}

/// Where a query runs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    /// On the cluster the runner names (`ORCA_BALLISTA_URL`), else here.
    Default,
    /// In the step's process.
    Local,
    /// On this Ballista scheduler (`df://host:port`).
    Ballista(String),
}

/// The Ballista scheduler the runner gives its steps' queries.
pub const BALLISTA_URL_ENV: &str = "ORCA_BALLISTA_URL";

impl<'a> Query<'a> {
    fn new(ctx: &Ctx<'a>, df: DataFrame) -> Result<Query<'a>> {
        Ok(Query {
            lake: ctx.io.tables.get()?,
            df,
            log: ctx.log.clone(),
            tag: ctx.tag(),
            scans: ctx.io.scans.clone(),
            place: Place::Default,
        })
    }

    /// Runs the query in the step's process, whatever cluster the runner
    /// names.
    pub fn local(self) -> Query<'a> {
        Query {
            place: Place::Local,
            ..self
        }
    }

    /// Runs the query on the Ballista cluster whose scheduler is at `url`
    /// (`df://host:port`), rather than the runner's (`ORCA_BALLISTA_URL`).
    /// The binary must be built with the SDK's `ballista` feature.
    pub fn on_ballista(self, url: &str) -> Query<'a> {
        Query {
            place: Place::Ballista(url.to_string()),
            ..self
        }
    }

    /// The cluster the query goes to, if any.
    pub(crate) fn cluster(&self) -> Result<Option<String>> {
        let from_env = || {
            std::env::var(BALLISTA_URL_ENV)
                .ok()
                .filter(|u| !u.trim().is_empty())
        };
        let (url, asked) = match &self.place {
            Place::Local => return Ok(None),
            Place::Ballista(u) => (u.clone(), true),
            Place::Default => match from_env() {
                Some(u) => (u, false),
                None => return Ok(None),
            },
        };
        if cfg!(feature = "ballista") {
            return Ok(Some(url));
        }
        let why = format!(
            "{} query: this pipeline binary is built without the SDK's `ballista` feature, so it cannot send its query to {url}",
            self.tag
        );
        if asked {
            return Err(
                format!("{why} (add features = [\"ballista\"] to its orca dependency)").into(),
            );
        }
        self.log
            .line(&format!("{why} ({BALLISTA_URL_ENV}): it runs in the step"));
        Ok(None)
    }

    pub(crate) fn into_parts(self) -> (&'a Lake, DataFrame, LogSink, String, ScanLog) {
        (self.lake, self.df, self.log, self.tag, self.scans)
    }

    /// The query as a DataFusion DataFrame, transformed by `f`: the tables
    /// stay the pinned ones.
    pub fn map(
        self,
        f: impl FnOnce(DataFrame) -> std::result::Result<DataFrame, DataFusionError>,
    ) -> Result<Query<'a>> {
        Ok(Query {
            df: f(self.df)?,
            ..self
        })
    }

    /// The DataFusion DataFrame itself.
    pub fn dataframe(self) -> DataFrame {
        self.df
    }

    /// Runs the query and streams its result, a batch at a time.
    pub fn stream(self) -> Result<Batches<'a>> {
        if let Some(url) = self.cluster()? {
            return self.stream_on(&url);
        }
        let stream = self
            .lake
            .rt
            .block_on(self.df.execute_stream())
            .map_err(context(format!("{} query", self.tag)))?;
        report(&self.log, &self.tag, &self.scans);
        Ok(Batches {
            lake: self.lake,
            stream,
            tag: self.tag,
        })
    }

    #[cfg(feature = "ballista")]
    fn stream_on(self, url: &str) -> Result<Batches<'a>> {
        let (lake, df, log, tag, scans) = self.into_parts();
        let stream = crate::ballista::stream(lake, df, url, &tag, BATCH_ROWS)?;
        report(&log, &tag, &scans);
        log.line(&format!(
            "{tag} query runs on the Ballista cluster at {url}"
        ));
        Ok(Batches { lake, stream, tag })
    }

    #[cfg(not(feature = "ballista"))]
    fn stream_on(self, url: &str) -> Result<Batches<'a>> {
        Err(format!("{}: no Ballista client for {url}", self.tag).into())
    }

    /// Runs the query and returns every batch of its result.
    pub fn collect(self) -> Result<Vec<RecordBatch>> {
        self.stream()?.collect()
    }
}

/// Logs the plans of the scans a query made since the last report.
pub(crate) fn report(log: &LogSink, tag: &str, scans: &Mutex<Vec<ScanStats>>) {
    let done: Vec<ScanStats> = scans
        .lock()
        .map(|mut s| s.drain(..).collect())
        .unwrap_or_default();
    for s in done {
        log.line(&format!("{tag} {s}"));
    }
}

/// A query's result as it is read: an iterator of batches. Memory holds
/// the batches in flight, never the whole table.
pub struct Batches<'a> {
    lake: &'a Lake,
    stream: SendableRecordBatchStream,
    tag: String,
}

impl Iterator for Batches<'_> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.lake
            .rt
            .block_on(self.stream.next())
            .map(|r| r.map_err(context(format!("{} reading", self.tag))))
    }
}

/// Rows to append: batches in memory, a query, or a scan's or query's
/// stream, read as they are written ([`crate::append`] takes any of them).
pub trait IntoBatches<'a>: Sized {
    fn into_batches(self) -> Result<BatchIter<'a>>;

    /// A query to run on a cluster, with the cluster's URL: what
    /// [`crate::write_files`] has the cluster's executors write. Anything
    /// else comes back as it was.
    fn on_cluster(self) -> Result<std::result::Result<(Query<'a>, String), Self>> {
        Ok(Err(self))
    }
}

/// Batches as [`IntoBatches`] hands them to a writer.
pub type BatchIter<'a> = Box<dyn Iterator<Item = orca_lake::Result<RecordBatch>> + 'a>;

impl<'a> IntoBatches<'a> for Vec<RecordBatch> {
    fn into_batches(self) -> Result<BatchIter<'a>> {
        Ok(Box::new(self.into_iter().map(Ok)))
    }
}

impl<'a> IntoBatches<'a> for RecordBatch {
    fn into_batches(self) -> Result<BatchIter<'a>> {
        Ok(Box::new(std::iter::once(Ok(self))))
    }
}

impl<'a> IntoBatches<'a> for Batches<'a> {
    fn into_batches(self) -> Result<BatchIter<'a>> {
        Ok(Box::new(self.map(|r| r.map_err(LakeError::Input))))
    }
}

impl<'a> IntoBatches<'a> for Query<'a> {
    fn into_batches(self) -> Result<BatchIter<'a>> {
        self.stream()?.into_batches()
    }

    fn on_cluster(self) -> Result<std::result::Result<(Query<'a>, String), Self>> {
        match self.cluster()? {
            Some(url) => Ok(Ok((self, url))),
            None => Ok(Err(self)),
        }
    }
}

/// A scan of a table at the snapshot pinned for this (run, step,
/// partition): [`crate::scan`] starts one.
pub struct Scan<'c, 'a> {
    ctx: &'c mut Ctx<'a>,
    dataset: String,
    filter: Option<Expr>,
    columns: Option<Vec<String>>,
}

impl<'c, 'a> Scan<'c, 'a> {
    pub(crate) fn new(ctx: &'c mut Ctx<'a>, table: &Table) -> Scan<'c, 'a> {
        Scan {
            ctx,
            dataset: table.dataset().to_string(),
            filter: None,
            columns: None,
        }
    }

    /// Keeps the rows `expr` holds for (`col("month").eq(lit("2013-05"))`).
    /// Pushed down: files whose partition values or column statistics rule
    /// it out are not read, nor such row groups. Filters given twice must
    /// both hold.
    pub fn filter(mut self, expr: Expr) -> Self {
        self.filter = Some(match self.filter.take() {
            Some(f) => f.and(expr),
            None => expr,
        });
        self
    }

    /// Reads these columns only, in this order.
    pub fn select<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.columns = Some(columns.into_iter().map(Into::into).collect());
        self
    }

    /// The scan as a query, for DataFusion's DataFrame API.
    pub fn query(self) -> Result<Query<'a>> {
        let Scan {
            ctx,
            dataset,
            filter,
            columns,
        } = self;
        register_pinned(ctx, &dataset)?;
        let (ns, name) = dataset.split_once('.').unwrap_or(("", &dataset));
        let reference = datafusion::common::TableReference::partial(ns, name);
        let s = session(ctx)?.clone();
        let mut frame = ctx
            .io
            .tables
            .get()?
            .rt
            .block_on(s.table(reference))
            .map_err(context(format!("scan of {dataset}")))?;
        if let Some(f) = filter {
            frame = frame
                .filter(f)
                .map_err(|e| format!("scan of {dataset}: filter: {e}"))?;
        }
        if let Some(c) = columns {
            let names: Vec<&str> = c.iter().map(String::as_str).collect();
            frame = frame
                .select_columns(&names)
                .map_err(|e| format!("scan of {dataset}: columns: {e}"))?;
        }
        Query::new(ctx, frame)
    }

    /// Reads the scan as a stream of batches.
    pub fn stream(self) -> Result<Batches<'a>> {
        self.query()?.stream()
    }

    /// Reads every row the scan keeps into memory: for small tables, or a
    /// partition's rows.
    pub fn collect(self) -> Result<Vec<RecordBatch>> {
        self.query()?.collect()
    }
}

impl<'a> Ctx<'a> {
    /// Runs DataFusion SQL over the lake's tables at this step's pinned
    /// snapshots: `ctx.sql("SELECT ... FROM lake.raw WHERE month = $1",
    /// [month])`. A table is named `namespace.table` and must be in the
    /// step's `reads`; `$1`, `$2`... take `params` in order. Bare names are
    /// tables registered in the step's session ([`Ctx::register_csv`]).
    /// Read-only: no DDL, no INSERT or COPY.
    pub fn sql(&mut self, query: &str, params: impl SqlParams) -> Result<Query<'a>> {
        let refs = lake_query::references(session(self)?, query)
            .map_err(context(format!("step {}", self.step)))?;
        for r in refs {
            match r {
                Reference::Dataset(d) => register_pinned(self, &d)?,
                Reference::Local(name) => {
                    if !session(self)?.table_exist(name.as_str()).unwrap_or(false) {
                        return Err(format!(
                            "step {} queries table {name}, which is neither namespace.table nor registered in the step (register_csv)",
                            self.step
                        )
                        .into());
                    }
                }
            }
        }
        let params = params.values();
        let options = datafusion::execution::context::SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let s = session(self)?.clone();
        let lake = self.io.tables.get()?;
        let df = lake
            .rt
            .block_on(s.sql_with_options(query, options))
            .and_then(|df| {
                if params.is_empty() {
                    Ok(df)
                } else {
                    df.with_param_values(params)
                }
            })
            .map_err(context(format!("step {} SQL", self.step)))?;
        Query::new(self, df)
    }

    /// Registers a CSV file (with a header line) as table `name` of the
    /// step's session, for [`Ctx::sql`]. Its rows are not a dataset and are
    /// not part of lineage.
    pub fn register_csv(&mut self, name: &str, path: &str) -> Result<()> {
        let s = session(self)?.clone();
        let lake = self.io.tables.get()?;
        lake.rt
            .block_on(s.register_csv(name, path, datafusion::prelude::CsvReadOptions::new()))
            .map_err(context(format!(
                "step {}: reading {path} as {name}",
                self.step
            )))
    }
}

/// The values of a query's `$1`, `$2`...: `()` for none, an array or a
/// vector of one type (`[month]`, `vec![a, b]`), or a vector of
/// [`ScalarValue`]s for several types (`vec![ScalarValue::from("EWR"),
/// ScalarValue::from(15i64)]`).
pub trait SqlParams {
    fn values(self) -> Vec<ScalarValue>;
}

impl SqlParams for () {
    fn values(self) -> Vec<ScalarValue> {
        Vec::new()
    }
}

impl<T: Into<ScalarValue>, const N: usize> SqlParams for [T; N] {
    fn values(self) -> Vec<ScalarValue> {
        self.into_iter().map(Into::into).collect()
    }
}

impl<T: Into<ScalarValue>> SqlParams for Vec<T> {
    fn values(self) -> Vec<ScalarValue> {
        self.into_iter().map(Into::into).collect()
    }
}

impl From<Month> for ScalarValue {
    fn from(m: Month) -> ScalarValue {
        ScalarValue::Utf8(Some(m.to_string()))
    }
}

impl From<Day> for ScalarValue {
    fn from(d: Day) -> ScalarValue {
        ScalarValue::Utf8(Some(d.to_string()))
    }
}

impl From<Name> for ScalarValue {
    fn from(n: Name) -> ScalarValue {
        ScalarValue::Utf8(Some(n.to_string()))
    }
}
