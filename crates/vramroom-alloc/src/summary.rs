//! `memory_summary()`: byte-identical to PyTorch 2.11's `torch.cuda.memory_summary`.
//!
//! Design note: this mirrors `torch/cuda/memory.py` step by step (spec 12.1) rather than
//! building a "nicer" table, because users diff these texts against PyTorch's. Two details
//! decide byte equality and are easy to get wrong: every row of a group takes its unit from
//! the group's `all` row (so 15,360 bytes in the small pool print as `0 MiB`), and the unit
//! loop divides the value with floor division but the reference with true division. Python's
//! `int / int` is correctly rounded; `(x as f64) / 1024.0` equals it for every `i64` because
//! dividing by a power of two is exact, and for counts the divisor-1000 comparison only ever
//! runs on values far below 2^53 or far above the threshold, so `f64` reproduces Python here.

use crate::stats::{DeviceStats, Stat, StatArray};

const WIDTH: usize = 75;

/// `torch.cuda.memory_summary(device, abbreviated)` for the given statistics.
pub fn memory_summary(stats: &DeviceStats, device: i64, abbreviated: bool) -> String {
    let groups: [(&StatArray, &str, Fmt); 9] = [
        (&stats.allocated_bytes, "Allocated memory", Fmt::Bytes),
        (&stats.active_bytes, "Active memory", Fmt::Bytes),
        (&stats.requested_bytes, "Requested memory", Fmt::Bytes),
        (&stats.reserved_bytes, "GPU reserved memory", Fmt::Bytes),
        (
            &stats.inactive_split_bytes,
            "Non-releasable memory",
            Fmt::Bytes,
        ),
        (&stats.allocation, "Allocations", Fmt::Count),
        (&stats.active, "Active allocs", Fmt::Count),
        (&stats.segment, "GPU reserved segments", Fmt::Count),
        (&stats.inactive_split, "Non-releasable allocs", Fmt::Count),
    ];

    let eq = "=".repeat(WIDTH);
    let dash = "-".repeat(WIDTH);
    let mut lines: Vec<String> = Vec::with_capacity(48);
    lines.push(eq.clone());
    // Python fills these placeholders in one final `str.format` pass; formatting them in
    // place gives the same text because no row can contain a brace.
    lines.push(format!(
        " {:16} PyTorch CUDA memory summary, device ID {:<17} ",
        "", device
    ));
    lines.push(dash.clone());
    lines.push(format!(
        "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
        "", stats.num_ooms, "", stats.num_alloc_retries
    ));
    lines.push(eq.clone());
    lines
        .push("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".into());

    for (arr, label, fmt) in groups {
        lines.push(dash.clone());
        let all = arr.0[0];
        lines.push(row(label, &arr.0[0], &all, fmt));
        if !abbreviated {
            lines.push(row("      from large pool", &arr.0[2], &all, fmt));
            lines.push(row("      from small pool", &arr.0[1], &all, fmt));
        }
    }
    for (cell, label) in [
        (&stats.oversize_allocations, "Oversize allocations"),
        (&stats.oversize_segments, "Oversize GPU segments"),
    ] {
        lines.push(dash.clone());
        lines.push(row(label, cell, cell, Fmt::Count));
    }
    lines.push(eq);

    let mut out = String::with_capacity(lines.len() * (WIDTH + 3));
    out.push('|');
    out.push_str(&lines.join("|\n|"));
    out.push_str("|\n");
    out
}

#[derive(Clone, Copy)]
enum Fmt {
    Bytes,
    Count,
}

fn row(label: &str, s: &Stat, pref: &Stat, fmt: Fmt) -> String {
    let f = |v: i64, p: i64| match fmt {
        Fmt::Bytes => format_bytes(v, p),
        Fmt::Count => format_count(v, p),
    };
    format!(
        " {:<21} | {} | {} | {} | {} ",
        label,
        f(s.current, pref.current),
        f(s.peak, pref.peak),
        f(s.allocated, pref.allocated),
        f(s.freed, pref.freed)
    )
}

/// `_format_size(sz, pref_sz)` of memory.py: 10 characters.
fn format_bytes(v: i64, pref: i64) -> String {
    const UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let (v, unit) = scale(v, pref, 786_432, 1024, &UNITS);
    format!("{v:>6} {unit}")
}

/// `_format_count(cnt, pref_cnt)` of memory.py: 10 characters.
fn format_count(v: i64, pref: i64) -> String {
    const UNITS: [&str; 3] = [" ", "K", "M"];
    let (v, unit) = scale(v, pref, 750_000, 1000, &UNITS);
    format!("{v:>7} {unit} ")
}

