//! The report's plots, drawn with plotters into inline SVG strings.
//!
//! Design note: each plot is a function of the [`RunResult`] that returns one `<svg>`
//! element (plotters' SVG backend escapes its text). A plot with nothing to show (no
//! timeline, a single concurrency level, no OOM search) still returns an SVG that says so,
//! so the report always has the same figures in the same places. Long timelines are
//! decimated per time bucket keeping each bucket's lowest and highest sample, so peaks
//! survive and the page stays small.

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::results::{CategoryBytes, LatencyStats, MemorySample, RunResult, SampleKind};

/// Width and height of every plot, in SVG pixels.
pub const WIDTH: u32 = 1000;
pub const HEIGHT: u32 = 420;

/// Most points a timeline series keeps (two per bucket).
const MAX_POINTS: usize = 2400;

const C_ALLOC: RGBColor = RGBColor(31, 119, 180);
const C_RESERVED: RGBColor = RGBColor(255, 127, 14);
const C_ACTIVE: RGBColor = RGBColor(44, 160, 44);
const C_SPLIT: RGBColor = RGBColor(148, 103, 189);
const C_DEVICE: RGBColor = RGBColor(127, 127, 127);
const C_CAP: RGBColor = RGBColor(214, 39, 40);
const C_FIT: RGBColor = RGBColor(23, 190, 207);
const C_BUDGET: RGBColor = RGBColor(230, 130, 130);
const C_SAFE: RGBColor = RGBColor(44, 160, 44);
const C_PROCESS: RGBColor = RGBColor(140, 86, 75);
const C_OVERHEAD: RGBColor = RGBColor(227, 119, 194);
const C_P: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
];
/// One colour per memory category, in [`CategoryBytes::entries`] order.
pub const CATEGORY_COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),  // parameter
    RGBColor(188, 189, 34),  // gradient
    RGBColor(148, 103, 189), // optimizer_state
    RGBColor(214, 39, 40),   // activation
    RGBColor(255, 127, 14),  // temporary
    RGBColor(127, 127, 127), // input
];

/// `#rrggbb` of a category's colour, for the HTML tables beside the plots.
pub fn category_css(i: usize) -> String {
    let c = CATEGORY_COLORS[i % CATEGORY_COLORS.len()];
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

const FONT: &str = "sans-serif";

/// A byte unit for an axis: the largest of KiB/MiB/GiB that keeps `max` at or above 1.
#[derive(Debug, Clone, Copy)]
struct Scale {
    div: f64,
    name: &'static str,
}

impl Scale {
    fn for_max(max: f64) -> Scale {
        if max >= 4.0 * (1u64 << 30) as f64 {
            Scale {
                div: (1u64 << 30) as f64,
                name: "GiB",
            }
        } else if max >= 4.0 * (1u64 << 20) as f64 {
            Scale {
                div: (1u64 << 20) as f64,
                name: "MiB",
            }
        } else {
            Scale {
                div: 1024.0,
                name: "KiB",
            }
        }
    }
    fn v(&self, bytes: u64) -> f64 {
        bytes as f64 / self.div
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type PResult<T> = Result<T, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Draws into a fresh SVG string; on a drawing error, returns an SVG with the error text.
fn render(title: &str, f: impl FnOnce(&Area) -> PResult<()>) -> String {
    render_sized(title, HEIGHT, f)
}

fn render_sized(title: &str, height: u32, f: impl FnOnce(&Area) -> PResult<()>) -> String {
    let mut buf = String::new();
    let res = {
        let root = SVGBackend::with_string(&mut buf, (WIDTH, height)).into_drawing_area();
        let r = root.fill(&WHITE).map_err(err).and_then(|_| f(&root));
        let p = root.present().map_err(err);
        r.and(p)
    };
    match res {
        Ok(()) => buf,
        Err(e) => message_svg(title, &format!("could not draw this plot: {e}")),
    }
}

/// An SVG with a title and a line of text: for plots with nothing to show.
pub fn message_svg(title: &str, msg: &str) -> String {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (WIDTH, 120)).into_drawing_area();
        let _ = root.fill(&WHITE);
        let _ = root.draw(&Text::new(
            title.to_string(),
            (20, 20),
            (FONT, 20).into_font().color(&BLACK),
        ));
        let _ = root.draw(&Text::new(
            msg.to_string(),
            (20, 65),
            (FONT, 16).into_font().color(&RGBColor(90, 90, 90)),
        ));
        let _ = root.present();
    }
    buf
}

/// Keeps at most `max` samples: per time bucket, the lowest and the highest by `key`
/// (in time order), and every OOM sample.
fn decimate(
    samples: &[MemorySample],
    max: usize,
    key: impl Fn(&MemorySample) -> u64,
) -> Vec<MemorySample> {
    if samples.len() <= max {
        return samples.to_vec();
    }
    let buckets = (max / 2).max(1);
    let t0 = samples.first().map(|s| s.t_s).unwrap_or(0.0);
    let t1 = samples.last().map(|s| s.t_s).unwrap_or(1.0);
    let span = (t1 - t0).max(1e-9);
    let mut out = Vec::with_capacity(max + 16);
    let mut i = 0;
    for b in 0..buckets {
        let end = t0 + span * (b + 1) as f64 / buckets as f64;
        let mut lo: Option<usize> = None;
        let mut hi: Option<usize> = None;
        let start = i;
        while i < samples.len() && (samples[i].t_s <= end || b + 1 == buckets) {
            let k = key(&samples[i]);
            if lo.is_none_or(|j| k < key(&samples[j])) {
                lo = Some(i);
            }
            if hi.is_none_or(|j| k > key(&samples[j])) {
                hi = Some(i);
            }
            i += 1;
        }
        let mut keep: Vec<usize> = lo.into_iter().chain(hi).collect();
        keep.extend((start..i).filter(|&j| samples[j].kind == SampleKind::Oom));
        keep.sort_unstable();
        keep.dedup();
        out.extend(keep.into_iter().map(|j| samples[j]));
    }
    out
}

fn legend_line(c: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3))
}

