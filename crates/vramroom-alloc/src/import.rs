//! Restoring allocator state that existed before a recording began.
//!
//! Design note: a PyTorch snapshot's trace often starts mid-process: the cuBLAS workspace,
//! the weights, an expandable segment grown by an earlier phase are already there. Replaying
//! such a trace on an empty allocator shifts every later decision. `import_segment` rebuilds
//! one such segment with its live blocks at their exact offsets (free gaps between them
//! cached as PyTorch would have them), so the replay starts from the state PyTorch was in.
//! Statistics move as if the blocks had been allocated: they were, before the recording.

use crate::block::{BlockId, NIL, NO_SEGMENT};
use crate::device::{Device, DeviceError};
use crate::event::{AllocEvent, PoolKind, StreamId};
use crate::oom::AllocError;
use crate::policy::State;
use crate::private::{MempoolId, DEFAULT_POOL};

/// A block that is live in an imported segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Offset from the start of the segment (or of the reservation, for expandable).
    pub offset: u64,
    /// Block size (a multiple of 512).
    pub size: u64,
    /// The unrounded request.
    pub requested: u64,
}

/// A segment to rebuild.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportSegment {
    pub pool: PoolKind,
    pub stream: StreamId,
    /// Non-expandable: the segment's size. Expandable: ignored (the reservation's size
    /// follows from the device's total memory).
    pub total_size: u64,
    pub expandable: bool,
    /// Expandable only: (offset, length) ranges that are mapped, page-aligned.
    pub mapped: Vec<(u64, u64)>,
    pub live: Vec<LiveBlock>,
    /// The private pool that owns the segment (`DEFAULT_POOL` for the default pool); made
    /// alive (one user) if it does not exist yet.
    pub pool_id: MempoolId,
}

impl<D: Device> State<D> {
    /// Rebuild one segment. Returns the device address of its start (for expandable, of the
    /// reservation) so the caller can translate addresses.
    pub(crate) fn import_segment(&mut self, seg: &ImportSegment) -> Result<u64, AllocError> {
        let mut live = seg.live.clone();
        live.sort_by_key(|b| b.offset);
        // The key stream: a private pool files its blocks under a virtual stream.
        let stream = if seg.pool_id == DEFAULT_POOL {
            seg.stream
        } else {
            let slot = match self.private.slot(seg.pool_id) {
                Some(s) => s,
                None => self.private.create_or_incref(seg.pool_id),
            };
            self.private.virtual_stream(slot, seg.stream)
        };
        let (base, head) = if seg.expandable && self.expandable_active {
            // A fresh reservation; map the requested ranges into it.
            let id = self.new_expandable_reservation(seg.pool, stream)?;
            let base = self.arena.get(id).ptr;
            let mut ranges = seg.mapped.clone();
            ranges.sort_unstable();
            // PyTorch maps whole pages; a snapshot that says otherwise is not one it wrote
            // (the snapshot_replay fuzz target's), and mapping from mid-page would misplace
            // every block after it.
            let page = self.page_size(seg.pool);
            if let Some((off, len)) = ranges
                .iter()
                .find(|(off, len)| off % page != 0 || len % page != 0)
            {
                return Err(AllocError::Device(format!(
                    "the snapshot's expandable segment maps {len} bytes at offset {off}, not whole \
                     pages of {page} bytes"
                )));
            }
            for (off, len) in ranges {
                let target = self.find_unmapped_at(seg.pool, stream, base + off);
                let Some(t) = target else { continue };
                // Split off the part before `off` so the mapping starts exactly there.
                let t = self.split_unmapped_front(t, base + off);
                let len = len.min(self.arena.get(t).size);
                if !self.map_block_pub(t, len)? {
                    return Err(AllocError::Device(
                        "out of memory while restoring the snapshot's initial state".into(),
                    ));
                }
            }
            (base, id)
        } else {
            let size = seg.total_size;
            let ptr = match self.device.malloc(size) {
                Ok(p) => p,
                Err(DeviceError::OutOfMemory) => {
                    return Err(AllocError::Device(format!(
                        "the snapshot's initial state ({size} bytes in one segment) does not fit the device"
                    )))
                }
                Err(DeviceError::Other(e)) => return Err(AllocError::Device(e)),
            };
            self.total_allocated_memory += size;
            let id = self.arena.alloc(ptr, size, stream, seg.pool);
            let oversize = size >= self.max_split();
            self.emit(
                AllocEvent::SegmentAlloc {
                    pool: seg.pool,
                    ptr,
                    size,
                    stream,
                    oversize,
                },
                None,
            );
            self.insert_free(id);
            (ptr, id)
        };
        // Live blocks in address order, each searched from where the last one ended: the
        // walk along the segment is linear, whatever the number of segments.
        let mut from = head;
        while self.arena.get(from).prev != NIL {
            from = self.arena.get(from).prev;
        }
        for b in live {
            from = self.carve_live(from, seg.pool, stream, base + b.offset, b.size, b.requested)?;
        }
        Ok(base)
    }

    fn new_expandable_reservation(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
    ) -> Result<BlockId, AllocError> {
        self.new_reservation(kind, stream, 0)?.ok_or_else(|| {
            AllocError::Device(
                "no address space to restore the snapshot's expandable segment".into(),
            )
        })
    }

    fn find_unmapped_at(&self, kind: PoolKind, stream: StreamId, addr: u64) -> Option<BlockId> {
        let pool = self.pool_ref(kind);
        let a = &self.arena;
        let cand = pool.unmapped.predecessor_of_key(a, (stream, 0, addr + 1))?;
        let b = a.get(cand);
        (b.stream == stream && b.ptr <= addr && addr < b.ptr + b.size).then_some(cand)
    }

