//! Issue 18, steps 3 and 4: each planted mistake gets its own finding and no other critical
//! one, a clean run gets no critical finding, OOMs from real demand are not blamed on
//! fragmentation, severities follow the measured cost, and the what-if's own-config row
//! re-makes the run (peak reserved and OOMs), also when the history ring wrapped. All on
//! the meta twin, in a few seconds each.

use std::time::Duration;

mod common;

use common::{requests, run_it, MIB};
use vramroom_load::*;
use vramroom_workload::{AccumPattern, DeviceChoice, InputDist, OptimKind, Scenario};

fn cfg(scenario: Scenario, capacity: u64, plan: LoadPlan, search: bool) -> LoadConfig {
    LoadConfig {
        scenario,
        device: DeviceChoice::Meta,
        capacity,
        plan,
        search: search.then(SearchConfig::default),
        ..Default::default()
    }
}

fn infer(model: &str, batch: usize, input: &str) -> Scenario {
    Scenario::inference(model.parse().unwrap(), batch, input.parse().unwrap())
}

fn train(model: &str, input: InputDist, accum: usize, pattern: AccumPattern) -> Scenario {
    let mut s = Scenario::training(
        model.parse().unwrap(),
        4,
        input,
        OptimKind::Sgd,
        accum,
        pattern,
    );
    s.mistakes.sum_losses = pattern == AccumPattern::Sum;
    s
}

fn summary(r: &RunResult) -> String {
    r.findings
        .iter()
        .map(|f| format!("[{:?}] {:?}: {}", f.severity, f.id, f.evidence))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `id` is found, and no other finding is critical.
fn only(r: &RunResult, id: FindingId) -> &Finding {
    let f = r
        .findings
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("no {id:?}:\n{}", summary(r)));
    for o in r.findings.iter().filter(|f| f.id != id) {
        assert!(
            o.severity != Severity::Critical,
            "another critical finding beside {id:?}:\n{}",
            summary(r)
        );
    }
    f
}

fn no_critical(r: &RunResult) {
    assert!(
        r.findings.iter().all(|f| f.severity != Severity::Critical),
        "{}",
        summary(r)
    );
}

/// The what-if's own-config row is the run: same peak reserved, same OOM count.
fn what_if_agrees(r: &RunResult) {
    let own = &r.what_if[0];
    let ooms = r.final_memory_stats["num_ooms"];
    assert_eq!(r.what_if_check.source, "run log", "{:?}", r.what_if_check);
    assert_eq!(own.peak_reserved_bytes, r.peaks.reserved_bytes);
    assert_eq!(own.num_ooms, ooms);
    assert!(r.what_if_check.agrees, "{:?}", r.what_if_check);
    assert!(r.what_if_check.note.is_empty());
    assert!(r.what_if_check.summary().contains("agrees with the run"));
}

#[test]
fn grad_on_is_its_own_finding_on_every_model() {
    for (model, batch, input) in [
        ("zoo-gpt-small", 4, "uniform:16..128"),
        ("zoo-gpt-tiny", 4, "uniform:8..32"),
        ("mlp-small", 64, "1"),
        ("resnet18", 2, "64"),
    ] {
        let mut s = infer(model, batch, input);
        s.mistakes.grad_at_inference = true;
        let r = run_it(&cfg(s, 1 << 30, requests(2, 40), false));
        assert_eq!(r.errors.oom, 0, "{model}");
        let f = only(&r, FindingId::AutogradInInference);
        // The severity is the cost: the saved activations' share of the peak above the model.
        let share = f.numbers["share_of_peak_above_base"];
        let want = if share >= 0.25 {
            Severity::Critical
        } else if share >= 0.05 {
            Severity::Warning
        } else {
            Severity::Info
        };
        assert_eq!(f.severity, want, "{model}: {}", f.evidence);
        assert!(f.predicted_saving_bytes > 0, "{model}");
        what_if_agrees(&r);
    }
}

