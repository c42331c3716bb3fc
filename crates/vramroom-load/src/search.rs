//! OOM search: the largest safe concurrency (or batch size) under a capacity.
//!
//! Design note: the search runs on the meta device, where a request costs microseconds but
//! allocates exactly what it would on cpu or CUDA, so it can afford a dozen probes. Each
//! probe is a fresh device and a fresh model, loaded with `load` workers (or batch `load`)
//! for a fixed number of requests per worker, with workers interleaving op by op (see
//! `devices::Interleave`), so the requests in flight hold their memory at the same time.
//!
//! 1. Fit: probe loads on an unbounded device under the run's allocator config and fit
//!    `peak ≈ a + b·load` to the peak *reserved* bytes, what the allocator asks the device
//!    for and so what runs out: segments, rounding and splits included. The load doubles
//!    until the peak passes the capacity, and the line is fitted through the top points,
//!    around the crossing, so the prediction interpolates instead of extrapolating from
//!    small loads where fixed costs dominate. `b` is the marginal memory of one more
//!    concurrent request; where the line crosses the capacity is the predicted OOM load.
//!
//! Every probe is deterministic for a seed: the meta twin's workers take turns on a
//! virtual clock, and each draws its request (and so its input) inside its turn.
//! 2. Verify: under the real capacity, probe the predicted point and walk outward with
//!    doubling steps until the first OOM is bracketed, then bisect to the exact boundary.
//!    The allocator can free its cache and retry before it raises OOM, so the observed
//!    boundary can lie above the line's prediction: the verified figure is the one to use.
//! 3. Safe: the largest verified load whose peak reserved also stays under the capacity
//!    less the fragmentation margin. "Verified" means by one probe of `requests_per_worker`
//!    requests per worker, so the headline ([`OomSearch::headline`]) says how many requests
//!    verified it and the per-request OOM chance that leaves; a search cut short by its time
//!    limit says so (`stopped_early`) instead of claiming the loads it never probed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tracing::debug;
use vramroom_alloc::AllocatorConfig;

use crate::config::LoadPlan;
use crate::engine::drive;
use crate::error::Result;
use crate::results::{LinearFit, LoadPoint, OomSearch};
use crate::timeline::{linear_fit, Phase};
use vramroom_workload::device::{Interleave, RunDevice};
use vramroom_workload::{Scenario, Workload};

pub use crate::config::{SearchAxis, SearchConfig};

/// Capacity of the fit probes: large enough that nothing here runs out.
const UNBOUNDED: u64 = 1 << 46;

/// One meta probe at `load` under `capacity`.
pub fn probe(
    scenario: &Scenario,
    axis: SearchAxis,
    load: usize,
    capacity: u64,
    conf: &AllocatorConfig,
    cfg: &SearchConfig,
    stop: &AtomicBool,
) -> Result<LoadPoint> {
    let mut sc = scenario.clone();
    let workers = match axis {
        SearchAxis::Concurrency => load,
        SearchAxis::Batch => {
            sc.batch = load;
            cfg.concurrency.max(1)
        }
    };
    let dev = RunDevice::meta(capacity, conf, Interleave::Virtual);
    let point = |dev: &RunDevice, oom: bool| {
        let st = dev.probe.stats();
        LoadPoint {
            load,
            peak_allocated_bytes: st.allocated_bytes.all().peak.max(0) as u64,
            peak_reserved_bytes: st.reserved_bytes.all().peak.max(0) as u64,
            oom,
            peak_activation_bytes: dev
                .device
                .peak_memory_by_category()
                .get(vramroom_tensor::MemoryCategory::Activation),
        }
    };
    let workload = match Workload::build(&sc, &dev.device) {
        Ok(w) => w,
        Err(vramroom_workload::WorkloadError::Setup(e)) if e.is_oom() => {
            return Ok(point(&dev, true))
        }
        Err(e) => return Err(e.into()),
    };
    // One request alone first, as a server warms up: it teaches the virtual clock how long
    // a request runs (so the workers' phases can be spread) and warms the cache.
    if let Some(clock) = dev.clock.as_ref() {
        let mut st = vramroom_workload::WorkerState::new();
        let turn = clock.enter(vramroom_workload::device::MAX_WORKERS - 1);
        let r = workload.run_request(&mut st, u64::MAX / 2);
        drop(turn);
        drop(st);
        if let Err(e) = r {
            if e.is_oom() {
                return Ok(point(&dev, true));
            }
        }
    }
    let plan = LoadPlan::Requests {
        concurrency: workers,
        total: workers as u64 * cfg.requests_per_worker.max(1),
    };
    let phase = Phase::default();
    let out = drive(&workload, &dev, &plan, &phase, Instant::now(), stop, |_| {})?;
    let oom = out
        .records
        .iter()
        .any(|r| r.outcome == crate::timeline::Outcome::Oom);
    let p = point(&dev, oom);
    workload.release();
    debug!(load, oom, peak_reserved = p.peak_reserved_bytes, "probe");
    Ok(p)
}

