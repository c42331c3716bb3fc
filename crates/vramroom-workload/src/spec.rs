//! Workload specs: what one request does, with the known mistakes as switches, and the
//! parsing of every name a user types for them.
//!
//! Design note: a request is the loop body a PyTorch user writes, statement for statement,
//! on vramroom-tensor's runtime — so the allocator sees the request sequence PyTorch's would.
//! Inference workers share one model (threads of one server process share its weights);
//! training workers each own a replica and an optimizer (N training jobs in one process),
//! because concurrent backward passes into one set of `.grad`s would race, in PyTorch too.
//!
//! The variable dimension of a request is drawn from a seeded distribution keyed by the
//! request's sequence number, not by the worker or the clock, so the same run on meta and
//! on cpu sees the same input sizes in the same order.
//!
//! A model is a zoo name or a Hugging Face `config.json` ([`ModelSpec::Hf`], see
//! [`crate::model`]); `Mode::Generate` and `Scenario::use_cache` exist for the latter.
//!
//! The planted mistakes:
//! - `grad_at_inference`: the forward runs with autograd on; every op saves its inputs for
//!   a backward that never comes, until the output is dropped.
//! - `sum_losses`: `total = total + loss / N` then one `backward()` — the graphs of all N
//!   micro-steps stay alive together.
//! - `keep_outputs`: every request's output is appended to a list that lives as long as the
//!   run (a leak; with grad on it also keeps each graph).
//! - `named_temporaries`: `h1 = f1(x); h2 = f2(h1); ...; return hn` — every intermediate
//!   stays alive until the request returns, as Python locals do, instead of dying as soon as
//!   the next layer has consumed it.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use vramroom_alloc::rng::splitmix64;
use vramroom_tensor::models::hf::CacheImpl;
use vramroom_tensor::models::Gpt2Config;
pub use vramroom_tensor::models::ZooModel;
use vramroom_tensor::DType;

use crate::error::{Result, WorkloadError};
pub use crate::model::HfModelSpec;
pub use vramroom_tensor::vocab::{AccumPattern, Mode, OptimKind};

/// The model a scenario runs.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSpec {
    /// A zoo model, in vramroom-tensor's one vocabulary of them.
    Zoo(ZooModel),
    /// A Hugging Face model from its `config.json` (`--model PATH`).
    Hf(HfModelSpec),
}

/// Names accepted by [`ModelSpec::from_str`]. A name means one model: `gpt2` is
/// transformers' `GPT2LMHeadModel` (its built-in config, [`crate::model::BUILTIN`]); the
/// zoo's own hand-written GPT, which keeps less than transformers' forward does, is
/// `zoo-gpt`.
pub const MODEL_NAMES: [&str; 9] = [
    "mlp",
    "mlp-small",
    "mlp-tiny",
    "resnet18",
    "resnet50",
    "gpt2",
    "zoo-gpt",
    "zoo-gpt-small",
    "zoo-gpt-tiny",
];

/// Names the zoo's GPT went by, and what they are now: typed, they are an error that says
/// so, not another model under the old name.
const RENAMED: [(&str, &str); 2] = [
    ("gpt2-small", "zoo-gpt-small"),
    ("gpt2-tiny", "zoo-gpt-tiny"),
];

