//! The workload flags `vramroom predict`, `vramroom loadtest` and `vramroom serve` share,
//! and their one parser: what the user typed, as strings, into a checked [`Scenario`].
//!
//! Design note: the binary's clap structs only collect the strings; every meaning (model
//! names and `--model PATH`, `--seq` distributions, modes, optimizers, dtypes, the planted
//! mistakes, the KV cache switches) is decided here, so the three commands cannot drift
//! apart. A flag left out takes the default scenario's value, or the model's: a zoo model's
//! natural input size, a Hugging Face config's `torch_dtype`, AdamW for a Hugging Face
//! model's training (as transformers' Trainer), SGD for the zoo.

use vramroom_tensor::models::hf::CacheImpl;

use crate::error::{Result, WorkloadError};
use crate::spec::{
    parse_dtype, AccumPattern, InputDist, Mode, ModelSpec, OptimKind, Scenario, ZooModel,
};

/// New tokens of `--mode generate` when `--new` is not given.
pub const DEFAULT_NEW_TOKENS: usize = 32;

/// The workload flags as typed. `None` / `false`: not given.
#[derive(Debug, Clone, Default)]
pub struct WorkloadFlags {
    /// `--model`: a zoo name or the path of a Hugging Face config.json / folder.
    pub model: Option<String>,
    pub batch: Option<usize>,
    /// `--seq` (`--input`, `--prompt`): `128`, `uniform:16..128`, `choice:32,64`.
    pub seq: Option<String>,
    /// `--mode`: infer, train or generate.
    pub mode: Option<String>,
    pub optimizer: Option<String>,
    pub accum: Option<usize>,
    pub accum_pattern: Option<String>,
    pub dtype: Option<String>,
    pub seed: Option<u64>,
    /// `--new`: tokens to generate.
    pub new_tokens: Option<usize>,
    /// `--cache dynamic|static` (generate).
    pub cache: Option<String>,
    /// `--use-cache true|false` / `--no-cache`.
    pub use_cache: Option<bool>,
    pub grad_on: bool,
    pub sum_losses: bool,
    pub keep_outputs: bool,
    pub named_temporaries: bool,
}

fn bad(m: impl Into<String>) -> WorkloadError {
    WorkloadError::Scenario(m.into())
}

/// The input size a model takes when `--seq` is not given.
pub fn default_input(model: &ModelSpec, default: &InputDist) -> InputDist {
    let positions = |n: usize| {
        if default.max() <= n {
            default.clone()
        } else {
            InputDist::Uniform {
                lo: (n / 4).max(1),
                hi: n,
            }
        }
    };
    match model {
        ModelSpec::Zoo(ZooModel::Gpt2(c)) => positions(c.n_positions),
        ModelSpec::Hf(h) => positions(h.config.max_position_embeddings),
        ModelSpec::Zoo(ZooModel::ResNet18 { .. }) | ModelSpec::Zoo(ZooModel::ResNet50 { .. }) => {
            InputDist::Fixed(224)
        }
        ModelSpec::Zoo(ZooModel::Mlp { .. }) => InputDist::Fixed(1),
    }
}

/// `true`, `false` (and `1`/`0`, `yes`/`no`), as transformers' `use_cache` is written.
pub fn parse_bool(flag: &str, s: &str) -> Result<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        o => Err(bad(format!("{flag} {o:?}: expected true or false"))),
    }
}

fn parse_cache(s: &str) -> Result<CacheImpl> {
    match s.trim().to_ascii_lowercase().as_str() {
        "dynamic" => Ok(CacheImpl::Dynamic),
        "static" => Ok(CacheImpl::Static),
        o => Err(bad(format!(
            "unknown --cache {o:?} (expected dynamic, static)"
        ))),
    }
}