#[test]
fn grad_on_gpt2_small_is_critical_without_an_oom() {
    // The issue: autograd on at inference costs most of the activations; that is critical
    // whether or not this run happened to run out.
    let mut s = infer("zoo-gpt-small", 4, "uniform:16..128");
    s.mistakes.grad_at_inference = true;
    let r = run_it(&cfg(s, 128 * MIB, requests(4, 200), false));
    assert_eq!(r.errors.oom, 0);
    let f = only(&r, FindingId::AutogradInInference);
    assert_eq!(f.severity, Severity::Critical, "{}", f.evidence);
    assert!(f.numbers["share_of_peak_above_base"] >= 0.5, "{f:?}");
}

#[test]
fn kept_outputs_is_a_leak_not_fragmentation() {
    // The run: the leak fills the device and every later request OOMs. The leak is
    // critical; the OOM storm it causes is no evidence of fragmentation.
    let mut s = infer("zoo-gpt-small", 4, "uniform:16..128");
    s.mistakes.keep_outputs = true;
    let r = run_it(&cfg(s, 128 * MIB, requests(4, 300), true));
    assert!(r.errors.oom > 100, "{}", r.errors.oom);
    let f = only(&r, FindingId::Leak);
    assert_eq!(f.severity, Severity::Critical);
    assert!(
        !r.findings.iter().any(|f| f.id == FindingId::Fragmentation),
        "{}",
        summary(&r)
    );
    what_if_agrees(&r);
}

#[test]
fn summed_losses_are_seen_on_mlp_and_gpt2() {
    // The help's own example (mlp-small, batch 4, 4 micro-steps), and zoo-gpt-tiny at 2.
    for (model, input, accum) in [
        ("mlp-small", InputDist::Fixed(1), 4),
        ("zoo-gpt-tiny", "uniform:8..32".parse().unwrap(), 2),
    ] {
        let r = run_it(&cfg(
            train(model, input.clone(), accum, AccumPattern::Sum),
            128 * MIB,
            requests(2, 6),
            false,
        ));
        let f = only(&r, FindingId::GraphAccumulated);
        assert!(f.numbers["ratio"] >= 1.5, "{model}: {f:?}");
        assert!(f.predicted_saving_bytes > 0, "{model}");
        // The correct loop at the same micro-steps: no finding at all.
        let r = run_it(&cfg(
            train(model, input, accum, AccumPattern::Each),
            128 * MIB,
            requests(2, 6),
            false,
        ));
        assert!(r.findings.is_empty(), "{model}: {}", summary(&r));
    }
}

#[test]
fn clean_runs_have_no_critical_finding() {
    for (model, batch, input, capacity) in [
        ("zoo-gpt-small", 4, "uniform:16..128", 128 * MIB),
        ("zoo-gpt-tiny", 4, "uniform:8..32", 64 * MIB),
        ("mlp-small", 64, "1", 128 * MIB),
        ("resnet18", 2, "64", 1 << 30),
    ] {
        // The search only matters to OOMs (none here): run it on one model, to keep CI fast.
        let search = model == "zoo-gpt-small";
        let r = run_it(&cfg(
            infer(model, batch, input),
            capacity,
            requests(4, 80),
            search,
        ));
        assert_eq!(r.errors.oom, 0, "{model}");
        no_critical(&r);
        what_if_agrees(&r);
    }
}

#[test]
fn over_capacity_is_demand_not_fragmentation_and_the_what_if_agrees() {
    // 32 workers of zoo-gpt-small need ~160 MiB on a 128 MiB device: real demand.
    let mut c = cfg(
        infer("zoo-gpt-small", 4, "uniform:16..128"),
        128 * MIB,
        LoadPlan::Stages(vec![Stage::timed(32, Duration::from_millis(500))]),
        true,
    );
    c.what_if = vec!["expandable_segments:True".into()];
    let r = run_it(&c);
    assert!(r.errors.oom > 0);
    let f = only(&r, FindingId::OutOfMemory);
    assert_eq!(f.severity, Severity::Critical);
    assert!(
        f.numbers["demand_bytes"] > f.numbers["capacity_bytes"],
        "{f:?}"
    );
    let s = r.oom_search.as_ref().unwrap();
    assert!(s.observed_oom_load.unwrap() <= 32);
    what_if_agrees(&r);
    assert!(r.what_if[0].num_ooms > 0);
}

