//! `vramroom claims`: the five claims of ground-truth.md, re-run on Vramroom's runtime.
//!
//! Design note: each claim is re-measured the way ground-truth.md measured it on PyTorch
//! 2.11 / H200, but on the meta device (`vramroom_tensor::predict`, whose meta device
//! allocates PyTorch's cuDNN and cuBLAS workspaces too), so the whole set runs in seconds
//! with no GPU. Every claim reports Vramroom's numbers beside PyTorch's, a verdict on the
//! claim itself (`holds`), and whether Vramroom reproduces PyTorch's figures within the
//! stated tolerance (`matches_pytorch`) — two different questions: a myth can be busted
//! by both, and a fidelity gap shows up here before it misleads a prediction.

use std::sync::Arc;

use vramroom_alloc::{AllocatorConfig, CachingAllocator, SimDevice};
use vramroom_tensor::models::ZooModel;
use vramroom_tensor::nn::{Init, Linear};
use vramroom_tensor::predict::{predict, AccumPattern, Mode, OptimKind, PredictOptions};
use vramroom_tensor::{no_grad, DType, Device, Tensor, TensorError};

use crate::results::{ClaimNumber, ClaimVerdict, ClaimsResult, SCHEMA_VERSION};

const MIB: f64 = 1048576.0;
/// Relative tolerance for "matches PyTorch" on memory figures.
const TOL: f64 = 0.03;
/// The H200 of ground-truth.md: 143771 MiB.
const H200: u64 = 143_771 << 20;

fn num(label: impl Into<String>, unit: &str, vramroom: f64, pytorch: Option<f64>) -> ClaimNumber {
    ClaimNumber {
        label: label.into(),
        unit: unit.into(),
        vramroom,
        pytorch,
        tolerance: TOL,
    }
}

/// A claim agrees with PyTorch only when every row with a PyTorch figure does: a claim
/// cannot say "agree" over a row whose match is "no".
fn matches(nums: &[ClaimNumber]) -> bool {
    nums.iter().all(|n| n.matches() != Some(false))
}

fn r50(batch: usize, grad: bool) -> PredictOptions {
    PredictOptions {
        model: ZooModel::resnet50(),
        batch,
        mode: Mode::Inference,
        grad,
        ..Default::default()
    }
}

fn above_input(o: &PredictOptions) -> Result<f64, TensorError> {
    Ok(predict(o)?.peak_over_input_bytes as f64 / MIB)
}

/// Runs the five claims. Each claim that fails to run (it should not) becomes a verdict
/// that says so, so one broken claim does not hide the others.
pub fn run_claims() -> ClaimsResult {
    let claims = vec![
        wrap(
            "no_grad_saving",
            "`no_grad` saves 30–50% at inference",
            no_grad_claim,
        ),
        wrap(
            "accumulation",
            "accumulation over 4 steps ≈ 3.5× and 8 steps ≈ 7× the memory of 1 step",
            accumulation_claim,
        ),
        wrap(
            "chained_calls",
            "`out = l2(l1(x))` has a lower peak than `h = l1(x); out = l2(h)`",
            chained_claim,
        ),
        wrap(
            "empty_cache",
            "`empty_cache()` does not give memory back to the system",
            empty_cache_claim,
        ),
        wrap(
            "resnet50_activations",
            "ResNet-50 inference activations exceed 200 MB",
            activations_claim,
        ),
    ];
    ClaimsResult {
        schema_version: SCHEMA_VERSION,
        claims,
    }
}

fn wrap(id: &str, claim: &str, f: fn() -> Claim) -> ClaimVerdict {
    match f() {
        Ok(Measured {
            holds,
            verdict,
            numbers,
        }) => ClaimVerdict {
            id: id.into(),
            claim: claim.into(),
            verdict,
            holds,
            matches_pytorch: matches(&numbers),
            numbers,
        },
        Err(e) => ClaimVerdict {
            id: id.into(),
            claim: claim.into(),
            verdict: format!("could not be measured: {e}"),
            holds: false,
            matches_pytorch: false,
            numbers: Vec::new(),
        },
    }
}

struct Measured {
    holds: bool,
    verdict: String,
    numbers: Vec<ClaimNumber>,
}

type Claim = Result<Measured, TensorError>;

fn measured(holds: bool, verdict: String, numbers: Vec<ClaimNumber>) -> Claim {
    Ok(Measured {
        holds,
        verdict,
        numbers,
    })
}