fn legend_box(c: RGBColor) -> impl Fn((i32, i32)) -> Rectangle<(i32, i32)> {
    move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled())
}

/// The series legend, in the one style every plot uses: at `position`, `margin` px in.
fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
    margin: i32,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .margin(margin)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(200, 200, 200))
        .label_font((FONT, 13))
        .draw()
        .map_err(err)
}

/// The memory timeline: allocated, reserved, active, inactive_split and device used (where
/// there is a device), the capacity, OOMs as red crosses, and each stage as a band.
pub fn timeline_svg(r: &RunResult) -> String {
    let title = "Memory timeline";
    // An HTTP run draws only what its memory sources measured; a loadtest has them all.
    let measured = |name: &str| {
        r.http
            .as_ref()
            .is_none_or(|h| h.memory_series.iter().any(|s| s == name))
    };
    if r.timeline.is_empty() {
        return message_svg(
            title,
            if r.http.is_some() {
                "No memory source: pass --metrics-url (vramroom serve, vramroom_probe.py, DCGM, \
                 Triton) or run beside the GPU for NVML."
            } else {
                "No memory samples were taken (the run ended before the first)."
            },
        );
    }
    let samples = decimate(&r.timeline, MAX_POINTS, |s| s.allocated_bytes);
    let has_device = samples.iter().any(|s| s.device_used_bytes.is_some());
    let has_process = samples.iter().any(|s| s.process_used_bytes.is_some());
    let has_overhead = samples.iter().any(|s| s.overhead_bytes.is_some());
    let data_max = oom_markers(r)
        .iter()
        .map(|m| m.1)
        .chain(samples.iter().map(|s| {
            s.reserved_bytes
                .max(s.allocated_bytes)
                .max(s.active_bytes)
                .max(s.device_used_bytes.unwrap_or(0))
                .max(s.process_used_bytes.unwrap_or(0))
        }))
        .max()
        .unwrap_or(0)
        .max(r.peaks.reserved_bytes);
    // The capacity line is drawn when it is within reach of the data; a 140 GiB card under a
    // 100 MiB workload would flatten every curve. A service's capacity is the reference of
    // its whole timeline (the line its memory must stay under), so it is drawn from further.
    let reach = if r.http.is_some() { 8.0 } else { 4.0 };
    let show_cap =
        r.capacity_bytes > 0 && (r.capacity_bytes as f64) <= reach * data_max.max(1) as f64;
    let y_max_b = if show_cap {
        data_max.max(r.capacity_bytes)
    } else {
        data_max
    };
    let sc = Scale::for_max(y_max_b as f64);
    let y_max = (sc.v(y_max_b) * 1.12).max(1e-6);
    let t_end = r
        .timeline
        .last()
        .map(|s| s.t_s)
        .unwrap_or(0.0)
        .max(r.stages.last().map(|s| s.end_s).unwrap_or(0.0))
        .max(1e-3);
    render(title, |root| {
        let cap_note = if show_cap || r.capacity_bytes == 0 {
            String::new()
        } else {
            format!(
                " (capacity {} off the scale)",
                super::format::fmt_bytes(r.capacity_bytes)
            )
        };
        let mut chart = ChartBuilder::on(root)
            .caption(format!("{title}{cap_note}"), (FONT, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..t_end, 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time since the first request (s)")
            .y_desc(sc.name)
            .light_line_style(RGBColor(243, 243, 243))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .draw()
            .map_err(err)?;
        // Stage bands, alternating shades, each labelled with its concurrency.
        for (i, st) in r.stages.iter().enumerate() {
            let shade = if i % 2 == 0 {
                RGBColor(240, 244, 250)
            } else {
                RGBColor(250, 250, 250)
            };
            let (a, b) = (st.start_s.max(0.0), st.end_s.min(t_end).max(st.start_s));
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(a, 0.0), (b, y_max)],
                    shade.filled(),
                )))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(DashedPathElement::new(
                    vec![(a, 0.0), (a, y_max)],
                    4,
                    4,
                    RGBColor(150, 150, 150).stroke_width(1),
                )))
                .map_err(err)?;
            let load = match r
                .http
                .as_ref()
                .and_then(|h| h.stages.get(i))
                .and_then(|h| h.rate_per_s)
            {
                Some(q) => format!("q={q}/s"),
                None => format!("c={}", st.concurrency),
            };
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("stage {} · {load}", i + 1),
                    (a + t_end * 0.004, y_max * 0.985),
                    (FONT, 13).into_font().color(&RGBColor(80, 80, 80)),
                )))
                .map_err(err)?;
        }
        type Get = fn(&MemorySample) -> u64;
        // Allocated is drawn over the others, and active (which equals allocated unless a
        // freed block still waits on another stream) dashed on top of it, so both show.
        let series: [(&str, RGBColor, Get, u32); 3] = [
            ("reserved", C_RESERVED, |s| s.reserved_bytes, 2),
            ("inactive_split", C_SPLIT, |s| s.inactive_split_bytes, 1),
            ("allocated", C_ALLOC, |s| s.allocated_bytes, 2),
        ];
        for (name, color, get, w) in series {
            if !measured(name) {
                continue;
            }
            chart
                .draw_series(LineSeries::new(
                    samples.iter().map(|s| (s.t_s, sc.v(get(s)))),
                    color.stroke_width(w),
                ))
                .map_err(err)?
                .label(name)
                .legend(legend_line(color));
        }
        if measured("active") {
            chart
                .draw_series(DashedLineSeries::new(
                    samples.iter().map(|s| (s.t_s, sc.v(s.active_bytes))),
                    3,
                    3,
                    C_ACTIVE.stroke_width(1),
                ))
                .map_err(err)?
                .label("active")
                .legend(legend_line(C_ACTIVE));
        }
        // NVML beside the allocator: what the process holds on the device, and the part
        // of it that is not the allocator's (CUDA context, cuBLAS/cuDNN workspaces).
        if has_process {
            chart
                .draw_series(LineSeries::new(
                    samples
                        .iter()
                        .filter_map(|s| s.process_used_bytes.map(|d| (s.t_s, sc.v(d)))),
                    C_PROCESS.stroke_width(2),
                ))
                .map_err(err)?
                .label("process used (NVML)")
                .legend(legend_line(C_PROCESS));
        }
        if has_overhead {
            chart
                .draw_series(DashedLineSeries::new(
                    samples
                        .iter()
                        .filter_map(|s| s.overhead_bytes.map(|d| (s.t_s, sc.v(d)))),
                    5,
                    3,
                    C_OVERHEAD.stroke_width(2),
                ))
                .map_err(err)?
                .label("context + library overhead")
                .legend(legend_line(C_OVERHEAD));
        }
        if has_device {
            chart
                .draw_series(DashedLineSeries::new(
                    samples
                        .iter()
                        .filter_map(|s| s.device_used_bytes.map(|d| (s.t_s, sc.v(d)))),
                    6,
                    3,
                    C_DEVICE.stroke_width(2),
                ))
                .map_err(err)?
                .label("device used")
                .legend(legend_line(C_DEVICE));
        }
        if show_cap {
            let cap = sc.v(r.capacity_bytes);
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(0.0, cap), (t_end, cap)],
                    8,
                    4,
                    C_CAP.stroke_width(2),
                ))
                .map_err(err)?
                .label("capacity")
                .legend(legend_line(C_CAP));
        }
        let ooms: Vec<(f64, f64)> = oom_markers(r)
            .into_iter()
            .map(|(t, b)| (t, sc.v(b)))
            .collect();
        if !ooms.is_empty() {
            chart
                .draw_series(
                    ooms.into_iter()
                        .map(|p| Cross::new(p, 6, C_CAP.stroke_width(2))),
                )
                .map_err(err)?
                .label("OOM")
                .legend(|(x, y)| Cross::new((x + 9, y), 5, C_CAP.stroke_width(2)));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 18)?;
        Ok(())
    })
}

