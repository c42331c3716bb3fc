//! The seed's mistakes found in a traced program (`vramroom trace`, issue #30 Deliver 3):
//! the same rule ids, severities and fixes as a load test's, decided from what the fake-CUDA
//! tracer measured in the user's own code, each with the file:line that caused it.
//!
//! The tracer (python/vramroom/trace/evidence.py) measures; this file decides. Its evidence
//! says, for every allocation, what it is (parameter, gradient, optimizer state, saved for
//! backward, activation) and where in the user's code it was made; when backward ran and on
//! what; and the live bytes at each iteration boundary (optimizer steps, else backward
//! calls, else forward passes that the user's code made). The replay of the traced snapshot
//! on Vramroom's allocator adds what the cache holds.
//!
//! - `autograd_in_inference`: tensors saved for a backward that never ran (never unpacked)
//!   — their most at once. As in [`super::autograd`], no floor when no backward ran at all
//!   (an inference forward under no_grad saves none); the floor otherwise (a metric with
//!   grad on beside a training loop is not worth a finding).
//! - `graph_accumulated`: at a backward, the saved bytes of several forward passes from one
//!   line of the user's code are alive: the graphs of all micro-steps. Compared, as in
//!   [`super::accum`], with the same backward holding one pass's graph (backward every
//!   micro-step): [`Rules::accum_ratio`] and [`super::accum::MIN_GRAPH_BYTES`].
//! - `leak`: bytes allocated at one site of the user's code rise at every iteration boundary
//!   (after the first iteration, which warms up library workspaces): a growing floor.
//! - `cache_held`: after the program's peak, a later phase (forward passes that start after
//!   it) ran with the cache the peak left: what `empty_cache()` would return; or a user's
//!   `empty_cache()` that left reserved memory in segments with live blocks, which it cannot
//!   return. Info, as in [`super::cache`].
//!
//! Floors: a trace runs a few iterations of a program that may run many, on whatever card;
//! what matters is measured against the program's own footprint, [`Rules::floor`] of its
//! replayed peak reserved (5% of it, at least 4 MiB). Severities: [`by_cost`], the cause's
//! share of the peak above the model (the parameters and buffers).
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use vramroom_alloc::{AllocatorConfig, BlockState};
use vramroom_trace::replay::Session;
use vramroom_trace::{own_config, ReplayError, ReplayOptions, ReplayPlan, Snapshot};

use super::rules::{by_cost, mib, nums, Rules};
use crate::results::*;
use vramroom_alloc::human_bytes;

/// A place in the user's code.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TracedSite {
    pub file: String,
    pub line: u32,
    #[serde(default)]
    pub function: String,
}

/// Live bytes by category.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TracedCategories {
    pub parameter: u64,
    pub gradient: u64,
    pub optimizer_state: u64,
    pub saved_for_backward: u64,
    pub activation: u64,
}

/// The state at one moment of the trace (an iteration boundary, the peak).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TracedPoint {
    /// Index of the next trace entry (the snapshot's `device_traces[0]`).
    pub event: usize,
    pub allocated_bytes: u64,
    pub categories: TracedCategories,
    /// Saved for a backward that never runs (part of `saved_for_backward`).
    pub saved_no_backward_bytes: u64,
    /// Site index (as a string, JSON's keys) -> live bytes of activations made there (the
    /// largest sites; parameters, gradients, optimizer state and what autograd holds for a
    /// backward that never runs are not in them).
    pub sites: BTreeMap<String, u64>,
    /// Where the boundary was (an optimizer step's line).
    pub site: Option<usize>,
}

/// Forward passes of one line of the user's code whose saved tensors are alive at a backward.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TracedPasses {
    pub site: Option<usize>,
    /// Passes from that line with saved tensors alive.
    pub count: u32,
    pub bytes: u64,
    /// The most one of them holds.
    pub max_pass_bytes: u64,
}

