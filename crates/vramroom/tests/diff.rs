//! `vramroom diff`: two snapshots or two results JSON, thresholds and exit 99.

use std::path::PathBuf;
use std::process::Command;

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(p)
}

fn trace(name: &str) -> PathBuf {
    repo("../shared/traces").join(name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramroom"))
        .arg("diff")
        .args(args)
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .output()
        .expect("run vramroom");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.push("--json");
    let (code, out, err) = run(&a);
    assert!(code == 0 || code == 99, "{code} {err}");
    serde_json::from_str(&out).expect("json")
}

#[test]
fn a_snapshot_against_itself_changes_nothing() {
    let t = trace("resnet50_infer_nograd__default.pickle");
    let t = t.to_str().unwrap();
    let (code, out, err) = run(&[t, t, "--threshold", "peak_reserved<=+0%"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("peak_reserved") && out.contains("+0.00%"),
        "{out}"
    );
    // The threshold as written, the actual change rounded in its terms (not a raw fraction).
    assert!(out.contains("✓ peak_reserved<=+0% (actual +0.0%)"), "{out}");
    // No stacks in these recordings: the diff says so instead of inventing sites.
    assert!(out.contains("no allocation sites"), "{out}");
    let (code, _, err) = run(&[t, t, "--threshold", "peak_reserved<-1%"]);
    assert_eq!(code, 99, "{err}");
    assert!(err.contains("peak_reserved<-1%"), "{err}");
}

#[test]
fn thresholds_follow_the_measured_change() {
    let (b, n) = (
        trace("resnet50_train_sgd__default.pickle"),
        trace("resnet50_train_sgd__expandable_segments-True.pickle"),
    );
    let (b, n) = (b.to_str().unwrap(), n.to_str().unwrap());
    let v = json(&[b, n]);
    let base = v["base"]["figures"]["peak_reserved"].as_f64().unwrap();
    let new = v["new"]["figures"]["peak_reserved"].as_f64().unwrap();
    assert!(base > 0.0 && new > 0.0 && base != new);
    let pct = 100.0 * (new - base) / base;
    // Just above and just below the measured change: one passes, one breaks.
    let above = format!("peak_reserved<{:+.3}%", pct + 0.01);
    let below = format!("peak_reserved<{:+.3}%", pct - 0.01);
    assert_eq!(run(&[b, n, "--threshold", &above]).0, 0, "{above}");
    assert_eq!(run(&[b, n, "--threshold", &below]).0, 99, "{below}");
    // An absolute limit on NEW.
    let abs = format!("peak_reserved<={}", new as u64);
    assert_eq!(run(&[b, n, "--threshold", &abs]).0, 0);
    let abs = format!("peak_reserved<{}", new as u64);
    assert_eq!(run(&[b, n, "--threshold", &abs]).0, 99);
}

#[test]
fn snapshots_with_stacks_name_their_allocation_sites() {
    let (b, n) = (
        repo("fixtures/snapshots/graph_release__default.pickle"),
        repo("fixtures/snapshots/oom_recover__default.pickle"),
    );
    let (b, n) = (b.to_str().unwrap(), n.to_str().unwrap());
    let v = json(&[b, n]);
    assert_eq!(v["has_stacks"], true);
    let sites = v["top_sites"].as_array().unwrap();
    assert!(!sites.is_empty());
    assert!(sites
        .iter()
        .all(|s| s["site"].as_str().unwrap().contains(':')));
    let (code, out, _) = run(&[b, n, "--top", "3"]);
    assert_eq!(code, 0);
    assert!(out.contains("allocation sites at the peak"), "{out}");
}

#[test]
fn results_json_are_compared_by_their_peaks_and_latency() {
    let dir = std::env::temp_dir().join(format!("vramroom-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, reserved: u64, p99: f64| {
        let p = dir.join(name);
        let v = serde_json::json!({
            "peaks": {"allocated_bytes": reserved / 2, "reserved_bytes": reserved},
            "latency": {"count": 100, "p50_ms": p99 / 2.0, "p99_ms": p99},
            "errors": {"oom": 0},
            "throughput": {"requests_per_s": 50.0},
        });
        std::fs::write(&p, v.to_string()).unwrap();
        p
    };
    let b = write("base.json", 1 << 30, 100.0);
    let n = write("new.json", (1 << 30) + (1 << 26), 120.0);
    let (b, n) = (b.to_str().unwrap(), n.to_str().unwrap());
    let v = json(&[b, n]);
    assert_eq!(v["new"]["figures"]["p99"], 120.0);
    assert_eq!(v["new"]["figures"]["fragmentation"], 0.5);
    assert_eq!(run(&[b, n, "--threshold", "p99<+25%"]).0, 0);
    assert_eq!(run(&[b, n, "--threshold", "p99<+15%"]).0, 99);
    assert_eq!(run(&[b, n, "--threshold", "peak_reserved<=+64MiB"]).0, 0);
    assert_eq!(run(&[b, n, "--threshold", "peak_reserved<+64MiB"]).0, 99);
    // A metric results do not have fails its gate.
    assert_eq!(run(&[b, n, "--threshold", "device_allocs<1000"]).0, 99);
    // Mixed kinds and bad thresholds are usage errors.
    let t = trace("resnet50_infer_nograd__default.pickle");
    let (code, _, err) = run(&[b, t.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("one kind"), "{err}");
    for bad in ["nope<1", "peak_reserved<5%", "p99"] {
        let (code, _, err) = run(&[b, n, "--threshold", bad]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("invalid threshold"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A snapshot (written to `path`) whose peak holds one allocation from each of `n` user
/// sites, `train.py:i` with `(i + 1) * mult` bytes.
fn write_sites_snapshot(path: &std::path::Path, n: u64, mult: u64) {
    use vramroom_trace::{Frame, Snapshot, TraceAction, TraceEntry};
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
    let s = Snapshot {
        device_traces: vec![trace],
        ..Snapshot::default()
    };
    vramroom_trace::write_snapshot_file(&s, path).expect("write snapshot");
}

#[test]
fn top_above_ten_lists_that_many_sites() {
    let dir = std::env::temp_dir().join(format!("vramroom-diff-top-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (b, n) = (dir.join("base.pickle"), dir.join("new.pickle"));
    write_sites_snapshot(&b, 25, 512);
    write_sites_snapshot(&n, 25, 1024);
    let (b, n) = (b.to_str().unwrap(), n.to_str().unwrap());
    // The default stays 10; --top N gives N rows up to the 25 sites there are, in the JSON
    // and in the table alike.
    for (top, want) in [
        (None, 10),
        (Some("3"), 3),
        (Some("20"), 20),
        (Some("40"), 25),
    ] {
        let mut args = vec![b, n];
        if let Some(t) = top {
            args.extend(["--top", t]);
        }
        let v = json(&args);
        assert_eq!(v["top_sites"].as_array().unwrap().len(), want, "{top:?}");
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{err}");
        let rows = out.lines().filter(|l| l.contains("train.py:")).count();
        assert_eq!(rows, want, "{top:?}: {out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
