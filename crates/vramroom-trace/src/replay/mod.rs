//! Replay: feed a PyTorch snapshot's device trace through a `CachingAllocator<SimDevice>`.
//!
//! Design note: a trace records what PyTorch's allocator did (`alloc`, `free_requested`,
//! `free_completed`) and what it asked the driver for (`segment_*`). Replay re-issues only
//! the client's requests and lets Vramroom's policy decide the rest, so the same trace can be
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

mod check;
mod initial;
pub mod limits;
mod model;
mod plan;
mod pools;
mod session;

pub use plan::ReplayPlan;
pub use session::Session;

use std::collections::BTreeMap;

use vramroom_alloc::{AllocatorConfig, Snapshot, TraceAction, TraceEntry};

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
    /// Record Vramroom's own history and return its snapshot (for memory_viz).
    pub record_history: bool,
    /// Place every `cudaMalloc` with the driver model (`driver_va`), as for a traced
    /// snapshot, even where the snapshot recorded the GPU's addresses: a recorded snapshot
    /// replayed so stands in for the trace of the same program, which measures the model.
    pub ignore_recorded_addresses: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            config: AllocatorConfig::default(),
            capacity: None,
            device: 0,
            stop_at_oom: true,
            record_history: false,
            ignore_recorded_addresses: false,
        }
    }
}

/// The allocator's state at the first OOM of a replay.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OomState {
    /// Index of the failing entry in the device trace.
    pub event_index: usize,
    pub requested_bytes: u64,
    /// PyTorch's OOM message as Vramroom's allocator produced it.
    pub message: String,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub segments: usize,
    pub largest_free_block: u64,
    pub memory_summary: String,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
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
    /// cuDNN convolutions whose workspace did not fit and that ran another plan instead
    /// (traced snapshots only: session.rs's note).
    pub workspace_fallbacks: usize,
    /// CUDA-graph / `MemPool` private pools the trace used (named by the snapshot or
    /// inferred from what the recorded allocator did).
    pub private_pools: usize,
    /// Releases re-issued as `empty_cache()`, and releases left to the allocator's policy.
    pub user_empty_cache: usize,
    pub allocator_releases: usize,
    pub stats: BTreeMap<String, i64>,
    #[serde(skip)]
    pub memory_summary: String,
    /// Vramroom's snapshot of the replay, when `record_history` was asked.
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
    let mut s = Session::new(snapshot, plan, opts)?;
    s.run_to(s.trace_len())?;
    Ok(s.finish())
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
