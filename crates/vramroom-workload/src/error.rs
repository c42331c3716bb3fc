//! Errors of the workload vocabulary.
//!
//! Design note: everything here is user input (a model name, an input distribution, stages,
//! a device) or the setup that follows from it, so each error says what was wrong and what
//! was expected; callers print it and exit 2 before any output exists. The messages are the
//! ones `vramroom loadtest` always printed: the load engine wraps this error transparently.

use vramroom_tensor::TensorError;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A malformed `--stages` value.
    #[error("invalid stages {input:?}: {msg}")]
    Stages { input: String, msg: String },
    /// A scenario option that does not make sense (unknown model, batch 0, ...).
    #[error("invalid scenario: {0}")]
    Scenario(String),
    /// A device or capacity option that does not make sense.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Setting up the workload failed (e.g. the model alone does not fit the capacity).
    #[error("setup failed: {0}")]
    Setup(TensorError),
    /// The requested device has no backend in this build, or no such GPU here.
    #[error("device {0} is not available: {1}")]
    DeviceUnavailable(String, String),
}

impl WorkloadError {
    /// Whether this is the device running out of memory (not a user mistake).
    pub fn is_oom(&self) -> bool {
        matches!(self, WorkloadError::Setup(e) if e.is_oom())
    }
}

pub type Result<T> = std::result::Result<T, WorkloadError>;
