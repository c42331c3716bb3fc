//! Devices: an allocator, a backend, and the memory bookkeeping that ties them together.
//!
//! Design note: a `Device` is a cheap handle to one `DeviceContext` (not a global registry),
//! so tests and `vramroom predict` can run many independent simulated GPUs in one process.
//! The op layer allocates every output, workspace and saved buffer through the device
//! *before* calling the backend, which only fills memory in. That is what makes the meta
//! backend's allocation sequence identical to cpu's (and later cuda's) by construction.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::backend::{cpu::CpuBackend, meta::MetaBackend, Backend, LT_WORKSPACE};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::memory::{Allocation, CategoryBreakdown, CategoryTracker, StorageAllocator};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Cpu,
    /// Shapes and memory only: no data, no compute.
    Meta,
    /// A real GPU ([`Device::cuda`]).
    Cuda(u32),
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKind::Cpu => f.write_str("cpu"),
            DeviceKind::Meta => f.write_str("meta"),
            DeviceKind::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Which pass of a convolution asks for workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConvPass {
    Forward,
    BackwardInput,
    BackwardWeight,
}

/// Everything cuDNN's algorithm choice depends on, for [`WorkspacePolicy::conv2d`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvWorkspaceQuery {
    pub pass: ConvPass,
    pub input: [usize; 4],
    pub weight: [usize; 4],
    pub output: [usize; 4],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    pub dtype: DType,
}

/// Library workspaces that PyTorch takes from the caching allocator on CUDA (cuDNN conv
/// workspaces, the cuBLAS handle workspaces). Sizes depend on the library's algorithm choice,
/// so they are a policy: [`NoWorkspace`] asks for none (the default of [`Device::cpu`] and
/// [`Device::meta`]), [`crate::workspace::CudaLikeWorkspace`] reproduces what PyTorch 2.11
/// allocated on an H200 (the default of [`Device::meta_caching`]).
pub trait WorkspacePolicy: Send + Sync {
    /// Bytes of the workspace allocated after the conv's output and freed right after it.
    fn conv2d(&self, _q: &ConvWorkspaceQuery) -> u64 {
        0
    }
    /// Bytes of one cuBLAS handle's workspace: allocated at the first matmul a handle runs
    /// and held as long as the device. PyTorch keeps one handle per thread, so the forward
    /// (the calling thread) and backward (autograd's device thread) have one each.
    fn blas_handle(&self) -> u64 {
        0
    }
    /// Bytes allocated once per device, right after the first handle's workspace, and held
    /// as long as the device (the cuBLASLt workspace of PyTorch 2.x).
    fn blas_device(&self) -> u64 {
        0
    }
}

/// No library workspaces at all (what a CPU process allocates).
pub struct NoWorkspace;
impl WorkspacePolicy for NoWorkspace {}

/// Which cuBLAS handle a matmul runs on: PyTorch's handles are per thread, and backward
/// runs on the autograd engine's device thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlasThread {
    Forward = 0,
    Backward = 1,
}

#[derive(Default)]
struct BlasState {
    handles: [Option<Allocation>; 2],
    device: Option<Allocation>,
}

impl BlasState {
    fn all(&mut self) -> impl Iterator<Item = Allocation> + '_ {
        self.handles
            .iter_mut()
            .chain(std::iter::once(&mut self.device))
            .filter_map(|a| a.take())
    }
}

pub struct DeviceContext {
    kind: DeviceKind,
    id: u64,
    pub(crate) allocator: Arc<dyn StorageAllocator>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) tracker: Mutex<CategoryTracker>,
    rng: Mutex<vramroom_alloc::rng::Rng>,
    workspace: RwLock<Arc<dyn WorkspacePolicy>>,
    blas: Mutex<BlasState>,
    /// Set by [`Device::interrupt`]: every tensor allocation fails with
    /// `TensorError::Interrupted` until cleared.
    interrupted: std::sync::atomic::AtomicBool,
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        for a in self.blas.lock().all() {
            self.allocator.free(a.ptr);
        }
    }
}

