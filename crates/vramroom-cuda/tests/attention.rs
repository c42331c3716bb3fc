//! The attention forward kernels on a real GPU: the fast ones of flash.cu (`Tiled`, `Rows`)
//! and the naive `k_attn_fwd`, each against an f64 host reference computed from the same
//! dtype-rounded inputs, over causal and padding masks, f32 / bf16 / f16, head dims 64 and
//! 128 (and an odd one), grouped-query heads, the decode step (one query row against S keys)
//! and sizes that are not multiples of the tiles. Every case also checks which kernel `Auto`
//! picks, so a fast path that silently fell back would fail here. Each test is `#[ignore]`d
//! with the reason (needs a GPU); run them with `-- --include-ignored` on one.

use std::sync::Mutex;

use vramroom_alloc::rng::Rng;
use vramroom_alloc::AllocatorConfig;
use vramroom_cuda::compute::{AttentionKernel, AttentionSpec, AttentionViews};
use vramroom_cuda::{cuda_allocator, unavailable_reason, CudaAllocator, Dt, Gpu, Strided};

static GPU: Mutex<()> = Mutex::new(());

struct Dev {
    gpu: Gpu,
    alloc: CudaAllocator,
}

impl Dev {
    fn buffer(&self, bytes: usize) -> u64 {
        self.alloc
            .malloc(bytes.max(16) as u64, self.gpu.stream_id())
            .expect("device memory")
            .ptr
    }
    fn upload(&self, vals: &[f32], dt: Dt) -> u64 {
        let bytes = encode(vals, dt);
        let p = self.buffer(bytes.len());
        self.gpu.write(p, &bytes).expect("upload");
        p
    }
    fn download(&self, ptr: u64, n: usize, dt: Dt) -> Vec<f64> {
        let mut bytes = vec![0u8; n * dt.size()];
        self.gpu.read(ptr, &mut bytes).expect("download");
        decode(&bytes, dt)
    }
}

fn encode(vals: &[f32], dt: Dt) -> Vec<u8> {
    match dt {
        Dt::F32 => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dt::BF16 => vals
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        Dt::F16 => vals
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => unreachable!("float dtypes only"),
    }
}

fn decode(bytes: &[u8], dt: Dt) -> Vec<f64> {
    match dt {
        Dt::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        Dt::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        Dt::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        _ => unreachable!("float dtypes only"),
    }
}

/// Values in [-2, 2) from the workspace's seeded generator, rounded to `dt` (the reference
/// sees what the GPU sees).
fn random(n: usize, seed: u64, dt: Dt) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let raw: Vec<f32> = (0..n)
        .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0)
        .collect();
    decode(&encode(&raw, dt), dt)
        .into_iter()
        .map(|v| v as f32)
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// [B, H, T, D] contiguous.
    Contiguous,
    /// Views of one [B, T, 3 * H * D] projection (GPT-2's c_attn split), output [B, T, H, D]
    /// in memory: what transformers hands SDPA.
    Fused,
    /// Contiguous, one element past a 16-byte boundary: no vector loads possible.
    Misaligned,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    s: usize,
    d: usize,
    dt: Dt,
    causal: bool,
    /// Keys visible per batch: a padding mask [B, 1, 1, S] (0 / -inf) expanded.
    padding: bool,
    /// The padding mask holds the dtype's finfo.min instead of -inf (as transformers' float
    /// masks do): a fully masked row is then uniform, not zeros.
    mask_min: bool,
    layout: Layout,
    /// What `Auto` must pick.
    want: AttentionKernel,
    /// Whether the tiled kernels take the call (forced, for the decode cases).
    tiled: bool,
}

/// Valid key count of batch `b` under the padding mask: full, about half, none (that row
/// is all -inf: zeros out, logsumexp -inf), then repeating.
fn valid_len(c: &Case, b: usize) -> usize {
    if !c.padding {
        return c.s;
    }
    match b % 3 {
        0 => c.s,
        1 => c.s / 2 + 1,
        _ => 0,
    }
}

