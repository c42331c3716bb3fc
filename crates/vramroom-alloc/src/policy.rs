//! The allocation policy: PyTorch 2.11's `DeviceCachingAllocator`.
//!
//! Design note: `State` is a plain single-threaded state machine; `CachingAllocator` wraps it
//! in a mutex. Every decision follows pytorch-allocator.md sections 3-9 in PyTorch's order,
//! because the order is observable: best fit breaks ties by address, a split hands the front
//! to the client, the OOM fallback chain frees caches in a fixed sequence, and the statistics
//! and trace entries come out of the same points. State changes that matter to anyone outside
//! are emitted as `AllocEvent`s (see `emit`): stats and history are observers of those.
//!
//! Releasing memory (empty_cache, GC, oversize release) lives in release.rs, expandable
//! segments in expandable.rs and private pools (CUDA graphs, `MemPool`) in private.rs; the
//! first two are further `impl State` blocks.

use std::collections::{HashMap, VecDeque};

use crate::block::{Arena, BlockId, Membership, MAX_STREAM_USES, NIL};
use crate::config::AllocatorConfig;
use crate::device::{Device, DeviceError, EventId};
use crate::event::{AllocEvent, PoolKind, StreamId};
use crate::expandable::ExpandableSegment;
use crate::history::History;
use crate::oom::{AllocError, OutOfMemoryError};
use crate::pool::BlockPool;
use crate::private::PrivatePools;
use crate::ptrmap::PtrMap;
use crate::snapshot::Stack;
use crate::stats::LiveStats;

pub const MIN_BLOCK_SIZE: u64 = 512;
pub const SMALL_SIZE: u64 = 1 << 20;
pub const SMALL_BUFFER: u64 = 2 << 20;
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
pub const ROUND_LARGE: u64 = 2 << 20;
pub const ONE_EB: u64 = 1 << 60;

/// Receives every allocator event, after the statistics were updated.
pub trait Observer: Send {
    fn on_event(&mut self, ev: &AllocEvent);
}

/// What `malloc` hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    pub ptr: u64,
    /// The block size, which `memory_allocated` counts (≥ the rounded request).
    pub size: u64,
}

pub(crate) struct State<D: Device> {
    pub device: D,
    pub config: AllocatorConfig,
    /// Expandable segments are on in the config *and* the device has virtual memory.
    pub expandable_active: bool,
    pub arena: Arena,
    /// The small and large pools, indexed by `PoolKind` (an index, not a match: which pool
    /// a request falls in is a coin toss on mixed workloads).
    pub pools: [BlockPool; 2],
    /// Allocated blocks by address (PyTorch's pointer map). Pending frees are not here.
    pub active: PtrMap,
    /// Bytes obtained from the device: cudaMalloc'd plus mapped.
    pub total_allocated_memory: u64,
    pub allowed_memory_maximum: Option<u64>,
    /// Streams recorded with `record_stream` on allocated blocks (flagged by
    /// `Block::has_uses`): rare, so kept out of the blocks' hot cache line.
    pub stream_uses: HashMap<BlockId, Vec<StreamId>>,
    /// Per-stream FIFO of (event, block) guarding reuse after `record_stream`.
    pub stream_events: Vec<(StreamId, VecDeque<(EventId, BlockId)>)>,
    pub outstanding_events: usize,
    pub expandable: Vec<Option<ExpandableSegment>>,
    /// The statistics (read them through `LiveStats::get`: `freed` is derived on read).
    pub stats: LiveStats,
    pub history: History,
    /// CUDA graphs' and `MemPool`s' pools; their blocks sit in `pools` under virtual streams.
    pub private: PrivatePools,
    pub observers: Vec<(usize, Box<dyn Observer>)>,
    /// `history.enabled() || !observers.is_empty()`, kept by `refresh_listening` whenever
    /// either changes: the hot paths ask several times a pair.
    listening: bool,
    /// Some pool's GC clock has ticked (clocks never go back), so free blocks get stamped.
    gc_ticked: bool,
    /// The config rounds some sizes up by power-of-two divisions (else `round_size` is the
    /// plain 512-byte rounding), refreshed with the config.
    roundup_on: bool,
    pub next_observer: usize,
}

