//! The prediction part of the HTTP report (`vramroom http --predict`, `--ramp-until-oom`):
//! predicted against observed OOM concurrency, per device and config, the size caps, and
//! per-request peak memory against input size with its outliers.
//!
//! Design note: the numbers all come from `HttpResult::prediction` (see
//! `http::predict`); this file only lays them out, for the terminal and for the page, and
//! draws two small SVGs in the page's style: the simulated peak reserved per concurrency
//! against the limit, with the ramp's observed stages on the same axes, and the per-request
//! scatter. Nothing here runs when the run made no prediction.

use std::fmt::Write as _;

use super::format::fmt_bytes;
use super::parts::{esc, figure};
use crate::http::predict::{Observed, ServicePrediction};
use crate::results::*;

/// Ids of the prediction `<figure>`s, in page order.
pub const PREDICT_PLOT_IDS: [&str; 2] = ["plot-predict", "plot-requests"];

fn conc(v: Option<u32>) -> String {
    v.map_or("none found".into(), |c| c.to_string())
}

fn observed_line(o: &Observed) -> String {
    let mut s = format!(
        "observed first OOM at {} (last step without: {})",
        conc(o.first_oom_concurrency),
        conc(o.last_ok_concurrency)
    );
    if let Some(p) = o.predicted_first_oom {
        let _ = write!(s, "; predicted {p}");
    }
    if let (Some(e), Some(st)) = (o.error_pct, o.steps_apart) {
        let _ = write!(s, " ({e:+.0}%, {st:+} step(s))");
    }
    match o.agrees {
        Some(true) => s.push_str(": agrees (within 15% or one step)"),
        Some(false) => s.push_str(": DOES NOT agree"),
        None => {}
    }
    s
}

/// Terminal lines for the prediction, or nothing.
pub fn terminal_lines(o: &mut String, p: &ServicePrediction) {
    for d in &p.devices {
        let _ = writeln!(
            o,
            "prediction     device {}: limit {} (fraction {:.4} of {}), {} requests{}",
            d.device,
            fmt_bytes(d.limit_bytes),
            d.capacity.fraction,
            fmt_bytes(d.capacity.total_bytes),
            d.requests,
            if d.tagged {
                " tagged"
            } else {
                " (untagged: cut by pauses)"
            }
        );
        for c in &d.configs {
            let _ = writeln!(
                o,
                "  {:<34} first OOM at {} in flight (safe at {})",
                if c.alloc_conf.is_empty() {
                    "(default config)".to_string()
                } else {
                    c.alloc_conf.clone()
                },
                conc(c.first_oom_concurrency),
                c.safe_concurrency
            );
        }
        if let Some(cap) = &d.size_cap {
            let unit = cap.unit.as_deref().unwrap_or("units");
            let _ = writeln!(
                o,
                "  to keep {} in flight safe: {}",
                cap.target_concurrency,
                match cap.max_size {
                    Some(m) => format!("cap each request at {m} {unit}"),
                    None => format!("no cap on {unit} is enough"),
                }
            );
        }
        let a = &d.attribution;
        if let (Some(b), Some(u)) = (a.bytes_per_unit, a.unit.as_deref()) {
            let _ = writeln!(
                o,
                "  per request: {} per {} + {}; {} outlier(s){}",
                fmt_bytes(b.max(0.0) as u64),
                u.trim_end_matches('s'),
                fmt_bytes(a.intercept_bytes.unwrap_or(0.0).max(0.0) as u64),
                a.outliers.len(),
                a.outliers
                    .first()
                    .map(|(id, s, pk)| format!(", worst {id}: {s} {u}, {}", fmt_bytes(*pk)))
                    .unwrap_or_default()
            );
        }
    }
    if let Some(o2) = &p.observed {
        let _ = writeln!(o, "ramp           {}", observed_line(o2));
    }
    for n in &p.notes {
        let _ = writeln!(o, "  note: {n}");
    }
}

