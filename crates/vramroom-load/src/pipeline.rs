//! The pipeline of a load test: config → engine → OOM search → diagnosis → results.
//!
//! Design note: [`run`] is the one place that orders the steps, and each step only looks
//! down the flow: the engine ([`crate::engine`]) drives load, the timeline measures it, the
//! search ([`crate::search`]) probes on the meta twin with the engine, the diagnosis
//! ([`crate::diagnose`]) reads the finished result, and the report ([`crate::report`]) is a
//! pure function of that result. No step calls back into the one that called it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::{info, warn};

use vramroom_alloc::HistoryMode;

use crate::config::{LoadConfig, LoadPlan};
use crate::engine::{drive, LoadOutcome};
use crate::error::{LoadError, Result};
use crate::results::*;
use crate::search::oom_search;
use crate::threshold::evaluate_thresholds;
use crate::timeline::{category_bytes, latency_stats, Outcome, Phase, RequestRecord, Timeline};
use vramroom_workload::device::{make_device, RunDevice};
use vramroom_workload::Workload;

fn summarize(records: &[&RequestRecord]) -> RequestSummary {
    let mut s = RequestSummary::default();
    for r in records {
        if r.outcome == Outcome::Stopped {
            s.stopped += 1;
            continue;
        }
        s.total += 1;
        match r.outcome {
            Outcome::Ok => {
                s.ok += 1;
                s.items += r.items;
            }
            Outcome::Oom => s.oom += 1,
            Outcome::Error(_) => s.other_errors += 1,
            Outcome::Stopped => {}
        }
    }
    s
}

fn lat(records: &[&RequestRecord]) -> LatencyStats {
    let v: Vec<u64> = records
        .iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .map(|r| r.latency_us)
        .collect();
    latency_stats(v.iter())
}

