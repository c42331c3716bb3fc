//! What existed before a trace began: the segments and live blocks a replay starts from.
//!
//! Design note: a snapshot holds the allocator's state at its *end* and the trace of how it
//! got there, often only the last part of it (a wrapping ring buffer, or recording switched
//! on mid-run). Memory that predates the trace shows up as segments and blocks that no trace
//! entry created, and as frees of addresses the trace never allocated. Both are rebuilt at
//! their recorded offsets so the replay starts from the state PyTorch was in.
//!
//! A block is from before the trace exactly when no trace entry names its address: a block
//! whose address the trace allocated is the trace's own, even if it is still pending at the
//! end. Everything here is sorted once and walked, so the cost is O(n log n) in the number of
//! segments and blocks, whatever their count.

use std::collections::{BTreeMap, HashSet};

use vramroom_alloc::{
    AllocatorConfig, BlockState, ImportSegment, LiveBlock, MempoolId, PoolKind, SegmentInfo,
    TraceAction, TraceEntry, DEFAULT_POOL,
};

/// A pre-trace segment: its recorded base and how to rebuild it.
pub(crate) struct InitSegment {
    pub recorded_base: u64,
    pub import: ImportSegment,
}

/// What the snapshot says existed before its trace began.
pub(crate) struct Initial {
    pub segments: Vec<InitSegment>,
    /// Live blocks that could not be placed in a rebuilt segment: (address, requested,
    /// stream, pool).
    pub loose: Vec<(u64, u64, u64, MempoolId)>,
    /// Recorded reservation bases, in the order the replay will create them.
    pub reserve_hints: Vec<u64>,
}

fn pool_id(p: (i64, i64)) -> MempoolId {
    (p.0 as u64, p.1 as u64)
}

/// A live pre-trace block: (address, size, requested, stream, pool).
type PreLive = (u64, u64, u64, u64, MempoolId);

