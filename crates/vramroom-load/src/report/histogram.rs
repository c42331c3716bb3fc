//! The latency histogram of the terminal summary, in oha's layout: linear buckets from the
//! fastest to the slowest request, a bar of `■` per bucket scaled to the fullest one.
//!
//! Design note: a result keeps its latency as percentiles (min, p50, p90, p99, p99.9, max
//! and the count: [`LatencyStats`]), not the HDR histogram they came from, so the bucket
//! counts are read off the distribution those points pin down: the cumulative share rises
//! linearly between known percentiles (0 at min, 0.5 at p50, ..., 1 at max), and a
//! bucket holds `count x` the share between its edges, rounded so the buckets add up to
//! the count. Every percentile's bucket boundary is exact; within a span between two
//! percentiles requests are spread evenly. The heading says "from the percentiles" so
//! nobody takes the bars for per-request counts.

use std::fmt::Write as _;

use crate::results::LatencyStats;

/// Buckets drawn (oha draws 11 lines; 10 buckets between min and max is the same look).
pub const BUCKETS: usize = 10;
/// Widest bar, in characters.
pub const BAR_WIDTH: usize = 40;

/// The (latency ms, cumulative share) points of the distribution, increasing in both.
fn cdf_points(l: &LatencyStats) -> Vec<(f64, f64)> {
    let raw = [
        (l.min_ms, 0.0),
        (l.p50_ms, 0.5),
        (l.p90_ms, 0.9),
        (l.p99_ms, 0.99),
        (l.p999_ms, 0.999),
        (l.max_ms, 1.0),
    ];
    let mut pts: Vec<(f64, f64)> = Vec::with_capacity(raw.len());
    for (x, q) in raw {
        if !x.is_finite() {
            continue;
        }
        // HDR percentiles may repeat (or, rounded, step back): keep the curve monotone.
        let x = pts.last().map_or(x, |&(px, _)| x.max(px));
        match pts.last_mut() {
            Some(last) if last.0 == x => last.1 = q,
            _ => pts.push((x, q)),
        }
    }
    pts
}

/// The cumulative share of requests at or below `x` ms.
fn cdf(pts: &[(f64, f64)], x: f64) -> f64 {
    let Some(&(x0, _)) = pts.first() else {
        return 0.0;
    };
    if x < x0 {
        return 0.0;
    }
    for w in pts.windows(2) {
        let ((a, qa), (b, qb)) = (w[0], w[1]);
        if x <= b {
            return qa + (qb - qa) * (x - a) / (b - a);
        }
    }
    1.0
}

/// `(upper edge ms, requests)` of each bucket; empty when there is nothing to draw.
pub fn buckets(l: &LatencyStats) -> Vec<(f64, u64)> {
    let pts = cdf_points(l);
    if l.count == 0 || pts.is_empty() {
        return Vec::new();
    }
    let (lo, hi) = (pts[0].0, pts[pts.len() - 1].0);
    if hi <= lo {
        return vec![(hi, l.count)];
    }
    let width = (hi - lo) / BUCKETS as f64;
    // Counts by rounding the cumulative count at each edge: they add up to `count` exactly.
    let cum = |x: f64| (cdf(&pts, x) * l.count as f64).round() as u64;
    let mut out = Vec::with_capacity(BUCKETS);
    let mut below = 0;
    for i in 1..=BUCKETS {
        let edge = if i == BUCKETS {
            hi
        } else {
            lo + width * i as f64
        };
        let at = if i == BUCKETS { l.count } else { cum(edge) };
        out.push((edge, at.saturating_sub(below)));
        below = below.max(at);
    }
    out
}

/// Appends the histogram to the summary `o` (nothing when no request succeeded).
pub fn write(o: &mut String, l: &LatencyStats) {
    let b = buckets(l);
    let Some(most) = b.iter().map(|x| x.1).max().filter(|&m| m > 0) else {
        return;
    };
    let _ = writeln!(o, "\nlatency histogram (from the percentiles):");
    let label_w = b
        .iter()
        .map(|(e, _)| format!("{e:.3}").len())
        .max()
        .unwrap_or(0);
    let count_w = most.to_string().len();
    for (edge, n) in &b {
        let bar = (*n as u128 * BAR_WIDTH as u128).div_ceil(most as u128) as usize;
        let _ = writeln!(
            o,
            "  {:>label_w$} ms [{:>count_w$}] |{}",
            format!("{edge:.3}"),
            n,
            "■".repeat(bar)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(count: u64, ms: [f64; 6]) -> LatencyStats {
        LatencyStats {
            count,
            min_ms: ms[0],
            mean_ms: ms[1],
            p50_ms: ms[1],
            p90_ms: ms[2],
            p99_ms: ms[3],
            p999_ms: ms[4],
            max_ms: ms[5],
        }
    }

    #[test]
    fn buckets_add_up_and_follow_the_percentiles() {
        let l = stats(10_000, [1.0, 5.0, 9.0, 10.0, 10.5, 11.0]);
        let b = buckets(&l);
        assert_eq!(b.len(), BUCKETS);
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), l.count);
        assert_eq!(b.last().unwrap().0, 11.0);
        // Half the requests are at or below p50 = 5 ms: the buckets up to 5 ms hold 50%.
        let upto5: u64 = b.iter().filter(|x| x.0 <= 5.0 + 1e-9).map(|x| x.1).sum();
        assert_eq!(upto5, 5_000);
        // 90% at or below 9 ms.
        let upto9: u64 = b.iter().filter(|x| x.0 <= 9.0 + 1e-9).map(|x| x.1).sum();
        assert_eq!(upto9, 9_000);
    }

    #[test]
    fn a_single_latency_is_one_bucket_and_nothing_is_nothing() {
        let b = buckets(&stats(7, [3.0; 6]));
        assert_eq!(b, vec![(3.0, 7)]);
        assert!(buckets(&LatencyStats::default()).is_empty());
        let mut o = String::new();
        write(&mut o, &LatencyStats::default());
        assert!(o.is_empty());
    }

    #[test]
    fn percentiles_that_step_back_keep_the_counts_sane() {
        // Rounded HDR values can repeat or dip; counts never go negative or overflow.
        let l = stats(100, [2.0, 2.0, 1.9, 5.0, 5.0, 4.0]);
        let b = buckets(&l);
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), 100);
    }

    #[test]
    fn drawn_like_oha() {
        let mut o = String::new();
        write(&mut o, &stats(1000, [1.0, 2.0, 3.0, 8.0, 9.0, 10.0]));
        let lines: Vec<&str> = o.lines().filter(|l| l.contains(" ms [")).collect();
        assert_eq!(lines.len(), BUCKETS);
        let longest = lines.iter().map(|l| l.matches('■').count()).max().unwrap();
        assert_eq!(longest, BAR_WIDTH);
        assert!(o.contains("latency histogram"));
    }
}
