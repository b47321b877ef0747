//! Errors: what a step returns, and what the SDK itself reports.

/// The error a step returns: anything that converts, so `?` works on any
/// error type inside a step.
pub type Error = Box<dyn std::error::Error + Send + Sync + 'static>;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong around the steps, each naming what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    #[error("pipeline {pipeline} is not valid: {reason}")]
    Invalid { pipeline: String, reason: String },
    #[error("{0}")]
    Usage(String),
    #[error("step {step} failed for partition {partition}: {error}")]
    StepFailed {
        step: String,
        partition: String,
        error: String,
    },
    #[error("step {step}: cannot {what} its data as JSON: {error}")]
    Codec {
        step: String,
        what: &'static str,
        error: String,
    },
    #[error("control plane: {0}")]
    Control(String),
    #[error("tables: {0}")]
    Tables(String),
    #[error("{what}: {error}")]
    Io { what: String, error: std::io::Error },
    /// The object store did not answer through its client's retries, or
    /// the local warehouse's disk is full: the attempt is handed back to
    /// the control plane, spending none of the run's retries.
    #[error("the object store did not answer: {0}")]
    StoreUnavailable(String),
}

/// How [`SdkError::StoreUnavailable`] begins: a task's error that begins so
/// met an outage (its error travels as text, from a worker process or
/// through the control plane).
pub(crate) const STORE_UNAVAILABLE: &str = "the object store did not answer: ";

/// A task's error as text, marked as an outage when it is one.
pub(crate) fn task_error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let text = e.to_string();
    if store_outage(e) && !text.starts_with(STORE_UNAVAILABLE) {
        format!("{STORE_UNAVAILABLE}{text}")
    } else {
        text
    }
}

/// The outage a task's error text tells of, if it tells of one.
pub(crate) fn task_outage(error: &str) -> Option<SdkError> {
    error
        .strip_prefix(STORE_UNAVAILABLE)
        .map(|rest| SdkError::StoreUnavailable(rest.to_string()))
}

/// What was being done, with the error it met kept as its source: an
/// outage of the store several wrappers down can still be told
/// ([`store_outage`]).
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct Context {
    what: String,
    #[source]
    source: Error,
}

/// `map_err(context("scan of lake.clean"))`.
pub(crate) fn context<E: Into<Error>>(what: impl Into<String>) -> impl FnOnce(E) -> Error {
    let what = what.into();
    move |e| {
        Box::new(Context {
            what,
            source: e.into(),
        })
    }
}

/// Whether `e`, or an error in its chain, says that the object store did
/// not answer or the warehouse's disk is full ([`orca_lake::outage`]).
pub fn store_outage(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if matches!(
            err.downcast_ref::<SdkError>(),
            Some(SdkError::StoreUnavailable(_))
        ) {
            return true;
        }
        next = err.source();
    }
    orca_lake::outage(e)
}

impl From<orca_client::ClientError> for SdkError {
    fn from(e: orca_client::ClientError) -> Self {
        SdkError::Control(match e.code() {
            Some(code) => format!("{} ({code})", e.message()),
            None => e.to_string(),
        })
    }
}

impl From<orca_lake::LakeError> for SdkError {
    fn from(e: orca_lake::LakeError) -> Self {
        if e.unavailable() {
            SdkError::StoreUnavailable(e.to_string())
        } else {
            SdkError::Tables(e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_disk() -> std::io::Error {
        std::io::Error::from(std::io::ErrorKind::StorageFull)
    }

    #[test]
    fn an_outage_is_told_however_deep_a_step_wrapped_it() {
        // A write under a full local warehouse, as the lake returns it for
        // rows that failed to come, inside a query's context, boxed by `?`.
        let lake = orca_lake::LakeError::Input(Box::new(full_disk()));
        let wrapped: Error = context("step load SQL")(lake);
        assert!(store_outage(wrapped.as_ref()));
        assert_eq!(
            wrapped.to_string(),
            "step load SQL: no storage space",
            "the message reads as it did before the context kept the source"
        );
        let told: Error = Box::new(SdkError::StoreUnavailable("timed out".into()));
        assert!(store_outage(context("step load")(told).as_ref()));
        let sdk: SdkError = orca_lake::LakeError::Input(Box::new(full_disk())).into();
        assert!(matches!(sdk, SdkError::StoreUnavailable(_)), "{sdk:?}");
    }

    #[test]
    fn a_tasks_outage_survives_its_trip_as_text_and_fails_the_step_as_one() {
        let lake: Error = Box::new(orca_lake::LakeError::Input(Box::new(full_disk())));
        let text = task_error_text(context("task load #3")(lake).as_ref());
        assert_eq!(
            text,
            "the object store did not answer: task load #3: no storage space"
        );
        let told: Error = Box::new(SdkError::StoreUnavailable("timed out".into()));
        assert_eq!(
            task_error_text(told.as_ref()),
            "the object store did not answer: timed out",
            "said once"
        );
        let failed = crate::tasks::TaskFailed::new("load".into(), 3, 2, text);
        assert!(failed
            .to_string()
            .starts_with("task load #3 failed after 2 tries: the object store"));
        let in_step: Error = context("step fan")(failed);
        assert!(store_outage(in_step.as_ref()));
        let own: Error = "bad input row 7".into();
        let failed =
            crate::tasks::TaskFailed::new("load".into(), 4, 1, task_error_text(own.as_ref()));
        assert!(!store_outage(&failed));
    }

    #[test]
    fn a_steps_own_failure_is_not_an_outage() {
        let own: Error = "no rows for 2024-01".into();
        assert!(!store_outage(own.as_ref()));
        let refused = orca_lake::LakeError::Table("dataset lake.x does not exist".into());
        assert!(!store_outage(context("scan of lake.x")(refused).as_ref()));
        let sdk: SdkError = orca_lake::LakeError::Config("no catalog".into()).into();
        assert!(matches!(sdk, SdkError::Tables(_)), "{sdk:?}");
    }
}
