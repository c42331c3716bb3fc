//! Forward outputs against PyTorch: ResNet-18 (torchvision layout) and a tiny GPT-2 (Hugging
//! Face layout) on the cpu device, with the weights, BatchNorm statistics and inputs of
//! `tests/fixtures/make_fixtures.py`, whose outputs PyTorch 2.11 wrote into
//! `tests/fixtures/` (`*_logits.f32`, raw little-endian f32, and `fixtures.json`).
//!
//! The formulas are repeated here from the script's docstring; `fixtures.json` carries float64
//! sums of some generated tensors, so a formula that drifted on either side fails as such
//! before any output is compared. Each stage (stem, layers, pooled features; embeddings,
//! blocks, final norm) is compared too, which places a mismatch.

use std::path::PathBuf;

use serde_json::Value;
use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::models::{Gpt2, Gpt2Config, ResNet};
use vramroom_tensor::nn::{Init, Module};
use vramroom_tensor::{no_grad, ops, DType, Device, Tensor};

/// Relative tolerance, against the largest magnitude of the compared tensor.
const TOL: f64 = 1e-4;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn meta() -> Value {
    let p = dir().join("fixtures.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; regenerate with `python3 tests/fixtures/make_fixtures.py tests/fixtures` \
             on a machine with PyTorch",
            p.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

fn read_f32(file: &str) -> Vec<f32> {
    let bytes = std::fs::read(dir().join(file)).unwrap();
    assert_eq!(bytes.len() % 4, 0);
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

const CONV1D: [&str; 3] = [".c_attn.", ".c_proj.", ".c_fc."];

/// The parameter formula of make_fixtures.py (float64, then f32).
fn param_values(name: &str, shape: &[usize], k: usize) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let sin = |i: usize| (0.37 * i as f64 + 1.3 * k as f64).sin();
    let f: Box<dyn Fn(usize) -> f64> = if shape.len() == 1 {
        if name.ends_with("weight") {
            Box::new(move |i| 1.0 + 0.1 * sin(i))
        } else {
            Box::new(move |i| 0.05 * sin(i))
        }
    } else if name.contains(".wte.") || name.contains(".wpe.") {
        Box::new(move |i| 0.1 * sin(i))
    } else if CONV1D.iter().any(|c| name.contains(c)) {
        let a = (3.0 / shape[0] as f64).sqrt();
        Box::new(move |i| a * sin(i))
    } else {
        let a = (3.0 / (n / shape[0]) as f64).sqrt();
        Box::new(move |i| a * sin(i))
    };
    (0..n).map(|i| f(i) as f32).collect()
}

fn buffer_values(name: &str, n: usize, k: usize) -> Vec<f32> {
    (0..n)
        .map(|c| {
            let c = c as f64;
            let v = if name.ends_with("running_mean") {
                0.1 * (0.29 * c + 0.7 * k as f64).sin()
            } else {
                1.0 + 0.5 * (0.53 * c + 0.7 * k as f64).sin()
            };
            v as f32
        })
        .collect()
}

/// Fills parameters and BN buffers by the formulas; returns the float64 sum of each.
fn fill(m: &dyn Module, d: &Device) -> Vec<(String, f64)> {
    let _g = no_grad();
    let mut sums = Vec::new();
    let mut params = m.named_parameters();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, (name, p)) in params.iter().enumerate() {
        let v = param_values(name, p.shape(), k);
        p.copy_(&Tensor::from_f32(&v, p.shape(), d).unwrap())
            .unwrap();
        sums.push((name.clone(), v.iter().map(|&x| x as f64).sum()));
    }
    let mut bufs: Vec<_> = m
        .named_buffers()
        .into_iter()
        .filter(|(n, _)| n.ends_with("running_mean") || n.ends_with("running_var"))
        .collect();
    bufs.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, (name, b)) in bufs.iter().enumerate() {
        let v = buffer_values(name, b.numel(), k);
        b.copy_(&Tensor::from_f32(&v, b.shape(), d).unwrap())
            .unwrap();
        sums.push((name.clone(), v.iter().map(|&x| x as f64).sum()));
    }
    sums
}

fn check_weight_sums(ours: &[(String, f64)], want: &Value) {
    for (name, w) in want.as_object().unwrap() {
        let w = w.as_f64().unwrap();
        let got = ours
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
            .1;
        assert!(
            (got - w).abs() <= 1e-9 * w.abs().max(1.0),
            "{name}: generated sum {got} vs PyTorch's {w}: the formulas differ"
        );
    }
}

fn cpu() -> Device {
    Device::cpu_caching(4 << 30, AllocatorConfig::default())
}

