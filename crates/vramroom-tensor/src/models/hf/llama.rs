//! transformers 5.17's `LlamaForCausalLM`, which with the config's switches is also
//! `MistralForCausalLM` (no sliding window) and `Qwen2ForCausalLM` (q/k/v bias): grouped-query
//! attention, RoPE, RMSNorm and SwiGLU, each as transformers writes it in Python.
//!
//! Design note: the three families differ only in what the config already says here
//! (biases, tied embeddings, head_dim, RoPE theta), so one code path mirrors
//! `LlamaModel.forward` statement by statement. Python lifetimes that show in memory:
//! `inputs_embeds`, the position ids and the rotary cos/sin live until the model's forward
//! returns; in the attention, the q/k projections die when `apply_rotary_pos_emb`'s results
//! rebind them and the v projection when the cache update rebinds it; in each decoder layer
//! the residual stream's input lives until the caller rebinds `hidden_states`. Attention goes
//! through `sdpa_attention_forward`, which passes `enable_gqa` when there is no mask, and
//! PyTorch 2.11 then runs f32 through the math path (see [`crate::ops::attention`]).

use crate::error::{Result, TensorError};
use crate::ops;
use crate::tensor::Tensor;

use super::cache::{Cache, DynamicCache};
use super::config::HfConfig;
use super::error::HfResult;
use super::layers::{self, AttnCall};
use super::masking::{self, CausalMaskArgs};
use super::params::{InitKind, Node, ParamStore};
use super::{lm_loss, ForwardArgs, LmOutput};

struct Linear {
    w: Tensor,
    b: Option<Tensor>,
}

impl Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::linear(x, &self.w, self.b.as_ref())
    }
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
    input_norm: Tensor,
    post_norm: Tensor,
}

/// `LlamaForCausalLM` / `MistralForCausalLM` / `Qwen2ForCausalLM`.
pub struct LlamaForCausalLm {
    pub(crate) cfg: HfConfig,
    pub(crate) store: ParamStore,
    pub(crate) training: bool,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    inv_freq: Tensor,
}

pub(crate) fn tree(c: &HfConfig) -> Node {
    let (e, std, hd) = (c.hidden_size, c.initializer_range, c.head_dim);
    let (nq, nkv) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
    let mut layers = Node::new("layers");
    for i in 0..c.num_hidden_layers {
        layers = layers.child(
            Node::new(i.to_string())
                .child(
                    Node::new("self_attn")
                        .child(Node::linear("q_proj", e, nq, c.qkv_bias, std))
                        .child(Node::linear("k_proj", e, nkv, c.qkv_bias, std))
                        .child(Node::linear("v_proj", e, nkv, c.qkv_bias, std))
                        .child(Node::linear("o_proj", nq, e, c.o_bias, std)),
                )
                .child(
                    Node::new("mlp")
                        .child(Node::linear(
                            "gate_proj",
                            e,
                            c.intermediate_size,
                            c.mlp_bias,
                            std,
                        ))
                        .child(Node::linear(
                            "up_proj",
                            e,
                            c.intermediate_size,
                            c.mlp_bias,
                            std,
                        ))
                        .child(Node::linear(
                            "down_proj",
                            c.intermediate_size,
                            e,
                            c.mlp_bias,
                            std,
                        )),
                )
                .child(Node::new("input_layernorm").param("weight", &[e], InitKind::Ones))
                .child(Node::new("post_attention_layernorm").param("weight", &[e], InitKind::Ones)),
        );
    }
    let freq = InitKind::InvFreq {
        theta: c.rope_theta,
        dim: hd,
    };
    let model = Node::new("model")
        .child(Node::embedding("embed_tokens", c.vocab_size, e, std))
        .child(layers)
        .child(Node::new("norm").param("weight", &[e], InitKind::Ones))
        .child(
            Node::new("rotary_emb")
                .buffer("inv_freq", &[hd / 2], freq, None)
                .buffer("original_inv_freq", &[hd / 2], freq, None),
        );
    let lm_head = if c.tie_word_embeddings {
        Node::new("lm_head").tied("weight", &[c.vocab_size, e], "model.embed_tokens.weight")
    } else {
        Node::linear("lm_head", e, c.vocab_size, false, std)
    };
    Node::new("").child(model).child(lm_head)
}

impl LlamaForCausalLm {
    pub(crate) fn new(cfg: HfConfig, store: ParamStore) -> HfResult<LlamaForCausalLm> {
        let lin = |p: &str, bias: bool| -> HfResult<Linear> {
            Ok(Linear {
                w: store.get(&format!("{p}.weight"))?,
                b: if bias {
                    Some(store.get(&format!("{p}.bias"))?)
                } else {
                    None
                },
            })
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            layers.push(Layer {
                q: lin(&format!("{p}.self_attn.q_proj"), cfg.qkv_bias)?,
                k: lin(&format!("{p}.self_attn.k_proj"), cfg.qkv_bias)?,
                v: lin(&format!("{p}.self_attn.v_proj"), cfg.qkv_bias)?,
                o: lin(&format!("{p}.self_attn.o_proj"), cfg.o_bias)?,
                gate: lin(&format!("{p}.mlp.gate_proj"), cfg.mlp_bias)?,
                up: lin(&format!("{p}.mlp.up_proj"), cfg.mlp_bias)?,
                down: lin(&format!("{p}.mlp.down_proj"), cfg.mlp_bias)?,
                input_norm: store.get(&format!("{p}.input_layernorm.weight"))?,
                post_norm: store.get(&format!("{p}.post_attention_layernorm.weight"))?,
            });
        }
        Ok(LlamaForCausalLm {
            embed: store.get("model.embed_tokens.weight")?,
            norm: store.get("model.norm.weight")?,
            lm_head: store.get("lm_head.weight")?,
            inv_freq: store.get("model.rotary_emb.inv_freq")?,
            layers,
            cfg,
            store,
            training: false,
        })
    }

