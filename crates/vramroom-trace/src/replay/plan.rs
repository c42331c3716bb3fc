//! What a trace asks of an allocator, config by config the same: the plan a replay follows.
//!
//! Design note: a trace mixes the client's requests with the recorded allocator's own
//! decisions. Everything that belongs to the client, and so must be re-issued under any
//! config or capacity, is decided once here from the recording, never from a replay:
//! - the pool each allocation went to (`pools.rs`), and when each private pool was let go;
//! - which releases were the user's `empty_cache()` (re-issued) and which were PyTorch's own
//!   (left to the replayed policy). Without pressure in the recording (no OOM entry, no
//!   partial release) no release can have been the allocator's own but a full one, and a
//!   full release is what `empty_cache()` does, so every run is re-issued. With pressure, a
//!   release right before a device allocation is the allocator's fallback, and a partial one
//!   is `max_split_size`'s or GC's; the replay runs on the capacity the recording had;
//! - the capacity that recording had, when its OOMs or fallbacks show it was bounded: the
//!   highest reserved total it reached, which every decision it made is consistent with (it
//!   never held more, and each failed request needed more than it had). When an OOM found
//!   the driver with room to spare, the bound was a memory fraction, which PyTorch checks
//!   against reserved plus the whole request before mapping any page: then the bound is the
//!   highest such sum among the requests that succeeded, applied as the allocator's limit;
//! - frees that completed later (`record_stream`, or frees during a capture): each waits on
//!   a simulated stream until its `free_completed` entry. Frees that complete in request
//!   order share a stream (a stream's events complete in order), so the number of streams is
//!   the trace's real concurrency, not its number of frees; frees that never complete share
//!   one stream that is never released.

use std::collections::{BTreeMap, HashMap, HashSet};

use vramroom_alloc::{AllocatorConfig, MempoolId, SegmentInfo, Snapshot, TraceAction, TraceEntry};

use super::initial::{initial_state, Initial};
use super::model::{self, Facts};
use super::pools::{self, Pools};
use super::ReplayError;

/// First simulated stream (real streams are pointers; bit 63 is private pools' tag).
pub(crate) const SIM_STREAMS: u64 = 1 << 62;
/// The stream of frees whose completion the trace never shows.
pub(crate) const NEVER: u64 = SIM_STREAMS;

/// A trace's client requests and the facts behind them; built once, replayed under any
/// config and capacity.
pub struct ReplayPlan {
    pub(crate) device: usize,
    pub(crate) initial: Initial,
    pub(crate) facts: Facts,
    pub(crate) pools: Pools,
    /// Release runs (by start index) re-issued as `empty_cache()`.
    pub(crate) user_release: HashSet<usize>,
    /// Release run index by its start index.
    pub(crate) run_at: HashMap<usize, usize>,
    /// `free_requested` index → the simulated stream its completion waits on.
    pub(crate) defer_at: HashMap<usize, u64>,
    /// `free_completed` index → the simulated stream to advance.
    pub(crate) complete_at: HashMap<usize, u64>,
    /// The capacity the recording ran under, when its OOMs or fallbacks bound it.
    pub inferred_capacity: Option<u64>,
    /// That bound was a memory fraction (the allocator's own limit), not the device.
    pub inferred_is_fraction: bool,
}

