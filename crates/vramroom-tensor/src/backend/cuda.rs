//! The cuda backend: every kernel of the [`Backend`] trait on a real GPU.
//!
//! Design note: this file only translates. A [`TRef`] becomes a vramroom-cuda [`Strided`]
//! view (pointer, offset, shape, strides, dtype), each op code becomes the kernel's code, and
//! the call goes to vramroom-cuda's [`Gpu`], which queues it on the device's one stream:
//! elementwise, reduction, norm, softmax, pooling, embedding and loss kernels compiled by
//! NVRTC, GEMMs through cuBLAS (with the handle workspaces the op layer allocated, see
//! [`Backend::bind_blas_workspace`]), convolutions through cuDNN (with the per-call workspace
//! the op layer allocated from [`CudnnWorkspace`]'s answer). Kernels run asynchronously;
//! only reads back to the host synchronise, and that is where a kernel's index error
//! surfaces, as on PyTorch's CUDA.

use std::sync::Arc;

use vramroom_cuda::compute::{
    decode, encode, AttentionSpec, AttentionViews, BinaryCode, ConvArgs, ConvPass as CudaPass,
    ConvSpec, ReduceCode, UnaryCode,
};
use vramroom_cuda::{CudaError, Dt, Gpu, Strided};

use super::*;
use crate::device::{ConvPass, ConvWorkspaceQuery, WorkspacePolicy};
use crate::error::TensorError;

pub struct CudaBackend {
    gpu: Arc<Gpu>,
    profile: HostProfile,
}

impl CudaBackend {
    /// Eval batch norm of `[x, running_mean, running_var, out]` with `[weight, bias]`,
    /// with ReLU fused when `relu`.
    fn bn_eval(&self, t: [TRef; 4], wb: [Option<TRef>; 2], eps: f64, relu: bool) -> Result<()> {
        let name = if relu {
            "batch_norm_eval_relu"
        } else {
            "batch_norm_eval"
        };
        self.profile.time(name, || {
            Ok(self.gpu.batch_norm_eval(
                &st(t[0])?,
                &opt(wb[0])?,
                &opt(wb[1])?,
                &st(t[1])?,
                &st(t[2])?,
                eps,
                &st(t[3])?,
                relu,
            )?)
        })
    }

    pub fn new(gpu: Arc<Gpu>) -> CudaBackend {
        CudaBackend {
            gpu,
            profile: HostProfile::default(),
        }
    }
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
    /// The host-side profile of this backend's calls (off until enabled).
    pub fn profile(&self) -> &HostProfile {
        &self.profile
    }
}

/// Host time spent inside each backend method (argument translation, library calls,
/// launches), for finding what makes a launch-bound forward slow. Off by default: then each
/// call pays one relaxed atomic load.
#[derive(Default)]
pub struct HostProfile {
    on: std::sync::atomic::AtomicBool,
    table: parking_lot::Mutex<std::collections::BTreeMap<&'static str, (u64, u64)>>,
}

impl HostProfile {
    pub fn enable(&self, on: bool) {
        self.on.store(on, std::sync::atomic::Ordering::Relaxed);
    }
    /// (method, calls, total ns), by total time, and clears the table.
    pub fn take(&self) -> Vec<(&'static str, u64, u64)> {
        let mut v: Vec<_> = std::mem::take(&mut *self.table.lock())
            .into_iter()
            .map(|(k, (n, ns))| (k, n, ns))
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.2));
        v
    }
    #[inline]
    fn time<R>(&self, what: &'static str, f: impl FnOnce() -> R) -> R {
        if !self.on.load(std::sync::atomic::Ordering::Relaxed) {
            return f();
        }
        let t = std::time::Instant::now();
        let r = f();
        let ns = t.elapsed().as_nanos() as u64;
        let mut g = self.table.lock();
        let e = g.entry(what).or_insert((0, 0));
        e.0 += 1;
        e.1 += ns;
        r
    }
}

impl From<CudaError> for TensorError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::DeviceAssert { op, index } => TensorError::IndexOutOfRange {
                op,
                msg: format!("index {index} is out of bounds (reported by a CUDA kernel)"),
            },
            CudaError::OutOfMemory { call } => {
                TensorError::oom(format!("CUDA out of memory in {call}"))
            }
            other => TensorError::Cuda(other.to_string()),
        }
    }
}

