//! The device under the allocator: raw segments, free/total memory, optional virtual memory,
//! and stream events.
//!
//! Design note: this is the only door between the policy and the world. `CachingAllocator`
//! calls exactly what PyTorch's allocator calls on CUDA (`cudaMalloc`, `cudaFree`,
//! `cudaMemGetInfo`, `cuMemAddressReserve`/`cuMemCreate`/`cuMemMap`, `cudaEventRecord`/
//! `cudaEventQuery`), so a `SimDevice` replays a GPU's behaviour exactly and a CUDA device
//! drops in without the policy changing. The device is also the allocator's only clock.

use std::collections::{HashMap, HashSet};

use crate::driver_va::DriverVa;
use crate::event::StreamId;

/// Why a device call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// `cudaErrorMemoryAllocation`: the caller may free cache and retry.
    #[error("out of device memory")]
    OutOfMemory,
    /// Anything else: raised to the user at once.
    #[error("device error: {0}")]
    Other(String),
}

/// An event recorded on a stream, as returned by [`Device::record_event`].
pub type EventId = u64;

pub trait Device: Send {
    /// `cudaMalloc`.
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError>;
    /// `cudaFree`.
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError>;
    /// `cudaMemGetInfo`: (free, total), device-wide.
    fn mem_get_info(&self) -> (u64, u64);
    /// `totalGlobalMem`: the base of memory fractions and expandable reservations.
    fn total_memory(&self) -> u64 {
        self.mem_get_info().1
    }
    /// Device index, for messages and snapshots.
    fn index(&self) -> i64 {
        0
    }

    /// Whether `reserve`/`map_page`/`unmap_page` work (expandable segments need them).
    fn supports_vmm(&self) -> bool {
        false
    }
    /// `cuMemAddressReserve`.
    fn reserve(&mut self, _size: u64) -> Result<u64, DeviceError> {
        Err(DeviceError::Other(
            "virtual memory is not supported by this device".into(),
        ))
    }
    /// `cuMemAddressFree`.
    fn release_reservation(&mut self, _ptr: u64, _size: u64) {}
    /// `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` of one physical page at `ptr`.
    fn map_page(&mut self, _ptr: u64, _page_size: u64) -> Result<(), DeviceError> {
        Err(DeviceError::Other(
            "virtual memory is not supported by this device".into(),
        ))
    }
    /// `cuMemUnmap` + `cuMemRelease` of one page.
    fn unmap_page(&mut self, _ptr: u64, _page_size: u64) {}

    /// `cudaEventRecord` on `stream`.
    fn record_event(&mut self, _stream: StreamId) -> EventId {
        0
    }
    /// `cudaEventQuery`: has the work before the event finished?
    fn query_event(&mut self, _event: EventId) -> bool {
        true
    }
    /// `cudaEventSynchronize`, then the event returns to the pool.
    fn synchronize_event(&mut self, _event: EventId) {}
    /// The event is no longer needed.
    fn release_event(&mut self, _event: EventId) {}
    /// `cudaStreamSynchronize` (unmapping does not synchronise by itself).
    fn synchronize_stream(&mut self, _stream: StreamId) {}

    /// Microseconds for history timestamps. Devices without a clock return a counter.
    fn now_us(&mut self) -> i64 {
        0
    }
    /// NVML-style per-process memory lines for OOM messages; empty when unknown.
    fn process_memory_info(&self) -> String {
        String::new()
    }
}

const SIM_BASE: u64 = 0x7f00_0000_0000;
/// How far ahead a `malloc` looks for a hint of its size.
const HINT_LOOKAHEAD: usize = 64;
const SIM_ALIGN: u64 = 2 << 20;
/// The driver model's chunks stay above this (far below any hint or reservation).
const DRIVER_FLOOR: u64 = 0x1000_0000_0000;

/// Accounting only: a capacity in bytes and deterministic addresses. Replay and tests run on
/// it. Addresses are deterministic, so a run is reproducible: a recorded address when a hint
/// gives one, else the driver's placement after [`SimDevice::use_driver_addresses`], else the
/// next fresh range (addresses that grow and are never reused).
///
/// Events complete at once unless their stream is held with [`SimDevice::hold_stream`]; a
/// held stream's events complete in order, one at each [`SimDevice::advance_stream`], or
/// all at [`SimDevice::release_stream`].
#[derive(Debug, Clone)]
pub struct SimDevice {
    capacity: u64,
    used: u64,
    /// Memory outside the allocator (CUDA context, libraries), counted as used.
    external: u64,
    next_addr: u64,
    next_event: EventId,
    held: HashSet<StreamId>,
    /// Events not yet complete, per held stream in record order.
    queues: HashMap<StreamId, std::collections::VecDeque<EventId>>,
    waiting: HashSet<EventId>,
    mapped_pages: u64,
    clock_us: i64,
    fail_next: u32,
    /// Addresses to hand out, in order, when the request's size matches (replay uses the
    /// recorded GPU's addresses so best-fit ties break as they did there).
    malloc_hints: std::collections::VecDeque<(u64, u64)>,
    reserve_hints: std::collections::VecDeque<u64>,
    /// Live ranges by start, to refuse a hint that would overlap.
    live: std::collections::BTreeMap<u64, u64>,
    /// The driver's placement, for `malloc`s without a hint (see `driver_va`); off, addresses
    /// grow with time.
    driver: Option<DriverVa>,
}

