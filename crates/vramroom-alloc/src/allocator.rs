//! `CachingAllocator`: the thread-safe front of the policy, with PyTorch's API names.
//!
//! Design note: one mutex guards one device's whole state, as in PyTorch (which uses one
//! recursive mutex per device). The policy itself (policy.rs) is single-threaded and
//! deterministic; everything here is locking, queries and the snapshot.

use std::collections::BTreeMap;

use crate::lock::Mutex;

use crate::block::NIL;
use crate::config::{AllocatorConfig, ConfigError};
use crate::device::Device;
use crate::event::{AllocEvent, StreamId};
use crate::history::HistoryMode;
use crate::import::ImportSegment;
use crate::oom::AllocError;
use crate::policy::{fraction_limit, Allocation, Observer, State};
use crate::private::MempoolId;
use crate::snapshot::{BlockInfo, BlockState, SegmentInfo, Snapshot, Stack};
use crate::stats::DeviceStats;

pub struct CachingAllocator<D: Device> {
    state: Mutex<State<D>>,
}

impl<D: Device> CachingAllocator<D> {
    pub fn new(device: D, config: AllocatorConfig) -> Self {
        CachingAllocator {
            state: Mutex::new(State::new(device, config)),
        }
    }

    /// Allocate `size` bytes on `stream` (0 = the default stream).
    #[inline]
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        self.state.lock().malloc(size, stream, None)
    }

    /// As [`malloc`](Self::malloc), with a stack to store on the block and in the history.
    pub fn malloc_with_context(
        &self,
        size: u64,
        stream: StreamId,
        ctx: Stack,
    ) -> Result<Allocation, AllocError> {
        self.state.lock().malloc(size, stream, Some(ctx))
    }

    /// Return a block; it goes to the cache, not to the device.
    #[inline]
    pub fn free(&self, ptr: u64) -> Result<(), AllocError> {
        self.state.lock().free(ptr)
    }

    /// `Tensor.record_stream`: the block is in use on `stream` too; its memory is reused only
    /// after the work queued on `stream` at free time has finished.
    pub fn record_stream(&self, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        self.state.lock().record_stream(ptr, stream)
    }

    /// A request that goes to private pool `id` (made on first use), whatever is being
    /// captured: how a replay re-issues a recorded request whose pool it knows.
    pub fn malloc_in_pool(
        &self,
        size: u64,
        stream: StreamId,
        pool: MempoolId,
    ) -> Result<Allocation, AllocError> {
        self.state.lock().malloc_in_pool(size, stream, pool)
    }

    /// `createOrIncrefPool`: a CUDA graph or a `MemPool` starts using pool `id`.
    pub fn create_or_incref_pool(&self, id: MempoolId) {
        self.state.lock().create_or_incref_pool(id);
    }

    /// `releasePool`: a user of pool `id` is gone; once none is left, `empty_cache` gives
    /// its free segments back.
    pub fn release_pool(&self, id: MempoolId) {
        self.state.lock().release_pool(id);
    }

    /// `beginAllocateToPool`: a capture (`Some(stream)`) or `use_mem_pool` (`None`: every
    /// stream) sends requests to pool `id`.
    pub fn begin_allocate_to_pool(&self, id: MempoolId, stream: Option<StreamId>) {
        self.state.lock().begin_allocate_to_pool(id, stream);
    }

    pub fn end_allocate_to_pool(&self, id: MempoolId) {
        self.state.lock().end_allocate_to_pool(id);
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&self) {
        self.state.lock().release_cached_blocks();
    }

    pub fn stats(&self) -> DeviceStats {
        self.state.lock().stats.get()
    }

    /// `torch.cuda.memory_stats()`.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.state.lock().stats.get().memory_stats()
    }

    pub fn memory_allocated(&self) -> u64 {
        self.state.lock().stats.allocated_bytes_all().current as u64
    }
    pub fn max_memory_allocated(&self) -> u64 {
        self.state.lock().stats.allocated_bytes_all().peak as u64
    }
    pub fn memory_reserved(&self) -> u64 {
        self.state.lock().stats.reserved_bytes_all().current as u64
    }
    pub fn max_memory_reserved(&self) -> u64 {
        self.state.lock().stats.reserved_bytes_all().peak as u64
    }
    pub fn reset_peak_memory_stats(&self) {
        self.state.lock().stats.reset_peak();
    }
    pub fn reset_accumulated_memory_stats(&self) {
        self.state.lock().stats.reset_accumulated();
    }

    /// `torch.cuda.memory_summary(abbreviated)`.
    pub fn memory_summary(&self, abbreviated: bool) -> String {
        let st = self.state.lock();
        crate::summary::memory_summary(&st.stats.get(), st.device.index(), abbreviated)
    }

    /// `torch.cuda.mem_get_info()`: the device's (free, total).
    pub fn mem_get_info(&self) -> (u64, u64) {
        self.state.lock().device.mem_get_info()
    }

    /// `set_per_process_memory_fraction`: limits what this allocator may reserve.
    pub fn set_per_process_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocError::Device(format!(
                "invalid fraction {fraction}, please set within (0, 1)"
            )));
        }
        let mut st = self.state.lock();
        let total = st.device.total_memory();
        st.allowed_memory_maximum = fraction_limit(fraction, total);
        Ok(())
    }

    /// The limit behind a memory fraction, in bytes (`None`: no limit): for a replay that
    /// knows the bytes a recording was allowed, not the fraction of which device.
    pub fn set_memory_limit(&self, bytes: Option<u64>) {
        self.state.lock().allowed_memory_maximum = bytes;
    }

    pub fn get_per_process_memory_fraction(&self) -> f64 {
        let st = self.state.lock();
        match st.allowed_memory_maximum {
            Some(a) => a as f64 / st.device.total_memory() as f64,
            None => 1.0,
        }
    }

    /// `_set_allocator_settings`: re-parse a config string at runtime. The `max_split_size`
    /// statistic keeps its creation-time value, as in PyTorch.
    pub fn set_allocator_settings(&self, conf: &str) -> Result<(), ConfigError> {
        let mut st = self.state.lock();
        let mut cfg = st.config.clone();
        cfg.update(conf)?;
        st.set_config(cfg);
        Ok(())
    }

    pub fn config(&self) -> AllocatorConfig {
        self.state.lock().config.clone()
    }

    /// `_record_memory_history(enabled, max_entries=...)`.
    pub fn record_memory_history(&self, mode: HistoryMode, max_entries: usize) {
        let mut st = self.state.lock();
        st.history.configure(mode, max_entries);
        st.refresh_listening();
    }

    /// `torch.cuda.memory._snapshot()`.
    pub fn snapshot(&self) -> Snapshot {
        let mut st = self.state.lock();
        let segments = segments(&st);
        let traces = st.history.entries();
        let active: u64 = segments.iter().map(|s| s.active_size).sum();
        // PyTorch copies the trace before appending its own `snapshot` entry.
        st.emit(
            AllocEvent::Snapshot {
                active_bytes: active,
            },
            None,
        );
        Snapshot {
            segments,
            device_traces: vec![traces],
            allocator_settings: st.config.to_settings(),
            external_annotations: Vec::new(),
        }
    }

    /// Subscribe to every allocator event; returns an id for [`remove_observer`](Self::remove_observer).
    pub fn add_observer(&self, o: Box<dyn Observer>) -> usize {
        let mut st = self.state.lock();
        let id = st.next_observer;
        st.next_observer += 1;
        st.observers.push((id, o));
        st.refresh_listening();
        id
    }

    pub fn remove_observer(&self, id: usize) -> Option<Box<dyn Observer>> {
        let mut st = self.state.lock();
        let i = st.observers.iter().position(|(k, _)| *k == id)?;
        let o = st.observers.remove(i).1;
        st.refresh_listening();
        Some(o)
    }

    /// Run `f` on the device under the allocator's lock (tests drive `SimDevice` this way).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut self.state.lock().device)
    }

    /// The block size behind an allocated pointer.
    pub fn block_size(&self, ptr: u64) -> Option<u64> {
        let st = self.state.lock();
        st.active.get(ptr).map(|id| st.arena.get(id).size)
    }

    /// How many segments `snapshot()` would list, without taking a snapshot (which would
    /// append a `snapshot` entry to the history).
    pub fn segment_count(&self) -> usize {
        segments(&self.state.lock()).len()
    }

    /// Largest free cached block (PyTorch's `cacheInfo`, used to size workspaces).
    pub fn largest_free_block(&self) -> u64 {
        let st = self.state.lock();
        st.pools
            .iter()
            .flat_map(|p| p.blocks.to_vec(&st.arena))
            .map(|id| st.arena.get(id).size)
            .max()
            .unwrap_or(0)
    }

    /// Rebuild a segment that existed before a recording began, with its live blocks at
    /// their offsets. Returns the segment's (or reservation's) base address.
    pub fn import_segment(&self, seg: &ImportSegment) -> Result<u64, AllocError> {
        self.state.lock().import_segment(seg)
    }

    /// Verify every structural invariant and that each statistic equals its value
    /// recomputed from the blocks. For tests; O(blocks).
    pub fn check_invariants(&self) -> Result<(), String> {
        crate::invariants::check(&self.state.lock())
    }
}

