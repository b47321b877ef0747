//! A table handle and what can be done with one: create or load it, list a
//! snapshot's files, commit (append, or
//! a commit that removes files), and find a commit by its summary
//! properties.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::Schema as ArrowSchema;
use iceberg::spec::{DataFile, Operation};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, TableCreation, TableIdent};

use crate::catalog::{ident, Lake};
use crate::rewrite;
use crate::spec::{describe_partitioning, TableSpec};
use crate::{LakeError, Result};

pub use crate::writer::{fit, write_data_files};

/// A table, known by its dataset name.
pub struct Table {
    dataset: String,
    pub ident: TableIdent,
    pub inner: iceberg::table::Table,
}

impl Table {
    pub fn new(dataset: &str, ident: TableIdent, inner: iceberg::table::Table) -> Table {
        Table {
            dataset: dataset.to_string(),
            ident,
            inner,
        }
    }

    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    /// The table's current snapshot when it was loaded.
    pub fn current_snapshot(&self) -> Option<i64> {
        self.inner
            .metadata()
            .current_snapshot()
            .map(|s| s.snapshot_id())
    }

    /// Where its data and metadata live.
    pub fn location(&self) -> &str {
        self.inner.metadata().location()
    }

    /// Its partitioning as a person reads it: `identity(month)`,
    /// `month(at)`, or `unpartitioned`.
    pub fn partitioning(&self) -> String {
        let m = self.inner.metadata();
        describe_partitioning(m.default_partition_spec(), m.current_schema())
    }

    /// Its schema, as Arrow sees it.
    pub fn arrow_schema(&self) -> Result<Arc<ArrowSchema>> {
        Ok(Arc::new(
            iceberg::arrow::schema_to_arrow_schema(self.inner.metadata().current_schema())
                .map_err(LakeError::iceberg(format!(
                    "the schema of {}",
                    self.dataset
                )))?,
        ))
    }
}

/// How a commit that lost the catalog's compare-and-swap waits before it
/// tries again, set on the tables Orca creates (every Iceberg writer reads
/// them from the table). Iceberg's defaults (100 ms first, 4 tries) suit
/// rare conflicts; a backfill's steps append to one table side by side and
/// lose the swap to each other routinely, each loss then costing more than
/// a month's aggregation. Starting at 10 ms and doubling, ten tries wait
/// ten seconds in all.
const COMMIT_RETRY: [(&str, &str); 2] = [
    ("commit.retry.min-wait-ms", "10"),
    ("commit.retry.num-retries", "10"),
];

/// Loads the table of a dataset as it is now.
pub fn load(t: &Lake, dataset: &str) -> Result<Table> {
    let id = ident(dataset)?;
    let inner = t.load(&id)?;
    Ok(Table::new(dataset, id, inner))
}

/// Loads a table, creating it (and its namespace) with this spec if it does
/// not exist: its columns, partitioning ([`Partitioning::Auto`](crate::spec::Partitioning::Auto) is
/// unpartitioned here) and sort order. An existing table must have the
/// columns; it keeps the partitioning and sort order it has.
pub fn create_or_load(t: &Lake, dataset: &str, spec: impl Into<TableSpec>) -> Result<Table> {
    let spec: TableSpec = spec.into();
    let schema = spec.schema.as_ref();
    let id = ident(dataset)?;
    let ice = iceberg::arrow::arrow_schema_to_schema_auto_assign_ids(schema).map_err(
        LakeError::iceberg(format!("the columns of table {dataset}")),
    )?;
    // Checked before anything is created: a bad spec makes no namespace.
    let (partition_spec, sort_order) = spec.iceberg(dataset, &ice)?;
    let inner = t.rt.block_on(async {
        if !t.catalog.namespace_exists(id.namespace()).await? {
            // Another writer may create it at the same moment.
            if let Err(e) = t
                .catalog
                .create_namespace(id.namespace(), HashMap::new())
                .await
            {
                if !t.catalog.namespace_exists(id.namespace()).await? {
                    return Err(e);
                }
            }
        }
        if t.catalog.table_exists(&id).await? {
            return t.catalog.load_table(&id).await;
        }
        let creation = TableCreation::builder()
            .name(id.name().to_string())
            .schema(ice)
            .partition_spec(partition_spec)
            .sort_order(sort_order)
            .properties(
                COMMIT_RETRY
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            )
            .build();
        match t.catalog.create_table(id.namespace(), creation).await {
            Ok(table) => Ok(table),
            // Another writer created it first: it is the table.
            Err(_) if t.catalog.table_exists(&id).await.unwrap_or(false) => {
                t.catalog.load_table(&id).await
            }
            Err(e) => Err(e),
        }
    });
    // Most calls find the table and only load it: the label names both.
    let inner = inner.map_err(LakeError::iceberg(format!(
        "table {dataset} cannot be loaded or created"
    )))?;
    let table = Table::new(dataset, id, inner);
    let have = table.arrow_schema()?;
    for f in schema.fields() {
        match have.field_with_name(f.name()) {
            Ok(h) if same_type(h.data_type(), f.data_type()) => {}
            Ok(h) => {
                return Err(LakeError::Table(format!(
                    "table {dataset} exists and its column {} is {}, not {}",
                    f.name(),
                    h.data_type(),
                    f.data_type()
                )))
            }
            Err(_) => {
                return Err(LakeError::Table(format!(
                    "table {dataset} exists without column {}",
                    f.name()
                )))
            }
        }
    }
    Ok(table)
}

