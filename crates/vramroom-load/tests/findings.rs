//! Every finding both ways: it fires with its planted mistake and stays silent on the
//! clean scenario. All on the meta device (same allocations as cpu, no compute).

mod common;

use common::{requests, run_it, MIB};
use vramroom_load::*;
use vramroom_workload::{AccumPattern, DeviceChoice, InputDist, OptimKind, Scenario};

fn clean() -> Scenario {
    Scenario::inference("mlp-small".parse().unwrap(), 256, InputDist::Fixed(256))
}

fn cfg(scenario: Scenario, plan: LoadPlan) -> LoadConfig {
    LoadConfig {
        scenario,
        device: DeviceChoice::Meta,
        capacity: 128 * MIB,
        plan,
        search: None,
        what_if: vec![],
        history_entries: 20_000,
        ..Default::default()
    }
}

fn ids(r: &RunResult) -> Vec<FindingId> {
    r.findings.iter().map(|f| f.id).collect()
}

fn finding(r: &RunResult, id: FindingId) -> &Finding {
    r.findings
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("no {id:?} in {:?}; peaks {:?}", ids(r), r.peaks))
}

#[test]
fn clean_inference_has_no_findings() {
    let r = run_it(&cfg(clean(), requests(4, 400)));
    assert_eq!(r.requests.ok, 400);
    assert_eq!(r.errors.oom, 0);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert_eq!(r.peaks.categories_at_peak.activation, 0);
}

#[test]
fn named_temporaries_is_not_a_finding() {
    // The myth: named locals instead of chained calls. It may hold more for a deep model,
    // but it is no leak, no autograd, no fragmentation.
    let mut s = clean();
    s.mistakes.named_temporaries = true;
    let r = run_it(&cfg(s, requests(4, 200)));
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

#[test]
fn autograd_at_inference_fires() {
    let mut s = clean();
    s.mistakes.grad_at_inference = true;
    let r = run_it(&cfg(s, requests(4, 200)));
    let f = finding(&r, FindingId::AutogradInInference);
    assert!(f.predicted_saving_bytes >= MIB, "{f:?}");
    assert!(f.fix.contains("no_grad"));
    assert_eq!(ids(&r), vec![FindingId::AutogradInInference]);
}

#[test]
fn kept_outputs_leak_fires() {
    let mut s = clean();
    s.mistakes.keep_outputs = true;
    s.batch = 1024;
    s.input = InputDist::Fixed(1024);
    // 40 KiB of logits kept per request.
    let r = run_it(&cfg(s, requests(2, 600)));
    let f = finding(&r, FindingId::Leak);
    assert!(f.predicted_saving_bytes >= 20 * MIB, "{f:?}");
    assert!(f.numbers["retained_bytes_per_request"] >= 40_000.0, "{f:?}");
    assert!(f.evidence.contains("temporary"), "{}", f.evidence);
}

fn train(pattern: AccumPattern) -> Scenario {
    Scenario::training(
        "mlp-small".parse().unwrap(),
        512,
        InputDist::Fixed(512),
        OptimKind::Sgd,
        4,
        pattern,
    )
}

#[test]
fn summed_losses_fire_graph_accumulated() {
    let r = run_it(&cfg(train(AccumPattern::Sum), requests(1, 3)));
    let f = finding(&r, FindingId::GraphAccumulated);
    assert!(f.numbers["ratio"] >= 1.5, "{f:?}");
    assert!(f.predicted_saving_bytes >= 4 * MIB, "{f:?}");
    // The mistake switch forces the pattern too.
    let mut s = train(AccumPattern::Each);
    s.mistakes.sum_losses = true;
    let r = run_it(&cfg(s, requests(1, 3)));
    finding(&r, FindingId::GraphAccumulated);
}

#[test]
fn backward_each_micro_step_is_clean() {
    let r = run_it(&cfg(train(AccumPattern::Each), requests(2, 6)));
    assert_eq!(r.requests.ok, 6);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

fn variable_gpt2() -> Scenario {
    Scenario::inference(
        "zoo-gpt-small".parse().unwrap(),
        16,
        "uniform:16..128".parse().unwrap(),
    )
}

#[test]
fn variable_lengths_fire_fragmentation_with_what_if() {
    // One worker: which of several threads wins the race for the next request number is
    // not under the virtual clock's control, so with eight workers the peak ratio varied
    // between 1.37 and 2.0 from run to run and the test flaked. A single stream of variable
    // lengths fragments the cache on its own, as PyTorch's single-stream measurement shows.
    let mut c = cfg(variable_gpt2(), requests(1, 400));
    c.what_if = vec!["expandable_segments:True".into()];
    let r = run_it(&c);
    let f = finding(&r, FindingId::Fragmentation);
    assert!(f.numbers["reserved_over_allocated"] >= 1.25, "{f:?}");
    assert_eq!(r.what_if.len(), 2);
    assert_eq!(r.what_if[0].alloc_conf, "");
    assert!(r.what_if.iter().all(|w| w.peak_allocated_bytes > 0));
    assert!(!ids(&r).contains(&FindingId::Leak), "{:?}", ids(&r));
}

#[test]
fn clean_run_with_what_if_does_not_fragment() {
    // The what-if table shows expandable segments reserving less (the model's 4 MiB weight
    // sits in a 20 MiB segment), but nothing was reserved for want of usable free cache.
    let mut c = cfg(clean(), requests(4, 200));
    c.what_if = vec!["expandable_segments:True".into()];
    let r = run_it(&c);
    assert_eq!(r.what_if.len(), 2);
    assert_eq!(r.peaks.fragmented_segment_bytes, 0);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

#[test]
fn cache_held_after_a_burst_fires() {
    // 16 workers, then 1: the cache keeps the burst's segments.
    let plan = LoadPlan::Stages(vec![
        Stage::counted(16, 10),
        Stage::timed(1, std::time::Duration::from_millis(300)),
    ]);
    let r = run_it(&cfg(clean(), plan));
    let f = finding(&r, FindingId::CacheHeld);
    assert!(f.predicted_saving_bytes >= 8 * MIB, "{f:?}");
    assert!(f.fix.contains("empty_cache"));
    // Rising load only: silent.
    let plan = LoadPlan::Stages(vec![Stage::counted(1, 20), Stage::counted(16, 10)]);
    let r = run_it(&cfg(clean(), plan));
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}