/// One backward call.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TracedBackward {
    pub event: usize,
    pub end_event: Option<usize>,
    /// The `loss.backward()` line.
    pub site: Option<usize>,
    /// Where the tensor backward ran on was made (the line that summed the losses).
    pub root_site: Option<usize>,
    /// Saved for backward (all graphs) when it began.
    pub saved_bytes: u64,
    /// Terms the tensor backward ran on sums (through `+ - * /`) that were made in different
    /// forward passes' windows: the micro-steps' losses when they were summed; 1 when the
    /// passes feed one loss together (a two-tower contrastive loss). `None`: not measured.
    pub summed_losses: Option<u32>,
    pub allocated_bytes: u64,
    pub passes: Vec<TracedPasses>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TracedSiteBytes {
    pub site: Option<usize>,
    pub bytes: u64,
}

/// Saved tensors that no backward ever used, at their most.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TracedNoBackward {
    pub max_bytes: u64,
    pub event: usize,
    /// By forward pass line (else allocation line), largest first.
    pub sites: Vec<TracedSiteBytes>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TracedEmptyCache {
    pub event: usize,
    pub site: Option<usize>,
}

/// What the tracer measured (`SNAPSHOT.evidence.json`'s `evidence`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TracedEvidence {
    pub version: u32,
    /// Trace entries (the snapshot's).
    pub events: usize,
    pub sites: Vec<TracedSite>,
    pub allocated_peak: TracedPoint,
    /// The model: parameters and buffers at the peak.
    pub baseline_bytes: u64,
    /// Outermost module calls: `[start event, end event, site]`.
    pub forwards: Vec<(usize, usize, Option<usize>)>,
    pub backwards: Vec<TracedBackward>,
    pub saved_no_backward: TracedNoBackward,
    /// `optimizer_step`, `backward` or `forward`.
    pub boundary_kind: String,
    pub boundaries: Vec<TracedPoint>,
    pub empty_cache: Vec<TracedEmptyCache>,
}

impl TracedEvidence {
    /// Reads `{"evidence": {...}}` (the sidecar file) or the bare object.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        let v: serde_json::Value = serde_json::from_str(text)?;
        let inner = v.get("evidence").cloned().unwrap_or(v);
        serde_json::from_value(inner)
    }

    /// `file:line` of a site.
    pub fn at(&self, site: Option<usize>) -> String {
        match site.and_then(|i| self.sites.get(i)) {
            Some(s) => format!("{}:{}", s.file, s.line),
            None => "an unknown line".into(),
        }
    }
}

/// What the replay of the traced snapshot says, for the rules.
#[derive(Debug, Clone, Default)]
pub struct TracedReplay {
    pub capacity_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub num_ooms: i64,
    /// Allocated and reserved bytes after each trace entry (up to an OOM).
    pub allocated: Vec<u64>,
    pub reserved: Vec<u64>,
    /// Index -> bytes in segments with no live block after that entry (what
    /// `empty_cache()` would return), for the indices the rules asked for.
    pub releasable: BTreeMap<usize, u64>,
}

impl TracedReplay {
    fn at(&self, i: usize) -> Option<(u64, u64)> {
        Some((*self.allocated.get(i)?, *self.reserved.get(i)?))
    }
}

fn releasable_now(s: &Session) -> u64 {
    s.alloc
        .snapshot()
        .segments
        .iter()
        .filter(|g| g.blocks.iter().all(|b| b.state == BlockState::Inactive))
        .map(|g| g.total_size)
        .sum()
}

/// Replays the traced snapshot under `config`, keeping allocated and reserved after every
/// entry and what `empty_cache()` would return at the moments the rules look at.
pub fn replay_traced(
    snap: &Snapshot,
    config: &AllocatorConfig,
    capacity: Option<u64>,
    ev: &TracedEvidence,
) -> Result<TracedReplay, ReplayError> {
    let plan = ReplayPlan::new(snap, 0, &own_config(snap))?;
    let opts = ReplayOptions {
        config: config.clone(),
        capacity,
        stop_at_oom: true,
        ..ReplayOptions::default()
    };
    let mut out = TracedReplay::default();
    let mut s = Session::new(snap, &plan, &opts)?;
    let n = s.trace_len();
    out.capacity_bytes = s.capacity();
    for i in 0..n {
        s.run_to(i + 1)?;
        if s.oom().is_some() {
            break;
        }
        out.allocated.push(s.alloc.memory_allocated());
        out.reserved.push(s.alloc.memory_reserved());
    }
    // The moments cache_held looks at, replayed again to read the segments there.
    let mut want: Vec<usize> = ev
        .empty_cache
        .iter()
        .map(|e| e.event)
        .chain(later_phase(ev, &out).map(|p| p.at))
        .filter(|&i| i < out.allocated.len())
        .collect();
    want.sort_unstable();
    want.dedup();
    if !want.is_empty() {
        let mut s2 = Session::new(snap, &plan, &opts)?;
        for i in want {
            s2.run_to(i + 1)?;
            out.releasable.insert(i, releasable_now(&s2));
        }
    }
    let r = s.finish();
    out.peak_allocated_bytes = r.peak_allocated_bytes;
    out.peak_reserved_bytes = r.peak_reserved_bytes;
    out.num_ooms = r.num_ooms;
    Ok(out)
}

