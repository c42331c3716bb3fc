//! `vramroom predict`: a scenario's peak memory for one request on the meta device, in the
//! same vocabulary as `vramroom loadtest` (model names or `--model PATH`, `--seq`
//! distributions, modes, mistakes).
//!
//! Design note: the prediction is of the largest request the scenario can make (the
//! distribution's largest size), because that is the one that decides whether it fits.
//! Zoo models run `vramroom_tensor::predict` (the loop the ground-truth figures were
//! measured with); Hugging Face models run `vramroom_tensor::models::hf::scenario::predict`
//! (transformers' loop, as `scripts/hf_memory.py` recorded it on an H200). Both run on a
//! fresh meta device under PyTorch's caching allocator, so the figures are what
//! `torch.cuda.max_memory_allocated()` / `max_memory_reserved()` would report.

use std::collections::BTreeMap;

use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::models::hf::{self, Optim};
use vramroom_tensor::predict as zoo;

use crate::error::{Result, WorkloadError};
use crate::model::hf_error;
use crate::spec::{AccumPattern, Mode, ModelSpec, OptimKind, Scenario, ZooModel};

/// The simulated GPU.
#[derive(Debug, Clone)]
pub struct PredictDevice {
    /// Bytes (default: effectively unbounded).
    pub capacity: u64,
    pub alloc_conf: AllocatorConfig,
    /// Optimizer steps a training prediction runs; `None`: 1 for the zoo (the figures it
    /// was calibrated on), 3 for a Hugging Face model (as recorded; AdamW's state exists
    /// from the first step on, so steps 2 and 3 hold it beside the activations).
    pub steps: Option<usize>,
}

impl Default for PredictDevice {
    fn default() -> Self {
        PredictDevice {
            capacity: zoo::UNBOUNDED,
            alloc_conf: AllocatorConfig::default(),
            steps: None,
        }
    }
}

