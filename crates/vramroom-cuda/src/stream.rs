//! Streams and raw device memory access, for tests, benchmarks and callers that have no
//! runtime of their own.
//!
//! Design note: the allocator itself never creates streams: PyTorch hands it raw `cudaStream_t`
//! values. These helpers exist so that Vramroom can exercise `record_stream` on a real GPU
//! without kernels: a *gate* (`cuLaunchHostFunc` with a host function that waits on a flag)
//! holds a stream's queue until the test opens it, which makes "the side stream's work is not
//! done yet" deterministic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;
use vramroom_alloc::StreamId;

use crate::device::CudaDevice;
use crate::driver::{check, CudaError};

/// A non-blocking stream in a device's primary context.
pub struct CudaStream {
    raw: sys::CUstream,
    ctx: sys::CUcontext,
}

// SAFETY: a CUstream may be used from any thread that has its context current; every method
// makes it current.
unsafe impl Send for CudaStream {}
// SAFETY: as above; the driver's stream calls are thread-safe.
unsafe impl Sync for CudaStream {}

/// Opens a gate made by [`CudaStream::gate`] when dropped or when [`Gate::open`] is called.
pub struct Gate {
    flag: Arc<AtomicBool>,
}

impl Gate {
    pub fn open(&self) {
        self.flag.store(true, Ordering::Release);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

unsafe extern "C" fn wait_for_flag(user: *mut std::ffi::c_void) {
    // SAFETY: `user` is the `Arc<AtomicBool>` leaked by `gate` with `Arc::into_raw`; this call
    // takes that reference back exactly once.
    let flag = unsafe { Arc::from_raw(user as *const AtomicBool) };
    while !flag.load(Ordering::Acquire) {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

fn with_ctx<R>(
    ctx: sys::CUcontext,
    f: impl FnOnce() -> Result<R, CudaError>,
) -> Result<R, CudaError> {
    let mut prev: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is loaded (a CudaDevice or CudaStream exists); prev is an out-pointer.
    check("cuCtxGetCurrent", unsafe {
        sys::cuCtxGetCurrent(&mut prev)
    })?;
    // SAFETY: ctx is a retained primary context.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
    let r = f();
    // SAFETY: restores what was current before.
    unsafe { sys::cuCtxSetCurrent(prev) };
    r
}

impl CudaStream {
    /// A new non-blocking stream on `dev`.
    pub fn new(dev: &CudaDevice) -> Result<Self, CudaError> {
        let ctx = dev.context();
        let raw = with_ctx(ctx, || {
            let mut s: sys::CUstream = std::ptr::null_mut();
            // SAFETY: context current; s is an out-pointer.
            check("cuStreamCreate", unsafe {
                sys::cuStreamCreate(
                    &mut s,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint,
                )
            })?;
            Ok(s)
        })?;
        Ok(CudaStream { raw, ctx })
    }

    /// The stream as the allocator names it (the raw handle as an integer).
    pub fn id(&self) -> StreamId {
        self.raw as StreamId
    }

    /// Hold this stream: work queued after the gate waits until the gate is opened.
    pub fn gate(&self) -> Result<Gate, CudaError> {
        let flag = Arc::new(AtomicBool::new(false));
        let user = Arc::into_raw(flag.clone()) as *mut std::ffi::c_void;
        let raw = self.raw;
        let r = with_ctx(self.ctx, || {
            // SAFETY: the host function takes back the Arc leaked into `user` exactly once.
            check("cuLaunchHostFunc", unsafe {
                sys::cuLaunchHostFunc(raw, Some(wait_for_flag), user)
            })
        });
        if r.is_err() {
            // SAFETY: the launch failed, so the host function will never run; reclaim here.
            drop(unsafe { Arc::from_raw(user as *const AtomicBool) });
        }
        r.map(|_| Gate { flag })
    }

    /// `cuMemsetD32Async` of `words` 32-bit words at `ptr` on this stream.
    pub fn memset_d32(&self, ptr: u64, value: u32, words: usize) -> Result<(), CudaError> {
        let raw = self.raw;
        with_ctx(self.ctx, || {
            // SAFETY: the caller owns ptr..ptr+4*words on the device.
            check("cuMemsetD32Async", unsafe {
                sys::cuMemsetD32Async(ptr, value, words, raw)
            })
        })
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        let raw = self.raw;
        with_ctx(self.ctx, || {
            // SAFETY: raw is a live stream of ctx.
            check("cuStreamSynchronize", unsafe {
                sys::cuStreamSynchronize(raw)
            })
        })
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        let raw = self.raw;
        let _ = with_ctx(self.ctx, || {
            // SAFETY: raw is a live stream of ctx; destroying waits for nothing but is legal
            // with work queued (the driver finishes it first).
            check("cuStreamDestroy", unsafe { sys::cuStreamDestroy_v2(raw) })
        });
    }
}

/// Plain device-memory access in a device's context (synchronous).
pub struct DeviceBuffer;

impl DeviceBuffer {
    /// `cuMemsetD8` of `len` bytes at `ptr`.
    pub fn fill(dev: &CudaDevice, ptr: u64, value: u8, len: usize) -> Result<(), CudaError> {
        with_ctx(dev.context(), || {
            // SAFETY: the caller owns ptr..ptr+len on the device.
            check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(ptr, value, len) })
        })
    }

    /// Copy `len` bytes at `ptr` back to the host.
    pub fn read(dev: &CudaDevice, ptr: u64, len: usize) -> Result<Vec<u8>, CudaError> {
        let mut out = vec![0u8; len];
        with_ctx(dev.context(), || {
            // SAFETY: out has len bytes; the caller owns ptr..ptr+len on the device.
            check("cuMemcpyDtoH", unsafe {
                sys::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut std::ffi::c_void, ptr, len)
            })
        })?;
        Ok(out)
    }

    /// Copy `data` to `ptr`.
    pub fn write(dev: &CudaDevice, ptr: u64, data: &[u8]) -> Result<(), CudaError> {
        with_ctx(dev.context(), || {
            // SAFETY: data has data.len() bytes; the caller owns the device range.
            check("cuMemcpyHtoD", unsafe {
                sys::cuMemcpyHtoD_v2(ptr, data.as_ptr() as *const std::ffi::c_void, data.len())
            })
        })
    }
}
