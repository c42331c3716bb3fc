//! `CudaDevice`: Vramroom's `Device` on a real GPU through the CUDA driver API.
//!
//! Design note: this is what PyTorch's `CUDACachingAllocator` calls underneath, one to one:
//! - segments: `cuMemAlloc` / `cuMemFree` (PyTorch's `cudaMalloc` / `cudaFree`);
//! - expandable segments: `cuMemAddressReserve` for the whole range, then per page one
//!   `cuMemCreate` (one physical handle per page, as PyTorch does), `cuMemMap` and
//!   `cuMemSetAccess`; unmapping is `cuMemUnmap` + `cuMemRelease`, and the range goes back
//!   with `cuMemAddressFree`;
//! - `record_stream`: events from a pool (`cuEventCreate` with timing disabled), recorded with
//!   `cuEventRecord` on the using stream, polled with `cuEventQuery` and waited on with
//!   `cuEventSynchronize`, then returned to the pool;
//! - `mem_get_info`: `cuMemGetInfo`; total memory: `cuDeviceTotalMem` (`totalGlobalMem`);
//! - the OOM message's process lines: NVML (see nvml.rs).
//!
//! Every call runs in the device's *primary* context, the one the CUDA runtime (and so
//! PyTorch) uses, made current for the call and the caller's context put back after, so the
//! allocator can be called from any thread and shares memory with PyTorch. The `Device`
//! methods that cannot return an error (events, unmapping) fail safe: an event that cannot be
//! recorded is replaced by synchronising its stream, so memory is never reused early.

use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::sys;
use vramroom_alloc::{Device, DeviceError, EventId, StreamId};

use crate::driver::{check, error, CudaError};

/// An event id that is complete from the start (used when recording failed and the stream was
/// synchronised instead).
const DONE_EVENT: EventId = 0;

/// Vramroom's view of one CUDA device.
pub struct CudaDevice {
    ordinal: i32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    total: u64,
    name: String,
    pci_bus_id: String,
    /// `CU_MEM_ALLOC_GRANULARITY_MINIMUM` for pinned device memory; 0 without VMM.
    granularity: u64,
    vmm: bool,
    /// Physical handle and size of each mapped page, by page address.
    pages: HashMap<u64, (sys::CUmemGenericAllocationHandle, u64)>,
    /// Live `cuMemAlloc` segments and VMM reservations (base -> size), given back on drop.
    segments: HashMap<u64, u64>,
    reservations: HashMap<u64, u64>,
    /// Events recorded and not yet released.
    events: HashMap<EventId, sys::CUevent>,
    /// Idle events, reused before creating new ones.
    pool: Vec<sys::CUevent>,
    next_event: EventId,
    start: Instant,
}

// SAFETY: every handle here (context, events, memory handles) belongs to the device's primary
// context, which the driver lets any thread use once it is made current; each method makes it
// current for its own duration (`CtxGuard`). `CachingAllocator` serialises all calls with its
// mutex, so the maps are never touched concurrently.
unsafe impl Send for CudaDevice {}

/// Makes a context current and puts the previous one back on drop.
struct CtxGuard {
    prev: sys::CUcontext,
    swapped: bool,
}

impl CtxGuard {
    fn new(ctx: sys::CUcontext) -> Result<Self, CudaError> {
        let mut prev: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the driver was loaded by `driver()` before any `CudaDevice` exists; prev is a
        // valid out-pointer.
        check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(&mut prev)
        })?;
        if prev == ctx {
            return Ok(CtxGuard {
                prev,
                swapped: false,
            });
        }
        // SAFETY: ctx is the retained primary context of a live CudaDevice.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
        Ok(CtxGuard {
            prev,
            swapped: true,
        })
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if self.swapped {
            // SAFETY: prev was current on this thread a moment ago (or null, which unbinds).
            unsafe { sys::cuCtxSetCurrent(self.prev) };
        }
    }
}

fn dev_err(e: CudaError) -> DeviceError {
    if e.is_oom() {
        DeviceError::OutOfMemory
    } else {
        DeviceError::Other(e.to_string())
    }
}