/// Runs a load test. This is the entry point of `vramroom loadtest`.
///
/// `stop` is polled throughout; setting it (Ctrl-C) ends the load early and the result of
/// what was measured is still returned (`stop_reason: cancelled`; the search and what-if
/// are skipped, the diagnosis runs on what there is). `progress` is called on the calling
/// thread several times a second.
///
/// Errors are only for bad configuration or a setup that cannot run (the model alone does
/// not fit); failures of requests are counted in the result.
pub fn run(
    cfg: &LoadConfig,
    stop: Arc<AtomicBool>,
    mut progress: impl FnMut(&Progress),
) -> Result<RunResult> {
    let conf = cfg.validate()?;
    let t_setup = Instant::now();
    let mut prog = Progress {
        phase: "setup".into(),
        capacity_bytes: cfg.capacity,
        planned_s: planned_seconds(&cfg.plan),
        requests_planned: match cfg.plan {
            LoadPlan::Requests { total, .. } => Some(total),
            _ => None,
        },
        stages: match &cfg.plan {
            LoadPlan::Stages(v) => v.len(),
            _ => 1,
        },
        ..Default::default()
    };
    progress(&prog);
    let dev = make_device(&cfg.device, cfg.capacity, &conf)?;
    dev.probe
        .record_memory_history(HistoryMode::All, cfg.history_entries.max(1));
    // Before anything is allocated: the what-if replays the whole run from this log.
    let run_log = (!cfg.what_if.is_empty() || cfg.diagnose)
        .then(|| crate::diagnose::RunLog::new(cfg.what_if_log_entries));
    let log_id = run_log
        .as_ref()
        .map(|l| dev.probe.add_observer(l.observer()));
    let workload = Workload::build(&cfg.scenario, &dev.device)?;
    let baseline = dev.device.memory_allocated();
    dev.probe.reset_peak_memory_stats();
    dev.device.reset_peak_memory_stats();
    info!(
        device = %dev.name,
        baseline,
        setup_ms = t_setup.elapsed().as_millis() as u64,
        "workload built"
    );

    let phase = Arc::new(Phase::default());
    let start = Instant::now();
    let timeline = Timeline::new(start, phase.clone());
    let obs_id = dev
        .probe
        .add_observer(Box::new(crate::timeline::PeakObserver::new(
            dev.probe.stats(),
            timeline.clone(),
            dev.device.clone(),
        )));
    let sampler_stop = AtomicBool::new(false);
    let ext_source = SourceTally::new(cfg.memory_source.clone());
    let used = |d: &RunDevice| {
        if d.has_device_usage {
            let (free, total) = d.probe.mem_get_info();
            Some(total.saturating_sub(free))
        } else {
            None
        }
    };
    let outcome = std::thread::scope(|scope| {
        let sampler = {
            let timeline = &timeline;
            let dev = &dev;
            let sampler_stop = &sampler_stop;
            let ext_source = &ext_source;
            let period = cfg.sample_period;
            std::thread::Builder::new()
                .name("vramroom-sampler".into())
                .spawn_scoped(scope, move || {
                    let mut next = Instant::now();
                    while !sampler_stop.load(Ordering::Relaxed) {
                        let ext = ext_source.sample();
                        timeline.sample_now_with(
                            &dev.probe.stats(),
                            &dev.device,
                            used(dev),
                            ext.as_ref(),
                        );
                        next += period;
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        } else {
                            next = now;
                        }
                    }
                })
                .map_err(|e| LoadError::Thread(e.to_string()))
        };
        let mut last_progress = Instant::now() - Duration::from_secs(1);
        let r = sampler.and_then(|_| {
            drive(&workload, &dev, &cfg.plan, &phase, start, &stop, |v| {
                if last_progress.elapsed() < Duration::from_millis(100) {
                    return;
                }
                last_progress = Instant::now();
                let st = dev.probe.stats();
                prog.phase = "load".into();
                prog.elapsed_s = start.elapsed().as_secs_f64();
                prog.stage = v.stage;
                prog.stages = prog.stages.max(v.stage + 1);
                prog.concurrency = v.concurrency;
                prog.requests_done = v.completed;
                prog.ooms = v.ooms;
                prog.errors = v.errors;
                prog.allocated_bytes = st.allocated_bytes.all().current.max(0) as u64;
                prog.reserved_bytes = st.reserved_bytes.all().current.max(0) as u64;
                prog.peak_allocated_bytes = st.allocated_bytes.all().peak.max(0) as u64;
                progress(&prog);
            })
        });
        sampler_stop.store(true, Ordering::Relaxed);
        r
    });
    // One last sample after the load: what stays allocated and cached at rest.
    let ext = ext_source.sample();
    timeline.sample_now_with(&dev.probe.stats(), &dev.device, used(&dev), ext.as_ref());
    dev.probe.remove_observer(obs_id);
    if let Some(id) = log_id {
        dev.probe.remove_observer(id);
    }
    let outcome = outcome?;

    let stats = dev.probe.stats();
    let snapshot = dev.probe.snapshot();
    let mut result = aggregate(cfg, &dev, &workload, baseline, &timeline, outcome, &stats);
    result.memory_sources = ext_source.info().into_iter().collect();
    result.final_memory_stats = stats.memory_stats();
    result.final_memory_summary = dev.probe.memory_summary();
    result.snapshot = Some(snapshot);
    let cancelled = stop.load(Ordering::Relaxed);
    // Release the run's memory before the search builds its own devices.
    workload.release();
    drop(workload);

    if !cancelled {
        prog.phase = "what_if".into();
        progress(&prog);
        let (rows, check) =
            crate::diagnose::what_if(&result, run_log.as_ref(), &cfg.alloc_conf, &cfg.what_if);
        result.what_if = rows;
        result.what_if_check = check;
        if !result.what_if_check.agrees && !result.what_if.is_empty() {
            warn!(note = %result.what_if_check.note, "what-if disagrees with the run");
        }
        if let Some(l) = &run_log {
            l.clear();
        }
        if let Some(sc) = &cfg.search {
            prog.phase = "search".into();
            progress(&prog);
            result.oom_search = verdict(cfg, &conf, sc, &stop);
        }
    }
    if cfg.diagnose {
        prog.phase = "diagnose".into();
        progress(&prog);
        result.findings = crate::diagnose::diagnose(&result, &cfg.scenario, &conf, &stop);
    }
    result.thresholds = evaluate_thresholds(&cfg.thresholds, &result);
    prog.phase = "done".into();
    progress(&prog);
    Ok(result)
}

