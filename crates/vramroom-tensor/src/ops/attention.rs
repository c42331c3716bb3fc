//! `F.scaled_dot_product_attention` as PyTorch 2.11 runs it on an H200 (CUDA 13, cuDNN 9).
//!
//! Design note — which kernel. PyTorch picks one of four backends per call
//! ([`sdpa_backend`]); what each allocates was read out of the recorded snapshots of
//! transformers 5.17 models (`scripts/hf_memory.py`), and that is what this op allocates:
//! - **cuDNN** (f16/bf16; on sm90 with cuDNN > 9.15 it comes first in PyTorch's priority
//!   order, ahead of flash): a device seed and offset (8 bytes each), the output, with grad
//!   the softmax stats [B, H, T, 1] f32, and a 256-byte workspace freed right away.
//! - **flash** (f16/bf16 where cuDNN declines: a key length of 1): the output, logsumexp
//!   [B, H, T] f32 and a 16-byte RNG state (freed without grad).
//! - **memory-efficient** (f32 and the rest, when query and key heads match): the output,
//!   and with grad the logsumexp [B, H, ceil32(T)] f32; seed and offset live on the host.
//! - **math** (f32 with grouped-query heads: PyTorch 2.11's memory-efficient kernel takes
//!   `enable_gqa` only for matching head counts): the composite, op by op, as
//!   `_scaled_dot_product_attention_math` runs it — q scaled by sqrt(scale), the causal
//!   mask materialised (ones, tril, where: [T, S] in the query dtype), key and value
//!   repeated to the query heads, the scaled key transposed, the batched matmul's copy of a
//!   q that does not fold to [B*H, T, D] (rotary outputs are laid out [B, T, H, D]), the
//!   scores [B, H, T, S], `_safe_softmax` (softmax plus its masked-row check: a
//!   [B, H, T, S] bool and a [B, H, T, 1] bool), the output matmul. With grad, autograd
//!   saves what those ops save.
//!
//! The three fused kernels write their output in [B, T, H, D] memory order, so transformers'
//! `transpose(1, 2).contiguous()` after them copies nothing; the math path's [B, H, T, D]
//! output is copied there.
//!
//! The fused backends compute on [`crate::backend::Backend::attention`] (the cpu backend in
//! f64, the cuda backend on cuDNN's engine or its own kernels, vramroom-cuda's
//! `compute/attention.rs`); their backward recomputes the weights from the
//! logsumexp. The memory-efficient backward allocates like PyTorch's: grad q, k, v, then
//! `delta = (grad_out * out).sum(-1)` through a product [B, T, H, D] and a sum [B, T, H]
//! copied to [B, H, T], then the kernel's f32 workspace (a grad-q accumulator of
//! ceil64(T) x ceil64(D) per batch and head, plus 16 bytes per 64 queries; measured for f32
//! on GPT-2 and BERT). The cuDNN and flash backwards are not in the recorded corpus (every
//! bf16 scenario there is inference); they allocate what their sources allocate (gradients,
//! flash's `softmax_d` and f32 `dq_accum`), which is an estimate.
//!
//! Masks: an additive float mask or a boolean one (true = attend, converted to 0 / -inf as
//! PyTorch's `convert_boolean_attn_mask` does). The fused kernels read it broadcast; the
//! padding copy PyTorch's memory-efficient kernel makes of an unaligned mask is not modelled.

use super::*;
use crate::autograd::Saved;
use crate::backend::{AttentionArgs, AttentionGradArgs, AttentionParams, BinaryOp, Workspace};
use crate::layout::Layout;

/// Bytes of the workspace PyTorch's cuDNN attention forward allocates (recorded snapshots).
const CUDNN_WORKSPACE: usize = 256;

/// The kernel PyTorch's dispatcher picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SdpaBackend {
    Cudnn,
    Flash,
    Efficient,
    Math,
}

