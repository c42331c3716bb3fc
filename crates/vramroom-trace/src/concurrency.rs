//! What-if at higher load: from a service's trace at low load, the concurrency at which it
//! runs out of memory.
//!
//! Design note: a service's memory under load is its base (weights, caches, workspaces) plus
//! the requests in flight, whose allocations interleave in one caching allocator. A trace
//! recorded at low load holds each request's own allocation sequence; at concurrency N the
//! same sequences run N at a time. So the trace is cut into requests (by the tag the probe's
//! request helper puts in each entry's `user_metadata`, `vramroom:req=ID;items=N;tokens=N;
//! bytes=N`, else by the pauses between requests), the trace up to the first request is
//! replayed exactly (the allocator state the service really had), and then N simulated
//! workers each run requests drawn from the recorded ones, back to back, each starting at a
//! random point within one average request: requests in flight at a sustained load arrive
//! at independent times, so their peaks meet by chance, not all at once. Two pacings are run
//! and the more out of memory counts (`Interleave::Either`): kernel by kernel (one
//! allocation or free per worker per turn, `Staggered`: a saturated GPU's one queue paces
//! every thread's launches) and the recorded clock (`Timed`: a handler that waits, on a
//! sleep or a remote call, holds its memory for the wait). Each worker is a thread of the
//! server and first allocates what a thread keeps (its cuBLAS handle's workspaces,
//! `THREAD_WORKSPACES`): N in flight hold N sets, which a gentle run on one connection shows
//! once. The exact allocator decides, under the service's capacity (its memory fraction, or
//! the device less what the CUDA context and libraries hold), whether and when a request
//! fails.
//!
//! Which requests meet is chance, so each concurrency is run with several seeds (which
//! requests each worker draws), and it counts as out of memory when at least half of them are.
//! Monotone in N in practice; the search doubles, then bisects.
//!
//! A service whose one worker thread runs every request while the handlers wait (a batcher:
//! the probe tags its batches `worker=1` with the thread's number) does not stack requests
//! in memory, whatever the load: only concurrency 1 is replayed (`Workload::one_worker`).
//!
//! Why this model: on the nine services of device runs 16 and 17 (their saved gentle traces,
//! `repredict` example) it is within one ramp step of every observed first OOM (51 ramps)
//! and of all 17 decided what-if restarts. Lockstep from aligned starts (the default before)
//! lines every request's peak up at once: GPT-2 scoring, whose peak is one spike of fp32
//! logits, came out 9 against 24 observed, its replayed peak allocated at 8 in flight twice
//! the GPU's. GIL-like 5 ms slices put two models at 77 against 16. Without the per-thread
//! workspaces, staggered was two steps high there (47): 33 MiB a thread is a third of its
//! cap at 16 threads. Kernel pacing alone misses a handler that holds memory across a wait
//! (the stub service of tests/predict.rs: 16 against 11); the clock alone puts the
//! `empty_cache()` service at 35 against 24 to 32.

use std::cmp::Reverse;
use std::collections::HashMap;

use vramroom_alloc::{AllocError, AllocatorConfig, Snapshot, TraceAction, TraceEntry};

use crate::replay::{own_config, ReplayError, ReplayOptions, ReplayPlan, Session};

/// The `user_metadata` prefix the probe's request helper writes.
pub const TAG_PREFIX: &str = "vramroom:req=";

/// What a request carried, as the service told the probe (any may be missing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RequestSize {
    pub items: Option<u64>,
    pub tokens: Option<u64>,
    pub bytes: Option<u64>,
}

impl RequestSize {
    /// The unit a cap or a per-unit cost is best stated in: tokens, else items, else bytes.
    pub fn main(&self) -> Option<(u64, &'static str)> {
        self.tokens
            .map(|t| (t, "tokens"))
            .or(self.items.map(|i| (i, "items")))
            .or(self.bytes.map(|b| (b, "bytes")))
    }
}

/// A request tag parsed from `user_metadata`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tag {
    pub id: String,
    pub size: RequestSize,
    /// The probe's number for the thread that ran the request (`thread=K`).
    pub thread: Option<u32>,
    /// Run on a worker thread while a handler waited (`worker=1`): a batcher's batch.
    pub worker: bool,
}

/// A request tag parsed from `user_metadata` (unknown fields are skipped: older and newer
/// probes both parse).
pub fn parse_tag(meta: &str) -> Option<Tag> {
    let rest = meta.strip_prefix(TAG_PREFIX)?;
    let mut parts = rest.split(';');
    let id = parts.next()?.to_string();
    if id.is_empty() {
        return None;
    }
    let mut t = Tag {
        id,
        ..Tag::default()
    };
    for p in parts {
        let Some((k, v)) = p.split_once('=') else {
            continue;
        };
        let v = v.trim().parse::<u64>().ok();
        match k.trim() {
            "items" => t.size.items = v,
            "tokens" => t.size.tokens = v,
            "bytes" => t.size.bytes = v,
            "thread" => t.thread = v.and_then(|x| u32::try_from(x).ok()),
            "worker" => t.worker = v == Some(1),
            _ => {}
        }
    }
    Some(t)
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc { size: u64, stream: u64, key: u32 },
    Free { key: u32 },
}

