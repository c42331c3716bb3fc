//! Workloads on a Hugging Face model, as people run them with transformers, measured the
//! way `scripts/hf_memory.py` measures PyTorch: a forward under `no_grad` (with or without
//! `use_cache`), a greedy `generate`, or training steps with an optimizer.
//!
//! Design note: the measured region starts with the weights on the device (and, unless
//! the process is cold, the cuBLAS workspaces an earlier iteration created) and the peaks
//! reset; the inputs are created inside it, as the recording script creates them after
//! recording starts. Forward: `model(input_ids=ids, use_cache=...)` (BERT:
//! `BertModel(input_ids, attention_mask=ones_like(ids))`), output dropped. Generate:
//! `generate(ids, attention_mask=ones_like(ids), max_new_tokens=n, min_new_tokens=n)`.
//! Train: `model.train()`, optimizer built before, then per step new ids,
//! `model(input_ids=ids, labels=ids).loss`, `backward()`, `step()`,
//! `zero_grad(set_to_none=True)` (BERT trains `BertForMaskedLM`). [`predict`] runs the same
//! on a fresh meta device with PyTorch's caching allocator: peak allocated and reserved as
//! PyTorch would report them. On a device that ran earlier workloads, [`run`] continues
//! from its allocator state (cached segments, cuBLAS workspaces), as a process does.

use std::collections::BTreeMap;
use std::path::Path;

use vramroom_alloc::AllocatorConfig;

use crate::autograd::no_grad;
use crate::device::{BlasThread, Device};
use crate::dtype::DType;
use crate::optim::{Adam, Optimizer, Sgd};
use crate::tensor::Tensor;

use super::bert::BertHead;
use super::error::{HfError, HfResult};
use super::generate::{self, CacheImpl, GenerateOptions};
use super::{folder_of, load_config, ForwardArgs, HfConfig, LoadOptions};

/// The optimizer of a training workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Optim {
    /// `torch.optim.AdamW(params, lr, weight_decay)` (foreach, state from the first step).
    AdamW { lr: f64, weight_decay: f64 },
    /// `torch.optim.SGD(params, lr, momentum)`.
    Sgd { lr: f64, momentum: f64 },
}

impl Default for Optim {
    /// What the recording script uses: `AdamW(lr=1e-4)` (weight decay 0.01).
    fn default() -> Self {
        Optim::AdamW {
            lr: 1e-4,
            weight_decay: 0.01,
        }
    }
}

/// A workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Workload {
    /// One forward without grad. `use_cache`: `None` is the config's default (on); BERT
    /// has no cache.
    Forward {
        batch: usize,
        seq: usize,
        use_cache: Option<bool>,
    },
    /// Greedy generation of exactly `new_tokens` tokens after a `prompt`-token prefill.
    Generate {
        batch: usize,
        prompt: usize,
        new_tokens: usize,
        cache: CacheImpl,
    },
    /// `steps` optimizer steps on [batch, seq] token batches (labels = inputs).
    Train {
        batch: usize,
        seq: usize,
        steps: usize,
        optimizer: Optim,
    },
}

/// Which cuBLAS workspaces exist before the workload (PyTorch keeps them for the life of
/// the process once a matmul has run on a thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warmth {
    /// A fresh process: the workload's first matmul allocates them.
    Cold,
    /// An earlier forward ran: the calling thread's handle workspace exists (and the
    /// cuBLASLt one, if the model has biased linears).
    Forward,
    /// An earlier training step ran: autograd's thread has its handle too.
    Full,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOptions {
    /// Overrides the config's dtype.
    pub dtype: Option<DType>,
    /// `None`: [`Warmth::Forward`] for inference, [`Warmth::Full`] for training (a
    /// workload that has run before, as the zoo's `predict` assumes).
    pub warmth: Option<Warmth>,
    /// Seed of the random input ids.
    pub seed: u64,
}

/// [`predict`]'s simulated GPU.
#[derive(Debug, Clone)]
pub struct PredictOptions {
    pub run: RunOptions,
    /// Device capacity in bytes (default: effectively unbounded).
    pub capacity: u64,
    pub alloc_conf: AllocatorConfig,
}

impl Default for PredictOptions {
    fn default() -> Self {
        PredictOptions {
            run: RunOptions::default(),
            capacity: crate::predict::UNBOUNDED,
            alloc_conf: AllocatorConfig::default(),
        }
    }
}

