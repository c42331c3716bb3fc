//! Reference-counted device memory.
//!
//! Design note: a `Storage` owns one allocator block; tensors and views hold it through an
//! `Arc`, so the block goes back to the allocator exactly when the last view, saved tensor or
//! gradient referring to it drops — the moment PyTorch's `memory_allocated()` falls. The
//! version counter implements PyTorch's check that saved tensors were not modified in place.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::memory::{current_category, Allocation, MemoryCategory};

pub struct Storage {
    alloc: Allocation,
    nbytes: u64,
    device: Device,
    category: AtomicU8,
    version: AtomicU64,
}

impl Storage {
    /// `nbytes == 0` gives a null storage without touching the allocator, as PyTorch does.
    pub(crate) fn new(device: &Device, nbytes: u64) -> Result<Arc<Storage>> {
        let category = current_category();
        let alloc = if nbytes == 0 {
            Allocation { ptr: 0, size: 0 }
        } else {
            if device.is_interrupted() {
                return Err(TensorError::Interrupted);
            }
            let a = device.0.allocator.allocate(nbytes)?;
            device.0.tracker.lock().add(category, a.size);
            a
        };
        Ok(Arc::new(Storage {
            alloc,
            nbytes,
            device: device.clone(),
            category: AtomicU8::new(category as u8),
            version: AtomicU64::new(0),
        }))
    }
    pub fn ptr(&self) -> u64 {
        self.alloc.ptr
    }
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }
    /// The allocator's block size (what `memory_allocated()` counts).
    pub fn block_size(&self) -> u64 {
        self.alloc.size
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn category(&self) -> MemoryCategory {
        MemoryCategory::from_index(self.category.load(Ordering::Relaxed))
    }
    pub fn set_category(&self, c: MemoryCategory) {
        let old = MemoryCategory::from_index(self.category.swap(c as u8, Ordering::Relaxed));
        if old != c && self.alloc.size > 0 {
            self.device.0.tracker.lock().retag(old, c, self.alloc.size);
        }
    }
    /// Re-tags only if the storage is still `from` (so saving a parameter keeps it a parameter).
    pub(crate) fn retag_if(&self, from: MemoryCategory, to: MemoryCategory) {
        if self
            .category
            .compare_exchange(from as u8, to as u8, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && self.alloc.size > 0
        {
            self.device
                .0
                .tracker
                .lock()
                .retag(from, to, self.alloc.size);
        }
    }
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }
    pub(crate) fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if self.alloc.ptr != 0 || self.alloc.size != 0 {
            self.device
                .0
                .tracker
                .lock()
                .sub(self.category(), self.alloc.size);
            self.device.0.allocator.free(self.alloc.ptr);
        }
    }
}
