//! `vramroom loadtest` with a memory source beside the allocator (NVML on a GPU; here a
//! fake, since CI has no GPU): the timeline samples carry the process's bytes and the
//! context + library overhead, the peaks and the source's tally are in the results, the
//! report draws them, and results.json stays backward compatible (the new fields are
//! absent without a source, and a file without them still reads).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramroom_load::report::render_html;
use vramroom_load::{run, FnSource, LoadConfig, LoadPlan, MemoryReading, MemorySource, RunResult};
use vramroom_workload::{DeviceChoice, InputDist, ModelSpec, Scenario};

const MIB: u64 = 1 << 20;

fn cfg(source: Option<Arc<dyn MemorySource>>) -> LoadConfig {
    LoadConfig {
        scenario: Scenario::inference(
            "mlp-tiny".parse::<ModelSpec>().unwrap(),
            4,
            InputDist::Fixed(8),
        ),
        device: DeviceChoice::Meta,
        capacity: 256 * MIB,
        plan: LoadPlan::Requests {
            concurrency: 2,
            total: 400,
        },
        sample_period: std::time::Duration::from_millis(2),
        search: None,
        diagnose: false,
        what_if: vec![],
        history_entries: 1000,
        memory_source: source,
        ..Default::default()
    }
}

fn go(c: &LoadConfig) -> RunResult {
    run(c, Arc::new(AtomicBool::new(false)), |_| {}).unwrap()
}

#[test]
fn a_fake_nvml_joins_the_timeline_with_the_overhead() {
    // The process holds a 300 MiB context beside whatever the allocator reserves; a fake
    // cannot see the allocator, so it reports a fixed figure that grows by 1 KiB a tick.
    let fake = Arc::new(FnSource::new("nvml:fake", "fake", |t| {
        Ok(MemoryReading {
            process_used: Some(300 * MIB + t * 1024),
            device_used: Some(900 * MIB),
            capacity: Some(1 << 30),
            ..Default::default()
        })
    }));
    let r = go(&cfg(Some(fake.clone())));
    let periodic: Vec<_> = r
        .timeline
        .iter()
        .filter(|s| s.kind == vramroom_load::SampleKind::Periodic)
        .collect();
    assert!(periodic.len() >= 2);
    for s in &periodic {
        let p = s
            .process_used_bytes
            .expect("every periodic sample has NVML's figure");
        assert_eq!(s.overhead_bytes, Some(p.saturating_sub(s.reserved_bytes)));
        // Meta reports no device usage of its own: NVML's fills it.
        assert_eq!(s.device_used_bytes, Some(900 * MIB));
    }
    // Peak samples are taken under the allocator's lock: no NVML there.
    assert!(r
        .timeline
        .iter()
        .filter(|s| s.kind == vramroom_load::SampleKind::Peak)
        .all(|s| s.process_used_bytes.is_none()));
    assert_eq!(fake.ticks() as usize, periodic.len());
    let src = &r.memory_sources[0];
    assert_eq!(
        (src.name.as_str(), src.status.as_str()),
        ("nvml:fake", "ok")
    );
    assert_eq!(src.samples as usize, periodic.len());
    assert!(src.series.iter().any(|s| s == "process_used"));
    let peak = r.peaks.process_used_bytes.unwrap();
    assert_eq!(
        peak,
        periodic
            .iter()
            .map(|s| s.process_used_bytes.unwrap())
            .max()
            .unwrap()
    );
    assert!(r.peaks.overhead_bytes.unwrap() > 250 * MIB);

    let json = r.to_json();
    assert!(json.contains("\"process_used_bytes\"") && json.contains("\"overhead_bytes\""));
    let back: RunResult = serde_json::from_str(&json).unwrap();
    assert_eq!(back.peaks.overhead_bytes, r.peaks.overhead_bytes);
    let html = render_html(&r);
    let svg = vramroom_load::report::plots::timeline_svg(&r);
    assert!(svg.contains("context + library overhead"));
    assert!(html.contains("process used (NVML)"));
    assert!(html.contains("nvml:fake"));
    // thresholds on the new peaks
    let t =
        vramroom_load::parse_thresholds(&["peak_overhead<1GiB", "peak_process_used<1MiB"]).unwrap();
    let res = vramroom_load::threshold::evaluate_thresholds(&t, &r);
    assert!(res[0].passed && !res[1].passed);
}

#[test]
fn without_a_source_the_json_is_as_before_and_old_files_read() {
    let r = go(&cfg(None));
    let json = r.to_json();
    for k in [
        "process_used_bytes",
        "overhead_bytes",
        "memory_sources",
        "\"http\"",
    ] {
        assert!(!json.contains(k), "{k} in a run without a source");
    }
    assert!(r.timeline.iter().all(|s| s.process_used_bytes.is_none()));
    // A results.json written before these fields existed: every new field reads as absent.
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v.as_object_mut().unwrap().remove("memory_sources");
    let old: RunResult = serde_json::from_value(v).unwrap();
    assert!(old.http.is_none() && old.memory_sources.is_empty());
    // The plot draws no NVML series (the caption still explains what they would be).
    let svg = vramroom_load::report::plots::timeline_svg(&r);
    assert!(svg.contains("allocated") && !svg.contains("context + library overhead"));
}

#[test]
fn a_failing_source_is_reported_and_the_run_goes_on() {
    let bad = Arc::new(FnSource::new("nvml:broken", "nvml", |_| {
        Err("NVML query failed".to_string())
    }));
    let r = go(&cfg(Some(bad)));
    assert_eq!(r.requests.total, 400);
    let s = &r.memory_sources[0];
    assert_eq!(s.status, "failing");
    assert_eq!(s.note, "NVML query failed");
    assert!(s.failures > 0 && s.samples == 0);
    assert!(r.peaks.process_used_bytes.is_none());
}
