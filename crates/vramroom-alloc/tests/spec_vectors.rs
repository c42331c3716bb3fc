//! Every measured test vector of shared/spec/pytorch-allocator.md (sections 3-9 and the
//! checklist in 16), run on a `SimDevice`. Numbers are PyTorch 2.11's, measured on an H200.

use std::collections::BTreeMap;

use vramroom_alloc::{
    AllocError, AllocatorConfig, BlockState, CachingAllocator, HistoryMode, SimDevice, TraceAction,
};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// `totalGlobalMem` of the H200 the spec was measured on.
const H200: u64 = 150_109_880_320;

type Alloc = CachingAllocator<SimDevice>;

fn new(conf: &str) -> Alloc {
    new_cap(conf, H200)
}

fn new_cap(conf: &str, capacity: u64) -> Alloc {
    CachingAllocator::new(
        SimDevice::new(capacity),
        AllocatorConfig::parse(conf).expect("config"),
    )
}

fn ok(a: &Alloc) {
    a.check_invariants().expect("invariants");
}

fn st(a: &Alloc, key: &str) -> i64 {
    *a.memory_stats()
        .get(key)
        .unwrap_or_else(|| panic!("no stat {key}"))
}

/// The blocks of the segment holding `ptr`: (offset, size, requested, state).
fn seg_of(a: &Alloc, ptr: u64) -> Vec<(u64, u64, u64, BlockState)> {
    let s = a
        .snapshot()
        .segments
        .into_iter()
        .find(|s| s.address <= ptr && ptr < s.address + s.total_size)
        .expect("segment of ptr");
    s.blocks
        .iter()
        .map(|b| (b.address - s.address, b.size, b.requested_size, b.state))
        .collect()
}

/// (action, size) of every history entry, oldest first.
fn trace(a: &Alloc) -> Vec<(TraceAction, u64)> {
    a.snapshot().device_traces[0]
        .iter()
        .map(|e| (e.action, e.size))
        .collect()
}

fn trace_tail(a: &Alloc, n: usize) -> Vec<(TraceAction, u64)> {
    let t = trace(a);
    t[t.len().saturating_sub(n)..].to_vec()
}

use BlockState::{ActiveAllocated as Allocated, ActivePendingFree as Pending, Inactive};
use TraceAction::*;

// ---- 3.5: rounding, pool choice, segment size, split remainder ---------------------------

#[test]
fn table_3_5_block_pool_segment_remainder() {
    // (n, block size, small pool, segment reserved, split remainder)
    let table: &[(u64, u64, bool, u64, Option<u64>)] = &[
        (1, 512, true, 2 * MIB, Some(2_096_640)),
        (511, 512, true, 2 * MIB, Some(2_096_640)),
        (512, 512, true, 2 * MIB, Some(2_096_640)),
        (513, 1024, true, 2 * MIB, Some(2_096_128)),
        (1000, 1024, true, 2 * MIB, Some(2_096_128)),
        (4096, 4096, true, 2 * MIB, Some(2_093_056)),
        (1_048_575, MIB, true, 2 * MIB, Some(MIB)),
        (1_048_576, MIB, true, 2 * MIB, Some(MIB)),
        (1_048_577, 1_049_088, false, 20 * MIB, Some(19_922_432)),
        (2 * MIB, 2 * MIB, false, 20 * MIB, Some(18_874_368)),
        (5 * MIB, 5 * MIB, false, 20 * MIB, Some(15_728_640)),
        (10 * MIB - 1, 10 * MIB, false, 10 * MIB, None),
        (10 * MIB, 10 * MIB, false, 10 * MIB, None),
        (10 * MIB + 1, 10_486_272, false, 12 * MIB, Some(2_096_640)),
        // 21 MiB: the 1 MiB remainder is not > 1 MiB, so the whole 22 MiB segment is handed out.
        (21 * MIB, 23_068_672, false, 23_068_672, None),
        (
            100 * MIB + 1,
            104_858_112,
            false,
            106_954_752,
            Some(2_096_640),
        ),
    ];
    let a = new("");
    for &(n, block, small, seg, rem) in table {
        a.empty_cache();
        let t = a.malloc(n, 0).unwrap();
        ok(&a);
        assert_eq!(t.size, block, "n={n}");
        assert_eq!(st(&a, "allocated_bytes.all.current"), block as i64, "n={n}");
        assert_eq!(st(&a, "requested_bytes.all.current"), n as i64, "n={n}");
        assert_eq!(st(&a, "reserved_bytes.all.current"), seg as i64, "n={n}");
        assert_eq!(st(&a, "segment.all.current"), 1, "n={n}");
        let (pool, other) = if small {
            ("small_pool", "large_pool")
        } else {
            ("large_pool", "small_pool")
        };
        assert_eq!(
            st(&a, &format!("allocated_bytes.{pool}.current")),
            block as i64
        );
        assert_eq!(
            st(&a, &format!("reserved_bytes.{pool}.current")),
            seg as i64
        );
        assert_eq!(st(&a, &format!("reserved_bytes.{other}.current")), 0);
        let mut want = vec![(0, block, n, Allocated)];
        if let Some(r) = rem {
            want.push((block, r, 0, Inactive));
        }
        assert_eq!(seg_of(&a, t.ptr), want, "n={n}");
        assert_eq!(
            st(&a, "inactive_split.all.current"),
            rem.is_some() as i64,
            "n={n}"
        );
        assert_eq!(
            st(&a, "inactive_split_bytes.all.current"),
            rem.unwrap_or(0) as i64
        );
        a.free(t.ptr).unwrap();
        ok(&a);
    }
}

#[test]
fn three_700_kib_tensors_fill_two_small_segments() {
    let a = new("");
    let ts: Vec<_> = (0..3).map(|_| a.malloc(700 * KIB, 0).unwrap()).collect();
    ok(&a);
    assert_eq!(
        seg_of(&a, ts[0].ptr),
        vec![
            (0, 716_800, 716_800, Allocated),
            (716_800, 716_800, 716_800, Allocated),
            (1_433_600, 663_552, 0, Inactive),
        ]
    );
    assert_eq!(ts[1].ptr, ts[0].ptr + 716_800);
    assert_eq!(
        seg_of(&a, ts[2].ptr),
        vec![
            (0, 716_800, 716_800, Allocated),
            (716_800, 1_380_352, 0, Inactive)
        ]
    );
    assert_eq!(st(&a, "segment.all.current"), 2);
    assert_eq!(st(&a, "reserved_bytes.small_pool.current"), 4 * MIB as i64);
    assert_eq!(st(&a, "allocated_bytes.all.current"), 2_150_400);
    assert_eq!(st(&a, "inactive_split.all.current"), 2);
    assert_eq!(st(&a, "inactive_split_bytes.all.current"), 2_043_904);
}

