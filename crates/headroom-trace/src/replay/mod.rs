//! Replay: feed a PyTorch snapshot's device trace through a `CachingAllocator<SimDevice>`.
//!
//! Design note: a trace records what PyTorch's allocator did (`alloc`, `free_requested`,
//! `free_completed`) and what it asked the driver for (`segment_*`). Replay re-issues only
//! the client's requests and lets Headroom's policy decide the rest, so the same trace can be
//! replayed under another config or a smaller capacity to predict what PyTorch would do.
//!
//! What the client asked for is read once from the recording into a [`ReplayPlan`]
//! (plan.rs): the pool of every request (CUDA graphs' private pools are inferred from what
//! the recorded allocator did, model.rs and pools.rs), which releases were the user's
//! `empty_cache()`, when frees completed, and the capacity the recording had when its OOMs
//! show one. The plan is the same under every config; only the policy's answers change.
//!
//! Three details make a replay under the recording's own config exact:
//! - Memory that was live before recording began is rebuilt from the snapshot's segments at
//!   its original offsets (initial.rs); what cannot be placed is allocated fresh and counted.
//! - The simulated device hands out the recorded GPU's addresses where the sizes match, so
//!   best-fit ties (by address) break as they did on the GPU.
//! - A free whose `free_completed` comes later (a `record_stream` use) is held pending on a
//!   simulated stream until that entry, so its memory is reused exactly as late.
//!
//! A snapshot has one trace per device; each is replayed on its own ([`ReplayOptions::device`]).

mod initial;
mod model;
mod plan;
mod pools;

pub use plan::ReplayPlan;

use std::collections::{BTreeMap, HashMap};