struct Host {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// (out [B, HQ, TQ, D], lse [B, HQ, TQ]) in f64.
fn reference(c: &Case, x: &Host, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let (d, group) = (c.d, c.hq / c.hkv);
    let mut out = vec![0f64; c.b * c.hq * c.tq * d];
    let mut lse = vec![0f64; c.b * c.hq * c.tq];
    for b in 0..c.b {
        for h in 0..c.hq {
            let kh = h / group;
            for i in 0..c.tq {
                let qrow = &x.q[((b * c.hq + h) * c.tq + i) * d..][..d];
                let scores: Vec<f64> = (0..c.s)
                    .map(|j| {
                        if c.causal && j > i {
                            return f64::NEG_INFINITY;
                        }
                        let masked = j >= valid_len(c, b);
                        if masked && !c.mask_min {
                            return f64::NEG_INFINITY;
                        }
                        let krow = &x.k[((b * c.hkv + kh) * c.s + j) * d..][..d];
                        let dot: f64 = qrow
                            .iter()
                            .zip(krow)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        dot * scale + if masked { finfo_min(c.dt) as f64 } else { 0.0 }
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let r = (b * c.hq + h) * c.tq + i;
                if m == f64::NEG_INFINITY {
                    lse[r] = m;
                    continue;
                }
                let l: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                lse[r] = m + l.ln();
                for (j, s) in scores.iter().enumerate() {
                    let w = (s - m).exp() / l;
                    if w == 0.0 {
                        continue;
                    }
                    let vrow = &x.v[((b * c.hkv + kh) * c.s + j) * d..][..d];
                    for e in 0..d {
                        out[r * d + e] += w * vrow[e] as f64;
                    }
                }
            }
        }
    }
    (out, lse)
}

/// Host data [B, H, T, D] laid out for `layout`: (buffer contents, element offset, strides).
fn place(vals: &[f32], sh: [usize; 4], layout: Layout) -> (Vec<f32>, usize, [usize; 4]) {
    let [_, h, t, d] = sh;
    match layout {
        Layout::Contiguous => (vals.to_vec(), 0, [h * t * d, t * d, d, 1]),
        Layout::Misaligned => {
            let mut buf = vec![0f32; 1];
            buf.extend_from_slice(vals);
            (buf, 1, [h * t * d, t * d, d, 1])
        }
        Layout::Fused => unreachable!("fused views are built in run()"),
    }
}

/// `torch.finfo(dtype).min`.
fn finfo_min(dt: Dt) -> f32 {
    match dt {
        Dt::F16 => -65504.0,
        Dt::BF16 => half::bf16::MIN.to_f32(),
        _ => f32::MIN,
    }
}

fn view(ptr: u64, dt: Dt, sh: [usize; 4], st: [usize; 4], off: usize) -> Strided {
    Strided::new(ptr, dt, &sh, &st, off).expect("4-d view")
}

fn tol(dt: Dt) -> (f64, f64) {
    match dt {
        Dt::BF16 => (2e-2, 2e-2),
        Dt::F16 => (5e-3, 5e-3),
        _ => (2e-4, 2e-5),
    }
}

/// Every mismatch of the run (kernel, case, first bad element), reported together at the
/// end, so one GPU run says which kernels are wrong on which cases.
static FAILURES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn assert_close(what: &str, want: &[f64], got: &[f64], tolerances: (f64, f64)) {
    if let Err(e) = std::panic::catch_unwind(|| check_close(what, want, got, tolerances)) {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| what.to_string());
        FAILURES.lock().unwrap_or_else(|e| e.into_inner()).push(msg);
    }
}

fn check_close(what: &str, want: &[f64], got: &[f64], (rtol, atol): (f64, f64)) {
    assert_eq!(want.len(), got.len(), "{what}: lengths");
    let scale = want
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f64, |m, v| m.max(v.abs()));
    for (i, (x, y)) in want.iter().zip(got).enumerate() {
        let ok = if x.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= atol * scale.max(1.0) + rtol * x.abs().max(y.abs())
        };
        assert!(
            ok,
            "{what}[{i}]: reference {x} vs gpu {y} (rtol {rtol}, atol {atol})"
        );
    }
}

