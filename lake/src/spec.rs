//! What a table is made with: its columns, how its rows are partitioned and
//! how they are sorted ([`TableSpec`]), and what that becomes in Iceberg.
//!
//! A partitioned table keeps each partition value's rows in files of their
//! own and records the value in the manifests, so that every reader (ours,
//! PyIceberg, DuckDB, Spark) skips the files a filter on the partition
//! column rules out.

use std::fmt;
use std::sync::Arc;

use arrow_schema::Schema as ArrowSchema;
use iceberg::spec::{
    NullOrder, PartitionSpec, Schema as IcebergSchema, SortDirection, SortField, SortOrder,
    Transform as IcebergTransform, UnboundPartitionSpec,
};

use crate::{LakeError, Result};

/// How a partition value is made from a column's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// The value itself: a `month` text column holding `2013-05`.
    Identity,
    /// The year of a date or timestamp.
    Year,
    /// The month of a date or timestamp.
    Month,
    /// The day of a date or timestamp.
    Day,
    /// The hour of a timestamp.
    Hour,
    /// A hash of the value into this many buckets.
    Bucket(u32),
    /// The value cut to this width (text: its first N characters).
    Truncate(u32),
}

impl Transform {
    fn iceberg(self) -> IcebergTransform {
        match self {
            Transform::Identity => IcebergTransform::Identity,
            Transform::Year => IcebergTransform::Year,
            Transform::Month => IcebergTransform::Month,
            Transform::Day => IcebergTransform::Day,
            Transform::Hour => IcebergTransform::Hour,
            Transform::Bucket(n) => IcebergTransform::Bucket(n),
            Transform::Truncate(w) => IcebergTransform::Truncate(w),
        }
    }

    /// The partition field's name for a column, as Spark and PyIceberg
    /// name them: the column itself for identity, else `column_transform`.
    fn field_name(self, column: &str) -> String {
        match self {
            Transform::Identity => column.to_string(),
            Transform::Year => format!("{column}_year"),
            Transform::Month => format!("{column}_month"),
            Transform::Day => format!("{column}_day"),
            Transform::Hour => format!("{column}_hour"),
            Transform::Bucket(_) => format!("{column}_bucket"),
            Transform::Truncate(_) => format!("{column}_trunc"),
        }
    }
}

impl From<orca_core::sync::PartitionTransform> for Transform {
    fn from(t: orca_core::sync::PartitionTransform) -> Transform {
        use orca_core::sync::PartitionTransform as P;
        match t {
            P::Identity => Transform::Identity,
            P::Year => Transform::Year,
            P::Month => Transform::Month,
            P::Day => Transform::Day,
            P::Hour => Transform::Hour,
            P::Bucket(n) => Transform::Bucket(n),
            P::Truncate(w) => Transform::Truncate(w),
        }
    }
}

impl fmt::Display for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.iceberg())
    }
}

/// One field of a partitioning: a column and its transform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionField {
    pub column: String,
    pub transform: Transform,
}

impl From<&orca_core::sync::PartitionBy> for PartitionField {
    fn from(p: &orca_core::sync::PartitionBy) -> PartitionField {
        PartitionField {
            column: p.column.clone(),
            transform: p.transform.into(),
        }
    }
}

/// How a table's rows are divided into partitions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Partitioning {
    /// Whatever the writer's context makes the default: the SDK partitions
    /// a table by its pipeline's partition ([`TableSpec::partitioning`]);
    /// without such a context the table is unpartitioned.
    #[default]
    Auto,
    /// One partition: every file may hold any row.
    Unpartitioned,
    /// By these fields, in order.
    By(Vec<PartitionField>),
}

/// One column a table's files are sorted by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SortKey {
    pub column: String,
    pub descending: bool,
}

/// A table to create: its columns, partitioning and sort order. An Arrow
/// schema alone is a spec with the default partitioning and no sort order.
#[derive(Debug, Clone)]
pub struct TableSpec {
    pub schema: Arc<ArrowSchema>,
    pub partitioning: Partitioning,
    pub sort: Vec<SortKey>,
}

impl TableSpec {
    pub fn new(schema: impl Into<Arc<ArrowSchema>>) -> TableSpec {
        TableSpec {
            schema: schema.into(),
            partitioning: Partitioning::Auto,
            sort: Vec::new(),
        }
    }

