//! Diagnosis: named causes of memory waste, each with evidence, a fix and a saving.
//!
//! Design note: every finding is decided from measurements, never from the scenario's
//! mistake switches — the switches only plant the mistake; the diagnosis must see it in the
//! numbers, as it would in a user's workload. Each rule has an absolute floor (bytes that
//! matter against the capacity) so that a clean run produces no findings, and each reports
//! a predicted saving measured the same way PyTorch users would measure it:
//!
//! - `autograd_in_inference`: activation-category bytes (saved for backward) at the peak of
//!   an inference run. With `no_grad` there are none, so the saving is exactly those bytes.
//! - `graph_accumulated`: the peak grows with accumulation steps. Meta probes of the same
//!   training step at 1 and N micro-steps, and at N with backward every micro-step; the
//!   saving is the difference between the run's pattern and the correct one at N.
//! - `leak`: allocated memory that stays after every request has finished (at rest, over
//!   the baseline), and the slope of allocated-memory floors over a steady stage; the
//!   categories that grew.
//! - `fragmentation`: reserved far above allocated at the peak, inactive split bytes,
//!   alloc retries, or OOMs with much cached-but-free memory. The run's own trace is
//!   replayed under other allocator configs; the saving is the best one's peak reserved
//!   below the replay of the run's own config.
//! - `cache_held`: after the load fell, the cache still holds memory for a burst that is
//!   over; what `empty_cache()` would hand back (fully free segments) is the saving.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use headroom_alloc::{AllocatorConfig, BlockState};
use headroom_trace::{replay, ReplayOptions};
use tracing::{debug, warn};

use crate::results::*;
use crate::search::{probe, SearchAxis, SearchConfig};
use crate::timeline::linear_fit;
use headroom_workload::{AccumPattern, Mode, Scenario};

const MIB: f64 = 1048576.0;

pub(crate) fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / MIB)
}

/// `default: 812.0 MiB; expandable_segments:True: 640.0 MiB`: each replayed config's peak
/// reserved, for a finding's evidence.
pub(crate) fn what_if_table(rows: &[WhatIfRow]) -> String {
    rows.iter()
        .map(|w| {
            let conf = if w.alloc_conf.is_empty() {
                "default"
            } else {
                &w.alloc_conf
            };
            format!("{conf}: {}", mib(w.peak_reserved_bytes as f64))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Replays the run's own snapshot under its config and each of `configs`.
pub fn what_if(r: &RunResult, own_conf: &str, configs: &[String]) -> Vec<WhatIfRow> {
    let Some(snap) = r.snapshot.as_ref() else {
        return Vec::new();
    };
    what_if_snapshot(snap, r.capacity_bytes, own_conf, configs)
}

/// Replays `snap`'s first device trace under `own_conf` and each of `configs`, on a device
/// of `capacity` bytes (`headroom http` replays the snapshot a probe served).
pub fn what_if_snapshot(
    snap: &headroom_alloc::Snapshot,
    capacity: u64,
    own_conf: &str,
    configs: &[String],
) -> Vec<WhatIfRow> {
    if snap.device_traces.iter().all(|t| t.is_empty()) {
        return Vec::new();
    }
    let mut confs: Vec<String> = vec![own_conf.to_string()];
    for c in configs {
        if !confs.contains(c) {
            confs.push(c.clone());
        }
    }
    let mut rows = Vec::new();
    for c in confs {
        let Ok(config) = AllocatorConfig::parse(&c) else {
            warn!(conf = %c, "what-if: config does not parse");
            continue;
        };
        let opts = ReplayOptions {
            config,
            capacity: Some(capacity),
            stop_at_oom: false,
            record_history: false,
            ..ReplayOptions::default()
        };
        match replay(snap, &opts) {
            Ok(rr) => rows.push(WhatIfRow {
                alloc_conf: c,
                peak_allocated_bytes: rr.peak_allocated_bytes,
                peak_reserved_bytes: rr.peak_reserved_bytes,
                reserved_over_allocated: if rr.peak_allocated_bytes > 0 {
                    rr.peak_reserved_bytes as f64 / rr.peak_allocated_bytes as f64
                } else {
                    0.0
                },
                num_alloc_retries: rr.num_alloc_retries,
                num_ooms: rr.num_ooms,
                // An allocation of 1 EB or more fails without counting an OOM (as in
                // PyTorch): any failed allocation means the config does not fit.
                fits_capacity: rr.num_ooms == 0 && rr.oom_event.is_none(),
                saving_vs_run_bytes: 0,
            }),
            Err(e) => warn!(conf = %c, error = %e, "what-if replay failed"),
        }
    }
    if let Some(base) = rows.first().map(|r| r.peak_reserved_bytes as i64) {
        for row in &mut rows {
            row.saving_vs_run_bytes = base - row.peak_reserved_bytes as i64;
        }
    }
    rows
}

/// Thresholds of the rules, in one place.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// A byte figure matters when it is at least this share of the capacity...
    pub capacity_share: f64,
    /// ...and at least this many bytes.
    pub min_bytes: u64,
    /// Fragmentation: peak reserved / peak allocated at least this.
    pub frag_ratio: f64,
    /// Graph accumulated: peak at N micro-steps over peak at 1 at least this.
    pub accum_ratio: f64,
    /// Cache held: the last stage's peak allocated at most this share of the run's peak.
    pub load_drop: f64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            capacity_share: 0.05,
            min_bytes: 4 << 20,
            frag_ratio: 1.5,
            accum_ratio: 1.5,
            load_drop: 0.6,
        }
    }
}

