//! Replay and allocator findings of the `snapshot_replay` fuzz target and its stable
//! stand-in (`replay_semantic.rs`), minimized: snapshots that the reader accepts and on
//! which `replay` panicked or did not return. Each is now answered (a clean error naming
//! the range that runs past the address space, or an OOM for a request no device holds),
//! and stays here as a regression test. Most were arithmetic overflows or `debug_assert`s,
//! which panic only with debug assertions, so run them without `--release` too:
//!
//! ```sh
//! cargo test -p vramroom-trace --test replay_findings
//! ```
//!
//! Each test fails, never hangs: replay runs under a watchdog.

use std::time::Duration;

use vramroom_alloc::AllocatorConfig;
use vramroom_trace::replay::{replay, ReplayOptions};
use vramroom_trace::{
    BlockInfo, BlockState, SegmentInfo, Snapshot, Stack, TraceAction, TraceEntry,
};

fn entry(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
    TraceEntry::new(action, addr, size)
}

fn segment(address: u64, total_size: u64, expandable: bool, blocks: Vec<BlockInfo>) -> SegmentInfo {
    SegmentInfo {
        device: 0,
        address,
        total_size,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: if total_size == 2 << 20 {
            "small"
        } else {
            "large"
        }
        .into(),
        segment_pool_id: (0, 0),
        is_expandable: expandable,
        frames: Stack::empty(),
        blocks,
    }
}

fn block(address: u64, size: u64, requested_size: u64, state: BlockState) -> BlockInfo {
    BlockInfo {
        address,
        size,
        requested_size,
        state,
        frames: Stack::empty(),
    }
}

fn live(address: u64, size: u64, requested_size: u64) -> BlockInfo {
    block(address, size, requested_size, BlockState::ActiveAllocated)
}

fn snapshot(segments: Vec<SegmentInfo>, trace: Vec<TraceEntry>) -> Snapshot {
    Snapshot {
        segments,
        device_traces: vec![trace],
        ..Snapshot::default()
    }
}

fn opts(expandable: bool, capacity: u64, stop_at_oom: bool, record_history: bool) -> ReplayOptions {
    ReplayOptions {
        config: if expandable {
            AllocatorConfig::parse("expandable_segments:True").unwrap()
        } else {
            AllocatorConfig::default()
        },
        capacity: Some(capacity),
        stop_at_oom,
        record_history,
        ..ReplayOptions::default()
    }
}

/// Replays `s` on another thread; fails if it panics or has not returned in 20 s.
fn must_return(s: Snapshot, opts: ReplayOptions) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r =
            std::panic::catch_unwind(|| replay(&s, &opts).map(|_| ()).map_err(|e| e.to_string()));
        let _ = tx.send(r.map_err(|p| {
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        }));
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(_)) => {}
        Ok(Err(panic)) => panic!("replay panicked: {panic}"),
        Err(_) => panic!("replay did not return in 20 s"),
    }
}

const MIB: u64 = 1 << 20;

// ---- replay.rs ----

/// `initial_state`: the page walk over an expandable segment that predates the trace
/// steps through `total_size` one page at a time and scans the trace's maps at each page:
/// 2^62 bytes are 2^38 steps. Never returns, in release builds too. (Python reads this
/// snapshot in microseconds.)
#[test]
fn replay_huge_expandable_segment() {
    let s = snapshot(
        vec![segment(0, 1 << 62, true, vec![])],
        vec![entry(TraceAction::Alloc, 1 << 63, 512)],
    );
    must_return(s, opts(true, 64 * MIB, true, false));
}

/// `initial_state`, line 261: `s.address + s.total_size` of an expandable segment
/// overflows.
#[test]
fn replay_expandable_segment_end_overflows() {
    let top = 0xffff_ffff_ffff_ff6d;
    let s = snapshot(
        vec![segment(top, top, true, vec![])],
        vec![entry(TraceAction::Alloc, 0, 0)],
    );
    must_return(s, opts(true, 64 * MIB, false, true));
}

/// `initial_state`, line 240: `addr + size` of a non-expandable segment overflows.
#[test]
fn replay_plain_segment_end_overflows() {
    let s = snapshot(
        vec![segment(0xffff_ffff_ffff_ff90, 0xd2_e600, false, vec![])],
        vec![entry(TraceAction::Oom, 2 * MIB, 0x8000_0000_0001_6800)],
    );
    must_return(s, opts(false, 64 * MIB, false, true));
}

/// `initial_state::take_live`, line 204: `a + size` of a live block overflows.
#[test]
fn replay_live_block_end_overflows() {
    let s = snapshot(
        vec![
            segment(
                u64::MAX,
                20 * MIB,
                false,
                vec![block(
                    u64::MAX,
                    20 * MIB,
                    20 * MIB,
                    BlockState::ActivePendingFree,
                )],
            ),
            segment(20 * MIB, 20 * MIB, true, vec![]),
        ],
        vec![entry(TraceAction::Alloc, 0, 0)],
    );
    must_return(s, opts(true, 32 << 30, false, true));
}