impl WorkloadFlags {
    /// The checked scenario, starting from the default one (`vramroom loadtest` with no
    /// flags).
    pub fn scenario(&self) -> Result<Scenario> {
        let mut s = Scenario::default();
        let default_input_dist = s.input.clone();
        if let Some(m) = &self.model {
            s.model = m.parse::<ModelSpec>()?;
            s.input = default_input(&s.model, &default_input_dist);
        }
        let hf = match &s.model {
            ModelSpec::Hf(h) => Some(h.clone()),
            _ => None,
        };
        if let Some(b) = self.batch {
            if b == 0 {
                return Err(bad("--batch must be at least 1"));
            }
            s.batch = b;
        }
        if let Some(d) = &self.seq {
            s.input = d.parse::<InputDist>()?;
        }
        if let Some(seed) = self.seed {
            s.seed = seed;
        }
        s.dtype = match (&self.dtype, &hf) {
            (Some(d), _) => parse_dtype(d)?,
            // A config's `torch_dtype` is the dtype transformers loads it in when asked
            // for `torch_dtype="auto"`; float32 otherwise.
            (None, Some(h)) => h.config.dtype.unwrap_or(s.dtype),
            (None, None) => s.dtype,
        };
        let optimizer = match (&self.optimizer, &hf) {
            (Some(o), _) => o
                .parse::<OptimKind>()
                .map_err(|e| WorkloadError::Scenario(e.to_string()))?,
            (None, Some(_)) => OptimKind::AdamW,
            (None, None) => OptimKind::Sgd,
        };
        let pattern = match &self.accum_pattern {
            Some(p) => p
                .parse::<AccumPattern>()
                .map_err(|e| WorkloadError::Scenario(e.to_string()))?,
            None => AccumPattern::Each,
        };
        let accum = self.accum.unwrap_or(1);
        let mode = self.mode.as_deref().unwrap_or("infer");
        s.mode = match mode.trim().to_ascii_lowercase().as_str() {
            "infer" | "inference" => Mode::Inference,
            "train" | "training" => {
                if accum == 0 {
                    return Err(bad("--accum must be at least 1"));
                }
                Mode::Training {
                    optimizer,
                    accum_steps: accum,
                    pattern,
                }
            }
            "generate" => Mode::Generate {
                new_tokens: self.new_tokens.unwrap_or(DEFAULT_NEW_TOKENS),
                cache: match &self.cache {
                    Some(c) => parse_cache(c)?,
                    None => CacheImpl::Dynamic,
                },
            },
            other => {
                return Err(bad(format!(
                    "unknown --mode {other:?} (expected infer, train, generate)"
                )))
            }
        };
        if !s.is_generate() {
            if self.new_tokens.is_some() {
                return Err(bad("--new needs --mode generate"));
            }
            if self.cache.is_some() {
                return Err(bad(
                    "--cache needs --mode generate (--no-cache turns a forward's cache off)",
                ));
            }
        }
        if !s.is_training() && (self.accum.is_some_and(|a| a != 1) || self.accum_pattern.is_some())
        {
            return Err(bad("--accum and --accum-pattern need --mode train"));
        }
        if let Some(u) = self.use_cache {
            if !s.model.is_hf_decoder() {
                return Err(bad(
                    "--use-cache/--no-cache apply to a Hugging Face decoder (--model PATH)",
                ));
            }
            if s.is_generate() && !u {
                return Err(bad("generate decodes on its KV cache: drop --no-cache"));
            }
            s.use_cache = u;
        }
        if self.sum_losses && !s.is_training() {
            return Err(bad("--sum-losses needs --mode train"));
        }
        if self.grad_on && s.is_training() {
            return Err(bad(
                "--grad-on is an inference mistake (training has grad on)",
            ));
        }
        if self.grad_on && s.is_generate() {
            return Err(bad("--grad-on applies to --mode infer"));
        }
        s.mistakes.grad_at_inference = self.grad_on;
        s.mistakes.sum_losses = self.sum_losses;
        s.mistakes.keep_outputs = self.keep_outputs;
        s.mistakes.named_temporaries = self.named_temporaries;
        if self.model.is_some() || !matches!(s.mode, Mode::Inference) {
            s.name = format!(
                "{}-{}",
                match &hf {
                    Some(h) => h.config.family.name().to_string(),
                    None => s.model.name(),
                },
                match s.mode {
                    Mode::Inference => "infer",
                    Mode::Training { .. } => "train",
                    Mode::Generate { .. } => "generate",
                }
            );
        }
        s.validate()?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(model: &str) -> WorkloadFlags {
        WorkloadFlags {
            model: Some(model.into()),
            ..WorkloadFlags::default()
        }
    }

    fn fixture(name: &str) -> String {
        format!("{}/../../fixtures/hf/{name}", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn no_flags_is_the_default_scenario() {
        assert_eq!(
            WorkloadFlags::default().scenario().unwrap(),
            Scenario::default()
        );
    }

    #[test]
    fn a_config_takes_its_dtype_and_adamw_and_the_cache() {
        let mut f = flags(&fixture("gpt2-tiny"));
        f.mode = Some("train".into());
        let s = f.scenario().unwrap();
        assert!(matches!(s.model, ModelSpec::Hf(_)));
        assert!(matches!(
            s.mode,
            Mode::Training {
                optimizer: OptimKind::AdamW,
                ..
            }
        ));
        let s = flags(&fixture("gpt2-tiny")).scenario().unwrap();
        assert!(s.use_cache);
        assert!(s.info().description.contains("use_cache"));
    }

    #[test]
    fn generate_needs_a_decoder_and_fits_the_positions() {
        let mut f = flags("zoo-gpt-small");
        f.mode = Some("generate".into());
        let e = f.scenario().unwrap_err().to_string();
        assert!(e.contains("Hugging Face decoder"), "{e}");
        let mut f = flags(&fixture("bert-tiny"));
        f.mode = Some("generate".into());
        assert!(f.scenario().is_err());
        let mut f = flags(&fixture("gpt2-tiny"));
        f.mode = Some("generate".into());
        f.seq = Some("8".into());
        f.new_tokens = Some(100_000);
        let e = f.scenario().unwrap_err().to_string();
        assert!(e.contains("max_position_embeddings"), "{e}");
    }

    #[test]
    fn switches_are_refused_where_they_mean_nothing() {
        let mut f = flags("zoo-gpt-small");
        f.use_cache = Some(false);
        assert!(f.scenario().is_err());
        let mut f = flags("zoo-gpt-small");
        f.new_tokens = Some(4);
        assert!(f.scenario().is_err());
        let mut f = flags("zoo-gpt-small");
        f.accum = Some(4);
        assert!(f.scenario().is_err());
    }
}
