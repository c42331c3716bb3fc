//! Memory seen from outside the allocator: NVML, a Prometheus endpoint, a test double.
//!
//! Design note: the allocator's own stats say what PyTorch holds (allocated, reserved); they
//! cannot say what the *process* holds on the device (the CUDA context, cuBLAS/cuDNN
//! workspaces, NCCL buffers, other allocators) or what the whole device has in use. A
//! [`MemorySource`] answers those: one blocking [`MemorySource::sample`] call returns a
//! [`MemoryReading`] whose fields are all optional, because every source knows only part of
//! the picture (NVML knows process and device bytes, not allocated; a Prometheus endpoint
//! knows what its exporter exports). Readings of several sources taken at one tick are
//! merged with [`MemoryReading::fill_from`] into one timeline sample, so every source lands
//! on the same time axis as the load.
//!
//! The in-process load tester (`vramroom loadtest`) samples an optional source from its
//! timeline sampler thread (see `LoadConfig::memory_source`); `vramroom http` samples NVML
//! and the scraped endpoint from its own sampler task. A source that is not there (no
//! NVIDIA driver) is not an error: [`NvmlSource::open`] says why and the run goes on
//! without it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use vramroom_cuda::nvml::NvmlDeviceRef;

/// One reading: what a source knows at one moment. `None` = this source does not know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReading {
    /// `torch.cuda.memory_allocated()` (summed over the service's devices).
    pub allocated: Option<u64>,
    /// `torch.cuda.memory_reserved()`.
    pub reserved: Option<u64>,
    /// `active_bytes.all.current`.
    pub active: Option<u64>,
    /// `inactive_split_bytes.all.current`.
    pub inactive_split: Option<u64>,
    /// `torch.cuda.max_memory_allocated()`: the exact peak since the last reset.
    pub max_allocated: Option<u64>,
    /// `torch.cuda.max_memory_reserved()`.
    pub max_reserved: Option<u64>,
    /// Bytes the process holds on the device per the driver (NVML's per-process figure):
    /// reserved plus the CUDA context and library workspaces.
    pub process_used: Option<u64>,
    /// Bytes in use on the whole device (every process).
    pub device_used: Option<u64>,
    /// Device memory the service may use (the card's total, or a configured limit).
    pub capacity: Option<u64>,
    /// Out-of-memory errors counted by the service so far (a counter).
    pub num_ooms: Option<u64>,
}

impl MemoryReading {
    /// Every field, in declaration order: the one list of them, which [`fill_from`] and
    /// [`add`] walk (adding a field means adding it here).
    ///
    /// [`fill_from`]: MemoryReading::fill_from
    /// [`add`]: MemoryReading::add
    fn fields_mut(&mut self) -> [&mut Option<u64>; 10] {
        [
            &mut self.allocated,
            &mut self.reserved,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.max_allocated,
            &mut self.max_reserved,
            &mut self.process_used,
            &mut self.device_used,
            &mut self.capacity,
            &mut self.num_ooms,
        ]
    }

    /// Fills every field this reading lacks from `other` (the first source to know a field
    /// wins).
    pub fn fill_from(&mut self, other: &MemoryReading) {
        let mut other = *other;
        for (mine, theirs) in self.fields_mut().into_iter().zip(other.fields_mut()) {
            if mine.is_none() {
                *mine = *theirs;
            }
        }
    }

    /// Adds `other` in, field by field (a field is known when either knows it): the sum
    /// over a service's endpoints.
    pub fn add(&mut self, other: &MemoryReading) {
        let mut other = *other;
        for (mine, theirs) in self.fields_mut().into_iter().zip(other.fields_mut()) {
            *mine = match (*mine, *theirs) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                (a, b) => a.or(b),
            };
        }
    }

    /// True when the reading knows nothing.
    pub fn is_empty(&self) -> bool {
        *self == MemoryReading::default()
    }

    /// "Context + library overhead": what the process holds on the device beyond the
    /// caching allocator's reserved memory (`process_used − reserved`). NVML samples a
    /// moment apart from the allocator, so a process figure a little below reserved reads
    /// as zero overhead rather than a negative one.
    pub fn overhead(&self) -> Option<u64> {
        Some(self.process_used?.saturating_sub(self.reserved?))
    }

    /// Names of the fields this reading has, as the timeline's series names.
    pub fn series(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let f: [(&'static str, Option<u64>); 8] = [
            ("allocated", self.allocated),
            ("reserved", self.reserved),
            ("active", self.active),
            ("inactive_split", self.inactive_split),
            ("process_used", self.process_used),
            ("device_used", self.device_used),
            ("capacity", self.capacity),
            ("num_ooms", self.num_ooms),
        ];
        for (n, x) in f {
            if x.is_some() {
                v.push(n);
            }
        }
        if self.overhead().is_some() {
            v.push("overhead");
        }
        v
    }
}

/// Something that reports memory, sampled from a sampler thread. `sample` may block for a
/// few milliseconds (an NVML call); it must not panic.
pub trait MemorySource: Send + Sync {
    /// A short name for reports: `"nvml:0"`, `"prometheus http://host:9400/metrics"`.
    fn name(&self) -> String;
    /// The kind for results.json: `"nvml"`, `"prometheus"`, `"probe"`, `"fake"`.
    fn kind(&self) -> &'static str;
    /// One reading now, or why there is none this time.
    fn sample(&self) -> Result<MemoryReading, String>;
}

impl fmt::Debug for dyn MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemorySource({})", self.name())
    }
}

