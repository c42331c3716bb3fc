//! The HTTP driver's `drive`: the load through its stages, memory sampled on the same
//! clock, the probe's snapshots at the end, all handed to [`crate::http::aggregate`].
//!
//! Design note: the calling thread is the controller (`block_on` on a small runtime of its
//! own): it walks the stages at fixed times from the start (a `--ramp-until-oom` step is
//! held until its own requests are back: [`ramp_step_end`]), reports progress, and watches
//! the stop flag; the memory sampler is one more task there. The load runs elsewhere:
//! - closed model: `threads` load threads, each a current-thread runtime (`Shards`) that
//!   owns every `threads`-th worker with its connection, timer and I/O registration, as
//!   wrk's threads do. A worker's request never leaves its thread: no work stealing, no
//!   wake-up handed to another core, no shared timer wheel. Against one work-stealing
//!   runtime of the same threads this is what lets the client keep pace with wrk on a
//!   many-core host (see `vramroom bench http`);
//! - open model: a dispatcher plus one task per request on a work-stealing runtime of
//!   `threads` threads, whose connections are pooled across all of them (a request takes
//!   whichever connection is free, wherever it was opened).
//!
//! Everything that can be wrong with the user's input (the URL, the body, the metrics
//! endpoint, nothing listening) is found by `prepare` before the clock starts, so the CLI
//! can exit 2 with nothing written.
//!
//! The end of a run: no new request starts; requests in flight, and open-model requests the
//! schedule meant to send before the end but still waiting for a connection, get a grace
//! period (`min(--timeout, 5s)`) to finish; what is left is counted as aborted (in flight)
//! or dropped (never sent; after Ctrl-C, at once). Then one more memory sample (the
//! service at rest), the probe's snapshots, the replays and the findings.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};
use tracing::{debug, info, warn};

use crate::error::{LoadError, Result};
use crate::http::aggregate::{Aggregate, StageRun, Tick};
use crate::http::client;
use crate::http::config::HttpConfig;
use crate::http::load::StageLoad;
use crate::http::predict::{device_capacities, DeviceCapacity};
use crate::http::prepare::{scrape_timeout, Prepared};
use crate::http::record::Recorder;
use crate::http::refusal::{hint, Refusals};
use crate::http::sample::Sampler;
use crate::http::workers::{closed_worker, dispatcher, Ctx, Shards};
use crate::memsource::MemoryReading;
use crate::results::*;

/// What the controller does when a stage's time is up.
enum StepEnd {
    Next,
    Hold,
    Saturated,
}

/// `--ramp-until-oom` (closed model): a step is over once as many of the requests sent in
/// it have come back as it has workers, so every step really held its load at once; a
/// service whose requests take longer than the step (a `generate()` of many tokens under
/// 16 concurrent requests) would otherwise be ramped past its OOM point before any of its
/// answers, OOM or not, came back. The hold is bounded: by `--timeout` after the step's
/// time every request it sent has finished or timed out. A step none of whose requests got
/// an answer ends the ramp: no higher load could show an OOM either. Other runs keep their
/// stages to the clock.
fn ramp_step_end(cfg: &HttpConfig, ctx: &Ctx, i: usize, load: StageLoad, end_at: f64) -> StepEnd {
    let StageLoad::Workers(workers) = load else {
        return StepEnd::Next;
    };
    if !cfg.stop_at_first_oom {
        return StepEnd::Next;
    }
    let count = |v: &[AtomicU64]| v.get(i).map_or(0, |n| n.load(Ordering::Relaxed));
    let finished = count(&ctx.finished_by_stage);
    let answered = count(&ctx.answered_by_stage);
    let expired = ctx.t() >= end_at + cfg.timeout.as_secs_f64();
    if finished >= workers as u64 || expired {
        if answered == 0 && finished > 0 {
            StepEnd::Saturated
        } else {
            StepEnd::Next
        }
    } else {
        StepEnd::Hold
    }
}

