//! Opening the serving device and its meta twin: the one place that knows device kinds.
//!
//! Design note: the server needs two devices that agree on every allocation: the serving
//! device (real compute) and a meta device for prediction with the same allocator config
//! and the same library-workspace policy. On cpu the serving device is host memory under
//! PyTorch's caching allocator, limited to `--capacity` (the simulated GPU `vramroom
//! loadtest` uses), with no library workspaces; its twin is a meta device with no
//! workspaces either. On cuda the serving device is vramroom-tensor's CUDA runtime, limited
//! to `--capacity` (or the card) as `set_per_process_memory_fraction` limits PyTorch, and its
//! twin asks the same cuDNN for its convolution workspaces and holds the same cuBLAS
//! handle workspaces, so a prediction allocates what the GPU will.

use std::sync::Arc;

use vramroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};
use vramroom_tensor::backend::cuda::CudnnWorkspace;
use vramroom_tensor::predict::UNBOUNDED;
use vramroom_tensor::Device;
use vramroom_workload::RunDevice;

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
        ServeDevice::Cuda(i) => {
            let unavailable = |reason: String| ServeError::DeviceUnavailable {
                device: choice.to_string(),
                reason,
            };
            let rt = Device::cuda(i as i32, alloc_conf.clone())
                .map_err(|e| unavailable(e.to_string()))?;
            let (_, total) = rt.allocator.mem_get_info();
            let capacity = capacity.min(total);
            if capacity < total {
                rt.allocator
                    .set_per_process_memory_fraction(capacity as f64 / total as f64)
                    .map_err(|e| unavailable(e.to_string()))?;
            }
            let twin = Device::meta(Arc::new(CachingAllocator::new(
                SimDevice::new(UNBOUNDED),
                alloc_conf.clone(),
            )));
            twin.set_workspace_policy(Arc::new(CudnnWorkspace::new(rt.gpu.clone())));
            Ok(OpenedDevice {
                run: RunDevice {
                    device: rt.device.clone(),
                    probe: rt.allocator.clone(),
                    name: choice.to_string(),
                    has_device_usage: true,
                    clock: None,
                },
                capacity,
                twin,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_without_a_gpu_is_a_clear_error_and_cpu_opens() {
        if let Some(why) = vramroom_cuda::unavailable_reason() {
            let e = open_device(ServeDevice::Cuda(0), 1 << 30, &AllocatorConfig::default())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("cuda:0 is not available"), "{e}");
            assert!(e.contains(&why), "{e} / {why}");
        }
        let d = open_device(ServeDevice::Cpu, 1 << 20, &AllocatorConfig::default()).unwrap();
        assert_eq!(d.capacity, 1 << 20);
        assert!(d.twin.is_meta());
        assert_eq!(d.run.device.memory_allocated(), 0);
    }
}
