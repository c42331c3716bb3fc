//! Host side of the fused attention kernels of kernels.cu (`k_attn_fwd`, `k_attn_bwd_q`,
//! `k_attn_bwd_kv`).
//!
//! Design note: the kernels compute what PyTorch's flash / memory-efficient / cuDNN attention
//! computes, but they are written for correctness, not speed (a thread per query or key
//! row, scores recomputed on the fly). Every buffer they touch was allocated by the tensor
//! runtime's op layer the way PyTorch's chosen kernel allocates it, so memory matches PyTorch
//! whatever the kernel's speed; they need no scratch memory of their own.

use super::{kargs, Gpu, Strided, K};
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
    if s.d > ATTENTION_MAX_HEAD_DIM || s.dv > ATTENTION_MAX_HEAD_DIM {
        return Err(CudaError::Invalid(format!(
            "attention: head dims {} / {} above {ATTENTION_MAX_HEAD_DIM}",
            s.d, s.dv
        )));
    }
    Ok(s)
}

impl Gpu {
    /// `out = softmax(q k^T * scale + mask) v`, and the rows' log-sum-exp into `lse` if given.
    pub fn attention(&self, a: &AttentionViews, p: &AttentionSpec) -> R {
        let s = shape(a)?;
        let (has_mask, has_lse) = ((a.mask.ptr != 0) as i32, (a.lse.ptr != 0) as i32);
        let (causal, n) = (p.causal as i32, s.b * s.hq * s.tq);
        self.launch1d(
            K::AttnFwd,
            n,
            &mut kargs![
                a.q, a.k, a.v, a.mask, has_mask, a.out, a.lse, has_lse, p.scale, causal, p.dropout,
                p.seed, s
            ],
        )
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
