//! A synthetic [`RunResult`] for the report's tests: three stages, a timeline with peaks and
//! an OOM, an OOM search, findings, a what-if table and thresholds — and text that would
//! break HTML if it were not escaped.

use std::collections::BTreeMap;

use crate::results::*;

const MIB: u64 = 1 << 20;

pub fn synthetic() -> RunResult {
    let conc = [1usize, 4, 8];
    let dur = [2.0, 3.0, 3.0];
    let base = 40 * MIB;
    let mut stages = Vec::new();
    let mut timeline = Vec::new();
    let mut t0 = 0.0;
    for (i, (&c, &d)) in conc.iter().zip(dur.iter()).enumerate() {
        let per = 6 * MIB * c as u64;
        let n = (d / 0.02) as usize;
        for k in 0..n {
            let t = t0 + k as f64 * 0.02;
            let wobble = ((k * 37 % 17) as u64) * MIB / 4;
            let alloc = base + per / 2 + wobble;
            let reserved = base + per + 4 * MIB + wobble.max(MIB);
            timeline.push(MemorySample {
                t_s: t,
                kind: if k % 25 == 7 {
                    SampleKind::Peak
                } else {
                    SampleKind::Periodic
                },
                stage: i,
                concurrency: c,
                allocated_bytes: alloc,
                reserved_bytes: reserved,
                active_bytes: alloc + MIB / 8,
                inactive_split_bytes: reserved - alloc - MIB,
                device_used_bytes: Some(reserved + 16 * MIB),
                // NVML: the process holds reserved plus a context of ~10 MiB.
                process_used_bytes: Some(reserved + 10 * MIB),
                overhead_bytes: Some(10 * MIB),
                categories: CategoryBytes {
                    parameter: base,
                    activation: (alloc - base) / 2,
                    temporary: (alloc - base) / 3,
                    input: (alloc - base) - (alloc - base) / 2 - (alloc - base) / 3,
                    ..Default::default()
                },
            });
        }
        let req = (d * 50.0 * c as f64) as u64;
        let lat = LatencyStats {
            count: req,
            min_ms: 5.0 * c as f64 * 0.6,
            mean_ms: 5.0 * c as f64,
            p50_ms: 4.8 * c as f64,
            p90_ms: 6.5 * c as f64,
            p99_ms: 9.0 * c as f64,
            p999_ms: 12.0 * c as f64,
            max_ms: 14.0 * c as f64,
        };
        let oom = if c == 8 { 3 } else { 0 };
        let rs = RequestSummary {
            total: req + oom,
            ok: req,
            oom,
            other_errors: 0,
            items: req * 4,
            stopped: 0,
        };
        stages.push(StageResult {
            index: i,
            concurrency: c,
            start_s: t0,
            end_s: t0 + d,
            requests: rs,
            latency: lat,
            throughput: Throughput {
                requests_per_s: req as f64 / d,
                items_per_s: 4.0 * req as f64 / d,
            },
            peak_allocated_bytes: base + per / 2 + 4 * MIB,
            peak_reserved_bytes: base + per + 8 * MIB,
            workers_started: c,
        });
        t0 += d;
    }
    let oom_t = 7.1;
    timeline.push(MemorySample {
        t_s: oom_t,
        kind: SampleKind::Oom,
        stage: 2,
        concurrency: 8,
        allocated_bytes: 90 * MIB,
        reserved_bytes: 100 * MIB,
        active_bytes: 90 * MIB,
        inactive_split_bytes: 6 * MIB,
        device_used_bytes: Some(116 * MIB),
        process_used_bytes: Some(110 * MIB),
        overhead_bytes: Some(10 * MIB),
        categories: CategoryBytes {
            parameter: base,
            activation: 30 * MIB,
            temporary: 20 * MIB,
            ..Default::default()
        },
    });
    timeline.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
    let by_concurrency = stages
        .iter()
        .map(|s| ConcurrencyResult {
            concurrency: s.concurrency,
            requests: s.requests,
            latency: s.latency,
            throughput: s.throughput,
            peak_allocated_bytes: s.peak_allocated_bytes,
            peak_reserved_bytes: s.peak_reserved_bytes,
            peak_above_base_bytes: s.peak_allocated_bytes - base,
        })
        .collect::<Vec<_>>();
    let total = RequestSummary {
        total: stages.iter().map(|s| s.requests.total).sum(),
        ok: stages.iter().map(|s| s.requests.ok).sum(),
        oom: 3,
        other_errors: 0,
        items: stages.iter().map(|s| s.requests.items).sum(),
        stopped: 0,
    };
    let cap = 100 * MIB;
    let points: Vec<LoadPoint> = [1usize, 2, 4, 8]
        .iter()
        .map(|&c| LoadPoint {
            load: c,
            peak_allocated_bytes: base + 3 * MIB * c as u64,
            peak_reserved_bytes: base + 4 * MIB + 6 * MIB * c as u64,
            oom: false,
            ..Default::default()
        })
        .collect();
    let search = OomSearch {
        axis: "concurrency".into(),
        device: "meta".into(),
        capacity_bytes: cap,
        margin_fraction: 0.1,
        budget_bytes: cap - cap / 10,
        metric: "peak_reserved".into(),
        points,
        fit: LinearFit {
            a: (base + 4 * MIB) as f64,
            b: (6 * MIB) as f64,
            r2: 0.998,
        },
        predicted_oom_load: Some(10),
        predicted_safe_load: Some(7),
        observed_oom_load: Some(10),
        verified_max_load: Some(9),
        verified_safe_load: Some(7),
        bisection: vec![
            LoadPoint {
                load: 12,
                peak_allocated_bytes: 95 * MIB,
                peak_reserved_bytes: 100 * MIB,
                oom: true,
                ..Default::default()
            },
            LoadPoint {
                load: 9,
                peak_allocated_bytes: 70 * MIB,
                peak_reserved_bytes: 98 * MIB,
                oom: false,
                ..Default::default()
            },
            LoadPoint {
                load: 10,
                peak_allocated_bytes: 74 * MIB,
                peak_reserved_bytes: 100 * MIB,
                oom: true,
                ..Default::default()
            },
        ],
        marginal_bytes_per_unit: 6 * MIB,
        max_load_tried: 12,
        alloc_conf: String::new(),
        recommended: Some(RecommendedSearch {
            alloc_conf: "expandable_segments:True".into(),
            verified_safe_load: Some(8),
            observed_oom_load: Some(11),
            safe_peak_reserved_bytes: None,
        }),
        not_better: None,
        headline: String::new(),
        requests_per_worker: 4,
        stopped_early: false,
    };
    let search = OomSearch {
        headline: search.headline(),
        ..search
    };
    let mut numbers = BTreeMap::new();
    numbers.insert("activation_bytes".into(), (30 * MIB) as f64);
    let findings = vec![
        Finding {
            id: FindingId::AutogradInInference,
            title: "Autograd was on during inference <script>alert(1)</script>".into(),
            severity: Severity::Critical,
            evidence: "30.00 MiB of activations were saved for backward in an inference \
                       scenario; x < y && y > z"
                .into(),
            numbers: numbers.clone(),
            fix: "with torch.no_grad():\n    out = model(x)".into(),
            predicted_saving_bytes: 30 * MIB,
        },
        Finding {
            id: FindingId::Fragmentation,
            title: "Fragmentation".into(),
            severity: Severity::Warning,
            evidence: "reserved/allocated = 1.45, 6.00 MiB inactive split".into(),
            numbers,
            fix: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(),
            predicted_saving_bytes: 12 * MIB,
        },
    ];
    let what_if = vec![
        WhatIfRow {
            alloc_conf: String::new(),
            peak_allocated_bytes: 90 * MIB,
            peak_reserved_bytes: 100 * MIB,
            reserved_over_allocated: 1.11,
            num_alloc_retries: 2,
            num_ooms: 3,
            fits_capacity: false,
            saving_vs_run_bytes: 0,
        },
        WhatIfRow {
            alloc_conf: "expandable_segments:True".into(),
            peak_allocated_bytes: 90 * MIB,
            peak_reserved_bytes: 92 * MIB,
            reserved_over_allocated: 1.02,
            num_alloc_retries: 0,
            num_ooms: 0,
            fits_capacity: true,
            saving_vs_run_bytes: (8 * MIB) as i64,
        },
    ];
    let thresholds = vec![
        ThresholdResult {
            expr: "peak_reserved<6GiB".into(),
            metric: "peak_reserved".into(),
            op: "<".into(),
            limit: (6u64 << 30) as f64,
            actual: Some((100 * MIB) as f64),
            unit: "bytes".into(),
            passed: true,
        },
        ThresholdResult {
            expr: "p99<20ms".into(),
            metric: "p99".into(),
            op: "<".into(),
            limit: 20.0,
            actual: Some(72.0),
            unit: "ms".into(),
            passed: false,
        },
    ];
    let mut stats = BTreeMap::new();
    stats.insert("allocated_bytes.all.current".into(), (base) as i64);
    RunResult {
        schema_version: SCHEMA_VERSION,
        vramroom_version: "0.1.0".into(),
        scenario: ScenarioInfo {
            name: "default".into(),
            kind: "inference".into(),
            model: "zoo-gpt-small".into(),
            batch: 4,
            input: "seq_len uniform 16..128 (seed 7)".into(),
            optimizer: None,
            accum_steps: None,
            accum_pattern: None,
            mistakes: Mistakes {
                grad_at_inference: true,
                ..Default::default()
            },
            seed: 7,
            description: "zoo-gpt-small inference, batch 4, seq_len uniform 16..128 & <b>".into(),
        },
        load: LoadInfo {
            mode: "stages".into(),
            stages: conc
                .iter()
                .zip(dur.iter())
                .map(|(&c, &d)| StageSpecInfo {
                    concurrency: c,
                    duration_s: Some(d),
                })
                .collect(),
            max_requests: None,
            time_limit_s: None,
            sample_period_ms: 20.0,
        },
        device: "cpu".into(),
        capacity_bytes: cap,
        alloc_conf: String::new(),
        wall_s: t0,
        stop_reason: StopReason::Completed,
        baseline_bytes: base,
        requests: total,
        latency: stages[1].latency,
        throughput: Throughput {
            requests_per_s: total.ok as f64 / t0,
            items_per_s: total.items as f64 / t0,
        },
        errors: ErrorCounts {
            oom: 3,
            by_kind: BTreeMap::new(),
        },
        stages,
        by_concurrency,
        timeline,
        peaks: Peaks {
            allocated_bytes: 90 * MIB,
            reserved_bytes: 100 * MIB,
            active_bytes: 90 * MIB,
            inactive_split_bytes: 9 * MIB,
            allocated_t_s: oom_t,
            above_base_bytes: 50 * MIB,
            categories_at_peak: CategoryBytes {
                parameter: base,
                activation: 30 * MIB,
                temporary: 15 * MIB,
                input: 5 * MIB,
                ..Default::default()
            },
            alloc_retries: 2,
            process_used_bytes: Some(110 * MIB),
            overhead_bytes: Some(10 * MIB),
            device_used_bytes: Some(116 * MIB),
            ..Default::default()
        },
        ooms: vec![OomRecord {
            t_s: oom_t,
            stage: 2,
            concurrency: 8,
            worker: 5,
            request: 900,
            requested_bytes: Some(12 * MIB),
            message: "CUDA out of memory. Tried to allocate 12.00 MiB. <oops>".into(),
            allocated_bytes: 90 * MIB,
            reserved_bytes: 100 * MIB,
            categories: CategoryBytes {
                parameter: base,
                activation: 30 * MIB,
                temporary: 20 * MIB,
                ..Default::default()
            },
            memory_stats: BTreeMap::new(),
            memory_summary: "|  memory summary <table> |".into(),
        }],
        oom_search: Some(search),
        findings,
        what_if,
        what_if_check: WhatIfCheck::default(),
        thresholds,
        final_memory_stats: stats,
        final_memory_summary: "|===========|\n| PyTorch CUDA memory summary |".into(),
        snapshot: None,
        oom_snapshot: None,
        memory_sources: vec![MemorySourceInfo {
            name: "nvml:0000:01:00.0".into(),
            kind: "nvml".into(),
            status: "ok".into(),
            samples: 400,
            series: vec![
                "process_used".into(),
                "device_used".into(),
                "capacity".into(),
            ],
            ..Default::default()
        }],
        http: None,
    }
}

