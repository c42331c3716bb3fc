//! PyTorch's `DeviceStats`: the stat cells behind `memory_stats()`.
//!
//! Design note: the allocator never writes these cells directly. It emits [`crate::AllocEvent`]s
//! and [`DeviceStats::observe`] turns each event into cell updates, exactly as PyTorch's
//! allocator updates its own counters at the same points. Keeping the mapping in one function
//! makes "every statistic equals its value recomputed from the state" checkable.
//!
//! The allocator's own copy ([`LiveStats`]) skips what the other counters imply, on the hot
//! path: a cell's `freed` always equals `allocated - (current - current at the last
//! accumulated-stats reset)`, and an array's `all` cell has the small and large pools'
//! `current` and `allocated` summed (every update of a pool cell updates `all` by the same
//! amount). So only `all.peak` is kept for `all`, and the rest is computed when the stats
//! are read: about 28 fewer read-modify-writes per cache-hit malloc+free pair. The
//! event-to-cell mapping is still one function, instantiated eager and lazy.

use std::collections::BTreeMap;

use crate::event::{AllocEvent, PoolKind};

/// One tracked quantity: PyTorch's `Stat` (current, peak, allocated, freed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stat {
    pub current: i64,
    pub peak: i64,
    pub allocated: i64,
    pub freed: i64,
}

impl Stat {
    #[inline]
    pub fn increase(&mut self, x: i64) {
        // Saturating: PyTorch's int64 counters cannot overflow on a real device, but a
        // hostile snapshot's blocks can add up past 2^63 (the snapshot_replay fuzz target).
        self.current = self.current.saturating_add(x);
        if self.current > self.peak {
            self.peak = self.current;
        }
        self.allocated = self.allocated.saturating_add(x);
    }
    #[inline]
    pub fn decrease(&mut self, x: i64) {
        self.decrease_by::<false>(x)
    }
    /// `decrease`; a `LAZY` cell does not count `freed` (see [`LiveStats`]).
    #[inline(always)]
    fn decrease_by<const LAZY: bool>(&mut self, x: i64) {
        self.current = self.current.saturating_sub(x);
        if !LAZY {
            self.freed = self.freed.saturating_add(x);
        }
    }
    /// Signed update, as PyTorch applies a net change: positive increases, negative decreases.
    #[inline]
    pub fn apply(&mut self, delta: i64) {
        self.apply_by::<false>(delta)
    }
    #[inline(always)]
    fn apply_by<const LAZY: bool>(&mut self, delta: i64) {
        if delta > 0 {
            self.increase(delta)
        } else if delta < 0 {
            self.decrease_by::<LAZY>(delta.saturating_neg())
        }
    }
    /// `freed` as implied by the other counters and `current` at the last reset.
    fn derive_freed(&mut self, base: &Stat) {
        self.freed = self
            .allocated
            .saturating_sub(self.current.saturating_sub(base.current));
    }
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// Index into a [`StatArray`]: PyTorch's `StatType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatType {
    All = 0,
    SmallPool = 1,
    LargePool = 2,
}

/// A pool's cell in a `StatArray`: `pool.stat_type() as usize`, as arithmetic the compiler
/// sees is in range (no bounds check, no match).
#[inline(always)]
fn cell_of(pool: PoolKind) -> usize {
    const _: () = assert!(PoolKind::Small as usize + 1 == StatType::SmallPool as usize);
    const _: () = assert!(PoolKind::Large as usize + 1 == StatType::LargePool as usize);
    pool as usize + 1
}

impl StatType {
    pub const ALL: [StatType; 3] = [StatType::All, StatType::SmallPool, StatType::LargePool];
    pub fn key(self) -> &'static str {
        match self {
            StatType::All => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }
}