fn no_grad_claim() -> Claim {
    // ground-truth.md: ResNet-50 fp32, memory above the input while the forward runs.
    let table = [
        (1, 89.7, 11.75),
        (8, 656.6, 85.75),
        (32, 2621.2, 318.5),
        (64, 5229.9, 637.0),
    ];
    let model = 97.5;
    let mut numbers = Vec::new();
    let mut act_savings = Vec::new();
    let mut total_savings = Vec::new();
    for (bs, pt_grad, pt_nograd) in table {
        let g = above_input(&r50(bs, true))?;
        let n = above_input(&r50(bs, false))?;
        numbers.push(num(
            format!("bs{bs} grad on, above input"),
            "MiB",
            g,
            Some(pt_grad),
        ));
        numbers.push(num(
            format!("bs{bs} no_grad, above input"),
            "MiB",
            n,
            Some(pt_nograd),
        ));
        let act = 100.0 * (1.0 - n / g);
        let tot = 100.0 * (1.0 - (n + model) / (g + model));
        numbers.push(num(
            format!("bs{bs} saving of activation memory"),
            "%",
            act,
            Some(100.0 * (1.0 - pt_nograd / pt_grad)),
        ));
        numbers.push(num(
            format!("bs{bs} saving counting the weights"),
            "%",
            tot,
            Some(100.0 * (1.0 - (pt_nograd + model) / (pt_grad + model))),
        ));
        act_savings.push(act);
        total_savings.push(tot);
    }
    let lo = act_savings.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = act_savings.iter().copied().fold(0.0, f64::max);
    let holds = (30.0..=50.0).contains(&lo) && (30.0..=50.0).contains(&hi);
    let verdict = format!(
        "False as stated: no_grad saves {lo:.0}–{hi:.0}% of activation memory. Counting the \
         {model} MiB of weights it is {:.0}% at bs1 and {:.0}% at bs32.",
        total_savings[0], total_savings[2]
    );
    measured(holds, verdict, numbers)
}

fn accumulation_claim() -> Claim {
    let table = [
        (1, 2706.9, 2672.6),
        (4, 2762.9, 10585.1),
        (8, 2762.9, 21133.4),
    ];
    let run = |n: usize, p: AccumPattern| -> Result<f64, TensorError> {
        above_input(&PredictOptions {
            model: ZooModel::resnet50(),
            batch: 32,
            mode: Mode::Training {
                optimizer: OptimKind::Sgd,
                accum_steps: n,
                pattern: p,
            },
            ..Default::default()
        })
    };
    let mut numbers = Vec::new();
    let mut each = Vec::new();
    let mut sum = Vec::new();
    for (n, pt_each, pt_sum) in table {
        let e = run(n, AccumPattern::Each)?;
        let s = run(n, AccumPattern::Sum)?;
        numbers.push(num(
            format!("{n} steps, backward each, peak"),
            "MiB",
            e,
            Some(pt_each),
        ));
        numbers.push(num(
            format!("{n} steps, summed losses, peak"),
            "MiB",
            s,
            Some(pt_sum),
        ));
        each.push(e);
        sum.push(s);
    }
    let r = |v: &[f64], i: usize| v[i] / v[0].max(1e-9);
    numbers.push(num(
        "4 steps / 1 step, backward each",
        "x",
        r(&each, 1),
        Some(2762.9 / 2706.9),
    ));
    numbers.push(num(
        "8 steps / 1 step, backward each",
        "x",
        r(&each, 2),
        Some(2762.9 / 2706.9),
    ));
    numbers.push(num(
        "4 steps / 1 step, summed losses",
        "x",
        r(&sum, 1),
        Some(10585.1 / 2672.6),
    ));
    numbers.push(num(
        "8 steps / 1 step, summed losses",
        "x",
        r(&sum, 2),
        Some(21133.4 / 2672.6),
    ));
    let holds = r(&each, 1) > 3.0;
    let verdict = format!(
        "False for the correct loop ({:.2}× at 8 steps with backward every micro-step). True \
         only for the sum-then-backward mistake ({:.2}× at 4 steps, {:.2}× at 8).",
        r(&each, 2),
        r(&sum, 1),
        r(&sum, 2)
    );
    measured(holds, verdict, numbers)
}

