//! k6-style thresholds: `--threshold 'peak_reserved<6GiB' --threshold 'p99<200ms'`.
//!
//! Design note: a threshold is parsed once, up front (a malformed one is a usage error
//! before the run), into a metric, an operator and a limit in the metric's base unit
//! (bytes, milliseconds, a count, a ratio or a rate), and evaluated against the finished
//! [`RunResult`]. A metric the run does not have (e.g. the OOM search's safe concurrency
//! when the search was skipped) fails its threshold: a gate that cannot be checked must
//! not pass silently.
//!
//! k6's own syntax is accepted beside ours and rewritten into it before parsing: an
//! aggregation `p(99)<200`, `avg<150`, `med`, `min`, `max`, optionally after k6's metric name
//! (`http_req_duration: p(95)<300`, `http_req_failed: rate<0.01`, `http_reqs: rate>100`,
//! `http_reqs: count>1000`). Values without a unit are milliseconds, as in k6.

use std::str::FromStr;

use crate::error::{LoadError, Result};
use crate::results::{RunResult, ThresholdResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Ms,
    Count,
    Ratio,
    PerSecond,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Ms => "ms",
            Unit::Count => "count",
            Unit::Ratio => "ratio",
            Unit::PerSecond => "1/s",
        }
    }
}

/// Metrics a threshold may name, with their unit. `shed`, `shed_rate` and `dropped` are
/// `vramroom http`'s (503 answers, their share of all requests, open-model requests that
/// never got a connection); `peak_process_used`, `peak_overhead` and `peak_device_used`
/// need a memory source (NVML) that reports them.
pub const METRICS: [(&str, Unit); 25] = [
    ("peak_reserved", Unit::Bytes),
    ("peak_allocated", Unit::Bytes),
    ("peak_above_base", Unit::Bytes),
    ("peak_inactive_split", Unit::Bytes),
    ("p50", Unit::Ms),
    ("p90", Unit::Ms),
    ("p99", Unit::Ms),
    ("p99.9", Unit::Ms),
    ("max_latency", Unit::Ms),
    ("oom_count", Unit::Count),
    ("errors", Unit::Count),
    ("error_rate", Unit::Ratio),
    ("rps", Unit::PerSecond),
    ("findings", Unit::Count),
    ("safe_concurrency", Unit::Count),
    ("reserved_over_allocated", Unit::Ratio),
    ("shed", Unit::Count),
    ("shed_rate", Unit::Ratio),
    ("dropped", Unit::Count),
    ("peak_process_used", Unit::Bytes),
    ("peak_overhead", Unit::Bytes),
    ("peak_device_used", Unit::Bytes),
    ("avg_latency", Unit::Ms),
    ("min_latency", Unit::Ms),
    ("requests", Unit::Count),
];

/// Percentiles the results keep (k6's `p(N)` for these N).
const PERCENTILES: [&str; 4] = ["50", "90", "99", "99.9"];

