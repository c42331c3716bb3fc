//! Two snapshots compared: what a change did to memory, for a gate in CI.
//!
//! Design note: a snapshot's peaks are only known by replaying it (the final state is just
//! the end), so each side is replayed under its own config, which is exact (see replay).
//! Allocation sites come from the stacks the trace carries: at the moment of each side's
//! peak allocated, the live bytes are summed by the innermost frame that is the user's own
//! code (not PyTorch's, not a library's, not C++), which is the line a reviewer can act on.
//! Without stacks there are no sites, and the diff says so rather than guessing.

use std::collections::HashMap;

use vramroom_alloc::{Snapshot, TraceAction};

use crate::replay::{replay, ReplayError, ReplayOptions};

/// One side's figures.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Facts {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// `1 - peak allocated / peak reserved`: the share of the peak reservation that held
    /// nothing at the allocated peak (cached free blocks, split remainders).
    pub fragmentation: f64,
    pub num_ooms: u64,
    pub device_allocations: u64,
    /// Live bytes by allocation site at the allocated peak, largest first (empty without
    /// stacks).
    pub sites: Vec<Site>,
    pub has_stacks: bool,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Site {
    /// `file:line in function` of the innermost frame of the user's own code.
    pub site: String,
    pub bytes: u64,
    pub allocations: u64,
}

/// A site's bytes on both sides.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SiteDelta {
    pub site: String,
    pub base_bytes: u64,
    pub new_bytes: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SnapshotDiff {
    pub base: Facts,
    pub new: Facts,
    /// Every site on either side, the largest absolute change first. All of them: how many
    /// to show is the caller's `top` ([`report_json`], `diff --top`), not a cap here.
    pub top_sites: Vec<SiteDelta>,
}

/// Whether a frame is library code (PyTorch's, a package's, C++) rather than the user's.
fn is_library(filename: &str) -> bool {
    filename == "??"
        || filename.ends_with(".cpp")
        || filename.ends_with(".h")
        || filename.ends_with(".cc")
        || filename.contains("/site-packages/")
        || filename.contains("/dist-packages/")
        || filename.contains("/torch/")
        || filename.contains("/lib/python")
        || filename.starts_with('<')
}

/// Figures of one snapshot: its replay under its own config, and its sites.
pub fn facts(snapshot: &Snapshot) -> Result<Facts, ReplayError> {
    let r = replay(
        snapshot,
        &ReplayOptions {
            config: crate::replay::own_config(snapshot),
            stop_at_oom: false,
            ..ReplayOptions::default()
        },
    )?;
    let (sites, has_stacks) = sites_at_peak(snapshot);
    Ok(Facts {
        peak_allocated_bytes: r.peak_allocated_bytes,
        peak_reserved_bytes: r.peak_reserved_bytes,
        fragmentation: if r.peak_reserved_bytes > 0 {
            1.0 - r.peak_allocated_bytes as f64 / r.peak_reserved_bytes as f64
        } else {
            0.0
        },
        num_ooms: r.num_ooms.max(0) as u64,
        device_allocations: r.segment_allocs,
        sites,
        has_stacks,
    })
}

/// Live requested bytes by site at the first moment the trace's live bytes peak.
fn sites_at_peak(snapshot: &Snapshot) -> (Vec<Site>, bool) {
    let Some(trace) = snapshot.device_traces.iter().find(|t| !t.is_empty()) else {
        return (Vec::new(), false);
    };
    let has_stacks = trace
        .iter()
        .any(|e| e.frames.as_ref().is_some_and(|f| !f.is_empty()));
    if !has_stacks {
        return (Vec::new(), false);
    }
    let mut names: Vec<String> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut live: HashMap<u64, (u64, usize)> = HashMap::new();
    let mut per_site: Vec<(u64, u64)> = Vec::new();
    let (mut cur, mut peak) = (0u64, 0u64);
    let mut best: Vec<(u64, u64)> = Vec::new();
    for e in trace {
        match e.action {
            TraceAction::Alloc => {
                let site = e
                    .frames
                    .as_ref()
                    .and_then(|fr| {
                        fr.iter()
                            .find(|f| !is_library(&f.filename))
                            .or_else(|| fr.iter().find(|f| f.filename.ends_with(".py")))
                            .map(|f| format!("{}:{} in {}", f.filename, f.line, f.name))
                    })
                    .unwrap_or_else(|| "(no stack)".to_string());
                let i = *index.entry(site.clone()).or_insert_with(|| {
                    names.push(site);
                    per_site.push((0, 0));
                    names.len() - 1
                });
                per_site[i].0 += e.size;
                per_site[i].1 += 1;
                live.insert(e.addr, (e.size, i));
                cur += e.size;
                if cur > peak {
                    peak = cur;
                    best.clone_from(&per_site);
                }
            }
            TraceAction::FreeRequested => {
                if let Some((size, i)) = live.remove(&e.addr) {
                    per_site[i].0 -= size;
                    per_site[i].1 -= 1;
                    cur -= size;
                }
            }
            _ => {}
        }
    }
    let mut sites: Vec<Site> = best
        .iter()
        .enumerate()
        .filter(|(_, (b, _))| *b > 0)
        .map(|(i, &(bytes, allocations))| Site {
            site: names[i].clone(),
            bytes,
            allocations,
        })
        .collect();
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
    (sites, true)
}