/// A finding in a traced program, with the line of the user's code it is about.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TracedFinding {
    #[serde(flatten)]
    pub finding: Finding,
    /// `file:line` of the user's code.
    pub location: String,
    pub file: String,
    pub line: u32,
}

fn located(ev: &TracedEvidence, site: Option<usize>, finding: Finding) -> TracedFinding {
    let s = site
        .and_then(|i| ev.sites.get(i))
        .cloned()
        .unwrap_or_default();
    TracedFinding {
        finding,
        location: ev.at(site),
        file: s.file,
        line: s.line,
    }
}

/// All findings for a traced program.
pub fn diagnose_traced(ev: &TracedEvidence, replay: &TracedReplay) -> Vec<TracedFinding> {
    diagnose_traced_with(ev, replay, &Rules::default())
}

pub fn diagnose_traced_with(
    ev: &TracedEvidence,
    replay: &TracedReplay,
    rules: &Rules,
) -> Vec<TracedFinding> {
    let floor = rules.floor(
        replay
            .peak_reserved_bytes
            .max(ev.allocated_peak.allocated_bytes),
    );
    let peak = replay
        .peak_allocated_bytes
        .max(ev.allocated_peak.allocated_bytes);
    let above = peak.saturating_sub(ev.baseline_bytes).max(1);
    let mut f = Vec::new();
    f.extend(autograd_in_inference(ev, above, floor, rules));
    f.extend(graph_accumulated(ev, above, rules));
    f.extend(leak(ev, replay, above, floor, rules));
    f.extend(cache_held(ev, replay, peak, floor, rules));
    f
}

fn autograd_in_inference(
    ev: &TracedEvidence,
    above: u64,
    floor: u64,
    rules: &Rules,
) -> Option<TracedFinding> {
    let nb = &ev.saved_no_backward;
    let act = nb.max_bytes;
    let trained = !ev.backwards.is_empty();
    if act == 0 || (trained && act < floor) {
        return None;
    }
    let share = (act as f64 / above as f64).min(1.0);
    let top = nb.sites.first();
    let site = top.and_then(|s| s.site);
    let passes = ev
        .forwards
        .iter()
        .filter(|p| p.2 == site && site.is_some())
        .count();
    let at_peak = ev.allocated_peak.saved_no_backward_bytes;
    let finding = Finding {
        id: FindingId::AutogradInInference,
        title: "Autograd was on during inference".into(),
        severity: by_cost(share, rules),
        evidence: format!(
            "{} of activations were saved for a backward pass that never runs ({:.0}% of the \
             peak above the model's {}); an inference forward under no_grad saves none. \
             Saved by the forward pass{} at {} ({}{}){}.",
            mib(act as f64),
            100.0 * share,
            mib(ev.baseline_bytes as f64),
            if passes == 1 { "" } else { "es" },
            ev.at(site),
            mib(top.map_or(act, |s| s.bytes) as f64),
            if passes > 1 {
                format!(", {passes} passes")
            } else {
                String::new()
            },
            if trained {
                "; the program's backward calls never used them"
            } else {
                "; the program never calls backward"
            }
        ),
        numbers: nums(&[
            ("activation_bytes_at_peak", at_peak as f64),
            ("activation_bytes_max", act as f64),
            ("peak_above_base_bytes", above as f64),
            ("share_of_peak_above_base", share),
            ("forward_passes", passes as f64),
        ]),
        fix: super::autograd::FIX.into(),
        predicted_saving_bytes: act,
    };
    Some(located(ev, site, finding))
}