/// `round_size`: the block size a request of `n` bytes is rounded to.
#[inline]
pub fn round_size(config: &AllocatorConfig, n: u64) -> u64 {
    if n < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let d = config.divisions_for(n);
    if d > 1 && n > MIN_BLOCK_SIZE * d {
        roundup_power2_next_division(n, d)
    } else {
        round_512(n)
    }
}

/// Plain rounding up to a multiple of 512 bytes, at least 512: `round_size` without
/// power-of-two divisions.
#[inline(always)]
fn round_512(n: u64) -> u64 {
    // Saturates for requests within 511 bytes of 2^64: no device holds them, so they OOM.
    n.div_ceil(MIN_BLOCK_SIZE)
        .max(1)
        .saturating_mul(MIN_BLOCK_SIZE)
}

fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor.saturating_mul(2);
    }
    let r = size & !(step - 1);
    if r == size {
        size
    } else {
        // Saturates near 2^64, where the request OOMs anyway.
        r.saturating_add(step)
    }
}

/// Whether `round_size` can differ from plain 512-byte rounding under `config`.
fn roundup_configured(config: &AllocatorConfig) -> bool {
    config.roundup_power2_divisions.iter().any(|&d| d > 1)
}

/// `get_allocation_size`: the segment asked from the device for a rounded size.
pub fn allocation_size(config: &AllocatorConfig, s: u64) -> u64 {
    if s <= SMALL_SIZE {
        SMALL_BUFFER
    } else if s < MIN_LARGE_ALLOC {
        config.large_segment_size
    } else {
        ROUND_LARGE * s.div_ceil(ROUND_LARGE)
    }
}

pub fn pool_for(s: u64) -> PoolKind {
    if s <= SMALL_SIZE {
        PoolKind::Small
    } else {
        PoolKind::Large
    }
}

impl<D: Device> State<D> {
    pub fn new(device: D, config: AllocatorConfig) -> Self {
        let expandable_active = config.expandable_segments && device.supports_vmm();
        if config.expandable_segments && !expandable_active {
            tracing::warn!("expandable_segments is not supported by this device; ignoring it");
        }
        let total = device.total_memory();
        let allowed = fraction_limit(config.per_process_memory_fraction, total);
        let stats = LiveStats::new(max_split_stat(&config));
        let mut st = State {
            device,
            config,
            expandable_active,
            arena: Arena::with_capacity(256),
            pools: [BlockPool::new(), BlockPool::new()],
            active: PtrMap::with_capacity(256),
            total_allocated_memory: 0,
            allowed_memory_maximum: allowed,
            stream_uses: HashMap::new(),
            stream_events: Vec::new(),
            outstanding_events: 0,
            expandable: Vec::new(),
            stats,
            history: History::default(),
            private: PrivatePools::default(),
            observers: Vec::new(),
            listening: false,
            gc_ticked: false,
            roundup_on: false,
            next_observer: 0,
        };
        st.roundup_on = roundup_configured(&st.config);
        st.refresh_listening();
        st
    }

    pub fn set_config(&mut self, config: AllocatorConfig) {
        self.expandable_active = config.expandable_segments && self.device.supports_vmm();
        self.roundup_on = roundup_configured(&config);
        self.config = config;
    }

    #[inline]
    pub fn max_split(&self) -> u64 {
        self.config.max_split_size
    }

    #[inline]
    pub fn pool_ref(&self, k: PoolKind) -> &BlockPool {
        &self.pools[k as usize]
    }

    /// Hand an event to the stats, the history and every observer.
    ///
    /// Always inlined: every call site builds one known variant, so the stats' `match`
    /// folds away and only that variant's cell updates remain.
    #[inline(always)]
    pub fn emit(&mut self, ev: AllocEvent, ctx: Option<&Stack>) {
        self.stats.observe(&ev);
        if self.has_listeners() {
            self.notify(ev, ctx);
        }
    }

