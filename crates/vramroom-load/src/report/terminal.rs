//! The terminal summary: plain text, fixed-width columns, no colour codes (it is also what
//! lands in a CI log).

use std::fmt::Write as _;

use super::format::{fmt_bytes, fmt_ms, fmt_signed_bytes};
use super::parts::{finding_lines, table, threshold_lines};
use crate::results::*;

/// The summary printed at the end of `vramroom loadtest` ([`super::summary_table`] picks
/// it for in-process runs).
pub(super) fn run_summary_table(r: &RunResult) -> String {
    let mut o = String::new();
    let sc = &r.scenario;
    let _ = writeln!(o, "vramroom loadtest: {}", sc.description);
    let _ = writeln!(
        o,
        "device {}  capacity {}  alloc_conf {}  baseline {}  wall {:.1}s  ({})",
        r.device,
        fmt_bytes(r.capacity_bytes),
        if r.alloc_conf.is_empty() {
            "default"
        } else {
            &r.alloc_conf
        },
        fmt_bytes(r.baseline_bytes),
        r.wall_s,
        match r.stop_reason {
            StopReason::Completed => "completed",
            StopReason::Cancelled => "CANCELLED: partial results",
            StopReason::OomFound => "stopped at the first OOM",
            StopReason::TimeLimit => "time limit, no OOM",
            StopReason::Saturated => "saturated (no answer within --timeout), no OOM",
            StopReason::Refused => "stopped early: every answer the same 4xx",
        }
    );
    o.push('\n');
    let rows: Vec<Vec<String>> = r
        .stages
        .iter()
        .map(|s| {
            vec![
                (s.index + 1).to_string(),
                s.concurrency.to_string(),
                format!("{:.1}", s.end_s - s.start_s),
                s.requests.total.to_string(),
                format!("{:.1}", s.throughput.requests_per_s),
                fmt_ms(s.latency.p50_ms),
                fmt_ms(s.latency.p99_ms),
                fmt_bytes(s.peak_allocated_bytes),
                fmt_bytes(s.peak_reserved_bytes),
                s.requests.oom.to_string(),
                s.requests.other_errors.to_string(),
            ]
        })
        .collect();
    table(
        &mut o,
        &[
            "stage",
            "workers",
            "secs",
            "requests",
            "req/s",
            "p50",
            "p99",
            "peak alloc",
            "peak reserved",
            "OOMs",
            "errors",
        ],
        &rows,
        &[true; 11],
    );
    let _ = writeln!(
        o,
        "{:<}  {} requests ({} ok, {} OOM, {} errors)  {:.1} req/s  p50 {}  p90 {}  p99 {}  p99.9 {}",
        "total",
        r.requests.total,
        r.requests.ok,
        r.requests.oom,
        r.requests.other_errors,
        r.throughput.requests_per_s,
        fmt_ms(r.latency.p50_ms),
        fmt_ms(r.latency.p90_ms),
        fmt_ms(r.latency.p99_ms),
        fmt_ms(r.latency.p999_ms),
    );
    super::histogram::write(&mut o, &r.latency);
    let _ = writeln!(
        o,
        "peak   allocated {}  reserved {}  above baseline {}  inactive_split {}  alloc retries {}  fragmented segments {} ({})",
        fmt_bytes(r.peaks.allocated_bytes),
        fmt_bytes(r.peaks.reserved_bytes),
        fmt_bytes(r.peaks.above_base_bytes),
        fmt_bytes(r.peaks.inactive_split_bytes),
        r.peaks.alloc_retries,
        r.peaks.fragmented_segment_allocs,
        fmt_bytes(r.peaks.fragmented_segment_bytes)
    );
    if let Some(s) = &r.oom_search {
        let _ = writeln!(
            o,
            "OOM    {}  (fit {} + {} per {}, budget {}, {:.0}% margin)",
            s.headline,
            fmt_signed_bytes(s.fit.a.round() as i64),
            fmt_bytes(s.marginal_bytes_per_unit),
            if s.axis == "batch" {
                "sample"
            } else {
                "concurrent request"
            },
            fmt_bytes(s.budget_bytes),
            s.margin_fraction * 100.0,
        );
    }
    finding_lines(&mut o, r, true);
    if !r.what_if.is_empty() {
        o.push('\n');
        let rows: Vec<Vec<String>> = r
            .what_if
            .iter()
            .map(|w| {
                vec![
                    if w.alloc_conf.is_empty() {
                        "default".into()
                    } else {
                        w.alloc_conf.clone()
                    },
                    fmt_bytes(w.peak_reserved_bytes),
                    format!("{:.3}", w.reserved_over_allocated),
                    w.num_alloc_retries.to_string(),
                    w.num_ooms.to_string(),
                    fmt_signed_bytes(w.saving_vs_run_bytes),
                ]
            })
            .collect();
        table(
            &mut o,
            &[
                "what if alloc_conf",
                "peak reserved",
                "res/alloc",
                "retries",
                "OOMs",
                "saving",
            ],
            &rows,
            &[false, true, true, true, true, true],
        );
        let chk = r.what_if_check.summary();
        if !chk.is_empty() {
            let _ = writeln!(o, "what if: {chk}");
        }
    }
    threshold_lines(&mut o, r);
    o
}

#[cfg(test)]
mod tests {
    use crate::report::summary_table;
    use crate::report::testdata::synthetic;

    #[test]
    fn summary_has_stage_rows_and_findings() {
        let r = synthetic();
        let s = summary_table(&r);
        let stage_rows = s
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 11 && f[0].parse::<usize>().is_ok()
            })
            .count();
        assert_eq!(stage_rows, 3, "{s}");
        assert!(s.contains("peak reserved"));
        assert!(s.contains("autograd_in_inference"));
        assert!(s.contains("with torch.no_grad():"));
        assert!(s.contains("p99<20ms") && s.contains("FAIL"));
        // the one verdict, as the JSON and the HTML say it
        let v = &r.oom_search.as_ref().unwrap().headline;
        assert!(
            v.starts_with("safe concurrency 7 (verified over 28 requests at that load"),
            "{v}"
        );
        assert!(
            v.contains("below 10.7% at 95% confidence), first OOM at 10"),
            "{v}"
        );
        assert!(s.contains(v.as_str()), "{s}");
    }
}
