//! Expandable segments: one virtual-address reservation per (stream, pool) that grows by
//! mapping physical pages, instead of a new `cudaMalloc` per segment.
//!
//! Design note: the whole reservation is a chain of blocks like any segment, with the
//! unmapped ranges as blocks whose `mapped` is false, kept in the pool's `unmapped` set.
//! Mapping turns the front of an unmapped block into mapped memory and merges it with the
//! free block before it, which is why a growing tensor lands right after the last one. Page
//! size is 2 MiB for the small pool and `large_segment_size` (20 MiB) for the large pool.

use crate::block::{BlockId, NIL, NO_SEGMENT};
use crate::device::{Device, DeviceError};
use crate::event::{AllocEvent, PoolKind, StreamId};
use crate::oom::AllocError;
use crate::policy::{State, SMALL_BUFFER};
use crate::snapshot::Stack;

/// The most address space one reservation takes: 4 TiB, over 20 times the memory of any
/// GPU PyTorch 2.11 runs on, so for every real capacity the reservation is PyTorch's
/// `total + total/8`. Only a simulated capacity above ~3.5 TiB is affected: its segments
/// reserve 4 TiB (or the request, when larger) instead of more than the address space has.
pub const MAX_RESERVATION: u64 = 1 << 42;

pub struct ExpandableSegment {
    pub base: u64,
    pub page_size: u64,
    pub max_pages: u64,
    /// Which pages are mapped, grown on demand up to the highest page ever mapped: the
    /// bookkeeping follows the memory really mapped, not the reservation (a 16 EiB
    /// simulated device would otherwise need a terabyte of flags).
    mapped: Vec<bool>,
    pub stream: StreamId,
}

impl ExpandableSegment {
    pub fn size(&self) -> u64 {
        self.page_size * self.max_pages
    }

    /// How many pages are mapped now.
    pub fn mapped_pages(&self) -> u64 {
        self.mapped.iter().filter(|m| **m).count() as u64
    }

    fn is_mapped(&self, page: u64) -> bool {
        usize::try_from(page)
            .ok()
            .and_then(|i| self.mapped.get(i))
            .copied()
            .unwrap_or(false)
    }

    fn set_mapped(&mut self, page: u64, on: bool) {
        let i = page as usize; // page < max_pages, whose flags fit in memory once mapped
        if i >= self.mapped.len() {
            if !on {
                return;
            }
            self.mapped.resize(i + 1, false);
        }
        self.mapped[i] = on;
    }

    /// Map the pages covering [ptr, ptr+size). Returns the mapped range; size 0 when the
    /// device ran out of memory, after giving back the pages this call mapped.
    fn map<D: Device>(
        &mut self,
        dev: &mut D,
        ptr: u64,
        size: u64,
    ) -> Result<(u64, u64), AllocError> {
        let begin = (ptr - self.base) / self.page_size;
        let end = (ptr + size - self.base)
            .div_ceil(self.page_size)
            .min(self.max_pages);
        for i in begin..end {
            if self.is_mapped(i) {
                continue;
            }
            let page = self.base + i * self.page_size;
            if let Err(e) = dev.map_page(page, self.page_size) {
                for j in begin..i {
                    dev.unmap_page(self.base + j * self.page_size, self.page_size);
                    self.set_mapped(j, false);
                }
                return match e {
                    DeviceError::OutOfMemory => Ok((ptr, 0)),
                    DeviceError::Other(m) => Err(AllocError::Device(m)),
                };
            }
            self.set_mapped(i, true);
        }
        Ok((
            self.base + begin * self.page_size,
            (end - begin) * self.page_size,
        ))
    }

    /// Unmap every whole page inside [ptr, ptr+size); returns the unmapped range.
    fn unmap<D: Device>(&mut self, dev: &mut D, ptr: u64, size: u64) -> (u64, u64) {
        let begin = (ptr - self.base).div_ceil(self.page_size);
        let end = (ptr + size - self.base) / self.page_size;
        if begin >= end {
            return (ptr, 0);
        }
        // Unmapping does not wait for the stream's work; the allocator must.
        dev.synchronize_stream(self.stream);
        for i in begin..end {
            if self.is_mapped(i) {
                dev.unmap_page(self.base + i * self.page_size, self.page_size);
                self.set_mapped(i, false);
            }
        }
        (
            self.base + begin * self.page_size,
            (end - begin) * self.page_size,
        )
    }
}

impl<D: Device> State<D> {
    pub(crate) fn page_size(&self, kind: PoolKind) -> u64 {
        match kind {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => self.config.large_segment_size,
        }
    }