/// What a workload did to memory.
#[derive(Debug, Clone)]
pub struct Report {
    /// `torch.cuda.max_memory_allocated()` over the workload (weights included).
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Allocated when the workload started: weights and buffers, plus warm library
    /// workspaces.
    pub base_allocated_bytes: u64,
    /// Parameters and buffers (requested bytes).
    pub weights_bytes: u64,
    pub end_allocated_bytes: u64,
    /// Bytes per memory category at the peak.
    pub categories: BTreeMap<&'static str, u64>,
    pub stats: BTreeMap<String, i64>,
    /// Set when weights were initialised rather than read (for the caller to print).
    pub note: Option<String>,
    /// Generate on cpu/cuda: the ids [B, P + new], row-major.
    pub tokens: Option<Vec<i64>>,
    /// Train on cpu/cuda: each step's loss.
    pub losses: Vec<f64>,
}

/// Token ids in `0..vocab`, from `seed` (a 64-bit LCG; only the values differ from
/// `torch.randint`, never the memory).
fn random_ids(shape: &[usize], vocab: usize, seed: u64, dev: &Device) -> HfResult<Tensor> {
    if dev.is_meta() {
        return Ok(Tensor::empty(shape, DType::I64, dev)?);
    }
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<i64> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab.max(1) as u64) as i64
        })
        .collect();
    Ok(Tensor::from_i64(&v, shape, dev)?)
}

fn check(w: &Workload) -> HfResult<()> {
    let bad = |m: &str| Err(HfError::Invalid(m.to_string()));
    match *w {
        Workload::Forward { batch, seq, .. } if batch == 0 || seq == 0 => {
            bad("batch and seq must be at least 1")
        }
        Workload::Generate {
            batch,
            prompt,
            new_tokens,
            ..
        } if batch == 0 || prompt == 0 || new_tokens == 0 => {
            bad("batch, prompt and new tokens must be at least 1")
        }
        Workload::Train {
            batch, seq, steps, ..
        } if batch == 0 || seq == 0 || steps == 0 => bad("batch, seq and steps must be at least 1"),
        _ => Ok(()),
    }
}

/// Loads the model of `path` onto `device` and runs `w` there.
pub fn run(path: &Path, device: &Device, w: &Workload, o: &RunOptions) -> HfResult<Report> {
    let cfg = HfConfig::from_path(path)?;
    run_config(cfg, Some(&folder_of(path)), device, w, o)
}

