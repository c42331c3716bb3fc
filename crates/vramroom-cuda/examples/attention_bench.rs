//! The attention forward alone on a real GPU: the naive kernel (`k_attn_fwd`) against the one
//! `Auto` picks (flash.cu's tiles, or its row kernel for decode), at GPT-2's shapes (causal,
//! the views of a fused QKV projection, as transformers hands them to SDPA) and a Llama
//! prefill and decode step; beside PyTorch's SDPA at the same shapes when given the JSON lines
//! of scripts/torch_sdpa_bench.py.
//!
//!     attention_bench [--reps N] [--no-naive] [--kernel auto|tiled|cudnn|rows]
//!                     [--torch torch_sdpa.jsonl] [--json out.jsonl]
//!
//! `--kernel` times that kernel instead of the one `Auto` picks (cuDNN's engine for 16-bit
//! calls where it has a plan: the views carry the 256-byte workspace PyTorch allocates).
//! Times are CUDA-event milliseconds per call: the fast kernel's median over N calls (after 3
//! warm-up calls), the naive kernel's single call. `max|fast-naive|` is relative to the
//! largest output, a check that the fast kernel computed the same thing at full size.

use std::collections::HashMap;

use vramroom_alloc::rng::Rng;
use vramroom_alloc::AllocatorConfig;
use vramroom_cuda::compute::{AttentionKernel, AttentionSpec, AttentionViews};
use vramroom_cuda::{cuda_allocator, unavailable_reason, CudaAllocator, Dt, Gpu, Strided};

struct Case {
    name: &'static str,
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    s: usize,
    d: usize,
    causal: bool,
    /// q, k, v as views of one [B, T, 3 * H * D] projection (GPT-2's c_attn), the output in
    /// [B, T, H, D] memory; else contiguous [B, H, T, D] (a KV cache, rotary outputs).
    fused: bool,
}

const CASES: &[Case] = &[
    Case {
        name: "gpt2 8x512",
        b: 8,
        hq: 12,
        hkv: 12,
        tq: 512,
        s: 512,
        d: 64,
        causal: true,
        fused: true,
    },
    Case {
        name: "gpt2 32x1024",
        b: 32,
        hq: 12,
        hkv: 12,
        tq: 1024,
        s: 1024,
        d: 64,
        causal: true,
        fused: true,
    },
    Case {
        name: "gpt2 decode 32x1024",
        b: 32,
        hq: 12,
        hkv: 12,
        tq: 1,
        s: 1024,
        d: 64,
        causal: false,
        fused: false,
    },
    Case {
        name: "llama 4x1024",
        b: 4,
        hq: 32,
        hkv: 8,
        tq: 1024,
        s: 1024,
        d: 128,
        causal: true,
        fused: false,
    },
    Case {
        name: "llama decode 8x2048",
        b: 8,
        hq: 32,
        hkv: 8,
        tq: 1,
        s: 2048,
        d: 128,
        causal: false,
        fused: false,
    },
];

