//! The runner: load plans, OOM handling, cancellation, thresholds, errors, the JSON.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vramroom_load::*;
use vramroom_workload::{
    AccumPattern, DeviceChoice, InputDist, ModelSpec, OptimKind, Scenario, MAX_STAGES, MAX_WORKERS,
};

const MIB: u64 = 1 << 20;

fn small() -> Scenario {
    Scenario::inference("mlp-small".parse().unwrap(), 256, InputDist::Fixed(256))
}

fn base(plan: LoadPlan) -> LoadConfig {
    LoadConfig {
        scenario: small(),
        device: DeviceChoice::Meta,
        capacity: 128 * MIB,
        plan,
        search: None,
        what_if: vec![],
        history_entries: 10_000,
        ..Default::default()
    }
}

fn go(c: &LoadConfig) -> RunResult {
    run(c, Arc::new(AtomicBool::new(false)), |_| {}).unwrap()
}

#[test]
fn fixed_request_count_is_exact() {
    let r = go(&base(LoadPlan::Requests {
        concurrency: 3,
        total: 50,
    }));
    assert_eq!(r.requests.total, 50);
    assert_eq!(r.requests.ok, 50);
    assert_eq!(r.requests.items, 50 * 256);
    assert_eq!(r.latency.count, 50);
    assert!(r.latency.p50_ms <= r.latency.p90_ms && r.latency.p99_ms <= r.latency.p999_ms);
    assert_eq!(r.stop_reason, StopReason::Completed);
    assert_eq!(r.by_concurrency.len(), 1);
    assert!(r.peaks.allocated_bytes > r.baseline_bytes);
    assert!(r.timeline.len() >= 2);
    assert!(r.snapshot.is_some());
    assert_eq!(r.load.mode, "requests");
}

#[test]
fn stages_are_timed_and_reported_per_concurrency() {
    let plan = LoadPlan::Stages(parse_stages("1:150ms,4:150ms,2:150ms").unwrap());
    let r = go(&base(plan));
    assert_eq!(r.stages.len(), 3);
    assert_eq!(
        r.stages.iter().map(|s| s.concurrency).collect::<Vec<_>>(),
        vec![1, 4, 2]
    );
    // A timed stage lasts its time whether or not the scheduler let a request finish in
    // it (CI's two cores run this binary's other tests beside it): every request is
    // counted in the stage it started in, and in exactly one.
    for s in &r.stages {
        assert!(s.end_s - s.start_s >= 0.14, "{s:?}");
    }
    assert_eq!(
        r.stages.iter().map(|s| s.requests.total).sum::<u64>(),
        r.requests.total
    );
    assert!(r.requests.ok > 0, "{:?}", r.requests);
    assert_eq!(
        r.by_concurrency
            .iter()
            .map(|c| c.concurrency)
            .collect::<Vec<_>>(),
        vec![1, 2, 4]
    );
    // The timeline covers the stages and is sorted.
    assert!(r.timeline.windows(2).all(|w| w[0].t_s <= w[1].t_s));
    assert!(r.timeline.iter().any(|s| s.kind == SampleKind::Peak));
    assert!(r
        .timeline
        .iter()
        .any(|s| s.stage == 1 && s.concurrency == 4));
    // The category breakdown at the peak adds up to about the peak (blocks being freed at
    // that moment are already out of the categories).
    let cat = r.peaks.categories_at_peak.total();
    assert!(cat <= r.peaks.allocated_bytes);
    assert!(
        cat as f64 >= 0.7 * r.peaks.allocated_bytes as f64,
        "{cat} vs {:?}",
        r.peaks
    );
}

