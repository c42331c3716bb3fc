//! A Hugging Face `config.json`, read into the few numbers the supported families need.
//!
//! Design note: each family's defaults are transformers 5.17's (`GPT2Config`, `LlamaConfig`,
//! `MistralConfig`, `Qwen2Config`, `BertConfig`), so a config that omits a field means what
//! it means to transformers. Anything that would make the computation differ from what is
//! implemented (sliding-window attention, RoPE scaling, cross-attention, a decoder BERT, an
//! unknown activation) is refused with [`HfError::UnsupportedFeature`] rather than silently
//! computed another way. The dtype is `dtype` (transformers 5) or `torch_dtype` (4.x).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::{HfError, HfResult};
use crate::dtype::DType;

/// The model families, by `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Gpt2,
    Llama,
    Mistral,
    Qwen2,
    Bert,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Bert => "bert",
        }
    }
    /// Llama, Mistral and Qwen2 run the same decoder code here.
    pub fn is_llama_like(self) -> bool {
        matches!(self, Family::Llama | Family::Mistral | Family::Qwen2)
    }
    pub fn is_decoder(self) -> bool {
        self != Family::Bert
    }
}

/// The activation of the MLP, as `ACT2FN` maps the config's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `gelu_new` / `gelu_fast`-style Python composition (`NewGELUActivation`): eight
    /// elementwise kernels, the tanh approximation.
    GeluNew,
    /// `gelu`: one erf kernel.
    Gelu,
    /// `gelu_pytorch_tanh`: one tanh-approximation kernel.
    GeluTanh,
    Relu,
    /// `silu` / `swish`.
    Silu,
}

impl Activation {
    fn parse(family: Family, s: &str) -> HfResult<Activation> {
        Ok(match s {
            "gelu_new" => Activation::GeluNew,
            "gelu" => Activation::Gelu,
            "gelu_pytorch_tanh" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            "silu" | "swish" => Activation::Silu,
            other => {
                return Err(HfError::UnsupportedFeature {
                    family: family.name(),
                    what: format!("activation {other:?}"),
                    why: "implemented: gelu_new, gelu, gelu_pytorch_tanh, relu, silu".into(),
                })
            }
        })
    }
}

/// What the supported families need from a config. Names follow the Llama config; GPT-2's
/// `n_embd`, `n_layer`, ... are read into the same fields.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    /// LayerNorm / RMSNorm epsilon.
    pub norm_eps: f64,
    pub rope_theta: f64,
    /// Bias on the q, k, v projections (Qwen2: always; Llama: `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on the attention output projection (Llama's `attention_bias`; Qwen2: never).
    pub o_bias: bool,
    pub mlp_bias: bool,
    pub tie_word_embeddings: bool,
    pub activation: Activation,
    /// `dtype` / `torch_dtype` of the config, when it names one.
    pub dtype: Option<DType>,
    pub initializer_range: f64,
    /// BERT's token type vocabulary.
    pub type_vocab_size: usize,
    pub pad_token_id: Option<i64>,
    pub eos_token_ids: Vec<i64>,
    /// Dropouts, applied in training mode only: embeddings, attention weights, residual
    /// branches (GPT-2's `embd_pdrop`/`attn_pdrop`/`resid_pdrop`, BERT's
    /// `hidden_dropout_prob`/`attention_probs_dropout_prob`, Llama's `attention_dropout`).
    pub embd_pdrop: f64,
    pub attn_pdrop: f64,
    pub resid_pdrop: f64,
    /// GPT-2: divide scores by sqrt(head_dim) (`scale_attn_weights`).
    pub scale_attn_weights: bool,
    /// GPT-2: also divide by (layer index + 1).
    pub scale_attn_by_inverse_layer_idx: bool,
    /// `use_cache`, the default of a forward's `use_cache`.
    pub use_cache: bool,
}

fn get<'a>(v: &'a Value, k: &str) -> Option<&'a Value> {
    v.get(k).filter(|x| !x.is_null())
}

struct Reader<'a> {
    v: &'a Value,
    path: &'a str,
}

