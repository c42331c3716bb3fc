//! The load runner: a closed model of N workers on one device, driven through stages.
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

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::{debug, info, warn};

use headroom_alloc::{AllocatorConfig, HistoryMode, Snapshot};
use headroom_tensor::TensorError;

use crate::error::{LoadError, Result};
use crate::results::*;
use crate::search::{oom_search, SearchConfig};
use crate::threshold::{evaluate_thresholds, Threshold};
use crate::timeline::{category_bytes, latency_stats, Outcome, Phase, RequestRecord, Timeline};
use headroom_workload::device::{make_device, DeviceChoice, RunDevice, MAX_WORKERS};
use headroom_workload::stages::{StageLoad, MAX_STAGES};
use headroom_workload::{Scenario, WorkerState, Workload};

/// One stage: `concurrency` workers until `duration` passes or, when set, until
/// `requests_per_worker × concurrency` requests have completed, whichever comes first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stage {
    pub concurrency: usize,
    pub duration: Option<Duration>,
    pub requests_per_worker: Option<u64>,
}

impl Stage {
    pub fn timed(concurrency: usize, duration: Duration) -> Stage {
        Stage {
            concurrency,
            duration: Some(duration),
            requests_per_worker: None,
        }
    }
    pub fn counted(concurrency: usize, requests_per_worker: u64) -> Stage {
        Stage {
            concurrency,
            duration: None,
            requests_per_worker: Some(requests_per_worker),
        }
    }
}

/// How the concurrency rises in `--ramp-until-oom`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RampStep {
    Add(usize),
    Mul(usize),
}

/// How the load is driven.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadPlan {
    /// k6-style stages (`--stages`), or one stage for `-c N -d T`.
    Stages(Vec<Stage>),
    /// `-n`: exactly `total` requests with `concurrency` workers.
    Requests { concurrency: usize, total: u64 },
    /// `--ramp-until-oom`: stages of rising concurrency until the first OOM, bounded by
    /// `max_concurrency` and `time_limit`.
    RampUntilOom {
        start: usize,
        step: RampStep,
        /// Each ramp stage's length (its `concurrency` field is ignored).
        stage: Stage,
        max_concurrency: usize,
        time_limit: Duration,
    },
}

/// Everything a run needs. `LoadConfig::default()` is the default `headroom loadtest`.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub scenario: Scenario,
    pub device: DeviceChoice,
    /// Device capacity in bytes (simulated on cpu and meta).
    pub capacity: u64,
    /// `PYTORCH_CUDA_ALLOC_CONF` syntax; `""` is the default config.
    pub alloc_conf: String,
    pub plan: LoadPlan,
    /// Period of the memory sampler.
    pub sample_period: Duration,
    /// The OOM search (on meta) after the load; `None` skips it.
    pub search: Option<SearchConfig>,
    /// Run the diagnosis (findings) after the load.
    pub diagnose: bool,
    /// Allocator configs to replay the run's trace under (the what-if table). The run's
    /// own config is always replayed first.
    pub what_if: Vec<String>,
    pub thresholds: Vec<Threshold>,
    /// Entries of allocator history kept for the snapshot (ring buffer).
    pub history_entries: usize,
    /// Memory seen from outside the allocator (NVML on a CUDA device), sampled with every
    /// periodic timeline sample: the process's bytes on the device and the context +
    /// library overhead beside the allocator's numbers. `None`: the allocator's view only.
    pub memory_source: Option<Arc<dyn crate::memsource::MemorySource>>,
}

pub use headroom_workload::device::DEFAULT_CAPACITY;

