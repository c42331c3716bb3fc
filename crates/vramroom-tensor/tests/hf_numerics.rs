//! The cpu backend computes what transformers computes: for the tiny checkpoints of
//! `fixtures/hf-numerics` (made, with their golden outputs, by `scripts/hf_fixtures.py` on
//! CPU PyTorch 2.11 / transformers 5.17), logits, losses, BERT's hidden states and pooler,
//! greedy generation (dynamic and static cache) and the loss's gradients match
//! transformers' within the dtype's tolerance.

use std::path::PathBuf;

use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::models::hf::{self, BertHead, ForwardArgs, GenerateOptions, LoadOptions};
use vramroom_tensor::{safetensors, DType, Device, Tensor};

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf-numerics")
        .join(name)
}

fn cpu() -> Device {
    Device::cpu_caching(1 << 32, AllocatorConfig::default())
}

fn golden(name: &str, dev: &Device) -> Vec<(String, Tensor)> {
    safetensors::load(dir(name).join("golden.safetensors"), dev).unwrap()
}

fn get<'a>(g: &'a [(String, Tensor)], k: &str) -> &'a Tensor {
    &g.iter()
        .find(|(n, _)| n == k)
        .unwrap_or_else(|| panic!("golden {k}"))
        .1
}

/// max |a - b| over max |b|.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
        / scale
}

fn load(name: &str, dev: &Device, dtype: DType, head: BertHead) -> hf::HfModel {
    let l = hf::load(
        &dir(name),
        dev,
        &LoadOptions {
            dtype: Some(dtype),
            bert_head: head,
        },
    )
    .unwrap();
    assert!(l.note.is_none(), "{name}: {:?}", l.note);
    l.model
}

fn ids(g: &[(String, Tensor)], dev: &Device) -> Tensor {
    let v = get(g, "input_ids").to_vec_i64().unwrap();
    Tensor::from_i64(&v, &[2, 8], dev).unwrap()
}

/// The loss's gradients of the golden file's `grad.*` parameters (eval mode, no dropout).
fn check_grads(name: &str, m: &hf::HfModel, x: &Tensor, g: &[(String, Tensor)]) {
    let out = m
        .forward(
            x,
            ForwardArgs {
                labels: Some(x),
                ..ForwardArgs::default()
            },
        )
        .unwrap();
    out.loss.unwrap().backward().unwrap();
    let params = m.named_parameters();
    let (mut n, mut bad) = (0, false);
    for (k, want) in g.iter().filter(|(k, _)| k.starts_with("grad.")) {
        let p = &params
            .iter()
            .find(|(pn, _)| *pn == k[5..])
            .unwrap_or_else(|| panic!("{name}: {k}"))
            .1;
        let e = rel_err(&p.grad().unwrap(), want);
        eprintln!("{name} {k}: relative error {e}");
        bad |= e >= 1e-5;
        n += 1;
    }
    assert_eq!(n, 2, "{name}");
    assert!(!bad, "{name}: gradients off (above)");
}