/// The optional arguments of `scaled_dot_product_attention`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SdpaArgs<'a> {
    /// Additive float mask, or bool (true: attend), broadcastable to [B, Hq, T, S].
    pub attn_mask: Option<&'a Tensor>,
    pub dropout_p: f64,
    /// Top-left causal mask (query `i` sees keys `0..=i`).
    pub is_causal: bool,
    /// Defaults to `1 / sqrt(head_dim)`.
    pub scale: Option<f64>,
    /// Query heads may be a multiple of key heads (grouped-query attention).
    pub enable_gqa: bool,
}

#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    hq: usize,
    hkv: usize,
    t: usize,
    s: usize,
    d: usize,
    dv: usize,
}

const OP: &str = "scaled_dot_product_attention";

fn check(q: &Tensor, k: &Tensor, v: &Tensor, a: &SdpaArgs) -> Result<Dims> {
    for t in [q, k, v] {
        need_ndim(t, 4, OP)?;
        need_float(t, OP)?;
        same_device(q, t, OP)?;
        same_dtype(q, t, OP)?;
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let dm = Dims {
        b: qs[0],
        hq: qs[1],
        hkv: ks[1],
        t: qs[2],
        s: ks[2],
        d: qs[3],
        dv: vs[3],
    };
    if ks[0] != dm.b || vs[0] != dm.b || vs[1] != dm.hkv || vs[2] != dm.s || ks[3] != dm.d {
        return Err(TensorError::shape(
            OP,
            format!("query {qs:?}, key {ks:?} and value {vs:?} do not fit together"),
        ));
    }
    if dm.hkv == 0 || dm.hq != dm.hkv && (!a.enable_gqa || !dm.hq.is_multiple_of(dm.hkv)) {
        return Err(TensorError::shape(
            OP,
            format!(
                "{} query heads for {} key heads (grouped-query attention needs enable_gqa and a multiple)",
                dm.hq, dm.hkv
            ),
        ));
    }
    if !(0.0..1.0).contains(&a.dropout_p) {
        return Err(TensorError::invalid(
            OP,
            format!("dropout_p must be in [0, 1), got {}", a.dropout_p),
        ));
    }
    if a.is_causal && a.attn_mask.is_some() {
        return Err(TensorError::invalid(
            OP,
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True",
        ));
    }
    if let Some(m) = a.attn_mask {
        same_device(q, m, OP)?;
        m.layout().expand(&[dm.b, dm.hq, dm.t, dm.s]).map_err(|_| {
            TensorError::shape(
                OP,
                format!(
                    "attn_mask {:?} does not broadcast to {:?}",
                    m.shape(),
                    [dm.b, dm.hq, dm.t, dm.s]
                ),
            )
        })?;
        if m.dtype() != DType::Bool && m.dtype() != q.dtype() && m.dtype() != DType::F32 {
            return Err(TensorError::DTypeMismatch {
                op: OP,
                expected: q.dtype(),
                got: m.dtype(),
            });
        }
    }
    Ok(dm)
}

/// The backend PyTorch 2.11 chooses on an H200 for these inputs (see the module note).
pub fn sdpa_backend(q: &Tensor, k: &Tensor, v: &Tensor, a: &SdpaArgs) -> Result<SdpaBackend> {
    let dm = check(q, k, v, a)?;
    let low = matches!(q.dtype(), DType::BF16 | DType::F16);
    let dims_ok = |m: usize| dm.d.is_multiple_of(m) && dm.dv.is_multiple_of(m);
    if low {
        // Dropout keeps cuDNN out only under deterministic algorithms (PyTorch's
        // check_cudnn_deterministic), which the runtime does not offer: DistilBERT's dropout
        // 0.1 ran on cuDNN in the trace corpus (device run 18).
        if dm.s > 1 && dims_ok(8) && dm.d <= 256 && dm.dv <= 256 {
            return Ok(SdpaBackend::Cudnn);
        }
        let causal_square = !a.is_causal || dm.t == dm.s;
        if a.attn_mask.is_none() && dm.d == dm.dv && dm.d <= 256 && causal_square {
            return Ok(SdpaBackend::Flash);
        }
    }
    // Memory-efficient: matching head counts, head dims aligned (4 elements in f32, 8 in
    // 16-bit types), and element offsets aligned to the same.
    let align = if low { 8 } else { 4 };
    let aligned = [q, k, v].iter().all(|t| t.offset().is_multiple_of(align));
    if dm.hq == dm.hkv && dims_ok(align) && aligned {
        return Ok(SdpaBackend::Efficient);
    }
    Ok(SdpaBackend::Math)
}

/// `F.scaled_dot_product_attention(q, k, v, ...)`: q [B, Hq, T, D], k [B, Hkv, S, D],
/// v [B, Hkv, S, Dv] → [B, Hq, T, Dv], allocating as the backend PyTorch picks would.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    a: &SdpaArgs,
) -> Result<Tensor> {
    let dm = check(q, k, v, a)?;
    let scale = a.scale.unwrap_or(1.0 / (dm.d as f64).sqrt());
    match sdpa_backend(q, k, v, a)? {
        SdpaBackend::Math => math(q, k, v, a, &dm, scale),
        fused => {
            let mask = match a.attn_mask {
                Some(m) if m.dtype() == DType::Bool => Some(bool_mask_to_float(m, q.dtype())?),
                Some(m) => Some(m.clone()),
                None => None,
            };
            Fused {
                backend: fused,
                dims: dm,
                params: AttentionParams {
                    scale,
                    causal: a.is_causal,
                    dropout: a.dropout_p,
                    seed: if a.dropout_p > 0.0 {
                        q.device().next_seed()
                    } else {
                        0
                    },
                },
            }
            .forward(q, k, v, mask)
        }
    }
}

