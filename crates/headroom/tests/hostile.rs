//! Hostile input at the command line: every case ends in a clean answer (exit 0 with a sane
//! result, or exit 2 with one line naming the problem), never a panic or an abort.

use std::path::{Path, PathBuf};
use std::process::Command;

use headroom_alloc::{AllocatorSettings, Snapshot, TraceAction, TraceEntry};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
}

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces")
        .join(name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = bin().args(args).output().expect("run headroom");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("headroom-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// No panic, no abort: the process exited by itself with 0 or 2, and an error is one line.
fn assert_clean(code: i32, err: &str, what: &str) {
    assert!(
        !err.contains("panicked") && !err.contains("memory allocation of"),
        "{what}: {err}"
    );
    assert!(code == 0 || code == 2, "{what}: exit {code}: {err}");
    if code == 2 {
        assert_eq!(err.trim().lines().count(), 1, "{what}: {err}");
    }
}

fn alloc(addr: u64, size: u64) -> TraceEntry {
    TraceEntry {
        action: TraceAction::Alloc,
        addr,
        size,
        stream: 0,
        time_us: 0,
        compile_context: String::new(),
        user_metadata: String::new(),
        frames: None,
    }
}

fn write_snapshot(path: &Path, settings: AllocatorSettings, trace: Vec<TraceEntry>) {
    let s = Snapshot {
        device_traces: vec![trace],
        allocator_settings: settings,
        ..Snapshot::default()
    };
    headroom_trace::write_snapshot_file(&s, path).unwrap();
}

fn json(out: &str) -> Vec<serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(out)
        .expect("json")
        .as_array()
        .expect("array")
        .clone()
}

#[test]
fn a_huge_alloc_conf_string_is_a_table_not_a_panic() {
    let t = trace("resnet50_infer_nograd__default.pickle");
    let conf = "expandable_segments:False,".repeat(2600);
    let (code, out, err) = run(&["replay", t.to_str().unwrap(), "--alloc-conf", &conf]);
    assert_clean(code, &err, "long --alloc-conf");
    assert_eq!(code, 0, "{err}");
    // the label is cut, so the table stays narrow
    assert!(out.lines().all(|l| l.chars().count() < 300), "{out}");
    assert!(out.contains("(67600 chars)"), "{out}");
    // --json keeps the whole string
    let (code, out, _) = run(&[
        "replay",
        t.to_str().unwrap(),
        "--alloc-conf",
        &conf,
        "--json",
    ]);
    assert_eq!(code, 0);
    assert_eq!(json(&out)[0]["alloc_conf"], conf.as_str());
}

#[test]
fn a_snapshot_with_a_70000_character_conf_replays() {
    let d = tmpdir("longconf");
    let p = d.join("long.pickle");
    let conf = "expandable_segments:False,".repeat(2700);
    assert!(conf.len() > 70_000);
    let settings = AllocatorSettings {
        pytorch_cuda_alloc_conf: conf,
        ..AllocatorSettings::default()
    };
    write_snapshot(&p, settings, vec![alloc(1 << 40, 4096)]);
    let (code, out, err) = run(&["replay", p.to_str().unwrap()]);
    assert_clean(code, &err, "70k conf in the snapshot");
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().all(|l| l.chars().count() < 300));
    let (code, out, err) = run(&["replay", p.to_str().unwrap(), "--recommend"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("recommended:"), "{out}");
}

#[test]
fn a_16_eib_capacity_replays_expandable_segments() {
    let t = trace("resnet50_infer_nograd__expandable_segments-True.pickle");
    let t = t.to_str().unwrap();
    let (code, out, err) = run(&["replay", t, "--json"]);
    assert_eq!(code, 0, "{err}");
    let want = json(&out)[0]["peak_reserved_bytes"].clone();
    for cap in ["18446744073709551615", "16383PiB"] {
        let (code, out, err) = run(&["replay", t, "--capacity", cap, "--json"]);
        assert_clean(code, &err, cap);
        assert_eq!(code, 0, "{cap}: {err}");
        let o = &json(&out)[0];
        assert!(o["oom_event"].is_null(), "{cap}");
        assert_eq!(o["peak_reserved_bytes"], want, "{cap}");
    }
}

#[test]
fn a_large_segment_size_that_overflows_is_an_oom_not_a_wrap() {
    let t = trace("resnet50_infer_nograd__default.pickle");
    for conf in [
        "large_segment_size_mb:17592186044415",
        "large_segment_size_mb:18446744073709551615",
        "large_segment_size_mb:17592186044415,expandable_segments:True",
    ] {
        let (code, out, err) = run(&[
            "replay",
            t.to_str().unwrap(),
            "--alloc-conf",
            conf,
            "--json",
        ]);
        assert_clean(code, &err, conf);
        assert_eq!(code, 0, "{conf}: {err}");
        let o = &json(&out)[0];
        // Clamped to 16 EiB - 1 MiB as PyTorch clamps it: the first 1-10 MiB request asks
        // for such a segment and fails, counted as an OOM.
        assert!(o["oom_event"].as_u64().is_some(), "{conf}: {o}");
        assert_eq!(o["num_ooms"], 1, "{conf}");
        let alloc = o["peak_allocated_bytes"].as_u64().unwrap();
        let reserved = o["peak_reserved_bytes"].as_u64().unwrap();
        assert!(
            reserved >= alloc,
            "{conf}: reserved {reserved} < allocated {alloc}"
        );
    }
    // past u64: refused, naming the key
    let (code, _, err) = run(&[
        "replay",
        t.to_str().unwrap(),
        "--alloc-conf",
        "large_segment_size_mb:18446744073709551616",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("large_segment_size_mb"), "{err}");
}

#[test]
fn recommend_never_picks_a_config_whose_replay_failed_an_allocation() {
    // 2^63 bytes: refused like PyTorch's >= 1 EB requests, without touching any stat, so
    // num_ooms stays 0; the config still does not fit.
    let d = tmpdir("exabyte");
    let p = d.join("eb.pickle");
    write_snapshot(
        &p,
        AllocatorSettings::default(),
        vec![alloc(1 << 40, 4096), alloc(1 << 41, 1 << 63)],
    );
    let (code, out, err) = run(&["replay", p.to_str().unwrap(), "--recommend", "--json"]);
    assert_clean(code, &err, "2^63 alloc");
    assert_eq!(code, 0, "{err}");
    let rows = json(&out);
    assert!(rows.len() > 1);
    for o in &rows {
        assert_eq!(o["num_ooms"], 0, "{o}");
        assert_eq!(o["oom_event"], 1, "{o}");
        assert_eq!(o["recommended"], false, "{o}");
    }
    let (code, out, _) = run(&["replay", p.to_str().unwrap(), "--recommend"]);
    assert_eq!(code, 0);
    assert!(!out.contains("recommended:"), "{out}");
    assert!(out.contains("no config runs this trace"), "{out}");
}

#[test]
fn a_snapshots_max_split_size_is_shown_as_what_it_is_or_refused() {
    let d = tmpdir("maxsplit");
    for v in [0i64, 1, (20 << 20) - 1] {
        let p = d.join(format!("ms{v}.pickle"));
        let settings = AllocatorSettings {
            max_split_size: v,
            ..AllocatorSettings::default()
        };
        write_snapshot(&p, settings, vec![alloc(1 << 40, 4096)]);
        let (code, _, err) = run(&["replay", p.to_str().unwrap()]);
        assert_clean(code, &err, "max_split_size");
        assert_eq!(code, 2, "max_split_size {v} was accepted");
        assert!(
            err.contains("max_split_size") && err.contains(&v.to_string()) && err.contains(">= 20"),
            "{err}"
        );
    }
    let p = d.join("ms128.pickle");
    let settings = AllocatorSettings {
        max_split_size: 128 << 20,
        ..AllocatorSettings::default()
    };
    write_snapshot(&p, settings, vec![alloc(1 << 40, 4096)]);
    let (code, out, err) = run(&["replay", p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)[0]["alloc_conf"], "max_split_size_mb:128");
    assert_eq!(json(&out)[0]["stats"]["max_split_size"], 128 << 20);
}

#[test]
fn sizes_follow_the_documented_rules() {
    let t = trace("resnet50_infer_nograd__default.pickle");
    let t = t.to_str().unwrap();
    for (cap, says) in [
        ("0.1KiB", "whole number of bytes"),
        ("1.5", "whole number of bytes"),
        ("0", "greater than 0"),
        ("0KiB", "greater than 0"),
        ("-1GiB", "negative"),
        ("16384PiB", "does not fit in 64 bits"),
        ("1e9", "unknown unit"),
        ("", "empty"),
    ] {
        let (code, _, err) = run(&["replay", t, &format!("--capacity={cap}")]);
        assert_clean(code, &err, cap);
        assert_eq!(code, 2, "--capacity {cap:?} was accepted");
        assert!(err.contains(says), "{cap}: {err}");
    }
    let (code, out, err) = run(&["replay", t, "--capacity", " 1.5 GiB ", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)[0]["capacity_bytes"], 3u64 << 29);
}
