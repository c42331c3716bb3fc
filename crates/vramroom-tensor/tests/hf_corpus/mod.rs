//! The recorded transformers corpus (`scripts/hf_memory.py`: one PyTorch 2.11 snapshot per
//! model and scenario, on an H200) against Vramroom's meta-device prediction. Shared by
//! `tests/hf_snapshots.rs` and `examples/hf_corpus_table.rs`.
//!
//! Two predictions per scenario, both from the config alone:
//! - **process**: the recording script's process replayed on one simulated GPU — every
//!   scenario of the model in the script's order, each loading a fresh model (weights moved
//!   in `_apply` order, `empty_cache()`), running, and dropping it — so the allocator's
//!   cached segments and the cuBLAS workspaces carry over from scenario to scenario as they
//!   did in PyTorch. PyTorch's `allocated` counts block sizes, and where a weight or an
//!   activation lands (and how much of its block is rounding) depends on that history.
//!   The `static`-cache scenarios, recorded under `torch.compile`, are run eagerly in their
//!   place (their compiled graphs are not modelled; CUDA-graph trees clear the cuBLAS
//!   workspaces, so that is done too) and not compared.
//! - **fresh**: `hf::predict` on a fresh device, with the cuBLAS workspaces the snapshot
//!   shows existing before the recording (a process's first scenario is cold).
//!
//! PyTorch's figure is the replay of the snapshot (`vramroom replay`), which reproduces
//! `max_memory_allocated()` exactly.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use vramroom_alloc::AllocatorConfig;
use vramroom_tensor::models::hf::scenario::Optim;
use vramroom_tensor::models::hf::{self, CacheImpl, RunOptions, Warmth, Workload};
use vramroom_tensor::{DType, Device};
use vramroom_trace::{read_snapshot_file, replay, BlockState, ReplayOptions, TraceAction};

/// One scenario of the script, in its order.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub model: &'static str,
    pub dtype: DType,
    pub workload: Workload,
    /// The snapshot's file name (`<model>__<scenario>.pickle`).
    pub file: String,
}

impl Scenario {
    pub fn is_static(&self) -> bool {
        matches!(
            self.workload,
            Workload::Generate {
                cache: CacheImpl::Static,
                ..
            }
        )
    }
}

/// The models of the script, in its process order.
pub const MODELS: [&str; 8] = [
    "bert-base",
    "bert-tiny",
    "gpt2",
    "gpt2-tiny",
    "llama-small",
    "llama-tiny",
    "mistral-tiny",
    "qwen2-tiny",
];

fn dt_name(d: DType) -> &'static str {
    if d == DType::BF16 {
        "bfloat16"
    } else {
        "float32"
    }
}

/// `scenarios(name, family)` of `scripts/hf_memory.py`.
pub fn scenarios(model: &'static str) -> Vec<Scenario> {
    let causal: &[(usize, usize)] = match model {
        "gpt2" => &[(1, 128), (8, 512), (32, 1024)],
        "gpt2-tiny" => &[(2, 32)],
        "llama-tiny" => &[(2, 64)],
        "llama-small" => &[(1, 128), (4, 512), (8, 1024)],
        "mistral-tiny" | "qwen2-tiny" => &[(2, 64), (4, 256)],
        _ => &[],
    };
    let generate: &[(usize, usize, usize)] = match model {
        "gpt2" | "llama-small" => &[(1, 128, 64), (8, 256, 32)],
        "gpt2-tiny" | "llama-tiny" => &[(2, 16, 8)],
        "mistral-tiny" | "qwen2-tiny" => &[(2, 32, 16)],
        _ => &[],
    };
    let train: (usize, usize) = match model {
        "gpt2" => (8, 512),
        "gpt2-tiny" | "bert-tiny" => (2, 32),
        "llama-tiny" => (2, 64),
        "llama-small" => (4, 512),
        "mistral-tiny" | "qwen2-tiny" => (4, 128),
        _ => (8, 512),
    };
    let bert_infer: &[(usize, usize)] = match model {
        "bert-base" => &[(8, 512), (32, 128)],
        "bert-tiny" => &[(2, 32)],
        _ => &[],
    };
    let mut v = Vec::new();
    let mut push = |dtype: DType, workload: Workload, id: String| {
        v.push(Scenario {
            model,
            dtype,
            workload,
            file: format!("{model}__{id}.pickle"),
        })
    };
    let dtypes = [DType::F32, DType::BF16];
    if model.starts_with("bert") {
        for dt in dtypes {
            for &(b, s) in bert_infer {
                push(
                    dt,
                    Workload::Forward {
                        batch: b,
                        seq: s,
                        use_cache: None,
                    },
                    format!("forward_{}_{b}_{s}", dt_name(dt)),
                );
            }
        }
    } else {
        for dt in dtypes {
            for &(b, s) in causal {
                for uc in [true, false] {
                    let name = if uc { "True" } else { "False" };
                    push(
                        dt,
                        Workload::Forward {
                            batch: b,
                            seq: s,
                            use_cache: Some(uc),
                        },
                        format!("forward_{}_{b}_{s}_{name}", dt_name(dt)),
                    );
                }
            }
        }
        for &(b, p, n) in generate {
            for (c, name) in [
                (CacheImpl::Dynamic, "dynamic"),
                (CacheImpl::Static, "static"),
            ] {
                push(
                    DType::F32,
                    Workload::Generate {
                        batch: b,
                        prompt: p,
                        new_tokens: n,
                        cache: c,
                    },
                    format!("generate_float32_{b}_{p}_{n}_{name}"),
                );
            }
        }
        let (b, p, n) = generate[0];
        push(
            DType::BF16,
            Workload::Generate {
                batch: b,
                prompt: p,
                new_tokens: n,
                cache: CacheImpl::Dynamic,
            },
            format!("generate_bfloat16_{b}_{p}_{n}_dynamic"),
        );
    }
    let (b, s) = train;
    push(
        DType::F32,
        Workload::Train {
            batch: b,
            seq: s,
            steps: 3,
            optimizer: Optim::default(),
        },
        format!("train_float32_{b}_{s}"),
    );
    v
}

