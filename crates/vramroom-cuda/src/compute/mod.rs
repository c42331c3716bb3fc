//! Compute on one GPU: kernels (NVRTC), GEMMs (cuBLAS), convolutions (cuDNN), copies, and
//! CUDA graphs, all on one stream.
//!
//! Design note: a [`Gpu`] owns one non-blocking stream in the device's primary context (the
//! one the allocator's [`crate::CudaDevice`] and PyTorch use), and every piece of work goes to
//! that stream in program order. That is what makes the caching allocator's stream-ordered
//! reuse safe without events: a block freed by the host after a kernel was queued is only
//! ever handed to work queued after that kernel. Host reads synchronise the stream, host
//! writes are stream-ordered copies, so no copy can race a kernel still using the memory.
//!
//! Nothing here allocates device memory for tensors, and no library is allowed to either:
//! cuBLAS and cuBLASLt get their workspaces from the caller ([`Gpu::bind_blas_workspace`]),
//! and cuDNN gets a workspace per call, all carved from the caching allocator by the tensor
//! runtime. The only memory this module takes from the driver itself is a 16-byte error
//! word, plus what the libraries' handles take internally (their "library overhead", which
//! NVML sees and the allocator does not, exactly as under PyTorch).
//!
//! Kernels take [`Strided`] descriptors (pointer, offset, shape, strides, dtype) and convert
//! dtypes themselves; see kernels.cu for the conventions. The Rust wrappers (ops.rs) do the
//! host-side work: coalescing contiguous dims, picking grid sizes, choosing the kernel variant.

mod attention;
pub mod blas;
pub mod blas_lt;
pub mod dnn;
mod dnn_graph;
mod dnn_sdpa;
pub mod graph;
pub mod libs;
pub mod nvrtc;
mod ops;

pub use attention::{AttentionKernel, AttentionSpec, AttentionViews, ATTENTION_MAX_HEAD_DIM};
pub use dnn::ConvArgs;
pub use dnn::{ConvPass, ConvSpec};
pub use graph::CudaGraph;
pub use ops::{decode, encode, BinaryCode, ReduceCode, UnaryCode};

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys;
use parking_lot::Mutex;

use crate::driver::{check, require_symbols, CudaError, COMPUTE_SYMBOLS};

/// Element types, with the codes kernels.cu uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Dt {
    F32 = 0,
    F16 = 1,
    BF16 = 2,
    I64 = 3,
    I32 = 4,
    U8 = 5,
    Bool = 6,
}

impl Dt {
    pub fn size(self) -> usize {
        match self {
            Dt::F32 | Dt::I32 => 4,
            Dt::F16 | Dt::BF16 => 2,
            Dt::I64 => 8,
            Dt::U8 | Dt::Bool => 1,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, Dt::F32 | Dt::F16 | Dt::BF16)
    }
}

/// Most dims a kernel descriptor carries (after coalescing).
pub const MAX_DIMS: usize = 8;

/// A tensor view as kernels see it: `struct T` in kernels.cu, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Strided {
    /// Base address of the storage (element 0 is at `ptr + offset * size`).
    pub ptr: u64,
    pub offset: i64,
    pub shape: [i64; MAX_DIMS],
    pub strides: [i64; MAX_DIMS],
    pub ndim: i32,
    pub dtype: i32,
}

