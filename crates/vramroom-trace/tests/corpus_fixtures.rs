//! Real snapshots recorded with PyTorch 2.11 on an H200 (fixtures/snapshots/, recorded with
//! PyTorch's default recording arguments by scripts/corpus/record_all.py; CUDA-graph pools
//! and a side stream under expandable segments, max_split_size and roundup_power2_divisions
//! beside the default) replay exactly:
//! under their own config, peak allocated, peak reserved, the OOM count and the sequence of
//! device allocations equal PyTorch's own figures (scripts/corpus-results/, the same run);
//! a deterministic default recording predicts the other configs' peaks. With
//! VRAMROOM_CORPUS=DIR (the whole corpus of that run), every recording there is checked too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use vramroom_trace::{
    own_config, read_snapshot_file, recorded_segment_sizes, replay, ReplayOptions, TraceAction,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// PyTorch's figures, by recording name (the `snapshot` field without `.pickle`).
fn results() -> BTreeMap<String, serde_json::Value> {
    let dir = root().join("scripts/corpus-results/2026-12-03-h200-a/corpus_results.jsonl");
    let text = std::fs::read_to_string(&dir).expect("the corpus results are committed");
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("stats").is_some())
        .map(|v| {
            let name = v["snapshot"]
                .as_str()
                .unwrap_or("")
                .trim_end_matches(".pickle")
                .to_string();
            (name, v)
        })
        .collect()
}

/// Recordings whose requests depend on more than the program (threads, GPU timing of
/// record_stream frees, OOMs the program reacts to, inductor's choices per config): their
/// own trace replays exactly, but it cannot predict another config's run.
const NOT_DETERMINISTIC: &[&str] = &[
    "multithread_infer",
    "ddp_gloo_2rank",
    "side_stream_record_stream",
    "oom_recover",
    "compile_reduce_overhead",
];

fn stat(v: &serde_json::Value, k: &str) -> u64 {
    v["stats"][k].as_u64().unwrap_or(0)
}

fn check_dir(dir: &Path, all: &BTreeMap<String, serde_json::Value>) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut bad = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for path in files {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        let Some(want) = all.get(&name) else { continue };
        // A wrapped ring buffer's peak can predate its window; nothing can see it.
        if name.ends_with("__ring2000") {
            continue;
        }
        let snap = read_snapshot_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Under its own config: the settings the recording carries.
        let own = ReplayOptions {
            config: own_config(&snap),
            ..ReplayOptions::default()
        };
        let r = replay(&snap, &own).unwrap_or_else(|e| panic!("{name}: {e}"));
        let recorded = recorded_segment_sizes(&snap.device_traces[0]);
        checked += 1;
        let got = (
            r.peak_allocated_bytes,
            r.peak_reserved_bytes,
            r.num_ooms as u64,
        );
        let exp = (
            stat(want, "allocated_bytes.all.peak"),
            stat(want, "reserved_bytes.all.peak"),
            stat(want, "num_ooms"),
        );
        if got != exp || r.segment_sizes != recorded {
            bad.push(format!(
                "{name}: (peak allocated, peak reserved, OOMs) {got:?} vs PyTorch {exp:?}; device allocations equal: {}",
                r.segment_sizes == recorded
            ));
        }
        // The default recording predicts the other configs.
        let Some(workload) = name.strip_suffix("__default") else {
            continue;
        };
        if NOT_DETERMINISTIC.iter().any(|w| workload.starts_with(w)) {
            continue;
        }
        for (suffix, conf) in [
            ("expandable", "expandable_segments:True"),
            ("msplit128", "max_split_size_mb:128"),
            ("rp2div4", "roundup_power2_divisions:4"),
        ] {
            let Some(other) = all.get(&format!("{workload}__{suffix}")) else {
                continue;
            };
            let opts = ReplayOptions {
                config: vramroom_alloc::AllocatorConfig::parse(conf).expect("a valid config"),
                ..ReplayOptions::default()
            };
            let r = replay(&snap, &opts).unwrap_or_else(|e| panic!("{name} under {conf}: {e}"));
            checked += 1;
            let got = (r.peak_allocated_bytes, r.peak_reserved_bytes);
            let exp = (
                stat(other, "allocated_bytes.all.peak"),
                stat(other, "reserved_bytes.all.peak"),
            );
            if got != exp {
                bad.push(format!("{name} under {conf}: {got:?} vs PyTorch {exp:?}"));
            }
        }
    }
    (checked, bad)
}

#[test]
fn committed_recordings_replay_exactly() {
    let all = results();
    let (checked, bad) = check_dir(&root().join("fixtures/snapshots"), &all);
    assert!(checked >= 8, "only {checked} comparisons made");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn graph_and_stream_recordings_use_their_pools() {
    // The graph recordings name their private pools, and the replay files its capture
    // allocations there: its own snapshot reports the same pool ids PyTorch did.
    let path = root().join("fixtures/snapshots/graph_shared_pool__default.pickle");
    let snap = read_snapshot_file(&path).expect("fixture");
    let want: std::collections::BTreeSet<(i64, i64)> =
        snap.segments.iter().map(|s| s.segment_pool_id).collect();
    let r = replay(
        &snap,
        &ReplayOptions {
            record_history: true,
            ..ReplayOptions::default()
        },
    )
    .expect("replay");
    assert!(r.private_pools >= 1);
    let ours = r.snapshot.expect("history asked");
    let got: std::collections::BTreeSet<(i64, i64)> =
        ours.segments.iter().map(|s| s.segment_pool_id).collect();
    assert_eq!(got, want);
    assert!(
        ours.device_traces[0]
            .iter()
            .all(|e| e.action != TraceAction::Alloc || e.stream >> 63 == 0),
        "streams in the history are the real ones"
    );
}

#[test]
fn whole_corpus_when_present() {
    let Ok(dir) = std::env::var("VRAMROOM_CORPUS") else {
        eprintln!("SKIP: VRAMROOM_CORPUS is not set (the whole corpus is not in the repository)");
        return;
    };
    let (checked, bad) = check_dir(Path::new(&dir), &results());
    eprintln!("{checked} comparisons, {} differ", bad.len());
    for b in &bad {
        eprintln!("  {b}");
    }
}