#[test]
fn counted_stages_each_run_their_own_requests() {
    // A stage that ends on its count cannot end before its requests complete, so each has
    // requests of its own however slow the machine: 5 per worker is more than the 4 that
    // can still be in flight from the stage before.
    let counted = |w: usize| Stage {
        requests_per_worker: Some(5),
        ..Stage::held(vramroom_workload::stages::StageLoad::Workers(w), None)
    };
    let r = go(&base(LoadPlan::Stages(vec![
        counted(1),
        counted(4),
        counted(2),
    ])));
    assert_eq!(r.stop_reason, StopReason::Completed);
    assert_eq!(
        r.stages.iter().map(|s| s.concurrency).collect::<Vec<_>>(),
        vec![1, 4, 2]
    );
    for s in &r.stages {
        assert!(s.requests.ok > 0, "{s:?}");
    }
    assert_eq!(
        r.stages.iter().map(|s| s.requests.total).sum::<u64>(),
        r.requests.total
    );
    assert!(r.requests.total >= 5 * (1 + 4 + 2));
}

#[test]
fn an_oom_fails_one_request_and_the_rest_go_on() {
    // Grad on: every request holds ~5 MiB of activations; 40 MiB fits a few at once.
    let mut c = base(LoadPlan::Requests {
        concurrency: 12,
        total: 120,
    });
    c.scenario.mistakes.grad_at_inference = true;
    c.capacity = 40 * MIB;
    let r = go(&c);
    assert!(r.errors.oom > 0, "no OOM at 12 workers in 40 MiB");
    assert!(r.requests.ok > 0, "every request failed");
    assert_eq!(r.requests.ok + r.requests.oom, 120);
    assert_eq!(r.errors.oom, r.requests.oom);
    let o = &r.ooms[0];
    assert!(o.message.contains("out of memory"), "{}", o.message);
    assert!(
        o.memory_summary.contains("PyTorch CUDA memory summary"),
        "{}",
        o.memory_summary
    );
    assert!(o.memory_stats.contains_key("num_ooms"));
    assert!(r.oom_snapshot.is_some());
    assert!(r.timeline.iter().any(|s| s.kind == SampleKind::Oom));
    assert!(r.ooms.len() <= MAX_OOM_RECORDS);
}

#[test]
fn ramp_until_oom_stops_at_the_first_oom() {
    let mut c = base(LoadPlan::RampUntilOom {
        start: 1,
        step: RampStep::Mul(2),
        stage: Stage::counted(1, 4),
        max_concurrency: 256,
        time_limit: Duration::from_secs(20),
    });
    c.scenario.mistakes.grad_at_inference = true;
    c.capacity = 64 * MIB;
    let r = go(&c);
    assert_eq!(r.stop_reason, StopReason::OomFound);
    let cs: Vec<usize> = r.stages.iter().map(|s| s.concurrency).collect();
    assert!(cs.windows(2).all(|w| w[1] == 2 * w[0]), "{cs:?}");
    // The failing request started in the last stage or, still in flight at the switch, in
    // the one before.
    let last = *cs.last().unwrap();
    assert!(
        r.ooms[0].concurrency == last || 2 * r.ooms[0].concurrency == last,
        "{cs:?}"
    );
}