/// Each OOM's marker: its time and the bytes it is drawn at, the memory the allocator would
/// have held had the failing malloc succeeded (reserved + requested). That is the number
/// that crossed the capacity, so the marker sits on or above the capacity line; drawn at the
/// allocated bytes it sat below the line it had broken. Without the requested size (an OOM
/// only the timeline saw) it is the reserved bytes at the OOM.
pub(crate) fn oom_markers(r: &RunResult) -> Vec<(f64, u64)> {
    if r.ooms.is_empty() {
        r.timeline
            .iter()
            .filter(|s| s.kind == SampleKind::Oom)
            .map(|s| (s.t_s, s.reserved_bytes))
            .collect()
    } else {
        r.ooms
            .iter()
            .map(|o| {
                let b = o
                    .reserved_bytes
                    .saturating_add(o.requested_bytes.unwrap_or(0));
                (o.t_s, b)
            })
            .collect()
    }
}

/// Latency percentiles (p50, p90, p99, p99.9) against concurrency, or against the request
/// rate for an open-model HTTP run.
pub fn latency_svg(r: &RunResult) -> String {
    if let Some(h) = r.http.as_ref().filter(|h| h.model == "open") {
        let rows: Vec<(f64, LatencyStats)> = h
            .by_rate
            .iter()
            .filter(|x| x.latency.count > 0)
            .map(|x| (x.rate_per_s, x.latency))
            .collect();
        return latency_plot(
            "Latency percentiles against the request rate",
            "target request rate (1/s)",
            &rows,
        );
    }
    let rows: Vec<(f64, LatencyStats)> = r
        .by_concurrency
        .iter()
        .filter(|c| c.latency.count > 0)
        .map(|c| (c.concurrency as f64, c.latency))
        .collect();
    latency_plot(
        "Latency percentiles against concurrency",
        "concurrent workers",
        &rows,
    )
}