impl Rules {
    /// The smallest byte figure that matters on a device of `capacity` bytes.
    pub fn floor(&self, capacity: u64) -> u64 {
        ((capacity as f64 * self.capacity_share) as u64).max(self.min_bytes)
    }
}

fn nums(v: &[(&str, f64)]) -> BTreeMap<String, f64> {
    v.iter().map(|(k, x)| (k.to_string(), *x)).collect()
}

/// All findings for a finished run.
pub fn diagnose(
    r: &RunResult,
    scenario: &Scenario,
    conf: &AllocatorConfig,
    stop: &AtomicBool,
) -> Vec<Finding> {
    diagnose_with(r, scenario, conf, stop, &Rules::default())
}

pub fn diagnose_with(
    r: &RunResult,
    scenario: &Scenario,
    conf: &AllocatorConfig,
    stop: &AtomicBool,
    rules: &Rules,
) -> Vec<Finding> {
    let mut f = Vec::new();
    f.extend(autograd_in_inference(r, scenario));
    f.extend(graph_accumulated(r, scenario, conf, stop, rules));
    f.extend(leak(r, rules));
    f.extend(fragmentation(r, rules));
    f.extend(cache_held(r, rules));
    f
}

fn autograd_in_inference(r: &RunResult, scenario: &Scenario) -> Option<Finding> {
    if scenario.is_training() {
        return None;
    }
    let at_peak = r.peaks.categories_at_peak.activation;
    let max_seen = r
        .timeline
        .iter()
        .map(|s| s.categories.activation)
        .max()
        .unwrap_or(0);
    let act = at_peak.max(max_seen);
    // Any saved activation in inference is autograd's: no floor is needed, because a
    // no_grad forward saves none at all.
    if act == 0 {
        return None;
    }
    let above = r.peaks.above_base_bytes.max(1) as f64;
    Some(Finding {
        id: FindingId::AutogradInInference,
        title: "Autograd was on during inference".into(),
        severity: if r.errors.oom > 0 {
            Severity::Critical
        } else {
            Severity::Warning
        },
        evidence: format!(
            "{} of activations were saved for a backward pass that never runs ({:.0}% of the \
             peak above the model's {}); an inference forward under no_grad saves none.",
            mib(act as f64),
            100.0 * at_peak as f64 / above,
            mib(r.baseline_bytes as f64)
        ),
        numbers: nums(&[
            ("activation_bytes_at_peak", at_peak as f64),
            ("activation_bytes_max", max_seen as f64),
            ("peak_above_base_bytes", r.peaks.above_base_bytes as f64),
        ]),
        fix: "Run the forward under `with torch.no_grad():` (or `torch.inference_mode()`), \
              or decorate the handler with `@torch.no_grad()`."
            .into(),
        predicted_saving_bytes: act,
    })
}

