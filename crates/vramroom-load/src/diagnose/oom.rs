//! `out_of_memory`: a service ran out of memory during an HTTP run, with the allocator's
//! state at that moment when the probe dumped it.
use vramroom_alloc::{BlockState, Snapshot};

use super::rules::{mib, nums};
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
         model (`vramroom serve` sheds load with 503 instead of dying), or lower the batch or \
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

/// The highest concurrency of the stages that ran out of memory (of all stages when none
/// did).
fn oom_concurrency(r: &RunResult) -> usize {
    r.stages
        .iter()
        .filter(|s| s.requests.oom > 0)
        .map(|s| s.concurrency)
        .max()
        .or_else(|| r.stages.iter().map(|s| s.concurrency).max())
        .unwrap_or(1)
}

/// `out_of_memory` of a load test whose demand is over the capacity: the OOM search's fit of
/// peak reserved against concurrency, at the concurrency that ran out, is more than the
/// device holds (or the search itself saw the first OOM at or below it). The OOMs are then
/// real demand, which no allocator setting removes.
pub(super) fn over_capacity(r: &RunResult) -> Option<Finding> {
    let n = r.errors.oom;
    let s = r.oom_search.as_ref()?;
    if n == 0 || s.axis != "concurrency" || s.fit.b <= 0.0 {
        return None;
    }
    let c = oom_concurrency(r);
    let cap = r.capacity_bytes;
    let demand = s.fit.a + s.fit.b * c as f64;
    let seen = s.observed_oom_load.is_some_and(|m| m <= c);
    if demand <= cap as f64 && !seen {
        return None;
    }
    let safe = s
        .verified_safe_load
        .map(|x| x.to_string())
        .unwrap_or_else(|| "none".into());
    let first = s
        .observed_oom_load
        .map(|x| x.to_string())
        .unwrap_or_else(|| "not reached".into());
    Some(Finding {
        id: FindingId::OutOfMemory,
        title: "The load needs more memory than the device has".into(),
        severity: Severity::Critical,
        evidence: format!(
            "{n} request{} ran out of memory. At {c} concurrent requests the workload needs \
             about {} of peak reserved ({} + {} per concurrent request, the OOM search's fit on \
             the meta twin), over the capacity of {}: the search saw the first OOM at {first} \
             and stays within the budget up to {safe}. This is real demand, not cache in the \
             wrong pieces.",
            if n == 1 { "" } else { "s" },
            mib(demand),
            mib(s.fit.a),
            mib(s.fit.b),
            mib(cap as f64),
        ),
        numbers: nums(&[
            ("run_ooms", n as f64),
            ("concurrency", c as f64),
            ("demand_bytes", demand),
            ("capacity_bytes", cap as f64),
            ("fit_intercept_bytes", s.fit.a),
            ("fit_bytes_per_request", s.fit.b),
            ("safe_concurrency", s.verified_safe_load.unwrap_or(0) as f64),
            (
                "first_oom_concurrency",
                s.observed_oom_load.unwrap_or(0) as f64,
            ),
        ]),
        fix: format!(
            "Cap the requests in flight at {safe} (an admission limit in front of the model: \
             `vramroom serve` sheds load with 503 instead of running out), or give it more \
             memory, or lower the batch or the sequence-length cap."
        ),
        predicted_saving_bytes: (demand - cap as f64).max(0.0) as u64,
    })
}

/// OOMs that no other finding explains (neither demand over the capacity, a leak, nor
/// fragmentation): said as a warning with the allocator's state at the first one, so that
/// a run with OOMs never reads as clean.
pub(super) fn unexplained_ooms(r: &RunResult, found: &[Finding]) -> Option<Finding> {
    let n = r.errors.oom;
    let explains = |f: &Finding| {
        matches!(
            f.id,
            FindingId::OutOfMemory | FindingId::Leak | FindingId::Fragmentation
        )
    };
    if n == 0 || found.iter().any(explains) {
        return None;
    }
    let at = r
        .ooms
        .first()
        .map(|o| {
            format!(
                " The first was at t={:.1}s with {} requests in flight, {} allocated and {} \
                 reserved of {}.",
                o.t_s,
                o.concurrency,
                mib(o.allocated_bytes as f64),
                mib(o.reserved_bytes as f64),
                mib(r.capacity_bytes as f64)
            )
        })
        .unwrap_or_default();
    Some(Finding {
        id: FindingId::OutOfMemory,
        title: "The run ran out of memory".into(),
        severity: Severity::Warning,
        evidence: format!(
            "{n} request{} ran out of memory, below the demand the OOM search measured (or \
             without a search to compare with).{at}",
            if n == 1 { "" } else { "s" }
        ),
        numbers: nums(&[("run_ooms", n as f64)]),
        fix: "Run the OOM search (drop --no-search) to see the safe concurrency, and bound the \
              requests in flight below it."
            .into(),
        predicted_saving_bytes: 0,
    })
}