/// The default what-if configs.
pub const DEFAULT_WHAT_IF: [&str; 3] = [
    "expandable_segments:True",
    "max_split_size_mb:128",
    "garbage_collection_threshold:0.6",
];

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            scenario: Scenario::default(),
            device: DeviceChoice::Cpu,
            capacity: DEFAULT_CAPACITY,
            alloc_conf: String::new(),
            plan: LoadPlan::Stages(vec![
                Stage::timed(1, Duration::from_secs(5)),
                Stage::timed(4, Duration::from_secs(10)),
                Stage::timed(8, Duration::from_secs(10)),
            ]),
            sample_period: Duration::from_millis(20),
            search: Some(SearchConfig::default()),
            diagnose: true,
            what_if: DEFAULT_WHAT_IF.iter().map(|s| s.to_string()).collect(),
            thresholds: Vec::new(),
            history_entries: 400_000,
            memory_source: None,
        }
    }
}

/// Parses the loadtest's k6-style stages `workers:duration,...`, e.g. `1:10s,4:20s,16:20s`
/// (headroom-workload's parser; a rate is `headroom http`'s open model, refused here).
pub fn parse_stages(s: &str) -> Result<Vec<Stage>> {
    headroom_workload::parse_stages(s, MAX_WORKERS)?
        .into_iter()
        .enumerate()
        .map(|(i, st)| match st.load {
            StageLoad::Workers(n) => Ok(Stage::timed(n, st.duration)),
            StageLoad::Rate(_) => Err(LoadError::Stages {
                input: s.to_string(),
                msg: format!(
                    "stage {}: a rate is the open model of headroom http; loadtest stages are worker counts",
                    i + 1
                ),
            }),
        })
        .collect()
}

impl LoadConfig {
    /// Checks everything a user can get wrong, before any work starts.
    pub fn validate(&self) -> Result<AllocatorConfig> {
        if self.capacity == 0 {
            return Err(LoadError::Config(
                "capacity must be more than 0 bytes".into(),
            ));
        }
        self.scenario.validate()?;
        let conf = AllocatorConfig::parse(&self.alloc_conf)
            .map_err(|e| LoadError::AllocConf(e.to_string()))?;
        for w in &self.what_if {
            AllocatorConfig::parse(w).map_err(|e| LoadError::AllocConf(format!("{w:?}: {e}")))?;
        }
        if self.sample_period < Duration::from_millis(1) {
            return Err(LoadError::Config(
                "sample period must be at least 1ms".into(),
            ));
        }
        let check_stage = |s: &Stage| -> Result<()> {
            if s.duration.is_none() && s.requests_per_worker.is_none() {
                return Err(LoadError::Config(
                    "a stage needs a duration or a request count".into(),
                ));
            }
            if s.requests_per_worker == Some(0) {
                return Err(LoadError::Config(
                    "requests per worker must be at least 1".into(),
                ));
            }
            Ok(())
        };
        let check_workers = |what: &str, n: usize| -> Result<()> {
            if n > MAX_WORKERS {
                return Err(LoadError::Config(format!(
                    "{what} {n}: at most {MAX_WORKERS} workers are allowed"
                )));
            }
            Ok(())
        };
        match &self.plan {
            LoadPlan::Stages(v) => {
                if v.is_empty() {
                    return Err(LoadError::Config("at least one stage is needed".into()));
                }
                if v.len() > MAX_STAGES {
                    return Err(LoadError::Config(format!(
                        "{} stages: at most {MAX_STAGES} are allowed",
                        v.len()
                    )));
                }
                for s in v {
                    if s.concurrency == 0 {
                        return Err(LoadError::Config("concurrency must be at least 1".into()));
                    }
                    check_workers("concurrency", s.concurrency)?;
                    check_stage(s)?;
                }
            }
            LoadPlan::Requests { concurrency, total } => {
                if *concurrency == 0 || *total == 0 {
                    return Err(LoadError::Config(
                        "concurrency and request count must be at least 1".into(),
                    ));
                }
                check_workers("concurrency", *concurrency)?;
            }
            LoadPlan::RampUntilOom {
                start,
                step,
                stage,
                max_concurrency,
                ..
            } => {
                if *start == 0 || *max_concurrency < *start {
                    return Err(LoadError::Config(
                        "ramp start must be at least 1 and at most the maximum".into(),
                    ));
                }
                check_workers("ramp maximum", *max_concurrency)?;
                match step {
                    RampStep::Add(0) | RampStep::Mul(0) | RampStep::Mul(1) => {
                        return Err(LoadError::Config(
                            "the ramp step must raise the load".into(),
                        ))
                    }
                    _ => {}
                }
                check_stage(stage)?;
            }
        }
        Ok(conf)
    }