/// The pre-trace state of one device: `segments` are that device's final segments.
pub(crate) fn initial_state(
    segments_at_end: &[&SegmentInfo],
    trace: &[TraceEntry],
    config: &AllocatorConfig,
) -> Initial {
    // Addresses the trace names, frees of never-allocated addresses, segments it made or
    // freed without making.
    let mut named: HashSet<u64> = HashSet::new();
    let mut allocated: HashSet<u64> = HashSet::new();
    let mut pre_freed: Vec<PreLive> = Vec::new();
    let mut trace_segments: HashSet<u64> = HashSet::new();
    let mut freed_segments: Vec<(u64, u64, u64)> = Vec::new();
    let mut maps: Vec<(u64, u64)> = Vec::new();
    let round = |n: u64| vramroom_alloc::policy::round_size(config, n);
    for e in trace {
        match e.action {
            TraceAction::Alloc => {
                named.insert(e.addr);
                allocated.insert(e.addr);
            }
            TraceAction::FreeRequested => {
                if !named.contains(&e.addr) {
                    pre_freed.push((e.addr, round(e.size), e.size, e.stream, DEFAULT_POOL));
                }
                named.insert(e.addr);
            }
            TraceAction::FreeCompleted => {
                named.insert(e.addr);
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
    let mut pre_live: Vec<PreLive> = Vec::new();
    for s in segments_at_end {
        for b in &s.blocks {
            if b.state != BlockState::Inactive && !named.contains(&b.address) {
                pre_live.push((
                    b.address,
                    b.size,
                    b.requested_size,
                    s.stream,
                    pool_id(s.segment_pool_id),
                ));
            }
        }
    }
    pre_live.extend(pre_freed);
    // A pre-trace block freed in the trace sits in a segment the final snapshot may still
    // list; its pool is that segment's.
    let seg_pool: BTreeMap<u64, (u64, MempoolId)> = segments_at_end
        .iter()
        .map(|s| {
            (
                s.address,
                (s.address + s.total_size, pool_id(s.segment_pool_id)),
            )
        })
        .collect();
    for b in pre_live.iter_mut() {
        if let Some((_, &(end, p))) = seg_pool.range(..=b.0).next_back() {
            if b.0 < end {
                b.4 = p;
            }
        }
    }
    // By (stream, address), so each segment takes its blocks with one range walk.
    pre_live.sort_by_key(|b| (b.3, b.0));
    let mut placed = vec![false; pre_live.len()];
    let take_live = |start: u64, end: u64, stream: u64, placed: &mut Vec<bool>| {
        let from = pre_live.partition_point(|b| (b.3, b.0) < (stream, start));
        let mut v = Vec::new();
        for (i, &(a, size, req, st, _)) in pre_live.iter().enumerate().skip(from) {
            if st != stream || a >= end {
                break;
            }
            if !placed[i] && a + size <= end {
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
    let mut segments = Vec::new();
    let mut reserve_hints = Vec::new();
    let large_page = config.large_segment_size;
    // Non-expandable segments that predate the trace.
    let mut plain: Vec<(u64, u64, u64, PoolKind, MempoolId)> = segments_at_end
        .iter()
        .filter(|s| !s.is_expandable && !trace_segments.contains(&s.address))
        .map(|s| {
            let pool = if s.segment_type == "small" {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            (
                s.address,
                s.total_size,
                s.stream,
                pool,
                pool_id(s.segment_pool_id),
            )
        })
        .collect();
    for &(addr, size, stream) in &freed_segments {
        let pool = if size == 2 << 20 {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        plain.push((addr, size, stream, pool, DEFAULT_POOL));
    }
    if !config.expandable_segments {
        for (addr, size, stream, pool, pid) in plain {
            let live = take_live(addr, addr.saturating_add(size), stream, &mut placed);
            segments.push(InitSegment {
                recorded_base: addr,
                import: ImportSegment {
                    pool,
                    stream,
                    total_size: size,
                    expandable: false,
                    mapped: Vec::new(),
                    live,
                    pool_id: pid,
                },
            });
        }
    }
    // Expandable memory that predates the trace: final mapped runs minus pages mapped
    // in-trace.
    if config.expandable_segments {
        let mut groups: BTreeMap<(u64, bool, MempoolId), Vec<(u64, u64)>> = BTreeMap::new();
        for s in segments_at_end.iter().filter(|s| s.is_expandable) {
            groups
                .entry((
                    s.stream,
                    s.segment_type == "small",
                    pool_id(s.segment_pool_id),
                ))
                .or_default()
                .push((s.address, s.address.saturating_add(s.total_size)));
        }
        maps.sort_unstable();
        let mut bases: Vec<(usize, u64)> = Vec::new();
        for ((stream, small, pid), runs) in &groups {
            let page = if *small { 2 << 20 } else { large_page.max(1) };
            let lo = runs.iter().map(|r| r.0).min().unwrap_or(0);
            let hi = runs.iter().map(|r| r.1).max().unwrap_or(0);
            let in_group = |a: u64| a >= lo && a < hi;
            let from = maps.partition_point(|m| m.0 < lo);
            let trace_maps: Vec<(u64, u64)> = maps[from..]
                .iter()
                .take_while(|m| m.0 < hi)
                .copied()
                .collect();
            let base = trace_maps.first().map_or(lo, |m| m.0.min(lo));
            let first_use = trace
                .iter()
                .position(|e| e.action == TraceAction::SegmentMap && in_group(e.addr))
                .unwrap_or(0);
            // The run minus the pages mapped in-trace, by interval arithmetic over the
            // sorted maps (a page walk would be as long as the run is large).
            let mut mapped: Vec<(u64, u64)> = Vec::new();
            let mut push = |from: u64, to: u64| {
                if to <= from {
                    return;
                }
                match mapped.last_mut() {
                    Some((off, len)) if *off + *len == from - base => *len += to - from,
                    _ => mapped.push((from - base, to - from)),
                }
            };
            for &(s, e) in runs {
                let mut p = s;
                let k = trace_maps.partition_point(|m| m.0.saturating_add(m.1) <= s);
                for &(a, l) in &trace_maps[k..] {
                    if a >= e {
                        break;
                    }
                    push(p, a.min(e));
                    p = p.max(a.saturating_add(l));
                }
                push(p, e);
            }
            let _ = page;
            let pool = if *small {
                PoolKind::Small
            } else {
                PoolKind::Large
            };
            if !mapped.is_empty() {
                let live = take_live(base, hi, *stream, &mut placed);
                segments.push(InitSegment {
                    recorded_base: base,
                    import: ImportSegment {
                        pool,
                        stream: *stream,
                        total_size: 0,
                        expandable: true,
                        mapped,
                        live,
                        pool_id: *pid,
                    },
                });
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
        .map(|(&(a, _, req, st, pid), _)| (a, req, st, pid))
        .collect();
    Initial {
        segments,
        loose,
        reserve_hints,
    }
}
