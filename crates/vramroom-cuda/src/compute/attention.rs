//! Host side of the attention kernels: the naive ones of kernels.cu (`k_attn_fwd`,
//! `k_attn_bwd_q`, `k_attn_bwd_kv`), the fast forward ones of flash.cu (`k_flash_*`,
//! `k_attn_rows`) and cuDNN's fused engine (dnn_sdpa.rs), and the choice between them.
//!
//! Design note: every kernel computes what PyTorch's flash / memory-efficient / cuDNN
//! attention computes. Every buffer they touch was allocated by the tensor runtime's op layer
//! the way PyTorch's chosen kernel allocates it, so memory matches PyTorch whichever kernel
//! runs; none needs scratch memory of its own (the fast forward keeps its softmax state in
//! registers and shared memory, and decode splits the keys inside one block rather than
//! across blocks, which would need a partial-results buffer). cuDNN's engine gets only the
//! workspace the op layer allocated where PyTorch's cuDNN path allocates one, and runs only
//! when its plan fits in it.
//!
//! The forward picks ([`Gpu::attention_kernel`]): dropout goes to the naive kernel (the only
//! one that draws the dropout mask); then cuDNN's engine for f16/bf16 without an additive
//! mask where it has a plan (PyTorch's own choice on sm_90, and twice the speed of our tiles
//! there), except for one to four query rows (the decode step: see [`DECODE_ROWS`]);
//! otherwise the FlashAttention-2 tiles when the call fits them (head dim 64 or 128 in
//! bf16/f16, 64 in f32, all on sm_80+; q, k, v with a unit inner stride and 16-byte aligned rows,
//! as transformers' views of a fused QKV projection or a KV cache are), decode steps
//! included (a 64-row tile with one live row still streams the cache 2 to 10 times faster
//! than `k_attn_rows` did: run r); else `k_attn_rows`, a block per query row, which takes
//! any layout and head dim.
//! The backward stays the naive pair (a thread per query row, then per key row).

use super::dnn_graph::alignment;
use super::dnn_sdpa::{SdpaPtrs, SdpaShape};
use super::{kargs, Dt, Gpu, Strided, K};
use crate::driver::CudaError;

type R = Result<(), CudaError>;

/// The largest head dim the kernels keep in registers (PyTorch's fused kernels stop at 256).
pub const ATTENTION_MAX_HEAD_DIM: i64 = 256;

/// `AttnShape` of kernels.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AttnShape {
    b: i64,
    hq: i64,
    hkv: i64,
    tq: i64,
    s: i64,
    d: i64,
    dv: i64,
}

/// Which forward kernel runs an attention call. `Auto` picks ([`Gpu::attention_kernel`]);
/// the others are for tests and benchmarks that compare the kernels on the same inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    Auto,
    /// `k_attn_fwd`: a thread per query row; the only one with dropout.
    Naive,
    /// `k_attn_rows`: a block per query row (the fallback: any head dim, layout and dtype).
    Rows,
    /// `k_flash_mma_d64/_d128` (bf16, f16) or `k_flash_f32_d64`: FlashAttention-2 tiles.
    Tiled,
    /// cuDNN's fused attention engine (bf16, f16; dnn_sdpa.rs).
    Cudnn,
}

/// Heads and batches index the grid's y and z (at most 65535 each).
fn grid_ok(s: &AttnShape) -> bool {
    s.hq <= 65535 && s.b <= 65535 && s.tq <= i32::MAX as i64
}

/// What the attention kernels compute besides their tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionSpec {
    pub scale: f64,
    pub causal: bool,
    pub dropout: f64,
    pub seed: u64,
}

/// The forward's tensors: q [B,HQ,TQ,D], k [B,HKV,S,D], v [B,HKV,S,DV], an additive mask
/// expanded to [B,HQ,TQ,S] (or [`Strided::none`]), out [B,HQ,TQ,DV], lse [B,HQ,TQ] f32 (or none).
#[derive(Debug, Clone, Copy)]
pub struct AttentionViews {
    pub q: Strided,
    pub k: Strided,
    pub v: Strided,
    pub mask: Strided,
    pub out: Strided,
    pub lse: Strided,
    /// Scratch for cuDNN's engine (0 bytes: only plans that need none run there).
    pub workspace: u64,
    pub workspace_size: u64,
}

