//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while reading or writing traces.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The bytes are not a well-formed pickle we are willing to decode: truncated, corrupt,
    /// an opcode outside plain data, or a structure over our size and depth limits.
    #[error("bad pickle: {0}")]
    Pickle(String),
    /// A well-formed pickle whose contents are not a memory snapshot. The message names the
    /// offending key by its path, e.g. `segments[3].blocks[0].size`.
    #[error("not a PyTorch memory snapshot: {0}")]
    NotASnapshot(String),
    /// A line of an RMM CSV log that does not parse (`line` counts from 1).
    #[error("RMM log line {line}: {message}")]
    Rmm { line: usize, message: String },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