impl Reader<'_> {
    fn usize_or(&self, keys: &[&str], default: Option<usize>) -> HfResult<usize> {
        for k in keys {
            if let Some(x) = get(self.v, k) {
                return x
                    .as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| HfError::Config {
                        path: self.path.into(),
                        msg: format!("{k} must be a non-negative integer, got {x}"),
                    });
            }
        }
        default.ok_or_else(|| HfError::Config {
            path: self.path.into(),
            msg: format!("missing {}", keys.join(" / ")),
        })
    }
    fn f64_or(&self, keys: &[&str], default: f64) -> HfResult<f64> {
        for k in keys {
            if let Some(x) = get(self.v, k) {
                return x.as_f64().ok_or_else(|| HfError::Config {
                    path: self.path.into(),
                    msg: format!("{k} must be a number, got {x}"),
                });
            }
        }
        Ok(default)
    }
    fn bool_or(&self, k: &str, default: bool) -> HfResult<bool> {
        match get(self.v, k) {
            Some(x) => x.as_bool().ok_or_else(|| HfError::Config {
                path: self.path.into(),
                msg: format!("{k} must be true or false, got {x}"),
            }),
            None => Ok(default),
        }
    }
    fn str_or<'b>(&'b self, k: &str, default: &'b str) -> HfResult<&'b str> {
        match get(self.v, k) {
            Some(x) => x.as_str().ok_or_else(|| HfError::Config {
                path: self.path.into(),
                msg: format!("{k} must be a string, got {x}"),
            }),
            None => Ok(default),
        }
    }
    fn ids(&self, k: &str, default: &[i64]) -> Vec<i64> {
        match get(self.v, k) {
            Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_i64()).collect(),
            Some(x) => x.as_i64().into_iter().collect(),
            None => default.to_vec(),
        }
    }
}

/// Parses a dtype name as transformers writes it (`"float32"`, `"bfloat16"`, `"torch.float16"`).
pub fn parse_dtype(s: &str) -> Option<DType> {
    match s.trim_start_matches("torch.") {
        "float32" | "float" | "fp32" => Some(DType::F32),
        "bfloat16" | "bf16" => Some(DType::BF16),
        "float16" | "half" | "fp16" => Some(DType::F16),
        _ => None,
    }
}

/// The config file for `path`: the file itself, or `config.json` inside a folder.
pub fn config_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    }
}

impl HfConfig {
    /// Reads `path` (a `config.json` or a folder holding one).
    pub fn from_path(path: &Path) -> HfResult<HfConfig> {
        let file = config_path(path);
        let shown = file.display().to_string();
        // Bounded, and never blocking on a FIFO: `/dev/zero` or a 1 GB JSON array as a
        // config is an error naming the limit, not a read until the kernel kills us.
        let text = vramroom_alloc::input::read_text(&file, vramroom_alloc::input::Limit::CONFIG)
            .map_err(|e| HfError::Io {
                msg: match e {
                    vramroom_alloc::input::InputError::Io { source, .. } => source.to_string(),
                    other => {
                        let m = other.to_string();
                        m.strip_prefix(&format!("{shown}: "))
                            .unwrap_or(&m)
                            .to_string()
                    }
                },
                path: shown.clone(),
            })?;
        HfConfig::from_json(&text, &shown)
    }