pub(crate) async fn drive(
    cfg: &HttpConfig,
    prep: Prepared,
    shards: Option<&Shards>,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Driven> {
    let open = cfg.is_open();
    let planned = cfg.planned_s();
    let bucket_s = match planned {
        Some(p) => (p / 600.0).max(0.1),
        None => 0.1,
    };
    // The memory sampler: a sample before the first request (the baseline, at t = 0), then
    // one per interval on the run's clock.
    let mut sampler = Sampler::new(prep.scrapes, prep.blocking, scrape_timeout(cfg));
    let latest: Arc<Mutex<MemoryReading>> = Arc::new(Mutex::new(MemoryReading::default()));
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let has_sources = sampler.has_sources();
    let mut readings: Vec<Tick> = Vec::new();
    if has_sources {
        let r = sampler.read().await;
        readings.push((0.0, r, 0));
        *latest.lock() = r;
    }
    let readings_first = readings.first().and_then(|r| r.1.num_ooms);
    let ctx = Arc::new(Ctx {
        head_len: prep.template.head_len(),
        target: prep.target,
        template: prep.template,
        bodies: prep.bodies,
        timeout: cfg.timeout,
        rec: Recorder::new(bucket_s, open),
        start: Instant::now(),
        stage: AtomicUsize::new(0),
        workers_target: AtomicUsize::new(0),
        done: AtomicBool::new(false),
        notify: Notify::new(),
        next_seq: AtomicU64::new(0),
        limit: cfg.max_requests,
        limit_hit: AtomicBool::new(false),
        started: AtomicU64::new(0),
        finished: AtomicU64::new(0),
        shed: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        oom_answers: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
        peak_in_flight: cfg.stages.iter().map(|_| AtomicUsize::new(0)).collect(),
        finished_by_stage: cfg.stages.iter().map(|_| AtomicU64::new(0)).collect(),
        answered_by_stage: cfg.stages.iter().map(|_| AtomicU64::new(0)).collect(),
        connections: AtomicU64::new(0),
        live_workers: AtomicUsize::new(0),
        scheduled: AtomicU64::new(0),
        pending: AtomicU64::new(0),
        cancelled: AtomicBool::new(false),
        dropped: AtomicU64::new(0),
        pool: Mutex::new(Vec::new()),
        slots: Semaphore::new(cfg.max_connections.min(Semaphore::MAX_PERMITS)),
        refusals: Refusals::default(),
        retry_after: AtomicU64::new(0),
        retry_after_max_s: AtomicU64::new(0),
    });

    let sampler_task = {
        let ctx = ctx.clone();
        let stop = sampler_stop.clone();
        let latest = latest.clone();
        let interval = cfg.metrics_interval;
        tokio::spawn(async move {
            let mut out: Vec<Tick> = Vec::new();
            if !sampler.has_sources() {
                return (sampler, out);
            }
            let mut next = Instant::now() + interval;
            loop {
                tokio::time::sleep_until(next.into()).await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let t0 = ctx.t();
                let r = sampler.read().await;
                let t = (t0 + ctx.t()) / 2.0;
                *latest.lock() = r;
                // Bounded, as the loadtest's timeline is: a day at 10 ms stays plottable.
                if out.len() < crate::timeline::MAX_SAMPLES {
                    out.push((t, r, ctx.in_flight.load(Ordering::Relaxed)));
                }
                next += interval;
                let now = Instant::now();
                if next < now {
                    next = now + interval;
                }
            }
            (sampler, out)
        })
    };

    // The load.
    if open {
        let plan: Vec<(f64, Option<f64>)> = cfg
            .stages
            .iter()
            .map(|s| match s.target {
                StageLoad::Rate(r) => (r, s.duration.map(|d| d.as_secs_f64())),
                StageLoad::Workers(_) => (0.0, None),
            })
            .collect();
        tokio::spawn(dispatcher(ctx.clone(), plan, cfg.arrival, cfg.seed));
    }
    let mut stages_run: Vec<StageRun> = Vec::new();
    let mut stop_reason = StopReason::Completed;
    let mut stop_hint: Option<String> = None;
    let mut spawned = 0usize;
    let mut last_progress = Instant::now() - Duration::from_secs(1);
    let mut boundary = 0.0f64;
    let mut prog = Progress {
        phase: "load".into(),
        planned_s: planned,
        stages: cfg.stages.len(),
        requests_planned: cfg.max_requests,
        ..Default::default()
    };
    'stages: for (i, st) in cfg.stages.iter().enumerate() {
        ctx.stage.store(i, Ordering::Relaxed);
        let stage_start = ctx.t();
        if let StageLoad::Workers(c) = st.target {
            while spawned < c {
                ctx.live_workers.fetch_add(1, Ordering::Relaxed);
                let w = closed_worker(ctx.clone(), spawned);
                match shards {
                    Some(sh) => sh.spawn(spawned, w),
                    None => drop(tokio::spawn(w)),
                }
                spawned += 1;
            }
            ctx.workers_target.store(c, Ordering::Relaxed);
            ctx.notify.notify_waiters();
        }
        debug!(stage = i, ?st.target, "stage start");
        let end_at = st.duration.map(|d| boundary + d.as_secs_f64());
        loop {
            let now = ctx.t();
            let wait = end_at.map(|e| (e - now).clamp(0.0, 0.005)).unwrap_or(0.005);
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            if last_progress.elapsed() >= Duration::from_millis(100) {
                last_progress = Instant::now();
                let l = *latest.lock();
                prog.elapsed_s = ctx.t();
                prog.stage = i;
                prog.concurrency = match st.target {
                    StageLoad::Workers(c) => c,
                    StageLoad::Rate(_) => ctx.in_flight.load(Ordering::Relaxed),
                };
                prog.rate_per_s = match st.target {
                    StageLoad::Rate(r) => Some(r),
                    StageLoad::Workers(_) => None,
                };
                prog.in_flight = ctx.in_flight.load(Ordering::Relaxed);
                prog.requests_done = ctx.finished.load(Ordering::Relaxed);
                prog.shed = ctx.shed.load(Ordering::Relaxed);
                prog.errors = ctx.failed.load(Ordering::Relaxed);
                prog.allocated_bytes = l.allocated.unwrap_or(0);
                prog.reserved_bytes = l.reserved.unwrap_or(0);
                prog.capacity_bytes = l.capacity.unwrap_or(0);
                prog.ooms = l.num_ooms.unwrap_or(0);
                progress(&prog);
            }
            if cfg.stop_at_first_oom && oom_seen(&ctx, &readings_first, &latest) {
                stop_reason = StopReason::OomFound;
                ctx.cancelled.store(true, Ordering::Relaxed);
                stages_run.push((i, stage_start, ctx.t()));
                info!(stage = i, "first OOM: the ramp stops");
                break 'stages;
            }
            if let Some(status) = ctx.refusals.stop_status() {
                stop_reason = StopReason::Refused;
                let h = hint(status, &prep.method, &cfg.url);
                warn!(status, "{h}");
                stop_hint = Some(h);
                ctx.cancelled.store(true, Ordering::Relaxed);
                stages_run.push((i, stage_start, ctx.t()));
                break 'stages;
            }
            if stop.load(Ordering::Relaxed) {
                stop_reason = StopReason::Cancelled;
                ctx.cancelled.store(true, Ordering::Relaxed);
                stages_run.push((i, stage_start, ctx.t()));
                break 'stages;
            }
            if ctx.limit_hit.load(Ordering::Relaxed) {
                // Every request number below -n is handed out: done once none is in flight
                // (idle workers of an earlier, larger stage do not count).
                let all_done = if open {
                    ctx.finished.load(Ordering::Relaxed) + ctx.dropped.load(Ordering::Relaxed)
                        >= ctx.scheduled.load(Ordering::Relaxed)
                } else {
                    ctx.live_workers.load(Ordering::Relaxed) == 0
                        || ctx.started.load(Ordering::Relaxed)
                            == ctx.finished.load(Ordering::Relaxed)
                };
                if all_done {
                    stages_run.push((i, stage_start, ctx.t()));
                    break 'stages;
                }
            }
            if end_at.is_some_and(|e| ctx.t() >= e) {
                match ramp_step_end(cfg, &ctx, i, st.target, end_at.unwrap_or(0.0)) {
                    StepEnd::Hold => {}
                    StepEnd::Next => break,
                    StepEnd::Saturated => {
                        stop_reason = StopReason::Saturated;
                        ctx.cancelled.store(true, Ordering::Relaxed);
                        stages_run.push((i, stage_start, ctx.t()));
                        info!(stage = i, "no answer at this step: the ramp stops");
                        break 'stages;
                    }
                }
            }
        }
        stages_run.push((i, stage_start, ctx.t()));
        boundary = match end_at {
            // A held ramp step ends late; the next step gets its whole duration.
            Some(e) if cfg.stop_at_first_oom => e.max(ctx.t()),
            Some(e) => e,
            None => boundary,
        };
    }
    let load_end = ctx.t();
    ctx.done.store(true, Ordering::SeqCst);
    ctx.notify.notify_waiters();
    // Grace: requests in flight finish or are given up.
    let grace = cfg.timeout.min(Duration::from_secs(5));
    let g0 = Instant::now();
    while (ctx.started.load(Ordering::Relaxed) > ctx.finished.load(Ordering::Relaxed)
        || ctx.pending.load(Ordering::Relaxed) > 0)
        && g0.elapsed() < grace
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let totals = ctx.rec.finish();
    let aborted = ctx
        .started
        .load(Ordering::Relaxed)
        .saturating_sub(ctx.finished.load(Ordering::Relaxed));
    let dropped = ctx.dropped.load(Ordering::Relaxed)
        + ctx.scheduled.load(Ordering::Relaxed).saturating_sub(
            ctx.started.load(Ordering::Relaxed) + ctx.dropped.load(Ordering::Relaxed),
        );

    // The sampler: stop it, then one more sample of the service at rest.
    sampler_stop.store(true, Ordering::Relaxed);
    let (mut sampler, sampled) = sampler_task
        .await
        .map_err(|e| LoadError::Thread(format!("memory sampler: {e}")))?;
    readings.extend(sampled);
    if has_sources {
        let t0 = ctx.t();
        let r = sampler.read().await;
        readings.push(((t0 + ctx.t()) / 2.0, r, 0));
    }

    // The probe's snapshots.
    let service_ooms = ooms_during(&readings);
    let mut probe = None;
    let mut snapshot = None;
    let mut oom_snapshot = None;
    if cfg.probe && sampler.is_probe {
        if let Some(u) = sampler.scrape_url() {
            let base = crate::http::probe::probe_base(u);
            let total_ooms = readings.last().and_then(|r| r.1.num_ooms).unwrap_or(0);
            let (p, s, o) =
                crate::http::probe::fetch(&base, Duration::from_secs(30), total_ooms).await;
            probe = Some(p);
            snapshot = s;
            oom_snapshot = o;
        }
    }
    // --predict needs each device's own capacity: one more scrape, kept whole.
    let mut caps = Vec::new();
    if cfg.predict.is_some() {
        if let Some(u) = sampler.scrape_url() {
            caps = scrape_capacities(u, scrape_timeout(cfg)).await;
        }
    }

    let wall_s = load_end;
    let mut sources = sampler.infos();
    sources.extend(prep.absent);
    let agg = Aggregate {
        cfg,
        method: prep.method,
        body: ctx.bodies.describe().to_string(),
        open,
        totals,
        stages_run,
        stop_reason,
        wall_s,
        readings,
        peak_in_flight: ctx
            .peak_in_flight
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .collect(),
        aborted,
        dropped,
        connections: ctx.connections.load(Ordering::Relaxed),
        service_ooms,
        first_stats: std::mem::take(&mut sampler.first_stats),
        last_stats: std::mem::take(&mut sampler.last_stats),
        probe,
        shed_reasons: crate::http::sample::rejections_during(
            sampler.first_rejections.as_ref(),
            &sampler.last_rejections,
        ),
        retry_after_answers: ctx.retry_after.load(Ordering::Relaxed),
        retry_after_max_s: match ctx.retry_after.load(Ordering::Relaxed) {
            0 => None,
            _ => Some(ctx.retry_after_max_s.load(Ordering::Relaxed)),
        },
    };
    let mut measured = agg.measured();
    if let Some(h) = measured.result.http.as_mut() {
        h.stop_hint = stop_hint;
    }
    Ok(Driven {
        measured,
        caps,
        sources,
        snapshot,
        oom_snapshot,
    })
}

