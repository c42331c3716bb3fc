//! `vramroom http --predict`: from a gentle run's probe snapshot, the concurrency at which
//! the service runs out of memory, per device, under its own config and each what-if; the
//! input-size caps that keep a target concurrency safe; per-request memory against input
//! size. And, for `--ramp-until-oom`, how that prediction compares with what a ramp saw.
//!
//! Design note: the prediction itself is vramroom-trace's `concurrency` module (the trace
//! cut into requests, replayed N at a time through the exact allocator). This file feeds it
//! what only the live service knows: the real capacity of each device, from the probe's
//! `torch_cuda_device_capacity_bytes` (fraction × total) and `torch_cuda_memory_fraction`.
//! A fraction below 1 is the allocator's own limit (PyTorch refuses a segment that would
//! take reserved past it), so it becomes the replay's memory limit; without one the limit
//! is the card less what NVML saw the process hold beyond PyTorch's reserved bytes (the
//! CUDA context, cuBLAS workspaces, NCCL), measured during the run. Devices are predicted
//! one by one: a multi-GPU process runs out on whichever device is first full.
//!
//! The comparison rule is the issue's: a prediction agrees with a ramp when it is within
//! 15% of the observed first-OOM concurrency, or within one step of the ramp's load steps.

use std::collections::BTreeMap;

use tracing::warn;
use vramroom_alloc::{AllocatorConfig, Snapshot};
use vramroom_trace::concurrency::{
    attribution, predict_concurrency, size_cap_for, split_requests, Interleave, LoadWhatIf,
    RequestSize, Workload,
};

use crate::http::prometheus::{Exposition, PROBE_CAPACITY_METRIC, PROBE_FRACTION_METRIC};

/// What `--predict` was asked for.
#[derive(Debug, Clone, Default)]
pub struct PredictOptions {
    /// `--target-concurrency`: the load the batch/length caps must keep safe (default:
    /// twice the gentle run's load, at least 2).
    pub target_concurrency: Option<u32>,
    /// Seeds per concurrency (which recorded requests meet).
    pub seeds: u64,
    /// How concurrent requests interleave in the replay.
    pub interleave: Option<Interleave>,
}

pub use crate::results::prediction::{
    ConfigPrediction, DeviceCapacity, DevicePrediction, Observed, RequestAttribution, RequestPoint,
    ServicePrediction, SizeCap,
};

/// What a prediction means when one worker thread ran every request (a batcher).
fn one_worker_note(
    d: usize,
    thread: u32,
    w: &Workload,
    limit: u64,
    configs: &[ConfigPrediction],
) -> String {
    let mut n = format!(
        "device {d}: every request ran on one worker thread (the probe's thread {thread}) while \
         its handler waited: a batcher or a single worker. Requests in flight queue for it \
         instead of stacking in memory, so no concurrency runs out; memory grows with the \
         batch the worker takes, which a gentle run cannot see"
    );
    let a = attribution(w);
    let reserved_1 = configs.first().and_then(|c| c.points.first()).map(|p| p.1);
    let largest = w.requests.iter().map(|r| r.peak_bytes).max().unwrap_or(0);
    if let (Some(unit), Some(slope), Some(icpt), Some(r1)) =
        (a.unit, a.bytes_per_unit, a.intercept_bytes, reserved_1)
    {
        // What the largest recorded request did not use is the base; a batch fits while
        // base + its own peak (the fit) stays under the limit.
        let base = r1.saturating_sub(largest) as f64;
        if slope > 0.0 {
            let most = ((limit as f64 - base - icpt) / slope).floor();
            if most > 0.0 {
                n.push_str(&format!(
                    ": at {:.0} bytes per {} (fit over {} requests), a batch above about {:.0} {} \
                     would not fit",
                    slope, unit, a.requests, most, unit
                ));
            }
        }
    }
    n
}

/// Per-device capacity, fraction and total from a probe scrape (devices in order).
pub fn device_capacities(e: &Exposition) -> Vec<DeviceCapacity> {
    let mut by: BTreeMap<usize, DeviceCapacity> = BTreeMap::new();
    let dev = |s: &crate::http::prometheus::Sample| {
        s.label("device")
            .and_then(|d| d.trim().parse::<usize>().ok())
    };
    for s in &e.samples {
        let Some(d) = dev(s) else { continue };
        if !s.value.is_finite() || s.value < 0.0 {
            continue;
        }
        let c = by.entry(d).or_insert(DeviceCapacity {
            device: d,
            fraction: 1.0,
            ..Default::default()
        });
        match s.name.as_str() {
            PROBE_CAPACITY_METRIC => c.capacity_bytes = s.value.round() as u64,
            PROBE_FRACTION_METRIC => c.fraction = s.value,
            "torch_cuda_device_total_memory_bytes" => c.total_bytes = s.value.round() as u64,
            "torch_cuda_device_total_bytes" if c.total_bytes == 0 => {
                c.total_bytes = s.value.round() as u64
            }
            _ => {}
        }
    }
    by.into_values()
        .filter(|c| c.capacity_bytes > 0 || c.total_bytes > 0)
        .map(|mut c| {
            if c.capacity_bytes == 0 {
                c.capacity_bytes = (c.total_bytes as f64 * c.fraction.min(1.0)) as u64;
            }
            c
        })
        .collect()
}