impl ModelSpec {
    /// `zoo-gpt-small`: the zoo's GPT, 4 layers of width 128: big enough to show
    /// variable-length behaviour, small enough for real compute on two cores.
    pub fn zoo_gpt_small_config() -> Gpt2Config {
        Gpt2Config {
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
            vocab_size: 4096,
            n_positions: 256,
            dropout: 0.0,
            layer_norm_epsilon: 1e-5,
        }
    }
    pub fn name(&self) -> String {
        match self {
            ModelSpec::Zoo(ZooModel::Mlp { sizes }) if *sizes == [1024, 4096, 4096, 1000] => {
                "mlp".into()
            }
            ModelSpec::Zoo(ZooModel::Mlp { sizes }) if *sizes == [256, 1024, 1024, 10] => {
                "mlp-small".into()
            }
            ModelSpec::Zoo(ZooModel::Mlp { sizes }) if *sizes == [64, 128, 128, 10] => {
                "mlp-tiny".into()
            }
            ModelSpec::Zoo(ZooModel::Mlp { sizes }) => format!(
                "mlp[{}]",
                sizes
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join("-")
            ),
            ModelSpec::Zoo(ZooModel::ResNet18 { .. }) => "resnet18".into(),
            ModelSpec::Zoo(ZooModel::ResNet50 { .. }) => "resnet50".into(),
            ModelSpec::Zoo(ZooModel::Gpt2(c)) if *c == Gpt2Config::gpt2() => "zoo-gpt".into(),
            ModelSpec::Zoo(ZooModel::Gpt2(c)) if *c == Gpt2Config::tiny() => "zoo-gpt-tiny".into(),
            ModelSpec::Zoo(ZooModel::Gpt2(c)) if *c == Self::zoo_gpt_small_config() => {
                "zoo-gpt-small".into()
            }
            ModelSpec::Zoo(ZooModel::Gpt2(c)) => {
                format!("zoo-gpt[{}x{}]", c.n_layer, c.n_embd)
            }
            ModelSpec::Hf(h) => h.name(),
        }
    }
    /// What the drawn input size means for this model.
    pub fn size_dim(&self) -> &'static str {
        match self {
            ModelSpec::Zoo(ZooModel::Mlp { .. }) => "rows",
            ModelSpec::Zoo(ZooModel::ResNet18 { .. })
            | ModelSpec::Zoo(ZooModel::ResNet50 { .. }) => "image_side",
            ModelSpec::Zoo(ZooModel::Gpt2(_)) | ModelSpec::Hf(_) => "seq_len",
        }
    }
    /// A Hugging Face decoder (gpt2, llama, mistral, qwen2 from a config): the models
    /// that have a KV cache and can `generate`.
    pub fn is_hf_decoder(&self) -> bool {
        matches!(self, ModelSpec::Hf(h) if h.config.family.is_decoder())
    }
}

impl FromStr for ModelSpec {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "mlp" => ModelSpec::Zoo(ZooModel::Mlp {
                sizes: vec![1024, 4096, 4096, 1000],
            }),
            "mlp-small" => ModelSpec::Zoo(ZooModel::Mlp {
                sizes: vec![256, 1024, 1024, 10],
            }),
            "mlp-tiny" => ModelSpec::Zoo(ZooModel::Mlp {
                sizes: vec![64, 128, 128, 10],
            }),
            "resnet18" => ModelSpec::Zoo(ZooModel::ResNet18 { classes: 1000 }),
            "resnet50" => ModelSpec::Zoo(ZooModel::ResNet50 { classes: 1000 }),
            "zoo-gpt" => ModelSpec::Zoo(ZooModel::Gpt2(Gpt2Config::gpt2())),
            "zoo-gpt-small" => ModelSpec::Zoo(ZooModel::Gpt2(ModelSpec::zoo_gpt_small_config())),
            "zoo-gpt-tiny" => ModelSpec::Zoo(ZooModel::Gpt2(Gpt2Config::tiny())),
            other => {
                if let Some(h) = HfModelSpec::builtin(other) {
                    return Ok(ModelSpec::Hf(h?));
                }
                if let Some((_, now)) = RENAMED.iter().find(|(old, _)| *old == other) {
                    return Err(WorkloadError::Scenario(format!(
                        "model {other:?} is now {now:?}: the zoo's own GPT, named for what it \
                         is; `gpt2` is transformers' GPT-2 (GPT2LMHeadModel)"
                    )));
                }
                // Not a zoo name: a Hugging Face config.json, or a folder holding one.
                let path = Path::new(s.trim());
                if path.exists() {
                    return Ok(ModelSpec::Hf(HfModelSpec::open(path)?));
                }
                return Err(WorkloadError::Scenario(format!(
                    "unknown model {other:?} (expected one of {}, or the path of a Hugging \
                     Face config.json or of a folder holding one)",
                    MODEL_NAMES.join(", ")
                )));
            }
        })
    }
}

