//! Diagnosis: named causes of memory waste, each with evidence, a fix and a saving.
//!
//! The one diagnosis engine, for in-process runs ([`diagnose`]) and HTTP runs
//! ([`diagnose_service`], which `http::probe` calls): each rule lives in its own file here.
//!
//! Design note: every finding is decided from measurements, never from the scenario's
//! mistake switches — the switches only plant the mistake; the diagnosis must see it in the
//! numbers, as it would in a user's workload. Each rule has an absolute floor (bytes that
//! matter against the capacity) so that a clean run produces no findings, and each reports
//! a predicted saving measured the same way PyTorch users would measure it:
//!
//! - `autograd_in_inference`: activation-category bytes (saved for backward) at the peak of
//!   an inference run. With `no_grad` there are none, so the saving is exactly those bytes.
//! - `graph_accumulated`: activations saved for backward grow with the micro-steps. Meta
//!   probes of the run's training step at N micro-steps and of the same step with backward
//!   every micro-step, at the largest input; the saving is the difference, per worker.
//! - `leak`: allocated memory that stays after every request has finished (at rest, over
//!   the baseline), and the slope of allocated-memory floors over a steady stage; the
//!   categories that grew.
//! - `fragmentation`: segments reserved while the free cache held enough in the wrong
//!   pieces (with reserved far above allocated), alloc retries that did not end in an OOM,
//!   or a replayed config that needs materially less. The run's own trace is
//!   replayed under other allocator configs; the saving is the best one's peak reserved
//!   below the replay of the run's own config.
//! - `out_of_memory`: in a load test, the run's OOMs and what explains them: the demand
//!   the OOM search measured (its fit of peak reserved against load) at the run's
//!   concurrency, against the capacity (critical: the load is more than the device holds);
//!   OOMs that neither the demand, a leak nor fragmentation explains get a warning. In HTTP
//!   runs: the service's OOM counter rose, with the state the probe's OOM snapshot shows.
//!
//! Severities are set by measured cost, the cause's share of the run's peak above the
//! baseline ([`Rules::critical_share`], [`Rules::warning_share`]), never by whether the run
//! happened to OOM; the over-capacity finding is critical by nature. Fragmentation is
//! critical only when the replay shows another config avoiding a material share of the
//! OOMs; OOMs that demand or a leak explain are not blamed on it.
//! - `cache_held`: after the load fell, the cache still holds memory for a burst that is
//!   over; what `empty_cache()` would hand back (fully free segments) is the saving.
//! - `load_shed` (HTTP runs): the service answered 503 to part of the load, with its reason
//!   when it says one (admission metrics, `Retry-After`); critical when most was shed.

use std::sync::atomic::AtomicBool;

use vramroom_alloc::AllocatorConfig;

use crate::results::*;
use vramroom_workload::Scenario;

mod accum;
mod autograd;
mod cache;
mod fragmentation;
mod leak;
mod oom;
mod rules;
mod runlog;
mod shed;
mod traced;
mod whatif;

pub use oom::segment_state;
use rules::mib;
pub use rules::Rules;
pub use runlog::{LogReplay, RunLog};
pub use traced::*;
pub use whatif::{
    check as what_if_check, check_service as what_if_check_service, what_if, what_if_snapshot,
    what_if_table,
};

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
    f.extend(autograd::autograd_in_inference(r, scenario, rules));
    f.extend(accum::graph_accumulated(r, scenario, conf, stop, rules));
    let leak = leak::leak(r, rules);
    let demand = oom::over_capacity(r);
    // The OOMs' cause decides what is blamed for them: demand over the capacity, a leak,
    // or (only when the replay shows another config avoids them) fragmentation.
    let (leaks, over) = (leak.is_some(), demand.is_some());
    f.extend(leak);
    f.extend(fragmentation::fragmentation(r, rules, leaks, over));
    f.extend(demand.map(|d| blame_the_mistake(d, &f)));
    f.extend(oom::unexplained_ooms(r, &f));
    f.extend(cache::cache_held(r, rules));
    f
}

/// Demand over the capacity that a critical mistake's own saving would bring back under
/// it is that mistake's doing: the over-capacity finding then says so and is a warning,
/// so the mistake stays the one critical finding.
fn blame_the_mistake(mut demand: Finding, found: &[Finding]) -> Finding {
    let excess = demand.predicted_saving_bytes;
    let culprit = found.iter().find(|f| {
        f.severity == Severity::Critical
            && matches!(
                f.id,
                FindingId::AutogradInInference | FindingId::GraphAccumulated | FindingId::Leak
            )
            && f.predicted_saving_bytes >= excess
    });
    if let Some(c) = culprit {
        demand.severity = Severity::Warning;
        demand.evidence.push_str(&format!(
            " The critical finding `{}` saves {}, more than the {} the demand is over: fix \
             it first.",
            c.id.as_str(),
            mib(c.predicted_saving_bytes as f64),
            mib(excess as f64)
        ));
    }
    demand
}

/// The findings of a finished HTTP run: the service is seen through its metrics and the
/// probe's snapshots, so only the rules that need no workload apply (out of memory,
/// fragmentation, cache held), with the same ids, floors and wording.
pub fn diagnose_service(r: &RunResult) -> Vec<Finding> {
    let rules = Rules::default();
    let floor = rules.floor(r.capacity_bytes);
    let mut f = Vec::new();
    f.extend(oom::out_of_memory(r));
    f.extend(fragmentation::service_fragmentation(r, floor));
    f.extend(cache::service_cache_held(r, &rules));
    f.extend(shed::load_shed(r));
    f
}
