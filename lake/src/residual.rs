//! What is left of a scan's filter for one data file once its partition
//! values are known (Iceberg's residuals, for identity partitions): a
//! filter on a column the table is partitioned by as itself is decided by
//! the file's partition value, so the reader need not test it row by row.
//! `month = '2013-05'` over a file of partition `month=2013-05` leaves
//! nothing to test; `month = '2013-05' AND dep_delay > 60` leaves
//! `dep_delay > 60`.
//!
//! Only what is certain is dropped: a leaf on a column without an identity
//! partition, on a null partition value (bar `IS NULL`), on floating point
//! (NaN) or with a literal of another kind stays as it was, and a node both
//! of whose sides stay keeps its whole original subtree (iceberg-rust does
//! not let a predicate be rebuilt from parts outside its crate).

use iceberg::expr::{BoundPredicate, BoundReference, PredicateOperator};
use iceberg::scan::FileScanTask;
use iceberg::spec::{Datum, Literal, PartitionSpec, PrimitiveLiteral, TableMetadata, Transform};

/// What a predicate is for one file.
#[derive(Debug)]
enum Residual {
    True,
    False,
    /// Still to be tested on the rows: this (part of the) predicate.
    Rows(BoundPredicate),
}

/// The filter the reader must still apply to `task`'s rows: `None` when its
/// partition decides the whole filter true. `spec` is the file's partition
/// spec when the task does not carry it (iceberg-rust 0.10's planning does
/// not).
pub fn of_task(task: &FileScanTask, spec: Option<&PartitionSpec>) -> Option<BoundPredicate> {
    let predicate = task.predicate.as_ref()?;
    let values = PartitionValues::of(task, spec);
    if values.is_empty() {
        return Some(predicate.clone());
    }
    match residual(predicate, &values) {
        Residual::True => None,
        // A file the filter rules out whole: the reader's own test drops
        // every row, as before.
        Residual::False => Some(predicate.clone()),
        Residual::Rows(p) => Some(p),
    }
}

/// Drops from each task what its partition decides. The tasks' planning
/// names no partition spec, so a file's spec is the table's one spec of as
/// many fields as its partition value has; where two specs of the table
/// have that many (a field replaced by another), its filter stays whole.
pub fn apply(tasks: &mut [FileScanTask], metadata: &TableMetadata) {
    for t in tasks {
        let arity = t.partition.as_ref().map_or(0, |p| p.fields().len());
        if arity == 0 {
            continue;
        }
        let mut same = metadata
            .partition_specs_iter()
            .filter(|s| s.fields().len() == arity);
        if let (Some(spec), None) = (same.next(), same.next()) {
            t.predicate = of_task(t, Some(spec.as_ref()));
        }
    }
}

/// The file's identity partition values, by source column (field id).
struct PartitionValues<'a> {
    by_field: Vec<(i32, Option<&'a PrimitiveLiteral>)>,
}

impl<'a> PartitionValues<'a> {
    fn of(task: &'a FileScanTask, spec: Option<&'a PartitionSpec>) -> PartitionValues<'a> {
        let mut by_field = Vec::new();
        let spec = task.partition_spec.as_deref().or(spec);
        if let (Some(spec), Some(values)) = (spec, &task.partition) {
            for (field, value) in spec.fields().iter().zip(values.iter()) {
                if field.transform != Transform::Identity {
                    continue;
                }
                let value = match value {
                    None => None,
                    Some(Literal::Primitive(p)) => Some(p),
                    // Not a primitive: nothing to decide by.
                    Some(_) => continue,
                };
                by_field.push((field.source_id, value));
            }
        }
        PartitionValues { by_field }
    }

    fn is_empty(&self) -> bool {
        self.by_field.is_empty()
    }

    /// `Some(value)` when the column is an identity partition of the file
    /// (`value` None: a null partition value).
    fn get(&self, r: &BoundReference) -> Option<Option<&'a PrimitiveLiteral>> {
        let id = r.field().id;
        self.by_field
            .iter()
            .find(|(f, _)| *f == id)
            .map(|(_, v)| *v)
    }
}

