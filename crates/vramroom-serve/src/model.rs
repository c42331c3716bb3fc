//! The served model: decoding a request into an [`Input`], running a batch of inputs, and
//! predicting a batch's memory on the meta device ([`Predictor`]).
//!
//! Design note: one function, [`ServedModel::forward_batch`], runs a batch on a device,
//! and it runs on both the serving device (cpu, later cuda) and the meta twin the
//! [`Predictor`] holds. The predicted peak is therefore the peak of exactly the op
//! sequence the worker will run — the input tensor, every activation, the output rows —
//! not of a model-level estimate. What happens on the host afterwards (reading the rows,
//! top-k, softmax) allocates nothing on the device.
//!
//! Batching needs inputs of one shape. Token inputs (GPT-2) are *bucketed*: a request's
//! sequences are right-padded with token 0 to the next power of two at or above its
//! longest sequence (at least 8, at most `n_positions`), and only requests of the same
//! bucket share a batch. Right padding is exact for a causal model: position `i` attends
//! to positions `<= i` only, so the logits at each sequence's last real token do not see
//! the padding. Buckets keep the number of distinct shapes (prediction cache entries,
//! allocator block sizes) to a handful, at the price of up to 2x the tokens of compute;
//! the prediction uses the padded length, so the memory of the padding is accounted for.
//! Images batch with images of the same height and width; MLP rows always batch.
//!
//! A Hugging Face decoder (`--model PATH`) runs transformers' forward, with its KV cache
//! (`use_cache`, on by default) alive beside the logits as `out = model(ids)` keeps it, or,
//! with `--new N` above 1, `generate(ids, max_new_tokens=N)`: the prefill and N-1 decode
//! steps on a cache that grows by one position per token. Generation takes unpadded
//! sequences (a batch shares one exact length: padding is not modelled), and the meta twin
//! runs the same generate, so each request's admission price includes its KV cache for
//! prompt + new tokens.
//!
//! An LM answers the next token of each sequence. Its head runs only on each sequence's
//! last real position (gathered before `ln_f` and the tied `lm_head`), so a batch never
//! materialises `[batch, seq, vocab]` logits: for GPT-2 at 1024 tokens that alone would be
//! 200 MB per sequence.

use std::collections::HashMap;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use vramroom_tensor::models::hf::{self, CacheImpl, ForwardArgs, GenerateOptions};
use vramroom_tensor::models::ZooNet;
use vramroom_tensor::{
    category_scope, no_grad, ops, DType, Device, MemoryCategory, Tensor, TensorError,
};
use vramroom_workload::Net;
use vramroom_workload::{ModelSpec, ZooModel};

use crate::error::ApiError;

/// The dtype models are served in.
pub const SERVE_DTYPE: DType = DType::F32;

/// Smallest token bucket.
pub const MIN_BUCKET: usize = 8;

/// Smallest image side a ResNet takes (five stride-2 stages).
pub const MIN_IMAGE_SIDE: usize = 32;

/// What kind of input a model takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Token ids `[T]` or `[N, T]`, `0 <= id < vocab`, `1 <= T <= n_positions`. `pad`:
    /// sequences are padded to buckets; otherwise (generate) a batch has one exact length.
    Lm {
        vocab: usize,
        n_positions: usize,
        pad: bool,
    },
    /// Images `[3, H, W]` or `[N, 3, H, W]`, float32, `H, W >= 32`.
    Image { classes: usize },
    /// Rows `[F]` or `[N, F]`, float32.
    Mlp { features: usize, outputs: usize },
}

/// How a Hugging Face decoder answers: `--new N` tokens (1: the next token from one
/// forward), and `use_cache` for that forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation {
    pub new_tokens: usize,
    pub use_cache: bool,
}

impl Default for Generation {
    fn default() -> Self {
        Generation {
            new_tokens: 1,
            use_cache: true,
        }
    }
}

impl Generation {
    fn generates(&self) -> bool {
        self.new_tokens > 1
    }
}

impl Family {
    pub fn of(spec: &ModelSpec) -> Family {
        Family::of_with(spec, Generation::default())
    }
    pub fn of_with(spec: &ModelSpec, gen: Generation) -> Family {
        match spec {
            ModelSpec::Zoo(ZooModel::Gpt2(c)) => Family::Lm {
                vocab: c.vocab_size,
                n_positions: c.n_positions,
                pad: true,
            },
            ModelSpec::Hf(h) => Family::Lm {
                vocab: h.config.vocab_size,
                // The prompt and the new tokens share the positions.
                n_positions: if gen.generates() {
                    h.config
                        .max_position_embeddings
                        .saturating_sub(gen.new_tokens)
                } else {
                    h.config.max_position_embeddings
                },
                pad: !gen.generates(),
            },
            ModelSpec::Zoo(ZooModel::ResNet18 { classes })
            | ModelSpec::Zoo(ZooModel::ResNet50 { classes }) => Family::Image { classes: *classes },
            ModelSpec::Zoo(ZooModel::Mlp { sizes }) => Family::Mlp {
                features: sizes.first().copied().unwrap_or(1),
                outputs: sizes.last().copied().unwrap_or(1),
            },
        }
    }
    /// Width of one output row (vocabulary or classes).
    pub fn outputs(&self) -> usize {
        match *self {
            Family::Lm { vocab, .. } => vocab,
            Family::Image { classes } => classes,
            Family::Mlp { outputs, .. } => outputs,
        }
    }
    fn default_top_k(&self) -> usize {
        match self {
            Family::Lm { .. } => 1,
            _ => 5.min(self.outputs()),
        }
    }
}

