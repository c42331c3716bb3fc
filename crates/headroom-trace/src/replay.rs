//! Replay: feed a PyTorch snapshot's device trace through a `CachingAllocator<SimDevice>`.
//!
//! Design note: a trace records what PyTorch's allocator did (`alloc`, `free_requested`,
//! `free_completed`) and what it asked the driver for (`segment_*`). Replay re-issues only
//! the client's requests and lets Headroom's policy decide the rest, so the same trace can be
//! replayed under another config or a smaller capacity to predict what PyTorch would do.
//!
//! Three details make a replay under the recording's own config exact:
//! - Memory that was live before recording began is rebuilt from the snapshot's segments at
//!   its original offsets (`import_segment`); what cannot be placed is allocated fresh and
//!   counted.
//! - The simulated device hands out the recorded GPU's addresses where the sizes match, so
//!   best-fit ties (by address) break as they did on the GPU.
//! - A free whose `free_completed` comes later (a `record_stream` use) is held pending on a
//!   simulated stream until that entry, so its memory is reused exactly as late.

use std::collections::{BTreeMap, HashMap, HashSet};

use headroom_alloc::{
    AllocError, AllocEvent, AllocatorConfig, CachingAllocator, ImportSegment, LiveBlock, Observer,
    PoolKind, SimDevice, Snapshot, TraceAction, TraceEntry,
};

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{0}")]
    NoTrace(String),
    #[error("{0}")]
    Invalid(String),
}

/// Total memory of the H200 the reference traces were recorded on (`totalGlobalMem`).
pub const DEFAULT_CAPACITY: u64 = 150_109_880_320;

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub config: AllocatorConfig,
    /// Simulated device capacity in bytes.
    pub capacity: u64,
    /// Stop at the first OOM (otherwise the failed request is skipped and replay goes on).
    pub stop_at_oom: bool,
    /// Record Headroom's own history and return its snapshot (for memory_viz).
    pub record_history: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            config: AllocatorConfig::default(),
            capacity: DEFAULT_CAPACITY,
            stop_at_oom: true,
            record_history: false,
        }
    }
}

/// The allocator's state at the first OOM of a replay.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OomState {
    /// Index of the failing entry in the device trace.
    pub event_index: usize,
    pub requested_bytes: u64,
    /// PyTorch's OOM message as Headroom's allocator produced it.
    pub message: String,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub segments: usize,
    pub largest_free_block: u64,
    pub memory_summary: String,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ReplayResult {
    pub alloc_conf: String,
    pub capacity_bytes: u64,
    pub events: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Device allocations made during the replay (segments, or page maps when expandable).
    pub segment_allocs: u64,
    pub segment_frees: u64,
    /// Sizes of those device allocations, in order.
    pub segment_sizes: Vec<u64>,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub oom_event: Option<usize>,
    pub oom: Option<OomState>,
    pub min_capacity_bytes: Option<u64>,
    /// Blocks live before the recording began, rebuilt at their offsets.
    pub initial_live_blocks: usize,
    pub initial_reserved_bytes: u64,
    /// Frees of addresses the replay never allocated (skipped after an OOM, or unknown).
    pub unmatched_frees: usize,
    pub stats: BTreeMap<String, i64>,
    #[serde(skip)]
    pub memory_summary: String,
    /// Headroom's snapshot of the replay, when `record_history` was asked.
    #[serde(skip)]
    pub snapshot: Option<Snapshot>,
}

/// The trace's own device allocations: what PyTorch did, for comparison with a replay.
pub fn recorded_segment_sizes(trace: &[TraceEntry]) -> Vec<u64> {
    trace
        .iter()
        .filter(|e| {
            matches!(
                e.action,
                TraceAction::SegmentAlloc | TraceAction::SegmentMap
            )
        })
        .map(|e| e.size)
        .collect()
}

#[derive(Default)]
struct SegmentLog {
    allocs: Vec<u64>,
    frees: u64,
}

struct LogObserver(std::sync::Arc<std::sync::Mutex<SegmentLog>>);

impl Observer for LogObserver {
    fn on_event(&mut self, ev: &AllocEvent) {
        let Ok(mut log) = self.0.lock() else { return };
        match ev {
            AllocEvent::SegmentAlloc { size, .. } | AllocEvent::SegmentMap { size, .. } => {
                log.allocs.push(*size)
            }
            AllocEvent::SegmentFree { .. } | AllocEvent::SegmentUnmap { .. } => log.frees += 1,
            _ => {}
        }
    }
}

/// The first device's trace, or an error that says why there is none.
pub fn device_trace(snapshot: &Snapshot) -> Result<&[TraceEntry], ReplayError> {
    match snapshot.device_traces.iter().find(|t| !t.is_empty()) {
        Some(t) => Ok(t),
        None => Err(ReplayError::NoTrace(
            "the snapshot has no device trace to replay (record it with torch.cuda.memory._record_memory_history() enabled)".into(),
        )),
    }
}

