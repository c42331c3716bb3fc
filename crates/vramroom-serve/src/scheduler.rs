//! Admission control and dynamic batching: the queue between the HTTP handlers and the
//! compute threads.
//!
//! Design note. Two budgets decide whether a request is admitted, and both are checked
//! under one lock at arrival, so a burst cannot slip past them together:
//!
//! - **Memory.** Every admitted, unfinished piece of work holds its predicted peak (from
//!   the meta twin, see [`crate::model::Predictor`]): a queued request its own, a running
//!   batch the batch's. A request is admitted only if
//!   `max(allocated_now, idle_base + Σ running) + Σ queued + its peak <= capacity − margin`.
//!   `idle_base` is what the allocator holds with nothing running (weights, workspaces),
//!   re-read whenever no batch is running (so memory that was taken outside the ledger and
//!   given back stops counting at once). Taking the max with `allocated_now` instead
//!   of adding them keeps a running batch from being counted twice (once in what it has
//!   allocated, once in its prediction) while still seeing memory that no prediction
//!   explains (a leak, a prediction that was too low). Peaks of concurrent batches are
//!   added as if they coincided, which is the safe side.
//! - **Latency.** Memory alone does not bound queueing on a compute-bound server: a queue
//!   that fits in memory can still hold seconds of work. Each request gets a latency
//!   target (`--max-latency`, default `auto`: 1.5 × the server's own estimate of the
//!   request's unloaded latency, `max_wait + c(its work)`, plus one full batch of its kind
//!   `c(max_batch samples)`, with `c` fitted to the batches that ran while nothing was
//!   shed), and is admitted only if the
//!   predicted time to finish it — time until a worker is free, plus the queued work
//!   ahead, plus its own compute — is within the target. Compute time is a linear model
//!   `c = α + β·units` (units: tokens, pixels or rows) fitted online, with forgetting, to
//!   the measured batches, and calibrated at start-up by warm-up batches. Predictions can
//!   be wrong (a noisy neighbour, a cold cache), so the target is also enforced at
//!   dispatch: a request that waited behind other work until it can no longer finish within
//!   its target is answered 503 rather than served late, and a batch only grows while every
//!   member still finishes in time. `--max-queue` caps the number of waiting requests outright.
//!
//!   The promise, then: an admitted request is admitted and dispatched only while it is
//!   predicted to be answered within 1.5 × its unloaded latency plus the measured service
//!   time of one full batch; a batch's compute cannot be preempted, so one that runs slower
//!   than the fit (a noisy neighbour, the load generator on the same cores) can finish late
//!   by up to one more batch. Admitted latency is therefore within 1.5 × the unloaded
//!   latency plus two full batches, and aims at one. The batch term is the calibration to
//!   the model's own speed: a request that arrives while a batch runs must wait for it, so
//!   a target of 1.5 × its own latency alone shed nearly everything a few clients sent to a
//!   model served at CPU speed (measured: 99.95% of `-c 4` shed with 503, memory at 3% of
//!   the capacity), while with one batch allowed `-c 4` is served and a queue of several
//!   batches is still shed.
//!
//! Batching: a free worker takes the oldest request's key and waits until `max_batch`
//! samples of that key are queued or the oldest has waited `max_wait`, then takes up to
//! `max_batch` samples of that key in arrival order (skipping other keys, which keep their
//! places). It does not wait while draining, nor when the ledger (or `--max-queue`) admits
//! no further request of that key: then nothing can join the batch until something
//! finishes, and waiting would only add latency. A batch's memory is re-predicted for its
//! total size; a member that would push the ledger past the limit stays queued.
//!
//! Cancellation: a handler whose client went away drops its [`Ticket`], which removes the
//! request from the queue and releases its memory at once, so no compute is spent on it.
//! A request already in a running batch finishes; its answer is dropped.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use vramroom_alloc::{AllocEvent, DeviceStats, Observer};
use vramroom_workload::AllocatorProbe;

use crate::error::{ApiError, Reject};
use crate::metrics::{BatchRecord, Metrics};
use crate::model::{BatchKey, Input, Predictor, SampleOutput, ServedModel};