fn graph_accumulated(
    r: &RunResult,
    scenario: &Scenario,
    conf: &AllocatorConfig,
    stop: &AtomicBool,
    rules: &Rules,
) -> Option<Finding> {
    let Mode::Training {
        optimizer,
        accum_steps,
        pattern,
    } = scenario.mode.clone()
    else {
        return None;
    };
    if accum_steps < 2 {
        return None;
    }
    let cfg = SearchConfig {
        requests_per_worker: 2,
        ..SearchConfig::default()
    };
    let with = |steps: usize, pat: AccumPattern| -> Option<u64> {
        let mut sc = scenario.clone();
        sc.mode = Mode::Training {
            optimizer,
            accum_steps: steps,
            pattern: pat,
        };
        sc.mistakes.sum_losses = pat == AccumPattern::Sum;
        sc.mistakes.keep_outputs = false;
        match probe(&sc, SearchAxis::Concurrency, 1, 1 << 46, conf, &cfg, stop) {
            Ok(p) => Some(p.peak_allocated_bytes),
            Err(e) => {
                warn!(error = %e, "accumulation probe failed");
                None
            }
        }
    };
    let pat = scenario.effective_pattern().unwrap_or(pattern);
    let p1 = with(1, pat)?;
    let pn = with(accum_steps, pat)?;
    let pn_each = if pat == AccumPattern::Each {
        pn
    } else {
        with(accum_steps, AccumPattern::Each)?
    };
    let ratio = pn as f64 / p1.max(1) as f64;
    let growth = pn.saturating_sub(p1);
    debug!(p1, pn, pn_each, ratio, "accumulation probes");
    if ratio < rules.accum_ratio || growth < rules.floor(r.capacity_bytes) {
        return None;
    }
    Some(Finding {
        id: FindingId::GraphAccumulated,
        title: "The autograd graph accumulated across micro-steps".into(),
        severity: if r.errors.oom > 0 {
            Severity::Critical
        } else {
            Severity::Warning
        },
        evidence: format!(
            "Peak memory grows with accumulation steps: {} at 1 step, {} at {} steps \
             ({:.2}x). With backward every micro-step the peak at {} steps is {}.",
            mib(p1 as f64),
            mib(pn as f64),
            accum_steps,
            ratio,
            accum_steps,
            mib(pn_each as f64)
        ),
        numbers: nums(&[
            ("peak_bytes_1_step", p1 as f64),
            ("peak_bytes_n_steps", pn as f64),
            ("peak_bytes_n_steps_backward_each", pn_each as f64),
            ("accum_steps", accum_steps as f64),
            ("ratio", ratio),
        ]),
        fix: "Call `(loss / N).backward()` inside the micro-step loop instead of summing the \
              losses and calling backward once: gradients accumulate in `.grad`, graphs do not."
            .into(),
        predicted_saving_bytes: pn.saturating_sub(pn_each),
    })
}