    /// Partitions by `column` under `transform`, after any fields given before.
    pub fn partition_by(mut self, column: &str, transform: Transform) -> TableSpec {
        let field = PartitionField {
            column: column.to_string(),
            transform,
        };
        match &mut self.partitioning {
            Partitioning::By(fields) => fields.push(field),
            p => *p = Partitioning::By(vec![field]),
        }
        self
    }

    /// Partitions by these fields, after any given before.
    pub fn partitioned(self, fields: &[PartitionField]) -> TableSpec {
        fields
            .iter()
            .fold(self, |spec, f| spec.partition_by(&f.column, f.transform))
    }

    /// No partitions, whatever the pipeline's partition is.
    pub fn unpartitioned(mut self) -> TableSpec {
        self.partitioning = Partitioning::Unpartitioned;
        self
    }

    /// Sorts each data file by `column`, ascending, after any keys given before.
    pub fn sort_by(mut self, column: &str) -> TableSpec {
        self.sort.push(SortKey {
            column: column.to_string(),
            descending: false,
        });
        self
    }

    /// Sorts each data file by `column`, descending, after any keys given before.
    pub fn sort_by_desc(mut self, column: &str) -> TableSpec {
        self.sort.push(SortKey {
            column: column.to_string(),
            descending: true,
        });
        self
    }

    /// The partition fields this spec asks for (none for `Auto` and
    /// `Unpartitioned`).
    pub fn partition_fields(&self) -> &[PartitionField] {
        match &self.partitioning {
            Partitioning::By(fields) => fields,
            _ => &[],
        }
    }