    /// `LlamaAttention.forward`.
    fn attention(
        &self,
        i: usize,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        cache: Option<&mut Cache>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let l = &self.layers[i];
        let (b, t, hd) = (x.shape()[0], x.shape()[1], self.cfg.head_dim);
        let heads = |y: Tensor| -> Result<Tensor> {
            y.view(&[b as isize, t as isize, -1, hd as isize])?
                .transpose(1, 2)
        };
        // query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2), k, v
        let mut q = heads(l.q.forward(x)?)?;
        let mut k = heads(l.k.forward(x)?)?;
        let mut v = heads(l.v.forward(x)?)?;
        // query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        let (qe, ke) = layers::apply_rotary(&q, &k, cos, sin)?;
        q = qe;
        k = ke;
        // key_states, value_states = past_key_values.update(key_states, value_states, idx)
        if let Some(c) = cache {
            (k, v) = c.update(i, &k, &v)?;
        }
        let groups = self.cfg.num_attention_heads / self.cfg.num_key_value_heads;
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
                scaling: (hd as f64).powf(-0.5),
                kv_groups: groups,
                causal: true,
            },
        )?
        // attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        .reshape(&[b, t, self.cfg.num_attention_heads * hd])?
        .contiguous()?;
        a = l.o.forward(&a)?;
        drop((q, k, v));
        Ok(a)
    }

    /// `LlamaDecoderLayer.forward`.
    fn layer(
        &self,
        i: usize,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        cache: Option<&mut Cache>,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let l = &self.layers[i];
        let eps = self.cfg.norm_eps;
        // residual = hidden_states; hidden_states = self.input_layernorm(hidden_states)
        let mut h = layers::rms_norm(x, &l.input_norm, eps)?;
        h = self.attention(i, &h, rope, cache, mask)?;
        // hidden_states = residual + hidden_states
        h = x.add(&h)?;
        // residual = hidden_states; hidden_states = self.post_attention_layernorm(...)
        let residual = h.clone();
        h = layers::rms_norm(&h, &l.post_norm, eps)?;
        // LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))
        h = {
            let g = layers::activation(&l.gate.forward(&h)?, self.cfg.activation)?;
            let up = l.up.forward(&h)?;
            let gu = g.mul(&up)?;
            // Python drops a product's left operand, then its right.
            drop((g, up));
            l.down.forward(&gu)?
        };
        // hidden_states = residual + hidden_states (the MLP output dies at the rebinding,
        // the residual at return)
        let out = residual.add(&h)?;
        drop((h, residual));
        Ok(out)
    }

    pub(crate) fn forward(&self, input_ids: &Tensor, fa: ForwardArgs) -> Result<LmOutput> {
        let (b, t) = (input_ids.shape()[0], input_ids.shape()[1]);
        let dev = input_ids.device();
        let use_cache = fa.use_cache.unwrap_or(self.cfg.use_cache);
        // inputs_embeds = self.embed_tokens(input_ids)
        let inputs_embeds = ops::embedding(&self.embed, input_ids)?;
        // if use_cache and past_key_values is None: past_key_values = DynamicCache(...)
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
            return Err(TensorError::invalid(
                "llama",
                format!(
                    "{} positions exceed max_position_embeddings {}",
                    past + t,
                    self.cfg.max_position_embeddings
                ),
            ));
        }
        let position_ids = match fa.position_ids {
            Some(p) => p.clone(),
            None => layers::position_ids(t, past, dev)?,
        };
        let mask = masking::causal_mask(
            &CausalMaskArgs {
                batch: b,
                q_len: t,
                cache: cache.as_ref().map(|c| c.kind()),
                attention_mask: fa.attention_mask,
            },
            dev,
        )?;
        let (cos, sin) = layers::rotary(&self.inv_freq, &position_ids, inputs_embeds.dtype())?;
        let mut h = inputs_embeds.clone();
        for i in 0..self.layers.len() {
            h = self.layer(i, &h, (&cos, &sin), cache.as_deref_mut(), mask.as_ref())?;
        }
        h = layers::rms_norm(&h, &self.norm, self.cfg.norm_eps)?;
        drop((inputs_embeds, position_ids, mask, cos, sin));
        // logits = self.lm_head(hidden_states[:, slice_indices, :])
        let logits = if fa.logits_to_keep > 0 && fa.logits_to_keep < t {
            ops::linear(
                &h.narrow(1, t - fa.logits_to_keep, fa.logits_to_keep)?,
                &self.lm_head,
                None,
            )?
        } else {
            ops::linear(&h, &self.lm_head, None)?
        };
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
