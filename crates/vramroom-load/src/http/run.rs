//! An HTTP load run: check everything, drive the load through its stages, sample memory on
//! the same clock, then turn it all into a [`RunResult`].
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

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Sleep;
use tracing::{debug, info, warn};

use crate::error::{LoadError, Result};
use crate::http::body::{Bodies, BodySpec};
use crate::http::client::{self, Conn, ErrorKind, RequestTemplate, Target};
use crate::http::load::{Arrival, HttpStage, Load, Schedule};
use crate::http::predict::{device_capacities, observed, predict, DeviceCapacity};
use crate::http::prometheus::{MetricMap, Selector, Target as MetricTarget};
use crate::http::record::{self, Done, Outcome, Recorder, StageAcc, Totals};
use crate::http::refusal::{hint, Refusals};
use crate::http::sample::{self, Sampler, Scrape};
use crate::memsource::{MemoryReading, MemorySource, NvmlDevice, NvmlSource};
use crate::results::*;
use crate::threshold::{evaluate_thresholds, Threshold};

/// Everything an HTTP run needs. `HttpConfig::new(url)` is `vramroom http URL` with the
/// defaults.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub url: String,
    /// `None`: GET, or POST when there is a body (as curl does).
    pub method: Option<String>,
    /// `-H 'Name: value'`.
    pub headers: Vec<String>,
    pub body: BodySpec,
    /// At least one; only the last may have no duration (it runs until `-n`).
    pub stages: Vec<HttpStage>,
    /// `-n`: no request beyond this many is sent.
    pub max_requests: Option<u64>,
    pub arrival: Arrival,
    /// Open model: the most connections (requests in flight).
    pub max_connections: usize,
    pub timeout: Duration,
    /// Client runtime threads; 0 = one per core.
    pub threads: usize,
    pub seed: u64,
    /// A Prometheus endpoint to scrape for memory (`--metrics-url`).
    pub metrics_url: Option<String>,
    /// More endpoints (`--metrics-url` repeated: the other ranks of a job), summed with the
    /// first onto the one timeline.
    pub more_metrics_urls: Vec<String>,
    pub metrics_interval: Duration,
    /// `--metric TARGET=SELECTOR`, tried before the known names.
    pub metric_rules: Vec<(MetricTarget, Selector)>,
    /// NVML device to sample (`None`: no NVML).
    pub nvml: Option<NvmlDevice>,
    /// The service's process id, for NVML's per-process figure.
    pub pid: Option<u32>,
    /// More sources (tests pass a fake NVML here).
    pub memory_sources: Vec<Arc<dyn MemorySource>>,
    pub thresholds: Vec<Threshold>,
    /// Fetch the probe's snapshots at the end when the endpoint is a probe.
    pub probe: bool,
    /// Allocator configs to replay the probe's trace under.
    pub what_if: Vec<String>,
    /// Connect once before the run and fail (exit 2) if nothing listens.
    pub check_target: bool,
    /// `--ramp-until-oom`: end the run at the first OOM (an answer naming a CUDA OOM, or the
    /// service's OOM counter rising), so a ramp finds the OOM point without hammering on.
    pub stop_at_first_oom: bool,
    /// `--predict`: after the run, predict from the probe's trace the concurrency at which
    /// the service runs out of memory (see [`crate::http::predict`]).
    pub predict: Option<crate::http::predict::PredictOptions>,
}

impl HttpConfig {
    pub fn new(url: impl Into<String>) -> HttpConfig {
        HttpConfig {
            url: url.into(),
            method: None,
            headers: Vec::new(),
            body: BodySpec::default(),
            stages: vec![HttpStage {
                load: Load::Closed(10),
                duration: Some(Duration::from_secs(10)),
            }],
            max_requests: None,
            arrival: Arrival::Constant,
            max_connections: crate::http::load::DEFAULT_MAX_CONNECTIONS,
            timeout: Duration::from_secs(30),
            threads: 0,
            seed: 1,
            metrics_url: None,
            more_metrics_urls: Vec::new(),
            metrics_interval: Duration::from_millis(250),
            metric_rules: Vec::new(),
            nvml: None,
            pid: None,
            memory_sources: Vec::new(),
            thresholds: Vec::new(),
            probe: true,
            what_if: crate::config::DEFAULT_WHAT_IF
                .iter()
                .map(|s| s.to_string())
                .collect(),
            check_target: true,
            stop_at_first_oom: false,
            predict: None,
        }
    }

    fn is_open(&self) -> bool {
        matches!(self.stages.first().map(|s| s.load), Some(Load::Open(_)))
    }

