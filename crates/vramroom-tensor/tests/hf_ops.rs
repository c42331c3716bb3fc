//! The pieces under the Hugging Face models: scaled-dot-product attention (backend choice,
//! what each backend allocates, values and gradients against the composite), argmax, and
//! the loader's and workloads' user-facing behaviour.

use std::path::PathBuf;
use std::sync::Arc;

use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::gradcheck::{gradcheck, GradcheckOptions};
use vramroom_tensor::models::hf::{self, ForwardArgs, HfError, LoadOptions, Workload};
use vramroom_tensor::ops::{self, SdpaArgs, SdpaBackend};
use vramroom_tensor::{
    no_grad, CountingAllocator, DType, Device, HostAllocator, MemEvent, RecordingAllocator, Result,
    Tensor,
};

fn cpu() -> Device {
    Device::cpu(Arc::new(HostAllocator::new(1 << 30)))
}

fn data(n: usize, seed: u64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            (((i as f64 + 1.0) * 0.754_877_666 + seed as f64 * 0.569_840_29).fract() - 0.5) * 2.0
        })
        .collect()
}

fn rand(d: &Device, shape: &[usize], seed: u64, dt: DType) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_f64(&data(n, seed), shape, dt, d).unwrap()
}

fn leaf(d: &Device, shape: &[usize], seed: u64) -> Tensor {
    let t = rand(d, shape, seed, DType::F32);
    t.requires_grad_(true).unwrap();
    t
}

/// `softmax(q k^T * scale + causal mask) v`, from the basic ops (heads repeated for GQA).
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> Result<Tensor> {
    let (hq, hk) = (q.shape()[1], k.shape()[1]);
    let rep = |x: &Tensor| -> Result<Tensor> {
        let s = x.shape().to_vec();
        x.unsqueeze(2)?
            .expand(&[s[0], s[1], hq / hk, s[2], s[3]])?
            .reshape(&[s[0], hq, s[2], s[3]])
    };
    let (k, v) = (rep(k)?, rep(v)?);
    let d = q.shape()[3] as f64;
    let mut w = q
        .matmul(&k.transpose(-1, -2)?)?
        .mul_scalar(1.0 / d.sqrt())?;
    if causal {
        let (t, s) = (q.shape()[2], k.shape()[2]);
        let m: Vec<f64> = (0..t * s)
            .map(|x| ((x % s) > (x / s)) as u8 as f64)
            .collect();
        let m = Tensor::from_f64(&m, &[t, s], DType::Bool, q.device())?;
        w = w.masked_fill(&m, f64::NEG_INFINITY)?;
    }
    w.softmax(-1)?.matmul(&v)
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn args(causal: bool, gqa: bool) -> SdpaArgs<'static> {
    SdpaArgs {
        is_causal: causal,
        enable_gqa: gqa,
        ..SdpaArgs::default()
    }
}

#[test]
fn backend_choice_is_pytorchs_on_an_h200() {
    let d = Device::meta(Arc::new(CountingAllocator::new(1 << 40)));
    let t = |sh: &[usize], dt| Tensor::empty(sh, dt, &d).unwrap();
    let pick = |q: &Tensor, k: &Tensor, gqa| ops::sdpa_backend(q, k, k, &args(true, gqa)).unwrap();
    let (q, k) = (
        t(&[2, 8, 64, 32], DType::BF16),
        t(&[2, 2, 64, 32], DType::BF16),
    );
    assert_eq!(pick(&q, &q, false), SdpaBackend::Cudnn);
    assert_eq!(
        pick(&q, &k, true),
        SdpaBackend::Cudnn,
        "cuDNN takes grouped heads"
    );
    let k1 = t(&[2, 8, 1, 32], DType::BF16);
    assert_eq!(
        ops::sdpa_backend(&q, &k1, &k1, &args(false, false)).unwrap(),
        SdpaBackend::Flash,
        "cuDNN declines a key length of 1"
    );
    let (q, k) = (
        t(&[2, 8, 64, 32], DType::F32),
        t(&[2, 2, 64, 32], DType::F32),
    );
    assert_eq!(pick(&q, &q, false), SdpaBackend::Efficient);
    assert_eq!(
        pick(&q, &k, true),
        SdpaBackend::Math,
        "f32 grouped heads: the math path"
    );
    let odd = t(&[1, 2, 8, 6], DType::F32);
    assert_eq!(
        pick(&odd, &odd, false),
        SdpaBackend::Math,
        "head dim not a multiple of 4"
    );
    // Grouped heads without enable_gqa are an error, as in PyTorch.
    assert!(ops::sdpa_backend(&q, &k, &k, &args(true, false)).is_err());
}

