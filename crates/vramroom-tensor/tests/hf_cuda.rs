//! The Hugging Face models on the cuda backend: the tiny checkpoints of
//! `fixtures/hf-numerics` compute transformers' logits, gradients and greedy tokens, and the
//! workloads allocate what the meta device predicts. Each test is
//! `#[ignore]`d with the reason (a plain `cargo test` lists them as ignored); on a GPU machine
//! run them with `-- --include-ignored`.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock};

use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::models::hf::scenario::Optim;
use vramroom_tensor::models::hf::{
    self, BertHead, CacheImpl, ForwardArgs, GenerateOptions, LoadOptions, RunOptions, Warmth,
    Workload,
};
use vramroom_tensor::{no_grad, safetensors, CudaRuntime, DType, Device, Tensor};

static RT: OnceLock<Option<CudaRuntime>> = OnceLock::new();
static LOCK: Mutex<()> = Mutex::new(());

fn runtime() -> Option<&'static CudaRuntime> {
    RT.get_or_init(|| {
        if let Some(why) = vramroom_cuda::unavailable_reason() {
            eprintln!("no GPU: {why}");
            return None;
        }
        let rt = Device::cuda(0, AllocatorConfig::default()).expect("open cuda:0");
        rt.gpu.set_allow_tf32(false);
        Some(rt)
    })
    .as_ref()
}

macro_rules! gpu {
    () => {{
        let Some(rt) = runtime() else {
            panic!("{}: asked to run without a CUDA GPU", module_path!());
        };
        let g: MutexGuard<()> = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        (rt, g)
    }};
}

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf-numerics")
        .join(name)
}

fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
        / scale
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn hf_models_on_cuda_match_transformers() {
    let (rt, _g) = gpu!();
    let d = &rt.device;
    let host = Device::cpu_caching(1 << 30, AllocatorConfig::default());
    for (name, head) in [
        ("gpt2-tiny", BertHead::Base),
        ("llama-tiny", BertHead::Base),
        ("qwen2-tiny", BertHead::Base),
        ("bert-tiny", BertHead::MaskedLm),
    ] {
        let g = safetensors::load(dir(name).join("golden.safetensors"), &host).unwrap();
        let get = |k: &str| &g.iter().find(|(n, _)| n == k).unwrap().1;
        let ids = get("input_ids").to_vec_i64().unwrap();
        let x = Tensor::from_i64(&ids, &[2, 8], d).unwrap();
        for dtype in [DType::F32, DType::BF16] {
            let m = hf::load(
                &dir(name),
                d,
                &LoadOptions {
                    dtype: Some(dtype),
                    bert_head: head,
                },
            )
            .unwrap()
            .model;
            if dtype == DType::F32 {
                let out = m
                    .forward(
                        &x,
                        ForwardArgs {
                            labels: Some(&x),
                            ..ForwardArgs::default()
                        },
                    )
                    .unwrap();
                let e = rel_err(out.logits.as_ref().unwrap(), get("logits_float32"));
                assert!(e < 1e-3, "{name} f32 logits on cuda: {e}");
                out.loss.unwrap().backward().unwrap();
                for (k, want) in g.iter().filter(|(k, _)| k.starts_with("grad.")) {
                    let p = m
                        .named_parameters()
                        .into_iter()
                        .find(|(n, _)| *n == k[5..])
                        .unwrap()
                        .1;
                    let e = rel_err(&p.grad().unwrap(), want);
                    assert!(e < 1e-3, "{name} {k} on cuda: {e}");
                }
                if name != "bert-tiny" {
                    let _ng = no_grad();
                    let mask = Tensor::ones(&[2, 8], DType::I64, d).unwrap();
                    for cache in [CacheImpl::Dynamic, CacheImpl::Static] {
                        let t = hf::generate(
                            &m,
                            &x,
                            &mask,
                            &GenerateOptions {
                                max_new_tokens: 6,
                                min_new_tokens: None,
                                cache,
                            },
                        )
                        .unwrap();
                        assert_eq!(
                            t.to_vec_i64().unwrap(),
                            get("generated").to_vec_i64().unwrap(),
                            "{name} {cache:?}"
                        );
                    }
                }
            } else {
                let _ng = no_grad();
                let l = m
                    .forward(&x, ForwardArgs::default())
                    .unwrap()
                    .logits
                    .unwrap();
                let e = rel_err(&l, get("logits_bfloat16"));
                assert!(e < 3e-2, "{name} bf16 logits on cuda: {e}");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn hf_workloads_on_cuda_allocate_as_the_meta_device_predicts() {
    let (rt, _g) = gpu!();
    let workloads = [
        Workload::Forward {
            batch: 2,
            seq: 32,
            use_cache: Some(true),
        },
        Workload::Forward {
            batch: 2,
            seq: 32,
            use_cache: Some(false),
        },
        Workload::Generate {
            batch: 2,
            prompt: 16,
            new_tokens: 8,
            cache: CacheImpl::Dynamic,
        },
        Workload::Train {
            batch: 2,
            seq: 32,
            steps: 2,
            optimizer: Optim::default(),
        },
    ];
    for name in ["gpt2-tiny", "llama-tiny", "qwen2-tiny", "bert-tiny"] {
        for w in workloads {
            if name == "bert-tiny" && matches!(w, Workload::Generate { .. }) {
                continue;
            }
            for dtype in [DType::F32, DType::BF16] {
                let o = RunOptions {
                    dtype: Some(dtype),
                    warmth: Some(Warmth::Full),
                    seed: 0,
                };
                rt.device.empty_cache();
                let c = hf::run(&dir(name), &rt.device, &w, &o).unwrap();
                let m = hf::predict(
                    &dir(name),
                    &w,
                    &hf::PredictOptions {
                        run: o.clone(),
                        ..hf::PredictOptions::default()
                    },
                )
                .unwrap();
                // Same allocation sequence; the cuda device's cached segments (earlier
                // tests) may round a block differently, hence a small tolerance.
                let (pc, pm) = (
                    c.peak_allocated_bytes - c.base_allocated_bytes,
                    m.peak_allocated_bytes - m.base_allocated_bytes,
                );
                let r = pc as f64 / pm.max(1) as f64;
                assert!(
                    (r - 1.0).abs() < 0.02,
                    "{name} {w:?} {dtype}: cuda {pc} vs meta {pm} above base"
                );
            }
        }
    }
}
