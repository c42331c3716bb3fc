//! Acceptance: every shared PyTorch trace, replayed under its own config, reproduces
//! PyTorch's segment sequence and peaks to the byte; default traces replayed under the other
//! configs predict those configs' recorded peak reserved within 2%.

use std::path::PathBuf;

use vramroom_alloc::AllocatorConfig;
use vramroom_trace::{read_snapshot_file, recorded_segment_sizes, replay, ReplayOptions};

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces")
}

/// PyTorch's own peaks for each trace, from shared/spec/golden/results__*.json.
fn golden(file: &str) -> (u64, u64) {
    let dir = traces_dir().join("../spec/golden");
    for name in [
        "results__default_clean.json",
        "results__expandable_segments-True.json",
        "results__max_split_size_mb-128.json",
    ] {
        let text = std::fs::read_to_string(dir.join(name)).expect("golden results");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        for (_, t) in v["traces"].as_object().expect("traces") {
            if t["file"] == file {
                return (
                    t["peak_allocated"].as_u64().expect("peak_allocated"),
                    t["peak_reserved"].as_u64().expect("peak_reserved"),
                );
            }
        }
    }
    panic!("no golden entry for {file}");
}

const TRACES: [&str; 6] = [
    "resnet50_infer_nograd__default.pickle",
    "resnet50_infer_nograd__expandable_segments-True.pickle",
    "resnet50_infer_nograd__max_split_size_mb-128.pickle",
    "resnet50_train_sgd__default.pickle",
    "resnet50_train_sgd__expandable_segments-True.pickle",
    "resnet50_train_sgd__max_split_size_mb-128.pickle",
];

#[test]
fn own_config_replay_is_exact() {
    for file in TRACES {
        let snap = read_snapshot_file(&traces_dir().join(file)).expect("read trace");
        let config = AllocatorConfig::parse(&snap.allocator_settings.pytorch_cuda_alloc_conf)
            .expect("trace config");
        let r = replay(
            &snap,
            &ReplayOptions {
                config,
                ..Default::default()
            },
        )
        .expect("replay");
        let (peak_alloc, peak_res) = golden(file);
        let recorded = recorded_segment_sizes(&snap.device_traces[0]);
        eprintln!(
            "{file}: alloc {} vs {peak_alloc}, reserved {} vs {peak_res}, segments {} vs {}",
            r.peak_allocated_bytes,
            r.peak_reserved_bytes,
            r.segment_sizes.len(),
            recorded.len()
        );
        assert_eq!(r.oom_event, None, "{file}");
        assert_eq!(r.segment_sizes, recorded, "{file}: segment sequence");
        assert_eq!(r.peak_allocated_bytes, peak_alloc, "{file}: peak allocated");
        assert_eq!(r.peak_reserved_bytes, peak_res, "{file}: peak reserved");
    }
}

#[test]
fn default_trace_predicts_other_configs() {
    for workload in ["resnet50_infer_nograd", "resnet50_train_sgd"] {
        let snap = read_snapshot_file(&traces_dir().join(format!("{workload}__default.pickle")))
            .expect("read trace");
        for conf in ["expandable_segments:True", "max_split_size_mb:128"] {
            let file = format!("{workload}__{}.pickle", conf.replace(':', "-"));
            let (_, want) = golden(&file);
            let r = replay(
                &snap,
                &ReplayOptions {
                    config: AllocatorConfig::parse(conf).expect("conf"),
                    ..Default::default()
                },
            )
            .expect("replay");
            let err = (r.peak_reserved_bytes as f64 - want as f64).abs() / want as f64;
            eprintln!(
                "{workload} under {conf}: predicted {} recorded {want} ({:.2}%)",
                r.peak_reserved_bytes,
                err * 100.0
            );
            assert!(
                err <= 0.02,
                "{workload} under {conf}: {:.2}% off",
                err * 100.0
            );
        }
    }
}

/// Stronger than peaks: Vramroom's own history of the replay is PyTorch's trace, entry for
/// entry (action and size), and its final segments and blocks are PyTorch's final ones.
#[test]
fn own_config_replay_reproduces_the_whole_trace() {
    for file in TRACES {
        let snap = read_snapshot_file(&traces_dir().join(file)).expect("read trace");
        let config = AllocatorConfig::parse(&snap.allocator_settings.pytorch_cuda_alloc_conf)
            .expect("trace config");
        let r = replay(
            &snap,
            &ReplayOptions {
                config,
                record_history: true,
                ..Default::default()
            },
        )
        .expect("replay");
        let ours = r.snapshot.expect("snapshot");
        let seq = |t: &[vramroom_alloc::TraceEntry]| -> Vec<(vramroom_alloc::TraceAction, u64)> {
            t.iter().map(|e| (e.action, e.size)).collect()
        };
        assert_eq!(
            seq(&ours.device_traces[0]),
            seq(&snap.device_traces[0]),
            "{file}: trace"
        );
        type Layout = Vec<(u64, u64, Vec<(u64, vramroom_alloc::BlockState)>)>;
        let layout = |s: &vramroom_alloc::Snapshot| -> Layout {
            s.segments
                .iter()
                .map(|g| {
                    (
                        g.total_size,
                        g.allocated_size,
                        g.blocks.iter().map(|b| (b.size, b.state)).collect(),
                    )
                })
                .collect()
        };
        // Address order may differ where a reservation got a fresh address; compare as sets.
        let (mut a, mut b) = (layout(&ours), layout(&snap));
        a.sort();
        b.sort();
        assert_eq!(a, b, "{file}: final segments");
    }
}
