//! vramroom-alloc's `CachingAllocator` (PyTorch's policy) as a storage allocator.
//!
//! Design note: the runtime allocates everything on stream 0 (PyTorch's default stream), so
//! the policy sees the same request sequence PyTorch's allocator saw. A failed `free` cannot
//! be reported from a storage's `Drop`; it can only mean a pointer the allocator does not
//! own, which the runtime never hands it, so it is ignored.

use std::collections::BTreeMap;
use std::sync::Arc;

use vramroom_alloc::{AllocError, AllocatorConfig, CachingAllocator, HostDevice, SimDevice};

use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::memory::{Allocation, StorageAllocator};
use crate::workspace::CudaLikeWorkspace;

impl From<AllocError> for TensorError {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::OutOfMemory(oom) => TensorError::OutOfMemory {
                message: oom.to_string(),
                detail: Some(oom),
            },
            other => TensorError::Alloc(other.to_string()),
        }
    }
}

impl<D> StorageAllocator for CachingAllocator<D>
where
    D: vramroom_alloc::Device + 'static,
    CachingAllocator<D>: Send + Sync,
{
    fn allocate(&self, nbytes: u64) -> Result<Allocation> {
        let a = self.malloc(nbytes, 0)?;
        Ok(Allocation {
            ptr: a.ptr,
            size: a.size,
        })
    }
    fn free(&self, ptr: u64) {
        let _ = CachingAllocator::free(self, ptr);
    }
    fn memory_allocated(&self) -> u64 {
        CachingAllocator::memory_allocated(self)
    }
    fn memory_reserved(&self) -> u64 {
        CachingAllocator::memory_reserved(self)
    }
    fn max_memory_allocated(&self) -> u64 {
        CachingAllocator::max_memory_allocated(self)
    }
    fn capacity(&self) -> Option<u64> {
        Some(self.mem_get_info().1)
    }
    fn reset_peak_memory_stats(&self) {
        CachingAllocator::reset_peak_memory_stats(self)
    }
    fn empty_cache(&self) {
        CachingAllocator::empty_cache(self)
    }
    fn memory_stats(&self) -> BTreeMap<String, i64> {
        CachingAllocator::memory_stats(self)
    }
    fn memory_summary(&self, abbreviated: bool) -> String {
        CachingAllocator::memory_summary(self, abbreviated)
    }
}

impl Device {
    /// A meta device on a simulated GPU of `capacity` bytes under PyTorch's caching policy,
    /// with the library workspaces PyTorch's CUDA path allocates ([`CudaLikeWorkspace`]:
    /// cuDNN conv workspaces, cuBLAS handle workspaces). `set_workspace_policy` changes it.
    pub fn meta_caching(capacity: u64, config: AllocatorConfig) -> Device {
        let d = Device::meta(Arc::new(CachingAllocator::new(
            SimDevice::new(capacity),
            config,
        )));
        d.set_workspace_policy(Arc::new(CudaLikeWorkspace::h200()));
        d
    }
    /// A cpu device on real host memory under PyTorch's caching policy.
    pub fn cpu_caching(capacity: u64, config: AllocatorConfig) -> Device {
        Device::cpu(Arc::new(CachingAllocator::new(
            HostDevice::new(capacity),
            config,
        )))
    }
}
