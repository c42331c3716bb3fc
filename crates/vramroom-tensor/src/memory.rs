//! The door to the allocator, and the memory categories.
//!
//! Design note: storage talks to its device's allocator only through [`StorageAllocator`],
//! so the runtime runs on vramroom-alloc's `CachingAllocator` (PyTorch's policy) and, in
//! tests, on the plain allocators below. Category accounting lives here, not in the
//! allocator: the allocator knows blocks, the runtime knows what a block is *for*. Every
//! byte is counted at its block size, so the categories add up to `memory_allocated()`.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::{Result, TensorError};

/// One block handed out by an allocator: `ptr` is a device address (a real host address on
/// the cpu device), `size` the block size the allocator accounts (PyTorch rounds to 512).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub ptr: u64,
    pub size: u64,
}

/// What the runtime needs from a device allocator. `&self` everywhere: storages are freed
/// from whatever thread drops the last reference.
pub trait StorageAllocator: Send + Sync {
    /// Never called with 0 bytes (a zero-byte storage has a null pointer and no block).
    fn allocate(&self, nbytes: u64) -> Result<Allocation>;
    fn free(&self, ptr: u64);
    fn memory_allocated(&self) -> u64;
    fn memory_reserved(&self) -> u64 {
        self.memory_allocated()
    }
    fn max_memory_allocated(&self) -> u64;
    /// The device's total memory when the allocator knows it (a simulated or real GPU):
    /// what a model's weights are checked against before any layer is built.
    fn capacity(&self) -> Option<u64> {
        None
    }
    fn reset_peak_memory_stats(&self);
    fn empty_cache(&self) {}
    fn memory_stats(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        m.insert(
            "allocated_bytes.all.current".into(),
            self.memory_allocated() as i64,
        );
        m.insert(
            "allocated_bytes.all.peak".into(),
            self.max_memory_allocated() as i64,
        );
        m.insert(
            "reserved_bytes.all.current".into(),
            self.memory_reserved() as i64,
        );
        m
    }
    fn memory_summary(&self, _abbreviated: bool) -> String {
        format!(
            "allocated {} B (peak {} B), reserved {} B",
            self.memory_allocated(),
            self.max_memory_allocated(),
            self.memory_reserved()
        )
    }
}

/// PyTorch's block rounding for small requests (`kMinBlockSize`).
fn round512(n: u64) -> u64 {
    n.div_ceil(512) * 512
}

#[derive(Default)]
struct Counters {
    allocated: AtomicU64,
    peak: AtomicU64,
}

impl Counters {
    fn add(&self, n: u64) {
        let now = self.allocated.fetch_add(n, Ordering::SeqCst) + n;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }
    fn sub(&self, n: u64) {
        self.allocated.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Real host memory, no caching: every storage is one `std::alloc` call, 64-byte aligned and
/// zeroed. Block sizes are rounded to 512 like PyTorch's. Useful for the cpu device where the
/// caching policy does not matter, and in tests.
pub struct HostAllocator {
    capacity: u64,
    counters: Counters,
    sizes: Mutex<std::collections::HashMap<u64, u64>>,
}

impl HostAllocator {
    pub fn new(capacity: u64) -> Self {
        HostAllocator {
            capacity,
            counters: Counters::default(),
            sizes: Mutex::new(Default::default()),
        }
    }
}

impl StorageAllocator for HostAllocator {
    fn allocate(&self, nbytes: u64) -> Result<Allocation> {
        let size = round512(nbytes);
        if self.counters.allocated.load(Ordering::SeqCst) + size > self.capacity {
            return Err(TensorError::oom(format!(
                "host allocator out of memory: tried to allocate {nbytes} bytes with {} of {} in use",
                self.memory_allocated(),
                self.capacity
            )));
        }
        let layout = std::alloc::Layout::from_size_align(size as usize, 64)
            .map_err(|e| TensorError::Alloc(e.to_string()))?;
        // SAFETY: size is non-zero (callers never ask for 0 bytes, and round512 keeps it).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(TensorError::oom(format!(
                "host out of memory allocating {nbytes} bytes"
            )));
        }
        self.sizes.lock().insert(p as u64, size);
        self.counters.add(size);
        Ok(Allocation {
            ptr: p as u64,
            size,
        })
    }
    fn free(&self, ptr: u64) {
        let Some(size) = self.sizes.lock().remove(&ptr) else {
            return;
        };
        self.counters.sub(size);
        if let Ok(layout) = std::alloc::Layout::from_size_align(size as usize, 64) {
            // SAFETY: ptr came from alloc_zeroed with this very layout and is freed once
            // (it was just removed from the live map).
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        }
    }
    fn memory_allocated(&self) -> u64 {
        self.counters.allocated.load(Ordering::SeqCst)
    }
    fn max_memory_allocated(&self) -> u64 {
        self.counters.peak.load(Ordering::SeqCst)
    }
    fn reset_peak_memory_stats(&self) {
        self.counters
            .peak
            .store(self.memory_allocated(), Ordering::SeqCst);
    }
}