/// Requests with equal keys can share a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BatchKey {
    /// Sequences padded to `len` tokens.
    Tokens {
        len: usize,
    },
    Image {
        h: usize,
        w: usize,
    },
    Rows,
}

impl BatchKey {
    /// Work per sample, in the unit the compute-time model counts: tokens, pixels, rows.
    pub fn units_per_sample(&self) -> u64 {
        match *self {
            BatchKey::Tokens { len } => len as u64,
            BatchKey::Image { h, w } => (h * w) as u64,
            BatchKey::Rows => 1,
        }
    }
}

impl std::fmt::Display for BatchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchKey::Tokens { len } => write!(f, "tokens[{len}]"),
            BatchKey::Image { h, w } => write!(f, "image[3x{h}x{w}]"),
            BatchKey::Rows => f.write_str("rows"),
        }
    }
}

/// The bucket a sequence of `len` tokens is padded to.
pub fn bucket(len: usize, n_positions: usize) -> usize {
    len.max(MIN_BUCKET)
        .next_power_of_two()
        .min(n_positions)
        .max(len)
}

/// A decoded request, checked against the model.
#[derive(Debug, Clone)]
pub struct Input {
    pub key: BatchKey,
    /// Sequences, images or rows in this request.
    pub samples: usize,
    pub data: InputData,
    pub top_k: usize,
    pub return_logits: bool,
}

#[derive(Debug, Clone)]
pub enum InputData {
    /// One vector of ids per sequence, unpadded.
    Tokens(Vec<Vec<i64>>),
    /// `samples × per-sample` values, row-major.
    Floats(Vec<f32>),
}

/// One entry of a top-k list.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Scored {
    /// Class index, or token id for an LM.
    pub index: usize,
    pub logit: f32,
    /// Softmax probability over the whole row.
    pub prob: f32,
}

/// The answer for one sample.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SampleOutput {
    /// LMs: the argmax next token after the sequence.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_token: Option<usize>,
    pub top_k: Vec<Scored>,
    /// The whole output row (LMs: the last position's logits), only when asked.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub logits: Option<Vec<f32>>,
    /// Generate (`--new N` above 1): the N new tokens, greedy.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tokens: Option<Vec<i64>>,
}

/// The JSON request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    inputs: Value,
    #[serde(default)]
    top_k: Option<usize>,
    #[serde(default)]
    return_logits: bool,
}

/// A model built on a device, ready to run batches.
pub struct ServedModel {
    spec: ModelSpec,
    family: Family,
    net: Net,
    device: Device,
    gen: Generation,
}