/// A k6 threshold (`p(99)<200`, `http_req_failed: rate<0.01`) rewritten in our syntax;
/// `Ok(None)` when `t` is not in k6's form.
fn from_k6(t: &str) -> std::result::Result<Option<String>, String> {
    let op_at = t.find(['<', '>', '=']).unwrap_or(t.len());
    let (k6_metric, rest) = match t[..op_at].find(':') {
        Some(c) => (Some(t[..c].trim()), t[c + 1..].trim()),
        None => (None, t),
    };
    let op_at = rest.find(['<', '>', '=']).unwrap_or(rest.len());
    let (agg, tail) = (rest[..op_at].trim(), &rest[op_at..]);
    let trend = |agg: &str| -> std::result::Result<Option<String>, String> {
        if let Some(n) = agg.strip_prefix("p(").and_then(|a| a.strip_suffix(')')) {
            let n = n.trim();
            if !PERCENTILES.contains(&n) {
                return Err(format!(
                    "p({n}) is not kept (percentiles: {})",
                    PERCENTILES.map(|p| format!("p({p})")).join(", ")
                ));
            }
            return Ok(Some(format!("p{n}")));
        }
        Ok(match agg {
            "avg" => Some("avg_latency".into()),
            "min" => Some("min_latency".into()),
            "med" => Some("p50".into()),
            "max" => Some("max_latency".into()),
            _ => None,
        })
    };
    let ours = match k6_metric {
        None => trend(agg)?,
        Some("http_req_duration") | Some("iteration_duration") => {
            Some(trend(agg)?.ok_or_else(|| {
                format!("{agg:?} is not an aggregation of a duration (p(N), avg, med, min, max)")
            })?)
        }
        Some("http_req_failed") if agg == "rate" => Some("error_rate".into()),
        Some("http_reqs") if agg == "rate" => Some("rps".into()),
        Some("http_reqs") if agg == "count" => Some("requests".into()),
        Some(m @ ("http_req_failed" | "http_reqs")) => {
            return Err(format!(
                "{agg:?} is not an aggregation of {m} (rate{})",
                if m == "http_reqs" { ", count" } else { "" }
            ))
        }
        Some(m) => {
            return Err(format!(
                "unknown k6 metric {m:?} (expected http_req_duration, iteration_duration, \
                 http_req_failed, http_reqs)"
            ))
        }
    };
    Ok(ours.map(|m| format!("{m}{tail}")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
}

/// The operators, two-character ones first so `<=` is not read as `<` then `=...`.
pub const OPS: [(&str, Op); 5] = [
    ("<=", Op::Le),
    (">=", Op::Ge),
    ("==", Op::Eq),
    ("<", Op::Lt),
    (">", Op::Gt),
];

/// The first operator in `t`: its byte position, the operator and its length. Every
/// threshold syntax (loadtest's, http's, diff's) splits `METRIC OP VALUE` here, so they
/// accept the same operators.
pub fn split_op(t: &str) -> Option<(usize, Op, usize)> {
    OPS.iter()
        .filter_map(|(tok, op)| t.find(tok).map(|p| (p, *op, tok.len())))
        .min_by_key(|(p, _, len)| (*p, usize::MAX - len))
}

/// The limit as the user wrote it: the text after the operator (`10%`, `0.1`, `64MiB`, k6's
/// `300`). Reports print this, not the parsed number: a percentage parses to a fraction such
/// as 0.1 that the user never typed. `None` when `expr` has no operator or no value.
pub fn written_limit(expr: &str) -> Option<&str> {
    let (pos, _, len) = split_op(expr)?;
    Some(expr[pos + len..].trim()).filter(|v| !v.is_empty())
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Eq => "==",
        }
    }
    pub fn holds(self, actual: f64, limit: f64) -> bool {
        match self {
            Op::Lt => actual < limit,
            Op::Le => actual <= limit,
            Op::Gt => actual > limit,
            Op::Ge => actual >= limit,
            Op::Eq => (actual - limit).abs() <= f64::EPSILON * limit.abs().max(1.0),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub expr: String,
    pub metric: String,
    pub unit: Unit,
    pub op: Op,
    /// In the metric's base unit.
    pub limit: f64,
}

impl FromStr for Threshold {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Self> {
        let err = |msg: String| LoadError::Threshold {
            input: s.to_string(),
            msg,
        };
        let k6 = from_k6(s.trim()).map_err(err)?;
        let t = k6.as_deref().unwrap_or(s.trim());
        let Some((pos, op, oplen)) = split_op(t) else {
            return Err(err(
                "expected METRIC<VALUE, e.g. peak_reserved<6GiB or p99<200ms".into(),
            ));
        };
        let metric = t[..pos].trim().to_ascii_lowercase();
        let value = t[pos + oplen..].trim();
        let Some(&(_, unit)) = METRICS.iter().find(|(m, _)| *m == metric) else {
            return Err(err(format!(
                "unknown metric {metric:?} (expected one of {})",
                METRICS.iter().map(|m| m.0).collect::<Vec<_>>().join(", ")
            )));
        };
        if value.is_empty() {
            return Err(err("missing value".into()));
        }
        let limit = match unit {
            Unit::Bytes => vramroom_alloc::parse_size(value)
                .map_err(|e| err(format!("{value:?} is not a size: {e}")))?
                as f64,
            Unit::Ms => parse_ms(value).map_err(err)?,
            Unit::Count | Unit::Ratio | Unit::PerSecond => {
                let v = value.trim_end_matches('%');
                let x: f64 = v
                    .parse()
                    .map_err(|_| err(format!("{value:?} is not a number")))?;
                if !x.is_finite() || x < 0.0 {
                    return Err(err(format!("{value:?} must be a finite number ≥ 0")));
                }
                if value.ends_with('%') {
                    x / 100.0
                } else {
                    x
                }
            }
        };
        Ok(Threshold {
            // As the user wrote it: the report shows their expression.
            expr: s.trim().to_string(),
            metric,
            unit,
            op,
            limit,
        })
    }
}

fn parse_ms(v: &str) -> std::result::Result<f64, String> {
    let v = v.trim();
    let (num, mult) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e3)
    } else {
        (v, 1.0)
    };
    let x: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{v:?} is not a time (expected e.g. 200ms, 1.5s)"))?;
    if !x.is_finite() || x < 0.0 {
        return Err(format!("{v:?} must be a finite time ≥ 0"));
    }
    Ok(x * mult)
}