/// What one request of the scenario does to memory.
#[derive(Debug, Clone)]
pub struct Prediction {
    /// The input size predicted (the distribution's largest).
    pub size: usize,
    pub batch: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Allocated before the request: weights, optimizer, library workspaces (zoo: inputs
    /// too).
    pub base_bytes: u64,
    /// Peak minus base.
    pub peak_over_base_bytes: u64,
    /// Bytes per memory category at the peak.
    pub categories: BTreeMap<&'static str, u64>,
    /// `memory_stats()` after the request.
    pub stats: BTreeMap<String, i64>,
    /// `memory_summary()` (zoo models).
    pub summary: Option<String>,
}

impl Prediction {
    /// `vramroom predict --json` and Python's `vramroom.predict()`: one object, so the two
    /// cannot drift apart.
    pub fn to_json(&self, sc: &Scenario) -> serde_json::Value {
        serde_json::json!({
            "scenario": sc.info(),
            "size": self.size,
            "batch": self.batch,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "base_bytes": self.base_bytes,
            "peak_over_base_bytes": self.peak_over_base_bytes,
            "categories": self.categories,
            "stats": self.stats,
        })
    }
}

fn unsupported(what: &str) -> WorkloadError {
    WorkloadError::Scenario(format!(
        "{what} is not predicted by `vramroom predict` (one request); `vramroom loadtest` \
         runs it"
    ))
}

/// The zoo's predict options for a scenario.
fn zoo_options(sc: &Scenario, dev: &PredictDevice, size: usize) -> Result<zoo::PredictOptions> {
    let mut o = zoo::PredictOptions {
        batch: sc.batch,
        dtype: sc.dtype,
        alloc_conf: dev.alloc_conf.clone(),
        capacity: dev.capacity,
        steps: dev.steps.unwrap_or(1),
        ..zoo::PredictOptions::default()
    };
    let ModelSpec::Zoo(model) = &sc.model else {
        return Err(WorkloadError::Scenario(
            "a Hugging Face model has no zoo options".into(),
        ));
    };
    o.model = model.clone();
    // The drawn size is the model's input dimension (`ModelSpec::size_dim`).
    match model {
        // The MLP's drawn size is its rows; a fixed input keeps `batch` rows.
        ZooModel::Mlp { .. } => {
            if !sc.input.is_fixed() {
                o.batch = size;
            }
        }
        ZooModel::ResNet18 { .. } | ZooModel::ResNet50 { .. } => o.image_side = size,
        ZooModel::Gpt2(_) => o.seq = size,
    }
    match &sc.mode {
        Mode::Inference => {
            o.mode = Mode::Inference;
            o.grad = sc.mistakes.grad_at_inference;
        }
        Mode::Training {
            optimizer,
            accum_steps,
            ..
        } => {
            o.mode = Mode::Training {
                optimizer: *optimizer,
                accum_steps: *accum_steps,
                pattern: sc.effective_pattern().unwrap_or(AccumPattern::Each),
            };
        }
        Mode::Generate { .. } => return Err(unsupported("generate on a zoo model")),
    }
    Ok(o)
}

/// The Hugging Face workload for a scenario.
fn hf_workload(sc: &Scenario, dev: &PredictDevice, size: usize) -> Result<hf::Workload> {
    Ok(match &sc.mode {
        Mode::Inference => {
            if sc.mistakes.grad_at_inference {
                return Err(unsupported("--grad-on with --model PATH"));
            }
            hf::Workload::Forward {
                batch: sc.batch,
                seq: size,
                use_cache: sc.model.is_hf_decoder().then_some(sc.use_cache),
            }
        }
        Mode::Generate { new_tokens, cache } => hf::Workload::Generate {
            batch: sc.batch,
            prompt: size,
            new_tokens: *new_tokens,
            cache: *cache,
        },
        Mode::Training {
            optimizer,
            accum_steps,
            ..
        } => {
            if *accum_steps != 1 || sc.effective_pattern() == Some(AccumPattern::Sum) {
                return Err(unsupported("gradient accumulation with --model PATH"));
            }
            hf::Workload::Train {
                batch: sc.batch,
                seq: size,
                steps: dev.steps.unwrap_or(3),
                optimizer: match optimizer {
                    OptimKind::AdamW => Optim::default(),
                    OptimKind::Sgd => Optim::Sgd {
                        lr: 0.01,
                        momentum: 0.9,
                    },
                },
            }
        }
    })
}

/// Predicts one request of `sc` at the largest input size its distribution draws.
pub fn predict(sc: &Scenario, dev: &PredictDevice) -> Result<Prediction> {
    sc.validate()?;
    if sc.mistakes.keep_outputs {
        return Err(unsupported("--keep-outputs (a leak across requests)"));
    }
    if sc.mistakes.named_temporaries {
        return Err(unsupported("--named-temporaries"));
    }
    if dev.capacity == 0 {
        return Err(WorkloadError::Config(
            "capacity must be more than 0 bytes".into(),
        ));
    }
    if dev.steps == Some(0) {
        return Err(WorkloadError::Scenario("--steps must be at least 1".into()));
    }
    let size = sc.input.max();
    match &sc.model {
        ModelSpec::Hf(h) => {
            let w = hf_workload(sc, dev, size)?;
            let o = hf::PredictOptions {
                run: hf::RunOptions {
                    dtype: Some(sc.dtype),
                    warmth: None,
                    seed: sc.seed,
                },
                capacity: dev.capacity,
                alloc_conf: dev.alloc_conf.clone(),
            };
            let r =
                hf::predict_config(h.config.clone(), &w, &o).map_err(|e| hf_error(&h.path, e))?;
            Ok(Prediction {
                size,
                batch: sc.batch,
                peak_allocated_bytes: r.peak_allocated_bytes,
                peak_reserved_bytes: r.peak_reserved_bytes,
                base_bytes: r.base_allocated_bytes,
                peak_over_base_bytes: r
                    .peak_allocated_bytes
                    .saturating_sub(r.base_allocated_bytes),
                categories: r.categories,
                stats: r.stats,
                summary: None,
            })
        }
        _ => {
            let o = zoo_options(sc, dev, size)?;
            let p = zoo::predict(&o).map_err(WorkloadError::Setup)?;
            Ok(Prediction {
                size,
                batch: o.batch,
                peak_allocated_bytes: p.peak_allocated_bytes,
                peak_reserved_bytes: p.peak_reserved_bytes,
                base_bytes: p.base_bytes,
                peak_over_base_bytes: p.peak_over_input_bytes,
                categories: p.categories,
                stats: p.stats,
                summary: Some(p.summary),
            })
        }
    }
}

/// The largest batch whose request fits the device: doubling from 1, then bisection
/// between the last fit and the first OOM. `None` when batch 1 does not fit; `limit`
/// bounds the search.
pub fn max_batch(
    sc: &Scenario,
    dev: &PredictDevice,
    limit: usize,
) -> Result<Option<(usize, Prediction)>> {
    zoo::largest_fitting(
        limit,
        |b| {
            let mut s = sc.clone();
            s.batch = b;
            predict(&s, dev)
        },
        WorkloadError::is_oom,
    )
}
