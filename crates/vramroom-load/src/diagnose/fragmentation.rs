//! `fragmentation`: memory the caching allocator reserved because its free cache was in the
//! wrong pieces. One rule for a load test's own allocator and for a service's (an HTTP run,
//! read through the probe): the same evidence (alloc retries, the what-if replay) decides.
use std::collections::BTreeMap;

use super::rules::{mib, nums, Rules};
use super::whatif::what_if_table;
use crate::results::*;

/// `leak`/`demand`: a leak or demand over the capacity explains the run's OOMs.
pub(super) fn fragmentation(
    r: &RunResult,
    rules: &Rules,
    leak: bool,
    demand: bool,
) -> Option<Finding> {
    let ooms_explained = leak || demand;
    let p = &r.peaks;
    let waste = p.reserved_bytes.saturating_sub(p.allocated_bytes);
    let ratio = p.reserved_bytes as f64 / p.allocated_bytes.max(1) as f64;
    let floor = rules.floor(r.capacity_bytes);
    let oom_waste = r
        .ooms
        .iter()
        .map(|o| o.reserved_bytes.saturating_sub(o.allocated_bytes))
        .max()
        .unwrap_or(0);
    // The replay of the run's own trace is evidence only when its own-config row agrees
    // with the run (it starts from an empty allocator and saw every event).
    let own = r.what_if.first().filter(|_| r.what_if_check.agrees);
    let best = best_config(&r.what_if);
    // OOMs another config would have avoided: the one thing that makes fragmentation the
    // cause of a run's OOMs rather than the demand.
    let avoided = match (own, best) {
        (Some(o), Some(b)) => (o.num_ooms - b.num_ooms).max(0) as u64,
        _ => 0,
    };
    // A replay re-issues the recorded requests only: a request that OOMed in the run and
    // fits in the replay made none of its later allocations. So when a leak explains the
    // OOMs (any config runs out once it has grown) the avoided count is no evidence, and
    // when demand does, only the OOM search under that config (which runs whole requests)
    // can say it helps.
    let material = avoided >= 1
        && avoided as f64
            >= rules.avoidable_oom_share * own.map(|o| o.num_ooms).unwrap_or(0) as f64
        && !leak
        && (!demand
            || r.oom_search
                .as_ref()
                .is_some_and(|s| s.recommended.is_some()));
    // Every OOM is preceded by a retry (the allocator flushes its cache first): only
    // retries that succeeded are a cost of their own.
    let retries_ok = (p.alloc_retries.max(0) as u64).saturating_sub(r.errors.oom);
    // Reserved above allocated alone is no evidence: a small model on 20 MiB segments shows
    // a high ratio with nothing wasted. What counts is memory reserved *because* the free
    // cache was in the wrong pieces, retries, OOMs with much cached-but-free memory — the
    // last two only while neither the demand nor a leak explains the run's OOMs, since a
    // device filled by either shows both.
    let frag = p.fragmented_segment_bytes;
    let fires = (frag >= floor && ratio >= rules.frag_ratio)
        || material
        || (!ooms_explained && (retries_ok > 0 || oom_waste >= floor));
    if !fires {
        return None;
    }
    let table = what_if_table(&r.what_if);
    // The saving reads the replay's own rows whether or not the own-config row matched the
    // run: both rows come from one replay of one log, so their difference is measured the
    // same way every time, where the fallback (the fragmented bytes) is an upper bound of
    // another kind. Choosing by `agrees` made one scenario say 30.29 MiB in one run and
    // 2.00 MiB in the next.
    let saving = match (r.what_if.first(), best) {
        (Some(o), Some(b)) => o.peak_reserved_bytes.saturating_sub(b.peak_reserved_bytes),
        // No replay to ask: the fragmented segments are the upper bound of what a
        // fragmentation-free allocator would not have reserved.
        _ => frag.min(waste),
    };
    let fix = match (best, r.oom_search.as_ref()) {
        // The OOM search ran the whole workload under each config: its recommendation is
        // the verdict's, and a finding must not recommend another.
        (_, Some(search)) => match &search.recommended {
            Some(rc) => format!(
                "Set `PYTORCH_CUDA_ALLOC_CONF={}`, the verdict's recommended config: the OOM \
                 search keeps {} concurrent requests within the budget under it, against {} \
                 under the run's config.",
                rc.alloc_conf,
                rc.verified_safe_load
                    .map_or("none".into(), |v| v.to_string()),
                search
                    .verified_safe_load
                    .map_or("none".into(), |v| v.to_string())
            ),
            None => "No allocator config tried does better under load (the OOM search ran \
                     each): the waste comes from requests of many sizes whose lifetimes \
                     interleave. Pad the variable dimension to a few buckets (e.g. sequence \
                     lengths to multiples of 64) so freed blocks fit the next request."
                .into(),
        },
        (best, None) => match best {
            Some(b) if material => format!(
                "Set `PYTORCH_CUDA_ALLOC_CONF={}`: the replay of this run's trace under it has {} \
             OOMs instead of {} and peaks at {} reserved.",
                b.alloc_conf,
                b.num_ooms,
                own.map(|o| o.num_ooms).unwrap_or(0),
                mib(b.peak_reserved_bytes as f64)
            ),
            Some(b) if saving > 0 => format!(
                "Set `PYTORCH_CUDA_ALLOC_CONF={}`: the replay of this run's trace under it peaks \
             at {} reserved instead of {}.",
                b.alloc_conf,
                mib(b.peak_reserved_bytes as f64),
                mib(own
                    .map(|o| o.peak_reserved_bytes)
                    .unwrap_or(p.reserved_bytes) as f64)
            ),
            Some(_) if own.is_some() => {
                "No allocator config helps this trace much (see the what-if table): the \
              waste comes from requests of many sizes whose lifetimes interleave. Pad the \
              variable dimension to a few buckets (e.g. sequence lengths to multiples of 64) so \
              freed blocks fit the next request."
                    .into()
            }
            _ => {
                "Try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` so segments grow in place \
              instead of splitting, and pad variable sizes to a few buckets."
                    .into()
            }
        },
    };
    Some(Finding {
        id: FindingId::Fragmentation,
        title: "The caching allocator's memory is fragmented".into(),
        // Critical only when the replay shows the OOMs were the cache's fault.
        severity: if material {
            Severity::Critical
        } else {
            Severity::Warning
        },
        evidence: format!(
            "Peak reserved {} against peak allocated {} ({:.2}x); {} new segments ({}) were \
             reserved while the pool already held enough free cache for the request; up to {} \
             free inside split segments; {} alloc retries{}.{}",
            mib(p.reserved_bytes as f64),
            mib(p.allocated_bytes as f64),
            ratio,
            p.fragmented_segment_allocs,
            mib(frag as f64),
            mib(p.inactive_split_bytes as f64),
            p.alloc_retries,
            if oom_waste > 0 {
                format!(
                    "; at an OOM {} was reserved but unallocated",
                    mib(oom_waste as f64)
                )
            } else {
                String::new()
            },
            if table.is_empty() {
                String::new()
            } else if own.is_none() {
                format!(
                    " Replayed peak reserved (not evidence: {}): {table}.",
                    r.what_if_check.note
                )
            } else if avoided > 0 {
                format!(
                    " The replay under {} avoids {avoided} of the run's {} OOMs. Replayed peak \
                     reserved: {table}.",
                    best.map(|b| b.alloc_conf.as_str()).unwrap_or(""),
                    own.map(|o| o.num_ooms).unwrap_or(0)
                )
            } else {
                format!(" Replayed peak reserved: {table}.")
            }
        ),
        numbers: peak_numbers(
            p,
            &[
                ("replay_ooms_avoided", avoided as f64),
                ("oom_reserved_unallocated_bytes", oom_waste as f64),
                ("fragmented_segment_bytes", frag as f64),
                (
                    "fragmented_segment_allocs",
                    p.fragmented_segment_allocs as f64,
                ),
            ],
        ),
        fix,
        predicted_saving_bytes: saving,
    })
}