fn decided(b: bool) -> Residual {
    if b {
        Residual::True
    } else {
        Residual::False
    }
}

/// The literal as comparable with a partition value: the same kind, and
/// not floating point (NaN orders unlike SQL).
fn comparable<'a>(d: &'a Datum, value: &PrimitiveLiteral) -> Option<&'a PrimitiveLiteral> {
    let lit = d.literal();
    let same = std::mem::discriminant(lit) == std::mem::discriminant(value);
    let float = matches!(
        lit,
        PrimitiveLiteral::Float(_) | PrimitiveLiteral::Double(_)
    );
    let bound = matches!(lit, PrimitiveLiteral::AboveMax | PrimitiveLiteral::BelowMin);
    (same && !float && !bound).then_some(lit)
}

fn residual(p: &BoundPredicate, values: &PartitionValues<'_>) -> Residual {
    let keep = || Residual::Rows(p.clone());
    match p {
        BoundPredicate::AlwaysTrue => Residual::True,
        BoundPredicate::AlwaysFalse => Residual::False,
        BoundPredicate::And(e) => {
            let [a, b] = e.inputs();
            match (residual(a, values), residual(b, values)) {
                (Residual::False, _) | (_, Residual::False) => Residual::False,
                (Residual::True, other) | (other, Residual::True) => other,
                _ => keep(),
            }
        }
        BoundPredicate::Or(e) => {
            let [a, b] = e.inputs();
            match (residual(a, values), residual(b, values)) {
                (Residual::True, _) | (_, Residual::True) => Residual::True,
                (Residual::False, other) | (other, Residual::False) => other,
                _ => keep(),
            }
        }
        BoundPredicate::Not(e) => {
            let [a] = e.inputs();
            match residual(a, values) {
                Residual::True => Residual::False,
                Residual::False => Residual::True,
                Residual::Rows(_) => keep(),
            }
        }
        BoundPredicate::Unary(u) => match (values.get(u.term()), u.op()) {
            (Some(v), PredicateOperator::IsNull) => decided(v.is_none()),
            (Some(v), PredicateOperator::NotNull) => decided(v.is_some()),
            _ => keep(),
        },
        BoundPredicate::Binary(b) => {
            let Some(Some(value)) = values.get(b.term()) else {
                return keep();
            };
            let Some(lit) = comparable(b.literal(), value) else {
                return keep();
            };
            let prefix = |v: &PrimitiveLiteral, l: &PrimitiveLiteral| match (v, l) {
                (PrimitiveLiteral::String(v), PrimitiveLiteral::String(l)) => {
                    Some(v.starts_with(l.as_str()))
                }
                _ => None,
            };
            match b.op() {
                PredicateOperator::Eq => decided(value == lit),
                PredicateOperator::NotEq => decided(value != lit),
                PredicateOperator::LessThan => decided(value < lit),
                PredicateOperator::LessThanOrEq => decided(value <= lit),
                PredicateOperator::GreaterThan => decided(value > lit),
                PredicateOperator::GreaterThanOrEq => decided(value >= lit),
                PredicateOperator::StartsWith => prefix(value, lit).map_or_else(keep, decided),
                PredicateOperator::NotStartsWith => {
                    prefix(value, lit).map_or_else(keep, |s| decided(!s))
                }
                _ => keep(),
            }
        }
        BoundPredicate::Set(s) => {
            let Some(Some(value)) = values.get(s.term()) else {
                return keep();
            };
            let mut hit = false;
            for d in s.literals() {
                let Some(lit) = comparable(d, value) else {
                    return keep();
                };
                hit |= lit == value;
            }
            match s.op() {
                PredicateOperator::In => decided(hit),
                PredicateOperator::NotIn => decided(!hit),
                _ => keep(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use iceberg::expr::{Bind, Predicate, Reference};
    use iceberg::spec::{
        DataFileFormat, NestedField, PartitionSpec, PrimitiveType, Schema, Struct, Type,
    };

    use super::*;

    fn schema() -> Arc<Schema> {
        Arc::new(
            Schema::builder()
                .with_fields(vec![
                    NestedField::optional(1, "month", Type::Primitive(PrimitiveType::String))
                        .into(),
                    NestedField::optional(2, "delay", Type::Primitive(PrimitiveType::Long)).into(),
                    NestedField::optional(3, "ratio", Type::Primitive(PrimitiveType::Double))
                        .into(),
                ])
                .build()
                .expect("schema"),
        )
    }

    /// A task over a file of partition `month = value` (identity), or of
    /// `bucket(4, month)` when `bucket`.
    fn task(filter: Predicate, value: Option<&str>, bucket: bool) -> FileScanTask {
        let schema = schema();
        let mut spec = PartitionSpec::builder(schema.clone()).with_spec_id(1);
        spec = if bucket {
            spec.add_partition_field("month", "month_bucket", Transform::Bucket(4))
                .expect("field")
        } else {
            spec.add_partition_field("month", "month", Transform::Identity)
                .expect("field")
        };
        let spec = spec.build().expect("spec");
        let partition = Struct::from_iter([value.map(Literal::string)]);
        let predicate = filter.bind(schema.clone(), true).expect("bind");
        FileScanTask::builder()
            .with_file_size_in_bytes(100)
            .with_start(0)
            .with_length(100)
            .with_data_file_path("f.parquet".to_string())
            .with_data_file_format(DataFileFormat::Parquet)
            .with_schema(schema)
            .with_project_field_ids(vec![1, 2])
            .with_predicate(Some(predicate))
            .with_partition(Some(partition))
            .with_partition_spec(Some(Arc::new(spec)))
            .with_case_sensitive(true)
            .build()
    }

    fn month() -> Reference {
        Reference::new("month")
    }

    fn left(filter: Predicate, value: Option<&str>) -> Option<String> {
        of_task(&task(filter, value, false), None).map(|p| p.to_string())
    }

    #[test]
    fn a_filter_the_partition_decides_leaves_nothing_to_test() {
        let may = Some("2013-05");
        assert_eq!(left(month().equal_to(Datum::string("2013-05")), may), None);
        assert_eq!(
            left(month().greater_than(Datum::string("2013-01")), may),
            None
        );
        assert_eq!(left(month().starts_with(Datum::string("2013")), may), None);
        assert_eq!(
            left(
                month().is_in([Datum::string("2013-04"), Datum::string("2013-05")]),
                may
            ),
            None
        );
        assert_eq!(left(month().is_not_null(), may), None);
        assert_eq!(
            left(
                month()
                    .equal_to(Datum::string("2014-01"))
                    .or(month().equal_to(Datum::string("2013-05"))),
                may
            ),
            None
        );
    }

    #[test]
    fn what_the_partition_does_not_decide_stays() {
        let may = Some("2013-05");
        let delay = || Reference::new("delay").greater_than(Datum::long(60));
        // The month's part goes; the delay's stays.
        let rest =
            left(month().equal_to(Datum::string("2013-05")).and(delay()), may).expect("a residual");
        assert!(rest.contains("delay") && !rest.contains("month"), "{rest}");
        // A column that is no partition, floating point, a null partition
        // value and a non-identity transform: all stay whole.
        assert!(left(delay(), may).is_some());
        let ratio = Reference::new("ratio").greater_than(Datum::double(0.5));
        assert!(left(ratio, may).is_some());
        assert!(left(month().equal_to(Datum::string("2013-05")), None).is_some());
        let bucketed = task(month().equal_to(Datum::string("2013-05")), Some("1"), true);
        assert!(of_task(&bucketed, None).is_some());
        // A file the filter rules out keeps its filter (the reader drops
        // every row), as does a mix the rows must decide.
        assert!(left(month().equal_to(Datum::string("2014-01")), may).is_some());
        let mixed =
            left(month().equal_to(Datum::string("2014-01")).or(delay()), may).expect("a residual");
        assert!(mixed.contains("delay"), "{mixed}");
    }

    #[test]
    fn null_partition_values_decide_only_null_tests() {
        assert_eq!(left(month().is_null(), None), None);
        assert!(left(month().is_not_null(), None).is_some());
        assert!(left(month().not_equal_to(Datum::string("x")), None).is_some());
    }
}
