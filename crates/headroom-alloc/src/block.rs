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

#[derive(Clone, Debug)]
pub struct Block {
    pub ptr: u64,
    pub size: u64,
    /// Unrounded size of the last allocation this block object served (stale when free).
    pub requested: u64,
    pub stream: StreamId,
    pub pool: PoolKind,
    pub allocated: bool,
    pub mapped: bool,
    pub prev: BlockId,
    pub next: BlockId,
    pub event_count: u32,
    /// Other streams recorded with `record_stream` since the block was handed out.
    pub stream_uses: Vec<StreamId>,
    /// Pool GC clock when the block was last inserted into the pool.
    pub gc_count_base: u64,
    /// Index of the owning expandable segment, or `NIL`.
    pub expandable: u32,
    pub context: Option<Arc<[Frame]>>,
    pub segment_context: Option<Arc<[Frame]>>,
    // Intrusive treap links (see pool.rs).
    pub(crate) left: BlockId,
    pub(crate) right: BlockId,
    pub(crate) prio: u32,
    pub(crate) member: Membership,
    pub(crate) live: bool,
}

impl Block {
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
    pub fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }
    /// Free in PyTorch's sense: eligible for reuse or merging.
    pub fn is_free(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.stream_uses.is_empty()
    }
}

/// Slab of blocks.
#[derive(Default)]
pub struct Arena {
    slots: Vec<Block>,
    free: Vec<BlockId>,
}

impl Arena {
    pub fn with_capacity(n: usize) -> Self {
        Arena {
            slots: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
        }
    }

    /// A fresh block, as PyTorch's `Block(device, stream, size, pool, ptr)`: requested 0,
    /// unallocated, mapped, unlinked. A reused slot keeps its `stream_uses` buffer.
    pub fn alloc(&mut self, ptr: u64, size: u64, stream: StreamId, pool: PoolKind) -> BlockId {
        let fresh = |stream_uses: Vec<StreamId>| Block {
            ptr,
            size,
            requested: 0,
            stream,
            pool,
            allocated: false,
            mapped: true,
            prev: NIL,
            next: NIL,
            event_count: 0,
            stream_uses,
            gc_count_base: 0,
            expandable: NIL,
            context: None,
            segment_context: None,
            left: NIL,
            right: NIL,
            prio: 0,
            member: Membership::None,
            live: true,
        };
        if let Some(id) = self.free.pop() {
            let slot = &mut self.slots[id as usize];
            let mut uses = std::mem::take(&mut slot.stream_uses);
            uses.clear();
            *slot = fresh(uses);
            id
        } else {
            self.slots.push(fresh(Vec::new()));
            (self.slots.len() - 1) as BlockId
        }
    }

    pub fn release(&mut self, id: BlockId) {
        let b = &mut self.slots[id as usize];
        debug_assert!(b.live && b.member == Membership::None);
        b.live = false;
        b.context = None;
        b.segment_context = None;
        self.free.push(id);
    }

    #[inline]
    pub fn get(&self, id: BlockId) -> &Block {
        &self.slots[id as usize]
    }
    #[inline]
    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.slots[id as usize]
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