/// An op and when it came, in microseconds from its request's first entry.
#[derive(Clone, Copy, Debug)]
struct TimedOp {
    op: Op,
    t: i64,
}

/// One request's allocations and frees, timed from its first entry.
#[derive(Clone, Debug)]
pub struct Request {
    pub id: String,
    pub size: RequestSize,
    pub duration_us: i64,
    /// Its own highest live bytes (requested sizes).
    pub peak_bytes: u64,
    /// The probe's thread number, and whether a worker thread ran it (see `Tag`).
    pub thread: Option<u32>,
    pub worker: bool,
    ops: Vec<TimedOp>,
}

/// A trace cut into the base (replayed as recorded) and its requests.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Trace index of the first request entry: everything before is the base.
    pub base_end: usize,
    pub requests: Vec<Request>,
    /// Requests were told apart by the probe's tags (else by memory given back).
    pub tagged: bool,
    /// What each thread that serves requests allocates once and keeps (size, stream): its
    /// cuBLAS handle's workspaces (see `THREAD_WORKSPACES`). Taken out of the first request
    /// of the trace's first thread; every simulated worker allocates it once.
    pub thread_state: Vec<(u64, u64)>,
}

impl Workload {
    /// The thread, when one worker thread ran every request while handlers waited (a
    /// batcher): requests in flight then queue for it instead of stacking in memory.
    pub fn one_worker(&self) -> Option<u32> {
        let mut it = self.requests.iter().filter(|r| !r.ops.is_empty());
        let first = it.next()?;
        let t = first.thread.filter(|_| first.worker)?;
        it.all(|r| r.worker && r.thread == Some(t)).then_some(t)
    }
}

/// The workspaces PyTorch 2.11 gives each cuBLAS handle through the caching allocator and
/// keeps (`cuda_hidden.json`'s `cublas_handle_workspace` per architecture: 32 MiB on sm90,
/// 8 MiB + 128 KiB before it; `cublaslt_workspace`, 1 MiB). Handles are per thread (a
/// thread-local pool window), so a threaded server holds one set per thread that serves:
/// N in flight, N sets. A gentle run at one in flight shows one set, inside its first
/// request; other never-freed allocations of a first request (a model's lazily built cache)
/// are the process's, not the thread's, so only these sizes count.
pub const THREAD_WORKSPACES: [u64; 3] = [33_554_432, 8_519_680, 1_048_576];

/// Cut device trace `trace` into requests.
pub fn split_requests(trace: &[TraceEntry]) -> Workload {
    let tagged = trace
        .iter()
        .any(|e| e.action == TraceAction::Alloc && parse_tag(&e.user_metadata).is_some());
    if tagged {
        split_tagged(trace)
    } else {
        split_untagged(trace)
    }
}

struct Building {
    id: String,
    size: RequestSize,
    thread: Option<u32>,
    worker: bool,
    start: i64,
    end: i64,
    live: u64,
    peak: u64,
    ops: Vec<TimedOp>,
    next_key: u32,
}

impl Building {
    fn new(tag: Tag, start: i64) -> Self {
        Building {
            id: tag.id,
            size: tag.size,
            thread: tag.thread,
            worker: tag.worker,
            start,
            end: start,
            live: 0,
            peak: 0,
            ops: Vec::new(),
            next_key: 0,
        }
    }
    fn alloc(&mut self, e: &TraceEntry) -> u32 {
        let key = self.next_key;
        self.next_key += 1;
        self.ops.push(TimedOp {
            op: Op::Alloc {
                size: e.size,
                stream: e.stream,
                key,
            },
            t: e.time_us - self.start,
        });
        self.live += e.size;
        self.peak = self.peak.max(self.live);
        self.end = self.end.max(e.time_us);
        key
    }
    fn free(&mut self, e: &TraceEntry, key: u32, size: u64) {
        self.ops.push(TimedOp {
            op: Op::Free { key },
            t: e.time_us - self.start,
        });
        self.live = self.live.saturating_sub(size);
        self.end = self.end.max(e.time_us);
    }
    fn done(self) -> Request {
        Request {
            id: self.id,
            size: self.size,
            duration_us: (self.end - self.start).max(1),
            peak_bytes: self.peak,
            thread: self.thread,
            worker: self.worker,
            ops: self.ops,
        }
    }
}

