//! The single self-contained HTML report: inline CSS, inline SVG plots, no script and no
//! external URL, so it opens from a CI artifact, an email or a file share as it is.
//!
//! Every piece of text that comes from the run (scenario names, alloc confs, finding texts,
//! OOM messages, threshold expressions) goes through [`super::parts::esc`].

use std::fmt::Write as _;

use super::format::{fmt_bytes, fmt_ms, fmt_signed_bytes};
use super::parts::*;
use super::plots;
use crate::results::*;

/// Ids of the `<figure>`s that hold the plots, in page order.
pub const PLOT_IDS: [&str; 5] = [
    "plot-timeline",
    "plot-categories-time",
    "plot-latency",
    "plot-peak-concurrency",
    "plot-categories",
];

/// Renders a load test's page ([`super::render_html`] picks it for in-process runs).
pub(super) fn render_run_html(r: &RunResult) -> String {
    let mut h = String::with_capacity(256 * 1024);
    let title = format!("Vramroom load test: {}", r.scenario.name);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n",
        esc(&title)
    );
    let _ = writeln!(h, "<h1>{}</h1>", esc(&title));
    let _ = writeln!(h, "<p class=\"sub\">{}</p>", esc(&r.scenario.description));
    badges(&mut h, r);
    summary_section(&mut h, r);
    stages_section(&mut h, r);

    h.push_str("<h2 id=\"memory\">Memory over time</h2>\n");
    figure(
        &mut h,
        PLOT_IDS[0],
        &plots::timeline_svg(r),
        "Allocated (live tensors), reserved (held by the caching allocator), active, \
         inactive_split (free bytes inside split segments) and device used, sampled every \
         period and at every new peak; with NVML, the bytes the process holds on the device \
         and the context + library overhead (process used − reserved: the CUDA context and \
         library workspaces); each stage is a band, OOMs are red crosses at the bytes that broke the capacity \
         (reserved + the request that failed).",
    );
    memory_sources_section(&mut h, r);
    figure(
        &mut h,
        PLOT_IDS[1],
        &plots::categories_over_time_svg(r),
        "What the allocated bytes are for, stacked, over the same time axis.",
    );

    h.push_str("<h2 id=\"latency\">Latency and throughput against concurrency</h2>\n");
    figure(
        &mut h,
        PLOT_IDS[2],
        &plots::latency_svg(r),
        "Percentiles of successful requests' latency, from an HDR histogram, per concurrency level.",
    );
    concurrency_table(&mut h, r);

    h.push_str("<h2 id=\"oom\">Peak memory and the OOM point</h2>\n");
    if let Some(s) = r.oom_search.as_ref() {
        let _ = writeln!(
            h,
            "<p class=\"verdict\"><strong>{}</strong></p>",
            esc(&s.headline)
        );
    }
    figure(
        &mut h,
        PLOT_IDS[3],
        &plots::peak_vs_concurrency_svg(r),
        "Peak reserved per concurrency level (the run's and the search's probes on the meta \
         twin), the line fitted to it, where it crosses the capacity, and the verified safe \
         load of the verdict above.",
    );
    oom_search_section(&mut h, r);

    h.push_str("<h2 id=\"categories\">Category breakdown at the peak</h2>\n");
    figure(
        &mut h,
        PLOT_IDS[4],
        &plots::categories_svg(r),
        "Bytes by what they are for, at the allocated peak (and at the first OOM).",
    );
    categories_table(&mut h, r);

    findings_section(&mut h, r);
    what_if_section(&mut h, r);
    thresholds_section(&mut h, r);
    ooms_section(&mut h, r);

    if !r.final_memory_summary.is_empty() {
        h.push_str("<h2 id=\"summary-final\">Allocator state at the end</h2>\n");
        let _ = writeln!(
            h,
            "<details><summary>memory_summary() at the end of the run</summary><pre>{}</pre></details>",
            esc(&r.final_memory_summary)
        );
    }
    let _ = writeln!(
        h,
        "<footer>vramroom {} · results schema v{} · the same numbers are in results.json; \
         snapshot.pickle opens in PyTorch's memory_viz.</footer>",
        esc(&r.vramroom_version),
        r.schema_version
    );
    h.push_str("</main>\n</body>\n</html>\n");
    h
}