    /// Checks what can be checked without the network.
    pub fn validate(&self) -> Result<()> {
        if self.stages.is_empty() {
            return Err(LoadError::Config("at least one stage is needed".into()));
        }
        let open = self.is_open();
        for (i, s) in self.stages.iter().enumerate() {
            match s.load {
                Load::Closed(0) => {
                    return Err(LoadError::Config("concurrency must be at least 1".into()))
                }
                Load::Open(r) if !(r.is_finite() && r > 0.0) => {
                    return Err(LoadError::Config("the rate must be more than 0".into()))
                }
                Load::Open(_) if !open => {
                    return Err(LoadError::Config("stages mix workers and rates".into()))
                }
                Load::Closed(_) if open => {
                    return Err(LoadError::Config("stages mix workers and rates".into()))
                }
                _ => {}
            }
            if s.duration.is_none() && (i + 1 < self.stages.len() || self.max_requests.is_none()) {
                return Err(LoadError::Config(
                    "a stage needs a duration (-z) unless it is the last and -n bounds it".into(),
                ));
            }
        }
        if self.max_requests == Some(0) {
            return Err(LoadError::Config("-n must be at least 1".into()));
        }
        if self.max_connections == 0 {
            return Err(LoadError::Config(
                "the connection limit must be at least 1".into(),
            ));
        }
        if self.timeout < Duration::from_millis(1) {
            return Err(LoadError::Config("--timeout must be at least 1ms".into()));
        }
        if self.metrics_interval < Duration::from_millis(10) {
            return Err(LoadError::Config(
                "--metrics-interval must be at least 10ms".into(),
            ));
        }
        for w in &self.what_if {
            vramroom_alloc::AllocatorConfig::parse(w)
                .map_err(|e| LoadError::AllocConf(format!("{w:?}: {e}")))?;
        }
        Ok(())
    }

    fn planned_s(&self) -> Option<f64> {
        self.stages
            .iter()
            .map(|s| s.duration.map(|d| d.as_secs_f64()))
            .sum()
    }
}

/// The run's inputs, checked.
struct Prepared {
    target: Target,
    template: RequestTemplate,
    bodies: Bodies,
    method: String,
    scrapes: Vec<Scrape>,
    blocking: Vec<Arc<dyn MemorySource>>,
    absent: Vec<MemorySourceInfo>,
}

/// Checks the whole config against the world: URL, body files, the metrics endpoint (one
/// scrape), NVML, and (when asked) that something listens at the target.
async fn prepare(cfg: &HttpConfig) -> Result<Prepared> {
    cfg.validate()?;
    let target = client::resolve(&cfg.url)?;
    let bodies = Bodies::new(&cfg.body)?;
    let method = cfg
        .method
        .clone()
        .unwrap_or_else(|| if bodies.is_empty() { "GET" } else { "POST" }.to_string());
    let template = RequestTemplate::new(&target, &method, &cfg.headers, bodies.content_type())?;
    let mut scrapes = Vec::new();
    for u in cfg.metrics_url.iter().chain(cfg.more_metrics_urls.iter()) {
        let t = client::resolve(u).map_err(|e| LoadError::Http(format!("--metrics-url {e}")))?;
        let s = Scrape {
            url: u.clone(),
            target: t,
            map: MetricMap::with_user(cfg.metric_rules.clone()),
        };
        let first = sample::scrape(&s, scrape_timeout(cfg))
            .await
            .map_err(|e| LoadError::Http(format!("--metrics-url {u}: {e}")))?;
        if first.reading.is_empty() {
            warn!(
                url = %u,
                "the metrics endpoint exports no memory metric Vramroom knows; map one with --metric"
            );
        }
        scrapes.push(s);
    }
    let mut blocking: Vec<Arc<dyn MemorySource>> = cfg.memory_sources.clone();
    let mut absent = Vec::new();
    if let Some(dev) = &cfg.nvml {
        match NvmlSource::open(dev.clone(), cfg.pid) {
            Ok(s) => blocking.push(Arc::new(s)),
            Err(e) => {
                info!(reason = %e, "NVML is absent: device memory is not sampled");
                absent.push(MemorySourceInfo {
                    name: format!("nvml:{}", nvml_name(dev)),
                    kind: "nvml".into(),
                    status: "absent".into(),
                    note: e,
                    ..Default::default()
                });
            }
        }
    }
    if cfg.check_target {
        let t = cfg.timeout.min(Duration::from_secs(5));
        if let Err(k) = client::connect(&target, t).await {
            return Err(LoadError::Http(format!(
                "cannot connect to {}: {}",
                cfg.url,
                match k {
                    ErrorKind::ConnectRefused => "connection refused (is the service running?)",
                    ErrorKind::ConnectTimeout => "no answer to the connection (timed out)",
                    _ => "the connection failed",
                }
            )));
        }
    }
    Ok(Prepared {
        target,
        template,
        bodies,
        method,
        scrapes,
        blocking,
        absent,
    })
}

fn nvml_name(d: &NvmlDevice) -> String {
    match d {
        NvmlDevice::Index(i) => i.to_string(),
        NvmlDevice::PciBusId(p) => p.clone(),
    }
}

fn scrape_timeout(cfg: &HttpConfig) -> Duration {
    (cfg.metrics_interval * 4).clamp(Duration::from_secs(1), Duration::from_secs(10))
}