#[test]
fn what_if_agrees_after_the_history_ring_wrapped() {
    // A ring of 5,000 entries wraps within the first requests: the snapshot's trace starts
    // warm, but the what-if replays the run log from the empty allocator.
    let mut c = cfg(
        infer("zoo-gpt-small", 4, "uniform:16..128"),
        128 * MIB,
        requests(32, 300),
        false,
    );
    c.history_entries = 5_000;
    let r = run_it(&c);
    let trace = &r.snapshot.as_ref().unwrap().device_traces[0];
    assert_eq!(trace.len(), 5_000, "the ring did not wrap");
    assert!(r.what_if_check.events > 5_000);
    assert!(r.errors.oom > 0);
    what_if_agrees(&r);

    // A log too small for the run: the what-if falls back to the ring and says so.
    c.what_if_log_entries = 1_000;
    let r = run_it(&c);
    let chk = &r.what_if_check;
    assert_eq!(chk.source, "history ring");
    let same = r.what_if[0].peak_reserved_bytes == r.peaks.reserved_bytes
        && r.what_if[0].num_ooms == r.final_memory_stats["num_ooms"];
    assert_eq!(chk.agrees, same, "{chk:?}");
    if !chk.agrees {
        assert!(chk.note.contains("run log stopped"), "{}", chk.note);
        assert!(chk.summary().contains("DISAGREES"), "{}", chk.summary());
        // Unchecked rows are no evidence for fragmentation's severity.
        assert!(r
            .findings
            .iter()
            .all(|f| f.id != FindingId::Fragmentation || f.severity != Severity::Critical));
    }
}

#[test]
fn one_seed_one_verdict() {
    // The verdict comes from the searches only (the run's own what-if does not choose the
    // recommended config), so two runs of one seed print the same headline.
    let mut c = cfg(
        infer("zoo-gpt-small", 4, "uniform:16..128"),
        128 * MIB,
        requests(8, 40),
        true,
    );
    c.what_if = vec!["expandable_segments:True".into()];
    let a = run_it(&c).oom_search.unwrap();
    let b = run_it(&c).oom_search.unwrap();
    assert!(!a.headline.is_empty());
    assert_eq!(a.headline, b.headline);
    // A recommended config does better than the run's own: never fewer safe workers.
    if let Some(rec) = &a.recommended {
        assert!(
            rec.verified_safe_load >= a.verified_safe_load,
            "{}",
            a.headline
        );
    }
}

#[test]
fn grad_on_past_capacity_blames_the_mistake_not_the_load() {
    // zoo-gpt-small with grad on at 10 workers needs some 160 MiB; without the mistake it
    // would fit (about 66 MiB). The mistake is the one critical finding;
    // the over-capacity finding says to fix it first.
    let mut s = infer("zoo-gpt-small", 4, "uniform:16..128");
    s.mistakes.grad_at_inference = true;
    let mut c = cfg(
        s,
        128 * MIB,
        LoadPlan::Stages(vec![Stage::timed(10, Duration::from_millis(500))]),
        true,
    );
    c.what_if = vec![];
    let r = run_it(&c);
    assert!(r.errors.oom > 0);
    let f = only(&r, FindingId::AutogradInInference);
    assert_eq!(f.severity, Severity::Critical);
    let d = r
        .findings
        .iter()
        .find(|f| f.id == FindingId::OutOfMemory)
        .unwrap_or_else(|| panic!("{}", summary(&r)));
    assert_eq!(d.severity, Severity::Warning, "{}", d.evidence);
    assert!(d.evidence.contains("fix it first"), "{}", d.evidence);
}

#[test]
fn one_seed_one_diagnosis() {
    // The findings come from a timed run, but which causes they name and how severe they are
    // must not depend on the timing: three runs of the over-capacity scenario (OOMs under
    // 32 workers, the most timing-dependent run here) name the same findings at the same
    // severities. (CI once saw a critical "leak" with 0 B retained in one run of it.)
    let c = cfg(
        infer("zoo-gpt-small", 4, "uniform:16..128"),
        128 * MIB,
        LoadPlan::Stages(vec![Stage::timed(32, Duration::from_millis(500))]),
        true,
    );
    let verdict = |r: &RunResult| -> Vec<(FindingId, Severity)> {
        r.findings.iter().map(|f| (f.id, f.severity)).collect()
    };
    let first = run_it(&c);
    for _ in 0..2 {
        let again = run_it(&c);
        assert_eq!(
            verdict(&first),
            verdict(&again),
            "\n{}\n---\n{}",
            summary(&first),
            summary(&again)
        );
    }
}

