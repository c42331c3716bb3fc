//! Hugging Face's `GPT2LMHeadModel`: `transformer.wte`, `transformer.wpe`,
//! `transformer.h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}`,
//! `transformer.ln_f`, and `lm_head` tied to `wte` (so it is not a separate parameter, and
//! HF checkpoints omit it).

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::memory::{category_scope, MemoryCategory};
use crate::nn::{
    causal_mask, prefixed, CausalSelfAttention, Conv1D, Dropout, Embedding, Init, LayerNorm, Module,
};
use crate::ops;
use crate::tensor::Tensor;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpt2Config {
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub vocab_size: usize,
    pub n_positions: usize,
    /// resid/embd/attn dropout (HF: 0.1 each).
    pub dropout: f64,
    pub layer_norm_epsilon: f64,
}

impl Gpt2Config {
    /// The 124M model (`gpt2`).
    pub fn gpt2() -> Gpt2Config {
        Gpt2Config {
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            vocab_size: 50257,
            n_positions: 1024,
            dropout: 0.1,
            layer_norm_epsilon: 1e-5,
        }
    }
    /// A tiny config for tests.
    pub fn tiny() -> Gpt2Config {
        Gpt2Config {
            n_layer: 2,
            n_head: 2,
            n_embd: 16,
            vocab_size: 50,
            n_positions: 32,
            dropout: 0.0,
            layer_norm_epsilon: 1e-5,
        }
    }
}

pub struct Mlp {
    pub c_fc: Conv1D,
    pub c_proj: Conv1D,
    pub dropout: Dropout,
}

pub struct Gpt2Block {
    pub ln_1: LayerNorm,
    pub attn: CausalSelfAttention,
    pub ln_2: LayerNorm,
    pub mlp: Mlp,
}

impl Gpt2Block {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let residual = x.clone();
        let mut h = self.ln_1.forward(x)?;
        h = self.attn.forward(&h)?;
        h = h.add(&residual)?;
        let residual = h.clone();
        h = self.ln_2.forward(&h)?;
        h = self.mlp.c_fc.forward(&h)?;
        // `gelu_new` is the tanh approximation.
        h = h.gelu(true)?;
        h = self.mlp.c_proj.forward(&h)?;
        h = self.mlp.dropout.forward(&h)?;
        residual.add(&h)
    }
}

impl Module for Gpt2Block {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = prefixed("ln_1", self.ln_1.named_parameters());
        v.extend(prefixed("attn", self.attn.named_parameters()));
        v.extend(prefixed("ln_2", self.ln_2.named_parameters()));
        v.extend(prefixed("mlp.c_fc", self.mlp.c_fc.named_parameters()));
        v.extend(prefixed("mlp.c_proj", self.mlp.c_proj.named_parameters()));
        v
    }
    fn train(&mut self, on: bool) {
        self.attn.train(on);
        self.mlp.dropout.train(on);
    }
}

pub struct Gpt2 {
    pub config: Gpt2Config,
    pub wte: Embedding,
    pub wpe: Embedding,
    pub drop: Dropout,
    pub h: Vec<Gpt2Block>,
    pub ln_f: LayerNorm,
}

impl Gpt2 {
    pub fn new(init: &Init, c: Gpt2Config) -> Result<Gpt2> {
        if c.n_layer == 0 || c.n_embd == 0 || c.vocab_size == 0 || c.n_positions == 0 {
            return Err(TensorError::invalid("gpt2", format!("bad config {c:?}")));
        }
        let wte = Embedding::new(init, c.vocab_size, c.n_embd, 0.02)?;
        let wpe = Embedding::new(init, c.n_positions, c.n_embd, 0.01)?;
        let mut h = Vec::with_capacity(c.n_layer);
        for _ in 0..c.n_layer {
            // One mask per layer, like HF's per-layer `bias` buffer.
            let mask = causal_mask(c.n_positions, &init.device)?;
            h.push(Gpt2Block {
                ln_1: LayerNorm::new(init, c.n_embd, c.layer_norm_epsilon)?,
                attn: CausalSelfAttention::new(init, c.n_embd, c.n_head, mask, c.dropout)?,
                ln_2: LayerNorm::new(init, c.n_embd, c.layer_norm_epsilon)?,
                mlp: Mlp {
                    c_fc: Conv1D::new(init, c.n_embd, 4 * c.n_embd)?,
                    c_proj: Conv1D::new(init, 4 * c.n_embd, c.n_embd)?,
                    dropout: Dropout::new(c.dropout),
                },
            });
        }
        Ok(Gpt2 {
            config: c,
            wte,
            wpe,
            drop: Dropout::new(c.dropout),
            h,
            ln_f: LayerNorm::new(init, c.n_embd, c.layer_norm_epsilon)?,
        })
    }

    /// `input_ids`: int64 `[B, T]` → logits `[B, T, vocab]`.
    pub fn forward(&self, input_ids: &Tensor) -> Result<Tensor> {
        if input_ids.ndim() != 2 {
            return Err(TensorError::shape(
                "gpt2",
                format!("input_ids must be [B, T], got {:?}", input_ids.shape()),
            ));
        }
        let t = input_ids.shape()[1];
        if t > self.config.n_positions {
            return Err(TensorError::invalid(
                "gpt2",
                format!("seq {t} > n_positions {}", self.config.n_positions),
            ));
        }
        let pos = {
            let _c = category_scope(MemoryCategory::Input);
            Tensor::arange(t, DType::I64, input_ids.device())?.reshape(&[1, t])?
        };
        let inputs_embeds = self.wte.forward(input_ids)?;
        let position_embeds = self.wpe.forward(&pos)?;
        drop(pos);
        let mut h = inputs_embeds.add(&position_embeds)?;
        drop((inputs_embeds, position_embeds));
        h = self.drop.forward(&h)?;
        for block in &self.h {
            h = block.forward(&h)?;
        }
        h = self.ln_f.forward(&h)?;
        // lm_head: tied to wte, no bias.
        ops::linear(&h, &self.wte.weight, None)
    }

    /// Causal-LM loss as HF computes it: logits `[B*T, V]` against labels shifted by one
    /// (the last position has no target: ignore_index), mean over the rest.
    pub fn loss(&self, logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let v = self.config.vocab_size;
        let flat = logits.reshape(&[logits.numel() / v.max(1), v])?;
        ops::cross_entropy(&flat, labels)
    }

    pub fn device(&self) -> &Device {
        self.wte.weight.device()
    }
}

impl Module for Gpt2 {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = prefixed("transformer.wte", self.wte.named_parameters());
        v.extend(prefixed("transformer.wpe", self.wpe.named_parameters()));
        for (i, b) in self.h.iter().enumerate() {
            v.extend(prefixed(
                &format!("transformer.h.{i}"),
                b.named_parameters(),
            ));
        }
        v.extend(prefixed("transformer.ln_f", self.ln_f.named_parameters()));
        v
    }
    fn train(&mut self, on: bool) {
        self.drop.train(on);
        for b in &mut self.h {
            b.train(on);
        }
    }
}