    /// As [`emit`](Self::emit), with the stack of block `id` (cloned only if someone
    /// listens).
    #[inline(always)]
    fn emit_with_block_context(&mut self, ev: AllocEvent, id: BlockId) {
        self.stats.observe(&ev);
        if self.has_listeners() {
            let ctx = self.arena.context(id).cloned();
            self.notify(ev, ctx.as_ref());
        }
    }

    /// Whether anything beyond the stats sees events: the history or an observer.
    #[inline(always)]
    fn has_listeners(&self) -> bool {
        debug_assert_eq!(
            self.listening,
            self.history.enabled() || !self.observers.is_empty()
        );
        self.listening
    }

    /// Call after changing `history` or `observers`.
    pub fn refresh_listening(&mut self) {
        self.listening = self.history.enabled() || !self.observers.is_empty();
    }

    /// The history and the observers, in that order (after the stats). Out of line, so
    /// the hot paths carry only the stats' cell updates; the event is taken by value so
    /// that it is built in memory only on this path.
    #[inline(never)]
    fn notify(&mut self, ev: AllocEvent, ctx: Option<&Stack>) {
        let ev = if self.private.any() {
            ev.map_stream(|s| self.private.real(s))
        } else {
            ev
        };
        if self.history.enabled() {
            let t = self.device.now_us();
            self.history.record(&ev, t, ctx);
        }
        for (_, o) in self.observers.iter_mut() {
            o.on_event(&ev);
        }
    }

    /// Insert a free block into its pool's `blocks` set, stamping its GC age base.
    #[inline(always)]
    pub fn insert_free(&mut self, id: BlockId) {
        let kind = self.arena.get(id).pool;
        let pool = &mut self.pools[kind as usize];
        pool.blocks.insert(&mut self.arena, id);
        let base = pool.get_free_blocks_call_count;
        // Clocks only tick while GC is on and never go back. Until either has ticked,
        // every stamp would be 0, which is what the side table holds, so the store (to a
        // line nothing else here touches) waits for the first tick.
        if self.gc_ticked {
            self.arena.set_gc_count_base(id, base);
        }
    }

    #[inline(always)]
    pub fn remove_free(&mut self, id: BlockId) {
        let kind = self.arena.get(id).pool;
        let member = self.arena.get(id).member;
        let pool = &mut self.pools[kind as usize];
        match member {
            Membership::Blocks => pool.blocks.remove(&mut self.arena, id),
            Membership::Unmapped => pool.unmapped.remove(&mut self.arena, id),
            Membership::None | Membership::Dead => {}
        }
    }

    /// A new block of `like`'s segment (same stream, pool, expandable segment), linked
    /// between `prev` and `next`, which may be NIL.
    pub(crate) fn splice_new(
        &mut self,
        like: BlockId,
        ptr: u64,
        size: u64,
        mapped: bool,
        prev: BlockId,
        next: BlockId,
    ) -> BlockId {
        let (stream, kind, exp) = {
            let l = self.arena.get(like);
            (l.stream, l.pool, l.expandable)
        };
        let id = self.arena.alloc(ptr, size, stream, kind);
        {
            let b = self.arena.get_mut(id);
            b.mapped = mapped;
            b.expandable = exp;
            b.prev = prev;
            b.next = next;
        }
        if prev != NIL {
            self.arena.get_mut(prev).next = id;
        }
        if next != NIL {
            self.arena.get_mut(next).prev = id;
        }
        id
    }

    pub fn insert_unmapped(&mut self, id: BlockId) {
        let kind = self.arena.get(id).pool;
        let pool = &mut self.pools[kind as usize];
        pool.unmapped.insert(&mut self.arena, id);
    }

    // ----- malloc -------------------------------------------------------------------------