    /// `find_expandable_block`: the lowest unmapped range of this stream that, with the free
    /// block before it and the free/unmapped chain after it, offers `size` bytes; else a new
    /// reservation. `None` when the device has no address space for one (an OOM).
    fn find_expandable_block(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        let a = &self.arena;
        let allocatable = |id: BlockId| id != NIL && a.get(id).is_free();
        let has_space = |mut id: BlockId| {
            let mut bytes = 0u64;
            while bytes < size && allocatable(id) {
                bytes = bytes.saturating_add(a.get(id).size);
                id = a.get(id).next;
            }
            bytes >= size
        };
        let pool = &self.pools[kind as usize];
        let mut it = pool.unmapped.lower_bound(a, (stream, 0, 0));
        while let Some(c0) = it {
            if a.get(c0).stream != stream {
                break;
            }
            let mut c = c0;
            let prev = a.get(c).prev;
            if allocatable(prev) {
                c = prev;
            }
            if has_space(c) {
                return Ok(Some(c));
            }
            it = pool.unmapped.successor(a, c0);
        }
        self.new_reservation(kind, stream, size)
    }

    /// Pages of a new reservation: PyTorch's `ceil((total + total/8) / page)`, computed
    /// without overflow. Above [`MAX_RESERVATION`] (only simulated capacities get there) it
    /// is that bound, or the request (`min_bytes`) when larger, so that a request the
    /// capacity allows still fits a fresh reservation. `None` when the reservation cannot
    /// be expressed in 64 bits (a page near 16 EiB).
    fn reservation_pages(&self, page: u64, min_bytes: u64) -> Option<u64> {
        let total = self.device.total_memory() as u128;
        let pytorch = total + total / 8;
        let page = page.max(1) as u128;
        let pages = if pytorch <= MAX_RESERVATION as u128 {
            pytorch.div_ceil(page)
        } else {
            (MAX_RESERVATION as u128)
                .div_ceil(page)
                .max((min_bytes as u128).div_ceil(page))
        }
        .max(1);
        let pages = u64::try_from(pages).ok()?;
        u64::try_from(page * pages as u128).ok().map(|_| pages)
    }

    /// A new reservation, as one unmapped block spanning it, with room for at least
    /// `min_bytes`. `Ok(None)` when the device has no address space for it.
    pub(crate) fn new_reservation(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        min_bytes: u64,
    ) -> Result<Option<BlockId>, AllocError> {
        let page = self.page_size(kind);
        let Some(max_pages) = self.reservation_pages(page, min_bytes) else {
            return Ok(None);
        };
        let base = match self.device.reserve(page * max_pages) {
            Ok(b) => b,
            // `cuMemAddressReserve` out of address space: the request does not fit.
            Err(DeviceError::OutOfMemory) => return Ok(None),
            Err(DeviceError::Other(e)) => return Err(AllocError::Device(e)),
        };
        let seg = ExpandableSegment {
            base,
            page_size: page,
            max_pages,
            mapped: Vec::new(),
            // the real stream: unmapping synchronises it
            stream: self.private.real(stream),
        };
        // A block names its segment in 16 bits. Each segment reserves address space for
        // the whole device, so a process runs out of that long before it has 65,535.
        let free_slot = self.expandable.iter().position(Option::is_none);
        if free_slot.is_none() && self.expandable.len() >= NO_SEGMENT as usize {
            self.device.release_reservation(base, page * max_pages);
            return Err(AllocError::Device(format!(
                "too many expandable segments ({})",
                self.expandable.len()
            )));
        }
        let idx = match free_slot {
            Some(i) => {
                self.expandable[i] = Some(seg);
                i
            }
            None => {
                self.expandable.push(Some(seg));
                self.expandable.len() - 1
            }
        };
        let id = self.arena.alloc(base, page * max_pages, stream, kind);
        let b = self.arena.get_mut(id);
        b.mapped = false;
        b.expandable = idx as u16;
        self.insert_unmapped(id);
        Ok(Some(id))
    }