    fn columns(&self) -> String {
        self.schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn field_id(
        &self,
        dataset: &str,
        ice: &IcebergSchema,
        column: &str,
        what: &str,
    ) -> Result<i32> {
        ice.field_by_name(column).map(|f| f.id).ok_or_else(|| {
            LakeError::Table(format!(
                "table {dataset} cannot be {what} column {column}: it has no such column (its columns are {})",
                self.columns()
            ))
        })
    }

    /// The Iceberg partition spec and sort order of this spec over `ice`
    /// (the table's schema with its field ids). A column the schema lacks,
    /// or a transform its type does not take, is an error naming both.
    pub fn iceberg(
        &self,
        dataset: &str,
        ice: &IcebergSchema,
    ) -> Result<(UnboundPartitionSpec, SortOrder)> {
        let mut spec = UnboundPartitionSpec::builder();
        for f in self.partition_fields() {
            let id = self.field_id(dataset, ice, &f.column, "partitioned by")?;
            let source = ice
                .field_by_id(id)
                .map(|s| s.field_type.to_string())
                .unwrap_or_default();
            let checked = ice
                .field_by_id(id)
                .and_then(|s| s.field_type.as_primitive_type().cloned())
                .ok_or_else(|| {
                    LakeError::Table(format!(
                        "table {dataset} cannot be partitioned by {} of column {}: it is a {source}, not a primitive",
                        f.transform, f.column
                    ))
                })
                .and_then(|p| {
                    f.transform
                        .iceberg()
                        .result_type(&iceberg::spec::Type::Primitive(p))
                        .map_err(|e| {
                            LakeError::Table(format!(
                                "table {dataset} cannot be partitioned by {} of column {} ({source}): {e}",
                                f.transform, f.column
                            ))
                        })
                });
            checked?;
            spec = spec
                .add_partition_field(id, f.transform.field_name(&f.column), f.transform.iceberg())
                .map_err(|e| {
                    LakeError::Table(format!("table {dataset}: partition by {}: {e}", f.column))
                })?;
        }
        let mut order = SortOrder::builder();
        for k in &self.sort {
            let id = self.field_id(dataset, ice, &k.column, "sorted by")?;
            order.with_sort_field(SortField {
                source_id: id,
                transform: IcebergTransform::Identity,
                direction: if k.descending {
                    SortDirection::Descending
                } else {
                    SortDirection::Ascending
                },
                null_order: if k.descending {
                    NullOrder::Last
                } else {
                    NullOrder::First
                },
            });
        }
        let order = order
            .build(ice)
            .map_err(|e| LakeError::Table(format!("table {dataset}: sort order: {e}")))?;
        Ok((spec.build(), order))
    }
}

impl From<ArrowSchema> for TableSpec {
    fn from(s: ArrowSchema) -> TableSpec {
        TableSpec::new(s)
    }
}

impl From<&ArrowSchema> for TableSpec {
    fn from(s: &ArrowSchema) -> TableSpec {
        TableSpec::new(s.clone())
    }
}

impl From<Arc<ArrowSchema>> for TableSpec {
    fn from(s: Arc<ArrowSchema>) -> TableSpec {
        TableSpec::new(s)
    }
}

/// A table's partitioning as a person reads it: `month`, `month(date)`,
/// `identity(origin), bucket[16](id)`, or `unpartitioned`.
pub fn describe_partitioning(spec: &PartitionSpec, schema: &IcebergSchema) -> String {
    described(spec.fields().iter().map(|f| {
        let col = schema
            .field_by_id(f.source_id)
            .map(|c| c.name.clone())
            .unwrap_or_else(|| format!("#{}", f.source_id));
        (f.transform.to_string(), col)
    }))
}

/// Partition fields as [`describe_partitioning`] says a table's, so that
/// the two compare.
pub fn describe_fields(fields: &[PartitionField]) -> String {
    described(
        fields
            .iter()
            .map(|f| (f.transform.to_string(), f.column.clone())),
    )
}

fn described(fields: impl Iterator<Item = (String, String)>) -> String {
    let parts: Vec<String> = fields.map(|(t, col)| format!("{t}({col})")).collect();
    match parts.is_empty() {
        true => "unpartitioned".into(),
        false => parts.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::{DataType, Field, TimeUnit};

    fn schema() -> (TableSpec, IcebergSchema) {
        let arrow = ArrowSchema::new(vec![
            Field::new("month", DataType::Utf8, false),
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("n", DataType::Int64, false),
        ]);
        let ice = iceberg::arrow::arrow_schema_to_schema_auto_assign_ids(&arrow).expect("schema");
        (TableSpec::new(arrow), ice)
    }

    #[test]
    fn specs_become_iceberg_partition_specs_and_sort_orders() {
        let (spec, ice) = schema();
        let spec = spec
            .partition_by("month", Transform::Identity)
            .partition_by("at", Transform::Day)
            .sort_by("n");
        let (p, o) = spec.iceberg("x.t", &ice).expect("valid");
        let names: Vec<_> = p.fields().iter().map(|f| f.name.clone()).collect();
        assert_eq!(names, ["month", "at_day"]);
        let bound = p.bind(Arc::new(ice.clone())).expect("binds");
        assert_eq!(
            describe_partitioning(&bound, &ice),
            "identity(month), day(at)"
        );
        assert_eq!(o.fields.len(), 1);
        assert_eq!(o.fields[0].direction, SortDirection::Ascending);
    }

    #[test]
    fn a_spec_naming_what_the_schema_lacks_or_cannot_take_is_refused() {
        let (spec, ice) = schema();
        let e = spec
            .clone()
            .partition_by("day", Transform::Identity)
            .iceberg("x.t", &ice)
            .expect_err("no column day")
            .to_string();
        assert!(
            e.contains("column day") && e.contains("month, at, n"),
            "{e}"
        );
        let e = spec
            .clone()
            .partition_by("month", Transform::Month)
            .iceberg("x.t", &ice)
            .expect_err("month of a string")
            .to_string();
        assert!(e.contains("month of column month (string)"), "{e}");
        let e = spec
            .sort_by("nope")
            .iceberg("x.t", &ice)
            .expect_err("sort by a missing column")
            .to_string();
        assert!(e.contains("sorted by column nope"), "{e}");
    }

    #[test]
    fn auto_and_unpartitioned_have_no_fields() {
        let (spec, ice) = schema();
        let (p, _) = spec.clone().iceberg("x.t", &ice).expect("auto");
        assert!(p.fields().is_empty());
        let (p, o) = spec.unpartitioned().iceberg("x.t", &ice).expect("none");
        assert!(p.fields().is_empty() && o.is_unsorted());
    }
}