/// `all`, `small_pool`, `large_pool`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// A pool-typed update touches `all` and the pool's own cell.
    #[inline]
    pub fn apply(&mut self, pool: PoolKind, delta: i64) {
        self.apply_by::<false>(pool, delta)
    }
    #[inline(always)]
    fn apply_by<const LAZY: bool>(&mut self, pool: PoolKind, delta: i64) {
        if LAZY {
            // The same cell updates as below, without the sign test: a split's net change
            // is as likely up as down, so the test was a coin-toss branch on the hot path.
            // A decrease leaves peaks alone (each is already >= its current) and adds 0 to
            // `allocated`; a lazy cell keeps no `freed`.
            let c = &mut self.0[cell_of(pool)];
            c.current += delta;
            c.peak = c.peak.max(c.current);
            c.allocated += delta.max(0);
            let all = self.0[1].current + self.0[2].current;
            self.0[0].peak = self.0[0].peak.max(all);
            return;
        }
        if delta > 0 {
            self.increase::<LAZY>(pool, delta)
        } else if delta < 0 {
            self.decrease::<LAZY>(pool, -delta)
        }
    }
    /// `apply(pool, x)` for an `x` known to be ≥ 0, without the sign test (an increase by 0
    /// leaves a cell as `apply(0)` does: its peak is already ≥ its current). A `LAZY` array
    /// keeps only the peak of `all`: its current is the pools' sum.
    #[inline(always)]
    fn increase<const LAZY: bool>(&mut self, pool: PoolKind, x: i64) {
        self.0[cell_of(pool)].increase(x);
        if LAZY {
            let all = self.0[1].current + self.0[2].current;
            if all > self.0[0].peak {
                self.0[0].peak = all;
            }
        } else {
            self.0[0].increase(x);
        }
    }
    /// `apply(pool, -x)` for an `x` known to be ≥ 0. A `LAZY` array leaves `all` alone.
    #[inline(always)]
    fn decrease<const LAZY: bool>(&mut self, pool: PoolKind, x: i64) {
        if !LAZY {
            self.0[0].decrease_by::<LAZY>(x);
        }
        self.0[cell_of(pool)].decrease_by::<LAZY>(x);
    }
    /// A lazy array made whole: `all`'s current and allocated from the pools, and every
    /// `freed` from `base` (the array at the last accumulated-stats reset).
    fn derive_lazy(&mut self, base: &StatArray) {
        self.derive_all();
        for (c, b) in self.0.iter_mut().zip(base.0.iter()) {
            c.derive_freed(b);
        }
    }
    fn derive_all(&mut self) {
        self.0[0].current = self.0[1].current + self.0[2].current;
        self.0[0].allocated = self.0[1].allocated + self.0[2].allocated;
    }
    pub fn get(&self, t: StatType) -> &Stat {
        &self.0[t as usize]
    }
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }
    fn for_each_mut(&mut self, mut f: impl FnMut(&mut Stat)) {
        self.0.iter_mut().for_each(&mut f)
    }
}

/// Every statistic PyTorch 2.11's native allocator keeps for one device.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceStats {
    pub allocation: StatArray,
    pub segment: StatArray,
    pub active: StatArray,
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub num_sync_all_streams: i64,
    pub num_device_alloc: i64,
    pub num_device_free: i64,
    /// Frozen at allocator creation; `-1` for unlimited.
    pub max_split_size: i64,
}

/// The nine stat arrays in the order `memory_summary` prints them, with their key names.
pub const ARRAY_NAMES: [&str; 9] = [
    "active",
    "active_bytes",
    "allocated_bytes",
    "allocation",
    "inactive_split",
    "inactive_split_bytes",
    "requested_bytes",
    "reserved_bytes",
    "segment",
];

impl DeviceStats {
    pub fn new(max_split_size: i64) -> Self {
        DeviceStats {
            max_split_size,
            ..Default::default()
        }
    }

    /// Apply one allocator event. This is the only place stats change.
    #[inline(always)]
    pub fn observe(&mut self, ev: &AllocEvent) {
        self.apply_event::<false>(ev, false)
    }

