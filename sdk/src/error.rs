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
        SdkError::Tables(e.to_string())
    }
}
