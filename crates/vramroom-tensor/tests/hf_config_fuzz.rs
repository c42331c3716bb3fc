//! A fuzzer for `config.json` (the Hugging Face model reader) that runs on stable: real
//! configs from `fixtures/hf/`, mutated structurally (hostile numbers in the size fields,
//! wrong types, deleted keys, swapped families) and byte by byte, then read, sized and
//! built on the meta device, and one forward predicted. Every input must end in `Ok` or
//! `Err`: a panic, an abort, a hang or unbounded memory is a finding.
//!
//! The quick test runs a few hundred inputs with every `cargo test`; the long one is the
//! fuzz campaign (the cargo-fuzz target `fuzz/fuzz_targets/hf_config.rs` does the same
//! under libFuzzer where nightly and cargo-fuzz are installed):
//!
//! ```sh
//! VRAMROOM_FUZZ_ITERS=20000 cargo test --release -p vramroom-tensor --test hf_config_fuzz \
//!     -- --ignored --nocapture
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use vramroom_tensor::models::hf::{self, HfConfig, PredictOptions, Workload};

/// SplitMix64: reproducible inputs from a seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

const SIZE_KEYS: [&str; 16] = [
    "vocab_size",
    "hidden_size",
    "n_embd",
    "num_hidden_layers",
    "n_layer",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "n_inner",
    "max_position_embeddings",
    "n_positions",
    "type_vocab_size",
    "pad_token_id",
    "eos_token_id",
];

const OTHER_KEYS: [&str; 12] = [
    "model_type",
    "torch_dtype",
    "dtype",
    "hidden_act",
    "activation_function",
    "rope_theta",
    "rope_scaling",
    "tie_word_embeddings",
    "sliding_window",
    "rms_norm_eps",
    "attention_bias",
    "layer_types",
];

fn hostile_number(r: &mut Rng) -> Value {
    let k = r.below(64) as u32;
    match r.below(12) {
        0 => 0.into(),
        1 => 1.into(),
        2 => (1u64 << k).into(),
        3 => ((1u64 << k) + r.below(2000) as u64).into(),
        4 => u64::MAX.into(),
        5 => (u64::MAX - r.below(1000) as u64).into(),
        6 => (-(r.below(1000) as i64) - 1).into(),
        7 => serde_json::json!(1e300),
        8 => serde_json::json!(2.5),
        9 => (r.below(9) as u64 + 1).into(),
        10 => 1_000_000_000_000u64.into(),
        _ => ((r.below(4096) as u64 + 1) * 2).into(),
    }
}

fn hostile_value(r: &mut Rng) -> Value {
    match r.below(9) {
        0 => Value::Null,
        1 => "llama".into(),
        2 => "bfloat16".into(),
        3 => true.into(),
        4 => serde_json::json!([1, 2, "x"]),
        5 => serde_json::json!({"rope_type": "linear", "factor": 2.0}),
        6 => serde_json::json!({"rope_type": "default", "rope_theta": -1.0}),
        7 => "\u{0}".into(),
        _ => hostile_number(r),
    }
}

fn mutate_json(r: &mut Rng, base: &Value) -> Value {
    let mut v = base.clone();
    let Some(obj) = v.as_object_mut() else {
        return v;
    };
    for _ in 0..1 + r.below(4) {
        match r.below(6) {
            0 | 1 | 2 => {
                let k = *r.pick(&SIZE_KEYS);
                obj.insert(k.into(), hostile_number(r));
            }
            3 => {
                let k = *r.pick(&OTHER_KEYS);
                obj.insert(k.into(), hostile_value(r));
            }
            4 => {
                let keys: Vec<String> = obj.keys().cloned().collect();
                if !keys.is_empty() {
                    let k = r.pick(&keys).clone();
                    obj.remove(&k);
                }
            }
            _ => {
                let fam = *r.pick(&["gpt2", "llama", "mistral", "qwen2", "bert", "t5"]);
                obj.insert("model_type".into(), fam.into());
            }
        }
    }
    v
}