pub(crate) fn dt(d: DType) -> Dt {
    match d {
        DType::F32 => Dt::F32,
        DType::F16 => Dt::F16,
        DType::BF16 => Dt::BF16,
        DType::I64 => Dt::I64,
        DType::I32 => Dt::I32,
        DType::U8 => Dt::U8,
        DType::Bool => Dt::Bool,
    }
}

fn st(r: TRef) -> Result<Strided> {
    Ok(Strided::new(
        r.ptr,
        dt(r.dtype),
        &r.layout.shape,
        &r.layout.strides,
        r.layout.offset,
    )?)
}

fn opt(r: Option<TRef>) -> Result<Strided> {
    match r {
        Some(r) => st(r),
        None => Ok(Strided::none()),
    }
}

fn unary_code(op: UnaryOp) -> UnaryCode {
    match op {
        UnaryOp::Neg => UnaryCode::Neg,
        UnaryOp::Exp => UnaryCode::Exp,
        UnaryOp::Log => UnaryCode::Log,
        UnaryOp::Sqrt => UnaryCode::Sqrt,
        UnaryOp::Rsqrt => UnaryCode::Rsqrt,
        UnaryOp::Tanh => UnaryCode::Tanh,
        UnaryOp::Sigmoid => UnaryCode::Sigmoid,
        UnaryOp::Relu => UnaryCode::Relu,
        UnaryOp::Gelu { tanh: false } => UnaryCode::Gelu,
        UnaryOp::Gelu { tanh: true } => UnaryCode::GeluTanh,
        UnaryOp::Abs => UnaryCode::Abs,
        UnaryOp::Square => UnaryCode::Square,
        UnaryOp::AddScalar(s) => UnaryCode::AddScalar(s),
        UnaryOp::MulScalar(s) => UnaryCode::MulScalar(s),
        UnaryOp::PowScalar(s) => UnaryCode::PowScalar(s),
        UnaryOp::Cos => UnaryCode::Cos,
        UnaryOp::Sin => UnaryCode::Sin,
        UnaryOp::Silu => UnaryCode::Silu,
    }
}

fn binary_code(op: BinaryOp) -> BinaryCode {
    match op {
        BinaryOp::Add { alpha } => BinaryCode::Add(alpha),
        BinaryOp::Sub => BinaryCode::Sub,
        BinaryOp::Mul => BinaryCode::Mul,
        BinaryOp::Div => BinaryCode::Div,
        BinaryOp::Maximum => BinaryCode::Maximum,
        BinaryOp::ThresholdBackward => BinaryCode::ThresholdBackward,
        BinaryOp::GeluBackward { tanh: false } => BinaryCode::GeluBackward,
        BinaryOp::GeluBackward { tanh: true } => BinaryCode::GeluTanhBackward,
        BinaryOp::TanhBackward => BinaryCode::TanhBackward,
        BinaryOp::SigmoidBackward => BinaryCode::SigmoidBackward,
        BinaryOp::SiluBackward => BinaryCode::SiluBackward,
    }
}

fn attention_views(a: &AttentionArgs) -> Result<AttentionViews> {
    Ok(AttentionViews {
        q: st(a.q)?,
        k: st(a.k)?,
        v: st(a.v)?,
        mask: opt(a.mask)?,
        out: st(a.out)?,
        lse: opt(a.lse)?,
        workspace: a.workspace.ptr,
        workspace_size: a.workspace.size,
    })
}

fn attention_spec(p: &AttentionParams) -> AttentionSpec {
    AttentionSpec {
        scale: p.scale,
        causal: p.causal,
        dropout: p.dropout,
        seed: p.seed,
    }
}

fn conv_args(x: &Strided, w: &Strided, y: &Strided, ws: Workspace) -> ConvArgs {
    ConvArgs {
        x: x.addr(),
        w: w.addr(),
        y: y.addr(),
        workspace: ws.ptr,
        workspace_size: ws.size,
    }
}

