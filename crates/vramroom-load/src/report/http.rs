//! The report of a `vramroom http` run: the same self-contained page and terminal summary
//! as `vramroom loadtest`, laid out for a service under load.
//!
//! Design note: an HTTP run is a [`RunResult`] with its `http` part, so everything that does
//! not depend on the allocator running in-process is shared with the loadtest report (the
//! memory timeline, the latency plot, findings, what-if, thresholds, OOMs, the CSS). What
//! differs is what a service has and an in-process run has not: answers by status over
//! time (load shedding shows as 503s), the open model's rate axis, latency with and without
//! the coordinated-omission correction, and the memory sources the numbers came from.

use std::fmt::Write as _;

use super::format::{fmt_bytes, fmt_ms};
use super::parts::{
    esc, figure, finding_lines, findings_and_thresholds_badges, findings_section, kv,
    memory_sources_section, ooms_section, stop_text, table, threshold_lines, thresholds_section,
    what_if_section, CSS,
};
use super::plots;
use crate::results::*;

/// The stages table has more columns than the loadtest's: smaller type keeps it in the page.
const WIDE: &str =
    "table.wide { font-size:12.5px; } table.wide th, table.wide td { padding:4px 6px; }\n";

/// Ids of the `<figure>`s of the HTTP page, in page order.
pub const HTTP_PLOT_IDS: [&str; 3] = ["plot-timeline", "plot-status", "plot-latency"];

fn load_text(r: &RunResult, i: usize) -> String {
    let h = r.http.as_ref();
    match h.and_then(|h| h.stages.get(i)).and_then(|s| s.rate_per_s) {
        Some(q) => format!("{q}/s"),
        None => format!("c={}", r.stages.get(i).map(|s| s.concurrency).unwrap_or(0)),
    }
}

fn opt_bytes(v: Option<u64>) -> String {
    v.map(fmt_bytes).unwrap_or_else(|| "—".into())
}

fn lat_line(l: &LatencyStats) -> String {
    if l.count == 0 {
        return "—".into();
    }
    format!(
        "p50 {} · p90 {} · p99 {} · p99.9 {} · max {}",
        fmt_ms(l.p50_ms),
        fmt_ms(l.p90_ms),
        fmt_ms(l.p99_ms),
        fmt_ms(l.p999_ms),
        fmt_ms(l.max_ms)
    )
}

fn codes_text(c: &std::collections::BTreeMap<String, u64>) -> String {
    if c.is_empty() {
        return "none".into();
    }
    c.iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn correction_text(h: &HttpResult) -> &'static str {
    if h.latency_correction == "intended_send_time" {
        "from each request's intended send time (open model)"
    } else {
        "HdrHistogram expected-interval correction, each stage's median as the interval \
         (closed model)"
    }
}