fn split_tagged(trace: &[TraceEntry]) -> Workload {
    let mut reqs: Vec<Building> = Vec::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    // live address -> (request, key, size)
    let mut owner: HashMap<u64, (usize, u32, u64)> = HashMap::new();
    let mut base_end = None;
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::Alloc => {
                let Some(tag) = parse_tag(&e.user_metadata) else {
                    continue;
                };
                base_end.get_or_insert(i);
                let r = *by_id.entry(tag.id.clone()).or_insert_with(|| {
                    reqs.push(Building::new(tag, e.time_us));
                    reqs.len() - 1
                });
                let key = reqs[r].alloc(e);
                owner.insert(e.addr, (r, key, e.size));
            }
            TraceAction::FreeRequested => {
                if let Some((r, key, size)) = owner.remove(&e.addr) {
                    reqs[r].free(e, key, size);
                }
            }
            _ => {}
        }
    }
    let thread_state = take_thread_state(&mut reqs, &owner);
    Workload {
        base_end: base_end.unwrap_or(trace.len()),
        requests: reqs.into_iter().map(Building::done).collect(),
        tagged: true,
        thread_state,
    }
}

/// Moves the per-thread workspaces (`THREAD_WORKSPACES` sizes, never freed, allocated in the
/// first request a thread ran) out of those requests: a worker allocates them once, not
/// each time it draws that request. Returns the first thread's set.
fn take_thread_state(
    reqs: &mut [Building],
    never_freed: &HashMap<u64, (usize, u32, u64)>,
) -> Vec<(u64, u64)> {
    let mut first_of_thread: HashMap<Option<u32>, usize> = HashMap::new();
    for (i, r) in reqs.iter().enumerate() {
        first_of_thread.entry(r.thread).or_insert(i);
    }
    let firsts: std::collections::HashSet<usize> = first_of_thread.values().copied().collect();
    let mut taken: HashMap<usize, Vec<u32>> = HashMap::new();
    for &(r, key, size) in never_freed.values() {
        if firsts.contains(&r) && THREAD_WORKSPACES.contains(&size) {
            taken.entry(r).or_default().push(key);
        }
    }
    let mut state = Vec::new();
    let first = taken.keys().min().copied();
    for (r, keys) in taken {
        let b = &mut reqs[r];
        let mut kept = Vec::with_capacity(b.ops.len());
        for op in b.ops.drain(..) {
            match op.op {
                Op::Alloc { size, stream, key } if keys.contains(&key) => {
                    if Some(r) == first {
                        state.push((size, stream));
                    }
                }
                _ => kept.push(op),
            }
        }
        b.ops = kept;
        b.peak = live_peak(&b.ops);
    }
    state
}

/// The highest live bytes over a request's ops.
fn live_peak(ops: &[TimedOp]) -> u64 {
    let mut sizes: HashMap<u32, u64> = HashMap::new();
    let (mut live, mut peak) = (0u64, 0u64);
    for o in ops {
        match o.op {
            Op::Alloc { size, key, .. } => {
                sizes.insert(key, size);
                live += size;
                peak = peak.max(live);
            }
            Op::Free { key } => live = live.saturating_sub(sizes.remove(&key).unwrap_or(0)),
        }
    }
    peak
}

/// Without tags: the base ends after the last allocation that is never freed. After it,
/// requests are told apart by the pauses between them (a service at low load idles between
/// requests): a gap in time well above the typical gap between entries ends a request.
/// A free belongs to the request that made the allocation, whenever it comes.
fn split_untagged(trace: &[TraceEntry]) -> Workload {
    let mut live: HashMap<u64, usize> = HashMap::new();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::Alloc => {
                live.insert(e.addr, i);
            }
            TraceAction::FreeRequested => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    let base_end = live.values().max().map_or(0, |&i| i + 1);
    let rest = trace.get(base_end..).unwrap_or(&[]);
    let mut gaps: Vec<i64> = rest
        .windows(2)
        .map(|p| (p[1].time_us - p[0].time_us).max(0))
        .collect();
    gaps.sort_unstable();
    let median = gaps.get(gaps.len() / 2).copied().unwrap_or(0);
    let pause = (20 * median).max(1000);
    let mut reqs: Vec<Building> = Vec::new();
    let mut owner: HashMap<u64, (usize, u32, u64)> = HashMap::new();
    let mut last_t: Option<i64> = None;
    for e in rest {
        let new_req = last_t.is_none_or(|t| e.time_us - t > pause);
        last_t = Some(e.time_us);
        match e.action {
            TraceAction::Alloc => {
                if new_req || reqs.is_empty() {
                    let tag = Tag {
                        id: format!("{}", reqs.len() + 1),
                        ..Tag::default()
                    };
                    reqs.push(Building::new(tag, e.time_us));
                }
                let r = reqs.len() - 1;
                let key = reqs[r].alloc(e);
                owner.insert(e.addr, (r, key, e.size));
            }
            TraceAction::FreeRequested => {
                if let Some((r, key, size)) = owner.remove(&e.addr) {
                    reqs[r].free(e, key, size);
                }
            }
            _ => {}
        }
    }
    Workload {
        base_end,
        requests: reqs.into_iter().map(Building::done).collect(),
        tagged: false,
        thread_state: Vec::new(),
    }
}

