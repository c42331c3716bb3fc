//! 2-d convolutions through cuDNN, with the algorithm's workspace from the caller.
//!
//! Design note: PyTorch (with `torch.backends.cudnn.benchmark` off, its default) asks cuDNN's
//! heuristics for an algorithm, allocates that algorithm's workspace from the caching
//! allocator, runs, and frees the workspace. Vramroom does the same in two halves, because
//! the allocation belongs to the tensor runtime: [`Gpu::conv_workspace`] answers "how many
//! bytes will this convolution want" (the runtime allocates them), and the run functions take
//! the block it got and pick the best algorithm whose workspace fits in it, which is the one
//! the size was asked for, unless the actual strides differ from the query's.
//!
//! Algorithms come from the `_v7` heuristics (ordered by expected speed), cached per shape.
//! Math: bf16 and f16 use tensor cores; fp32 allows TF32 unless
//! [`Gpu::set_allow_tf32`] turned it off, like `torch.backends.cudnn.allow_tf32` (on by
//! default in PyTorch). Descriptors are cached with the choice, so a repeated shape costs
//! only the cuDNN call. The cuDNN calls enqueue on the device's stream and are capturable
//! into a CUDA graph.
//!
//! Forward passes go through the backend API with cached execution plans (dnn_graph.rs), as
//! PyTorch's do; the legacy call above is the fallback for what that cannot do, and the
//! only path with `VRAMROOM_CUDNN_LEGACY=1` (for comparisons).

use std::collections::HashMap;

use cudarc::cudnn::sys as dn;
use cudarc::driver::sys;

use super::dnn_graph;
use super::dnn_sdpa::{self, SdpaCache, SdpaPtrs, SdpaShape};
use super::libs::{ensure, Lib};
use super::{Dt, Gpu, Strided};
use crate::driver::{require_symbols, CudaError};

const SYMBOLS: &[&str] = &[
    "cudnnCreate",
    "cudnnDestroy",
    "cudnnSetStream",
    "cudnnGetErrorString",
    "cudnnCreateTensorDescriptor",
    "cudnnDestroyTensorDescriptor",
    "cudnnSetTensorNdDescriptor",
    "cudnnCreateFilterDescriptor",
    "cudnnDestroyFilterDescriptor",
    "cudnnSetFilter4dDescriptor",
    "cudnnCreateConvolutionDescriptor",
    "cudnnDestroyConvolutionDescriptor",
    "cudnnSetConvolution2dDescriptor",
    "cudnnSetConvolutionGroupCount",
    "cudnnSetConvolutionMathType",
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
    "cudnnConvolutionForward",
    "cudnnConvolutionBackwardData",
    "cudnnConvolutionBackwardFilter",
];

fn status(call: &'static str, s: dn::cudnnStatus_t) -> Result<(), CudaError> {
    if s == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any status.
    let msg = unsafe { std::ffi::CStr::from_ptr(dn::cudnnGetErrorString(s)) }
        .to_string_lossy()
        .into_owned();
    Err(CudaError::LibraryCall {
        call,
        status: format!("{msg} ({s:?})"),
    })
}

/// Which pass of a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvPass {
    Forward,
    BackwardData,
    BackwardFilter,
}

/// Everything a convolution's descriptors and algorithm depend on. `x` is the input (or
/// grad-input), `y` the output (or grad-output); each with its strides in elements.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConvSpec {
    pub dtype: Dt,
    pub x: [i64; 4],
    pub x_strides: [i64; 4],
    pub w: [i64; 4],
    pub y: [i64; 4],
    pub y_strides: [i64; 4],
    pub padding: [i64; 2],
    pub stride: [i64; 2],
    pub dilation: [i64; 2],
    pub groups: i64,
}

pub(crate) fn contiguous4(s: [i64; 4]) -> [i64; 4] {
    [s[1] * s[2] * s[3], s[2] * s[3], s[3], 1]
}

/// cuDNN's algorithm-performance struct with plain integers where the binding has enums, so
/// a value this binding does not know cannot make an invalid Rust enum.
#[repr(C)]
#[derive(Clone, Copy)]
struct Perf {
    algo: u32,
    status: u32,
    time: f32,
    memory: usize,
    determinism: u32,
    math_type: u32,
    reserved: [i32; 3],
}

#[derive(Clone, Copy, Debug)]
struct Choice {
    algo: u32,
    math: u32,
    workspace: u64,
}

