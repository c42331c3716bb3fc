//! Giving memory back to the device: `empty_cache`, the oversize release that precedes the
//! last-resort retry, and garbage collection.
//!
//! Design note: PyTorch never returns part of a non-expandable segment. A segment goes back
//! only when it is one free block (no neighbours); expandable segments instead give back
//! every whole free page. The three paths differ in what they are allowed to touch, and that
//! difference is what makes `max_split_size_mb` and `garbage_collection_threshold` behave as
//! they do, so each is written out on its own rather than folded into one.

use crate::block::BlockId;
use crate::device::Device;
use crate::event::{AllocEvent, PoolKind, StreamId};
use crate::policy::State;
use crate::private::is_virtual;

impl<D: Device> State<D> {
    /// `release_block`: cudaFree a whole, free, non-expandable segment.
    pub(crate) fn release_block(&mut self, id: BlockId) {
        let (ptr, size, kind, stream) = {
            let b = self.arena.get(id);
            debug_assert!(!b.is_expandable() && !b.is_split());
            (b.ptr, b.size, b.pool, b.stream)
        };
        let ctx = self.arena.segment_context(id).cloned();
        let oversize = size >= self.max_split();
        self.emit(
            AllocEvent::SegmentFree {
                pool: kind,
                ptr,
                size,
                stream,
                oversize,
            },
            ctx.as_ref(),
        );
        if let Err(e) = self.device.free(ptr, size) {
            tracing::error!(ptr, size, error = %e, "device free failed");
        }
        self.total_allocated_memory -= size;
        self.remove_free(id);
        self.arena.release(id);
    }

    /// `release_blocks(pool)`: every unsplit free segment, and every whole free page of
    /// expandable segments, of the default pool (`None`) or of one private pool.
    pub(crate) fn release_pool_blocks(&mut self, kind: PoolKind, pool: Option<usize>) {
        let ids = self.pool_ref(kind).blocks.to_vec(&self.arena);
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = self.arena.get(id);
            if !self.in_pool(b.stream, pool) {
                continue;
            }
            if b.is_expandable() {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id);
            }
        }
        for id in to_unmap {
            self.unmap_block(id);
            let b = self.arena.get(id);
            if !b.is_split() && !b.mapped {
                self.release_expandable_segment(id);
            }
        }
    }

    /// `release_cached_blocks` = `torch.cuda.empty_cache()`.
    pub(crate) fn release_cached_blocks(&mut self) {
        self.synchronize_and_free_events();
        self.release_pool_blocks(PoolKind::Large, None);
        self.release_pool_blocks(PoolKind::Small, None);
        if self.private.any() {
            self.release_freeable_pools();
        }
    }

    /// `release_available_cached_blocks`: with `max_split_size` set, free oversize cached
    /// segments, largest first, until the request could fit.
    pub(crate) fn release_available_cached_blocks(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        s: u64,
    ) -> bool {
        let m = self.max_split();
        if m == u64::MAX {
            return false;
        }
        let key = s.max(m);
        let found = self
            .pool_ref(kind)
            .blocks
            .lower_bound(&self.arena, (stream, key, 0));
        let single = found.filter(|&id| {
            let b = self.arena.get(id);
            b.stream == stream && !b.is_expandable()
        });
        if let Some(id) = single {
            self.release_block(id);
            return true;
        }
        let start = match found {
            Some(id) => self.pool_ref(kind).blocks.predecessor(&self.arena, id),
            None => self.pool_ref(kind).blocks.last(&self.arena),
        };
        let Some(mut cur) = start else {
            return false;
        };
        let mut released = 0u64;
        loop {
            let (size, st, exp) = {
                let b = self.arena.get(cur);
                (b.size, b.stream, b.is_expandable())
            };
            if released >= key || size < m || st != stream {
                break;
            }
            let prev = self.pool_ref(kind).blocks.predecessor(&self.arena, cur);
            if !exp {
                self.release_block(cur);
                released += size;
            }
            match prev {
                Some(p) => cur = p,
                None => break,
            }
        }
        released >= key
    }

    /// `garbage_collect_cached_blocks`: with a memory fraction and a threshold, free old
    /// unsplit cached segments of the large pool once reserved memory passes the threshold.
    pub(crate) fn garbage_collect_cached_blocks(&mut self) {
        let Some(allowed) = self.allowed_memory_maximum else {
            return;
        };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return;
        }
        let target = self.total_allocated_memory - threshold;
        let clock = self.pool_ref(PoolKind::Large).get_free_blocks_call_count;
        let age = |st: &Self, id: BlockId| clock - st.arena.gc_count_base(id);
        let mut total_age = 0u64;
        let mut count = 0u64;
        // Only the default large pool is collected; private pools' blocks are skipped.
        for id in self.pool_ref(PoolKind::Large).blocks.to_vec(&self.arena) {
            let b = self.arena.get(id);
            if !b.is_split() && !is_virtual(b.stream) {
                total_age += age(self, id);
                count += 1;
            }
        }
        if count == 0 {
            return;
        }
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed_any = false;
            // Free every block at or above the average age; the pass does not stop at the
            // target, so GC does not fire again at once.
            for id in self.pool_ref(PoolKind::Large).blocks.to_vec(&self.arena) {
                let b = self.arena.get(id);
                if !b.is_split()
                    && !b.is_expandable()
                    && !is_virtual(b.stream)
                    && age(self, id) as f64 >= threshold_age
                {
                    freed_any = true;
                    reclaimed += b.size;
                    total_age -= age(self, id);
                    count -= 1;
                    self.release_block(id);
                }
            }
        }
    }
}