fn latency_plot(title: &str, x_desc: &str, rows: &[(f64, LatencyStats)]) -> String {
    if rows.is_empty() {
        return message_svg(
            title,
            "No request succeeded, so there is no latency to show.",
        );
    }
    let x_max = rows.iter().map(|c| c.0).fold(f64::MIN, f64::max);
    let x_min = rows.iter().map(|c| c.0).fold(f64::MAX, f64::min);
    let (x0, x1) = if x_max - x_min < 1.0 {
        ((x_min - 1.0).max(0.0), x_max + 1.0)
    } else {
        let pad = (x_max - x_min) * 0.05;
        ((x_min - pad).max(0.0), x_max + pad)
    };
    let y_max = rows
        .iter()
        .map(|c| c.1.p999_ms.max(c.1.p99_ms))
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.12;
    render(title, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("latency (ms)")
            .light_line_style(RGBColor(243, 243, 243))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .draw()
            .map_err(err)?;
        type Get = fn(&LatencyStats) -> f64;
        let ps: [(&str, Get); 4] = [
            ("p50", |l| l.p50_ms),
            ("p90", |l| l.p90_ms),
            ("p99", |l| l.p99_ms),
            ("p99.9", |l| l.p999_ms),
        ];
        for (k, (name, get)) in ps.into_iter().enumerate() {
            let c = C_P[k];
            let pts: Vec<(f64, f64)> = rows.iter().map(|row| (row.0, get(&row.1))).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
                .map_err(err)?
                .label(name)
                .legend(legend_line(c));
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled())))
                .map_err(err)?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft, 18)?;
        Ok(())
    })
}

/// A legend mark, for legends drawn beside a chart rather than over it.
#[derive(Debug, Clone, Copy)]
enum Mark {
    Line(RGBColor, u32),
    Dashed(RGBColor),
    Dot(RGBColor),
    Ring(RGBColor),
    Cross(RGBColor),
    Triangle(RGBColor),
}

/// Draws `entries` top-down in `area` (a panel beside the chart). A label may hold `\n`.
fn side_legend(area: &Area, entries: &[(String, Mark)]) -> PResult<()> {
    let mut y = 58i32;
    let x = 8i32;
    for (label, mark) in entries {
        let m = (x + 11, y);
        match *mark {
            Mark::Line(c, w) => area
                .draw(&PathElement::new(
                    vec![(x, y), (x + 22, y)],
                    c.stroke_width(w),
                ))
                .map_err(err)?,
            Mark::Dashed(c) => area
                .draw(&DashedPathElement::new(
                    vec![(x, y), (x + 22, y)],
                    4,
                    3,
                    c.stroke_width(2),
                ))
                .map_err(err)?,
            Mark::Dot(c) => area.draw(&Circle::new(m, 5, c.filled())).map_err(err)?,
            Mark::Ring(c) => area
                .draw(&Circle::new(m, 5, c.stroke_width(2)))
                .map_err(err)?,
            Mark::Cross(c) => area
                .draw(&Cross::new(m, 5, c.stroke_width(2)))
                .map_err(err)?,
            Mark::Triangle(c) => area
                .draw(&TriangleMarker::new(m, 6, c.filled()))
                .map_err(err)?,
        }
        for (k, line) in label.lines().enumerate() {
            let style = if k == 0 {
                (FONT, 14).into_font().color(&BLACK)
            } else {
                (FONT, 12).into_font().color(&RGBColor(90, 90, 90))
            };
            area.draw(&Text::new(line.to_string(), (x + 30, y - 7), style))
                .map_err(err)?;
            y += if k == 0 { 17 } else { 15 };
        }
        y += 9;
    }
    Ok(())
}