fn spec(x: &Strided, w: &Strided, y: &Strided, p: &Conv2dParams) -> Result<ConvSpec> {
    Ok(ConvSpec::of(
        x, w, y, p.padding, p.stride, p.dilation, p.groups,
    )?)
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn fill(&self, out: TRef, value: f64) -> Result<()> {
        self.profile
            .time("fill", || Ok(self.gpu.fill(&st(out)?, value)?))
    }
    fn arange(&self, out: TRef, start: f64, step: f64) -> Result<()> {
        self.profile
            .time("arange", || Ok(self.gpu.arange(&st(out)?, start, step)?))
    }
    fn tril_fill(&self, out: TRef, below: f64, above: f64) -> Result<()> {
        self.profile.time("tril_fill", || {
            Ok(self.gpu.tril_fill(&st(out)?, below, above)?)
        })
    }
    fn uniform(&self, out: TRef, low: f64, high: f64, seed: u64) -> Result<()> {
        self.profile.time("uniform", || {
            Ok(self.gpu.uniform(&st(out)?, low, high, seed)?)
        })
    }
    fn normal(&self, out: TRef, mean: f64, std: f64, seed: u64) -> Result<()> {
        self.profile.time("normal", || {
            Ok(self.gpu.normal(&st(out)?, mean, std, seed)?)
        })
    }
    fn write_f64(&self, out: TRef, data: &[f64]) -> Result<()> {
        self.profile.time("write_f64", || {
            let o = st(out)?;
            let n = o.numel().max(0) as usize;
            let mut v: Vec<f64> = data.iter().copied().take(n).collect();
            v.resize(n, 0.0);
            if o.is_contiguous() {
                return Ok(self.gpu.upload(&o, &encode(&v, o.dt()))?);
            }
            Err(TensorError::invalid(
                "write_f64",
                "host data can only be written to a contiguous CUDA tensor",
            ))
        })
    }
    fn read_f64(&self, x: TRef) -> Result<Vec<f64>> {
        self.profile.time("read_f64", || {
            let s = st(x)?;
            let bytes = self.gpu.download(&s)?;
            Ok(decode(&bytes, s.dt()))
        })
    }
    fn copy(&self, src: TRef, dst: TRef) -> Result<()> {
        self.profile
            .time("copy", || Ok(self.gpu.copy(&st(src)?, &st(dst)?)?))
    }
    fn unary(&self, op: UnaryOp, x: TRef, out: TRef) -> Result<()> {
        self.profile.time("unary", || {
            Ok(self.gpu.unary(unary_code(op), &st(x)?, &st(out)?)?)
        })
    }
    fn binary(&self, op: BinaryOp, a: TRef, b: TRef, out: TRef) -> Result<()> {
        self.profile.time("binary", || {
            Ok(self
                .gpu
                .binary(binary_code(op), &st(a)?, &st(b)?, &st(out)?)?)
        })
    }
    fn reduce(&self, op: ReduceOp, x: TRef, dims: &[usize], out: TRef) -> Result<()> {
        self.profile.time("reduce", || {
            let code = match op {
                ReduceOp::Sum => ReduceCode::Sum,
                ReduceOp::Mean => ReduceCode::Mean,
                ReduceOp::Max => ReduceCode::Max,
                ReduceOp::Min => ReduceCode::Min,
                ReduceOp::ArgMax => ReduceCode::ArgMax,
            };
            Ok(self.gpu.reduce(code, &st(x)?, dims, &st(out)?)?)
        })
    }
    fn masked_fill(&self, x: TRef, mask: TRef, value: f64, out: TRef) -> Result<()> {
        self.profile.time("masked_fill", || {
            Ok(self
                .gpu
                .masked_fill(&st(x)?, &st(mask)?, value, &st(out)?)?)
        })
    }
    fn matmul(&self, a: TRef, b: TRef, out: TRef, accumulate: bool) -> Result<()> {
        self.profile.time("matmul", || {
            // PyTorch's handles are per thread; backward runs on autograd's device thread.
            let which = crate::autograd::in_backward() as usize;
            Ok(self
                .gpu
                .matmul(&st(a)?, &st(b)?, &st(out)?, accumulate, which)?)
        })
    }
    fn matmul_bias(&self, a: TRef, b: TRef, bias: TRef, out: TRef) -> Result<bool> {
        self.profile.time("matmul", || {
            Ok(self
                .gpu
                .matmul_bias(&st(a)?, &st(b)?, &st(bias)?, &st(out)?)?)
        })
    }
    fn conv2d(
        &self,
        x: TRef,
        w: TRef,
        bias: Option<TRef>,
        out: TRef,
        p: &Conv2dParams,
        ws: Workspace,
    ) -> Result<()> {
        self.profile.time("conv2d", || {
            let (xs, wsd, ys) = (st(x)?, st(w)?, st(out)?);
            let sp = spec(&xs, &wsd, &ys, p)?;
            self.gpu
                .conv(CudaPass::Forward, &sp, &conv_args(&xs, &wsd, &ys, ws))?;
            if let Some(b) = bias {
                self.gpu.bias_nchw(&ys, &st(b)?)?;
            }
            Ok(())
        })
    }
    fn conv2d_backward_input(
        &self,
        gy: TRef,
        w: TRef,
        gx: TRef,
        p: &Conv2dParams,
        ws: Workspace,
    ) -> Result<()> {
        self.profile.time("conv2d_backward_input", || {
            let (gys, wsd, gxs) = (st(gy)?, st(w)?, st(gx)?);
            let sp = spec(&gxs, &wsd, &gys, p)?;
            Ok(self.gpu.conv(
                CudaPass::BackwardData,
                &sp,
                &conv_args(&gxs, &wsd, &gys, ws),
            )?)
        })
    }
    fn conv2d_backward_weight(
        &self,
        gy: TRef,
        x: TRef,
        gw: TRef,
        p: &Conv2dParams,
        ws: Workspace,
    ) -> Result<()> {
        self.profile.time("conv2d_backward_weight", || {
            let (gys, xs, gws) = (st(gy)?, st(x)?, st(gw)?);
            let sp = spec(&xs, &gws, &gys, p)?;
            Ok(self.gpu.conv(
                CudaPass::BackwardFilter,
                &sp,
                &conv_args(&xs, &gws, &gys, ws),
            )?)
        })
    }
    fn max_pool2d(&self, x: TRef, out: TRef, indices: TRef, p: &Pool2dParams) -> Result<()> {
        self.profile.time("max_pool2d", || {
            Ok(self.gpu.max_pool2d(
                &st(x)?,
                &st(out)?,
                &st(indices)?,
                p.kernel,
                p.stride,
                p.padding,
                p.dilation,
            )?)
        })
    }
    fn max_pool2d_backward(&self, gy: TRef, indices: TRef, gx: TRef) -> Result<()> {
        self.profile.time("max_pool2d_backward", || {
            Ok(self
                .gpu
                .max_pool2d_backward(&st(gy)?, &st(indices)?, &st(gx)?)?)
        })
    }
    fn adaptive_avg_pool2d(&self, x: TRef, out: TRef) -> Result<()> {
        self.profile.time("adaptive_avg_pool2d", || {
            Ok(self.gpu.adaptive_avg_pool2d(&st(x)?, &st(out)?)?)
        })
    }
    fn adaptive_avg_pool2d_backward(&self, gy: TRef, gx: TRef) -> Result<()> {
        self.profile.time("adaptive_avg_pool2d_backward", || {
            Ok(self.gpu.adaptive_avg_pool2d_backward(&st(gy)?, &st(gx)?)?)
        })
    }
    fn batch_norm_train(
        &self,
        x: TRef,
        weight: Option<TRef>,
        bias: Option<TRef>,
        running_mean: Option<TRef>,
        running_var: Option<TRef>,
        momentum: f64,
        eps: f64,
        out: TRef,
        save_mean: TRef,
        save_invstd: TRef,
    ) -> Result<()> {
        self.profile.time("batch_norm_train", || {
            Ok(self.gpu.batch_norm_train(
                &st(x)?,
                &opt(weight)?,
                &opt(bias)?,
                &opt(running_mean)?,
                &opt(running_var)?,
                momentum,
                eps,
                &st(out)?,
                &st(save_mean)?,
                &st(save_invstd)?,
            )?)
        })
    }
    fn batch_norm_eval(
        &self,
        x: TRef,
        weight: Option<TRef>,
        bias: Option<TRef>,
        running_mean: TRef,
        running_var: TRef,
        eps: f64,
        out: TRef,
    ) -> Result<()> {
        self.bn_eval(
            [x, running_mean, running_var, out],
            [weight, bias],
            eps,
            false,
        )
    }
    fn batch_norm_eval_relu(
        &self,
        x: TRef,
        weight: Option<TRef>,
        bias: Option<TRef>,
        running_mean: TRef,
        running_var: TRef,
        eps: f64,
        out: TRef,
    ) -> Result<()> {
        self.bn_eval(
            [x, running_mean, running_var, out],
            [weight, bias],
            eps,
            true,
        )
    }
    fn batch_norm_backward(
        &self,
        gy: TRef,
        x: TRef,
        weight: Option<TRef>,
        mean: TRef,
        invstd: TRef,
        train: bool,
        eps: f64,
        gx: Option<TRef>,
        gw: Option<TRef>,
        gb: Option<TRef>,
    ) -> Result<()> {
        self.profile.time("batch_norm_backward", || {
            Ok(self.gpu.batch_norm_backward(
                &st(gy)?,
                &st(x)?,
                &opt(weight)?,
                &st(mean)?,
                &st(invstd)?,
                train,
                eps,
                &opt(gx)?,
                &opt(gw)?,
                &opt(gb)?,
            )?)
        })
    }
    fn layer_norm(
        &self,
        x: TRef,
        weight: Option<TRef>,
        bias: Option<TRef>,
        eps: f64,
        out: TRef,
        mean: TRef,
        rstd: TRef,
    ) -> Result<()> {
        self.profile.time("layer_norm", || {
            Ok(self.gpu.layer_norm(
                &st(x)?,
                &opt(weight)?,
                &opt(bias)?,
                eps,
                &st(out)?,
                &st(mean)?,
                &st(rstd)?,
            )?)
        })
    }
    fn layer_norm_backward(
        &self,
        gy: TRef,
        x: TRef,
        weight: Option<TRef>,
        mean: TRef,
        rstd: TRef,
        gx: Option<TRef>,
        gw: Option<TRef>,
        gb: Option<TRef>,
    ) -> Result<()> {
        self.profile.time("layer_norm_backward", || {
            Ok(self.gpu.layer_norm_backward(
                &st(gy)?,
                &st(x)?,
                &opt(weight)?,
                &st(mean)?,
                &st(rstd)?,
                &opt(gx)?,
                &opt(gw)?,
                &opt(gb)?,
            )?)
        })
    }
    fn softmax(&self, x: TRef, dim: usize, log: bool, out: TRef) -> Result<()> {
        self.profile.time("softmax", || {
            Ok(self.gpu.softmax(&st(x)?, dim, log, &st(out)?)?)
        })
    }
    fn softmax_backward(&self, gy: TRef, y: TRef, dim: usize, log: bool, gx: TRef) -> Result<()> {
        self.profile.time("softmax_backward", || {
            Ok(self
                .gpu
                .softmax_backward(&st(gy)?, &st(y)?, dim, log, &st(gx)?)?)
        })
    }
    fn attention(&self, a: &AttentionArgs, p: &AttentionParams) -> Result<()> {
        let views = attention_views(a)?;
        self.profile.time("attention", || {
            Ok(self.gpu.attention(&views, &attention_spec(p))?)
        })
    }

    fn attention_backward(&self, a: &AttentionGradArgs, p: &AttentionParams) -> Result<()> {
        let views = attention_views(&a.fwd)?;
        self.profile.time("attention_backward", || {
            Ok(self.gpu.attention_backward(
                &views,
                &st(a.gout)?,
                &opt(a.delta)?,
                &st(a.gq)?,
                &st(a.gk)?,
                &st(a.gv)?,
                &attention_spec(p),
            )?)
        })
    }

    fn embedding(&self, weight: TRef, idx: TRef, out: TRef) -> Result<()> {
        self.profile.time("embedding", || {
            Ok(self.gpu.embedding(&st(weight)?, &st(idx)?, &st(out)?)?)
        })
    }
    fn embedding_backward(
        &self,
        gy: TRef,
        idx: TRef,
        gw: TRef,
        padding_idx: Option<i64>,
    ) -> Result<()> {
        self.profile.time("embedding_backward", || {
            Ok(self
                .gpu
                .embedding_backward(&st(gy)?, &st(idx)?, &st(gw)?, padding_idx)?)
        })
    }
    fn dropout(&self, x: TRef, p: f64, seed: u64, out: TRef, mask: TRef) -> Result<()> {
        self.profile.time("dropout", || {
            Ok(self.gpu.dropout(&st(x)?, p, seed, &st(out)?, &st(mask)?)?)
        })
    }
    fn nll_loss(
        &self,
        logp: TRef,
        target: TRef,
        mean: bool,
        ignore_index: i64,
        out: TRef,
        total_weight: TRef,
    ) -> Result<()> {
        self.profile.time("nll_loss", || {
            Ok(self.gpu.nll_loss(
                &st(logp)?,
                &st(target)?,
                mean,
                ignore_index,
                &st(out)?,
                &st(total_weight)?,
            )?)
        })
    }
    fn nll_loss_backward(
        &self,
        gy: TRef,
        target: TRef,
        total_weight: TRef,
        mean: bool,
        ignore_index: i64,
        gx: TRef,
    ) -> Result<()> {
        self.profile.time("nll_loss_backward", || {
            Ok(self.gpu.nll_loss_backward(
                &st(gy)?,
                &st(target)?,
                &st(total_weight)?,
                mean,
                ignore_index,
                &st(gx)?,
            )?)
        })
    }
    fn bind_blas_workspace(&self, thread: usize, ptr: u64, size: u64) -> Result<()> {
        self.profile.time("bind_blas_workspace", || {
            Ok(self.gpu.bind_blas_workspace(thread, ptr, size)?)
        })
    }
    fn synchronize(&self) -> Result<()> {
        self.profile
            .time("synchronize", || Ok(self.gpu.synchronize()?))
    }
}