#[test]
fn one_mib_plus_one_then_19_mib_opens_a_second_segment_unsplit() {
    let a = new("");
    let x = a.malloc(MIB + 1, 0).unwrap();
    let y = a.malloc(19 * MIB, 0).unwrap();
    ok(&a);
    // 19 MiB = 19,922,944 does not fit the 19,922,432-byte remainder.
    assert_eq!(
        seg_of(&a, x.ptr),
        vec![
            (0, 1_049_088, MIB + 1, Allocated),
            (1_049_088, 19_922_432, 0, Inactive)
        ]
    );
    // A new 20 MiB segment, taken whole: the 1 MiB remainder is not > 1 MiB.
    assert_eq!(seg_of(&a, y.ptr), vec![(0, 20 * MIB, 19 * MIB, Allocated)]);
    assert_eq!(st(&a, "allocated_bytes.all.current"), 22_020_608);
    assert_eq!(st(&a, "requested_bytes.all.current"), 20_971_521);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
    assert_eq!(st(&a, "segment.all.current"), 2);
    assert_eq!(st(&a, "inactive_split.all.current"), 1);
    assert_eq!(st(&a, "inactive_split_bytes.all.current"), 19_922_432);
}

// ---- 3.2: roundup_power2_divisions ------------------------------------------------------

#[test]
fn roundup_power2_divisions_measured_results() {
    // (config, [(request, block size, reserved)])
    type Case<'a> = (&'a str, &'a [(u64, u64, u64)]);
    let cases: &[Case] = &[
        (
            "roundup_power2_divisions:4",
            &[
                (700, 1024, 2 * MIB),
                (1200 * KIB, 1_310_720, 20 * MIB),
                (1_228_801, 1_310_720, 20 * MIB),
                (3 * MIB + 1, 3_670_016, 20 * MIB),
                (5 * MIB, 5 * MIB, 20 * MIB),
                (33 * MIB, 40 * MIB, 40 * MIB),
            ],
        ),
        (
            "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
            &[
                (700 * KIB, 716_800, 2 * MIB),
                (100 * MIB + 1, 104_858_112, 106_954_752),
                (300 * MIB + 1, 314_573_312, 316_669_952),
                (600 * MIB + 1, 768 * MIB, 768 * MIB),
                (1_395_864_371, 1536 * MIB, 1536 * MIB),
                (2_254_857_830, 2304 * MIB, 2304 * MIB),
            ],
        ),
    ];
    for (conf, sizes) in cases {
        // Both through the config at creation and through `_set_allocator_settings`.
        for runtime in [false, true] {
            let a = if runtime {
                let a = new("");
                a.set_allocator_settings(conf).unwrap();
                a
            } else {
                new(conf)
            };
            for &(n, block, reserved) in *sizes {
                a.empty_cache();
                let t = a.malloc(n, 0).unwrap();
                ok(&a);
                assert_eq!(t.size, block, "{conf} n={n}");
                assert_eq!(
                    st(&a, "reserved_bytes.all.current"),
                    reserved as i64,
                    "{conf} n={n}"
                );
                a.free(t.ptr).unwrap();
            }
        }
    }
    // The measured table for the list form: entry B governs [B, 2B) MiB.
    let a = new("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
    let d = a.snapshot().allocator_settings.roundup_power2_divisions;
    let want: BTreeMap<String, i64> = (0..16)
        .map(|i| {
            let b = 1i64 << i;
            let v = match b {
                ..=256 => 1,
                512 => 2,
                1024 => 4,
                _ => 8,
            };
            (b.to_string(), v)
        })
        .collect();
    assert_eq!(d, want);
}

// ---- 5.2 / 5.3: oversize blocks with max_split_size_mb ------------------------------------

#[test]
fn oversize_reuse_with_max_split_size_mb_64() {
    let a = new("");
    a.set_allocator_settings("max_split_size_mb:64").unwrap();
    // The stat is captured at allocator creation and is not updated at runtime.
    assert_eq!(st(&a, "max_split_size"), -1);
    let x = a.malloc(100 * MIB, 0).unwrap();
    let px = x.ptr;
    assert_eq!(seg_of(&a, px), vec![(0, 100 * MIB, 100 * MIB, Allocated)]);
    a.free(px).unwrap();
    assert_eq!(st(&a, "oversize_segments.current"), 1);
    assert_eq!(st(&a, "oversize_allocations.current"), 0);

    // 90 and 81 MiB: 100 < s + 20, reuse the 100 MiB block unsplit.
    for n in [90, 81] {
        let y = a.malloc(n * MIB, 0).unwrap();
        ok(&a);
        assert_eq!(y.ptr, px, "{n} MiB reuses the cached 100 MiB block");
        assert_eq!(y.size, 100 * MIB);
        assert_eq!(st(&a, "allocated_bytes.all.current"), 100 * MIB as i64);
        assert_eq!(st(&a, "requested_bytes.all.current"), (n * MIB) as i64);
        assert_eq!(st(&a, "segment.all.current"), 1);
        assert_eq!(st(&a, "oversize_allocations.current"), 1);
        assert_eq!(st(&a, "inactive_split.all.current"), 0);
        a.free(y.ptr).unwrap();
    }
    // 80 MiB: 100 >= 80 + 20, a miss: a new 80 MiB segment.
    let y = a.malloc(80 * MIB, 0).unwrap();
    assert_ne!(y.ptr, px);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 180 * MIB as i64);
    assert_eq!(st(&a, "segment.all.current"), 2);
    assert_eq!(st(&a, "oversize_segments.current"), 2);
    assert_eq!(st(&a, "oversize_allocations.current"), 1);
    let p80 = y.ptr;
    a.free(y.ptr).unwrap();
    // 70 MiB takes the cached 80 MiB block (best fit), not the 100.
    let y = a.malloc(70 * MIB, 0).unwrap();
    assert_eq!(y.ptr, p80);
    assert_eq!(st(&a, "allocated_bytes.all.current"), 80 * MIB as i64);
    assert_eq!(st(&a, "requested_bytes.all.current"), 70 * MIB as i64);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 180 * MIB as i64);
    a.free(y.ptr).unwrap();
    // 50 MiB < M: oversize blocks are off limits, so a new 50 MiB segment.
    let y = a.malloc(50 * MIB, 0).unwrap();
    assert!(y.ptr != px && y.ptr != p80);
    assert_eq!(seg_of(&a, y.ptr), vec![(0, 50 * MIB, 50 * MIB, Allocated)]);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 230 * MIB as i64);
    assert_eq!(st(&a, "segment.all.current"), 3);
    assert_eq!(st(&a, "oversize_allocations.current"), 0);
    assert_eq!(st(&a, "oversize_segments.current"), 2);
    ok(&a);
}