/// What the snapshot says existed before its trace began.
struct Initial {
    segments: Vec<(u64, ImportSegment)>,
    /// Live blocks that could not be placed in a rebuilt segment: (requested, stream).
    loose: Vec<(u64, u64, u64)>,
    /// Recorded reservation bases, in the order the replay will create them.
    reserve_hints: Vec<u64>,
}

fn initial_state(snapshot: &Snapshot, trace: &[TraceEntry], config: &AllocatorConfig) -> Initial {
    // Addresses allocated in-trace and live at its end; blocks freed without an alloc.
    let mut live: HashSet<u64> = HashSet::new();
    let mut seen_alloc: HashSet<u64> = HashSet::new();
    let mut pre_freed: Vec<(u64, u64, u64)> = Vec::new(); // (addr, requested, stream)
    let mut trace_segments: HashSet<u64> = HashSet::new();
    let mut freed_segments: Vec<(u64, u64, u64)> = Vec::new();
    let mut maps: Vec<(u64, u64)> = Vec::new();
    for e in trace {
        match e.action {
            TraceAction::Alloc => {
                live.insert(e.addr);
                seen_alloc.insert(e.addr);
            }
            TraceAction::FreeRequested
                if !live.remove(&e.addr) && !seen_alloc.contains(&e.addr) =>
            {
                pre_freed.push((e.addr, e.size, e.stream));
            }
            TraceAction::SegmentAlloc => {
                trace_segments.insert(e.addr);
            }
            TraceAction::SegmentFree if !trace_segments.contains(&e.addr) => {
                freed_segments.push((e.addr, e.size, e.stream));
            }
            TraceAction::SegmentMap => maps.push((e.addr, e.size)),
            _ => {}
        }
    }
    let round = |n: u64| headroom_alloc::policy::round_size(config, n);
    let mut pre_live: Vec<(u64, u64, u64, u64)> = Vec::new(); // addr, size, requested, stream
    for s in &snapshot.segments {
        for b in &s.blocks {
            if b.state != headroom_alloc::BlockState::Inactive && !live.contains(&b.address) {
                pre_live.push((b.address, b.size, b.requested_size, s.stream));
            }
        }
    }
    for &(addr, req, stream) in &pre_freed {
        pre_live.push((addr, round(req), req, stream));
    }
    let mut placed = vec![false; pre_live.len()];
    let mut segments = Vec::new();
    let mut reserve_hints = Vec::new();
    let take_live = |start: u64, end: u64, stream: u64, placed: &mut Vec<bool>| {
        let mut v = Vec::new();
        for (i, &(a, size, req, st)) in pre_live.iter().enumerate() {
            if !placed[i] && st == stream && a >= start && a + size <= end {
                placed[i] = true;
                v.push(LiveBlock {
                    offset: a - start,
                    size,
                    requested: req,
                });
            }
        }
        v
    };
    let large_page = config.large_segment_size;
    // Non-expandable segments that predate the trace.
    let mut plain: Vec<(u64, u64, u64, PoolKind)> = snapshot
        .segments
        .iter()
        .filter(|s| !s.is_expandable && !trace_segments.contains(&s.address))
        .map(|s| {
            let pool = if s.segment_type == "small" {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            (s.address, s.total_size, s.stream, pool)
        })
        .collect();
    for &(addr, size, stream) in &freed_segments {
        let pool = if size == 2 << 20 {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        plain.push((addr, size, stream, pool));
    }
    if !config.expandable_segments {
        for (addr, size, stream, pool) in plain {
            let live = take_live(addr, addr + size, stream, &mut placed);
            segments.push((
                addr,
                ImportSegment {
                    pool,
                    stream,
                    total_size: size,
                    expandable: false,
                    mapped: Vec::new(),
                    live,
                },
            ));
        }
    }
    // Expandable memory that predates the trace: final mapped runs minus pages mapped in-trace.
    if config.expandable_segments {
        let mut groups: BTreeMap<(u64, bool), Vec<(u64, u64)>> = BTreeMap::new();
        for s in snapshot.segments.iter().filter(|s| s.is_expandable) {
            groups
                .entry((s.stream, s.segment_type == "small"))
                .or_default()
                .push((s.address, s.address + s.total_size));
        }
        let mut bases: Vec<(usize, u64)> = Vec::new();
        for ((stream, small), runs) in &groups {
            let page = if *small { 2 << 20 } else { large_page };
            let lo = runs.iter().map(|r| r.0).min().unwrap_or(0);
            let hi = runs.iter().map(|r| r.1).max().unwrap_or(0);
            let in_group = |a: u64| a >= lo && a < hi;
            let trace_maps: Vec<(u64, u64)> =
                maps.iter().copied().filter(|(a, _)| in_group(*a)).collect();
            let base = trace_maps
                .iter()
                .map(|m| m.0)
                .chain([lo])
                .min()
                .unwrap_or(lo);
            let first_use = trace
                .iter()
                .position(|e| e.action == TraceAction::SegmentMap && in_group(e.addr))
                .unwrap_or(0);
            // Page-granular difference.
            let mut mapped = Vec::new();
            for &(s, e) in runs {
                let mut p = s;
                while p < e {
                    let covered = trace_maps.iter().any(|&(a, l)| p >= a && p < a + l);
                    if !covered {
                        match mapped.last_mut() {
                            Some((off, len)) if *off + *len == p - base => *len += page,
                            _ => mapped.push((p - base, page)),
                        }
                    }
                    p += page;
                }
            }
            let pool = if *small {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            if !mapped.is_empty() {
                let live = take_live(base, hi, *stream, &mut placed);
                segments.push((
                    base,
                    ImportSegment {
                        pool,
                        stream: *stream,
                        total_size: 0,
                        expandable: true,
                        mapped,
                        live,
                    },
                ));
                bases.push((0, base));
            } else {
                bases.push((first_use + 1, base));
            }
        }
        bases.sort();
        reserve_hints = bases.into_iter().map(|b| b.1).collect();
    }
    let loose = pre_live
        .iter()
        .zip(&placed)
        .filter(|(_, p)| !**p)
        .map(|(&(a, _, req, st), _)| (a, req, st))
        .collect();
    Initial {
        segments,
        loose,
        reserve_hints,
    }
}

/// Replay `snapshot`'s first device trace under `opts`.
pub fn replay(snapshot: &Snapshot, opts: &ReplayOptions) -> Result<ReplayResult, ReplayError> {
    if opts.capacity == 0 {
        return Err(ReplayError::Invalid(
            "capacity must be greater than 0".into(),
        ));
    }
    let trace = device_trace(snapshot)?;
    let init = initial_state(snapshot, trace, &opts.config);
    let mut dev = SimDevice::new(opts.capacity);
    let hints: Vec<(u64, u64)> = init
        .segments
        .iter()
        .filter(|(_, s)| !s.expandable)
        .map(|(a, s)| (s.total_size, *a))
        .chain(
            trace
                .iter()
                .filter(|e| e.action == TraceAction::SegmentAlloc)
                .map(|e| (e.size, e.addr)),
        )
        .collect();
    dev.set_malloc_hints(hints);
    dev.set_reserve_hints(init.reserve_hints.clone());
    let alloc = CachingAllocator::new(dev, opts.config.clone());

    // Address translation: recorded address -> replay address.
    let mut addr_map: HashMap<u64, u64> = HashMap::new();
    let mut initial_live = 0usize;
    for (recorded_base, seg) in &init.segments {
        match alloc.import_segment(seg) {
            Ok(base) => {
                for b in &seg.live {
                    addr_map.insert(recorded_base + b.offset, base + b.offset);
                    initial_live += 1;
                }
            }
            Err(e) => {
                return Err(ReplayError::Invalid(format!(
                    "cannot rebuild the memory that was live before the trace began: {e}"
                )))
            }
        }
    }
    for &(addr, req, stream) in &init.loose {
        match alloc.malloc(req, stream) {
            Ok(a) => {
                addr_map.insert(addr, a.ptr);
                initial_live += 1;
            }
            Err(e) => {
                return Err(ReplayError::Invalid(format!(
                    "the memory live before the trace began does not fit: {e}"
                )))
            }
        }
    }
    let initial_reserved = alloc.memory_reserved();

    if opts.record_history {
        alloc.record_memory_history(headroom_alloc::HistoryMode::All, usize::MAX);
    }
    let log = std::sync::Arc::new(std::sync::Mutex::new(SegmentLog::default()));
    alloc.add_observer(Box::new(LogObserver(log.clone())));

    let mut pending: HashMap<u64, u64> = HashMap::new();
    let mut next_stream: u64 = 1 << 62;
    let mut oom: Option<OomState> = None;
    let mut unmatched = 0usize;
    let mut i = 0usize;
    while i < trace.len() {
        let e = &trace[i];
        if opts.record_history {
            // Headroom's entries carry the recorded times, so both timelines line up.
            let t = e.time_us - 1;
            alloc.with_device(|d| d.set_clock_us(t));
        }
        match e.action {
            TraceAction::Alloc => match alloc.malloc(e.size, e.stream) {
                Ok(a) => {
                    addr_map.insert(e.addr, a.ptr);
                }
                Err(AllocError::OutOfMemory(o)) => {
                    if oom.is_none() {
                        oom = Some(OomState {
                            event_index: i,
                            requested_bytes: e.size,
                            message: o.to_string(),
                            allocated_bytes: alloc.memory_allocated(),
                            reserved_bytes: alloc.memory_reserved(),
                            segments: alloc.segment_count(),
                            largest_free_block: alloc.largest_free_block(),
                            memory_summary: alloc.memory_summary(false),
                        });
                    }
                    if opts.stop_at_oom {
                        break;
                    }
                }
                Err(other) => return Err(ReplayError::Invalid(other.to_string())),
            },
            TraceAction::FreeRequested => {
                let Some(ptr) = addr_map.remove(&e.addr) else {
                    unmatched += 1;
                    i += 1;
                    continue;
                };
                let completes_now = trace
                    .get(i + 1)
                    .is_some_and(|n| n.action == TraceAction::FreeCompleted && n.addr == e.addr);
                if completes_now {
                    alloc
                        .free(ptr)
                        .map_err(|err| ReplayError::Invalid(err.to_string()))?;
                } else {
                    // Held on a simulated stream until its `free_completed` entry.
                    let s = next_stream;
                    next_stream += 1;
                    alloc.with_device(|d| d.hold_stream(s));
                    alloc
                        .record_stream(ptr, s)
                        .map_err(|err| ReplayError::Invalid(err.to_string()))?;
                    alloc
                        .free(ptr)
                        .map_err(|err| ReplayError::Invalid(err.to_string()))?;
                    pending.insert(e.addr, s);
                }
            }
            TraceAction::FreeCompleted => {
                if let Some(s) = pending.remove(&e.addr) {
                    alloc.with_device(|d| d.release_stream(s));
                }
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                // A run of releases that no allocation follows was a user `empty_cache()`;
                // one followed by new device memory was the allocator's own OOM fallback.
                let mut j = i;
                while j < trace.len()
                    && matches!(
                        trace[j].action,
                        TraceAction::SegmentFree | TraceAction::SegmentUnmap
                    )
                {
                    j += 1;
                }
                let internal = trace.get(j).is_some_and(|n| {
                    matches!(
                        n.action,
                        TraceAction::SegmentAlloc | TraceAction::SegmentMap | TraceAction::Oom
                    )
                });
                if !internal {
                    alloc.empty_cache();
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }

    let stats = alloc.memory_stats();
    let log = log
        .lock()
        .map(|l| (l.allocs.clone(), l.frees))
        .unwrap_or_default();
    Ok(ReplayResult {
        alloc_conf: opts.config.last_conf.clone(),
        capacity_bytes: opts.capacity,
        events: trace.len(),
        peak_allocated_bytes: stats["allocated_bytes.all.peak"] as u64,
        peak_reserved_bytes: stats["reserved_bytes.all.peak"] as u64,
        segment_allocs: log.0.len() as u64,
        segment_frees: log.1,
        segment_sizes: log.0,
        num_alloc_retries: stats["num_alloc_retries"],
        num_ooms: stats["num_ooms"],
        oom_event: oom.as_ref().map(|o| o.event_index),
        oom,
        min_capacity_bytes: None,
        initial_live_blocks: initial_live,
        initial_reserved_bytes: initial_reserved,
        unmatched_frees: unmatched,
        memory_summary: alloc.memory_summary(false),
        snapshot: opts.record_history.then(|| {
            let mut s = alloc.snapshot();
            s.external_annotations = snapshot.external_annotations.clone();
            s
        }),
        stats,
    })
}

/// The smallest capacity (to 2 MiB) on which the trace replays without OOM, by bisection
/// between the peak allocated and the peak reserved of an unconstrained replay.
pub fn min_capacity(snapshot: &Snapshot, opts: &ReplayOptions) -> Result<u64, ReplayError> {
    let unconstrained = ReplayOptions {
        capacity: opts.capacity.max(DEFAULT_CAPACITY),
        stop_at_oom: true,
        record_history: false,
        ..opts.clone()
    };
    let base = replay(snapshot, &unconstrained)?;
    if base.oom_event.is_some() {
        return Err(ReplayError::Invalid(format!(
            "the trace does not fit even {} bytes",
            unconstrained.capacity
        )));
    }
    const STEP: u64 = 2 << 20;
    let fits = |cap: u64| -> Result<bool, ReplayError> {
        let o = ReplayOptions {
            capacity: cap,
            stop_at_oom: true,
            record_history: false,
            ..opts.clone()
        };
        Ok(replay(snapshot, &o)?.oom_event.is_none())
    };
    let mut lo = base.peak_allocated_bytes / STEP; // in steps; lo*STEP may not fit
    let mut hi = base.peak_reserved_bytes.div_ceil(STEP);
    if !fits(hi * STEP)? {
        // Not monotone at the top: fall back to the unconstrained peak.
        return Ok(base.peak_reserved_bytes);
    }
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid * STEP)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi * STEP)
}
