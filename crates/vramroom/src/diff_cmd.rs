//! `vramroom diff BASE NEW`: a memory gate for CI, on two snapshots or two results JSON.
//!
//! Design note: snapshots are compared by vramroom-trace's diff (each side replayed under its
//! own config for its peaks, allocation sites from the stacks at the allocated peak);
//! results JSON (`vramroom loadtest`/`http`) by their recorded peaks and latency, read as
//! JSON values so any schema version with those fields works. The kind is told by the
//! content (JSON starts with `{`), not the extension. Thresholds are loadtest's syntax,
//! `METRIC OP VALUE`, where VALUE is either absolute (`peak_reserved<6GiB`) or a change from
//! BASE: `+5%` / `-10%` relative, `+100MiB` absolute (`peak_reserved<+5%`). A threshold on a
//! metric one side lacks fails, as in loadtest: a gate that cannot be checked must not pass.
//! Exit codes as loadtest's: 0 ok, 2 bad input, 99 a threshold broken.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use clap::Args;
use vramroom_alloc::size::{human_bytes, parse_size};
// The figures and the JSON shape are vramroom-trace's: the Python API serializes a diff with
// the same function, so `vramroom.diff()` and `diff --json` have one vocabulary.
use vramroom_trace::diff::{report_json, Figures, Side, Verdict};

use crate::error::UserError;
use crate::table::print_rows;

#[derive(Args)]
pub struct DiffArgs {
    /// The baseline: a snapshot pickle (torch.cuda.memory._dump_snapshot) or a results.json
    /// (vramroom loadtest / http).
    base: PathBuf,
    /// The candidate, of the same kind as BASE.
    new: PathBuf,
    /// A gate on NEW, repeatable: METRIC OP VALUE with an absolute VALUE (peak_reserved<6GiB)
    /// or a change from BASE (peak_reserved<+5%, peak_allocated<=+100MiB). Metrics:
    /// peak_allocated, peak_reserved, fragmentation, oom_count, device_allocs (snapshots);
    /// peak_allocated, peak_reserved, fragmentation, oom_count, p50, p99, rps (results).
    /// A broken threshold exits 99.
    #[arg(long = "threshold", value_name = "EXPR")]
    thresholds: Vec<String>,
    /// Allocation sites to list (snapshots with stacks).
    #[arg(long, default_value_t = 10, value_name = "N")]
    top: usize,
    /// Print JSON (both sides, the sites, the thresholds) instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Unit {
    Bytes,
    Ratio,
    Count,
    Ms,
    PerSecond,
}

/// Metrics a diff knows, with their unit.
const METRICS: [(&str, Unit); 8] = [
    ("peak_allocated", Unit::Bytes),
    ("peak_reserved", Unit::Bytes),
    ("fragmentation", Unit::Ratio),
    ("oom_count", Unit::Count),
    ("device_allocs", Unit::Count),
    ("p50", Unit::Ms),
    ("p99", Unit::Ms),
    ("rps", Unit::PerSecond),
];

// The operators are loadtest's (`<`, `<=`, `>`, `>=`, `==`), from its parser.
use vramroom_load::threshold::{split_op, Op};

#[derive(Clone, Copy, PartialEq, Debug)]
enum Limit {
    /// NEW's value against this.
    Absolute(f64),
    /// NEW - BASE against this (in the metric's unit).
    Change(f64),
    /// (NEW - BASE) / BASE against this ratio.
    Relative(f64),
}

#[derive(Clone, PartialEq, Debug)]
struct Threshold {
    expr: String,
    metric: &'static str,
    unit: Unit,
    op: Op,
    limit: Limit,
}