#[test]
fn large_pool_splits_only_when_remainder_exceeds_one_mib() {
    let a = new("");
    // 19 MiB in a fresh 20 MiB segment: remainder exactly 1 MiB, not split.
    let x = a.malloc(19 * MIB, 0).unwrap();
    assert_eq!(x.size, 20 * MIB);
    // 19 MiB - 512 B: remainder 1 MiB + 512 > 1 MiB, split.
    let y = a.malloc(19 * MIB - 512, 0).unwrap();
    assert_eq!(y.size, 19 * MIB - 512);
    assert_eq!(
        st(&a, "inactive_split_bytes.all.current"),
        (MIB + 512) as i64
    );
    ok(&a);
}

#[test]
fn small_pool_splits_down_to_512_bytes() {
    let a = new("");
    let x = a.malloc(MIB, 0).unwrap();
    let y = a.malloc(MIB - 512, 0).unwrap();
    assert_eq!(y.ptr, x.ptr + MIB);
    assert_eq!(
        seg_of(&a, x.ptr),
        vec![
            (0, MIB, MIB, Allocated),
            (MIB, MIB - 512, MIB - 512, Allocated),
            (2 * MIB - 512, 512, 0, Inactive)
        ]
    );
    let z = a.malloc(1, 0).unwrap();
    assert_eq!(z.ptr, x.ptr + 2 * MIB - 512);
    assert_eq!(st(&a, "inactive_split.all.current"), 0);
    assert_eq!(st(&a, "inactive_split_bytes.all.current"), 0);
    ok(&a);
}

// ---- 6.2: inactive_split and coalescing --------------------------------------------------

#[test]
fn inactive_split_sequence() {
    let a = new("");
    let x = a.malloc(3 * MIB, 0).unwrap();
    let y = a.malloc(3 * MIB, 0).unwrap();
    let z = a.malloc(3 * MIB, 0).unwrap();
    assert_eq!([y.ptr - x.ptr, z.ptr - x.ptr], [3 * MIB, 6 * MIB]);
    let split = |a: &Alloc| {
        (
            st(a, "inactive_split.all.current"),
            st(a, "inactive_split_bytes.all.current"),
        )
    };
    assert_eq!(split(&a), (1, 11_534_336));
    a.free(y.ptr).unwrap();
    ok(&a);
    assert_eq!(split(&a), (2, 14_680_064));
    a.free(x.ptr).unwrap();
    ok(&a);
    assert_eq!(split(&a), (2, 17_825_792));
    assert_eq!(
        seg_of(&a, z.ptr),
        vec![
            (0, 6 * MIB, 3 * MIB, Inactive),
            (6 * MIB, 3 * MIB, 3 * MIB, Allocated),
            (9 * MIB, 11_534_336, 0, Inactive)
        ]
    );
    // Best fit: a 2 MiB request takes the 6 MiB hole at offset 0, not the 11 MiB tail.
    let d = a.malloc(2 * MIB, 0).unwrap();
    assert_eq!(d.ptr, x.ptr);
    assert_eq!(
        seg_of(&a, x.ptr),
        vec![
            (0, 2 * MIB, 2 * MIB, Allocated),
            (2 * MIB, 4 * MIB, 3 * MIB, Inactive),
            (6 * MIB, 3 * MIB, 3 * MIB, Allocated),
            (9 * MIB, 11_534_336, 0, Inactive)
        ]
    );
    a.free(z.ptr).unwrap();
    a.free(d.ptr).unwrap();
    ok(&a);
    assert_eq!(split(&a), (0, 0));
    // One free block of 20 MiB, with the stale requested size of the block object that
    // survived the merges.
    assert_eq!(seg_of(&a, x.ptr), vec![(0, 20 * MIB, 2 * MIB, Inactive)]);
    assert_eq!(st(&a, "segment.all.current"), 1);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 20 * MIB as i64);
}

#[test]
fn best_fit_ties_break_by_lowest_address() {
    let a = new("");
    // Three 20 MiB segments, each holding one 4 MiB hole; the middle one freed first.
    let mut holes = Vec::new();
    let mut keep = Vec::new();
    for _ in 0..3 {
        let h = a.malloc(4 * MIB, 0).unwrap();
        keep.push(a.malloc(16 * MIB, 0).unwrap());
        holes.push(h);
    }
    for i in [1, 2, 0] {
        a.free(holes[i].ptr).unwrap();
    }
    let t = a.malloc(4 * MIB, 0).unwrap();
    let lowest = holes.iter().map(|h| h.ptr).min().unwrap();
    assert_eq!(t.ptr, lowest);
    ok(&a);
}

// ---- 6.1 / 6.3: record_stream and pending frees -------------------------------------------

const SIDE: u64 = 0x5eed;

