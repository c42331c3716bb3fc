//! Blocks and their arena.
//!
//! Design note: PyTorch allocates a `Block` object with `new` on every split and frees it on
//! every merge. Here blocks live in a slab (`Vec<Block>` plus a free list of slots), so a cache
//! hit that splits and a free that merges reuse slots and never touch the host allocator. A
//! slot index is the block's identity: as in PyTorch, a split hands the *front* part to the
//! client as a new block and the old block object becomes the remainder, keeping its stale
//! `requested_size` (snapshots show it).
//!
//! A block is one cache line. What a cache hit reads or writes on any block it touches (the
//! best-fit key, tree and segment links, the free test, the requested size) is in it; what
//! only recording, GC or `record_stream` need lives in side tables: stacks and GC age in
//! [`Cold`], parallel to the slots and touched only when a flag or a running GC clock says
//! so; recorded streams in the allocator's map, flagged by `has_uses`. At a few thousand
//! live blocks the working set is what the pair costs, so halving it is the point.

use crate::event::{PoolKind, StreamId};
use crate::snapshot::Stack;

/// Slot index of a block; `NIL` means none.
pub type BlockId = u32;
pub const NIL: BlockId = u32::MAX;
/// `Block::expandable` of a block outside any expandable segment.
pub const NO_SEGMENT: u16 = u16::MAX;
/// Streams `record_stream` accepts on one block (its event count is 16 bits).
pub const MAX_STREAM_USES: usize = u16::MAX as usize;

/// Which ordered set of its pool a block sits in (or that its slot is free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    None,
    /// Free, mapped blocks: ordered by (stream, size, address).
    Blocks,
    /// Unmapped ranges of expandable segments: ordered by (stream, address).
    Unmapped,
    /// The arena slot holds no block (it is on the slot free list).
    Dead,
}

/// One cache line (`repr(C, align(64))`, checked below).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct Block {
    pub ptr: u64,
    pub size: u64,
    pub stream: StreamId,
    /// Unrounded size of the last allocation this block object served (stale when free).
    pub requested: u64,
    // Intrusive treap links (see pool.rs): children [left, right]. A slot's priority is a
    // hash of its id (`prio`), so it takes no room here.
    pub(crate) kids: [BlockId; 2],
    pub(crate) parent: BlockId,
    pub prev: BlockId,
    pub next: BlockId,
    /// Outstanding `record_stream` events: at most one per stream recorded on the block,
    /// which `record_stream` caps at `MAX_STREAM_USES`.
    pub event_count: u16,
    /// Size bin of the free-block index while the block is in it (see pool.rs), so that
    /// removal finds its bin without recomputing it.
    pub(crate) bin: u16,
    /// Index of the owning expandable segment, or `NO_SEGMENT`.
    pub expandable: u16,
    pub pool: PoolKind,
    pub allocated: bool,
    pub mapped: bool,
    pub(crate) member: Membership,
    /// Other streams were recorded with `record_stream` since the block was handed out.
    pub has_uses: bool,
    /// The slot's [`Cold`] entry may hold a stack: reads and clears look there only if set.
    has_ctx: bool,
}

const _: () = assert!(std::mem::size_of::<Block>() == 64);

/// What a block needs only while recording history or collecting garbage.
#[derive(Clone, Debug, Default)]
pub struct Cold {
    /// Pool GC clock when the block was last inserted into the pool.
    pub gc_count_base: u64,
    pub context: Option<Stack>,
    pub segment_context: Option<Stack>,
}

impl Block {
    /// As PyTorch's `Block(device, stream, size, pool, ptr)`.
    #[inline(always)]
    fn fresh(ptr: u64, size: u64, stream: StreamId, pool: PoolKind) -> Block {
        Block {
            ptr,
            size,
            stream,
            requested: 0,
            kids: [NIL; 2],
            parent: NIL,
            prev: NIL,
            next: NIL,
            event_count: 0,
            bin: 0,
            expandable: NO_SEGMENT,
            pool,
            allocated: false,
            mapped: true,
            member: Membership::None,
            has_uses: false,
            has_ctx: false,
        }
    }