use headroom_alloc::{
    AllocError, AllocEvent, AllocatorConfig, CachingAllocator, Observer, SimDevice, Snapshot,
    TraceAction, TraceEntry, DEFAULT_POOL,
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
    /// Simulated device capacity in bytes. `None`: the capacity the recording ran under
    /// when its OOMs show it ([`ReplayPlan::inferred_capacity`]), else [`DEFAULT_CAPACITY`].
    pub capacity: Option<u64>,
    /// Which device's trace (`device_traces[device]`).
    pub device: usize,
    /// Stop at the first OOM (otherwise the failed request is skipped and replay goes on).
    pub stop_at_oom: bool,
    /// Record Headroom's own history and return its snapshot (for memory_viz).
    pub record_history: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            config: AllocatorConfig::default(),
            capacity: None,
            device: 0,
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
    pub device: usize,
    pub capacity_bytes: u64,
    /// Where the capacity came from: "given", "inferred from the trace's OOMs", or
    /// "the recording GPU's total".
    pub capacity_source: &'static str,
    pub events: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Device allocations made during the replay (segments, or page maps when expandable).
    pub segment_allocs: u64,
    pub segment_frees: u64,
    /// Sizes of those device allocations, in order.
    pub segment_sizes: Vec<u64>,
    pub num_alloc_retries: i64,
    /// PyTorch's `num_ooms`: the recorded OOMs that happen here too, and any new one.
    pub num_ooms: i64,
    /// The first OOM that the recording did not have (the trace does not fit).
    pub oom_event: Option<usize>,
    pub oom: Option<OomState>,
    pub min_capacity_bytes: Option<u64>,
    /// Blocks live before the recording began, rebuilt at their offsets.
    pub initial_live_blocks: usize,
    pub initial_reserved_bytes: u64,
    /// Frees of addresses the replay never allocated (skipped after an OOM, or unknown).
    pub unmatched_frees: usize,
    /// OOMs the recording caught (its `oom` entries; the client went on after each), and how
    /// many of them this replay's config and capacity avoid.
    pub recorded_ooms: usize,
    pub recorded_ooms_avoided: usize,
    /// CUDA-graph / `MemPool` private pools the trace used (named by the snapshot or
    /// inferred from what the recorded allocator did).
    pub private_pools: usize,
    /// Releases re-issued as `empty_cache()`, and releases left to the allocator's policy.
    pub user_empty_cache: usize,
    pub allocator_releases: usize,
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

/// Devices whose trace has entries, in order.
pub fn traced_devices(snapshot: &Snapshot) -> Vec<usize> {
    (0..snapshot.device_traces.len())
        .filter(|&d| !snapshot.device_traces[d].is_empty())
        .collect()
}

/// The snapshot's own config, for the recorded state (the default when its settings do
/// not parse: the plan then only loses precision, never correctness of the replay itself).
pub fn own_config(snapshot: &Snapshot) -> AllocatorConfig {
    AllocatorConfig::from_settings(&snapshot.allocator_settings).unwrap_or_default()
}

/// Replay device `opts.device`'s trace of `snapshot` under `opts`.
pub fn replay(snapshot: &Snapshot, opts: &ReplayOptions) -> Result<ReplayResult, ReplayError> {
    let plan = ReplayPlan::new(snapshot, opts.device, &own_config(snapshot))?;
    replay_plan(snapshot, &plan, opts)
}

/// [`replay`] with a plan built once (several configs or capacities of one trace).
pub fn replay_plan(
    snapshot: &Snapshot,
    plan: &ReplayPlan,
    opts: &ReplayOptions,
) -> Result<ReplayResult, ReplayError> {
    // A bound inferred as a memory fraction limits the allocator, not the device.
    let fraction = match (opts.capacity, plan.inferred_capacity) {
        (None, Some(c)) if plan.inferred_is_fraction => Some(c),
        _ => None,
    };
    let (capacity, capacity_source) = match (opts.capacity, plan.inferred_capacity) {
        (Some(c), _) => (c, "given"),
        (None, Some(c)) if fraction.is_some() => {
            (c, "a memory fraction inferred from the trace's OOMs")
        }
        (None, Some(c)) => (c, "inferred from the trace's OOMs"),
        (None, None) => (DEFAULT_CAPACITY, "the recording GPU's total"),
    };
    if capacity == 0 {
        return Err(ReplayError::Invalid(
            "capacity must be greater than 0".into(),
        ));
    }
    let trace = snapshot
        .device_traces
        .get(plan.device)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let init = &plan.initial;
    let mut dev = SimDevice::new(if fraction.is_some() {
        DEFAULT_CAPACITY.max(capacity)
    } else {
        capacity
    });
    let hints: Vec<(u64, u64)> = init
        .segments
        .iter()
        .filter(|s| !s.import.expandable)
        .map(|s| (s.import.total_size, s.recorded_base))
        .chain(
            trace
                .iter()
                .filter(|e| e.action == TraceAction::SegmentAlloc)
                .map(|e| (e.size, e.addr)),
        )
        .collect();
    dev.set_malloc_hints(hints);
    dev.set_reserve_hints(init.reserve_hints.clone());
    dev.hold_stream(plan::NEVER);
    let alloc = CachingAllocator::new(dev, opts.config.clone());
    if let Some(limit) = fraction {
        alloc.set_memory_limit(Some(limit));
    }

    // Address translation: recorded address -> replay address.
    let mut addr_map: HashMap<u64, u64> = HashMap::new();
    let mut initial_live = 0usize;
    for seg in &init.segments {
        match alloc.import_segment(&seg.import) {
            Ok(base) => {
                for b in &seg.import.live {
                    addr_map.insert(seg.recorded_base + b.offset, base + b.offset);
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
    for &(addr, req, stream, pool) in &init.loose {
        match alloc.malloc_in_pool(req, stream, pool) {
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

    let mut oom: Option<OomState> = None;
    let mut unmatched = 0usize;
    let mut recorded_ooms_avoided = 0usize;
    let mut held: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut i = 0usize;
    while i < trace.len() {
        let e = &trace[i];
        if opts.record_history {
            // Headroom's entries carry the recorded times, so both timelines line up.
            let t = e.time_us - 1;
            alloc.with_device(|d| d.set_clock_us(t));
        }
        match e.action {
            TraceAction::Alloc => {
                let pool = plan.pools.of_alloc(&plan.facts, i);
                let got = if pool == DEFAULT_POOL {
                    alloc.malloc(e.size, e.stream)
                } else {
                    alloc.malloc_in_pool(e.size, e.stream, pool)
                };
                match got {
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
                }
            }
            TraceAction::FreeRequested => {
                let Some(ptr) = addr_map.remove(&e.addr) else {
                    unmatched += 1;
                    i += 1;
                    continue;
                };
                match plan.defer_at.get(&i) {
                    None => alloc
                        .free(ptr)
                        .map_err(|err| ReplayError::Invalid(err.to_string()))?,
                    Some(&s) => {
                        // Held on a simulated stream until its `free_completed` entry.
                        if held.insert(s) {
                            alloc.with_device(|d| d.hold_stream(s));
                        }
                        alloc
                            .record_stream(ptr, s)
                            .map_err(|err| ReplayError::Invalid(err.to_string()))?;
                        alloc
                            .free(ptr)
                            .map_err(|err| ReplayError::Invalid(err.to_string()))?;
                    }
                }
            }
            TraceAction::Oom => {
                // The request PyTorch failed (it has no `alloc` entry): re-issued, so the
                // OOM happens here too, or is shown not to under this config (then the
                // memory goes back at once: the client's next steps are the recorded ones).
                match alloc.malloc(e.size, e.stream) {
                    Ok(a) => {
                        recorded_ooms_avoided += 1;
                        alloc
                            .free(a.ptr)
                            .map_err(|err| ReplayError::Invalid(err.to_string()))?;
                    }
                    Err(AllocError::OutOfMemory(_)) => {}
                    Err(other) => return Err(ReplayError::Invalid(other.to_string())),
                }
            }
            TraceAction::FreeCompleted => {
                if let Some(&s) = plan.complete_at.get(&i) {
                    alloc.with_device(|d| d.advance_stream(s));
                }
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                let Some(&k) = plan.run_at.get(&i) else {
                    i += 1;
                    continue;
                };
                for &p in plan.pools.freeable_at.get(&k).into_iter().flatten() {
                    alloc.release_pool(p);
                }
                if plan.user_release.contains(&i) {
                    alloc.empty_cache();
                }
                i = plan.facts.runs[k].end;
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
    let (user_empty_cache, allocator_releases) = plan.releases();
    Ok(ReplayResult {
        alloc_conf: opts.config.last_conf.clone(),
        device: plan.device,
        capacity_bytes: capacity,
        capacity_source,
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
        recorded_ooms: plan.facts.ooms,
        recorded_ooms_avoided,
        private_pools: plan.private_pools(),
        user_empty_cache,
        allocator_releases,
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
    let plan = ReplayPlan::new(snapshot, opts.device, &own_config(snapshot))?;
    min_capacity_plan(snapshot, &plan, opts)
}

/// [`min_capacity`] with a plan built once.
pub fn min_capacity_plan(
    snapshot: &Snapshot,
    plan: &ReplayPlan,
    opts: &ReplayOptions,
) -> Result<u64, ReplayError> {
    let unconstrained = ReplayOptions {
        capacity: Some(DEFAULT_CAPACITY.max(plan.inferred_capacity.unwrap_or(0))),
        stop_at_oom: true,
        record_history: false,
        ..opts.clone()
    };
    let base = replay_plan(snapshot, plan, &unconstrained)?;
    if base.oom_event.is_some() {
        return Err(ReplayError::Invalid(format!(
            "the trace does not fit even {} bytes",
            base.capacity_bytes
        )));
    }
    const STEP: u64 = 2 << 20;
    let fits = |cap: u64| -> Result<bool, ReplayError> {
        let o = ReplayOptions {
            capacity: Some(cap),
            stop_at_oom: true,
            record_history: false,
            ..opts.clone()
        };
        Ok(replay_plan(snapshot, plan, &o)?.oom_event.is_none())
    };
    let mut lo = base.peak_allocated_bytes / STEP; // in steps; lo*STEP may not fit
    let mut hi = base.peak_reserved_bytes.div_ceil(STEP).max(1);
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
