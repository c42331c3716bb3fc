//! The load engine: a closed model of N workers on one device, driven through stages.
//!
//! Design note: workers are threads sharing one [`RunDevice`] and its caching allocator,
//! as PyTorch threads of one server process share its CUDA allocator. The load is *closed*:
//! each worker sends its next request as soon as the last one returns, so concurrency is
//! the number of requests in flight. A controller (the calling thread) moves through the
//! stages by setting a target worker count; workers above the target idle (keeping their
//! per-worker state, as an idle thread of a pool does), new workers are spawned the first
//! time they are needed. An OOM fails only the request that hit it: its tensors drop as
//! the error returns, the failure is counted and the allocator's state is recorded, and
//! the worker goes on with its next request.
//!
//! Cancellation is cooperative: the caller's stop flag (Ctrl-C) is checked by the
//! controller and by every worker between requests, and whatever was measured is returned
//! as a normal result with `stop_reason: cancelled`.
//!
//! The engine drives load and records requests, nothing more: the pipeline
//! ([`crate::pipeline`]) wraps it with the timeline, and the OOM search ([`crate::search`])
//! calls it for its probes.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::{debug, warn};

use vramroom_alloc::Snapshot;
use vramroom_tensor::TensorError;

use crate::config::{LoadPlan, RampStep, Stage};
use crate::error::{LoadError, Result};
use crate::results::*;
use crate::timeline::{category_bytes, Outcome, Phase, RequestRecord};
use vramroom_workload::device::RunDevice;
use vramroom_workload::stages::StageLoad;
use vramroom_workload::{Scenario, WorkerState, Workload};

fn error_kind(e: &TensorError) -> &'static str {
    match e {
        TensorError::ShapeMismatch { .. } => "shape",
        TensorError::DTypeMismatch { .. } | TensorError::UnsupportedDType { .. } => "dtype",
        TensorError::DeviceMismatch { .. } | TensorError::UnsupportedDevice { .. } => "device",
        TensorError::NoGrad | TensorError::Autograd(_) | TensorError::ModifiedInPlace { .. } => {
            "autograd"
        }
        TensorError::OutOfMemory { .. } => "oom",
        TensorError::Alloc(_) => "alloc",
        TensorError::InvalidArgument { .. } => "invalid_argument",
        TensorError::IndexOutOfRange { .. } => "index",
        TensorError::Cuda(_) => "cuda",
        TensorError::Interrupted => "interrupted",
    }
}

/// Shared between the controller and the workers.
struct Control {
    /// Workers with index below this run requests.
    target: AtomicUsize,
    /// Set when the load is over (plan done, or stop): workers exit.
    done: AtomicBool,
    next_request: AtomicU64,
    /// `-n`: no request number at or above this is started.
    request_limit: Option<u64>,
    completed: AtomicU64,
    ooms: AtomicU64,
    errors: AtomicU64,
    records: Mutex<Vec<RequestRecord>>,
    oom_records: Mutex<Vec<OomRecord>>,
    oom_snapshot: Mutex<Option<Snapshot>>,
    /// Idle workers wait here rather than polling: thousands of threads waking every few
    /// milliseconds would take the cores from the workers that run requests (and from
    /// the controller spawning the rest).
    wake_lock: Mutex<()>,
    wake: parking_lot::Condvar,
}

impl Control {
    /// Waits until `ready()` may have become true: a [`Control::wake_all`], or at the
    /// latest [`IDLE_RECHECK`] (a safety net; the stop flag is also seen then).
    fn idle_until(&self, ready: impl Fn() -> bool) {
        let mut g = self.wake_lock.lock();
        if !ready() {
            self.wake.wait_for(&mut g, IDLE_RECHECK);
        }
    }
    /// After changing `target` or `done`: every idle worker looks again.
    fn wake_all(&self) {
        let _g = self.wake_lock.lock();
        self.wake.notify_all();
    }
}

/// How long past its planned end a load may run before the deadline thread ends it.
const END_GRACE: Duration = Duration::from_millis(250);