/// Peak memory against concurrency: the measured peaks, the OOM search's probes, the fitted
/// line, the predicted OOM point, the verified safe load and the capacity line. The legend
/// is drawn beside the chart: the top right, where a legend usually goes, is where the
/// points cross the capacity.
pub fn peak_vs_concurrency_svg(r: &RunResult) -> String {
    let title = "Peak memory against concurrency";
    let s = r.oom_search.as_ref();
    let measured: Vec<_> = r.by_concurrency.iter().collect();
    let probes: Vec<_> = s
        .map(|s| s.points.iter().chain(s.bisection.iter()).copied().collect())
        .unwrap_or_default();
    if measured.is_empty() && probes.is_empty() {
        return message_svg(title, "No load level was measured.");
    }
    // The search's points are shown in the metric it fitted, so they sit on its line.
    let fit_allocated = s.is_some_and(|s| s.metric == "peak_allocated");
    let probe_y = |p: &crate::results::LoadPoint| {
        if fit_allocated {
            p.peak_allocated_bytes
        } else {
            p.peak_reserved_bytes
        }
    };
    let metric_words = if fit_allocated {
        "peak allocated"
    } else {
        "peak reserved"
    };
    let mut x_max = measured
        .iter()
        .map(|c| c.concurrency)
        .chain(probes.iter().map(|p| p.load))
        .max()
        .unwrap_or(1) as f64;
    if let Some(s) = s {
        for v in [
            s.predicted_oom_load,
            s.observed_oom_load,
            s.verified_safe_load,
        ]
        .into_iter()
        .flatten()
        {
            x_max = x_max.max(v as f64);
        }
    }
    let x_max = (x_max * 1.1).max(x_max + 1.0);
    let y_data = measured
        .iter()
        .map(|c| c.peak_reserved_bytes.max(c.peak_allocated_bytes))
        .chain(probes.iter().map(probe_y))
        .max()
        .unwrap_or(0);
    let y_max_b = y_data.max(r.capacity_bytes);
    let sc = Scale::for_max(y_max_b as f64);
    let y_max = (sc.v(y_max_b) * 1.15).max(1e-6);
    render(title, |root| {
        let (left, right) = root.split_horizontally(WIDTH as i32 - 290);
        let mut legend: Vec<(String, Mark)> = Vec::new();
        let mut chart = ChartBuilder::on(&left)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("concurrent workers")
            .y_desc(sc.name)
            .light_line_style(RGBColor(243, 243, 243))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .draw()
            .map_err(err)?;
        let cap = sc.v(r.capacity_bytes);
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, cap), (x_max, cap)],
                C_CAP.stroke_width(2),
            ))
            .map_err(err)?;
        legend.push((
            format!("capacity {}", super::format::fmt_bytes(r.capacity_bytes)),
            Mark::Line(C_CAP, 2),
        ));
        // A text label beside a vertical marker line, kept inside the plot.
        let label_at = |x: f64, y: f64, text: String, c: RGBColor| {
            let style = (FONT, 13).into_font().color(&c);
            if x > x_max * 0.7 {
                Text::new(
                    text,
                    (x - x_max * 0.006, y),
                    style.pos(Pos::new(HPos::Right, VPos::Top)),
                )
            } else {
                Text::new(text, (x + x_max * 0.006, y), style)
            }
        };
        if let Some(s) = s {
            if s.budget_bytes > 0 && s.budget_bytes < r.capacity_bytes {
                let b = sc.v(s.budget_bytes);
                chart
                    .draw_series(DashedLineSeries::new(
                        vec![(0.0, b), (x_max, b)],
                        6,
                        4,
                        C_BUDGET.stroke_width(1),
                    ))
                    .map_err(err)?;
                legend.push((
                    format!(
                        "budget {}\ncapacity less a {:.0}% margin",
                        super::format::fmt_bytes(s.budget_bytes),
                        s.margin_fraction * 100.0
                    ),
                    Mark::Dashed(C_BUDGET),
                ));
            }
            if s.fit.b.is_finite() && s.fit.a.is_finite() && !s.points.is_empty() {
                let n = 60;
                let line: Vec<(f64, f64)> = (0..=n)
                    .map(|i| {
                        let x = x_max * i as f64 / n as f64;
                        (x, s.fit.at(x) / sc.div)
                    })
                    .filter(|p| p.1 >= 0.0 && p.1 <= y_max)
                    .collect();
                chart
                    .draw_series(DashedLineSeries::new(line, 8, 4, C_FIT.stroke_width(2)))
                    .map_err(err)?;
                legend.push((
                    format!(
                        "fit of {metric_words}\n{} + {} per worker, R² {:.3}",
                        super::format::fmt_signed_bytes(s.fit.a.round() as i64),
                        super::format::fmt_signed_bytes(s.fit.b.round() as i64),
                        s.fit.r2
                    ),
                    Mark::Dashed(C_FIT),
                ));
            }
            let vline = |x: f64, c: RGBColor| {
                DashedPathElement::new(vec![(x, 0.0), (x, y_max)], 3, 3, c.stroke_width(1))
            };
            if let Some(k) = s.predicted_oom_load {
                let x = k as f64;
                chart
                    .draw_series(std::iter::once(vline(x, C_CAP)))
                    .map_err(err)?;
                // On the capacity line: the fit crosses it between k-1 and k.
                let y = (s.fit.at(x) / sc.div).clamp(0.0, cap);
                chart
                    .draw_series(std::iter::once(TriangleMarker::new(
                        (x, y),
                        8,
                        C_CAP.filled(),
                    )))
                    .map_err(err)?;
                chart
                    .draw_series(std::iter::once(label_at(
                        x,
                        y_max * 0.2,
                        format!("predicted OOM c={k}"),
                        C_CAP,
                    )))
                    .map_err(err)?;
                legend.push((
                    format!("predicted OOM at c={k}\nwhere the fit crosses the capacity"),
                    Mark::Triangle(C_CAP),
                ));
            }
            if let Some(k) = s.verified_safe_load {
                let x = k as f64;
                chart
                    .draw_series(std::iter::once(vline(x, C_SAFE)))
                    .map_err(err)?;
                chart
                    .draw_series(std::iter::once(label_at(
                        x,
                        y_max * 0.12,
                        format!("safe c={k}"),
                        C_SAFE,
                    )))
                    .map_err(err)?;
                legend.push((
                    format!("safe concurrency {k}\nverified, within the budget"),
                    Mark::Line(C_SAFE, 1),
                ));
            }
            if !probes.is_empty() {
                chart
                    .draw_series(probes.iter().filter(|p| !p.oom).map(|p| {
                        Circle::new((p.load as f64, sc.v(probe_y(p))), 5, C_FIT.stroke_width(2))
                    }))
                    .map_err(err)?;
                legend.push((
                    format!("search probe ({})\n{metric_words}", s.device),
                    Mark::Ring(C_FIT),
                ));
                let oom_probes: Vec<_> = probes.iter().filter(|p| p.oom).collect();
                if !oom_probes.is_empty() {
                    chart
                        .draw_series(oom_probes.iter().map(|p| {
                            Cross::new((p.load as f64, sc.v(probe_y(p))), 6, C_CAP.stroke_width(2))
                        }))
                        .map_err(err)?;
                    legend.push(("probe that OOMed".into(), Mark::Cross(C_CAP)));
                }
            }
        }
        if !measured.is_empty() {
            chart
                .draw_series(measured.iter().map(|c| {
                    Circle::new(
                        (c.concurrency as f64, sc.v(c.peak_reserved_bytes)),
                        5,
                        C_RESERVED.filled(),
                    )
                }))
                .map_err(err)?;
            chart
                .draw_series(measured.iter().map(|c| {
                    Circle::new(
                        (c.concurrency as f64, sc.v(c.peak_allocated_bytes)),
                        5,
                        C_ALLOC.filled(),
                    )
                }))
                .map_err(err)?;
            legend.push((
                format!("this run ({}): peak reserved", r.device),
                Mark::Dot(C_RESERVED),
            ));
            legend.push((
                format!("this run ({}): peak allocated", r.device),
                Mark::Dot(C_ALLOC),
            ));
        }
        side_legend(&right, &legend)
    })
}

