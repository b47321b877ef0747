//! Cells a destination cannot take: loaded as null, and kept under
//! `_held/` for a later release ([`crate::release`]).

/// A cell the destination cannot take, kept for a later release.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Held {
    pub column: String,
    pub orca_id: String,
    pub value: String,
    pub reason: &'static str,
}