/// How often an idle worker looks at the stop flag without being woken.
const IDLE_RECHECK: Duration = Duration::from_millis(100);

/// The measurement of a load phase, before diagnosis. Also what the OOM search's probes
/// return.
pub(crate) struct LoadOutcome {
    pub records: Vec<RequestRecord>,
    /// Each stage as it ran: the stage, start and end (s), workers started.
    pub stages_run: Vec<(Stage, f64, f64, usize)>,
    pub stop_reason: StopReason,
    pub wall_s: f64,
    pub oom_records: Vec<OomRecord>,
    pub oom_snapshot: Option<Snapshot>,
}

/// Runs `plan` on `workload` with workers on their own threads. The caller owns the
/// timeline (observer and sampler); this only drives load and records requests.
pub(crate) fn drive(
    workload: &Workload,
    dev: &RunDevice,
    plan: &LoadPlan,
    phase: &Phase,
    timeline_start: Instant,
    stop: &AtomicBool,
    mut on_tick: impl FnMut(&ControlView),
) -> Result<LoadOutcome> {
    let ctl = Control {
        target: AtomicUsize::new(0),
        done: AtomicBool::new(false),
        next_request: AtomicU64::new(0),
        request_limit: match plan {
            LoadPlan::Requests { total, .. } => Some(*total),
            _ => None,
        },
        completed: AtomicU64::new(0),
        ooms: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        records: Mutex::new(Vec::new()),
        oom_records: Mutex::new(Vec::new()),
        oom_snapshot: Mutex::new(None),
        wake_lock: Mutex::new(()),
        wake: parking_lot::Condvar::new(),
    };
    let t = || timeline_start.elapsed().as_secs_f64();
    let mut stages_run: Vec<(Stage, f64, f64, usize)> = Vec::new();
    let mut stop_reason = StopReason::Completed;
    let load_start = Instant::now();
    // Stage ends are absolute, from the start of the load: the overhead of starting a
    // stage (spawning its workers, the controller's tick) never adds up over the stages,
    // so the load lasts what its stages say, however many there are.
    let mut stage_end_offset = Duration::ZERO;
    // The hard end of the load, when the plan has one: every timed stage's duration
    // summed, or the ramp's time limit. At that point, or on Ctrl-C, requests still in
    // flight are interrupted at their next op instead of being waited for.
    // The deadline thread acts [`END_GRACE`] after the planned end: normally the controller
    // has ended the load by then, having run every stage; the thread is the backstop for a
    // controller held up behind the workers.
    let hard_end: Option<Instant> = match plan {
        LoadPlan::Stages(v) => v
            .iter()
            .map(|s| s.duration)
            .sum::<Option<Duration>>()
            .map(|d| load_start + d + END_GRACE),
        LoadPlan::RampUntilOom { time_limit, .. } => Some(load_start + *time_limit + END_GRACE),
        LoadPlan::Requests { .. } => None,
    };
    let out_of_time =
        || stop.load(Ordering::Relaxed) || hard_end.is_some_and(|e| Instant::now() >= e);

    // Ends the load at its hard end, or at Ctrl-C: the workers leave and requests in
    // flight stop at their next op. A thread of its own that takes no lock, because the
    // controller may wait behind thousands of workers for the allocator's lock (its
    // progress reads the stats) and must not be what decides when the load ends.
    let end_load = || {
        ctl.done.store(true, Ordering::SeqCst);
        dev.device.interrupt(true);
        ctl.wake_all();
    };
    let scoped = std::thread::scope(|scope| -> Result<()> {
        let ctl_ref = &ctl;
        let end_load = &end_load;
        std::thread::Builder::new()
            .name("vramroom-deadline".into())
            .spawn_scoped(scope, move || {
                while !ctl_ref.done.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if stop.load(Ordering::Relaxed) || hard_end.is_some_and(|e| now >= e) {
                        end_load();
                        break;
                    }
                    let nap = Duration::from_millis(10);
                    let nap = hard_end.map_or(nap, |e| nap.min(e.saturating_duration_since(now)));
                    std::thread::sleep(nap.max(Duration::from_micros(100)));
                }
            })
            .map_err(|e| LoadError::Thread(e.to_string()))?;
        let mut spawned = 0usize;
        // Stops spawning when the load is over (time, or Ctrl-C): a worker that cannot
        // start in time is not started, and the stage reports how many ran.
        let spawn_upto = |n: usize, spawned: &mut usize| -> Result<()> {
            while *spawned < n {
                if spawned.is_multiple_of(64) && out_of_time() {
                    break;
                }
                let i = *spawned;
                let ctl = &ctl;
                std::thread::Builder::new()
                    .name(format!("vramroom-worker-{i}"))
                    .spawn_scoped(scope, move || {
                        worker(i, workload, dev, ctl, phase, timeline_start, stop)
                    })
                    .map_err(|e| LoadError::Thread(e.to_string()))?;
                *spawned += 1;
            }
            Ok(())
        };
        // The stage list: fixed for Stages/Requests, generated for the ramp.
        let mut index = 0usize;
        let mut ramp_c = match plan {
            LoadPlan::RampUntilOom { start, .. } => *start,
            _ => 0,
        };
        let result = (|| -> Result<()> {
            'stages: loop {
                let stage = match plan {
                    LoadPlan::Stages(v) => match v.get(index) {
                        Some(s) => *s,
                        None => break,
                    },
                    LoadPlan::Requests { concurrency, .. } => {
                        if index > 0 {
                            break;
                        }
                        Stage::held(StageLoad::Workers(*concurrency), None)
                    }
                    LoadPlan::RampUntilOom {
                        stage,
                        max_concurrency,
                        ..
                    } => {
                        if ramp_c > *max_concurrency {
                            break;
                        }
                        Stage {
                            target: StageLoad::Workers(ramp_c),
                            ..*stage
                        }
                    }
                };
                phase.stage.store(index, Ordering::Relaxed);
                phase.concurrency.store(stage.workers(), Ordering::Relaxed);
                let stage_start = t();
                let done_at_start = ctl.completed.load(Ordering::Relaxed)
                    + ctl.ooms.load(Ordering::Relaxed)
                    + ctl.errors.load(Ordering::Relaxed);
                debug!(stage = index, concurrency = stage.workers(), "stage start");
                let stage_end = match plan {
                    // a ramp stage lasts its full length, wherever it starts
                    LoadPlan::RampUntilOom { .. } => stage.duration.map(|d| Instant::now() + d),
                    _ => stage.duration.map(|d| {
                        stage_end_offset += d;
                        load_start + stage_end_offset
                    }),
                };
                if let Some(clock) = dev.clock.as_ref() {
                    clock.gate(stage.workers());
                }
                spawn_upto(stage.workers(), &mut spawned)?;
                let running = spawned.min(stage.workers());
                if running < stage.workers() {
                    warn!(
                        stage = index,
                        started = running,
                        planned = stage.workers(),
                        "the load ended before all workers of the stage could start"
                    );
                }
                ctl.target.store(stage.workers(), Ordering::SeqCst);
                ctl.wake_all();
                loop {
                    let tick = Duration::from_millis(5);
                    let nap = match stage_end {
                        Some(e) => tick.min(e.saturating_duration_since(Instant::now())),
                        None => tick,
                    };
                    if !nap.is_zero() {
                        std::thread::sleep(nap);
                    }
                    let finished = ctl.completed.load(Ordering::Relaxed)
                        + ctl.ooms.load(Ordering::Relaxed)
                        + ctl.errors.load(Ordering::Relaxed);
                    on_tick(&ControlView {
                        stage: index,
                        concurrency: stage.workers(),
                        completed: finished,
                        ooms: ctl.ooms.load(Ordering::Relaxed),
                        errors: ctl.errors.load(Ordering::Relaxed),
                    });
                    if stop.load(Ordering::Relaxed) {
                        stop_reason = StopReason::Cancelled;
                        stages_run.push((stage, stage_start, t(), running));
                        break 'stages;
                    }
                    if ctl.done.load(Ordering::Relaxed) {
                        // the deadline thread ended the load at its hard end
                        if let LoadPlan::RampUntilOom { .. } = plan {
                            stop_reason = StopReason::TimeLimit;
                        }
                        stages_run.push((stage, stage_start, t(), running));
                        break 'stages;
                    }
                    if let LoadPlan::RampUntilOom { time_limit, .. } = plan {
                        if ctl.ooms.load(Ordering::Relaxed) > 0 {
                            stop_reason = StopReason::OomFound;
                            stages_run.push((stage, stage_start, t(), running));
                            break 'stages;
                        }
                        if load_start.elapsed() >= *time_limit {
                            stop_reason = StopReason::TimeLimit;
                            stages_run.push((stage, stage_start, t(), running));
                            break 'stages;
                        }
                    }
                    if let Some(limit) = ctl.request_limit {
                        if finished >= limit {
                            break;
                        }
                    }
                    if stage_end.is_some_and(|e| Instant::now() >= e) {
                        break;
                    }
                    if let Some(r) = stage.requests_per_worker {
                        if finished - done_at_start >= r * stage.workers() as u64 {
                            break;
                        }
                    }
                }
                stages_run.push((stage, stage_start, t(), running));
                index += 1;
                if let LoadPlan::RampUntilOom { step, .. } = plan {
                    ramp_c = match step {
                        RampStep::Add(n) => ramp_c.saturating_add(*n),
                        RampStep::Mul(n) => ramp_c.saturating_mul(*n),
                    };
                }
            }
            Ok(())
        })();
        // The load is over: workers leave, and a request in flight stops at its next op
        // (it cannot be preempted) instead of holding the end of the run for as long as
        // it takes — under thousands of workers on a few cores, minutes.
        end_load();
        result
    });
    // Scoped workers have all returned here; later phases allocate on this device again.
    dev.device.interrupt(false);
    scoped?;
    let wall_s = load_start.elapsed().as_secs_f64();
    let mut records = std::mem::take(&mut *ctl.records.lock());
    records.sort_by_key(|r| r.request);
    let oom_records = std::mem::take(&mut *ctl.oom_records.lock());
    let oom_snapshot = ctl.oom_snapshot.lock().take();
    Ok(LoadOutcome {
        records,
        stages_run,
        stop_reason,
        wall_s,
        oom_records,
        oom_snapshot,
    })
}