    pub fn malloc(
        &mut self,
        n: u64,
        stream: StreamId,
        ctx: Option<Stack>,
    ) -> Result<Allocation, AllocError> {
        if n >= ONE_EB {
            return Err(self.exceeds_one_eb(n));
        }
        if n == 0 {
            // PyTorch never sends zero-byte requests to the allocator: a null pointer.
            return Ok(Allocation { ptr: 0, size: 0 });
        }
        let stream = if self.private.routing() {
            // A capture or `use_mem_pool` is underway: no events are processed, as in
            // PyTorch, and the request may go to a private pool.
            self.private.route(stream)
        } else {
            self.process_events();
            stream
        };
        self.malloc_keyed(n, stream, ctx)
    }

    /// `malloc` after routing: `stream` is the key stream (a private pool's virtual one, or
    /// the real one for the default pool) and events were processed if they are to be.
    #[inline(always)]
    pub(crate) fn malloc_keyed(
        &mut self,
        n: u64,
        stream: StreamId,
        ctx: Option<Stack>,
    ) -> Result<Allocation, AllocError> {
        let s = if self.roundup_on {
            round_size(&self.config, n)
        } else {
            round_512(n)
        };
        let kind = pool_for(s);
        let block = match self.get_free_block(kind, stream, s) {
            Some(b) => b,
            None => self.malloc_miss(kind, stream, s, n, ctx.as_ref())?,
        };
        let split = self.should_split(block, s);
        Ok(self.alloc_found_block(block, stream, s, n, split, ctx))
    }

    /// The cache had no block: GC, a new segment, then the fallback chain, then OOM. Out of
    /// line, so the cache-hit path stays small.
    #[cold]
    #[inline(never)]
    fn malloc_miss(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        s: u64,
        n: u64,
        ctx: Option<&Stack>,
    ) -> Result<BlockId, AllocError> {
        let alloc_size = allocation_size(&self.config, s);
        if self.gc_enabled() {
            self.garbage_collect_cached_blocks();
        }
        let mut found = self.alloc_block(kind, stream, s, alloc_size, false, ctx)?;
        if found.is_none() && self.release_available_cached_blocks(kind, stream, s) {
            found = self.alloc_block(kind, stream, s, alloc_size, false, ctx)?;
        }
        // The last resort empties the cache, which PyTorch never does during a capture.
        if found.is_none() && !self.private.routing() {
            self.release_cached_blocks();
            found = self.alloc_block(kind, stream, s, alloc_size, true, ctx)?;
        }
        match found {
            Some(block) => Ok(block),
            None => Err(self.out_of_memory(n, s, alloc_size, stream)),
        }
    }

    #[cold]
    fn exceeds_one_eb(&self, n: u64) -> AllocError {
        let (free, total) = self.device.mem_get_info();
        AllocError::OutOfMemory(Box::new(OutOfMemoryError {
            device: self.device.index(),
            requested: n,
            alloc_size: n,
            total,
            free,
            allowed: self.allowed_memory_maximum,
            allocated: 0,
            reserved: 0,
            private_pools: 0,
            proc_info: String::new(),
            exceeds_1eb: true,
        }))
    }