impl Strided {
    /// A view of `shape`/`strides` (in elements) at `offset` elements from `ptr`.
    pub fn new(
        ptr: u64,
        dtype: Dt,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<Strided, CudaError> {
        if shape.len() > MAX_DIMS || strides.len() != shape.len() {
            return Err(CudaError::Invalid(format!(
                "a CUDA kernel takes at most {MAX_DIMS} dims (got shape {shape:?})"
            )));
        }
        let mut s = Strided {
            ptr,
            offset: offset as i64,
            shape: [1; MAX_DIMS],
            strides: [0; MAX_DIMS],
            ndim: shape.len() as i32,
            dtype: dtype as i32,
        };
        for (i, (&n, &st)) in shape.iter().zip(strides).enumerate() {
            s.shape[i] = n as i64;
            s.strides[i] = st as i64;
        }
        Ok(s)
    }
    /// The absent optional tensor (a null pointer the kernels test for).
    pub fn none() -> Strided {
        Strided {
            ptr: 0,
            offset: 0,
            shape: [1; MAX_DIMS],
            strides: [0; MAX_DIMS],
            ndim: 0,
            dtype: 0,
        }
    }
    pub fn dt(&self) -> Dt {
        match self.dtype {
            0 => Dt::F32,
            1 => Dt::F16,
            2 => Dt::BF16,
            3 => Dt::I64,
            4 => Dt::I32,
            5 => Dt::U8,
            _ => Dt::Bool,
        }
    }
    pub fn dims(&self) -> &[i64] {
        &self.shape[..self.ndim as usize]
    }
    pub fn numel(&self) -> i64 {
        self.dims().iter().product()
    }
    /// Whether the view is row-major contiguous (size-1 dims ignored).
    pub fn is_contiguous(&self) -> bool {
        let mut want = 1i64;
        for d in (0..self.ndim as usize).rev() {
            if self.shape[d] != 1 && self.strides[d] != want {
                return false;
            }
            want *= self.shape[d];
        }
        true
    }
    /// Byte address of element 0 of the view.
    pub fn addr(&self) -> u64 {
        self.ptr + (self.offset as u64) * self.dt().size() as u64
    }
    /// Same view with its logical shape flattened wherever every view in `views` (all of the
    /// same shape) is contiguous across neighbouring dims, and size-1 dims dropped: the
    /// logical element order is unchanged, and index math in the kernel gets cheaper (a
    /// contiguous tensor becomes 1-d with stride 1).
    pub fn coalesce(views: &mut [Strided]) {
        let Some(first) = views.first() else { return };
        let nd = first.ndim as usize;
        let shape: Vec<i64> = first.dims().to_vec();
        // Drop size-1 dims.
        let keep: Vec<usize> = (0..nd).filter(|&d| shape[d] != 1).collect();
        let mut dims: Vec<(i64, Vec<i64>)> = keep
            .iter()
            .map(|&d| (shape[d], views.iter().map(|v| v.strides[d]).collect()))
            .collect();
        // Merge d into d-1 when contiguous for every view.
        let mut i = dims.len();
        while i > 1 {
            i -= 1;
            let (n, ref st) = dims[i];
            let mergeable = dims[i - 1]
                .1
                .iter()
                .zip(st)
                .all(|(&outer, &inner)| outer == inner * n);
            if mergeable {
                let st = dims[i].1.clone();
                let outer_n = dims[i - 1].0;
                dims[i - 1] = (outer_n * n, st);
                dims.remove(i);
            }
        }
        for (k, v) in views.iter_mut().enumerate() {
            v.ndim = dims.len() as i32;
            v.shape = [1; MAX_DIMS];
            v.strides = [0; MAX_DIMS];
            for (d, (n, st)) in dims.iter().enumerate() {
                v.shape[d] = *n;
                v.strides[d] = st[k];
            }
        }
    }
}

/// `map[key]`, built by `build` on a miss. The map holds at most `max` entries and starts
/// over when full: plan caches keyed by shape meet a new shape per prompt length on a
/// server, and a miss costs one plan build.
pub(crate) fn cached<'a, K: Hash + Eq + Clone, V, E>(
    map: &'a mut HashMap<K, V>,
    key: &K,
    max: usize,
    build: impl FnOnce() -> Result<V, E>,
) -> Result<&'a V, E> {
    if !map.contains_key(key) {
        if map.len() >= max {
            map.clear();
        }
        let v = build()?;
        map.insert(key.clone(), v);
    }
    Ok(&map[key])
}