    fn load_info(&self) -> LoadInfo {
        let si = |s: &Stage| StageSpecInfo {
            concurrency: s.concurrency,
            duration_s: s.duration.map(|d| d.as_secs_f64()),
        };
        let (mode, stages, max_requests, time_limit_s) = match &self.plan {
            LoadPlan::Stages(v) if v.len() == 1 => {
                ("fixed", v.iter().map(si).collect(), None, None)
            }
            LoadPlan::Stages(v) => ("stages", v.iter().map(si).collect(), None, None),
            LoadPlan::Requests { concurrency, total } => (
                "requests",
                vec![StageSpecInfo {
                    concurrency: *concurrency,
                    duration_s: None,
                }],
                Some(*total),
                None,
            ),
            LoadPlan::RampUntilOom { time_limit, .. } => (
                "ramp_until_oom",
                Vec::new(),
                None,
                Some(time_limit.as_secs_f64()),
            ),
        };
        LoadInfo {
            mode: mode.into(),
            stages,
            max_requests,
            time_limit_s,
            sample_period_ms: self.sample_period.as_secs_f64() * 1e3,
        }
    }
}

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
            .name("headroom-deadline".into())
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
                    .name(format!("headroom-worker-{i}"))
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
                        Stage {
                            concurrency: *concurrency,
                            duration: None,
                            requests_per_worker: None,
                        }
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
                            concurrency: ramp_c,
                            ..*stage
                        }
                    }
                };
                phase.stage.store(index, Ordering::Relaxed);
                phase
                    .concurrency
                    .store(stage.concurrency, Ordering::Relaxed);
                let stage_start = t();
                let done_at_start = ctl.completed.load(Ordering::Relaxed)
                    + ctl.ooms.load(Ordering::Relaxed)
                    + ctl.errors.load(Ordering::Relaxed);
                debug!(
                    stage = index,
                    concurrency = stage.concurrency,
                    "stage start"
                );
                let stage_end = match plan {
                    // a ramp stage lasts its full length, wherever it starts
                    LoadPlan::RampUntilOom { .. } => stage.duration.map(|d| Instant::now() + d),
                    _ => stage.duration.map(|d| {
                        stage_end_offset += d;
                        load_start + stage_end_offset
                    }),
                };
                if let Some(clock) = dev.clock.as_ref() {
                    clock.gate(stage.concurrency);
                }
                spawn_upto(stage.concurrency, &mut spawned)?;
                let running = spawned.min(stage.concurrency);
                if running < stage.concurrency {
                    warn!(
                        stage = index,
                        started = running,
                        planned = stage.concurrency,
                        "the load ended before all workers of the stage could start"
                    );
                }
                ctl.target.store(stage.concurrency, Ordering::SeqCst);
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
                        concurrency: stage.concurrency,
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
                        if finished - done_at_start >= r * stage.concurrency as u64 {
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
    loop {
        if ctl.done.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
            break;
        }
        if i >= ctl.target.load(Ordering::Relaxed) {
            ctl.idle_until(|| {
                i < ctl.target.load(Ordering::Relaxed) || ctl.done.load(Ordering::Relaxed)
            });
            continue;
        }
        let request = ctl.next_request.fetch_add(1, Ordering::Relaxed);
        if ctl.request_limit.is_some_and(|l| request >= l) {
            // -n reached: idle until the controller ends the load.
            ctl.idle_until(|| ctl.done.load(Ordering::Relaxed));
            continue;
        }
        let stage = phase.stage.load(Ordering::Relaxed);
        let concurrency = phase.concurrency.load(Ordering::Relaxed);
        let t0 = Instant::now();
        let start_s = t0.duration_since(start).as_secs_f64();
        let res = catch_unwind(AssertUnwindSafe(|| {
            // Under a virtual clock the request runs in its turns; the guard leaves the
            // schedule when the request is over, so an idle worker never holds the baton.
            let _turn = dev.clock.as_ref().map(|c| c.enter(i));
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

fn throughput(s: &RequestSummary, secs: f64) -> Throughput {
    if secs <= 0.0 {
        return Throughput::default();
    }
    Throughput {
        requests_per_s: s.ok as f64 / secs,
        items_per_s: s.items as f64 / secs,
    }
}

/// Runs a load test. This is the entry point of `headroom loadtest`.
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
                .name("headroom-sampler".into())
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
        if let Some(sc) = &cfg.search {
            prog.phase = "search".into();
            progress(&prog);
            match oom_search(&cfg.scenario, cfg.capacity, &conf, sc, &stop) {
                Ok(s) => result.oom_search = Some(s),
                Err(e) => warn!(error = %e, "OOM search failed"),
            }
        }
        prog.phase = "what_if".into();
        progress(&prog);
        result.what_if = crate::diagnose::what_if(&result, &cfg.alloc_conf, &cfg.what_if);
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
    stats: &headroom_alloc::DeviceStats,
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
                throughput: throughput(&req, s1 - s0),
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
                throughput: throughput(&req, secs),
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
        headroom_version: env!("CARGO_PKG_VERSION").into(),
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
        throughput: throughput(&requests, out.wall_s),
        errors,
        stages,
        by_concurrency,
        timeline: timeline_samples,
        peaks,
        ooms: out.oom_records,
        oom_search: None,
        findings: Vec::new(),
        what_if: Vec::new(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_parse() {
        let s = parse_stages("1:10s,4:20s, 16:1m30s").unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0], Stage::timed(1, Duration::from_secs(10)));
        assert_eq!(s[2].duration, Some(Duration::from_secs(90)));
        assert_eq!(
            parse_stages("2:500ms").unwrap()[0].duration,
            Some(Duration::from_millis(500))
        );
        for bad in [
            "", "1", "0:10s", "x:10s", "1:10", "1:-3s", "1:10q", "1:10s,",
        ] {
            let r = parse_stages(bad);
            if bad == "1:10" {
                // a bare number is seconds
                assert!(r.is_ok());
                continue;
            }
            let e = r.expect_err(bad).to_string();
            assert!(e.contains("invalid stages"), "{bad}: {e}");
        }
        // DURATION:TARGET is k6's ramping form: 0 to 1 worker over 10 s is 1 worker held.
        assert_eq!(
            parse_stages("10s:1").unwrap(),
            vec![Stage::timed(1, Duration::from_secs(10))]
        );
    }

    #[test]
    fn config_validation() {
        let mut c = LoadConfig {
            capacity: 0,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("capacity"));
        c.capacity = 1 << 30;
        c.alloc_conf = "bogus_option:3".into();
        assert!(c.validate().is_err());
        c.alloc_conf = String::new();
        assert!(c.validate().is_ok());
        // cuda parses where there is a GPU and says why not elsewhere.
        match headroom_cuda::unavailable_reason() {
            Some(_) => assert!(matches!(
                "cuda".parse::<DeviceChoice>(),
                Err(headroom_workload::WorkloadError::DeviceUnavailable(..))
            )),
            None => assert!("cuda:0".parse::<DeviceChoice>().is_ok()),
        }
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
        assert!("tpu".parse::<DeviceChoice>().is_err());
    }
}
