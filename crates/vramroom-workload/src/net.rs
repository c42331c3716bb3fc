//! The network builder: a spec's model on a device, and its forward as a user writes it.
//!
//! Design note: a zoo model is vramroom-tensor's [`ZooNet`] (built from the spec's
//! [`vramroom_tensor::models::ZooModel`], the one vocabulary of zoo models), and this is
//! the one place that walks its layers, so the named-temporaries forward (every
//! intermediate kept in a local, as `h1 = ...; h2 = ...` keeps them in Python) sits beside
//! the plain one and cannot drift from it.

use vramroom_tensor::models::hf::{self, ForwardArgs, HfError, HfModel};
use vramroom_tensor::models::ZooNet;
use vramroom_tensor::nn::Init;
use vramroom_tensor::{category_scope, ops, DType, Device, MemoryCategory, Tensor, TensorError};

use crate::spec::ModelSpec;

/// A loader error as a tensor error (the runtime's error type, which the load engine and
/// the server carry): tensor failures (OOM above all) unchanged, the rest as invalid input.
pub fn hf_tensor_error(e: HfError) -> TensorError {
    match e {
        HfError::Tensor(t) => t,
        other => TensorError::invalid("model", other.to_string()),
    }
}

/// A model built on a device.
pub enum Net {
    Zoo(ZooNet),
    Hf(Box<HfModel>),
}

impl Net {
    /// Builds `spec` for inference.
    pub fn build(
        spec: &ModelSpec,
        dev: &Device,
        dtype: DType,
    ) -> std::result::Result<Net, TensorError> {
        Net::build_for(spec, dev, dtype, false)
    }
    /// Builds `spec`; `training` picks the head a Hugging Face encoder trains with (BERT:
    /// `BertForMaskedLM`).
    pub fn build_for(
        spec: &ModelSpec,
        dev: &Device,
        dtype: DType,
        training: bool,
    ) -> std::result::Result<Net, TensorError> {
        let init = Init::new(dev, dtype);
        Ok(match spec {
            ModelSpec::Hf(h) => {
                let opts = hf::LoadOptions {
                    dtype: Some(dtype),
                    bert_head: if training {
                        hf::BertHead::MaskedLm
                    } else {
                        hf::BertHead::Base
                    },
                };
                let loaded =
                    hf::load_config(h.config.clone(), h.weights_dir().as_deref(), dev, &opts)
                        .map_err(hf_tensor_error)?;
                if let Some(n) = &loaded.note {
                    tracing::info!("{n}");
                }
                Net::Hf(Box::new(loaded.model))
            }
            ModelSpec::Zoo(z) => Net::Zoo(z.build(&init)?),
        })
    }
    /// `model.parameters()`.
    pub fn parameters(&self) -> Vec<Tensor> {
        match self {
            Net::Zoo(m) => m.parameters(),
            Net::Hf(m) => m.parameters(),
        }
    }
    pub fn set_train(&mut self, on: bool) {
        match self {
            Net::Zoo(m) => m.train(on),
            Net::Hf(m) => m.train(on),
        }
    }
    /// transformers' forward of a Hugging Face model on token ids [B, T]: decoders with
    /// `use_cache` (the returned `past_key_values` live as long as the output), BERT with
    /// an all-ones attention mask; `labels` for the training loss. Returns (output, loss);
    /// the output is the logits (BERT: the last hidden state), and the KV cache is dropped
    /// with it.
    pub fn hf_forward(
        &self,
        ids: &Tensor,
        use_cache: bool,
        labels: Option<&Tensor>,
    ) -> std::result::Result<(Tensor, Option<Tensor>), TensorError> {
        let Net::Hf(m) = self else {
            return Err(TensorError::invalid("forward", "not a Hugging Face model"));
        };
        let decoder = m.config().family.is_decoder();
        let mask = if decoder {
            None
        } else {
            let _c = category_scope(MemoryCategory::Input);
            Some(Tensor::ones(ids.shape(), DType::I64, ids.device())?)
        };
        let out = m.forward(
            ids,
            ForwardArgs {
                use_cache: decoder.then_some(use_cache && labels.is_none()),
                attention_mask: mask.as_ref(),
                labels,
                ..ForwardArgs::default()
            },
        )?;
        let y = match (out.logits, out.last_hidden_state) {
            (Some(l), _) => l,
            (None, Some(h)) => h,
            (None, None) => {
                return Err(TensorError::invalid("forward", "the model gave no output"))
            }
        };
        // The forward's peak held the cache beside the logits; the caller keeps the output.
        drop(out.cache);
        Ok((y, out.loss))
    }
    /// The model's forward. With `named`, every intermediate (each layer's output for the
    /// MLP, each block's for ResNet and GPT-2) is kept in a local until the forward returns,
    /// as `h1 = ...; h2 = ...` in a Python function keeps them; otherwise each dies once the
    /// next layer has consumed it.
    pub fn forward(&self, x: &Tensor, named: bool) -> std::result::Result<Tensor, TensorError> {
        if !named {
            return match self {
                Net::Zoo(m) => m.forward(x),
                Net::Hf(_) => Ok(self.hf_forward(x, true, None)?.0),
            };
        }
        let mut locals: Vec<Tensor> = Vec::new();
        let out = match self {
            Net::Zoo(ZooNet::Mlp(m)) => {
                let last = m.layers.len().saturating_sub(1);
                let mut h = x.clone();
                for (i, l) in m.layers.iter().enumerate() {
                    let z = l.forward(&h)?;
                    locals.push(h);
                    h = if i < last {
                        let a = z.relu()?;
                        locals.push(z);
                        a
                    } else {
                        z
                    };
                }
                h
            }
            Net::Zoo(ZooNet::ResNet(m)) => {
                let mut h = m.conv1.forward(x)?;
                locals.push(h.clone());
                h = m.bn1.forward(&h)?;
                locals.push(h.clone());
                h = h.relu()?;
                locals.push(h.clone());
                h = m.maxpool.forward(&h)?;
                for layer in &m.layers {
                    for b in layer {
                        locals.push(h.clone());
                        h = b.forward(&h)?;
                    }
                }
                locals.push(h.clone());
                h = m.avgpool.forward(&h)?.flatten(1, -1)?;
                m.fc.forward(&h)?
            }
            Net::Zoo(ZooNet::Gpt2(m)) => {
                let t = x.shape().get(1).copied().unwrap_or(0);
                let pos = {
                    let _c = category_scope(MemoryCategory::Input);
                    Tensor::arange(t, DType::I64, x.device())?.reshape(&[1, t])?
                };
                let tok = m.wte.forward(x)?;
                let pose = m.wpe.forward(&pos)?;
                let mut h = tok.add(&pose)?;
                locals.extend([pos, tok, pose]);
                h = m.drop.forward(&h)?;
                for block in &m.h {
                    locals.push(h.clone());
                    h = block.forward(&h)?;
                }
                locals.push(h.clone());
                h = m.ln_f.forward(&h)?;
                locals.push(h.clone());
                ops::linear(&h, &m.wte.weight, None)?
            }
            Net::Hf(_) => self.hf_forward(x, true, None)?.0,
        };
        drop(locals);
        Ok(out)
    }
    pub(crate) fn loss(
        &self,
        out: &Tensor,
        target: &Tensor,
    ) -> std::result::Result<Tensor, TensorError> {
        match self {
            Net::Zoo(m) => m.loss(out, target),
            Net::Hf(_) => ops::cross_entropy(out, target),
        }
    }
}