    pub fn gc_enabled(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    fn out_of_memory(&mut self, n: u64, s: u64, alloc_size: u64, stream: StreamId) -> AllocError {
        let (free, total) = self.device.mem_get_info();
        let private_pools = self.private_free_cached_bytes();
        self.emit(
            AllocEvent::Oom {
                size: s,
                device_free: free,
                stream,
            },
            None,
        );
        AllocError::OutOfMemory(Box::new(OutOfMemoryError {
            device: self.device.index(),
            requested: n,
            alloc_size,
            total,
            free,
            allowed: self.allowed_memory_maximum,
            allocated: self.stats.allocated_bytes_all().current.max(0) as u64,
            reserved: self.stats.reserved_bytes_all().current.max(0) as u64,
            private_pools,
            proc_info: self.device.process_memory_info(),
            exceeds_1eb: false,
        }))
    }

    /// `get_free_block`: best fit in the request's pool and stream.
    fn get_free_block(&mut self, kind: PoolKind, stream: StreamId, s: u64) -> Option<BlockId> {
        let gc = self.gc_enabled();
        let expandable_on = self.expandable_active;
        let m = self.config.max_split_size;
        let r = self.config.max_non_split_rounding_size;
        self.gc_ticked |= gc;
        let pool = &mut self.pools[kind as usize];
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let a = &self.arena;
        let mut it = pool.blocks.best_fit(a, stream, s)?;
        if a.get(it).is_expandable() {
            if expandable_on {
                // A block that can grow into the unmapped tail counts as its grown size for
                // best fit, so blocks that cannot grow are preferred over the growable tail.
                let exp_size = |id: BlockId| {
                    let b = a.get(id);
                    b.size
                        + if b.next != NIL && !a.get(b.next).mapped {
                            a.get(b.next).size
                        } else {
                            0
                        }
                };
                while a.get(it).is_expandable() {
                    match pool.blocks.successor(a, it) {
                        Some(nx) if a.get(nx).stream == stream && exp_size(nx) < exp_size(it) => {
                            it = nx
                        }
                        _ => break,
                    }
                }
            } else {
                // Expandable segments were switched off: honour it, skip their blocks.
                loop {
                    it = pool.blocks.successor(a, it)?;
                    let b = a.get(it);
                    if b.stream != stream {
                        return None;
                    }
                    if !b.is_expandable() {
                        break;
                    }
                }
            }
        }
        let size = a.get(it).size;
        if s < m && size >= m {
            return None;
        }
        if s >= m && size >= s.saturating_add(r) {
            return None;
        }
        pool.blocks.remove(&mut self.arena, it);
        Some(it)
    }

    /// `alloc_block`: a new segment from the device (or new pages of an expandable segment).
    pub(crate) fn alloc_block(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        s: u64,
        alloc_size: u64,
        retry: bool,
        ctx: Option<&Stack>,
    ) -> Result<Option<BlockId>, AllocError> {
        if retry {
            self.emit(AllocEvent::AllocRetry, None);
        }
        if let Some(allowed) = self.allowed_memory_maximum {
            // saturating: a segment near 2^64 bytes (huge large_segment_size) must not wrap
            if self.total_allocated_memory.saturating_add(alloc_size) > allowed {
                return Ok(None);
            }
        }
        if self.expandable_active {
            return self.try_allocate_expandable_block(kind, stream, s, ctx);
        }
        let ptr = match self.device.malloc(alloc_size) {
            Ok(p) => p,
            Err(DeviceError::OutOfMemory) => return Ok(None),
            Err(DeviceError::Other(e)) => return Err(AllocError::Device(e)),
        };
        self.total_allocated_memory += alloc_size;
        let id = self.arena.alloc(ptr, alloc_size, stream, kind);
        self.arena.set_segment_context(id, ctx.cloned());
        let oversize = alloc_size >= self.max_split();
        self.emit(
            AllocEvent::SegmentAlloc {
                pool: kind,
                ptr,
                size: alloc_size,
                stream,
                oversize,
            },
            ctx,
        );
        Ok(Some(id))
    }

    fn should_split(&self, id: BlockId, s: u64) -> bool {
        let b = self.arena.get(id);
        let remaining = b.size - s;
        // Both rules, then a select (the pool is a coin toss on mixed workloads).
        let small_rule = remaining >= MIN_BLOCK_SIZE;
        let large_rule = (s < self.max_split()) & (remaining > SMALL_SIZE);
        let small = b.pool.is_small() | self.expandable_active;
        (small & small_rule) | (!small & large_rule)
    }

    /// `alloc_found_block`: split if asked, mark allocated, account.
    fn alloc_found_block(
        &mut self,
        block: BlockId,
        stream: StreamId,
        s: u64,
        n: u64,
        split: bool,
        ctx: Option<Stack>,
    ) -> Allocation {
        let (already_split, expandable, kind) = {
            let b = self.arena.get(block);
            (b.is_split(), b.is_expandable(), b.pool)
        };
        let client = if split {
            let remaining = block;
            let (ptr, prev, exp) = {
                let r = self.arena.get(remaining);
                (r.ptr, r.prev, r.expandable)
            };
            let c = self.arena.alloc(ptr, s, stream, kind);
            {
                let cb = self.arena.get_mut(c);
                cb.expandable = exp;
                cb.prev = prev;
                cb.next = remaining;
            }
            self.arena.get_mut_or_scratch(prev).next = c;
            let rem_size = {
                let r = self.arena.get_mut(remaining);
                r.prev = c;
                r.ptr += s;
                r.size -= s;
                r.size
            };
            self.insert_free(remaining);
            if !expandable {
                // An already-split inactive block shrinks by s; a previously unsplit block
                // now leaves a split inactive remainder.
                let (blocks, bytes) = if already_split {
                    (0, -(s as i64))
                } else {
                    (1, rem_size as i64)
                };
                self.emit_inactive_split(kind, blocks, bytes);
            }
            c
        } else {
            if !expandable {
                let size = self.arena.get(block).size as i64;
                let split = already_split as i64;
                self.emit_inactive_split(kind, -split, -split * size);
            }
            block
        };
        let (ptr, size) = {
            let b = self.arena.get_mut(client);
            b.allocated = true;
            b.requested = n;
            (b.ptr, b.size)
        };
        self.arena.set_context(client, ctx);
        self.active.insert_new(ptr, client);
        let oversize = size >= self.max_split();
        self.emit_with_block_context(
            AllocEvent::Alloc {
                pool: kind,
                ptr,
                block_size: size,
                requested: n,
                stream,
                oversize,
            },
            client,
        );
        Allocation { ptr, size }
    }

    // ----- free ---------------------------------------------------------------------------

    pub fn free(&mut self, ptr: u64) -> Result<(), AllocError> {
        if ptr == 0 {
            return Ok(());
        }
        let id = self
            .active
            .remove(ptr)
            .ok_or(AllocError::InvalidPointer(ptr))?;
        let (kind, size, requested, stream, has_uses) = {
            let b = self.arena.get_mut(id);
            b.allocated = false;
            (b.pool, b.size, b.requested, b.stream, b.has_uses)
        };
        if has_uses {
            // The block stays active until its events complete.
            self.stats.unmirror();
        }
        let oversize = size >= self.max_split();
        self.emit_with_block_context(
            AllocEvent::FreeRequested {
                pool: kind,
                ptr,
                block_size: size,
                requested,
                stream,
                oversize,
            },
            id,
        );
        if has_uses {
            self.insert_events(id);
        } else {
            self.free_block(id);
        }
        Ok(())
    }

    /// `free_block`: the free completes; merge with free neighbours and cache.
    #[inline(always)]
    pub(crate) fn free_block(&mut self, id: BlockId) {
        let (kind, ptr, size, requested, stream) = {
            let b = self.arena.get(id);
            debug_assert!(b.is_free());
            (b.pool, b.ptr, b.size, b.requested, b.stream)
        };
        let ctx = self.arena.take_context(id);
        self.emit(
            AllocEvent::FreeCompleted {
                pool: kind,
                ptr,
                block_size: size,
                requested,
                stream,
            },
            ctx.as_ref(),
        );
        let (prev, next) = {
            let b = self.arena.get(id);
            (b.prev, b.next)
        };
        // Previous neighbour first, then next, as PyTorch does. The net change is summed
        // without branches: whether a neighbour merged is a coin toss here.
        let sub_prev = self.try_merge_blocks::<true>(id, prev);
        let sub_next = self.try_merge_blocks::<false>(id, next);
        self.insert_free(id);
        let b = self.arena.get(id);
        let split = b.is_split() as i64;
        let net_blocks = split - (sub_prev > 0) as i64 - (sub_next > 0) as i64;
        let net_bytes = split * b.size as i64 - sub_prev as i64 - sub_next as i64;
        // Expandable memory is never "non-releasable": its free pages can always go back.
        if !b.is_expandable() {
            self.emit_inactive_split(kind, net_blocks, net_bytes);
        }
    }

    /// An `InactiveSplit` change: always into the stats (a zero change is a no-op there,
    /// and skipping it would be a branch), to listeners only when something changed.
    #[inline(always)]
    fn emit_inactive_split(&mut self, pool: PoolKind, blocks: i64, bytes: i64) {
        let ev = AllocEvent::InactiveSplit {
            pool,
            blocks,
            bytes,
        };
        self.stats.observe(&ev);
        if self.has_listeners() && (blocks != 0 || bytes != 0) {
            self.notify(ev, None);
        }
    }

    /// Absorb `dst`'s previous (`PREV`) or next neighbour `src` if it is free and in the
    /// same mapped state; returns the bytes absorbed (0 if no merge). `dst` must not be in
    /// any pool set.
    #[inline(always)]
    pub(crate) fn try_merge_blocks<const PREV: bool>(&mut self, dst: BlockId, src: BlockId) -> u64 {
        // One test for "is there a neighbour, and is it free and alike": each part is a coin
        // toss on a mixed workload, and one unpredictable branch beats two. With no
        // neighbour the flags of some valid slot are read and ignored.
        let s = self.arena.get_or_last(src);
        let mergeable = (src != NIL) & s.is_free() & (s.mapped == self.arena.get(dst).mapped);
        if !mergeable {
            return 0;
        }
        debug_assert_eq!(
            if PREV {
                self.arena.get(dst).prev
            } else {
                self.arena.get(dst).next
            },
            src
        );
        self.remove_free(src);
        let (s_ptr, s_prev, s_next, s_size) = {
            let s = self.arena.get(src);
            (s.ptr, s.prev, s.next, s.size)
        };
        if PREV {
            let seg_ctx = self.arena.take_segment_context(src);
            let d = self.arena.get_mut(dst);
            d.ptr = s_ptr;
            d.prev = s_prev;
            self.arena.set_segment_context(dst, seg_ctx);
            // Whether `src` had a neighbour beyond it is a coin toss: a NIL link is
            // written to the arena's scratch block instead of being branched around.
            self.arena.get_mut_or_scratch(s_prev).next = dst;
        } else {
            self.arena.get_mut(dst).next = s_next;
            self.arena.get_mut_or_scratch(s_next).prev = dst;
        }
        self.arena.get_mut(dst).size += s_size;
        self.arena.release(src);
        s_size
    }

    // ----- streams and events -------------------------------------------------------------

    pub fn record_stream(&mut self, ptr: u64, stream: StreamId) -> Result<(), AllocError> {
        if ptr == 0 {
            return Ok(());
        }
        let id = self
            .active
            .get(ptr)
            .ok_or(AllocError::InvalidPointer(ptr))?;
        let own = self.private.real(self.arena.get(id).stream);
        let b = self.arena.get_mut(id);
        if stream != own {
            let uses = self.stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                if uses.len() >= MAX_STREAM_USES {
                    return Err(AllocError::Device(format!(
                        "record_stream: block {ptr:#x} already has {MAX_STREAM_USES} other streams"
                    )));
                }
                uses.push(stream);
                b.has_uses = true;
            }
        }
        Ok(())
    }