#[test]
fn pending_free_accounting_and_reuse_after_event() {
    let a = new("");
    a.record_memory_history(HistoryMode::All, 1000);
    a.with_device(|d| d.hold_stream(SIDE));
    let x = a.malloc(4 * MIB, 0).unwrap();
    a.record_stream(x.ptr, SIDE).unwrap();
    a.record_stream(x.ptr, 0).unwrap(); // the allocation stream itself: ignored
    a.free(x.ptr).unwrap();
    ok(&a);
    // Measured: allocation 0, active 1, requested stays, allocated 0.
    assert_eq!(st(&a, "allocation.all.current"), 0);
    assert_eq!(st(&a, "allocated_bytes.all.current"), 0);
    assert_eq!(st(&a, "active.all.current"), 1);
    assert_eq!(st(&a, "active_bytes.all.current"), 4 * MIB as i64);
    assert_eq!(st(&a, "requested_bytes.all.current"), 4 * MIB as i64);
    assert_eq!(st(&a, "inactive_split.all.current"), 1);
    assert_eq!(st(&a, "inactive_split_bytes.all.current"), 16 * MIB as i64);
    assert_eq!(
        seg_of(&a, x.ptr),
        vec![
            (0, 4 * MIB, 4 * MIB, Pending),
            (4 * MIB, 16 * MIB, 0, Inactive)
        ]
    );
    let seg = a.snapshot().segments.remove(0);
    assert_eq!(
        (seg.allocated_size, seg.active_size, seg.requested_size),
        (0, 4 * MIB, 4 * MIB)
    );
    assert!(!trace(&a).iter().any(|e| e.0 == FreeCompleted));

    // While the side stream's work is outstanding the block is not reused.
    let y = a.malloc(4 * MIB, 0).unwrap();
    assert_eq!(y.ptr, x.ptr + 4 * MIB);
    ok(&a);
    // The event completes, but nothing processes it until the next malloc.
    a.with_device(|d| d.release_stream(SIDE));
    assert_eq!(st(&a, "active.all.current"), 2);
    assert_eq!(seg_of(&a, x.ptr)[0].3, Pending);
    // The next malloc processes the event first, then finds the block.
    let z = a.malloc(4 * MIB, 0).unwrap();
    assert_eq!(z.ptr, x.ptr);
    ok(&a);
    // The snapshots taken above add `snapshot` entries; the rest is PyTorch's order.
    let acts: Vec<_> = trace(&a)
        .into_iter()
        .map(|e| e.0)
        .filter(|&x| x != Snapshot)
        .collect();
    assert_eq!(
        acts,
        vec![
            SegmentAlloc,
            Alloc,
            FreeRequested,
            Alloc,
            FreeCompleted,
            Alloc
        ]
    );
    assert_eq!(st(&a, "active.all.current"), 2);
    assert_eq!(st(&a, "allocation.all.current"), 2);
    assert_eq!(st(&a, "requested_bytes.all.current"), 8 * MIB as i64);
    a.free(y.ptr).unwrap();
    a.free(z.ptr).unwrap();
    ok(&a);
}

#[test]
fn pending_free_waits_for_every_recorded_stream() {
    let a = new("");
    let (s1, s2) = (11, 12);
    a.with_device(|d| {
        d.hold_stream(s1);
        d.hold_stream(s2)
    });
    let x = a.malloc(1000, 0).unwrap();
    a.record_stream(x.ptr, s1).unwrap();
    a.record_stream(x.ptr, s2).unwrap();
    a.free(x.ptr).unwrap();
    a.with_device(|d| d.release_stream(s1));
    let y = a.malloc(1000, 0).unwrap();
    assert_ne!(y.ptr, x.ptr, "one stream still pending");
    assert_eq!(seg_of(&a, x.ptr)[0].3, Pending);
    a.with_device(|d| d.release_stream(s2));
    a.free(y.ptr).unwrap();
    let z = a.malloc(1000, 0).unwrap();
    assert_eq!(z.ptr, x.ptr);
    ok(&a);
}

#[test]
fn empty_cache_waits_for_pending_frees() {
    let a = new("");
    a.with_device(|d| d.hold_stream(SIDE));
    let x = a.malloc(4 * MIB, 0).unwrap();
    a.record_stream(x.ptr, SIDE).unwrap();
    a.free(x.ptr).unwrap();
    let sync0 = st(&a, "num_sync_all_streams");
    a.empty_cache();
    ok(&a);
    assert_eq!(st(&a, "num_sync_all_streams"), sync0 + 1);
    assert_eq!(st(&a, "active.all.current"), 0);
    assert_eq!(st(&a, "requested_bytes.all.current"), 0);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(st(&a, "segment.all.current"), 0);
}

#[test]
fn cached_memory_never_crosses_streams() {
    let a = new("");
    const S2: u64 = 931_058_640;
    let x = a.malloc(4 * MIB, S2).unwrap();
    a.free(x.ptr).unwrap();
    let y = a.malloc(4 * MIB, 0).unwrap();
    assert_ne!(y.ptr, x.ptr);
    assert_eq!(st(&a, "segment.all.current"), 2);
    let streams: Vec<_> = a
        .snapshot()
        .segments
        .iter()
        .map(|s| (s.stream, s.total_size))
        .collect();
    assert_eq!(streams, vec![(S2, 20 * MIB), (0, 20 * MIB)]);
    // Not even a small request fits into the other stream's free 20 MiB block.
    let z = a.malloc(2 * MIB, 0).unwrap();
    assert!(z.ptr > y.ptr && z.ptr < y.ptr + 20 * MIB);
    // A pending block whose event completed is reused only by its own stream.
    a.with_device(|d| d.hold_stream(SIDE));
    let w = a.malloc(4 * MIB, S2).unwrap();
    a.record_stream(w.ptr, SIDE).unwrap();
    a.free(w.ptr).unwrap();
    a.with_device(|d| d.release_stream(SIDE));
    let v = a.malloc(4 * MIB, SIDE).unwrap();
    assert_eq!(st(&a, "segment.all.current"), 3);
    assert_ne!(v.ptr, w.ptr);
    let u = a.malloc(4 * MIB, S2).unwrap();
    assert_eq!(u.ptr, w.ptr);
    ok(&a);
}

// ---- 7.2: empty_cache --------------------------------------------------------------------