/// The library workspaces of a real GPU: each convolution's size is what cuDNN's chosen
/// algorithm asks for, and the cuBLAS handle sizes are PyTorch's on this architecture.
pub struct CudnnWorkspace {
    gpu: Arc<Gpu>,
    blas_handle: u64,
    blas_device: u64,
}

impl CudnnWorkspace {
    pub fn new(gpu: Arc<Gpu>) -> CudnnWorkspace {
        // PyTorch's default CUBLAS_WORKSPACE_CONFIG is :4096:8 (32 MiB) from Hopper on and
        // :4096:2:16:8 (4 MiB + 16 KiB·8) before; the cuBLASLt workspace is 1 MiB.
        let blas_handle = if gpu.arch().0 >= 9 {
            32 << 20
        } else {
            (4096 << 10) * 2 + (16 << 10) * 8
        };
        CudnnWorkspace {
            gpu,
            blas_handle,
            blas_device: 1 << 20,
        }
    }
}

impl WorkspacePolicy for CudnnWorkspace {
    fn conv2d(&self, q: &ConvWorkspaceQuery) -> u64 {
        let to = |a: [usize; 4]| [a[0] as i64, a[1] as i64, a[2] as i64, a[3] as i64];
        let (x, y) = (to(q.input), to(q.output));
        let contig = |s: [i64; 4]| [s[1] * s[2] * s[3], s[2] * s[3], s[3], 1];
        let spec = ConvSpec {
            dtype: dt(q.dtype),
            x,
            x_strides: contig(x),
            w: to(q.weight),
            y,
            y_strides: contig(y),
            padding: [q.padding[0] as i64, q.padding[1] as i64],
            stride: [q.stride[0] as i64, q.stride[1] as i64],
            dilation: [q.dilation[0] as i64, q.dilation[1] as i64],
            groups: q.groups as i64,
        };
        let pass = match q.pass {
            ConvPass::Forward => CudaPass::Forward,
            ConvPass::BackwardInput => CudaPass::BackwardData,
            ConvPass::BackwardWeight => CudaPass::BackwardFilter,
        };
        // A query cuDNN cannot answer gets no workspace; the run then picks an algorithm
        // that needs none, or reports the same error.
        self.gpu.conv_workspace(pass, &spec).unwrap_or(0)
    }
    fn blas_handle(&self) -> u64 {
        self.blas_handle
    }
    fn blas_device(&self) -> u64 {
        self.blas_device
    }
}
