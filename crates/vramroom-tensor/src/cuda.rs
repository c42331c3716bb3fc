//! The runtime on a real GPU: [`Device::cuda`], and CUDA-graph capture of tensor code.
//!
//! Design note: a CUDA device is three things sharing one primary context: vramroom-alloc's
//! `CachingAllocator` over vramroom-cuda's `CudaDevice` (PyTorch's allocator policy, real
//! `cuMemAlloc` segments), a vramroom-cuda [`Gpu`] (the stream, the kernels, cuBLAS and cuDNN)
//! behind [`CudaBackend`], and [`CudnnWorkspace`] as the workspace policy. Every allocation
//! is made on the Gpu's stream, so the allocator's stream-ordered reuse is safe with no
//! events, exactly as for PyTorch tensors on the current stream.
//!
//! Graphs ([`CudaRuntime::capture`]) follow `torch.cuda.graph`: what a closure queues is
//! recorded once and replayed with one launch. Memory the capture allocates must never be
//! handed to anyone else while the graph can still replay, which PyTorch ensures with a
//! private memory pool. Here the pool costs nothing new: during capture the runtime allocates
//! on a stream id of the graph's own, and the caching allocator already keeps blocks per
//! stream, so those blocks are reused only by that capture, survive the graph (freed blocks
//! stay cached on that stream), and count in `memory_allocated`/`memory_reserved` like every
//! other block. `empty_cache` gives their segments back once they are free.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vramroom_alloc::{AllocatorConfig, CachingAllocator};
use vramroom_cuda::compute::CudaGraph;
use vramroom_cuda::{CudaDevice, Gpu};

use crate::backend::cuda::{CudaBackend, CudnnWorkspace};
use crate::device::{Device, DeviceKind};
use crate::error::{Result, TensorError};
use crate::memory::{Allocation, StorageAllocator};

/// The caching allocator on a real GPU.
pub type CudaAllocator = CachingAllocator<CudaDevice>;

/// Allocations on the device's stream (or a capture's private pool stream).
struct CudaStorage {
    alloc: Arc<CudaAllocator>,
    stream: AtomicU64,
}

impl StorageAllocator for CudaStorage {
    fn allocate(&self, nbytes: u64) -> Result<Allocation> {
        let a = self
            .alloc
            .malloc(nbytes, self.stream.load(Ordering::Relaxed))?;
        Ok(Allocation {
            ptr: a.ptr,
            size: a.size,
        })
    }
    fn free(&self, ptr: u64) {
        let _ = self.alloc.free(ptr);
    }
    fn memory_allocated(&self) -> u64 {
        self.alloc.memory_allocated()
    }
    fn memory_reserved(&self) -> u64 {
        self.alloc.memory_reserved()
    }
    fn max_memory_allocated(&self) -> u64 {
        self.alloc.max_memory_allocated()
    }
    fn reset_peak_memory_stats(&self) {
        self.alloc.reset_peak_memory_stats()
    }
    fn empty_cache(&self) {
        self.alloc.empty_cache()
    }
    fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.alloc.memory_stats()
    }
    fn memory_summary(&self, abbreviated: bool) -> String {
        self.alloc.memory_summary(abbreviated)
    }
}

/// A CUDA device ready for tensors, with its allocator and compute handles.
#[derive(Clone)]
pub struct CudaRuntime {
    pub device: Device,
    /// The caching allocator (stats, snapshot, `memory_summary`, observers).
    pub allocator: Arc<CudaAllocator>,
    pub gpu: Arc<Gpu>,
    /// The backend, for its host-side profile.
    pub backend: Arc<CudaBackend>,
    storage: Arc<CudaStorage>,
}

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

impl Device {
    /// Open GPU `ordinal` with a caching allocator under `config` (`PYTORCH_CUDA_ALLOC_CONF`
    /// semantics). Errors, never panics, without a driver, a device, or the CUDA libraries.
    pub fn cuda(ordinal: i32, config: AllocatorConfig) -> Result<CudaRuntime> {
        let gpu = Arc::new(Gpu::new(ordinal)?);
        let alloc = Arc::new(CachingAllocator::new(CudaDevice::new(ordinal)?, config));
        let storage = Arc::new(CudaStorage {
            alloc: alloc.clone(),
            stream: AtomicU64::new(gpu.stream_id()),
        });
        let backend = Arc::new(CudaBackend::new(gpu.clone()));
        let device = Device::with_backend(
            DeviceKind::Cuda(ordinal.max(0) as u32),
            storage.clone(),
            backend.clone(),
        );
        device.set_workspace_policy(Arc::new(CudnnWorkspace::new(gpu.clone())));
        Ok(CudaRuntime {
            device,
            allocator: alloc,
            gpu,
            backend,
            storage,
        })
    }
}

/// A captured graph of tensor work, replayed on the device's stream.
pub struct TensorGraph {
    graph: CudaGraph,
    gpu: Arc<Gpu>,
    pool: u64,
}

impl TensorGraph {
    /// Queue one replay. Inputs are read from, and outputs written to, the very tensors the
    /// capture used: copy new data into the inputs first.
    pub fn replay(&self) -> Result<()> {
        Ok(self.graph.launch(&self.gpu)?)
    }
    /// The allocator stream id of the graph's private pool.
    pub fn pool(&self) -> u64 {
        self.pool
    }
}

impl CudaRuntime {
    /// Wait for all queued work; report a kernel's index error if one happened.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.gpu.synchronize()?)
    }

    /// Record what `f` queues into a CUDA graph instead of running it, and return the graph
    /// with `f`'s result (typically the output tensors, which stay valid: each replay writes
    /// them anew). Run `f` once eagerly first, so that library handles exist and every shape's
    /// algorithm is chosen: nothing in a capture may synchronise with the host.
    pub fn capture<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<(TensorGraph, R)> {
        let pool = (1u64 << 63) | NEXT_POOL.fetch_add(1, Ordering::Relaxed);
        let main = self.gpu.stream_id();
        self.storage.stream.store(pool, Ordering::Relaxed);
        if let Err(e) = self.gpu.begin_capture() {
            self.storage.stream.store(main, Ordering::Relaxed);
            return Err(e.into());
        }
        let r = f();
        let g = self.gpu.end_capture();
        self.storage.stream.store(main, Ordering::Relaxed);
        let r = r?;
        let graph = g.map_err(|e| {
            TensorError::Cuda(format!(
                "{e} (was the work run once eagerly before capture?)"
            ))
        })?;
        Ok((
            TensorGraph {
                graph,
                gpu: self.gpu.clone(),
                pool,
            },
            r,
        ))
    }
}