    /// `map_block`: map the front `size` bytes of unmapped block `id` and merge the result
    /// with free neighbours. Ok(false) when the device is out of memory.
    fn map_block(
        &mut self,
        id: BlockId,
        size: u64,
        ctx: Option<&Stack>,
    ) -> Result<bool, AllocError> {
        let (ptr, bsize, seg_idx, stream, kind) = {
            let b = self.arena.get(id);
            debug_assert!(!b.mapped && size <= b.size);
            (b.ptr, b.size, b.expandable as usize, b.stream, b.pool)
        };
        let Some(seg) = self.expandable.get_mut(seg_idx).and_then(Option::as_mut) else {
            return Err(AllocError::Device("expandable segment missing".into()));
        };
        let (mptr, msize) = seg.map(&mut self.device, ptr, size)?;
        if msize == 0 {
            return Ok(false);
        }
        debug_assert_eq!(mptr, ptr);
        self.remove_free(id);
        self.arena.get_mut(id).mapped = true;
        if msize < bsize {
            let next = self.arena.get(id).next;
            let rest = self.splice_new(id, ptr + msize, bsize - msize, false, id, next);
            self.arena.get_mut(id).size = msize;
            self.insert_unmapped(rest);
        }
        let (prev, next) = {
            let b = self.arena.get(id);
            (b.prev, b.next)
        };
        self.try_merge_blocks::<true>(id, prev);
        self.try_merge_blocks::<false>(id, next);
        self.insert_free(id);
        self.total_allocated_memory += msize;
        self.emit(
            AllocEvent::SegmentMap {
                pool: kind,
                ptr: mptr,
                size: msize,
                stream,
            },
            ctx,
        );
        if self.arena.get(id).prev == NIL && self.arena.segment_context(id).is_none() {
            self.arena.set_segment_context(id, ctx.cloned());
        }
        Ok(true)
    }

    pub(crate) fn map_block_pub(&mut self, id: BlockId, size: u64) -> Result<bool, AllocError> {
        self.map_block(id, size, None)
    }

    /// `try_allocate_expandable_block`: find room, map pages until the candidate holds
    /// `size`, and take it out of the pool.
    pub(crate) fn try_allocate_expandable_block(
        &mut self,
        kind: PoolKind,
        stream: StreamId,
        size: u64,
        ctx: Option<&Stack>,
    ) -> Result<Option<BlockId>, AllocError> {
        let Some(mut cand) = self.find_expandable_block(kind, stream, size)? else {
            return Ok(None);
        };
        // cand is: unmapped -> ..., or free -> unmapped -> ...
        if !self.arena.get(cand).mapped {
            let sz = self.arena.get(cand).size.min(size);
            if !self.map_block(cand, sz, ctx)? {
                return Ok(None);
            }
        }
        while self.arena.get(cand).size < size {
            let remaining = size - self.arena.get(cand).size;
            let next = self.arena.get(cand).next;
            let sz = remaining.min(self.arena.get(next).size);
            if !self.map_block(next, sz, ctx)? {
                return Ok(None);
            }
            cand = next;
        }
        self.remove_free(cand);
        Ok(Some(cand))
    }

    /// `unmap_block`: give back the whole pages inside free block `id`; the page-unaligned
    /// edges stay as free mapped blocks.
    pub(crate) fn unmap_block(&mut self, id: BlockId) {
        let (ptr, size, seg_idx, stream, kind) = {
            let b = self.arena.get(id);
            (b.ptr, b.size, b.expandable as usize, b.stream, b.pool)
        };
        let Some(seg) = self.expandable.get_mut(seg_idx).and_then(Option::as_mut) else {
            return;
        };
        let (uptr, usize_) = seg.unmap(&mut self.device, ptr, size);
        if usize_ == 0 {
            return;
        }
        self.remove_free(id);
        let before = uptr - ptr;
        if before > 0 {
            let prev = self.arena.get(id).prev;
            let bf = self.splice_new(id, ptr, before, true, prev, id);
            self.insert_free(bf);
        }
        let after = size - (before + usize_);
        if after > 0 {
            let next = self.arena.get(id).next;
            let af = self.splice_new(id, uptr + usize_, after, true, id, next);
            self.insert_free(af);
        }
        {
            let b = self.arena.get_mut(id);
            b.ptr = uptr;
            b.size = usize_;
            b.mapped = false;
        }
        let (prev, next) = {
            let b = self.arena.get(id);
            (b.prev, b.next)
        };
        self.try_merge_blocks::<true>(id, prev);
        self.try_merge_blocks::<false>(id, next);
        self.insert_unmapped(id);
        self.total_allocated_memory -= usize_;
        let ctx = self.arena.segment_context(id).cloned();
        self.emit(
            AllocEvent::SegmentUnmap {
                pool: kind,
                ptr: uptr,
                size: usize_,
                stream,
            },
            ctx.as_ref(),
        );
    }

    /// The reservation is one unmapped block again: give the address range back.
    pub(crate) fn release_expandable_segment(&mut self, id: BlockId) {
        let seg_idx = self.arena.get(id).expandable as usize;
        self.remove_free(id);
        if let Some(seg) = self.expandable.get_mut(seg_idx).and_then(Option::take) {
            self.device.release_reservation(seg.base, seg.size());
        }
        self.arena.release(id);
    }
}