    /// The event-to-cell mapping; `LAZY` skips what [`LiveStats`] derives on read, and
    /// `mirrored` the active arrays while they mirror the allocation arrays.
    #[inline(always)]
    fn apply_event<const LAZY: bool>(&mut self, ev: &AllocEvent, mirrored: bool) {
        match *ev {
            AllocEvent::Alloc {
                pool,
                block_size,
                requested,
                oversize,
                ..
            } => {
                let b = block_size as i64;
                self.allocation.increase::<LAZY>(pool, 1);
                self.allocated_bytes.increase::<LAZY>(pool, b);
                if !mirrored {
                    self.active.increase::<LAZY>(pool, 1);
                    self.active_bytes.increase::<LAZY>(pool, b);
                }
                self.requested_bytes
                    .increase::<LAZY>(pool, requested as i64);
                if oversize {
                    self.oversize_allocations.increase(1);
                }
            }
            AllocEvent::FreeRequested {
                pool,
                block_size,
                oversize,
                ..
            } => {
                self.allocation.decrease::<LAZY>(pool, 1);
                self.allocated_bytes
                    .decrease::<LAZY>(pool, block_size as i64);
                if oversize {
                    self.oversize_allocations.decrease_by::<LAZY>(1);
                }
            }
            AllocEvent::FreeCompleted {
                pool,
                block_size,
                requested,
                ..
            } => {
                if !mirrored {
                    self.active.decrease::<LAZY>(pool, 1);
                    self.active_bytes.decrease::<LAZY>(pool, block_size as i64);
                }
                self.requested_bytes
                    .decrease::<LAZY>(pool, requested as i64);
            }
            AllocEvent::InactiveSplit {
                pool,
                blocks,
                bytes,
            } => {
                self.inactive_split.apply_by::<LAZY>(pool, blocks);
                self.inactive_split_bytes.apply_by::<LAZY>(pool, bytes);
            }
            AllocEvent::SegmentAlloc {
                pool,
                size,
                oversize,
                ..
            } => {
                self.segment.apply_by::<LAZY>(pool, 1);
                self.reserved_bytes.apply_by::<LAZY>(pool, size as i64);
                if oversize {
                    self.oversize_segments.increase(1);
                }
                self.num_device_alloc += 1;
            }
            AllocEvent::SegmentFree {
                pool,
                size,
                oversize,
                ..
            } => {
                self.segment.apply_by::<LAZY>(pool, -1);
                self.reserved_bytes.apply_by::<LAZY>(pool, -(size as i64));
                if oversize {
                    self.oversize_segments.decrease_by::<LAZY>(1);
                }
                self.num_device_free += 1;
            }
            AllocEvent::SegmentMap { pool, size, .. } => {
                self.reserved_bytes.apply_by::<LAZY>(pool, size as i64);
                self.num_device_alloc += 1;
            }
            AllocEvent::SegmentUnmap { pool, size, .. } => {
                self.reserved_bytes.apply_by::<LAZY>(pool, -(size as i64));
                self.num_device_free += 1;
            }
            AllocEvent::AllocRetry => self.num_alloc_retries += 1,
            AllocEvent::SyncAllStreams => self.num_sync_all_streams += 1,
            AllocEvent::Oom { .. } => self.num_ooms += 1,
            AllocEvent::Snapshot { .. } => {}
        }
    }

    /// The active arrays as the allocation arrays they mirror (see `LiveStats::mirrored`).
    fn fill_mirrored_active(&mut self) {
        self.active = self.allocation;
        self.active_bytes = self.allocated_bytes;
    }

    fn arrays(&self) -> [&StatArray; 9] {
        [
            &self.active,
            &self.active_bytes,
            &self.allocated_bytes,
            &self.allocation,
            &self.inactive_split,
            &self.inactive_split_bytes,
            &self.requested_bytes,
            &self.reserved_bytes,
            &self.segment,
        ]
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.active,
            &mut self.active_bytes,
            &mut self.allocated_bytes,
            &mut self.allocation,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.segment,
        ]
    }

    /// `torch.cuda.memory_stats()`: the 122 keys, sorted by key as PyTorch's OrderedDict is.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for (name, arr) in ARRAY_NAMES.iter().zip(self.arrays()) {
            for t in StatType::ALL {
                put_cell(&mut m, &format!("{name}.{}", t.key()), arr.get(t));
            }
        }
        put_cell(&mut m, "oversize_allocations", &self.oversize_allocations);
        put_cell(&mut m, "oversize_segments", &self.oversize_segments);
        m.insert("max_split_size".into(), self.max_split_size);
        m.insert("num_alloc_retries".into(), self.num_alloc_retries);
        m.insert("num_device_alloc".into(), self.num_device_alloc);
        m.insert("num_device_free".into(), self.num_device_free);
        m.insert("num_ooms".into(), self.num_ooms);
        m.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        m
    }

    /// Rebuild stats from a flat `memory_stats()` dict (for example from a PyTorch JSON dump).
    /// Missing keys read as 0.
    pub fn from_memory_stats(m: &BTreeMap<String, i64>) -> Self {
        let cell = |prefix: &str| Stat {
            current: m.get(&format!("{prefix}.current")).copied().unwrap_or(0),
            peak: m.get(&format!("{prefix}.peak")).copied().unwrap_or(0),
            allocated: m.get(&format!("{prefix}.allocated")).copied().unwrap_or(0),
            freed: m.get(&format!("{prefix}.freed")).copied().unwrap_or(0),
        };
        let mut s = DeviceStats::default();
        for (name, arr) in ARRAY_NAMES.iter().zip(s.arrays_mut()) {
            for t in StatType::ALL {
                arr.0[t as usize] = cell(&format!("{name}.{}", t.key()));
            }
        }
        s.oversize_allocations = cell("oversize_allocations");
        s.oversize_segments = cell("oversize_segments");
        let scalar = |k: &str| m.get(k).copied().unwrap_or(0);
        s.max_split_size = scalar("max_split_size");
        s.num_alloc_retries = scalar("num_alloc_retries");
        s.num_device_alloc = scalar("num_device_alloc");
        s.num_device_free = scalar("num_device_free");
        s.num_ooms = scalar("num_ooms");
        s.num_sync_all_streams = scalar("num_sync_all_streams");
        s
    }

    /// `reset_peak_memory_stats()`.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.for_each_mut(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `reset_accumulated_memory_stats()`.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.for_each_mut(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }
}