fn badges(h: &mut String, r: &RunResult) {
    h.push_str("<div class=\"badges\">");
    let _ = write!(
        h,
        "<span>{} on {}</span><span>capacity {}</span>",
        esc(&r.scenario.model),
        esc(&r.device),
        fmt_bytes(r.capacity_bytes)
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
    let _ = write!(
        h,
        "<span class=\"{}\">{} OOM{}</span>",
        if r.requests.oom > 0 { "bad" } else { "ok" },
        r.requests.oom,
        if r.requests.oom == 1 { "" } else { "s" }
    );
    findings_and_thresholds_badges(h, r);
    if let Some(s) = r.oom_search.as_ref() {
        let _ = write!(h, "<span class=\"ok\">{}</span>", esc(&s.headline));
    }
    h.push_str("</div>\n");
}

fn mistakes_text(m: &Mistakes) -> String {
    let mut v = Vec::new();
    if m.grad_at_inference {
        v.push("grad on at inference");
    }
    if m.sum_losses {
        v.push("sum losses before backward");
    }
    if m.keep_outputs {
        v.push("keep every output");
    }
    if m.named_temporaries {
        v.push("named temporaries");
    }
    if v.is_empty() {
        "none (clean)".into()
    } else {
        v.join(", ")
    }
}

fn stages_text(l: &LoadInfo) -> String {
    let mut s = l
        .stages
        .iter()
        .map(|st| match st.duration_s {
            Some(d) => format!("{}:{}s", st.concurrency, trim_float(d)),
            None => format!("{} workers", st.concurrency),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if let Some(n) = l.max_requests {
        let _ = write!(s, " ({n} requests)");
    }
    if let Some(t) = l.time_limit_s {
        let _ = write!(s, " (bounded at {}s)", trim_float(t));
    }
    s
}

fn summary_section(h: &mut String, r: &RunResult) {
    h.push_str("<h2 id=\"run\">Run summary</h2>\n");
    let sc = &r.scenario;
    let mut rows: Vec<(&str, String)> = vec![
        ("scenario", format!("{} ({})", sc.name, sc.kind)),
        ("model", sc.model.clone()),
        ("batch", sc.batch.to_string()),
        ("input sizes", sc.input.clone()),
    ];
    if let Some(o) = &sc.optimizer {
        rows.push(("optimizer", o.clone()));
    }
    if let Some(a) = sc.accum_steps {
        rows.push((
            "accumulation",
            format!(
                "{a} steps, {}",
                sc.accum_pattern.clone().unwrap_or_default()
            ),
        ));
    }
    rows.extend([
        ("planted mistakes", mistakes_text(&sc.mistakes)),
        ("device", r.device.clone()),
        ("capacity", fmt_bytes(r.capacity_bytes)),
        (
            "allocator config",
            if r.alloc_conf.is_empty() {
                "default".into()
            } else {
                r.alloc_conf.clone()
            },
        ),
        ("load", format!("{}: {}", r.load.mode, stages_text(&r.load))),
        ("wall time", format!("{:.2} s", r.wall_s)),
        ("stop reason", stop_text(r.stop_reason).into()),
        ("baseline (weights, state)", fmt_bytes(r.baseline_bytes)),
        (
            "requests",
            format!(
                "{} total, {} ok, {} OOM, {} other errors",
                r.requests.total, r.requests.ok, r.requests.oom, r.requests.other_errors
            ),
        ),
        (
            "throughput",
            format!(
                "{:.1} requests/s, {:.1} samples/s",
                r.throughput.requests_per_s, r.throughput.items_per_s
            ),
        ),
        (
            "latency",
            format!(
                "p50 {} · p90 {} · p99 {} · p99.9 {} · max {}",
                fmt_ms(r.latency.p50_ms),
                fmt_ms(r.latency.p90_ms),
                fmt_ms(r.latency.p99_ms),
                fmt_ms(r.latency.p999_ms),
                fmt_ms(r.latency.max_ms)
            ),
        ),
        (
            "peak allocated / reserved",
            format!(
                "{} / {} ({} above baseline)",
                fmt_bytes(r.peaks.allocated_bytes),
                fmt_bytes(r.peaks.reserved_bytes),
                fmt_bytes(r.peaks.above_base_bytes)
            ),
        ),
        (
            "peak active / inactive_split",
            format!(
                "{} / {}",
                fmt_bytes(r.peaks.active_bytes),
                fmt_bytes(r.peaks.inactive_split_bytes)
            ),
        ),
        ("alloc retries", r.peaks.alloc_retries.to_string()),
        (
            "fragmented segment allocs",
            format!(
                "{} ({}): segments reserved although the cache held enough free bytes",
                r.peaks.fragmented_segment_allocs,
                fmt_bytes(r.peaks.fragmented_segment_bytes)
            ),
        ),
    ]);
    if let Some(p) = r.peaks.process_used_bytes {
        rows.push((
            "peak process used (NVML) / context + library overhead",
            format!(
                "{} / {}",
                fmt_bytes(p),
                r.peaks
                    .overhead_bytes
                    .map(fmt_bytes)
                    .unwrap_or_else(|| "—".into())
            ),
        ));
    }
    if !r.errors.by_kind.is_empty() {
        rows.push((
            "errors by kind",
            r.errors
                .by_kind
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", "),
        ));
    }
    kv(h, &rows);
}

fn stages_section(h: &mut String, r: &RunResult) {
    h.push_str("<h2 id=\"stages\">Stages</h2>\n");
    if r.stages.is_empty() {
        h.push_str("<p>No stage ran.</p>\n");
        return;
    }
    h.push_str(
        "<table><tr><th>stage</th><th class=\"num\">workers</th><th class=\"num\">time (s)</th>\
         <th class=\"num\">requests</th><th class=\"num\">ok</th><th class=\"num\">OOM</th>\
         <th class=\"num\">errors</th><th class=\"num\">req/s</th><th class=\"num\">p50</th>\
         <th class=\"num\">p99</th><th class=\"num\">peak allocated</th>\
         <th class=\"num\">peak reserved</th></tr>\n",
    );
    for s in &r.stages {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:.1}–{:.1}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{:.1}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            s.index + 1,
            s.concurrency,
            s.start_s,
            s.end_s,
            s.requests.total,
            s.requests.ok,
            s.requests.oom,
            s.requests.other_errors,
            s.throughput.requests_per_s,
            fmt_ms(s.latency.p50_ms),
            fmt_ms(s.latency.p99_ms),
            fmt_bytes(s.peak_allocated_bytes),
            fmt_bytes(s.peak_reserved_bytes),
        );
    }
    h.push_str("</table>\n");
}