/// Runs the search for `scenario` under `capacity`. Stops early (with what it has) when
/// `stop` is set or the time limit passes.
pub fn oom_search(
    scenario: &Scenario,
    capacity: u64,
    conf: &AllocatorConfig,
    cfg: &SearchConfig,
    stop: &AtomicBool,
) -> Result<OomSearch> {
    let t0 = Instant::now();
    let stopped_early = std::cell::Cell::new(false);
    let out_of_time = || {
        let out = stop.load(Ordering::Relaxed) || t0.elapsed() >= cfg.time_limit;
        if out {
            stopped_early.set(true);
        }
        out
    };
    let margin = (capacity as f64 * cfg.margin_fraction.clamp(0.0, 0.9)) as u64;
    let budget = capacity - margin;
    let max_load = cfg.max_load.max(1);

    let mut points: Vec<LoadPoint> = Vec::new();
    for &l in cfg.fit_points.iter().filter(|&&l| l >= 1 && l <= max_load) {
        if out_of_time() {
            break;
        }
        points.push(probe(scenario, cfg.axis, l, UNBOUNDED, conf, cfg, stop)?);
    }
    // At small loads fixed costs (weights, the first segments, requests that happen not to
    // overlap) dominate, and a line through them extrapolates badly. Keep doubling the load
    // until the peak passes the capacity, then fit the top points only, around the crossing.
    let fit_of = |pts: &[LoadPoint]| {
        let mut v: Vec<&LoadPoint> = pts.iter().collect();
        v.sort_by_key(|p| p.load);
        let top = &v[v.len().saturating_sub(4)..];
        let xy: Vec<(f64, f64)> = top
            .iter()
            .map(|p| (p.load as f64, p.peak_reserved_bytes as f64))
            .collect();
        linear_fit(&xy).unwrap_or(LinearFit {
            a: xy.first().map(|p| p.1).unwrap_or(0.0),
            b: 0.0,
            r2: 0.0,
        })
    };
    while let Some(last) = points.iter().max_by_key(|p| p.load).copied() {
        if last.load >= max_load || out_of_time() {
            break;
        }
        if last.peak_reserved_bytes > capacity {
            break;
        }
        let next = (last.load * 2).min(max_load);
        points.push(probe(scenario, cfg.axis, next, UNBOUNDED, conf, cfg, stop)?);
    }
    let fit = fit_of(&points);
    // Smallest integer x with a + b·x > limit.
    let crossing = |limit: u64| -> Option<usize> {
        if fit.b <= 0.0 {
            return None;
        }
        let x = ((limit as f64 - fit.a) / fit.b).floor() + 1.0;
        Some(x.max(1.0) as usize)
    };
    let predicted_oom_load = crossing(capacity);
    let predicted_safe_load = crossing(budget).map(|x| x - 1).filter(|&x| x >= 1);

    // Verify under the real capacity: bracket the first OOM, then bisect.
    let mut bisection: Vec<LoadPoint> = Vec::new();
    let run = |l: usize, bisection: &mut Vec<LoadPoint>| -> Result<LoadPoint> {
        if let Some(p) = bisection.iter().find(|p| p.load == l) {
            return Ok(*p);
        }
        let p = probe(scenario, cfg.axis, l, capacity, conf, cfg, stop)?;
        bisection.push(p);
        Ok(p)
    };
    let mut lo: Option<usize> = None; // largest load known to run without OOM
    let mut hi: Option<usize> = None; // smallest load known to OOM
    let start = predicted_oom_load.unwrap_or(max_load).clamp(1, max_load);
    if !out_of_time() {
        let p = run(start, &mut bisection)?;
        if p.oom {
            hi = Some(start);
            let mut d = 1;
            loop {
                if out_of_time() {
                    break;
                }
                let l = start.saturating_sub(d);
                if l == 0 {
                    lo = None;
                    break;
                }
                if run(l, &mut bisection)?.oom {
                    hi = Some(l);
                } else {
                    lo = Some(l);
                    break;
                }
                d *= 2;
            }
        } else {
            lo = Some(start);
            let mut d = 1;
            loop {
                if out_of_time() || lo == Some(max_load) {
                    break;
                }
                let l = (start + d).min(max_load);
                if run(l, &mut bisection)?.oom {
                    hi = Some(l);
                    break;
                }
                lo = Some(l);
                d *= 2;
            }
        }
        // Bisect between lo (ok) and hi (OOM).
        if let (Some(mut a), Some(mut b)) = (lo.or(Some(0)), hi) {
            while b - a > 1 && !out_of_time() {
                let m = a + (b - a) / 2;
                if run(m, &mut bisection)?.oom {
                    b = m;
                } else {
                    a = m;
                }
            }
            lo = (a > 0).then_some(a);
            hi = Some(b);
        }
    }
    // Safe: the largest verified load whose reserved peak stays within the budget, by
    // bisection between 0 and the largest load that ran (assuming the peak grows with load).
    let mut verified_safe_load = None;
    if let Some(maxok) = lo {
        let fits = |p: &LoadPoint| !p.oom && p.peak_reserved_bytes <= budget;
        let (mut a, mut b) = (0usize, maxok + 1); // a fits (or is 0), b does not
        let top = run(maxok, &mut bisection)?;
        if fits(&top) {
            a = maxok;
        } else {
            // Start from the fit's guess to save probes.
            if let Some(g) = predicted_safe_load.filter(|&g| g >= 1 && g < maxok) {
                if fits(&run(g, &mut bisection)?) {
                    a = g;
                } else {
                    b = g;
                }
            }
            b = b.min(maxok);
            while b - a > 1 && !out_of_time() {
                let m = a + (b - a) / 2;
                if fits(&run(m, &mut bisection)?) {
                    a = m;
                } else {
                    b = m;
                }
            }
        }
        verified_safe_load = (a >= 1).then_some(a);
    }
    Ok(OomSearch {
        axis: match cfg.axis {
            SearchAxis::Concurrency => "concurrency",
            SearchAxis::Batch => "batch",
        }
        .into(),
        device: "meta".into(),
        capacity_bytes: capacity,
        margin_fraction: cfg.margin_fraction,
        budget_bytes: budget,
        metric: "peak_reserved".into(),
        points,
        fit,
        predicted_oom_load,
        predicted_safe_load,
        observed_oom_load: hi,
        verified_max_load: lo,
        verified_safe_load,
        bisection,
        marginal_bytes_per_unit: fit.b.max(0.0).round() as u64,
        max_load_tried: max_load,
        alloc_conf: String::new(),
        recommended: None,
        not_better: None,
        headline: String::new(),
        requests_per_worker: cfg.requests_per_worker.max(1),
        stopped_early: stopped_early.get(),
    })
}