fn graph_accumulated(ev: &TracedEvidence, above: u64, rules: &Rules) -> Option<TracedFinding> {
    // The backward whose graphs of repeated passes hold the most.
    let mut best: Option<(&TracedBackward, &TracedPasses, u64, u64, f64)> = None;
    for b in &ev.backwards {
        // Passes whose graphs feed one loss together are no accumulation: backward every
        // micro-step needs a loss per micro-step.
        if b.summed_losses.is_some_and(|n| n < 2) {
            continue;
        }
        for g in b.passes.iter().filter(|g| g.count >= 2) {
            let extra = g.bytes.saturating_sub(g.max_pass_bytes);
            let one = b.saved_bytes.saturating_sub(extra).max(1);
            let ratio = b.saved_bytes as f64 / one as f64;
            if ratio < rules.accum_ratio || extra < super::accum::MIN_GRAPH_BYTES {
                continue;
            }
            if best.is_none_or(|x| extra > x.2) {
                best = Some((b, g, extra, one, ratio));
            }
        }
    }
    let (b, g, extra, one, ratio) = best?;
    let n = g.count;
    let share = extra as f64 / above as f64;
    // The line to change: where the tensor backward ran on was made (the summed losses),
    // unless backward was called on the loss where it was computed.
    let site = if b.root_site.is_some() && b.root_site != b.site {
        b.root_site
    } else {
        b.site
    };
    let finding = Finding {
        id: FindingId::GraphAccumulated,
        title: "The autograd graph accumulated across micro-steps".into(),
        severity: by_cost(share, rules),
        evidence: format!(
            "At {n} micro-steps the step holds {} of activations saved for backward at its \
             peak; with backward every micro-step it holds {} ({ratio:.1}x): the graphs of all \
             micro-steps stay alive until the one backward. That is {} more ({:.0}% of the \
             peak above the model); it grows with the batch and the micro-steps. The {n} \
             forward passes at {} stay alive until the one backward at {}, called on the \
             tensor made at {}.",
            mib(b.saved_bytes as f64),
            mib(one as f64),
            mib(extra as f64),
            100.0 * share,
            ev.at(g.site),
            ev.at(b.site),
            ev.at(b.root_site),
        ),
        numbers: nums(&[
            ("activation_bytes_at_peak", b.saved_bytes as f64),
            ("activation_bytes_at_peak_backward_each", one as f64),
            ("accum_steps", n as f64),
            ("ratio", ratio),
            ("share_of_peak_above_base", share),
        ]),
        fix: super::accum::FIX.into(),
        predicted_saving_bytes: extra,
    };
    Some(located(ev, site, finding))
}