/// The kernels of kernels.cu and flash.cu, by index into the loaded module's functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub(crate) enum K {
    Fill,
    Arange,
    TrilFill,
    Uniform,
    Normal,
    Copy,
    Unary,
    Binary,
    MaskedFill,
    ReduceBlock,
    ReduceThread,
    BiasNchw,
    MaxPool2d,
    MaxPool2dBwd,
    AdaptiveAvg,
    AdaptiveAvgBwd,
    BnTrain,
    BnEvalPlanes,
    BnEval,
    BnBwd,
    Ln,
    LnBwdGx,
    LnBwdGwb,
    SoftmaxRows,
    SoftmaxCols,
    SoftmaxBwdRows,
    SoftmaxBwdCols,
    Embedding,
    EmbeddingBwd,
    Dropout,
    Nll,
    NllBwd,
    SoftmaxWarp,
    LnWarp,
    BnPartStats,
    BnFinStats,
    BnApply,
    BnBwdPart,
    BnBwdFin,
    BnBwdApply,
    Argmax,
    AttnFwd,
    AttnBwdQ,
    AttnBwdKv,
    AttnRows,
    FlashF32D64,
    FlashMmaD64,
    FlashMmaD128,
    UnaryVec,
    BinaryVec,
    LnVec,
}

const KERNEL_NAMES: &[(K, &str)] = &[
    (K::Fill, "k_fill"),
    (K::Arange, "k_arange"),
    (K::TrilFill, "k_tril_fill"),
    (K::Uniform, "k_uniform"),
    (K::Normal, "k_normal"),
    (K::Copy, "k_copy"),
    (K::Unary, "k_unary"),
    (K::Binary, "k_binary"),
    (K::MaskedFill, "k_masked_fill"),
    (K::ReduceBlock, "k_reduce_block"),
    (K::ReduceThread, "k_reduce_thread"),
    (K::BiasNchw, "k_bias_nchw"),
    (K::MaxPool2d, "k_maxpool2d"),
    (K::MaxPool2dBwd, "k_maxpool2d_bwd"),
    (K::AdaptiveAvg, "k_adaptive_avg"),
    (K::AdaptiveAvgBwd, "k_adaptive_avg_bwd"),
    (K::BnTrain, "k_bn_train"),
    (K::BnEvalPlanes, "k_bn_eval_planes"),
    (K::BnEval, "k_bn_eval"),
    (K::BnBwd, "k_bn_bwd"),
    (K::Ln, "k_ln"),
    (K::LnBwdGx, "k_ln_bwd_gx"),
    (K::LnBwdGwb, "k_ln_bwd_gwb"),
    (K::SoftmaxRows, "k_softmax_rows"),
    (K::SoftmaxCols, "k_softmax_cols"),
    (K::SoftmaxBwdRows, "k_softmax_bwd_rows"),
    (K::SoftmaxBwdCols, "k_softmax_bwd_cols"),
    (K::Embedding, "k_embedding"),
    (K::EmbeddingBwd, "k_embedding_bwd"),
    (K::Dropout, "k_dropout"),
    (K::Nll, "k_nll"),
    (K::NllBwd, "k_nll_bwd"),
    (K::SoftmaxWarp, "k_softmax_warp"),
    (K::LnWarp, "k_ln_warp"),
    (K::BnPartStats, "k_bn_part_stats"),
    (K::BnFinStats, "k_bn_fin_stats"),
    (K::BnApply, "k_bn_apply"),
    (K::BnBwdPart, "k_bn_bwd_part"),
    (K::BnBwdFin, "k_bn_bwd_fin"),
    (K::BnBwdApply, "k_bn_bwd_apply"),
    (K::Argmax, "k_argmax"),
    (K::AttnFwd, "k_attn_fwd"),
    (K::AttnBwdQ, "k_attn_bwd_q"),
    (K::AttnBwdKv, "k_attn_bwd_kv"),
    (K::AttnRows, "k_attn_rows"),
    (K::FlashF32D64, "k_flash_f32_d64"),
    (K::FlashMmaD64, "k_flash_mma_d64"),
    (K::FlashMmaD128, "k_flash_mma_d128"),
    (K::UnaryVec, "k_unary_vec"),
    (K::BinaryVec, "k_binary_vec"),
    (K::LnVec, "k_ln_vec"),
];

