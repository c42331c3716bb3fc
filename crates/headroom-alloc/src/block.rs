//! Blocks and their arena.
//!
//! Design note: PyTorch allocates a `Block` object with `new` on every split and frees it on
//! every merge. Here blocks live in a slab (`Vec<Block>` plus a free list of slots), so a cache
//! hit that splits and a free that merges reuse slots and never touch the host allocator. A
//! slot index is the block's identity: as in PyTorch, a split hands the *front* part to the
//! client as a new block and the old block object becomes the remainder, keeping its stale
//! `requested_size` (snapshots show it).

use std::sync::Arc;

use crate::event::{PoolKind, StreamId};
use crate::snapshot::Frame;

/// Slot index of a block; `NIL` means none.
pub type BlockId = u32;
pub const NIL: BlockId = u32::MAX;

/// Which ordered set of its pool a block sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    None,
    /// Free, mapped blocks: ordered by (stream, size, address).
    Blocks,
    /// Unmapped ranges of expandable segments: ordered by (stream, address).
    Unmapped,
}

/// Field order and alignment are chosen (`repr(C, align(64))`): the first 64 bytes, one
/// cache line, hold everything a cache hit reads and writes on the blocks it walks past
/// (the best-fit key, tree links, segment links, the free test), so a tree step or a look
/// at a neighbour touches one line. The rest (requested size, GC age, stacks) is read only
/// for the block being handed out or freed. Streams recorded with `record_stream` live in
/// the allocator's side table, flagged here by `has_uses`.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct Block {
    pub ptr: u64,
    pub size: u64,
    pub stream: StreamId,
    // Intrusive treap links (see pool.rs): children [left, right]. `prio` is fixed per slot.
    pub(crate) kids: [BlockId; 2],
    pub(crate) parent: BlockId,
    pub(crate) prio: u32,
    pub prev: BlockId,
    pub next: BlockId,
    /// Index of the owning expandable segment, or `NIL`.
    pub expandable: u32,
    pub event_count: u32,
    /// Size bin of the free-block index the block sits in (see pool.rs), fixed at insert so
    /// that removal finds the bin's root without recomputing it.
    pub(crate) bin: u16,
    pub pool: PoolKind,
    pub allocated: bool,
    pub mapped: bool,
    pub(crate) member: Membership,
    pub(crate) live: bool,
    /// Other streams were recorded with `record_stream` since the block was handed out.
    pub has_uses: bool,
    // ---- second cache line ----
    /// Unrounded size of the last allocation this block object served (stale when free).
    pub requested: u64,
    /// Pool GC clock when the block was last inserted into the pool.
    pub gc_count_base: u64,
    pub context: Option<Arc<[Frame]>>,
    pub segment_context: Option<Arc<[Frame]>>,
}

const _: () = assert!(std::mem::offset_of!(Block, has_uses) < 64);
const _: () = assert!(std::mem::size_of::<Block>() == 128);

impl Block {
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
    pub fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }
    /// Free in PyTorch's sense: eligible for reuse or merging.
    pub fn is_free(&self) -> bool {
        !self.allocated && self.event_count == 0 && !self.has_uses
    }
}

/// Slab of blocks, with an intrusive free list of slots (threaded through `next`).
pub struct Arena {
    slots: Vec<Block>,
    free_head: BlockId,
    /// xorshift32 state: each new slot draws its treap priority once, for good.
    prio: u32,
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
            free_head: NIL,
            prio: 0x9E37_79B9,
        }
    }

    /// A fresh block, as PyTorch's `Block(device, stream, size, pool, ptr)`: requested 0,
    /// unallocated, mapped, unlinked. A reused slot keeps its treap priority.
    #[inline]
    pub fn alloc(&mut self, ptr: u64, size: u64, stream: StreamId, pool: PoolKind) -> BlockId {
        let id = self.free_head;
        if id == NIL {
            return self.push(ptr, size, stream, pool);
        }
        let b = &mut self.slots[id as usize];
        debug_assert!(!b.live && b.context.is_none() && b.segment_context.is_none());
        self.free_head = b.next;
        // Field by field: a released slot already holds no contexts (see `release`), so
        // there is nothing to drop. Its treap links are stale and stay so: they are read
        // only while the block is in a set, and inserting it writes them. `gc_count_base`
        // likewise is read only for blocks in a set and is stamped by `insert_free`.
        b.ptr = ptr;
        b.size = size;
        b.stream = stream;
        b.requested = 0;
        b.prev = NIL;
        b.next = NIL;
        b.expandable = NIL;
        b.event_count = 0;
        b.pool = pool;
        b.allocated = false;
        b.mapped = true;
        b.member = Membership::None;
        b.live = true;
        b.has_uses = false;
        id
    }

    #[cold]
    fn push(&mut self, ptr: u64, size: u64, stream: StreamId, pool: PoolKind) -> BlockId {
        let mut x = self.prio;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.prio = x;
        self.slots.push(Block {
            ptr,
            size,
            stream,
            requested: 0,
            kids: [NIL; 2],
            parent: NIL,
            prio: x,
            prev: NIL,
            next: NIL,
            expandable: NIL,
            event_count: 0,
            pool,
            allocated: false,
            mapped: true,
            member: Membership::None,
            live: true,
            bin: 0,
            has_uses: false,
            gc_count_base: 0,
            context: None,
            segment_context: None,
        });
        (self.slots.len() - 1) as BlockId
    }

    #[inline(always)]
    pub fn release(&mut self, id: BlockId) {
        let b = &mut self.slots[id as usize];
        debug_assert!(b.live && b.member == Membership::None);
        b.live = false;
        b.context = None;
        b.segment_context = None;
        b.next = self.free_head;
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

    /// Ids of every live block.
    pub fn live_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live)
            .map(|(i, _)| i as BlockId)
    }
}