/// `convert_boolean_attn_mask`: true (attend) → 0, false → -inf, in `dtype`.
fn bool_mask_to_float(m: &Tensor, dtype: DType) -> Result<Tensor> {
    let _g = autograd::no_grad();
    let zeros = Tensor::zeros(m.shape(), dtype, m.device())?;
    // `~mask`: ones where the mask is false (one bool tensor, as logical_not's output).
    let not = Tensor::ones(m.shape(), DType::Bool, m.device())?.masked_fill(m, 0.0)?;
    zeros.masked_fill(&not, f64::NEG_INFINITY)
}

/// A fresh [B, H, T, D] tensor laid out [B, T, H, D] in memory.
fn empty_bthd(sh: [usize; 4], dtype: DType, dev: &crate::device::Device) -> Result<Tensor> {
    let l = Layout::contiguous(&[sh[0], sh[2], sh[1], sh[3]]).permute(&[0, 2, 1, 3])?;
    Tensor::empty_dense(l, dtype, dev)
}

#[derive(Clone, Copy)]
struct Fused {
    backend: SdpaBackend,
    dims: Dims,
    params: AttentionParams,
}

impl Fused {
    fn forward(self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<Tensor>) -> Result<Tensor> {
        let dm = self.dims;
        let dev = q.device();
        let grad = autograd::should_record(&[q, k, v]);
        let osh = [dm.b, dm.hq, dm.t, dm.dv];
        // Allocations in the chosen kernel's order.
        let mut rng: Vec<Tensor> = Vec::new();
        let (out, lse) = match self.backend {
            SdpaBackend::Cudnn => {
                rng.push(Tensor::empty(&[1], DType::I64, dev)?);
                rng.push(Tensor::empty(&[1], DType::I64, dev)?);
                let out = empty_bthd(osh, q.dtype(), dev)?;
                let lse = if grad {
                    Some(Tensor::empty(&[dm.b, dm.hq, dm.t, 1], DType::F32, dev)?.squeeze_dim(3)?)
                } else {
                    None
                };
                (out, lse)
            }
            SdpaBackend::Flash => {
                let out = empty_bthd(osh, q.dtype(), dev)?;
                let lse = Tensor::empty(&[dm.b, dm.hq, dm.t], DType::F32, dev)?;
                rng.push(Tensor::empty(&[2], DType::I64, dev)?);
                (out, Some(lse))
            }
            _ => {
                let out = empty_bthd(osh, q.dtype(), dev)?;
                let lse = if grad {
                    let padded = dm.t.div_ceil(32) * 32;
                    let l = Tensor::empty(&[dm.b, dm.hq, padded], DType::F32, dev)?;
                    Some(l.with_layout(l.layout().narrow(2, 0, dm.t)?))
                } else {
                    None
                };
                (out, lse)
            }
        };
        let ml = match &mask {
            Some(m) => Some(m.layout().expand(&[dm.b, dm.hq, dm.t, dm.s])?),
            None => None,
        };
        // cuDNN's workspace: allocated after the outputs, freed right after the kernel.
        let ws = match self.backend {
            SdpaBackend::Cudnn => Some(Tensor::empty(&[CUDNN_WORKSPACE], DType::U8, dev)?),
            _ => None,
        };
        let args = AttentionArgs {
            q: q.kref(),
            k: k.kref(),
            v: v.kref(),
            mask: match (&mask, &ml) {
                (Some(m), Some(l)) => Some(m.kref_as(l)),
                _ => None,
            },
            out: out.kref(),
            lse: lse.as_ref().map(|l| l.kref()),
            workspace: ws.as_ref().map_or(Workspace::default(), |w| Workspace {
                ptr: w.storage().ptr(),
                size: CUDNN_WORKSPACE as u64,
            }),
        };
        dev.backend().attention(&args, &self.params)?;
        drop(ws);
        if !grad {
            // Without a backward the statistics and the RNG state die with the call.
            drop((lse, rng));
            return Ok(out);
        }
        let saved = [q, k, v, &out].map(Saved::new);
        let s_lse = lse.as_ref().map(Saved::new);
        let s_mask = mask.as_ref().map(Saved::new);
        let s_rng: Vec<Saved> = rng.iter().map(Saved::new).collect();
        drop((lse, rng));
        let name = match self.backend {
            SdpaBackend::Cudnn => "ScaledDotProductCudnnAttentionBackward0",
            SdpaBackend::Flash => "ScaledDotProductFlashAttentionBackward0",
            _ => "ScaledDotProductEfficientAttentionBackward0",
        };
        record(
            name,
            &[Some(q), Some(k), Some(v)],
            &[&out],
            move |g, needs| {
                let _keep = &s_rng;
                let gout = grad0(g, name)?;
                let [sq, sk, sv, so] = &saved;
                let lse = match &s_lse {
                    Some(l) => Some(l.get(name)?),
                    None => None,
                };
                let mask = match &s_mask {
                    Some(m) => Some(m.get(name)?),
                    None => None,
                };
                self.backward(
                    &gout,
                    [sq.get(name)?, sk.get(name)?, sv.get(name)?, so.get(name)?],
                    lse,
                    mask,
                    needs,
                )
            },
        );
        Ok(out)
    }