impl ReplayPlan {
    /// The plan of device `device`'s trace, under the recording's own config for the
    /// recorded state (`own`, from the snapshot's settings).
    pub fn new(
        snapshot: &Snapshot,
        device: usize,
        own: &AllocatorConfig,
    ) -> Result<Self, ReplayError> {
        super::limits::check_devices(snapshot)?;
        let trace = snapshot
            .device_traces
            .get(device)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if trace.is_empty() {
            return Err(ReplayError::NoTrace(format!(
                "device {device} has no trace to replay (record it with torch.cuda.memory._record_memory_history() enabled)"
            )));
        }
        super::limits::check_streams(device, trace)?;
        let segments: Vec<&SegmentInfo> = snapshot
            .segments
            .iter()
            .filter(|s| device_of(s) == device)
            .collect();
        super::check::address_ranges(&segments, trace)?;
        let initial = initial_state(&segments, trace, own);
        let final_pools: BTreeMap<u64, (u64, MempoolId)> = segments
            .iter()
            .map(|s| {
                (
                    s.address,
                    (
                        s.address.saturating_add(s.total_size),
                        (s.segment_pool_id.0 as u64, s.segment_pool_id.1 as u64),
                    ),
                )
            })
            .collect();
        let facts = model::collect(trace, &initial, own, &final_pools);
        let pools = pools::infer(&facts);
        let pressure = facts.ooms > 0 || facts.runs.iter().any(|r| r.partial);
        let user_release = facts
            .runs
            .iter()
            .filter(|r| !(r.partial || pressure && r.then_alloc))
            .map(|r| r.start)
            .collect();
        let run_at = facts
            .runs
            .iter()
            .enumerate()
            .map(|(k, r)| (r.start, k))
            .collect();
        let (defer_at, complete_at) = deferred_frees(trace);
        Ok(ReplayPlan {
            device,
            inferred_capacity: pressure.then_some(if facts.fraction_bound {
                facts.peak_demand
            } else {
                facts.peak_reserved
            }),
            inferred_is_fraction: pressure && facts.fraction_bound,
            initial,
            facts,
            pools,
            user_release,
            run_at,
            defer_at,
            complete_at,
        })
    }

    /// Private pools the plan uses (named by the snapshot or inferred).
    pub fn private_pools(&self) -> usize {
        let mut v: Vec<MempoolId> = self
            .pools
            .label
            .iter()
            .copied()
            .filter(|&l| l != vramroom_alloc::DEFAULT_POOL)
            .collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    }

    /// The device whose trace this is.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Release runs re-issued as `empty_cache()`, and runs left to the policy.
    pub fn releases(&self) -> (usize, usize) {
        let user = self.user_release.len();
        (user, self.facts.runs.len() - user)
    }
}

/// Device index of a segment (negative or huge values are device 0's problem to refuse).
pub(crate) fn device_of(s: &SegmentInfo) -> usize {
    usize::try_from(s.device).unwrap_or(usize::MAX)
}

/// Simulated streams for frees that complete later: patience sorting by completion index,
/// so each stream's completions come in the order its frees were requested.
fn deferred_frees(trace: &[TraceEntry]) -> (HashMap<usize, u64>, HashMap<usize, u64>) {
    // The completion of each deferred free: the next free_completed of its address.
    let mut waiting: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut completion: HashMap<usize, usize> = HashMap::new();
    for (i, e) in trace.iter().enumerate() {
        match e.action {
            TraceAction::FreeRequested => {
                let now = trace
                    .get(i + 1)
                    .is_some_and(|n| n.action == TraceAction::FreeCompleted && n.addr == e.addr);
                if !now {
                    waiting.entry(e.addr).or_default().push(i);
                }
            }
            TraceAction::FreeCompleted => {
                if let Some(v) = waiting.get_mut(&e.addr) {
                    if !v.is_empty() {
                        let r = v.remove(0);
                        completion.insert(r, i);
                    }
                }
            }
            _ => {}
        }
    }
    let mut defer_at = HashMap::new();
    let mut complete_at = HashMap::new();
    // Streams by the completion index of their last free; a free joins the stream whose
    // last completion is the latest one before its own.
    let mut tails: BTreeMap<usize, u64> = BTreeMap::new();
    let mut next = NEVER + 1;
    let mut requests: Vec<usize> = waiting.values().flatten().copied().collect();
    requests.extend(completion.keys().copied());
    requests.sort_unstable();
    requests.dedup();
    for r in requests {
        let Some(&c) = completion.get(&r) else {
            defer_at.insert(r, NEVER);
            continue;
        };
        let stream = match tails.range(..c).next_back().map(|(&k, &s)| (k, s)) {
            Some((k, s)) => {
                tails.remove(&k);
                s
            }
            None => {
                let s = next;
                next += 1;
                s
            }
        };
        tails.insert(c, stream);
        defer_at.insert(r, stream);
        complete_at.insert(c, stream);
    }
    (defer_at, complete_at)
}