    fn insert_events(&mut self, id: BlockId) {
        let uses = self.stream_uses.remove(&id).unwrap_or_default();
        self.arena.get_mut(id).has_uses = false;
        for s in uses {
            let ev = self.device.record_event(s);
            self.arena.get_mut(id).event_count += 1;
            let q = match self.stream_events.iter().position(|(st, _)| *st == s) {
                Some(i) => i,
                None => {
                    self.stream_events.push((s, VecDeque::new()));
                    self.stream_events.len() - 1
                }
            };
            self.stream_events[q].1.push_back((ev, id));
            self.outstanding_events += 1;
        }
    }

    /// `process_events`: complete frees whose events finished (start of every malloc).
    #[inline(always)]
    pub(crate) fn process_events(&mut self) {
        if self.outstanding_events != 0 {
            self.process_pending_events();
        }
    }

    #[inline(never)]
    fn process_pending_events(&mut self) {
        for q in 0..self.stream_events.len() {
            while let Some(&(ev, id)) = self.stream_events[q].1.front() {
                if !self.device.query_event(ev) {
                    break;
                }
                self.stream_events[q].1.pop_front();
                self.device.release_event(ev);
                self.complete_event(id);
            }
        }
    }

    fn complete_event(&mut self, id: BlockId) {
        self.outstanding_events -= 1;
        let b = self.arena.get_mut(id);
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id);
        }
    }

    /// `synchronize_and_free_events`: wait for every outstanding event.
    pub(crate) fn synchronize_and_free_events(&mut self) {
        self.emit(AllocEvent::SyncAllStreams, None);
        for q in 0..self.stream_events.len() {
            while let Some((ev, id)) = self.stream_events[q].1.pop_front() {
                self.device.synchronize_event(ev);
                self.device.release_event(ev);
                self.complete_event(id);
            }
        }
    }
}