/// How to run the what-if.
#[derive(Clone, Debug)]
pub struct LoadWhatIf {
    pub config: AllocatorConfig,
    /// The device's capacity (None: the trace's own or the H200 default, as in replay).
    pub capacity: Option<u64>,
    /// The allocator's own limit (a memory fraction's bytes), if the service had one.
    pub memory_limit: Option<u64>,
    pub requests_per_worker: usize,
    pub seeds: u64,
    pub max_concurrency: u32,
    /// Only requests whose main size is at most this (for the caps search).
    pub size_cap: Option<u64>,
    /// How the workers' ops interleave (see `run_turns` and `run_timed`).
    pub interleave: Interleave,
}

/// How concurrent requests' allocations interleave in the replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum Interleave {
    /// One allocation or free per worker per turn: every request at the same point at once.
    Lockstep,
    /// Each worker runs this many microseconds of its recorded timeline per turn (Python's
    /// GIL hands the interpreter to another thread every switch interval, 5 ms by default).
    Slices { us: i64 },
    /// Lockstep, but each worker starts after a random wait of up to one average request:
    /// requests arrive at independent times, so their phases do not line up.
    Staggered,
    /// The more out of memory of `Staggered` and `Timed` at each concurrency: a service's
    /// threads are paced by the GPU's queue (kernel by kernel) or by the clock (waits in the
    /// handler: a sleep, a remote call), and a gentle run cannot tell which.
    #[default]
    Either,
    /// In recorded time: each worker starts at a random moment within one average request
    /// and runs its requests back to back at their recorded pace, all workers at once.
    Timed,
}

impl Default for LoadWhatIf {
    fn default() -> Self {
        LoadWhatIf {
            config: AllocatorConfig::default(),
            capacity: None,
            memory_limit: None,
            requests_per_worker: 4,
            seeds: 5,
            max_concurrency: 4096,
            size_cap: None,
            interleave: Interleave::Either,
        }
    }
}

/// One concurrency's outcome over the seeds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConcurrencyPoint {
    pub concurrency: u32,
    pub runs: u32,
    pub oom_runs: u32,
    /// The highest peak reserved (and allocated) over the runs.
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
}

impl ConcurrencyPoint {
    pub fn ooms(&self) -> bool {
        2 * self.oom_runs >= self.runs && self.oom_runs > 0
    }
}

/// The prediction: the first concurrency that runs out of memory, and what was tried.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoadPrediction {
    pub alloc_conf: String,
    pub first_oom: Option<u32>,
    /// The highest concurrency tried that did not run out.
    pub safe: u32,
    pub points: Vec<ConcurrencyPoint>,
    pub requests_sampled_from: usize,
    /// One worker thread ran every request (`Workload::one_worker`): only concurrency 1 was
    /// replayed, since more in flight queue for that thread rather than stack in memory.
    pub one_worker: Option<u32>,
}

use vramroom_alloc::rng::Rng;