/// The shared unit loop: move to the next unit while the reference is at least `threshold`,
/// floor-dividing the value (Python `//`, also for negatives) and true-dividing the reference.
fn scale<'u>(
    mut v: i64,
    pref: i64,
    threshold: i64,
    divisor: i64,
    units: &[&'u str],
) -> (i64, &'u str) {
    let mut unit = units[0];
    // The first comparison is between Python ints; only after one division is it a float.
    if pref < threshold {
        return (v, unit);
    }
    let mut p = pref as f64;
    for (k, next) in units.iter().enumerate().skip(1) {
        if k > 1 && p < threshold as f64 {
            break;
        }
        unit = next;
        v = v.div_euclid(divisor);
        p /= divisor as f64;
    }
    (v, unit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/spec/golden/");

    fn read(name: &str) -> String {
        let path = format!("{GOLDEN}{name}");
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("golden file {path}: {e}"))
    }

    fn json(name: &str) -> serde_json::Value {
        serde_json::from_str(&read(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn stats_of(v: &serde_json::Value) -> DeviceStats {
        let obj = v.as_object().expect("stats must be an object");
        let m: BTreeMap<String, i64> = obj
            .iter()
            .map(|(k, v)| (k.clone(), v.as_i64().expect("integer stat")))
            .collect();
        assert_eq!(m.len(), 122, "a full memory_stats() dict");
        DeviceStats::from_memory_stats(&m)
    }

    fn assert_same(got: &str, want: &str, what: &str) {
        if got != want {
            for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
                if g != w {
                    panic!(
                        "{what}: first difference at line {}\n got: {g:?}\nwant: {w:?}",
                        i + 1
                    );
                }
            }
            panic!(
                "{what}: lengths differ ({} vs {} bytes)",
                got.len(),
                want.len()
            );
        }
    }

    #[test]
    fn probe_full_and_abbreviated_summaries() {
        let probe = json("probe.json");
        let stats = stats_of(&probe["summary"]["stats"]);
        let full = read("summary_full.txt");
        let abbrev = read("summary_abbrev.txt");
        assert_eq!(full.len(), 3666);
        assert_eq!(abbrev.len(), 2262);
        assert_same(&memory_summary(&stats, 0, false), &full, "summary_full.txt");
        assert_same(
            &memory_summary(&stats, 0, true),
            &abbrev,
            "summary_abbrev.txt",
        );
        assert_eq!(memory_summary(&stats, 0, false).lines().count(), 47);
        assert_eq!(memory_summary(&stats, 0, true).lines().count(), 29);
    }

    #[test]
    fn probe_cuda_malloc_async_summary() {
        let probe = json("probe.json");
        let r = &probe["subprocesses"]["cudaMallocAsync"]["result"];
        let stats = stats_of(&r["stats"]);
        let want = r["summary"].as_str().expect("summary text");
        assert_same(
            &memory_summary(&stats, 0, false),
            want,
            "cudaMallocAsync summary",
        );
    }

    #[test]
    fn results_empty_cache_summaries() {
        let mut matched = 0;
        let dir = std::fs::read_dir(GOLDEN).expect("golden dir");
        let mut names: Vec<String> = dir
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("results__") && n.ends_with(".json"))
            .collect();
        names.sort();
        for name in &names {
            let v = json(name);
            let ec = &v["empty_cache"];
            if let Some(text) = ec["summary_text"].as_str() {
                let stats = stats_of(&ec["stats"]);
                assert_same(&memory_summary(&stats, 0, false), text, name);
                matched += 1;
            }
            // Every recorded stats dict must at least render to the fixed shape.
            if let Some(traces) = v["traces"].as_object() {
                for (tname, t) in traces {
                    if t["stats"].is_object() {
                        let s = memory_summary(&stats_of(&t["stats"]), 0, false);
                        assert_eq!(s.lines().count(), 47, "{name}/{tname}");
                        assert!(s.lines().all(|l| l.len() == 77), "{name}/{tname}");
                    }
                }
            }
        }
        assert!(
            matched >= 2,
            "expected ≥ 2 empty_cache summaries, got {matched}"
        );
    }

    #[test]
    fn empty_stats_summary_shape() {
        let s = memory_summary(&DeviceStats::new(-1), 0, false);
        assert_eq!(s.len(), 3666);
        assert!(s.ends_with("|\n"));
        assert!(s.contains("| Allocated memory      |      0 B   |      0 B   |"));
    }

    #[test]
    fn byte_units_follow_the_reference() {
        assert_eq!(format_bytes(0, 0), "     0 B  ");
        assert_eq!(format_bytes(786_431, 786_431), "786431 B  ");
        assert_eq!(format_bytes(786_432, 786_432), "   768 KiB");
        assert_eq!(format_bytes(734_003_200, 734_003_200), "716800 KiB");
        assert_eq!(format_bytes(15_360, 3_221_225_472), "     0 MiB");
        assert_eq!(format_bytes(i64::MAX, i64::MAX), "  8191 PiB");
        // floor division as in Python, and a negative reference never changes unit
        assert_eq!(format_bytes(-1, 1 << 30), "    -1 MiB");
        assert_eq!(format_bytes(-5000, -5000), " -5000 B  ");
    }

    #[test]
    fn count_units_follow_the_reference() {
        assert_eq!(format_count(4, 4), "      4   ");
        assert_eq!(format_count(749_999, 749_999), " 749999   ");
        assert_eq!(format_count(750_000, 750_000), "    750 K ");
        assert_eq!(format_count(750_000_000, 750_000_000), "    750 M ");
        assert_eq!(format_count(7, 750_000_000), "      0 M ");
        assert_eq!(format_count(i64::MAX, i64::MAX), "9223372036854 M ");
    }

    #[test]
    fn header_placeholders() {
        let mut s = DeviceStats::new(-1);
        s.num_ooms = 12;
        s.num_alloc_retries = 3;
        let text = memory_summary(&s, 7, true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "|                  PyTorch CUDA memory summary, device ID 7                 |"
        );
        assert_eq!(
            lines[3],
            "|            CUDA OOMs: 12           |        cudaMalloc retries: 3         |"
        );
    }
}