fn shape(a: &AttentionViews) -> Result<AttnShape, CudaError> {
    for (n, t) in [("q", &a.q), ("k", &a.k), ("v", &a.v), ("out", &a.out)] {
        if t.ndim != 4 {
            return Err(CudaError::Invalid(format!(
                "attention: {n} must be 4-d, got {:?}",
                t.dims()
            )));
        }
    }
    let s = AttnShape {
        b: a.q.shape[0],
        hq: a.q.shape[1],
        hkv: a.k.shape[1],
        tq: a.q.shape[2],
        s: a.k.shape[2],
        d: a.q.shape[3],
        dv: a.v.shape[3],
    };
    if s.hkv <= 0 || s.hq % s.hkv != 0 {
        return Err(CudaError::Invalid(format!(
            "attention: {} query heads for {} key heads",
            s.hq, s.hkv
        )));
    }
    let fits = |t: &Strided, want: [i64; 4]| t.dims() == want;
    if !fits(&a.k, [s.b, s.hkv, s.s, s.d])
        || !fits(&a.v, [s.b, s.hkv, s.s, s.dv])
        || !fits(&a.out, [s.b, s.hq, s.tq, s.dv])
        || (a.mask.ptr != 0 && !fits(&a.mask, [s.b, s.hq, s.tq, s.s]))
    {
        return Err(CudaError::Invalid(format!(
            "attention: q {:?}, k {:?}, v {:?}, out {:?} and mask {:?} do not fit together",
            a.q.dims(),
            a.k.dims(),
            a.v.dims(),
            a.out.dims(),
            a.mask.dims()
        )));
    }
    if s.d > ATTENTION_MAX_HEAD_DIM || s.dv > ATTENTION_MAX_HEAD_DIM {
        return Err(CudaError::Invalid(format!(
            "attention: head dims {} / {} above {ATTENTION_MAX_HEAD_DIM}",
            s.d, s.dv
        )));
    }
    Ok(s)
}

/// Query rows up to which cuDNN's engine is not used: a decode step's key length grows by
/// one every token, and each new length would build (and cache) a plan of its own.
const DECODE_ROWS: i64 = 4;
/// Query rows per block of the tiled kernels (FM_BM and FF_BM of flash.cu).
const TILE_ROWS: i64 = 64;

/// Whether `t` can be read in `bytes`-byte vectors along its last dim: unit inner stride, the
/// first element and every row aligned (the strides of size-1 dims are never stepped).
fn rows_aligned(t: &Strided, bytes: i64) -> bool {
    let es = t.dt().size() as i64;
    t.strides[3] == 1
        && t.addr().is_multiple_of(bytes as u64)
        && (0..3).all(|d| t.shape[d] == 1 || (t.strides[d] * es) % bytes == 0)
}

/// The call as cuDNN's engine takes it: f16/bf16 throughout, no additive mask (PyTorch's
/// cuDNN path takes one, ours does not yet), unit inner strides and no broadcast
/// (zero-stride) dims. Dropout never gets here: both callers send it to the naive kernel.
fn sdpa_shape(a: &AttentionViews, s: &AttnShape, p: &AttentionSpec) -> Option<SdpaShape> {
    let dt = a.q.dt();
    let views = [&a.q, &a.k, &a.v, &a.out];
    let plain =
        |t: &Strided| t.strides[3] == 1 && (0..4).all(|d| t.shape[d] == 1 || t.strides[d] > 0);
    if !matches!(dt, Dt::BF16 | Dt::F16)
        || views.iter().any(|t| t.dt() != dt || !plain(t))
        || a.mask.ptr != 0
    {
        return None;
    }
    let st = |t: &Strided| [t.strides[0], t.strides[1], t.strides[2], t.strides[3]];
    let stats = (a.lse.ptr != 0).then(|| [a.lse.strides[0], a.lse.strides[1], a.lse.strides[2]]);
    Some(SdpaShape {
        dt,
        sizes: [s.b, s.hq, s.hkv, s.tq, s.s, s.d, s.dv],
        q: st(&a.q),
        k: st(&a.k),
        v: st(&a.v),
        o: st(&a.out),
        stats,
        causal: p.causal,
        align: [&a.q, &a.k, &a.v, &a.out, &a.lse].map(|t| alignment(t.addr())),
    })
}