fn decoder(name: &str) {
    let dev = cpu();
    let g = golden(name, &dev);
    let x = ids(&g, &dev);
    check_grads(name, &load(name, &dev, DType::F32, BertHead::Base), &x, &g);
    let _ng = vramroom_tensor::no_grad();
    // float32: logits (with the default cache) and the loss.
    let m = load(name, &dev, DType::F32, BertHead::Base);
    let out = m
        .forward(
            &x,
            ForwardArgs {
                labels: Some(&x),
                ..ForwardArgs::default()
            },
        )
        .unwrap();
    assert!(out.cache.is_some(), "use_cache is on by default");
    let e = rel_err(out.logits.as_ref().unwrap(), get(&g, "logits_float32"));
    eprintln!("{name} f32 logits {e}");
    assert!(e < 1e-5, "{name} f32 logits: relative error {e}");
    let loss = out.loss.unwrap().item().unwrap();
    let want = get(&g, "loss_float32").to_vec_f64().unwrap()[0];
    assert!(
        (loss - want).abs() < 1e-4 * want.abs().max(1.0),
        "{name} loss {loss} vs {want}"
    );
    // Greedy generation: the same tokens.
    let mask = Tensor::ones(&[2, 8], DType::I64, &dev).unwrap();
    let gen = hf::generate(
        &m,
        &x,
        &mask,
        &GenerateOptions {
            max_new_tokens: 6,
            min_new_tokens: None,
            cache: hf::CacheImpl::Dynamic,
        },
    )
    .unwrap();
    assert_eq!(
        gen.to_vec_i64().unwrap(),
        get(&g, "generated").to_vec_i64().unwrap(),
        "{name}"
    );
    // The static cache computes the same tokens.
    let gen_s = hf::generate(
        &m,
        &x,
        &mask,
        &GenerateOptions {
            max_new_tokens: 6,
            min_new_tokens: None,
            cache: hf::CacheImpl::Static,
        },
    )
    .unwrap();
    assert_eq!(
        gen_s.to_vec_i64().unwrap(),
        get(&g, "generated").to_vec_i64().unwrap(),
        "{name} static"
    );
    // Without a cache: the same logits.
    let nc = m
        .forward(
            &x,
            ForwardArgs {
                use_cache: Some(false),
                ..ForwardArgs::default()
            },
        )
        .unwrap();
    assert!(nc.cache.is_none());
    assert!(rel_err(nc.logits.as_ref().unwrap(), get(&g, "logits_float32")) < 1e-4);
    // bfloat16: within bf16's rounding, accumulated over the layers.
    let mb = load(name, &dev, DType::BF16, BertHead::Base);
    let lb = mb
        .forward(&x, ForwardArgs::default())
        .unwrap()
        .logits
        .unwrap();
    assert_eq!(lb.dtype(), DType::BF16, "logits stay in the model dtype");
    let e = rel_err(&lb, get(&g, "logits_bfloat16"));
    eprintln!("{name} bf16 logits {e}");
    assert!(e < 2e-2, "{name} bf16 logits: relative error {e}");
}

#[test]
fn gpt2_matches_transformers() {
    decoder("gpt2-tiny");
}

#[test]
fn llama_matches_transformers() {
    decoder("llama-tiny");
}

#[test]
fn qwen2_matches_transformers() {
    decoder("qwen2-tiny");
}

#[test]
fn bert_matches_transformers() {
    let dev = cpu();
    let g = golden("bert-tiny", &dev);
    let x = ids(&g, &dev);
    check_grads(
        "bert-tiny",
        &load("bert-tiny", &dev, DType::F32, BertHead::MaskedLm),
        &x,
        &g,
    );
    let _ng = vramroom_tensor::no_grad();
    let mask = Tensor::ones(&[2, 8], DType::I64, &dev).unwrap();
    let base = load("bert-tiny", &dev, DType::F32, BertHead::Base);
    let o = base
        .forward(
            &x,
            ForwardArgs {
                attention_mask: Some(&mask),
                ..ForwardArgs::default()
            },
        )
        .unwrap();
    let e = rel_err(
        o.last_hidden_state.as_ref().unwrap(),
        get(&g, "hidden_float32"),
    );
    eprintln!("bert hidden {e}");
    assert!(e < 1e-5, "hidden: {e}");
    let e = rel_err(o.pooler_output.as_ref().unwrap(), get(&g, "pooler_float32"));
    assert!(e < 1e-5, "pooler: {e}");
    let mlm = load("bert-tiny", &dev, DType::F32, BertHead::MaskedLm);
    let o = mlm
        .forward(
            &x,
            ForwardArgs {
                labels: Some(&x),
                ..ForwardArgs::default()
            },
        )
        .unwrap();
    let e = rel_err(o.logits.as_ref().unwrap(), get(&g, "logits_float32"));
    eprintln!("bert mlm logits {e}");
    assert!(e < 1e-5, "mlm logits: {e}");
    let loss = o.loss.unwrap().item().unwrap();
    let want = get(&g, "loss_float32").to_vec_f64().unwrap()[0];
    assert!(
        (loss - want).abs() < 1e-4 * want.abs(),
        "loss {loss} vs {want}"
    );
    let mb = load("bert-tiny", &dev, DType::BF16, BertHead::MaskedLm);
    let lb = mb
        .forward(&x, ForwardArgs::default())
        .unwrap()
        .logits
        .unwrap();
    let e = rel_err(&lb, get(&g, "logits_bfloat16"));
    eprintln!("bert bf16 mlm logits {e}");
    assert!(e < 2e-2, "bf16 mlm logits: {e}");
}