fn chained_claim() -> Claim {
    // Two Linear(4096) layers, batch 2048, no_grad, on a meta device with PyTorch's cuBLAS
    // workspaces (meta_caching's default).
    let d = Device::meta_caching(H200, AllocatorConfig::default());
    let init = Init::new(&d, DType::F32);
    let l1 = Linear::new(&init, 4096, 4096, true)?;
    let l2 = Linear::new(&init, 4096, 4096, true)?;
    let x = Tensor::empty(&[2048, 4096], DType::F32, &d)?;
    let _g = no_grad();
    let before = d.memory_allocated();
    drop(l1.forward(&x)?);
    let workspace = (d.memory_allocated() - before) as f64 / MIB;
    let mut res = Vec::new();
    for chained in [true, false] {
        let base = d.memory_allocated();
        d.reset_peak_memory_stats();
        let out = if chained {
            l2.forward(&l1.forward(&x)?)?
        } else {
            let h = l1.forward(&x)?;
            l2.forward(&h)?
        };
        // The peak is above the weights only; ground-truth.md counts the input as well.
        let peak = (d.max_memory_allocated() - base) as f64 / MIB + 32.0;
        let held = (d.memory_allocated() - base) as f64 / MIB;
        drop(out);
        res.push((peak, held));
    }
    let numbers = vec![
        num(
            "chained: peak (with the 32 MiB input)",
            "MiB",
            res[0].0,
            Some(96.0),
        ),
        num(
            "named temporary: peak (with the input)",
            "MiB",
            res[1].0,
            Some(96.0),
        ),
        num("chained: held after return", "MiB", res[0].1, Some(32.0)),
        num(
            "named temporary: held after return",
            "MiB",
            res[1].1,
            Some(32.0),
        ),
        num(
            "first matmul of the process: cuBLAS workspace",
            "MiB",
            workspace,
            None,
        ),
    ];
    let holds = res[0].0 < res[1].0;
    let verdict = format!(
        "No difference: peak {:.0} MiB both ways and {:.0} MiB held after return. A named local \
         costs memory only while later work runs in the same scope. The first call pays {:.0} \
         MiB of cuBLAS workspace.",
        res[0].0, res[0].1, workspace
    );
    measured(holds, verdict, numbers)
}

fn empty_cache_claim() -> Claim {
    // A live 85 MiB block, a burst of large temporaries freed, then empty_cache(): the
    // shape of ground-truth.md's measurement (85 MiB allocated, ~7.8 GiB reserved).
    let alloc = Arc::new(CachingAllocator::new(
        SimDevice::new(H200),
        AllocatorConfig::default(),
    ));
    let d = Device::meta(alloc.clone());
    let keep = Tensor::empty(&[85 << 18], DType::F32, &d)?;
    let junk: Vec<Tensor> = (0..30)
        .map(|i| Tensor::empty(&[(240 + i) << 18], DType::F32, &d))
        .collect::<Result<_, _>>()?;
    drop(junk);
    let mib = |b: u64| b as f64 / MIB;
    let (free0, _) = alloc.mem_get_info();
    let r0 = mib(d.memory_reserved());
    let a0 = mib(d.memory_allocated());
    d.empty_cache();
    let (free1, _) = alloc.mem_get_info();
    let r1 = mib(d.memory_reserved());
    drop(keep);
    let returned = mib(free1.saturating_sub(free0));
    let numbers = vec![
        num("before: allocated", "MiB", a0, Some(85.0)),
        num("before: reserved", "MiB", r0, Some(7792.0)),
        num("after: reserved", "MiB", r1, Some(328.0)),
        num(
            "device free memory gained",
            "MiB",
            returned,
            Some(142057.0 - 134593.0),
        ),
    ];
    let holds = returned <= 0.0;
    // The workload is PyTorch's in shape only: ground-truth.md's process had other live
    // blocks, which kept 328 MiB reserved after the call where this one keeps the segment of
    // its live block. The row says "no" and so the claim does not agree.
    let verdict = format!(
        "False: empty_cache() handed {returned:.0} MiB back to the device ({r0:.0} → {r1:.0} MiB \
         reserved). It frees every fully free segment; the segment that still holds the live \
         {a0:.0} MiB block stays. (PyTorch kept 328 MiB: its process held other live blocks \
         that this workload does not reproduce.)"
    );
    measured(holds, verdict, numbers)
}

