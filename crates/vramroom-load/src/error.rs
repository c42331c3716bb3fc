//! Errors of the load engine.
//!
//! Design note: user input (stages, thresholds, models, capacities, alloc confs) is parsed
//! here into values or a [`LoadError`] that says what was wrong and what was expected, so
//! the CLI can print it and exit 2 before any output file exists. Failures *during* a run
//! (an OOM, a bad request) are not errors of the run: they are counted in the result.

use vramroom_workload::WorkloadError;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A malformed `--stages` value.
    #[error("invalid stages {input:?}: {msg}")]
    Stages { input: String, msg: String },
    /// A malformed `--threshold` value.
    #[error("invalid threshold {input:?}: {msg}")]
    Threshold { input: String, msg: String },
    /// A load/run option that does not make sense (capacity 0, concurrency 0, ...).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The allocator config string did not parse.
    #[error("invalid alloc conf: {0}")]
    AllocConf(String),
    /// A worker thread could not be started.
    #[error("could not start a thread: {0}")]
    Thread(String),
    /// The workload vocabulary (model, input sizes, stages, device) refused the input.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// `vramroom http`: the target or the metrics URL cannot be used (not a URL, the host
    /// does not resolve, nothing listens). Checked before the run, so nothing is written.
    #[error("{0}")]
    Http(String),
}

pub type Result<T> = std::result::Result<T, LoadError>;