/// The OOM search under the run's config and under each what-if config: the headline
/// recommends the one that does best when it beats the run's own (more safe load, or the
/// same with less peak reserved there), else says the run's config is already the best.
/// Every search is deterministic for a seed and none reads the run's own measurements, so
/// two runs with one seed print the same verdict.
fn verdict(
    cfg: &LoadConfig,
    conf: &vramroom_alloc::AllocatorConfig,
    sc: &crate::search::SearchConfig,
    stop: &AtomicBool,
) -> Option<OomSearch> {
    let mut s = match oom_search(&cfg.scenario, cfg.capacity, conf, sc, stop) {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "OOM search failed");
            return None;
        }
    };
    s.alloc_conf = cfg.alloc_conf.clone();
    let mut best: Option<(String, OomSearch)> = None;
    for c in cfg.what_if.iter().filter(|c| **c != cfg.alloc_conf) {
        let Ok(rc) = vramroom_alloc::AllocatorConfig::parse(c) else {
            continue;
        };
        match oom_search(&cfg.scenario, cfg.capacity, &rc, sc, stop) {
            Ok(r) => {
                if best.as_ref().is_none_or(|(_, b)| b.is_beaten_by(&r)) {
                    best = Some((c.clone(), r));
                }
            }
            Err(e) => warn!(conf = %c, error = %e, "OOM search under a what-if config failed"),
        }
    }
    if let Some((c, r)) = best {
        if s.is_beaten_by(&r) {
            s.recommended = Some(r.as_recommended(&c));
        } else {
            s.not_better = Some(r.as_recommended(&c));
        }
    }
    s.headline = s.headline();
    Some(s)
}

fn planned_seconds(plan: &LoadPlan) -> Option<f64> {
    match plan {
        LoadPlan::Stages(v) => v
            .iter()
            .map(|s| s.duration.map(|d| d.as_secs_f64()))
            .sum::<Option<f64>>(),
        LoadPlan::Requests { .. } => None,
        LoadPlan::RampUntilOom { time_limit, .. } => Some(time_limit.as_secs_f64()),
    }
}

