//! The terminal summary: plain text, fixed-width columns, no colour codes (it is also what
//! lands in a CI log).

use std::fmt::Write as _;

use super::{fmt_bytes, fmt_ms, fmt_signed_bytes, fmt_value};
use crate::results::*;

/// Pads each column to its widest cell; `right[i]` aligns column `i` to the right.
pub(super) fn table(out: &mut String, header: &[&str], rows: &[Vec<String>], right: &[bool]) {
    let n = header.len();
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |out: &mut String, cells: &[String]| {
        let mut s = String::new();
        for (i, wi) in w.iter().enumerate() {
            let c = cells.get(i).map(String::as_str).unwrap_or("");
            let pad = wi.saturating_sub(c.chars().count());
            if i > 0 {
                s.push_str("  ");
            }
            if right.get(i).copied().unwrap_or(false) {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            } else {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(
        out,
        &header.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
    );
    let total: usize = w.iter().sum::<usize>() + 2 * n.saturating_sub(1);
    out.push_str(&"-".repeat(total));
    out.push('\n');
    for r in rows {
        line(out, r);
    }
}

/// The summary printed at the end of `headroom loadtest` (and of `headroom http`, whose
/// own layout is [`super::http::http_summary_table`]).
pub fn summary_table(r: &RunResult) -> String {
    if r.http.is_some() {
        return super::http::http_summary_table(r);
    }
    let mut o = String::new();
    let sc = &r.scenario;
    let _ = writeln!(o, "headroom loadtest: {}", sc.description);
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
        let opt = |v: Option<usize>| v.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            o,
            "OOM    predicted first OOM at {}={}  observed {}  safe {} (budget {}, {:.0}% margin)  +{} per {}",
            s.axis,
            opt(s.predicted_oom_load),
            opt(s.observed_oom_load),
            opt(s.verified_safe_load),
            fmt_bytes(s.budget_bytes),
            s.margin_fraction * 100.0,
            fmt_bytes(s.marginal_bytes_per_unit),
            if s.axis == "batch" { "sample" } else { "concurrent request" }
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
    }
    threshold_lines(&mut o, r);
    o
}

/// The findings block: severity, title, evidence and fix of each (and, with `savings`, the
/// peak it is predicted to save).
pub(crate) fn finding_lines(o: &mut String, r: &RunResult, savings: bool) {
    o.push('\n');
    if r.findings.is_empty() {
        o.push_str("findings: none\n");
        return;
    }
    let _ = writeln!(o, "findings ({}):", r.findings.len());
    for f in &r.findings {
        let sev = match f.severity {
            Severity::Critical => "CRITICAL",
            Severity::Warning => "WARNING",
            Severity::Info => "info",
        };
        let _ = writeln!(o, "  [{sev}] {} ({})", f.title, f.id.as_str());
        let _ = writeln!(o, "    evidence: {}", f.evidence);
        let mut fix = f.fix.lines();
        if let Some(first) = fix.next() {
            let _ = writeln!(o, "    fix:      {first}");
            for l in fix {
                let _ = writeln!(o, "              {l}");
            }
        }
        if savings && f.predicted_saving_bytes > 0 {
            let _ = writeln!(
                o,
                "    saves:    {} of peak",
                fmt_bytes(f.predicted_saving_bytes)
            );
        }
    }
}

/// One line per `--threshold`, pass or FAIL and the measured value.
pub(crate) fn threshold_lines(o: &mut String, r: &RunResult) {
    if r.thresholds.is_empty() {
        return;
    }
    o.push('\n');
    for t in &r.thresholds {
        let _ = writeln!(
            o,
            "threshold {:<28} {}  (measured {})",
            t.expr,
            if t.passed { "pass" } else { "FAIL" },
            t.actual
                .map(|v| fmt_value(v, &t.unit))
                .unwrap_or_else(|| "nothing".into())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert!(s.contains("predicted first OOM at concurrency=10"));
    }
}