fn leak(
    ev: &TracedEvidence,
    replay: &TracedReplay,
    above: u64,
    floor: u64,
    rules: &Rules,
) -> Option<TracedFinding> {
    let bs = &ev.boundaries;
    let n = bs.len();
    if n < 3 {
        return None;
    }
    let mut keys: Vec<&String> = bs.iter().flat_map(|b| b.sites.keys()).collect();
    keys.sort();
    keys.dedup();
    // Sites whose bytes rise at every boundary after the first iteration; what they keep
    // per iteration, over all iterations.
    let mut grown: Vec<(usize, u64, u64)> = Vec::new(); // (site, per iteration, retained)
    for k in keys {
        let Ok(site) = k.parse::<usize>() else {
            continue;
        };
        let v: Vec<u64> = bs
            .iter()
            .map(|b| b.sites.get(k).copied().unwrap_or(0))
            .collect();
        if !v[1..].windows(2).all(|w| w[1] > w[0]) {
            continue;
        }
        let per = (v[n - 1] - v[1]) / (n as u64 - 2);
        grown.push((site, per, per * (n as u64 - 1)));
    }
    grown.sort_by(|a, b| b.2.cmp(&a.2));
    let retained: u64 = grown.iter().map(|g| g.2).sum();
    if retained < floor {
        return None;
    }
    let per_iter: u64 = grown.iter().map(|g| g.1).sum();
    let (first, last) = (&bs[0].categories, &bs[n - 1].categories);
    let cat_growth = [
        ("parameter", first.parameter, last.parameter),
        ("gradient", first.gradient, last.gradient),
        (
            "optimizer_state",
            first.optimizer_state,
            last.optimizer_state,
        ),
        (
            "saved_for_backward",
            first.saved_for_backward,
            last.saved_for_backward,
        ),
        ("activation", first.activation, last.activation),
    ];
    let grown_txt: Vec<String> = cat_growth
        .iter()
        .filter(|(_, a, b)| b > a)
        .map(|(c, a, b)| format!("{c} +{}", mib((b - a) as f64)))
        .collect();
    let share = retained as f64 / above as f64;
    let site = grown.first().map(|g| g.0);
    let others: Vec<String> = grown[1..]
        .iter()
        .take(3)
        .map(|g| format!("{} (+{}/iteration)", ev.at(Some(g.0)), human_bytes(g.1)))
        .collect();
    let kind = match ev.boundary_kind.as_str() {
        "optimizer_step" => "optimizer step",
        "backward" => "backward call",
        _ => "forward pass",
    };
    let mut numbers = nums(&[
        ("retained_bytes", retained as f64),
        ("floor_rise_bytes_per_iteration", per_iter as f64),
        ("iterations", n as f64),
        ("floor_bytes_first", bs[0].allocated_bytes as f64),
        ("floor_bytes_last", bs[n - 1].allocated_bytes as f64),
    ]);
    for (c, a, b) in &cat_growth {
        if b > a {
            numbers.insert(format!("grew_{c}_bytes"), (b - a) as f64);
        }
    }
    let finding = Finding {
        id: FindingId::Leak,
        title: "Memory leaks across iterations".into(),
        severity: if replay.num_ooms > 0 {
            Severity::Critical
        } else {
            by_cost(share, rules)
        },
        evidence: format!(
            "Allocated memory rises at every iteration boundary (each {kind}, {n} of them): the \
             floor rises {} per iteration, from {} to {}, and {} stays allocated from earlier \
             iterations at the last one ({:.0}% of the peak above the model). Made at {}{}, kept \
             across iterations. Grew: {}.",
            mib(per_iter as f64),
            mib(bs[0].allocated_bytes as f64),
            mib(bs[n - 1].allocated_bytes as f64),
            mib(retained as f64),
            100.0 * share,
            ev.at(site),
            if others.is_empty() {
                String::new()
            } else {
                format!(" (and {})", others.join(", "))
            },
            if grown_txt.is_empty() {
                "no single category".to_string()
            } else {
                grown_txt.join(", ")
            }
        ),
        numbers,
        fix: super::leak::FIX.into(),
        predicted_saving_bytes: retained,
    };
    Some(located(ev, site, finding))
}

/// The phase after the peak: forward passes that start once allocated memory has fallen
/// from its peak. `at`: the entry where that phase allocated the most; `recent`: that most.
struct LaterPhase {
    first_pass: usize,
    at: usize,
    recent: u64,
}

fn later_phase(ev: &TracedEvidence, replay: &TracedReplay) -> Option<LaterPhase> {
    let a = &replay.allocated;
    let (peak_i, _) = a
        .iter()
        .enumerate()
        .max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(&x.0)))?;
    // A later phase is other code (evaluation after training), not the same loop's later
    // iterations: forward passes from lines that made none before the peak.
    let before: Vec<Option<usize>> = ev
        .forwards
        .iter()
        .filter(|p| p.0 <= peak_i)
        .map(|p| p.2)
        .collect();
    let passes: Vec<usize> = (0..ev.forwards.len())
        .filter(|&i| {
            let p = ev.forwards[i];
            p.0 > peak_i && p.0 < a.len() && !before.contains(&p.2)
        })
        .collect();
    let first = *passes.first()?;
    let start = ev.forwards[first].0;
    let end = ev.forwards[*passes.last()?].1.min(a.len());
    if end <= start {
        return None;
    }
    let (at, recent) = (start..end)
        .map(|i| (i, a[i]))
        .max_by(|x, y| x.1.cmp(&y.1).then(y.0.cmp(&x.0)))?;
    Some(LaterPhase {
        first_pass: first,
        at,
        recent,
    })
}