/// Predicts every device of `snap` that served requests. `caps`: the probe's per-device
/// capacities (may be empty: the snapshot's own device sizes are used). `overhead`: per
/// device, the bytes the process held beyond reserved (NVML), when measured.
pub fn predict(
    snap: &Snapshot,
    caps: &[DeviceCapacity],
    overhead: &BTreeMap<usize, u64>,
    own_conf: &str,
    what_if: &[String],
    gentle_concurrency: usize,
    opts: &PredictOptions,
) -> ServicePrediction {
    let mut out = ServicePrediction {
        gentle_concurrency,
        ..Default::default()
    };
    let mut confs: Vec<String> = vec![own_conf.to_string()];
    for c in what_if {
        if !confs.contains(c) {
            confs.push(c.clone());
        }
    }
    for (d, trace) in snap.device_traces.iter().enumerate() {
        if trace.is_empty() {
            continue;
        }
        let w = split_requests(trace);
        if w.requests.is_empty() {
            out.notes.push(format!(
                "device {d}: the trace holds no request after the model's load"
            ));
            continue;
        }
        let cap = caps.iter().find(|c| c.device == d).copied();
        let Some(cap) = cap else {
            out.notes.push(format!(
                "device {d}: the probe exports no capacity for it: not predicted"
            ));
            continue;
        };
        let oh = overhead.get(&d).copied().unwrap_or(0);
        let fraction_set = cap.fraction < 0.999_999;
        let limit = if fraction_set {
            cap.capacity_bytes
        } else {
            cap.total_bytes.saturating_sub(oh)
        };
        let base = LoadWhatIf {
            capacity: Some(cap.total_bytes.max(limit)),
            memory_limit: Some(limit),
            seeds: opts.seeds.max(1),
            max_concurrency: 1024,
            interleave: opts.interleave.unwrap_or_default(),
            ..Default::default()
        };
        let mut configs = Vec::new();
        for c in &confs {
            let config = match AllocatorConfig::parse(c) {
                Ok(x) => x,
                Err(e) => {
                    out.notes.push(format!("{c:?}: {e}"));
                    continue;
                }
            };
            let o = LoadWhatIf {
                config,
                ..base.clone()
            };
            match predict_concurrency(snap, d, &w, &o) {
                Ok(p) => configs.push(ConfigPrediction {
                    one_worker: p.one_worker.is_some(),
                    alloc_conf: c.clone(),
                    first_oom_concurrency: p.first_oom,
                    safe_concurrency: p.safe,
                    max_concurrency_tried: p.points.last().map_or(0, |x| x.concurrency),
                    points: p
                        .points
                        .iter()
                        .map(|x| {
                            (
                                x.concurrency,
                                x.peak_reserved_bytes,
                                f64::from(x.oom_runs) / f64::from(x.runs.max(1)),
                            )
                        })
                        .collect(),
                }),
                Err(e) => {
                    warn!(device = d, conf = %c, error = %e, "prediction failed");
                    out.notes.push(format!("device {d}, {c:?}: {e}"));
                }
            }
        }
        let target = opts
            .target_concurrency
            .unwrap_or(((gentle_concurrency as u32) * 2).max(2));
        let own_config = AllocatorConfig::parse(own_conf).unwrap_or_default();
        out.notes.push(rests_on(d, w.requests.len()));
        if let Some(t) = w.one_worker() {
            out.notes.push(one_worker_note(d, t, &w, limit, &configs));
        }
        // The cap is stated in the unit that explains the requests' cost, or not at all.
        let (basis, note) = cost_basis(&w);
        if let Some(n) = note {
            out.notes.push(format!("device {d}: {n}"));
        }
        let w = match basis {
            CostBasis::Unit(u) => only_unit(&w, u),
            _ => w,
        };
        let size_cap = if !matches!(basis, CostBasis::Unexplained)
            && w.requests.iter().any(|r| r.size.main().is_some())
        {
            match size_cap_for(
                snap,
                d,
                &w,
                target,
                &LoadWhatIf {
                    config: own_config,
                    ..base.clone()
                },
            ) {
                Ok(c) => Some(SizeCap {
                    target_concurrency: target,
                    max_size: c.map(|x| x.0),
                    unit: c.map(|x| x.1.to_string()).or_else(|| {
                        w.requests
                            .iter()
                            .find_map(|r| r.size.main())
                            .map(|x| x.1.to_string())
                    }),
                }),
                Err(e) => {
                    out.notes.push(format!("device {d}: size cap: {e}"));
                    None
                }
            }
        } else {
            None
        };
        let a = attribution(&w);
        let points = w
            .requests
            .iter()
            .take(2000)
            .map(|r| RequestPoint {
                id: r.id.clone(),
                size: r.size.main().map(|x| x.0),
                peak_bytes: r.peak_bytes,
            })
            .collect();
        out.devices.push(DevicePrediction {
            device: d,
            capacity: cap,
            limit_bytes: limit,
            overhead_bytes: if fraction_set { 0 } else { oh },
            requests: w.requests.len(),
            tagged: w.tagged,
            configs,
            size_cap,
            attribution: RequestAttribution {
                unit: a.unit.map(str::to_string),
                requests: a.requests,
                bytes_per_unit: a.bytes_per_unit,
                intercept_bytes: a.intercept_bytes,
                outliers: a.outliers,
                points,
            },
        });
    }
    out.first_oom_concurrency = out
        .devices
        .iter()
        .filter_map(|d| d.configs.first().and_then(|c| c.first_oom_concurrency))
        .min();
    if out.devices.is_empty() && out.notes.is_empty() {
        out.notes
            .push("the probe's snapshot holds no device trace (record_history off?)".into());
    }
    out
}

