//! The HTTP driver's measurements as [`Measured`]: per-thread histograms into one
//! [`StageMeasure`] per stage, memory readings into the timeline, peaks and the service's
//! OOMs, and the HTTP side of the result.
//!
//! Design note: latency here is histograms, not records (a million answers a second would
//! not fit as records), corrected for coordinated omission in the closed model; the stages
//! become stage results, levels (concurrencies or rates) and run-wide figures in the
//! pipeline's one fold ([`crate::aggregate::fold`]), as `loadtest`'s do.

use std::collections::BTreeMap;

use crate::aggregate::{Measured, StageMeasure};
use crate::http::config::HttpConfig;
use crate::http::load::StageLoad;
use crate::http::record::{self, StageAcc, Totals};
use crate::memsource::MemoryReading;
use crate::results::*;

/// A stage as it ran: (index, start_s, end_s).
pub(crate) type StageRun = (usize, f64, f64);
/// A memory tick: (t_s, merged reading, requests in flight).
pub(crate) type Tick = (f64, MemoryReading, usize);

pub(crate) struct Aggregate<'a> {
    pub(crate) cfg: &'a HttpConfig,
    pub(crate) method: String,
    pub(crate) body: String,
    pub(crate) open: bool,
    pub(crate) totals: Totals,
    pub(crate) stages_run: Vec<StageRun>,
    pub(crate) stop_reason: StopReason,
    pub(crate) wall_s: f64,
    pub(crate) readings: Vec<Tick>,
    pub(crate) peak_in_flight: Vec<usize>,
    pub(crate) aborted: u64,
    pub(crate) dropped: u64,
    pub(crate) connections: u64,
    pub(crate) service_ooms: Option<u64>,
    pub(crate) first_stats: BTreeMap<String, i64>,
    pub(crate) last_stats: BTreeMap<String, i64>,
    pub(crate) probe: Option<ProbeResult>,
    pub(crate) shed_reasons: BTreeMap<String, u64>,
    pub(crate) retry_after_answers: u64,
    pub(crate) retry_after_max_s: Option<u64>,
}

fn summary(s: &StageAcc) -> RequestSummary {
    RequestSummary {
        total: s.total,
        ok: s.ok_n,
        oom: s.oom_n,
        other_errors: (s.failed_status_n - s.oom_n.min(s.failed_status_n)) + s.errors_total(),
        items: s.ok_n,
        stopped: 0,
    }
}

