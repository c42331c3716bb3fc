//! `cache_held`: after a burst, the cache still holds memory the load no longer needs.
use vramroom_alloc::BlockState;

use super::rules::{mib, nums, Rules};
use crate::results::*;

pub(super) fn cache_held(r: &RunResult, rules: &Rules) -> Option<Finding> {
    // Only a load that fell leaves a burst's memory behind: a later stage with fewer
    // workers than an earlier one.
    let last_c = r.stages.last()?.concurrency;
    if !r.stages.iter().any(|s| s.concurrency > last_c) {
        return None;
    }
    let rest = r
        .timeline
        .iter()
        .rfind(|s| s.kind == SampleKind::Periodic)?;
    let last = r.stages.last()?;
    // What the last stage itself needs: the most allocated in its second half (its start
    // still carries the previous stage's requests in flight), or its peak without samples.
    let mid = last.start_s + 0.5 * (last.end_s - last.start_s);
    let recent = r
        .timeline
        .iter()
        .filter(|s| s.kind == SampleKind::Periodic && s.stage == last.index && s.t_s >= mid)
        .map(|s| s.allocated_bytes)
        .max()
        .unwrap_or(last.peak_allocated_bytes);
    let held = rest.reserved_bytes.saturating_sub(rest.allocated_bytes);
    let dropped = recent as f64 <= rules.load_drop * r.peaks.allocated_bytes as f64;
    let excess = rest.reserved_bytes.saturating_sub(recent);
    let floor = rules.floor(r.capacity_bytes);
    if !(dropped && excess >= floor && held >= floor) {
        return None;
    }
    // What empty_cache() hands back: every segment with no live block.
    let releasable = r
        .snapshot
        .as_ref()
        .map(|s| {
            s.segments
                .iter()
                .filter(|g| g.blocks.iter().all(|b| b.state == BlockState::Inactive))
                .map(|g| g.total_size)
                .sum::<u64>()
        })
        .unwrap_or(held);
    Some(Finding {
        id: FindingId::CacheHeld,
        title: "The cache holds memory for a burst that is over".into(),
        severity: Severity::Info,
        evidence: format!(
            "After the load fell to {} workers (at most {} allocated late in the last stage, \
             against {} at the run's peak), the allocator still reserves {} with {} allocated: {} is \
             cached but unused; empty_cache() would return {} to the device.",
            last.concurrency,
            mib(recent as f64),
            mib(r.peaks.allocated_bytes as f64),
            mib(rest.reserved_bytes as f64),
            mib(rest.allocated_bytes as f64),
            mib(held as f64),
            mib(releasable as f64)
        ),
        numbers: nums(&[
            ("reserved_bytes_at_rest", rest.reserved_bytes as f64),
            ("allocated_bytes_at_rest", rest.allocated_bytes as f64),
            ("cached_unused_bytes", held as f64),
            ("empty_cache_returns_bytes", releasable as f64),
            ("last_stage_recent_allocated_bytes", recent as f64),
        ]),
        fix: "Call `torch.cuda.empty_cache()` once a burst is over (it frees every fully free \
              segment to the driver), or set `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8` \
              so the allocator reclaims old cached blocks itself."
            .into(),
        predicted_saving_bytes: releasable,
    })
}

pub(super) fn has(r: &RunResult, series: &str) -> bool {
    r.http
        .as_ref()
        .is_some_and(|h| h.memory_series.iter().any(|s| s == series))
}

pub(super) fn service_cache_held(r: &RunResult, floor: u64) -> Option<Finding> {
    if !(has(r, "allocated") && has(r, "reserved")) {
        return None;
    }
    // The last sample is taken after the load: the service at rest. Only a burst that
    // allocated much more than what stays allocated leaves cache behind worth freeing.
    let rest = r.timeline.last()?;
    let held = rest.reserved_bytes.saturating_sub(rest.allocated_bytes);
    let dropped = rest.allocated_bytes as f64 <= 0.6 * r.peaks.allocated_bytes as f64;
    if !dropped || held < floor || rest.reserved_bytes < 2 * rest.allocated_bytes.max(1) {
        return None;
    }
    let releasable = r
        .snapshot
        .as_ref()
        .map(|s| {
            s.segments
                .iter()
                .filter(|g| g.blocks.iter().all(|b| b.state == BlockState::Inactive))
                .map(|g| g.total_size)
                .sum::<u64>()
        })
        .unwrap_or(held);
    Some(Finding {
        id: FindingId::CacheHeld,
        title: "The service's cache holds memory for a burst that is over".into(),
        severity: Severity::Info,
        evidence: format!(
            "After the load, the service's allocator still reserves {} with {} allocated \
             (peak allocated under load {}): {} is cached but unused{}.",
            mib(rest.reserved_bytes as f64),
            mib(rest.allocated_bytes as f64),
            mib(r.peaks.allocated_bytes as f64),
            mib(held as f64),
            if r.snapshot.is_some() {
                format!(
                    "; empty_cache() would return {} (its fully free segments)",
                    mib(releasable as f64)
                )
            } else {
                String::new()
            }
        ),
        numbers: nums(&[
            ("reserved_bytes_at_rest", rest.reserved_bytes as f64),
            ("allocated_bytes_at_rest", rest.allocated_bytes as f64),
            ("cached_unused_bytes", held as f64),
            ("empty_cache_returns_bytes", releasable as f64),
        ]),
        fix: "Call `torch.cuda.empty_cache()` when the service goes idle (it frees every fully \
              free segment to the driver, for other processes), or set \
              `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8`."
            .into(),
        predicted_saving_bytes: releasable,
    })
}