/// Max |a - b| over max |b|.
fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    got.iter()
        .zip(want)
        .fold(0f64, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

/// Compares one stage with its summary in fixtures.json.
fn check_stage(model: &str, name: &str, t: &Tensor, want: &Value) {
    let w = &want[name];
    let shape: Vec<usize> = w["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(t.shape(), &shape[..], "{model} {name}");
    let v = t.to_vec_f64().unwrap();
    let abs_sum: f64 = v.iter().map(|x| x.abs()).sum();
    let sum: f64 = v.iter().sum();
    let want_abs = w["abs_sum"].as_f64().unwrap();
    let want_sum = w["sum"].as_f64().unwrap();
    let first: Vec<f64> = w["first"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let e_first = rel_err(&v[..first.len()], &first);
    let e_abs = (abs_sum - want_abs).abs() / want_abs;
    // The plain sum can cancel; measure it against the absolute sum.
    let e_sum = (sum - want_sum).abs() / want_abs;
    eprintln!(
        "{model} {name:>8}: abs_sum {abs_sum:.6e} (PyTorch {want_abs:.6e}), errors: first {e_first:.1e}, abs_sum {e_abs:.1e}, sum {e_sum:.1e}"
    );
    assert!(
        e_first <= TOL && e_abs <= TOL && e_sum <= TOL,
        "{model} {name}: off PyTorch"
    );
}

fn check_logits(model: &str, t: &Tensor, file: &str) {
    let want: Vec<f64> = read_f32(file).into_iter().map(f64::from).collect();
    let got = t.to_vec_f64().unwrap();
    let e = rel_err(&got, &want);
    let worst_elem = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1e-3))
        .fold(0f64, f64::max);
    eprintln!(
        "{model} logits: {} values, max |ours - PyTorch| / max |PyTorch| = {e:.2e}, worst elementwise relative {worst_elem:.2e}",
        got.len()
    );
    assert!(e <= TOL, "{model} logits off PyTorch: {e}");
}

#[test]
fn resnet18_forward_matches_pytorch() {
    let meta = meta();
    let want = &meta["resnet18"];
    let d = cpu();
    let mut m = ResNet::resnet18(&Init::new(&d, DType::F32), 1000).unwrap();
    m.train(false);
    let n: usize = m.parameters().iter().map(|p| p.numel()).sum();
    assert_eq!(n as u64, want["n_params"].as_u64().unwrap());
    check_weight_sums(&fill(&m, &d), &want["weight_sums"]);
    let img: Vec<f32> = (0..3 * 64 * 64)
        .map(|i| {
            let i = i as f64;
            ((0.013 * i).sin() + 0.5 * (0.0071 * i).cos()) as f32
        })
        .collect();
    let input_sum: f64 = img.iter().map(|&x| x as f64).sum();
    assert!((input_sum - want["input_sum"].as_f64().unwrap()).abs() < 1e-9 * 12288.0);
    let x = Tensor::from_f32(&img, &[1, 3, 64, 64], &d).unwrap();

    let _g = no_grad();
    let st = &want["stages"];
    let mut h = m.conv1.forward(&x).unwrap();
    h = m.bn1.forward(&h).unwrap();
    h.relu_().unwrap();
    check_stage("resnet18", "stem", &h, st);
    h = m.maxpool.forward(&h).unwrap();
    check_stage("resnet18", "maxpool", &h, st);
    for (i, layer) in m.layers.iter().enumerate() {
        for b in layer {
            h = b.forward(&h).unwrap();
        }
        check_stage("resnet18", &format!("layer{}", i + 1), &h, st);
    }
    h = m.avgpool.forward(&h).unwrap().flatten(1, -1).unwrap();
    check_stage("resnet18", "avgpool", &h, st);
    let logits = m.fc.forward(&h).unwrap();
    check_stage("resnet18", "logits", &logits, st);
    check_logits("resnet18", &logits, want["file"].as_str().unwrap());
    // The model's own forward is the same computation.
    let direct = m.forward(&x).unwrap();
    assert_eq!(direct.to_vec_f32().unwrap(), logits.to_vec_f32().unwrap());
}

#[test]
fn tiny_gpt2_forward_matches_pytorch() {
    let meta = meta();
    let want = &meta["gpt2_tiny"];
    let cfg = &want["config"];
    let c = Gpt2Config {
        n_layer: cfg["n_layer"].as_u64().unwrap() as usize,
        n_head: cfg["n_head"].as_u64().unwrap() as usize,
        n_embd: cfg["n_embd"].as_u64().unwrap() as usize,
        vocab_size: cfg["vocab_size"].as_u64().unwrap() as usize,
        n_positions: cfg["n_positions"].as_u64().unwrap() as usize,
        dropout: 0.0,
        layer_norm_epsilon: cfg["layer_norm_epsilon"].as_f64().unwrap(),
    };
    assert_eq!(
        (c.n_layer, c.n_head, c.n_embd, c.vocab_size, c.n_positions),
        (2, 2, 64, 101, 32)
    );
    let d = cpu();
    let mut m = Gpt2::new(&Init::new(&d, DType::F32), c).unwrap();
    m.train(false);
    let n: usize = m.parameters().iter().map(|p| p.numel()).sum();
    assert_eq!(n as u64, want["n_params"].as_u64().unwrap());
    check_weight_sums(&fill(&m, &d), &want["weight_sums"]);
    let (b, t) = (2usize, 8usize);
    let ids: Vec<i64> = (0..b)
        .flat_map(|b| (0..t).map(move |t| ((7 * t + 13 * b + 3) % 101) as i64))
        .collect();
    let want_ids: Vec<i64> = want["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()))
        .collect();
    assert_eq!(ids, want_ids);
    let x = Tensor::from_i64(&ids, &[b, t], &d).unwrap();

    let _g = no_grad();
    let st = &want["stages"];
    let pos = Tensor::arange(t, DType::I64, &d)
        .unwrap()
        .reshape(&[1, t])
        .unwrap();
    let mut h = m
        .wte
        .forward(&x)
        .unwrap()
        .add(&m.wpe.forward(&pos).unwrap())
        .unwrap();
    check_stage("gpt2", "embed", &h, st);
    for (i, blk) in m.h.iter().enumerate() {
        h = blk.forward(&h).unwrap();
        check_stage("gpt2", &format!("h{i}"), &h, st);
    }
    h = m.ln_f.forward(&h).unwrap();
    check_stage("gpt2", "ln_f", &h, st);
    let logits = ops::linear(&h, &m.wte.weight, None).unwrap();
    check_stage("gpt2", "logits", &logits, st);
    check_logits("gpt2", &logits, want["file"].as_str().unwrap());
    let direct = m.forward(&x).unwrap();
    assert_eq!(direct.to_vec_f32().unwrap(), logits.to_vec_f32().unwrap());
}