/// The allocator's statistics: a [`DeviceStats`] updated lazily from events (no `freed`
/// counters; of each array's `all` cell only the peak), plus the complete stats as they were
/// at the last `reset_accumulated_memory_stats()` (zeros before any). From those, `all`'s
/// current and allocated are the pools' sums and `freed = allocated - (current - current at
/// reset)` for every cell, which is exactly what eager counting gives.
///
/// `active` and `active_bytes` differ from `allocation` and `allocated_bytes` only while a
/// free waits for `record_stream` events. Until the first such free they are the same
/// sequence of updates, so they are not kept (`mirrored`) and are copied on read; the first
/// deferred free ([`unmirror`](Self::unmirror)) makes them cells of their own for good.
#[derive(Clone, Debug)]
pub(crate) struct LiveStats {
    /// Stale in every `freed` and in `all`'s current and allocated, and in the active arrays
    /// while `mirrored`: read through `get`.
    cells: DeviceStats,
    at_reset: DeviceStats,
    mirrored: bool,
}

impl Default for LiveStats {
    fn default() -> Self {
        Self::new(-1)
    }
}

impl LiveStats {
    pub fn new(max_split_size: i64) -> Self {
        LiveStats {
            cells: DeviceStats::new(max_split_size),
            at_reset: DeviceStats::default(),
            mirrored: true,
        }
    }

    #[inline(always)]
    pub fn observe(&mut self, ev: &AllocEvent) {
        self.cells.apply_event::<true>(ev, self.mirrored);
    }

    /// A free is about to wait for events: from now on the active arrays count apart.
    pub fn unmirror(&mut self) {
        if self.mirrored {
            self.cells.fill_mirrored_active();
            self.mirrored = false;
        }
    }

    /// The cells with the active arrays filled in.
    fn cells_view(&self) -> DeviceStats {
        let mut s = self.cells.clone();
        if self.mirrored {
            s.fill_mirrored_active();
        }
        s
    }

    /// The complete statistics.
    pub fn get(&self) -> DeviceStats {
        let mut s = self.cells_view();
        for (a, base) in s.arrays_mut().into_iter().zip(self.at_reset.arrays()) {
            a.derive_lazy(base);
        }
        s.oversize_allocations
            .derive_freed(&self.at_reset.oversize_allocations);
        s.oversize_segments
            .derive_freed(&self.at_reset.oversize_segments);
        s
    }

    /// `allocated_bytes.all` (current and peak; without the whole `get`).
    pub fn allocated_bytes_all(&self) -> Stat {
        Self::all_of(&self.cells.allocated_bytes)
    }

    /// `reserved_bytes.all` (current and peak; without the whole `get`).
    pub fn reserved_bytes_all(&self) -> Stat {
        Self::all_of(&self.cells.reserved_bytes)
    }

    fn all_of(a: &StatArray) -> Stat {
        let mut a = *a;
        a.derive_all();
        a.0[0]
    }

    /// The complete stats at the last accumulated-stats reset.
    pub fn at_reset(&self) -> &DeviceStats {
        &self.at_reset
    }

    pub fn reset_peak(&mut self) {
        self.cells.reset_peak();
        // `all.current` is stale here: its peak restarts from the pools' sum.
        for a in self.cells.arrays_mut() {
            a.0[0].peak = a.0[1].current + a.0[2].current;
        }
    }

    pub fn reset_accumulated(&mut self) {
        self.cells.reset_accumulated();
        let mut at_reset = self.cells_view();
        for a in at_reset.arrays_mut() {
            a.derive_all();
        }
        self.at_reset = at_reset;
    }
}