#[test]
fn ramp_is_bounded_in_time() {
    let c = base(LoadPlan::RampUntilOom {
        start: 1,
        step: RampStep::Add(1),
        stage: Stage::timed(1, Duration::from_secs(10)),
        max_concurrency: 4,
        time_limit: Duration::from_millis(300),
    });
    let t = Instant::now();
    let r = go(&c);
    assert_eq!(r.stop_reason, StopReason::TimeLimit);
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn cancellation_returns_what_was_measured() {
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let mut c = base(LoadPlan::Stages(vec![Stage::timed(
        2,
        Duration::from_secs(30),
    )]));
    c.search = Some(SearchConfig::default());
    let t = Instant::now();
    let mut progressed = 0;
    let r = run(&c, stop, |p| {
        progressed += 1;
        if p.phase == "load" && p.requests_done > 20 {
            s2.store(true, Ordering::Relaxed); // Ctrl-C
        }
    })
    .unwrap();
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(r.stop_reason, StopReason::Cancelled);
    assert!(r.requests.ok > 20);
    assert!(r.oom_search.is_none(), "the search runs only on a full run");
    assert!(progressed > 0);
}

#[test]
fn thresholds_pass_and_fail() {
    let mut c = base(LoadPlan::Requests {
        concurrency: 2,
        total: 20,
    });
    c.thresholds = parse_thresholds(&[
        "peak_reserved<1GiB",
        "p99<10s",
        "oom_count==0",
        "error_rate<1%",
    ])
    .unwrap();
    let r = go(&c);
    assert!(r.thresholds_passed(), "{:#?}", r.thresholds);
    c.thresholds = parse_thresholds(&["peak_reserved<1MiB", "p99<10s"]).unwrap();
    let r = go(&c);
    assert!(!r.thresholds_passed());
    assert!(!r.thresholds[0].passed && r.thresholds[1].passed);
    assert_eq!(r.thresholds[0].unit, "bytes");
    assert!(r.thresholds[0].actual.unwrap() > MIB as f64);
    // A metric the run lacks fails its gate.
    c.thresholds = parse_thresholds(&["safe_concurrency>=1"]).unwrap();
    assert!(!go(&c).thresholds_passed());
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let mut c = base(LoadPlan::Requests {
        concurrency: 1,
        total: 1,
    });
    c.capacity = 0;
    let e = run(&c, Arc::new(AtomicBool::new(false)), |_| {}).unwrap_err();
    assert!(matches!(e, LoadError::Config(_)), "{e}");
    c.capacity = 64 * MIB;
    c.alloc_conf = "expandable_segments:Maybe".into();
    assert!(matches!(
        run(&c, Arc::new(AtomicBool::new(false)), |_| {}).unwrap_err(),
        LoadError::AllocConf(_)
    ));
    c.alloc_conf.clear();
    c.scenario.batch = 0;
    assert!(matches!(
        run(&c, Arc::new(AtomicBool::new(false)), |_| {}).unwrap_err(),
        LoadError::Workload(vramroom_workload::WorkloadError::Scenario(_))
    ));
    // The model alone does not fit.
    let mut c = base(LoadPlan::Requests {
        concurrency: 1,
        total: 1,
    });
    c.scenario.model = "mlp".parse().unwrap();
    c.capacity = 16 * MIB;
    let e = run(&c, Arc::new(AtomicBool::new(false)), |_| {}).unwrap_err();
    assert!(
        matches!(
            e,
            LoadError::Workload(vramroom_workload::WorkloadError::Setup(_))
        ),
        "{e}"
    );
    assert!(e.to_string().contains("out of memory"), "{e}");
    assert!("gpt7".parse::<ModelSpec>().is_err());
    assert!(parse_stages("4:20x").is_err());
    assert!("p99<<3".parse::<Threshold>().is_err());
}

#[test]
fn json_round_trips() {
    let r = go(&base(LoadPlan::Requests {
        concurrency: 2,
        total: 10,
    }));
    let j = r.to_json();
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    for k in [
        "schema_version",
        "scenario",
        "load",
        "latency",
        "timeline",
        "peaks",
        "findings",
        "what_if",
        "thresholds",
        "oom_search",
    ] {
        assert!(v.get(k).is_some(), "{k} missing");
    }
    assert_eq!(v["schema_version"], SCHEMA_VERSION);
    let back: RunResult = serde_json::from_str(&j).unwrap();
    assert_eq!(back.requests, r.requests);
    assert!(back.snapshot.is_none(), "the snapshot is not in the JSON");
}

#[test]
fn cpu_training_runs_with_real_compute() {
    let mut c = base(LoadPlan::Requests {
        concurrency: 2,
        total: 4,
    });
    c.device = DeviceChoice::Cpu;
    c.scenario = Scenario::training(
        "mlp-tiny".parse().unwrap(),
        16,
        InputDist::Fixed(16),
        OptimKind::AdamW,
        2,
        AccumPattern::Each,
    );
    let r = go(&c);
    assert_eq!(r.requests.ok, 4, "{:?}", r.errors);
    assert_eq!(r.requests.items, 4 * 2 * 16);
    assert!(
        r.peaks.categories_at_peak.optimizer_state > 0 || r.peaks.categories_at_peak.gradient > 0
    );
    assert_eq!(r.device, "cpu");
}

#[test]
fn variable_gpt2_on_cpu() {
    let mut c = base(LoadPlan::Requests {
        concurrency: 2,
        total: 6,
    });
    c.device = DeviceChoice::Cpu;
    c.scenario = Scenario::inference(
        "zoo-gpt-tiny".parse().unwrap(),
        2,
        "uniform:4..32".parse().unwrap(),
    );
    let r = go(&c);
    assert_eq!(r.requests.ok, 6, "{:?}", r.errors);
}

// ---------------------------------------------------------------------------------------
// Hard limits: a duration ends the load whatever -c is; absurd plans are refused.

/// Heavy requests on the cpu device under far more workers than cores: each request takes
/// seconds of wall time, so waiting for the requests in flight used to hold the end of a
/// 1 s load for minutes. They are interrupted at their next op instead.
#[test]
fn a_duration_is_a_hard_limit_whatever_the_concurrency() {
    let cfg = LoadConfig {
        device: DeviceChoice::Cpu,
        scenario: Scenario::default(),
        capacity: 1 << 30,
        plan: LoadPlan::Stages(vec![Stage::timed(512, Duration::from_secs(1))]),
        search: None,
        what_if: vec![],
        diagnose: false,
        history_entries: 10_000,
        ..Default::default()
    };
    let t = Instant::now();
    let r = go(&cfg);
    let took = t.elapsed();
    // one op of grace, generous for a loaded CI machine; it used to be minutes
    assert!(r.wall_s < 4.0, "load lasted {} s", r.wall_s);
    assert!(took < Duration::from_secs(60), "run took {took:?}");
    assert_eq!(r.stop_reason, StopReason::Completed);
    let s = &r.stages[0];
    assert!(s.workers_started > 0 && s.workers_started <= 512);
    // requests cut off are counted apart, not as errors
    assert_eq!(r.requests.other_errors, 0);
    assert_eq!(r.requests.stopped, s.requests.stopped);
}

#[test]
fn a_stop_flag_ends_a_big_load_promptly() {
    let cfg = LoadConfig {
        device: DeviceChoice::Cpu,
        scenario: Scenario::default(),
        capacity: 1 << 30,
        plan: LoadPlan::Stages(vec![Stage::timed(1024, Duration::from_secs(300))]),
        search: None,
        what_if: vec![],
        diagnose: false,
        history_entries: 10_000,
        ..Default::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        flag.store(true, Ordering::SeqCst);
    });
    let t = Instant::now();
    let r = run(&cfg, stop, |_| {}).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(r.stop_reason, StopReason::Cancelled);
}