struct Entry {
    xd: dn::cudnnTensorDescriptor_t,
    yd: dn::cudnnTensorDescriptor_t,
    wd: dn::cudnnFilterDescriptor_t,
    cd: dn::cudnnConvolutionDescriptor_t,
    /// Heuristic candidates that cuDNN says it can run, best first.
    candidates: Vec<Choice>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Dnn::entry` and is destroyed once.
        unsafe {
            dn::cudnnDestroyTensorDescriptor(self.xd);
            dn::cudnnDestroyTensorDescriptor(self.yd);
            dn::cudnnDestroyFilterDescriptor(self.wd);
            dn::cudnnDestroyConvolutionDescriptor(self.cd);
        }
    }
}

pub struct Dnn {
    handle: dn::cudnnHandle_t,
    cache: HashMap<(ConvPass, ConvSpec, bool), Entry>,
    /// Forward plans by (spec, tf32, pointer alignments); an empty list means "use legacy".
    plans: HashMap<(ConvSpec, bool, [u8; 3]), dnn_graph::Plans>,
    /// Attention plans (dnn_sdpa.rs).
    sdpa: SdpaCache,
    /// The backend API is present and not switched off.
    graph_api: bool,
}

impl Dnn {
    pub(crate) fn new(stream: sys::CUstream) -> Result<Dnn, CudaError> {
        ensure(Lib::Cudnn)?;
        // SAFETY: the library is loaded (ensure).
        require_symbols(unsafe { dn::culib() }, "cuDNN", SYMBOLS)?;
        let mut handle: dn::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: out-pointer; the context is current (Gpu::with_dnn binds it).
        status("cudnnCreate", unsafe { dn::cudnnCreate(&mut handle) })?;
        // SAFETY: the library is loaded.
        let graph_api = require_symbols(unsafe { dn::culib() }, "cuDNN", dnn_graph::SYMBOLS)
            .is_ok()
            && std::env::var("VRAMROOM_CUDNN_LEGACY").map_or(true, |v| v.is_empty() || v == "0");
        let d = Dnn {
            handle,
            cache: HashMap::new(),
            plans: HashMap::new(),
            sdpa: SdpaCache::default(),
            graph_api,
        };
        // SAFETY: live handle and stream.
        status("cudnnSetStream", unsafe {
            dn::cudnnSetStream(d.handle, stream as dn::cudaStream_t)
        })?;
        Ok(d)
    }

    fn entry(&mut self, pass: ConvPass, spec: &ConvSpec, tf32: bool) -> Result<&Entry, CudaError> {
        let key = (pass, spec.clone(), tf32);
        if !self.cache.contains_key(&key) {
            let e = build(self.handle, pass, spec, tf32)?;
            self.cache.insert(key.clone(), e);
        }
        Ok(&self.cache[&key])
    }

    /// The forward plans for `spec` at these pointer alignments, built on first use. Empty
    /// when the backend API is off or cannot run the shape.
    fn forward_plans(&mut self, spec: &ConvSpec, tf32: bool, align: [u8; 3]) -> &[dnn_graph::Plan] {
        if !self.graph_api {
            return &[];
        }
        let handle = self.handle;
        let key = (spec.clone(), tf32, align);
        &self
            .plans
            .entry(key)
            .or_insert_with(|| {
                dnn_graph::build_forward(handle, spec, tf32, align).unwrap_or_else(|e| {
                    tracing::debug!(?spec, error = %e, "no cuDNN execution plan; legacy API");
                    dnn_graph::Plans::none()
                })
            })
            .plans
    }

    /// The workspace bytes of cuDNN's fused-attention plan for `shape`; `None` when it has
    /// none (or the graph API is off).
    pub(crate) fn attention_workspace(&mut self, shape: &SdpaShape) -> Option<u64> {
        if !self.graph_api {
            return None;
        }
        self.sdpa.plan(self.handle, shape).map(|p| p.workspace)
    }

    /// The attention forward on cuDNN's fused engine (dnn_sdpa.rs). Ok(false), with nothing
    /// run, when it has no plan for the shape within `workspace_size` bytes.
    pub(crate) fn attention(
        &mut self,
        shape: &SdpaShape,
        ptrs: &SdpaPtrs,
        workspace_size: u64,
        scale: f32,
    ) -> Result<bool, CudaError> {
        if !self.graph_api {
            return Ok(false);
        }
        let handle = self.handle;
        let Some(plan) = self
            .sdpa
            .plan(handle, shape)
            .filter(|p| p.workspace <= workspace_size)
        else {
            return Ok(false);
        };
        match dnn_sdpa::execute(handle, plan, shape, ptrs, scale) {
            Ok(()) => Ok(true),
            Err(e) => {
                // A plan that finalized but will not run: this shape takes our kernels.
                tracing::warn!(?shape, error = %e, "cuDNN attention plan failed");
                self.sdpa.decline(shape);
                Ok(false)
            }
        }
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        self.cache.clear();
        if !self.handle.is_null() {
            // SAFETY: created in new, destroyed once.
            unsafe { dn::cudnnDestroy(self.handle) };
        }
    }
}

fn data_type(dt: Dt) -> Result<dn::cudnnDataType_t, CudaError> {
    Ok(match dt {
        Dt::F32 => dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
        Dt::F16 => dn::cudnnDataType_t::CUDNN_DATA_HALF,
        Dt::BF16 => dn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        other => {
            return Err(CudaError::Invalid(format!(
                "conv2d on {other:?} is not supported on CUDA"
            )))
        }
    })
}

fn math_type(v: u32) -> dn::cudnnMathType_t {
    match v {
        1 => dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        2 => dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        3 => dn::cudnnMathType_t::CUDNN_FMA_MATH,
        _ => dn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
    }
}

fn to_i32(v: &[i64]) -> Result<Vec<i32>, CudaError> {
    v.iter()
        .map(|&x| {
            i32::try_from(x).map_err(|_| {
                CudaError::Invalid(format!("conv2d: size {x} exceeds cuDNN's 32-bit limit"))
            })
        })
        .collect()
}

fn tensor_desc(
    dt: dn::cudnnDataType_t,
    dims: &[i64; 4],
    strides: &[i64; 4],
) -> Result<dn::cudnnTensorDescriptor_t, CudaError> {
    let mut d: dn::cudnnTensorDescriptor_t = std::ptr::null_mut();
    // SAFETY: out-pointer.
    status("cudnnCreateTensorDescriptor", unsafe {
        dn::cudnnCreateTensorDescriptor(&mut d)
    })?;
    let (dd, ss) = (to_i32(dims)?, to_i32(strides)?);
    // cuDNN wants a positive stride even on size-1 dims.
    let ss: Vec<i32> = ss.iter().map(|&s| s.max(1)).collect();
    // SAFETY: d is live; 4 dims and strides.
    let r = status("cudnnSetTensorNdDescriptor", unsafe {
        dn::cudnnSetTensorNdDescriptor(d, dt, 4, dd.as_ptr(), ss.as_ptr())
    });
    if let Err(e) = r {
        // SAFETY: created above.
        unsafe { dn::cudnnDestroyTensorDescriptor(d) };
        return Err(e);
    }
    Ok(d)
}

fn build(
    handle: dn::cudnnHandle_t,
    pass: ConvPass,
    s: &ConvSpec,
    tf32: bool,
) -> Result<Entry, CudaError> {
    let dt = data_type(s.dtype)?;
    let mut e = Entry {
        xd: std::ptr::null_mut(),
        yd: std::ptr::null_mut(),
        wd: std::ptr::null_mut(),
        cd: std::ptr::null_mut(),
        candidates: Vec::new(),
    };
    e.xd = tensor_desc(dt, &s.x, &s.x_strides)?;
    e.yd = tensor_desc(dt, &s.y, &s.y_strides)?;
    let w = to_i32(&s.w)?;
    // SAFETY: out-pointers and live descriptors throughout; on error `e` drops and destroys
    // what was created (destroying a null descriptor is a no-op in cuDNN).
    unsafe {
        status(
            "cudnnCreateFilterDescriptor",
            dn::cudnnCreateFilterDescriptor(&mut e.wd),
        )?;
        status(
            "cudnnSetFilter4dDescriptor",
            dn::cudnnSetFilter4dDescriptor(
                e.wd,
                dt,
                dn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                w[0],
                w[1],
                w[2],
                w[3],
            ),
        )?;
        status(
            "cudnnCreateConvolutionDescriptor",
            dn::cudnnCreateConvolutionDescriptor(&mut e.cd),
        )?;
        let p = to_i32(&[
            s.padding[0],
            s.padding[1],
            s.stride[0],
            s.stride[1],
            s.dilation[0],
            s.dilation[1],
            s.groups,
        ])?;
        status(
            "cudnnSetConvolution2dDescriptor",
            dn::cudnnSetConvolution2dDescriptor(
                e.cd,
                p[0],
                p[1],
                p[2],
                p[3],
                p[4],
                p[5],
                dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                // Accumulate in f32 for every input type, as PyTorch does.
                dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            ),
        )?;
        status(
            "cudnnSetConvolutionGroupCount",
            dn::cudnnSetConvolutionGroupCount(e.cd, p[6]),
        )?;
        let math = match s.dtype {
            Dt::F32 if !tf32 => dn::cudnnMathType_t::CUDNN_FMA_MATH,
            Dt::F32 => dn::cudnnMathType_t::CUDNN_DEFAULT_MATH,
            _ => dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        };
        status(
            "cudnnSetConvolutionMathType",
            dn::cudnnSetConvolutionMathType(e.cd, math),
        )?;
        let mut perf = [Perf {
            algo: 0,
            status: 1,
            time: 0.0,
            memory: 0,
            determinism: 0,
            math_type: 0,
            reserved: [0; 3],
        }; 16];
        let mut got = 0i32;
        match pass {
            ConvPass::Forward => status(
                "cudnnGetConvolutionForwardAlgorithm_v7",
                dn::cudnnGetConvolutionForwardAlgorithm_v7(
                    handle,
                    e.xd,
                    e.wd,
                    e.cd,
                    e.yd,
                    16,
                    &mut got,
                    perf.as_mut_ptr() as *mut dn::cudnnConvolutionFwdAlgoPerf_t,
                ),
            )?,
            ConvPass::BackwardData => status(
                "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                dn::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                    handle,
                    e.wd,
                    e.yd,
                    e.cd,
                    e.xd,
                    16,
                    &mut got,
                    perf.as_mut_ptr() as *mut dn::cudnnConvolutionBwdDataAlgoPerf_t,
                ),
            )?,
            ConvPass::BackwardFilter => status(
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                dn::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                    handle,
                    e.xd,
                    e.yd,
                    e.cd,
                    e.wd,
                    16,
                    &mut got,
                    perf.as_mut_ptr() as *mut dn::cudnnConvolutionBwdFilterAlgoPerf_t,
                ),
            )?,
        }
        let max_algo = match pass {
            ConvPass::Forward => 8,
            ConvPass::BackwardData => 6,
            ConvPass::BackwardFilter => 7,
        };
        for p in &perf[..(got.clamp(0, 16) as usize)] {
            if p.status == 0 && p.algo < max_algo {
                e.candidates.push(Choice {
                    algo: p.algo,
                    math: p.math_type,
                    workspace: p.memory as u64,
                });
            }
        }
    }
    if e.candidates.is_empty() {
        return Err(CudaError::LibraryCall {
            call: "cudnnGetConvolution*Algorithm_v7",
            status: format!("no algorithm supports {pass:?} {s:?}"),
        });
    }
    Ok(e)
}

/// Pointers and sizes of one convolution call.
#[derive(Debug, Clone, Copy)]
pub struct ConvArgs {
    /// Input (forward, backward-filter) or grad-input (backward-data).
    pub x: u64,
    pub w: u64,
    /// Output (forward) or grad-output (backward passes).
    pub y: u64,
    pub workspace: u64,
    pub workspace_size: u64,
}

impl Gpu {
    /// Bytes of workspace the convolution will want (the best algorithm's).
    pub fn conv_workspace(&self, pass: ConvPass, spec: &ConvSpec) -> Result<u64, CudaError> {
        let tf32 = self.allow_tf32();
        self.with_dnn(|d| {
            if pass == ConvPass::Forward {
                // Asked before the pointers exist: the allocator's blocks are 512-aligned,
                // so a whole-tensor view is 16-aligned.
                if let Some(p) = d.forward_plans(spec, tf32, [16; 3]).first() {
                    return Ok(p.workspace);
                }
            }
            Ok(d.entry(pass, spec, tf32)?.candidates[0].workspace)
        })
    }

    /// Run one pass. Forward writes `y`, backward-data writes `x`, backward-filter writes `w`;
    /// each overwrites its output (beta = 0).
    pub fn conv(&self, pass: ConvPass, spec: &ConvSpec, a: &ConvArgs) -> Result<(), CudaError> {
        let tf32 = self.allow_tf32();
        self.with_dnn(|d| {
            let handle = d.handle;
            if pass == ConvPass::Forward {
                let align = [a.x, a.w, a.y].map(dnn_graph::alignment);
                let ran = d
                    .forward_plans(spec, tf32, align)
                    .iter()
                    .find(|p| p.workspace <= a.workspace_size)
                    .map(|p| dnn_graph::execute(handle, p, a.x, a.w, a.y, a.workspace));
                match ran {
                    Some(Ok(())) => return Ok(()),
                    Some(Err(e)) => {
                        // A plan that finalized but will not run: this shape goes legacy.
                        tracing::warn!(?spec, error = %e, "cuDNN plan failed; legacy API");
                        d.plans
                            .insert((spec.clone(), tf32, align), dnn_graph::Plans::none());
                    }
                    None => {}
                }
            }
            let e = d.entry(pass, spec, tf32)?;
            let c = *e
                .candidates
                .iter()
                .find(|c| c.workspace <= a.workspace_size)
                .ok_or_else(|| CudaError::LibraryCall {
                    call: "conv2d",
                    status: format!(
                        "no cuDNN algorithm fits the {} B workspace",
                        a.workspace_size
                    ),
                })?;
            let (alpha, beta) = (1f32, 0f32);
            let al = &alpha as *const f32 as *const std::ffi::c_void;
            let be = &beta as *const f32 as *const std::ffi::c_void;
            let ws = a.workspace as *mut std::ffi::c_void;
            let wsz = a.workspace_size as usize;
            // SAFETY: descriptors are live and describe the views the caller passed; the
            // pointers lie in live allocations of those sizes; `algo` was returned by cuDNN
            // for these descriptors and is within the enum's range (checked in build), so the
            // transmutes produce valid enum values.
            unsafe {
                status(
                    "cudnnSetConvolutionMathType",
                    dn::cudnnSetConvolutionMathType(e.cd, math_type(c.math)),
                )?;
                match pass {
                    ConvPass::Forward => status(
                        "cudnnConvolutionForward",
                        dn::cudnnConvolutionForward(
                            handle,
                            al,
                            e.xd,
                            a.x as *const std::ffi::c_void,
                            e.wd,
                            a.w as *const std::ffi::c_void,
                            e.cd,
                            std::mem::transmute::<u32, dn::cudnnConvolutionFwdAlgo_t>(c.algo),
                            ws,
                            wsz,
                            be,
                            e.yd,
                            a.y as *mut std::ffi::c_void,
                        ),
                    ),
                    ConvPass::BackwardData => status(
                        "cudnnConvolutionBackwardData",
                        dn::cudnnConvolutionBackwardData(
                            handle,
                            al,
                            e.wd,
                            a.w as *const std::ffi::c_void,
                            e.yd,
                            a.y as *const std::ffi::c_void,
                            e.cd,
                            std::mem::transmute::<u32, dn::cudnnConvolutionBwdDataAlgo_t>(c.algo),
                            ws,
                            wsz,
                            be,
                            e.xd,
                            a.x as *mut std::ffi::c_void,
                        ),
                    ),
                    ConvPass::BackwardFilter => status(
                        "cudnnConvolutionBackwardFilter",
                        dn::cudnnConvolutionBackwardFilter(
                            handle,
                            al,
                            e.xd,
                            a.x as *const std::ffi::c_void,
                            e.yd,
                            a.y as *const std::ffi::c_void,
                            e.cd,
                            std::mem::transmute::<u32, dn::cudnnConvolutionBwdFilterAlgo_t>(c.algo),
                            ws,
                            wsz,
                            be,
                            e.wd,
                            a.w as *mut std::ffi::c_void,
                        ),
                    ),
                }
            }
        })
    }
}

impl ConvSpec {
    /// The spec of a convolution of `x` (any strides) with `w` (contiguous) into `y`.
    #[allow(clippy::too_many_arguments)]
    pub fn of(
        x: &Strided,
        w: &Strided,
        y: &Strided,
        padding: [usize; 2],
        stride: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<ConvSpec, CudaError> {
        for (t, what) in [(x, "input"), (w, "weight"), (y, "output")] {
            if t.ndim != 4 {
                return Err(CudaError::Invalid(format!(
                    "conv2d: the {what} must be 4-d, got {:?}",
                    t.dims()
                )));
            }
        }
        let four = |a: &[i64]| [a[0], a[1], a[2], a[3]];
        let ws = four(&w.strides);
        if !w.is_contiguous() && ws != contiguous4(four(&w.shape)) {
            return Err(CudaError::Invalid(
                "conv2d on CUDA needs a contiguous weight".into(),
            ));
        }
        let i = |v: [usize; 2]| [v[0] as i64, v[1] as i64];
        Ok(ConvSpec {
            dtype: x.dt(),
            x: four(&x.shape),
            x_strides: four(&x.strides),
            w: four(&w.shape),
            y: four(&y.shape),
            y_strides: four(&y.strides),
            padding: i(padding),
            stride: i(stride),
            dilation: i(dilation),
            groups: groups as i64,
        })
    }
}