/// `n` values in [-2, 2) from the workspace's seeded generator, as `dt` bytes.
fn encode(n: usize, dt: Dt, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(n * dt.size());
    for _ in 0..n {
        let v = ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0;
        match dt {
            Dt::BF16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            _ => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

fn decode(bytes: &[u8], dt: Dt) -> Vec<f32> {
    match dt {
        Dt::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    }
}

struct Bufs {
    views: AttentionViews,
    out_bytes: usize,
    ptrs: Vec<u64>,
}

fn setup(gpu: &Gpu, alloc: &CudaAllocator, c: &Case, dt: Dt) -> Result<Bufs, String> {
    let es = dt.size();
    let mut ptrs = Vec::new();
    let mut buffer = |bytes: usize| -> Result<u64, String> {
        let p = alloc
            .malloc(bytes as u64, gpu.stream_id())
            .map_err(|e| e.to_string())?
            .ptr;
        ptrs.push(p);
        Ok(p)
    };
    let sv = |p: u64, sh: [usize; 4], st: [usize; 4], off: usize| {
        Strided::new(p, dt, &sh, &st, off).map_err(|e| e.to_string())
    };
    let (qsh, ksh) = ([c.b, c.hq, c.tq, c.d], [c.b, c.hkv, c.s, c.d]);
    let (q, k, v, out);
    if c.fused {
        let e = c.hq * c.d;
        let n = c.b * c.tq * 3 * e;
        let p = buffer(n * es)?;
        gpu.write(p, &encode(n, dt, 1)).map_err(|e| e.to_string())?;
        let st = [c.tq * 3 * e, c.d, 3 * e, 1];
        q = sv(p, qsh, st, 0)?;
        k = sv(p, ksh, st, e)?;
        v = sv(p, ksh, st, 2 * e)?;
        let o = buffer(c.b * c.tq * e * es)?;
        out = sv(o, qsh, [c.tq * e, c.d, e, 1], 0)?;
    } else {
        let mut up = |sh: [usize; 4], seed: u64| -> Result<Strided, String> {
            let n: usize = sh.iter().product();
            let p = buffer(n * es)?;
            gpu.write(p, &encode(n, dt, seed))
                .map_err(|e| e.to_string())?;
            sv(p, sh, [sh[1] * sh[2] * sh[3], sh[2] * sh[3], sh[3], 1], 0)
        };
        q = up(qsh, 1)?;
        k = up(ksh, 2)?;
        v = up(ksh, 3)?;
        out = up(qsh, 4)?;
    }
    Ok(Bufs {
        views: AttentionViews {
            q,
            k,
            v,
            mask: Strided::none(),
            out,
            lse: Strided::none(),
            // What PyTorch's cuDNN path allocates, so that Auto may pick cuDNN as in a model.
            workspace: buffer(256)?,
            workspace_size: 256,
        },
        out_bytes: c.b * c.hq * c.tq * c.d * es,
        ptrs,
    })
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if let Some(why) = unavailable_reason() {
        eprintln!("SKIP attention_bench: {why}");
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let reps: usize = arg("--reps").and_then(|v| v.parse().ok()).unwrap_or(20);
    let naive = !args.iter().any(|a| a == "--no-naive");
    let fast_kernel = match arg("--kernel").as_deref() {
        None | Some("auto") => AttentionKernel::Auto,
        Some("tiled") => AttentionKernel::Tiled,
        Some("cudnn") => AttentionKernel::Cudnn,
        Some("rows") => AttentionKernel::Rows,
        Some(k) => {
            eprintln!("attention_bench: --kernel {k}: auto, tiled, cudnn or rows");
            std::process::exit(2);
        }
    };
    // PyTorch's figures: {"case", "dtype", "ms"} per line.
    let mut torch: HashMap<(String, String), f64> = HashMap::new();
    if let Some(p) = arg("--torch") {
        match std::fs::read_to_string(&p) {
            Ok(text) => {
                for line in text.lines() {
                    let Ok(j) = serde_json::from_str::<serde_json::Value>(line) else {
                        continue;
                    };
                    if let (Some(c), Some(d), Some(ms)) =
                        (j["case"].as_str(), j["dtype"].as_str(), j["ms"].as_f64())
                    {
                        torch.insert((c.to_string(), d.to_string()), ms);
                    }
                }
            }
            Err(e) => eprintln!("attention_bench: {p}: {e} (no torch column)"),
        }
    }
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("attention_bench: {e}");
            std::process::exit(1);
        }
    };
    let alloc = match cuda_allocator(0, AllocatorConfig::default()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("attention_bench: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "Attention forward on {} (ms per call; fast = median of {reps}, naive = one call)",
        gpu.name()
    );
    println!(
        "{:<22} {:>5} {:>7} {:>10} {:>10} {:>9} {:>8} {:>10} {:>11} {:>12}",
        "case",
        "dtype",
        "kernel",
        "naive ms",
        "fast ms",
        "speedup",
        "TFLOP/s",
        "torch ms",
        "torch/fast",
        "max|f-n|"
    );
    let mut json = Vec::new();
    for c in CASES {
        for (dt, dname) in [(Dt::F32, "f32"), (Dt::BF16, "bf16")] {
            // f32 with grouped heads never reaches a fused kernel (PyTorch runs its math path).
            if dt == Dt::F32 && c.hq != c.hkv {
                continue;
            }
            let bufs = match setup(&gpu, &alloc, c, dt) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("{} {dname}: {e}", c.name);
                    continue;
                }
            };
            let spec = AttentionSpec {
                scale: 1.0 / (c.d as f64).sqrt(),
                causal: c.causal,
                dropout: 0.0,
                seed: 0,
            };
            let v = &bufs.views;
            let run = |k: AttentionKernel| -> Result<f32, String> {
                gpu.time_ms(|| gpu.attention_with(k, v, &spec))
                    .map_err(|e| e.to_string())
            };
            let kernel = match fast_kernel {
                AttentionKernel::Auto => gpu
                    .attention_kernel(v, &spec)
                    .map(|k| format!("{k:?}"))
                    .unwrap_or_else(|e| e.to_string()),
                k => format!("{k:?}"),
            };
            let mut fast = Vec::new();
            let mut failed = None;
            for i in 0..reps + 3 {
                match run(fast_kernel) {
                    Ok(ms) if i >= 3 => fast.push(ms),
                    Ok(_) => {}
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                eprintln!("{} {dname}: fast kernel: {e}", c.name);
                continue;
            }
            let fast_ms = median(fast);
            let mut fast_out = vec![0u8; bufs.out_bytes];
            let read_out = |buf: &mut [u8]| gpu.read(v.out.addr(), buf).map_err(|e| e.to_string());
            let (mut naive_ms, mut diff) = (None, None);
            if naive && read_out(&mut fast_out).is_ok() {
                match run(AttentionKernel::Naive) {
                    Ok(ms) => {
                        naive_ms = Some(ms);
                        let mut naive_out = vec![0u8; bufs.out_bytes];
                        if read_out(&mut naive_out).is_ok() {
                            let (f, n) = (decode(&fast_out, dt), decode(&naive_out, dt));
                            let big = n.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
                            let worst = f
                                .iter()
                                .zip(&n)
                                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                            diff = Some(worst / big);
                        }
                    }
                    Err(e) => eprintln!("{} {dname}: naive kernel: {e}", c.name),
                }
            }
            let mut flops = 4.0 * (c.b * c.hq * c.tq * c.s * c.d) as f64;
            if c.causal {
                flops /= 2.0;
            }
            let tflops = flops / (fast_ms as f64 * 1e-3) / 1e12;
            let torch_ms = torch.get(&(c.name.to_string(), dname.to_string())).copied();
            let fmt = |x: Option<f64>, p: usize| {
                x.map(|v| format!("{v:.p$}")).unwrap_or_else(|| "-".into())
            };
            println!(
                "{:<22} {:>5} {:>7} {:>10} {:>10.3} {:>9} {:>8.1} {:>10} {:>11} {:>12}",
                c.name,
                dname,
                kernel,
                fmt(naive_ms.map(|x| x as f64), 3),
                fast_ms,
                naive_ms
                    .map(|n| format!("{:.0}x", n / fast_ms))
                    .unwrap_or_else(|| "-".into()),
                tflops,
                fmt(torch_ms, 3),
                torch_ms
                    .map(|t| format!("{:.2}x", t / fast_ms as f64))
                    .unwrap_or_else(|| "-".into()),
                diff.map(|d| format!("{d:.2e}"))
                    .unwrap_or_else(|| "-".into()),
            );
            json.push(serde_json::json!({
                "case": c.name, "dtype": dname, "kernel": kernel, "fast_ms": fast_ms,
                "naive_ms": naive_ms, "torch_ms": torch_ms, "tflops": tflops,
                "max_rel_diff_vs_naive": diff,
            }));
            for p in bufs.ptrs {
                let _ = alloc.free(p);
            }
            alloc.empty_cache();
        }
    }
    if let Some(p) = arg("--json") {
        let body: String = json.iter().map(|j| format!("{j}\n")).collect();
        if let Err(e) = std::fs::write(&p, body) {
            eprintln!("write {p}: {e}");
        }
    }
}
