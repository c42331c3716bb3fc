//! The probe (`python/vramroom/probe.py`) from the client's side, and the findings of an
//! HTTP run.
//!
//! Design note: when the metrics endpoint is a probe (it exports `vramroom_probe_info`),
//! the client fetches the service's allocator snapshot at the end of the run (`GET
//! /snapshot`, the pickle of `torch.cuda.memory._snapshot()`), and the snapshot the probe's
//! OOM observer dumped if the service ran out of memory (`GET /oom_snapshot`). vramroom-trace
//! reads them; the run's own trace is replayed under the service's allocator config and
//! the what-if configs (as `vramroom loadtest` replays its own), and the findings are
//! decided from those replays and the scraped numbers by the one diagnosis engine
//! (`crate::diagnose::diagnose_service`), with the same ids, floors and wording as the
//! in-process diagnosis:
//! - `out_of_memory`: the service's OOM counter rose during the run; with the OOM
//!   snapshot, the allocator state at that moment (reserved, allocated, the largest free
//!   block) and whether the trace fits under `expandable_segments`;
//! - `fragmentation`: alloc retries during the run, or a replay under another config that
//!   needs less reserved memory, or much free memory inside split segments;
//! - `cache_held`: after the load, the cache still reserves far more than is allocated;
//!   what `empty_cache()` would return is the snapshot's fully free segments.

use std::time::Duration;

use hyper::Method;
use vramroom_alloc::Snapshot;

pub use crate::diagnose::segment_state;
use crate::http::client;
use crate::results::*;

/// The probe's base URL from its metrics URL: `http://h:p/metrics` → `http://h:p`.
pub fn probe_base(metrics_url: &str) -> String {
    let t = metrics_url.trim();
    let after_scheme = t.find("://").map(|i| i + 3).unwrap_or(0);
    match t[after_scheme..].find('/') {
        Some(i) => t[..after_scheme + i].to_string(),
        None => t.to_string(),
    }
}

async fn fetch_pickle(base: &str, path: &str, timeout: Duration) -> Result<Snapshot, String> {
    let url = format!("{base}{path}");
    let target = client::resolve(&url).map_err(|e| e.to_string())?;
    let limit = crate::http::limits::snapshot();
    let (status, body) = client::get_limited(&target, timeout, Method::GET, limit).await?;
    if status != 200 {
        return Err(format!("GET {url}: HTTP {status}"));
    }
    vramroom_trace::read_snapshot(&body).map_err(|e| format!("GET {url}: {e}"))
}

/// Fetches the snapshot (and the OOM snapshot when `ooms > 0`) from the probe at `base`.
pub async fn fetch(
    base: &str,
    timeout: Duration,
    ooms: u64,
) -> (ProbeResult, Option<Snapshot>, Option<Snapshot>) {
    let mut p = ProbeResult {
        url: base.to_string(),
        ooms,
        ..Default::default()
    };
    let snap = match fetch_pickle(base, "/snapshot", timeout).await {
        Ok(s) => {
            p.snapshot_fetched = true;
            p.snapshot_segments = s.segments.len();
            p.trace_entries = s.device_traces.iter().map(Vec::len).sum();
            p.alloc_conf = s.allocator_settings.pytorch_cuda_alloc_conf.clone();
            if p.trace_entries == 0 {
                p.notes.push(
                    "the snapshot has no trace (the service does not record memory history: \
                     start the probe with record_history=True for the what-if replays)"
                        .into(),
                );
            }
            Some(s)
        }
        Err(e) => {
            p.notes.push(format!("snapshot: {e}"));
            None
        }
    };
    let oom = if ooms > 0 {
        match fetch_pickle(base, "/oom_snapshot", timeout).await {
            Ok(s) => {
                p.oom_snapshot_fetched = true;
                Some(s)
            }
            Err(e) => {
                p.notes.push(format!("OOM snapshot: {e}"));
                None
            }
        }
    } else {
        None
    };
    (p, snap, oom)
}

