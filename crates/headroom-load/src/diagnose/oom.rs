//! `out_of_memory`: a service ran out of memory during an HTTP run, with the allocator's
//! state at that moment when the probe dumped it.
use headroom_alloc::{BlockState, Snapshot};

use super::{mib, nums};
use crate::results::*;

/// Reserved, allocated and the largest free block of a snapshot's segments.
pub fn segment_state(s: &Snapshot) -> (u64, u64, u64) {
    let mut reserved = 0;
    let mut allocated = 0;
    let mut largest_free = 0;
    for g in &s.segments {
        reserved += g.total_size;
        for b in &g.blocks {
            match b.state {
                BlockState::Inactive => largest_free = largest_free.max(b.size),
                _ => allocated += b.size,
            }
        }
    }
    (reserved, allocated, largest_free)
}

pub(super) fn out_of_memory(r: &RunResult) -> Option<Finding> {
    let n = r.errors.oom;
    if n == 0 {
        return None;
    }
    let first = r.ooms.first();
    let mut numbers = vec![("service_ooms", n as f64)];
    let at = first
        .map(|o| {
            format!(
                " The first was seen at t={:.1}s with {} requests in flight, {} allocated and {} \
                 reserved of {}.",
                o.t_s,
                o.concurrency,
                mib(o.allocated_bytes as f64),
                mib(o.reserved_bytes as f64),
                if r.capacity_bytes > 0 {
                    mib(r.capacity_bytes as f64)
                } else {
                    "an unknown capacity".into()
                }
            )
        })
        .unwrap_or_default();
    let mut state = String::new();
    let mut fix = String::from(
        "Bound the work in flight below the OOM point: put an admission limit in front of the \
         model (`headroom serve` sheds load with 503 instead of dying), or lower the batch or \
         sequence-length cap.",
    );
    if let Some(s) = &r.oom_snapshot {
        let (res, alloc, largest) = segment_state(s);
        numbers.push(("oom_reserved_bytes", res as f64));
        numbers.push(("oom_allocated_bytes", alloc as f64));
        numbers.push(("oom_largest_free_block_bytes", largest as f64));
        state = format!(
            " The probe's OOM snapshot shows {} reserved in {} segments, {} allocated, and {} \
             cached but free (the largest free block {}).",
            mib(res as f64),
            s.segments.len(),
            mib(alloc as f64),
            mib(res.saturating_sub(alloc) as f64),
            mib(largest as f64)
        );
        if res.saturating_sub(alloc) as f64 > 0.1 * res as f64 {
            fix.push_str(
                "\nMuch of the reserved memory was free at the OOM, in pieces too small for the \
                 request: set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.",
            );
        }
    }
    Some(Finding {
        id: FindingId::OutOfMemory,
        title: "The service ran out of memory".into(),
        severity: Severity::Critical,
        evidence: format!(
            "The service reported {n} out-of-memory error{} during the run.{at}{state}",
            if n == 1 { "" } else { "s" }
        ),
        numbers: nums(&numbers),
        fix,
        predicted_saving_bytes: 0,
    })
}