/// State shared by the controller, the workers and the sampler.
struct Ctx {
    target: Target,
    template: RequestTemplate,
    head_len: u64,
    bodies: Bodies,
    timeout: Duration,
    rec: Recorder,
    start: Instant,
    stage: AtomicUsize,
    workers_target: AtomicUsize,
    done: AtomicBool,
    notify: Notify,
    next_seq: AtomicU64,
    limit: Option<u64>,
    /// The dispatcher or a worker ran into `-n`.
    limit_hit: AtomicBool,
    started: AtomicU64,
    finished: AtomicU64,
    shed: AtomicU64,
    failed: AtomicU64,
    /// Answers whose body named a CUDA OOM.
    oom_answers: AtomicU64,
    in_flight: AtomicUsize,
    peak_in_flight: Vec<AtomicUsize>,
    /// Per stage: requests sent in it that have finished (any outcome), and those that got
    /// an HTTP answer. `--ramp-until-oom` holds a step until its own requests are back.
    finished_by_stage: Vec<AtomicU64>,
    answered_by_stage: Vec<AtomicU64>,
    connections: AtomicU64,
    live_workers: AtomicUsize,
    /// Open model.
    scheduled: AtomicU64,
    /// Open model: requests spawned and not done (waiting for a connection, or in flight).
    pending: AtomicU64,
    /// The stop flag was seen: requests still waiting for a connection are dropped.
    cancelled: AtomicBool,
    dropped: AtomicU64,
    pool: Mutex<Vec<Conn>>,
    slots: Semaphore,
    /// Whether every answer so far was the same refusal (a 4xx).
    refusals: Refusals,
    /// Answers with a `Retry-After`, and the longest it asked for.
    retry_after: AtomicU64,
    retry_after_max_s: AtomicU64,
}

