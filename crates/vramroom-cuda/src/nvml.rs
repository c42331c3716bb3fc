//! NVML, loaded at run time: device and process memory as `nvidia-smi` shows them.
//!
//! Design note: NVML is optional. It is opened once per process (`libnvidia-ml.so`, then
//! `libnvidia-ml.so.1`, since many machines ship only the versioned name) and every query
//! returns `None` when it is missing, so nothing here can fail an allocation. Devices are
//! found by PCI bus id, which is the same for CUDA and NVML even when `CUDA_VISIBLE_DEVICES`
//! renumbers them.

use std::sync::OnceLock;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use vramroom_alloc::format_size;

static NVML: OnceLock<Option<Nvml>> = OnceLock::new();

fn nvml() -> Option<&'static Nvml> {
    NVML.get_or_init(|| {
        if crate::driver::driver().is_err() {
            // No NVIDIA driver: NVML cannot be there either; skip the dlopen attempts.
            return None;
        }
        match Nvml::init() {
            Ok(n) => Some(n),
            Err(_) => Nvml::builder()
                .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
                .init()
                .ok(),
        }
    })
    .as_ref()
}

/// Whether NVML could be loaded.
pub fn nvml_present() -> bool {
    nvml().is_some()
}

/// Memory of one device and of the processes on it, per NVML.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvmlMemory {
    /// Device-wide used bytes (`nvidia-smi`'s "Memory-Usage").
    pub device_used: u64,
    pub device_total: u64,
    /// This process's bytes on the device: the allocator's reserved memory plus the CUDA
    /// context and library workspaces. `None` when NVML cannot attribute per process (as in
    /// some containers).
    pub process_used: Option<u64>,
    /// (pid, bytes) for every compute process NVML lists on the device.
    pub processes: Vec<(u32, Option<u64>)>,
}

fn device<'a>(n: &'a Nvml, pci_bus_id: &str) -> Option<nvml_wrapper::Device<'a>> {
    n.device_by_pci_bus_id(pci_bus_id).ok()
}

/// Sample NVML for the device with this PCI bus id (`CudaDevice::pci_bus_id`).
pub fn memory(pci_bus_id: &str) -> Option<NvmlMemory> {
    memory_for_pid(NvmlDeviceRef::Pci(pci_bus_id), None)
}

/// A device as NVML finds it: by PCI bus id, or by NVML index (`nvidia-smi`'s numbering,
/// which `CUDA_VISIBLE_DEVICES` does not change).
#[derive(Clone, Copy, Debug)]
pub enum NvmlDeviceRef<'a> {
    Pci(&'a str),
    Index(u32),
}

/// Like [`memory`], for a device found either way, with `process_used` attributed to `pid`
/// (this process when `None`): a load client samples the service's process this way.
pub fn memory_for_pid(dev: NvmlDeviceRef<'_>, pid: Option<u32>) -> Option<NvmlMemory> {
    let n = nvml()?;
    let d = match dev {
        NvmlDeviceRef::Pci(id) => device(n, id)?,
        NvmlDeviceRef::Index(i) => n.device_by_index(i).ok()?,
    };
    let info = d.memory_info().ok()?;
    let me = pid.unwrap_or_else(std::process::id);
    let processes: Vec<(u32, Option<u64>)> = d
        .running_compute_processes()
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            };
            (p.pid, used)
        })
        .collect();
    let process_used = processes
        .iter()
        .find(|(pid, _)| *pid == me)
        .and_then(|(_, b)| *b);
    Some(NvmlMemory {
        device_used: info.used,
        device_total: info.total,
        process_used,
        processes,
    })
}

/// PyTorch's `proc_info` part of the OOM message: one sentence per compute process, or empty
/// when NVML is unavailable.
pub fn oom_process_lines(pci_bus_id: &str) -> String {
    let Some(m) = memory(pci_bus_id) else {
        return String::new();
    };
    let me = std::process::id();
    let mut s = String::new();
    for (pid, used) in m.processes {
        let used = used.unwrap_or(0);
        if pid == me {
            s.push_str(&format!(
                "Including non-PyTorch memory, this process has {} memory in use. ",
                format_size(used)
            ));
        } else {
            s.push_str(&format!(
                "Process {pid} has {} memory in use. ",
                format_size(used)
            ));
        }
    }
    s
}