/// A synthetic `vramroom http` run: two stages (closed c=4 then c=16, or open 100/s then
/// 200/s), 503s under the heavier stage, memory from an endpoint (allocated, reserved,
/// capacity), and a URL that would break HTML unescaped.
pub fn synthetic_http(open: bool) -> RunResult {
    let mut r = synthetic();
    let url = "http://127.0.0.1:8000/generate?q=<b>".to_string();
    let cap = 1u64 << 30;
    r.scenario = ScenarioInfo {
        name: url.clone(),
        kind: "http".into(),
        input: "template \"{\\\"p\\\": \\\"{{tokens 16..64}}\\\"}\"".into(),
        description: format!("POST {url} — two stages"),
        ..Default::default()
    };
    r.device = "service".into();
    r.capacity_bytes = cap;
    r.oom_search = None;
    r.what_if.clear();
    r.findings.truncate(1);
    r.ooms.clear();
    r.final_memory_summary.clear();
    let loads: [(usize, f64); 2] = [(4, 100.0), (16, 200.0)];
    r.stages.truncate(2);
    let mut http_stages = Vec::new();
    let mut timeline = Vec::new();
    let mut status = Vec::new();
    for (i, st) in r.stages.iter_mut().enumerate() {
        st.index = i;
        st.start_s = i as f64 * 2.0;
        st.end_s = st.start_s + 2.0;
        st.concurrency = loads[i].0;
        http_stages.push(HttpStageResult {
            index: i,
            concurrency: (!open).then_some(loads[i].0),
            rate_per_s: open.then_some(loads[i].1),
            peak_in_flight: loads[i].0,
            shed: if i == 1 { 40 } else { 0 },
            status_codes: [("200".to_string(), st.requests.ok)].into_iter().collect(),
            latency_uncorrected: st.latency,
            shed_latency: LatencyStats::default(),
            correction_interval_ms: (!open).then_some(st.latency.p50_ms),
        });
        for k in 0..40 {
            let t = st.start_s + k as f64 * 0.05;
            let alloc = (200 << 20) + (loads[i].0 as u64) * (20 << 20) + (k % 7) * (1 << 20);
            timeline.push(MemorySample {
                t_s: t,
                kind: SampleKind::Periodic,
                stage: i,
                concurrency: loads[i].0,
                allocated_bytes: alloc,
                reserved_bytes: alloc + (64 << 20),
                active_bytes: 0,
                inactive_split_bytes: 0,
                device_used_bytes: None,
                process_used_bytes: None,
                overhead_bytes: None,
                categories: CategoryBytes::default(),
            });
        }
        for k in 0..20 {
            status.push(StatusBucket {
                t_s: st.start_s + k as f64 * 0.1,
                width_s: 0.1,
                ok: 30,
                shed: if i == 1 { 2 } else { 0 },
                client_error: 0,
                server_error: u64::from(k == 5),
                transport_error: 0,
                mean_latency_ms: Some(20.0),
            });
        }
    }
    r.timeline = timeline;
    r.by_concurrency.truncate(2);
    for (c, l) in r.by_concurrency.iter_mut().zip(loads) {
        c.concurrency = l.0;
    }
    let by_rate = if open {
        r.by_concurrency
            .iter()
            .zip(loads)
            .map(|(c, l)| RateResult {
                rate_per_s: l.1,
                requests: c.requests,
                shed: 0,
                latency: c.latency,
                throughput: c.throughput,
                peak_allocated_bytes: c.peak_allocated_bytes,
                peak_reserved_bytes: c.peak_reserved_bytes,
            })
            .collect()
    } else {
        Vec::new()
    };
    if open {
        r.by_concurrency.clear();
    }
    r.peaks = Peaks {
        allocated_bytes: 540 << 20,
        reserved_bytes: 604 << 20,
        ..Default::default()
    };
    r.memory_sources = vec![MemorySourceInfo {
        name: "prometheus http://127.0.0.1:8000/metrics".into(),
        kind: "prometheus".into(),
        status: "ok".into(),
        samples: 80,
        series: vec!["allocated".into(), "reserved".into(), "capacity".into()],
        mapped: vec!["allocated ← vramroom_memory_allocated_bytes (vramroom serve)".into()],
        ..Default::default()
    }];
    r.http = Some(HttpResult {
        url,
        method: "POST".into(),
        model: if open { "open" } else { "closed" }.into(),
        arrival: open.then(|| "poisson".into()),
        max_connections: open.then_some(256),
        body: "template".into(),
        timeout_ms: 30_000.0,
        latency_correction: if open {
            "intended_send_time"
        } else {
            "expected_interval"
        }
        .into(),
        status_codes: [("200".to_string(), 1200u64), ("503".to_string(), 40)]
            .into_iter()
            .collect(),
        shed: 40,
        shed_latency: r.latency,
        latency_uncorrected: r.latency,
        dropped: 0,
        aborted: 0,
        bytes_sent: 1 << 20,
        bytes_received: 2 << 20,
        connections_opened: 16,
        stages: http_stages,
        by_rate,
        status_timeline: status,
        memory_series: vec!["allocated".into(), "reserved".into(), "capacity".into()],
        service_ooms: Some(0),
        probe: None,
        stop_hint: None,
        shed_reasons: BTreeMap::new(),
        retry_after_answers: 0,
        retry_after_max_s: None,
        prediction: None,
    });
    r
}
