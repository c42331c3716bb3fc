//! `graph_accumulated`: the autograd graph kept across gradient-accumulation micro-steps.
//!
//! Measured as a controlled experiment on the meta twin: the run's own training step at N
//! micro-steps, and the same step with backward every micro-step (the correct pattern), one
//! worker, inputs fixed at the distribution's largest size so that only the pattern
//! differs. A graph kept alive shows as activation bytes (saved for backward) that grow with
//! the micro-steps: N graphs at the peak instead of one. Weights, gradients and optimizer
//! state are the same in both probes, so they neither hide nor fake the signal (comparing
//! total peaks at 1 and N micro-steps did: the gradient buffers alone made a clean run grow,
//! and on a small batch the graphs were lost under the weights).
use std::sync::atomic::AtomicBool;

use tracing::{debug, warn};
use vramroom_alloc::AllocatorConfig;

use super::rules::{by_cost, nums, Rules};
use crate::results::*;
use crate::search::{probe, SearchAxis, SearchConfig};
use vramroom_alloc::human_bytes;
use vramroom_workload::{AccumPattern, InputDist, Mode, Scenario};

/// Activation bytes below this difference are allocator rounding, not a graph.
pub(crate) const MIN_GRAPH_BYTES: u64 = 16 << 10;

pub(super) fn graph_accumulated(
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
    let with = |pat: AccumPattern| -> Option<LoadPoint> {
        let mut sc = scenario.clone();
        sc.mode = Mode::Training {
            optimizer,
            accum_steps,
            pattern: pat,
        };
        sc.mistakes.sum_losses = pat == AccumPattern::Sum;
        sc.mistakes.keep_outputs = false;
        sc.input = InputDist::Fixed(scenario.input.max());
        match probe(&sc, SearchAxis::Concurrency, 1, 1 << 46, conf, &cfg, stop) {
            Ok(p) => Some(p),
            Err(e) => {
                warn!(error = %e, "accumulation probe failed");
                None
            }
        }
    };
    let pat = scenario.effective_pattern().unwrap_or(pattern);
    let run = with(pat)?;
    let each = if pat == AccumPattern::Each {
        run
    } else {
        with(AccumPattern::Each)?
    };
    let (act_run, act_each) = (run.peak_activation_bytes, each.peak_activation_bytes);
    let ratio = act_run as f64 / act_each.max(1) as f64;
    let extra_act = act_run.saturating_sub(act_each);
    debug!(act_run, act_each, ratio, "accumulation probes");
    if ratio < rules.accum_ratio || extra_act < MIN_GRAPH_BYTES {
        return None;
    }
    // What one worker's step would save, and so what the run's workers together would.
    let per_worker = run
        .peak_allocated_bytes
        .saturating_sub(each.peak_allocated_bytes)
        .max(extra_act);
    let workers = r.stages.iter().map(|s| s.concurrency).max().unwrap_or(1) as u64;
    let saving = per_worker.saturating_mul(workers.max(1));
    let share = saving as f64 / r.peaks.above_base_bytes.max(1) as f64;
    Some(Finding {
        id: FindingId::GraphAccumulated,
        title: "The autograd graph accumulated across micro-steps".into(),
        severity: by_cost(share, rules),
        evidence: format!(
            "At {accum_steps} micro-steps the step holds {} of activations saved for backward \
             at its peak; with backward every micro-step it holds {} ({ratio:.1}x): the graphs \
             of all micro-steps stay alive until the one backward. That is {} more per worker \
             ({} for the run's {workers} worker{}, {:.0}% of its peak above the model); it grows \
             with the batch and the micro-steps. Measured on the meta twin at the largest input \
             size, one worker.",
            human_bytes(act_run),
            human_bytes(act_each),
            human_bytes(per_worker),
            human_bytes(saving),
            if workers == 1 { "" } else { "s" },
            100.0 * share
        ),
        numbers: nums(&[
            ("activation_bytes_at_peak", act_run as f64),
            ("activation_bytes_at_peak_backward_each", act_each as f64),
            ("peak_bytes_n_steps", run.peak_allocated_bytes as f64),
            (
                "peak_bytes_n_steps_backward_each",
                each.peak_allocated_bytes as f64,
            ),
            ("accum_steps", accum_steps as f64),
            ("ratio", ratio),
            ("share_of_peak_above_base", share),
        ]),
        fix: FIX.into(),
        predicted_saving_bytes: saving,
    })
}

/// The fix, shared with the traced rule (traced.rs).
pub(crate) const FIX: &str =
    "Call `(loss / N).backward()` inside the micro-step loop instead of summing the \
    losses and calling backward once: gradients accumulate in `.grad`, graphs do not.";