#[test]
fn empty_cache_releases_only_whole_free_segments() {
    let a = new("");
    let (free0, total) = a.mem_get_info();
    assert_eq!(total, H200);
    let keep = a.malloc(3 * MIB, 0).unwrap();
    let t2 = a.malloc(40 * MIB, 0).unwrap();
    let sm = a.malloc(1000, 0).unwrap();
    a.free(t2.ptr).unwrap();
    assert_eq!(st(&a, "reserved_bytes.all.current"), 65_011_712);
    assert_eq!(st(&a, "segment.all.current"), 3);
    assert_eq!(st(&a, "inactive_split.all.current"), 2);
    assert_eq!(st(&a, "inactive_split_bytes.all.current"), 19_921_920);
    let free1 = a.mem_get_info().0;
    assert_eq!(free0 - free1, 65_011_712);
    let (nfree, nsync) = (st(&a, "num_device_free"), st(&a, "num_sync_all_streams"));
    a.empty_cache();
    ok(&a);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 23_068_672);
    assert_eq!(st(&a, "reserved_bytes.large_pool.current"), 20 * MIB as i64);
    assert_eq!(st(&a, "reserved_bytes.small_pool.current"), 2 * MIB as i64);
    assert_eq!(st(&a, "segment.all.current"), 2);
    assert_eq!(st(&a, "num_device_free"), nfree + 1);
    assert_eq!(st(&a, "num_sync_all_streams"), nsync + 1);
    assert_eq!(a.mem_get_info().0 - free1, 41_943_040);
    // The segments still in use keep their free parts.
    assert_eq!(st(&a, "inactive_split_bytes.all.current"), 19_921_920);
    a.free(keep.ptr).unwrap();
    a.free(sm.ptr).unwrap();
    a.empty_cache();
    ok(&a);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(st(&a, "num_device_free"), nfree + 3);
    assert_eq!(st(&a, "num_sync_all_streams"), nsync + 2);
    assert_eq!(a.mem_get_info().0, free0);
    // caching_allocator_alloc(1000) / delete
    let p = a.malloc(1000, 0).unwrap();
    assert_eq!(st(&a, "allocated_bytes.small_pool.current"), 1024);
    assert_eq!(st(&a, "inactive_split_bytes.all.current"), 2_096_128);
    a.free(p.ptr).unwrap();
    assert_eq!(st(&a, "reserved_bytes.all.current"), 2 * MIB as i64);
    assert_eq!(st(&a, "inactive_split.all.current"), 0);
}

// ---- 7.3: release_available_cached_blocks ------------------------------------------------

#[test]
fn release_available_cached_blocks_trace() {
    // A device of 1000 MiB with fraction 0.25: 250 MiB allowed.
    let a = new_cap("", 1000 * MIB);
    a.set_allocator_settings("max_split_size_mb:64").unwrap();
    let xs: Vec<_> = (0..2).map(|_| a.malloc(100 * MIB, 0).unwrap()).collect();
    for x in &xs {
        a.free(x.ptr).unwrap();
    }
    a.record_memory_history(HistoryMode::All, 10_000);
    a.set_per_process_memory_fraction(0.25).unwrap();
    assert_eq!(a.get_per_process_memory_fraction(), 0.25);
    let before = a.memory_stats();
    let z = a.malloc(120 * MIB, 0).unwrap();
    ok(&a);
    assert_eq!(
        trace(&a),
        vec![
            (SegmentFree, 104_857_600),
            (SegmentFree, 104_857_600),
            (SegmentAlloc, 125_829_120),
            (Alloc, 125_829_120)
        ]
    );
    let after = a.memory_stats();
    for k in ["num_alloc_retries", "num_sync_all_streams", "num_ooms"] {
        assert_eq!(before[k], after[k], "{k} unchanged");
    }
    assert_eq!(after["reserved_bytes.all.current"], 125_829_120);
    assert_eq!(after["segment.all.current"], 1);
    assert_eq!(after["oversize_segments.current"], 1);
    assert_eq!(after["oversize_allocations.current"], 1);
    assert_eq!(after["num_device_free"] - before["num_device_free"], 2);
    assert_eq!(after["num_device_alloc"] - before["num_device_alloc"], 1);
    a.free(z.ptr).unwrap();
}

#[test]
fn release_available_frees_one_big_enough_block() {
    let a = new_cap("max_split_size_mb:64", 1000 * MIB);
    let x = a.malloc(100 * MIB, 0).unwrap();
    let y = a.malloc(200 * MIB, 0).unwrap();
    a.free(x.ptr).unwrap();
    a.free(y.ptr).unwrap();
    a.record_memory_history(HistoryMode::All, 100);
    a.set_per_process_memory_fraction(0.35).unwrap(); // 350 MiB
                                                      // 150 MiB: the smallest cached block >= 150 MiB (the 200) goes; the 100 stays.
    let z = a.malloc(150 * MIB, 0).unwrap();
    assert_eq!(
        trace(&a),
        vec![
            (SegmentFree, 200 * MIB),
            (SegmentAlloc, 150 * MIB),
            (Alloc, 150 * MIB)
        ]
    );
    assert_eq!(st(&a, "reserved_bytes.all.current"), 250 * MIB as i64);
    assert_eq!(st(&a, "num_alloc_retries"), 0);
    a.free(z.ptr).unwrap();
    ok(&a);
}

// ---- 7.4: garbage collection -------------------------------------------------------------

#[test]
fn garbage_collection_frees_old_segments_before_growing() {
    // 4 GiB device, fraction 0.25: 1 GiB allowed; threshold 0.5 → GC above 512 MiB.
    let a = new_cap("", 4 * GIB);
    a.record_memory_history(HistoryMode::All, 10_000);
    a.set_allocator_settings("garbage_collection_threshold:0.5")
        .unwrap();
    a.set_per_process_memory_fraction(0.25).unwrap();
    let xs: Vec<_> = (0..3).map(|_| a.malloc(200 * MIB, 0).unwrap()).collect();
    for x in &xs {
        a.free(x.ptr).unwrap();
    }
    assert_eq!(st(&a, "reserved_bytes.all.current"), 600 * MIB as i64);
    assert_eq!(st(&a, "segment.all.current"), 3);
    let before = a.memory_stats();
    let y = a.malloc(300 * MIB, 0).unwrap();
    ok(&a);
    assert_eq!(
        trace_tail(&a, 8),
        vec![
            (FreeCompleted, 200 * MIB),
            (FreeRequested, 200 * MIB),
            (FreeCompleted, 200 * MIB),
            (SegmentFree, 200 * MIB),
            (SegmentFree, 200 * MIB),
            (SegmentFree, 200 * MIB),
            (SegmentAlloc, 300 * MIB),
            (Alloc, 300 * MIB)
        ]
    );
    let after = a.memory_stats();
    assert_eq!(after["reserved_bytes.all.current"], 300 * MIB as i64);
    assert_eq!(after["segment.all.current"], 1);
    assert_eq!(after["num_device_free"] - before["num_device_free"], 3);
    // GC does not synchronise and is not a retry.
    assert_eq!(
        after["num_sync_all_streams"],
        before["num_sync_all_streams"]
    );
    assert_eq!(after["num_alloc_retries"], before["num_alloc_retries"]);
    a.free(y.ptr).unwrap();
}