/// The distribution of a request's variable dimension (sequence length for GPT-2, image
/// side for ResNet, rows for the MLP).
#[derive(Debug, Clone, PartialEq)]
pub enum InputDist {
    Fixed(usize),
    /// Uniform over `lo..=hi`.
    Uniform {
        lo: usize,
        hi: usize,
    },
    /// One of these, uniformly.
    Choice(Vec<usize>),
}

impl InputDist {
    /// The size for request number `request` under `seed`: a pure function, so every device
    /// and every interleaving of workers sees the same sizes.
    pub fn draw(&self, seed: u64, request: u64) -> usize {
        let r = splitmix64(seed ^ request.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        match self {
            InputDist::Fixed(n) => *n,
            InputDist::Uniform { lo, hi } => {
                let span = (hi - lo + 1) as u64;
                lo + (r % span) as usize
            }
            InputDist::Choice(v) => v
                .get((r % v.len().max(1) as u64) as usize)
                .copied()
                .unwrap_or(1),
        }
    }
    pub fn max(&self) -> usize {
        match self {
            InputDist::Fixed(n) => *n,
            InputDist::Uniform { hi, .. } => *hi,
            InputDist::Choice(v) => v.iter().copied().max().unwrap_or(1),
        }
    }
    pub fn min(&self) -> usize {
        match self {
            InputDist::Fixed(n) => *n,
            InputDist::Uniform { lo, .. } => *lo,
            InputDist::Choice(v) => v.iter().copied().min().unwrap_or(1),
        }
    }
    pub fn is_fixed(&self) -> bool {
        self.min() == self.max()
    }
}

impl fmt::Display for InputDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputDist::Fixed(n) => write!(f, "fixed:{n}"),
            InputDist::Uniform { lo, hi } => write!(f, "uniform:{lo}..{hi}"),
            InputDist::Choice(v) => write!(
                f,
                "choice:{}",
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

impl FromStr for InputDist {
    type Err = WorkloadError;
    /// `128`, `fixed:128`, `uniform:16..128`, `choice:32,64,128`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |m: &str| {
            WorkloadError::Scenario(format!(
                "input size {s:?}: {m} (expected N, fixed:N, uniform:LO..HI or choice:A,B,...)"
            ))
        };
        let num = |t: &str| -> Result<usize> {
            match t.trim().parse::<usize>() {
                Ok(0) => Err(bad("sizes must be at least 1")),
                Ok(n) => Ok(n),
                Err(_) => Err(bad(&format!("{:?} is not a whole number", t.trim()))),
            }
        };
        let t = s.trim();
        let (kind, rest) = match t.split_once(':') {
            Some((k, r)) => (k.trim().to_ascii_lowercase(), r),
            None => ("fixed".to_string(), t),
        };
        match kind.as_str() {
            "fixed" => Ok(InputDist::Fixed(num(rest)?)),
            "uniform" => {
                let (lo, hi) = rest
                    .split_once("..")
                    .ok_or_else(|| bad("uniform needs LO..HI"))?;
                let (lo, hi) = (num(lo)?, num(hi.trim_start_matches('='))?);
                if lo > hi {
                    return Err(bad("LO must not exceed HI"));
                }
                Ok(InputDist::Uniform { lo, hi })
            }
            "choice" => {
                let v = rest.split(',').map(num).collect::<Result<Vec<_>>>()?;
                if v.is_empty() {
                    return Err(bad("choice needs at least one size"));
                }
                Ok(InputDist::Choice(v))
            }
            _ => Err(bad(&format!("unknown distribution {kind:?}"))),
        }
    }
}

/// A workload: model, batch, input sizes, mode and planted mistakes.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub model: ModelSpec,
    /// Samples per request (ignored for the MLP when the drawn size gives the rows).
    pub batch: usize,
    pub input: InputDist,
    pub mode: Mode,
    pub mistakes: Mistakes,
    pub seed: u64,
    pub dtype: DType,
    /// transformers' `use_cache` for a forward of a Hugging Face decoder: the forward
    /// returns `past_key_values` (on by default, as in transformers).
    pub use_cache: bool,
}