/// Both snapshots' figures and the sites that moved most.
pub fn diff(base: &Snapshot, new: &Snapshot) -> Result<SnapshotDiff, ReplayError> {
    let b = facts(base)?;
    let n = facts(new)?;
    let mut all: HashMap<&str, (u64, u64)> = HashMap::new();
    for s in &b.sites {
        all.entry(&s.site).or_default().0 = s.bytes;
    }
    for s in &n.sites {
        all.entry(&s.site).or_default().1 = s.bytes;
    }
    let mut top: Vec<SiteDelta> = all
        .into_iter()
        .map(|(site, (base_bytes, new_bytes))| SiteDelta {
            site: site.to_string(),
            base_bytes,
            new_bytes,
        })
        .collect();
    top.sort_by(|x, y| {
        let dx = x.new_bytes.abs_diff(x.base_bytes);
        let dy = y.new_bytes.abs_diff(y.base_bytes);
        dy.cmp(&dx).then(x.site.cmp(&y.site))
    });
    Ok(SnapshotDiff {
        base: b,
        new: n,
        top_sites: top,
    })
}

/// A side's figures by metric name: the names `vramroom diff --threshold` takes
/// (peak_allocated, peak_reserved, fragmentation, oom_count, device_allocs for snapshots; a
/// results JSON adds p50, p99, rps). A metric the input lacks is absent, not 0, so a gate on
/// it fails as not measured rather than passing on a made-up figure.
pub type Figures = Vec<(&'static str, f64)>;

impl Facts {
    /// This side's figures, as a diff reports and gates them.
    pub fn figures(&self) -> Figures {
        vec![
            ("peak_allocated", self.peak_allocated_bytes as f64),
            ("peak_reserved", self.peak_reserved_bytes as f64),
            ("fragmentation", self.fragmentation),
            ("oom_count", self.num_ooms as f64),
            ("device_allocs", self.device_allocations as f64),
        ]
    }
}

/// One threshold checked: as the user wrote it, NEW's measured value in the threshold's own
/// terms (absolute, change, or relative change; `None` when a side lacks the metric), and
/// whether it held.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Verdict {
    pub expr: String,
    pub actual: Option<f64>,
    pub passed: bool,
}

/// One input of a diff: where it came from (`None` for bytes handed to the API) and its
/// figures.
pub struct Side<'a> {
    pub path: Option<&'a str>,
    pub figures: &'a Figures,
}

/// The one JSON shape of a diff, for `vramroom diff --json` and `vramroom.diff()` alike, so
/// the CLI and the API cannot drift apart: `base` and `new` (`path`, `figures`),
/// `thresholds` (the verdicts), and for snapshots `has_stacks` and the `top` sites whose
/// bytes changed most (`top_sites`).
pub fn report_json(
    base: Side<'_>,
    new: Side<'_>,
    thresholds: &[Verdict],
    sites: Option<(&SnapshotDiff, usize)>,
) -> serde_json::Value {
    let side = |s: &Side<'_>| {
        let figures: serde_json::Map<String, serde_json::Value> = s
            .figures
            .iter()
            .map(|(k, v)| (k.to_string(), (*v).into()))
            .collect();
        serde_json::json!({ "path": s.path, "figures": figures })
    };
    let mut j = serde_json::json!({
        "base": side(&base),
        "new": side(&new),
        "thresholds": thresholds,
    });
    if let Some((d, top)) = sites {
        j["has_stacks"] = (d.base.has_stacks || d.new.has_stacks).into();
        j["top_sites"] = serde_json::Value::Array(
            d.top_sites
                .iter()
                .take(top)
                .map(|s| {
                    serde_json::json!({
                        "site": s.site, "base_bytes": s.base_bytes, "new_bytes": s.new_bytes,
                    })
                })
                .collect(),
        );
    }
    j
}