/// The page's prediction section, or nothing.
pub fn html_section(h: &mut String, r: &RunResult, p: &ServicePrediction) {
    h.push_str("<h2 id=\"prediction\">Predicted OOM concurrency</h2>\n");
    if let Some(o) = &p.observed {
        let _ = writeln!(h, "<p><strong>{}</strong></p>", esc(&observed_line(o)));
    }
    if !p.devices.is_empty() {
        h.push_str(
            "<table><tr><th>device</th><th>config</th><th class=\"num\">limit</th>\
             <th class=\"num\">predicted first OOM</th><th class=\"num\">safe</th></tr>\n",
        );
        for d in &p.devices {
            for c in &d.configs {
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td><code>{}</code></td><td class=\"num\">{}</td>\
                     <td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                    d.device,
                    esc(if c.alloc_conf.is_empty() {
                        "(default)"
                    } else {
                        &c.alloc_conf
                    }),
                    fmt_bytes(d.limit_bytes),
                    esc(&conc(c.first_oom_concurrency)),
                    c.safe_concurrency
                );
            }
        }
        h.push_str("</table>\n");
    }
    let mut text = String::new();
    terminal_lines(&mut text, p);
    let _ = writeln!(h, "<pre>{}</pre>", esc(&text));
    figure(
        h,
        PREDICT_PLOT_IDS[0],
        &predict_svg(r, p),
        "Peak reserved memory the replay of the gentle run's requests reaches at each \
         concurrency (the service's own config; red: at least half the simulated runs ran \
         out), against the limit; the ramp's stages, when this run ramped, as observed peak \
         reserved (squares), the observed first OOM marked.",
    );
    figure(
        h,
        PREDICT_PLOT_IDS[1],
        &requests_svg(p),
        "Each request's own peak memory against its input size, as the service tagged it \
         (probe.request(tokens=, items=, bytes=)), with the least-squares line; outliers \
         (more than 50% above the line) in red.",
    );
}

const W: f64 = 640.0;
const H: f64 = 300.0;
const L: f64 = 70.0;
const B: f64 = 40.0;

fn axes(s: &mut String, xlabel: &str, ylabel: &str, xmax: f64, ymax: f64) {
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\">\
         <line x1=\"{L}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\" stroke=\"#444\"/>\
         <line x1=\"{L}\" y1=\"10\" x2=\"{L}\" y2=\"{y0}\" stroke=\"#444\"/>\
         <text x=\"{xm}\" y=\"{yt}\" font-size=\"12\" text-anchor=\"middle\">{xl}</text>\
         <text x=\"14\" y=\"{ym}\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 14 {ym})\">{yl}</text>\
         <text x=\"{L}\" y=\"{yt2}\" font-size=\"10\">0</text>\
         <text x=\"{x1}\" y=\"{yt2}\" font-size=\"10\" text-anchor=\"end\">{xmax}</text>\
         <text x=\"{lx}\" y=\"14\" font-size=\"10\" text-anchor=\"end\">{ymaxs}</text>",
        y0 = H - B,
        x1 = W - 10.0,
        xm = (L + W) / 2.0,
        yt = H - 6.0,
        yt2 = H - B + 12.0,
        ym = (H - B) / 2.0,
        xl = esc(xlabel),
        yl = esc(ylabel),
        xmax = xmax.round(),
        lx = L - 4.0,
        ymaxs = esc(&fmt_bytes(ymax as u64)),
    );
}

fn px(x: f64, xmax: f64) -> f64 {
    L + (x / xmax.max(1e-9)) * (W - 10.0 - L)
}
fn py(y: f64, ymax: f64) -> f64 {
    (H - B) - (y / ymax.max(1e-9)) * (H - B - 10.0)
}

