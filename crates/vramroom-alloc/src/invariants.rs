//! Structural and statistical invariants, recomputed from scratch. Property tests call this
//! after every operation; it is deliberately independent of the incremental bookkeeping.

use crate::block::{Membership, NIL};
use crate::device::Device;
use crate::event::PoolKind;
use crate::policy::State;

pub(crate) fn check<D: Device>(st: &State<D>) -> Result<(), String> {
    let a = &st.arena;
    let idx = |k: PoolKind| k.stat_type() as usize;
    let mut allocated = [0i64; 3];
    let mut allocation = [0i64; 3];
    let mut active = [0i64; 3];
    let mut active_bytes = [0i64; 3];
    let mut requested = [0i64; 3];
    let mut reserved = [0i64; 3];
    let mut segments = [0i64; 3];
    let mut inactive_split = [0i64; 3];
    let mut inactive_split_bytes = [0i64; 3];
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut total_mapped = 0u64;
    let mut free_in_sets = 0usize;

    for id in a.live_ids() {
        let b = a.get(id);
        // Links are symmetric and blocks are contiguous.
        if b.next != NIL {
            let n = a.get(b.next);
            if n.prev != id {
                return Err(format!("block {id}: next.prev mismatch"));
            }
            if b.ptr + b.size != n.ptr {
                return Err(format!(
                    "block {id} at {:#x} not contiguous with next",
                    b.ptr
                ));
            }
            if n.pool != b.pool || n.stream != b.stream || n.expandable != b.expandable {
                return Err(format!("block {id}: neighbour in another segment"));
            }
        }
        if b.size == 0 || !b.size.is_multiple_of(512) {
            return Err(format!(
                "block {id}: size {} not a positive multiple of 512",
                b.size
            ));
        }
        let p = idx(b.pool);
        if b.mapped {
            ranges.push((b.ptr, b.ptr + b.size));
            total_mapped += b.size;
            reserved[0] += b.size as i64;
            reserved[p] += b.size as i64;
        }
        let is_active = b.allocated || b.event_count > 0 || b.has_uses;
        if b.allocated {
            allocation[0] += 1;
            allocation[p] += 1;
            allocated[0] += b.size as i64;
            allocated[p] += b.size as i64;
            if st.active.get(b.ptr) != Some(id) {
                return Err(format!("allocated block {id} missing from pointer map"));
            }
        }
        if is_active {
            active[0] += 1;
            active[p] += 1;
            active_bytes[0] += b.size as i64;
            active_bytes[p] += b.size as i64;
            requested[0] += b.requested as i64;
            requested[p] += b.requested as i64;
            if b.member != Membership::None {
                return Err(format!("active block {id} is in a free set"));
            }
        } else {
            let want = if b.mapped {
                Membership::Blocks
            } else {
                Membership::Unmapped
            };
            if b.member != want {
                return Err(format!("free block {id} in {:?}, want {want:?}", b.member));
            }
            free_in_sets += 1;
            // Free neighbours in the same mapped state must have been merged.
            for n in [b.prev, b.next] {
                if n != NIL {
                    let nb = a.get(n);
                    if nb.is_free() && nb.mapped == b.mapped {
                        return Err(format!("free block {id} not merged with free neighbour"));
                    }
                }
            }
            if !b.is_expandable() && b.is_split() {
                inactive_split[0] += 1;
                inactive_split[p] += 1;
                inactive_split_bytes[0] += b.size as i64;
                inactive_split_bytes[p] += b.size as i64;
            }
        }
        if !b.is_expandable() && b.prev == NIL {
            segments[0] += 1;
            segments[p] += 1;
        }
    }
    if st.active.len() != allocation[0] as usize {
        return Err("pointer map holds blocks that are not allocated".into());
    }
    let in_sets: usize = st
        .pools
        .iter()
        .map(|p| p.blocks.len(a) + p.unmapped.len(a))
        .sum();
    for p in &st.pools {
        p.blocks.check(a)?;
        p.unmapped.check(a)?;
    }
    if in_sets != free_in_sets {
        return Err(format!(
            "pool sets hold {in_sets} blocks, {free_in_sets} free blocks exist"
        ));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[0].1 > w[1].0 {
            return Err(format!("blocks overlap at {:#x}", w[1].0));
        }
    }
    if total_mapped != st.total_allocated_memory {
        return Err(format!(
            "total_allocated_memory {} != mapped {}",
            st.total_allocated_memory, total_mapped
        ));
    }
    // Expandable segments: mapped pages equal mapped block bytes.
    let mut pages = 0u64;
    for s in st.expandable.iter().flatten() {
        pages += s.mapped_pages() * s.page_size;
    }
    let exp_mapped: u64 = a
        .live_ids()
        .map(|id| a.get(id))
        .filter(|b| b.is_expandable() && b.mapped)
        .map(|b| b.size)
        .sum();
    if pages != exp_mapped {
        return Err(format!(
            "expandable pages {pages} != mapped expandable blocks {exp_mapped}"
        ));
    }

    let s = &st.stats.get();
    let base = st.stats.at_reset();
    let cmp = |name: &str,
               arr: &crate::stats::StatArray,
               base: &crate::stats::StatArray,
               want: [i64; 3]|
     -> Result<(), String> {
        for (i, w) in want.iter().enumerate() {
            if arr.0[i].current != *w {
                return Err(format!(
                    "{name}[{i}].current = {} but state says {w}",
                    arr.0[i].current
                ));
            }
            if arr.0[i].current > arr.0[i].peak {
                return Err(format!("{name}[{i}] current above peak"));
            }
            // `reset_accumulated_memory_stats` zeroes allocated and freed but not current.
            if arr.0[i].allocated - arr.0[i].freed != arr.0[i].current - base.0[i].current {
                return Err(format!("{name}[{i}] allocated - freed != current"));
            }
        }
        if want[0] != want[1] + want[2] {
            return Err(format!("{name}: all != small + large"));
        }
        Ok(())
    };
    cmp("allocation", &s.allocation, &base.allocation, allocation)?;
    cmp(
        "allocated_bytes",
        &s.allocated_bytes,
        &base.allocated_bytes,
        allocated,
    )?;
    cmp("active", &s.active, &base.active, active)?;
    cmp(
        "active_bytes",
        &s.active_bytes,
        &base.active_bytes,
        active_bytes,
    )?;
    cmp(
        "requested_bytes",
        &s.requested_bytes,
        &base.requested_bytes,
        requested,
    )?;
    cmp(
        "reserved_bytes",
        &s.reserved_bytes,
        &base.reserved_bytes,
        reserved,
    )?;
    cmp("segment", &s.segment, &base.segment, segments)?;
    cmp(
        "inactive_split",
        &s.inactive_split,
        &base.inactive_split,
        inactive_split,
    )?;
    cmp(
        "inactive_split_bytes",
        &s.inactive_split_bytes,
        &base.inactive_split_bytes,
        inactive_split_bytes,
    )?;
    if s.reserved_bytes.all().current < s.allocated_bytes.all().current {
        return Err("reserved < allocated".into());
    }
    Ok(())
}
