//! A replay in progress: the allocator, the address map and where the trace has got to.
//!
//! Design note: most callers replay a whole trace (`replay_plan`). The concurrency what-if
//! (`concurrency.rs`) replays the trace up to the first request and then drives the same
//! allocator with requests of its own, so the state it starts from is the one PyTorch had.
//! A session is that pausable replay: `run_to` advances through the trace, `alloc` is
//! there for whoever continues, and `finish` reads the results off the allocator.
//!
//! A cuDNN convolution survives its own OOM: PyTorch allocates each plan's workspace through
//! the caching allocator, and when that fails (after the allocator has emptied its cache) it
//! catches the error, runs the next plan the heuristics offer and keeps that plan for the
//! conv's key. The fake-CUDA tracer tags those workspaces (`user_metadata` starting with
//! [`WORKSPACE_TAG`]); a tagged allocation that does not fit is dropped, as is every later one
//! with the same tag, the next plan taken to need no workspace. Measured on the H100:
//! tv_resnet18_infer_nograd at 0.95 of its peak reserved finishes, with peak allocated the
//! trace's peak less the stem conv's workspace in steps 2 and 3 (to 49,152 bytes, the same
//! offset as its uncapped run). A recorded snapshot carries no such tag: its workspaces are
//! replayed as any allocation.

use std::collections::{HashMap, HashSet};

use vramroom_alloc::{
    AllocError, AllocEvent, CachingAllocator, Observer, SimDevice, Snapshot, TraceAction,
    TraceEntry, DEFAULT_POOL,
};

use super::plan::{self, ReplayPlan};
use super::{OomState, ReplayError, ReplayOptions, ReplayResult, DEFAULT_CAPACITY};

/// The tracer's `user_metadata` on a cuDNN conv workspace (python/vramroom/trace/snapshot.py).
pub const WORKSPACE_TAG: &str = "vramroom.cudnn_conv_workspace:";

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

/// A replay that can stop and go on (see the module note).
pub struct Session<'a> {
    snapshot: &'a Snapshot,
    plan: &'a ReplayPlan,
    opts: ReplayOptions,
    trace: &'a [TraceEntry],
    /// The allocator under replay.
    pub alloc: CachingAllocator<SimDevice>,
    capacity: u64,
    capacity_source: &'static str,
    /// Recorded address -> replay address.
    addr_map: HashMap<u64, u64>,
    initial_live: usize,
    initial_reserved: u64,
    log: std::sync::Arc<std::sync::Mutex<SegmentLog>>,
    oom: Option<OomState>,
    unmatched: usize,
    recorded_ooms_avoided: usize,
    held: HashSet<u64>,
    /// Workspace tags whose allocation failed: their plan's next one needs none.
    fallen_back: HashSet<std::sync::Arc<str>>,
    /// Recorded addresses of the workspaces dropped, so that their frees are no surprise.
    dropped: HashSet<u64>,
    /// Next trace index.
    at: usize,
}

