//! Greedy `model.generate(input_ids, attention_mask, max_new_tokens, min_new_tokens,
//! do_sample=False)` as transformers 5.17's `GenerationMixin._sample` runs it.
//!
//! Design note: one prefill forward (`logits_to_keep=1`, position ids from the mask's
//! cumsum), then one forward per new token on the last token, the cache growing as its
//! implementation grows ([`super::cache`]). Per step, what costs memory is transformers':
//! the last position's logits copied to f32 (`[B, V]`), each logits processor's `clone()`
//! and, while fewer than `min_new_tokens` were generated, its `torch.where` masking EOS
//! (`MinLengthLogitsProcessor`, then `MinNewTokensLengthLogitsProcessor`), each with a
//! `[V]` vocabulary arange and mask; `argmax`; `torch.cat` of the ids; the mask grown by
//! one column. The logits of a step die at `del outputs` before the next. The int64 and
//! bool bookkeeping of [B]-sized tensors (unfinished sequences, stopping criteria, the
//! special-token checks) is allocated in transformers' order too, but its values are kept
//! on the host: on cpu and cuda the tokens are read back each step (as transformers' stop
//! check syncs each step), on the meta device no sequence finishes early (true when
//! `min_new_tokens == max_new_tokens`, as in the recorded scenarios).

use crate::autograd::no_grad;
use crate::backend::UnaryOp;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

use super::cache::{Cache, DynamicCache, StaticCache};
use super::{ForwardArgs, HfModel};

/// `cache_implementation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheImpl {
    /// `DynamicCache` (the default).
    Dynamic,
    /// `StaticCache` of prompt + new tokens (transformers compiles the decode step with it
    /// by default; this runs it eagerly).
    Static,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// `None`: equal to `max_new_tokens` (EOS cannot end a sequence early).
    pub min_new_tokens: Option<usize>,
    pub cache: CacheImpl,
}

fn shadow(shape: &[usize], dtype: DType, like: &Tensor) -> Result<Tensor> {
    Tensor::empty(shape, dtype, like.device())
}

/// The logits processors' work on `scores` [B, V] f32: returns the processed scores.
fn process(scores: Tensor, eos_mask: &Tensor, below_min: [bool; 2], v: usize) -> Result<Tensor> {
    let b = scores.shape()[0];
    let mask_eos = |s: &Tensor| -> Result<Tensor> {
        // torch.where(eos_token_mask, -math.inf, scores)
        let inf = shadow(&[], DType::F32, s)?;
        let out = s.masked_fill(eos_mask, f64::NEG_INFINITY)?;
        drop(inf);
        Ok(out)
    };
    // torch.isin(vocab_tensor, eos): its [V] bool result, then two [V] bool temporaries
    // of the comparison against the few EOS ids.
    let isin = |like: &Tensor| -> Result<Tensor> {
        let out = shadow(&[v], DType::Bool, like)?;
        let t1 = shadow(&[v], DType::Bool, like)?;
        let t2 = shadow(&[v], DType::Bool, like)?;
        drop((t2, t1));
        Ok(out)
    };
    // MinLengthLogitsProcessor: arange(V), isin, clone, [where]
    let s1 = {
        let ar = shadow(&[v], DType::I64, &scores)?;
        let isin = isin(&scores)?;
        let mut sp = scores.clone_tensor()?;
        if below_min[0] {
            sp = mask_eos(&scores)?;
        }
        drop((ar, isin));
        sp
    };
    drop(scores);
    // MinNewTokensLengthLogitsProcessor: clone, arange(V), isin, [where]
    let s2 = {
        let mut sp = s1.clone_tensor()?;
        let ar = shadow(&[v], DType::I64, &s1)?;
        let isin = isin(&s1)?;
        if below_min[1] {
            sp = mask_eos(&s1)?;
        }
        drop((ar, isin));
        sp
    };
    debug_assert_eq!(s2.shape(), [b, v]);
    Ok(s2)
}