#[test]
fn garbage_collection_needs_a_memory_fraction() {
    let a = new_cap("garbage_collection_threshold:0.6", 4 * GIB);
    let xs: Vec<_> = (0..3).map(|_| a.malloc(200 * MIB, 0).unwrap()).collect();
    for x in &xs {
        a.free(x.ptr).unwrap();
    }
    let y = a.malloc(300 * MIB, 0).unwrap();
    assert_eq!(st(&a, "reserved_bytes.all.current"), 900 * MIB as i64);
    assert_eq!(st(&a, "num_device_free"), 0);
    a.free(y.ptr).unwrap();
    ok(&a);
}

// ---- 8: expandable segments --------------------------------------------------------------

#[test]
fn expandable_segments_measured_sequence() {
    let a = new("");
    a.record_memory_history(HistoryMode::All, 100_000);
    a.set_allocator_settings("expandable_segments:True")
        .unwrap();
    let x = a.malloc(MIB + 1, 0).unwrap();
    assert_eq!(st(&a, "reserved_bytes.all.current"), 20 * MIB as i64);
    assert_eq!(st(&a, "allocated_bytes.all.current"), 1_049_088);
    assert_eq!(st(&a, "num_device_alloc"), 1);
    let y = a.malloc(30 * MIB, 0).unwrap();
    // Placed right after x by mapping one more 20 MiB page.
    assert_eq!(y.ptr - x.ptr, 1_049_088);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
    assert_eq!(st(&a, "allocated_bytes.all.current"), 32_506_368);
    assert_eq!(st(&a, "num_device_alloc"), 2);
    let c = a.malloc(100 * KIB, 0).unwrap();
    assert_eq!(st(&a, "reserved_bytes.small_pool.current"), 2 * MIB as i64);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 44_040_192);
    assert_eq!(st(&a, "num_device_alloc"), 3);
    ok(&a);
    let segs = a.snapshot().segments;
    assert_eq!(segs.len(), 2);
    let l = &segs[0];
    assert!(l.is_expandable && l.segment_type == "large");
    assert_eq!(
        (l.total_size, l.allocated_size, l.requested_size),
        (41_943_040, 32_506_368, 32_505_857)
    );
    let blocks: Vec<_> = l
        .blocks
        .iter()
        .map(|b| (b.address - l.address, b.size, b.requested_size, b.state))
        .collect();
    assert_eq!(
        blocks,
        vec![
            (0, 1_049_088, MIB + 1, Allocated),
            (1_049_088, 30 * MIB, 30 * MIB, Allocated),
            (32_506_368, 9_436_672, 0, Inactive)
        ]
    );
    let s = &segs[1];
    assert!(s.is_expandable && s.segment_type == "small");
    assert_eq!(s.total_size, 2 * MIB);
    assert_eq!(s.address, c.ptr);
    // Freeing x leaves a free front in the large segment; a 512 KiB request is small-pool.
    a.free(x.ptr).unwrap();
    let d = a.malloc(512 * KIB + 7, 0).unwrap();
    assert_eq!(d.ptr, c.ptr + 102_400);
    a.free(y.ptr).unwrap();
    a.free(c.ptr).unwrap();
    a.free(d.ptr).unwrap();
    ok(&a);
    let nfree = st(&a, "num_device_free");
    a.empty_cache();
    ok(&a);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(st(&a, "num_device_free"), nfree + 2);
    // segment.* and inactive_split* are never touched by expandable memory.
    for k in ["segment", "inactive_split", "inactive_split_bytes"] {
        for f in ["allocated", "current", "freed", "peak"] {
            assert_eq!(st(&a, &format!("{k}.all.{f}")), 0, "{k}.all.{f}");
        }
    }
    let t = a.snapshot().device_traces.remove(0);
    let maps: Vec<_> = t
        .iter()
        .filter(|e| matches!(e.action, SegmentMap | SegmentUnmap))
        .map(|e| (e.action, e.size, e.addr))
        .collect();
    assert_eq!(
        maps,
        vec![
            (SegmentMap, 20 * MIB, x.ptr),
            (SegmentMap, 20 * MIB, x.ptr + 20 * MIB),
            (SegmentMap, 2 * MIB, c.ptr),
            (SegmentUnmap, 41_943_040, x.ptr),
            (SegmentUnmap, 2 * MIB, c.ptr)
        ]
    );
    assert!(a.snapshot().segments.is_empty());
}

#[test]
fn expandable_segments_grow_in_place_and_split_to_512() {
    let a = new("expandable_segments:True");
    // 25 MiB needs two 20 MiB pages; the tail stays free and is split off to 512 B.
    let x = a.malloc(25 * MIB, 0).unwrap();
    assert_eq!(x.size, 25 * MIB);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
    let y = a.malloc(15 * MIB - 512, 0).unwrap();
    assert_eq!(y.ptr, x.ptr + 25 * MIB);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
    let z = a.malloc(1, 0).unwrap();
    assert_eq!(st(&a, "reserved_bytes.small_pool.current"), 2 * MIB as i64);
    // Free a page-sized hole in the middle: empty_cache gives its whole pages back.
    a.free(x.ptr).unwrap();
    a.empty_cache();
    ok(&a);
    // x covered [0, 25 MiB): page 0 is whole; page 1 is shared with y.
    assert_eq!(st(&a, "reserved_bytes.large_pool.current"), 20 * MIB as i64);
    a.free(y.ptr).unwrap();
    a.free(z.ptr).unwrap();
    a.empty_cache();
    ok(&a);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(a.with_device(|d| d.used()), 0);
}