    fn backward(
        &self,
        gout: &Tensor,
        [q, k, v, out]: [&Tensor; 4],
        lse: Option<&Tensor>,
        mask: Option<&Tensor>,
        needs: &[bool],
    ) -> Result<Vec<Option<Tensor>>> {
        let dm = self.dims;
        let dev = q.device();
        let qsh = [dm.b, dm.hq, dm.t, dm.d];
        let ksh = [dm.b, dm.hkv, dm.s, dm.d];
        let vsh = [dm.b, dm.hkv, dm.s, dm.dv];
        let (gq, gk, gv) = if self.backend == SdpaBackend::Cudnn {
            (
                Tensor::empty(&qsh, q.dtype(), dev)?,
                Tensor::empty(&ksh, q.dtype(), dev)?,
                Tensor::empty(&vsh, q.dtype(), dev)?,
            )
        } else {
            (
                empty_bthd(qsh, q.dtype(), dev)?,
                empty_bthd(ksh, q.dtype(), dev)?,
                empty_bthd(vsh, q.dtype(), dev)?,
            )
        };
        // Kernel scratch PyTorch takes from the caching allocator, alive during the kernel.
        let mut scratch: Vec<Tensor> = Vec::new();
        let delta = match self.backend {
            SdpaBackend::Efficient => {
                // `(grad_out.float() * out.float()).sum(-1)`, in [B, T, H] order, then
                // transposed to [B, H, T] contiguous.
                let (g_t, o_t) = (gout.transpose(1, 2)?, out.transpose(1, 2)?);
                let (g_f, o_f) = (g_t.to_dtype(DType::F32)?, o_t.to_dtype(DType::F32)?);
                let prod = g_f.mul(&o_f)?;
                let sum = prod.sum_dim(-1, false)?;
                let delta = sum.transpose(1, 2)?.contiguous()?;
                drop((sum, prod, g_f, o_f));
                let blocks = dm.t.div_ceil(64);
                let per_bh = blocks * 64 * dm.d.div_ceil(64) * 64 * 4 + blocks * 16;
                scratch.push(Tensor::empty(&[dm.b * dm.hq * per_bh], DType::U8, dev)?);
                Some(delta)
            }
            SdpaBackend::Flash => {
                let t128 = dm.t.div_ceil(128) * 128;
                scratch.push(Tensor::empty(&[dm.b, dm.hq, t128], DType::F32, dev)?);
                let d32 = dm.d.div_ceil(32) * 32;
                scratch.push(Tensor::empty(&[dm.b, t128, dm.hq, d32], DType::F32, dev)?);
                if dm.hq != dm.hkv {
                    // dk, dv over all query heads, summed to the key heads afterwards.
                    scratch.push(empty_bthd([dm.b, dm.hq, dm.s, dm.d], q.dtype(), dev)?);
                    scratch.push(empty_bthd([dm.b, dm.hq, dm.s, dm.dv], q.dtype(), dev)?);
                }
                None
            }
            _ => {
                // cuDNN's SDPA backward workspace (measured, H100: DistilBERT and Llama GQA in
                // bf16): the f32 dQ accumulator and softmax sums, plus, with grouped heads,
                // dK and dV over all query heads before they are summed, and 256 bytes.
                let mut n = dm.b * dm.hq * dm.t * (4 * dm.d + 4) + 256;
                if dm.hq != dm.hkv {
                    n += dm.b * dm.hq * dm.s * (dm.d + dm.dv) * q.dtype().size();
                }
                scratch.push(Tensor::empty(&[n], DType::U8, dev)?);
                None
            }
        };
        let ml = match mask {
            Some(m) => Some(m.layout().expand(&[dm.b, dm.hq, dm.t, dm.s])?),
            None => None,
        };
        let args = AttentionGradArgs {
            fwd: AttentionArgs {
                q: q.kref(),
                k: k.kref(),
                v: v.kref(),
                mask: match (mask, &ml) {
                    (Some(m), Some(l)) => Some(m.kref_as(l)),
                    _ => None,
                },
                out: out.kref(),
                lse: lse.map(|l| l.kref()),
                workspace: Workspace::default(),
            },
            gout: gout.kref(),
            delta: delta.as_ref().map(|d| d.kref()),
            gq: gq.kref(),
            gk: gk.kref(),
            gv: gv.kref(),
        };
        dev.backend().attention_backward(&args, &self.params)?;
        drop(delta);
        drop(scratch);
        Ok(vec![
            needs[0].then_some(gq),
            needs[1].then_some(gk),
            needs[2].then_some(gv),
        ])
    }
}

