//! Errors of the Hugging Face loader and workloads.
//!
//! Design note: what a user gets wrong (a path, a config of a family this runtime does not
//! implement, a checkpoint that does not fit its config) is an [`HfError`] that says what
//! and where, never a panic; tensor failures (an OOM above all) pass through unchanged as
//! [`HfError::Tensor`] so callers can still ask `is_oom()`.

use crate::error::TensorError;

/// The families this runtime implements, for error messages.
pub const SUPPORTED: &str = "gpt2, llama, mistral, qwen2, bert";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HfError {
    #[error("{path}: {msg}")]
    Io { path: String, msg: String },
    #[error("{path}: not a valid config.json: {msg}")]
    Config { path: String, msg: String },
    #[error("model_type {model_type:?} is not supported (supported: {SUPPORTED})")]
    UnsupportedFamily { model_type: String },
    #[error("{family} config: {what} is not supported ({why})")]
    UnsupportedFeature {
        family: &'static str,
        what: String,
        why: String,
    },
    #[error("{path}: {msg}")]
    Weights { path: String, msg: String },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

impl HfError {
    pub fn is_oom(&self) -> bool {
        matches!(self, HfError::Tensor(e) if e.is_oom())
    }
}

pub type HfResult<T> = std::result::Result<T, HfError>;
