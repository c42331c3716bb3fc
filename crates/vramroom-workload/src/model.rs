//! Bring your own model: a Hugging Face `config.json` (or a folder holding one and,
//! optionally, `*.safetensors`) as a workload's model.
//!
//! Design note: the spec holds the parsed config, so everything that can be checked from it
//! (family, positions, generate on an encoder) is checked when the user's flags are parsed,
//! before a device or a file is touched. The model itself is built by
//! `vramroom_tensor::models::hf::load` on the run's device: the meta device needs only the
//! config; cpu and cuda read the folder's weights, or initialise randomly when it has none,
//! which [`HfModelSpec::weights_note`] says for the caller to print.
//!
//! A model name means one model: the names of transformers' architectures ([`BUILTIN`]:
//! `gpt2`) are transformers' own, from the config.json that `from_pretrained` reads for
//! them, embedded here and run through the same path as a user's config (no folder, so no
//! weights: random as transformers initialises them). The zoo's hand-written GPT is named
//! for what it is (`zoo-gpt`, see `spec`), not after transformers' GPT-2, whose forward
//! keeps more (at 8×512, 1086 MiB above the weights against the zoo GPT's 798).

use std::path::{Path, PathBuf};

use vramroom_tensor::models::hf::{HfConfig, HfError};

use crate::error::{Result, WorkloadError};

/// Built-in transformers configs by name: the Hub's `config.json` of each, as
/// `fixtures/hf/` holds it.
pub const BUILTIN: [(&str, &str); 1] = [(
    "gpt2",
    include_str!("../../../fixtures/hf/gpt2/config.json"),
)];

/// A Hugging Face model named by its config.
#[derive(Debug, Clone, PartialEq)]
pub struct HfModelSpec {
    /// As the user typed it (a config.json or a folder, or a built-in name).
    pub path: PathBuf,
    pub config: HfConfig,
    /// A built-in config ([`BUILTIN`]): no folder, no weights.
    pub builtin: bool,
}

/// A loader error as the user's mistake: which path, what was wrong.
pub(crate) fn hf_error(path: &Path, e: HfError) -> WorkloadError {
    match e {
        HfError::Tensor(t) => WorkloadError::Setup(t),
        HfError::Io { .. } | HfError::Config { .. } | HfError::Weights { .. } => {
            WorkloadError::Scenario(e.to_string())
        }
        other => WorkloadError::Scenario(format!("{}: {other}", path.display())),
    }
}

impl HfModelSpec {
    /// Reads and checks the config (an unsupported `model_type` is an error naming the
    /// supported families).
    pub fn open(path: &Path) -> Result<HfModelSpec> {
        let config = HfConfig::from_path(path).map_err(|e| hf_error(path, e))?;
        Ok(HfModelSpec {
            path: path.to_path_buf(),
            config,
            builtin: false,
        })
    }
    /// The built-in config named `name` ([`BUILTIN`]), if there is one.
    pub fn builtin(name: &str) -> Option<Result<HfModelSpec>> {
        let (name, text) = BUILTIN.iter().find(|(n, _)| *n == name)?;
        Some(
            HfConfig::from_json(text, name)
                .map(|config| HfModelSpec {
                    path: PathBuf::from(name),
                    config,
                    builtin: true,
                })
                .map_err(|e| hf_error(Path::new(name), e)),
        )
    }
    /// A built-in name as it is (`gpt2`); a path as typed, with the family:
    /// `fixtures/hf/gpt2 (gpt2)`.
    pub fn name(&self) -> String {
        if self.builtin {
            return self.path.display().to_string();
        }
        format!("{} ({})", self.path.display(), self.config.family.name())
    }
    /// The folder whose `*.safetensors` the model loads (none for a built-in config).
    pub fn weights_dir(&self) -> Option<PathBuf> {
        (!self.builtin).then(|| self.dir())
    }
    /// The folder the weights would be in.
    pub fn dir(&self) -> PathBuf {
        if self.path.is_dir() {
            self.path.clone()
        } else {
            match self.path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            }
        }
    }
    /// Whether the folder holds `*.safetensors` weights.
    pub fn has_weights(&self) -> bool {
        if self.builtin {
            return false;
        }
        std::fs::read_dir(self.dir())
            .map(|d| {
                d.flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            })
            .unwrap_or(false)
    }
    /// On a device that computes (cpu, cuda): the sentence to print when the weights are
    /// initialised randomly because the folder has none.
    pub fn weights_note(&self, computes: bool) -> Option<String> {
        (computes && !self.has_weights()).then(|| {
            if self.builtin {
                return format!(
                    "note: {} is transformers' architecture from its built-in config: weights \
                     initialised randomly (normal, std {})",
                    self.path.display(),
                    self.config.initializer_range
                );
            }
            format!(
                "note: no *.safetensors in {}: weights initialised randomly (normal, std {})",
                self.dir().display(),
                self.config.initializer_range
            )
        })
    }
    /// Checks what the config decides: the positions a request of the scenario needs at
    /// most (prompt + new tokens when `generate`), and the planted mistakes this family's
    /// loop has. Plain arguments, not the `Scenario`: the spec holds this model, so the
    /// model must not know the spec.
    pub(crate) fn validate(
        &self,
        need: usize,
        generate: bool,
        named_temporaries: bool,
    ) -> Result<()> {
        let bad = |m: String| Err(WorkloadError::Scenario(m));
        if need > self.config.max_position_embeddings {
            return bad(format!(
                "{need} positions (prompt/sequence{}) exceed the model's \
                 max_position_embeddings {}",
                if generate { " + new tokens" } else { "" },
                self.config.max_position_embeddings
            ));
        }
        if named_temporaries {
            return bad("--named-temporaries applies to the zoo models, not --model PATH".into());
        }
        Ok(())
    }
}