fn put_cell(m: &mut BTreeMap<String, i64>, prefix: &str, c: &Stat) {
    m.insert(format!("{prefix}.allocated"), c.allocated);
    m.insert(format!("{prefix}.current"), c.current);
    m.insert(format!("{prefix}.freed"), c.freed);
    m.insert(format!("{prefix}.peak"), c.peak);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_122_keys() {
        assert_eq!(DeviceStats::new(-1).memory_stats().len(), 122);
    }

    /// Hostile sizes (blocks near 2^63 from a snapshot) pin the counters at the ends of
    /// i64 instead of wrapping to negative bytes or panicking.
    #[test]
    fn counters_saturate() {
        let mut s = Stat::default();
        s.increase(i64::MAX);
        s.increase(i64::MAX);
        assert_eq!(
            (s.current, s.peak, s.allocated),
            (i64::MAX, i64::MAX, i64::MAX)
        );
        s.apply(i64::MIN);
        assert_eq!(s.current, 0);
        assert_eq!(s.freed, i64::MAX);
        s.decrease(i64::MAX);
        s.decrease(i64::MAX);
        assert_eq!(s.current, i64::MIN);
    }

    /// The allocator's lazily derived `freed` equals the eagerly counted one, before and
    /// after resets, for every event kind and sign.
    #[test]
    fn live_stats_match_eager_stats() {
        check_live_stats(false);
    }

    /// As the allocator drives them: while no free waits for events, every free's two
    /// events come together, and the mirrored active arrays read the same as eager ones;
    /// after a deferred free (halfway), the arrays count apart, again exactly.
    #[test]
    fn mirrored_active_arrays_match_eager_stats() {
        check_live_stats(true);
    }

    fn check_live_stats(paired_frees: bool) {
        use crate::event::AllocEvent as E;
        let mut eager = DeviceStats::new(64 << 20);
        let mut live = LiveStats::new(64 << 20);
        if !paired_frees {
            live.unmirror();
        }
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for i in 0..5000 {
            let pool = if next(2) == 0 {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            let size = 512 * (1 + next(4096));
            let ev = match next(9) {
                0 => E::Alloc {
                    pool,
                    ptr: 0,
                    block_size: size,
                    requested: size - next(512),
                    stream: 0,
                    oversize: next(3) == 0,
                },
                1 => E::FreeRequested {
                    pool,
                    ptr: 0,
                    block_size: size,
                    requested: size,
                    stream: 0,
                    oversize: next(3) == 0,
                },
                2 => E::FreeCompleted {
                    pool,
                    ptr: 0,
                    block_size: size,
                    requested: size - 1,
                    stream: 0,
                },
                3 => E::InactiveSplit {
                    pool,
                    blocks: next(3) as i64 - 1,
                    bytes: size as i64 - 2 * next(size) as i64,
                },
                4 => E::SegmentAlloc {
                    pool,
                    ptr: 0,
                    size,
                    stream: 0,
                    oversize: next(2) == 0,
                },
                5 => E::SegmentFree {
                    pool,
                    ptr: 0,
                    size,
                    stream: 0,
                    oversize: next(2) == 0,
                },
                6 => E::SegmentMap {
                    pool,
                    ptr: 0,
                    size,
                    stream: 0,
                },
                7 => E::SegmentUnmap {
                    pool,
                    ptr: 0,
                    size,
                    stream: 0,
                },
                _ => E::AllocRetry,
            };
            let deferred_phase = !paired_frees || i >= 2500;
            if i == 2500 && paired_frees {
                live.unmirror();
            }
            let ev = match ev {
                // Before the first deferred free, a completion only follows its request.
                E::FreeCompleted { .. } if !deferred_phase => E::AllocRetry,
                e => e,
            };
            eager.observe(&ev);
            live.observe(&ev);
            if let (
                false,
                E::FreeRequested {
                    pool,
                    block_size,
                    requested,
                    ..
                },
            ) = (deferred_phase, ev)
            {
                let done = E::FreeCompleted {
                    pool,
                    ptr: 0,
                    block_size,
                    requested,
                    stream: 0,
                };
                eager.observe(&done);
                live.observe(&done);
            }
            if i % 997 == 0 {
                eager.reset_accumulated();
                live.reset_accumulated();
            }
            if i % 1409 == 0 {
                eager.reset_peak();
                live.reset_peak();
            }
            assert_eq!(live.get(), eager, "after event {i}: {ev:?}");
        }
    }

    #[test]
    fn flat_round_trip() {
        let mut s = DeviceStats::new(-1);
        s.allocated_bytes.apply(PoolKind::Large, 4096);
        s.allocated_bytes.apply(PoolKind::Large, -1024);
        s.num_ooms = 3;
        let back = DeviceStats::from_memory_stats(&s.memory_stats());
        assert_eq!(back, s);
        assert_eq!(s.allocated_bytes.all().peak, 4096);
        assert_eq!(s.allocated_bytes.get(StatType::LargePool).freed, 1024);
    }
}