fn parse_threshold(s: &str) -> Result<Threshold, String> {
    let t = s.trim();
    let Some((pos, op, len)) = split_op(t) else {
        return Err("expected METRIC<VALUE, e.g. peak_reserved<+5% or peak_reserved<6GiB".into());
    };
    let name = t[..pos].trim().to_ascii_lowercase();
    let Some(&(metric, unit)) = METRICS.iter().find(|(m, _)| *m == name) else {
        return Err(format!(
            "unknown metric {name:?} (expected one of {})",
            METRICS.iter().map(|m| m.0).collect::<Vec<_>>().join(", ")
        ));
    };
    let v = t[pos + len..].trim();
    let (sign, body) = match v.chars().next() {
        Some('+') => (Some(1.0), v[1..].trim()),
        Some('-') => (Some(-1.0), v[1..].trim()),
        _ => (None, v),
    };
    if body.is_empty() {
        return Err("missing value".into());
    }
    let number = |x: &str| -> Result<f64, String> {
        let n: f64 = x
            .trim()
            .parse()
            .map_err(|_| format!("{x:?} is not a number"))?;
        if !n.is_finite() || n < 0.0 {
            return Err(format!("{x:?} must be a finite number ≥ 0"));
        }
        Ok(n)
    };
    let limit = if let Some(p) = body.strip_suffix('%') {
        let r = number(p)? / 100.0;
        match (sign, unit) {
            (Some(s), _) => Limit::Relative(s * r),
            (None, Unit::Ratio) => Limit::Absolute(r),
            (None, _) => {
                return Err(format!(
                "{v:?}: a percentage of {metric} is a change from BASE: write +{body} or -{body}"
            ))
            }
        }
    } else {
        let x = match unit {
            Unit::Bytes => {
                parse_size(body).map_err(|e| format!("{body:?} is not a size: {e}"))? as f64
            }
            Unit::Ms => {
                let (n, mult) = match (body.strip_suffix("ms"), body.strip_suffix('s')) {
                    (Some(n), _) => (n, 1.0),
                    (None, Some(n)) => (n, 1e3),
                    _ => (body, 1.0),
                };
                number(n)? * mult
            }
            _ => number(body)?,
        };
        match sign {
            Some(s) => Limit::Change(s * x),
            None => Limit::Absolute(x),
        }
    };
    Ok(Threshold {
        expr: t.to_string(),
        metric,
        unit,
        op,
        limit,
    })
}

fn get(f: &Figures, m: &str) -> Option<f64> {
    f.iter().find(|(k, _)| *k == m).map(|(_, v)| *v)
}