impl Drop for HostAllocator {
    fn drop(&mut self) {
        for (ptr, size) in self.sizes.lock().drain() {
            if let Ok(layout) = std::alloc::Layout::from_size_align(size as usize, 64) {
                // SAFETY: still-live blocks of this allocator, freed exactly once here.
                unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            }
        }
    }
}

/// Accounting only, fake addresses, no caching: the simplest meta-device allocator.
pub struct CountingAllocator {
    capacity: u64,
    counters: Counters,
    next: AtomicU64,
    sizes: Mutex<std::collections::HashMap<u64, u64>>,
}

impl CountingAllocator {
    pub fn new(capacity: u64) -> Self {
        CountingAllocator {
            capacity,
            counters: Counters::default(),
            next: AtomicU64::new(0x1000_0000),
            sizes: Mutex::new(Default::default()),
        }
    }
}

impl StorageAllocator for CountingAllocator {
    fn allocate(&self, nbytes: u64) -> Result<Allocation> {
        let size = round512(nbytes);
        if self.memory_allocated() + size > self.capacity {
            return Err(TensorError::oom(format!(
                "meta allocator out of memory: tried to allocate {nbytes} bytes with {} of {} in use",
                self.memory_allocated(),
                self.capacity
            )));
        }
        let ptr = self.next.fetch_add(size, Ordering::SeqCst);
        self.sizes.lock().insert(ptr, size);
        self.counters.add(size);
        Ok(Allocation { ptr, size })
    }
    fn free(&self, ptr: u64) {
        if let Some(size) = self.sizes.lock().remove(&ptr) {
            self.counters.sub(size);
        }
    }
    fn memory_allocated(&self) -> u64 {
        self.counters.allocated.load(Ordering::SeqCst)
    }
    fn max_memory_allocated(&self) -> u64 {
        self.counters.peak.load(Ordering::SeqCst)
    }
    fn reset_peak_memory_stats(&self) {
        self.counters
            .peak
            .store(self.memory_allocated(), Ordering::SeqCst);
    }
}

/// One call the runtime made on an allocator, as logged by [`RecordingAllocator`]. Sizes
/// are the requested bytes, as in the `alloc`/`free_requested` entries of a PyTorch trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemEvent {
    Alloc { ptr: u64, nbytes: u64 },
    Free { ptr: u64, nbytes: u64 },
}

/// Wraps an allocator and logs every allocate/free, for comparing allocation sequences
/// (meta against cpu, or against a PyTorch trace).
pub struct RecordingAllocator {
    inner: std::sync::Arc<dyn StorageAllocator>,
    log: Mutex<Vec<MemEvent>>,
    live: Mutex<std::collections::HashMap<u64, u64>>,
}

impl RecordingAllocator {
    pub fn new(inner: std::sync::Arc<dyn StorageAllocator>) -> Self {
        RecordingAllocator {
            inner,
            log: Mutex::new(Vec::new()),
            live: Mutex::new(Default::default()),
        }
    }
    /// The events so far, leaving the log empty.
    pub fn take(&self) -> Vec<MemEvent> {
        std::mem::take(&mut *self.log.lock())
    }
    /// The events as signed sizes: `+n` for an allocation, `-n` for a free.
    pub fn take_sizes(&self) -> Vec<i64> {
        self.take()
            .into_iter()
            .map(|e| match e {
                MemEvent::Alloc { nbytes, .. } => nbytes as i64,
                MemEvent::Free { nbytes, .. } => -(nbytes as i64),
            })
            .collect()
    }
}

