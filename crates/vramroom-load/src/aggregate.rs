//! Aggregation shared by every driver: requests into summaries and latency stats, stages
//! into levels (one row per concurrency or rate).
//!
//! Design note: the in-process engine keeps one record per request and the HTTP client
//! keeps per-thread histograms (a million requests a second would not fit as records), so
//! each driver counts its own requests; what a level is (stages at one load merged, their
//! seconds summed, their peaks the highest) and how a level becomes a
//! [`ConcurrencyResult`] is written here once, so `loadtest` and `http` cannot drift apart.

use std::collections::HashMap;

use crate::results::{ConcurrencyResult, LatencyStats, RequestSummary, StageResult, Throughput};
use crate::timeline::{latency_stats, Outcome, RequestRecord};

/// Requests by outcome; stopped requests (cut off at the end of the run) are counted
/// apart and not in `total`.
pub fn summarize(records: &[&RequestRecord]) -> RequestSummary {
    let mut s = RequestSummary::default();
    for r in records {
        if r.outcome == Outcome::Stopped {
            s.stopped += 1;
            continue;
        }
        s.total += 1;
        match r.outcome {
            Outcome::Ok => {
                s.ok += 1;
                s.items += r.items;
            }
            Outcome::Oom => s.oom += 1,
            Outcome::Error(_) => s.other_errors += 1,
            Outcome::Stopped => {}
        }
    }
    s
}

/// Latency of the successful requests: a failed request's time says nothing of service.
pub fn latency(records: &[&RequestRecord]) -> LatencyStats {
    let v: Vec<u64> = records
        .iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .map(|r| r.latency_us)
        .collect();
    latency_stats(v.iter())
}

/// Stages held at one load (workers, or requests per second).
#[derive(Debug, Clone, Default)]
pub struct Level {
    pub key: f64,
    /// Indices into the stages it merges, in run order.
    pub stages: Vec<usize>,
    pub secs: f64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
}

impl Level {
    /// The level as a row of `by_concurrency`.
    pub fn concurrency_result(
        &self,
        requests: RequestSummary,
        latency: LatencyStats,
        baseline: u64,
    ) -> ConcurrencyResult {
        ConcurrencyResult {
            concurrency: self.key as usize,
            requests,
            latency,
            throughput: Throughput::of(&requests, self.secs),
            peak_allocated_bytes: self.peak_allocated_bytes,
            peak_reserved_bytes: self.peak_reserved_bytes,
            peak_above_base_bytes: self.peak_allocated_bytes.saturating_sub(baseline),
        }
    }
}

/// Stages grouped by `key`, lowest first. A plan of thousands of short stages must cost
/// time linear in stages, not stages times levels: levels are found by the key's bits.
pub fn levels(stages: &[StageResult], key: impl Fn(&StageResult) -> f64) -> Vec<Level> {
    let mut out: Vec<Level> = Vec::new();
    let mut index: HashMap<u64, usize> = HashMap::new();
    for (k, st) in stages.iter().enumerate() {
        let key = key(st);
        let i = *index.entry(key.to_bits()).or_insert_with(|| {
            out.push(Level {
                key,
                ..Default::default()
            });
            out.len() - 1
        });
        let l = &mut out[i];
        l.stages.push(k);
        l.secs += st.end_s - st.start_s;
        l.peak_allocated_bytes = l.peak_allocated_bytes.max(st.peak_allocated_bytes);
        l.peak_reserved_bytes = l.peak_reserved_bytes.max(st.peak_reserved_bytes);
    }
    out.sort_by(|a, b| a.key.total_cmp(&b.key));
    out
}
