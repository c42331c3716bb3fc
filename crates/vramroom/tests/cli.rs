//! The CLI as a user runs it: exit codes, one-line errors, JSON fields.

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramroom"))
}

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces")
        .join(name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = bin().args(args).output().expect("run vramroom");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn replay_json_has_the_documented_fields() {
    let t = trace("resnet50_infer_nograd__default.pickle");
    let (code, out, err) = run(&[
        "replay",
        t.to_str().unwrap(),
        "--alloc-conf",
        "default",
        "--alloc-conf",
        "expandable_segments:True",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let arr = v.as_array().expect("array");
    assert_eq!(arr.len(), 2);
    for o in arr {
        for k in [
            "alloc_conf",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "segment_allocs",
            "segment_frees",
            "num_alloc_retries",
            "num_ooms",
            "oom_event",
            "min_capacity_bytes",
            "stats",
        ] {
            assert!(o.get(k).is_some(), "missing {k}");
        }
        assert_eq!(o["stats"].as_object().unwrap().len(), 122);
    }
    assert_eq!(arr[0]["peak_reserved_bytes"], 1_608_515_584u64);
    assert_eq!(arr[1]["peak_reserved_bytes"], 968_884_224u64);
    assert!(arr[0]["oom_event"].is_null());
}

#[test]
fn small_capacity_reports_the_failing_event_and_min_capacity() {
    let t = trace("resnet50_infer_nograd__default.pickle");
    let (code, out, err) = run(&[
        "replay",
        t.to_str().unwrap(),
        "--capacity",
        "900MiB",
        "--min-capacity",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let o = &v[0];
    assert!(o["oom_event"].as_u64().is_some(), "{o}");
    assert!(o["oom"]["message"]
        .as_str()
        .unwrap()
        .starts_with("CUDA out of memory. Tried to allocate"));
    let min = o["min_capacity_bytes"].as_u64().unwrap();
    // Between what the workload needs and what it reserved unconstrained.
    assert!((843_556_352..=1_608_515_584).contains(&min), "{min}");
    // And a replay on exactly that capacity runs through.
    let (code, out, _) = run(&[
        "replay",
        t.to_str().unwrap(),
        "--capacity",
        &min.to_string(),
        "--json",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v[0]["oom_event"].is_null());
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let dir = std::env::temp_dir().join(format!("vramroom-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = std::fs::read(trace("resnet50_infer_nograd__default.pickle")).unwrap();
    let truncated = dir.join("truncated.pickle");
    std::fs::write(&truncated, &good[..good.len() / 2]).unwrap();
    let garbage = dir.join("garbage.pickle");
    std::fs::write(&garbage, b"this is not a pickle at all").unwrap();
    // {"segments": [], "device_traces": one dict referenced 2^30 times through tuples}
    let bomb = dir.join("bomb.pickle");
    let mut b = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces}".to_vec();
    b.extend(b"2\x86".repeat(30));
    b.extend(b"u.");
    std::fs::write(&bomb, &b).unwrap();
    let t = trace("resnet50_infer_nograd__default.pickle");
    let t = t.to_str().unwrap();
    let mut cases: Vec<Vec<&str>> = vec![
        vec!["replay", truncated.to_str().unwrap()],
        vec!["replay", garbage.to_str().unwrap()],
        vec!["replay", bomb.to_str().unwrap()],
        vec!["replay", dir.to_str().unwrap()],
        vec!["replay", "/no/such/file.pickle"],
        vec!["replay", t, "--alloc-conf", "bogus:1"],
        vec!["replay", t, "--alloc-conf", "max_split_size_mb:abc"],
        vec!["replay", t, "--alloc-conf", "expandable_segments:true"],
        vec!["replay", t, "--capacity", "0"],
        vec!["replay", t, "--capacity", "12XB"],
        vec![
            "summary",
            t,
            "--alloc-conf",
            "garbage_collection_threshold:2",
        ],
    ];
    if std::path::Path::new("/dev/zero").exists() {
        // an endless file: refused at its first byte, not read forever
        cases.push(vec!["replay", "/dev/zero"]);
    }
    for args in cases {
        let (code, out, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed {out}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn summary_prints_pytorch_table() {
    let t = trace("resnet50_train_sgd__default.pickle");
    let (code, out, err) = run(&["summary", t.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 47);
    assert!(out.contains("PyTorch CUDA memory summary, device ID 0"));
    let (code, out, _) = run(&["summary", t.to_str().unwrap(), "--abbreviated"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 29);
}

#[test]
fn replay_recommend_picks_the_lowest_reserved_config_that_fits() {
    let t = trace("resnet50_infer_nograd__default.pickle");
    let (code, out, err) = run(&["replay", t.to_str().unwrap(), "--recommend", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let arr = v.as_array().expect("array");
    assert!(
        arr.len() >= 5,
        "candidate configs were replayed: {}",
        arr.len()
    );
    let picked: Vec<&serde_json::Value> = arr.iter().filter(|o| o["recommended"] == true).collect();
    assert_eq!(picked.len(), 1);
    let best = picked[0]["peak_reserved_bytes"].as_u64().unwrap();
    for o in arr {
        if o["num_ooms"] == 0 {
            assert!(o["peak_reserved_bytes"].as_u64().unwrap() >= best);
        }
    }
    // This trace's recorded expandable run reserved 968884224 bytes (ground-truth.md); the
    // recommendation must be at least that good, and the snapshot's own config is first.
    assert!(best <= 968_884_224, "{best}");
    assert_eq!(arr[0]["alloc_conf"], "default");
    // The table form names it.
    let (code, out, _) = run(&["replay", t.to_str().unwrap(), "--recommend"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("recommended: PYTORCH_CUDA_ALLOC_CONF="),
        "{out}"
    );
}