impl SnapshotDiff {
    /// This diff in [`report_json`]'s shape.
    pub fn to_json(
        &self,
        base_path: Option<&str>,
        new_path: Option<&str>,
        thresholds: &[Verdict],
        top: usize,
    ) -> serde_json::Value {
        let (b, n) = (self.base.figures(), self.new.figures());
        report_json(
            Side {
                path: base_path,
                figures: &b,
            },
            Side {
                path: new_path,
                figures: &n,
            },
            thresholds,
            Some((self, top)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_frames_are_not_sites() {
        assert!(is_library(
            "/usr/lib/python3.12/site-packages/torch/nn/modules/linear.py"
        ));
        assert!(is_library("??"));
        assert!(is_library("CUDACachingAllocator.cpp"));
        assert!(!is_library("/home/me/train.py"));
        assert!(!is_library("service.py"));
    }

    /// A snapshot whose peak holds one allocation from each of `n` user sites, site `i`
    /// (`train.py:i`) with `(i + 1) * mult` bytes.
    fn sites_snapshot(n: u64, mult: u64) -> Snapshot {
        use vramroom_alloc::{Frame, TraceEntry};
        let trace = (0..n)
            .map(|i| TraceEntry {
                action: TraceAction::Alloc,
                addr: 0x1000_0000 * (i + 1),
                size: (i + 1) * mult,
                stream: 0,
                time_us: i as i64,
                compile_context: "N/A".into(),
                user_metadata: "".into(),
                frames: Some(
                    vec![Frame {
                        name: "step".into(),
                        filename: "train.py".into(),
                        line: i,
                    }]
                    .into(),
                ),
            })
            .collect();
        Snapshot {
            device_traces: vec![trace],
            ..Snapshot::default()
        }
    }

    #[test]
    fn every_site_is_kept_and_top_picks_how_many_are_shown() {
        // 25 sites that all change: `--top 20` must list 20, not a fixed 10.
        let d = diff(&sites_snapshot(25, 512), &sites_snapshot(25, 1024)).unwrap();
        assert_eq!(d.top_sites.len(), 25);
        // Largest change first: site 24 grew most.
        assert_eq!(d.top_sites[0].site, "train.py:24 in step");
        for top in [3, 10, 20, 25, 100] {
            let j = d.to_json(None, None, &[], top);
            assert_eq!(
                j["top_sites"].as_array().unwrap().len(),
                top.min(25),
                "{top}"
            );
        }
    }

    fn keys(v: &serde_json::Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
        k.sort();
        k
    }

    #[test]
    fn one_json_shape_for_the_cli_and_the_api() {
        // The CLI passes paths and verdicts, the API bytes or paths and none: the keys must
        // not depend on either, only on whether snapshots (with sites) were compared.
        let facts = Facts {
            peak_allocated_bytes: 3,
            peak_reserved_bytes: 4,
            fragmentation: 0.25,
            ..Facts::default()
        };
        let d = SnapshotDiff {
            base: facts.clone(),
            new: facts,
            top_sites: vec![SiteDelta {
                site: "a.py:1 in f".into(),
                base_bytes: 1,
                new_bytes: 2,
            }],
        };
        let verdict = Verdict {
            expr: "peak_reserved<+5%".into(),
            actual: Some(0.0),
            passed: true,
        };
        let cli = d.to_json(Some("b.pickle"), Some("n.pickle"), &[verdict], 10);
        let api = d.to_json(None, None, &[], 10);
        let top = ["base", "has_stacks", "new", "thresholds", "top_sites"];
        assert_eq!(keys(&cli), top);
        assert_eq!(keys(&api), top);
        for side in ["base", "new"] {
            assert_eq!(keys(&cli[side]), ["figures", "path"]);
            assert_eq!(keys(&cli[side]), keys(&api[side]));
            assert_eq!(
                keys(&cli[side]["figures"]),
                [
                    "device_allocs",
                    "fragmentation",
                    "oom_count",
                    "peak_allocated",
                    "peak_reserved"
                ]
            );
            assert_eq!(keys(&cli[side]["figures"]), keys(&api[side]["figures"]));
        }
        assert_eq!(keys(&cli["thresholds"][0]), ["actual", "expr", "passed"]);
        assert_eq!(
            keys(&cli["top_sites"][0]),
            ["base_bytes", "new_bytes", "site"]
        );
        assert_eq!(api["base"]["path"], serde_json::Value::Null);
        // The figures are the metric names the thresholds take.
        assert_eq!(cli["new"]["figures"]["peak_reserved"], 4.0);
        // Results JSON (no snapshots): the same sides, no sites.
        let f = vec![("p99", 1.5)];
        let side = || Side {
            path: Some("r.json"),
            figures: &f,
        };
        let r = report_json(side(), side(), &[], None);
        assert_eq!(keys(&r), ["base", "new", "thresholds"]);
    }
}
