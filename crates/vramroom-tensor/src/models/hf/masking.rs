//! transformers' mask creation (`masking_utils.create_causal_mask` /
//! `create_bidirectional_mask`) for the SDPA implementation, as it allocates.
//!
//! Design note: for unpadded batches transformers ends up passing no mask at all (SDPA's
//! `is_causal`, or nothing for BERT), but it finds that out with small tensors first: the
//! packed-sequence check on the position ids when there is neither a cache nor a mask, the
//! 2-d mask cast to bool and `fast_all` (`sum() == numel`) when there is a mask. Those
//! checks cannot change the answer for the inputs this runtime builds (position ids
//! `0..T`, all-ones masks), so their tensors are allocated and freed in PyTorch's order
//! without computing values; what must be computed (a static cache's decode mask) is. A
//! padded batch (a mask with zeros) is not supported here.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// An allocation standing in for a bookkeeping tensor whose value is never read.
fn shadow(shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    Tensor::empty(shape, dtype, dev)
}

/// `find_packed_sequence_indices(position_ids)` for [B, T] positions `0..T` (no packing):
/// its allocations, and `None`.
fn packed_sequence_check(b: usize, t: usize, dev: &Device) -> Result<()> {
    // first_dummy_value = position_ids[:, :1] - 1
    let first = shadow(&[b, 1], DType::I64, dev)?;
    // position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
    let cat = shadow(&[b, t + 1], DType::I64, dev)?;
    let diff = shadow(&[b, t], DType::I64, dev)?;
    drop(cat);
    // packed_sequence_mask = (position_diff != 1).cumsum(-1)
    let ne = shadow(&[b, t], DType::Bool, dev)?;
    let cumsum = shadow(&[b, t], DType::I64, dev)?;
    drop(shadow(&[b, t], DType::I64, dev)?);
    drop(ne);
    // (packed_sequence_mask[:, -1] == 0).all()
    let eq = shadow(&[b], DType::Bool, dev)?;
    let all = shadow(&[], DType::Bool, dev)?;
    drop((eq, all));
    drop((first, diff, cumsum));
    Ok(())
}

/// `fast_all(mask)`: `mask.sum() == mask.numel()` and its `.item()`.
fn fast_all_check(dev: &Device) -> Result<()> {
    let s = shadow(&[], DType::I64, dev)?;
    let e = shadow(&[], DType::Bool, dev)?;
    drop((s, e));
    Ok(())
}

/// What a causal decoder is called with.
pub(crate) struct CausalMaskArgs<'a> {
    pub batch: usize,
    pub q_len: usize,
    /// Tokens already in the cache, when there is a cache.
    pub cache: Option<CacheKind>,
    /// The 2-d all-ones `attention_mask` generate passes, [B, past + q_len].
    pub attention_mask: Option<&'a Tensor>,
}

/// The kind and fill of the cache a forward runs with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CacheKind {
    /// A `DynamicCache` (whatever it holds, the mask is skipped).
    Dynamic,
    /// A `StaticCache` of `max_len` slots, `past` filled.
    Static { past: usize, max_len: usize },
}

/// `create_causal_mask(...)` under SDPA: `None` (SDPA's `is_causal` or no mask) for every
/// case but a static cache's decode step, which gets a bool mask [B, 1, q_len, max_len]
/// (true: attend).
pub(crate) fn causal_mask(a: &CausalMaskArgs, dev: &Device) -> Result<Option<Tensor>> {
    let _g = crate::autograd::no_grad();
    let Some(mask2d) = a.attention_mask else {
        if a.cache.is_none() {
            // position_ids given and no cache: the packed-sequence check.
            packed_sequence_check(a.batch, a.q_len, dev)?;
        }
        return Ok(None);
    };
    // attention_mask.to(device, dtype=torch.bool)
    let as_bool = shadow(mask2d.shape(), DType::Bool, dev)?;
    let out = match a.cache {
        Some(CacheKind::Static { past, max_len }) => {
            // prepare_padding_mask pads the mask to the cache length.
            let padded = shadow(&[a.batch, max_len], DType::Bool, dev)?;
            if a.q_len > 1 && past == 0 {
                // Prefill of an empty static cache: `is_causal` with the keys sliced.
                drop(padded);
                None
            } else {
                // Decode on a compileable cache: the mask is materialised (key j visible
                // to query i when j <= past + i).
                let vals: Vec<f64> = (0..a.batch * a.q_len * max_len)
                    .map(|x| {
                        let (i, j) = ((x / max_len) % a.q_len, x % max_len);
                        if j <= past + i {
                            1.0
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let m = Tensor::from_f64(&vals, &[a.batch, 1, a.q_len, max_len], DType::Bool, dev)?;
                drop(padded);
                Some(m)
            }
        }
        _ => {
            // _ignore_causal_mask_sdpa: (q_len == 1 or kv_len == q_len) and fast_all(mask).
            fast_all_check(dev)?;
            None
        }
    };
    drop(as_bool);
    Ok(out)
}

/// `create_bidirectional_mask(...)` under SDPA for BERT: with an all-ones 2-d mask, its cast
/// to bool and `.all()`; without one, nothing. Always `None`.
pub(crate) fn bidirectional_mask(
    attention_mask: Option<&Tensor>,
    dev: &Device,
) -> Result<Option<Tensor>> {
    let _g = crate::autograd::no_grad();
    if let Some(m) = attention_mask {
        let as_bool = shadow(m.shape(), DType::Bool, dev)?;
        let all = shadow(&[], DType::Bool, dev)?;
        drop((all, as_bool));
    }
    Ok(None)
}
