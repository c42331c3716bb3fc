//! transformers 5.17's `GPT2LMHeadModel` with SDPA attention, as a KV-cache decoder.
//!
//! Design note: this is not the zoo's [`crate::models::Gpt2`] (eager attention, no cache,
//! the one the load tester and its tests were built on); it is transformers' current code:
//! `Conv1D` projections, attention through `sdpa_attention_forward`, `gelu_new` as its
//! eight-kernel Python composition, a `DynamicCache` filled by every forward unless
//! `use_cache=False` (transformers' default is on, and the cache is part of the output), and
//! `logits_to_keep`. `GPT2Model.forward` keeps `inputs_embeds` and `position_embeds` as
//! locals until it returns, so they stay alive through the blocks, as here.

use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;

use super::cache::{Cache, DynamicCache};
use super::config::HfConfig;
use super::error::HfResult;
use super::layers::{self, AttnCall};
use super::masking::{self, CausalMaskArgs};
use super::params::{InitKind, Node, ParamStore};
use super::{lm_loss, ForwardArgs, LmOutput};

struct Block {
    ln_1: (Tensor, Tensor),
    c_attn: (Tensor, Tensor),
    c_proj: (Tensor, Tensor),
    ln_2: (Tensor, Tensor),
    c_fc: (Tensor, Tensor),
    mlp_proj: (Tensor, Tensor),
}

/// `GPT2LMHeadModel`.
pub struct Gpt2LmHead {
    pub(crate) cfg: HfConfig,
    pub(crate) store: ParamStore,
    pub(crate) training: bool,
    wte: Tensor,
    wpe: Tensor,
    h: Vec<Block>,
    ln_f: (Tensor, Tensor),
    lm_head: Tensor,
}

/// The module tree of `GPT2LMHeadModel` (see [`super::params`]).
pub(crate) fn tree(c: &HfConfig) -> Node {
    let (e, std) = (c.hidden_size, c.initializer_range);
    let conv = |name: &str, nx: usize, nf: usize| {
        Node::new(name)
            .param("weight", &[nx, nf], InitKind::Normal(std))
            .param("bias", &[nf], InitKind::Zeros)
    };
    let mut h = Node::new("h");
    for i in 0..c.num_hidden_layers {
        h = h.child(
            Node::new(i.to_string())
                .child(Node::layer_norm("ln_1", e))
                .child(
                    Node::new("attn")
                        .child(conv("c_attn", e, 3 * e))
                        .child(conv("c_proj", e, e)),
                )
                .child(Node::layer_norm("ln_2", e))
                .child(
                    Node::new("mlp")
                        .child(conv("c_fc", e, c.intermediate_size))
                        .child(conv("c_proj", c.intermediate_size, e)),
                ),
        );
    }
    let transformer = Node::new("transformer")
        .child(Node::embedding("wte", c.vocab_size, e, std))
        .child(Node::embedding("wpe", c.max_position_embeddings, e, std))
        .child(h)
        .child(Node::layer_norm("ln_f", e));
    let lm_head = if c.tie_word_embeddings {
        Node::new("lm_head").tied("weight", &[c.vocab_size, e], "transformer.wte.weight")
    } else {
        Node::linear("lm_head", e, c.vocab_size, false, std)
    };
    Node::new("").child(transformer).child(lm_head)
}