/// The findings of a finished HTTP run (see the module docs).
pub fn findings(r: &RunResult) -> Vec<Finding> {
    crate::diagnose::diagnose_service(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testdata::synthetic_http;
    use vramroom_alloc::BlockState;

    const MIB: u64 = 1 << 20;

    /// An HTTP run on a 1 GiB service: allocated 100 MiB at rest after a peak of `peak`.
    fn run_with(peak: u64, retries: i64) -> RunResult {
        let mut r = synthetic_http(false);
        r.capacity_bytes = 1 << 30;
        r.findings.clear();
        r.errors.oom = 0;
        r.peaks.allocated_bytes = peak;
        r.peaks.reserved_bytes = 1 << 30;
        r.peaks.alloc_retries = retries;
        let last = r.timeline.last_mut().unwrap();
        last.allocated_bytes = 100 * MIB;
        last.reserved_bytes = 1 << 30;
        r
    }

    fn ids(r: &RunResult) -> Vec<&'static str> {
        findings(r).iter().map(|f| f.id.as_str()).collect()
    }

    #[test]
    fn cache_held_only_after_a_burst_that_is_over() {
        let r = run_with(800 * MIB, 0);
        let f = findings(&r);
        let c = f
            .iter()
            .find(|f| f.id == FindingId::CacheHeld)
            .expect("cache_held");
        assert_eq!(c.predicted_saving_bytes, (1 << 30) - 100 * MIB);
        // The load never allocated much more than what stays: segment granularity, not a
        // burst (a small model in big segments).
        assert!(!ids(&run_with(110 * MIB, 0)).contains(&"cache_held"));
    }

    #[test]
    fn fragmentation_needs_retries_or_a_better_replay_not_a_ratio() {
        // Reserved 1 GiB over 110 MiB allocated, free bytes in split segments: no retry, no
        // replay, so no finding.
        let mut r = run_with(110 * MIB, 0);
        r.peaks.inactive_split_bytes = 500 * MIB;
        assert!(!ids(&r).contains(&"fragmentation"));
        r.peaks.alloc_retries = 2;
        assert!(ids(&r).contains(&"fragmentation"));
        // A replay of the service's trace that needs 300 MiB less under expandable segments.
        let mut r = run_with(110 * MIB, 0);
        let row = |c: &str, b: u64| WhatIfRow {
            alloc_conf: c.into(),
            peak_reserved_bytes: b,
            ..Default::default()
        };
        r.what_if = vec![
            row("", 900 * MIB),
            row("expandable_segments:True", 600 * MIB),
        ];
        let f = findings(&r);
        let g = f.iter().find(|f| f.id == FindingId::Fragmentation).unwrap();
        assert_eq!(g.predicted_saving_bytes, 300 * MIB);
        assert!(g.fix.contains("expandable_segments:True"), "{}", g.fix);
    }

    #[test]
    fn an_oom_is_critical_with_the_allocator_state_when_the_probe_dumped_it() {
        let mut r = run_with(110 * MIB, 0);
        assert!(!ids(&r).contains(&"out_of_memory"));
        r.errors.oom = 2;
        let f = findings(&r);
        let o = f.iter().find(|f| f.id == FindingId::OutOfMemory).unwrap();
        assert_eq!(o.severity, Severity::Critical);
        assert!(o.evidence.contains("2 out-of-memory errors"));
        assert!(!o.evidence.contains("OOM snapshot"));
        let seg = |free: u64| vramroom_alloc::SegmentInfo {
            total_size: 20 * MIB,
            blocks: vec![
                vramroom_alloc::BlockInfo {
                    address: 0,
                    size: 20 * MIB - free,
                    requested_size: 0,
                    state: BlockState::ActiveAllocated,
                    frames: vramroom_alloc::Stack::empty(),
                },
                vramroom_alloc::BlockInfo {
                    address: 20 * MIB - free,
                    size: free,
                    requested_size: 0,
                    state: BlockState::Inactive,
                    frames: vramroom_alloc::Stack::empty(),
                },
            ],
            device: 0,
            address: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: "large".into(),
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: vramroom_alloc::Stack::empty(),
        };
        r.oom_snapshot = Some(Snapshot {
            segments: vec![seg(8 * MIB), seg(2 * MIB)],
            ..Default::default()
        });
        let o = findings(&r)
            .into_iter()
            .find(|f| f.id == FindingId::OutOfMemory)
            .unwrap();
        assert!(
            o.evidence.contains("40.0 MiB reserved in 2 segments"),
            "{}",
            o.evidence
        );
        assert!(
            o.evidence.contains("largest free block 8.0 MiB"),
            "{}",
            o.evidence
        );
        assert!(o.fix.contains("expandable_segments"), "{}", o.fix);
        assert_eq!(
            segment_state(r.oom_snapshot.as_ref().unwrap()),
            (40 * MIB, 30 * MIB, 8 * MIB)
        );
    }

    #[test]
    fn base_of_a_metrics_url() {
        assert_eq!(
            probe_base("http://127.0.0.1:9400/metrics"),
            "http://127.0.0.1:9400"
        );
        assert_eq!(probe_base("http://h:1"), "http://h:1");
        assert_eq!(probe_base("http://h:1/a/b"), "http://h:1");
    }
}