impl SimDevice {
    pub fn new(capacity: u64) -> Self {
        SimDevice {
            capacity,
            used: 0,
            external: 0,
            next_addr: SIM_BASE,
            next_event: 1,
            held: HashSet::new(),
            queues: HashMap::new(),
            waiting: HashSet::new(),
            mapped_pages: 0,
            clock_us: 0,
            fail_next: 0,
            malloc_hints: Default::default(),
            reserve_hints: Default::default(),
            live: Default::default(),
            driver: None,
        }
    }
    /// Place `malloc`s without a hint as the CUDA driver does (`driver_va`'s model) instead of
    /// at ever-growing addresses: for replays of traces that recorded no addresses.
    pub fn use_driver_addresses(&mut self) {
        self.driver.get_or_insert_with(DriverVa::default);
    }
    /// Prefer these (size, address) pairs for the next `malloc`s of matching size.
    pub fn set_malloc_hints(&mut self, hints: impl IntoIterator<Item = (u64, u64)>) {
        self.malloc_hints = hints.into_iter().collect();
        self.bump_past_hints();
    }
    /// Prefer these addresses for the next reservations.
    pub fn set_reserve_hints(&mut self, hints: impl IntoIterator<Item = u64>) {
        self.reserve_hints = hints.into_iter().collect();
    }
    fn bump_past_hints(&mut self) {
        // Hints come from a snapshot file: saturate rather than wrap on absurd ones.
        if let Some(end) = self
            .malloc_hints
            .iter()
            .map(|(s, a)| a.saturating_add(*s))
            .max()
        {
            let aligned = end.div_ceil(SIM_ALIGN).saturating_mul(SIM_ALIGN);
            self.next_addr = self.next_addr.max(aligned);
        }
    }
    fn overlaps(&self, start: u64, size: u64) -> bool {
        let end = start.saturating_add(size);
        if let Some((_, &e)) = self.live.range(..end).next_back() {
            if e > start {
                return true;
            }
        }
        false
    }
    /// An address range of `size` bytes: the hint when it is free, else the next fresh
    /// range. `OutOfMemory` when the range would run past the end of the 64-bit address
    /// space, as `cudaMalloc` or `cuMemAddressReserve` fail on a real device; a huge
    /// simulated capacity (or a 16 EiB `large_segment_size`) must not wrap addresses around.
    fn place(&mut self, size: u64, hinted: Option<u64>) -> Result<u64, DeviceError> {
        let p = match hinted {
            Some(h) if h.checked_add(size).is_some() && !self.overlaps(h, size) => h,
            _ => loop {
                let p = self.next_range(size)?;
                if !self.overlaps(p, size) {
                    break p;
                }
            },
        };
        let end = p.checked_add(size).ok_or(DeviceError::OutOfMemory)?;
        self.live.insert(p, end);
        Ok(p)
    }
    /// Bytes taken by the allocator's segments and mapped pages.
    pub fn used(&self) -> u64 {
        self.used
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Memory used outside the allocator, such as a CUDA context: lowers what is free.
    pub fn set_external_usage(&mut self, bytes: u64) {
        self.external = bytes;
    }
    /// Make the next `n` segment or page requests fail with OOM (fault injection).
    pub fn fail_next_allocations(&mut self, n: u32) {
        self.fail_next = n;
    }
    pub fn hold_stream(&mut self, s: StreamId) {
        self.held.insert(s);
    }
    /// The stream's work is done: every event on it completes, and later ones at once.
    pub fn release_stream(&mut self, s: StreamId) {
        self.held.remove(&s);
        for e in self.queues.remove(&s).unwrap_or_default() {
            self.waiting.remove(&e);
        }
    }
    /// The oldest outstanding event recorded on held stream `s` completes.
    pub fn advance_stream(&mut self, s: StreamId) {
        let Some(q) = self.queues.get_mut(&s) else {
            return;
        };
        while let Some(e) = q.pop_front() {
            // skip events already waited for
            if self.waiting.remove(&e) {
                break;
            }
        }
    }
    pub fn set_clock_us(&mut self, t: i64) {
        self.clock_us = t;
    }
    fn take(&mut self, size: u64) -> Result<(), DeviceError> {
        if self.fail_next > 0 {
            self.fail_next -= 1;
            return Err(DeviceError::OutOfMemory);
        }
        // Checked: a size near 2^64 (a huge `large_segment_size`) must fail, not wrap.
        let fits = self
            .used
            .checked_add(self.external)
            .and_then(|u| u.checked_add(size))
            .is_some_and(|end| end <= self.capacity);
        if !fits {
            return Err(DeviceError::OutOfMemory);
        }
        self.used += size;
        Ok(())
    }
    fn next_range(&mut self, size: u64) -> Result<u64, DeviceError> {
        let p = self.next_addr;
        let step = size
            .div_ceil(SIM_ALIGN)
            .max(1)
            .checked_mul(SIM_ALIGN)
            .ok_or(DeviceError::OutOfMemory)?;
        self.next_addr = p.checked_add(step).ok_or(DeviceError::OutOfMemory)?;
        Ok(p)
    }
}

impl Device for SimDevice {
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.take(size)?;
        // The next hint of this size: a replay under another config asks for other sizes
        // in between, and the driver's later answers still follow its earlier ones.
        let hint = self
            .malloc_hints
            .iter()
            .take(HINT_LOOKAHEAD)
            .position(|&(s, _)| s == size)
            .and_then(|i| self.malloc_hints.remove(i))
            .map(|(_, a)| a);
        let hint = match (hint, self.driver.as_mut()) {
            (None, Some(va)) => va.place(size, &self.live, DRIVER_FLOOR, SIM_BASE),
            (h, _) => h,
        };
        self.place(size, hint).inspect_err(|_| self.used -= size)
    }
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        self.used = self.used.saturating_sub(size);
        self.live.remove(&ptr);
        Ok(())
    }
    fn mem_get_info(&self) -> (u64, u64) {
        (
            self.capacity
                .saturating_sub(self.used.saturating_add(self.external)),
            self.capacity,
        )
    }
    fn supports_vmm(&self) -> bool {
        true
    }
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        let hint = self.reserve_hints.pop_front();
        self.place(size, hint)
    }
    fn release_reservation(&mut self, ptr: u64, _size: u64) {
        self.live.remove(&ptr);
    }
    fn map_page(&mut self, _ptr: u64, page_size: u64) -> Result<(), DeviceError> {
        self.take(page_size)?;
        self.mapped_pages += 1;
        Ok(())
    }
    fn unmap_page(&mut self, _ptr: u64, page_size: u64) {
        self.used = self.used.saturating_sub(page_size);
        self.mapped_pages = self.mapped_pages.saturating_sub(1);
    }
    fn record_event(&mut self, stream: StreamId) -> EventId {
        let e = self.next_event;
        self.next_event += 1;
        if self.held.contains(&stream) {
            self.waiting.insert(e);
            self.queues.entry(stream).or_default().push_back(e);
        }
        e
    }
    fn query_event(&mut self, event: EventId) -> bool {
        !self.waiting.contains(&event)
    }
    fn synchronize_event(&mut self, event: EventId) {
        // Waiting for an event means the stream's work up to it finished.
        self.waiting.remove(&event);
    }
    fn release_event(&mut self, event: EventId) {
        self.waiting.remove(&event);
    }
    fn now_us(&mut self) -> i64 {
        self.clock_us += 1;
        self.clock_us
    }
}