// ---- 5.6: out of memory ------------------------------------------------------------------

const DOCS: &str = "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)";

fn oom_message(e: AllocError) -> String {
    assert!(e.is_oom(), "{e:?}");
    e.to_string()
}

#[test]
fn oom_message_and_counters() {
    let a = new("");
    // The probe's device had 149,557,477,376 bytes free with nothing reserved.
    a.with_device(|d| d.set_external_usage(H200 - 149_557_477_376));
    a.record_memory_history(HistoryMode::All, 1000);
    let live = a.malloc(3 * MIB, 0).unwrap();
    a.free(live.ptr).unwrap();
    a.empty_cache();
    let before = a.memory_stats();
    let e = a.malloc(200 * GIB, 0).unwrap_err();
    let oom = e.as_oom().unwrap().clone();
    assert_eq!(oom.alloc_size, 200 * GIB);
    // NVML's "Including non-PyTorch memory, this process has … in use. " is empty on a
    // device that does not report per-process usage.
    assert_eq!(
        oom_message(e),
        format!("CUDA out of memory. Tried to allocate 200.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 139.29 GiB is free. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. {DOCS}")
    );
    let after = a.memory_stats();
    for (k, v) in &before {
        let d = after[k] - v;
        let want = match k.as_str() {
            "num_ooms" | "num_alloc_retries" | "num_sync_all_streams" => 1,
            _ => 0,
        };
        assert_eq!(d, want, "{k}");
    }
    let t = a.snapshot().device_traces.remove(0);
    let last = t.last().unwrap();
    assert_eq!(last.action, Oom);
    assert_eq!(last.addr, 149_557_477_376, "device_free");
    assert_eq!(last.size, 200 * GIB);
    ok(&a);
}

#[test]
fn oom_leaves_live_state_intact() {
    let a = new_cap("", 100 * MIB);
    let live = a.malloc(30 * MIB, 0).unwrap();
    let small = a.malloc(5000, 0).unwrap();
    let cached = a.malloc(40 * MIB, 0).unwrap();
    a.free(cached.ptr).unwrap();
    // The retry after flushing the cache succeeds: one retry, one sync, no OOM.
    let b = a.malloc(50 * MIB, 0).unwrap();
    assert_eq!(st(&a, "num_alloc_retries"), 1);
    assert_eq!(st(&a, "num_sync_all_streams"), 1);
    assert_eq!(st(&a, "num_ooms"), 0);
    ok(&a);
    let before = a.memory_stats();
    let snap = a.snapshot().segments;
    let e = a.malloc(50 * MIB, 0).unwrap_err();
    assert!(e.is_oom());
    ok(&a);
    let after = a.memory_stats();
    for (k, v) in &before {
        let want = match k.as_str() {
            "num_ooms" | "num_alloc_retries" | "num_sync_all_streams" => v + 1,
            _ => *v,
        };
        assert_eq!(after[k], want, "{k}");
    }
    assert_eq!(a.snapshot().segments, snap);
    // Reserved-but-unallocated memory is named in the message.
    let msg = e.to_string();
    assert!(msg.starts_with("CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 100.00 MiB of which 18.00 MiB is free. Of the allocated memory 80.00 MiB is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated. "), "{msg}");
    for p in [live.ptr, small.ptr, b.ptr] {
        a.free(p).unwrap();
    }
    a.empty_cache();
    ok(&a);
    assert_eq!(a.memory_reserved(), 0);
}

#[test]
fn oom_reports_the_segment_size_tried() {
    let a = new("");
    for (n, tried) in [
        (4096, "2.00 MiB"),
        (3 * MIB, "20.00 MiB"),
        (21 * MIB, "22.00 MiB"),
    ] {
        // First attempt and the retry after flushing the cache both fail.
        a.with_device(|d| d.fail_next_allocations(2));
        let msg = a.malloc(n, 0).unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!("CUDA out of memory. Tried to allocate {tried}. ")),
            "{msg}"
        );
        ok(&a);
    }
    assert_eq!(st(&a, "num_ooms"), 3);
    assert_eq!(st(&a, "num_alloc_retries"), 3);
    assert_eq!(st(&a, "num_sync_all_streams"), 3);
    assert_eq!(a.memory_reserved(), 0);
}

#[test]
fn oom_with_memory_fraction_names_the_limit() {
    let a = new("");
    a.with_device(|d| d.set_external_usage(H200 - 149_557_477_376));
    let keep = a.malloc(64 * MIB, 0).unwrap();
    a.set_per_process_memory_fraction(0.01).unwrap();
    assert_eq!(a.get_per_process_memory_fraction(), 0.009999999998667642);
    let e = a.malloc(5 * GIB, 0).unwrap_err();
    assert_eq!(
        oom_message(e),
        format!("CUDA out of memory. Tried to allocate 5.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 139.22 GiB is free. 1.40 GiB allowed; Of the allocated memory 64.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. {DOCS}")
    );
    a.set_per_process_memory_fraction(1.0).unwrap();
    assert_eq!(a.get_per_process_memory_fraction(), 1.0);
    a.free(keep.ptr).unwrap();
    ok(&a);
}

#[test]
fn one_exabyte_guard_touches_nothing() {
    let a = new("");
    a.record_memory_history(HistoryMode::All, 1000);
    let x = a.malloc(5000, 0).unwrap();
    let before = a.memory_stats();
    let n_trace = a.snapshot().device_traces[0].len();
    for n in [1u64 << 60, 1 << 61, u64::MAX] {
        let e = a.malloc(n, 0).unwrap_err();
        assert!(e.is_oom());
        assert_eq!(
            e.to_string(),
            "CUDA out of memory. Tried to allocate more than 1EB memory."
        );
    }
    assert_eq!(a.memory_stats(), before);
    // +1 for the snapshot entry of the snapshot taken above, nothing else.
    let t = a.snapshot().device_traces.remove(0);
    assert_eq!(t.len(), n_trace + 1);
    assert_eq!(t.last().unwrap().action, Snapshot);
    // Just below the guard is an ordinary OOM.
    let e = a.malloc((1 << 60) - 1, 0).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("CUDA out of memory. Tried to allocate 1073741824.00 GiB. "),
        "{e}"
    );
    assert_eq!(st(&a, "num_ooms"), 1);
    a.free(x.ptr).unwrap();
    ok(&a);
}