/// Issue 31's acceptance: every planted mistake on every zoo model it applies to
/// (zoo-gpt-small, mlp-small, resnet18) finds its own finding and no other critical one,
/// and the same workload without the mistake has no critical finding. (`--grad-on` on every
/// model is `grad_on_is_its_own_finding_on_every_model`.)
#[test]
fn every_planted_mistake_on_every_zoo_model() {
    // (model, inference batch and input, training input, micro-steps and capacity):
    // mlp-small trains as the help's own example does (4 micro-steps of its fixed rows), and
    // resnet18's weights, gradients and momentum alone are over 128 MiB (on 1 GiB, its
    // graphs matter at full-size images).
    for (model, batch, input, rows, accum, train_cap) in [
        (
            "zoo-gpt-small",
            4,
            "uniform:16..128",
            "uniform:16..128",
            2,
            128 * MIB,
        ),
        ("mlp-small", 1024, "1024", "1", 4, 128 * MIB),
        ("resnet18", 8, "32", "224", 2, 1 << 30),
    ] {
        // Outputs kept across requests: a leak, seen at rest.
        let mut s = infer(model, batch, input);
        s.mistakes.keep_outputs = true;
        let r = run_it(&cfg(s, 128 * MIB, requests(2, 400), false));
        let f = only(&r, FindingId::Leak);
        assert!(f.predicted_saving_bytes > 0, "{model}");
        let clean = run_it(&cfg(
            infer(model, batch, input),
            128 * MIB,
            requests(2, 400),
            false,
        ));
        no_critical(&clean);

        // Summed losses over micro-steps: the graphs of all of them alive at once.
        let input: InputDist = rows.parse().unwrap();
        let r = run_it(&cfg(
            train(model, input.clone(), accum, AccumPattern::Sum),
            train_cap,
            requests(2, 6),
            false,
        ));
        let f = only(&r, FindingId::GraphAccumulated);
        assert!(f.numbers["ratio"] >= 1.5, "{model}: {f:?}");
        let r = run_it(&cfg(
            train(model, input, accum, AccumPattern::Each),
            train_cap,
            requests(2, 6),
            false,
        ));
        no_critical(&r);
        assert!(
            !r.findings.iter().any(|f| f.id == FindingId::Leak),
            "{model}: {}",
            summary(&r)
        );
    }
}

/// Leaks only when the workload holds memory at rest: the false leaks stay away
/// on timed stages like loadtest's default (resnet18 `--grad-on`, resnet18 training with
/// `--sum-losses`), and so does an OOM storm's memory in flight (resnet50 at 8 workers on
/// 128 MiB: every request runs out, and the storm's samples once filled the timeline, so
/// the last reading kept was in flight and read as held at rest).
#[test]
fn oom_unwinding_and_mistakes_that_hold_nothing_at_rest_are_no_leak() {
    let timed = |stages: &[(usize, u64)]| {
        LoadPlan::Stages(
            stages
                .iter()
                .map(|&(c, ms)| Stage::timed(c, Duration::from_millis(ms)))
                .collect(),
        )
    };
    let mut grad_on = infer("resnet18", 2, "64");
    grad_on.mistakes.grad_at_inference = true;
    let storm = infer("resnet50", 4, "224");
    for (name, s, capacity, plan) in [
        (
            "resnet18 --grad-on",
            grad_on,
            128 * MIB,
            timed(&[(1, 300), (4, 700)]),
        ),
        (
            "resnet18 train --sum-losses",
            train("resnet18", InputDist::Fixed(32), 2, AccumPattern::Sum),
            1 << 30,
            timed(&[(1, 300), (4, 700)]),
        ),
        ("resnet50 OOM storm", storm, 128 * MIB, timed(&[(8, 1000)])),
    ] {
        let r = run_it(&cfg(s, capacity, plan, false));
        assert!(
            !r.findings.iter().any(|f| f.id == FindingId::Leak),
            "{name}: {}",
            summary(&r)
        );
        if name.contains("storm") {
            assert!(r.errors.oom > 1000, "{name}: {} OOMs", r.errors.oom);
        }
    }
}