/// Whether a column of type `have` takes values of type `want` as they are:
/// the same type, or one Iceberg stores the same way (int16 in an int
/// column, a UTC timestamp under either spelling of its zone).
fn same_type(have: &arrow_schema::DataType, want: &arrow_schema::DataType) -> bool {
    use arrow_schema::DataType as D;
    let utc = |tz: &Option<Arc<str>>| matches!(tz.as_deref(), Some("UTC" | "+00:00"));
    match (have, want) {
        (D::Timestamp(u1, z1), D::Timestamp(u2, z2)) => {
            u1 == u2 && (z1 == z2 || (utc(z1) && utc(z2)))
        }
        (D::Int32, D::Int16) => true,
        _ => have == want,
    }
}

/// The data files a snapshot of a table holds.
pub fn live_data_files(
    t: &Lake,
    table: &iceberg::table::Table,
    snapshot: &iceberg::spec::SnapshotRef,
) -> Result<Vec<DataFile>> {
    let files = t.rt.block_on(async {
        let list = table.manifest_list_reader(snapshot).load().await?;
        let mut out = Vec::new();
        for mf in list.entries() {
            if mf.content != iceberg::spec::ManifestContentType::Data {
                continue;
            }
            let m = mf.load_manifest(table.file_io()).await?;
            out.extend(
                m.entries()
                    .iter()
                    .filter(|e| e.is_alive())
                    .map(|e| e.data_file().clone()),
            );
        }
        Ok::<_, iceberg::Error>(out)
    });
    files.map_err(LakeError::iceberg(format!(
        "listing the files of snapshot {}",
        snapshot.snapshot_id()
    )))
}

/// A snapshot of the table whose summary holds every one of `props`.
pub fn find_commit(table: &iceberg::table::Table, props: &[(&str, &str)]) -> Option<i64> {
    table.metadata().snapshots().find_map(|s| {
        let p = &s.summary().additional_properties;
        props
            .iter()
            .all(|(k, v)| p.get(*k).map(String::as_str) == Some(*v))
            .then(|| s.snapshot_id())
    })
}

/// Appends data files as one snapshot with these summary properties and
/// returns its id. The SQL catalog swaps the metadata pointer with a
/// compare-and-swap; a concurrent commit makes the transaction retry on the
/// new state.
pub fn fast_append(
    t: &Lake,
    dataset: &str,
    fresh: &iceberg::table::Table,
    added: Vec<DataFile>,
    props: HashMap<String, String>,
) -> Result<i64> {
    let committed =
        t.rt.block_on(async {
            let tx = Transaction::new(fresh);
            // No check for files the table holds already: it reads every
            // manifest of the table, a cost that grows with each commit,
            // and the files a step writes have names no other write uses
            // (run, step, partition, attempt and a random UUID).
            let action = tx
                .fast_append()
                .with_check_duplicate(false)
                .add_data_files(added)
                .set_snapshot_properties(props);
            action.apply(tx)?.commit(&t.catalog).await
        })
        .map_err(LakeError::iceberg(format!("commit to {dataset}")))?;
    committed
        .metadata()
        .current_snapshot()
        .map(|s| s.snapshot_id())
        .ok_or_else(|| LakeError::Table(format!("commit to {dataset} made no snapshot")))
}

