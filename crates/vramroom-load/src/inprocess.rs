//! The in-process driver: a workload on one device and its caching allocator, driven by
//! the engine's worker threads, with the allocator's own counters on the timeline.
//!
//! Design note: this is the [`Driver`] of `vramroom loadtest`. `prepare` builds the device
//! and the workload before the clock starts (a model that alone does not fit is an error,
//! not a run); `drive` runs the engine ([`crate::engine`]) with a sampler thread beside it
//! and groups its per-request records by stage (the pipeline folds them); the evidence is
//! the allocator's own log of the whole run and its snapshots; `search` is the what-if
//! replay of that log and the OOM search on the meta twin, both skipped after Ctrl-C.
//! Progress names each phase (setup, load, what_if, search, diagnose, done).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::{info, warn};

use vramroom_alloc::{AllocatorConfig, HistoryMode};

use crate::aggregate::{latency_histogram, summarize};
use crate::config::{LoadConfig, LoadPlan};
use crate::diagnose::RunLog;
use crate::driver::{Diagnosis, Driver, Evidence, Measured, StageMeasure};
use crate::engine::{drive, LoadOutcome};
use crate::error::{LoadError, Result};
use crate::results::*;
use crate::search::oom_search;
use crate::threshold::Threshold;
use crate::timeline::{category_bytes, Outcome, Phase, RequestRecord, Timeline};
use vramroom_workload::device::{make_device, RunDevice};
use vramroom_workload::Workload;

/// The in-process driver of one [`LoadConfig`].
pub struct InProcess<'a> {
    cfg: &'a LoadConfig,
    prog: Progress,
    ready: Option<Ready>,
    /// The allocator config the run used (checked in `prepare`).
    conf: AllocatorConfig,
    /// Ctrl-C came during the load: no replay, no search.
    cancelled: bool,
    run_log: Option<RunLog>,
    device: Option<RunDevice>,
    /// The outside memory source's tally, once the load has run.
    sources: Vec<MemorySourceInfo>,
    snapshot: Option<vramroom_alloc::Snapshot>,
    oom_snapshot: Option<vramroom_alloc::Snapshot>,
}

/// The device and the workload, built before the clock starts.
struct Ready {
    dev: RunDevice,
    log_id: Option<usize>,
    workload: Workload,
    baseline: u64,
}