/// `initial_state`, line 286: `a + l` of a traced `segment_map` overflows in the page
/// walk.
#[test]
fn replay_segment_map_end_overflows() {
    let s = snapshot(
        vec![segment(0x7fff_ffff_ffff_ff00, 30 * MIB, true, vec![])],
        vec![entry(
            TraceAction::SegmentMap,
            0x8000_0000_0001_5200,
            0x7fff_ffff_ffff_ff00,
        )],
    );
    must_return(s, opts(true, 32 << 30, false, true));
}

/// `replay`, line 409: `e.time_us - 1` overflows for `time_us = i64::MIN` when history
/// is recorded.
#[test]
fn replay_earliest_time_overflows() {
    let mut e = entry(TraceAction::Alloc, 0, 0);
    e.time_us = i64::MIN;
    must_return(snapshot(vec![], vec![e]), opts(true, 4 * MIB, true, true));
}

// ---- vramroom-alloc ----

/// expandable.rs `ExpandableSegment::unmap` indexes `mapped` up to the end of the block it
/// releases without the `.min(max_pages)` clamp that `map` has: an expandable segment at
/// an unaligned address, with live blocks outside it that replay must allocate loose,
/// panics with "index out of bounds: the len is 5 but the index is 5" when the first
/// malloc frees cached blocks. This one panics in release builds (`--release`); with debug
/// assertions replay.rs:204 overflows on these blocks first.
#[test]
fn alloc_unmap_past_the_last_page() {
    let s = snapshot(
        vec![segment(
            0x677b,
            2 * MIB,
            true,
            vec![
                live(0x8000_0000_0001_f000, 0x140_0000, 0x8000_1540_0000),
                live(
                    0x8000_0000_0000_fe00,
                    0x8000_0000_0001_f000,
                    0x8000_0000_0001_a200,
                ),
            ],
        )],
        vec![entry(TraceAction::Alloc, 0, 0)],
    );
    must_return(s, opts(true, 8 * MIB, true, true));
}

/// expandable.rs line 192, `debug_assert_eq!(mptr, ptr)` in `map_block`: two expandable
/// segments that predate the trace, at 20 MiB and 255 MiB, with no blocks.
#[test]
fn alloc_map_block_address_mismatch() {
    let s = snapshot(
        vec![
            segment(20 * MIB, 20 * MIB, true, vec![]),
            segment(255 * MIB, 255 * MIB, true, vec![]),
        ],
        vec![entry(TraceAction::Alloc, 0, 0)],
    );
    must_return(s, opts(true, 256 * MIB, true, false));
}

/// ptrmap.rs line 163, `debug_assert!` "address 0x1400000 already mapped": an expandable
/// segment with two empty pending-free blocks, one at its base, rebuilt as live.
#[test]
fn alloc_same_address_mapped_twice() {
    let pending = BlockState::ActivePendingFree;
    let s = snapshot(
        vec![segment(
            20 * MIB,
            20 * MIB,
            true,
            vec![
                block(20 * MIB, 0, 0, pending),
                block(0x8000_0000_013f_ff00, 0, 35 * MIB, pending),
            ],
        )],
        vec![entry(TraceAction::Alloc, 0, 0)],
    );
    must_return(s, opts(true, 256 * MIB, true, false));
}

/// device.rs line 147, `SimDevice::bump_past_hints`: `a + s` of a traced `segment_alloc`
/// hint overflows.
#[test]
fn alloc_device_hint_end_overflows() {
    let s = snapshot(
        vec![],
        vec![entry(TraceAction::SegmentAlloc, u64::MAX, 1 << 63)],
    );
    must_return(s, opts(true, 1 << 30, true, false));
}

/// device.rs line 148, `SimDevice::bump_past_hints`: rounding the hint's end up to the
/// device alignment overflows for a segment freed at the top of the address space.
#[test]
fn alloc_device_hint_rounding_overflows() {
    let s = snapshot(
        vec![],
        vec![entry(TraceAction::SegmentFree, 0xffff_ffff_ffff_ff97, 0)],
    );
    must_return(s, opts(false, MIB, false, true));
}

/// policy.rs line 101, `round_512`: rounding a request of u64::MAX bytes overflows (in
/// release it wraps to 0, a zero-byte block for a u64::MAX request), reached here through
/// a `free_requested` of a block that predates the trace.
#[test]
fn alloc_round_512_overflows() {
    let s = snapshot(
        vec![],
        vec![entry(TraceAction::FreeRequested, u64::MAX, u64::MAX)],
    );
    must_return(s, opts(true, MIB, false, true));
}

/// policy.rs line 117, `roundup_power2_next_division`: `r + step` overflows when a size
/// near u64::MAX is rounded up to the next power-of-two division (in release it wraps to
/// a tiny size); reached through a `free_requested` of a block that predates the trace.
#[test]
fn alloc_roundup_division_overflows() {
    let s = snapshot(
        vec![],
        vec![entry(
            TraceAction::FreeRequested,
            2 * MIB,
            0xffff_ffff_ffff_ffb1,
        )],
    );
    let opts = ReplayOptions {
        config: AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,>:4]").unwrap(),
        capacity: Some(64 << 30),
        stop_at_oom: true,
        record_history: false,
        ..ReplayOptions::default()
    };
    must_return(s, opts);
}