impl CudaDevice {
    /// Open device `ordinal`: load the driver, retain the primary context, read total memory
    /// and VMM support. Fails with a typed error when there is no driver or no such device.
    pub fn new(ordinal: i32) -> Result<Self, CudaError> {
        let dev = crate::driver::device_handle(ordinal)?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: dev is a valid device handle; the context is released in Drop.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        let mut d = CudaDevice {
            ordinal,
            dev,
            ctx,
            total: 0,
            name: String::new(),
            pci_bus_id: String::new(),
            granularity: 0,
            vmm: false,
            pages: HashMap::new(),
            segments: HashMap::new(),
            reservations: HashMap::new(),
            events: HashMap::new(),
            pool: Vec::new(),
            next_event: 1,
            start: Instant::now(),
        };
        // From here on Drop releases the context if anything below fails.
        let mut total: usize = 0;
        // SAFETY: dev valid; total is an out-pointer.
        check("cuDeviceTotalMem", unsafe {
            sys::cuDeviceTotalMem_v2(&mut total, dev)
        })?;
        d.total = total as u64;
        d.name = device_name(dev);
        d.pci_bus_id = pci_bus_id(dev);
        let mut vmm: i32 = 0;
        // SAFETY: dev valid; vmm is an out-pointer.
        let rc = unsafe {
            sys::cuDeviceGetAttribute(
                &mut vmm,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
                dev,
            )
        };
        if rc == sys::CUresult::CUDA_SUCCESS && vmm != 0 {
            let prop = d.page_prop();
            let mut g: usize = 0;
            // SAFETY: prop is a fully initialised allocation property for this device.
            let rc = unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut g,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            };
            if rc == sys::CUresult::CUDA_SUCCESS && g > 0 {
                d.granularity = g as u64;
                d.vmm = true;
            }
        }
        Ok(d)
    }

    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }
    /// `cudaDeviceProp.name`, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The PCI bus id NVML knows the device by.
    pub fn pci_bus_id(&self) -> &str {
        &self.pci_bus_id
    }
    /// The VMM page granularity (2 MiB on Hopper); 0 without VMM.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }
    /// The raw primary context (for callers that launch work in it).
    pub fn context(&self) -> sys::CUcontext {
        self.ctx
    }
    /// Pages currently mapped for expandable segments.
    pub fn mapped_pages(&self) -> usize {
        self.pages.len()
    }
    /// Events in flight and idle in the pool.
    pub fn event_counts(&self) -> (usize, usize) {
        (self.events.len(), self.pool.len())
    }

    /// `cuMemGetInfo` as a Result (the trait's form cannot fail).
    pub fn try_mem_get_info(&self) -> Result<(u64, u64), CudaError> {
        let _g = CtxGuard::new(self.ctx)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: context current; out-pointers valid.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// Run `f` with this device's context current.
    pub fn with_context<R>(&self, f: impl FnOnce() -> R) -> Result<R, CudaError> {
        let _g = CtxGuard::new(self.ctx)?;
        Ok(f())
    }

    fn page_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: CUmemAllocationProp is a plain C struct; all-zero is its documented default
        // (no handle type, no flags) before the fields below are set.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal;
        prop
    }

    fn new_event(&mut self) -> Result<sys::CUevent, CudaError> {
        if let Some(e) = self.pool.pop() {
            return Ok(e);
        }
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: context is current (callers hold a CtxGuard); e is an out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut e,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as std::ffi::c_uint,
            )
        })?;
        Ok(e)
    }

    fn try_record_event(&mut self, stream: StreamId) -> Result<EventId, CudaError> {
        let _g = CtxGuard::new(self.ctx)?;
        let ev = self.new_event()?;
        // SAFETY: ev is a live event of this context; stream is the raw CUstream the caller
        // allocated on (0 = legacy default stream), as PyTorch passes it.
        let rc = unsafe { sys::cuEventRecord(ev, stream as sys::CUstream) };
        if let Err(e) = check("cuEventRecord", rc) {
            self.pool.push(ev);
            return Err(e);
        }
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(id, ev);
        Ok(id)
    }

    fn try_synchronize_stream(&mut self, stream: StreamId) -> Result<(), CudaError> {
        let _g = CtxGuard::new(self.ctx)?;
        // SAFETY: context current; stream is a raw CUstream of this context or 0.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(stream as sys::CUstream)
        })
    }

    fn try_map_page(&mut self, ptr: u64, page_size: u64) -> Result<(), CudaError> {
        let _g = CtxGuard::new(self.ctx)?;
        let prop = self.page_prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: prop is valid; page_size is a multiple of the granularity (checked in
        // `reserve`); handle is an out-pointer.
        check("cuMemCreate", unsafe {
            sys::cuMemCreate(&mut handle, page_size as usize, &prop, 0)
        })?;
        // SAFETY: ptr..ptr+page_size lies inside a range from `reserve` and is not mapped
        // (the policy maps each page once); handle holds exactly page_size bytes.
        let rc = unsafe { sys::cuMemMap(ptr, page_size as usize, 0, handle, 0) };
        if let Err(e) = check("cuMemMap", rc) {
            // SAFETY: the handle was created above and is not mapped anywhere.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        let desc = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; desc names this device.
        let rc = unsafe { sys::cuMemSetAccess(ptr, page_size as usize, &desc, 1) };
        if let Err(e) = check("cuMemSetAccess", rc) {
            // SAFETY: undo the map and the handle made above.
            unsafe {
                sys::cuMemUnmap(ptr, page_size as usize);
                sys::cuMemRelease(handle);
            }
            return Err(e);
        }
        self.pages.insert(ptr, (handle, page_size));
        Ok(())
    }
}

fn device_name(dev: sys::CUdevice) -> String {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: buf has the length passed; the driver NUL-terminates within it.
    let rc = unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return String::new();
    }
    // SAFETY: NUL-terminated by the driver; the last byte is never written past.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn pci_bus_id(dev: sys::CUdevice) -> String {
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: as in device_name.
    let rc = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return String::new();
    }
    // SAFETY: as in device_name.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

