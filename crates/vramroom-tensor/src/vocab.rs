//! The workload vocabulary shared by the zoo's prediction and vramroom-workload: the mode
//! (inference, training, generation), which optimizer, and how gradient accumulation calls
//! `backward()`.
//!
//! Design note: data flows tensor → workload, so a word both say is defined here, at the
//! lower crate, once; vramroom-workload re-exports these and the zoo's `predict` takes
//! them as they are, with no translation between two copies that could drift.

use std::str::FromStr;

use crate::models::hf::CacheImpl;

/// A word the vocabulary does not know; the message names the ones it does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnknownWord(pub String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimKind {
    Sgd,
    AdamW,
}

impl FromStr for OptimKind {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, UnknownWord> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sgd" => Ok(OptimKind::Sgd),
            "adamw" => Ok(OptimKind::AdamW),
            o => Err(UnknownWord(format!(
                "unknown optimizer {o:?} (expected sgd, adamw)"
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccumPattern {
    /// `(loss / N).backward()` every micro-step: the graph of one micro-step at a time.
    Each,
    /// `total = total + loss / N` then one `total.backward()`: N graphs alive at once (the
    /// planted mistake).
    Sum,
}

impl FromStr for AccumPattern {
    type Err = UnknownWord;
    fn from_str(s: &str) -> Result<Self, UnknownWord> {
        match s.trim().to_ascii_lowercase().as_str() {
            "each" => Ok(AccumPattern::Each),
            "sum" => Ok(AccumPattern::Sum),
            o => Err(UnknownWord(format!(
                "unknown accumulation pattern {o:?} (expected each, sum)"
            ))),
        }
    }
}

/// What a request does with the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// A forward (under `no_grad` unless grad is asked for).
    Inference,
    /// `accum_steps` micro-steps of forward, loss / N and backward, then the optimizer step.
    Training {
        optimizer: OptimKind,
        accum_steps: usize,
        /// `Sum` is the `sum_losses` mistake (vramroom-workload's `Mistakes::sum_losses`
        /// forces it too).
        pattern: AccumPattern,
    },
    /// `model.generate(ids, max_new_tokens=new_tokens)`: a prefill of the drawn prompt
    /// length, then one decode step per new token on the KV cache (Hugging Face decoders).
    Generate { new_tokens: usize, cache: CacheImpl },
}