/// `attn += mask` in place, keeping autograd's history (the gradient passes through).
fn add_mask_(attn: &Tensor, mask: &Tensor) -> Result<()> {
    let record_it = autograd::should_record(&[attn]);
    let prev = attn.detach();
    if record_it {
        prev.set_edge(attn.edge());
    }
    let ml = mask.layout().expand(attn.shape())?;
    attn.device().backend().binary(
        BinaryOp::Add { alpha: 1.0 },
        attn.kref(),
        mask.kref_as(&ml),
        attn.kref(),
    )?;
    attn.storage().bump_version();
    if record_it {
        record("AddBackward0", &[Some(&prev)], &[attn], move |g, _| {
            Ok(vec![Some(grad0(g, "AddBackward0")?)])
        });
    }
    Ok(())
}

/// `x.repeat_interleave(n, dim=1)` of a [B, H, S, D] tensor: one copy [B, H*n, S, D].
fn repeat_heads(x: &Tensor, n: usize) -> Result<Tensor> {
    let sh = x.shape().to_vec();
    x.unsqueeze(2)?
        .expand(&[sh[0], sh[1], n, sh[2], sh[3]])?
        .contiguous()?
        .reshape(&[sh[0], sh[1] * n, sh[2], sh[3]])
}

/// The causal mask `where(ones(T, S).tril(), 0, -inf)` in `dtype`, allocated as PyTorch does
/// (the ones, the tril, two scalar tensors, the result; the temporaries freed).
fn causal_float_mask(
    t: usize,
    s: usize,
    dtype: DType,
    dev: &crate::device::Device,
) -> Result<Tensor> {
    let _g = autograd::no_grad();
    let ones = Tensor::ones(&[t, s], DType::Bool, dev)?;
    let tril = Tensor::empty(&[t, s], DType::Bool, dev)?;
    dev.backend().tril_fill(tril.kref(), 1.0, 0.0)?;
    drop(ones);
    let zero = Tensor::scalar(0.0, DType::F32, dev)?;
    let ninf = Tensor::scalar(f64::NEG_INFINITY, DType::F32, dev)?;
    // Filled on the device: built on the host, the [T, S] values and their upload cost
    // about a millisecond per layer, which left Llama's f32 forward host-bound.
    let mask = Tensor::empty(&[t, s], dtype, dev)?;
    dev.backend()
        .tril_fill(mask.kref(), 0.0, f64::NEG_INFINITY)?;
    drop((ninf, zero, tril));
    Ok(mask)
}