impl Device for CudaDevice {
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        let _g = CtxGuard::new(self.ctx).map_err(dev_err)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: context current; p is an out-pointer.
        let rc = unsafe { sys::cuMemAlloc_v2(&mut p, size as usize) };
        match rc {
            sys::CUresult::CUDA_SUCCESS => {
                self.segments.insert(p, size);
                Ok(p)
            }
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory),
            other => Err(dev_err(error("cuMemAlloc", other))),
        }
    }

    fn free(&mut self, ptr: u64, _size: u64) -> Result<(), DeviceError> {
        let _g = CtxGuard::new(self.ctx).map_err(dev_err)?;
        // SAFETY: ptr is a segment base from `malloc` that no block uses any more (the policy
        // releases whole free segments only, after their events completed).
        check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) }).map_err(dev_err)?;
        self.segments.remove(&ptr);
        Ok(())
    }

    fn mem_get_info(&self) -> (u64, u64) {
        match self.try_mem_get_info() {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("cuMemGetInfo: {e}");
                (0, self.total)
            }
        }
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn index(&self) -> i64 {
        self.ordinal as i64
    }

    fn supports_vmm(&self) -> bool {
        self.vmm
    }

    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        if !self.vmm {
            return Err(DeviceError::Other(
                "this device does not support CUDA virtual memory management".into(),
            ));
        }
        if !size.is_multiple_of(self.granularity) {
            return Err(DeviceError::Other(format!(
                "reservation of {size} bytes is not a multiple of the VMM granularity {}",
                self.granularity
            )));
        }
        let _g = CtxGuard::new(self.ctx).map_err(dev_err)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: context current; size is a multiple of the granularity; no fixed address.
        let rc = unsafe { sys::cuMemAddressReserve(&mut p, size as usize, 0, 0, 0) };
        check("cuMemAddressReserve", rc).map_err(dev_err)?;
        self.reservations.insert(p, size);
        Ok(p)
    }

    fn release_reservation(&mut self, ptr: u64, size: u64) {
        let Ok(_g) = CtxGuard::new(self.ctx) else {
            return;
        };
        // SAFETY: ptr/size is a reservation from `reserve` whose pages were all unmapped.
        let rc = unsafe { sys::cuMemAddressFree(ptr, size as usize) };
        if let Err(e) = check("cuMemAddressFree", rc) {
            tracing::warn!("{e}");
        }
        self.reservations.remove(&ptr);
    }

    fn map_page(&mut self, ptr: u64, page_size: u64) -> Result<(), DeviceError> {
        if !self.vmm || !page_size.is_multiple_of(self.granularity) {
            return Err(DeviceError::Other(format!(
                "page size {page_size} is not a multiple of the VMM granularity {}",
                self.granularity
            )));
        }
        self.try_map_page(ptr, page_size).map_err(dev_err)
    }

    fn unmap_page(&mut self, ptr: u64, page_size: u64) {
        let Some((handle, _)) = self.pages.remove(&ptr) else {
            tracing::warn!("unmap_page: no page mapped at {ptr:#x}");
            return;
        };
        let Ok(_g) = CtxGuard::new(self.ctx) else {
            return;
        };
        // SAFETY: ptr was mapped by `map_page` with this handle and size; the policy
        // synchronised the segment's stream first (unmapping does not wait).
        unsafe {
            if let Err(e) = check("cuMemUnmap", sys::cuMemUnmap(ptr, page_size as usize)) {
                tracing::warn!("{e}");
            }
            if let Err(e) = check("cuMemRelease", sys::cuMemRelease(handle)) {
                tracing::warn!("{e}");
            }
        }
    }

    fn record_event(&mut self, stream: StreamId) -> EventId {
        match self.try_record_event(stream) {
            Ok(id) => id,
            Err(e) => {
                // Fail safe: wait for the stream now, so the block is truly free.
                tracing::warn!("{e}; synchronising stream {stream:#x} instead");
                if let Err(e) = self.try_synchronize_stream(stream) {
                    tracing::error!("{e}");
                }
                DONE_EVENT
            }
        }
    }

    fn query_event(&mut self, event: EventId) -> bool {
        let Some(&ev) = self.events.get(&event) else {
            return true;
        };
        let Ok(_g) = CtxGuard::new(self.ctx) else {
            return false;
        };
        // SAFETY: ev is a live recorded event of this context.
        match unsafe { sys::cuEventQuery(ev) } {
            sys::CUresult::CUDA_SUCCESS => true,
            sys::CUresult::CUDA_ERROR_NOT_READY => false,
            other => {
                // A failed query means the context is broken; waiting would not help.
                tracing::error!("{}", error("cuEventQuery", other));
                true
            }
        }
    }

    fn synchronize_event(&mut self, event: EventId) {
        let Some(&ev) = self.events.get(&event) else {
            return;
        };
        let Ok(_g) = CtxGuard::new(self.ctx) else {
            return;
        };
        // SAFETY: ev is a live recorded event of this context.
        if let Err(e) = check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(ev) }) {
            tracing::error!("{e}");
        }
    }

    fn release_event(&mut self, event: EventId) {
        if let Some(ev) = self.events.remove(&event) {
            self.pool.push(ev);
        }
    }

    fn synchronize_stream(&mut self, stream: StreamId) {
        if let Err(e) = self.try_synchronize_stream(stream) {
            tracing::error!("{e}");
        }
    }

    fn now_us(&mut self) -> i64 {
        self.start.elapsed().as_micros() as i64
    }

    fn process_memory_info(&self) -> String {
        crate::nvml::oom_process_lines(&self.pci_bus_id)
    }
}

