//! Hugging Face models from their `config.json` (and `*.safetensors` weights): GPT-2,
//! Llama-family decoders (Llama, Mistral, Qwen2) and BERT encoders, computed as
//! transformers 5.17 computes them on PyTorch 2.11, so that their memory on the meta device
//! is what PyTorch allocates on an H200.
//!
//! Design note — fidelity. Each model mirrors its `modeling_*.py` statement by statement
//! ([`layers`] holds the shared Python compositions), with Python's variable lifetimes,
//! because the order in which tensors are created and released is the memory profile. What
//! transformers gets from PyTorch kernels comes from the runtime's ops, where only attention
//! is fused ([`crate::ops::attention`], with PyTorch's backend choice and allocations). The
//! KV cache is transformers' `DynamicCache` (a concatenation per token per layer) or
//! `StaticCache` ([`cache`]); a forward fills one unless `use_cache=false`, as transformers
//! does by default. Small bookkeeping tensors transformers makes on the way (mask checks,
//! generate's stopping criteria) are allocated in its order where they matter.
//!
//! Design note — devices. The meta device needs only the config: parameters are allocated
//! in the order `model.to(device)` moves them, nothing is read. On cpu and cuda the weights
//! come from the folder's `*.safetensors` when present; otherwise (or for parameters a
//! checkpoint lacks) they are initialised as transformers' `_init_weights` would, and
//! [`Loaded::note`] says so for the caller to print.
//!
//! Design note — hostile configs. Every shape a config implies is multiplied with checked
//! arithmetic when it is read ([`config`]), and before any tensor exists the weights'
//! bytes are computed from the config alone ([`footprint`]): a model the device cannot
//! hold is an out-of-memory answer naming what it needs, not a build that allocates layer
//! after layer, and a layer count past any real model's is refused.
//!
//! Entry points: [`load`] a model, call [`HfModel::forward`] or [`generate::generate`], or
//! run a whole workload with [`scenario::run`] / [`scenario::predict`].

pub mod bert;
pub mod cache;
pub mod config;
pub mod error;
pub mod footprint;
pub mod generate;
pub mod gpt2;
mod layers;
pub mod llama;
mod masking;
mod params;
pub mod scenario;
mod weights;

use std::path::{Path, PathBuf};

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops;
use crate::tensor::Tensor;

pub use bert::{Bert, BertHead, BertOutput};
pub use cache::{Cache, DynamicCache, StaticCache};
pub use config::{Activation, Family, HfConfig};
pub use error::{HfError, HfResult, SUPPORTED};
pub use generate::{generate, CacheImpl, GenerateOptions};
pub use gpt2::Gpt2LmHead;
pub use llama::LlamaForCausalLm;
pub use scenario::{
    predict, predict_config, run, run_config, Optim, PredictOptions, Report, RunOptions, Warmth,
    Workload,
};

/// How to load a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Overrides the config's `dtype` / `torch_dtype` (default float32 when neither).
    pub dtype: Option<DType>,
    /// For BERT: `BertModel` (encoder + pooler, the default) or `BertForMaskedLM`.
    pub bert_head: BertHead,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: None,
            bert_head: BertHead::Base,
        }
    }
}

/// A loaded model.
pub enum HfModel {
    Gpt2(Gpt2LmHead),
    Llama(LlamaForCausalLm),
    Bert(Bert),
}

/// [`load`]'s result: the model and, when weights were initialised rather than read, a
/// sentence saying so (for the caller to print).
pub struct Loaded {
    pub model: HfModel,
    pub note: Option<String>,
}

/// Per-forward arguments (transformers' keyword arguments).
#[derive(Default)]
pub struct ForwardArgs<'a> {
    /// `use_cache`; `None`: the config's (transformers' default, true).
    pub use_cache: Option<bool>,
    /// `past_key_values` to extend in place (generate passes its cache).
    pub cache: Option<&'a mut Cache>,
    /// A 2-d all-ones attention mask [B, past + T] (generate passes one; padding is not
    /// supported).
    pub attention_mask: Option<&'a Tensor>,
    /// int64 [B or 1, T]; `None`: `arange(past, past + T)`.
    pub position_ids: Option<&'a Tensor>,
    /// Compute logits for the last `n` positions only (0: all), as generate asks for 1.
    pub logits_to_keep: usize,
    /// Labels for the loss (causal LM: shifted inside, as transformers; BERT MLM: as is).
    pub labels: Option<&'a Tensor>,
}