fn concurrency_table(h: &mut String, r: &RunResult) {
    if r.by_concurrency.is_empty() {
        return;
    }
    h.push_str(
        "<table><tr><th class=\"num\">workers</th><th class=\"num\">requests</th>\
         <th class=\"num\">req/s</th><th class=\"num\">samples/s</th><th class=\"num\">p50</th>\
         <th class=\"num\">p90</th><th class=\"num\">p99</th><th class=\"num\">p99.9</th>\
         <th class=\"num\">peak allocated</th><th class=\"num\">peak reserved</th>\
         <th class=\"num\">above baseline</th></tr>\n",
    );
    for c in &r.by_concurrency {
        let _ = writeln!(
            h,
            "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{:.1}</td>\
             <td class=\"num\">{:.1}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            c.concurrency,
            c.requests.total,
            c.throughput.requests_per_s,
            c.throughput.items_per_s,
            fmt_ms(c.latency.p50_ms),
            fmt_ms(c.latency.p90_ms),
            fmt_ms(c.latency.p99_ms),
            fmt_ms(c.latency.p999_ms),
            fmt_bytes(c.peak_allocated_bytes),
            fmt_bytes(c.peak_reserved_bytes),
            fmt_bytes(c.peak_above_base_bytes),
        );
    }
    h.push_str("</table>\n");
}

fn opt(v: Option<usize>) -> String {
    v.map(|x| x.to_string()).unwrap_or_else(|| "—".into())
}