/// Why a load what-if could not run.
#[derive(Debug, thiserror::Error)]
pub enum LoadWhatIfError {
    #[error("{0}")]
    Replay(#[from] ReplayError),
    #[error("{0}")]
    NoRequests(String),
}

/// Runs `n` workers on one seed. Returns (ran out of memory, peak reserved, peak allocated).
fn run_once(
    snapshot: &Snapshot,
    plan: &ReplayPlan,
    w: &Workload,
    pool: &[usize],
    n: u32,
    seed: u64,
    opts: &LoadWhatIf,
) -> Result<(bool, u64, u64), LoadWhatIfError> {
    let ro = ReplayOptions {
        config: opts.config.clone(),
        capacity: opts.capacity,
        device: plan_device(plan),
        stop_at_oom: false,
        record_history: false,
        ..ReplayOptions::default()
    };
    let mut s = Session::new(snapshot, plan, &ro)?;
    s.run_to(w.base_end)?;
    if let Some(l) = opts.memory_limit {
        s.alloc.set_memory_limit(Some(l));
    }
    let mut rng = Rng::new(seed ^ (u64::from(n) << 32) ^ 0x5eed);
    let mean_ops = pool.iter().map(|&r| w.requests[r].ops.len()).sum::<usize>() / pool.len().max(1);
    let mut workers: Vec<Worker> = (0..n)
        .map(|_| Worker {
            reqs: (0..opts.requests_per_worker)
                .map(|_| pool[rng.below(pool.len())])
                .collect(),
            at: (0, 0),
            wait: 0,
            started: false,
        })
        .collect();
    if opts.interleave == Interleave::Staggered {
        for wk in &mut workers {
            wk.wait = rng.below(mean_ops.max(1));
        }
    }
    let oom = match opts.interleave {
        Interleave::Timed => {
            let mean_us = pool.iter().map(|&r| w.requests[r].duration_us).sum::<i64>()
                / pool.len().max(1) as i64;
            run_timed(&mut s, w, &mut workers, mean_us, &mut rng)?
        }
        Interleave::Slices { us } => run_turns(&mut s, w, &mut workers, Some(us.max(0)))?,
        Interleave::Lockstep | Interleave::Staggered | Interleave::Either => {
            run_turns(&mut s, w, &mut workers, None)?
        }
    };
    Ok((
        oom,
        s.alloc.max_memory_reserved(),
        s.alloc.max_memory_allocated(),
    ))
}

/// A simulated server thread: its requests, drawn up front, and where it is.
struct Worker {
    reqs: Vec<usize>,
    /// (request position, op index)
    at: (usize, usize),
    /// Turns to sit out before the first op.
    wait: usize,
    /// Its thread's workspaces are allocated (`Workload::thread_state`).
    started: bool,
}

/// Round robin. One op per worker per turn: at the load where memory runs out, the GPU is
/// the bottleneck, every thread's launches wait on the one stream's queue, and the threads
/// advance in step, each a kernel at a time; allocations and frees follow the launches.
/// Staggered workers join after their wait (their requests' phases differ); lockstep ones
/// all start at once. `slice`: a worker runs on until its slice of recorded time is spent
/// or its request ends (the response goes out), as threads under the GIL do. Returns
/// whether it ran out of memory.
fn run_turns(
    s: &mut Session,
    w: &Workload,
    workers: &mut [Worker],
    slice: Option<i64>,
) -> Result<bool, LoadWhatIfError> {
    let mut ptrs: HashMap<(u32, usize, u32), u64> = HashMap::new();
    let mut active: Vec<u32> = (0..workers.len() as u32).collect();
    while !active.is_empty() {
        let mut still = Vec::with_capacity(active.len());
        for &k in &active {
            let wk = &mut workers[k as usize];
            if wk.wait > 0 {
                wk.wait -= 1;
                still.push(k);
                continue;
            }
            if !wk.started {
                wk.started = true;
                if !start_thread(s, w)? {
                    return Ok(true);
                }
            }
            let mut turn_start: Option<i64> = None;
            loop {
                let (ri, oi) = wk.at;
                let Some(req) = wk.reqs.get(ri).map(|&r| &w.requests[r]) else {
                    break;
                };
                let TimedOp { op, t } = req.ops[oi];
                match (slice, turn_start) {
                    (None, Some(_)) => break,
                    (Some(us), Some(t0)) if t - t0 > us => break,
                    _ => {}
                }
                turn_start.get_or_insert(t);
                if !apply(s, &mut ptrs, k, ri, op)? {
                    return Ok(true);
                }
                if oi + 1 < req.ops.len() {
                    wk.at = (ri, oi + 1);
                } else {
                    wk.at = (ri + 1, 0);
                    break;
                }
            }
            if wk.at.0 < wk.reqs.len() {
                still.push(k);
            }
        }
        active = still;
    }
    Ok(false)
}

/// In recorded time: each worker starts at a random moment within one average request
/// (`mean_us`) and runs its requests back to back at their recorded pace, all at once.
/// Returns whether it ran out of memory.
fn run_timed(
    s: &mut Session,
    w: &Workload,
    workers: &mut [Worker],
    mean_us: i64,
    rng: &mut Rng,
) -> Result<bool, LoadWhatIfError> {
    let mut ptrs: HashMap<(u32, usize, u32), u64> = HashMap::new();
    // (when, worker, when its request began)
    let mut heap: std::collections::BinaryHeap<Reverse<(i64, u32, i64)>> = (0..workers.len()
        as u32)
        .map(|k| {
            let t0 = rng.below(mean_us.max(1) as usize) as i64;
            Reverse((t0, k, t0))
        })
        .collect();
    while let Some(Reverse((now, k, began))) = heap.pop() {
        let wk = &mut workers[k as usize];
        if !wk.started {
            wk.started = true;
            if !start_thread(s, w)? {
                return Ok(true);
            }
        }
        let (ri, oi) = wk.at;
        let Some(req) = wk.reqs.get(ri).map(|&r| &w.requests[r]) else {
            continue;
        };
        if !apply(s, &mut ptrs, k, ri, req.ops[oi].op)? {
            return Ok(true);
        }
        if oi + 1 < req.ops.len() {
            wk.at = (ri, oi + 1);
            heap.push(Reverse((began + req.ops[oi + 1].t, k, began)));
        } else if ri + 1 < wk.reqs.len() {
            wk.at = (ri + 1, 0);
            let next = (began + req.duration_us).max(now);
            heap.push(Reverse((next, k, next)));
        }
    }
    Ok(false)
}

/// The allocator's answer to one request: its address, or None when it ran out.
fn try_malloc(s: &mut Session, size: u64, stream: u64) -> Result<Option<u64>, LoadWhatIfError> {
    match s.alloc.malloc(size, stream) {
        Ok(a) => Ok(Some(a.ptr)),
        Err(AllocError::OutOfMemory(_)) => Ok(None),
        Err(e) => Err(ReplayError::Invalid(e.to_string()).into()),
    }
}

/// One op of worker `k`'s request `ri` on the allocator. Returns false when it ran out.
fn apply(
    s: &mut Session,
    ptrs: &mut HashMap<(u32, usize, u32), u64>,
    k: u32,
    ri: usize,
    op: Op,
) -> Result<bool, LoadWhatIfError> {
    match op {
        Op::Alloc { size, stream, key } => match try_malloc(s, size, stream)? {
            Some(p) => {
                ptrs.insert((k, ri, key), p);
            }
            None => return Ok(false),
        },
        Op::Free { key } => {
            if let Some(p) = ptrs.remove(&(k, ri, key)) {
                s.alloc
                    .free(p)
                    .map_err(|e| ReplayError::Invalid(e.to_string()))?;
            }
        }
    }
    Ok(true)
}

/// A worker thread's first op: what the thread keeps (`Workload::thread_state`). Returns
/// false when it ran out.
fn start_thread(s: &mut Session, w: &Workload) -> Result<bool, LoadWhatIfError> {
    for &(size, stream) in &w.thread_state {
        if try_malloc(s, size, stream)?.is_none() {
            return Ok(false);
        }
    }
    Ok(true)
}

fn plan_device(plan: &ReplayPlan) -> usize {
    plan.device()
}

/// The pool of requests a what-if draws from (those under the size cap).
fn request_pool(w: &Workload, opts: &LoadWhatIf) -> Result<Vec<usize>, LoadWhatIfError> {
    let pool: Vec<usize> = (0..w.requests.len())
        .filter(|&r| {
            let req = &w.requests[r];
            !req.ops.is_empty()
                && opts
                    .size_cap
                    .is_none_or(|cap| req.size.main().is_none_or(|(s, _)| s <= cap))
        })
        .collect();
    if pool.is_empty() {
        return Err(LoadWhatIfError::NoRequests(
            "the trace holds no request to replay at higher load (tag requests with vramroom.probe's request helper, or record while the service serves)".into(),
        ));
    }
    Ok(pool)
}

/// One concurrency, every seed: how the service's memory behaves at `n` in flight.
pub fn simulate_at(
    snapshot: &Snapshot,
    device: usize,
    w: &Workload,
    n: u32,
    opts: &LoadWhatIf,
) -> Result<ConcurrencyPoint, LoadWhatIfError> {
    let plan = ReplayPlan::new(snapshot, device, &own_config(snapshot))?;
    let pool = request_pool(w, opts)?;
    point_at(snapshot, &plan, w, &pool, n, opts)
}

fn point_at(
    snapshot: &Snapshot,
    plan: &ReplayPlan,
    w: &Workload,
    pool: &[usize],
    n: u32,
    opts: &LoadWhatIf,
) -> Result<ConcurrencyPoint, LoadWhatIfError> {
    if opts.interleave == Interleave::Either {
        let under = |interleave| {
            let o = LoadWhatIf {
                interleave,
                ..opts.clone()
            };
            point_at(snapshot, plan, w, pool, n, &o)
        };
        let (a, b) = (under(Interleave::Staggered)?, under(Interleave::Timed)?);
        let mut p = if b.oom_runs > a.oom_runs {
            b.clone()
        } else {
            a.clone()
        };
        p.peak_reserved_bytes = a.peak_reserved_bytes.max(b.peak_reserved_bytes);
        p.peak_allocated_bytes = a.peak_allocated_bytes.max(b.peak_allocated_bytes);
        return Ok(p);
    }
    let mut p = ConcurrencyPoint {
        concurrency: n,
        runs: 0,
        oom_runs: 0,
        peak_reserved_bytes: 0,
        peak_allocated_bytes: 0,
    };
    for seed in 0..opts.seeds.max(1) {
        let (oom, res, alloc) = run_once(snapshot, plan, w, pool, n, seed, opts)?;
        p.runs += 1;
        p.oom_runs += u32::from(oom);
        p.peak_reserved_bytes = p.peak_reserved_bytes.max(res);
        p.peak_allocated_bytes = p.peak_allocated_bytes.max(alloc);
    }
    Ok(p)
}

/// The concurrency at which the service runs out of memory, from its trace.
pub fn predict_concurrency(
    snapshot: &Snapshot,
    device: usize,
    w: &Workload,
    opts: &LoadWhatIf,
) -> Result<LoadPrediction, LoadWhatIfError> {
    let plan = ReplayPlan::new(snapshot, device, &own_config(snapshot))?;
    let pool = request_pool(w, opts)?;
    if let Some(t) = w.one_worker() {
        let p = point_at(snapshot, &plan, w, &pool, 1, opts)?;
        let oom = p.ooms();
        return Ok(LoadPrediction {
            alloc_conf: opts.config.last_conf.clone(),
            first_oom: oom.then_some(1),
            safe: if oom { 0 } else { opts.max_concurrency.max(1) },
            points: vec![p],
            requests_sampled_from: pool.len(),
            one_worker: Some(t),
        });
    }
    let mut points: Vec<ConcurrencyPoint> = Vec::new();
    let at = |n: u32, points: &mut Vec<ConcurrencyPoint>| -> Result<bool, LoadWhatIfError> {
        if let Some(p) = points.iter().find(|p| p.concurrency == n) {
            return Ok(p.ooms());
        }
        let p = point_at(snapshot, &plan, w, &pool, n, opts)?;
        let o = p.ooms();
        points.push(p);
        Ok(o)
    };
    // Double until out of memory, then bisect between the last safe and the first OOM.
    let mut lo = 0u32;
    let mut hi = None;
    let mut n = 1u32;
    while n <= opts.max_concurrency.max(1) {
        if at(n, &mut points)? {
            hi = Some(n);
            break;
        }
        lo = n;
        n = n.saturating_mul(2);
    }
    if let Some(mut h) = hi {
        while lo + 1 < h {
            let mid = lo + (h - lo) / 2;
            if at(mid, &mut points)? {
                h = mid;
            } else {
                lo = mid;
            }
        }
        hi = Some(h);
    }
    points.sort_by_key(|p| p.concurrency);
    Ok(LoadPrediction {
        alloc_conf: opts.config.last_conf.clone(),
        first_oom: hi,
        safe: lo,
        points,
        requests_sampled_from: pool.len(),
        one_worker: None,
    })
}

/// Per-request memory against input size: the cost per unit (a least-squares slope through
/// the requests that carried a size), and the requests far above it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Attribution {
    pub unit: Option<&'static str>,
    pub requests: usize,
    /// Peak bytes per unit of input, and the fixed part.
    pub bytes_per_unit: Option<f64>,
    pub intercept_bytes: Option<f64>,
    /// (id, size, peak bytes) of requests more than 50% above the fit.
    pub outliers: Vec<(String, u64, u64)>,
}

