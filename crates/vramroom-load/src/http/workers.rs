//! Where the load runs: the state the controller, the workers and the sampler share, one
//! request, the closed model's workers on their load threads, the open model's dispatcher.
//!
//! Design note: closed model: `threads` load threads, each a current-thread runtime
//! ([`Shards`]) that owns every `threads`-th worker with its connection, timer and I/O
//! registration, as wrk's threads do. A worker's request never leaves its thread: no work
//! stealing, no wake-up handed to another core, no shared timer wheel. Against one
//! work-stealing runtime of the same threads this is what lets the client keep pace with
//! wrk on a many-core host (see `vramroom bench http`). Open model: a dispatcher plus one
//! task per request on a work-stealing runtime of `threads` threads, whose connections are
//! pooled across all of them (a request takes whichever connection is free, wherever it
//! was opened).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Sleep;

use crate::error::{LoadError, Result};
use crate::http::body::Bodies;
use crate::http::client::{self, Conn, ErrorKind, RequestTemplate, Target};
use crate::http::load::{Arrival, Schedule};
use crate::http::record::{Done, Outcome, Recorder};
use crate::http::refusal::Refusals;

/// State shared by the controller, the workers and the sampler.
pub(crate) struct Ctx {
    pub(crate) target: Target,
    pub(crate) template: RequestTemplate,
    pub(crate) head_len: u64,
    pub(crate) bodies: Bodies,
    pub(crate) timeout: Duration,
    pub(crate) rec: Recorder,
    pub(crate) start: Instant,
    pub(crate) stage: AtomicUsize,
    pub(crate) workers_target: AtomicUsize,
    pub(crate) done: AtomicBool,
    pub(crate) notify: Notify,
    pub(crate) next_seq: AtomicU64,
    pub(crate) limit: Option<u64>,
    /// The dispatcher or a worker ran into `-n`.
    pub(crate) limit_hit: AtomicBool,
    pub(crate) started: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) shed: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// Answers whose body named a CUDA OOM.
    pub(crate) oom_answers: AtomicU64,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) peak_in_flight: Vec<AtomicUsize>,
    /// Per stage: requests sent in it that have finished (any outcome), and those that got
    /// an HTTP answer. `--ramp-until-oom` holds a step until its own requests are back.
    pub(crate) finished_by_stage: Vec<AtomicU64>,
    pub(crate) answered_by_stage: Vec<AtomicU64>,
    pub(crate) connections: AtomicU64,
    pub(crate) live_workers: AtomicUsize,
    /// Open model.
    pub(crate) scheduled: AtomicU64,
    /// Open model: requests spawned and not done (waiting for a connection, or in flight).
    pub(crate) pending: AtomicU64,
    /// The stop flag was seen: requests still waiting for a connection are dropped.
    pub(crate) cancelled: AtomicBool,
    pub(crate) dropped: AtomicU64,
    pub(crate) pool: Mutex<Vec<Conn>>,
    pub(crate) slots: Semaphore,
    /// Whether every answer so far was the same refusal (a 4xx).
    pub(crate) refusals: Refusals,
    /// Answers with a `Retry-After`, and the longest it asked for.
    pub(crate) retry_after: AtomicU64,
    pub(crate) retry_after_max_s: AtomicU64,
}

impl Ctx {
    pub(crate) fn t(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
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

pub(crate) async fn closed_worker(ctx: Arc<Ctx>, i: usize) {
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
pub(crate) async fn dispatcher(
    ctx: Arc<Ctx>,
    plan: Vec<(f64, Option<f64>)>,
    arrival: Arrival,
    seed: u64,
) {
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
pub(crate) struct Shards {
    handles: Vec<tokio::runtime::Handle>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Shards {
    pub(crate) fn start(n: usize) -> Result<Shards> {
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

    pub(crate) fn spawn<F>(&self, worker: usize, f: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        drop(self.handles[worker % self.handles.len()].spawn(f));
    }

    pub(crate) fn stop(self) {
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