/// What the controller knows at a tick.
pub(crate) struct ControlView {
    pub stage: usize,
    pub concurrency: usize,
    pub completed: u64,
    pub ooms: u64,
    pub errors: u64,
}

fn worker(
    i: usize,
    workload: &Workload,
    dev: &RunDevice,
    ctl: &Control,
    phase: &Phase,
    start: Instant,
    stop: &AtomicBool,
) {
    let mut state = WorkerState::new();
    let mut local: Vec<RequestRecord> = Vec::new();
    // A worker that stops sending requests gives up its place on the virtual clock.
    let rest = || {
        if let Some(c) = dev.clock.as_ref() {
            c.rest(i);
        }
    };
    loop {
        if ctl.done.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
            break;
        }
        if i >= ctl.target.load(Ordering::Relaxed) {
            rest();
            ctl.idle_until(|| {
                i < ctl.target.load(Ordering::Relaxed) || ctl.done.load(Ordering::Relaxed)
            });
            continue;
        }
        // Under a virtual clock the request runs in its turns, and its number (which picks
        // its input) is drawn inside the first one: requests go to workers in virtual-time
        // order, not in the order the OS happened to wake the threads, so a meta run draws
        // the same inputs for the same seed every time. The guard leaves the schedule when
        // the request is over, so an idle worker never holds the baton.
        let turn = dev.clock.as_ref().map(|c| c.enter_closed(i));
        let request = ctl.next_request.fetch_add(1, Ordering::Relaxed);
        if ctl.request_limit.is_some_and(|l| request >= l) {
            drop(turn);
            rest();
            // -n reached: idle until the controller ends the load.
            ctl.idle_until(|| ctl.done.load(Ordering::Relaxed));
            continue;
        }
        let stage = phase.stage.load(Ordering::Relaxed);
        let concurrency = phase.concurrency.load(Ordering::Relaxed);
        let t0 = Instant::now();
        let start_s = t0.duration_since(start).as_secs_f64();
        let res = catch_unwind(AssertUnwindSafe(|| {
            let _turn = turn;
            workload.run_request(&mut state, request)
        }));
        let latency_us = t0.elapsed().as_micros() as u64;
        let (outcome, items) = match res {
            Ok(Ok(items)) => {
                ctl.completed.fetch_add(1, Ordering::Relaxed);
                (Outcome::Ok, items)
            }
            Ok(Err(e)) if e.is_oom() => {
                let n = ctl.ooms.fetch_add(1, Ordering::Relaxed);
                if (n as usize) < MAX_OOM_RECORDS {
                    let rec = oom_record(&e, dev, i, request, stage, concurrency, start);
                    ctl.oom_records.lock().push(rec);
                }
                if n == 0 {
                    *ctl.oom_snapshot.lock() = Some(dev.probe.snapshot());
                }
                debug!(worker = i, request, "request OOM");
                (Outcome::Oom, 0)
            }
            Ok(Err(e)) if e.is_interrupted() => (Outcome::Stopped, 0),
            Ok(Err(e)) => {
                ctl.errors.fetch_add(1, Ordering::Relaxed);
                warn!(worker = i, request, error = %e, "request failed");
                (Outcome::Error(error_kind(&e)), 0)
            }
            Err(_) => {
                ctl.errors.fetch_add(1, Ordering::Relaxed);
                warn!(worker = i, request, "request panicked");
                // A panic may have left this worker's state half-updated: start afresh.
                state = WorkerState::new();
                (Outcome::Error("panic"), 0)
            }
        };
        local.push(RequestRecord {
            request,
            worker: i,
            stage,
            concurrency,
            start_s,
            latency_us,
            items,
            outcome,
        });
        if local.len() >= 64 {
            ctl.records.lock().append(&mut local);
        }
    }
    rest();
    ctl.records.lock().append(&mut local);
    // Worker state (a training replica) drops here, on the worker's thread.
}