fn is_json(path: &Path) -> Result<bool, UserError> {
    use std::io::Read;
    let mut buf = [0u8; 64];
    let n = vramroom_alloc::input::open_nonblocking(path)
        .and_then(|mut f| f.read(&mut buf))
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(buf[..n]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{'))
}

fn results_figures(path: &Path) -> Result<Figures, UserError> {
    let text = vramroom_alloc::input::read_text(path, vramroom_alloc::input::Limit::RESULTS)
        .map_err(|e| anyhow!("cannot read {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a results JSON", path.display()))?;
    if v.get("peaks").is_none() {
        return Err(anyhow!(
            "{} has no \"peaks\": not a vramroom loadtest/http results.json",
            path.display()
        )
        .into());
    }
    let num = |p: &str| v.pointer(p).and_then(|x| x.as_f64());
    let mut f: Figures = Vec::new();
    let mut put = |k: &'static str, x: Option<f64>| {
        if let Some(x) = x {
            f.push((k, x));
        }
    };
    // An HTTP run reads 0 for the memory it had no source for: those peaks are absent
    // here, so a gate on them fails as not measured (loadtest's rule, from its module).
    let series: Option<Vec<String>> = v.pointer("/http").map(|h| {
        h.get("memory_series")
            .and_then(|s| s.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    });
    let measured = |m: &str| vramroom_load::threshold::memory_measured(m, series.as_deref());
    let alloc = num("/peaks/allocated_bytes").filter(|_| measured("peak_allocated"));
    let reserved = num("/peaks/reserved_bytes").filter(|_| measured("peak_reserved"));
    put("peak_allocated", alloc);
    put("peak_reserved", reserved);
    put(
        "fragmentation",
        match (alloc, reserved) {
            (Some(a), Some(r)) if r > 0.0 => Some(1.0 - a / r),
            _ => None,
        },
    );
    put("oom_count", num("/errors/oom"));
    let has_lat = num("/latency/count").is_some_and(|c| c > 0.0);
    put("p50", num("/latency/p50_ms").filter(|_| has_lat));
    put("p99", num("/latency/p99_ms").filter(|_| has_lat));
    put("rps", num("/throughput/requests_per_s"));
    Ok(f)
}

fn show(unit: Unit, x: f64) -> String {
    match unit {
        Unit::Bytes => {
            let s = if x < 0.0 { "-" } else { "" };
            format!("{s}{}", human_bytes(x.abs() as u64))
        }
        Unit::Ratio => format!("{:.1}%", 100.0 * x),
        Unit::Count => format!("{x}"),
        Unit::Ms => format!("{x:.2} ms"),
        Unit::PerSecond => format!("{x:.1}/s"),
    }
}

/// A verdict's measured value in the terms the threshold was written in: a relative change
/// as a rounded signed percentage (`+17.4%` against `+5%`, never the raw fraction
/// 0.1736806947227789), a change as a signed amount of the metric's unit, an absolute value
/// in that unit.
fn show_actual(t: &Threshold, x: f64) -> String {
    let sign = if x < 0.0 { "-" } else { "+" };
    match t.limit {
        Limit::Relative(_) if x.is_infinite() => format!("{sign}∞% (from 0)"),
        Limit::Relative(_) => format!("{:+.1}%", 100.0 * x),
        Limit::Change(_) if t.unit == Unit::Ratio => format!("{:+.1} pts", 100.0 * x),
        Limit::Change(_) => format!("{sign}{}", show(t.unit, x.abs())),
        Limit::Absolute(_) => show(t.unit, x),
    }
}

fn evaluate(t: &Threshold, base: &Figures, new: &Figures) -> Verdict {
    let (b, n) = (get(base, t.metric), get(new, t.metric));
    let actual = match t.limit {
        Limit::Absolute(_) => n,
        Limit::Change(_) => b.zip(n).map(|(b, n)| n - b),
        // A relative change from 0 is infinite unless nothing changed.
        Limit::Relative(_) => b.zip(n).map(|(b, n)| {
            if b == 0.0 {
                if n == 0.0 {
                    0.0
                } else {
                    f64::INFINITY * n.signum()
                }
            } else {
                (n - b) / b
            }
        }),
    };
    let limit = match t.limit {
        Limit::Absolute(x) | Limit::Change(x) | Limit::Relative(x) => x,
    };
    Verdict {
        expr: t.expr.clone(),
        actual,
        passed: actual.is_some_and(|a| t.op.holds(a, limit)),
    }
}

pub fn diff(a: DiffArgs) -> Result<ExitCode, UserError> {
    let thresholds = a
        .thresholds
        .iter()
        .map(|s| parse_threshold(s).map_err(|m| anyhow!("invalid threshold {s:?}: {m}")))
        .collect::<Result<Vec<_>, _>>()?;
    let (bj, nj) = (is_json(&a.base)?, is_json(&a.new)?);
    if bj != nj {
        return Err(anyhow!(
            "BASE and NEW must be of one kind (two snapshots or two results JSON): {} is {}, {} is {}",
            a.base.display(),
            if bj { "JSON" } else { "a snapshot" },
            a.new.display(),
            if nj { "JSON" } else { "a snapshot" }
        )
        .into());
    }
    let (base, new, snap_diff) = if bj {
        (results_figures(&a.base)?, results_figures(&a.new)?, None)
    } else {
        let read = |p: &Path| {
            vramroom_trace::read_snapshot_file(p)
                .with_context(|| format!("cannot read snapshot {}", p.display()))
        };
        let d = vramroom_trace::diff::diff(&read(&a.base)?, &read(&a.new)?)
            .context("cannot replay the snapshots")?;
        (d.base.figures(), d.new.figures(), Some(d))
    };
    let verdicts: Vec<Verdict> = thresholds
        .iter()
        .map(|t| evaluate(t, &base, &new))
        .collect();
    if a.json {
        let (bp, np) = (a.base.display().to_string(), a.new.display().to_string());
        let j = match &snap_diff {
            Some(d) => d.to_json(Some(&bp), Some(&np), &verdicts, a.top),
            None => report_json(
                Side {
                    path: Some(&bp),
                    figures: &base,
                },
                Side {
                    path: Some(&np),
                    figures: &new,
                },
                &verdicts,
                None,
            ),
        };
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    } else {
        println!("base: {}\nnew:  {}\n", a.base.display(), a.new.display());
        let rows: Vec<Vec<String>> = METRICS
            .iter()
            .filter_map(|&(m, unit)| {
                let (b, n) = (get(&base, m), get(&new, m));
                if b.is_none() && n.is_none() {
                    return None;
                }
                let o = |x: Option<f64>| x.map(|x| show(unit, x)).unwrap_or_else(|| "-".into());
                let change = match (b, n) {
                    (Some(b), Some(n)) if unit == Unit::Ratio => {
                        format!("{:+.1} pts", 100.0 * (n - b))
                    }
                    (Some(b), Some(n)) if b != 0.0 => format!("{:+.2}%", 100.0 * (n - b) / b),
                    (Some(b), Some(n)) if b == n => "0".into(),
                    (Some(_), Some(_)) => "new".into(),
                    _ => "-".into(),
                };
                Some(vec![m.to_string(), o(b), o(n), change])
            })
            .collect();
        print_rows(&["metric", "base", "new", "change"], &rows);
        if let Some(d) = &snap_diff {
            println!();
            if !(d.base.has_stacks || d.new.has_stacks) {
                println!("no allocation sites: the snapshots carry no stacks (record them with torch.cuda.memory._record_memory_history(stacks=\"python\"))");
            } else {
                let rows: Vec<Vec<String>> = d
                    .top_sites
                    .iter()
                    .take(a.top)
                    .map(|s| {
                        let delta = s.new_bytes as f64 - s.base_bytes as f64;
                        vec![
                            s.site.clone(),
                            human_bytes(s.base_bytes),
                            human_bytes(s.new_bytes),
                            show(Unit::Bytes, delta),
                        ]
                    })
                    .collect();
                println!("allocation sites at the peak allocated, largest change first");
                print_rows(&["site", "base", "new", "change"], &rows);
            }
        }
        if !verdicts.is_empty() {
            println!();
            for (t, v) in thresholds.iter().zip(&verdicts) {
                println!(
                    "{} {} (actual {})",
                    if v.passed { "✓" } else { "✗" },
                    v.expr,
                    v.actual
                        .map(|x| show_actual(t, x))
                        .unwrap_or_else(|| "not measured".into())
                );
            }
        }
    }
    if verdicts.iter().any(|v| !v.passed) {
        eprintln!(
            "thresholds broken: {}",
            verdicts
                .iter()
                .filter(|v| !v.passed)
                .map(|v| v.expr.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Ok(ExitCode::from(99));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse_absolute_relative_and_change() {
        let t = parse_threshold("peak_reserved<+5%").unwrap();
        assert_eq!((t.op, t.limit), (Op::Lt, Limit::Relative(0.05)));
        // loadtest's syntax, as the README says: `==` too.
        let t = parse_threshold("oom_count==0").unwrap();
        assert_eq!((t.op, t.limit), (Op::Eq, Limit::Absolute(0.0)));
        let t = parse_threshold("peak_allocated <= +100MiB").unwrap();
        assert_eq!(t.limit, Limit::Change(100.0 * (1 << 20) as f64));
        let t = parse_threshold("peak_reserved<6GiB").unwrap();
        assert_eq!(t.limit, Limit::Absolute(6.0 * (1u64 << 30) as f64));
        let t = parse_threshold("fragmentation<20%").unwrap();
        assert_eq!(t.limit, Limit::Absolute(0.2));
        let t = parse_threshold("p99<-10%").unwrap();
        assert_eq!(t.limit, Limit::Relative(-0.1));
        let t = parse_threshold("p99<0.2s").unwrap();
        assert_eq!(t.limit, Limit::Absolute(200.0));
        for bad in [
            "",
            "peak_reserved",
            "nope<1",
            "peak_reserved<5%",
            "peak_reserved<lots",
            "p99<",
        ] {
            assert!(parse_threshold(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn actual_values_print_as_their_threshold_reads() {
        let a = |s: &str, x: f64| show_actual(&parse_threshold(s).unwrap(), x);
        assert_eq!(a("peak_reserved<+5%", 0.1736806947227789), "+17.4%");
        assert_eq!(a("p99<-10%", -0.25), "-25.0%");
        assert_eq!(a("oom_count<+1000%", f64::INFINITY), "+∞% (from 0)");
        assert_eq!(a("peak_allocated<=+100MiB", 64.0 * 1048576.0), "+64.00 MiB");
        assert_eq!(a("peak_allocated<=+100MiB", -1048576.0), "-1.00 MiB");
        assert_eq!(a("fragmentation<20%", 0.1736806947227789), "17.4%");
        assert_eq!(a("fragmentation<+0.05", 0.0126), "+1.3 pts");
        assert_eq!(a("peak_reserved<6GiB", 1073741824.0), "1.00 GiB");
    }

    #[test]
    fn evaluation_against_base() {
        let base: Figures = vec![("peak_reserved", 100.0), ("oom_count", 0.0)];
        let new: Figures = vec![("peak_reserved", 104.0), ("oom_count", 1.0)];
        let ok = |s: &str| evaluate(&parse_threshold(s).unwrap(), &base, &new).passed;
        assert!(ok("peak_reserved<+5%"));
        assert!(!ok("peak_reserved<+3%"));
        assert!(ok("peak_reserved<=+4"));
        assert!(!ok("oom_count<1"));
        // From 0 to 1 is an infinite relative rise.
        assert!(!ok("oom_count<+1000%"));
        // A metric neither side has fails.
        assert!(!ok("p99<1s"));
    }
}