impl Aggregate<'_> {
    fn sample(&self, tick: &Tick, prev_ooms: Option<u64>) -> MemorySample {
        let (t, r, in_flight) = (tick.0, &tick.1, tick.2);
        let stage = self
            .stages_run
            .iter()
            .rfind(|s| s.1 <= t)
            .map(|s| s.0)
            .unwrap_or(0);
        let kind = match (prev_ooms, r.num_ooms) {
            (Some(a), Some(b)) if b > a => SampleKind::Oom,
            _ => SampleKind::Periodic,
        };
        MemorySample {
            t_s: t,
            kind,
            stage,
            // Closed: the stage's workers while the load ran; open: requests in flight.
            concurrency: match self.cfg.stages.get(stage).map(|s| s.target) {
                Some(StageLoad::Workers(c)) if t > 0.0 && t <= self.wall_s => c,
                _ => in_flight,
            },
            allocated_bytes: r.allocated.unwrap_or(0),
            reserved_bytes: r.reserved.unwrap_or(0),
            active_bytes: r.active.unwrap_or(0),
            inactive_split_bytes: r.inactive_split.unwrap_or(0),
            device_used_bytes: r.device_used,
            process_used_bytes: r.process_used,
            overhead_bytes: r.overhead(),
            categories: CategoryBytes::default(),
        }
    }

    pub(crate) fn measured(self) -> Measured {
        let cfg = self.cfg;
        // The timeline.
        let mut timeline = Vec::with_capacity(self.readings.len());
        let mut prev = None;
        let mut series: Vec<String> = Vec::new();
        for tick in &self.readings {
            let r = &tick.1;
            timeline.push(self.sample(tick, prev));
            prev = r.num_ooms.or(prev);
            for s in r.series() {
                if !series.iter().any(|x| x == s) {
                    series.push(s.into());
                }
            }
        }
        let capacity = self
            .readings
            .iter()
            .filter_map(|r| r.1.capacity)
            .max()
            .unwrap_or(0);
        let baseline = self
            .readings
            .first()
            .and_then(|r| r.1.allocated)
            .unwrap_or(0);
        let in_stage = |i: usize| {
            let (s0, s1) = self
                .stages_run
                .iter()
                .find(|s| s.0 == i)
                .map(|s| (s.1, s.2))
                .unwrap_or((0.0, 0.0));
            timeline
                .iter()
                .filter(move |m| m.t_s >= s0 && m.t_s <= s1)
                .collect::<Vec<_>>()
        };

        // Stages: the measured latency, corrected in the closed model.
        let empty = StageAcc::default();
        let mut stages = Vec::new();
        let mut http_stages = Vec::new();
        for &(i, s0, s1) in &self.stages_run {
            let acc = self.totals.stages.get(i).unwrap_or(&empty);
            let (lat_h, interval) = match (&acc.ok, self.open) {
                (Some(h), false) => {
                    let (c, iv) = record::corrected(h);
                    (Some(c), Some(iv))
                }
                (h, _) => (h.clone(), None),
            };
            let uncorrected = if self.open {
                acc.ok_raw.as_ref()
            } else {
                acc.ok.as_ref()
            };
            let load = cfg.stages[i].target;
            let peak_flight = self.peak_in_flight.get(i).copied().unwrap_or(0);
            let mem = in_stage(i);
            let concurrency = match load {
                StageLoad::Workers(c) => c,
                StageLoad::Rate(_) => peak_flight,
            };
            stages.push(StageMeasure {
                index: i,
                load: match load {
                    StageLoad::Workers(c) => c as f64,
                    StageLoad::Rate(r) => r,
                },
                concurrency,
                workers_started: concurrency,
                start_s: s0,
                end_s: s1,
                requests: summary(acc),
                latency: lat_h,
                shed: acc.shed_n,
                peak_allocated_bytes: mem.iter().map(|m| m.allocated_bytes).max().unwrap_or(0),
                peak_reserved_bytes: mem.iter().map(|m| m.reserved_bytes).max().unwrap_or(0),
            });
            http_stages.push(HttpStageResult {
                index: i,
                concurrency: match load {
                    StageLoad::Workers(c) => Some(c),
                    StageLoad::Rate(_) => None,
                },
                rate_per_s: match load {
                    StageLoad::Rate(r) => Some(r),
                    StageLoad::Workers(_) => None,
                },
                peak_in_flight: peak_flight,
                shed: acc.shed_n,
                status_codes: acc.status_map(),
                latency_uncorrected: record::stats(uncorrected, acc.ok_n),
                shed_latency: record::stats(acc.shed.as_ref(), acc.shed_n),
                correction_interval_ms: interval.map(|us| us as f64 / 1000.0),
            });
        }

        // Run-wide answers (the fold sums the stages' requests and latency).
        let mut all = StageAcc::default();
        for s in &self.totals.stages {
            all.merge(s);
        }
        let mut by_kind = all.error_map();
        for (code, n) in &all.statuses {
            if *code >= 400 && *code != 503 {
                by_kind.insert(format!("status_{code}"), *n);
            }
        }

        // Answers over time, at most 600 buckets.
        let status_timeline = buckets(&self.totals, 600);

        // Peaks from the samples, refined by the service's own peak gauges when they rose
        // during the run (a sampler misses what happens between ticks).
        let maxs = |f: fn(&MemorySample) -> u64| timeline.iter().map(f).max().unwrap_or(0);
        let mut peaks = Peaks {
            allocated_bytes: maxs(|s| s.allocated_bytes),
            reserved_bytes: maxs(|s| s.reserved_bytes),
            active_bytes: maxs(|s| s.active_bytes),
            inactive_split_bytes: maxs(|s| s.inactive_split_bytes),
            allocated_t_s: timeline
                .iter()
                .max_by_key(|s| s.allocated_bytes)
                .map(|s| s.t_s)
                .unwrap_or(0.0),
            ..Default::default()
        };
        let rose = |f: fn(&MemoryReading) -> Option<u64>| {
            let a = self.readings.iter().find_map(|r| f(&r.1))?;
            let b = self.readings.iter().rev().find_map(|r| f(&r.1))?;
            (b > a).then_some(b)
        };
        if let Some(m) = rose(|r| r.max_allocated) {
            peaks.allocated_bytes = peaks.allocated_bytes.max(m);
        }
        if let Some(m) = rose(|r| r.max_reserved) {
            peaks.reserved_bytes = peaks.reserved_bytes.max(m);
        }
        let stat = |m: &BTreeMap<String, i64>, k: &str| m.get(k).copied().unwrap_or(0);
        if !self.last_stats.is_empty() {
            peaks.alloc_retries = (stat(&self.last_stats, "num_alloc_retries")
                - stat(&self.first_stats, "num_alloc_retries"))
            .max(0);
            let split_peak = stat(&self.last_stats, "inactive_split_bytes.all.peak");
            if split_peak > stat(&self.first_stats, "inactive_split_bytes.all.peak") {
                peaks.inactive_split_bytes = peaks.inactive_split_bytes.max(split_peak as u64);
            }
        }
        peaks.above_base_bytes = peaks.allocated_bytes.saturating_sub(baseline);
        crate::memsource::fill_peaks(&mut peaks, &timeline);

        // OOMs the service reported, one record per rise of its counter.
        let mut ooms = Vec::new();
        let mut prev: Option<u64> = None;
        for tick in &self.readings {
            let (t, r) = (&tick.0, &tick.1);
            if let (Some(a), Some(b)) = (prev, r.num_ooms) {
                if b > a && ooms.len() < MAX_OOM_RECORDS {
                    let s = self.sample(tick, prev);
                    ooms.push(OomRecord {
                        t_s: *t,
                        stage: s.stage,
                        concurrency: s.concurrency,
                        worker: 0,
                        request: 0,
                        requested_bytes: None,
                        message: format!(
                            "the service's OOM counter rose from {a} to {b} (seen at the scrape at t={t:.2}s)"
                        ),
                        allocated_bytes: s.allocated_bytes,
                        reserved_bytes: s.reserved_bytes,
                        categories: CategoryBytes::default(),
                        memory_stats: BTreeMap::new(),
                        memory_summary: String::new(),
                    });
                }
            }
            prev = r.num_ooms.or(prev);
        }

        let describe_stages = cfg
            .stages
            .iter()
            .map(|s| {
                let l = match s.target {
                    StageLoad::Workers(1) => "1 worker".to_string(),
                    StageLoad::Workers(c) => format!("{c} workers"),
                    StageLoad::Rate(r) => format!("{r}/s"),
                };
                match s.duration {
                    Some(d) => format!("{l} for {:.3}s", d.as_secs_f64()).replace(".000s", "s"),
                    None => l,
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let model = if self.open { "open" } else { "closed" };
        let description = format!(
            "{} {} — {model} model: {describe_stages}{}",
            self.method,
            cfg.url,
            cfg.max_requests
                .map(|n| format!(", at most {n} requests"))
                .unwrap_or_default()
        );
        let load = LoadInfo {
            mode: if cfg.stages.len() > 1 {
                "stages"
            } else if cfg.stages[0].duration.is_none() {
                "requests"
            } else {
                "fixed"
            }
            .into(),
            stages: cfg
                .stages
                .iter()
                .map(|s| StageSpecInfo {
                    concurrency: match s.target {
                        StageLoad::Workers(c) => c,
                        StageLoad::Rate(_) => 0,
                    },
                    duration_s: s.duration.map(|d| d.as_secs_f64()),
                })
                .collect(),
            max_requests: cfg.max_requests,
            time_limit_s: None,
            sample_period_ms: cfg.metrics_interval.as_secs_f64() * 1e3,
        };
        let service_ooms = self.service_ooms;
        let result = RunResult {
            schema_version: SCHEMA_VERSION,
            vramroom_version: env!("CARGO_PKG_VERSION").into(),
            scenario: ScenarioInfo {
                name: cfg.url.clone(),
                kind: "http".into(),
                model: String::new(),
                batch: 0,
                input: self.body.clone(),
                seed: cfg.seed,
                description,
                ..Default::default()
            },
            load,
            device: "service".into(),
            capacity_bytes: capacity,
            alloc_conf: String::new(),
            wall_s: self.wall_s,
            stop_reason: self.stop_reason,
            baseline_bytes: baseline,
            // Folded from the stages by the pipeline.
            requests: RequestSummary::default(),
            latency: LatencyStats::default(),
            throughput: Throughput::default(),
            errors: ErrorCounts {
                oom: service_ooms.unwrap_or(0).max(all.oom_n),
                by_kind,
            },
            stages: Vec::new(),
            by_concurrency: Vec::new(),
            timeline,
            peaks,
            ooms,
            oom_search: None,
            findings: Vec::new(),
            what_if: Vec::new(),
            what_if_check: WhatIfCheck::default(),
            thresholds: Vec::new(),
            final_memory_stats: self.last_stats.clone(),
            final_memory_summary: String::new(),
            snapshot: None,
            oom_snapshot: None,
            memory_sources: Vec::new(),
            http: Some(HttpResult {
                url: cfg.url.clone(),
                method: self.method.clone(),
                model: model.into(),
                arrival: self.open.then(|| cfg.arrival.as_str().to_string()),
                max_connections: self.open.then_some(cfg.max_connections),
                body: self.body.clone(),
                timeout_ms: cfg.timeout.as_secs_f64() * 1e3,
                latency_correction: if self.open {
                    "intended_send_time"
                } else {
                    "expected_interval"
                }
                .into(),
                status_codes: all.status_map(),
                shed: all.shed_n,
                shed_latency: record::stats(all.shed.as_ref(), all.shed_n),
                latency_uncorrected: record::stats(
                    if self.open {
                        all.ok_raw.as_ref()
                    } else {
                        all.ok.as_ref()
                    },
                    all.ok_n,
                ),
                dropped: self.dropped,
                aborted: self.aborted,
                bytes_sent: all.bytes_out,
                bytes_received: all.bytes_in,
                connections_opened: self.connections,
                stages: http_stages,
                by_rate: Vec::new(),
                status_timeline,
                memory_series: series,
                service_ooms,
                probe: self.probe,
                stop_hint: None,
                shed_reasons: self.shed_reasons,
                retry_after_answers: self.retry_after_answers,
                retry_after_max_s: self.retry_after_max_s,
                prediction: None,
            }),
        };
        Measured {
            result,
            stages,
            open: self.open,
        }
    }
}

/// Answers by class over time, merged to at most `max` buckets.
fn buckets(t: &Totals, max: usize) -> Vec<StatusBucket> {
    let n = t.buckets.len();
    if n == 0 {
        return Vec::new();
    }
    let k = n.div_ceil(max.max(1)).max(1);
    let w = t.bucket_s * k as f64;
    t.buckets
        .chunks(k)
        .enumerate()
        .map(|(i, c)| {
            let mut b = StatusBucket {
                t_s: i as f64 * w,
                width_s: w,
                ..Default::default()
            };
            let mut lat = 0u64;
            for x in c {
                b.ok += x.ok;
                b.shed += x.shed;
                b.client_error += x.client_error;
                b.server_error += x.server_error;
                b.transport_error += x.transport_error;
                lat += x.ok_latency_sum_us;
            }
            b.mean_latency_ms = (b.ok > 0).then(|| lat as f64 / b.ok as f64 / 1000.0);
            b
        })
        .collect()
}
