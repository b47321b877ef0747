//! The `Step` trait that `#[orca::step]` implements, and the kind markers.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::ctx::Ctx;
use crate::error::{Result, SdkError};

/// Runs once per partition key of a run.
pub struct Mapped;
/// Runs once per run, over every partition's output.
pub struct Gather;

/// A step kind, as a type so the compiler can check edges.
pub trait Kind {
    const NAME: &'static str;
}
impl Kind for Mapped {
    const NAME: &'static str = "mapped";
}
impl Kind for Gather {
    const NAME: &'static str = "gather";
}

/// A step that follows the step listed before it (no `after = ...`).
pub struct Previous;

/// Resolves the step a step follows: its own `after`, or `D`, the step
/// listed before it.
pub trait AfterOr<D> {
    type Prev;
}
impl<D> AfterOr<D> for Previous {
    type Prev = D;
}

/// A step, as `#[orca::step]` declares it.
pub trait Step {
    type Input: Serialize + DeserializeOwned;
    type Output: Serialize + DeserializeOwned;
    type Kind: Kind;
    type After;
    const NAME: &'static str;
    /// The function's path: what `after` is compared by.
    const ID: &'static str;
    const AFTER_ID: Option<&'static str>;
    const RETRIES: u32;
    /// A hash of the function's code, kind, edge, retries and datasets.
    const CODE: &'static str;
    /// The datasets (`namespace.table`) it reads and writes.
    const READS: &'static [&'static str];
    const WRITES: &'static [&'static str];
    fn call(ctx: &mut Ctx<'_>, input: Self::Input) -> Result<Self::Output>;
}

/// Calls a step on JSON, the form inputs and outputs are stored in.
pub fn run_erased<S: Step>(
    ctx: &mut Ctx<'_>,
    input: Value,
) -> std::result::Result<Value, StepError> {
    let input: S::Input = serde_json::from_value(input).map_err(|e| {
        StepError::Codec(SdkError::Codec {
            step: S::NAME.to_string(),
            what: "decode the input of",
            error: e.to_string(),
        })
    })?;
    let output = S::call(ctx, input).map_err(|e| {
        if crate::error::store_outage(e.as_ref()) {
            StepError::StoreUnavailable(e.to_string())
        } else {
            StepError::Failed(e.to_string())
        }
    })?;
    serde_json::to_value(output).map_err(|e| {
        StepError::Codec(SdkError::Codec {
            step: S::NAME.to_string(),
            what: "encode the output of",
            error: e.to_string(),
        })
    })
}

/// Why a step call did not give an output.
#[derive(Debug)]
pub enum StepError {
    /// The step returned an error (retried while its retries last).
    Failed(String),
    /// Its input or output does not fit its types (not retried).
    Codec(SdkError),
    /// The object store did not answer, or the warehouse's disk is full:
    /// not the step's fault, so neither its retries nor the run's are
    /// spent (the attempt is handed back).
    StoreUnavailable(String),
}