/// Parses every `--threshold`; the first bad one is the error.
pub fn parse_thresholds<S: AsRef<str>>(v: &[S]) -> Result<Vec<Threshold>> {
    v.iter().map(|s| s.as_ref().parse()).collect()
}

/// The memory series an HTTP run must have measured for `metric` to mean anything: an
/// HTTP run fills the peaks it has no memory source for with 0, and a gate such as
/// `peak_reserved<1B` must not pass on a number nobody measured.
pub fn memory_series_needed(metric: &str) -> &'static [&'static str] {
    match metric {
        "peak_reserved" => &["reserved"],
        "peak_allocated" | "peak_above_base" => &["allocated"],
        "peak_inactive_split" => &["inactive_split"],
        "reserved_over_allocated" => &["allocated", "reserved"],
        _ => &[],
    }
}

/// Whether `metric` was measured by the run: always for an in-process run (loadtest's
/// allocator is the memory), for an HTTP run only when a source gave its series. `series`
/// is the run's `http.memory_series`, `None` for an in-process run; `diff` applies the
/// same rule to a results JSON.
pub fn memory_measured(metric: &str, series: Option<&[String]>) -> bool {
    match series {
        None => true,
        Some(s) => memory_series_needed(metric)
            .iter()
            .all(|need| s.iter().any(|x| x == need)),
    }
}

/// The measured value of `metric` in its base unit, if the run has it.
pub fn metric_value(r: &RunResult, metric: &str) -> Option<f64> {
    if !memory_measured(metric, r.http.as_ref().map(|h| h.memory_series.as_slice())) {
        return None;
    }
    let has_lat = r.latency.count > 0;
    // 503s are load shed by the service: neither ok nor an error of the run.
    let shed = r.http.as_ref().map(|h| h.shed).unwrap_or(0);
    Some(match metric {
        "peak_reserved" => r.peaks.reserved_bytes as f64,
        "peak_allocated" => r.peaks.allocated_bytes as f64,
        "peak_above_base" => r.peaks.above_base_bytes as f64,
        "peak_inactive_split" => r.peaks.inactive_split_bytes as f64,
        "p50" if has_lat => r.latency.p50_ms,
        "p90" if has_lat => r.latency.p90_ms,
        "p99" if has_lat => r.latency.p99_ms,
        "p99.9" if has_lat => r.latency.p999_ms,
        "max_latency" if has_lat => r.latency.max_ms,
        "avg_latency" if has_lat => r.latency.mean_ms,
        "min_latency" if has_lat => r.latency.min_ms,
        "requests" => r.requests.total as f64,
        "oom_count" => r.errors.oom as f64,
        "errors" => (r.errors.oom + r.errors.by_kind.values().sum::<u64>()) as f64,
        "error_rate" if r.requests.total > 0 => {
            r.requests.total.saturating_sub(r.requests.ok + shed) as f64 / r.requests.total as f64
        }
        "shed" => shed as f64,
        "shed_rate" if r.requests.total > 0 => shed as f64 / r.requests.total as f64,
        "dropped" => r.http.as_ref().map(|h| h.dropped).unwrap_or(0) as f64,
        "peak_process_used" => r.peaks.process_used_bytes? as f64,
        "peak_overhead" => r.peaks.overhead_bytes? as f64,
        "peak_device_used" => r.peaks.device_used_bytes? as f64,
        "rps" => r.throughput.requests_per_s,
        "findings" => r.findings.len() as f64,
        "safe_concurrency" => r.oom_search.as_ref()?.verified_safe_load? as f64,
        "reserved_over_allocated" if r.peaks.allocated_bytes > 0 => {
            r.peaks.reserved_bytes as f64 / r.peaks.allocated_bytes as f64
        }
        _ => return None,
    })
}

