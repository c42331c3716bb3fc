//! A model's weight bytes from its config alone, known before any layer is built.
//!
//! Design note: building a model allocates its layers one by one, so a config with
//! `num_hidden_layers` = 10^12 would allocate (and on the meta device, simulate) without
//! bound before the device ran out. Layers of one config are identical, so the weights are
//! `base + layers x per_layer`, with both terms read off the module trees of a 1- and a
//! 2-layer model ([`super::params::Node::weight_bytes`]) in u128: a model past the 64-bit
//! address space is an answer ("needs N EiB"), never a wrap. [`check`] compares that with
//! the device's capacity and refuses a layer count no real model has ([`MAX_LAYERS`]), so
//! the work of building is bounded by what the answer needs.

use super::bert::{self, BertHead};
use super::config::{Family, HfConfig};
use super::error::{HfError, HfResult};
use super::{gpt2, llama};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::TensorError;

/// The most layers a config may have. The deepest published transformers have a few
/// hundred; past this, building and simulating each layer is work no answer needs.
pub const MAX_LAYERS: usize = 1 << 14;

fn tree_bytes(cfg: &HfConfig, layers: usize, dtype: DType, head: BertHead) -> u128 {
    let mut c = cfg.clone();
    c.num_hidden_layers = layers;
    let t = match c.family {
        Family::Gpt2 => gpt2::tree(&c),
        Family::Bert => bert::tree(&c, head),
        _ => llama::tree(&c),
    };
    t.weight_bytes(dtype)
}

/// Bytes of the model's parameters and buffers in `dtype`.
pub fn weight_bytes(cfg: &HfConfig, dtype: DType, head: BertHead) -> u128 {
    let one = tree_bytes(cfg, 1, dtype, head);
    let two = tree_bytes(cfg, 2, dtype, head);
    let per_layer = two.saturating_sub(one);
    let base = one.saturating_sub(per_layer);
    base.saturating_add(per_layer.saturating_mul(cfg.num_hidden_layers as u128))
}

/// `n` bytes for a message, in the largest binary unit up to EiB (past 2^64 bytes too).
pub fn human_bytes_u128(n: u128) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut i = 0;
    while i + 1 < UNITS.len() && n >= 1u128 << (10 * (i + 1)) {
        i += 1;
    }
    if i == 0 {
        return format!("{n} B");
    }
    let v = n as f64 / (1u128 << (10 * i)) as f64;
    format!("{v:.2} {}", UNITS[i])
}

/// Refuses, before any tensor exists, a model whose weights cannot fit `device` (an
/// out-of-memory answer naming what they need) or whose layer count is past [`MAX_LAYERS`].
pub fn check(cfg: &HfConfig, dtype: DType, head: BertHead, device: &Device) -> HfResult<()> {
    let need = weight_bytes(cfg, dtype, head);
    let cap = device.capacity();
    if need > u64::MAX as u128 || cap.is_some_and(|c| need > c as u128) {
        let what = match cap {
            Some(c) if need <= u64::MAX as u128 => {
                format!("the device has {}", human_bytes_u128(c as u128))
            }
            _ => "more than a 64-bit address space holds".into(),
        };
        return Err(HfError::Tensor(TensorError::oom(format!(
            "the {} weights of this config ({} layers, {dtype}) need {} \
             ({need} bytes); {what}",
            cfg.family.name(),
            cfg.num_hidden_layers,
            human_bytes_u128(need),
        ))));
    }
    if cfg.num_hidden_layers > MAX_LAYERS {
        return Err(HfError::Invalid(format!(
            "{} config: num_hidden_layers {} is more than the {MAX_LAYERS} layers this \
             runtime builds (the weights alone would need {})",
            cfg.family.name(),
            cfg.num_hidden_layers,
            human_bytes_u128(need)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: &str) -> HfConfig {
        let text = format!(
            r#"{{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
                "num_hidden_layers": 3 {extra}}}"#
        );
        HfConfig::from_json(&text, "x").unwrap()
    }

    #[test]
    fn weight_bytes_are_linear_in_layers() {
        let c = cfg("");
        let built = llama::tree(&c).weight_bytes(DType::F32);
        assert_eq!(weight_bytes(&c, DType::F32, BertHead::Base), built);
    }

    #[test]
    fn past_the_address_space_is_an_answer() {
        let c = cfg(r#", "num_hidden_layers": 1000000000000"#);
        let need = weight_bytes(&c, DType::F32, BertHead::Base);
        assert!(need > 1u128 << 40, "{need}");
        assert_eq!(human_bytes_u128(1u128 << 70), "1024.00 EiB");
    }
}
