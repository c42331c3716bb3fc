//! Aggregation, once for every driver: a driver's per-stage measurements folded into the
//! [`RunResult`]'s stages, levels (one row per concurrency or rate) and run-wide request
//! counts, latency and throughput.
//!
//! Design note: a driver measures ([`Measured`]: one [`StageMeasure`] per stage that ran,
//! and the rest of the result it alone can fill: timeline, peaks, OOMs, its own extras);
//! [`fold`] is the one place those stages become results, so `loadtest` and `http` cannot
//! drift apart. Latency travels as a histogram of microseconds per stage: the in-process
//! engine's records are recorded into one ([`latency_histogram`], the same bounds the
//! percentiles were always read with, so its figures are exact as before) and the HTTP
//! client's are its own per-thread histograms merged (a million answers a second would not
//! fit as records), so merging stages into levels and the run is adding histograms.

use std::collections::HashMap;

use hdrhistogram::Histogram;

use crate::results::{
    ConcurrencyResult, RateResult, RequestSummary, RunResult, StageResult, Throughput,
};
use crate::timeline::{histogram_stats, Outcome, RequestRecord};

/// One stage as a driver measured it.
#[derive(Debug, Clone, Default)]
pub struct StageMeasure {
    pub index: usize,
    /// The stage's load: workers (closed model) or requests per second (open); stages at
    /// one load merge into one level.
    pub load: f64,
    /// Workers, or the most requests in flight (open model).
    pub concurrency: usize,
    pub workers_started: usize,
    pub start_s: f64,
    pub end_s: f64,
    pub requests: RequestSummary,
    /// Latency of the successful requests (µs); `requests.ok` of them are real.
    pub latency: Option<Histogram<u64>>,
    /// Answers shed with 503 (HTTP runs).
    pub shed: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
}

/// What a driver's `drive` returns: the result as far as the driver alone can fill it
/// (stages, levels and the run-wide requests, latency and throughput are left to
/// [`fold`]) and its stages.
#[derive(Debug)]
pub struct Measured {
    pub result: RunResult,
    pub stages: Vec<StageMeasure>,
    /// Levels are rates (open model: `http.by_rate`), else concurrencies (`by_concurrency`).
    pub open: bool,
}

/// The stages folded into the result; see the module note.
pub fn fold(m: Measured) -> RunResult {
    let Measured {
        mut result,
        stages: measured,
        open,
    } = m;
    let stats = |h: Option<&Histogram<u64>>, req: &RequestSummary| histogram_stats(h, req.ok);
    let stages: Vec<StageResult> = measured
        .iter()
        .map(|s| StageResult {
            index: s.index,
            concurrency: s.concurrency,
            start_s: s.start_s,
            end_s: s.end_s,
            requests: s.requests,
            latency: stats(s.latency.as_ref(), &s.requests),
            throughput: Throughput::of(&s.requests, s.end_s - s.start_s),
            peak_allocated_bytes: s.peak_allocated_bytes,
            peak_reserved_bytes: s.peak_reserved_bytes,
            workers_started: s.workers_started,
        })
        .collect();
    let merged = |ks: &mut dyn Iterator<Item = usize>| {
        let mut req = RequestSummary::default();
        let mut h: Option<Histogram<u64>> = None;
        let mut shed = 0;
        for k in ks {
            let s = &measured[k];
            req.add(&s.requests);
            merge_into(&mut h, s.latency.as_ref());
            shed += s.shed;
        }
        (req, h, shed)
    };
    let mut by_concurrency = Vec::new();
    let mut by_rate = Vec::new();
    for l in levels(&measured) {
        let (req, h, shed) = merged(&mut l.stages.iter().copied());
        let latency = stats(h.as_ref(), &req);
        if open {
            by_rate.push(RateResult {
                rate_per_s: l.key,
                requests: req,
                shed,
                latency,
                throughput: Throughput::of(&req, l.secs),
                peak_allocated_bytes: l.peak_allocated_bytes,
                peak_reserved_bytes: l.peak_reserved_bytes,
            });
        } else {
            by_concurrency.push(l.concurrency_result(req, latency, result.baseline_bytes));
        }
    }
    let (requests, h, _) = merged(&mut (0..measured.len()));
    result.requests = requests;
    result.latency = stats(h.as_ref(), &requests);
    result.throughput = Throughput::of(&requests, result.wall_s);
    result.stages = stages;
    result.by_concurrency = by_concurrency;
    if let Some(http) = result.http.as_mut() {
        http.by_rate = by_rate;
    }
    result
}