/// How long an admitted request may take, end to end inside the server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatencyTarget {
    /// [`AUTO_TARGET_FACTOR`] × the predicted unloaded latency of the request
    /// (`max_wait + c(work)`) plus one full batch of its kind (`c(max_batch samples)`), at
    /// least [`MIN_AUTO_TARGET`]; see the module note.
    Auto,
    Fixed(Duration),
    /// No latency admission (memory and `--max-queue` only).
    Off,
}

/// Factor over the predicted unloaded latency that [`LatencyTarget::Auto`] allows.
pub const AUTO_TARGET_FACTOR: f64 = 1.5;
/// Floor of the auto target: below this, timer, scheduling and HTTP noise dominate a
/// request's latency on a general-purpose OS, and a target would shed at random.
pub const MIN_AUTO_TARGET: Duration = Duration::from_millis(2);

/// The scheduler's knobs.
#[derive(Debug, Clone)]
pub struct SchedConfig {
    /// Most samples in one batch.
    pub max_batch: usize,
    /// Longest a batch waits to fill after its first request arrived.
    pub max_wait: Duration,
    /// Most requests waiting (not running) at once.
    pub max_queue: usize,
    pub latency: LatencyTarget,
    /// capacity − margin: what predicted memory may add up to.
    pub limit_bytes: u64,
    /// Compute threads.
    pub workers: usize,
}

/// A finished request.
#[derive(Debug, Clone)]
pub struct Done {
    pub outputs: Vec<SampleOutput>,
    pub queue_s: f64,
    pub compute_s: f64,
    /// Samples in the batch it ran in.
    pub batch_samples: usize,
    /// Requests in the batch it ran in.
    pub batch_requests: usize,
    pub key: BatchKey,
}

type Reply = oneshot::Sender<Result<Done, ApiError>>;

/// A request [`Scheduler::try_submit`] did not admit: why, and the input, handed back.
pub struct Refused {
    pub error: ApiError,
    pub input: Input,
}

/// An admitted request: its place in the queue and where its answer comes.
pub type Admitted = (Ticket, oneshot::Receiver<Result<Done, ApiError>>);

struct Entry {
    id: u64,
    input: Input,
    pred: u64,
    arrived: Instant,
    target: Option<Duration>,
    /// It found work running or queued ahead of it.
    behind_work: bool,
    /// `batch_seq` when it arrived: a batch started since means it waited behind work.
    seq_at_arrival: u64,
    tx: Reply,
}

struct RunningBatch {
    seq: u64,
    started: Instant,
    est_s: f64,
}

/// `c = alpha + beta·units`, fitted by exponentially weighted least squares.
#[derive(Debug, Clone)]
pub struct CostModel {
    s0: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    pub alpha: f64,
    pub beta: f64,
}

/// Weight an observation keeps per later observation (about the last 10 batches count):
/// compute time moves with the load on the machine, the model must follow it.
const FORGET: f64 = 0.9;

impl CostModel {
    fn new() -> CostModel {
        CostModel {
            s0: 0.0,
            sx: 0.0,
            sy: 0.0,
            sxx: 0.0,
            sxy: 0.0,
            alpha: 0.0,
            beta: 0.0,
        }
    }
    pub fn observe(&mut self, units: f64, secs: f64) {
        for s in [
            &mut self.s0,
            &mut self.sx,
            &mut self.sy,
            &mut self.sxx,
            &mut self.sxy,
        ] {
            *s *= FORGET;
        }
        self.s0 += 1.0;
        self.sx += units;
        self.sy += secs;
        self.sxx += units * units;
        self.sxy += units * secs;
        let det = self.s0 * self.sxx - self.sx * self.sx;
        // With one distinct size seen, the slope is unknown: attribute it all to the units
        // (the pessimistic reading for larger batches).
        let (a, b) = if det > 1e-9 * self.s0 * self.sxx.max(1.0) {
            let b = (self.s0 * self.sxy - self.sx * self.sy) / det;
            ((self.sy - b * self.sx) / self.s0, b)
        } else {
            (0.0, self.sy / self.sx.max(1.0))
        };
        if b < 0.0 {
            // Noise made bigger batches look faster: fall back to a mean per unit.
            self.alpha = 0.0;
            self.beta = self.sy / self.sx.max(1.0);
        } else if a < 0.0 {
            self.alpha = 0.0;
            self.beta = self.sxy / self.sxx.max(1.0);
        } else {
            self.alpha = a;
            self.beta = b;
        }
    }
    pub fn secs(&self, units: u64) -> f64 {
        self.alpha + self.beta * units as f64
    }
}