/// Simulated peak reserved per concurrency with the limit; the ramp's stages on top.
pub fn predict_svg(r: &RunResult, p: &ServicePrediction) -> String {
    let mut s = String::new();
    let Some(d) = p.devices.first() else {
        let observed = p.observed.as_ref().map(observed_line).unwrap_or_default();
        return format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} 40\"><text x=\"10\" y=\"24\" font-size=\"12\">no simulated points in this run (the prediction came from another run). {}</text></svg>",
            esc(&observed)
        );
    };
    let pts = d
        .configs
        .first()
        .map(|c| c.points.clone())
        .unwrap_or_default();
    let ramp: Vec<(f64, f64)> = if p.observed.is_some() {
        r.stages
            .iter()
            .map(|st| (st.concurrency as f64, st.peak_reserved_bytes as f64))
            .collect()
    } else {
        Vec::new()
    };
    let xmax = pts
        .iter()
        .map(|x| f64::from(x.0))
        .chain(ramp.iter().map(|x| x.0))
        .fold(1.0, f64::max);
    let ymax = (d.limit_bytes as f64 * 1.1).max(
        pts.iter()
            .map(|x| x.1 as f64)
            .chain(ramp.iter().map(|x| x.1))
            .fold(1.0, f64::max),
    );
    axes(&mut s, "requests in flight", "peak reserved", xmax, ymax);
    let ly = py(d.limit_bytes as f64, ymax);
    let _ = write!(
        s,
        "<line x1=\"{L}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"#c00\" stroke-dasharray=\"4 3\"/>\
         <text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"#c00\">limit {}</text>",
        W - 10.0,
        L + 4.0,
        ly - 3.0,
        esc(&fmt_bytes(d.limit_bytes))
    );
    let line: Vec<String> = pts
        .iter()
        .map(|x| {
            format!(
                "{:.1},{:.1}",
                px(f64::from(x.0), xmax),
                py(x.1 as f64, ymax)
            )
        })
        .collect();
    if !line.is_empty() {
        let _ = write!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"#1f77b4\"/>",
            line.join(" ")
        );
    }
    for x in &pts {
        let _ = write!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{}\"><title>{} in flight: {} ({:.0}% of runs out of memory)</title></circle>",
            px(f64::from(x.0), xmax),
            py(x.1 as f64, ymax),
            if x.2 >= 0.5 { "#d62728" } else { "#1f77b4" },
            x.0,
            esc(&fmt_bytes(x.1)),
            x.2 * 100.0
        );
    }
    for (c, pk) in &ramp {
        let _ = write!(
            s,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"7\" height=\"7\" fill=\"#2ca02c\"><title>ramp: {c} workers, peak reserved {}</title></rect>",
            px(*c, xmax) - 3.5,
            py(*pk, ymax) - 3.5,
            esc(&fmt_bytes(*pk as u64))
        );
    }
    if let Some(o) = p.observed.as_ref().and_then(|o| o.first_oom_concurrency) {
        let x = px(f64::from(o), xmax);
        let _ = write!(
            s,
            "<line x1=\"{x:.1}\" y1=\"10\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#2ca02c\" stroke-dasharray=\"2 2\"/>\
             <text x=\"{:.1}\" y=\"22\" font-size=\"10\" fill=\"#2ca02c\">observed OOM {o}</text>",
            H - B,
            x + 3.0
        );
    }
    s.push_str("</svg>");
    s
}