/// The category breakdown at the allocated peak (and at the first OOM, when there was
/// one) as horizontal stacked bars.
pub fn categories_svg(r: &RunResult) -> String {
    let title = "What the memory is for: category breakdown";
    let mut bars: Vec<(String, CategoryBytes)> = vec![(
        format!(
            "at the peak ({})",
            super::format::fmt_bytes(r.peaks.allocated_bytes)
        ),
        r.peaks.categories_at_peak,
    )];
    if let Some(o) = r.ooms.first() {
        bars.push((format!("at the first OOM (t={:.1}s)", o.t_s), o.categories));
    }
    let bars: Vec<_> = bars.into_iter().filter(|b| b.1.total() > 0).collect();
    if bars.is_empty() {
        return message_svg(title, "No categorized bytes were recorded.");
    }
    let x_max_b = bars.iter().map(|b| b.1.total()).max().unwrap_or(1);
    let sc = Scale::for_max(x_max_b as f64);
    // Room on the right for the legend.
    let x_max = sc.v(x_max_b) * 1.32;
    let n = bars.len() as f64;
    let height = 170 + 90 * bars.len() as u32;
    render_sized(title, height, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(20)
            .build_cartesian_2d(0f64..x_max, 0f64..n)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .x_desc(sc.name)
            .light_line_style(RGBColor(243, 243, 243))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .draw()
            .map_err(err)?;
        for (bi, (label, cats)) in bars.iter().enumerate() {
            // Bars from the top down.
            let y1 = n - bi as f64 - 0.3;
            let y0 = y1 - 0.55;
            chart
                .draw_series(std::iter::once(Text::new(
                    label.clone(),
                    (0.0, y1 + 0.25),
                    (FONT, 14).into_font().color(&BLACK),
                )))
                .map_err(err)?;
            let mut x = 0.0;
            for (ci, (name, bytes)) in cats.entries().iter().enumerate() {
                if *bytes == 0 {
                    continue;
                }
                let w = sc.v(*bytes);
                let c = CATEGORY_COLORS[ci];
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x, y0), (x + w, y1)],
                        c.filled(),
                    )))
                    .map_err(err)?;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x, y0), (x + w, y1)],
                        WHITE.stroke_width(1),
                    )))
                    .map_err(err)?;
                if w / x_max > 0.09 {
                    chart
                        .draw_series(std::iter::once(Text::new(
                            format!("{name} {}", super::format::fmt_bytes(*bytes)),
                            (x + x_max * 0.005, (y0 + y1) / 2.0 + 0.06),
                            (FONT, 12).into_font().color(&WHITE),
                        )))
                        .map_err(err)?;
                }
                x += w;
            }
        }
        for (ci, (name, _)) in CategoryBytes::default().entries().iter().enumerate() {
            let c = CATEGORY_COLORS[ci];
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.0, -1.0), (0.0, -1.0)],
                    c.filled(),
                )))
                .map_err(err)?
                .label(*name)
                .legend(legend_box(c));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 10)?;
        Ok(())
    })
}