impl<'a> InProcess<'a> {
    pub fn new(cfg: &'a LoadConfig) -> InProcess<'a> {
        InProcess {
            cfg,
            prog: Progress::default(),
            ready: None,
            conf: AllocatorConfig::default(),
            cancelled: false,
            run_log: None,
            device: None,
            sources: Vec::new(),
            snapshot: None,
            oom_snapshot: None,
        }
    }

    fn phase(&mut self, phase: &str, progress: &mut dyn FnMut(&Progress)) {
        self.prog.phase = phase.into();
        progress(&self.prog);
    }
}

impl Driver for InProcess<'_> {
    fn prepare(&mut self, progress: &mut dyn FnMut(&Progress)) -> Result<()> {
        let cfg = self.cfg;
        self.conf = cfg.validate()?;
        let t_setup = Instant::now();
        self.prog = Progress {
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
        progress(&self.prog);
        let dev = make_device(&cfg.device, cfg.capacity, &self.conf)?;
        dev.probe
            .record_memory_history(HistoryMode::All, cfg.history_entries.max(1));
        // Before anything is allocated: the what-if replays the whole run from this log.
        self.run_log =
            (!cfg.what_if.is_empty() || cfg.diagnose).then(|| RunLog::new(cfg.what_if_log_entries));
        let log_id = self
            .run_log
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
        self.ready = Some(Ready {
            dev,
            log_id,
            workload,
            baseline,
        });
        Ok(())
    }

    fn drive(
        &mut self,
        stop: &Arc<AtomicBool>,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<Measured> {
        let cfg = self.cfg;
        let Ready {
            dev,
            log_id,
            workload,
            baseline,
        } = self
            .ready
            .take()
            .ok_or_else(|| LoadError::Config("the run was not prepared".into()))?;
        let prog = &mut self.prog;
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
                drive(&workload, &dev, &cfg.plan, &phase, start, stop, |v| {
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
                    progress(prog);
                })
            });
            sampler_stop.store(true, Ordering::Relaxed);
            r
        });
        // One last sample after the load: what stays allocated and cached at rest.
        let ext = ext_source.sample();
        timeline.sample_at_rest(&dev.probe.stats(), &dev.device, used(&dev), ext.as_ref());
        dev.probe.remove_observer(obs_id);
        if let Some(id) = log_id {
            dev.probe.remove_observer(id);
        }
        let mut outcome = outcome?;

        let stats = dev.probe.stats();
        self.snapshot = Some(dev.probe.snapshot());
        self.oom_snapshot = outcome.oom_snapshot.take();
        let mut measured = measure(cfg, &dev, baseline, &timeline, outcome, &stats);
        self.sources = ext_source.info().into_iter().collect();
        measured.result.final_memory_stats = stats.memory_stats();
        measured.result.final_memory_summary = dev.probe.memory_summary();
        self.cancelled = stop.load(Ordering::Relaxed);
        // Release the run's memory before the search builds its own devices.
        workload.release();
        drop(workload);
        // The device outlives the load, as it did when the pipeline was one function.
        self.device = Some(dev);
        Ok(measured)
    }

    fn memory_sources(&self) -> Vec<MemorySourceInfo> {
        self.sources.clone()
    }

    fn evidence(&mut self) -> Evidence {
        Evidence {
            run_log: self.run_log.take(),
            snapshot: self.snapshot.take(),
            oom_snapshot: self.oom_snapshot.take(),
        }
    }

    fn search(
        &mut self,
        result: &mut RunResult,
        run_log: Option<&RunLog>,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(&Progress),
    ) {
        if self.cancelled {
            return;
        }
        let cfg = self.cfg;
        self.phase("what_if", progress);
        let (rows, check) =
            crate::diagnose::what_if(result, run_log, &cfg.alloc_conf, &cfg.what_if);
        result.what_if = rows;
        result.what_if_check = check;
        if !result.what_if_check.agrees && !result.what_if.is_empty() {
            warn!(note = %result.what_if_check.note, "what-if disagrees with the run");
        }
        // The log is the run's whole history: free it before the search builds devices.
        if let Some(l) = run_log {
            l.clear();
        }
        if let Some(sc) = &cfg.search {
            self.phase("search", progress);
            result.oom_search = verdict(cfg, &self.conf, sc, stop);
        }
    }

    fn diagnosis(&mut self, progress: &mut dyn FnMut(&Progress)) -> Diagnosis<'_> {
        if !self.cfg.diagnose {
            return Diagnosis::None;
        }
        self.phase("diagnose", progress);
        Diagnosis::Workload {
            scenario: &self.cfg.scenario,
            conf: &self.conf,
        }
    }

    fn thresholds(&self) -> &[Threshold] {
        &self.cfg.thresholds
    }

    fn done(&mut self, progress: &mut dyn FnMut(&Progress)) {
        self.phase("done", progress);
    }
}