/// Codes a kernel writes to the error word, and the op each stands for.
const ASSERT_OPS: &[&str] = &[
    "",
    "max_pool2d_backward",
    "embedding",
    "embedding_backward",
    "nll_loss",
    "nll_loss_backward",
];

/// Kernel arguments: pointers to each value, in order. Use inside the call expression, so the
/// temporaries live until the launch returns.
macro_rules! kargs {
    ($($a:expr),* $(,)?) => {
        [$( &$a as *const _ as *mut std::ffi::c_void ),*]
    };
}
pub(crate) use kargs;

/// One GPU's compute: context, stream, kernels, and the cuBLAS/cuDNN handles.
pub struct Gpu {
    ordinal: i32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    module: sys::CUmodule,
    funcs: Vec<sys::CUfunction>,
    /// Each kernel's parameter count, checked at every launch: a wrapper that passes too few
    /// arguments would otherwise make the driver read past the argument array.
    nparams: Vec<usize>,
    /// 16 bytes of device memory: [code: i32, pad, index: i64] of the first kernel assert.
    err: u64,
    arch: (i32, i32),
    sm_count: i32,
    name: String,
    blas: Mutex<Option<blas::Blas>>,
    blas_lt: Mutex<Option<blas_lt::BlasLt>>,
    dnn: Mutex<Option<dnn::Dnn>>,
    /// `torch.backends.cudnn.allow_tf32` (true by default, as in PyTorch).
    allow_tf32: AtomicBool,
    capturing: AtomicBool,
}