impl Ctx {
    fn t(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

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
fn ramp_step_end(cfg: &HttpConfig, ctx: &Ctx, i: usize, load: Load, end_at: f64) -> StepEnd {
    let Load::Closed(workers) = load else {
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

/// Sends request `seq` on `conn` (opening one if needed) and records it. `timer`: a
/// worker's own timeout timer, reused request after request (moving a registered timer's
/// deadline later is a lock-free update in tokio, where a fresh timer per request takes
/// the timer wheel's lock twice); `None` makes a fresh one.
async fn one_request(
    ctx: &Ctx,
    conn: &mut Option<Conn>,
    seq: u64,
    stage: usize,
    intended: Option<Instant>,
    timer: Option<Pin<&mut Sleep>>,
) {
    ctx.started.fetch_add(1, Ordering::Relaxed);
    let now = ctx.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
    if let Some(p) = ctx.peak_in_flight.get(stage) {
        p.fetch_max(now, Ordering::Relaxed);
    }
    let t_send = Instant::now();
    let body = ctx.bodies.body(seq);
    let bytes_out = ctx.head_len + body.len() as u64;
    let work = async {
        let reuse = match conn.as_mut() {
            Some(c) => client::usable(c).await,
            None => false,
        };
        if !reuse {
            *conn = None;
            let c = client::connect(&ctx.target, ctx.timeout).await?;
            ctx.connections.fetch_add(1, Ordering::Relaxed);
            *conn = Some(c);
        }
        let c = conn.as_mut().ok_or(ErrorKind::Io)?;
        client::exchange(c, ctx.template.build(body)).await
    };
    let res = match timer {
        Some(mut t) => {
            t.as_mut().reset((t_send + ctx.timeout).into());
            tokio::select! {
                biased;
                r = work => Ok(r),
                _ = t => Err(()),
            }
        }
        None => tokio::time::timeout(ctx.timeout, work)
            .await
            .map_err(|_| ()),
    };
    let t_done = Instant::now();
    ctx.in_flight.fetch_sub(1, Ordering::Relaxed);
    let outcome = match res {
        Ok(Ok(a)) => {
            if let Some(ra) = a.retry_after_s {
                ctx.retry_after.fetch_add(1, Ordering::Relaxed);
                ctx.retry_after_max_s.fetch_max(ra, Ordering::Relaxed);
            }
            Outcome::Answer {
                status: a.status,
                body_bytes: a.body_bytes,
                oom: a.oom,
            }
        }
        Ok(Err(k)) => {
            *conn = None;
            Outcome::Error(k)
        }
        Err(_) => {
            *conn = None;
            Outcome::Error(ErrorKind::Timeout)
        }
    };
    if let Outcome::Answer { status, .. } = outcome {
        ctx.refusals.see(status);
        if let Some(n) = ctx.answered_by_stage.get(stage) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    }
    let raw_us = t_done.duration_since(t_send).as_micros() as u64;
    let latency_us = match intended {
        Some(i) => t_done.saturating_duration_since(i).as_micros() as u64,
        None => raw_us,
    };
    ctx.rec.record(&Done {
        stage,
        latency_us,
        raw_us,
        t_done_s: t_done.duration_since(ctx.start).as_secs_f64(),
        outcome,
        bytes_out,
    });
    match outcome {
        Outcome::Answer {
            status: 503,
            oom: false,
            ..
        } => {
            ctx.shed.fetch_add(1, Ordering::Relaxed);
        }
        Outcome::Answer { status, .. } if status < 400 => {}
        Outcome::Answer { oom: true, .. } => {
            ctx.failed.fetch_add(1, Ordering::Relaxed);
            ctx.oom_answers.fetch_add(1, Ordering::Relaxed);
        }
        _ => {
            ctx.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    if let Some(n) = ctx.finished_by_stage.get(stage) {
        n.fetch_add(1, Ordering::Relaxed);
    }
    ctx.finished.fetch_add(1, Ordering::Relaxed);
}

async fn closed_worker(ctx: Arc<Ctx>, i: usize) {
    let mut conn: Option<Conn> = None;
    let timer = tokio::time::sleep(ctx.timeout);
    tokio::pin!(timer);
    loop {
        if ctx.done.load(Ordering::Relaxed) {
            break;
        }
        if i >= ctx.workers_target.load(Ordering::Relaxed) {
            conn = None;
            let n = ctx.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if ctx.done.load(Ordering::Relaxed) || i < ctx.workers_target.load(Ordering::Relaxed) {
                continue;
            }
            n.await;
            continue;
        }
        let seq = ctx.next_seq.fetch_add(1, Ordering::Relaxed);
        if ctx.limit.is_some_and(|l| seq >= l) {
            ctx.limit_hit.store(true, Ordering::Relaxed);
            break;
        }
        let stage = ctx.stage.load(Ordering::Relaxed);
        let had = conn.is_some();
        one_request(&ctx, &mut conn, seq, stage, None, Some(timer.as_mut())).await;
        if conn.is_none() && !had {
            // Could not connect: do not spin against a dead port.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    ctx.live_workers.fetch_sub(1, Ordering::Relaxed);
}

/// One open-model request: wait for a connection slot, send. Every request the schedule
/// meant to send before the end is sent (within the grace period), unless the run was
/// cancelled; `pending` counts it until it is done.
async fn open_request(ctx: Arc<Ctx>, seq: u64, stage: usize, intended: Instant) {
    if let Ok(_slot) = ctx.slots.acquire().await {
        if ctx.cancelled.load(Ordering::Relaxed) {
            ctx.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            let mut conn = ctx.pool.lock().pop();
            one_request(&ctx, &mut conn, seq, stage, Some(intended), None).await;
            if let Some(c) = conn {
                ctx.pool.lock().push(c);
            }
        }
    }
    ctx.pending.fetch_sub(1, Ordering::Relaxed);
}

/// The open model's schedule: every request at its intended time, stage by stage, each
/// stage's schedule starting at its boundary.
async fn dispatcher(ctx: Arc<Ctx>, plan: Vec<(f64, Option<f64>)>, arrival: Arrival, seed: u64) {
    let mut sched = Schedule::new(arrival, seed);
    let mut next = ctx.start;
    let mut stage_start = 0.0;
    for (si, (rate, dur)) in plan.iter().enumerate() {
        let begin = ctx.start + Duration::from_secs_f64(stage_start);
        next = next.max(begin);
        let end = dur.map(|d| ctx.start + Duration::from_secs_f64(stage_start + d));
        loop {
            if ctx.done.load(Ordering::Relaxed) {
                return;
            }
            if end.is_some_and(|e| next >= e) {
                break;
            }
            let now = Instant::now();
            if next > now {
                // Wake at the next intended time, but at least every 5 ms to see `done`.
                let wake = next.min(now + Duration::from_millis(5));
                tokio::time::sleep_until(wake.into()).await;
                continue;
            }
            let seq = ctx.next_seq.fetch_add(1, Ordering::Relaxed);
            if ctx.limit.is_some_and(|l| seq >= l) {
                ctx.limit_hit.store(true, Ordering::Relaxed);
                return;
            }
            ctx.scheduled.fetch_add(1, Ordering::Relaxed);
            // A service that stalls for long at a high rate would otherwise pile up
            // millions of waiting requests: past a bound they are dropped (and counted), as
            // k6 drops iterations when it runs out of VUs.
            if ctx.pending.load(Ordering::Relaxed) >= MAX_WAITING {
                ctx.dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                ctx.pending.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(open_request(ctx.clone(), seq, si, next));
            }
            next += Duration::from_secs_f64(sched.gap(*rate));
        }
        stage_start += dur.unwrap_or(0.0);
    }
}

/// The closed model's load threads: one current-thread runtime each, driven by its own OS
/// thread until [`Shards::stop`]. Worker `i` lives on thread `i % n` for its whole life.
struct Shards {
    handles: Vec<tokio::runtime::Handle>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Shards {
    fn start(n: usize) -> Result<Shards> {
        let mut s = Shards {
            handles: Vec::with_capacity(n),
            stops: Vec::with_capacity(n),
            threads: Vec::with_capacity(n),
        };
        for i in 0..n.max(1) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| LoadError::Thread(e.to_string()))?;
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            s.handles.push(rt.handle().clone());
            s.stops.push(tx);
            let t = std::thread::Builder::new()
                .name(format!("vramroom-load-{i}"))
                .spawn(move || {
                    // Runs the shard's tasks until told to stop (or the sender is gone);
                    // tasks still running then are dropped with the runtime.
                    let _ = rt.block_on(rx);
                    rt.shutdown_background();
                })
                .map_err(|e| LoadError::Thread(e.to_string()))?;
            s.threads.push(t);
        }
        Ok(s)
    }

    fn spawn<F>(&self, worker: usize, f: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        drop(self.handles[worker % self.handles.len()].spawn(f));
    }

    fn stop(self) {
        for tx in self.stops {
            let _ = tx.send(());
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Open model: most requests pending (waiting for a connection or in flight) before new
/// ones are dropped.
const MAX_WAITING: u64 = 100_000;

/// A stage as it ran: (index, start_s, end_s).
type StageRun = (usize, f64, f64);
/// A memory tick: (t_s, merged reading, requests in flight).
type Tick = (f64, MemoryReading, usize);

/// Runs an HTTP load test. This is the entry point of `vramroom http`.
///
/// `stop` (Ctrl-C) ends the load early; what was measured is still returned with
/// `stop_reason: cancelled`. `progress` is called on the calling thread several times a
/// second. Errors are only for input that cannot run (see `prepare`: a bad URL, body, metrics endpoint, or nothing listening).
pub fn run(
    cfg: &HttpConfig,
    stop: Arc<AtomicBool>,
    mut progress: impl FnMut(&Progress),
) -> Result<RunResult> {
    cfg.validate()?;
    let threads = if cfg.threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    } else {
        cfg.threads
    };
    let open = cfg.is_open();
    // Closed model: the controller and the sampler need one thread; the load has its own.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(if open { threads } else { 1 })
        .thread_name("vramroom-http")
        .enable_all()
        .build()
        .map_err(|e| LoadError::Thread(e.to_string()))?;
    let prep = rt.block_on(prepare(cfg))?;
    let shards = if open {
        None
    } else {
        Some(Shards::start(threads)?)
    };
    let result = rt.block_on(drive(cfg, prep, shards.as_ref(), &stop, &mut progress));
    // Tasks still running (requests past the grace period) are dropped with the runtimes.
    if let Some(s) = shards {
        s.stop();
    }
    rt.shutdown_background();
    let (mut r, caps) = result?;
    finish(cfg, &mut r, &caps);
    Ok(r)
}

async fn drive(
    cfg: &HttpConfig,
    prep: Prepared,
    shards: Option<&Shards>,
    stop: &AtomicBool,
    progress: &mut impl FnMut(&Progress),
) -> Result<(RunResult, Vec<DeviceCapacity>)> {
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
            .map(|s| match s.load {
                Load::Open(r) => (r, s.duration.map(|d| d.as_secs_f64())),
                Load::Closed(_) => (0.0, None),
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
        if let Load::Closed(c) = st.load {
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
        debug!(stage = i, ?st.load, "stage start");
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
                prog.concurrency = match st.load {
                    Load::Closed(c) => c,
                    Load::Open(_) => ctx.in_flight.load(Ordering::Relaxed),
                };
                prog.rate_per_s = match st.load {
                    Load::Open(r) => Some(r),
                    Load::Closed(_) => None,
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
                match ramp_step_end(cfg, &ctx, i, st.load, end_at.unwrap_or(0.0)) {
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
    let mut infos = sampler.infos();
    infos.extend(prep.absent);
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
        infos,
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
    let mut r = agg.result();
    if let Some(h) = r.http.as_mut() {
        h.stop_hint = stop_hint;
    }
    r.snapshot = snapshot;
    r.oom_snapshot = oom_snapshot;
    Ok((r, caps))
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

/// Per device, what the process held beyond PyTorch's reserved bytes (the CUDA context,
/// libraries), as NVML saw it: the most over the run. NVML samples one device, taken as the
/// process's device 0.
fn overhead(r: &RunResult) -> BTreeMap<usize, u64> {
    let oh = r
        .timeline
        .iter()
        .filter(|s| s.reserved_bytes > 0)
        .filter_map(|s| {
            s.process_used_bytes
                .map(|u| u.saturating_sub(s.reserved_bytes))
        })
        .max();
    oh.map(|v| BTreeMap::from([(0usize, v)]))
        .unwrap_or_default()
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

/// The replays, prediction, findings and thresholds, after the runtime is gone.
fn finish(cfg: &HttpConfig, r: &mut RunResult, caps: &[DeviceCapacity]) {
    if let Some(s) = &r.snapshot {
        let own = vramroom_alloc::AllocatorConfig::from_settings(&s.allocator_settings)
            .map(|c| c.to_string())
            .unwrap_or_default();
        let own = if own == vramroom_alloc::AllocatorConfig::default().to_string() {
            String::new()
        } else {
            own
        };
        r.alloc_conf = own.clone();
        // Replay on the service's device when its size is known, else unbounded: the
        // question is how much each config reserves, not whether it fits a guess.
        let cap = if r.capacity_bytes > 0 {
            r.capacity_bytes
        } else {
            1 << 50
        };
        r.what_if = crate::diagnose::what_if_snapshot(s, cap, &own, &cfg.what_if);
        r.what_if_check = crate::diagnose::what_if_check_service(r, &r.what_if, s);
        if let Some(po) = &cfg.predict {
            let gentle = r.stages.iter().map(|s| s.concurrency).max().unwrap_or(1);
            let p = predict(s, caps, &overhead(r), &own, &cfg.what_if, gentle, po);
            if let Some(h) = r.http.as_mut() {
                h.prediction = Some(p);
            }
        }
    }
    if cfg.stop_at_first_oom {
        let mut o = observed(r);
        if let Some(h) = r.http.as_mut() {
            let mine = h.prediction.as_ref().and_then(|p| p.first_oom_concurrency);
            o.compare(mine);
            h.prediction.get_or_insert_with(Default::default).observed = Some(o);
        }
    }
    r.findings = crate::http::probe::findings(r);
    r.thresholds = evaluate_thresholds(&cfg.thresholds, r);
}

struct Aggregate<'a> {
    cfg: &'a HttpConfig,
    method: String,
    body: String,
    open: bool,
    totals: Totals,
    stages_run: Vec<StageRun>,
    stop_reason: StopReason,
    wall_s: f64,
    readings: Vec<Tick>,
    peak_in_flight: Vec<usize>,
    aborted: u64,
    dropped: u64,
    connections: u64,
    service_ooms: Option<u64>,
    first_stats: BTreeMap<String, i64>,
    last_stats: BTreeMap<String, i64>,
    infos: Vec<MemorySourceInfo>,
    probe: Option<ProbeResult>,
    shed_reasons: BTreeMap<String, u64>,
    retry_after_answers: u64,
    retry_after_max_s: Option<u64>,
}

fn summary(s: &StageAcc) -> RequestSummary {
    RequestSummary {
        total: s.total,
        ok: s.ok_n,
        oom: s.oom_n,
        other_errors: (s.failed_status_n - s.oom_n.min(s.failed_status_n)) + s.errors_total(),
        items: s.ok_n,
        stopped: 0,
    }
}

fn merge_into(into: &mut Option<Histogram<u64>>, h: Option<&Histogram<u64>>) {
    if let Some(h) = h {
        match into {
            Some(i) => {
                let _ = i.add(h);
            }
            None => *into = Some(h.clone()),
        }
    }
}

impl Aggregate<'_> {
    fn sample(&self, tick: &Tick, prev_ooms: Option<u64>) -> MemorySample {
        let (t, r, in_flight) = (tick.0, &tick.1, tick.2);
        let stage = self
            .stages_run
            .iter()
            .rfind(|s| s.1 <= t)
            .map(|s| s.0)
            .unwrap_or(0);
        let kind = match (prev_ooms, r.num_ooms) {
            (Some(a), Some(b)) if b > a => SampleKind::Oom,
            _ => SampleKind::Periodic,
        };
        MemorySample {
            t_s: t,
            kind,
            stage,
            // Closed: the stage's workers while the load ran; open: requests in flight.
            concurrency: match self.cfg.stages.get(stage).map(|s| s.load) {
                Some(Load::Closed(c)) if t > 0.0 && t <= self.wall_s => c,
                _ => in_flight,
            },
            allocated_bytes: r.allocated.unwrap_or(0),
            reserved_bytes: r.reserved.unwrap_or(0),
            active_bytes: r.active.unwrap_or(0),
            inactive_split_bytes: r.inactive_split.unwrap_or(0),
            device_used_bytes: r.device_used,
            process_used_bytes: r.process_used,
            overhead_bytes: r.overhead(),
            categories: CategoryBytes::default(),
        }
    }

    fn result(self) -> RunResult {
        let cfg = self.cfg;
        // The timeline.
        let mut timeline = Vec::with_capacity(self.readings.len());
        let mut prev = None;
        let mut series: Vec<String> = Vec::new();
        for tick in &self.readings {
            let r = &tick.1;
            timeline.push(self.sample(tick, prev));
            prev = r.num_ooms.or(prev);
            for s in r.series() {
                if !series.iter().any(|x| x == s) {
                    series.push(s.into());
                }
            }
        }
        let capacity = self
            .readings
            .iter()
            .filter_map(|r| r.1.capacity)
            .max()
            .unwrap_or(0);
        let baseline = self
            .readings
            .first()
            .and_then(|r| r.1.allocated)
            .unwrap_or(0);
        let in_stage = |i: usize| {
            let (s0, s1) = self
                .stages_run
                .iter()
                .find(|s| s.0 == i)
                .map(|s| (s.1, s.2))
                .unwrap_or((0.0, 0.0));
            timeline
                .iter()
                .filter(move |m| m.t_s >= s0 && m.t_s <= s1)
                .collect::<Vec<_>>()
        };

        // Stages: the measured latency, corrected in the closed model.
        let empty = StageAcc::default();
        let mut stages = Vec::new();
        let mut http_stages = Vec::new();
        let mut corrected: Vec<Option<Histogram<u64>>> = Vec::new();
        for &(i, s0, s1) in &self.stages_run {
            let acc = self.totals.stages.get(i).unwrap_or(&empty);
            let (lat_h, interval) = match (&acc.ok, self.open) {
                (Some(h), false) => {
                    let (c, iv) = record::corrected(h);
                    (Some(c), Some(iv))
                }
                (h, _) => (h.clone(), None),
            };
            let uncorrected = if self.open {
                acc.ok_raw.as_ref()
            } else {
                acc.ok.as_ref()
            };
            let load = cfg.stages[i].load;
            let peak_flight = self.peak_in_flight.get(i).copied().unwrap_or(0);
            let mem = in_stage(i);
            let req = summary(acc);
            stages.push(StageResult {
                index: i,
                concurrency: match load {
                    Load::Closed(c) => c,
                    Load::Open(_) => peak_flight,
                },
                start_s: s0,
                end_s: s1,
                requests: req,
                latency: record::stats(lat_h.as_ref(), acc.ok_n),
                throughput: Throughput::of(&req, s1 - s0),
                peak_allocated_bytes: mem.iter().map(|m| m.allocated_bytes).max().unwrap_or(0),
                peak_reserved_bytes: mem.iter().map(|m| m.reserved_bytes).max().unwrap_or(0),
                workers_started: match load {
                    Load::Closed(c) => c,
                    Load::Open(_) => peak_flight,
                },
            });
            http_stages.push(HttpStageResult {
                index: i,
                concurrency: match load {
                    Load::Closed(c) => Some(c),
                    Load::Open(_) => None,
                },
                rate_per_s: match load {
                    Load::Open(r) => Some(r),
                    Load::Closed(_) => None,
                },
                peak_in_flight: peak_flight,
                shed: acc.shed_n,
                status_codes: acc.status_map(),
                latency_uncorrected: record::stats(uncorrected, acc.ok_n),
                shed_latency: record::stats(acc.shed.as_ref(), acc.shed_n),
                correction_interval_ms: interval.map(|us| us as f64 / 1000.0),
            });
            corrected.push(lat_h);
        }

        // Run-wide.
        let mut all = StageAcc::default();
        for s in &self.totals.stages {
            all.merge(s);
        }
        let mut lat_all: Option<Histogram<u64>> = None;
        for h in &corrected {
            merge_into(&mut lat_all, h.as_ref());
        }
        let requests = summary(&all);
        let mut by_kind = all.error_map();
        for (code, n) in &all.statuses {
            if *code >= 400 && *code != 503 {
                by_kind.insert(format!("status_{code}"), *n);
            }
        }

        // Levels: workers (closed) or rates (open), stages at one level merged.
        let mut by_concurrency = Vec::new();
        let mut by_rate = Vec::new();
        let mut levels: Vec<(f64, Vec<usize>)> = Vec::new();
        for (k, st) in stages.iter().enumerate() {
            let key = match cfg.stages[st.index].load {
                Load::Closed(c) => c as f64,
                Load::Open(r) => r,
            };
            match levels.iter_mut().find(|l| l.0 == key) {
                Some(l) => l.1.push(k),
                None => levels.push((key, vec![k])),
            }
        }
        levels.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (key, ks) in levels {
            let mut req = RequestSummary::default();
            let mut h: Option<Histogram<u64>> = None;
            let mut secs = 0.0;
            let mut shed = 0;
            let (mut pa, mut pr) = (0, 0);
            for &k in &ks {
                let st = &stages[k];
                req.add(&st.requests);
                merge_into(&mut h, corrected[k].as_ref());
                secs += st.end_s - st.start_s;
                shed += http_stages[k].shed;
                pa = pa.max(st.peak_allocated_bytes);
                pr = pr.max(st.peak_reserved_bytes);
            }
            let latency = record::stats(h.as_ref(), req.ok);
            if self.open {
                by_rate.push(RateResult {
                    rate_per_s: key,
                    requests: req,
                    shed,
                    latency,
                    throughput: Throughput::of(&req, secs),
                    peak_allocated_bytes: pa,
                    peak_reserved_bytes: pr,
                });
            } else {
                by_concurrency.push(ConcurrencyResult {
                    concurrency: key as usize,
                    requests: req,
                    latency,
                    throughput: Throughput::of(&req, secs),
                    peak_allocated_bytes: pa,
                    peak_reserved_bytes: pr,
                    peak_above_base_bytes: pa.saturating_sub(baseline),
                });
            }
        }

        // Answers over time, at most 600 buckets.
        let status_timeline = buckets(&self.totals, 600);

        // Peaks from the samples, refined by the service's own peak gauges when they rose
        // during the run (a sampler misses what happens between ticks).
        let maxs = |f: fn(&MemorySample) -> u64| timeline.iter().map(f).max().unwrap_or(0);
        let mut peaks = Peaks {
            allocated_bytes: maxs(|s| s.allocated_bytes),
            reserved_bytes: maxs(|s| s.reserved_bytes),
            active_bytes: maxs(|s| s.active_bytes),
            inactive_split_bytes: maxs(|s| s.inactive_split_bytes),
            allocated_t_s: timeline
                .iter()
                .max_by_key(|s| s.allocated_bytes)
                .map(|s| s.t_s)
                .unwrap_or(0.0),
            ..Default::default()
        };
        let rose = |f: fn(&MemoryReading) -> Option<u64>| {
            let a = self.readings.iter().find_map(|r| f(&r.1))?;
            let b = self.readings.iter().rev().find_map(|r| f(&r.1))?;
            (b > a).then_some(b)
        };
        if let Some(m) = rose(|r| r.max_allocated) {
            peaks.allocated_bytes = peaks.allocated_bytes.max(m);
        }
        if let Some(m) = rose(|r| r.max_reserved) {
            peaks.reserved_bytes = peaks.reserved_bytes.max(m);
        }
        let stat = |m: &BTreeMap<String, i64>, k: &str| m.get(k).copied().unwrap_or(0);
        if !self.last_stats.is_empty() {
            peaks.alloc_retries = (stat(&self.last_stats, "num_alloc_retries")
                - stat(&self.first_stats, "num_alloc_retries"))
            .max(0);
            let split_peak = stat(&self.last_stats, "inactive_split_bytes.all.peak");
            if split_peak > stat(&self.first_stats, "inactive_split_bytes.all.peak") {
                peaks.inactive_split_bytes = peaks.inactive_split_bytes.max(split_peak as u64);
            }
        }
        peaks.above_base_bytes = peaks.allocated_bytes.saturating_sub(baseline);
        crate::memsource::fill_peaks(&mut peaks, &timeline);

        // OOMs the service reported, one record per rise of its counter.
        let mut ooms = Vec::new();
        let mut prev: Option<u64> = None;
        for tick in &self.readings {
            let (t, r) = (&tick.0, &tick.1);
            if let (Some(a), Some(b)) = (prev, r.num_ooms) {
                if b > a && ooms.len() < MAX_OOM_RECORDS {
                    let s = self.sample(tick, prev);
                    ooms.push(OomRecord {
                        t_s: *t,
                        stage: s.stage,
                        concurrency: s.concurrency,
                        worker: 0,
                        request: 0,
                        requested_bytes: None,
                        message: format!(
                            "the service's OOM counter rose from {a} to {b} (seen at the scrape at t={t:.2}s)"
                        ),
                        allocated_bytes: s.allocated_bytes,
                        reserved_bytes: s.reserved_bytes,
                        categories: CategoryBytes::default(),
                        memory_stats: BTreeMap::new(),
                        memory_summary: String::new(),
                    });
                }
            }
            prev = r.num_ooms.or(prev);
        }

        let describe_stages = cfg
            .stages
            .iter()
            .map(|s| {
                let l = match s.load {
                    Load::Closed(1) => "1 worker".to_string(),
                    Load::Closed(c) => format!("{c} workers"),
                    Load::Open(r) => format!("{r}/s"),
                };
                match s.duration {
                    Some(d) => format!("{l} for {:.3}s", d.as_secs_f64()).replace(".000s", "s"),
                    None => l,
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let model = if self.open { "open" } else { "closed" };
        let description = format!(
            "{} {} — {model} model: {describe_stages}{}",
            self.method,
            cfg.url,
            cfg.max_requests
                .map(|n| format!(", at most {n} requests"))
                .unwrap_or_default()
        );
        let load = LoadInfo {
            mode: if cfg.stages.len() > 1 {
                "stages"
            } else if cfg.stages[0].duration.is_none() {
                "requests"
            } else {
                "fixed"
            }
            .into(),
            stages: cfg
                .stages
                .iter()
                .map(|s| StageSpecInfo {
                    concurrency: match s.load {
                        Load::Closed(c) => c,
                        Load::Open(_) => 0,
                    },
                    duration_s: s.duration.map(|d| d.as_secs_f64()),
                })
                .collect(),
            max_requests: cfg.max_requests,
            time_limit_s: None,
            sample_period_ms: cfg.metrics_interval.as_secs_f64() * 1e3,
        };
        let service_ooms = self.service_ooms;
        RunResult {
            schema_version: SCHEMA_VERSION,
            vramroom_version: env!("CARGO_PKG_VERSION").into(),
            scenario: ScenarioInfo {
                name: cfg.url.clone(),
                kind: "http".into(),
                model: String::new(),
                batch: 0,
                input: self.body.clone(),
                seed: cfg.seed,
                description,
                ..Default::default()
            },
            load,
            device: "service".into(),
            capacity_bytes: capacity,
            alloc_conf: String::new(),
            wall_s: self.wall_s,
            stop_reason: self.stop_reason,
            baseline_bytes: baseline,
            requests,
            latency: record::stats(lat_all.as_ref(), all.ok_n),
            throughput: Throughput::of(&summary(&all), self.wall_s),
            errors: ErrorCounts {
                oom: service_ooms.unwrap_or(0).max(all.oom_n),
                by_kind,
            },
            stages,
            by_concurrency,
            timeline,
            peaks,
            ooms,
            oom_search: None,
            findings: Vec::new(),
            what_if: Vec::new(),
            what_if_check: WhatIfCheck::default(),
            thresholds: Vec::new(),
            final_memory_stats: self.last_stats.clone(),
            final_memory_summary: String::new(),
            snapshot: None,
            oom_snapshot: None,
            memory_sources: self.infos,
            http: Some(HttpResult {
                url: cfg.url.clone(),
                method: self.method.clone(),
                model: model.into(),
                arrival: self.open.then(|| cfg.arrival.as_str().to_string()),
                max_connections: self.open.then_some(cfg.max_connections),
                body: self.body.clone(),
                timeout_ms: cfg.timeout.as_secs_f64() * 1e3,
                latency_correction: if self.open {
                    "intended_send_time"
                } else {
                    "expected_interval"
                }
                .into(),
                status_codes: all.status_map(),
                shed: all.shed_n,
                shed_latency: record::stats(all.shed.as_ref(), all.shed_n),
                latency_uncorrected: record::stats(
                    if self.open {
                        all.ok_raw.as_ref()
                    } else {
                        all.ok.as_ref()
                    },
                    all.ok_n,
                ),
                dropped: self.dropped,
                aborted: self.aborted,
                bytes_sent: all.bytes_out,
                bytes_received: all.bytes_in,
                connections_opened: self.connections,
                stages: http_stages,
                by_rate,
                status_timeline,
                memory_series: series,
                service_ooms,
                probe: self.probe,
                stop_hint: None,
                shed_reasons: self.shed_reasons,
                retry_after_answers: self.retry_after_answers,
                retry_after_max_s: self.retry_after_max_s,
                prediction: None,
            }),
        }
    }
}

/// Answers by class over time, merged to at most `max` buckets.
fn buckets(t: &Totals, max: usize) -> Vec<StatusBucket> {
    let n = t.buckets.len();
    if n == 0 {
        return Vec::new();
    }
    let k = n.div_ceil(max.max(1)).max(1);
    let w = t.bucket_s * k as f64;
    t.buckets
        .chunks(k)
        .enumerate()
        .map(|(i, c)| {
            let mut b = StatusBucket {
                t_s: i as f64 * w,
                width_s: w,
                ..Default::default()
            };
            let mut lat = 0u64;
            for x in c {
                b.ok += x.ok;
                b.shed += x.shed;
                b.client_error += x.client_error;
                b.server_error += x.server_error;
                b.transport_error += x.transport_error;
                lat += x.ok_latency_sum_us;
            }
            b.mean_latency_ms = (b.ok > 0).then(|| lat as f64 / b.ok as f64 / 1000.0);
            b
        })
        .collect()
}