impl Default for Scenario {
    /// The default `vramroom loadtest` workload: a small GPT-2 serving requests of variable
    /// length (16..=128 tokens, batch 4), clean. Variable length is what makes a caching
    /// allocator's reserved memory drift from its allocated memory, so the default run has
    /// something to show in the timeline and the what-if table.
    fn default() -> Self {
        Scenario {
            name: "default".into(),
            model: ModelSpec::Zoo(ZooModel::Gpt2(ModelSpec::zoo_gpt_small_config())),
            batch: 4,
            input: InputDist::Uniform { lo: 16, hi: 128 },
            mode: Mode::Inference,
            mistakes: Mistakes::default(),
            seed: 7,
            dtype: DType::F32,
            use_cache: true,
        }
    }
}

impl Scenario {
    /// An inference scenario with a fixed size.
    pub fn inference(model: ModelSpec, batch: usize, input: InputDist) -> Scenario {
        Scenario {
            name: format!("{}-infer", model.name()),
            model,
            batch,
            input,
            ..Scenario::default()
        }
    }
    /// A training scenario.
    pub fn training(
        model: ModelSpec,
        batch: usize,
        input: InputDist,
        optimizer: OptimKind,
        accum_steps: usize,
        pattern: AccumPattern,
    ) -> Scenario {
        Scenario {
            name: format!("{}-train", model.name()),
            model,
            batch,
            input,
            mode: Mode::Training {
                optimizer,
                accum_steps,
                pattern,
            },
            ..Scenario::default()
        }
    }
    pub fn is_training(&self) -> bool {
        matches!(self.mode, Mode::Training { .. })
    }
    pub fn accum_steps(&self) -> usize {
        match self.mode {
            Mode::Training { accum_steps, .. } => accum_steps,
            Mode::Inference | Mode::Generate { .. } => 1,
        }
    }
    pub fn is_generate(&self) -> bool {
        matches!(self.mode, Mode::Generate { .. })
    }
    /// The accumulation pattern after the `sum_losses` switch is applied.
    pub fn effective_pattern(&self) -> Option<AccumPattern> {
        match self.mode {
            Mode::Training { pattern, .. } if self.mistakes.sum_losses => {
                let _ = pattern;
                Some(AccumPattern::Sum)
            }
            Mode::Training { pattern, .. } => Some(pattern),
            Mode::Inference | Mode::Generate { .. } => None,
        }
    }