/// The category breakdown over time, stacked.
pub fn categories_over_time_svg(r: &RunResult) -> String {
    let title = "Category breakdown over time (stacked)";
    let samples = decimate(&r.timeline, MAX_POINTS, |s| s.categories.total());
    if samples.iter().all(|s| s.categories.total() == 0) {
        return message_svg(title, "No categorized bytes were recorded.");
    }
    let max_b = samples
        .iter()
        .map(|s| s.categories.total().max(s.allocated_bytes))
        .max()
        .unwrap_or(1);
    let sc = Scale::for_max(max_b as f64);
    let y_max = (sc.v(max_b) * 1.12).max(1e-6);
    let t_end = samples.last().map(|s| s.t_s).unwrap_or(1.0).max(1e-3);
    render(title, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..t_end, 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time since the first request (s)")
            .y_desc(sc.name)
            .light_line_style(RGBColor(243, 243, 243))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .draw()
            .map_err(err)?;
        // Cumulative tops, drawn from the top layer down so each area covers the next.
        let names = CategoryBytes::default().entries().map(|e| e.0);
        for ci in (0..6).rev() {
            let c = CATEGORY_COLORS[ci];
            let pts: Vec<(f64, f64)> = samples
                .iter()
                .map(|s| {
                    let e = s.categories.entries();
                    let top: u64 = e[..=ci].iter().map(|x| x.1).sum();
                    (s.t_s, sc.v(top))
                })
                .collect();
            chart
                .draw_series(AreaSeries::new(pts, 0.0, c.mix(0.85).filled()).border_style(c))
                .map_err(err)?
                .label(names[ci])
                .legend(legend_box(c));
        }
        chart
            .draw_series(LineSeries::new(
                samples.iter().map(|s| (s.t_s, sc.v(s.allocated_bytes))),
                BLACK.stroke_width(1),
            ))
            .map_err(err)?
            .label("allocated")
            .legend(legend_line(BLACK));
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 18)?;
        Ok(())
    })
}