/// Segments as `_snapshot()` reports them: one per segment, or one per contiguous mapped run
/// of an expandable segment; sorted by address.
fn segments<D: Device>(st: &State<D>) -> Vec<SegmentInfo> {
    let a = &st.arena;
    let mut out = Vec::new();
    for head in a.live_ids() {
        let b = a.get(head);
        let is_head = if b.is_expandable() {
            b.mapped && (b.prev == NIL || !a.get(b.prev).mapped)
        } else {
            b.prev == NIL
        };
        if !is_head {
            continue;
        }
        let mut seg = SegmentInfo {
            device: st.device.index(),
            address: b.ptr,
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: st.private.real(b.stream),
            segment_type: b.pool.segment_type().into(),
            segment_pool_id: {
                let (a, b) = st.private.id_of(b.stream);
                (a as i64, b as i64)
            },
            is_expandable: b.is_expandable(),
            frames: a.segment_context(head).cloned().unwrap_or_default(),
            blocks: Vec::new(),
        };
        let mut cur = head;
        while cur != NIL && a.get(cur).mapped {
            let x = a.get(cur);
            let active = x.allocated || x.event_count > 0 || x.has_uses;
            let state = if x.allocated {
                BlockState::ActiveAllocated
            } else if active {
                BlockState::ActivePendingFree
            } else {
                BlockState::Inactive
            };
            seg.total_size += x.size;
            if x.allocated {
                seg.allocated_size += x.size;
            }
            if active {
                seg.active_size += x.size;
                seg.requested_size += x.requested;
            }
            seg.blocks.push(BlockInfo {
                address: x.ptr,
                size: x.size,
                requested_size: x.requested,
                state,
                frames: if active {
                    a.context(cur).cloned().unwrap_or_default()
                } else {
                    Stack::empty()
                },
            });
            cur = x.next;
        }
        out.push(seg);
    }
    out.sort_by_key(|s| s.address);
    out
}