/// A causal LM forward's outputs.
pub struct LmOutput {
    /// [B, T (or logits_to_keep), V] in the model dtype.
    pub logits: Tensor,
    pub loss: Option<Tensor>,
    /// The `DynamicCache` the forward created (when `use_cache` and none was passed).
    pub cache: Option<Cache>,
}

/// What [`HfModel::forward`] returns, for any family.
pub struct Output {
    pub logits: Option<Tensor>,
    pub loss: Option<Tensor>,
    pub cache: Option<Cache>,
    pub last_hidden_state: Option<Tensor>,
    pub pooler_output: Option<Tensor>,
}

/// `ForCausalLMLoss`: logits upcast to f32, labels padded with -100 and shifted by one,
/// mean cross-entropy over the rest.
pub(crate) fn lm_loss(logits: &Tensor, labels: &Tensor, vocab: usize) -> Result<Tensor> {
    if labels.ndim() != 2 || labels.dtype() != DType::I64 {
        return Err(TensorError::shape(
            "lm_loss",
            format!(
                "labels must be int64 [B, T], got {:?} {}",
                labels.shape(),
                labels.dtype()
            ),
        ));
    }
    let (b, t) = (labels.shape()[0], labels.shape()[1]);
    // logits = logits.float()
    let l32 = logits.to_dtype(DType::F32)?;
    // labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
    let padded = {
        let _g = crate::autograd::no_grad();
        let p = Tensor::full(&[b, t + 1], -100.0, DType::I64, labels.device())?;
        p.narrow(1, 0, t)?.copy_(labels)?;
        p
    };
    // shift_labels = labels[..., 1:].contiguous()
    let shift = padded.narrow(1, 1, t)?.contiguous()?;
    drop(padded);
    let flat = l32.reshape(&[l32.numel() / vocab.max(1), vocab])?;
    ops::cross_entropy(&flat, &shift.reshape(&[b * t])?)
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::BF16 | DType::F16)
}

/// Loads the model of `path` (a `config.json`, or a folder with one and optionally
/// `*.safetensors`) onto `device`.
pub fn load(path: &Path, device: &Device, opts: &LoadOptions) -> HfResult<Loaded> {
    let cfg = HfConfig::from_path(path)?;
    load_config(cfg, Some(&folder_of(path)), device, opts)
}

/// The folder of a model's path: the path itself when it is a folder, else the config's.
pub fn folder_of(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.to_path_buf()
    } else {
        path.parent().map(Path::to_path_buf).unwrap_or_default()
    }
}

/// Loads the model of a parsed config onto `device`, its weights from `dir`'s
/// `*.safetensors` when a folder is given (none: initialised as transformers does, as for
/// a folder without weights; a built-in config has no folder).
pub fn load_config(
    cfg: HfConfig,
    dir: Option<&Path>,
    device: &Device,
    opts: &LoadOptions,
) -> HfResult<Loaded> {
    let dtype = opts.dtype.or(cfg.dtype).unwrap_or(DType::F32);
    if !is_float(dtype) {
        return Err(HfError::Invalid(format!(
            "dtype {dtype} is not a floating type (float32, bfloat16, float16)"
        )));
    }
    footprint::check(&cfg, dtype, opts.bert_head, device)?;
    let weights = match dir {
        Some(dir) if !device.is_meta() => Some(weights::WeightIndex::open_dir(
            if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            },
        )?),
        _ => None,
    };
    let tree = match cfg.family {
        Family::Gpt2 => gpt2::tree(&cfg),
        Family::Bert => bert::tree(&cfg, opts.bert_head),
        _ => llama::tree(&cfg),
    };
    let (store, report) = params::build(&tree, device, dtype, weights.as_ref())?;
    let note = match &weights {
        Some(w) if w.is_empty() => Some(format!(
            "no *.safetensors in {}: weights initialised randomly (normal, std {})",
            dir.unwrap_or(Path::new(".")).display(),
            cfg.initializer_range
        )),
        Some(_) if !report.missing.is_empty() => Some(format!(
            "{} parameter(s) not in the checkpoint were initialised randomly: {}",
            report.missing.len(),
            report.missing.join(", ")
        )),
        _ => None,
    };
    let model = match cfg.family {
        Family::Gpt2 => HfModel::Gpt2(Gpt2LmHead::new(cfg, store)?),
        Family::Bert => HfModel::Bert(Bert::new(cfg, store, opts.bert_head)?),
        _ => HfModel::Llama(LlamaForCausalLm::new(cfg, store)?),
    };
    Ok(Loaded { model, note })
}