/// Which NVML device to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlDevice {
    /// By PCI bus id (`CudaDevice::pci_bus_id`): the same device CUDA means, whatever
    /// `CUDA_VISIBLE_DEVICES` says.
    PciBusId(String),
    /// By NVML index (`nvidia-smi`'s numbering).
    Index(u32),
}

/// NVML: device used and total, and one process's bytes on the device.
#[derive(Debug, Clone)]
pub struct NvmlSource {
    device: NvmlDevice,
    /// Whose process figure to report; `None` = this process.
    pid: Option<u32>,
}

impl NvmlSource {
    /// A source for `device`, attributing the process figure to `pid` (this process when
    /// `None`). `Err` says why NVML is not there (no NVIDIA driver, no such device).
    pub fn open(device: NvmlDevice, pid: Option<u32>) -> Result<NvmlSource, String> {
        if !vramroom_cuda::nvml_present() {
            return Err(match vramroom_cuda::unavailable_reason() {
                Some(r) => format!("NVML is not available ({r})"),
                None => "NVML is not available (libnvidia-ml could not be loaded)".into(),
            });
        }
        let s = NvmlSource { device, pid };
        s.sample()
            .map_err(|e| format!("NVML has no device {}: {e}", s.device_name()))?;
        Ok(s)
    }

    fn device_name(&self) -> String {
        match &self.device {
            NvmlDevice::PciBusId(id) => id.clone(),
            NvmlDevice::Index(i) => i.to_string(),
        }
    }
}

impl MemorySource for NvmlSource {
    fn name(&self) -> String {
        match self.pid {
            Some(p) => format!("nvml:{} (pid {p})", self.device_name()),
            None => format!("nvml:{}", self.device_name()),
        }
    }
    fn kind(&self) -> &'static str {
        "nvml"
    }
    fn sample(&self) -> Result<MemoryReading, String> {
        let dev = match &self.device {
            NvmlDevice::PciBusId(id) => NvmlDeviceRef::Pci(id),
            NvmlDevice::Index(i) => NvmlDeviceRef::Index(*i),
        };
        let m = vramroom_cuda::nvml::memory_for_pid(dev, self.pid)
            .ok_or_else(|| "NVML query failed".to_string())?;
        Ok(MemoryReading {
            process_used: m.process_used,
            device_used: Some(m.device_used),
            capacity: Some(m.device_total),
            ..Default::default()
        })
    }
}

type ReadFn = dyn Fn(u64) -> Result<MemoryReading, String> + Send + Sync;

/// A source computed by a function of the tick number (0, 1, 2, …): the test double for
/// NVML on machines without a GPU, and an adapter for anything else that can be read.
pub struct FnSource {
    name: String,
    kind: &'static str,
    ticks: AtomicU64,
    f: Box<ReadFn>,
}

impl FnSource {
    pub fn new(
        name: impl Into<String>,
        kind: &'static str,
        f: impl Fn(u64) -> Result<MemoryReading, String> + Send + Sync + 'static,
    ) -> FnSource {
        FnSource {
            name: name.into(),
            kind,
            ticks: AtomicU64::new(0),
            f: Box::new(f),
        }
    }
    /// Times `sample` was called.
    pub fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }
}

impl MemorySource for FnSource {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn sample(&self) -> Result<MemoryReading, String> {
        let t = self.ticks.fetch_add(1, Ordering::Relaxed);
        (self.f)(t)
    }
}

/// Sets the peaks of the outside series (process used, overhead, device used) from a
/// timeline; absent series stay absent.
pub fn fill_peaks(peaks: &mut crate::results::Peaks, samples: &[crate::results::MemorySample]) {
    let max =
        |f: fn(&crate::results::MemorySample) -> Option<u64>| samples.iter().filter_map(f).max();
    peaks.process_used_bytes = max(|s| s.process_used_bytes);
    peaks.overhead_bytes = max(|s| s.overhead_bytes);
    peaks.device_used_bytes = max(|s| s.device_used_bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_keeps_the_first_source_and_overhead_is_process_minus_reserved() {
        let mut a = MemoryReading {
            allocated: Some(10),
            reserved: Some(20),
            ..Default::default()
        };
        let b = MemoryReading {
            reserved: Some(99),
            process_used: Some(50),
            device_used: Some(70),
            ..Default::default()
        };
        a.fill_from(&b);
        assert_eq!(a.reserved, Some(20));
        assert_eq!(a.process_used, Some(50));
        assert_eq!(a.overhead(), Some(30));
        assert_eq!(
            a.series(),
            vec![
                "allocated",
                "reserved",
                "process_used",
                "device_used",
                "overhead"
            ]
        );
        // NVML a moment behind the allocator: no negative overhead.
        let c = MemoryReading {
            reserved: Some(100),
            process_used: Some(90),
            ..Default::default()
        };
        assert_eq!(c.overhead(), Some(0));
        assert!(MemoryReading::default().is_empty());
    }

    #[test]
    fn nvml_is_absent_here_or_reads() {
        // On a machine without the NVIDIA driver this must be a reason, not a panic.
        match NvmlSource::open(NvmlDevice::Index(0), None) {
            Ok(s) => {
                let r = s.sample().unwrap();
                assert!(r.capacity.unwrap() > 0);
            }
            Err(e) => assert!(e.contains("NVML"), "{e}"),
        }
    }

    #[test]
    fn fn_source_counts_ticks() {
        let s = FnSource::new("fake", "fake", |t| {
            Ok(MemoryReading {
                process_used: Some(t),
                ..Default::default()
            })
        });
        assert_eq!(s.sample().unwrap().process_used, Some(0));
        assert_eq!(s.sample().unwrap().process_used, Some(1));
        assert_eq!(s.ticks(), 2);
    }
}