/// The replay's best other config: the fewest OOMs, then the lowest peak reserved.
fn best_config(what_if: &[WhatIfRow]) -> Option<&WhatIfRow> {
    what_if
        .iter()
        .skip(1)
        .min_by_key(|w| (w.num_ooms, w.peak_reserved_bytes))
}

/// The peak figures both findings report, then each one's own.
fn peak_numbers(p: &Peaks, own: &[(&str, f64)]) -> BTreeMap<String, f64> {
    let ratio = p.reserved_bytes as f64 / p.allocated_bytes.max(1) as f64;
    let mut n = nums(&[
        ("peak_reserved_bytes", p.reserved_bytes as f64),
        ("peak_allocated_bytes", p.allocated_bytes as f64),
        ("reserved_over_allocated", ratio),
        ("inactive_split_bytes_peak", p.inactive_split_bytes as f64),
        ("alloc_retries", p.alloc_retries as f64),
    ]);
    n.extend(nums(own));
    n
}

pub(super) fn service_fragmentation(r: &RunResult, floor: u64) -> Option<Finding> {
    let p = &r.peaks;
    let own = r.what_if.first();
    let best = best_config(&r.what_if);
    let saving = match (own, best) {
        (Some(o), Some(b)) => o.peak_reserved_bytes.saturating_sub(b.peak_reserved_bytes),
        _ => 0,
    };
    let ratio = p.reserved_bytes as f64 / p.allocated_bytes.max(1) as f64;
    // Reserved far above allocated, or free bytes inside split segments, are no evidence
    // alone: a small model in a 20 MiB segment shows both with nothing wasted. What counts
    // is the allocator flushing its cache to retry during the run, or a replay of the
    // service's own trace that needs less memory under another config.
    if !(p.alloc_retries > 0 || saving >= floor) {
        return None;
    }
    let table = what_if_table(&r.what_if);
    let fix = match best {
        Some(b) if saving > 0 => format!(
            "Set `PYTORCH_CUDA_ALLOC_CONF={}` in the service's environment: the replay of its \
             trace under it peaks at {} reserved instead of {}.",
            b.alloc_conf,
            mib(b.peak_reserved_bytes as f64),
            mib(own.map(|o| o.peak_reserved_bytes).unwrap_or(0) as f64)
        ),
        _ => "Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the service's \
              environment so segments grow in place instead of splitting, and pad variable \
              sizes (sequence lengths) to a few buckets."
            .into(),
    };
    Some(Finding {
        id: FindingId::Fragmentation,
        title: "The service's caching allocator is fragmented".into(),
        severity: if r.errors.oom > 0 {
            Severity::Critical
        } else {
            Severity::Warning
        },
        evidence: format!(
            "Peak reserved {} against peak allocated {} ({:.2}x); up to {} free inside split \
             segments; {} alloc retries (cache flushed and retried) during the run.{}",
            mib(p.reserved_bytes as f64),
            mib(p.allocated_bytes as f64),
            ratio,
            mib(p.inactive_split_bytes as f64),
            p.alloc_retries,
            if table.is_empty() {
                String::new()
            } else {
                format!(" Replayed peak reserved of the service's trace: {table}.")
            }
        ),
        numbers: peak_numbers(p, &[("replay_saving_bytes", saving as f64)]),
        fix,
        predicted_saving_bytes: saving,
    })
}