impl HfModel {
    pub fn config(&self) -> &HfConfig {
        match self {
            HfModel::Gpt2(m) => &m.cfg,
            HfModel::Llama(m) => &m.cfg,
            HfModel::Bert(m) => &m.cfg,
        }
    }
    fn store(&self) -> &params::ParamStore {
        match self {
            HfModel::Gpt2(m) => &m.store,
            HfModel::Llama(m) => &m.store,
            HfModel::Bert(m) => &m.store,
        }
    }
    pub fn dtype(&self) -> DType {
        self.store().dtype()
    }
    /// `model.named_parameters()` (each module's own before its children's, ties once).
    pub fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.store().named_parameters().to_vec()
    }
    /// `model.named_buffers()` (RoPE's `inv_freq`, BERT's position and token-type ids).
    pub fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.store().named_buffers().to_vec()
    }
    pub fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    }
    /// Bytes of parameters and buffers.
    pub fn nbytes(&self) -> u64 {
        self.store().nbytes()
    }
    /// `model.train(on)` / `model.eval()`: dropout on or off.
    pub fn train(&mut self, on: bool) {
        match self {
            HfModel::Gpt2(m) => m.training = on,
            HfModel::Llama(m) => m.training = on,
            HfModel::Bert(m) => m.training = on,
        }
    }
    /// Whether some linear layer has a bias (PyTorch routes those through cuBLASLt, whose
    /// workspace a process then holds).
    pub fn uses_cublaslt(&self) -> bool {
        let c = self.config();
        match c.family {
            Family::Gpt2 | Family::Bert => true,
            _ => c.qkv_bias || c.o_bias || c.mlp_bias,
        }
    }
    /// One forward. Decoders: `input_ids` int64 [B, T]; BERT: also `attention_mask`
    /// (all ones) and, for the masked-LM head, `labels`.
    pub fn forward(&self, input_ids: &Tensor, args: ForwardArgs) -> Result<Output> {
        if input_ids.ndim() != 2 || input_ids.dtype() != DType::I64 {
            return Err(TensorError::shape(
                "forward",
                format!(
                    "input_ids must be int64 [B, T], got {:?} {}",
                    input_ids.shape(),
                    input_ids.dtype()
                ),
            ));
        }
        let b = input_ids.shape()[0];
        for (what, t, dt) in [
            ("attention_mask", args.attention_mask, None),
            ("position_ids", args.position_ids, Some(DType::I64)),
            ("labels", args.labels, Some(DType::I64)),
        ] {
            if let Some(t) = t {
                if t.ndim() != 2 || dt.is_some_and(|d| d != t.dtype()) {
                    return Err(TensorError::shape(
                        "forward",
                        format!(
                            "{what} must be a 2-d tensor, got {:?} {}",
                            t.shape(),
                            t.dtype()
                        ),
                    ));
                }
                // Position ids may be one row for the whole batch.
                let batch_ok = t.shape()[0] == b || (what == "position_ids" && t.shape()[0] == 1);
                if !batch_ok {
                    return Err(TensorError::shape(
                        "forward",
                        format!("{what} {:?} for a batch of {b}", t.shape()),
                    ));
                }
            }
        }
        let lm = |o: LmOutput| Output {
            logits: Some(o.logits),
            loss: o.loss,
            cache: o.cache,
            last_hidden_state: None,
            pooler_output: None,
        };
        Ok(match self {
            HfModel::Gpt2(m) => lm(m.forward(input_ids, args)?),
            HfModel::Llama(m) => lm(m.forward(input_ids, args)?),
            HfModel::Bert(m) => {
                let o = m.forward(input_ids, args.attention_mask, args.labels)?;
                Output {
                    logits: o.logits,
                    loss: o.loss,
                    cache: None,
                    last_hidden_state: Some(o.last_hidden_state),
                    pooler_output: o.pooler_output,
                }
            }
        })
    }
}