pub fn attribution(w: &Workload) -> Attribution {
    let pts: Vec<(&Request, u64, &'static str)> = w
        .requests
        .iter()
        .filter_map(|r| r.size.main().map(|(s, u)| (r, s, u)))
        .collect();
    let unit = pts.first().map(|p| p.2);
    let pts: Vec<_> = pts.into_iter().filter(|p| Some(p.2) == unit).collect();
    let n = pts.len() as f64;
    let (mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0);
    for (r, s, _) in &pts {
        let (x, y) = (*s as f64, r.peak_bytes as f64);
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
    }
    let denom = n * sxx - sx * sx;
    let (slope, icpt) = if pts.len() >= 2 && denom.abs() > f64::EPSILON {
        let b = (n * sxy - sx * sy) / denom;
        (Some(b), Some((sy - b * sx) / n))
    } else {
        (None, None)
    };
    let mut outliers: Vec<(String, u64, u64)> = match (slope, icpt) {
        (Some(b), Some(a)) => pts
            .iter()
            .filter(|(r, s, _)| {
                let fit = (a + b * *s as f64).max(1.0);
                r.peak_bytes as f64 > 1.5 * fit
            })
            .map(|(r, s, _)| (r.id.clone(), *s, r.peak_bytes))
            .collect(),
        _ => Vec::new(),
    };
    outliers.sort_by_key(|o| Reverse(o.2));
    outliers.truncate(10);
    Attribution {
        unit,
        requests: w.requests.len(),
        bytes_per_unit: slope,
        intercept_bytes: icpt,
        outliers,
    }
}

/// The largest input size (among those recorded) at which `target` concurrent requests
/// still fit, or None when even the smallest does not.
pub fn size_cap_for(
    snapshot: &Snapshot,
    device: usize,
    w: &Workload,
    target: u32,
    opts: &LoadWhatIf,
) -> Result<Option<(u64, &'static str)>, LoadWhatIfError> {
    let mut sizes: Vec<(u64, &'static str)> =
        w.requests.iter().filter_map(|r| r.size.main()).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let fits = |cap: u64| -> Result<bool, LoadWhatIfError> {
        let o = LoadWhatIf {
            size_cap: Some(cap),
            max_concurrency: target,
            ..opts.clone()
        };
        let p = predict_concurrency(snapshot, device, w, &o)?;
        Ok(p.first_oom.is_none_or(|f| f > target))
    };
    let (mut lo, mut hi) = (0usize, sizes.len());
    // the largest index whose size fits: sizes[..lo] fit
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fits(sizes[mid].0)? {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(lo.checked_sub(1).map(|i| sizes[i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_parse() {
        let t = parse_tag("vramroom:req=42;items=8;tokens=512").unwrap();
        assert_eq!(t.id, "42");
        assert_eq!(t.size.items, Some(8));
        assert_eq!(t.size.tokens, Some(512));
        assert_eq!(t.size.main(), Some((512, "tokens")));
        assert_eq!((t.thread, t.worker), (None, false));
        assert!(parse_tag("other").is_none());
        assert!(parse_tag("vramroom:req=").is_none());
        let t = parse_tag("vramroom:req=a;bytes=x;items=3;thread=2;worker=1").unwrap();
        assert_eq!((t.size.bytes, t.size.items), (None, Some(3)));
        assert_eq!((t.thread, t.worker), (Some(2), true));
    }

    fn req(thread: Option<u32>, worker: bool) -> Request {
        Request {
            id: "r".into(),
            size: RequestSize::default(),
            duration_us: 1,
            peak_bytes: 512,
            thread,
            worker,
            ops: vec![TimedOp {
                op: Op::Alloc {
                    size: 512,
                    stream: 0,
                    key: 0,
                },
                t: 0,
            }],
        }
    }

    #[test]
    fn one_worker_only_when_every_request_ran_on_the_same_worker_thread() {
        let w = |requests| Workload {
            base_end: 0,
            requests,
            tagged: true,
            thread_state: Vec::new(),
        };
        let batcher = w(vec![req(Some(2), true), req(Some(2), true)]);
        assert_eq!(batcher.one_worker(), Some(2));
        // two worker threads: a pool, whose requests can stack
        assert_eq!(
            w(vec![req(Some(2), true), req(Some(3), true)]).one_worker(),
            None
        );
        // handler threads (a thread per request, or one keep-alive connection)
        assert_eq!(
            w(vec![req(Some(1), false), req(Some(1), false)]).one_worker(),
            None
        );
        // an older probe's tags say nothing of threads
        assert_eq!(w(vec![req(None, false)]).one_worker(), None);
    }

    fn entry(action: TraceAction, addr: u64, size: u64, meta: &str) -> TraceEntry {
        TraceEntry {
            time_us: addr as i64,
            user_metadata: meta.into(),
            ..TraceEntry::new(action, addr, size)
        }
    }

    #[test]
    fn a_threads_cublas_workspaces_leave_its_first_request_for_the_thread_state() {
        use TraceAction::{Alloc, FreeRequested};
        let r1 = "vramroom:req=1;tokens=8;thread=1";
        let r2 = "vramroom:req=2;tokens=8;thread=1";
        let trace = vec![
            entry(Alloc, 1, 4096, r1),
            entry(Alloc, 2, 33_554_432, r1), // the handle's workspace: kept
            entry(Alloc, 3, 1_048_576, r1),  // cuBLASLt's: kept
            entry(Alloc, 4, 2_097_152, r1),  // a lazily built cache: kept, the process's
            entry(FreeRequested, 1, 4096, r1),
            entry(Alloc, 5, 4096, r2),
            entry(Alloc, 6, 33_554_432, r2), // a later request's: a leak, not the thread's
            entry(FreeRequested, 5, 4096, r2),
        ];
        let w = split_requests(&trace);
        assert_eq!(w.thread_state, vec![(33_554_432, 0), (1_048_576, 0)]);
        assert_eq!(
            w.requests[0].ops.len(),
            3,
            "the cache stays in the first request"
        );
        assert_eq!(w.requests[0].peak_bytes, 4096 + 2_097_152);
        assert_eq!(w.requests[1].ops.len(), 3);
    }

    #[test]
    fn every_worker_holds_its_own_thread_state() {
        use TraceAction::{Alloc, FreeRequested};
        let mut trace = Vec::new();
        for r in 1..=3u64 {
            let m = format!("vramroom:req={r};tokens=8;thread=1");
            let a = r * 0x1000_0000;
            if r == 1 {
                trace.push(entry(Alloc, a + 0x800_0000, 33_554_432, &m));
            }
            trace.push(entry(Alloc, a, 2 << 20, &m));
            trace.push(entry(FreeRequested, a, 2 << 20, &m));
        }
        let snap = Snapshot {
            device_traces: vec![trace],
            ..Snapshot::default()
        };
        let w = split_requests(&snap.device_traces[0]);
        let opts = LoadWhatIf {
            capacity: Some(1 << 40),
            seeds: 1,
            ..LoadWhatIf::default()
        };
        let at = |n| {
            simulate_at(&snap, 0, &w, n, &opts)
                .unwrap()
                .peak_allocated_bytes
        };
        // 4 threads, 4 workspaces, whichever requests they draw; their requests meet or not
        let four = at(4);
        assert!(
            (4 * 33_554_432..=4 * 33_554_432 + 4 * (2 << 20)).contains(&four),
            "{four}"
        );
        assert!(at(1) <= 33_554_432 + (2 << 20));
    }
}
