//! The CUDA driver, loaded at run time, behind checks that never panic.
//!
//! Design note: cudarc's `dynamic-loading` bindings `panic!` when `libcuda` is missing or when
//! a symbol is not in it. Every path into the driver here first goes through [`driver`], which
//! (once per process) asks `is_culib_present()`, resolves every symbol this crate will call
//! (so the lazy per-symbol loader can no longer fail), then runs `cuInit(0)`. Its answer is
//! cached: a machine without a driver gets the same typed [`CudaError::NoDriver`] on every
//! call, cheaply, and nothing below it is ever reached.

use std::ffi::CStr;
use std::sync::OnceLock;

use cudarc::driver::sys;

/// Why a CUDA call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No `libcuda` could be loaded: no NVIDIA driver on this machine.
    #[error("CUDA driver not found (libcuda could not be loaded): {0}")]
    NoDriver(String),
    /// The driver loaded but lacks a function this crate needs (driver too old).
    #[error("CUDA driver lacks {0}; a driver for CUDA 13.0 or newer is needed")]
    MissingSymbol(&'static str),
    /// The driver is there but reports no device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// The ordinal is past the device count.
    #[error("invalid CUDA device ordinal {ordinal} (device count {count})")]
    InvalidDevice { ordinal: i32, count: i32 },
    /// `CUDA_ERROR_OUT_OF_MEMORY` from `call`.
    #[error("{call}: out of memory")]
    OutOfMemory { call: &'static str },
    /// Any other driver error.
    #[error("{call} failed: {name} ({code}): {message}")]
    Driver {
        call: &'static str,
        code: u32,
        name: String,
        message: String,
    },
    /// A CUDA library (NVRTC, cuBLAS, cuDNN) could not be loaded, or lacks a function.
    #[error("{lib} not usable: {why}")]
    Library { lib: &'static str, why: String },
    /// NVRTC rejected the kernel source (a bug in Vramroom, with the compiler's log).
    #[error("NVRTC could not compile Vramroom's kernels: {0}")]
    Compile(String),
    /// A cuBLAS or cuDNN call failed.
    #[error("{call} failed: {status}")]
    LibraryCall { call: &'static str, status: String },
    /// A kernel found a bad index (the CUDA analogue of a device-side assert), reported at
    /// the next synchronisation.
    #[error("{op}: index {index} is out of bounds (reported by a CUDA kernel)")]
    DeviceAssert { op: &'static str, index: i64 },
    /// The call is not possible in the current state (e.g. a host read during graph capture).
    #[error("{0}")]
    Invalid(String),
}

impl CudaError {
    pub fn is_oom(&self) -> bool {
        matches!(self, CudaError::OutOfMemory { .. })
    }
}

/// Every driver function this crate calls. All are resolved before the first call.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDeviceGetPCIBusId",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemGetAllocationGranularity",
    "cuMemsetD8_v2",
    "cuMemsetD32Async",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuLaunchHostFunc",
];

/// Driver functions the compute side (kernels, copies, graphs) calls, checked when a
/// [`crate::compute::Gpu`] is opened, so that the allocator alone still works on a driver that
/// lacks one of them.
pub const COMPUTE_SYMBOLS: &[&str] = &[
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuFuncGetParamInfo",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphExecDestroy",
    "cuGraphDestroy",
    "cuEventElapsedTime_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventSynchronize",
];

/// `Ok` when every name in `names` resolves in `lib` (so cudarc's lazy loader cannot panic).
pub fn require_symbols(
    lib: &libloading::Library,
    what: &'static str,
    names: &[&str],
) -> Result<(), CudaError> {
    for &name in names {
        // SAFETY: a presence check; the pointer type is irrelevant and nothing is called.
        if unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err() {
            return Err(CudaError::Library {
                lib: what,
                why: format!("{name} is missing (library too old?)"),
            });
        }
    }
    Ok(())
}

static DRIVER: OnceLock<Result<(), CudaError>> = OnceLock::new();

/// Load and initialise the driver once; `Ok` means every symbol in [`SYMBOLS`] resolves and
/// `cuInit` succeeded, so calls into `cudarc::driver::sys` cannot panic.
pub fn driver() -> Result<(), CudaError> {
    DRIVER.get_or_init(load_driver).clone()
}

/// Whether a usable driver is present (loads it on first call).
pub fn driver_present() -> bool {
    driver().is_ok()
}

fn load_driver() -> Result<(), CudaError> {
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names and drops the
    // handle; it has no other effect.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoDriver(
            "no libcuda.so / libcuda.so.1 on the library path".into(),
        ));
    }
    // SAFETY: `is_culib_present` just opened the library, so `culib` (which panics only when no
    // candidate opens) finds it. The symbol lookups read the dynamic symbol table only.
    let lib = unsafe { sys::culib() };
    for &name in SYMBOLS {
        // SAFETY: as above; the pointer type is irrelevant to a presence check.
        let found = unsafe { lib.get::<*const ()>(name.as_bytes()) };
        if found.is_err() {
            return Err(CudaError::MissingSymbol(name));
        }
    }
    // SAFETY: every symbol is resolved; cuInit takes flags 0.
    let rc = unsafe { sys::cuInit(0) };
    match rc {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        sys::CUresult::CUDA_ERROR_NO_DEVICE => {
            Err(CudaError::NoDevice("cuInit: CUDA_ERROR_NO_DEVICE".into()))
        }
        other => Err(error("cuInit", other)),
    }
}

/// The error for `rc` from `call`, with the driver's name and message for it.
pub fn error(call: &'static str, rc: sys::CUresult) -> CudaError {
    if rc == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return CudaError::OutOfMemory { call };
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut msg: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only reached after `driver()` resolved these symbols (or from `load_driver`
    // after the check); both write a pointer to a static string or leave it null.
    unsafe {
        sys::cuGetErrorName(rc, &mut name);
        sys::cuGetErrorString(rc, &mut msg);
    }
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            "unknown".to_string()
        } else {
            // SAFETY: the driver returns NUL-terminated static strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    CudaError::Driver {
        call,
        code: rc as u32,
        name: text(name),
        message: text(msg),
    }
}

/// `Ok` on `CUDA_SUCCESS`, else the typed error.
#[inline]
pub fn check(call: &'static str, rc: sys::CUresult) -> Result<(), CudaError> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(error(call, rc))
    }
}

/// Number of CUDA devices; 0 (not an error) when the driver is missing or sees none.
pub fn device_count() -> i32 {
    if driver().is_err() {
        return 0;
    }
    let mut n = 0;
    // SAFETY: driver loaded and initialised.
    let rc = unsafe { sys::cuDeviceGetCount(&mut n) };
    if rc == sys::CUresult::CUDA_SUCCESS {
        n
    } else {
        0
    }
}

/// The driver's handle of device `ordinal`, after loading the driver and checking that the
/// device exists: the first step of opening a device for allocation or for compute.
pub fn device_handle(ordinal: i32) -> Result<sys::CUdevice, CudaError> {
    driver()?;
    let count = device_count();
    if count == 0 {
        return Err(CudaError::NoDevice(
            "the CUDA driver reports no device".into(),
        ));
    }
    if ordinal < 0 || ordinal >= count {
        return Err(CudaError::InvalidDevice { ordinal, count });
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: driver initialised; the ordinal is in range.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal)
    })?;
    Ok(dev)
}

/// Why no GPU test can run here, or `None` when at least one device is usable.
pub fn unavailable_reason() -> Option<String> {
    if let Err(e) = driver() {
        return Some(e.to_string());
    }
    if device_count() == 0 {
        return Some("the CUDA driver reports no device".into());
    }
    None
}