fn run(dev: &Dev, c: &Case) {
    let (dt, d) = (c.dt, c.d);
    let qsh = [c.b, c.hq, c.tq, d];
    let ksh = [c.b, c.hkv, c.s, d];
    let x = Host {
        q: random(c.b * c.hq * c.tq * d, 1, dt),
        k: random(c.b * c.hkv * c.s * d, 2, dt),
        v: random(c.b * c.hkv * c.s * d, 3, dt),
    };
    let scale = 1.0 / (d as f64).sqrt();
    let (q, k, v, out_st) = if c.layout == Layout::Fused {
        assert!(
            c.hq == c.hkv && c.tq == c.s,
            "fused layout needs self-attention"
        );
        // qkv [B, T, 3, H, D]: q, k, v are its [:, :, n] slices viewed [B, H, T, D].
        let (h, t) = (c.hq, c.tq);
        let mut buf = vec![0f32; c.b * t * 3 * h * d];
        for (n, src) in [&x.q, &x.k, &x.v].into_iter().enumerate() {
            for bi in 0..c.b {
                for hi in 0..h {
                    for ti in 0..t {
                        for e in 0..d {
                            buf[(((bi * t + ti) * 3 + n) * h + hi) * d + e] =
                                src[((bi * h + hi) * t + ti) * d + e];
                        }
                    }
                }
            }
        }
        let p = dev.upload(&buf, dt);
        let st = [t * 3 * h * d, d, 3 * h * d, 1];
        (
            view(p, dt, qsh, st, 0),
            view(p, dt, ksh, st, h * d),
            view(p, dt, ksh, st, 2 * h * d),
            [t * h * d, d, h * d, 1],
        )
    } else {
        let up = |vals: &[f32], sh: [usize; 4]| {
            let (buf, off, st) = place(vals, sh, c.layout);
            view(dev.upload(&buf, dt), dt, sh, st, off)
        };
        let out_st = [c.hq * c.tq * d, c.tq * d, d, 1];
        (up(&x.q, qsh), up(&x.k, ksh), up(&x.v, ksh), out_st)
    };
    let mask = if c.padding {
        let vals: Vec<f32> = (0..c.b * c.s)
            .map(|i| {
                if i % c.s < valid_len(c, i / c.s) {
                    0.0
                } else if c.mask_min {
                    finfo_min(dt)
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        let p = dev.upload(&vals, dt);
        view(p, dt, [c.b, c.hq, c.tq, c.s], [c.s, 0, 0, 1], 0)
    } else {
        Strided::none()
    };
    let n_out = c.b * c.hq * c.tq * d;
    let out_p = dev.buffer(n_out * dt.size());
    let lse_p = dev.buffer(c.b * c.hq * c.tq * 4);
    let out = view(out_p, dt, [c.b, c.hq, c.tq, d], out_st, 0);
    let lse = Strided::new(
        lse_p,
        Dt::F32,
        &[c.b, c.hq, c.tq],
        &[c.hq * c.tq, c.tq, 1],
        0,
    )
    .expect("lse view");
    // The workspace PyTorch's cuDNN path allocates (what the tensor runtime hands down).
    let views = AttentionViews {
        q,
        k,
        v,
        mask,
        out,
        lse,
        workspace: dev.buffer(256),
        workspace_size: 256,
    };
    let spec = AttentionSpec {
        scale,
        causal: c.causal,
        dropout: 0.0,
        seed: 0,
    };
    // cuDNN's engine takes 16-bit calls without a mask past the decode rows; on the head
    // dims of the tiled kernels with aligned rows it must (cuDNN 9 on sm_80+).
    let cudnn_eligible = c.dt != Dt::F32 && !c.padding && c.tq > 4;
    let cudnn = cudnn_eligible
        && dev
            .gpu
            .attention_with(AttentionKernel::Cudnn, &views, &spec)
            .map_err(|e| {
                if c.tiled {
                    FAILURES
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(format!("cuDNN {c:?}: {e}"));
                }
            })
            .is_ok();
    let picked = dev.gpu.attention_kernel(&views, &spec).expect("a kernel");
    let want = if cudnn {
        AttentionKernel::Cudnn
    } else {
        c.want
    };
    assert_eq!(picked, want, "{c:?}: Auto picks {picked:?}");
    let (want_out, want_lse) = reference(c, &x, scale);
    let mut kernels = vec![AttentionKernel::Naive, AttentionKernel::Rows];
    if cudnn {
        kernels.push(AttentionKernel::Cudnn);
    }
    if c.tiled {
        kernels.push(AttentionKernel::Tiled);
    } else {
        // Forcing the tiled kernels onto a call they do not take is a typed error.
        assert!(dev
            .gpu
            .attention_with(AttentionKernel::Tiled, &views, &spec)
            .is_err());
    }
    for kern in kernels {
        // NaN everywhere first (all-ones bytes), so an element a kernel skips shows.
        dev.gpu
            .write(out_p, &vec![0xffu8; n_out * dt.size()])
            .expect("poison out");
        dev.gpu
            .write(lse_p, &vec![0xffu8; c.b * c.hq * c.tq * 4])
            .expect("poison lse");
        dev.gpu
            .attention_with(kern, &views, &spec)
            .unwrap_or_else(|e| panic!("{kern:?} {c:?}: {e}"));
        let raw = dev.download(out_p, n_out, dt);
        // Back to [B, HQ, TQ, D] order from the output's layout.
        let mut got = vec![0f64; n_out];
        for bi in 0..c.b {
            for h in 0..c.hq {
                for i in 0..c.tq {
                    for e in 0..d {
                        let o = bi * out_st[0] + h * out_st[1] + i * out_st[2] + e;
                        got[((bi * c.hq + h) * c.tq + i) * d + e] = raw[o];
                    }
                }
            }
        }
        assert_close(&format!("out {kern:?} {c:?}"), &want_out, &got, tol(dt));
        let got_lse = dev.download(lse_p, c.b * c.hq * c.tq, Dt::F32);
        for (r, (x, y)) in want_lse.iter().zip(&got_lse).enumerate() {
            let ok = if x.is_infinite() {
                x == y
            } else {
                (x - y).abs() <= 1e-3 * x.abs().max(1.0)
            };
            assert!(ok, "lse {kern:?} {c:?}[{r}]: reference {x} vs gpu {y}");
        }
    }
}

fn case(b: usize, hq: usize, hkv: usize, tq: usize, s: usize, d: usize, dt: Dt) -> Case {
    Case {
        b,
        hq,
        hkv,
        tq,
        s,
        d,
        dt,
        causal: false,
        padding: false,
        mask_min: false,
        layout: Layout::Contiguous,
        want: AttentionKernel::Tiled,
        tiled: true,
    }
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn fast_attention_forward_matches_the_reference_and_the_naive_kernel() {
    if let Some(why) = unavailable_reason() {
        panic!("asked to run without a GPU: {why}");
    }
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Dev {
        gpu: Gpu::new(0).expect("open the GPU"),
        alloc: cuda_allocator(0, AllocatorConfig::default()).expect("allocator"),
    };
    let sm80 = dev.gpu.arch().0 >= 8;
    let mut cases = Vec::new();
    for dt in [Dt::F32, Dt::BF16, Dt::F16] {
        // The tiled kernels, on sm_80+: f32 at head dim 64; bf16 / f16 at 64 and 128.
        let fits = |d: usize| {
            if dt == Dt::F32 {
                sm80 && d == 64
            } else {
                sm80 && (d == 64 || d == 128)
            }
        };
        let tiled = |d: usize| {
            if fits(d) {
                AttentionKernel::Tiled
            } else {
                AttentionKernel::Rows
            }
        };
        for d in [64, 128] {
            // GPT-2's layout, causal, 77 rows: a full tile and a ragged one.
            cases.push(Case {
                causal: true,
                layout: Layout::Fused,
                want: tiled(d),
                tiled: fits(d),
                ..case(2, 3, 3, 77, 77, d, dt)
            });
            // Grouped-query heads, causal, keys fewer than queries (top-left alignment).
            cases.push(Case {
                causal: true,
                want: tiled(d),
                tiled: fits(d),
                ..case(1, 8, 2, 80, 50, d, dt)
            });
            // Padding mask (one batch fully masked), more keys than queries, two key tiles.
            cases.push(Case {
                padding: true,
                want: tiled(d),
                tiled: fits(d),
                ..case(3, 2, 2, 100, 130, d, dt)
            });
            // The decode step: one query row against a long cache, grouped heads, padding.
            cases.push(Case {
                padding: true,
                want: tiled(d),
                tiled: fits(d),
                ..case(3, 8, 2, 1, 300, d, dt)
            });
            // Four rows (speculative decode): the tiles, not cuDNN; causal on.
            cases.push(Case {
                causal: true,
                want: tiled(d),
                tiled: fits(d),
                ..case(2, 4, 4, 4, 70, d, dt)
            });
        }
        // transformers' float padding mask: finfo.min, one batch masked everywhere (uniform).
        cases.push(Case {
            padding: true,
            mask_min: true,
            want: tiled(64),
            tiled: fits(64),
            ..case(3, 2, 2, 70, 90, 64, dt)
        });
        cases.push(Case {
            padding: true,
            mask_min: true,
            want: tiled(64),
            tiled: fits(64),
            ..case(3, 2, 2, 1, 90, 64, dt)
        });
        // Exact tiles, several of them.
        cases.push(Case {
            causal: true,
            want: tiled(64),
            tiled: fits(64),
            ..case(1, 2, 2, 256, 256, 64, dt)
        });
        // Rows fallback: an odd head dim, and rows that are not 16-byte aligned.
        cases.push(Case {
            causal: true,
            want: AttentionKernel::Rows,
            tiled: false,
            ..case(2, 2, 2, 33, 33, 40, dt)
        });
        cases.push(Case {
            padding: true,
            layout: Layout::Misaligned,
            want: AttentionKernel::Rows,
            tiled: false,
            ..case(2, 2, 2, 65, 65, 64, dt)
        });
    }
    for c in &cases {
        run(&dev, c);
    }
    eprintln!("{} attention cases checked", cases.len());
    let failures = std::mem::take(&mut *FAILURES.lock().unwrap_or_else(|e| e.into_inner()));
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn dropout_goes_to_the_naive_kernel_and_the_fast_ones_refuse_it() {
    if let Some(why) = unavailable_reason() {
        panic!("asked to run without a GPU: {why}");
    }
    let _g = GPU.lock().unwrap_or_else(|e| e.into_inner());
    let dev = Dev {
        gpu: Gpu::new(0).expect("open the GPU"),
        alloc: cuda_allocator(0, AllocatorConfig::default()).expect("allocator"),
    };
    let sh = [1usize, 2, 64, 64];
    let st = [2 * 64 * 64, 64 * 64, 64, 1];
    let n = sh.iter().product::<usize>();
    let mk = || {
        view(
            dev.upload(&random(n, 7, Dt::BF16), Dt::BF16),
            Dt::BF16,
            sh,
            st,
            0,
        )
    };
    let views = AttentionViews {
        q: mk(),
        k: mk(),
        v: mk(),
        mask: Strided::none(),
        out: mk(),
        lse: Strided::none(),
        workspace: 0,
        workspace_size: 0,
    };
    let spec = AttentionSpec {
        scale: 0.125,
        causal: true,
        dropout: 0.1,
        seed: 3,
    };
    assert_eq!(
        dev.gpu.attention_kernel(&views, &spec).unwrap(),
        AttentionKernel::Naive
    );
    for k in [
        AttentionKernel::Rows,
        AttentionKernel::Tiled,
        AttentionKernel::Cudnn,
    ] {
        assert!(dev.gpu.attention_with(k, &views, &spec).is_err(), "{k:?}");
    }
    dev.gpu
        .attention(&views, &spec)
        .expect("naive with dropout");
    dev.gpu.synchronize().expect("sync");
}