/// Where the snapshots are: `VRAMROOM_HF_SNAPS`, else `/work/hf-snaps`.
pub fn snaps_dir() -> Option<PathBuf> {
    let p = std::env::var_os("VRAMROOM_HF_SNAPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/hf-snaps"));
    p.join("hf_memory.jsonl").exists().then_some(p)
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf")
}

/// PyTorch's side of one snapshot.
pub struct Torch {
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Allocated when the recording began (weights and what the process held).
    pub initial_allocated: u64,
    /// cuBLAS handle workspaces (32 MiB blocks) alive when the recording began.
    pub warm_handles: usize,
}

pub fn torch(path: &Path) -> Torch {
    let snap = read_snapshot_file(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let r = replay(&snap, &ReplayOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Blocks alive at the start: alive at the end and not (re)allocated by the trace, plus
    // those the trace frees without having allocated them.
    let trace = &snap.device_traces[0];
    let mut live_in_trace = std::collections::HashMap::new();
    let mut freed_pre = Vec::new();
    for e in trace {
        if e.action == TraceAction::Alloc {
            live_in_trace.insert(e.addr, e.size);
        } else if e.action == TraceAction::FreeCompleted && live_in_trace.remove(&e.addr).is_none()
        {
            freed_pre.push(e.size);
        }
    }
    let mut pre = Vec::new();
    let mut end_alloc = 0u64;
    for seg in &snap.segments {
        for b in &seg.blocks {
            if b.state == BlockState::ActiveAllocated {
                end_alloc += b.size;
                if !live_in_trace.contains_key(&b.address) {
                    pre.push(b.size);
                }
            }
        }
    }
    let warm_handles = pre
        .iter()
        .chain(&freed_pre)
        .filter(|&&s| s == 32 << 20)
        .count();
    let in_trace: u64 = live_in_trace.values().map(|&s| s.div_ceil(512) * 512).sum();
    let freed: u64 = freed_pre.iter().map(|&s| s.div_ceil(512) * 512).sum();
    Torch {
        peak_allocated: r.peak_allocated_bytes,
        peak_reserved: r.peak_reserved_bytes,
        initial_allocated: end_alloc.saturating_sub(in_trace) + freed,
        warm_handles,
    }
}

/// One compared scenario.
pub struct Row {
    pub file: String,
    pub torch: Torch,
    pub process_peak: u64,
    pub process_reserved: u64,
    pub fresh_peak: u64,
}

impl Row {
    pub fn process_ratio(&self) -> f64 {
        self.process_peak as f64 / self.torch.peak_allocated as f64
    }
    pub fn fresh_ratio(&self) -> f64 {
        self.fresh_peak as f64 / self.torch.peak_allocated as f64
    }
}

fn opts(s: &Scenario, warmth: Warmth) -> RunOptions {
    RunOptions {
        dtype: Some(s.dtype),
        warmth: Some(warmth),
        seed: 0,
    }
}

/// Every non-static scenario of `model` whose snapshot is in `snaps`.
pub fn compare_model(model: &'static str, snaps: &Path) -> Vec<Row> {
    let dir = fixtures().join(model);
    let dev = Device::meta_caching(
        vramroom_tensor::predict::UNBOUNDED,
        AllocatorConfig::default(),
    );
    let mut rows = Vec::new();
    for s in scenarios(model) {
        // The process: this scenario on the device the earlier ones ran on (its state is
        // the warmth).
        let r = hf::run(&dir, &dev, &s.workload, &opts(&s, Warmth::Cold))
            .unwrap_or_else(|e| panic!("{model} {}: {e}", s.file));
        if s.is_static() {
            dev.clear_blas_workspaces();
            continue;
        }
        let path = snaps.join(&s.file);
        if !path.exists() {
            continue;
        }
        let t = torch(&path);
        let warmth = match t.warm_handles {
            0 => Warmth::Cold,
            1 => Warmth::Forward,
            _ => Warmth::Full,
        };
        let fresh = hf::predict(
            &dir,
            &s.workload,
            &hf::PredictOptions {
                run: opts(&s, warmth),
                ..hf::PredictOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("{model} {}: {e}", s.file));
        rows.push(Row {
            file: s.file.clone(),
            torch: t,
            process_peak: r.peak_allocated_bytes,
            process_reserved: r.peak_reserved_bytes,
            fresh_peak: fresh.peak_allocated_bytes,
        });
    }
    rows
}