/// Renders the HTTP run's page ([`super::render_html`] picks it for runs with an `http`
/// part; `hr` is that part).
pub(super) fn render_http_html(r: &RunResult, hr: &HttpResult) -> String {
    let mut h = String::with_capacity(256 * 1024);
    let title = format!("Vramroom HTTP load test: {} {}", hr.method, hr.url);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{CSS}{WIDE}</style>\n</head>\n<body>\n<main>\n",
        esc(&title)
    );
    let _ = writeln!(h, "<h1>{}</h1>", esc(&title));
    let _ = writeln!(h, "<p class=\"sub\">{}</p>", esc(&r.scenario.description));
    badges(&mut h, r, hr);
    summary(&mut h, r, hr);
    stages(&mut h, r, hr);

    h.push_str("<h2 id=\"memory\">Memory over time</h2>\n");
    figure(
        &mut h,
        HTTP_PLOT_IDS[0],
        &plots::timeline_svg(r),
        "The service's memory as its sources report it, on the load's clock: allocated and \
         reserved (the service's allocator, from its metrics endpoint), device used and the \
         process's bytes (NVML or the exporter), the context + library overhead (process used \
         − reserved), and the capacity; each stage is a band, OOMs the service reported are \
         red crosses. The last sample is the service at rest after the load.",
    );
    memory_sources_section(&mut h, r);

    h.push_str("<h2 id=\"answers\">Answers over time</h2>\n");
    figure(
        &mut h,
        HTTP_PLOT_IDS[1],
        &plots::status_svg(r),
        "Answers per second by class, stacked, by completion time: ok, load shed with 503, \
         4xx, other 5xx, and requests with no answer (connect errors, timeouts).",
    );

    let open = hr.model == "open";
    let _ = writeln!(
        h,
        "<h2 id=\"latency\">Latency against {}</h2>",
        if open {
            "the request rate"
        } else {
            "concurrency"
        }
    );
    figure(
        &mut h,
        HTTP_PLOT_IDS[2],
        &plots::latency_svg(r),
        "Percentiles of the ok answers' latency, corrected for coordinated omission, from HDR \
         histograms, per load level.",
    );
    levels(&mut h, r, hr);

    if let Some(p) = &hr.prediction {
        super::http_predict::html_section(&mut h, r, p);
    }
    findings_section(&mut h, r);
    if let Some(p) = &hr.probe {
        probe_section(&mut h, p);
    }
    if !r.what_if.is_empty() {
        what_if_section(&mut h, r);
    }
    thresholds_section(&mut h, r);
    ooms_section(&mut h, r);
    if !r.final_memory_stats.is_empty() {
        h.push_str("<h2 id=\"stats-final\">The service's memory_stats() at the end</h2>\n");
        h.push_str(
            "<details><summary>torch.cuda.memory_stats(), summed over devices</summary><table>\n",
        );
        for (k, v) in &r.final_memory_stats {
            let _ = writeln!(
                h,
                "<tr><td><code>{}</code></td><td class=\"num\">{v}</td></tr>",
                esc(k)
            );
        }
        h.push_str("</table></details>\n");
    }
    let _ = writeln!(
        h,
        "<footer>vramroom {} · results schema v{} · the same numbers are in results.json.</footer>",
        esc(&r.vramroom_version),
        r.schema_version
    );
    h.push_str("</main>\n</body>\n</html>\n");
    h
}

fn badges(h: &mut String, r: &RunResult, hr: &HttpResult) {
    h.push_str("<div class=\"badges\">");
    let _ = write!(
        h,
        "<span>{} model{}</span>",
        esc(&hr.model),
        hr.arrival
            .as_ref()
            .map(|a| format!(", {a} arrivals"))
            .unwrap_or_default()
    );
    let cls = if r.stop_reason == StopReason::Cancelled {
        "warn"
    } else {
        ""
    };
    let _ = write!(
        h,
        "<span class=\"{cls}\">{}</span>",
        esc(stop_text(r.stop_reason))
    );
    let _ = write!(h, "<span class=\"ok\">{} ok</span>", r.requests.ok);
    let _ = write!(
        h,
        "<span class=\"{}\">{} shed (503)</span>",
        if hr.shed > 0 { "warn" } else { "ok" },
        hr.shed
    );
    let _ = write!(
        h,
        "<span class=\"{}\">{} error{}</span>",
        if r.requests.other_errors > 0 {
            "bad"
        } else {
            "ok"
        },
        r.requests.other_errors,
        if r.requests.other_errors == 1 {
            ""
        } else {
            "s"
        }
    );
    if let Some(n) = hr.service_ooms {
        let _ = write!(
            h,
            "<span class=\"{}\">{n} service OOM{}</span>",
            if n > 0 { "bad" } else { "ok" },
            if n == 1 { "" } else { "s" }
        );
    }
    findings_and_thresholds_badges(h, r);
    h.push_str("</div>\n");
}