    // These two are written without short-circuits: on a mixed workload each test is a
    // coin toss, and one flag computation beats two unpredictable jumps.
    pub fn is_split(&self) -> bool {
        // NIL is all ones, so both links are NIL exactly when their AND is.
        (self.prev & self.next) != NIL
    }
    pub fn is_expandable(&self) -> bool {
        self.expandable != NO_SEGMENT
    }
    /// Free in PyTorch's sense: eligible for reuse or merging.
    pub fn is_free(&self) -> bool {
        !self.allocated & (self.event_count == 0) & !self.has_uses
    }
}

/// A slot's treap priority: Fibonacci hashing of its id, one multiply (the treap descent
/// computes it at every step). An odd multiplier is a bijection, so no two slots tie, and
/// every run is deterministic (a tree's shape is never observable, only its in-order
/// sequence is). Ids come from slot reuse, unrelated to the (size, address) keys, and the
/// golden-ratio sequence spreads even consecutive ids evenly.
#[inline(always)]
pub(crate) fn prio(id: BlockId) -> u32 {
    id.wrapping_mul(0x9E37_79B9)
}

/// Slab of blocks, with an intrusive free list of slots (threaded through `next`).
pub struct Arena {
    slots: Vec<Block>,
    cold: Vec<Cold>,
    free_head: BlockId,
    /// Where writes through a `NIL` link go (see `get_mut_or_scratch`); never read.
    scratch: Box<Block>,
}

impl Default for Arena {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl Arena {
    pub fn with_capacity(n: usize) -> Self {
        Arena {
            slots: Vec::with_capacity(n),
            cold: Vec::with_capacity(n),
            free_head: NIL,
            scratch: Box::new(Block::fresh(0, 0, 0, PoolKind::Small)),
        }
    }

    /// A fresh block, as PyTorch's `Block(device, stream, size, pool, ptr)`: requested 0,
    /// unallocated, mapped, unlinked, no stacks.
    #[inline]
    pub fn alloc(&mut self, ptr: u64, size: u64, stream: StreamId, pool: PoolKind) -> BlockId {
        let id = self.free_head;
        if id == NIL {
            return self.push(ptr, size, stream, pool);
        }
        let b = self.get_mut(id);
        debug_assert!(b.member == Membership::Dead && !b.has_ctx);
        let next_free = b.next;
        // One whole-line store: a released slot holds no stacks (see `release`) and a
        // block owns nothing, so there is nothing to drop. The treap links it resets
        // would be rewritten by any insert anyway.
        *b = Block::fresh(ptr, size, stream, pool);
        self.free_head = next_free;
        id
    }

    #[cold]
    fn push(&mut self, ptr: u64, size: u64, stream: StreamId, pool: PoolKind) -> BlockId {
        self.slots.push(Block::fresh(ptr, size, stream, pool));
        self.cold.push(Cold::default());
        (self.slots.len() - 1) as BlockId
    }

    #[inline(always)]
    pub fn release(&mut self, id: BlockId) {
        let b = &mut self.slots[id as usize];
        debug_assert!(b.member == Membership::None);
        b.member = Membership::Dead;
        b.next = self.free_head;
        if b.has_ctx {
            b.has_ctx = false;
            let c = &mut self.cold[id as usize];
            c.context = None;
            c.segment_context = None;
        }
        self.free_head = id;
    }

    // Ids are never user input: every id in a link, a set or the pointer map was handed out
    // by `alloc`, and slots are never removed, so an id is always in range. The bounds check
    // was a fifth of a mixed-size pair's instructions (every tree step reads a block).
    #[inline(always)]
    pub fn get(&self, id: BlockId) -> &Block {
        debug_assert!(
            (id as usize) < self.slots.len(),
            "block id {id} out of range"
        );
        // SAFETY: see above; `slots` only grows.
        unsafe { self.slots.get_unchecked(id as usize) }
    }
    #[inline(always)]
    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        debug_assert!(
            (id as usize) < self.slots.len(),
            "block id {id} out of range"
        );
        // SAFETY: as in `get`.
        unsafe { self.slots.get_unchecked_mut(id as usize) }
    }