fn activations_claim() -> Claim {
    let limit = 200e6 / MIB; // 200 MB in MiB
    let mut numbers = Vec::new();
    for (bs, pt) in [(1, 11.75), (8, 85.75), (32, 318.5)] {
        numbers.push(num(
            format!("bs{bs} no_grad, peak above input"),
            "MiB",
            above_input(&r50(bs, false))?,
            Some(pt),
        ));
    }
    // Smallest batch whose peak above the input exceeds 200 MB, by bisection in 1..=64.
    let first_over = |grad: bool| -> Result<Option<usize>, TensorError> {
        if above_input(&r50(64, grad))? <= limit {
            return Ok(None);
        }
        let (mut lo, mut hi) = (0usize, 64usize); // lo under (or 0), hi over
        while hi - lo > 1 {
            let m = lo + (hi - lo) / 2;
            if above_input(&r50(m, grad))? > limit {
                hi = m;
            } else {
                lo = m;
            }
        }
        Ok(Some(hi))
    };
    let ng = first_over(false)?;
    let g = first_over(true)?;
    numbers.push(num(
        "first batch over 200 MB, no_grad",
        "batch",
        ng.map_or(0.0, |b| b as f64),
        Some(20.0),
    ));
    numbers.push(num(
        "first batch over 200 MB, grad on",
        "batch",
        g.map_or(0.0, |b| b as f64),
        Some(3.0),
    ));
    let holds = ng == Some(1);
    let verdict = format!(
        "Only for large batches: under no_grad the activations pass 200 MB from batch {}; with \
         grad on (saved for backward), from batch {}.",
        ng.map_or("— (never up to 64)".to_string(), |b| b.to_string()),
        g.map_or("— (never up to 64)".to_string(), |b| b.to_string()),
    );
    measured(holds, verdict, numbers)
}

/// Not one of the five claims: ground-truth.md's "concurrency in one process" table
/// (ResNet-50, bs8 per thread, 1–16 threads) re-run through the load engine's meta
/// concurrency model (virtual clock, PyTorch's per-thread cuBLAS workspaces). It checks the
/// model the OOM search stands on; `matches_pytorch` uses a 10% tolerance for grad on, and
/// no_grad figures (transient, so sensitive to how requests overlap) are context.
pub fn concurrency_vs_pytorch() -> ClaimVerdict {
    use crate::config::LoadPlan;
    use crate::engine::drive_for_probe;
    use vramroom_workload::device::{Interleave, RunDevice};
    use vramroom_workload::{InputDist, Scenario};

    let run = |grad: bool, c: usize| -> crate::error::Result<(f64, f64)> {
        let mut sc = Scenario::inference(
            vramroom_workload::ModelSpec::Zoo(ZooModel::ResNet50 { classes: 1000 }),
            8,
            InputDist::Fixed(224),
        );
        sc.mistakes.grad_at_inference = grad;
        let dev = RunDevice::meta(1 << 44, &AllocatorConfig::default(), Interleave::Virtual);
        dev.device
            .set_workspace_policy(Arc::new(vramroom_tensor::CudaLikeWorkspace::h200()));
        let plan = LoadPlan::Requests {
            concurrency: c,
            total: 4 * c as u64,
        };
        let (base, peak, reserved) =
            drive_for_probe(&sc, &dev, &plan, &std::sync::atomic::AtomicBool::new(false))?;
        Ok(((peak - base) as f64 / MIB, reserved as f64 / MIB))
    };
    let nograd = [123.0, 208.0, 288.0, 583.0, 1121.0];
    let grad = [663.0, 1318.0, 2587.0, 5039.0, 10277.0];
    let mut numbers = Vec::new();
    let mut ok = true;
    for (k, c) in [1usize, 2, 4, 8, 16].into_iter().enumerate() {
        match (run(false, c), run(true, c)) {
            (Ok((n, _)), Ok((g, _))) => {
                numbers.push(ClaimNumber {
                    tolerance: 1.0,
                    ..num(
                        format!("{c} threads no_grad, peak above base"),
                        "MiB",
                        n,
                        Some(nograd[k]),
                    )
                });
                numbers.push(ClaimNumber {
                    tolerance: 0.10,
                    ..num(
                        format!("{c} threads grad on, peak above base"),
                        "MiB",
                        g,
                        Some(grad[k]),
                    )
                });
            }
            (Err(e), _) | (_, Err(e)) => {
                ok = false;
                tracing::warn!(error = %e, "concurrency check failed");
            }
        }
    }
    let matches_pytorch = ok && matches(&numbers);
    ClaimVerdict {
        id: "concurrency".into(),
        claim: "threads in one process share one allocator: memory grows with requests in flight"
            .into(),
        verdict: if matches_pytorch {
            "Vramroom's concurrency model reproduces PyTorch's threads within 10% with grad on; \
             no_grad peaks (transient) are within a factor of two."
                .into()
        } else {
            "Vramroom's concurrency model departs from PyTorch's measured threads (see numbers)."
                .into()
        },
        holds: true,
        matches_pytorch,
        numbers,
    }
}