    /// Split unmapped block `id` so that a block starts at `at`; returns that block.
    fn split_unmapped_front(&mut self, id: BlockId, at: u64) -> BlockId {
        let (ptr, size, prev) = {
            let b = self.arena.get(id);
            (b.ptr, b.size, b.prev)
        };
        if at == ptr {
            return id;
        }
        self.remove_free(id);
        let front = self.splice_new(id, ptr, at - ptr, false, prev, id);
        {
            let b = self.arena.get_mut(id);
            b.ptr = at;
            b.size = size - (at - ptr);
        }
        self.insert_unmapped(front);
        self.insert_unmapped(id);
        id
    }

    /// Mark [addr, addr+size) allocated inside the free mapped block that covers it, found
    /// by walking the segment's chain from block `from`. Returns the block after the live
    /// one (where the next, higher live block is searched from).
    fn carve_live(
        &mut self,
        from: BlockId,
        kind: PoolKind,
        stream: StreamId,
        addr: u64,
        size: u64,
        requested: u64,
    ) -> Result<BlockId, AllocError> {
        let a = &self.arena;
        let mut cur = from;
        let cover = loop {
            if cur == NIL {
                return Err(AllocError::Device(format!(
                    "restoring the initial state: no free memory covers the live block at {addr:#x} ({size} bytes): the snapshot's blocks overlap or lie outside their segment"
                )));
            }
            let b = a.get(cur);
            if b.ptr > addr {
                cur = NIL;
                continue;
            }
            if b.is_free() && b.mapped && b.ptr <= addr && addr + size <= b.ptr + b.size {
                break cur;
            }
            cur = b.next;
        };
        let before = self.inactive_split_of_segment(cover);
        self.remove_free(cover);
        let (ptr, bsize, exp, prev, next) = {
            let b = self.arena.get(cover);
            (b.ptr, b.size, b.expandable, b.prev, b.next)
        };
        // [front?][live][back?], each a block of the same segment.
        let mut left = prev;
        if addr > ptr {
            let f = self.arena.alloc(ptr, addr - ptr, stream, kind);
            self.link(left, f, exp);
            self.insert_free(f);
            left = f;
        }
        let live = cover;
        {
            let b = self.arena.get_mut(live);
            b.ptr = addr;
            b.size = size;
            b.prev = NIL;
            b.next = NIL;
        }
        self.link(left, live, exp);
        left = live;
        let end = addr + size;
        if end < ptr + bsize {
            let k = self.arena.alloc(end, ptr + bsize - end, stream, kind);
            self.link(left, k, exp);
            self.insert_free(k);
            left = k;
        }
        self.arena.get_mut(left).next = next;
        if next != NIL {
            self.arena.get_mut(next).prev = left;
        }
        let resume = self.arena.get(live).next;
        {
            let b = self.arena.get_mut(live);
            b.allocated = true;
            b.requested = requested;
        }
        self.active.insert(addr, live);
        let oversize = size >= self.max_split();
        self.emit(
            AllocEvent::Alloc {
                pool: kind,
                ptr: addr,
                block_size: size,
                requested,
                stream,
                oversize,
            },
            None,
        );
        if exp == NO_SEGMENT {
            let after = self.inactive_split_of_segment(live);
            let (db, dbytes) = (after.0 - before.0, after.1 - before.1);
            if db != 0 || dbytes != 0 {
                self.emit(
                    AllocEvent::InactiveSplit {
                        pool: kind,
                        blocks: db,
                        bytes: dbytes,
                    },
                    None,
                );
            }
        }
        Ok(if resume == NIL { live } else { resume })
    }

    fn link(&mut self, left: BlockId, right: BlockId, exp: u16) {
        self.arena.get_mut(right).expandable = exp;
        self.arena.get_mut(right).prev = left;
        if left != NIL {
            self.arena.get_mut(left).next = right;
        }
    }

    /// (blocks, bytes) of free blocks in a split segment, for the segment holding `id`.
    fn inactive_split_of_segment(&self, id: BlockId) -> (i64, i64) {
        let a = &self.arena;
        let mut head = id;
        while a.get(head).prev != NIL {
            head = a.get(head).prev;
        }
        let mut n = 0;
        let mut bytes = 0;
        let mut cur = head;
        while cur != NIL {
            let b = a.get(cur);
            if b.is_free() && b.is_split() {
                n += 1;
                bytes += b.size as i64;
            }
            cur = b.next;
        }
        (n, bytes)
    }
}

#[cfg(test)]
mod tests {
    use crate::{AllocatorConfig, CachingAllocator, ImportSegment, PoolKind, SimDevice};

    fn expandable(mapped: Vec<(u64, u64)>) -> ImportSegment {
        ImportSegment {
            pool: PoolKind::Large,
            stream: 0,
            total_size: 0,
            expandable: true,
            mapped,
            live: Vec::new(),
            pool_id: crate::DEFAULT_POOL,
        }
    }

    #[test]
    fn expandable_segments_map_whole_pages_or_are_refused() {
        let conf = AllocatorConfig::parse("expandable_segments:True").unwrap();
        let page = conf.large_segment_size;
        let a = CachingAllocator::new(SimDevice::new(80 << 30), conf.clone());
        assert!(a.import_segment(&expandable(vec![(0, 2 * page)])).is_ok());
        // The snapshot_replay fuzz target's: a mapping from mid-page.
        let a = CachingAllocator::new(SimDevice::new(80 << 30), conf);
        let e = a
            .import_segment(&expandable(vec![(109, page)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at offset 109, not whole pages"), "{e}");
    }
}