fn merge_into(into: &mut Option<Histogram<u64>>, h: Option<&Histogram<u64>>) {
    if let Some(h) = h {
        match into {
            // Every histogram here has the same bounds, so adding cannot fail.
            Some(i) => {
                let _ = i.add(h);
            }
            None => *into = Some(h.clone()),
        }
    }
}

/// The successful requests' latencies as a histogram (the bounds every latency here is
/// read with: 1 µs to 24 h, 3 significant digits).
pub fn latency_histogram(records: &[&RequestRecord]) -> Option<Histogram<u64>> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 24 * 3_600_000_000, 3).ok()?;
    for r in records.iter().filter(|r| r.outcome == Outcome::Ok) {
        // saturating_record clamps to the bounds instead of failing on 0 µs or > 24 h.
        h.saturating_record(r.latency_us.max(1));
    }
    Some(h)
}

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

/// Stages held at one load (workers, or requests per second).
#[derive(Debug, Clone, Default)]
struct Level {
    key: f64,
    /// Indices into the stages it merges, in run order.
    stages: Vec<usize>,
    secs: f64,
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
}

impl Level {
    /// The level as a row of `by_concurrency`.
    fn concurrency_result(
        &self,
        requests: RequestSummary,
        latency: crate::results::LatencyStats,
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

/// Stages grouped by their load, lowest first. A plan of thousands of short stages must
/// cost time linear in stages, not stages times levels: levels are found by the key's bits.
fn levels(stages: &[StageMeasure]) -> Vec<Level> {
    let mut out: Vec<Level> = Vec::new();
    let mut index: HashMap<u64, usize> = HashMap::new();
    for (k, st) in stages.iter().enumerate() {
        let i = *index.entry(st.load.to_bits()).or_insert_with(|| {
            out.push(Level {
                key: st.load,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::latency_stats;

    fn rec(stage: usize, us: u64, outcome: Outcome) -> RequestRecord {
        RequestRecord {
            worker: 0,
            request: 0,
            stage,
            concurrency: 1,
            start_s: 0.0,
            latency_us: us,
            items: 1,
            outcome,
        }
    }

    /// Stages at one load merge into one level, and the run-wide latency read from the
    /// merged histograms is the one read from all the records at once.
    #[test]
    fn fold_merges_stages_into_levels_and_the_run() {
        let recs = [
            rec(0, 1000, Outcome::Ok),
            rec(0, 3000, Outcome::Oom),
            rec(1, 5000, Outcome::Ok),
            rec(2, 7000, Outcome::Ok),
        ];
        let stage = |i: usize, load: f64, t: f64| {
            let rs: Vec<&RequestRecord> = recs.iter().filter(|r| r.stage == i).collect();
            StageMeasure {
                index: i,
                load,
                concurrency: load as usize,
                workers_started: load as usize,
                start_s: t,
                end_s: t + 1.0,
                requests: summarize(&rs),
                latency: latency_histogram(&rs),
                peak_allocated_bytes: 10 * i as u64,
                ..Default::default()
            }
        };
        let r = fold(Measured {
            result: RunResult {
                wall_s: 3.0,
                baseline_bytes: 0,
                ..crate::report::testdata::synthetic()
            },
            stages: vec![stage(0, 4.0, 0.0), stage(1, 1.0, 1.0), stage(2, 4.0, 2.0)],
            open: false,
        });
        assert_eq!(r.requests.total, 4);
        assert_eq!(r.requests.oom, 1);
        let ok: Vec<u64> = vec![1000, 5000, 7000];
        assert_eq!(r.latency.p99_ms, latency_stats(ok.iter()).p99_ms);
        assert_eq!(r.latency.count, 3);
        assert_eq!(r.stages.len(), 3);
        let levels: Vec<(usize, u64, f64)> = r
            .by_concurrency
            .iter()
            .map(|c| {
                (
                    c.concurrency,
                    c.requests.total,
                    c.peak_allocated_bytes as f64,
                )
            })
            .collect();
        assert_eq!(levels, vec![(1, 1, 10.0), (4, 3, 20.0)]);
    }
}
