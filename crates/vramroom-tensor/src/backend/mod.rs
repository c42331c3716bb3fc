//! The backend trait: kernels that fill preallocated memory.
//!
//! Design note: a backend never allocates device memory. The op layer (`crate::ops`) checks
//! shapes, allocates every output, workspace and saved buffer through the device in
//! PyTorch's order, and only then calls one of these kernels. The meta backend implements
//! each kernel as "do nothing", which is why its allocation sequence equals cpu's; a CUDA
//! backend implements the same methods with device pointers. Inputs may be strided views;
//! outputs are fresh contiguous buffers unless a method says otherwise.

pub mod cpu;
mod cpu_attention;
pub mod cuda;
pub mod meta;

use crate::dtype::DType;
use crate::error::Result;
use crate::layout::Layout;

/// The `thread` of [`Backend::bind_blas_workspace`] that names the per-device cuBLASLt
/// workspace (the CUDA backend passes it through as vramroom-cuda's own constant).
pub const LT_WORKSPACE: usize = vramroom_cuda::compute::blas_lt::LT_WORKSPACE;

/// A kernel argument: a storage base address, the view's layout (offset and strides are in
/// elements) and its dtype.
#[derive(Debug, Clone, Copy)]
pub struct TRef<'a> {
    pub ptr: u64,
    pub layout: &'a Layout,
    pub dtype: DType,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    /// `approximate="none"` (erf) when false, `"tanh"` when true.
    Gelu {
        tanh: bool,
    },
    Abs,
    Square,
    AddScalar(f64),
    MulScalar(f64),
    PowScalar(f64),
    Cos,
    Sin,
    /// `x * sigmoid(x)` (`F.silu`, Llama's `hidden_act="silu"`).
    Silu,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BinaryOp {
    /// `a + alpha * b`.
    Add {
        alpha: f64,
    },
    Sub,
    Mul,
    Div,
    Maximum,
    /// ReLU backward: `a * (b > 0)` with a the grad and b the saved output.
    ThresholdBackward,
    /// GELU backward: a the grad, b the saved input.
    GeluBackward {
        tanh: bool,
    },
    /// Tanh backward: `a * (1 - b^2)`, b the saved output.
    TanhBackward,
    /// Sigmoid backward: `a * b * (1 - b)`, b the saved output.
    SigmoidBackward,
    /// SiLU backward: a the grad, b the saved input.
    SiluBackward,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    /// Index of the first maximum along the one reduced dim, written into an int64 `out`.
    ArgMax,
}

/// What a fused attention kernel computes besides its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Multiplies `q . k` (PyTorch's default is `1/sqrt(head_dim)`).
    pub scale: f64,
    /// Top-left causal: key `j` is visible to query `i` when `j <= i` (SDPA's `is_causal`).
    pub causal: bool,
    /// Probability of dropping an attention weight (0: none).
    pub dropout: f64,
    /// Seed of the dropout pattern: a hash of (seed, batch, head, query, key) decides each
    /// weight, so the backward sees the very pattern the forward used.
    pub seed: u64,
}

/// The tensors of a fused attention forward: `q` [B, Hq, T, D], `k` [B, Hkv, S, D], `v`
/// [B, Hkv, S, Dv] (any strides; `Hq` a multiple of `Hkv`, query head `h` reads key head
/// `h / (Hq / Hkv)`), `mask` an additive float mask expanded to [B, Hq, T, S], `out`
/// [B, Hq, T, Dv], `lse` [B, Hq, T] f32 (the rows' log-sum-exp, for the backward), and the
/// workspace the op layer allocated where PyTorch's kernel takes one (cuDNN's).
#[derive(Debug, Clone, Copy)]
pub struct AttentionArgs<'a> {
    pub q: TRef<'a>,
    pub k: TRef<'a>,
    pub v: TRef<'a>,
    pub mask: Option<TRef<'a>>,
    pub out: TRef<'a>,
    pub lse: Option<TRef<'a>>,
    pub workspace: Workspace,
}

/// The tensors of a fused attention backward: the forward's (with its `lse`), the output
/// gradient `gout`, `delta` = rowsum(gout * out) [B, Hq, T] f32 when the op layer computed
/// it (PyTorch's memory-efficient backward does, outside its kernel; the others compute it
/// inside, and so does the backend then), and the gradients `gq`, `gk`, `gv` (shaped like
/// q, k, v; overwritten).
#[derive(Debug, Clone, Copy)]
pub struct AttentionGradArgs<'a> {
    pub fwd: AttentionArgs<'a>,
    pub gout: TRef<'a>,
    pub delta: Option<TRef<'a>>,
    pub gq: TRef<'a>,
    pub gk: TRef<'a>,
    pub gv: TRef<'a>,
}