// SAFETY: every handle belongs to the primary context, which any thread may use once it is
// current (`bind` makes it current); the cuBLAS and cuDNN handles are behind mutexes, and the
// driver's launch, copy and stream calls are thread-safe.
unsafe impl Send for Gpu {}
// SAFETY: as above.
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Open device `ordinal` for compute: retain its primary context, create the stream,
    /// compile (or load from the cache) and load the kernels. Fails with a typed error on a
    /// machine without a driver, a device or NVRTC.
    pub fn new(ordinal: i32) -> Result<Gpu, CudaError> {
        let dev = crate::driver::device_handle(ordinal)?;
        // SAFETY: the driver library is loaded (device_handle loaded it).
        require_symbols(unsafe { sys::culib() }, "the CUDA driver", COMPUTE_SYMBOLS)?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32, CudaError> {
            let mut v = 0;
            // SAFETY: dev is valid; out-pointer.
            check("cuDeviceGetAttribute", unsafe {
                sys::cuDeviceGetAttribute(&mut v, a, dev)
            })?;
            Ok(v)
        };
        use sys::CUdevice_attribute as A;
        let arch = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let cubin = nvrtc::cubin(nvrtc::SOURCE, arch)?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: dev valid; released in Drop.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        let mut g = Gpu {
            ordinal,
            dev,
            ctx,
            stream: std::ptr::null_mut(),
            module: std::ptr::null_mut(),
            funcs: Vec::new(),
            nparams: Vec::new(),
            err: 0,
            arch,
            sm_count,
            name: String::new(),
            blas: Mutex::new(None),
            blas_lt: Mutex::new(None),
            dnn: Mutex::new(None),
            allow_tf32: AtomicBool::new(true),
            capturing: AtomicBool::new(false),
        };
        // From here on Drop cleans up whatever was created.
        g.bind()?;
        // SAFETY: context current; out-pointer.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut g.stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint,
            )
        })?;
        // SAFETY: cubin is a complete image NVRTC produced for this architecture.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut g.module, cubin.as_ptr() as *const c_void)
        })?;
        for (_, name) in KERNEL_NAMES.iter() {
            let cname = std::ffi::CString::new(*name).unwrap_or_default();
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: module loaded; name is a C string.
            check("cuModuleGetFunction", unsafe {
                sys::cuModuleGetFunction(&mut f, g.module, cname.as_ptr())
            })?;
            g.funcs.push(f);
            // The parameter count: cuFuncGetParamInfo answers for indices below it only.
            let mut count = 0usize;
            loop {
                let (mut off, mut size) = (0usize, 0usize);
                // SAFETY: f is a live function; out-pointers.
                let rc = unsafe { sys::cuFuncGetParamInfo(f, count, &mut off, &mut size) };
                if rc != sys::CUresult::CUDA_SUCCESS || count > 64 {
                    break;
                }
                count += 1;
            }
            g.nparams.push(count);
        }
        // SAFETY: context current; out-pointer. Freed in Drop.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut g.err, 16) })?;
        // SAFETY: 16 bytes just allocated.
        check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(g.err, 0, 16) })?;
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: buf has 256 bytes.
        if unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), 256, dev) }
            == sys::CUresult::CUDA_SUCCESS
        {
            // SAFETY: NUL-terminated by the driver.
            g.name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned();
        }
        Ok(g)
    }

    /// Make this device's context current on the calling thread (cheap when it already is).
    pub fn bind(&self) -> Result<(), CudaError> {
        let mut cur: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer; the driver is loaded.
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut cur) })?;
        if cur != self.ctx {
            // SAFETY: ctx is our retained primary context.
            check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })?;
        }
        Ok(())
    }

    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Compute capability (major, minor).
    pub fn arch(&self) -> (i32, i32) {
        self.arch
    }
    pub fn sm_count(&self) -> i32 {
        self.sm_count
    }
    /// The stream every piece of work goes to, as the allocator names streams.
    pub fn stream_id(&self) -> u64 {
        self.stream as u64
    }
    pub fn raw_stream(&self) -> sys::CUstream {
        self.stream
    }
    pub fn set_allow_tf32(&self, on: bool) {
        self.allow_tf32.store(on, Ordering::Relaxed);
    }
    pub fn allow_tf32(&self) -> bool {
        self.allow_tf32.load(Ordering::Relaxed)
    }
    /// Whether a graph capture is in progress on the stream.
    pub fn is_capturing(&self) -> bool {
        self.capturing.load(Ordering::Relaxed)
    }

    pub(crate) fn launch(
        &self,
        k: K,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        if args.len() != self.nparams[k as usize] {
            return Err(CudaError::Invalid(format!(
                "{}: {} arguments for {} parameters (a bug in Vramroom's launch wrapper)",
                KERNEL_NAMES[k as usize].1,
                args.len(),
                self.nparams[k as usize]
            )));
        }
        self.bind()?;
        let f = self.funcs[k as usize];
        // SAFETY: f is a kernel of our module; args point at values laid out as the kernel's
        // parameters (checked by the wrappers in ops.rs), alive for the duration of the call
        // (the driver copies them before returning).
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                0,
                self.stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Blocks for a grid-stride loop over `n` elements.
    pub(crate) fn grid_for(&self, n: i64, block: u32) -> u32 {
        let want = (n.max(0) as u64).div_ceil(block as u64);
        let cap = (self.sm_count.max(1) as u64) * 32;
        want.min(cap).max(if n > 0 { 1 } else { 0 }) as u32
    }

    pub(crate) fn err_ptr(&self) -> u64 {
        self.err
    }

    /// Wait for all queued work; then report the first kernel assert since the last check.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        if self.is_capturing() {
            return Err(CudaError::Invalid(
                "cannot synchronise the stream while a CUDA graph is being captured".into(),
            ));
        }
        self.bind()?;
        // SAFETY: our stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })?;
        self.check_asserts()
    }

    fn check_asserts(&self) -> Result<(), CudaError> {
        let mut word = [0i64; 2];
        // SAFETY: err holds 16 bytes; word has 16; the stream is idle (called after a sync).
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(word.as_mut_ptr() as *mut c_void, self.err, 16)
        })?;
        let code = (word[0] & 0xffff_ffff) as usize;
        if code != 0 {
            // SAFETY: 16 bytes of ours.
            check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(self.err, 0, 16) })?;
            return Err(CudaError::DeviceAssert {
                op: ASSERT_OPS.get(code).copied().unwrap_or("kernel"),
                index: word[1],
            });
        }
        Ok(())
    }

    /// Copy `dst.len()` bytes from device address `src` to the host, after the work queued so
    /// far (synchronises).
    pub fn read(&self, src: u64, dst: &mut [u8]) -> Result<(), CudaError> {
        if self.is_capturing() {
            return Err(CudaError::Invalid(
                "cannot read tensor data while a CUDA graph is being captured".into(),
            ));
        }
        if dst.is_empty() {
            return self.synchronize();
        }
        self.bind()?;
        // SAFETY: the caller owns src..src+len on the device; dst is writable host memory
        // that outlives the copy (we synchronise before returning).
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len(), self.stream)
        })?;
        self.synchronize()
    }

    /// Copy `src` to device address `dst`, ordered after the work queued so far. Returns once
    /// the host buffer may be reused.
    pub fn write(&self, dst: u64, src: &[u8]) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        if self.is_capturing() {
            return Err(CudaError::Invalid(
                "cannot copy host data while a CUDA graph is being captured".into(),
            ));
        }
        self.bind()?;
        // SAFETY: the caller owns dst..dst+len; src outlives the copy (synchronised below).
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), self.stream)
        })?;
        // SAFETY: our stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.stream)
        })
    }

    /// Device-to-device copy of `bytes`, stream-ordered.
    pub fn copy_bytes(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller owns both ranges.
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream)
        })
    }

    /// Run `f` with this device's cuBLAS handles (created on first use).
    pub(crate) fn with_blas<R>(
        &self,
        f: impl FnOnce(&mut blas::Blas) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        self.bind()?;
        let mut g = self.blas.lock();
        if g.is_none() {
            *g = Some(blas::Blas::new(self.stream)?);
        }
        f(g.as_mut().expect("created above"))
    }

    /// Run `f` with this device's cuDNN handle (created on first use).
    pub(crate) fn with_dnn<R>(
        &self,
        f: impl FnOnce(&mut dnn::Dnn) -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        self.bind()?;
        let mut g = self.dnn.lock();
        if g.is_none() {
            *g = Some(dnn::Dnn::new(self.stream)?);
        }
        f(g.as_mut().expect("created above"))
    }

    /// Timing: a recorded event pair around `f`, in milliseconds of GPU time (what PyTorch's
    /// `torch.cuda.Event(enable_timing=True)` pairs measure).
    pub fn time_ms<E: From<CudaError>>(&self, f: impl FnOnce() -> Result<(), E>) -> Result<f32, E> {
        self.bind()?;
        let mut a: sys::CUevent = std::ptr::null_mut();
        let mut b: sys::CUevent = std::ptr::null_mut();
        // SAFETY: out-pointers; destroyed below.
        check("cuEventCreate", unsafe { sys::cuEventCreate(&mut a, 0) })?;
        // SAFETY: as above.
        if let Err(e) = check("cuEventCreate", unsafe { sys::cuEventCreate(&mut b, 0) }) {
            // SAFETY: a was created above.
            unsafe { sys::cuEventDestroy_v2(a) };
            return Err(e.into());
        }
        let run = || -> Result<f32, E> {
            // SAFETY: live events and our stream.
            check("cuEventRecord", unsafe {
                sys::cuEventRecord(a, self.stream)
            })?;
            f()?;
            // SAFETY: as above.
            check("cuEventRecord", unsafe {
                sys::cuEventRecord(b, self.stream)
            })?;
            // SAFETY: as above.
            check("cuEventSynchronize", unsafe { sys::cuEventSynchronize(b) })?;
            let mut ms = 0f32;
            // SAFETY: both events recorded and complete.
            check("cuEventElapsedTime", unsafe {
                sys::cuEventElapsedTime_v2(&mut ms, a, b)
            })?;
            Ok(ms)
        };
        let r = run();
        // SAFETY: created above, destroyed once.
        unsafe {
            sys::cuEventDestroy_v2(a);
            sys::cuEventDestroy_v2(b);
        }
        r
    }

    /// (free, total) bytes of the device per the driver.
    pub fn mem_get_info(&self) -> Result<(u64, u64), CudaError> {
        self.bind()?;
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: out-pointers; context current.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut f, &mut t)
        })?;
        Ok((f as u64, t as u64))
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: each handle below was created by `new` and is destroyed once; the stream is
        // drained first so nothing queued still uses the module or the error word.
        unsafe {
            if !self.stream.is_null() {
                sys::cuStreamSynchronize(self.stream);
            }
        }
        *self.blas.lock() = None;
        *self.blas_lt.lock() = None;
        *self.dnn.lock() = None;
        // SAFETY: as above.
        unsafe {
            if self.err != 0 {
                sys::cuMemFree_v2(self.err);
            }
            if !self.module.is_null() {
                sys::cuModuleUnload(self.module);
            }
            if !self.stream.is_null() {
                sys::cuStreamDestroy_v2(self.stream);
            }
            sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Gpu({} #{} sm_{}{})",
            self.name, self.ordinal, self.arch.0, self.arch.1
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_builds_once_per_key_and_starts_over_when_full() {
        let mut map: HashMap<u32, u32> = HashMap::new();
        let mut builds = 0;
        for k in [1, 2, 1, 2] {
            let v = cached(&mut map, &k, 2, || {
                builds += 1;
                Ok::<_, ()>(k * 10)
            });
            assert_eq!(v, Ok(&(k * 10)));
        }
        assert_eq!(builds, 2, "hits build nothing");
        // A third key finds the map full: it starts over with that key alone.
        assert_eq!(cached(&mut map, &3, 2, || Ok::<_, ()>(30)), Ok(&30));
        assert_eq!(map.len(), 1);
        // A failed build caches nothing.
        assert_eq!(cached(&mut map, &4, 2, || Err::<u32, _>("no")), Err("no"));
        assert!(!map.contains_key(&4));
    }

    #[test]
    fn coalesce_contiguous_becomes_1d() {
        let mut v = [Strided::new(0, Dt::F32, &[2, 3, 4], &[12, 4, 1], 5).unwrap()];
        Strided::coalesce(&mut v);
        assert_eq!(v[0].dims(), &[24]);
        assert_eq!(v[0].strides[0], 1);
        assert_eq!(v[0].offset, 5);
    }

    #[test]
    fn coalesce_keeps_a_transpose_and_merges_jointly() {
        // a is contiguous, b is a transposed view: only the size-1 dim can go.
        let a = Strided::new(0, Dt::F32, &[3, 1, 4], &[4, 4, 1], 0).unwrap();
        let b = Strided::new(0, Dt::F32, &[3, 1, 4], &[1, 1, 3], 0).unwrap();
        let mut v = [a, b];
        Strided::coalesce(&mut v);
        assert_eq!(v[0].dims(), &[3, 4]);
        assert_eq!(&v[1].strides[..2], &[1, 3]);
        // A broadcast (stride 0) operand beside contiguous ones merges only where both do.
        let a = Strided::new(0, Dt::F32, &[2, 3, 4], &[12, 4, 1], 0).unwrap();
        let b = Strided::new(0, Dt::F32, &[2, 3, 4], &[0, 4, 1], 0).unwrap();
        let mut v = [a, b];
        Strided::coalesce(&mut v);
        assert_eq!(v[0].dims(), &[2, 12]);
        assert_eq!(&v[1].strides[..2], &[0, 1]);
    }

    #[test]
    fn kernel_table_is_in_enum_order_and_every_kernel_is_in_the_source() {
        for (i, (k, name)) in KERNEL_NAMES.iter().enumerate() {
            assert_eq!(*k as usize, i, "{name} is out of order");
            assert!(
                nvrtc::kernel_params(name).is_some(),
                "{name} is not in kernels.cu or flash.cu"
            );
        }
    }

    #[test]
    fn too_many_dims_is_an_error() {
        let shape = [1usize; 9];
        assert!(Strided::new(0, Dt::F32, &shape, &shape, 0).is_err());
    }

    #[test]
    fn descriptor_layout_matches_the_kernel_struct() {
        // struct T in kernels.cu: void*, i64, i64[8], i64[8], int, int.
        assert_eq!(std::mem::size_of::<Strided>(), 8 + 8 + 64 + 64 + 4 + 4);
        assert_eq!(std::mem::align_of::<Strided>(), 8);
    }
}