fn summary(h: &mut String, r: &RunResult, hr: &HttpResult) {
    h.push_str("<h2 id=\"run\">Run summary</h2>\n");
    let mut rows: Vec<(&str, String)> = vec![
        ("target", format!("{} {}", hr.method, hr.url)),
        ("request body", hr.body.clone()),
        (
            "load model",
            match (&hr.arrival, hr.max_connections) {
                (Some(a), Some(c)) => {
                    format!("open: requests sent on a {a} schedule, at most {c} connections")
                }
                _ => "closed: each worker sends when its last answer is in".into(),
            },
        ),
        ("wall time", format!("{:.2} s", r.wall_s)),
        ("stop reason", stop_text(r.stop_reason).into()),
        (
            "requests",
            format!(
                "{} total: {} ok, {} shed (503), {} errors; {} dropped, {} aborted at the end",
                r.requests.total,
                r.requests.ok,
                hr.shed,
                r.requests.other_errors,
                hr.dropped,
                hr.aborted
            ),
        ),
        ("status codes", codes_text(&hr.status_codes)),
    ];
    if !r.errors.by_kind.is_empty() {
        rows.push(("errors by kind", codes_text(&r.errors.by_kind)));
    }
    rows.extend([
        (
            "throughput",
            format!("{:.1} ok answers/s", r.throughput.requests_per_s),
        ),
        ("latency (ok answers)", lat_line(&r.latency)),
        ("latency correction", correction_text(hr).into()),
        ("latency, uncorrected", lat_line(&hr.latency_uncorrected)),
        ("latency of 503 answers", lat_line(&hr.shed_latency)),
        (
            "traffic",
            format!(
                "{} sent, {} received, {} connections opened",
                fmt_bytes(hr.bytes_sent),
                fmt_bytes(hr.bytes_received),
                hr.connections_opened
            ),
        ),
        (
            "capacity",
            if r.capacity_bytes > 0 {
                fmt_bytes(r.capacity_bytes)
            } else {
                "unknown (no source reports it)".into()
            },
        ),
        ("allocated before the load", fmt_bytes(r.baseline_bytes)),
        (
            "peak allocated / reserved",
            format!(
                "{} / {}",
                fmt_bytes(r.peaks.allocated_bytes),
                fmt_bytes(r.peaks.reserved_bytes)
            ),
        ),
        (
            "peak device used / process used / overhead",
            format!(
                "{} / {} / {}",
                opt_bytes(r.peaks.device_used_bytes),
                opt_bytes(r.peaks.process_used_bytes),
                opt_bytes(r.peaks.overhead_bytes)
            ),
        ),
    ]);
    if let Some(n) = hr.service_ooms {
        rows.push(("OOMs the service reported", n.to_string()));
    }
    kv(h, &rows);
}

fn stages(h: &mut String, r: &RunResult, hr: &HttpResult) {
    h.push_str("<h2 id=\"stages\">Stages</h2>\n");
    if r.stages.is_empty() {
        h.push_str("<p>No stage ran.</p>\n");
        return;
    }
    h.push_str(
        "<table class=\"wide\"><tr><th>stage</th><th class=\"num\">load</th><th class=\"num\">time (s)</th>\
         <th class=\"num\">requests</th><th class=\"num\">ok</th><th class=\"num\">503</th>\
         <th class=\"num\">errors</th><th class=\"num\">ok/s</th><th class=\"num\">p50</th>\
         <th class=\"num\">p99</th><th class=\"num\">p99 uncorrected</th>\
         <th class=\"num\">in flight (max)</th><th class=\"num\">peak allocated</th>\
         <th class=\"num\">peak reserved</th></tr>\n",
    );
    for (i, s) in r.stages.iter().enumerate() {
        let hs = hr.stages.get(i);
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.1}–{:.1}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{:.1}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            s.index + 1,
            esc(&load_text(r, i)),
            s.start_s,
            s.end_s,
            s.requests.total,
            s.requests.ok,
            hs.map(|x| x.shed).unwrap_or(0),
            s.requests.other_errors,
            s.throughput.requests_per_s,
            fmt_ms(s.latency.p50_ms),
            fmt_ms(s.latency.p99_ms),
            hs.map(|x| fmt_ms(x.latency_uncorrected.p99_ms))
                .unwrap_or_default(),
            hs.map(|x| x.peak_in_flight).unwrap_or(0),
            fmt_bytes(s.peak_allocated_bytes),
            fmt_bytes(s.peak_reserved_bytes),
        );
    }
    h.push_str("</table>\n");
}

