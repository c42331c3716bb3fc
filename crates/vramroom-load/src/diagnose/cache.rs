//! `cache_held`: after a burst, the cache still holds memory the load no longer needs.
//!
//! One rule for in-process and HTTP runs: [`cache_held`] and [`service_cache_held`] only
//! find the sample at rest and what the load still needs; [`decide`] and [`finding`] are the
//! rule (the same [`Rules::load_drop`], floors and saving) and its wording.
use vramroom_alloc::BlockState;

use super::rules::{mib, nums, Rules};
use crate::results::*;

/// Where the memory at rest was seen, for the wording.
enum Seen {
    /// An in-process run whose last stage ran `workers` workers.
    Run { workers: usize },
    /// A service, after the load.
    Service,
}

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
    decide(r, rules, rest, recent)?;
    Some(finding(
        r,
        rest,
        recent,
        Seen::Run {
            workers: last.concurrency as usize,
        },
    ))
}

pub(super) fn has(r: &RunResult, series: &str) -> bool {
    r.http
        .as_ref()
        .is_some_and(|h| h.memory_series.iter().any(|s| s == series))
}

pub(super) fn service_cache_held(r: &RunResult, rules: &Rules) -> Option<Finding> {
    if !(has(r, "allocated") && has(r, "reserved")) {
        return None;
    }
    // The last sample is taken after the load: the service at rest, so what it still
    // needs is what stays allocated. Without stages to tell a burst from steady use, the
    // cache must also hold at least as much as is live before it is worth freeing.
    let rest = r.timeline.last()?;
    if rest.reserved_bytes < 2 * rest.allocated_bytes.max(1) {
        return None;
    }
    decide(r, rules, rest, rest.allocated_bytes)?;
    Some(finding(r, rest, rest.allocated_bytes, Seen::Service))
}

/// The rule: the load fell (what it still needs, `recent`, is at most
/// [`Rules::load_drop`] of the run's peak allocated), and both the cache held at rest and
/// what is reserved beyond that need matter against the capacity.
fn decide(r: &RunResult, rules: &Rules, rest: &MemorySample, recent: u64) -> Option<()> {
    let held = rest.reserved_bytes.saturating_sub(rest.allocated_bytes);
    let dropped = recent as f64 <= rules.load_drop * r.peaks.allocated_bytes as f64;
    let excess = rest.reserved_bytes.saturating_sub(recent);
    let floor = rules.floor(r.capacity_bytes);
    (dropped && excess >= floor && held >= floor).then_some(())
}

fn finding(r: &RunResult, rest: &MemorySample, recent: u64, seen: Seen) -> Finding {
    let held = rest.reserved_bytes.saturating_sub(rest.allocated_bytes);
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
    let mut numbers = nums(&[
        ("reserved_bytes_at_rest", rest.reserved_bytes as f64),
        ("allocated_bytes_at_rest", rest.allocated_bytes as f64),
        ("cached_unused_bytes", held as f64),
        ("empty_cache_returns_bytes", releasable as f64),
    ]);
    let (title, evidence, fix) = match seen {
        Seen::Run { workers } => {
            numbers.insert("last_stage_recent_allocated_bytes".into(), recent as f64);
            (
                "The cache holds memory for a burst that is over",
                format!(
                    "After the load fell to {} workers (at most {} allocated late in the last \
                     stage, against {} at the run's peak), the allocator still reserves {} with \
                     {} allocated: {} is cached but unused; empty_cache() would return {} to \
                     the device.",
                    workers,
                    mib(recent as f64),
                    mib(r.peaks.allocated_bytes as f64),
                    mib(rest.reserved_bytes as f64),
                    mib(rest.allocated_bytes as f64),
                    mib(held as f64),
                    mib(releasable as f64)
                ),
                FIX,
            )
        }
        Seen::Service => (
            "The service's cache holds memory for a burst that is over",
            format!(
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
            "Call `torch.cuda.empty_cache()` when the service goes idle (it frees every fully \
             free segment to the driver, for other processes), or set \
             `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8`.",
        ),
    };
    Finding {
        id: FindingId::CacheHeld,
        title: title.into(),
        severity: Severity::Info,
        evidence,
        numbers,
        fix: fix.into(),
        predicted_saving_bytes: releasable,
    }
}

/// The fix of a run's held cache, shared with the traced rule (traced.rs).
pub(crate) const FIX: &str =
    "Call `torch.cuda.empty_cache()` once a burst is over (it frees every fully free \
    segment to the driver), or set `PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8` \
    so the allocator reclaims old cached blocks itself.";
