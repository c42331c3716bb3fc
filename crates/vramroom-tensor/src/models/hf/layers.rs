//! The pieces transformers writes in Python, composed from the runtime's ops statement by
//! statement: RMSNorm, rotary embeddings, `rotate_half`, `NewGELUActivation`, SwiGLU, HF's
//! `Conv1D`, and the SDPA attention interface.
//!
//! Design note: in PyTorch each Python operator is one kernel and one output allocation,
//! and a temporary dies when the statement (or the function) that holds it ends. Writing the
//! same expressions with the same evaluation order and dropping the Rust values where
//! Python drops its references therefore reproduces PyTorch's allocation sequence, on the
//! meta device as on cpu and cuda. Comments quote the Python line each block mirrors.

use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{self, SdpaArgs};
use crate::tensor::Tensor;

use super::config::Activation;

/// `LlamaRMSNorm.forward`.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let input_dtype = x.dtype();
    // hidden_states = hidden_states.to(torch.float32)
    let h32 = x.to_dtype(DType::F32)?;
    // variance = hidden_states.pow(2).mean(-1, keepdim=True)
    let last = h32.ndim() - 1;
    let variance = h32.pow_scalar(2.0)?.mean_dims(&[last], true)?;
    // hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    let h = {
        let r = variance.add_scalar(eps)?.rsqrt()?;
        h32.mul(&r)?
    };
    drop(h32);
    // return self.weight * hidden_states.to(input_dtype)
    let hc = h.to_dtype(input_dtype)?;
    let out = weight.mul(&hc)?;
    drop((hc, h, variance));
    Ok(out)
}

/// `LlamaRotaryEmbedding.forward` (under `torch.no_grad()`): cos and sin [B, T, D] in
/// `x_dtype` for int64 `position_ids` [B, T]. `inv_freq` is the model's buffer (cast to the
/// model dtype by `.to(dtype)`, as transformers' is).
pub(crate) fn rotary(
    inv_freq: &Tensor,
    position_ids: &Tensor,
    x_dtype: DType,
) -> Result<(Tensor, Tensor)> {
    let _g = no_grad();
    let half = inv_freq.numel();
    let bsz = position_ids.shape()[0];
    // inv_freq_expanded = self.inv_freq[None, :, None].expand(B, -1, 1).to(dtype=torch.float)
    let ife = inv_freq
        .reshape(&[1, half, 1])?
        .expand(&[bsz, half, 1])?
        .to_dtype(DType::F32)?;
    // position_ids_expanded = position_ids[:, None, :].float()
    let pe = position_ids.unsqueeze(1)?.to_dtype(DType::F32)?;
    // freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    let freqs = ife.matmul(&pe)?.transpose(1, 2)?;
    // emb = torch.cat((freqs, freqs), dim=-1)
    let emb = Tensor::cat(&[&freqs, &freqs], -1)?;
    // cos = emb.cos() * self.attention_scaling ; sin likewise (default RoPE: scaling 1.0)
    let cos = emb.cos()?.mul_scalar(1.0)?;
    let sin = emb.sin()?.mul_scalar(1.0)?;
    // return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)
    let out = (cos.to_dtype(x_dtype)?, sin.to_dtype(x_dtype)?);
    drop((ife, pe, freqs, emb, cos, sin));
    Ok(out)
}

/// `rotate_half`: `torch.cat((-x2, x1), dim=-1)` of the two halves of the last dim.
fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let d = x.shape()[x.ndim() - 1];
    let x1 = x.narrow(-1, 0, d / 2)?;
    let x2 = x.narrow(-1, d / 2, d - d / 2)?;
    let neg = x2.neg()?;
    Tensor::cat(&[&neg, &x1], -1)
}

/// `apply_rotary_pos_emb(q, k, cos, sin)`: `(q * cos) + (rotate_half(q) * sin)` and the same
/// for k, with cos/sin unsqueezed at dim 1.
pub(crate) fn apply_rotary(
    q: &Tensor,
    k: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (cos, sin) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
    let one = |x: &Tensor| -> Result<Tensor> {
        let a = x.mul(&cos)?;
        let b = rotate_half(x)?.mul(&sin)?;
        let r = a.add(&b)?;
        // Python drops a sum's left operand first.
        drop((a, b));
        Ok(r)
    };
    Ok((one(q)?, one(k)?))
}

