//! # vramroom-cuda
//!
//! Vramroom's caching allocator on a real NVIDIA GPU: [`CudaDevice`] implements
//! [`vramroom_alloc::Device`] over the CUDA driver API (through cudarc, loaded at run time),
//! and [`nvml`] reads device and process memory as `nvidia-smi` does.
//!
//! Design note: nothing here links against CUDA. The driver and NVML are opened with `dlopen`
//! on first use, so the crate builds and its tests run on machines without a GPU; there every
//! entry point returns a typed [`CudaError`] (no driver, no device) and never panics.
//!
//! ```
//! use vramroom_alloc::{AllocatorConfig, CachingAllocator};
//! use vramroom_cuda::{CudaDevice, CudaError};
//! match CudaDevice::new(0) {
//!     Ok(dev) => {
//!         let a = CachingAllocator::new(dev, AllocatorConfig::default());
//!         let x = a.malloc(1 << 20, 0).unwrap();
//!         a.free(x.ptr).unwrap();
//!     }
//!     Err(CudaError::NoDriver(_) | CudaError::NoDevice(_)) => {} // CPU-only machine
//!     Err(e) => panic!("{e}"),
//! }
//! ```

pub mod compute;
pub mod device;
pub mod driver;
pub mod nvml;
pub mod stream;

pub use compute::{Dt, Gpu, Strided};
pub use device::CudaDevice;
pub use driver::{device_count, driver_present, unavailable_reason, CudaError};
pub use nvml::{nvml_present, NvmlMemory};
pub use stream::{CudaStream, DeviceBuffer};

/// A caching allocator on one CUDA device.
pub type CudaAllocator = vramroom_alloc::CachingAllocator<CudaDevice>;

/// Open device `ordinal` under a caching allocator with `config`.
pub fn cuda_allocator(
    ordinal: i32,
    config: vramroom_alloc::AllocatorConfig,
) -> Result<CudaAllocator, CudaError> {
    Ok(vramroom_alloc::CachingAllocator::new(
        CudaDevice::new(ordinal)?,
        config,
    ))
}