/// What a size cap may be stated in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CostBasis {
    /// Every request costs about the same: the tagged size (tokens, items, bytes) is as
    /// good as any, and the cap is the largest recorded size that fits.
    Constant,
    /// The unit whose size explains the requests' own peaks best (R² at least `MIN_R2`).
    Unit(&'static str),
    /// The peaks vary and no tagged size explains them: no cap (a cap in such a unit, say
    /// the body's bytes, would be a number that does not limit the cost).
    Unexplained,
    /// No request carried a size.
    Untagged,
}

/// The least share of the per-request peaks' variance a size must explain to cap by it.
const MIN_R2: f64 = 0.5;
/// Peaks within this coefficient of variation count as one cost.
const CONSTANT_CV: f64 = 0.10;

/// R² of peak bytes against `size` over the requests that carry it (`None`: fewer than
/// 3, or every size the same).
fn r2_of(w: &Workload, size: impl Fn(&RequestSize) -> Option<u64>) -> Option<(usize, f64)> {
    let pts: Vec<(f64, f64)> = w
        .requests
        .iter()
        .filter_map(|r| size(&r.size).map(|s| (s as f64, r.peak_bytes as f64)))
        .collect();
    let n = pts.len();
    if n < 3 {
        return None;
    }
    let nf = n as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / nf;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / nf;
    let (mut sxx, mut syy, mut sxy) = (0.0, 0.0, 0.0);
    for (x, y) in &pts {
        sxx += (x - mx) * (x - mx);
        syy += (y - my) * (y - my);
        sxy += (x - mx) * (y - my);
    }
    if sxx <= 0.0 || syy <= 0.0 {
        return None;
    }
    Some((n, (sxy * sxy) / (sxx * syy)))
}

