//! Hostile input at the command line: every case ends in a clean answer (exit 0 with a sane
//! result, or exit 2 with one line naming the problem), never a panic or an abort.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use vramroom_alloc::{AllocatorSettings, Snapshot, TraceAction, TraceEntry};

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

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vramroom-hostile-{}-{name}", std::process::id()));
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
        compile_context: "".into(),
        user_metadata: "".into(),
        frames: None,
    }
}

fn write_snapshot(path: &Path, settings: AllocatorSettings, trace: Vec<TraceEntry>) {
    let s = Snapshot {
        device_traces: vec![trace],
        allocator_settings: settings,
        ..Snapshot::default()
    };
    vramroom_trace::write_snapshot_file(&s, path).unwrap();
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

// ---------------------------------------------------------------------------------------
// loadtest: hard limits

#[test]
fn loadtest_duration_is_a_hard_limit_whatever_c_is() {
    let d = common::scratch("hostile", "c2048");
    let (code, _, err) = common::run_in_within(
        &d,
        &[
            "loadtest",
            "-c",
            "2048",
            "-z",
            "2s",
            "--no-search",
            "--quiet",
            "--out",
            "o",
        ],
        Duration::from_secs(90),
    );
    assert_eq!(code, 0, "{err}");
    let v = common::read_json(&d.join("o/results.json"));
    let wall = v["wall_s"].as_f64().unwrap();
    assert!(wall < 5.0, "a 2 s load lasted {wall} s");
    assert!(v["stages"][0]["workers_started"].as_u64().unwrap() <= 2048);
    assert!(v["requests"]["stopped"].as_u64().is_some());
}

/// The expandable segment's reservation is sized from the capacity; a 16 EiB one used to
/// abort the process allocating a page table for it.
#[test]
fn loadtest_on_a_16_eib_device_with_expandable_segments_runs() {
    for (i, cap) in ["18446744073709551615", "16383PiB"].iter().enumerate() {
        for dev in ["cpu", "meta"] {
            let d = common::scratch("hostile", &format!("cap{i}{dev}"));
            let (code, _, err) = common::run_in_within(
                &d,
                &[
                    "loadtest",
                    "--device",
                    dev,
                    "--model",
                    "mlp-tiny",
                    "-n",
                    "20",
                    "-c",
                    "2",
                    "--capacity",
                    cap,
                    "--alloc-conf",
                    "expandable_segments:True",
                    "--quiet",
                    "--out",
                    "o",
                ],
                Duration::from_secs(120),
            );
            assert_clean(code, &err, cap);
            assert_eq!(code, 0, "{cap} on {dev}: {err}");
            let v = common::read_json(&d.join("o/results.json"));
            assert_eq!(v["requests"]["ok"], 20, "{cap} on {dev}");
            assert_eq!(v["requests"]["oom"], 0, "{cap} on {dev}");
        }
    }
}

#[test]
fn loadtest_refuses_absurd_concurrency_and_stage_lists_at_once() {
    let d = common::scratch("hostile", "absurd");
    let many = vec!["1:1ms"; 10_000].join(",");
    for (args, says) in [
        (
            vec!["loadtest", "-c", "1000000", "-z", "1s"],
            "at most 4096",
        ),
        (vec!["loadtest", "--stages", "5000:1s"], "at most 4096"),
        (
            vec!["loadtest", "--ramp-until-oom", "--ramp-max", "99999"],
            "at most 4096",
        ),
        (vec!["loadtest", "--stages", many.as_str()], "at most 1000"),
    ] {
        let (code, _, err) = common::run_in_within(&d, &args, Duration::from_secs(20));
        assert_clean(code, &err, says);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{err}");
        assert!(
            err.len() < 400,
            "the error echoes the input: {} chars",
            err.len()
        );
    }
    assert!(
        common::files_under(&d).is_empty(),
        "a refused run writes nothing"
    );
}

#[test]
fn loadtest_thousand_short_stages_follow_their_durations() {
    let d = common::scratch("hostile", "stages");
    let stages = vec!["1:1ms"; 1000].join(",");
    let (code, _, err) = common::run_in_within(
        &d,
        &[
            "loadtest",
            "--device",
            "meta",
            "--model",
            "mlp-tiny",
            "--stages",
            &stages,
            "--no-search",
            "--quiet",
            "--out",
            "o",
        ],
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{err}");
    let v = common::read_json(&d.join("o/results.json"));
    assert!(v["wall_s"].as_f64().unwrap() < 3.0, "{}", v["wall_s"]);
}

#[test]
fn ctrl_c_stops_a_4096_worker_run_promptly() {
    let d = common::scratch("hostile", "ctrlc4096");
    let mut child = common::bin()
        .args([
            "loadtest", "-c", "4096", "-z", "120s", "--quiet", "--out", "o",
        ])
        .current_dir(&d)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vramroom");
    std::thread::sleep(Duration::from_millis(4000));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(st.success());
    let t = Instant::now();
    let out = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("vramroom -c 4096 did not stop within 30 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let v = common::read_json(&d.join("o/results.json"));
    assert_eq!(v["stop_reason"], "cancelled");
    assert!(d.join("o/report.html").is_file());
}

// ---------------------------------------------------------------------------------------
// Outputs: checked before the work; devices, FIFOs and links never replaced

#[cfg(target_os = "linux")]
#[test]
fn an_unwritable_out_is_found_before_the_load() {
    let d = common::scratch("hostile", "readonly");
    // procfs takes no file, even from root
    for out in ["/proc/self/vramroom-out", "/proc/self"] {
        let (code, _, err) = common::run_in_within(
            &d,
            &["loadtest", "-z", "60s", "--quiet", "--out", out],
            Duration::from_secs(20),
        );
        assert_clean(code, &err, out);
        assert_eq!(code, 2, "{out}: {err}");
        assert!(err.contains("--out") && err.contains(out), "{err}");
        let (code, _, err) = common::run_in_within(
            &d,
            &[
                "http",
                "http://127.0.0.1:9/",
                "-z",
                "60s",
                "--quiet",
                "--out",
                out,
            ],
            Duration::from_secs(20),
        );
        assert_eq!(code, 2, "{out}: {err}");
        assert!(err.contains("--out"), "{err}");
    }
    // a folder without write permission, for a user it applies to (root writes anyway)
    {
        use std::os::unix::fs::PermissionsExt;
        let ro = d.join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        let applies = std::fs::write(ro.join("x"), b"x").is_err();
        if applies {
            let (code, _, err) = common::run_in_within(
                &d,
                &["loadtest", "-z", "60s", "--quiet", "--out", "ro"],
                Duration::from_secs(20),
            );
            assert_eq!(code, 2, "{err}");
        }
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::remove_dir_all(&ro).unwrap();
    }
    // the probe leaves nothing behind where it could write
    let (code, _, err) = common::run_in(&d, &["loadtest", "-c", "0", "--out", "fresh"]);
    assert_eq!(code, 2, "{err}");
    assert!(!d.join("fresh").exists(), "a refused run created its --out");
}

#[cfg(unix)]
#[test]
fn replay_outputs_never_replace_devices_fifos_or_links() {
    use std::os::unix::fs::FileTypeExt;
    let t = trace("resnet50_infer_nograd__default.pickle");
    let t = t.to_str().unwrap();
    // /dev/null takes the bytes and stays a device
    for flag in ["--snapshot-out", "--rmm-out"] {
        let (code, _, err) = run(&["replay", t, flag, "/dev/null"]);
        assert_eq!(code, 0, "{flag}: {err}");
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
    }
    // /dev/full: a clean "no space" error, and the device node is still there
    if Path::new("/dev/full").exists() {
        for flag in ["--snapshot-out", "--rmm-out"] {
            let (code, _, err) = run(&["replay", t, flag, "/dev/full"]);
            assert_clean(code, &err, flag);
            assert_eq!(code, 2, "{flag}: {err}");
            assert!(err.to_lowercase().contains("no space"), "{err}");
            assert!(std::fs::metadata("/dev/full")
                .unwrap()
                .file_type()
                .is_char_device());
        }
    }
    let d = tmpdir("outputs");
    // a FIFO gets the bytes and stays a FIFO
    let fifo = d.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let reader = {
        let f = fifo.clone();
        std::thread::spawn(move || std::fs::read(f).unwrap())
    };
    let (code, _, err) = run(&["replay", t, "--rmm-out", fifo.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let bytes = reader.join().unwrap();
    assert!(String::from_utf8_lossy(&bytes).lines().count() > 100);
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    // a symlink stays a link; its target gets the file
    let target = d.join("real.pickle");
    std::fs::write(&target, b"old").unwrap();
    let link = d.join("link.pickle");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let (code, _, err) = run(&["replay", t, "--snapshot-out", link.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(vramroom_trace::read_snapshot_file(&target).is_ok());
    // a missing folder is found before the replay
    let (code, _, err) = run(&["replay", t, "--snapshot-out", "/no/such/dir/s.pickle"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--snapshot-out") && err.contains("does not exist"),
        "{err}"
    );
    // no temporary file is left anywhere
    let left: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