    /// Parses the text of a `config.json`; `path` is only for messages.
    pub fn from_json(text: &str, path: &str) -> HfResult<HfConfig> {
        let v: Value = serde_json::from_str(text).map_err(|e| HfError::Config {
            path: path.into(),
            msg: e.to_string(),
        })?;
        if !v.is_object() {
            return Err(HfError::Config {
                path: path.into(),
                msg: "expected a JSON object".into(),
            });
        }
        let r = Reader { v: &v, path };
        let model_type = r.str_or("model_type", "")?;
        let family = match model_type {
            "gpt2" => Family::Gpt2,
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "bert" => Family::Bert,
            other => {
                return Err(HfError::UnsupportedFamily {
                    model_type: other.to_string(),
                })
            }
        };
        let dtype = match get(&v, "dtype").or_else(|| get(&v, "torch_dtype")) {
            Some(Value::String(s)) => Some(parse_dtype(s).ok_or_else(|| HfError::Config {
                path: path.into(),
                msg: format!("unsupported dtype {s:?} (float32, bfloat16, float16)"),
            })?),
            _ => None,
        };
        let c = match family {
            Family::Gpt2 => gpt2(&r, dtype)?,
            Family::Bert => bert(&r, dtype)?,
            _ => llama_like(&r, family, dtype)?,
        };
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> HfResult<()> {
        let bad = |m: String| {
            Err(HfError::Invalid(format!(
                "{} config: {m}",
                self.family.name()
            )))
        };
        if self.hidden_size == 0
            || self.num_hidden_layers == 0
            || self.num_attention_heads == 0
            || self.vocab_size == 0
        {
            return bad("hidden_size, num_hidden_layers, num_attention_heads and vocab_size must be positive".into());
        }
        if self.num_key_value_heads == 0
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.family.is_llama_like()
            && self.head_dim * self.num_attention_heads != self.hidden_size
        {
            return bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.head_dim == 0 || (self.family.is_llama_like() && !self.head_dim.is_multiple_of(2)) {
            return bad(format!(
                "head_dim {} must be positive (and even for RoPE)",
                self.head_dim
            ));
        }
        self.check_shapes()
    }

    /// Every weight shape the config implies, multiplied out with checked arithmetic: a
    /// product whose bytes do not fit in 64 bits is refused naming the fields, instead of
    /// wrapping to a small tensor (`intermediate_size` = 2^62 made a weight of 0 elements,
    /// `vocab_size` = 2^58 + 1000 one of 1000 rows). Shapes that fit but whose total does
    /// not fit the device are an answer, given before any layer is built ([`super::load`]).
    fn check_shapes(&self) -> HfResult<()> {
        let f = self.family;
        let mut products: Vec<(&str, &str, usize, usize)> = vec![
            (
                "vocab_size",
                "hidden_size",
                self.vocab_size,
                self.hidden_size,
            ),
            (
                "hidden_size",
                "intermediate_size",
                self.hidden_size,
                self.intermediate_size,
            ),
            (
                "num_attention_heads",
                "head_dim",
                self.num_attention_heads,
                self.head_dim,
            ),
            (
                "num_key_value_heads",
                "head_dim",
                self.num_key_value_heads,
                self.head_dim,
            ),
        ];
        if !f.is_llama_like() {
            products.push((
                "max_position_embeddings",
                "hidden_size",
                self.max_position_embeddings,
                self.hidden_size,
            ));
            products.push(("3", "hidden_size", 3, self.hidden_size));
        }
        if f == Family::Bert {
            products.push((
                "type_vocab_size",
                "hidden_size",
                self.type_vocab_size,
                self.hidden_size,
            ));
        }
        // 8 bytes: the widest element a weight or buffer of these models has.
        let fits = |n: usize| n.checked_mul(8).is_some();
        for (fa, fb, a, b) in products {
            if !a.checked_mul(b).is_some_and(fits) {
                return Err(HfError::Invalid(format!(
                    "{} config: {fa} x {fb} = {a} x {b} elements does not fit in 64 bits \
                     (no tensor of that shape can exist)",
                    f.name()
                )));
            }
        }
        let sq = self.hidden_size.checked_mul(self.hidden_size);
        if !sq.and_then(|x| x.checked_mul(3)).is_some_and(fits) {
            return Err(HfError::Invalid(format!(
                "{} config: 3 x hidden_size x hidden_size = 3 x {} x {} elements does not \
                 fit in 64 bits",
                f.name(),
                self.hidden_size,
                self.hidden_size
            )));
        }
        if f.is_llama_like() {
            for (name, heads) in [
                ("num_attention_heads", self.num_attention_heads),
                ("num_key_value_heads", self.num_key_value_heads),
            ] {
                if !(heads * self.head_dim)
                    .checked_mul(self.hidden_size)
                    .is_some_and(fits)
                {
                    return Err(HfError::Invalid(format!(
                        "{} config: {name} x head_dim x hidden_size = {heads} x {} x {} \
                         elements does not fit in 64 bits",
                        f.name(),
                        self.head_dim,
                        self.hidden_size
                    )));
                }
            }
        }
        Ok(())
    }
}

fn unsupported(family: Family, what: &str, why: &str) -> HfError {
    HfError::UnsupportedFeature {
        family: family.name(),
        what: what.into(),
        why: why.into(),
    }
}

fn gpt2(r: &Reader, dtype: Option<DType>) -> HfResult<HfConfig> {
    let f = Family::Gpt2;
    if r.bool_or("add_cross_attention", false)? {
        return Err(unsupported(
            f,
            "add_cross_attention",
            "only the decoder-only GPT-2 is implemented",
        ));
    }
    if r.bool_or("reorder_and_upcast_attn", false)? {
        return Err(unsupported(
            f,
            "reorder_and_upcast_attn",
            "it only applies to eager attention; SDPA is implemented",
        ));
    }
    let hidden = r.usize_or(&["n_embd", "hidden_size"], Some(768))?;
    let heads = r.usize_or(&["n_head", "num_attention_heads"], Some(12))?;
    Ok(HfConfig {
        family: f,
        vocab_size: r.usize_or(&["vocab_size"], Some(50257))?,
        hidden_size: hidden,
        num_hidden_layers: r.usize_or(&["n_layer", "num_hidden_layers"], Some(12))?,
        num_attention_heads: heads,
        num_key_value_heads: heads,
        head_dim: hidden / heads.max(1),
        intermediate_size: r.usize_or(&["n_inner"], Some(hidden.saturating_mul(4)))?,
        max_position_embeddings: r
            .usize_or(&["n_positions", "max_position_embeddings"], Some(1024))?,
        norm_eps: r.f64_or(&["layer_norm_epsilon"], 1e-5)?,
        rope_theta: 0.0,
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        tie_word_embeddings: r.bool_or("tie_word_embeddings", true)?,
        activation: Activation::parse(f, r.str_or("activation_function", "gelu_new")?)?,
        dtype,
        initializer_range: r.f64_or(&["initializer_range"], 0.02)?,
        type_vocab_size: 0,
        pad_token_id: r.ids("pad_token_id", &[]).first().copied(),
        eos_token_ids: r.ids("eos_token_id", &[50256]),
        embd_pdrop: r.f64_or(&["embd_pdrop"], 0.1)?,
        attn_pdrop: r.f64_or(&["attn_pdrop"], 0.1)?,
        resid_pdrop: r.f64_or(&["resid_pdrop"], 0.1)?,
        scale_attn_weights: r.bool_or("scale_attn_weights", true)?,
        scale_attn_by_inverse_layer_idx: r.bool_or("scale_attn_by_inverse_layer_idx", false)?,
        use_cache: r.bool_or("use_cache", true)?,
    })
}

fn llama_like(r: &Reader, f: Family, dtype: Option<DType>) -> HfResult<HfConfig> {
    let (d_vocab, d_inter, d_maxpos, d_kv) = match f {
        Family::Mistral => (32000, 14336, 4096 * 32, Some(8)),
        Family::Qwen2 => (151936, 22016, 32768, Some(32)),
        _ => (32000, 11008, 2048, None),
    };
    match f {
        Family::Mistral => {
            if let Some(w) = get(r.v, "sliding_window") {
                return Err(unsupported(
                    f,
                    &format!("sliding_window {w}"),
                    "only full causal attention is implemented; set \"sliding_window\": null",
                ));
            }
            if r.v.get("sliding_window").is_none() {
                return Err(unsupported(
                    f,
                    "sliding_window (absent: transformers defaults it to 4096)",
                    "only full causal attention is implemented; set \"sliding_window\": null",
                ));
            }
        }
        Family::Qwen2 => {
            if r.bool_or("use_sliding_window", false)? {
                return Err(unsupported(
                    f,
                    "use_sliding_window",
                    "only full causal attention is implemented",
                ));
            }
            if let Some(Value::Array(types)) = get(r.v, "layer_types") {
                if types.iter().any(|t| t.as_str() != Some("full_attention")) {
                    return Err(unsupported(
                        f,
                        "sliding attention layer_types",
                        "only full causal attention is implemented",
                    ));
                }
            }
        }
        _ => {}
    }
    let rope = get(r.v, "rope_parameters").or_else(|| get(r.v, "rope_scaling"));
    let mut rope_theta = r.f64_or(&["rope_theta"], 10000.0)?;
    if let Some(p) = rope {
        let kind = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(|x| x.as_str())
            .unwrap_or("default");
        if kind != "default" {
            return Err(unsupported(
                f,
                &format!("rope_type {kind:?}"),
                "only the default RoPE is implemented",
            ));
        }
        if let Some(t) = p.get("rope_theta").and_then(|x| x.as_f64()) {
            rope_theta = t;
        }
    }
    let hidden = r.usize_or(&["hidden_size"], Some(4096))?;
    let heads = r.usize_or(&["num_attention_heads"], Some(32))?;
    let kv = r.usize_or(&["num_key_value_heads"], d_kv.or(Some(heads)))?;
    let attention_bias = r.bool_or("attention_bias", false)?;
    let act = r.str_or("hidden_act", "silu")?;
    Ok(HfConfig {
        family: f,
        vocab_size: r.usize_or(&["vocab_size"], Some(d_vocab))?,
        hidden_size: hidden,
        num_hidden_layers: r.usize_or(&["num_hidden_layers"], Some(32))?,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim: r.usize_or(&["head_dim"], Some(hidden / heads.max(1)))?,
        intermediate_size: r.usize_or(&["intermediate_size"], Some(d_inter))?,
        max_position_embeddings: r.usize_or(&["max_position_embeddings"], Some(d_maxpos))?,
        norm_eps: r.f64_or(&["rms_norm_eps"], 1e-6)?,
        rope_theta,
        qkv_bias: f == Family::Qwen2 || attention_bias,
        o_bias: f == Family::Llama && attention_bias,
        mlp_bias: f == Family::Llama && r.bool_or("mlp_bias", false)?,
        tie_word_embeddings: r.bool_or("tie_word_embeddings", false)?,
        activation: Activation::parse(f, act)?,
        dtype,
        initializer_range: r.f64_or(&["initializer_range"], 0.02)?,
        type_vocab_size: 0,
        pad_token_id: r.ids("pad_token_id", &[]).first().copied(),
        eos_token_ids: r.ids("eos_token_id", if f == Family::Qwen2 { &[] } else { &[2] }),
        embd_pdrop: 0.0,
        attn_pdrop: r.f64_or(&["attention_dropout"], 0.0)?,
        resid_pdrop: 0.0,
        scale_attn_weights: true,
        scale_attn_by_inverse_layer_idx: false,
        use_cache: r.bool_or("use_cache", true)?,
    })
}

fn bert(r: &Reader, dtype: Option<DType>) -> HfResult<HfConfig> {
    let f = Family::Bert;
    if r.bool_or("is_decoder", false)? || r.bool_or("add_cross_attention", false)? {
        return Err(unsupported(
            f,
            "is_decoder / add_cross_attention",
            "only the BERT encoder is implemented",
        ));
    }
    let pos = r.str_or("position_embedding_type", "absolute")?;
    if pos != "absolute" {
        return Err(unsupported(
            f,
            &format!("position_embedding_type {pos:?}"),
            "only absolute positions are implemented",
        ));
    }
    let hidden = r.usize_or(&["hidden_size"], Some(768))?;
    let heads = r.usize_or(&["num_attention_heads"], Some(12))?;
    Ok(HfConfig {
        family: f,
        vocab_size: r.usize_or(&["vocab_size"], Some(30522))?,
        hidden_size: hidden,
        num_hidden_layers: r.usize_or(&["num_hidden_layers"], Some(12))?,
        num_attention_heads: heads,
        num_key_value_heads: heads,
        head_dim: hidden / heads.max(1),
        intermediate_size: r.usize_or(&["intermediate_size"], Some(3072))?,
        max_position_embeddings: r.usize_or(&["max_position_embeddings"], Some(512))?,
        norm_eps: r.f64_or(&["layer_norm_eps"], 1e-12)?,
        rope_theta: 0.0,
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        tie_word_embeddings: r.bool_or("tie_word_embeddings", true)?,
        activation: Activation::parse(f, r.str_or("hidden_act", "gelu")?)?,
        dtype,
        initializer_range: r.f64_or(&["initializer_range"], 0.02)?,
        type_vocab_size: r.usize_or(&["type_vocab_size"], Some(2))?,
        pad_token_id: Some(r.ids("pad_token_id", &[0]).first().copied().unwrap_or(0)),
        eos_token_ids: r.ids("eos_token_id", &[]),
        embd_pdrop: r.f64_or(&["hidden_dropout_prob"], 0.1)?,
        attn_pdrop: r.f64_or(&["attention_probs_dropout_prob"], 0.1)?,
        resid_pdrop: r.f64_or(&["hidden_dropout_prob"], 0.1)?,
        scale_attn_weights: true,
        scale_attn_by_inverse_layer_idx: false,
        use_cache: r.bool_or("use_cache", true)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_family_names_the_supported_ones() {
        let e = HfConfig::from_json(r#"{"model_type": "t5"}"#, "x").unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("t5") && m.contains("gpt2, llama, mistral, qwen2, bert"),
            "{m}"
        );
    }

    #[test]
    fn defaults_are_transformers() {
        let c = HfConfig::from_json(r#"{"model_type": "gpt2"}"#, "x").unwrap();
        assert_eq!(
            (c.hidden_size, c.num_hidden_layers, c.vocab_size),
            (768, 12, 50257)
        );
        assert_eq!(c.intermediate_size, 3072);
        assert!(c.tie_word_embeddings);
        let c = HfConfig::from_json(
            r#"{"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "num_hidden_layers": 1, "torch_dtype": "bfloat16"}"#,
            "x",
        )
        .unwrap();
        assert!(c.qkv_bias && !c.o_bias);
        assert_eq!(c.dtype, Some(DType::BF16));
        assert_eq!(c.head_dim, 16);
    }

    #[test]
    fn mistral_needs_sliding_window_null() {
        let e = HfConfig::from_json(r#"{"model_type": "mistral"}"#, "x").unwrap_err();
        assert!(matches!(e, HfError::UnsupportedFeature { .. }), "{e}");
        let e = HfConfig::from_json(r#"{"model_type": "mistral", "sliding_window": 4096}"#, "x")
            .unwrap_err();
        assert!(e.to_string().contains("sliding_window"), "{e}");
        HfConfig::from_json(r#"{"model_type": "mistral", "sliding_window": null}"#, "x").unwrap();
    }

    #[test]
    fn shapes_that_wrap_are_refused_naming_the_field() {
        for (extra, field) in [
            (
                r#""intermediate_size": 4611686018427387904"#,
                "intermediate_size",
            ),
            (r#""vocab_size": 288230376151712704"#, "vocab_size"),
            (r#""head_dim": 4611686018427387904"#, "head_dim"),
            (
                r#""hidden_size": 4294967296, "num_attention_heads": 1"#,
                "hidden_size",
            ),
        ] {
            let text = format!(r#"{{"model_type": "llama", {extra}}}"#);
            let e = HfConfig::from_json(&text, "x").unwrap_err().to_string();
            assert!(e.contains(field) && e.contains("64 bits"), "{extra}: {e}");
        }
        let e = HfConfig::from_json(
            r#"{"model_type": "gpt2", "n_embd": 4611686018427387904,
            "n_head": 1}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("hidden_size"), "{e}");
        let e = HfConfig::from_json(
            r#"{"model_type": "bert", "type_vocab_size": 4611686018427387904}"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("type_vocab_size"), "{e}");
    }
}