/// Commits a change that removes files (or, for a sync's epoch, one that
/// also sets table properties), unless `stop`, asked about the table before
/// each try, says why not: then `Ok(Err(why))` and nothing is committed.
/// The one door to the removing commits iceberg-rust does not build yet.
pub fn commit_change<T>(
    t: &Lake,
    ident: &TableIdent,
    dataset: &str,
    fresh: iceberg::table::Table,
    change: &Change,
    stop: impl Fn(&iceberg::table::Table) -> Option<T>,
) -> Result<std::result::Result<i64, T>> {
    rewrite::commit_if(t, ident, dataset, fresh, change, stop)
}

/// Sets table properties unless `stop`, asked about the table before each
/// try, says why not: then `Ok(Err(why))` and nothing is set.
pub fn set_properties_if<T>(
    t: &Lake,
    ident: &TableIdent,
    dataset: &str,
    fresh: iceberg::table::Table,
    props: &HashMap<String, String>,
    stop: impl Fn(&iceberg::table::Table) -> Option<T>,
) -> Result<std::result::Result<(), T>> {
    rewrite::set_properties_if(t, ident, dataset, fresh, props, stop)
}

pub use crate::rewrite::Change;

/// What a removing commit does; `Append` never comes here.
pub fn operation(name: &str) -> Option<Operation> {
    match name {
        "replace" => Some(Operation::Replace),
        "overwrite" => Some(Operation::Overwrite),
        "delete" => Some(Operation::Delete),
        _ => None,
    }
}

fn err(dataset: &str, what: impl std::fmt::Display) -> LakeError {
    LakeError::Table(format!("commit to {dataset}: {what}"))
}

/// Checks what the operation promises about the rows.
pub fn check(
    dataset: &str,
    op: &Operation,
    added: &[DataFile],
    removed: &[DataFile],
) -> Result<(), LakeError> {
    let rows = |files: &[DataFile]| files.iter().map(DataFile::record_count).sum::<u64>();
    match op {
        Operation::Replace if rows(added) != rows(removed) => Err(err(
            dataset,
            format!(
                "a replace keeps the table's rows, but it adds {} rows and removes {}",
                rows(added),
                rows(removed)
            ),
        )),
        Operation::Delete if !added.is_empty() => Err(err(
            dataset,
            "a delete only removes files; use overwrite to add others",
        )),
        _ if removed.is_empty() => Err(err(
            dataset,
            format!("a {} removes files, and none were given", op.as_str()),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::DataFile;
    use iceberg::spec::{DataContentType, DataFileBuilder, DataFileFormat, Struct};

    fn file(path: &str, rows: u64) -> DataFile {
        DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path(path.to_string())
            .file_format(DataFileFormat::Parquet)
            .partition(Struct::empty())
            .record_count(rows)
            .file_size_in_bytes(100)
            .build()
            .expect("data file")
    }

    #[test]
    fn operations_keep_their_promises_about_rows() {
        let (a, b, c) = (file("a", 10), file("b", 5), file("c", 15));
        let ok = |op: &str, added: Vec<&DataFile>, removed: Vec<&DataFile>| {
            let op = operation(op).expect("operation");
            let added: Vec<DataFile> = added.into_iter().cloned().collect();
            let removed: Vec<DataFile> = removed.into_iter().cloned().collect();
            check("x.t", &op, &added, &removed).map_err(|e| e.to_string())
        };
        assert!(ok("replace", vec![&c], vec![&a, &b]).is_ok());
        let e = ok("replace", vec![&a], vec![&c]).expect_err("rows differ");
        assert!(e.contains("adds 10 rows and removes 15"), "{e}");
        assert!(ok("delete", vec![], vec![&a]).is_ok());
        assert!(ok("delete", vec![&b], vec![&a])
            .expect_err("delete adds")
            .contains("only removes"));
        assert!(ok("overwrite", vec![&b], vec![&a]).is_ok());
        assert!(ok("overwrite", vec![&b], vec![])
            .expect_err("nothing removed")
            .contains("none were given"));
        assert!(operation("append").is_none());
        assert!(operation("merge").is_none());
    }
}
