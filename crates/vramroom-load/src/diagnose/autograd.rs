//! `autograd_in_inference`: activations saved for a backward pass that never runs.
use super::rules::{by_cost, mib, nums, Rules};
use crate::results::*;
use vramroom_workload::Scenario;

pub(super) fn autograd_in_inference(
    r: &RunResult,
    scenario: &Scenario,
    rules: &Rules,
) -> Option<Finding> {
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
    // What it costs: the saved activations' share of the peak above the model (on
    // zoo-gpt-small most of it), whether or not this run happened to OOM.
    let share = (act as f64 / above).min(1.0);
    Some(Finding {
        id: FindingId::AutogradInInference,
        title: "Autograd was on during inference".into(),
        severity: by_cost(share, rules),
        evidence: format!(
            "{} of activations were saved for a backward pass that never runs ({:.0}% of the \
             peak above the model's {}); an inference forward under no_grad saves none.",
            mib(act as f64),
            100.0 * share,
            mib(r.baseline_bytes as f64)
        ),
        numbers: nums(&[
            ("activation_bytes_at_peak", at_peak as f64),
            ("activation_bytes_max", max_seen as f64),
            ("peak_above_base_bytes", r.peaks.above_base_bytes as f64),
            ("share_of_peak_above_base", share),
        ]),
        fix: FIX.into(),
        predicted_saving_bytes: act,
    })
}

/// The fix, shared with the traced rule (traced.rs).
pub(crate) const FIX: &str =
    "Run the forward under `with torch.no_grad():` (or `torch.inference_mode()`), \
    or decorate the handler with `@torch.no_grad()`.";
