//! Acceptance: the OOM concurrency the meta search predicts is the one a cpu ramp observes
//! under the same capacity, within one step.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use vramroom_alloc::AllocatorConfig;
use vramroom_load::*;
use vramroom_workload::{DeviceChoice, InputDist, ModelSpec, Scenario, ZooModel};

fn scenario() -> Scenario {
    // Wide inputs into a small MLP with autograd left on (so the input is saved for
    // backward): each request holds its 8 MiB input for all of its life, like an image
    // service whose inputs dominate, so memory grows by one input per request in flight.
    let mut s = Scenario::inference(
        ModelSpec::Zoo(ZooModel::Mlp {
            sizes: vec![4096, 64, 10],
        }),
        512,
        InputDist::Fixed(512),
    );
    s.mistakes.grad_at_inference = true;
    s
}

fn cpu_ramp(capacity: u64) -> RunResult {
    let cfg = LoadConfig {
        scenario: scenario(),
        device: DeviceChoice::Cpu,
        capacity,
        plan: LoadPlan::RampUntilOom {
            start: 1,
            step: RampStep::Add(1),
            stage: Stage::counted(1, 6),
            max_concurrency: 64,
            time_limit: Duration::from_secs(60),
        },
        search: None,
        diagnose: false,
        what_if: vec![],
        history_entries: 1000,
        ..Default::default()
    };
    run(&cfg, Arc::new(AtomicBool::new(false)), |_| {}).unwrap()
}

#[test]
fn meta_search_matches_cpu_ramp() {
    for capacity in [48u64 << 20, 80 << 20] {
        let cpu = cpu_ramp(capacity);
        assert_eq!(
            cpu.stop_reason,
            StopReason::OomFound,
            "cpu ramp never OOMed"
        );
        let observed = cpu.ooms.first().map(|o| o.concurrency).unwrap();
        let search = oom_search(
            &scenario(),
            capacity,
            &AllocatorConfig::default(),
            &SearchConfig {
                requests_per_worker: 6,
                ..Default::default()
            },
            &AtomicBool::new(false),
        )
        .unwrap();

        let meta = search.observed_oom_load.unwrap();
        let predicted = search.predicted_oom_load.unwrap();
        eprintln!(
            "capacity {} MiB: cpu OOM at {observed}, meta verified {meta}, fit {predicted} (b = {} KiB/request)",
            capacity >> 20,
            search.marginal_bytes_per_unit >> 10
        );
        assert!(
            meta.abs_diff(observed) <= 1,
            "meta {meta} vs cpu {observed} at {} MiB",
            capacity >> 20
        );
        assert!(search.verified_safe_load.unwrap() < meta);
        assert!(search.fit.b > 0.0);
    }
}