fn levels(h: &mut String, r: &RunResult, hr: &HttpResult) {
    let rows: Vec<(String, &RequestSummary, &LatencyStats, f64, u64, u64)> = if hr.model == "open" {
        hr.by_rate
            .iter()
            .map(|x| {
                (
                    format!("{}/s", x.rate_per_s),
                    &x.requests,
                    &x.latency,
                    x.throughput.requests_per_s,
                    x.peak_allocated_bytes,
                    x.peak_reserved_bytes,
                )
            })
            .collect()
    } else {
        r.by_concurrency
            .iter()
            .map(|x| {
                (
                    x.concurrency.to_string(),
                    &x.requests,
                    &x.latency,
                    x.throughput.requests_per_s,
                    x.peak_allocated_bytes,
                    x.peak_reserved_bytes,
                )
            })
            .collect()
    };
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        h,
        "<table><tr><th class=\"num\">{}</th><th class=\"num\">requests</th>\
         <th class=\"num\">ok/s</th><th class=\"num\">p50</th><th class=\"num\">p90</th>\
         <th class=\"num\">p99</th><th class=\"num\">p99.9</th>\
         <th class=\"num\">peak allocated</th><th class=\"num\">peak reserved</th></tr>",
        if hr.model == "open" {
            "rate"
        } else {
            "workers"
        }
    );
    for (k, req, l, rps, pa, pr) in rows {
        let _ = writeln!(
            h,
            "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{:.1}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&k),
            req.total,
            rps,
            fmt_ms(l.p50_ms),
            fmt_ms(l.p90_ms),
            fmt_ms(l.p99_ms),
            fmt_ms(l.p999_ms),
            fmt_bytes(pa),
            fmt_bytes(pr),
        );
    }
    h.push_str("</table>\n");
}

fn probe_section(h: &mut String, p: &ProbeResult) {
    h.push_str("<h2 id=\"probe\">The service's probe</h2>\n");
    let mut rows: Vec<(&str, String)> = vec![
        ("probe", p.url.clone()),
        (
            "snapshot",
            if p.snapshot_fetched {
                format!(
                    "fetched: {} segments, {} trace entries",
                    p.snapshot_segments, p.trace_entries
                )
            } else {
                "not fetched".into()
            },
        ),
        (
            "allocator config",
            if p.alloc_conf.is_empty() {
                "default".into()
            } else {
                p.alloc_conf.clone()
            },
        ),
        (
            "OOMs (service life)",
            format!(
                "{}{}",
                p.ooms,
                if p.oom_snapshot_fetched {
                    ", OOM snapshot fetched"
                } else {
                    ""
                }
            ),
        ),
    ];
    if !p.notes.is_empty() {
        rows.push(("notes", p.notes.join("; ")));
    }
    kv(h, &rows);
}