fn cache_held(
    ev: &TracedEvidence,
    replay: &TracedReplay,
    peak: u64,
    floor: u64,
    rules: &Rules,
) -> Vec<TracedFinding> {
    let mut out = Vec::new();
    if let Some(p) = later_phase(ev, replay) {
        if let Some((alloc, reserved)) = replay.at(p.at) {
            let held = reserved.saturating_sub(alloc);
            let dropped = p.recent as f64 <= rules.load_drop * peak as f64;
            let excess = reserved.saturating_sub(p.recent);
            if dropped && excess >= floor && held >= floor {
                let releasable = replay.releasable.get(&p.at).copied().unwrap_or(held);
                let site = ev.forwards[p.first_pass].2;
                let finding = Finding {
                    id: FindingId::CacheHeld,
                    title: "The cache holds memory for a phase that is over".into(),
                    severity: Severity::Info,
                    evidence: format!(
                        "After the program's peak ({} allocated), the phase from {} on needs at \
                         most {} allocated, and the allocator still reserves {} with {} \
                         allocated: {} is cached but unused; empty_cache() would return {} to \
                         the device{}.",
                        mib(peak as f64),
                        ev.at(site),
                        mib(p.recent as f64),
                        mib(reserved as f64),
                        mib(alloc as f64),
                        mib(held as f64),
                        mib(releasable as f64),
                        if releasable + floor <= held {
                            format!(
                                " ({} stays in segments with live blocks, which it cannot \
                                 return)",
                                mib(held.saturating_sub(releasable) as f64)
                            )
                        } else {
                            String::new()
                        }
                    ),
                    numbers: nums(&[
                        ("reserved_bytes_at_rest", reserved as f64),
                        ("allocated_bytes_at_rest", alloc as f64),
                        ("cached_unused_bytes", held as f64),
                        ("empty_cache_returns_bytes", releasable as f64),
                        ("last_stage_recent_allocated_bytes", p.recent as f64),
                    ]),
                    fix: super::cache::FIX.into(),
                    predicted_saving_bytes: releasable,
                };
                out.push(located(ev, site, finding));
            }
        }
    }
    // A user's empty_cache() that could not return what the cache held.
    for e in &ev.empty_cache {
        let Some((alloc, reserved)) = replay.at(e.event) else {
            continue;
        };
        let held = reserved.saturating_sub(alloc);
        if held < floor {
            continue;
        }
        let finding = Finding {
            id: FindingId::CacheHeld,
            title: "empty_cache() could not return the cache".into(),
            severity: Severity::Info,
            evidence: format!(
                "After empty_cache() at {}, the allocator still reserves {} with {} allocated: \
                 {} is cached in segments that hold live blocks, which empty_cache() does not \
                 return (fragmentation).",
                ev.at(e.site),
                mib(reserved as f64),
                mib(alloc as f64),
                mib(held as f64)
            ),
            numbers: nums(&[
                ("reserved_bytes_after_empty_cache", reserved as f64),
                ("allocated_bytes_after_empty_cache", alloc as f64),
                ("cached_unused_bytes", held as f64),
            ]),
            fix: "Free (or move to the CPU) the tensors that outlive the phase before calling \
                  `torch.cuda.empty_cache()`, or set \
                  `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, under which empty_cache() \
                  unmaps the free pages of a segment that still holds live blocks."
                .into(),
            predicted_saving_bytes: 0,
        };
        out.push(located(ev, e.site, finding));
    }
    out
}