/// `vramroom http`: answers over time by class (requests per second, stacked), with the
/// stages marked: load shed with 503 shows as the orange band growing under overload.
pub fn status_svg(r: &RunResult) -> String {
    let title = "Answers over time";
    let Some(h) = r.http.as_ref() else {
        return message_svg(title, "Not an HTTP run.");
    };
    let b = &h.status_timeline;
    if b.iter()
        .all(|x| x.ok + x.shed + x.client_error + x.server_error + x.transport_error == 0)
    {
        return message_svg(title, "No request finished.");
    }
    type Get = fn(&crate::results::StatusBucket) -> u64;
    let classes: [(&str, RGBColor, Get); 5] = [
        ("ok (1xx-3xx)", RGBColor(44, 160, 44), |x| x.ok),
        ("shed (503)", RGBColor(255, 127, 14), |x| x.shed),
        ("4xx", RGBColor(148, 103, 189), |x| x.client_error),
        ("5xx (not 503)", RGBColor(214, 39, 40), |x| x.server_error),
        ("no answer (errors)", RGBColor(60, 60, 60), |x| {
            x.transport_error
        }),
    ];
    let rate = |x: &crate::results::StatusBucket, upto: usize| {
        let n: u64 = classes[..=upto].iter().map(|c| (c.2)(x)).sum();
        n as f64 / x.width_s.max(1e-9)
    };
    let y_max = b.iter().map(|x| rate(x, 4)).fold(0.0, f64::max).max(1.0) * 1.15;
    let t_end = b
        .last()
        .map(|x| x.t_s + x.width_s)
        .unwrap_or(1.0)
        .max(r.stages.last().map(|s| s.end_s).unwrap_or(0.0))
        .max(1e-3);
    render(title, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..t_end, 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("time since the first request (s)")
            .y_desc("answers per second")
            .light_line_style(RGBColor(243, 243, 243))
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .draw()
            .map_err(err)?;
        for (i, st) in r.stages.iter().enumerate() {
            let a = st.start_s.max(0.0);
            chart
                .draw_series(std::iter::once(DashedPathElement::new(
                    vec![(a, 0.0), (a, y_max)],
                    4,
                    4,
                    RGBColor(150, 150, 150).stroke_width(1),
                )))
                .map_err(err)?;
            let load = match h.stages.get(i).and_then(|x| x.rate_per_s) {
                Some(q) => format!("q={q}/s"),
                None => format!("c={}", st.concurrency),
            };
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("stage {} · {load}", i + 1),
                    (a + t_end * 0.004, y_max * 0.985),
                    (FONT, 13).into_font().color(&RGBColor(80, 80, 80)),
                )))
                .map_err(err)?;
        }
        // Stacked: each class's top drawn from the top layer down, so each area covers the
        // next; a step per bucket.
        for k in (0..classes.len()).rev() {
            let (name, c, _) = classes[k];
            if b.iter().all(|x| (classes[k].2)(x) == 0) {
                continue;
            }
            let mut pts = Vec::with_capacity(b.len() * 2);
            for x in b {
                let y = rate(x, k);
                pts.push((x.t_s, y));
                pts.push((x.t_s + x.width_s, y));
            }
            chart
                .draw_series(AreaSeries::new(pts, 0.0, c.mix(0.8).filled()).border_style(c))
                .map_err(err)?
                .label(name)
                .legend(legend_box(c));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight, 18)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::testdata::synthetic;

    #[test]
    fn every_plot_is_an_svg_with_its_series() {
        let r = synthetic();
        for (name, svg) in [
            ("timeline", timeline_svg(&r)),
            ("latency", latency_svg(&r)),
            ("peak", peak_vs_concurrency_svg(&r)),
            ("categories", categories_svg(&r)),
            ("categories_time", categories_over_time_svg(&r)),
        ] {
            assert!(
                svg.starts_with("<svg"),
                "{name}: {}",
                &svg[..80.min(svg.len())]
            );
            assert!(svg.trim_end().ends_with("</svg>"), "{name}");
            assert!(!svg.contains("could not draw"), "{name}");
            assert!(
                svg.matches("<polyline").count()
                    + svg.matches("<path").count()
                    + svg.matches("<rect").count()
                    > 3,
                "{name}"
            );
        }
        let t = timeline_svg(&r);
        for k in [
            "allocated",
            "reserved",
            "inactive_split",
            "device used",
            "capacity",
            "stage 2",
            "process used (NVML)",
            "context + library overhead",
        ] {
            assert!(t.contains(k), "timeline lacks {k}");
        }
        let p = peak_vs_concurrency_svg(&r);
        assert!(p.contains("predicted OOM"), "peak plot lacks the OOM point");
    }

    #[test]
    fn empty_run_still_gives_svgs() {
        let mut r = synthetic();
        r.timeline.clear();
        r.by_concurrency.clear();
        r.stages.clear();
        r.oom_search = None;
        r.ooms.clear();
        r.peaks = Default::default();
        for svg in [
            timeline_svg(&r),
            latency_svg(&r),
            peak_vs_concurrency_svg(&r),
            categories_svg(&r),
            categories_over_time_svg(&r),
        ] {
            assert!(svg.starts_with("<svg") && svg.contains("</svg>"));
        }
    }

    #[test]
    fn decimation_keeps_peaks() {
        let r = synthetic();
        let mut many = Vec::new();
        for i in 0..20_000 {
            let mut s = r.timeline[0];
            s.t_s = i as f64 * 0.001;
            s.allocated_bytes = if i == 12_345 {
                1 << 40
            } else {
                (i % 100) as u64
            };
            many.push(s);
        }
        let d = decimate(&many, 1000, |s| s.allocated_bytes);
        assert!(d.len() <= 1100);
        assert!(d.iter().any(|s| s.allocated_bytes == 1 << 40));
        assert!(d.windows(2).all(|w| w[0].t_s <= w[1].t_s));
    }

    #[test]
    fn oom_markers_sit_at_the_bytes_that_broke_the_capacity() {
        let mut r = synthetic();
        let o = &r.ooms[0];
        assert!(
            o.allocated_bytes < r.capacity_bytes,
            "the case the old marker got wrong"
        );
        let m = oom_markers(&r);
        assert_eq!(
            m,
            vec![(o.t_s, o.reserved_bytes + o.requested_bytes.unwrap())]
        );
        assert!(m[0].1 >= r.capacity_bytes);
        // Only the timeline saw it: the reserved bytes then.
        r.ooms.clear();
        let m = oom_markers(&r);
        assert!(!m.is_empty() && m.iter().all(|(_, b)| *b == 100 << 20));
    }
}
