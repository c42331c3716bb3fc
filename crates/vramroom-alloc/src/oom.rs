//! Allocation errors. `OutOfMemoryError` carries the facts of PyTorch's message and renders
//! it in PyTorch 2.11's exact form, so tools that parse PyTorch OOMs parse ours.

use crate::size::format_size;

/// The facts PyTorch puts in `torch.OutOfMemoryError`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfMemoryError {
    pub device: i64,
    /// The user's request in bytes.
    pub requested: u64,
    /// The segment size that was attempted ("Tried to allocate").
    pub alloc_size: u64,
    /// The device's total memory.
    pub total: u64,
    /// Free memory per the driver at the moment of failure.
    pub free: u64,
    /// The per-process limit, when a memory fraction is set.
    pub allowed: Option<u64>,
    /// `allocated_bytes.all.current` at failure.
    pub allocated: u64,
    /// `reserved_bytes.all.current` at failure.
    pub reserved: u64,
    /// Free cached bytes in private pools (PyTorch calls them "allocated in private pools").
    pub private_pools: u64,
    /// NVML per-process lines, e.g. `Including non-PyTorch memory, this process has … in use. `
    pub proc_info: String,
    /// The request was ≥ 1 EB and was refused before touching any state.
    pub exceeds_1eb: bool,
}

impl std::fmt::Display for OutOfMemoryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.exceeds_1eb {
            return write!(
                f,
                "CUDA out of memory. Tried to allocate more than 1EB memory."
            );
        }
        let allowed = self
            .allowed
            .map(|a| format!("{} allowed; ", format_size(a)))
            .unwrap_or_default();
        let private = if self.private_pools > 0 {
            format!(
                "with {} allocated in private pools (e.g., CUDA Graphs), ",
                format_size(self.private_pools)
            )
        } else {
            String::new()
        };
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. {}{}Of the allocated memory {} is allocated by PyTorch, {}and {} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            format_size(self.alloc_size),
            self.device,
            format_size(self.total),
            format_size(self.free),
            self.proc_info,
            allowed,
            format_size(self.allocated + self.private_pools),
            private,
            format_size(
                self.reserved
                    .saturating_sub(self.allocated)
                    .saturating_sub(self.private_pools)
            ),
        )
    }
}

impl std::error::Error for OutOfMemoryError {}

/// Everything `malloc`, `free` and `record_stream` can fail with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemoryError>),
    /// PyTorch's text for freeing a pointer it does not own.
    #[error("invalid device pointer: {0:#x}")]
    InvalidPointer(u64),
    #[error("{0}")]
    Device(String),
}

impl AllocError {
    pub fn is_oom(&self) -> bool {
        matches!(self, AllocError::OutOfMemory(_))
    }
    pub fn as_oom(&self) -> Option<&OutOfMemoryError> {
        match self {
            AllocError::OutOfMemory(e) => Some(e),
            _ => None,
        }
    }
}