pub fn fraction_limit(fraction: f64, total: u64) -> Option<u64> {
    if fraction < 1.0 {
        Some((fraction * total as f64).floor() as u64)
    } else {
        None
    }
}

pub fn max_split_stat(config: &AllocatorConfig) -> i64 {
    if config.max_split_size == u64::MAX {
        -1
    } else {
        config.max_split_size as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_vectors() {
        let c = AllocatorConfig::default();
        for (n, want) in [
            (1u64, 512u64),
            (511, 512),
            (512, 512),
            (513, 1024),
            (1000, 1024),
            (1_048_577, 1_049_088),
        ] {
            assert_eq!(round_size(&c, n), want, "n={n}");
        }
        let c4 = AllocatorConfig {
            roundup_power2_divisions: [4; 16],
            ..Default::default()
        };
        assert_eq!(round_size(&c4, 700), 1024);
        assert_eq!(round_size(&c4, 1_228_801), 1_310_720);
        assert_eq!(round_size(&c4, (3 << 20) + 1), 3 << 20 | 1 << 19);
        assert_eq!(round_size(&c4, 5 << 20), 5 << 20);
        assert_eq!(round_size(&c4, 33 << 20), 40 << 20);
        assert_eq!(round_size(&c4, 1200 * 1024), 1_310_720);
    }

    #[test]
    fn segment_sizes() {
        let c = AllocatorConfig::default();
        assert_eq!(allocation_size(&c, 512), 2 << 20);
        assert_eq!(allocation_size(&c, 1_049_088), 20 << 20);
        assert_eq!(allocation_size(&c, 10 << 20), 10 << 20);
        assert_eq!(allocation_size(&c, 10_486_272), 12 << 20);
        assert_eq!(allocation_size(&c, 104_858_112), 106_954_752);
    }
}

#[cfg(test)]
mod stream_cap_tests {
    use crate::{AllocatorConfig, CachingAllocator, SimDevice};

    /// A block's event count is 16 bits: the stream past the cap is a typed error, the
    /// block keeps working, and its free still waits for every recorded stream.
    #[test]
    fn record_stream_caps_streams_per_block() {
        let a = CachingAllocator::new(SimDevice::new(1 << 30), AllocatorConfig::default());
        let p = a.malloc(4096, 0).unwrap().ptr;
        for s in 1..=super::MAX_STREAM_USES as u64 {
            a.record_stream(p, s).unwrap();
        }
        // Recording a stream again, or the block's own stream, is still fine.
        a.record_stream(p, 7).unwrap();
        a.record_stream(p, 0).unwrap();
        let e = a.record_stream(p, 1 << 40).unwrap_err();
        assert!(
            e.to_string().contains("already has 65535 other streams"),
            "{e}"
        );
        a.free(p).unwrap();
        assert_eq!(
            a.memory_stats()["active.all.current"],
            1,
            "pending on its events"
        );
        a.check_invariants().unwrap();
    }
}