/// One line per finding: `severity id at file:line: title`.
pub fn traced_finding_lines(f: &[TracedFinding]) -> Vec<String> {
    f.iter()
        .map(|t| {
            format!(
                "{:<8} {} at {}: {}",
                format!("{:?}", t.finding.severity).to_lowercase(),
                t.finding.id.as_str(),
                t.location,
                t.finding.title
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn sites() -> Vec<TracedSite> {
        (0..6)
            .map(|i| TracedSite {
                file: "train.py".into(),
                line: 10 + i,
                function: "<module>".into(),
            })
            .collect()
    }

    fn base() -> TracedEvidence {
        TracedEvidence {
            version: 1,
            events: 1000,
            sites: sites(),
            baseline_bytes: 100 * MIB,
            allocated_peak: TracedPoint {
                allocated_bytes: 500 * MIB,
                ..TracedPoint::default()
            },
            boundary_kind: "optimizer_step".into(),
            ..TracedEvidence::default()
        }
    }

    fn replay() -> TracedReplay {
        TracedReplay {
            capacity_bytes: 80 << 30,
            peak_allocated_bytes: 500 * MIB,
            peak_reserved_bytes: 520 * MIB,
            ..TracedReplay::default()
        }
    }

    fn ids(f: &[TracedFinding]) -> Vec<(&'static str, Severity, String)> {
        f.iter()
            .map(|t| {
                (
                    t.finding.id.as_str(),
                    t.finding.severity,
                    t.location.clone(),
                )
            })
            .collect()
    }

    fn boundary(floor: u64, site: usize, kept: u64) -> TracedPoint {
        let mut sites = BTreeMap::new();
        sites.insert(site.to_string(), kept);
        sites.insert("5".into(), 32 * MIB);
        TracedPoint {
            allocated_bytes: floor + kept,
            sites,
            ..TracedPoint::default()
        }
    }

    #[test]
    fn a_clean_training_loop_has_no_finding() {
        let mut ev = base();
        ev.forwards = (0..4).map(|i| (i * 100, i * 100 + 40, Some(1))).collect();
        ev.backwards = (0..4)
            .map(|i| TracedBackward {
                event: i * 100 + 50,
                site: Some(2),
                root_site: Some(1),
                saved_bytes: 200 * MIB,
                passes: vec![TracedPasses {
                    site: Some(1),
                    count: 1,
                    bytes: 200 * MIB,
                    max_pass_bytes: 200 * MIB,
                }],
                ..TracedBackward::default()
            })
            .collect();
        ev.boundaries = (0..4).map(|_| boundary(300 * MIB, 1, 60 * MIB)).collect();
        assert!(diagnose_traced(&ev, &replay()).is_empty());
    }

    #[test]
    fn inference_under_autograd_names_the_forward_line() {
        let mut ev = base();
        ev.forwards = (0..4).map(|i| (i * 100, i * 100 + 40, Some(3))).collect();
        ev.saved_no_backward = TracedNoBackward {
            max_bytes: 300 * MIB,
            event: 400,
            sites: vec![TracedSiteBytes {
                site: Some(3),
                bytes: 300 * MIB,
            }],
        };
        let f = diagnose_traced(&ev, &replay());
        assert_eq!(
            ids(&f),
            vec![(
                "autograd_in_inference",
                Severity::Critical,
                "train.py:13".to_string()
            )]
        );
        assert!(f[0].finding.evidence.contains("train.py:13"), "{f:?}");
        assert_eq!(f[0].finding.predicted_saving_bytes, 300 * MIB);
    }

    #[test]
    fn a_little_saved_beside_a_training_loop_is_not_inference() {
        let mut ev = base();
        ev.backwards = vec![TracedBackward::default()];
        ev.saved_no_backward.max_bytes = MIB;
        assert!(diagnose_traced(&ev, &replay()).is_empty());
    }

    #[test]
    fn summed_losses_name_the_line_that_summed_them() {
        let mut ev = base();
        ev.backwards = vec![TracedBackward {
            event: 500,
            site: Some(4),
            root_site: Some(3),
            saved_bytes: 400 * MIB,
            passes: vec![TracedPasses {
                site: Some(2),
                count: 4,
                bytes: 400 * MIB,
                max_pass_bytes: 100 * MIB,
            }],
            ..TracedBackward::default()
        }];
        let f = diagnose_traced(&ev, &replay());
        assert_eq!(
            ids(&f),
            vec![(
                "graph_accumulated",
                Severity::Critical,
                "train.py:13".to_string()
            )]
        );
        let e = &f[0].finding;
        assert_eq!(e.predicted_saving_bytes, 300 * MIB);
        assert!((e.numbers["ratio"] - 4.0).abs() < 1e-9, "{e:?}");
        assert!(e.evidence.contains("train.py:12") && e.evidence.contains("train.py:14"));
    }

    #[test]
    fn passes_that_feed_one_loss_together_are_no_accumulation() {
        // Two towers (query and document) through one line, one contrastive loss.
        let mut ev = base();
        ev.backwards = vec![TracedBackward {
            site: Some(4),
            root_site: Some(3),
            saved_bytes: 400 * MIB,
            summed_losses: Some(1),
            passes: vec![TracedPasses {
                site: Some(2),
                count: 2,
                bytes: 400 * MIB,
                max_pass_bytes: 200 * MIB,
            }],
            ..TracedBackward::default()
        }];
        assert!(diagnose_traced(&ev, &replay()).is_empty());
        ev.backwards[0].summed_losses = Some(2);
        assert_eq!(diagnose_traced(&ev, &replay()).len(), 1);
    }

    #[test]
    fn kept_outputs_are_a_leak_at_their_line() {
        let mut ev = base();
        ev.boundaries = (1..=4)
            .map(|k| boundary(300 * MIB, 1, k * 60 * MIB))
            .collect();
        let f = diagnose_traced(&ev, &replay());
        assert_eq!(
            ids(&f),
            vec![("leak", Severity::Critical, "train.py:11".to_string())]
        );
        assert_eq!(f[0].finding.predicted_saving_bytes, 180 * MIB);
    }

    #[test]
    fn growth_in_the_first_iteration_only_is_warm_up() {
        let mut ev = base();
        let mut bs: Vec<TracedPoint> = (0..4).map(|_| boundary(300 * MIB, 1, 60 * MIB)).collect();
        bs[0] = boundary(300 * MIB, 1, 0);
        ev.boundaries = bs;
        assert!(diagnose_traced(&ev, &replay()).is_empty());
    }

    #[test]
    fn a_later_phase_under_the_peak_s_cache_is_cache_held() {
        let mut ev = base();
        // Training up to entry 50 (peak 400 MiB), then an evaluation pass at 60..80.
        ev.forwards = vec![(0, 30, Some(1)), (60, 80, Some(4))];
        let mut r = replay();
        r.allocated = (0..100u64)
            .map(|i| match i {
                0..=49 => 100 * MIB + i * 6 * MIB,
                50..=59 => 100 * MIB,
                _ => 150 * MIB,
            })
            .collect();
        r.reserved = vec![500 * MIB; 100];
        r.peak_allocated_bytes = 394 * MIB;
        r.peak_reserved_bytes = 500 * MIB;
        let f = diagnose_traced(&ev, &r);
        assert_eq!(
            ids(&f),
            vec![("cache_held", Severity::Info, "train.py:14".to_string())]
        );
        // After an empty_cache() the reserve is gone: nothing.
        r.reserved = r
            .allocated
            .iter()
            .map(|&a| if a <= 150 * MIB { 160 * MIB } else { 500 * MIB })
            .collect();
        assert!(diagnose_traced(&ev, &r).is_empty());
    }

    #[test]
    fn evidence_reads_the_sidecar_format() {
        let text = r#"{"evidence": {"version": 1, "events": 3, "sites": [{"file": "a.py", "line": 3, "function": "f"}],
            "allocated_peak": {"event": 1, "allocated_bytes": 10, "categories": {"parameter": 4}},
            "baseline_bytes": 4, "forwards": [[0, 2, 0]], "backwards": [], "boundary_kind": "forward",
            "boundaries": [{"event": 0, "allocated_bytes": 4, "categories": {}, "sites": {"0": 2}}],
            "saved_no_backward": {"max_bytes": 0, "event": 0, "sites": []}, "empty_cache": []}}"#;
        let ev = TracedEvidence::from_json(text).unwrap();
        assert_eq!(ev.at(Some(0)), "a.py:3");
        assert_eq!(ev.forwards, vec![(0, 2, Some(0))]);
        assert_eq!(ev.boundaries[0].sites["0"], 2);
    }
}