// ---- 9 and 10.1: memory fraction and runtime settings ------------------------------------

#[test]
fn memory_fraction_limits_reserved_not_allocated() {
    let a = new_cap("", 1000 * MIB);
    a.set_per_process_memory_fraction(0.1).unwrap(); // 100 MiB
    let x = a.malloc(60 * MIB, 0).unwrap();
    // 60 + 40 = 100 is not above the limit.
    let y = a.malloc(40 * MIB, 0).unwrap();
    ok(&a);
    // A 1 KiB request needs a new 2 MiB small segment: over the limit.
    assert!(a.malloc(1024, 0).unwrap_err().is_oom());
    a.free(y.ptr).unwrap();
    // The cached 40 MiB segment is freed by the last-resort flush, then 2 MiB fits.
    let z = a.malloc(1024, 0).unwrap();
    assert_eq!(st(&a, "reserved_bytes.all.current"), 62 * MIB as i64);
    a.free(x.ptr).unwrap();
    a.free(z.ptr).unwrap();
    ok(&a);
    assert!(a.set_per_process_memory_fraction(1.5).is_err());
}

#[test]
fn zero_byte_requests_and_null_frees() {
    let a = new("");
    let z = a.malloc(0, 0).unwrap();
    assert_eq!((z.ptr, z.size), (0, 0));
    a.free(0).unwrap();
    a.record_stream(0, 3).unwrap();
    assert_eq!(a.memory_stats()["allocation.all.allocated"], 0);
    assert_eq!(a.memory_stats()["num_device_alloc"], 0);
    let e = a.free(0x1234).unwrap_err();
    assert!(matches!(e, AllocError::InvalidPointer(0x1234)));
    ok(&a);
}

#[test]
fn expandable_best_fit_prefers_blocks_that_cannot_grow() {
    let a = new("expandable_segments:True");
    let x = a.malloc(10 * MIB, 0).unwrap();
    let y = a.malloc(5 * MIB, 0).unwrap();
    let z = a.malloc(3 * MIB, 0).unwrap();
    assert_eq!([y.ptr - x.ptr, z.ptr - x.ptr], [10 * MIB, 15 * MIB]);
    // Free blocks now: a 10 MiB hole at 0 and the 2 MiB tail before the unmapped rest.
    a.free(x.ptr).unwrap();
    // By size the tail fits best, but it can grow into the unmapped range, so its
    // "expandable size" is huge: the hole is preferred.
    let w = a.malloc(2 * MIB, 0).unwrap();
    assert_eq!(w.ptr, x.ptr);
    ok(&a);
}

#[test]
fn expandable_blocks_are_skipped_once_the_option_is_off() {
    let a = new("expandable_segments:True");
    let x = a.malloc(3 * MIB, 0).unwrap();
    a.free(x.ptr).unwrap();
    assert_eq!(st(&a, "reserved_bytes.all.current"), 20 * MIB as i64);
    a.set_allocator_settings("expandable_segments:False")
        .unwrap();
    // The cached expandable page is not used: a cudaMalloc'd segment instead.
    let y = a.malloc(3 * MIB, 0).unwrap();
    assert_ne!(y.ptr, x.ptr);
    assert_eq!(st(&a, "segment.all.current"), 1);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
    let segs = a.snapshot().segments;
    assert_eq!(
        segs.iter().map(|s| s.is_expandable).collect::<Vec<_>>(),
        vec![true, false]
    );
    // Switched back on, both 20 MiB blocks are candidates; the expandable one counts as
    // its growable size, so best fit moves on to the ordinary block.
    a.free(y.ptr).unwrap();
    a.set_allocator_settings("expandable_segments:True")
        .unwrap();
    let z = a.malloc(3 * MIB, 0).unwrap();
    assert_eq!(z.ptr, y.ptr);
    ok(&a);
    a.free(z.ptr).unwrap();
    a.empty_cache();
    ok(&a);
    assert_eq!(a.memory_reserved(), 0);
}

#[test]
fn expandable_mode_splits_cached_ordinary_blocks_down_to_512() {
    let a = new("");
    let x = a.malloc(3 * MIB, 0).unwrap();
    a.free(x.ptr).unwrap();
    a.set_allocator_settings("expandable_segments:True")
        .unwrap();
    // The 20 MiB ordinary segment is found; with the option on, a remainder of
    // 1 MiB - 512 is split off (the large-pool rule would need > 1 MiB).
    let y = a.malloc(19 * MIB + 512, 0).unwrap();
    assert_eq!(y.ptr, x.ptr);
    assert_eq!(y.size, 19 * MIB + 512);
    assert_eq!(
        seg_of(&a, y.ptr),
        vec![
            (0, 19 * MIB + 512, 19 * MIB + 512, Allocated),
            (19 * MIB + 512, MIB - 512, 3 * MIB, Inactive)
        ]
    );
    // Non-expandable blocks keep their inactive_split accounting.
    assert_eq!(st(&a, "inactive_split.all.current"), 1);
    assert_eq!(
        st(&a, "inactive_split_bytes.all.current"),
        (MIB - 512) as i64
    );
    ok(&a);
}

#[test]
fn pending_frees_are_flushed_by_the_last_resort_retry() {
    let a = new_cap("", 64 * MIB);
    a.with_device(|d| d.hold_stream(SIDE));
    let x = a.malloc(40 * MIB, 0).unwrap();
    a.record_stream(x.ptr, SIDE).unwrap();
    a.free(x.ptr).unwrap();
    // 40 MiB pending + 40 MiB new does not fit 64 MiB: the retry waits for the side
    // stream, frees the segment, and then succeeds.
    let y = a.malloc(40 * MIB, 0).unwrap();
    assert_eq!(st(&a, "num_alloc_retries"), 1);
    assert_eq!(st(&a, "num_sync_all_streams"), 1);
    assert_eq!(st(&a, "num_ooms"), 0);
    assert_eq!(st(&a, "num_device_free"), 1);
    assert_eq!(st(&a, "active.all.current"), 1);
    assert_eq!(st(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
    a.free(y.ptr).unwrap();
    ok(&a);
}