fn leak(r: &RunResult, rules: &Rules) -> Option<Finding> {
    let periodic: Vec<&MemorySample> = r
        .timeline
        .iter()
        .filter(|s| s.kind == SampleKind::Periodic)
        .collect();
    let rest = periodic.last()?;
    let first = periodic.first()?;
    let retained = rest.allocated_bytes.saturating_sub(r.baseline_bytes);
    // Floors of allocated memory in windows of the longest stage after its first quarter:
    // the in-flight requests' memory comes and goes, a leak raises the floor.
    let mut slope = 0.0;
    let mut r2 = 0.0;
    let mut steady_s = 0.0;
    if let Some(st) = r
        .stages
        .iter()
        .max_by(|a, b| (a.end_s - a.start_s).total_cmp(&(b.end_s - b.start_s)))
    {
        let t0 = st.start_s + 0.25 * (st.end_s - st.start_s);
        let pts: Vec<&&MemorySample> = periodic
            .iter()
            .filter(|s| s.stage == st.index && s.t_s >= t0 && s.t_s <= st.end_s)
            .collect();
        if pts.len() >= 12 {
            let w = 6;
            let per = pts.len() / w;
            let floors: Vec<(f64, f64)> = pts
                .chunks(per.max(1))
                .filter(|c| c.len() == per.max(1))
                .map(|c| {
                    let t = c.iter().map(|s| s.t_s).sum::<f64>() / c.len() as f64;
                    let m = c.iter().map(|s| s.allocated_bytes).min().unwrap_or(0);
                    (t, m as f64)
                })
                .collect();
            if let Some(fit) = linear_fit(&floors) {
                slope = fit.b;
                r2 = fit.r2;
                steady_s = st.end_s - t0;
            }
        }
    }
    let floor = rules.floor(r.capacity_bytes);
    let drift = (slope * steady_s).max(0.0);
    let fires = retained >= floor || (drift >= floor as f64 && r2 >= 0.6);
    if !fires {
        return None;
    }
    let grown: Vec<(&'static str, u64)> = rest
        .categories
        .entries()
        .iter()
        .zip(first.categories.entries().iter())
        .filter_map(|((n, a), (_, b))| (a > b).then_some((*n, a - b)))
        .collect();
    let grown_txt = if grown.is_empty() {
        "no single category".to_string()
    } else {
        grown
            .iter()
            .map(|(n, b)| format!("{n} +{}", mib(*b as f64)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let per_req = retained as f64 / r.requests.ok.max(1) as f64;
    let mut numbers = nums(&[
        ("retained_bytes_at_rest", retained as f64),
        ("floor_slope_bytes_per_s", slope),
        ("floor_slope_r2", r2),
        ("retained_bytes_per_request", per_req),
    ]);
    for (n, b) in &grown {
        numbers.insert(format!("grew_{n}_bytes"), *b as f64);
    }
    Some(Finding {
        id: FindingId::Leak,
        title: "Memory leaks across requests".into(),
        severity: if r.errors.oom > 0 {
            Severity::Critical
        } else {
            Severity::Warning
        },
        evidence: format!(
            "Allocated memory drifts up at steady load: the floor rises {}/s (R² {:.2}), and \
             {} stays allocated after every request has finished ({} per request). Grew: {}.",
            mib(slope),
            r2,
            mib(retained as f64),
            if per_req >= 1024.0 {
                mib(per_req)
            } else {
                format!("{per_req:.0} B")
            },
            grown_txt
        ),
        numbers,
        fix: "Do not keep references to request outputs (a list of outputs or losses keeps \
              their memory, and with grad on their graphs): keep `out.detach().cpu()` or \
              `loss.item()`, or bound the list."
            .into(),
        predicted_saving_bytes: retained.max(drift as u64),
    })
}

fn fragmentation(r: &RunResult, rules: &Rules) -> Option<Finding> {
    let p = &r.peaks;
    let waste = p.reserved_bytes.saturating_sub(p.allocated_bytes);
    let ratio = p.reserved_bytes as f64 / p.allocated_bytes.max(1) as f64;
    let floor = rules.floor(r.capacity_bytes);
    let oom_waste = r
        .ooms
        .iter()
        .map(|o| o.reserved_bytes.saturating_sub(o.allocated_bytes))
        .max()
        .unwrap_or(0);
    // Reserved above allocated alone is no evidence: a small model on 20 MiB segments shows
    // a high ratio with nothing wasted. What counts is memory reserved *because* the free
    // cache was in the wrong pieces, retries, and OOMs with much cached-but-free memory.
    let frag = p.fragmented_segment_bytes;
    let fires =
        (frag >= floor && ratio >= rules.frag_ratio) || p.alloc_retries > 0 || oom_waste >= floor;
    if !fires {
        return None;
    }
    let own = r.what_if.first();
    let best = r
        .what_if
        .iter()
        .skip(1)
        .min_by_key(|w| (w.num_ooms, w.peak_reserved_bytes));
    let table = what_if_table(&r.what_if);
    let saving = match (own, best) {
        (Some(o), Some(b)) if b.peak_reserved_bytes < o.peak_reserved_bytes => {
            o.peak_reserved_bytes - b.peak_reserved_bytes
        }
        (Some(_), Some(_)) => 0,
        // No replay to ask: the fragmented segments are the upper bound of what a
        // fragmentation-free allocator would not have reserved.
        _ => frag.min(waste),
    };
    let fix = match best {
        Some(b) if saving > 0 => format!(
            "Set `PYTORCH_CUDA_ALLOC_CONF={}`: the replay of this run's trace under it peaks \
             at {} reserved instead of {}.",
            b.alloc_conf,
            mib(b.peak_reserved_bytes as f64),
            mib(own
                .map(|o| o.peak_reserved_bytes)
                .unwrap_or(p.reserved_bytes) as f64)
        ),
        Some(_) => "No allocator config helps this trace much (see the what-if table): the \
              waste comes from requests of many sizes whose lifetimes interleave. Pad the \
              variable dimension to a few buckets (e.g. sequence lengths to multiples of 64) so \
              freed blocks fit the next request."
            .into(),
        None => "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` so segments grow in place \
              instead of splitting, and pad variable sizes to a few buckets."
            .into(),
    };
    Some(Finding {
        id: FindingId::Fragmentation,
        title: "The caching allocator's memory is fragmented".into(),
        severity: if r.errors.oom > 0 && oom_waste >= floor {
            Severity::Critical
        } else {
            Severity::Warning
        },
        evidence: format!(
            "Peak reserved {} against peak allocated {} ({:.2}x); {} new segments ({}) were \
             reserved while the pool already held enough free cache for the request; up to {} \
             free inside split segments; {} alloc retries{}.{}",
            mib(p.reserved_bytes as f64),
            mib(p.allocated_bytes as f64),
            ratio,
            p.fragmented_segment_allocs,
            mib(frag as f64),
            mib(p.inactive_split_bytes as f64),
            p.alloc_retries,
            if oom_waste > 0 {
                format!(
                    "; at an OOM {} was reserved but unallocated",
                    mib(oom_waste as f64)
                )
            } else {
                String::new()
            },
            if table.is_empty() {
                String::new()
            } else {
                format!(" Replayed peak reserved: {table}.")
            }
        ),
        numbers: nums(&[
            ("peak_reserved_bytes", p.reserved_bytes as f64),
            ("peak_allocated_bytes", p.allocated_bytes as f64),
            ("reserved_over_allocated", ratio),
            ("inactive_split_bytes_peak", p.inactive_split_bytes as f64),
            ("alloc_retries", p.alloc_retries as f64),
            ("oom_reserved_unallocated_bytes", oom_waste as f64),
            ("fragmented_segment_bytes", frag as f64),
            (
                "fragmented_segment_allocs",
                p.fragmented_segment_allocs as f64,
            ),
        ]),
        fix,
        predicted_saving_bytes: saving,
    })
}

fn cache_held(r: &RunResult, rules: &Rules) -> Option<Finding> {
    // Only a load that fell leaves a burst's memory behind: a later stage with fewer
    // workers than an earlier one.
    let last_c = r.stages.last()?.concurrency;
    if !r.stages.iter().any(|s| s.concurrency > last_c) {
        return None;
    }
    let rest = r
        .timeline
        .iter()
        .rfind(|s| s.kind == SampleKind::Periodic)?;
    let last = r.stages.last()?;
    // What the last stage itself needs: the most allocated in its second half (its start
    // still carries the previous stage's requests in flight), or its peak without samples.
    let mid = last.start_s + 0.5 * (last.end_s - last.start_s);
    let recent = r
        .timeline
        .iter()
        .filter(|s| s.kind == SampleKind::Periodic && s.stage == last.index && s.t_s >= mid)
        .map(|s| s.allocated_bytes)
        .max()
        .unwrap_or(last.peak_allocated_bytes);
    let held = rest.reserved_bytes.saturating_sub(rest.allocated_bytes);
    let dropped = recent as f64 <= rules.load_drop * r.peaks.allocated_bytes as f64;
    let excess = rest.reserved_bytes.saturating_sub(recent);
    let floor = rules.floor(r.capacity_bytes);
    if !(dropped && excess >= floor && held >= floor) {
        return None;
    }
    // What empty_cache() hands back: every segment with no live block.
    let releasable = r
        .snapshot
        .as_ref()
        .map(|s| {
            s.segments
                .iter()
                .filter(|g| g.blocks.iter().all(|b| b.state == BlockState::Inactive))
                .map(|g| g.total_size)
                .sum::<u64>()
        })
        .unwrap_or(held);
    Some(Finding {
        id: FindingId::CacheHeld,
        title: "The cache holds memory for a burst that is over".into(),
        severity: Severity::Info,
        evidence: format!(
            "After the load fell to {} workers (at most {} allocated late in the last stage, \
             against {} at the run's peak), the allocator still reserves {} with {} allocated: {} is \
             cached but unused; empty_cache() would return {} to the device.",
            last.concurrency,
            mib(recent as f64),
            mib(r.peaks.allocated_bytes as f64),
            mib(rest.reserved_bytes as f64),
            mib(rest.allocated_bytes as f64),
            mib(held as f64),
            mib(releasable as f64)
        ),
        numbers: nums(&[
            ("reserved_bytes_at_rest", rest.reserved_bytes as f64),
            ("allocated_bytes_at_rest", rest.allocated_bytes as f64),
            ("cached_unused_bytes", held as f64),
            ("empty_cache_returns_bytes", releasable as f64),
            ("last_stage_recent_allocated_bytes", recent as f64),
        ]),
        fix: "Call `torch.cuda.empty_cache()` once a burst is over (it frees every fully free \
              segment to the driver), or set `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8` \
              so the allocator reclaims old cached blocks itself."
            .into(),
        predicted_saving_bytes: releasable,
    })
}