/// [`run`] on a parsed config, its weights from `dir` when given (see [`load_config`]).
pub fn run_config(
    cfg: HfConfig,
    dir: Option<&Path>,
    device: &Device,
    w: &Workload,
    o: &RunOptions,
) -> HfResult<Report> {
    check(w)?;
    let train = matches!(w, Workload::Train { .. });
    let opts = LoadOptions {
        dtype: o.dtype,
        bert_head: if train {
            BertHead::MaskedLm
        } else {
            BertHead::Base
        },
    };
    let loaded = load_config(cfg, dir, device, &opts)?;
    let mut model = loaded.model;
    let cfg = model.config().clone();
    if matches!(w, Workload::Generate { .. }) && !cfg.family.is_decoder() {
        return Err(HfError::Invalid(
            "generate needs a decoder (gpt2, llama, mistral, qwen2); bert is an encoder".into(),
        ));
    }
    let seq_needed = match *w {
        Workload::Forward { seq, .. } | Workload::Train { seq, .. } => seq,
        Workload::Generate {
            prompt, new_tokens, ..
        } => prompt + new_tokens,
    };
    if seq_needed > cfg.max_position_embeddings {
        return Err(HfError::Invalid(format!(
            "{seq_needed} positions exceed the model's {}",
            cfg.max_position_embeddings
        )));
    }
    // gc.collect(); torch.cuda.empty_cache() after the weights are on the device.
    device.empty_cache();
    model.train(train);
    let params = model.parameters();
    let mut opt: Option<Box<dyn Optimizer>> = match w {
        Workload::Train { optimizer, .. } => Some(match *optimizer {
            Optim::AdamW { lr, weight_decay } => Box::new(Adam::adamw(params, lr, weight_decay)?),
            Optim::Sgd { lr, momentum } => Box::new(Sgd::new(params, lr, momentum, 0.0)?),
        }),
        _ => None,
    };
    let warmth = o
        .warmth
        .unwrap_or(if train { Warmth::Full } else { Warmth::Forward });
    if warmth != Warmth::Cold {
        device.init_blas_workspaces(BlasThread::Forward, model.uses_cublaslt())?;
    }
    if warmth == Warmth::Full {
        device.init_blas_workspaces(BlasThread::Backward, false)?;
    }
    let base = device.memory_allocated();
    device.reset_peak_memory_stats();
    let vocab = cfg.vocab_size;
    let mut tokens = None;
    let mut losses = Vec::new();
    match *w {
        Workload::Forward {
            batch,
            seq,
            use_cache,
        } => {
            let ids = random_ids(&[batch, seq], vocab, o.seed, device)?;
            let _g = no_grad();
            let out = if cfg.family.is_decoder() {
                model.forward(
                    &ids,
                    ForwardArgs {
                        use_cache,
                        ..ForwardArgs::default()
                    },
                )?
            } else {
                let mask = Tensor::ones(ids.shape(), DType::I64, device)?;
                model.forward(
                    &ids,
                    ForwardArgs {
                        attention_mask: Some(&mask),
                        ..ForwardArgs::default()
                    },
                )?
            };
            drop(out);
        }
        Workload::Generate {
            batch,
            prompt,
            new_tokens,
            cache,
        } => {
            let ids = random_ids(&[batch, prompt], vocab, o.seed, device)?;
            let g = {
                let mask = Tensor::ones(ids.shape(), DType::I64, device)?;
                generate::generate(
                    &model,
                    &ids,
                    &mask,
                    &GenerateOptions {
                        max_new_tokens: new_tokens,
                        min_new_tokens: None,
                        cache,
                    },
                )?
            };
            if !device.is_meta() {
                tokens = Some(g.to_vec_i64()?);
            }
            drop(g);
        }
        Workload::Train {
            batch, seq, steps, ..
        } => {
            let mut ids: Option<Tensor> = None;
            let mut loss: Option<Tensor> = None;
            for step in 0..steps {
                ids = Some(random_ids(
                    &[batch, seq],
                    vocab,
                    o.seed.wrapping_add(step as u64),
                    device,
                )?);
                let Some(x) = ids.as_ref() else { break };
                let out = model.forward(
                    x,
                    ForwardArgs {
                        labels: Some(x),
                        ..ForwardArgs::default()
                    },
                )?;
                // `.loss` of the output; the rest of it (logits, cache) dies right away.
                let l = out
                    .loss
                    .ok_or_else(|| HfError::Invalid("the model computed no loss".into()))?;
                drop((
                    out.logits,
                    out.cache,
                    out.last_hidden_state,
                    out.pooler_output,
                ));
                loss = Some(l);
                let Some(l) = loss.as_ref() else { break };
                l.backward()?;
                if let Some(opt) = opt.as_mut() {
                    opt.step()?;
                    opt.zero_grad(true)?;
                }
                if !device.is_meta() {
                    losses.push(l.item()?);
                }
            }
            drop((loss, ids));
        }
    }
    let stats = device.allocator().memory_stats();
    let peak_reserved = stats
        .get("reserved_bytes.all.peak")
        .map(|&v| v.max(0) as u64)
        .unwrap_or_else(|| device.memory_reserved());
    let report = Report {
        peak_allocated_bytes: device.max_memory_allocated(),
        peak_reserved_bytes: peak_reserved,
        base_allocated_bytes: base,
        weights_bytes: model.nbytes(),
        end_allocated_bytes: device.memory_allocated(),
        categories: device.peak_memory_by_category().to_map(),
        stats,
        note: loaded.note,
        tokens,
        losses,
    };
    drop(opt);
    Ok(report)
}

/// [`run`] on a fresh meta device under PyTorch's caching allocator: what PyTorch 2.11 on
/// an H200 would report, from the config alone.
pub fn predict(path: &Path, w: &Workload, o: &PredictOptions) -> HfResult<Report> {
    let cfg = HfConfig::from_path(path)?;
    predict_config(cfg, w, o)
}

/// [`predict`] on a parsed config (the meta device reads no weights).
pub fn predict_config(cfg: HfConfig, w: &Workload, o: &PredictOptions) -> HfResult<Report> {
    let dev = Device::meta_caching(o.capacity, o.alloc_conf.clone());
    run_config(cfg, None, &dev, w, &o.run)
}