/// `NewGELUActivation`: `0.5 * x * (1.0 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3.0))))`,
/// eight kernels in Python's evaluation order.
fn gelu_new(x: &Tensor) -> Result<Tensor> {
    let a = x.mul_scalar(0.5)?;
    let inner = {
        let q = x.pow_scalar(3.0)?.mul_scalar(0.044715)?;
        x.add(&q)?
    };
    let s = inner.mul_scalar((2.0 / std::f64::consts::PI).sqrt())?;
    drop(inner);
    let t = s.tanh()?;
    drop(s);
    let u = t.add_scalar(1.0)?;
    drop(t);
    a.mul(&u)
}

/// `ACT2FN[name](x)`.
pub(crate) fn activation(x: &Tensor, act: Activation) -> Result<Tensor> {
    match act {
        Activation::GeluNew => gelu_new(x),
        Activation::Gelu => x.gelu(false),
        Activation::GeluTanh => x.gelu(true),
        Activation::Relu => x.relu(),
        Activation::Silu => x.silu(),
    }
}

/// HF's `Conv1D`: `addmm(bias, x.view(-1, nx), weight).view(..., nf)`; weight [nx, nf].
pub(crate) fn conv1d(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let (nx, nf) = (weight.shape()[0], weight.shape()[1]);
    let mut out_shape = x.shape().to_vec();
    let last = out_shape.len() - 1;
    out_shape[last] = nf;
    let x2 = x.reshape(&[x.numel() / nx.max(1), nx])?;
    Tensor::addmm(bias, &x2, weight)?.reshape(&out_shape)
}

/// Arguments of transformers' `sdpa_attention_forward`.
pub(crate) struct AttnCall<'a> {
    pub mask: Option<&'a Tensor>,
    pub dropout: f64,
    pub scaling: f64,
    /// `module.num_key_value_groups` (query heads per key head).
    pub kv_groups: usize,
    /// `module.is_causal` (decoders; BERT's encoder is not).
    pub causal: bool,
}

/// `sdpa_attention_forward(module, q, k, v, mask, dropout, scaling)` → [B, T, H, D]
/// contiguous (the transpose(1, 2).contiguous() at its end).
pub(crate) fn sdpa_attention(q: &Tensor, k: &Tensor, v: &Tensor, c: &AttnCall) -> Result<Tensor> {
    let (mut k, mut v) = (k.clone(), v.clone());
    let mut enable_gqa = false;
    if c.kv_groups > 1 {
        // use_gqa_in_sdpa: no mask and head dims <= 256, else repeat_kv.
        if c.mask.is_none() && k.shape()[3] == v.shape()[3] && k.shape()[3] <= 256 {
            enable_gqa = true;
        } else {
            k = repeat_kv(&k, c.kv_groups)?;
            v = repeat_kv(&v, c.kv_groups)?;
        }
    }
    let (q_len, kv_len) = (q.shape()[2], k.shape()[2]);
    let is_causal = q_len > 1 && c.mask.is_none() && c.causal;
    if is_causal && kv_len > q_len {
        // A static cache's prefill: keep only the filled part, so flash/cuDNN can run.
        k = k.narrow(2, 0, q_len)?;
        v = v.narrow(2, 0, q_len)?;
    }
    let out = ops::scaled_dot_product_attention(
        q,
        &k,
        &v,
        &SdpaArgs {
            attn_mask: c.mask,
            dropout_p: c.dropout,
            is_causal,
            scale: Some(c.scaling),
            enable_gqa,
        },
    )?;
    out.transpose(1, 2)?.contiguous()
}

/// `repeat_kv`: `x[:, :, None].expand(B, H, n, S, D).reshape(B, H * n, S, D)` (one copy).
fn repeat_kv(x: &Tensor, n: usize) -> Result<Tensor> {
    let s = x.shape().to_vec();
    x.unsqueeze(2)?
        .expand(&[s[0], s[1], n, s[2], s[3]])?
        .reshape(&[s[0], s[1] * n, s[2], s[3]])
}

/// `torch.arange(n) + offset` as int64 (two allocations, the first freed), unsqueezed to
/// [1, n]: the position ids a decoder computes when none are given.
pub(crate) fn position_ids(n: usize, offset: usize, dev: &crate::device::Device) -> Result<Tensor> {
    let _g = no_grad();
    let a = Tensor::arange(n, DType::I64, dev)?;
    let p = a.map_no_grad(crate::backend::UnaryOp::AddScalar(offset as f64))?;
    drop(a);
    p.unsqueeze(0)
}
