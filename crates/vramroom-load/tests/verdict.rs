//! Acceptance of the OOM verdict (issue 18): the search on the meta twin is deterministic
//! for a seed, and where its fit of peak reserved crosses the capacity is within one load
//! step or 10% of the first OOM it observes under that capacity, on the default scenario
//! and on three others.

use std::sync::atomic::AtomicBool;

use vramroom_alloc::AllocatorConfig;
use vramroom_load::*;
use vramroom_workload::{AccumPattern, InputDist, ModelSpec, OptimKind, Scenario, ZooModel};

fn search(sc: &Scenario, capacity: u64) -> OomSearch {
    let mut s = oom_search(
        sc,
        capacity,
        &AllocatorConfig::default(),
        &SearchConfig::default(),
        &AtomicBool::new(false),
    )
    .unwrap();
    s.headline = s.headline();
    s
}

fn scenarios() -> Vec<(&'static str, Scenario, u64)> {
    let mlp = |sizes: Vec<usize>| ModelSpec::Zoo(ZooModel::Mlp { sizes });
    let mut grad_on = Scenario::inference(mlp(vec![1024, 512, 10]), 64, InputDist::Fixed(64));
    grad_on.mistakes.grad_at_inference = true;
    vec![
        ("default", Scenario::default(), DEFAULT_CAPACITY),
        (
            "mlp inference, variable batch rows",
            Scenario::inference(
                mlp(vec![1024, 2048, 10]),
                32,
                InputDist::Uniform { lo: 32, hi: 256 },
            ),
            96 << 20,
        ),
        ("mlp inference, grad on", grad_on, 96 << 20),
        (
            "mlp training, adamw",
            Scenario::training(
                mlp(vec![512, 1024, 10]),
                64,
                InputDist::Fixed(64),
                OptimKind::AdamW,
                1,
                AccumPattern::Each,
            ),
            128 << 20,
        ),
    ]
}

#[test]
fn one_seed_one_verdict() {
    let sc = Scenario::default();
    let a = search(&sc, DEFAULT_CAPACITY);
    let b = search(&sc, DEFAULT_CAPACITY);
    eprintln!("{}", a.headline);
    assert_eq!(a.headline, b.headline);
    assert_eq!(a.predicted_oom_load, b.predicted_oom_load);
    assert_eq!(a.points, b.points);
    assert_eq!(a.bisection, b.bisection);
    assert!(a.headline.contains(&format!(
        "safe concurrency {}",
        a.verified_safe_load.unwrap()
    )));
}

#[test]
fn predicted_oom_is_within_a_step_of_the_observed() {
    for (name, sc, cap) in scenarios() {
        let s = search(&sc, cap);
        eprintln!(
            "{name}: predicted {:?} observed {:?} safe {:?} (fit {:.1} MiB + {:.2} MiB/worker, R² {:.3}) — {}",
            s.predicted_oom_load,
            s.observed_oom_load,
            s.verified_safe_load,
            s.fit.a / 1048576.0,
            s.fit.b / 1048576.0,
            s.fit.r2,
            s.headline
        );
        assert_eq!(s.metric, "peak_reserved");
        let (p, o) = (s.predicted_oom_load.unwrap(), s.observed_oom_load.unwrap());
        assert!(
            p.abs_diff(o) <= 1 || (p.abs_diff(o) as f64) <= 0.1 * o as f64,
            "{name}: predicted {p}, observed {o}"
        );
        let safe = s.verified_safe_load.unwrap();
        assert!(safe < o, "{name}: safe {safe} not below the first OOM {o}");
        // the probe at the safe load stays within the budget it promises
        let at_safe = s.bisection.iter().find(|q| q.load == safe);
        if let Some(q) = at_safe {
            assert!(!q.oom && q.peak_reserved_bytes <= s.budget_bytes, "{name}");
        }
    }
}