    /// Block `id`, or for `NIL` the last slot (a valid block whose fields the caller
    /// ignores), for tests that fold "no block" into a flag instead of a branch. The arena
    /// is never empty when this is asked (the caller holds a block).
    #[inline(always)]
    pub fn get_or_last(&self, id: BlockId) -> &Block {
        self.get(id.min(self.slots.len() as BlockId - 1))
    }

    /// Block `id`, or for `NIL` the scratch block (see `get_mut_or_scratch`), whose fields
    /// the caller masks out: a read through a link that may be `NIL` becomes a pointer
    /// select, not a branch. Unlike `get_or_last`, valid on an empty arena.
    #[inline(always)]
    pub fn get_or_scratch(&self, id: BlockId) -> &Block {
        let scratch: *const Block = &*self.scratch;
        let base = self.slots.as_ptr();
        // SAFETY: a non-NIL id is a live slot (see `get`); the scratch block is owned here.
        unsafe {
            let slot = base.wrapping_add(id as usize);
            &*std::hint::select_unpredictable(id == NIL, scratch, slot)
        }
    }

    /// Block `id` to write, or for `NIL` a scratch block whose contents nobody reads: a
    /// write through a link that may be `NIL` becomes a pointer select, not a branch.
    #[inline(always)]
    pub fn get_mut_or_scratch(&mut self, id: BlockId) -> &mut Block {
        let scratch: *mut Block = &mut *self.scratch;
        let base = self.slots.as_mut_ptr();
        // SAFETY: a non-NIL id is a live slot (see `get`); the scratch block is owned here.
        unsafe {
            let slot = base.wrapping_add(id as usize);
            &mut *std::hint::select_unpredictable(id == NIL, scratch, slot)
        }
    }

    /// Slots, live or not.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The slots' base pointer, for tree code that holds links into several blocks at once
    /// (taken without a reference to the slots, so earlier pointers stay valid). Valid
    /// until the arena grows.
    #[inline(always)]
    pub(crate) fn base_ptr(&mut self) -> *mut Block {
        self.slots.as_mut_ptr()
    }

    /// The stack that allocated the block, if recorded.
    #[inline(always)]
    pub fn context(&self, id: BlockId) -> Option<&Stack> {
        if !self.get(id).has_ctx {
            return None;
        }
        self.cold[id as usize].context.as_ref()
    }

    /// The stack that allocated the block's segment, if recorded.
    pub fn segment_context(&self, id: BlockId) -> Option<&Stack> {
        if !self.get(id).has_ctx {
            return None;
        }
        self.cold[id as usize].segment_context.as_ref()
    }

    #[inline(always)]
    pub fn set_context(&mut self, id: BlockId, ctx: Option<Stack>) {
        if let Some(c) = self.cold_for_write(id, ctx.is_some()) {
            c.context = ctx;
        }
    }

    #[inline(always)]
    pub fn set_segment_context(&mut self, id: BlockId, ctx: Option<Stack>) {
        if let Some(c) = self.cold_for_write(id, ctx.is_some()) {
            c.segment_context = ctx;
        }
    }

    #[inline(always)]
    pub fn take_context(&mut self, id: BlockId) -> Option<Stack> {
        self.cold_for_write(id, false)?.context.take()
    }

    #[inline(always)]
    pub fn take_segment_context(&mut self, id: BlockId) -> Option<Stack> {
        self.cold_for_write(id, false)?.segment_context.take()
    }

    /// The cold entry of `id` for a write that stores a stack (`storing`) or clears one;
    /// `None` when clearing a slot that holds none, which is the common case and touches
    /// only the block's own line.
    #[inline(always)]
    fn cold_for_write(&mut self, id: BlockId, storing: bool) -> Option<&mut Cold> {
        let b = self.get_mut(id);
        if !(storing || b.has_ctx) {
            return None;
        }
        b.has_ctx = true;
        Some(&mut self.cold[id as usize])
    }

    pub fn gc_count_base(&self, id: BlockId) -> u64 {
        self.cold[id as usize].gc_count_base
    }

    #[inline(always)]
    pub fn set_gc_count_base(&mut self, id: BlockId, base: u64) {
        self.cold[id as usize].gc_count_base = base;
    }

    /// Ids of every live block.
    pub fn live_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, b)| b.member != Membership::Dead)
            .map(|(i, _)| i as BlockId)
    }
}