fn mutate_bytes(r: &mut Rng, text: &str) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    for _ in 0..1 + r.below(8) {
        if b.is_empty() {
            break;
        }
        let i = r.below(b.len());
        match r.below(4) {
            0 => b[i] = r.next() as u8,
            1 => {
                b.remove(i);
            }
            2 => b.insert(i, *r.pick(b"0123456789-.e{}[]\",:")),
            _ => {
                let j = (i + r.below(64)).min(b.len());
                let chunk = b[i..j].to_vec();
                b.splice(i..i, chunk);
            }
        }
    }
    b
}

fn seeds() -> Vec<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf");
    let mut v = Vec::new();
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        let p = e.path().join("config.json");
        if let Ok(t) = std::fs::read_to_string(&p) {
            v.push(serde_json::from_str(&t).unwrap());
        }
    }
    v.sort_by_key(|x: &Value| x.to_string());
    assert!(!v.is_empty());
    v
}

/// One input through the whole reader: parse, size, build on meta, predict a forward.
fn exercise(bytes: &[u8], file: &Path) {
    let text = String::from_utf8_lossy(bytes);
    let cfg = HfConfig::from_json(&text, "fuzz");
    std::fs::write(file, bytes).unwrap();
    let from_file = HfConfig::from_path(file);
    // The file reader refuses what is not UTF-8; otherwise both readers agree.
    if std::str::from_utf8(bytes).is_ok() {
        assert_eq!(cfg.is_ok(), from_file.is_ok(), "{cfg:?} / {from_file:?}");
    }
    let Ok(cfg) = cfg else {
        return;
    };
    let dtype = cfg.dtype.unwrap_or(vramroom_tensor::DType::F32);
    let _ = hf::footprint::weight_bytes(&cfg, dtype, hf::BertHead::Base);
    let w = Workload::Forward {
        batch: 1,
        seq: 8.min(cfg.max_position_embeddings.max(1)),
        use_cache: None,
    };
    let o = PredictOptions {
        capacity: 80 << 30,
        ..PredictOptions::default()
    };
    let _ = hf::predict(file, &w, &o);
}

fn fuzz(iters: u64, seed: u64) {
    let seeds = seeds();
    let dir: PathBuf =
        std::env::temp_dir().join(format!("vramroom-hf-fuzz-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("config.json");
    let mut r = Rng(seed);
    let mut slowest = Duration::ZERO;
    for i in 0..iters {
        let base = r.pick(&seeds).clone();
        let bytes = if r.below(4) == 0 {
            mutate_bytes(&mut r, &base.to_string())
        } else {
            mutate_json(&mut r, &base).to_string().into_bytes()
        };
        if std::env::var_os("VRAMROOM_FUZZ_TRACE").is_some() {
            eprintln!("input {i}: {}", String::from_utf8_lossy(&bytes));
        }
        let t = Instant::now();
        let caught = std::panic::catch_unwind(|| exercise(&bytes, &file));
        if caught.is_err() {
            panic!(
                "input {i} (seed {seed}) panicked:\n{}",
                String::from_utf8_lossy(&bytes)
            );
        }
        let dt = t.elapsed();
        assert!(
            dt < Duration::from_secs(20),
            "input {i} took {dt:?}:\n{}",
            String::from_utf8_lossy(&bytes)
        );
        slowest = slowest.max(dt);
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{iters} inputs, seed {seed}: no finding (slowest {slowest:?})");
}

#[test]
fn fuzz_hf_config_quick() {
    fuzz(300, 28);
}

#[test]
#[ignore = "the fuzz campaign: VRAMROOM_FUZZ_ITERS=N cargo test --release --test hf_config_fuzz -- --ignored"]
fn fuzz_hf_config_long() {
    let iters = std::env::var("VRAMROOM_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let seed = std::env::var("VRAMROOM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    fuzz(iters, seed);
}