pub fn evaluate_thresholds(ts: &[Threshold], r: &RunResult) -> Vec<ThresholdResult> {
    ts.iter()
        .map(|t| {
            let actual = metric_value(r, &t.metric);
            ThresholdResult {
                expr: t.expr.clone(),
                metric: t.metric.clone(),
                op: t.op.as_str().into(),
                limit: t.limit,
                actual,
                unit: t.unit.name().into(),
                passed: actual.is_some_and(|a| t.op.holds(a, t.limit)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_k6_style() {
        let t: Threshold = "peak_reserved<6GiB".parse().unwrap();
        assert_eq!((t.op, t.limit), (Op::Lt, 6.0 * (1u64 << 30) as f64));
        let t: Threshold = "p99 <= 0.2s".parse().unwrap();
        assert_eq!((t.op, t.limit), (Op::Le, 200.0));
        let t: Threshold = "error_rate<1%".parse().unwrap();
        assert!((t.limit - 0.01).abs() < 1e-12);
        let t: Threshold = "p99.9<50".parse().unwrap();
        assert_eq!(t.metric, "p99.9");
        for bad in [
            "",
            "p99",
            "p42<1ms",
            "peak_reserved<lots",
            "p99<",
            "rps>-1",
            "p99<fast",
        ] {
            let e = bad.parse::<Threshold>().expect_err(bad).to_string();
            assert!(e.contains("invalid threshold"), "{bad}: {e}");
        }
    }

    #[test]
    fn parses_k6_syntax_as_ours() {
        let same = |k6: &str, ours: &str| {
            let (a, b): (Threshold, Threshold) = (k6.parse().unwrap(), ours.parse().unwrap());
            assert_eq!(
                (&a.metric, a.op, a.limit),
                (&b.metric, b.op, b.limit),
                "{k6}"
            );
            assert_eq!(a.expr, k6.trim(), "the user's expression is kept");
        };
        same("p(99)<200", "p99<200ms");
        same("p(99.9) <= 1s", "p99.9<=1000ms");
        same("http_req_duration: p(90)<300", "p90<300ms");
        same("http_req_duration:avg<150", "avg_latency<150ms");
        same("med<100", "p50<100ms");
        same("iteration_duration: max<2s", "max_latency<2000ms");
        same("http_req_failed: rate<0.01", "error_rate<1%");
        same("http_reqs: rate>100", "rps>100");
        same("http_reqs: count>=1000", "requests>=1000");
        for bad in [
            "p(95)<300",
            "http_req_duration: rate<1",
            "http_req_failed: p(99)<1",
            "vus_max: value<10",
            "p(99)<fast",
        ] {
            let e = bad.parse::<Threshold>().expect_err(bad).to_string();
            assert!(e.contains("invalid threshold"), "{bad}: {e}");
        }
        let e = "p(95)<300".parse::<Threshold>().unwrap_err().to_string();
        assert!(e.contains("p(99)"), "{e}");
    }

    #[test]
    fn the_written_limit_is_kept() {
        for (expr, want) in [
            ("error_rate<10%", "10%"),
            ("error_rate < 0.1", "0.1"),
            ("peak_reserved<=64MiB", "64MiB"),
            ("http_req_duration: p(95)<300", "300"),
            ("peak_reserved<+5%", "+5%"),
        ] {
            assert_eq!(written_limit(expr), Some(want), "{expr}");
        }
        assert_eq!(written_limit("p99"), None);
        assert_eq!(written_limit("p99<"), None);
    }

    #[test]
    fn ops() {
        assert!(Op::Lt.holds(1.0, 2.0) && !Op::Lt.holds(2.0, 2.0));
        assert!(Op::Ge.holds(2.0, 2.0) && Op::Eq.holds(3.0, 3.0));
    }
}