/// Greedy generation: `input_ids` int64 [B, P], `attention_mask` all ones [B, P]; returns
/// the ids [B, P + new] (fewer steps when every sequence has ended on EOS).
pub fn generate(
    model: &HfModel,
    input_ids: &Tensor,
    attention_mask: &Tensor,
    o: &GenerateOptions,
) -> Result<Tensor> {
    let _g = no_grad();
    let cfg = model.config();
    if !cfg.family.is_decoder() {
        return Err(TensorError::invalid(
            "generate",
            "BERT is an encoder: nothing to generate",
        ));
    }
    if input_ids.ndim() != 2
        || input_ids.dtype() != DType::I64
        || attention_mask.shape() != input_ids.shape()
    {
        return Err(TensorError::shape(
            "generate",
            format!(
                "input_ids int64 [B, P] and an attention_mask of its shape, got {:?} and {:?}",
                input_ids.shape(),
                attention_mask.shape()
            ),
        ));
    }
    let (b, p) = (input_ids.shape()[0], input_ids.shape()[1]);
    let n = o.max_new_tokens;
    let min_new = o.min_new_tokens.unwrap_or(n).min(n);
    let v = cfg.vocab_size;
    if p + n > cfg.max_position_embeddings {
        return Err(TensorError::invalid(
            "generate",
            format!(
                "{} tokens exceed max_position_embeddings {}",
                p + n,
                cfg.max_position_embeddings
            ),
        ));
    }
    let dev = input_ids.device().clone();
    let real = !dev.is_meta();
    let eos = cfg.eos_token_ids.clone();
    let pad = cfg.pad_token_id.unwrap_or(0);

    // _prepare_special_tokens: bos, eos, pad as device tensors, checked against each other.
    let special = (
        shadow(&[], DType::I64, input_ids)?,
        shadow(&[eos.len().max(1)], DType::I64, input_ids)?,
        shadow(&[], DType::I64, input_ids)?,
    );
    for _ in 0..2 {
        let c = shadow(&[eos.len().max(1)], DType::Bool, input_ids)?;
        let a = shadow(&[], DType::Bool, input_ids)?;
        drop((c, a));
    }
    // The padding-side check `(input_ids[:, -1] == pad).any()`.
    drop((
        shadow(&[b], DType::Bool, input_ids)?,
        shadow(&[], DType::Bool, input_ids)?,
    ));
    // The EOS mask over the vocabulary the processors use (its values matter).
    let eos_mask = {
        let mut m = vec![0.0; v];
        for &e in &eos {
            if let Some(x) = usize::try_from(e).ok().and_then(|i| m.get_mut(i)) {
                *x = 1.0;
            }
        }
        Tensor::from_f64(&m, &[v], DType::Bool, &dev)?
    };

    // position_ids = attention_mask.long().cumsum(-1) - 1; masked_fill(mask == 0, 1)
    let mut position_ids = {
        let cs = shadow(&[b, p], DType::I64, input_ids)?;
        // Unpadded rows: every row is 0..P.
        let vals: Vec<f64> = (0..b * p).map(|i| (i % p) as f64).collect();
        let pos = Tensor::from_f64(&vals, &[b, p], DType::I64, &dev)?;
        drop(cs);
        let eq = shadow(&[b, p], DType::Bool, input_ids)?;
        let filled = pos.clone_tensor()?;
        drop((pos, eq));
        filled
    };
    // unfinished_sequences = torch.ones(batch_size)
    let unfinished = shadow(&[b], DType::I64, input_ids)?;
    let mut finished = vec![false; b];

    let mut cache = match o.cache {
        CacheImpl::Dynamic => Cache::Dynamic(DynamicCache::new(cfg.num_hidden_layers)),
        CacheImpl::Static => Cache::Static(StaticCache::new(cfg.num_hidden_layers, p + n)),
    };
    let mut ids = input_ids.clone();
    let mut mask = attention_mask.clone();
    for step in 0..n {
        // prepare_inputs_for_generation: the new tokens and positions, cloned contiguous.
        let (step_ids, step_pos) = if step == 0 {
            (ids.clone_tensor()?, position_ids.clone())
        } else {
            let l = ids.shape()[1];
            (
                ids.narrow(1, l - 1, 1)?.clone_tensor()?,
                position_ids.clone_tensor()?,
            )
        };
        let out = model.forward(
            &step_ids,
            ForwardArgs {
                use_cache: Some(true),
                cache: Some(&mut cache),
                attention_mask: Some(&mask),
                position_ids: Some(&step_pos),
                logits_to_keep: 1,
                labels: None,
            },
        )?;
        drop((step_ids, step_pos));
        let logits = out
            .logits
            .ok_or_else(|| TensorError::invalid("generate", "no logits"))?;
        // _update_model_kwargs_for_generation: positions + 1, the mask grown by a column.
        {
            let l = position_ids.shape()[1];
            let ar = shadow(&[1], DType::I64, input_ids)?;
            let t = shadow(&[b, 1], DType::I64, input_ids)?;
            let next = position_ids
                .narrow(1, l - 1, 1)?
                .map_no_grad(UnaryOp::AddScalar(1.0))?;
            drop((ar, t));
            position_ids = next;
            let ones = Tensor::ones(&[b, 1], DType::I64, &dev)?;
            mask = Tensor::cat(&[&mask, &ones], 1)?;
        }
        // next_token_logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
        let last = logits.shape()[1] - 1;
        let next_logits = logits.select(1, last)?.to_dtype(DType::F32)?;
        let next_logits = if next_logits.shares_storage(&logits) {
            next_logits.clone_tensor()?
        } else {
            next_logits
        };
        let new_tokens = ids.shape()[1] - p;
        let below = [ids.shape()[1] < p + min_new, new_tokens < min_new];
        let scores = process(next_logits.clone(), &eos_mask, below, v)?;
        // next_tokens = torch.argmax(next_token_scores, dim=-1)
        let mut next = scores.argmax(-1, false)?;
        drop(scores);
        // next_tokens * unfinished + pad * (1 - unfinished)
        let arith: Vec<Tensor> = (0..4)
            .map(|_| shadow(&[b], DType::I64, input_ids))
            .collect::<Result<_>>()?;
        if real && !eos.is_empty() {
            let mut toks = next.to_vec_i64()?;
            let mut changed = false;
            for (t, f) in toks.iter_mut().zip(&finished) {
                if *f && *t != pad {
                    *t = pad;
                    changed = true;
                }
            }
            for (t, f) in toks.iter().zip(finished.iter_mut()) {
                *f |= eos.contains(t);
            }
            if changed {
                next = Tensor::from_i64(&toks, &[b], &dev)?;
            }
        }
        drop(arith);
        // input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        ids = Tensor::cat(&[&ids, &next.unsqueeze(1)?], 1)?;
        drop(next);
        // unfinished_sequences & ~stopping_criteria(input_ids, scores); .max() == 0
        let crit: Vec<Tensor> = [b, b, b, b, b, b]
            .iter()
            .map(|&s| shadow(&[s], DType::Bool, input_ids))
            .collect::<Result<_>>()?;
        let stop = (
            shadow(&[], DType::I64, input_ids)?,
            shadow(&[], DType::Bool, input_ids)?,
        );
        drop((crit, stop));
        // del outputs
        drop((logits, next_logits));
        if real && !eos.is_empty() && finished.iter().all(|&f| f) {
            break;
        }
    }
    drop((special, unfinished, eos_mask, cache, mask, position_ids));
    Ok(ids)
}