/// Stage ends are on one schedule from the start of the load: a thousand 1 ms stages take
/// about a second, not a thousand times the controller's tick.
#[test]
fn many_short_stages_follow_their_durations() {
    let spec = vec!["2:1ms"; MAX_STAGES].join(",");
    let r = go(&base(LoadPlan::Stages(parse_stages(&spec).unwrap())));
    assert_eq!(r.stages.len(), MAX_STAGES);
    assert!(r.wall_s < 3.0, "1000 x 1 ms took {} s", r.wall_s);
}

#[test]
fn absurd_plans_are_refused_naming_the_limit() {
    let spec = vec!["1:1ms"; MAX_STAGES + 1].join(",");
    let e = parse_stages(&spec).unwrap_err().to_string();
    assert!(e.contains("at most 1000"), "{e}");
    assert!(
        e.len() < 300,
        "the error quotes the whole input: {} chars",
        e.len()
    );
    let e = parse_stages(&format!("{}:1s", MAX_WORKERS + 1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 4096"), "{e}");
    for plan in [
        LoadPlan::Requests {
            concurrency: 1_000_000,
            total: 10,
        },
        LoadPlan::Stages(vec![Stage::timed(MAX_WORKERS + 1, Duration::from_secs(1))]),
        LoadPlan::Stages(vec![
            Stage::timed(1, Duration::from_millis(1));
            MAX_STAGES + 1
        ]),
        LoadPlan::RampUntilOom {
            start: 1,
            step: RampStep::Mul(2),
            stage: Stage::timed(1, Duration::from_secs(1)),
            max_concurrency: 100_000,
            time_limit: Duration::from_secs(10),
        },
    ] {
        let e = base(plan).validate().unwrap_err().to_string();
        assert!(e.contains("at most"), "{e}");
    }
}