impl StorageAllocator for RecordingAllocator {
    fn allocate(&self, nbytes: u64) -> Result<Allocation> {
        let a = self.inner.allocate(nbytes)?;
        self.live.lock().insert(a.ptr, nbytes);
        self.log.lock().push(MemEvent::Alloc { ptr: a.ptr, nbytes });
        Ok(a)
    }
    fn free(&self, ptr: u64) {
        let nbytes = self.live.lock().remove(&ptr).unwrap_or(0);
        self.log.lock().push(MemEvent::Free { ptr, nbytes });
        self.inner.free(ptr)
    }
    fn memory_allocated(&self) -> u64 {
        self.inner.memory_allocated()
    }
    fn memory_reserved(&self) -> u64 {
        self.inner.memory_reserved()
    }
    fn max_memory_allocated(&self) -> u64 {
        self.inner.max_memory_allocated()
    }
    fn reset_peak_memory_stats(&self) {
        self.inner.reset_peak_memory_stats()
    }
    fn empty_cache(&self) {
        self.inner.empty_cache()
    }
    fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.inner.memory_stats()
    }
    fn memory_summary(&self, abbreviated: bool) -> String {
        self.inner.memory_summary(abbreviated)
    }
}

/// What a block of memory is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryCategory {
    Parameter,
    Gradient,
    OptimizerState,
    /// Saved for backward by some op of a live graph.
    Activation,
    /// Anything else an op made: outputs not (yet) saved, workspaces, backward buffers.
    Temporary,
    Input,
}

impl MemoryCategory {
    pub const ALL: [MemoryCategory; 6] = [
        MemoryCategory::Parameter,
        MemoryCategory::Gradient,
        MemoryCategory::OptimizerState,
        MemoryCategory::Activation,
        MemoryCategory::Temporary,
        MemoryCategory::Input,
    ];
    pub fn name(self) -> &'static str {
        match self {
            MemoryCategory::Parameter => "parameter",
            MemoryCategory::Gradient => "gradient",
            MemoryCategory::OptimizerState => "optimizer_state",
            MemoryCategory::Activation => "activation",
            MemoryCategory::Temporary => "temporary",
            MemoryCategory::Input => "input",
        }
    }
    pub(crate) fn index(self) -> usize {
        self as usize
    }
    pub(crate) fn from_index(i: u8) -> MemoryCategory {
        MemoryCategory::ALL
            .get(i as usize)
            .copied()
            .unwrap_or(MemoryCategory::Temporary)
    }
}

/// Bytes per category at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CategoryBreakdown {
    pub bytes: [u64; 6],
}

impl CategoryBreakdown {
    pub fn get(&self, c: MemoryCategory) -> u64 {
        self.bytes[c.index()]
    }
    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }
    pub fn to_map(&self) -> BTreeMap<&'static str, u64> {
        MemoryCategory::ALL
            .iter()
            .map(|c| (c.name(), self.get(*c)))
            .collect()
    }
}

/// Current and peak-time breakdowns of one device. The peak is the moment the tracked total
/// last reached a new maximum, so it matches the allocator's `max_memory_allocated` when all
/// of the allocator's blocks come from storages.
#[derive(Debug, Default)]
pub(crate) struct CategoryTracker {
    pub current: CategoryBreakdown,
    pub peak: CategoryBreakdown,
}

impl CategoryTracker {
    pub fn add(&mut self, c: MemoryCategory, n: u64) {
        self.current.bytes[c.index()] += n;
        if self.current.total() > self.peak.total() {
            self.peak = self.current;
        }
    }
    pub fn sub(&mut self, c: MemoryCategory, n: u64) {
        let b = &mut self.current.bytes[c.index()];
        *b = b.saturating_sub(n);
    }
    pub fn retag(&mut self, from: MemoryCategory, to: MemoryCategory, n: u64) {
        self.sub(from, n);
        self.current.bytes[to.index()] += n;
    }
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

thread_local! {
    static CATEGORY: Cell<Option<MemoryCategory>> = const { Cell::new(None) };
}

/// RAII guard: storages allocated on this thread while it lives get `category` (instead of
/// `temporary`). Nestable; dropping restores the previous one.
pub struct CategoryGuard {
    prev: Option<MemoryCategory>,
}

/// Tag what this thread allocates from now until the guard drops, e.g.
/// `let _g = category_scope(MemoryCategory::Parameter);` around model construction.
pub fn category_scope(category: MemoryCategory) -> CategoryGuard {
    let prev = CATEGORY.with(|c| c.replace(Some(category)));
    CategoryGuard { prev }
}

impl Drop for CategoryGuard {
    fn drop(&mut self) {
        CATEGORY.with(|c| c.set(self.prev));
    }
}

pub(crate) fn current_category() -> MemoryCategory {
    CATEGORY
        .with(|c| c.get())
        .unwrap_or(MemoryCategory::Temporary)
}