impl ServedModel {
    /// Builds `spec` on `device` in eval mode (weights from the device generator: the same
    /// model on every fresh device).
    pub fn load(spec: &ModelSpec, device: &Device) -> Result<ServedModel, TensorError> {
        ServedModel::load_with(spec, device, Generation::default())
    }
    /// Builds `spec`; a Hugging Face decoder answers as `gen` says, in its config's
    /// `torch_dtype` (float32 when it names none).
    pub fn load_with(
        spec: &ModelSpec,
        device: &Device,
        gen: Generation,
    ) -> Result<ServedModel, TensorError> {
        let bad = |m: String| Err(TensorError::invalid("serve", m));
        let dtype = match spec {
            ModelSpec::Hf(h) => {
                if !h.config.family.is_decoder() {
                    return bad(format!(
                        "{} is an encoder: serve answers next tokens, so --model needs a \
                         decoder (gpt2, llama, mistral, qwen2)",
                        spec.name()
                    ));
                }
                if gen.new_tokens == 0 || gen.new_tokens >= h.config.max_position_embeddings {
                    return bad(format!(
                        "--new {} must be 1 to {} (max_position_embeddings - 1)",
                        gen.new_tokens,
                        h.config.max_position_embeddings.saturating_sub(1)
                    ));
                }
                h.config.dtype.unwrap_or(SERVE_DTYPE)
            }
            _ if gen != Generation::default() => {
                return bad(
                    "--new and --no-cache apply to --model PATH (a Hugging Face \
                            decoder)"
                        .into(),
                )
            }
            _ => SERVE_DTYPE,
        };
        let mut net = {
            let _p = category_scope(MemoryCategory::Parameter);
            Net::build(spec, device, dtype)?
        };
        net.set_train(false);
        Ok(ServedModel {
            spec: spec.clone(),
            family: Family::of_with(spec, gen),
            net,
            device: device.clone(),
            gen,
        })
    }
    pub fn generation(&self) -> Generation {
        self.gen
    }
    pub fn name(&self) -> String {
        self.spec.name()
    }
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }
    pub fn family(&self) -> Family {
        self.family
    }
    pub fn device(&self) -> &Device {
        &self.device
    }
    pub fn net(&self) -> &Net {
        &self.net
    }

    /// The batch's device tensor and, for an LM, each sequence's last real position.
    /// `inputs: None` makes zeros of the shape `n` samples of `key` take (the prediction).
    fn batch_tensor(
        &self,
        key: BatchKey,
        n: usize,
        inputs: Option<&[&Input]>,
    ) -> Result<(Tensor, Vec<usize>), TensorError> {
        let dev = &self.device;
        let _c = category_scope(MemoryCategory::Input);
        match (key, self.family) {
            (BatchKey::Tokens { len }, Family::Lm { .. }) => {
                let Some(inputs) = inputs else {
                    let x = Tensor::zeros(&[n, len], DType::I64, dev)?;
                    return Ok((x, vec![len - 1; n]));
                };
                let mut ids = vec![0.0f64; n * len];
                let mut last = Vec::with_capacity(n);
                let mut row = 0;
                for inp in inputs {
                    if let InputData::Tokens(seqs) = &inp.data {
                        for s in seqs {
                            for (j, &t) in s.iter().take(len).enumerate() {
                                ids[row * len + j] = t as f64;
                            }
                            last.push(s.len().clamp(1, len) - 1);
                            row += 1;
                        }
                    }
                }
                if row != n {
                    return Err(TensorError::invalid("serve", "batch rows do not add up"));
                }
                Ok((Tensor::from_f64(&ids, &[n, len], DType::I64, dev)?, last))
            }
            (BatchKey::Image { h, w }, Family::Image { .. }) => {
                let shape = [n, 3, h, w];
                Ok((self.float_batch(&shape, inputs)?, Vec::new()))
            }
            (BatchKey::Rows, Family::Mlp { features, .. }) => {
                Ok((self.float_batch(&[n, features], inputs)?, Vec::new()))
            }
            (k, _) => Err(TensorError::invalid(
                "serve",
                format!("batch key {k} does not fit model {}", self.name()),
            )),
        }
    }

    fn float_batch(
        &self,
        shape: &[usize],
        inputs: Option<&[&Input]>,
    ) -> Result<Tensor, TensorError> {
        let Some(inputs) = inputs else {
            return Tensor::zeros(shape, SERVE_DTYPE, &self.device);
        };
        let total: usize = shape.iter().product();
        let mut v = Vec::with_capacity(total);
        for inp in inputs {
            if let InputData::Floats(f) = &inp.data {
                v.extend(f.iter().map(|&x| x as f64));
            }
        }
        Tensor::from_f64(&v, shape, SERVE_DTYPE, &self.device)
    }

    /// Runs `n` samples of `key` under `no_grad` and returns the output rows `[n, C]` on the
    /// device (LMs: the logits at each sequence's last real token). The same op sequence on
    /// the serving device and on the meta twin.
    pub fn forward_batch(
        &self,
        key: BatchKey,
        n: usize,
        inputs: Option<&[&Input]>,
    ) -> Result<Tensor, TensorError> {
        let _g = no_grad();
        let (x, last) = self.batch_tensor(key, n, inputs)?;
        match &self.net {
            Net::Zoo(ZooNet::Gpt2(m)) => {
                let t = x.shape().get(1).copied().unwrap_or(0);
                let dev = x.device();
                let pos = {
                    let _c = category_scope(MemoryCategory::Input);
                    Tensor::arange(t, DType::I64, dev)?.reshape(&[1, t])?
                };
                let tok = m.wte.forward(&x)?;
                drop(x);
                let pose = m.wpe.forward(&pos)?;
                drop(pos);
                let mut h = tok.add(&pose)?;
                drop((tok, pose));
                h = m.drop.forward(&h)?;
                for block in &m.h {
                    h = block.forward(&h)?;
                }
                // Gather each sequence's last real position before ln_f and the head: both
                // act per position, so this is the full model's answer at that position.
                let rows = last
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| h.narrow(0, i, 1)?.narrow(1, p, 1))
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&Tensor> = rows.iter().collect();
                let g = Tensor::cat(&refs, 0)?;
                drop((rows, h));
                let e = m.config.n_embd;
                let g = m.ln_f.forward(&g.reshape(&[n, e])?)?;
                ops::linear(&g, &m.wte.weight, None)
            }
            Net::Hf(m) if self.gen.generates() => {
                let mask = {
                    let _c = category_scope(MemoryCategory::Input);
                    Tensor::ones(x.shape(), DType::I64, x.device())?
                };
                hf::generate(
                    m,
                    &x,
                    &mask,
                    &GenerateOptions {
                        max_new_tokens: self.gen.new_tokens,
                        min_new_tokens: None,
                        cache: CacheImpl::Dynamic,
                    },
                )
            }
            Net::Hf(m) => {
                // `out = model(input_ids=ids, use_cache=...)`: logits [n, T, V] and the KV
                // cache, both alive until the answer rows are taken.
                let out = m.forward(
                    &x,
                    ForwardArgs {
                        use_cache: Some(self.gen.use_cache),
                        ..ForwardArgs::default()
                    },
                )?;
                drop(x);
                let logits = out
                    .logits
                    .ok_or_else(|| TensorError::invalid("serve", "the model gave no logits"))?;
                let v = logits.shape().last().copied().unwrap_or(1);
                let rows = last
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| logits.narrow(0, i, 1)?.narrow(1, p, 1))
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&Tensor> = rows.iter().collect();
                let g = Tensor::cat(&refs, 0)?.reshape(&[n, v])?;
                drop((rows, logits, out.cache));
                if g.dtype() == DType::F32 {
                    Ok(g)
                } else {
                    g.to_dtype(DType::F32)
                }
            }
            net => net.forward(&x, false),
        }
    }

    /// Runs a batch of requests on the serving device and answers each.
    pub fn run(
        &self,
        key: BatchKey,
        inputs: &[&Input],
    ) -> Result<Vec<Vec<SampleOutput>>, TensorError> {
        let n: usize = inputs.iter().map(|i| i.samples).sum();
        let out = self.forward_batch(key, n, Some(inputs))?;
        if self.gen.generates() && matches!(self.net, Net::Hf(_)) {
            return self.answer_generated(key, inputs, out);
        }
        let c = self.family.outputs();
        let flat = out.to_vec_f32()?;
        drop(out);
        if flat.len() != n * c {
            return Err(TensorError::invalid(
                "serve",
                format!("model returned {} values for {n} rows of {c}", flat.len()),
            ));
        }
        let mut rows = flat.chunks(c);
        let lm = matches!(self.family, Family::Lm { .. });
        Ok(inputs
            .iter()
            .map(|inp| {
                (0..inp.samples)
                    .filter_map(|_| rows.next())
                    .map(|row| answer(row, inp.top_k, inp.return_logits, lm))
                    .collect()
            })
            .collect())
    }

    /// Generate's answers: each sequence's new tokens (the ids after its prompt).
    fn answer_generated(
        &self,
        key: BatchKey,
        inputs: &[&Input],
        out: Tensor,
    ) -> Result<Vec<Vec<SampleOutput>>, TensorError> {
        let BatchKey::Tokens { len } = key else {
            return Err(TensorError::invalid("serve", "generate takes token ids"));
        };
        let width = out.shape().get(1).copied().unwrap_or(0);
        let ids = out.to_vec_i64()?;
        drop(out);
        let mut rows = ids.chunks(width.max(1));
        Ok(inputs
            .iter()
            .map(|inp| {
                (0..inp.samples)
                    .filter_map(|_| rows.next())
                    .map(|row| {
                        let new = row.get(len..).unwrap_or(&[]).to_vec();
                        SampleOutput {
                            next_token: new.first().map(|&t| t.max(0) as usize),
                            top_k: Vec::new(),
                            logits: None,
                            tokens: Some(new),
                        }
                    })
                    .collect()
            })
            .collect())
    }

    /// Decodes a JSON body: `{"inputs": ..., "top_k": k, "return_logits": bool}`.
    pub fn decode_json(&self, body: &[u8], max_samples: usize) -> Result<Input, ApiError> {
        let req: JsonRequest = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
        let (data, samples, key) = match self.family {
            Family::Lm {
                vocab,
                n_positions,
                pad,
            } => {
                let seqs = json_tokens(&req.inputs)?;
                let (samples, key) = check_tokens(&seqs, vocab, n_positions, pad)?;
                (InputData::Tokens(seqs), samples, key)
            }
            _ => {
                let (shape, data) = json_floats(&req.inputs)?;
                let (samples, key) = self.check_float_shape(&shape)?;
                (InputData::Floats(data), samples, key)
            }
        };
        self.finish(
            key,
            samples,
            data,
            req.top_k,
            req.return_logits,
            max_samples,
        )
    }

    /// Decodes a binary body: raw little-endian values of `shape` (`X-Shape: 2,3,32,32`) and
    /// `dtype` (`X-Dtype`: `float32`, `int64` or `int32`), row-major.
    pub fn decode_binary(
        &self,
        shape: &[usize],
        dtype: &str,
        body: &[u8],
        top_k: Option<usize>,
        return_logits: bool,
        max_samples: usize,
    ) -> Result<Input, ApiError> {
        let size = match dtype {
            "float32" | "int32" => 4,
            "int64" => 8,
            other => {
                return Err(ApiError::unprocessable(format!(
                    "X-Dtype {other:?} is not supported (expected float32, int64 or int32)"
                )))
            }
        };
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .filter(|n| n.checked_mul(size).is_some())
            .ok_or_else(|| ApiError::unprocessable(format!("X-Shape {shape:?} is too large")))?;
        if body.len() != numel * size {
            return Err(ApiError::unprocessable(format!(
                "body is {} bytes; X-Shape {shape:?} of {dtype} needs {}",
                body.len(),
                numel * size
            )));
        }
        let (data, samples, key) = match self.family {
            Family::Lm {
                vocab,
                n_positions,
                pad,
            } => {
                let ids: Vec<i64> = match size {
                    8 => body
                        .chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                        .collect(),
                    _ if dtype == "int32" => body
                        .chunks_exact(4)
                        .map(|b| i32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as i64)
                        .collect(),
                    _ => {
                        return Err(ApiError::unprocessable(format!(
                            "model {} takes token ids: X-Dtype int64 or int32, not {dtype}",
                            self.name()
                        )))
                    }
                };
                let seqs: Vec<Vec<i64>> = match shape {
                    [_] => vec![ids],
                    [_, t] if *t > 0 => ids.chunks(*t).map(|c| c.to_vec()).collect(),
                    _ => {
                        return Err(ApiError::unprocessable(format!(
                            "token ids must have shape [T] or [N, T], got {shape:?}"
                        )))
                    }
                };
                let (samples, key) = check_tokens(&seqs, vocab, n_positions, pad)?;
                (InputData::Tokens(seqs), samples, key)
            }
            _ => {
                if dtype != "float32" {
                    return Err(ApiError::unprocessable(format!(
                        "model {} takes float32 inputs, not {dtype}",
                        self.name()
                    )));
                }
                let (samples, key) = self.check_float_shape(shape)?;
                let data = body
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
                    .collect::<Vec<_>>();
                if let Some(i) = data.iter().position(|x| !x.is_finite()) {
                    return Err(ApiError::unprocessable(format!(
                        "value {i} is not finite ({})",
                        data[i]
                    )));
                }
                (InputData::Floats(data), samples, key)
            }
        };
        self.finish(key, samples, data, top_k, return_logits, max_samples)
    }

    fn finish(
        &self,
        key: BatchKey,
        samples: usize,
        data: InputData,
        top_k: Option<usize>,
        return_logits: bool,
        max_samples: usize,
    ) -> Result<Input, ApiError> {
        if samples > max_samples {
            return Err(ApiError::unprocessable(format!(
                "{samples} samples in one request; the server batches at most {max_samples} \
                 (--max-batch)"
            )));
        }
        let top_k = top_k
            .unwrap_or_else(|| self.family.default_top_k())
            .min(self.family.outputs());
        Ok(Input {
            key,
            samples,
            data,
            top_k,
            return_logits,
        })
    }

    /// Samples and batch key of a float input of `shape`.
    fn check_float_shape(&self, shape: &[usize]) -> Result<(usize, BatchKey), ApiError> {
        match self.family {
            Family::Mlp { features, .. } => match *shape {
                [f] if f == features => Ok((1, BatchKey::Rows)),
                [n, f] if f == features && n > 0 => Ok((n, BatchKey::Rows)),
                _ => Err(ApiError::unprocessable(format!(
                    "model {} takes rows of {features} values: shape [{features}] or \
                     [N, {features}], got {shape:?}",
                    self.name()
                ))),
            },
            Family::Image { .. } => {
                let (n, c, h, w) = match *shape {
                    [c, h, w] => (1, c, h, w),
                    [n, c, h, w] => (n, c, h, w),
                    _ => (0, 0, 0, 0),
                };
                if n == 0 || c != 3 || h < MIN_IMAGE_SIDE || w < MIN_IMAGE_SIDE {
                    return Err(ApiError::unprocessable(format!(
                        "model {} takes images of shape [3, H, W] or [N, 3, H, W] with H, W >= \
                         {MIN_IMAGE_SIDE}, got {shape:?}",
                        self.name()
                    )));
                }
                Ok((n, BatchKey::Image { h, w }))
            }
            Family::Lm { .. } => Err(ApiError::unprocessable("expected token ids")),
        }
    }
}