impl Gpu {
    /// The kernel [`AttentionKernel::Auto`] runs for this call (see the module note).
    pub fn attention_kernel(
        &self,
        a: &AttentionViews,
        p: &AttentionSpec,
    ) -> Result<AttentionKernel, CudaError> {
        Ok(self.pick_kernel(a, &shape(a)?, p))
    }

    /// [`Gpu::attention_kernel`] for a call whose shape is already checked.
    fn pick_kernel(&self, a: &AttentionViews, s: &AttnShape, p: &AttentionSpec) -> AttentionKernel {
        if p.dropout > 0.0 || !grid_ok(s) {
            AttentionKernel::Naive
        } else if s.tq > DECODE_ROWS && self.cudnn_takes(a, s, p) {
            AttentionKernel::Cudnn
        } else if self.tiled_kernel(a, s).is_some() {
            AttentionKernel::Tiled
        } else {
            AttentionKernel::Rows
        }
    }

    /// Whether cuDNN's engine has a plan for this call within its workspace.
    fn cudnn_takes(&self, a: &AttentionViews, s: &AttnShape, p: &AttentionSpec) -> bool {
        let Some(shape) = sdpa_shape(a, s, p) else {
            return false;
        };
        self.with_dnn(|d| Ok(d.attention_workspace(&shape)))
            .ok()
            .flatten()
            .is_some_and(|w| w <= a.workspace_size)
    }

    /// The tiled kernel for this call, if one takes it.
    fn tiled_kernel(&self, a: &AttentionViews, s: &AttnShape) -> Option<(K, u32)> {
        let dt = a.q.dt();
        if [a.k.dt(), a.v.dt(), a.out.dt()].iter().any(|&d| d != dt) || s.d != s.dv {
            return None;
        }
        let picked = match (dt, s.d) {
            (Dt::F32, 64) if self.arch().0 >= 8 => (K::FlashF32D64, 128),
            (Dt::BF16 | Dt::F16, 64) if self.arch().0 >= 8 => (K::FlashMmaD64, 128),
            (Dt::BF16 | Dt::F16, 128) if self.arch().0 >= 8 => (K::FlashMmaD128, 128),
            _ => return None,
        };
        // 16-bit outputs are written in pairs (4-byte stores); f32 element by element.
        let out_ok = dt == Dt::F32 || rows_aligned(&a.out, 4);
        let in_ok = [&a.q, &a.k, &a.v].iter().all(|t| rows_aligned(t, 16));
        (in_ok && out_ok).then_some(picked)
    }

    /// `out = softmax(q k^T * scale + mask) v`, and the rows' log-sum-exp into `lse` if given.
    pub fn attention(&self, a: &AttentionViews, p: &AttentionSpec) -> R {
        self.attention_with(AttentionKernel::Auto, a, p)
    }