/// The terminal summary of an HTTP run (`hr` is its `http` part).
pub(super) fn http_summary_table(r: &RunResult, hr: &HttpResult) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "vramroom http: {}", r.scenario.description);
    let _ = writeln!(
        o,
        "{} model  wall {:.1}s  ({})  body: {}",
        hr.model,
        r.wall_s,
        match r.stop_reason {
            StopReason::Cancelled => "CANCELLED: partial results",
            StopReason::OomFound => "stopped at the first OOM (--ramp-until-oom)",
            StopReason::Saturated =>
                "stopped: no answer within --timeout at the last step, before any OOM",
            StopReason::Refused => "stopped early: every answer the same 4xx",
            _ => "completed",
        },
        hr.body
    );
    if let Some(h) = &hr.stop_hint {
        let _ = writeln!(o, "hint: {h}");
    }
    o.push('\n');
    let rows: Vec<Vec<String>> = r
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let hs = hr.stages.get(i);
            vec![
                (s.index + 1).to_string(),
                load_text(r, i),
                format!("{:.1}", s.end_s - s.start_s),
                s.requests.total.to_string(),
                format!("{:.1}", s.throughput.requests_per_s),
                fmt_ms(s.latency.p50_ms),
                fmt_ms(s.latency.p99_ms),
                hs.map(|x| x.shed).unwrap_or(0).to_string(),
                s.requests.oom.to_string(),
                s.requests.other_errors.to_string(),
                fmt_bytes(s.peak_allocated_bytes),
                fmt_bytes(s.peak_reserved_bytes),
            ]
        })
        .collect();
    table(
        &mut o,
        &[
            "stage",
            "load",
            "secs",
            "requests",
            "ok/s",
            "p50",
            "p99",
            "503",
            "oom",
            "errors",
            "peak alloc",
            "peak reserved",
        ],
        &rows,
        &[true; 12],
    );
    let _ = writeln!(
        o,
        "total  {} requests ({} ok, {} shed 503, {} OOM, {} errors, {} dropped, {} aborted)  {:.1} ok/s",
        r.requests.total,
        r.requests.ok,
        hr.shed,
        r.requests.oom,
        r.requests.other_errors,
        hr.dropped,
        hr.aborted,
        r.throughput.requests_per_s
    );
    let _ = writeln!(o, "latency        {}", lat_line(&r.latency));
    let _ = writeln!(o, "  uncorrected  {}", lat_line(&hr.latency_uncorrected));
    if hr.shed > 0 {
        let _ = writeln!(o, "  503 answers  {}", lat_line(&hr.shed_latency));
    }
    let _ = writeln!(o, "status codes   {}", codes_text(&hr.status_codes));
    super::histogram::write(&mut o, &r.latency);
    if !r.errors.by_kind.is_empty() {
        let _ = writeln!(o, "errors         {}", codes_text(&r.errors.by_kind));
    }
    if hr.memory_series.is_empty() {
        let _ = writeln!(
            o,
            "memory         not measured (no --metrics-url, no NVML on this machine)"
        );
    } else {
        let _ = writeln!(
            o,
            "memory         peak allocated {}  reserved {}  device used {}  process used {}  capacity {}{}",
            fmt_bytes(r.peaks.allocated_bytes),
            fmt_bytes(r.peaks.reserved_bytes),
            opt_bytes(r.peaks.device_used_bytes),
            opt_bytes(r.peaks.process_used_bytes),
            if r.capacity_bytes > 0 {
                fmt_bytes(r.capacity_bytes)
            } else {
                "unknown".into()
            },
            hr.service_ooms
                .map(|n| format!("  service OOMs {n}"))
                .unwrap_or_default()
        );
    }
    for m in &r.memory_sources {
        let _ = writeln!(
            o,
            "  source {}: {} ({} samples{}){}",
            m.name,
            m.status,
            m.samples,
            if m.failures > 0 {
                format!(", {} failed", m.failures)
            } else {
                String::new()
            },
            if m.note.is_empty() {
                String::new()
            } else {
                format!(": {}", m.note)
            }
        );
    }
    if let Some(p) = &hr.prediction {
        super::http_predict::terminal_lines(&mut o, p);
    }
    // As before, this summary leaves each finding's saving to the HTML report.
    finding_lines(&mut o, r, false);
    threshold_lines(&mut o, r);
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testdata::synthetic_http;

    #[test]
    fn http_page_has_its_plots_and_escapes_what_came_from_the_run() {
        for open in [false, true] {
            let r = synthetic_http(open);
            let h = super::super::render_html(&r);
            for id in HTTP_PLOT_IDS {
                assert!(h.contains(&format!("id=\"{id}\"")), "missing {id}");
            }
            assert_eq!(h.matches("<svg").count(), HTTP_PLOT_IDS.len());
            assert!(!h.contains("<script"));
            assert!(h.contains("&lt;b&gt;"), "the URL's query is escaped");
            assert!(h.contains("shed (503)"));
            assert!(!h.contains("could not draw"));
            let svg = plots::status_svg(&r);
            assert!(svg.contains("shed (503)") && svg.contains("ok (1xx-3xx)"));
            let t = plots::timeline_svg(&r);
            assert!(t.contains("allocated") && t.contains("capacity"));
            assert!(!t.contains("inactive_split"), "not measured, not drawn");
            let l = plots::latency_svg(&r);
            if open {
                assert!(l.contains("request rate") && t.contains("q=200/s"));
            } else {
                assert!(l.contains("concurrent workers") && t.contains("c=16"));
            }
        }
    }

    #[test]
    fn terminal_summary_of_an_http_run() {
        let s = super::super::summary_table(&synthetic_http(false));
        assert!(s.starts_with("vramroom http:"), "{s}");
        assert!(s.contains("503") && s.contains("uncorrected"), "{s}");
        let rows = s
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 12 && f[0].parse::<usize>().is_ok() && f[1].starts_with("c=")
            })
            .count();
        assert_eq!(rows, 2, "{s}");
    }
}
