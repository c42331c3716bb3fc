//! Issue 31: one verdict for one seed and one stage list. Seeds 1–10 × three stage lists,
//! each run twice on the meta twin: the same headline, and the same critical findings (id).
//!
//! Not yet pinned: info and warning findings of a run whose stages are timed on the wall
//! clock. Measured: seed 1 at 1:100ms,4:100ms,16:100ms gave a fragmentation warning in one
//! run of two (how many requests overlap in 100 ms depends on the machine's load).

use std::time::Duration;

#[allow(dead_code)] // each test file uses part of what the tests share
mod common;

use common::run_it;
use vramroom_load::*;
use vramroom_workload::{DeviceChoice, Scenario};

fn stage_lists() -> Vec<Vec<Stage>> {
    let ms = Duration::from_millis;
    vec![
        vec![Stage::timed(1, ms(150)), Stage::timed(4, ms(150))],
        vec![Stage::timed(2, ms(100)), Stage::timed(8, ms(200))],
        vec![
            Stage::timed(1, ms(100)),
            Stage::timed(4, ms(100)),
            Stage::timed(16, ms(100)),
        ],
    ]
}

fn cfg(seed: u64, stages: Vec<Stage>) -> LoadConfig {
    let mut scenario = Scenario::default();
    scenario.seed = seed;
    LoadConfig {
        scenario,
        device: DeviceChoice::Meta,
        capacity: DEFAULT_CAPACITY,
        plan: LoadPlan::Stages(stages),
        search: Some(SearchConfig::default()),
        // The verdict's own search only: the what-if configs' searches repeat it per config.
        what_if: Vec::new(),
        ..Default::default()
    }
}

fn verdict_and_critical(r: &RunResult) -> (String, Vec<FindingId>) {
    let headline = r
        .oom_search
        .as_ref()
        .map(|s| s.headline.clone())
        .unwrap_or_default();
    let mut f: Vec<FindingId> = r
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .map(|f| f.id)
        .collect();
    f.sort_by_key(|id| id.as_str());
    (headline, f)
}

/// Each seed's three stage lists, each run twice: one verdict and one set of critical findings.
fn one_verdict_per_stage_list(seeds: std::ops::RangeInclusive<u64>) -> usize {
    let mut seen = 0;
    for seed in seeds {
        for (i, stages) in stage_lists().into_iter().enumerate() {
            let c = cfg(seed, stages);
            let a = verdict_and_critical(&run_it(&c));
            let b = verdict_and_critical(&run_it(&c));
            assert!(!a.0.is_empty(), "seed {seed}, stage list {i}: no verdict");
            assert_eq!(a, b, "seed {seed}, stage list {i}: two runs, two answers");
            seen += 1;
        }
    }
    seen
}

// Seeds 1-10 in two tests, so the harness runs the halves side by side (147 s as one test
// on two cores): the verdict must not depend on what else the machine runs either.
#[test]
fn seeds_one_to_five_by_three_stage_lists_give_one_verdict_each() {
    assert_eq!(one_verdict_per_stage_list(1..=5), 15);
}

#[test]
fn seeds_six_to_ten_by_three_stage_lists_give_one_verdict_each() {
    assert_eq!(one_verdict_per_stage_list(6..=10), 15);
}