struct State {
    queue: VecDeque<Entry>,
    queued_pred: u64,
    running: Vec<RunningBatch>,
    running_pred: u64,
    idle_base: u64,
    /// Allocated with the model loaded and warm, nothing running: what a request can never
    /// share the device with.
    model_base: u64,
    cost: CostModel,
    /// The same fit, fed only with batches during which nothing was shed: what the server
    /// takes when it is not overloaded. The auto latency target is anchored here, so that
    /// contention under overload (compute slowed by the very requests being shed) cannot
    /// raise the target along with the latency.
    quiet_cost: CostModel,
    draining: bool,
    closed: bool,
    batch_seq: u64,
}

/// Tracks the allocator's allocated bytes event by event, so a batch's actual peak can be
/// read without resetting the allocator's own peak statistics.
struct WindowPeak {
    stats: DeviceStats,
    peak: Arc<AtomicU64>,
}

impl Observer for WindowPeak {
    fn on_event(&mut self, ev: &AllocEvent) {
        self.stats.observe(ev);
        let a = self.stats.allocated_bytes.all().current.max(0) as u64;
        self.peak.fetch_max(a, Ordering::Relaxed);
    }
}

/// The queue, its ledger and the compute threads.
pub struct Scheduler {
    st: Mutex<State>,
    cv: Condvar,
    cfg: SchedConfig,
    model: Arc<ServedModel>,
    predictor: Arc<Predictor>,
    probe: Arc<dyn AllocatorProbe>,
    metrics: Arc<Metrics>,
    window: Arc<AtomicU64>,
    observer_id: usize,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A request's place in the queue. Dropping it before the answer came cancels the request.
pub struct Ticket {
    sched: Arc<Scheduler>,
    id: u64,
    done: bool,
}

impl Ticket {
    /// The answer arrived: nothing to cancel.
    pub fn complete(mut self) {
        self.done = true;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.sched.cancel(self.id);
        }
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl Scheduler {
    /// A scheduler for `model`, its memory on `probe`'s allocator. `idle_base`: allocated
    /// bytes with nothing running.
    pub fn new(
        cfg: SchedConfig,
        model: Arc<ServedModel>,
        predictor: Arc<Predictor>,
        probe: Arc<dyn AllocatorProbe>,
        metrics: Arc<Metrics>,
    ) -> Arc<Scheduler> {
        let idle_base = model.device().memory_allocated();
        let window = Arc::new(AtomicU64::new(idle_base));
        let observer_id = probe.add_observer(Box::new(WindowPeak {
            stats: probe.stats(),
            peak: window.clone(),
        }));
        Arc::new(Scheduler {
            st: Mutex::new(State {
                queue: VecDeque::new(),
                queued_pred: 0,
                running: Vec::new(),
                running_pred: 0,
                idle_base,
                model_base: idle_base,
                cost: CostModel::new(),
                quiet_cost: CostModel::new(),
                draining: false,
                closed: false,
                batch_seq: 0,
            }),
            cv: Condvar::new(),
            cfg,
            model,
            predictor,
            probe,
            metrics,
            window,
            observer_id,
            threads: Mutex::new(Vec::new()),
        })
    }

    pub fn config(&self) -> &SchedConfig {
        &self.cfg
    }

    /// Runs warm-up batches of 1 and `big` samples of `key` (a fresh allocator's first batch
    /// sets up its cache; the first runs of a kernel are slow) and seeds the compute-time
    /// model with the two sizes. `big` must fit the memory limit.
    pub fn calibrate(&self, key: BatchKey, big: usize) -> Result<(), vramroom_tensor::TensorError> {
        let big = big.max(1);
        // The first run of each size is cold (fresh pages, empty allocator cache): unmeasured.
        for n in [1, big] {
            drop(self.model.forward_batch(key, n, None)?);
        }
        for n in [1, big, 1, big] {
            let t = Instant::now();
            drop(self.model.forward_batch(key, n, None)?);
            let s = secs(t.elapsed());
            let units = (n as u64 * key.units_per_sample()) as f64;
            let mut st = self.st.lock();
            st.cost.observe(units, s);
            st.quiet_cost.observe(units, s);
        }
        let mut st = self.st.lock();
        st.idle_base = self.model.device().memory_allocated();
        st.model_base = st.idle_base;
        Ok(())
    }

    /// Starts the compute threads.
    pub fn spawn_workers(self: &Arc<Self>) -> std::io::Result<()> {
        let mut th = self.threads.lock();
        for i in 0..self.cfg.workers.max(1) {
            let s = self.clone();
            th.push(
                std::thread::Builder::new()
                    .name(format!("vramroom-compute-{i}"))
                    .spawn(move || s.worker())?,
            );
        }
        Ok(())
    }

    /// The compute-time fits: `(live, quiet)`.
    pub fn cost_model(&self) -> (CostModel, CostModel) {
        let st = self.st.lock();
        (st.cost.clone(), st.quiet_cost.clone())
    }

    /// The memory admission ledger: `(committed, queued, running, idle_base)` bytes.
    pub fn ledger(&self) -> (u64, u64, u64, u64) {
        let mut st = self.st.lock();
        let committed = self.committed(&mut st);
        (committed, st.queued_pred, st.running_pred, st.idle_base)
    }

    /// `max(allocated, idle_base + Σ running) + Σ queued`, re-reading `idle_base` when
    /// nothing runs.
    fn committed(&self, st: &mut State) -> u64 {
        let alloc = self.model.device().memory_allocated();
        if st.running.is_empty() {
            st.idle_base = alloc;
        }
        alloc.max(st.idle_base + st.running_pred) + st.queued_pred
    }

    /// `(requests, samples)` waiting, and batches running.
    pub fn depth(&self) -> (usize, usize, usize) {
        let st = self.st.lock();
        (
            st.queue.len(),
            st.queue.iter().map(|e| e.input.samples).sum(),
            st.running.len(),
        )
    }

    /// Predicted seconds until a worker could start something new, and the queued work
    /// ahead of it.
    fn backlog_s(&self, st: &State, now: Instant) -> f64 {
        let w = self.cfg.workers.max(1);
        let mut free: Vec<f64> = st
            .running
            .iter()
            // A batch past its estimate is not about to finish: assume a quarter more.
            .map(|r| (r.est_s - secs(now.saturating_duration_since(r.started))).max(r.est_s / 4.0))
            .collect();
        free.resize(w.max(free.len()), 0.0);
        let first_free = free.iter().copied().fold(f64::INFINITY, f64::min);
        let mut units = 0u64;
        let mut per_key: Vec<(BatchKey, usize)> = Vec::new();
        for e in &st.queue {
            units += e.input.samples as u64 * e.input.key.units_per_sample();
            match per_key.iter_mut().find(|(k, _)| *k == e.input.key) {
                Some(p) => p.1 += e.input.samples,
                None => per_key.push((e.input.key, e.input.samples)),
            }
        }
        let batches: usize = per_key
            .iter()
            .map(|(_, s)| s.div_ceil(self.cfg.max_batch.max(1)))
            .sum();
        let work = st.cost.alpha * batches as f64 + st.cost.beta * units as f64;
        first_free + work / w as f64
    }

    /// The request's latency target, and its predicted latency if admitted now.
    fn latency_check(&self, st: &State, input: &Input, now: Instant) -> (Option<Duration>, f64) {
        let units = input.samples as u64 * input.key.units_per_sample();
        let own = st.cost.secs(units);
        let max_wait = secs(self.cfg.max_wait);
        let target = match self.cfg.latency {
            LatencyTarget::Off => None,
            LatencyTarget::Fixed(d) => Some(d),
            LatencyTarget::Auto => {
                // The batch it may wait behind: a full one of its kind.
                let batch = self.cfg.max_batch.max(1) as u64 * input.key.units_per_sample();
                Some(
                    Duration::from_secs_f64(
                        AUTO_TARGET_FACTOR * (max_wait + st.quiet_cost.secs(units))
                            + st.quiet_cost.secs(batch),
                    )
                    .max(MIN_AUTO_TARGET),
                )
            }
        };
        // The batch it joins starts when a worker is free and the work ahead is done, but
        // not before it has filled or its oldest member has waited max_wait.
        let same: Vec<&Entry> = st
            .queue
            .iter()
            .filter(|e| e.input.key == input.key)
            .collect();
        let same_samples: usize = same.iter().map(|e| e.input.samples).sum();
        let fill_wait = if same_samples + input.samples >= self.cfg.max_batch || st.draining {
            0.0
        } else {
            match same.first() {
                Some(e) => (max_wait - secs(now.saturating_duration_since(e.arrived))).max(0.0),
                None => max_wait,
            }
        };
        let start = self.backlog_s(st, now).max(fill_wait);
        (target, start + own)
    }

    /// Seconds a shed client should wait before retrying (at least 1: the header counts
    /// whole seconds).
    fn retry_after(&self, st: &State, now: Instant) -> u64 {
        (self.backlog_s(st, now).ceil() as u64).clamp(1, 60)
    }

    /// Admits `input` (whose predicted peak is `pred`) or says why not.
    pub fn submit(
        self: &Arc<Self>,
        id: u64,
        input: Input,
        pred: u64,
    ) -> Result<Admitted, ApiError> {
        self.try_submit(id, input, pred).map_err(|r| {
            if let Some(reason) = r.error.reject {
                self.metrics.reject(reason);
            }
            r.error
        })
    }

    /// [`Scheduler::submit`] that counts no rejection and hands a refused input back, so a
    /// router can offer it to another replica (and count the refusal once, where it answers).
    pub fn try_submit(
        self: &Arc<Self>,
        id: u64,
        input: Input,
        pred: u64,
    ) -> Result<Admitted, Box<Refused>> {
        let now = Instant::now();
        let mut st = self.st.lock();
        // Checked and queued under one lock: a burst cannot slip past the budgets together.
        let target = match self.refusal(&mut st, &input, pred, now) {
            Ok(t) => t,
            Err(error) => return Err(Box::new(Refused { error, input })),
        };
        let (tx, rx) = oneshot::channel();
        st.queued_pred += pred;
        let seq_at_arrival = st.batch_seq;
        let behind_work = !st.running.is_empty() || !st.queue.is_empty();
        st.queue.push_back(Entry {
            id,
            input,
            pred,
            arrived: now,
            target,
            seq_at_arrival,
            behind_work,
            tx,
        });
        drop(st);
        self.cv.notify_all();
        Ok((
            Ticket {
                sched: self.clone(),
                id,
                done: false,
            },
            rx,
        ))
    }

    /// Why `input` cannot be admitted now, or its latency target if it can.
    fn refusal(
        &self,
        st: &mut State,
        input: &Input,
        pred: u64,
        now: Instant,
    ) -> Result<Option<Duration>, ApiError> {
        if st.draining || st.closed {
            return Err(ApiError::shed(
                Reject::Shutdown,
                1,
                "the server is shutting down",
            ));
        }
        if st.model_base.saturating_add(pred) > self.cfg.limit_bytes {
            return Err(ApiError::unprocessable(format!(
                "this input needs {} bytes at its peak (predicted on the meta device) on top \
                 of the model's {}; the server admits at most {} in all (capacity − margin)",
                pred, st.model_base, self.cfg.limit_bytes
            )));
        }
        if st.queue.len() >= self.cfg.max_queue {
            let ra = self.retry_after(st, now);
            return Err(ApiError::shed(
                Reject::QueueFull,
                ra,
                format!("{} requests are queued (--max-queue)", st.queue.len()),
            ));
        }
        let (target, est) = self.latency_check(st, input, now);
        // A request that finds the server idle runs next whatever the estimate says: shedding
        // it could not make anything faster, and the batches it runs keep the compute-time
        // model learning (an estimate too high would otherwise shed everything for ever).
        let idle = st.running.is_empty() && st.queue.is_empty();
        if let (Some(t), false) = (target, idle) {
            if est > secs(t) {
                let ra = self.retry_after(st, now);
                return Err(ApiError::shed(
                    Reject::QueueDelay,
                    ra,
                    format!(
                        "predicted latency {:.1} ms is over the target {:.1} ms",
                        est * 1e3,
                        secs(t) * 1e3
                    ),
                ));
            }
        }
        let committed = self.committed(st);
        if committed.saturating_add(pred) > self.cfg.limit_bytes {
            let ra = self.retry_after(st, now);
            return Err(ApiError::shed(
                Reject::Memory,
                ra,
                format!(
                    "not enough memory: {committed} bytes committed + {pred} predicted for this \
                     request > {} (capacity − margin)",
                    self.cfg.limit_bytes
                ),
            ));
        }
        Ok(target)
    }

    /// The client of request `id` went away: if it is still queued, forget it.
    fn cancel(&self, id: u64) {
        let mut st = self.st.lock();
        if let Some(i) = st.queue.iter().position(|e| e.id == id) {
            if let Some(e) = st.queue.remove(i) {
                st.queued_pred = st.queued_pred.saturating_sub(e.pred);
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Stop admitting; queued requests are dispatched without waiting to fill.
    pub fn drain(&self) {
        self.st.lock().draining = true;
        self.cv.notify_all();
    }

    /// Answer every queued request 503 (the drain timed out).
    pub fn abort_queued(&self) {
        let entries: Vec<Entry> = {
            let mut st = self.st.lock();
            st.queued_pred = 0;
            st.queue.drain(..).collect()
        };
        for e in entries {
            self.metrics.reject(Reject::Shutdown);
            let _ = e.tx.send(Err(ApiError::shed(
                Reject::Shutdown,
                1,
                "the server shut down before this request ran",
            )));
        }
    }

    /// Workers exit once the queue is empty; waits for them.
    pub fn close_and_join(&self) {
        {
            let mut st = self.st.lock();
            st.draining = true;
            st.closed = true;
        }
        self.cv.notify_all();
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        self.probe.remove_observer(self.observer_id);
    }

    /// Picks the next batch, or `None` when closed and empty. Called with the lock held.
    fn next_batch(&self, st: &mut parking_lot::MutexGuard<'_, State>) -> Option<Batch> {
        loop {
            let now = Instant::now();
            // Requests that waited behind other work until they can no longer finish within
            // their target are answered now. One that only waited for its own batch to fill
            // (or for a late timer) on an idle server runs: refusing it would help nobody,
            // the worker is free.
            let batch_seq = st.batch_seq;
            let cost = st.cost.clone();
            let late = |e: &Entry| {
                let own = cost.secs(e.input.samples as u64 * e.input.key.units_per_sample());
                (e.behind_work || e.seq_at_arrival != batch_seq)
                    && e.target.is_some_and(|t| {
                        secs(now.saturating_duration_since(e.arrived)) + own > secs(t)
                    })
            };
            if st.queue.iter().any(late) {
                let (late, keep): (Vec<Entry>, Vec<Entry>) = st.queue.drain(..).partition(late);
                st.queue = keep.into();
                for e in late {
                    st.queued_pred = st.queued_pred.saturating_sub(e.pred);
                    let ra = self.retry_after(st, now);
                    self.metrics.reject(Reject::Deadline);
                    let _ = e.tx.send(Err(ApiError::shed(
                        Reject::Deadline,
                        ra,
                        "waited in the queue past its latency target",
                    )));
                }
            }
            let Some(head) = st.queue.front() else {
                if st.closed {
                    return None;
                }
                self.cv.wait(st);
                continue;
            };
            let key = head.input.key;
            let ready_at = head.arrived + self.cfg.max_wait;
            let avail: usize = st
                .queue
                .iter()
                .filter(|e| e.input.key == key)
                .map(|e| e.input.samples)
                .sum();
            // Waiting to fill is pointless when memory admits no further request of this
            // key until something finishes: the batch goes with what it has.
            let committed = self.committed(st);
            let smallest = self.predictor.cached(key, 1).unwrap_or(0);
            let cannot_grow = committed.saturating_add(smallest) > self.cfg.limit_bytes
                || st.queue.len() >= self.cfg.max_queue;
            if avail < self.cfg.max_batch && now < ready_at && !st.draining && !cannot_grow {
                self.cv.wait_until(st, ready_at);
                continue;
            }
            return Some(self.take_batch(st, key, now));
        }
    }

    /// Takes up to `max_batch` samples of `key`, oldest first, while the batch still fits
    /// the memory limit and its oldest member's latency target.
    fn take_batch(&self, st: &mut State, key: BatchKey, now: Instant) -> Batch {
        let committed = self.committed(st);
        let mut picked: Vec<usize> = Vec::new();
        let mut samples = 0;
        let mut member_pred = 0u64;
        let mut pred = 0u64;
        // The least time any member has left before its target: the batch's compute must
        // fit in it (the head always goes, even late: the worker is free).
        let mut min_left = f64::INFINITY;
        for (i, e) in st.queue.iter().enumerate() {
            if e.input.key != key {
                continue;
            }
            let n = samples + e.input.samples;
            if n > self.cfg.max_batch {
                break;
            }
            let p = self
                .predictor
                .cached(key, n)
                .unwrap_or(member_pred + e.pred);
            let left = e.target.map_or(f64::INFINITY, |t| {
                secs(t) - secs(now.saturating_duration_since(e.arrived))
            });
            if !picked.is_empty() {
                let extra = p.saturating_sub(member_pred + e.pred);
                if committed.saturating_add(extra) > self.cfg.limit_bytes {
                    break;
                }
                if st.cost.secs(n as u64 * key.units_per_sample()) > min_left.min(left) {
                    break;
                }
            }
            min_left = min_left.min(left);
            picked.push(i);
            samples = n;
            member_pred += e.pred;
            pred = p.max(member_pred);
        }
        let mut entries = Vec::with_capacity(picked.len());
        for &i in picked.iter().rev() {
            if let Some(e) = st.queue.remove(i) {
                entries.push(e);
            }
        }
        entries.reverse();
        st.queued_pred = st.queued_pred.saturating_sub(member_pred);
        st.running_pred += pred;
        st.batch_seq += 1;
        let alone = st.running.is_empty();
        let est_s = st.cost.secs(samples as u64 * key.units_per_sample());
        st.running.push(RunningBatch {
            seq: st.batch_seq,
            started: now,
            est_s,
        });
        Batch {
            seq: st.batch_seq,
            key,
            samples,
            pred,
            entries,
            alone,
            rejections_at_start: self.metrics.rejections_total(),
        }
    }

    fn worker(self: Arc<Self>) {
        loop {
            let batch = {
                let mut st = self.st.lock();
                match self.next_batch(&mut st) {
                    Some(b) => b,
                    None => return,
                }
            };
            self.run_batch(batch);
        }
    }

    fn run_batch(&self, b: Batch) {
        let before = self.model.device().memory_allocated();
        if b.alone {
            self.window.store(before, Ordering::Relaxed);
        }
        let start = Instant::now();
        let inputs: Vec<&Input> = b.entries.iter().map(|e| &e.input).collect();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| self.model.run(b.key, &inputs)));
        let compute = start.elapsed();
        let window_peak = self.window.load(Ordering::Relaxed);
        let units = b.samples as u64 * b.key.units_per_sample();
        let (ok, oom) = match &result {
            Ok(Ok(_)) => (true, false),
            Ok(Err(e)) => (false, e.is_oom()),
            Err(_) => (false, false),
        };
        if oom {
            // The prediction was wrong (or something outside the ledger took memory): give
            // the cache back so the next batch starts from a clean pool.
            self.probe.empty_cache();
        }
        let (alone, retry) = {
            let mut st = self.st.lock();
            st.running_pred = st.running_pred.saturating_sub(b.pred);
            st.running.retain(|r| r.seq != b.seq);
            // Alone from start to end: no other batch started meanwhile.
            let alone = b.alone && st.batch_seq == b.seq;
            if ok {
                st.cost.observe(units as f64, secs(compute));
                if alone && self.metrics.rejections_total() == b.rejections_at_start {
                    st.quiet_cost.observe(units as f64, secs(compute));
                }
            }
            if st.running.is_empty() {
                st.idle_base = self.model.device().memory_allocated();
            }
            (alone, self.retry_after(&st, Instant::now()))
        };
        self.cv.notify_all();
        self.metrics.record_batch(BatchRecord {
            seq: b.seq,
            key: b.key,
            samples: b.samples,
            requests: b.entries.len(),
            predicted_bytes: b.pred,
            actual_bytes: alone.then(|| window_peak.saturating_sub(before)),
            compute_s: secs(compute),
            ok,
        });
        let compute_s = secs(compute);
        let batch_requests = b.entries.len();
        match result {
            Ok(Ok(outputs)) => {
                for (e, out) in b.entries.into_iter().zip(outputs) {
                    let queue_s = secs(start.saturating_duration_since(e.arrived));
                    self.metrics.observe_request(queue_s, compute_s);
                    let _ = e.tx.send(Ok(Done {
                        outputs: out,
                        queue_s,
                        compute_s,
                        batch_samples: b.samples,
                        batch_requests,
                        key: b.key,
                    }));
                }
            }
            Ok(Err(err)) => {
                let msg = err.to_string();
                tracing::warn!(batch = b.seq, samples = b.samples, error = %msg, "batch failed");
                for e in b.entries {
                    let reply = if oom {
                        self.metrics.reject(Reject::Oom);
                        ApiError::shed(
                            Reject::Oom,
                            retry,
                            "the batch ran out of device memory; it was freed, try again",
                        )
                    } else {
                        ApiError::internal(format!("inference failed: {msg}"))
                    };
                    let _ = e.tx.send(Err(reply));
                }
            }
            Err(_) => {
                tracing::error!(batch = b.seq, "inference panicked");
                for e in b.entries {
                    let _ = e.tx.send(Err(ApiError::internal("inference panicked")));
                }
            }
        }
    }
}

struct Batch {
    seq: u64,
    key: BatchKey,
    samples: usize,
    pred: u64,
    entries: Vec<Entry>,
    alone: bool,
    rejections_at_start: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_model_fits_a_line_and_follows_a_change() {
        let mut c = CostModel::new();
        for _ in 0..5 {
            c.observe(8.0, 0.002 + 8.0 * 0.0001);
            c.observe(64.0, 0.002 + 64.0 * 0.0001);
        }
        assert!((c.alpha - 0.002).abs() < 1e-9 && (c.beta - 0.0001).abs() < 1e-9);
        assert!((c.secs(100) - 0.012).abs() < 1e-9);
        // The machine gets twice as slow: the fit follows within a few dozen batches.
        for _ in 0..40 {
            c.observe(8.0, 2.0 * (0.002 + 8.0 * 0.0001));
            c.observe(64.0, 2.0 * (0.002 + 64.0 * 0.0001));
        }
        assert!((c.secs(100) / 0.024 - 1.0).abs() < 0.02, "{c:?}");
    }

    #[test]
    fn cost_model_never_goes_negative() {
        let mut c = CostModel::new();
        // One size only: all of it is per unit.
        c.observe(10.0, 0.01);
        assert_eq!((c.alpha, c.beta), (0.0, 0.001));
        // Noise that makes bigger batches look faster.
        c.observe(100.0, 0.001);
        assert!(c.alpha >= 0.0 && c.beta >= 0.0, "{c:?}");
        assert!(c.secs(1) >= 0.0);
    }
}