    /// [`Gpu::attention`] on a chosen kernel; one that cannot take the call is an error.
    pub fn attention_with(
        &self,
        kernel: AttentionKernel,
        a: &AttentionViews,
        p: &AttentionSpec,
    ) -> R {
        let s = shape(a)?;
        let kernel = match kernel {
            AttentionKernel::Auto => self.pick_kernel(a, &s, p),
            k => k,
        };
        let (has_mask, has_lse) = ((a.mask.ptr != 0) as i32, (a.lse.ptr != 0) as i32);
        let causal = p.causal as i32;
        let refuse = |why: &str| {
            Err(CudaError::Invalid(format!(
                "attention: the {kernel:?} kernel {why}"
            )))
        };
        if kernel != AttentionKernel::Naive && (p.dropout > 0.0 || !grid_ok(&s)) {
            return refuse("takes no dropout and at most 65535 heads and batches");
        }
        match kernel {
            AttentionKernel::Auto | AttentionKernel::Naive => {
                let n = s.b * s.hq * s.tq;
                self.launch1d(
                    K::AttnFwd,
                    n,
                    &mut kargs![
                        a.q, a.k, a.v, a.mask, has_mask, a.out, a.lse, has_lse, p.scale, causal,
                        p.dropout, p.seed, s
                    ],
                )
            }
            AttentionKernel::Rows => self.launch(
                K::AttnRows,
                (s.tq as u32, s.hq as u32, s.b as u32),
                (256, 1, 1),
                &mut kargs![
                    a.q, a.k, a.v, a.mask, has_mask, a.out, a.lse, has_lse, p.scale, causal, s
                ],
            ),
            AttentionKernel::Cudnn => {
                let Some(shape) = sdpa_shape(a, &s, p) else {
                    return refuse("takes f16/bf16 without a mask, with unit inner strides");
                };
                let ptrs = SdpaPtrs {
                    q: a.q.addr(),
                    k: a.k.addr(),
                    v: a.v.addr(),
                    o: a.out.addr(),
                    stats: a.lse.addr(),
                    workspace: a.workspace,
                };
                // None: it ran; else the plan's workspace, if it has a plan.
                let declined = self.with_dnn(|d| {
                    if d.attention(&shape, &ptrs, a.workspace_size, p.scale as f32)? {
                        return Ok(None);
                    }
                    Ok(Some(d.attention_workspace(&shape)))
                })?;
                match declined {
                    None => Ok(()),
                    Some(None) => refuse("has no plan for this shape and layout"),
                    Some(Some(w)) => refuse(&format!(
                        "wants {w} B of workspace, the call has {}",
                        a.workspace_size
                    )),
                }
            }
            AttentionKernel::Tiled => {
                let Some((k, threads)) = self.tiled_kernel(a, &s) else {
                    return refuse("does not take this dtype, head dim or layout");
                };
                let tiles = (s.tq + TILE_ROWS - 1) / TILE_ROWS;
                self.launch(
                    k,
                    (tiles as u32, s.hq as u32, s.b as u32),
                    (threads, 1, 1),
                    &mut kargs![
                        a.q, a.k, a.v, a.mask, has_mask, a.out, a.lse, has_lse, p.scale, causal, s
                    ],
                )
            }
        }
    }

    /// The gradients of [`Gpu::attention`]: `gq`, `gk`, `gv` (overwritten) from `gout`, the
    /// forward's `lse` and `delta` = rowsum(gout * out) [B,HQ,TQ] f32 (or none: the kernels
    /// compute it from `gout` and the forward's `out`).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        &self,
        a: &AttentionViews,
        gout: &Strided,
        delta: &Strided,
        gq: &Strided,
        gk: &Strided,
        gv: &Strided,
        p: &AttentionSpec,
    ) -> R {
        let s = shape(a)?;
        if a.lse.ptr == 0 {
            return Err(CudaError::Invalid(
                "attention backward: the forward's logsumexp is required".into(),
            ));
        }
        let has_mask = (a.mask.ptr != 0) as i32;
        let causal = p.causal as i32;
        self.launch1d(
            K::AttnBwdQ,
            s.b * s.hq * s.tq,
            &mut kargs![
                a.q, a.k, a.v, a.mask, has_mask, a.lse, *gout, *delta, a.out, *gq, p.scale, causal,
                p.dropout, p.seed, s
            ],
        )?;
        self.launch1d(
            K::AttnBwdKv,
            s.b * s.hkv * s.s,
            &mut kargs![
                a.q, a.k, a.v, a.mask, has_mask, a.lse, *gout, *delta, a.out, *gk, *gv, p.scale,
                causal, p.dropout, p.seed, s
            ],
        )
    }
}