    /// Checks the scenario before anything is built.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(WorkloadError::Scenario(m));
        if self.batch == 0 {
            return bad("batch must be at least 1".into());
        }
        // Input shapes are products of the flags: checked here, once, so that none wraps
        // into a small tensor further down (an image is rows x 3 x side x side).
        let side = self.input.max();
        let elems = match self.model {
            ModelSpec::Zoo(ZooModel::ResNet18 { .. })
            | ModelSpec::Zoo(ZooModel::ResNet50 { .. }) => {
                side.checked_mul(side).and_then(|x| x.checked_mul(3))
            }
            _ => Some(side),
        };
        if elems
            .and_then(|x| x.checked_mul(self.batch))
            .and_then(|x| x.checked_mul(8))
            .is_none()
        {
            return bad(format!(
                "--batch {} x {} {} does not fit in 64 bits",
                self.batch,
                self.model.size_dim(),
                side
            ));
        }
        if let Mode::Generate { new_tokens, .. } = self.mode {
            if !self.model.is_hf_decoder() {
                return bad(format!(
                    "generate needs a Hugging Face decoder (--model PATH of a gpt2, llama, \
                     mistral or qwen2 config); {} has no KV cache",
                    self.model.name()
                ));
            }
            if new_tokens == 0 {
                return bad("--new must be at least 1".into());
            }
        }
        if let Mode::Training { accum_steps, .. } = self.mode {
            if accum_steps == 0 {
                return bad("accumulation steps must be at least 1".into());
            }
        }
        match &self.model {
            ModelSpec::Zoo(ZooModel::Mlp { sizes }) => {
                if sizes.len() < 2 || sizes.contains(&0) {
                    return bad(format!("mlp sizes {sizes:?}: need at least two, none 0"));
                }
            }
            ModelSpec::Zoo(ZooModel::Gpt2(c)) => {
                if self.input.max() > c.n_positions {
                    return bad(format!(
                        "sequence length up to {} exceeds the model's n_positions {}",
                        self.input.max(),
                        c.n_positions
                    ));
                }
            }
            ModelSpec::Hf(h) => {
                let need = match self.mode {
                    Mode::Generate { new_tokens, .. } => {
                        self.input.max().saturating_add(new_tokens)
                    }
                    _ => self.input.max(),
                };
                h.validate(need, self.is_generate(), self.mistakes.named_temporaries)?
            }
            ModelSpec::Zoo(ZooModel::ResNet18 { .. })
            | ModelSpec::Zoo(ZooModel::ResNet50 { .. }) => {
                if self.input.min() < 32 {
                    return bad(format!(
                        "image side {} is too small for a ResNet (need at least 32)",
                        self.input.min()
                    ));
                }
            }
        }
        Ok(())
    }

    /// The plain-data description that goes into the result.
    pub fn info(&self) -> ScenarioInfo {
        let (kind, optimizer, accum_steps, accum_pattern) = match &self.mode {
            Mode::Inference => ("inference", None, None, None),
            Mode::Generate { .. } => ("generate", None, None, None),
            Mode::Training {
                optimizer,
                accum_steps,
                ..
            } => (
                "training",
                Some(
                    match optimizer {
                        OptimKind::Sgd => "sgd",
                        OptimKind::AdamW => "adamw",
                    }
                    .to_string(),
                ),
                Some(*accum_steps),
                Some(
                    match self.effective_pattern() {
                        Some(AccumPattern::Sum) => "sum",
                        _ => "each",
                    }
                    .to_string(),
                ),
            ),
        };
        let input = format!(
            "{} {}{}",
            self.model.size_dim(),
            self.input,
            if self.input.is_fixed() {
                String::new()
            } else {
                format!(" (seed {})", self.seed)
            }
        );
        let m = self.mistakes;
        let mut planted = Vec::new();
        if m.grad_at_inference {
            planted.push("grad on at inference");
        }
        if m.sum_losses {
            planted.push("losses summed before backward");
        }
        if m.keep_outputs {
            planted.push("outputs kept");
        }
        if m.named_temporaries {
            planted.push("named temporaries");
        }
        // What the user chose beyond the zoo's fixed setup: the KV cache and the dtype of a
        // Hugging Face model, the decode steps of generate.
        let mut extra = String::new();
        if let Mode::Generate { new_tokens, cache } = self.mode {
            extra.push_str(&format!(
                ", {new_tokens} new tokens ({} cache)",
                match cache {
                    CacheImpl::Dynamic => "dynamic",
                    CacheImpl::Static => "static",
                }
            ));
        } else if self.model.is_hf_decoder() && !self.is_training() {
            extra.push_str(if self.use_cache {
                ", use_cache"
            } else {
                ", no cache"
            });
        }
        if self.dtype != DType::F32 || matches!(self.model, ModelSpec::Hf(_)) {
            extra.push_str(&format!(", {}", self.dtype));
        }
        let description = format!(
            "{} {} batch {}, {}{}{}{}",
            self.model.name(),
            kind,
            self.batch,
            input,
            extra,
            match (&optimizer, accum_steps) {
                (Some(o), Some(n)) => format!(
                    ", {o}, {n} micro-steps ({})",
                    accum_pattern.as_deref().unwrap_or("each")
                ),
                _ => String::new(),
            },
            if planted.is_empty() {
                String::new()
            } else {
                format!("; planted: {}", planted.join(", "))
            }
        );
        ScenarioInfo {
            name: self.name.clone(),
            kind: kind.into(),
            model: self.model.name(),
            batch: self.batch,
            input,
            optimizer,
            accum_steps,
            accum_pattern,
            mistakes: self.mistakes,
            seed: self.seed,
            description,
        }
    }
}

