//! The recorded allocator: PyTorch's segments and blocks as the trace shows them, walked
//! forward, to learn what the trace does not say outright.
//!
//! Design note: a trace records *that* PyTorch reused a block or asked the driver for a new
//! segment, never *which pool* it searched. Private pools (CUDA graphs, cudagraph trees,
//! `MemPool`) are invisible except in their consequences, and those are exact: PyTorch's
//! best fit is deterministic, so
//! - an allocation that got a new segment (or a worse block) while a free block of the same
//!   stream and size class would have fit better was not in that block's pool;
//! - a segment left in place by a full `empty_cache` while wholly free belongs to a private
//!   pool that was still in use; one released belongs to the default pool or to a pool that
//!   was already freeable.
//!
//! This module replays the recorded addresses (no policy of ours is involved) and collects
//! those facts as constraints between *segment instances* (one segment from its creation to
//! its release). `pools.rs` turns them into pool labels. Block extents follow PyTorch's split
//! rule under the recording's own config, so the free runs seen here are the blocks PyTorch
//! had. Every step is O(log n); a constraint search is capped per allocation.
//!
//! Expandable segments are different: one reservation per (stream, pool, size class) grows
//! page by page, so a second reservation on the same stream and class can only be another
//! pool. Reservations are told apart by address: they are at least a device's memory apart.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use vramroom_alloc::{AllocatorConfig, MempoolId, TraceAction, TraceEntry};

use super::initial::Initial;

/// Reservations of one stream closer than this are the same one. Each reservation spans
/// 1.125x the device's memory, so even a 16 GiB device spaces them 18 GiB apart.
const RESERVATION_GAP: u64 = 16 << 30;
/// At most this many instances named per allocation by the best-fit check.
const MAX_DIFFER_PER_ALLOC: usize = 16;

/// One segment from its creation to its release (or the trace's end).
#[derive(Clone, Debug)]
pub(crate) struct Instance {
    pub base: u64,
    /// Non-expandable: the segment's size. Expandable: the reservation's mapped span so far.
    pub size: u64,
    pub stream: u64,
    pub small: bool,
    pub expandable: bool,
    /// Trace index of the first allocation placed in it.
    pub first_alloc: Option<usize>,
    /// Release run (index into `Facts::runs`) that gave it back.
    pub released: Option<usize>,
    /// Its pool, when the snapshot's final state says (alive at the end, or before the trace).
    pub known: Option<MempoolId>,
}

/// A run of consecutive `segment_free`/`segment_unmap` entries: one `empty_cache`, or one
/// release inside an allocation (the OOM fallback, `max_split_size` or GC).
#[derive(Clone, Debug)]
pub(crate) struct ReleaseRun {
    /// Trace indices [start, end).
    pub start: usize,
    pub end: usize,
    /// A device allocation (or an OOM) follows at once: the release may have been the
    /// allocator's own.
    pub then_alloc: bool,
    /// It gave back only some of the whole free segments: `max_split_size` or GC at work.
    pub partial: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Facts {
    pub instances: Vec<Instance>,
    /// Instance of each `alloc` entry, by trace index.
    pub alloc_in: HashMap<usize, u32>,
    /// Per stream, its `alloc` entries in trace order: (trace index, instance).
    pub stream_allocs: HashMap<u64, Vec<(usize, u32)>>,
    /// Pairs of instances that cannot share a pool.
    pub differ: Vec<(u32, u32)>,
    /// (instance, run): wholly free at a full release run, and kept.
    pub kept: Vec<(u32, usize)>,
    pub runs: Vec<ReleaseRun>,
    /// PyTorch's reserved bytes at their highest, counting the pre-trace segments.
    pub peak_reserved: u64,
    /// The most a successful device allocation needed under a memory fraction: reserved
    /// before it plus what PyTorch checks against the limit (the segment size, or for
    /// expandable segments the whole rounded request, however little of it was mapped).
    pub peak_demand: u64,
    pub ooms: usize,
    /// An OOM entry found the driver with room for the request: the limit was a memory
    /// fraction, not the device.
    pub fraction_bound: bool,
}

/// An allocated or pending block: its end and instance.
#[derive(Clone, Copy)]
struct Live {
    end: u64,
    inst: u32,
}

struct Model<'a> {
    config: &'a AllocatorConfig,
    f: Facts,
    /// Live non-expandable instances by base.
    segs: BTreeMap<u64, u32>,
    /// Live expandable reservations by their lowest address.
    reservations: BTreeMap<u64, u32>,
    blocks: BTreeMap<u64, Live>,
    /// Free runs of non-expandable instances: start → (size, instance).
    runs_at: BTreeMap<u64, (u64, u32)>,
    /// The same runs by best-fit key: (stream, small, size, start).
    fit: BTreeSet<(u64, bool, u64, u64)>,
    reserved: u64,
}

