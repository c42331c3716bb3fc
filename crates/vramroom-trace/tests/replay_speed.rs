//! Replay speed: a synthetic 50,000-event training-like trace (alloc / free_requested /
//! free_completed, sizes 512 B .. 64 MiB, some frees completing late as after
//! `record_stream`) must replay in under 0.5 s in release builds. Debug builds (the
//! workspace's own crates at opt-level 0) only check a loose 5 s bound and print the time.

use std::time::{Duration, Instant};

use vramroom_alloc::bench::{synthetic_trace, SEED};
use vramroom_trace::{replay, ReplayOptions, TraceAction};

const EVENTS: usize = 50_000;

#[test]
fn replay_of_50k_events_is_fast() {
    let snap = synthetic_trace(EVENTS, SEED);
    let trace = &snap.device_traces[0];
    assert_eq!(trace.len(), EVENTS);
    let count = |a: TraceAction| trace.iter().filter(|e| e.action == a).count();
    let (allocs, reqs, dones) = (
        count(TraceAction::Alloc),
        count(TraceAction::FreeRequested),
        count(TraceAction::FreeCompleted),
    );
    assert_eq!(allocs + reqs + dones, EVENTS);
    assert!(allocs > 15_000 && reqs > 15_000 && dones > 15_000);
    // Some frees complete late (not right after their free_requested).
    let late = trace
        .windows(2)
        .filter(|w| {
            w[0].action == TraceAction::FreeRequested
                && !(w[1].action == TraceAction::FreeCompleted && w[1].addr == w[0].addr)
        })
        .count();
    assert!(late > 500, "only {late} late frees");
    let max = trace.iter().map(|e| e.size).max().unwrap();
    assert!(max >= 32 << 20, "largest request {max}");

    let opts = ReplayOptions::default();
    let _ = replay(&snap, &opts).expect("warm-up replay");
    let mut best = Duration::MAX;
    let mut result = None;
    for _ in 0..3 {
        let t = Instant::now();
        let r = replay(&snap, &opts).expect("replay");
        best = best.min(t.elapsed());
        result = Some(r);
    }
    let r = result.unwrap();
    assert_eq!(r.events, EVENTS);
    assert_eq!(r.oom_event, None);
    assert_eq!(r.unmatched_frees, 0);
    assert!(r.peak_allocated_bytes > 0 && r.peak_reserved_bytes >= r.peak_allocated_bytes);
    assert!(r.segment_allocs > 0);

    let release = !cfg!(debug_assertions);
    let limit = if release {
        Duration::from_millis(500)
    } else {
        Duration::from_secs(5)
    };
    println!(
        "replay of {EVENTS} events: best of 3 {:.1} ms ({:.0} ns/event, {} build, limit {:?}); peak reserved {} B, {} segments",
        best.as_secs_f64() * 1e3,
        best.as_secs_f64() * 1e9 / EVENTS as f64,
        if release { "release" } else { "debug" },
        limit,
        r.peak_reserved_bytes,
        r.segment_allocs,
    );
    assert!(best < limit, "replay took {best:?}, limit {limit:?}");
}