/// Top-k, probabilities and optionally the row itself, on the host.
fn answer(row: &[f32], k: usize, return_logits: bool, lm: bool) -> SampleOutput {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let mut idx: Vec<usize> = (0..row.len()).collect();
    // Ties go to the lower index, as torch.argmax does.
    let by_logit = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k.max(1) - 1, by_logit);
        idx.truncate(k.max(1));
    }
    idx.sort_by(by_logit);
    let argmax = idx.first().copied();
    idx.truncate(k);
    let top_k = idx
        .into_iter()
        .map(|i| Scored {
            index: i,
            logit: row[i],
            prob: (((row[i] - max) as f64).exp() / z) as f32,
        })
        .collect();
    SampleOutput {
        next_token: if lm { argmax } else { None },
        top_k,
        logits: return_logits.then(|| row.to_vec()),
        tokens: None,
    }
}

/// `[ids]`, `[[ids], [ids]]` or `{"shape": [N, T], "data": [...]}`.
fn json_tokens(v: &Value) -> Result<Vec<Vec<i64>>, ApiError> {
    let bad = || {
        ApiError::unprocessable(
            "\"inputs\" must be token ids: a list of integers, a list of lists of integers, \
             or {\"shape\": [N, T], \"data\": [...]}",
        )
    };
    let ints = |a: &[Value]| -> Result<Vec<i64>, ApiError> {
        a.iter()
            .map(|x| {
                x.as_i64().ok_or_else(|| {
                    ApiError::unprocessable(format!("token id {x} is not an integer"))
                })
            })
            .collect()
    };
    match v {
        Value::Array(a) if a.first().is_some_and(Value::is_array) => a
            .iter()
            .map(|s| s.as_array().ok_or_else(bad).and_then(|s| ints(s)))
            .collect(),
        Value::Array(a) => Ok(vec![ints(a)?]),
        Value::Object(_) => {
            let (shape, data) = json_shape_data(v)?;
            let ids = data
                .iter()
                .map(|&x| {
                    if x.fract() == 0.0 && x.abs() < 9.0e15 {
                        Ok(x as i64)
                    } else {
                        Err(ApiError::unprocessable(format!(
                            "token id {x} is not an integer"
                        )))
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            match shape.as_slice() {
                [_] => Ok(vec![ids]),
                [_, t] if *t > 0 => Ok(ids.chunks(*t).map(|c| c.to_vec()).collect()),
                _ => Err(ApiError::unprocessable(format!(
                    "token ids must have shape [T] or [N, T], got {shape:?}"
                ))),
            }
        }
        _ => Err(bad()),
    }
}

fn check_tokens(
    seqs: &[Vec<i64>],
    vocab: usize,
    n_positions: usize,
    pad: bool,
) -> Result<(usize, BatchKey), ApiError> {
    if seqs.is_empty() {
        return Err(ApiError::unprocessable("no sequences in \"inputs\""));
    }
    let mut longest = 0;
    for (i, s) in seqs.iter().enumerate() {
        if s.is_empty() || s.len() > n_positions {
            return Err(ApiError::unprocessable(format!(
                "sequence {i} has {} tokens; the model takes 1 to {n_positions}",
                s.len()
            )));
        }
        if let Some(t) = s.iter().find(|&&t| t < 0 || t as u64 >= vocab as u64) {
            return Err(ApiError::unprocessable(format!(
                "token id {t} in sequence {i} is outside the vocabulary 0..{vocab}"
            )));
        }
        if !pad && i > 0 && s.len() != longest {
            return Err(ApiError::unprocessable(format!(
                "sequence {i} has {} tokens and sequence 0 has {longest}: generation takes \
                 sequences of one length per request (no padding)",
                s.len()
            )));
        }
        longest = longest.max(s.len());
    }
    if !pad {
        return Ok((seqs.len(), BatchKey::Tokens { len: longest }));
    }
    Ok((
        seqs.len(),
        BatchKey::Tokens {
            len: bucket(longest, n_positions),
        },
    ))
}

/// A nested numeric array (rectangular) or `{"shape": [...], "data": [...]}`: the shape
/// and the flat values.
fn json_floats(v: &Value) -> Result<(Vec<usize>, Vec<f32>), ApiError> {
    let (shape, data) =
        match v {
            Value::Object(_) => json_shape_data(v)?,
            Value::Array(_) => {
                let mut shape = Vec::new();
                let mut cur = v;
                while let Value::Array(a) = cur {
                    shape.push(a.len());
                    match a.first() {
                        Some(x) => cur = x,
                        None => break,
                    }
                }
                let mut data = Vec::with_capacity(shape.iter().product());
                flatten(v, &shape, 0, &mut data)?;
                (shape, data)
            }
            _ => return Err(ApiError::unprocessable(
                "\"inputs\" must be a nested numeric array or {\"shape\": [...], \"data\": [...]}",
            )),
        };
    let data: Vec<f32> = data.into_iter().map(|x| x as f32).collect();
    if let Some(i) = data.iter().position(|x| !x.is_finite()) {
        return Err(ApiError::unprocessable(format!(
            "value {i} of \"inputs\" does not fit a float32"
        )));
    }
    Ok((shape, data))
}

fn flatten(v: &Value, shape: &[usize], depth: usize, out: &mut Vec<f64>) -> Result<(), ApiError> {
    match (v, shape.get(depth)) {
        (Value::Array(a), Some(&n)) if a.len() == n => {
            for x in a {
                flatten(x, shape, depth + 1, out)?;
            }
            Ok(())
        }
        (Value::Number(x), None) => {
            out.push(x.as_f64().unwrap_or(f64::NAN));
            Ok(())
        }
        (Value::Array(a), Some(&n)) => Err(ApiError::unprocessable(format!(
            "ragged array: {} elements at depth {depth} where the first had {n}",
            a.len()
        ))),
        (other, _) => Err(ApiError::unprocessable(format!(
            "unexpected {} at depth {depth} of \"inputs\" (expected a rectangular array of \
             numbers)",
            json_kind(other)
        ))),
    }
}

fn json_shape_data(v: &Value) -> Result<(Vec<usize>, Vec<f64>), ApiError> {
    let shape = v
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect::<Option<Vec<usize>>>()
        })
        .ok_or_else(|| {
            ApiError::unprocessable("\"inputs.shape\" must be a list of non-negative integers")
        })?;
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::unprocessable("\"inputs.data\" must be a flat list of numbers"))?;
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if numel != Some(data.len()) {
        return Err(ApiError::unprocessable(format!(
            "\"inputs.data\" has {} values; shape {shape:?} needs {}",
            data.len(),
            numel.map_or("more".to_string(), |n| n.to_string())
        )));
    }
    let data = data
        .iter()
        .map(|x| {
            x.as_f64().ok_or_else(|| {
                ApiError::unprocessable(format!("{x} in \"inputs.data\" is not a number"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((shape, data))
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Predicts a batch's peak memory by running it on a meta twin of the served model.
///
/// The twin is the same model and dtype on a meta device under the same allocator config
/// (and the same library-workspace policy) as the serving device. A prediction is the
/// peak `memory_allocated` above what was allocated before the batch; predictions are
/// cached by `(key, samples)`, so each shape runs once.
pub struct Predictor {
    state: Mutex<PredState>,
}

/// Most predictions the cache holds. Each distinct (input shape, batch size) is an entry,
/// and a client choosing its image sizes chooses how many there are: without a bound the
/// cache (and the twin's cached segments) grew by 17 MB of RSS per 1000 image shapes. A
/// prediction is a meta forward pass (micro- to milliseconds), so an evicted one is cheap
/// to make again.
pub const PREDICTION_CACHE_ENTRIES: usize = 4096;

struct PredState {
    model: ServedModel,
    /// Most entries (normally [`PREDICTION_CACHE_ENTRIES`]).
    capacity: usize,
    /// (prediction, last use) by (shape, batch size).
    cache: HashMap<(BatchKey, usize), (u64, u64)>,
    /// Use counter for least-recently-used eviction.
    clock: u64,
    evicted: u64,
}

impl PredState {
    fn get(&mut self, k: (BatchKey, usize)) -> Option<u64> {
        self.clock += 1;
        let now = self.clock;
        self.cache.get_mut(&k).map(|e| {
            e.1 = now;
            e.0
        })
    }
    /// Inserts, evicting the least recently used quarter when full: the sort is paid once
    /// per `capacity / 4` misses, so a miss costs O(log n) amortized.
    fn insert(&mut self, k: (BatchKey, usize), v: u64) {
        if self.cache.len() >= self.capacity {
            let mut uses: Vec<u64> = self.cache.values().map(|e| e.1).collect();
            uses.sort_unstable();
            let cut = uses[(self.capacity / 4).min(uses.len() - 1)];
            let before = self.cache.len();
            self.cache.retain(|_, e| e.1 >= cut);
            self.evicted += (before - self.cache.len()) as u64;
        }
        self.clock += 1;
        self.cache.insert(k, (v, self.clock));
    }
}

impl Predictor {
    pub fn new(spec: &ModelSpec, meta: &Device) -> Result<Predictor, TensorError> {
        Self::with_cache_capacity(spec, meta, PREDICTION_CACHE_ENTRIES)
    }
    /// A predictor whose twin answers as `gen` says (generate: the KV cache of prompt +
    /// new tokens is in every prediction).
    pub fn with_generation(
        spec: &ModelSpec,
        meta: &Device,
        gen: Generation,
    ) -> Result<Predictor, TensorError> {
        Ok(Predictor {
            state: Mutex::new(PredState {
                model: ServedModel::load_with(spec, meta, gen)?,
                capacity: PREDICTION_CACHE_ENTRIES,
                cache: HashMap::new(),
                clock: 0,
                evicted: 0,
            }),
        })
    }
    /// A predictor whose cache holds at most `capacity` predictions (at least 1).
    pub fn with_cache_capacity(
        spec: &ModelSpec,
        meta: &Device,
        capacity: usize,
    ) -> Result<Predictor, TensorError> {
        Ok(Predictor {
            state: Mutex::new(PredState {
                model: ServedModel::load(spec, meta)?,
                capacity: capacity.max(1),
                cache: HashMap::new(),
                clock: 0,
                evicted: 0,
            }),
        })
    }
    /// The cached prediction, if this shape has run.
    pub fn cached(&self, key: BatchKey, samples: usize) -> Option<u64> {
        self.state.lock().get((key, samples))
    }
    /// (entries cached now, entries evicted since start).
    pub fn cache_stats(&self) -> (usize, u64) {
        let st = self.state.lock();
        (st.cache.len(), st.evicted)
    }
    /// Peak bytes above the base that `samples` samples of `key` take. Runs the meta twin on
    /// a cache miss (microseconds to milliseconds: no data is touched).
    pub fn predict(&self, key: BatchKey, samples: usize) -> Result<u64, TensorError> {
        let mut st = self.state.lock();
        if let Some(p) = st.get((key, samples)) {
            return Ok(p);
        }
        let dev = st.model.device().clone();
        let before = dev.memory_allocated();
        dev.reset_peak_memory_stats();
        let out = st.model.forward_batch(key, samples, None)?;
        drop(out);
        let peak = dev.max_memory_allocated().saturating_sub(before);
        // The prediction is the peak *allocated*, which the twin's cached free segments do
        // not change; giving them back keeps the twin's bookkeeping from growing with every
        // new shape a client sends.
        dev.empty_cache();
        st.insert((key, samples), peak);
        Ok(peak)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_within_the_context() {
        assert_eq!(bucket(1, 1024), 8);
        assert_eq!(bucket(8, 1024), 8);
        assert_eq!(bucket(9, 1024), 16);
        assert_eq!(bucket(600, 1024), 1024);
        assert_eq!(bucket(20, 24), 24);
        assert_eq!(bucket(3, 4), 4);
    }

    #[test]
    fn top_k_is_sorted_and_argmax_breaks_ties_low() {
        let o = answer(&[1.0, 3.0, 3.0, -1.0], 2, false, true);
        assert_eq!(o.next_token, Some(1));
        assert_eq!(
            o.top_k.iter().map(|s| s.index).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let p: f32 = answer(&[1.0, 3.0, 3.0, -1.0], 4, false, false)
            .top_k
            .iter()
            .map(|s| s.prob)
            .sum();
        assert!((p - 1.0).abs() < 1e-6);
        assert!(answer(&[1.0, 2.0], 0, false, true).top_k.is_empty());
        assert_eq!(answer(&[1.0, 2.0], 0, false, true).next_token, Some(1));
    }

    #[test]
    fn nested_arrays_must_be_rectangular() {
        let v: Value = serde_json::from_str("[[1, 2], [3, 4], [5, 6]]").unwrap();
        assert_eq!(
            json_floats(&v).unwrap(),
            (vec![3, 2], vec![1., 2., 3., 4., 5., 6.])
        );
        for bad in ["[[1, 2], [3]]", "[[1, 2], 3]", "[1, \"x\"]", "\"x\""] {
            let v: Value = serde_json::from_str(bad).unwrap();
            let e = json_floats(&v).unwrap_err();
            assert_eq!(e.status.as_u16(), 422, "{bad}: {}", e.message);
        }
        let v: Value = serde_json::from_str(r#"{"shape": [2, 2], "data": [1, 2, 3]}"#).unwrap();
        assert!(json_floats(&v).unwrap_err().message.contains("needs 4"));
    }

    use proptest::prelude::*;
    use vramroom_alloc::AllocatorConfig;
    use vramroom_workload::RunDevice;

    fn lm() -> ServedModel {
        let d = RunDevice::cpu(1 << 30, &AllocatorConfig::default()).device;
        ServedModel::load(&"zoo-gpt-tiny".parse().unwrap(), &d).unwrap()
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-100i64..100).prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "[a-z]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,6}", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Any body is an input or a 400/422, never a panic, and an accepted input is one
        /// the model can batch: within the context, the vocabulary and --max-batch.
        #[test]
        fn any_body_decodes_or_is_a_client_error(
            inputs in json_value(),
            raw in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let m = lm();
            for body in [serde_json::to_vec(&serde_json::json!({"inputs": inputs})).unwrap(), raw] {
                match m.decode_json(&body, 4) {
                    Ok(inp) => {
                        prop_assert!(inp.samples >= 1 && inp.samples <= 4);
                        let BatchKey::Tokens { len } = inp.key else { panic!("key") };
                        let InputData::Tokens(seqs) = &inp.data else { panic!("data") };
                        for s in seqs {
                            prop_assert!(!s.is_empty() && s.len() <= len && len <= 32);
                            prop_assert!(s.iter().all(|&t| (0..50).contains(&t)));
                        }
                    }
                    Err(e) => prop_assert!([400, 422].contains(&e.status.as_u16()), "{}", e.message),
                }
            }
        }
    }

    /// The meta twin's prediction is the serving device's measured peak, to the byte: the
    /// same op sequence on the same allocator policy.
    #[test]
    fn predictions_equal_the_measured_peaks() {
        let conf = AllocatorConfig::default();
        for (model, key, n) in [
            ("zoo-gpt-tiny", BatchKey::Tokens { len: 16 }, 3),
            ("zoo-gpt-small", BatchKey::Tokens { len: 64 }, 2),
            ("mlp-small", BatchKey::Rows, 5),
            ("resnet18", BatchKey::Image { h: 32, w: 40 }, 2),
        ] {
            let spec: ModelSpec = model.parse().unwrap();
            let d = crate::device::open_device(crate::ServeDevice::Cpu, 1 << 30, &conf).unwrap();
            let m = ServedModel::load(&spec, &d.run.device).unwrap();
            let inputs: Vec<Input> = (0..n)
                .map(|i| {
                    let data = match key {
                        BatchKey::Tokens { len } => {
                            InputData::Tokens(vec![(0..len as i64 - i as i64).collect()])
                        }
                        BatchKey::Image { h, w } => InputData::Floats(vec![0.25; 3 * h * w]),
                        BatchKey::Rows => InputData::Floats(vec![0.5; 256]),
                    };
                    Input {
                        key,
                        samples: 1,
                        data,
                        top_k: 1,
                        return_logits: false,
                    }
                })
                .collect();
            let refs: Vec<&Input> = inputs.iter().collect();
            let dev = m.device();
            // Warm once (a first run may create cached segments), then measure.
            m.run(key, &refs).unwrap();
            let before = dev.memory_allocated();
            dev.reset_peak_memory_stats();
            m.run(key, &refs).unwrap();
            let actual = dev.max_memory_allocated() - before;
            let p = Predictor::new(&spec, &d.twin).unwrap();
            assert_eq!(p.predict(key, n).unwrap(), actual, "{model} {key} x{n}");
            assert_eq!(
                dev.memory_allocated(),
                before,
                "{model}: the batch left memory behind"
            );
        }
    }
}