/// What one HTTP run leaves: its measurements, each device's capacity (for `--predict`),
/// the memory sources it read, and the probe's snapshots.
pub(crate) struct Driven {
    pub(crate) measured: crate::aggregate::Measured,
    pub(crate) caps: Vec<DeviceCapacity>,
    pub(crate) sources: Vec<MemorySourceInfo>,
    pub(crate) snapshot: Option<vramroom_alloc::Snapshot>,
    pub(crate) oom_snapshot: Option<vramroom_alloc::Snapshot>,
}

async fn scrape_capacities(url: &str, timeout: Duration) -> Vec<DeviceCapacity> {
    let Ok(t) = client::resolve(url) else {
        return Vec::new();
    };
    match client::get(&t, timeout, hyper::Method::GET).await {
        Ok((200, body)) => match crate::http::prometheus::parse(&String::from_utf8_lossy(&body)) {
            Ok(e) => device_capacities(&e),
            Err(_) => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// Whether the run has met an OOM: an answer naming one, or the service's counter above
/// where it started.
fn oom_seen(ctx: &Ctx, first: &Option<u64>, latest: &Mutex<MemoryReading>) -> bool {
    if ctx.oom_answers.load(Ordering::Relaxed) > 0 {
        return true;
    }
    match (first, latest.lock().num_ooms) {
        (Some(a), Some(b)) => b > *a,
        _ => false,
    }
}

/// OOMs the service's counter shows during the run: (last − first), when exported.
fn ooms_during(readings: &[Tick]) -> Option<u64> {
    let first = readings.iter().find_map(|r| r.1.num_ooms)?;
    let last = readings.iter().rev().find_map(|r| r.1.num_ooms)?;
    Some(last.saturating_sub(first))
}