/// A library workspace the op layer allocated for one kernel call (`ptr` 0 when none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Workspace {
    pub ptr: u64,
    pub size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dParams {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool2dParams {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

/// Kernels of one device type. All methods take `&self`: backends are stateless or
/// internally synchronised.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;

    /// Every element of `out` (any layout) set to `value`.
    fn fill(&self, out: TRef, value: f64) -> Result<()>;
    /// `out[i] = start + i * step`, contiguous 1-d.
    fn arange(&self, out: TRef, start: f64, step: f64) -> Result<()>;
    /// A causal pattern into `out` (contiguous [T, S]): `below` where column <= row (what
    /// `tril` keeps), `above` elsewhere. By default computed here and written; a device
    /// backend fills it in place, since a model's attention builds one per layer.
    fn tril_fill(&self, out: TRef, below: f64, above: f64) -> Result<()> {
        let (t, s) = (out.layout.shape[0], out.layout.shape[1]);
        let vals: Vec<f64> = (0..t * s)
            .map(|x| if x % s <= x / s { below } else { above })
            .collect();
        self.write_f64(out, &vals)
    }
    /// Uniform in [low, high) or normal(mean, std), from `seed`.
    fn uniform(&self, out: TRef, low: f64, high: f64, seed: u64) -> Result<()>;
    fn normal(&self, out: TRef, mean: f64, std: f64, seed: u64) -> Result<()>;
    /// Host data into `out` (contiguous), converting from f64.
    fn write_f64(&self, out: TRef, data: &[f64]) -> Result<()>;
    /// `out` back to the host as f64, in logical order.
    fn read_f64(&self, x: TRef) -> Result<Vec<f64>>;
    /// Strided copy with dtype conversion; shapes are equal; `dst` may be a strided view.
    fn copy(&self, src: TRef, dst: TRef) -> Result<()>;

    fn unary(&self, op: UnaryOp, x: TRef, out: TRef) -> Result<()>;
    /// `a` and `b` come already expanded to `out`'s shape (zero strides). `out` may alias
    /// `a` exactly (in-place ops).
    fn binary(&self, op: BinaryOp, a: TRef, b: TRef, out: TRef) -> Result<()>;
    /// `out` has `x`'s shape with the reduced `dims` set to 1.
    fn reduce(&self, op: ReduceOp, x: TRef, dims: &[usize], out: TRef) -> Result<()>;
    /// `out[i] = cond[i] ? value : x[i]`; `mask` is bool, expanded to `x`'s shape.
    fn masked_fill(&self, x: TRef, mask: TRef, value: f64, out: TRef) -> Result<()>;

    /// Batched `out = a @ b (+ out if accumulate)`: `a` [B,M,K], `b` [B,K,N], `out` [B,M,N],
    /// any strides.
    fn matmul(&self, a: TRef, b: TRef, out: TRef, accumulate: bool) -> Result<()>;
    /// `out = a @ b + bias` (bias 1-d, broadcast over rows) in one call, as PyTorch's
    /// cuBLASLt `gemm_and_bias`; shapes as [`Backend::matmul`] with a batch of one.
    /// `Ok(false)`: not taken here (nothing written), and the caller copies the bias and
    /// accumulates with [`Backend::matmul`].
    fn matmul_bias(&self, _a: TRef, _b: TRef, _bias: TRef, _out: TRef) -> Result<bool> {
        Ok(false)
    }

    /// `ws` is the workspace the device's [`crate::device::WorkspacePolicy`] asked for; it
    /// stays allocated until the call returns.
    fn conv2d(
        &self,
        x: TRef,
        w: TRef,
        bias: Option<TRef>,
        out: TRef,
        p: &Conv2dParams,
        ws: Workspace,
    ) -> Result<()>;
    fn conv2d_backward_input(
        &self,
        gy: TRef,
        w: TRef,
        gx: TRef,
        p: &Conv2dParams,
        ws: Workspace,
    ) -> Result<()>;
    fn conv2d_backward_weight(
        &self,
        gy: TRef,
        x: TRef,
        gw: TRef,
        p: &Conv2dParams,
        ws: Workspace,
    ) -> Result<()>;

    /// The op layer allocated the GEMM workspace of BLAS handle `thread` (0 forward,
    /// 1 backward, [`LT_WORKSPACE`] the per-device cuBLASLt one): `size` bytes at `ptr`,
    /// held as long as the device. Backends whose BLAS needs no workspace ignore it.
    fn bind_blas_workspace(&self, _thread: usize, _ptr: u64, _size: u64) -> Result<()> {
        Ok(())
    }

    /// Waits for queued work (a no-op where kernels run synchronously).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// `indices` is i64, flat index into each (n, c) plane of the input.
    fn max_pool2d(&self, x: TRef, out: TRef, indices: TRef, p: &Pool2dParams) -> Result<()>;
    /// `gx` arrives zero-filled.
    fn max_pool2d_backward(&self, gy: TRef, indices: TRef, gx: TRef) -> Result<()>;
    fn adaptive_avg_pool2d(&self, x: TRef, out: TRef) -> Result<()>;
    fn adaptive_avg_pool2d_backward(&self, gy: TRef, gx: TRef) -> Result<()>;

    /// Training: batch statistics into `save_mean`/`save_invstd` (C floats), running stats
    /// updated in place with `momentum` (unbiased variance, as PyTorch).
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn batch_norm_eval(
        &self,
        x: TRef,
        weight: Option<TRef>,
        bias: Option<TRef>,
        running_mean: TRef,
        running_var: TRef,
        eps: f64,
        out: TRef,
    ) -> Result<()>;
    /// Eval batch norm, then ReLU in place on `out`. Backends that can do both in one pass
    /// override this (it saves a launch and a pass over memory per ResNet batch norm).
    #[allow(clippy::too_many_arguments)]
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
        self.batch_norm_eval(x, weight, bias, running_mean, running_var, eps, out)?;
        self.unary(UnaryOp::Relu, out, out)
    }
    /// Train: `mean`/`invstd` are the saved batch stats. Eval: they are the running mean and
    /// the running *variance* (PyTorch's eval backward reads the running stats).
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;

    /// Normalises rows of length `x.numel() / mean.numel()`.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        x: TRef,
        weight: Option<TRef>,
        bias: Option<TRef>,
        eps: f64,
        out: TRef,
        mean: TRef,
        rstd: TRef,
    ) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;

    /// Over `dim` of a contiguous `x`.
    fn softmax(&self, x: TRef, dim: usize, log: bool, out: TRef) -> Result<()>;
    fn softmax_backward(&self, gy: TRef, y: TRef, dim: usize, log: bool, gx: TRef) -> Result<()>;

    /// `out[i, :] = weight[idx[i], :]`.
    fn embedding(&self, weight: TRef, idx: TRef, out: TRef) -> Result<()>;
    /// `gw` arrives zero-filled; rows accumulate.
    fn embedding_backward(
        &self,
        gy: TRef,
        idx: TRef,
        gw: TRef,
        padding_idx: Option<i64>,
    ) -> Result<()>;

    /// Fused scaled-dot-product attention ([`AttentionArgs`]). `lse` must be given when a
    /// backward will follow.
    fn attention(&self, a: &AttentionArgs, p: &AttentionParams) -> Result<()>;
    /// Its gradients ([`AttentionGradArgs`]), recomputing the weights from `lse`.
    fn attention_backward(&self, a: &AttentionGradArgs, p: &AttentionParams) -> Result<()>;

    /// `mask` (bool) keeps with probability 1-p; `out = x * mask / (1-p)`.
    fn dropout(&self, x: TRef, p: f64, seed: u64, out: TRef, mask: TRef) -> Result<()>;

    /// `logp` [N, C], `target` i64 [N]. Mean (`mean=true`) or sum of `-logp[i, t_i]` over
    /// targets != ignore_index; `total_weight` gets the count.
    #[allow(clippy::too_many_arguments)]
    fn nll_loss(
        &self,
        logp: TRef,
        target: TRef,
        mean: bool,
        ignore_index: i64,
        out: TRef,
        total_weight: TRef,
    ) -> Result<()>;
    /// `gx` arrives zero-filled.
    fn nll_loss_backward(
        &self,
        gy: TRef,
        target: TRef,
        total_weight: TRef,
        mean: bool,
        ignore_index: i64,
        gx: TRef,
    ) -> Result<()>;
}
