//! Ranges a replay can model, checked before any state is built.
//!
//! Design note: replay reasons about memory as address ranges (`address + size`), so a
//! snapshot whose segments, blocks or trace entries run past the end of the 64-bit address
//! space (which no CUDA device can hand out) is refused here with the offending item named,
//! rather than wrapping around somewhere deep in the model. Huge *requests* stay legal: an
//! allocation of 2^63 bytes is a real thing a program can ask for, and replay answers it with
//! an OOM, as PyTorch does. Only addresses that were handed out must form valid ranges.

use vramroom_alloc::snapshot::{SegmentInfo, TraceAction, TraceEntry};

use super::ReplayError;

/// Refuses segments, blocks and trace entries whose `address + size` overflows.
pub(crate) fn address_ranges(
    segments: &[&SegmentInfo],
    trace: &[TraceEntry],
) -> Result<(), ReplayError> {
    let past_end = |what: &str, addr: u64, size: u64| {
        ReplayError::Invalid(format!(
            "{what} at {addr:#x} of {size} bytes runs past the end of the address space"
        ))
    };
    for s in segments {
        if s.address.checked_add(s.total_size).is_none() {
            return Err(past_end("segment", s.address, s.total_size));
        }
        for b in &s.blocks {
            if b.address.checked_add(b.size).is_none() {
                return Err(past_end("block", b.address, b.size));
            }
        }
    }
    // One device's segments never share an address: PyTorch's come from cudaMalloc or
    // their own VMM reservation. Overlapping ones are a corrupt snapshot, and the replay's
    // bookkeeping (reserved bytes, free runs) would mean nothing on them.
    let mut by_start: Vec<(u64, u64)> = segments
        .iter()
        .map(|s| (s.address, s.address + s.total_size))
        .collect();
    by_start.sort_unstable();
    for w in by_start.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(ReplayError::Invalid(format!(
                "segments at {:#x} and {:#x} overlap (the first runs to {:#x}): not a snapshot \
                 PyTorch writes",
                w[0].0, w[1].0, w[0].1
            )));
        }
    }
    for (i, e) in trace.iter().enumerate() {
        // An alloc that failed has no address; the others name memory that was handed out.
        let placed = !matches!(e.action, TraceAction::Oom | TraceAction::Snapshot);
        if placed && e.addr.checked_add(e.size).is_none() {
            return Err(past_end(
                &format!("trace entry {i} ({:?})", e.action),
                e.addr,
                e.size,
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(address: u64, total_size: u64) -> SegmentInfo {
        SegmentInfo {
            device: 0,
            address,
            total_size,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: "large".into(),
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: Default::default(),
            blocks: Vec::new(),
        }
    }

    #[test]
    fn a_range_past_the_address_space_is_refused_and_named() {
        let e = address_ranges(&[&segment(u64::MAX - 10, 2 << 20)], &[]).unwrap_err();
        assert!(
            e.to_string().contains("segment at 0xfffffffffffffff5"),
            "{e}"
        );
        assert!(address_ranges(&[&segment(1 << 40, 2 << 20)], &[]).is_ok());
    }

    #[test]
    fn overlapping_segments_are_refused_and_named() {
        // The snapshot_replay fuzz target's: two 128 TiB segments 150 MiB apart.
        let (a, b) = (
            segment(0xb900000, 0x8000_1960_0000),
            segment(0x1ef7800, 1 << 47),
        );
        let e = address_ranges(&[&a, &b], &[]).unwrap_err();
        assert!(
            e.to_string()
                .contains("segments at 0x1ef7800 and 0xb900000 overlap"),
            "{e}"
        );
        // Adjacent is fine.
        let (c, d) = (segment(0, 2 << 20), segment(2 << 20, 2 << 20));
        assert!(address_ranges(&[&d, &c], &[]).is_ok());
    }
}