/// The OOM search under the run's config and under each what-if config: the headline
/// recommends the one that does best when it beats the run's own (more safe load, or the
/// same with less peak reserved there), else says the run's config is already the best.
/// Every search is deterministic for a seed and none reads the run's own measurements, so
/// two runs with one seed print the same verdict. The searches are independent meta runs,
/// so they run side by side, one thread each (the load is over and its cores are free);
/// the best is then chosen in the configs' order, as one after another would.
fn verdict(
    cfg: &LoadConfig,
    conf: &vramroom_alloc::AllocatorConfig,
    sc: &crate::search::SearchConfig,
    stop: &AtomicBool,
) -> Option<OomSearch> {
    let others: Vec<(&String, vramroom_alloc::AllocatorConfig)> = cfg
        .what_if
        .iter()
        .filter(|c| **c != cfg.alloc_conf)
        .filter_map(|c| Some((c, vramroom_alloc::AllocatorConfig::parse(c).ok()?)))
        .collect();
    let (own, found) = std::thread::scope(|scope| {
        let handles: Vec<_> = others
            .iter()
            .map(|(_, rc)| {
                scope.spawn(move || oom_search(&cfg.scenario, cfg.capacity, rc, sc, stop))
            })
            .collect();
        let own = oom_search(&cfg.scenario, cfg.capacity, conf, sc, stop);
        let found: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        (own, found)
    });
    let mut s = match own {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "OOM search failed");
            return None;
        }
    };
    s.alloc_conf = cfg.alloc_conf.clone();
    let mut best: Option<(String, OomSearch)> = None;
    for ((c, _), r) in others.iter().zip(found) {
        match r {
            Ok(Ok(r)) => {
                if best.as_ref().is_none_or(|(_, b)| b.is_beaten_by(&r)) {
                    best = Some(((*c).clone(), r));
                }
            }
            Ok(Err(e)) => warn!(conf = %c, error = %e, "OOM search under a what-if config failed"),
            Err(_) => warn!(conf = %c, "OOM search under a what-if config panicked"),
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

/// The run's records grouped by stage, and the rest of the result only this driver can
/// fill (the allocator's peaks and counters, the timeline, the OOMs).
fn measure(
    cfg: &LoadConfig,
    dev: &RunDevice,
    baseline: u64,
    timeline: &Timeline,
    out: LoadOutcome,
    stats: &vramroom_alloc::DeviceStats,
) -> Measured {
    let all: Vec<&RequestRecord> = out.records.iter().collect();
    let stage_peaks = timeline.stage_peaks.lock().clone();
    let mut errors = ErrorCounts {
        oom: summarize(&all).oom,
        by_kind: BTreeMap::new(),
    };
    for r in &out.records {
        if let Outcome::Error(k) = r.outcome {
            *errors.by_kind.entry(k.to_string()).or_default() += 1;
        }
    }
    // Records grouped by stage in one pass: a plan of thousands of short stages must cost
    // time linear in records + stages, not their product.
    let mut by_stage: Vec<Vec<&RequestRecord>> = vec![Vec::new(); out.stages_run.len()];
    for r in &out.records {
        if let Some(v) = by_stage.get_mut(r.stage) {
            v.push(r);
        }
    }
    let stages: Vec<StageMeasure> = out
        .stages_run
        .iter()
        .zip(&by_stage)
        .enumerate()
        .map(|(i, ((st, s0, s1, started), recs))| {
            let p = stage_peaks.get(i).copied().unwrap_or_default();
            StageMeasure {
                index: i,
                load: st.workers() as f64,
                concurrency: st.workers(),
                workers_started: *started,
                start_s: *s0,
                end_s: *s1,
                requests: summarize(recs),
                latency: latency_histogram(recs),
                shed: 0,
                peak_allocated_bytes: p.allocated,
                peak_reserved_bytes: p.reserved,
            }
        })
        .collect();
    let peak_t = timeline.peak.lock().1;
    // One read: two `lock()`s in one expression would hold the first guard while taking
    // the second, and parking_lot's mutex is not reentrant.
    let frag = *timeline.fragmented.lock();
    let mut peaks = Peaks {
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
    crate::memsource::fill_peaks(&mut peaks, &timeline_samples);
    let result = RunResult {
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
        // Folded from the stages by the pipeline.
        requests: RequestSummary::default(),
        latency: LatencyStats::default(),
        throughput: Throughput::default(),
        errors,
        stages: Vec::new(),
        by_concurrency: Vec::new(),
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
        oom_snapshot: None,
        memory_sources: Vec::new(),
        http: None,
    };
    Measured {
        result,
        stages,
        open: false,
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
