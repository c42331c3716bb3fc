//! Opening the serving device and its meta twin: the one place that knows device kinds.
//!
//! Design note: the server needs two devices that agree on every allocation: the serving
//! device (real compute) and a meta device for prediction with the same allocator config
//! and the same library-workspace policy. On cpu the serving device is host memory under
//! PyTorch's caching allocator, limited to `--capacity` (the simulated GPU `headroom
//! loadtest` uses), with no library workspaces; its twin is a meta device with no
//! workspaces either. A CUDA device would pair with [`Device::meta_caching`]'s
//! `CudaLikeWorkspace` (cuBLAS/cuDNN workspaces) and take its capacity from the driver;
//! until the CUDA backend is linked, [`open_device`] says so.

use std::sync::Arc;

use headroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};
use headroom_load::RunDevice;
use headroom_tensor::predict::UNBOUNDED;
use headroom_tensor::Device;

use crate::config::ServeDevice;
use crate::error::ServeError;

/// The serving device, its capacity, and the meta twin predictions run on.
pub struct OpenedDevice {
    pub run: RunDevice,
    /// Bytes the device can hold (on cpu: the simulated capacity).
    pub capacity: u64,
    pub twin: Device,
}

/// Opens `choice` with `capacity` bytes under `alloc_conf`.
pub fn open_device(
    choice: ServeDevice,
    capacity: u64,
    alloc_conf: &AllocatorConfig,
) -> Result<OpenedDevice, ServeError> {
    match choice {
        ServeDevice::Cpu => {
            let run = RunDevice::cpu(capacity, alloc_conf);
            // The twin never runs out: a prediction must say how much, not fail.
            let twin = Device::meta(Arc::new(CachingAllocator::new(
                SimDevice::new(UNBOUNDED),
                alloc_conf.clone(),
            )));
            Ok(OpenedDevice {
                run,
                capacity,
                twin,
            })
        }
        // The CUDA backend is being written; when it lands, open it here (capacity from
        // `--capacity` via set_per_process_memory_fraction, or the device's total) and
        // pair it with `Device::meta_caching(UNBOUNDED, alloc_conf.clone())` as the twin.
        ServeDevice::Cuda(_) => Err(ServeError::DeviceUnavailable {
            device: choice.to_string(),
            reason: "the CUDA backend is not available in this build yet (use --device cpu)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_is_a_clear_error_and_cpu_opens() {
        let e = open_device(ServeDevice::Cuda(0), 1 << 30, &AllocatorConfig::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("CUDA backend is not available"), "{e}");
        let d = open_device(ServeDevice::Cpu, 1 << 20, &AllocatorConfig::default()).unwrap();
        assert_eq!(d.capacity, 1 << 20);
        assert!(d.twin.is_meta());
        assert_eq!(d.run.device.memory_allocated(), 0);
    }
}