fn oom_search_section(h: &mut String, r: &RunResult) {
    let Some(s) = &r.oom_search else {
        h.push_str("<p>The OOM search did not run (skipped or cancelled).</p>\n");
        return;
    };
    kv(
        h,
        &[
            (
                "search",
                format!(
                    "{} on {}, {} fitted, capacity {} with a {:.0}% fragmentation margin (budget {})",
                    s.axis,
                    s.device,
                    s.metric,
                    fmt_bytes(s.capacity_bytes),
                    s.margin_fraction * 100.0,
                    fmt_bytes(s.budget_bytes)
                ),
            ),
            (
                "fit",
                format!(
                    "peak ≈ {} + {} × {} (R² {:.4})",
                    fmt_signed_bytes(s.fit.a.round() as i64),
                    fmt_signed_bytes(s.fit.b.round() as i64),
                    s.axis,
                    s.fit.r2
                ),
            ),
            (
                "marginal memory of one more request",
                fmt_bytes(s.marginal_bytes_per_unit),
            ),
            ("where the fit of peak reserved crosses the capacity", opt(s.predicted_oom_load)),
            ("first OOM (bisection under the capacity)", opt(s.observed_oom_load)),
            ("safe (verified, peak reserved within the budget)", opt(s.verified_safe_load)),
            ("searched up to", s.max_load_tried.to_string()),
        ],
    );
    if !s.bisection.is_empty() || !s.points.is_empty() {
        h.push_str(
            "<details><summary>Probes</summary><table><tr><th>kind</th><th class=\"num\">load</th>\
             <th class=\"num\">peak allocated</th><th class=\"num\">peak reserved</th><th>OOM</th></tr>\n",
        );
        for (kind, v) in [("fit", &s.points), ("bisection", &s.bisection)] {
            for p in v {
                let _ = writeln!(
                    h,
                    "<tr><td>{kind}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                     <td class=\"num\">{}</td><td>{}</td></tr>",
                    p.load,
                    fmt_bytes(p.peak_allocated_bytes),
                    fmt_bytes(p.peak_reserved_bytes),
                    if p.oom { "yes" } else { "no" }
                );
            }
        }
        h.push_str("</table></details>\n");
    }
}

fn categories_table(h: &mut String, r: &RunResult) {
    let c = r.peaks.categories_at_peak;
    let total = c.total().max(1);
    h.push_str(
        "<table><tr><th>category</th><th class=\"num\">bytes at the peak</th><th class=\"num\">share</th></tr>\n",
    );
    for (i, (name, b)) in c.entries().iter().enumerate() {
        let _ = writeln!(
            h,
            "<tr><td><span class=\"swatch\" style=\"background:{}\"></span>{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{:.1}%</td></tr>",
            plots::category_css(i),
            esc(name),
            fmt_bytes(*b),
            100.0 * *b as f64 / total as f64
        );
    }
    let _ = writeln!(
        h,
        "<tr><th>total</th><th class=\"num\">{}</th><th></th></tr></table>",
        fmt_bytes(c.total())
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::render_html;
    use crate::report::testdata::synthetic;

    #[test]
    fn report_is_self_contained_and_escaped() {
        let r = synthetic();
        let h = render_html(&r);
        for id in PLOT_IDS {
            assert!(h.contains(&format!("id=\"{id}\"")), "missing {id}");
        }
        assert_eq!(h.matches("<svg").count(), PLOT_IDS.len());
        assert!(!h.contains("<script"), "a script tag got through unescaped");
        assert!(h.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(h.contains("x &lt; y &amp;&amp; y &gt; z"));
        assert!(only_svg_ns(&h), "an external URL in the report");
        assert!(!h.contains("https://"));
        assert!(h.contains("expandable_segments:True"));
        assert!(h.contains("p99&lt;20ms") && h.contains("FAIL"));
        assert!(h.contains("Autograd was on during inference"));
        // the verdict reads as the terminal and the JSON say it
        let v = &r.oom_search.as_ref().unwrap().headline;
        assert!(h.contains(&esc(v)), "verdict {v} missing");
        assert_eq!(h.matches(&esc(v)).count(), 2, "badge and the OOM section");
    }

    /// The only `http://` allowed is the SVG namespace, which is an identifier, not a fetch.
    fn only_svg_ns(h: &str) -> bool {
        h.replace("http://www.w3.org/2000/svg", "")
            .replace("http://www.w3.org/1999/xlink", "")
            .find("http://")
            .is_none()
    }

    #[test]
    fn clean_run_says_no_findings() {
        let mut r = synthetic();
        r.findings.clear();
        r.thresholds.clear();
        let h = render_html(&r);
        assert!(h.contains("No findings"));
    }
}
