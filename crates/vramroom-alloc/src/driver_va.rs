//! Where the CUDA driver puts a `cudaMalloc`, for replays that have no recorded address.
//!
//! Design note: the caching allocator breaks best-fit ties by address (its pools are ordered
//! by stream, size, then pointer), so the relative order of two equal-size segments decides
//! which one a request splits, and with it fragmentation and peak reserved. A snapshot recorded
//! on a GPU carries the driver's addresses and replay reuses them (`SimDevice`'s hints); a
//! traced snapshot (fake CUDA) has none, so something must stand in for the driver.
//!
//! The model, read off the segment addresses of real snapshots (PyTorch 2.11, H100): the
//! driver holds its address space in chunks; a new allocation takes the lowest free gap inside
//! a chunk it already holds, else a fresh chunk, its size rounded up to 32 MiB, placed below
//! every chunk so far. Measured on the 47 default-config snapshots of the tracer's corpus
//! (device runs 13, 14, 18 and 24) as the share of pairs of equal-size segments whose address
//! order a model gets right (`python scripts/trace_corpus/va_order.py DIR`): 94.8% of
//! 29,039 large-segment pairs and 85.6% of 12,150 2 MiB ones, against 6.0% and 27.4% for
//! addresses that grow with time (the earlier model) and 94.0% / 72.6% for plain top-down.
//! The rest come from address space the driver gives to others between our calls (lazily
//! loaded kernels, library handles, the context's own holes), which a trace cannot see.
//!
//! Chunks are never returned: a freed segment leaves a gap that later allocations fill, lowest
//! first, as the driver refills freed ranges after `empty_cache`.

use std::collections::BTreeMap;

/// The driver's unit of address space for `cudaMalloc`.
const CHUNK: u64 = 32 << 20;
/// Allocations are placed at 2 MiB boundaries (the large-page size).
const ALIGN: u64 = 2 << 20;

#[derive(Debug, Clone, Default)]
pub(crate) struct DriverVa {
    /// start -> end of each chunk held.
    chunks: BTreeMap<u64, u64>,
}

impl DriverVa {
    /// The address for `size` bytes, given the live ranges (start -> end); `None` when the
    /// range would leave `[floor, top)`.
    pub(crate) fn place(
        &mut self,
        size: u64,
        live: &BTreeMap<u64, u64>,
        floor: u64,
        top: u64,
    ) -> Option<u64> {
        let step = size.div_ceil(ALIGN).max(1).checked_mul(ALIGN)?;
        for (&start, &end) in &self.chunks {
            let mut at = start;
            for (&ls, &le) in live.range(start..end) {
                if ls.saturating_sub(at) >= step {
                    return Some(at);
                }
                at = at.max(le);
            }
            if end.saturating_sub(at) >= step {
                return Some(at);
            }
        }
        let chunk = step.div_ceil(CHUNK).checked_mul(CHUNK)?;
        let low = self.chunks.keys().next().copied().unwrap_or(top);
        let start = low.checked_sub(chunk).filter(|&s| s >= floor)?;
        self.chunks.insert(start, start + chunk);
        Some(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const TOP: u64 = 0x7f00_0000_0000;

    fn alloc(va: &mut DriverVa, live: &mut BTreeMap<u64, u64>, size: u64) -> u64 {
        let p = va.place(size, live, 0x1000_0000_0000, TOP).unwrap();
        live.insert(p, p + size.div_ceil(ALIGN) * ALIGN);
        p
    }

    #[test]
    fn fresh_chunks_go_down_and_small_ones_fill_upward() {
        let (mut va, mut live) = (DriverVa::default(), BTreeMap::new());
        let a = alloc(&mut va, &mut live, 20 * MIB);
        let b = alloc(&mut va, &mut live, 20 * MIB);
        assert_eq!(a, TOP - 32 * MIB);
        assert!(b < a, "a later chunk lies below");
        // The tails of both chunks have 12 MiB free: 2 MiB segments fill the lowest first,
        // upward.
        let s1 = alloc(&mut va, &mut live, 2 * MIB);
        let s2 = alloc(&mut va, &mut live, 2 * MIB);
        assert_eq!(s1, b + 20 * MIB);
        assert_eq!(s2, s1 + 2 * MIB);
    }

    #[test]
    fn a_freed_gap_is_reused_lowest_first() {
        let (mut va, mut live) = (DriverVa::default(), BTreeMap::new());
        let a = alloc(&mut va, &mut live, 32 * MIB);
        let b = alloc(&mut va, &mut live, 32 * MIB);
        live.remove(&a);
        live.remove(&b);
        assert_eq!(alloc(&mut va, &mut live, 32 * MIB), b);
        assert_eq!(alloc(&mut va, &mut live, 32 * MIB), a);
    }

    #[test]
    fn runs_out_at_the_floor_instead_of_wrapping() {
        let mut va = DriverVa::default();
        assert_eq!(va.place(u64::MAX - 1, &BTreeMap::new(), 0, TOP), None);
        assert_eq!(
            va.place(64 * MIB, &BTreeMap::new(), TOP - 32 * MIB, TOP),
            None
        );
    }
}