fn oom_record(
    e: &TensorError,
    dev: &RunDevice,
    worker: usize,
    request: u64,
    stage: usize,
    concurrency: usize,
    start: Instant,
) -> OomRecord {
    let (requested, message) = match e {
        TensorError::OutOfMemory { message, detail } => {
            (detail.as_ref().map(|d| d.requested), message.clone())
        }
        other => (None, other.to_string()),
    };
    let stats = dev.probe.stats();
    OomRecord {
        t_s: start.elapsed().as_secs_f64(),
        stage,
        concurrency,
        worker,
        request,
        requested_bytes: requested,
        message,
        allocated_bytes: stats.allocated_bytes.all().current.max(0) as u64,
        reserved_bytes: stats.reserved_bytes.all().current.max(0) as u64,
        categories: category_bytes(&dev.device.memory_by_category()),
        memory_stats: stats.memory_stats(),
        memory_summary: dev.probe.memory_summary(),
    }
}

/// Runs `plan` for `scenario` on `dev` with no measurement beyond the allocator's own, for
/// probes and examples: returns (allocated before the load, peak allocated, peak reserved).
pub fn drive_for_probe(
    scenario: &Scenario,
    dev: &RunDevice,
    plan: &LoadPlan,
    stop: &AtomicBool,
) -> Result<(u64, u64, u64)> {
    let workload = Workload::build(scenario, &dev.device)?;
    let base = dev.device.memory_allocated();
    dev.probe.reset_peak_memory_stats();
    let phase = Phase::default();
    drive(&workload, dev, plan, &phase, Instant::now(), stop, |_| {})?;
    let st = dev.probe.stats();
    workload.release();
    Ok((
        base,
        st.allocated_bytes.all().peak.max(0) as u64,
        st.reserved_bytes.all().peak.max(0) as u64,
    ))
}