/// `_scaled_dot_product_attention_math`, op for op (see the module note).
fn math(q: &Tensor, k: &Tensor, v: &Tensor, a: &SdpaArgs, dm: &Dims, scale: f64) -> Result<Tensor> {
    let dev = q.device();
    let sf = scale.sqrt();
    let q_s = q.mul_scalar(sf)?;
    let mask = if a.is_causal {
        Some(causal_float_mask(dm.t, dm.s, q.dtype(), dev)?)
    } else {
        match a.attn_mask {
            Some(m) if m.dtype() == DType::Bool => Some(bool_mask_to_float(m, q.dtype())?),
            Some(m) => Some(m.clone()),
            None => None,
        }
    };
    let (k_e, v_e) = if dm.hq != dm.hkv {
        let n = dm.hq / dm.hkv;
        (repeat_heads(k, n)?, repeat_heads(v, n)?)
    } else {
        (k.clone(), v.clone())
    };
    // `at::matmul(query, key.transpose(-2, -1) * scaling_factor)`: the batched matmul
    // reshapes q to [B*H, T, D], which copies a q laid out [B, T, H, D] (rotary outputs are);
    // the scaled key, transposed-contiguous, folds without a copy.
    let kt = k_e.transpose(-2, -1)?.mul_scalar(sf)?;
    let attn = q_s.matmul(&kt)?;
    drop(kt);
    if let Some(m) = &mask {
        add_mask_(&attn, m)?;
    }
    let probs = attn.softmax(-1)?;
    {
        // `_safe_softmax`'s check for rows that are all -inf: `self == -inf` over the
        // scores, `.all(-1, keepdim)`, a zero scalar. Such rows cannot occur with a causal
        // mask or none; with a user mask they come out as softmax's NaN, not 0.
        let _g = autograd::no_grad();
        let eq = Tensor::empty(attn.shape(), DType::Bool, dev)?;
        let mut rows = attn.shape().to_vec();
        rows[3] = 1;
        let all = Tensor::empty(&rows, DType::Bool, dev)?;
        let zero = Tensor::scalar(0.0, q.dtype(), dev)?;
        drop((zero, all, eq));
    }
    drop(attn);
    let out = probs.matmul(&v_e)?;
    drop((k_e, v_e, q_s, mask, probs));
    Ok(out)
}