/// Which unit, if any, the size cap may be measured in, and a note saying why.
fn cost_basis(w: &Workload) -> (CostBasis, Option<String>) {
    if !w.requests.iter().any(|r| r.size.main().is_some()) {
        return (CostBasis::Untagged, None);
    }
    let peaks: Vec<f64> = w.requests.iter().map(|r| r.peak_bytes as f64).collect();
    let n = peaks.len() as f64;
    let mean = peaks.iter().sum::<f64>() / n;
    let sd = (peaks.iter().map(|p| (p - mean) * (p - mean)).sum::<f64>() / n).sqrt();
    if mean <= 0.0 || sd / mean <= CONSTANT_CV {
        return (CostBasis::Constant, None);
    }
    let fits: Vec<(&'static str, usize, f64)> = [
        ("tokens", r2_of(w, |s: &RequestSize| s.tokens)),
        ("items", r2_of(w, |s: &RequestSize| s.items)),
        ("bytes", r2_of(w, |s: &RequestSize| s.bytes)),
    ]
    .into_iter()
    .filter_map(|(u, f)| f.map(|(k, r2)| (u, k, r2)))
    .collect();
    let listed = fits
        .iter()
        .map(|(u, k, r2)| format!("{u} R²={r2:.2} over {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    let best = fits.iter().copied().max_by(|a, b| a.2.total_cmp(&b.2));
    match best {
        Some((u, k, r2)) if r2 >= MIN_R2 => (
            CostBasis::Unit(u),
            Some(format!(
                "size cap in {u}: they explain R²={r2:.2} of the per-request peaks over {k} requests ({listed})"
            )),
        ),
        _ => (
            CostBasis::Unexplained,
            Some(format!(
                "no size cap: the per-request peaks vary (cv {:.2}) and nothing the run saw explains them ({}); tag each request's cost with probe.request(tokens=..., items=...)",
                sd / mean,
                if listed.is_empty() {
                    "no size varies".to_string()
                } else {
                    listed
                }
            )),
        ),
    }
}

/// `w` with each request's size reduced to `unit` (so caps and fits are stated in it).
fn only_unit(w: &Workload, unit: &'static str) -> Workload {
    let mut w = w.clone();
    for r in &mut w.requests {
        r.size = RequestSize {
            tokens: r.size.tokens.filter(|_| unit == "tokens"),
            items: r.size.items.filter(|_| unit == "items"),
            bytes: r.size.bytes.filter(|_| unit == "bytes"),
        };
    }
    w
}

/// How many requests the prediction rests on, and what few of them mean.
fn rests_on(d: usize, n: usize) -> String {
    // A request kind that is 1 in 10 of the traffic is absent from n samples with
    // probability 0.9^n: below ~30 the large requests that set the OOM point may be unseen.
    let miss = 0.9f64.powi(n.min(10_000) as i32) * 100.0;
    if n < 30 {
        format!(
            "device {d}: the prediction rests on {n} request(s) only: a request kind 1 in 10 of the traffic is missed with probability {miss:.0}%, and the first OOM may be over-predicted by a step or more (send more requests in the gentle run; if it sent more, the probe's history ring held only these: let it size itself, max_entries=None, or raise it)"
        )
    } else {
        format!("device {d}: the prediction rests on {n} requests (a kind 1 in 10 of the traffic is missed with probability {miss:.1}%)")
    }
}

/// What a ramp saw: the concurrency of the first stage with an OOM (an answer naming one,
/// or the run stopping at the first OOM), and the stage before it.
pub fn observed(r: &crate::results::RunResult) -> Observed {
    let steps: Vec<u32> = r.stages.iter().map(|s| s.concurrency as u32).collect();
    let first = r
        .stages
        .iter()
        .position(|s| s.requests.oom > 0)
        .or_else(|| {
            (r.stop_reason == crate::results::StopReason::OomFound)
                .then(|| r.stages.len().checked_sub(1))
                .flatten()
        });
    Observed {
        first_oom_concurrency: first.map(|i| steps[i]),
        last_ok_concurrency: first.and_then(|i| i.checked_sub(1)).map(|i| steps[i]),
        steps,
        ..Default::default()
    }
}

/// The default ramp of `--ramp-until-oom`: the load steps users' ramps take.
pub const DEFAULT_RAMP: [u32; 14] = [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::prometheus::parse;

    #[test]
    fn capacities_parse_per_device() {
        let e = parse(
            "torch_cuda_memory_fraction{device=\"0\"} 0.043\n\
             torch_cuda_device_capacity_bytes{device=\"0\"} 6454724853\n\
             torch_cuda_device_total_memory_bytes{device=\"0\"} 150109880320\n\
             torch_cuda_device_total_bytes{device=\"1\"} 1000\n\
             torch_cuda_memory_allocated_bytes{device=\"1\"} 5\n",
        )
        .unwrap();
        let c = device_capacities(&e);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].capacity_bytes, 6454724853);
        assert!((c[0].fraction - 0.043).abs() < 1e-12);
        assert_eq!(c[0].total_bytes, 150109880320);
        // An older probe: only the total, no fraction: the whole card.
        assert_eq!(c[1].capacity_bytes, 1000);
        assert_eq!(c[1].fraction, 1.0);
    }

    #[test]
    fn comparison_follows_the_issues_rule() {
        let steps = DEFAULT_RAMP.to_vec();
        let mut o = Observed {
            first_oom_concurrency: Some(16),
            last_ok_concurrency: Some(12),
            steps: steps.clone(),
            ..Default::default()
        };
        o.compare(Some(19)); // 19% off, but in the next step (24)
        assert_eq!(o.steps_apart, Some(1));
        assert_eq!(o.agrees, Some(true));
        o.compare(Some(40)); // two steps off and 150%
        assert_eq!(o.agrees, Some(false));
        o.compare(Some(17)); // 6%
        assert_eq!(o.agrees, Some(true));
        o.compare(None);
        assert_eq!(o.agrees, None);
    }
}
