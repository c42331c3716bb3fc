//! Errors of the tensor runtime.
//!
//! Design note: every user-reachable failure is a `TensorError` value, never a panic, so a
//! service built on this crate survives a bad request or an OOM. `OutOfMemory` keeps the
//! allocator's own message (PyTorch's wording) so tools that parse PyTorch OOMs parse ours.

use crate::dtype::DType;

/// Anything a tensor operation can refuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    #[error("shape mismatch in {op}: {msg}")]
    ShapeMismatch { op: &'static str, msg: String },
    #[error("{op}: expected dtype {expected}, got {got}")]
    DTypeMismatch {
        op: &'static str,
        expected: DType,
        got: DType,
    },
    #[error("{op}: dtype {dtype} is not supported here")]
    UnsupportedDType { op: &'static str, dtype: DType },
    #[error("{op}: expected all tensors on the same device, got {a} and {b}")]
    DeviceMismatch {
        op: &'static str,
        a: String,
        b: String,
    },
    #[error("{op}: not supported on device {device}")]
    UnsupportedDevice { op: &'static str, device: String },
    #[error("element 0 of tensors does not require grad and does not have a grad_fn")]
    NoGrad,
    #[error("{0}")]
    Autograd(String),
    #[error("one of the variables needed for gradient computation has been modified by an inplace operation: saved at version {saved}, now at version {now} ({op})")]
    ModifiedInPlace {
        op: &'static str,
        saved: u64,
        now: u64,
    },
    /// The allocator could not satisfy a request. `detail` carries vramroom-alloc's error
    /// (PyTorch's message facts) when the allocator is a `CachingAllocator`.
    #[error("{message}")]
    OutOfMemory {
        message: String,
        detail: Option<Box<vramroom_alloc::OutOfMemoryError>>,
    },
    #[error("allocator error: {0}")]
    Alloc(String),
    #[error("invalid argument to {op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },
    #[error("index out of range in {op}: {msg}")]
    IndexOutOfRange { op: &'static str, msg: String },
    /// The CUDA driver or a CUDA library failed (no GPU, a missing library, a launch error).
    #[error("CUDA: {0}")]
    Cuda(String),
    /// The device was interrupted ([`crate::Device::interrupt`]): the op stopped before
    /// allocating its output, so a request in flight ends at its next op (a load test's
    /// duration is over, or Ctrl-C).
    #[error("stopped: the device was interrupted")]
    Interrupted,
}

impl TensorError {
    pub fn shape(op: &'static str, msg: impl Into<String>) -> Self {
        TensorError::ShapeMismatch {
            op,
            msg: msg.into(),
        }
    }
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        TensorError::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }
    pub fn is_oom(&self) -> bool {
        matches!(self, TensorError::OutOfMemory { .. })
    }
    pub fn is_interrupted(&self) -> bool {
        matches!(self, TensorError::Interrupted)
    }
    pub(crate) fn oom(message: String) -> Self {
        TensorError::OutOfMemory {
            message,
            detail: None,
        }
    }
}

pub type Result<T> = std::result::Result<T, TensorError>;