impl<'a> Session<'a> {
    /// The allocator rebuilt as it was when the trace began, ready at index 0.
    pub fn new(
        snapshot: &'a Snapshot,
        plan: &'a ReplayPlan,
        opts: &ReplayOptions,
    ) -> Result<Self, ReplayError> {
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
            .filter(|_| !opts.ignore_recorded_addresses)
            .collect();
        // A trace with no recorded segment (the fake-CUDA tracer's) leaves placement to the
        // driver model, whose address order decides best-fit ties as the GPU's would.
        if hints.is_empty() {
            dev.use_driver_addresses();
        }
        dev.set_malloc_hints(hints);
        if !opts.ignore_recorded_addresses {
            dev.set_reserve_hints(init.reserve_hints.clone());
        }
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
            alloc.record_memory_history(vramroom_alloc::HistoryMode::All, usize::MAX);
        }
        let log = std::sync::Arc::new(std::sync::Mutex::new(SegmentLog::default()));
        alloc.add_observer(Box::new(LogObserver(log.clone())));
        Ok(Session {
            snapshot,
            plan,
            opts: opts.clone(),
            trace,
            alloc,
            capacity,
            capacity_source,
            addr_map,
            initial_live,
            initial_reserved,
            log,
            oom: None,
            unmatched: 0,
            recorded_ooms_avoided: 0,
            held: HashSet::new(),
            fallen_back: HashSet::new(),
            dropped: HashSet::new(),
            at: 0,
        })
    }

    pub fn trace_len(&self) -> usize {
        self.trace.len()
    }

    /// The capacity this session runs on.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The first OOM the recording did not have, if any so far.
    pub fn oom(&self) -> Option<&OomState> {
        self.oom.as_ref()
    }

    /// Replay entries up to (not including) `end`, or to the first new OOM when
    /// `stop_at_oom` is set.
    pub fn run_to(&mut self, end: usize) -> Result<(), ReplayError> {
        let end = end.min(self.trace.len());
        let (plan, trace) = (self.plan, self.trace);
        let mut i = self.at;
        while i < end {
            let e = &trace[i];
            if self.opts.record_history {
                // Vramroom's entries carry the recorded times, so both timelines line up.
                let t = e.time_us.saturating_sub(1);
                self.alloc.with_device(|d| d.set_clock_us(t));
            }
            match e.action {
                TraceAction::Alloc => {
                    let workspace = e.user_metadata.starts_with(WORKSPACE_TAG);
                    if workspace && self.fallen_back.contains(&e.user_metadata) {
                        self.dropped.insert(e.addr);
                        i += 1;
                        continue;
                    }
                    let pool = plan.pools.of_alloc(&plan.facts, i);
                    let got = if pool == DEFAULT_POOL {
                        self.alloc.malloc(e.size, e.stream)
                    } else {
                        self.alloc.malloc_in_pool(e.size, e.stream, pool)
                    };
                    match got {
                        Ok(a) => {
                            self.addr_map.insert(e.addr, a.ptr);
                        }
                        Err(AllocError::OutOfMemory(_)) if workspace => {
                            self.fallen_back.insert(e.user_metadata.clone());
                            self.dropped.insert(e.addr);
                        }
                        Err(AllocError::OutOfMemory(o)) => {
                            if self.oom.is_none() {
                                self.oom = Some(OomState {
                                    event_index: i,
                                    requested_bytes: e.size,
                                    message: o.to_string(),
                                    allocated_bytes: self.alloc.memory_allocated(),
                                    reserved_bytes: self.alloc.memory_reserved(),
                                    segments: self.alloc.segment_count(),
                                    largest_free_block: self.alloc.largest_free_block(),
                                    memory_summary: self.alloc.memory_summary(false),
                                });
                            }
                            if self.opts.stop_at_oom {
                                self.at = i;
                                return Ok(());
                            }
                        }
                        Err(other) => return Err(ReplayError::Invalid(other.to_string())),
                    }
                }
                TraceAction::FreeRequested => {
                    let Some(ptr) = self.addr_map.remove(&e.addr) else {
                        if !self.dropped.remove(&e.addr) {
                            self.unmatched += 1;
                        }
                        i += 1;
                        continue;
                    };
                    match plan.defer_at.get(&i) {
                        None => self
                            .alloc
                            .free(ptr)
                            .map_err(|err| ReplayError::Invalid(err.to_string()))?,
                        Some(&s) => {
                            // Held on a simulated stream until its `free_completed` entry.
                            if self.held.insert(s) {
                                self.alloc.with_device(|d| d.hold_stream(s));
                            }
                            self.alloc
                                .record_stream(ptr, s)
                                .map_err(|err| ReplayError::Invalid(err.to_string()))?;
                            self.alloc
                                .free(ptr)
                                .map_err(|err| ReplayError::Invalid(err.to_string()))?;
                        }
                    }
                }
                TraceAction::Oom => {
                    // The request PyTorch failed (it has no `alloc` entry): re-issued, so the
                    // OOM happens here too, or is shown not to under this config (then the
                    // memory goes back at once: the client's next steps are the recorded ones).
                    match self.alloc.malloc(e.size, e.stream) {
                        Ok(a) => {
                            self.recorded_ooms_avoided += 1;
                            self.alloc
                                .free(a.ptr)
                                .map_err(|err| ReplayError::Invalid(err.to_string()))?;
                        }
                        Err(AllocError::OutOfMemory(_)) => {}
                        Err(other) => return Err(ReplayError::Invalid(other.to_string())),
                    }
                }
                TraceAction::FreeCompleted => {
                    if let Some(&s) = plan.complete_at.get(&i) {
                        self.alloc.with_device(|d| d.advance_stream(s));
                    }
                }
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                    let Some(&k) = plan.run_at.get(&i) else {
                        i += 1;
                        continue;
                    };
                    for &p in plan.pools.freeable_at.get(&k).into_iter().flatten() {
                        self.alloc.release_pool(p);
                    }
                    if plan.user_release.contains(&i) {
                        self.alloc.empty_cache();
                    }
                    i = plan.facts.runs[k].end;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        self.at = i;
        Ok(())
    }

    /// The results, read off the allocator.
    pub fn finish(self) -> ReplayResult {
        let (plan, alloc, opts, snapshot) = (self.plan, &self.alloc, &self.opts, self.snapshot);
        let stats = alloc.memory_stats();
        let log = self
            .log
            .lock()
            .map(|l| (l.allocs.clone(), l.frees))
            .unwrap_or_default();
        let (user_empty_cache, allocator_releases) = plan.releases();
        ReplayResult {
            alloc_conf: opts.config.last_conf.clone(),
            device: plan.device,
            capacity_bytes: self.capacity,
            capacity_source: self.capacity_source,
            events: self.trace.len(),
            peak_allocated_bytes: stats["allocated_bytes.all.peak"] as u64,
            peak_reserved_bytes: stats["reserved_bytes.all.peak"] as u64,
            segment_allocs: log.0.len() as u64,
            segment_frees: log.1,
            segment_sizes: log.0,
            num_alloc_retries: stats["num_alloc_retries"],
            num_ooms: stats["num_ooms"],
            oom_event: self.oom.as_ref().map(|o| o.event_index),
            oom: self.oom.clone(),
            min_capacity_bytes: None,
            initial_live_blocks: self.initial_live,
            initial_reserved_bytes: self.initial_reserved,
            unmatched_frees: self.unmatched,
            recorded_ooms: plan.facts.ooms,
            recorded_ooms_avoided: self.recorded_ooms_avoided,
            workspace_fallbacks: self.fallen_back.len(),
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
        }
    }
}

#[cfg(test)]
mod tests {
    use vramroom_alloc::{Snapshot, TraceAction, TraceEntry};

    use super::WORKSPACE_TAG;
    use crate::replay::{replay, ReplayOptions};

    const MIB: u64 = 1 << 20;

    fn entry(action: TraceAction, addr: u64, size: u64, meta: &str) -> TraceEntry {
        TraceEntry {
            user_metadata: meta.into(),
            ..TraceEntry::new(action, addr, size)
        }
    }

    /// A 60 MiB tensor that stays, then a conv run twice whose workspace (50 MiB) is tagged
    /// `ws`, then a second conv's workspace (10 MiB) tagged `other`.
    fn traced(ws: &str, other: &str) -> Snapshot {
        use TraceAction::{Alloc, FreeCompleted, FreeRequested};
        let mut t = vec![entry(Alloc, 0x1000, 60 * MIB, "")];
        for (k, addr) in [0x2000_0000u64, 0x3000_0000].into_iter().enumerate() {
            t.push(entry(Alloc, addr + 1, 4 * MIB, "")); // the conv's output
            t.push(entry(Alloc, addr, 50 * MIB, ws));
            t.push(entry(FreeRequested, addr, 50 * MIB, ""));
            t.push(entry(FreeCompleted, addr, 50 * MIB, ""));
            if k == 0 {
                t.push(entry(FreeRequested, addr + 1, 4 * MIB, ""));
                t.push(entry(FreeCompleted, addr + 1, 4 * MIB, ""));
            }
        }
        t.push(entry(Alloc, 0x4000_0000, 10 * MIB, other));
        t.push(entry(FreeRequested, 0x4000_0000, 10 * MIB, ""));
        Snapshot {
            device_traces: vec![t],
            ..Snapshot::default()
        }
    }

    fn at(cap: u64, s: &Snapshot) -> crate::replay::ReplayResult {
        let opts = ReplayOptions {
            capacity: Some(cap),
            ..ReplayOptions::default()
        };
        replay(s, &opts).expect("replays")
    }

    #[test]
    fn a_conv_workspace_that_does_not_fit_falls_back_to_a_plan_without_one() {
        let tag = format!("{WORKSPACE_TAG}k1#1");
        let other = format!("{WORKSPACE_TAG}k2#1");
        let r = at(100 * MIB, &traced(&tag, &other));
        assert!(r.oom.is_none(), "{:?}", r.oom);
        assert_eq!(r.workspace_fallbacks, 1);
        assert_eq!(r.unmatched_frees, 0);
        // the second run of the same conv keeps the plan without a workspace; the other
        // conv's workspace still fits and is allocated (beside the second run's output)
        assert_eq!(r.peak_allocated_bytes, 60 * MIB + 4 * MIB + 10 * MIB);
        assert!(r.num_ooms >= 1);
        // with room for it, nothing falls back
        let roomy = at(1 << 34, &traced(&tag, &other));
        assert_eq!(roomy.workspace_fallbacks, 0);
        assert_eq!(roomy.peak_allocated_bytes, 60 * MIB + 4 * MIB + 50 * MIB);
    }

    /// The segment addresses of a replay (its own snapshot).
    fn segment_addresses(s: &Snapshot, ignore_recorded_addresses: bool) -> Vec<u64> {
        let opts = ReplayOptions {
            record_history: true,
            ignore_recorded_addresses,
            ..ReplayOptions::default()
        };
        let r = replay(s, &opts).expect("replays");
        let mut a: Vec<u64> = r
            .snapshot
            .expect("recorded")
            .segments
            .iter()
            .map(|g| g.address)
            .collect();
        a.sort_unstable();
        a
    }

    #[test]
    fn ignoring_recorded_addresses_replays_as_the_trace_without_them() {
        use TraceAction::{Alloc, SegmentAlloc};
        // Two 12 MiB segments (a large request's own) recorded far apart, the later one
        // below; the trace without them (the tracer's) is the same allocations.
        let (lo, hi) = (0x2000_0000_0000u64, 0x2100_0000_0000u64);
        let allocs = vec![
            entry(Alloc, hi, 12 * MIB, ""),
            entry(Alloc, lo, 12 * MIB, ""),
        ];
        let recorded = Snapshot {
            device_traces: vec![vec![
                entry(SegmentAlloc, hi, 12 * MIB, ""),
                allocs[0].clone(),
                entry(SegmentAlloc, lo, 12 * MIB, ""),
                allocs[1].clone(),
            ]],
            ..Snapshot::default()
        };
        let traced = Snapshot {
            device_traces: vec![allocs],
            ..Snapshot::default()
        };
        assert_eq!(segment_addresses(&recorded, false), vec![lo, hi]);
        let modelled = segment_addresses(&recorded, true);
        assert_eq!(modelled, segment_addresses(&traced, false));
        assert_ne!(modelled, vec![lo, hi]);
    }

    #[test]
    fn an_untagged_allocation_that_does_not_fit_is_the_programs_oom() {
        let r = at(100 * MIB, &traced("", ""));
        assert!(r.oom.is_some());
        assert_eq!(r.workspace_fallbacks, 0);
    }
}