/// A handle to a device. Clones refer to the same device.
#[derive(Clone)]
pub struct Device(pub(crate) Arc<DeviceContext>);

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Device {
    /// The cpu device. The allocator must hand out real host memory (64-byte aligned):
    /// vramroom-alloc's `CachingAllocator<HostDevice>` or [`crate::HostAllocator`].
    pub fn cpu(allocator: Arc<dyn StorageAllocator>) -> Device {
        Device::with_backend(DeviceKind::Cpu, allocator, Arc::new(CpuBackend))
    }
    /// The meta device: any allocator works, addresses are never dereferenced.
    pub fn meta(allocator: Arc<dyn StorageAllocator>) -> Device {
        Device::with_backend(DeviceKind::Meta, allocator, Arc::new(MetaBackend))
    }
    /// A device with a backend of your own (the CUDA backend plugs in here).
    pub fn with_backend(
        kind: DeviceKind,
        allocator: Arc<dyn StorageAllocator>,
        backend: Arc<dyn Backend>,
    ) -> Device {
        Device(Arc::new(DeviceContext {
            kind,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            allocator,
            backend,
            tracker: Mutex::new(CategoryTracker::default()),
            rng: Mutex::new(vramroom_alloc::rng::Rng::new(0x853c_49e6_748f_ea9b)),
            workspace: RwLock::new(Arc::new(NoWorkspace)),
            blas: Mutex::new(BlasState::default()),
            interrupted: std::sync::atomic::AtomicBool::new(false),
        }))
    }
    /// Interrupts (`true`) or resumes (`false`) the device: while interrupted, every tensor
    /// allocation fails with `TensorError::Interrupted`, so work in flight on other threads
    /// stops at its next op instead of running to its end. Ops cannot be preempted; this is
    /// how a load test ends its requests at the duration it was given.
    pub fn interrupt(&self, on: bool) {
        self.0.interrupted.store(on, Ordering::SeqCst);
    }
    pub fn is_interrupted(&self) -> bool {
        self.0.interrupted.load(Ordering::Relaxed)
    }
    pub fn kind(&self) -> DeviceKind {
        self.0.kind
    }
    pub fn is_meta(&self) -> bool {
        self.0.kind == DeviceKind::Meta
    }
    pub fn same(&self, other: &Device) -> bool {
        self.0.id == other.0.id
    }
    pub fn allocator(&self) -> &Arc<dyn StorageAllocator> {
        &self.0.allocator
    }
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.0.backend
    }
    /// The device's total memory, when its allocator knows it.
    pub fn capacity(&self) -> Option<u64> {
        self.0.allocator.capacity()
    }
    pub fn memory_allocated(&self) -> u64 {
        self.0.allocator.memory_allocated()
    }
    pub fn memory_reserved(&self) -> u64 {
        self.0.allocator.memory_reserved()
    }
    pub fn max_memory_allocated(&self) -> u64 {
        self.0.allocator.max_memory_allocated()
    }
    /// Resets the allocator's peaks and the peak category breakdown together.
    pub fn reset_peak_memory_stats(&self) {
        self.0.allocator.reset_peak_memory_stats();
        self.0.tracker.lock().reset_peak();
    }
    pub fn empty_cache(&self) {
        self.0.allocator.empty_cache();
    }
    /// Bytes per category now.
    pub fn memory_by_category(&self) -> CategoryBreakdown {
        self.0.tracker.lock().current
    }
    /// Bytes per category at the moment of the peak since the last reset.
    pub fn peak_memory_by_category(&self) -> CategoryBreakdown {
        self.0.tracker.lock().peak
    }
    pub fn manual_seed(&self, seed: u64) {
        *self.0.rng.lock() = vramroom_alloc::rng::Rng::new(seed ^ 0x853c_49e6_748f_ea9b);
    }
    /// A fresh seed for a random kernel (dropout), advancing the device generator.
    pub(crate) fn next_seed(&self) -> u64 {
        // The workspace's one generator: cheap, and good enough for dropout masks.
        self.0.rng.lock().next_u64()
    }
    /// Sets the library-workspace policy for ops from now on (workspaces already held stay).
    pub fn set_workspace_policy(&self, policy: Arc<dyn WorkspacePolicy>) {
        *self.0.workspace.write() = policy;
    }
    pub(crate) fn workspace_policy(&self) -> Arc<dyn WorkspacePolicy> {
        self.0.workspace.read().clone()
    }
    /// Allocates the cuBLAS handle workspace of the calling thread the first time a matmul
    /// runs there, and the per-device cuBLASLt workspace the first time a matmul goes through
    /// cuBLASLt (`lt`: PyTorch routes `addmm` with a 1-d bias there, for its bias epilogue;
    /// plain `mm`/`bmm` go to cuBLAS and leave it unallocated, as a bias-free Llama's traces
    /// show). They are tagged `temporary`: library memory, not tensors.
    pub(crate) fn ensure_blas_handle(&self, lt: bool) -> Result<()> {
        let thread = if crate::autograd::in_backward() {
            BlasThread::Backward
        } else {
            BlasThread::Forward
        };
        self.init_blas_workspaces(thread, lt)
    }
    /// What a process that has already run a matmul on `thread` holds: that handle's
    /// workspace and the per-device (cuBLASLt) one exist from now on. Idempotent.
    pub fn init_blas_handle(&self, thread: BlasThread) -> Result<()> {
        self.init_blas_workspaces(thread, true)
    }
    /// [`Device::init_blas_handle`] with the cuBLASLt workspace only when `lt` (a process
    /// whose matmuls never took a bias has none).
    pub fn init_blas_workspaces(&self, thread: BlasThread, lt: bool) -> Result<()> {
        let mut st = self.0.blas.lock();
        if st.handles[thread as usize].is_some() && (!lt || st.device.is_some()) {
            return Ok(());
        }
        let policy = self.workspace_policy();
        let (per_handle, per_device) = (policy.blas_handle(), policy.blas_device());
        if per_handle == 0 && per_device == 0 {
            return Ok(());
        }
        let alloc = |n: u64| -> Result<Option<Allocation>> {
            if n == 0 {
                return Ok(None);
            }
            let a = self.0.allocator.allocate(n)?;
            self.0
                .tracker
                .lock()
                .add(crate::memory::MemoryCategory::Temporary, a.size);
            Ok(Some(a))
        };
        if st.handles[thread as usize].is_none() {
            st.handles[thread as usize] = alloc(per_handle)?;
            if let Some(a) = st.handles[thread as usize] {
                self.0
                    .backend
                    .bind_blas_workspace(thread as usize, a.ptr, a.size)?;
            }
        }
        if lt && st.device.is_none() {
            st.device = alloc(per_device)?;
            if let Some(a) = st.device {
                self.0
                    .backend
                    .bind_blas_workspace(LT_WORKSPACE, a.ptr, a.size)?;
            }
        }
        Ok(())
    }
    /// Frees the cuBLAS workspaces (PyTorch's `torch._C._cuda_clearCublasWorkspaces()`,
    /// which `torch.compile`'s CUDA-graph trees call): the next matmul on each thread
    /// allocates them again.
    pub fn clear_blas_workspaces(&self) {
        let mut st = self.0.blas.lock();
        let mut tr = self.0.tracker.lock();
        for a in st.all() {
            tr.sub(crate::memory::MemoryCategory::Temporary, a.size);
            self.0.allocator.free(a.ptr);
        }
    }
    /// Bytes the library handles hold on this device now (cuBLAS workspaces).
    pub fn library_workspace_bytes(&self) -> u64 {
        let st = self.0.blas.lock();
        st.handles
            .iter()
            .chain(std::iter::once(&st.device))
            .flatten()
            .map(|a| a.size)
            .sum()
    }
    pub(crate) fn check_same(&self, other: &Device, op: &'static str) -> Result<()> {
        if self.same(other) {
            Ok(())
        } else {
            Err(TensorError::DeviceMismatch {
                op,
                a: self.to_string(),
                b: other.to_string(),
            })
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.kind)
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({}#{})", self.0.kind, self.0.id)
    }
}
