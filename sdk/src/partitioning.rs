//! How a pipeline is partitioned, as its declaration says: what a step's
//! context and a table a pipeline creates take their partitioning from.

/// How a pipeline is partitioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partitioning {
    /// `Monthly("2024-01")` or `Daily("2024-01-01")`: kind `monthly` or
    /// `daily`, and the first partition.
    Dated {
        kind: &'static str,
        start: &'static str,
    },
    /// `Keyed("lake.raw", "origin")`: the distinct values of a column in a
    /// dataset's current snapshot.
    Keyed {
        dataset: &'static str,
        column: &'static str,
    },
}