/// Per-request peak against size, with the fit and the outliers.
pub fn requests_svg(p: &ServicePrediction) -> String {
    let mut s = String::new();
    let Some(d) = p.devices.first() else {
        return format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} 40\"><text x=\"10\" y=\"24\" font-size=\"12\">no requests in this run's trace</text></svg>"
        );
    };
    let a = &d.attribution;
    let pts: Vec<(f64, f64, &str)> = a
        .points
        .iter()
        .filter_map(|q| {
            q.size
                .map(|z| (z as f64, q.peak_bytes as f64, q.id.as_str()))
        })
        .collect();
    let xmax = pts.iter().map(|x| x.0).fold(1.0, f64::max);
    let ymax = pts.iter().map(|x| x.1).fold(1.0, f64::max) * 1.05;
    axes(
        &mut s,
        &format!("input size ({})", a.unit.as_deref().unwrap_or("untagged")),
        "request's peak",
        xmax,
        ymax,
    );
    for (x, y, id) in &pts {
        let out = a.outliers.iter().any(|o| o.0 == *id);
        let _ = write!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"{}\" fill-opacity=\"0.7\"><title>{}: {} → {}</title></circle>",
            px(*x, xmax),
            py(*y, ymax),
            if out { "#d62728" } else { "#1f77b4" },
            esc(id),
            x,
            esc(&fmt_bytes(*y as u64))
        );
    }
    if let (Some(b), Some(c)) = (a.bytes_per_unit, a.intercept_bytes) {
        let y0 = c.max(0.0);
        let y1 = (c + b * xmax).clamp(0.0, ymax);
        let _ = write!(
            s,
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#444\" stroke-dasharray=\"5 3\"/>",
            px(0.0, xmax),
            py(y0, ymax),
            px(xmax, xmax),
            py(y1, ymax)
        );
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::predict::*;

    fn pred() -> ServicePrediction {
        ServicePrediction {
            gentle_concurrency: 2,
            devices: vec![DevicePrediction {
                device: 0,
                capacity: DeviceCapacity {
                    device: 0,
                    fraction: 0.5,
                    capacity_bytes: 1 << 30,
                    total_bytes: 2 << 30,
                },
                limit_bytes: 1 << 30,
                overhead_bytes: 0,
                requests: 3,
                tagged: true,
                configs: vec![ConfigPrediction {
                    alloc_conf: String::new(),
                    first_oom_concurrency: Some(8),
                    safe_concurrency: 7,
                    max_concurrency_tried: 8,
                    points: vec![(1, 100 << 20, 0.0), (8, 1 << 30, 0.8)],
                    one_worker: false,
                }],
                size_cap: Some(SizeCap {
                    target_concurrency: 4,
                    max_size: Some(256),
                    unit: Some("tokens".into()),
                }),
                attribution: RequestAttribution {
                    unit: Some("tokens".into()),
                    requests: 3,
                    bytes_per_unit: Some(1000.0),
                    intercept_bytes: Some(0.0),
                    outliers: vec![("<x>".into(), 10, 1 << 20)],
                    points: vec![
                        RequestPoint {
                            id: "a".into(),
                            size: Some(100),
                            peak_bytes: 100_000,
                        },
                        RequestPoint {
                            id: "<x>".into(),
                            size: Some(10),
                            peak_bytes: 1 << 20,
                        },
                    ],
                },
            }],
            first_oom_concurrency: Some(8),
            observed: None,
            notes: vec![],
        }
    }

    #[test]
    fn the_section_shows_the_prediction_and_escapes_ids() {
        let r = crate::report::testdata::synthetic_http(false);
        let mut h = String::new();
        html_section(&mut h, &r, &pred());
        assert!(h.contains("first OOM at 8"));
        assert!(h.contains("cap each request at 256 tokens"));
        assert!(h.contains("&lt;x&gt;") && !h.contains("<x>"));
        for id in PREDICT_PLOT_IDS {
            assert!(h.contains(&format!("id=\"{id}\"")));
        }
        let mut p = pred();
        let mut o = Observed {
            first_oom_concurrency: Some(8),
            last_ok_concurrency: Some(6),
            steps: vec![1, 2, 4, 6, 8],
            ..Default::default()
        };
        o.compare(Some(8));
        p.observed = Some(o);
        let mut t = String::new();
        terminal_lines(&mut t, &p);
        assert!(
            t.contains("observed first OOM at 8") && t.contains("agrees"),
            "{t}"
        );
    }
}