impl Drop for CudaDevice {
    /// The device owns what it took from the driver: memory still held when the allocator
    /// goes away (cached segments, mapped pages) goes back, then the events and the context.
    fn drop(&mut self) {
        if let Ok(_g) = CtxGuard::new(self.ctx) {
            let pending = !self.segments.is_empty() || !self.pages.is_empty();
            if pending {
                // SAFETY: context current; wait for queued work that may still use the memory.
                unsafe { sys::cuCtxSynchronize() };
            }
            for (p, (handle, size)) in self.pages.drain() {
                // SAFETY: each page was mapped by map_page with this handle and size.
                unsafe {
                    sys::cuMemUnmap(p, size as usize);
                    sys::cuMemRelease(handle);
                }
            }
            for (p, size) in self.reservations.drain() {
                // SAFETY: a reservation from cuMemAddressReserve whose pages were unmapped above.
                unsafe { sys::cuMemAddressFree(p, size as usize) };
            }
            for (p, _) in self.segments.drain() {
                // SAFETY: a segment from cuMemAlloc that nothing uses once the device drops.
                unsafe { sys::cuMemFree_v2(p) };
            }
            for (_, ev) in self.events.drain() {
                // SAFETY: events of this context, no longer referenced.
                unsafe { sys::cuEventDestroy_v2(ev) };
            }
            for ev in self.pool.drain(..) {
                // SAFETY: as above.
                unsafe { sys::cuEventDestroy_v2(ev) };
            }
        }
        // SAFETY: balances the retain in `new`.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("total", &self.total)
            .field("vmm", &self.vmm)
            .field("granularity", &self.granularity)
            .field("mapped_pages", &self.pages.len())
            .finish()
    }
}