#[test]
fn every_backend_computes_attention() {
    let d = cpu();
    for (hq, hk, dt) in [
        (4, 4, DType::F32),
        (4, 2, DType::F32),
        (4, 2, DType::BF16),
        (4, 4, DType::BF16),
    ] {
        for causal in [true, false] {
            let q = rand(&d, &[2, hq, 5, 8], 1, dt);
            let k = rand(&d, &[2, hk, 5, 8], 2, dt);
            let v = rand(&d, &[2, hk, 5, 8], 3, dt);
            let got =
                ops::scaled_dot_product_attention(&q, &k, &v, &args(causal, hq != hk)).unwrap();
            let f = |x: &Tensor| x.to_dtype(DType::F32).unwrap();
            let want = reference(&f(&q), &f(&k), &f(&v), causal).unwrap();
            let tol = if dt == DType::F32 { 1e-5 } else { 2e-2 };
            let e = max_diff(&got, &want);
            assert!(e < tol, "{hq}/{hk} heads {dt} causal {causal}: {e}");
        }
    }
    // A boolean mask (true: attend) equals the same positions masked additively.
    let q = rand(&d, &[1, 2, 4, 8], 4, DType::F32);
    let keep: Vec<f64> = (0..16).map(|i| ((i % 4) <= (i / 4)) as u8 as f64).collect();
    let m = Tensor::from_f64(&keep, &[4, 4], DType::Bool, &d).unwrap();
    let got = ops::scaled_dot_product_attention(
        &q,
        &q,
        &q,
        &SdpaArgs {
            attn_mask: Some(&m),
            ..SdpaArgs::default()
        },
    )
    .unwrap();
    assert!(max_diff(&got, &reference(&q, &q, &q, true).unwrap()) < 1e-5);
}

#[test]
fn attention_gradients_match_finite_differences() {
    let d = cpu();
    let opts = GradcheckOptions::default();
    for (hk, causal, dropout) in [
        (2, true, 0.0),
        (2, false, 0.0),
        (1, true, 0.0),
        (2, true, 0.3),
    ] {
        let q = leaf(&d, &[1, 2, 3, 4], 1);
        let k = leaf(&d, &[1, hk, 3, 4], 2);
        let v = leaf(&d, &[1, hk, 3, 4], 3);
        gradcheck(
            |t| {
                // Reseeded, so every evaluation drops the same weights.
                t[0].device().manual_seed(7);
                ops::scaled_dot_product_attention(
                    &t[0],
                    &t[1],
                    &t[2],
                    &SdpaArgs {
                        is_causal: causal,
                        enable_gqa: hk != 2,
                        dropout_p: dropout,
                        ..SdpaArgs::default()
                    },
                )
            },
            &[q, k, v],
            opts,
        )
        .unwrap_or_else(|e| panic!("{hk} key heads, causal {causal}, dropout {dropout}: {e}"));
    }
}

/// The sizes a call allocates (+) and frees (-), in order.
fn events(f: impl FnOnce(&Device)) -> Vec<i64> {
    let rec = Arc::new(RecordingAllocator::new(Arc::new(CountingAllocator::new(
        1 << 40,
    ))));
    let d = Device::meta(rec.clone());
    f(&d);
    rec.take()
        .into_iter()
        .map(|e| match e {
            MemEvent::Alloc { nbytes, .. } => nbytes as i64,
            MemEvent::Free { nbytes, .. } => -(nbytes as i64),
        })
        .collect()
}

#[test]
fn each_backend_allocates_what_pytorch_does() {
    let sh = [2usize, 4, 64, 32];
    let out = |dt: DType| (sh.iter().product::<usize>() * dt.size()) as i64;
    // Memory-efficient (f32), no grad: the output alone; with grad, logsumexp [B, H, 64].
    let ev = events(|d| {
        let q = Tensor::empty(&sh, DType::F32, d).unwrap();
        let _g = no_grad();
        let o = ops::scaled_dot_product_attention(&q, &q, &q, &args(true, false)).unwrap();
        // Its [B, T, H, D] order: transformers' transpose(1, 2).contiguous() copies nothing.
        assert!(o.transpose(1, 2).unwrap().is_contiguous());
    });
    assert_eq!(&ev[1..3], &[out(DType::F32), -out(DType::F32)], "{ev:?}");
    let ev = events(|d| {
        let q = Tensor::empty(&sh, DType::F32, d).unwrap();
        q.requires_grad_(true).unwrap();
        let _o = ops::scaled_dot_product_attention(&q, &q, &q, &args(true, false)).unwrap();
    });
    assert_eq!(&ev[1..3], &[out(DType::F32), 2 * 4 * 64 * 4], "{ev:?}");
    // cuDNN (bf16), no grad: seed, offset, output, a 256-byte workspace; all but the output
    // freed on return.
    let ev = events(|d| {
        let q = Tensor::empty(&sh, DType::BF16, d).unwrap();
        let _o = ops::scaled_dot_product_attention(&q, &q, &q, &args(true, false)).unwrap();
    });
    assert_eq!(
        &ev[1..8],
        &[8, 8, out(DType::BF16), 256, -256, -8, -8],
        "{ev:?}"
    );
}

#[test]
fn argmax_takes_the_first_maximum() {
    let d = cpu();
    let x = Tensor::from_f64(&[1.0, 3.0, 3.0, 0.0, -1.0, -2.0], &[2, 3], DType::F32, &d).unwrap();
    assert_eq!(
        x.argmax(-1, false).unwrap().to_vec_i64().unwrap(),
        vec![1, 0]
    );
    assert_eq!(x.argmax(0, true).unwrap().shape(), &[1, 3]);
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(name)
}