/// Parses a dtype as users type it: `f32`, `float32`, `bf16`, `bfloat16`, `f16`,
/// `float16` (also `torch.` prefixed, as configs write it).
pub fn parse_dtype(s: &str) -> Result<DType> {
    let t = s.trim().to_ascii_lowercase();
    match t.trim_start_matches("torch.") {
        "f32" | "float32" | "fp32" | "float" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" | "fp16" | "half" => Ok(DType::F16),
        _ => Err(WorkloadError::Scenario(format!(
            "unknown dtype {s:?} (expected float32, bfloat16, float16)"
        ))),
    }
}

/// What workload ran. Mirrors [`crate::Scenario`] as plain strings and numbers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScenarioInfo {
    /// Short name, e.g. `"default"`, `"mlp-infer"`.
    pub name: String,
    /// `"inference"`, `"training"` or `"generate"`.
    pub kind: String,
    /// `"mlp"`, `"resnet18"`, `"resnet50"`, `"gpt2"`, `"zoo-gpt-tiny"`, ...
    pub model: String,
    /// Samples per request (per micro-batch in training).
    pub batch: usize,
    /// The per-request input size distribution, human-readable: `"fixed 224x224"`,
    /// `"seq_len uniform 16..128 (seed 7)"`.
    pub input: String,
    /// Training only: `"sgd"` / `"adamw"`.
    pub optimizer: Option<String>,
    /// Training only: micro-steps per optimizer step.
    pub accum_steps: Option<usize>,
    /// Training only: `"each"` (backward every micro-step) or `"sum"` (sum, then one
    /// backward).
    pub accum_pattern: Option<String>,
    /// The planted mistakes that were switched on.
    pub mistakes: Mistakes,
    /// Seed of the input-size draws.
    pub seed: u64,
    /// One line describing the whole scenario.
    pub description: String,
}

/// The known mistakes, each a switch. All false is the clean scenario.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mistakes {
    /// Inference with autograd on (no `no_grad`): activations are saved for a backward that
    /// never comes.
    pub grad_at_inference: bool,
    /// Training: `total = total + loss/N` then one backward — N graphs alive at once.
    pub sum_losses: bool,
    /// Every request's output is kept (appended to a list): a leak.
    pub keep_outputs: bool,
    /// Named temporaries (`h = l1(x); out = l2(h)`) instead of chained calls. A myth test:
    /// it is expected to make *no* difference.
    pub named_temporaries: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramroom_tensor::models::hf::Family;

    /// A name means one model: `gpt2` is transformers' GPT-2 from its built-in config (the
    /// same model as `fixtures/hf/gpt2`), the zoo's own GPT is `zoo-gpt*`, and the names it
    /// went by are an error that says what they are now.
    #[test]
    fn gpt2_is_transformers_gpt2_and_the_zoo_gpt_is_named_for_what_it_is() {
        let m: ModelSpec = "gpt2".parse().unwrap();
        let ModelSpec::Hf(h) = &m else {
            panic!("gpt2 is not transformers' model: {m:?}")
        };
        assert!(h.builtin);
        assert_eq!(h.config.family, Family::Gpt2);
        let fixture = HfModelSpec::open(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fixtures/hf/gpt2"
        )))
        .unwrap();
        assert_eq!(h.config, fixture.config);
        assert_eq!(m.name(), "gpt2");
        assert!(!h.has_weights());
        for name in ["zoo-gpt", "zoo-gpt-small", "zoo-gpt-tiny"] {
            let z: ModelSpec = name.parse().unwrap();
            assert!(matches!(z, ModelSpec::Zoo(ZooModel::Gpt2(_))), "{name}");
            assert_eq!(z.name(), name);
        }
        for (old, now) in RENAMED {
            let e = old.parse::<ModelSpec>().unwrap_err().to_string();
            assert!(e.contains(now) && e.contains("transformers"), "{e}");
        }
        for name in MODEL_NAMES {
            assert!(name.parse::<ModelSpec>().is_ok(), "{name}");
        }
    }
}