pub(crate) fn collect(
    trace: &[TraceEntry],
    init: &Initial,
    config: &AllocatorConfig,
    final_pools: &BTreeMap<u64, (u64, MempoolId)>,
) -> Facts {
    let mut m = Model {
        config,
        f: Facts::default(),
        segs: BTreeMap::new(),
        reservations: BTreeMap::new(),
        blocks: BTreeMap::new(),
        runs_at: BTreeMap::new(),
        fit: BTreeSet::new(),
        reserved: 0,
    };
    m.seed(init);
    m.walk(trace, final_pools);
    m.f
}

impl Model<'_> {
    fn new_instance(&mut self, inst: Instance) -> u32 {
        let id = self.f.instances.len() as u32;
        self.f.instances.push(inst);
        id
    }

    fn add_run(&mut self, start: u64, size: u64, inst: u32) {
        if size == 0 {
            return;
        }
        let i = &self.f.instances[inst as usize];
        self.fit.insert((i.stream, i.small, size, start));
        self.runs_at.insert(start, (size, inst));
    }

    fn remove_run(&mut self, start: u64) -> Option<(u64, u32)> {
        let (size, inst) = self.runs_at.remove(&start)?;
        let i = &self.f.instances[inst as usize];
        self.fit.remove(&(i.stream, i.small, size, start));
        Some((size, inst))
    }

    /// The free run that contains `addr`, if any.
    fn run_containing(&self, addr: u64) -> Option<(u64, u64, u32)> {
        let (&start, &(size, inst)) = self.runs_at.range(..=addr).next_back()?;
        (addr < start + size).then_some((start, size, inst))
    }

    fn seed(&mut self, init: &Initial) {
        for s in &init.segments {
            let imp = &s.import;
            let small = imp.pool == vramroom_alloc::PoolKind::Small;
            let size = if imp.expandable {
                imp.mapped
                    .iter()
                    .map(|m| m.0.saturating_add(m.1))
                    .max()
                    .unwrap_or(0)
            } else {
                imp.total_size
            };
            let inst = self.new_instance(Instance {
                base: s.recorded_base,
                size,
                stream: imp.stream,
                small,
                expandable: imp.expandable,
                first_alloc: None,
                released: None,
                known: Some(imp.pool_id),
            });
            // Saturating: each segment's range was checked, but a hostile snapshot's
            // segments can add up past 2^64 (found by the snapshot_replay fuzz target).
            let held = if imp.expandable {
                imp.mapped.iter().fold(0u64, |a, m| a.saturating_add(m.1))
            } else {
                imp.total_size
            };
            self.reserved = self.reserved.saturating_add(held);
            if imp.expandable {
                self.reservations.insert(s.recorded_base, inst);
                for b in &imp.live {
                    self.blocks.insert(
                        s.recorded_base + b.offset,
                        Live {
                            end: s.recorded_base + b.offset + b.size,
                            inst,
                        },
                    );
                }
                continue;
            }
            self.segs.insert(s.recorded_base, inst);
            let mut p = s.recorded_base;
            let mut live = imp.live.clone();
            live.sort_by_key(|b| b.offset);
            for b in live {
                let a = s.recorded_base + b.offset;
                self.add_run(p, a.saturating_sub(p), inst);
                self.blocks.insert(
                    a,
                    Live {
                        end: a + b.size,
                        inst,
                    },
                );
                p = a + b.size;
            }
            let end = s.recorded_base.saturating_add(imp.total_size);
            self.add_run(p, end.saturating_sub(p), inst);
        }
        self.f.peak_reserved = self.reserved;
        self.f.peak_demand = self.reserved;
    }

    fn instance_at(&self, addr: u64) -> Option<u32> {
        if let Some((&base, &i)) = self.segs.range(..=addr).next_back() {
            if addr < base.saturating_add(self.f.instances[i as usize].size) {
                return Some(i);
            }
        }
        let (&lo, &i) = self.reservations.range(..=addr).next_back()?;
        let inst = &self.f.instances[i as usize];
        (addr < lo.saturating_add(inst.size).saturating_add(RESERVATION_GAP)).then_some(i)
    }

    fn walk(&mut self, trace: &[TraceEntry], final_pools: &BTreeMap<u64, (u64, MempoolId)>) {
        let mut i = 0;
        while i < trace.len() {
            let e = &trace[i];
            match e.action {
                TraceAction::SegmentAlloc => self.segment_alloc(e, final_pools),
                TraceAction::SegmentMap => self.segment_map(i, e, final_pools, trace),
                TraceAction::Alloc => self.alloc(i, e, trace),
                TraceAction::FreeCompleted => self.free_completed(e.addr),
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                    i = self.release_run(i, trace);
                    continue;
                }
                TraceAction::Oom => {
                    self.f.ooms += 1;
                    // `device_free` is stored in `addr` for OOM entries.
                    self.f.fraction_bound |= e.addr >= e.size;
                }
                _ => {}
            }
            i += 1;
        }
    }

    fn segment_alloc(&mut self, e: &TraceEntry, final_pools: &BTreeMap<u64, (u64, MempoolId)>) {
        let known = self.known_pool_cached(e.addr, final_pools);
        let inst = self.new_instance(Instance {
            base: e.addr,
            size: e.size,
            stream: e.stream,
            small: e.size == 2 << 20,
            expandable: false,
            first_alloc: None,
            released: None,
            known,
        });
        self.segs.insert(e.addr, inst);
        self.add_run(e.addr, e.size, inst);
        self.grow(e.size);
    }

    fn known_pool_cached(
        &self,
        addr: u64,
        final_pools: &BTreeMap<u64, (u64, MempoolId)>,
    ) -> Option<MempoolId> {
        // Whether a later release removes this segment is settled at its release (which
        // clears `known` again), so the cheap test suffices here.
        let (&base, &(_, pool)) = final_pools.range(..=addr).next_back()?;
        (base == addr).then_some(pool)
    }

    fn segment_map(
        &mut self,
        i: usize,
        e: &TraceEntry,
        final_pools: &BTreeMap<u64, (u64, MempoolId)>,
        trace: &[TraceEntry],
    ) {
        // The first map of a request: the limit was checked against the whole request.
        if i == 0 || trace[i - 1].action != TraceAction::SegmentMap {
            let request = trace[i..]
                .iter()
                .find(|n| n.action == TraceAction::Alloc)
                .map_or(e.size, |n| {
                    vramroom_alloc::policy::round_size(self.config, n.size)
                });
            self.f.peak_demand = self
                .f
                .peak_demand
                .max(self.reserved.saturating_add(request));
        }
        self.grow(e.size);
        // Pages mapped next to a reservation of this stream belong to it.
        let near = self
            .reservations
            .range(..=e.addr)
            .next_back()
            .filter(|(&lo, &r)| {
                let inst = &self.f.instances[r as usize];
                inst.stream == e.stream
                    && e.addr < lo.saturating_add(inst.size).saturating_add(RESERVATION_GAP)
            })
            .map(|(_, &r)| r);
        if let Some(r) = near {
            let inst = &mut self.f.instances[r as usize];
            inst.size = inst.size.max(e.addr.saturating_add(e.size) - inst.base);
            return;
        }
        // A new reservation: its pool is the one any final segment inside it has.
        let known = final_pools
            .range(e.addr..e.addr.saturating_add(RESERVATION_GAP))
            .next()
            .map(|(_, &(_, p))| p);
        let inst = self.new_instance(Instance {
            base: e.addr,
            size: e.size,
            stream: e.stream,
            small: e.size == 2 << 20,
            expandable: true,
            first_alloc: None,
            released: None,
            known,
        });
        // A second reservation of a stream and size class is another pool's.
        for (_, &other) in self.reservations.iter() {
            let o = &self.f.instances[other as usize];
            if o.stream == e.stream {
                self.f.differ.push((inst, other));
            }
        }
        self.reservations.insert(e.addr, inst);
    }

    fn grow(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_add(bytes);
        self.f.peak_reserved = self.f.peak_reserved.max(self.reserved);
        self.f.peak_demand = self.f.peak_demand.max(self.reserved);
    }

    /// Block size PyTorch gave a request of `n` taken from the front of a free run of
    /// `run` bytes: the rounded size, or the whole run when the rest is too small to split.
    fn block_size(&self, n: u64, run: u64, small: bool) -> u64 {
        let s = vramroom_alloc::policy::round_size(self.config, n).min(run);
        let rest = run - s;
        let split = if small || self.config.expandable_segments {
            rest >= 512
        } else {
            s < self.config.max_split_size && rest > (1 << 20)
        };
        if split {
            s
        } else {
            run
        }
    }

    fn alloc(&mut self, i: usize, e: &TraceEntry, trace: &[TraceEntry]) {
        let Some(inst) = self.instance_at(e.addr) else {
            return;
        };
        self.f.alloc_in.insert(i, inst);
        self.f
            .stream_allocs
            .entry(e.stream)
            .or_default()
            .push((i, inst));
        let first = &mut self.f.instances[inst as usize].first_alloc;
        if first.is_none() {
            *first = Some(i);
        }
        let (expandable, small, stream) = {
            let x = &self.f.instances[inst as usize];
            (x.expandable, x.small, x.stream)
        };
        if expandable {
            let s = vramroom_alloc::policy::round_size(self.config, e.size);
            self.blocks.insert(
                e.addr,
                Live {
                    end: e.addr.saturating_add(s),
                    inst,
                },
            );
            return;
        }
        let Some((start, size, _)) = self.run_containing(e.addr) else {
            // Not in a free run: inconsistent with the recorded state; keep the block.
            let s = vramroom_alloc::policy::round_size(self.config, e.size);
            self.blocks.insert(
                e.addr,
                Live {
                    end: e.addr.saturating_add(s),
                    inst,
                },
            );
            return;
        };
        let created_now =
            i > 0 && trace[i - 1].action == TraceAction::SegmentAlloc && trace[i - 1].addr == start;
        self.best_fit_check(e, inst, stream, small, (size, start), created_now);
        self.remove_run(start);
        let lead = e.addr - start;
        self.add_run(start, lead, inst);
        let bsize = self.block_size(e.size, size - lead, small);
        let end = e.addr + bsize;
        self.add_run(end, start + size - end, inst);
        self.blocks.insert(e.addr, Live { end, inst });
    }

    /// Which free runs of the same stream and size class PyTorch's best fit would have
    /// preferred to the block it took: those runs' instances are in other pools.
    fn best_fit_check(
        &mut self,
        e: &TraceEntry,
        inst: u32,
        stream: u64,
        small: bool,
        taken: (u64, u64),
        created_now: bool,
    ) {
        let s = vramroom_alloc::policy::round_size(self.config, e.size);
        let m = self.config.max_split_size;
        let r = self.config.max_non_split_rounding_size;
        let mut named = 0;
        let lo = (stream, small, s, 0u64);
        let hi = (stream, small, u64::MAX, u64::MAX);
        for &(_, _, size, start) in self.fit.range(lo..=hi) {
            if !created_now && (size, start) >= taken {
                break;
            }
            if (s < m && size >= m) || (s >= m && size >= s.saturating_add(r)) {
                break;
            }
            let Some(&(_, other)) = self.runs_at.get(&start) else {
                continue;
            };
            if other != inst {
                self.f.differ.push((inst, other));
                named += 1;
                if named >= MAX_DIFFER_PER_ALLOC {
                    break;
                }
            }
        }
    }

    fn free_completed(&mut self, addr: u64) {
        let Some(b) = self.blocks.remove(&addr) else {
            return;
        };
        if self.f.instances[b.inst as usize].expandable {
            return;
        }
        let mut start = addr;
        let mut end = b.end;
        // Merge with the free runs on either side, inside the same instance.
        if let Some((&ps, &(psize, pinst))) = self.runs_at.range(..addr).next_back() {
            if pinst == b.inst && ps + psize == addr {
                self.remove_run(ps);
                start = ps;
            }
        }
        if let Some(&(nsize, ninst)) = self.runs_at.get(&end) {
            if ninst == b.inst {
                self.remove_run(end);
                end += nsize;
            }
        }
        self.add_run(start, end - start, b.inst);
    }

    /// A run of releases starting at `i`; returns the index after it.
    fn release_run(&mut self, i: usize, trace: &[TraceEntry]) -> usize {
        let mut j = i;
        while j < trace.len()
            && matches!(
                trace[j].action,
                TraceAction::SegmentFree | TraceAction::SegmentUnmap
            )
        {
            j += 1;
        }
        let run_idx = self.f.runs.len();
        // Whole free non-expandable instances before the release.
        let free_whole: Vec<u32> = self
            .segs
            .iter()
            .filter(|(&base, &inst)| {
                let x = &self.f.instances[inst as usize];
                self.runs_at.get(&base).is_some_and(|&(sz, _)| sz == x.size)
            })
            .map(|(_, &inst)| inst)
            .collect();
        let mut freed = Vec::new();
        for e in &trace[i..j] {
            self.reserved = self.reserved.saturating_sub(e.size);
            if e.action == TraceAction::SegmentFree {
                if let Some(inst) = self.segs.remove(&e.addr) {
                    self.remove_run(e.addr);
                    let x = &mut self.f.instances[inst as usize];
                    x.released = Some(run_idx);
                    // Released, so the final snapshot's segment at this address is another.
                    x.known = None;
                    freed.push(inst);
                }
            } else if let Some(r) = self.instance_at(e.addr) {
                let x = &self.f.instances[r as usize];
                if x.expandable && e.addr == x.base && e.size >= x.size {
                    self.reservations.remove(&x.base);
                    self.f.instances[r as usize].released = Some(run_idx);
                }
            }
        }
        // A device allocation, or the OOM it failed with, follows at once.
        let then_alloc = trace.get(j).is_some_and(|n| {
            matches!(
                n.action,
                TraceAction::SegmentAlloc | TraceAction::SegmentMap | TraceAction::Oom
            )
        });
        let kept: Vec<u32> = free_whole
            .iter()
            .copied()
            .filter(|x| !freed.contains(x))
            .collect();
        let partial = !kept.is_empty() && self.explained_as_partial(&freed);
        if !partial {
            for x in kept {
                self.f.kept.push((x, run_idx));
            }
        }
        self.f.runs.push(ReleaseRun {
            start: i,
            end: j,
            then_alloc,
            partial,
        });
        j
    }

    /// A release that left whole free segments behind can be PyTorch's own partial one:
    /// with `max_split_size`, oversize segments only; with GC, unsplit large ones.
    fn explained_as_partial(&self, freed: &[u32]) -> bool {
        if freed.is_empty() {
            return false;
        }
        let m = self.config.max_split_size;
        let oversize = m != u64::MAX
            && freed
                .iter()
                .all(|&x| self.f.instances[x as usize].size >= m);
        let gc = self.config.garbage_collection_threshold > 0.0
            && freed.iter().all(|&x| !self.f.instances[x as usize].small);
        oversize || gc
    }
}