/// Real host memory under a capacity. The CPU tensor backend runs on it. Segments are
/// page-aligned heap allocations; virtual memory (for expandable segments) is an
/// `mmap(PROT_NONE)` reservation whose pages are committed with `mprotect`.
#[derive(Debug)]
pub struct HostDevice {
    capacity: u64,
    used: u64,
    start: std::time::Instant,
}

const HOST_ALIGN: usize = 4096;

impl HostDevice {
    pub fn new(capacity: u64) -> Self {
        HostDevice {
            capacity,
            used: 0,
            start: std::time::Instant::now(),
        }
    }
    pub fn used(&self) -> u64 {
        self.used
    }
}

impl Device for HostDevice {
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        // Checked: a segment near 2^64 bytes is out of memory, not a wrapped small one.
        if size == 0
            || self
                .used
                .checked_add(size)
                .is_none_or(|end| end > self.capacity)
        {
            return Err(DeviceError::OutOfMemory);
        }
        // A size no layout can describe is memory the host does not have.
        let layout = usize::try_from(size)
            .ok()
            .and_then(|n| std::alloc::Layout::from_size_align(n, HOST_ALIGN).ok())
            .ok_or(DeviceError::OutOfMemory)?;
        // SAFETY: layout has non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(DeviceError::OutOfMemory);
        }
        self.used += size;
        Ok(p as u64)
    }
    fn free(&mut self, ptr: u64, size: u64) -> Result<(), DeviceError> {
        let layout = std::alloc::Layout::from_size_align(size as usize, HOST_ALIGN)
            .map_err(|e| DeviceError::Other(e.to_string()))?;
        // SAFETY: ptr came from `malloc` above with this exact layout (the allocator frees
        // whole segments with their original size).
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        self.used -= size;
        Ok(())
    }
    fn mem_get_info(&self) -> (u64, u64) {
        (self.capacity.saturating_sub(self.used), self.capacity)
    }
    fn supports_vmm(&self) -> bool {
        cfg!(unix)
    }
    #[cfg(unix)]
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        // SAFETY: anonymous private mapping with no access; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DeviceError::OutOfMemory);
        }
        Ok(p as u64)
    }
    #[cfg(unix)]
    fn release_reservation(&mut self, ptr: u64, size: u64) {
        // SAFETY: the range is a reservation made by `reserve` and no block points into it.
        unsafe { libc::munmap(ptr as *mut libc::c_void, size as usize) };
    }
    #[cfg(unix)]
    fn map_page(&mut self, ptr: u64, page_size: u64) -> Result<(), DeviceError> {
        if self
            .used
            .checked_add(page_size)
            .is_none_or(|end| end > self.capacity)
        {
            return Err(DeviceError::OutOfMemory);
        }
        // SAFETY: ptr..ptr+page_size lies inside one of our reservations.
        let rc = unsafe {
            libc::mprotect(
                ptr as *mut libc::c_void,
                page_size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            return Err(DeviceError::OutOfMemory);
        }
        self.used += page_size;
        Ok(())
    }
    #[cfg(unix)]
    fn unmap_page(&mut self, ptr: u64, page_size: u64) {
        // SAFETY: as in map_page; MADV_DONTNEED gives the physical pages back to the OS.
        unsafe {
            libc::madvise(
                ptr as *mut libc::c_void,
                page_size as usize,
                libc::MADV_DONTNEED,
            );
            libc::mprotect(
                ptr as *mut libc::c_void,
                page_size as usize,
                libc::PROT_NONE,
            );
        }
        self.used -= page_size;
    }
    fn now_us(&mut self) -> i64 {
        self.start.elapsed().as_micros() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AllocatorConfig, CachingAllocator};

    fn write_read(ptr: u64, len: u64) {
        // SAFETY: the allocator handed out [ptr, ptr+len) of real host memory.
        let s = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len as usize) };
        for (i, b) in s.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        assert!(s.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }

    #[test]
    fn host_device_gives_real_memory_under_a_capacity() {
        let a = CachingAllocator::new(HostDevice::new(64 << 20), AllocatorConfig::default());
        let x = a.malloc(3 << 20, 0).unwrap();
        write_read(x.ptr, 3 << 20);
        assert_eq!(x.ptr % 512, 0);
        assert_eq!(a.memory_reserved(), 20 << 20);
        // Past the capacity: a typed OOM, and the allocator still works.
        let err = a.malloc(100 << 20, 0).unwrap_err();
        assert!(err.is_oom(), "{err}");
        a.free(x.ptr).unwrap();
        a.empty_cache();
        assert_eq!(a.memory_reserved(), 0);
        assert_eq!(a.with_device(|d| d.used()), 0);
        a.check_invariants().unwrap();
    }

    #[test]
    fn host_device_expandable_segments_map_real_pages() {
        let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
        let a = CachingAllocator::new(HostDevice::new(256 << 20), cfg);
        let x = a.malloc((1 << 20) + 1, 0).unwrap();
        let y = a.malloc(30 << 20, 0).unwrap();
        // The second tensor lands right after the first: the segment grew in place.
        assert_eq!(y.ptr, x.ptr + 1_049_088);
        write_read(x.ptr, (1 << 20) + 1);
        write_read(y.ptr, 30 << 20);
        assert_eq!(a.memory_reserved(), 40 << 20);
        a.free(x.ptr).unwrap();
        a.free(y.ptr).unwrap();
        a.empty_cache();
        assert_eq!(a.memory_reserved(), 0);
        assert_eq!(a.with_device(|d| d.used()), 0);
        // Memory can be taken again after the pages went back.
        let z = a.malloc(5 << 20, 0).unwrap();
        write_read(z.ptr, 5 << 20);
        a.free(z.ptr).unwrap();
        a.check_invariants().unwrap();
    }

    #[test]
    fn sim_device_holds_events_until_released() {
        let mut d = SimDevice::new(1 << 30);
        d.hold_stream(7);
        let e = d.record_event(7);
        let f = d.record_event(8);
        assert!(!d.query_event(e));
        assert!(d.query_event(f));
        d.release_stream(7);
        assert!(d.query_event(e));
    }
}