impl Gpt2LmHead {
    pub(crate) fn new(cfg: HfConfig, store: ParamStore) -> HfResult<Gpt2LmHead> {
        let g = |n: &str| store.get(n);
        let pair = |p: &str| -> HfResult<(Tensor, Tensor)> {
            Ok((g(&format!("{p}.weight"))?, g(&format!("{p}.bias"))?))
        };
        let mut h = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("transformer.h.{i}");
            h.push(Block {
                ln_1: pair(&format!("{p}.ln_1"))?,
                c_attn: pair(&format!("{p}.attn.c_attn"))?,
                c_proj: pair(&format!("{p}.attn.c_proj"))?,
                ln_2: pair(&format!("{p}.ln_2"))?,
                c_fc: pair(&format!("{p}.mlp.c_fc"))?,
                mlp_proj: pair(&format!("{p}.mlp.c_proj"))?,
            });
        }
        Ok(Gpt2LmHead {
            wte: g("transformer.wte.weight")?,
            wpe: g("transformer.wpe.weight")?,
            ln_f: pair("transformer.ln_f")?,
            lm_head: g("lm_head.weight")?,
            h,
            cfg,
            store,
            training: false,
        })
    }

    fn ln(&self, x: &Tensor, (w, b): &(Tensor, Tensor)) -> Result<Tensor> {
        ops::layer_norm(
            x,
            &[self.cfg.hidden_size],
            Some(w),
            Some(b),
            self.cfg.norm_eps,
        )
    }

    fn dropout(&self, x: &Tensor, p: f64) -> Result<Tensor> {
        ops::dropout(x, p, self.training)
    }

    /// `GPT2Attention.forward` (self-attention, SDPA).
    fn attention(
        &self,
        i: usize,
        x: &Tensor,
        cache: Option<&mut Cache>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let blk = &self.h[i];
        let (b, t, e) = (x.shape()[0], x.shape()[1], self.cfg.hidden_size);
        let (nh, d) = (self.cfg.num_attention_heads, self.cfg.head_dim);
        // query_states, key_states, value_states = self.c_attn(hidden_states).split(...)
        let qkv = layers::conv1d(x, &blk.c_attn.0, &blk.c_attn.1)?;
        let parts = qkv.split(e, 2)?;
        drop(qkv);
        let heads = |p: &Tensor| {
            p.view(&[b as isize, t as isize, -1, d as isize])?
                .transpose(1, 2)
        };
        let mut k = heads(&parts[1])?;
        let mut v = heads(&parts[2])?;
        let q = heads(&parts[0])?;
        drop(parts);
        if let Some(c) = cache {
            (k, v) = c.update(i, &k, &v)?;
        }
        let mut scaling = if self.cfg.scale_attn_weights {
            (d as f64).powf(-0.5)
        } else {
            1.0
        };
        if self.cfg.scale_attn_by_inverse_layer_idx {
            scaling /= (i + 1) as f64;
        }
        // attn_output = attn_output.reshape(*attn_output.shape[:-2], -1).contiguous()
        let mut a = layers::sdpa_attention(
            &q,
            &k,
            &v,
            &AttnCall {
                mask,
                dropout: if self.training {
                    self.cfg.attn_pdrop
                } else {
                    0.0
                },
                scaling,
                kv_groups: 1,
                causal: true,
            },
        )?
        .reshape(&[b, t, nh * d])?
        .contiguous()?;
        // attn_output = self.c_proj(attn_output); attn_output = self.resid_dropout(...)
        a = layers::conv1d(&a, &blk.c_proj.0, &blk.c_proj.1)?;
        a = self.dropout(&a, self.cfg.resid_pdrop)?;
        drop((q, k, v));
        Ok(a)
    }

    /// `GPT2Block.forward`. `x` stays alive in the caller's loop until this returns.
    fn block(
        &self,
        i: usize,
        x: &Tensor,
        cache: Option<&mut Cache>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let blk = &self.h[i];
        // residual = hidden_states; hidden_states = self.ln_1(hidden_states)
        let ln1 = self.ln(x, &blk.ln_1)?;
        let attn_output = self.attention(i, &ln1, cache, mask)?;
        // hidden_states = attn_output + residual
        let residual = attn_output.add(x)?;
        drop(ln1);
        // hidden_states = self.ln_2(hidden_states); feed_forward = self.mlp(hidden_states)
        let ln2 = self.ln(&residual, &blk.ln_2)?;
        let ff = {
            let mut f = layers::conv1d(&ln2, &blk.c_fc.0, &blk.c_fc.1)?;
            f = layers::activation(&f, self.cfg.activation)?;
            f = layers::conv1d(&f, &blk.mlp_proj.0, &blk.mlp_proj.1)?;
            self.dropout(&f, self.cfg.resid_pdrop)?
        };
        // hidden_states = residual + feed_forward_hidden_states
        let out = residual.add(&ff)?;
        // Python frees the locals at return: ln_2's output (rebound), residual,
        // attn_output, feed_forward_hidden_states.
        drop((ln2, residual, attn_output, ff));
        Ok(out)
    }

    pub(crate) fn forward(&self, input_ids: &Tensor, fa: ForwardArgs) -> Result<LmOutput> {
        let (b, t) = (input_ids.shape()[0], input_ids.shape()[1]);
        let dev = input_ids.device();
        let use_cache = fa.use_cache.unwrap_or(self.cfg.use_cache);
        let mut own: Option<Cache> = None;
        let mut cache: Option<&mut Cache> = match fa.cache {
            Some(c) => Some(c),
            None if use_cache => {
                own = Some(Cache::Dynamic(DynamicCache::new(
                    self.cfg.num_hidden_layers,
                )));
                own.as_mut()
            }
            None => None,
        };
        let past = cache.as_ref().map(|c| c.seq_len()).unwrap_or(0);
        if past + t > self.cfg.max_position_embeddings {
            return Err(crate::error::TensorError::invalid(
                "gpt2",
                format!(
                    "{} positions exceed n_positions {}",
                    past + t,
                    self.cfg.max_position_embeddings
                ),
            ));
        }
        let mask_args = CausalMaskArgs {
            batch: b,
            q_len: t,
            cache: cache.as_ref().map(|c| c.kind()),
            attention_mask: fa.attention_mask,
        };
        // inputs_embeds = self.wte(input_ids)
        let inputs_embeds = ops::embedding(&self.wte, input_ids)?;
        let position_ids = match fa.position_ids {
            Some(p) => p.clone(),
            None => layers::position_ids(t, past, dev)?,
        };
        let position_embeds = ops::embedding(&self.wpe, &position_ids)?;
        let mut h = inputs_embeds.add(&position_embeds)?;
        let mask = masking::causal_mask(&mask_args, dev)?;
        h = self.dropout(&h, self.cfg.embd_pdrop)?;
        for i in 0..self.h.len() {
            h = self.block(i, &h, cache.as_deref_mut(), mask.as_ref())?;
        }
        h = self.ln(&h, &self.ln_f)?;
        drop((inputs_embeds, position_embeds, position_ids, mask));
        // logits = self.lm_head(hidden_states[:, slice_indices, :])
        let x = if fa.logits_to_keep > 0 && fa.logits_to_keep < t {
            h.narrow(1, t - fa.logits_to_keep, fa.logits_to_keep)?
        } else {
            h.clone()
        };
        let logits = ops::linear(&x, &self.lm_head, None)?;
        drop(x);
        let loss = match fa.labels {
            Some(l) => Some(lm_loss(&logits, l, self.cfg.vocab_size)?),
            None => None,
        };
        drop(h);
        Ok(LmOutput {
            logits,
            loss,
            cache: own,
        })
    }
}