fn aggregate(
    cfg: &LoadConfig,
    dev: &RunDevice,
    workload: &Workload,
    baseline: u64,
    timeline: &Timeline,
    out: LoadOutcome,
    stats: &vramroom_alloc::DeviceStats,
) -> RunResult {
    let _ = workload;
    let all: Vec<&RequestRecord> = out.records.iter().collect();
    let requests = summarize(&all);
    let stage_peaks = timeline.stage_peaks.lock().clone();
    let mut errors = ErrorCounts {
        oom: requests.oom,
        by_kind: BTreeMap::new(),
    };
    for r in &out.records {
        if let Outcome::Error(k) = r.outcome {
            *errors.by_kind.entry(k.to_string()).or_default() += 1;
        }
    }
    // Records grouped by stage and by concurrency in one pass each: a plan of thousands of
    // short stages must cost time linear in records + stages, not their product.
    let mut by_stage: Vec<Vec<&RequestRecord>> = vec![Vec::new(); out.stages_run.len()];
    let mut by_level: BTreeMap<usize, Vec<&RequestRecord>> = BTreeMap::new();
    for r in &out.records {
        if let Some(v) = by_stage.get_mut(r.stage) {
            v.push(r);
        }
        by_level.entry(r.concurrency).or_default().push(r);
    }
    let stages: Vec<StageResult> = out
        .stages_run
        .iter()
        .zip(&by_stage)
        .enumerate()
        .map(|(i, ((st, s0, s1, started), recs))| {
            let req = summarize(recs);
            let p = stage_peaks.get(i).copied().unwrap_or_default();
            StageResult {
                index: i,
                concurrency: st.concurrency,
                start_s: *s0,
                end_s: *s1,
                requests: req,
                latency: lat(recs),
                throughput: Throughput::of(&req, s1 - s0),
                peak_allocated_bytes: p.allocated,
                peak_reserved_bytes: p.reserved,
                workers_started: *started,
            }
        })
        .collect();
    // Per level: seconds and peaks of its stages.
    let mut level_stages: BTreeMap<usize, (f64, u64, u64)> = BTreeMap::new();
    for s in &stages {
        let e = level_stages.entry(s.concurrency).or_default();
        e.0 += s.end_s - s.start_s;
        e.1 = e.1.max(s.peak_allocated_bytes);
        e.2 = e.2.max(s.peak_reserved_bytes);
    }
    let empty: Vec<&RequestRecord> = Vec::new();
    let by_concurrency = level_stages
        .into_iter()
        .map(|(c, (secs, pa, pr))| {
            let recs = by_level.get(&c).unwrap_or(&empty);
            let req = summarize(recs);
            ConcurrencyResult {
                concurrency: c,
                requests: req,
                latency: lat(recs),
                throughput: Throughput::of(&req, secs),
                peak_allocated_bytes: pa,
                peak_reserved_bytes: pr,
                peak_above_base_bytes: pa.saturating_sub(baseline),
            }
        })
        .collect();
    let peak_t = timeline.peak.lock().1;
    // One read: two `lock()`s in one expression would hold the first guard while taking
    // the second, and parking_lot's mutex is not reentrant.
    let frag = *timeline.fragmented.lock();
    let peaks = Peaks {
        allocated_bytes: stats.allocated_bytes.all().peak.max(0) as u64,
        reserved_bytes: stats.reserved_bytes.all().peak.max(0) as u64,
        active_bytes: stats.active_bytes.all().peak.max(0) as u64,
        inactive_split_bytes: stats.inactive_split_bytes.all().peak.max(0) as u64,
        allocated_t_s: peak_t,
        above_base_bytes: (stats.allocated_bytes.all().peak.max(0) as u64).saturating_sub(baseline),
        categories_at_peak: category_bytes(&dev.device.peak_memory_by_category()),
        alloc_retries: stats.num_alloc_retries,
        fragmented_segment_allocs: frag.0,
        fragmented_segment_bytes: frag.1,
        ..Default::default()
    };
    let timeline_samples = timeline.sorted_samples();
    let mut peaks = peaks;
    crate::memsource::fill_peaks(&mut peaks, &timeline_samples);
    RunResult {
        schema_version: SCHEMA_VERSION,
        vramroom_version: env!("CARGO_PKG_VERSION").into(),
        scenario: cfg.scenario.info(),
        load: cfg.load_info(),
        device: dev.name.clone(),
        capacity_bytes: cfg.capacity,
        alloc_conf: cfg.alloc_conf.clone(),
        wall_s: out.wall_s,
        stop_reason: out.stop_reason,
        baseline_bytes: baseline,
        requests,
        latency: lat(&all),
        throughput: Throughput::of(&requests, out.wall_s),
        errors,
        stages,
        by_concurrency,
        timeline: timeline_samples,
        peaks,
        ooms: out.oom_records,
        oom_search: None,
        findings: Vec::new(),
        what_if: Vec::new(),
        what_if_check: WhatIfCheck::default(),
        thresholds: Vec::new(),
        final_memory_stats: BTreeMap::new(),
        final_memory_summary: String::new(),
        snapshot: None,
        oom_snapshot: out.oom_snapshot,
        memory_sources: Vec::new(),
        http: None,
    }
}

/// An optional outside memory source with its tally (samples, failures, series seen), for
/// the sampler thread; a failing source is warned about once and the run goes on.
struct SourceTally {
    source: Option<Arc<dyn crate::memsource::MemorySource>>,
    tally: Mutex<MemorySourceInfo>,
}

impl SourceTally {
    fn new(source: Option<Arc<dyn crate::memsource::MemorySource>>) -> SourceTally {
        let info = source
            .as_ref()
            .map(|s| MemorySourceInfo {
                name: s.name(),
                kind: s.kind().into(),
                ..Default::default()
            })
            .unwrap_or_default();
        SourceTally {
            source,
            tally: Mutex::new(info),
        }
    }
    fn sample(&self) -> Option<crate::memsource::MemoryReading> {
        let s = self.source.as_ref()?;
        let r = s.sample();
        let mut t = self.tally.lock();
        match r {
            Ok(r) => {
                t.samples += 1;
                for name in r.series() {
                    if !t.series.iter().any(|x| x == name) {
                        t.series.push(name.into());
                    }
                }
                Some(r)
            }
            Err(e) => {
                if t.failures == 0 {
                    warn!(source = %s.name(), error = %e, "memory source failed");
                    t.note = e;
                }
                t.failures += 1;
                None
            }
        }
    }
    fn info(&self) -> Option<MemorySourceInfo> {
        self.source.as_ref()?;
        let mut t = self.tally.lock().clone();
        t.status = if t.samples > 0 { "ok" } else { "failing" }.into();
        Some(t)
    }
}
