//! `graph_accumulated`: the autograd graph kept across gradient-accumulation micro-steps.
use std::sync::atomic::AtomicBool;

use headroom_alloc::AllocatorConfig;
use tracing::{debug, warn};

use super::{mib, nums, Rules};
use crate::results::*;
use crate::search::{probe, SearchAxis, SearchConfig};
use headroom_workload::{AccumPattern, Mode, Scenario};

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