#[test]
fn unsupported_configs_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("vramroom-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = Device::meta_caching(1 << 40, AllocatorConfig::default());
    let load = |json: &str| {
        std::fs::write(dir.join("config.json"), json).unwrap();
        hf::load(&dir, &d, &LoadOptions::default()).err().unwrap()
    };
    let e = load(r#"{"model_type": "falcon"}"#);
    assert!(matches!(e, HfError::UnsupportedFamily { .. }));
    assert!(
        e.to_string()
            .contains("supported: gpt2, llama, mistral, qwen2, bert"),
        "{e}"
    );
    let e =
        load(r#"{"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#);
    assert!(e.to_string().contains("yarn"), "{e}");
    let e = load("{not json");
    assert!(matches!(e, HfError::Config { .. }), "{e}");
    let e = hf::load(&dir.join("missing"), &d, &LoadOptions::default())
        .err()
        .unwrap();
    assert!(matches!(e, HfError::Io { .. }), "{e}");
    let e = hf::predict(
        &fixture("hf/bert-tiny"),
        &Workload::Generate {
            batch: 1,
            prompt: 4,
            new_tokens: 2,
            cache: hf::CacheImpl::Dynamic,
        },
        &hf::PredictOptions::default(),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("encoder"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn without_weights_cpu_initialises_and_says_so_meta_needs_only_the_config() {
    let dir = fixture("hf/gpt2-tiny");
    let l = hf::load(&dir, &cpu(), &LoadOptions::default()).unwrap();
    let note = l.note.expect("random init is reported");
    assert!(note.contains("initialised randomly"), "{note}");
    let meta = Device::meta_caching(1 << 40, AllocatorConfig::default());
    let l = hf::load(&dir, &meta, &LoadOptions::default()).unwrap();
    assert!(l.note.is_none());
    // GPT-2's lm_head is wte: one tensor, allocated once.
    let params = l.model.named_parameters();
    assert!(params.iter().all(|(n, _)| n != "lm_head.weight"));
    assert_eq!(meta.memory_allocated(), {
        let mut b = 0u64;
        for (_, t) in params.iter().chain(l.model.named_buffers().iter()) {
            b += t.nbytes().div_ceil(512) * 512;
        }
        b
    });
}

#[test]
fn the_kv_cache_is_part_of_the_output_unless_use_cache_is_off() {
    let dir = fixture("hf/llama-tiny");
    let d = Device::meta_caching(1 << 40, AllocatorConfig::default());
    let m = hf::load(&dir, &d, &LoadOptions::default()).unwrap().model;
    let c = m.config().clone();
    let x = Tensor::empty(&[2, 64], DType::I64, &d).unwrap();
    let _g = no_grad();
    let base = d.memory_allocated();
    let on = m.forward(&x, ForwardArgs::default()).unwrap();
    let with_cache = d.memory_allocated() - base;
    let cache = on.cache.as_ref().expect("use_cache defaults to on");
    let kv = cache.tensors();
    assert_eq!(kv.len(), 2 * c.num_hidden_layers);
    let kv_bytes: u64 = kv.iter().map(|t| t.nbytes()).sum();
    assert_eq!(
        kv_bytes,
        (2 * c.num_hidden_layers * 2 * c.num_key_value_heads * 64 * c.head_dim * 4) as u64
    );
    drop((kv, on));
    let off = m
        .forward(
            &x,
            ForwardArgs {
                use_cache: Some(false),
                ..ForwardArgs::default()
            },
        )
        .unwrap();
    assert!(off.cache.is_none());
    let without = d.memory_allocated() - base;
    assert_eq!(with_cache - without, kv_bytes);
}

#[test]
fn predict_gives_peaks_from_the_config_alone() {
    // The 124M GPT-2: no weights on disk, every workload kind.
    let dir = fixture("hf/gpt2");
    let p = |w: Workload| hf::predict(&dir, &w, &hf::PredictOptions::default()).unwrap();
    let fwd = p(Workload::Forward {
        batch: 1,
        seq: 128,
        use_cache: None,
    });
    assert!(
        fwd.weights_bytes > 490_000_000 && fwd.weights_bytes < 500_000_000,
        "{}",
        fwd.weights_bytes
    );
    assert!(fwd.peak_allocated_bytes > fwd.base_allocated_bytes);
    assert!(fwd.peak_reserved_bytes >= fwd.peak_allocated_bytes);
    let gen = p(Workload::Generate {
        batch: 1,
        prompt: 32,
        new_tokens: 8,
        cache: hf::CacheImpl::Dynamic,
    });
    assert!(gen.tokens.is_none(), "no values on the meta device");
    let train = p(Workload::Train {
        batch: 1,
        seq: 32,
        steps: 2,
        optimizer: hf::scenario::Optim::default(),
    });
    // AdamW's two states are there from the first step.
    assert!(
        train
            .categories
            .get("optimizer_state")
            .copied()
            .unwrap_or(0)
            >= 2 * train.weights_bytes
    );
}
