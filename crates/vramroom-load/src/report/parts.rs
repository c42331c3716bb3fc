//! The pieces both report pages (a load test's and an HTTP run's) and both terminal
//! summaries share: the page's style and escaping, the findings, what-if, thresholds and
//! OOM sections, and the findings and thresholds as text.
//!
//! Design note: the report flows one way — [`super`] picks the page or summary for the run
//! (in-process or HTTP), each of those builds on the pieces here, and nothing here knows
//! which page it is on. The pages never call each other.

use std::fmt::Write as _;

use super::format::{fmt_bytes, fmt_measured, fmt_signed_bytes, fmt_value};
use crate::results::*;

/// HTML-escapes text for element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

pub(crate) const CSS: &str = r#"
:root { --fg:#1d2330; --muted:#5b6475; --line:#dde2ea; --bg:#f6f8fb; --ok:#1a7f37; --bad:#c62828; --warn:#b26a00; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif; color:var(--fg); background:var(--bg); }
main { max-width:1080px; margin:0 auto; padding:24px 28px 64px; background:#fff; min-height:100vh; }
h1 { font-size:26px; margin:0 0 4px; }
h2 { font-size:20px; margin:36px 0 10px; padding-bottom:4px; border-bottom:2px solid var(--line); }
h3 { font-size:16px; margin:18px 0 6px; }
.sub { color:var(--muted); margin:0 0 16px; }
.badges span { display:inline-block; margin:0 6px 6px 0; padding:3px 10px; border-radius:12px; font-size:13px; background:#eef1f6; }
.badges .ok { background:#e3f4e8; color:var(--ok); } .badges .bad { background:#fde7e7; color:var(--bad); } .badges .warn { background:#fff3dc; color:var(--warn); }
.scroll { overflow-x:auto; max-width:100%; margin:8px 0 12px; }
table { border-collapse:collapse; width:100%; font-size:14px; }
td:not(.num) { overflow-wrap:anywhere; }
th, td { text-align:left; padding:5px 9px; border-bottom:1px solid var(--line); vertical-align:top; }
th { background:#f1f4f8; font-weight:600; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
table.kv th { width:240px; background:none; color:var(--muted); font-weight:500; }
figure.plot { margin:12px 0 20px; }
figure.plot svg { width:100%; height:auto; display:block; border:1px solid var(--line); border-radius:6px; }
figcaption { color:var(--muted); font-size:13px; margin-top:4px; }
.finding { border:1px solid var(--line); border-left:5px solid var(--warn); border-radius:6px; padding:10px 14px; margin:12px 0; }
.finding.critical { border-left-color:var(--bad); } .finding.info { border-left-color:#1f77b4; }
.finding h3 { margin:0 0 6px; }
.finding pre { white-space:pre-wrap; }
.sev { font-size:12px; text-transform:uppercase; letter-spacing:.04em; color:var(--muted); margin-left:8px; }
pre { background:#f4f6f9; padding:8px 10px; border-radius:4px; overflow-x:auto; font-size:13px; }
.pass { color:var(--ok); font-weight:600; } .fail { color:var(--bad); font-weight:600; }
.swatch { display:inline-block; width:11px; height:11px; border-radius:2px; margin-right:6px; vertical-align:-1px; }
details { margin:6px 0; } summary { cursor:pointer; color:var(--muted); }
footer { margin-top:40px; color:var(--muted); font-size:12px; }
"#;

/// Every `<table>` of a page in a `<div class="scroll">`: a table wider than the page (a
/// what-if row's long config, many columns on a narrow window) scrolls inside its box
/// instead of running past the page. Done once on the finished page so no table is missed.
pub(crate) fn scroll_tables(page: &str) -> String {
    page.replace("<table", "<div class=\"scroll\"><table")
        .replace("</table>", "</table></div>")
}

pub(crate) fn figure(h: &mut String, id: &str, svg: &str, caption: &str) {
    let _ = writeln!(
        h,
        "<figure class=\"plot\" id=\"{id}\">\n{svg}\n<figcaption>{}</figcaption>\n</figure>",
        esc(caption)
    );
}

pub(crate) fn stop_text(s: StopReason) -> &'static str {
    match s {
        StopReason::Completed => "completed",
        StopReason::Cancelled => "cancelled (Ctrl-C): partial results",
        StopReason::OomFound => "stopped at the first OOM (ramp until OOM)",
        StopReason::TimeLimit => "time limit reached before any OOM",
        StopReason::Saturated => {
            "stopped: no answer at the last load step within --timeout (saturated before any OOM)"
        }
        StopReason::Refused => "stopped early: every answer was the same 4xx (see the hint)",
    }
}

pub(crate) fn kv(h: &mut String, rows: &[(&str, String)]) {
    h.push_str("<table class=\"kv\">\n");
    for (k, v) in rows {
        let _ = writeln!(h, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    h.push_str("</table>\n");
}

pub(crate) fn trim_float(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The memory sources besides the allocator (NVML, a scraped endpoint) and how they did.
pub(crate) fn memory_sources_section(h: &mut String, r: &RunResult) {
    if r.memory_sources.is_empty() {
        return;
    }
    h.push_str(
        "<table><tr><th>memory source</th><th>status</th><th class=\"num\">samples</th>\
         <th class=\"num\">failures</th><th>series</th><th>note</th></tr>\n",
    );
    for m in &r.memory_sources {
        let note = if m.mapped.is_empty() {
            m.note.clone()
        } else if m.note.is_empty() {
            m.mapped.join("; ")
        } else {
            format!("{} ({})", m.note, m.mapped.join("; "))
        };
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"{}\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(&m.name),
            if m.status == "ok" { "pass" } else { "" },
            esc(&m.status),
            m.samples,
            m.failures,
            esc(&m.series.join(", ")),
            esc(&note)
        );
    }
    h.push_str("</table>\n");
}

pub(crate) fn findings_section(h: &mut String, r: &RunResult) {
    h.push_str("<h2 id=\"findings\">Findings</h2>\n");
    if r.findings.is_empty() {
        h.push_str(
            "<p class=\"pass\">No findings: nothing wasteful was detected in this run.</p>\n",
        );
        return;
    }
    for f in &r.findings {
        let (cls, sev) = match f.severity {
            Severity::Critical => ("critical", "critical"),
            Severity::Warning => ("warning", "warning"),
            Severity::Info => ("info", "info"),
        };
        let _ = writeln!(
            h,
            "<div class=\"finding {cls}\" id=\"finding-{}\">\n<h3>{}<span class=\"sev\">{sev} · {}</span></h3>",
            esc(f.id.as_str()),
            esc(&f.title),
            esc(f.id.as_str())
        );
        let _ = writeln!(h, "<p><strong>Evidence.</strong> {}</p>", esc(&f.evidence));
        let _ = writeln!(
            h,
            "<p><strong>Fix.</strong></p><pre><code>{}</code></pre>",
            esc(&f.fix)
        );
        let _ = writeln!(
            h,
            "<p><strong>Predicted saving:</strong> {}</p>",
            if f.predicted_saving_bytes > 0 {
                format!("{} of peak", fmt_bytes(f.predicted_saving_bytes))
            } else {
                "none on the peak".into()
            }
        );
        if !f.numbers.is_empty() {
            h.push_str("<details><summary>Numbers</summary><table>\n");
            for (k, v) in &f.numbers {
                let shown = if k.ends_with("_bytes") && *v >= 0.0 {
                    format!("{} ({v:.0})", fmt_bytes(v.round() as u64))
                } else {
                    format!("{v}")
                };
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td class=\"num\">{}</td></tr>",
                    esc(k),
                    esc(&shown)
                );
            }
            h.push_str("</table></details>\n");
        }
        h.push_str("</div>\n");
    }
}

pub(crate) fn what_if_section(h: &mut String, r: &RunResult) {
    h.push_str("<h2 id=\"what-if\">What if: the run's trace under other allocator configs</h2>\n");
    if r.what_if.is_empty() {
        h.push_str("<p>No replay (skipped or cancelled).</p>\n");
        return;
    }
    h.push_str(
        "<table><tr><th>PYTORCH_CUDA_ALLOC_CONF</th><th class=\"num\">peak allocated</th>\
         <th class=\"num\">peak reserved</th><th class=\"num\">reserved / allocated</th>\
         <th class=\"num\">retries</th><th class=\"num\">OOMs</th><th>fits capacity</th>\
         <th class=\"num\">saving vs run</th></tr>\n",
    );
    for w in &r.what_if {
        let conf = if w.alloc_conf.is_empty() {
            "default".to_string()
        } else {
            w.alloc_conf.clone()
        };
        let _ = writeln!(
            h,
            "<tr><td><code>{}</code></td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{:.3}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"{}\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&conf),
            fmt_bytes(w.peak_allocated_bytes),
            fmt_bytes(w.peak_reserved_bytes),
            w.reserved_over_allocated,
            w.num_alloc_retries,
            w.num_ooms,
            if w.fits_capacity { "pass" } else { "fail" },
            if w.fits_capacity { "yes" } else { "no" },
            fmt_signed_bytes(w.saving_vs_run_bytes),
        );
    }
    h.push_str("</table>\n");
    let chk = r.what_if_check.summary();
    if !chk.is_empty() {
        let _ = writeln!(
            h,
            "<p class=\"{}\">{}</p>",
            if r.what_if_check.agrees {
                "pass"
            } else {
                "fail"
            },
            esc(&chk)
        );
    }
}

pub(crate) fn thresholds_section(h: &mut String, r: &RunResult) {
    h.push_str("<h2 id=\"thresholds\">Thresholds</h2>\n");
    if r.thresholds.is_empty() {
        h.push_str(
            "<p>No threshold was given (<code>--threshold 'peak_reserved&lt;6GiB'</code>).</p>\n",
        );
        return;
    }
    h.push_str(
        "<table><tr><th>threshold</th><th class=\"num\">limit</th><th class=\"num\">measured</th><th>result</th></tr>\n",
    );
    for t in &r.thresholds {
        let _ = writeln!(
            h,
            "<tr><td><code>{}</code></td><td class=\"num\">{} {}</td><td class=\"num\">{}</td><td class=\"{}\">{}</td></tr>",
            esc(&t.expr),
            esc(&t.op),
            esc(&limit_text(t)),
            esc(&t.actual.map(|v| measured_text(t, v)).unwrap_or_else(|| "not measured".into())),
            if t.passed { "pass" } else { "fail" },
            if t.passed { "pass" } else { "FAIL" },
        );
    }
    h.push_str("</table>\n");
}

pub(crate) fn ooms_section(h: &mut String, r: &RunResult) {
    if r.ooms.is_empty() {
        return;
    }
    let _ = writeln!(
        h,
        "<h2 id=\"ooms\">Out-of-memory errors</h2>\n<p>{} request(s) failed with OOM; each failed \
         alone and the others went on. The first {} kept the allocator state:</p>",
        r.requests.oom,
        r.ooms.len()
    );
    h.push_str(
        "<table><tr><th class=\"num\">t (s)</th><th class=\"num\">stage</th><th class=\"num\">workers</th>\
         <th class=\"num\">request</th><th class=\"num\">asked</th><th class=\"num\">allocated</th>\
         <th class=\"num\">reserved</th><th>message</th></tr>\n",
    );
    for o in &r.ooms {
        let _ =
            writeln!(
            h,
            "<tr><td class=\"num\">{:.2}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td>{}</td></tr>",
            o.t_s,
            o.stage + 1,
            o.concurrency,
            o.request,
            o.requested_bytes.map(fmt_bytes).unwrap_or_else(|| "—".into()),
            fmt_bytes(o.allocated_bytes),
            fmt_bytes(o.reserved_bytes),
            esc(&o.message)
        );
    }
    h.push_str("</table>\n");
    if let Some(o) = r.ooms.iter().find(|o| !o.memory_summary.is_empty()) {
        let _ = writeln!(
            h,
            "<details><summary>memory_summary() at the first OOM</summary><pre>{}</pre></details>",
            esc(&o.memory_summary)
        );
    }
}

/// The header badges every report page has: the findings count and the thresholds' verdict.
pub(crate) fn findings_and_thresholds_badges(h: &mut String, r: &RunResult) {
    let _ = write!(
        h,
        "<span class=\"{}\">{} finding{}</span>",
        if r.findings.is_empty() { "ok" } else { "warn" },
        r.findings.len(),
        if r.findings.len() == 1 { "" } else { "s" }
    );
    if !r.thresholds.is_empty() {
        let failed = r.thresholds.iter().filter(|t| !t.passed).count();
        if failed == 0 {
            h.push_str("<span class=\"ok\">all thresholds passed</span>");
        } else {
            let _ = write!(h, "<span class=\"bad\">{failed} threshold(s) failed</span>");
        }
    }
}

/// Pads each column to its widest cell; `right[i]` aligns column `i` to the right.
pub(crate) fn table(out: &mut String, header: &[&str], rows: &[Vec<String>], right: &[bool]) {
    out.push_str(&vramroom_alloc::table::format_table(header, rows, right));
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

/// A threshold's limit as the user wrote it (`10%`, `64MiB`); the parsed limit in its unit
/// only for an expression without one (a results file written by hand).
fn limit_text(t: &ThresholdResult) -> String {
    crate::threshold::written_limit(&t.expr)
        .map(String::from)
        .unwrap_or_else(|| fmt_value(t.limit, &t.unit))
}

/// A threshold's measured value, in the terms of its written limit (`17.4%` against `10%`).
fn measured_text(t: &ThresholdResult, v: f64) -> String {
    fmt_measured(v, &t.unit, crate::threshold::written_limit(&t.expr))
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
                .map(|v| measured_text(t, v))
                .unwrap_or_else(|| "nothing".into())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_is_in_a_scroll_box() {
        let page = crate::report::render_html(&crate::report::testdata::synthetic());
        let http = crate::report::render_html(&crate::report::testdata::synthetic_http(true));
        for p in [&page, &http] {
            let tables = p.matches("<table").count();
            assert!(tables > 3);
            assert_eq!(p.matches("<div class=\"scroll\"><table").count(), tables);
            assert_eq!(p.matches("</table></div>").count(), tables);
        }
    }

    #[test]
    fn thresholds_print_as_written() {
        let mut r = crate::report::testdata::synthetic();
        r.thresholds = vec![ThresholdResult {
            expr: "error_rate<10%".into(),
            metric: "error_rate".into(),
            op: "<".into(),
            limit: 0.1,
            actual: Some(0.1736806947227789),
            unit: "ratio".into(),
            passed: false,
        }];
        let mut h = String::new();
        thresholds_section(&mut h, &r);
        assert!(h.contains("&lt; 10%") && h.contains("17.4%"), "{h}");
        assert!(!h.contains("0.1736") && !h.contains("0.100"), "{h}");
        let mut o = String::new();
        threshold_lines(&mut o, &r);
        assert!(o.contains("error_rate<10%") && o.contains("17.4%"), "{o}");
        // Written as a fraction, it reads as one, rounded.
        r.thresholds[0].expr = "error_rate<0.1".into();
        let mut o = String::new();
        threshold_lines(&mut o, &r);
        assert!(o.contains("(measured 0.174)"), "{o}");
    }
}
