//! `vramroom loadtest` and `vramroom claims` as a user runs them: exit codes (0, 2, 99,
//! 130), the files written, and no file at all on bad input.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{bin, files_under, read_json, run_in};

fn scratch(name: &str) -> PathBuf {
    common::scratch("loadtest-cli", name)
}

/// A fast run: the meta device, a fixed number of requests, no OOM search.
const FAST: [&str; 8] = [
    "loadtest",
    "--device",
    "meta",
    "-n",
    "12",
    "-c",
    "2",
    "--no-search",
];

#[test]
fn broken_threshold_exits_99_and_still_writes_the_report() {
    let d = scratch("t99");
    let mut a: Vec<&str> = FAST.to_vec();
    a.extend([
        "--threshold",
        "peak_reserved<1KiB",
        "--threshold",
        "oom_count==0",
        "--out",
        "o",
        "--quiet",
    ]);
    let (code, out, err) = run_in(&d, &a);
    assert_eq!(code, 99, "stdout: {out}\nstderr: {err}");
    assert!(err.contains("peak_reserved<1KiB"), "{err}");
    assert!(out.contains("FAIL"), "{out}");
    let v = read_json(&d.join("o/results.json"));
    let t = v["thresholds"].as_array().unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(t[0]["passed"], false);
    assert_eq!(t[1]["passed"], true);
    assert!(d.join("o/report.html").is_file());
}

#[test]
fn thresholds_that_hold_exit_0() {
    let d = scratch("t0");
    let mut a: Vec<&str> = FAST.to_vec();
    a.extend([
        "--threshold",
        "peak_reserved<100GiB",
        "--threshold",
        "p99<60s",
        "--threshold",
        "oom_count==0",
        "--out",
        "o",
        "--quiet",
    ]);
    let (code, out, err) = run_in(&d, &a);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let v = read_json(&d.join("o/results.json"));
    assert!(v["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .all(|t| t["passed"] == true));
}

#[test]
fn bad_arguments_exit_2_with_one_line_and_no_files() {
    let cases: &[&[&str]] = &[
        &["--model", "resnet9000"],
        &["--stages", "1:10s,4:"],
        &["--stages", "x:10s"],
        &["--stages", "0:10s"],
        &["--threshold", "peak_reserved<<6GiB"],
        &["--threshold", "nosuchmetric<3"],
        &["--threshold", "p99<fast"],
        &["--capacity", "0"],
        &["--capacity", "0GiB"],
        &["--capacity", "huge"],
        &["-c", "0"],
        &["-n", "0"],
        &["-z", "soon"],
        &["--device", "tpu"],
        &["--alloc-conf", "no_such_key:1"],
        &["--seq", "uniform:9..3"],
        &["--mode", "serve"],
        &["--stages", "1:1s", "-c", "2"],
        &["--batch", "0"],
    ];
    for case in cases {
        let d = scratch("bad");
        let mut a = vec!["loadtest", "--out", "o"];
        a.extend_from_slice(case);
        let (code, out, err) = run_in(&d, &a);
        assert_eq!(code, 2, "{case:?}: stdout {out} stderr {err}");
        assert!(
            err.trim_start().starts_with("error"),
            "{case:?}: no clear error: {err}"
        );
        let left = files_under(&d);
        assert!(left.is_empty(), "{case:?} left files: {left:?}");
    }
}

#[test]
fn out_that_is_a_file_is_a_usage_error() {
    let d = scratch("outfile");
    std::fs::write(d.join("o"), "x").unwrap();
    let mut a: Vec<&str> = FAST.to_vec();
    a.extend(["--out", "o"]);
    let (code, _out, err) = run_in(&d, &a);
    assert_eq!(code, 2, "{err}");
    assert_eq!(files_under(&d).len(), 1);
}

#[test]
fn a_model_bigger_than_the_default_card_is_told_to_give_a_capacity() {
    let d = scratch("bigmodel");
    let (code, _out, err) = run_in(&d, &["loadtest", "--model", "gpt2", "--out", "o"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("need 474.70 MiB") && err.contains("--capacity"),
        "{err}"
    );
    assert!(files_under(&d).is_empty(), "nothing is written");
}

#[test]
fn default_scenario_on_cpu_writes_every_output() {
    // The default scenario, model and device, shortened with -z (the full default runs its
    // three stages; the README's main command is that one).
    let d = scratch("default");
    let t = Instant::now();
    let (code, out, err) = run_in(&d, &["loadtest", "-z", "2s", "-c", "2"]);
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(secs < 60.0, "took {secs:.1}s");
    let dir = d.join("out/loadtest");
    for f in ["report.html", "results.json", "snapshot.pickle"] {
        let p = dir.join(f);
        assert!(p.is_file(), "{f} missing");
        assert!(std::fs::metadata(&p).unwrap().len() > 100, "{f} is empty");
    }
    // No temporary file is left beside them.
    let names: Vec<String> = files_under(&dir)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
    // The summary table: a stage row, the peaks line.
    assert!(
        out.contains("stage") && out.contains("peak reserved"),
        "{out}"
    );
    let v = read_json(&dir.join("results.json"));
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["scenario"]["name"], "default");
    assert!(v["requests"]["ok"].as_u64().unwrap() > 0);
    assert!(!v["timeline"].as_array().unwrap().is_empty());
    assert!(v["peaks"]["reserved_bytes"].as_u64().unwrap() > 0);
    assert!(
        v["oom_search"].is_object(),
        "the default run searches for the OOM point"
    );
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), 5);
    assert!(!html.contains("<script"));
    // The snapshot is PyTorch's format: Vramroom's own reader takes it back.
    let snap = vramroom_trace::read_snapshot_file(&dir.join("snapshot.pickle")).expect("pickle");
    assert!(!snap.segments.is_empty() || !snap.device_traces.is_empty());
}

#[test]
fn json_flag_prints_the_results_on_stdout() {
    let d = scratch("json");
    let mut a: Vec<&str> = FAST.to_vec();
    a.extend(["--json", "--out", "o", "--quiet"]);
    let (code, out, err) = run_in(&d, &a);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("stdout is JSON");
    assert_eq!(v["device"], "meta");
    assert_eq!(v["requests"]["total"], 12);
    assert_eq!(v, read_json(&d.join("o/results.json")));
}

#[test]
fn planted_mistake_flags_reach_the_scenario() {
    let d = scratch("mistakes");
    let (code, _out, err) = run_in(
        &d,
        &[
            "loadtest",
            "--device",
            "meta",
            "--model",
            "zoo-gpt-tiny",
            "-n",
            "6",
            "--grad-on",
            "--keep-outputs",
            "--named-temporaries",
            "--no-search",
            "--json",
            "--quiet",
            "--out",
            "o",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let v = read_json(&d.join("o/results.json"));
    let m = &v["scenario"]["mistakes"];
    assert_eq!(m["grad_at_inference"], true);
    assert_eq!(m["keep_outputs"], true);
    assert_eq!(m["named_temporaries"], true);
    assert_eq!(m["sum_losses"], false);
    assert_eq!(v["scenario"]["model"], "zoo-gpt-tiny");
}

#[cfg(unix)]
#[test]
fn ctrl_c_still_writes_the_report_of_what_was_measured() {
    let d = scratch("ctrlc");
    let mut child = bin()
        .args(["loadtest", "-z", "120s", "-c", "2", "--quiet", "--out", "o"])
        .current_dir(&d)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vramroom");
    // Let it measure something, then interrupt it as a terminal's Ctrl-C would.
    std::thread::sleep(Duration::from_millis(2500));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(st.success());
    let t = Instant::now();
    let out = loop {
        if let Some(_s) = child.try_wait().unwrap() {
            break child.wait_with_output().unwrap();
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("vramroom did not stop within 60 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let v = read_json(&d.join("o/results.json"));
    assert_eq!(v["stop_reason"], "cancelled");
    assert!(v["requests"]["total"].as_u64().unwrap() > 0);
    assert!(v["wall_s"].as_f64().unwrap() < 60.0);
    assert!(d.join("o/report.html").is_file());
    assert!(d.join("o/snapshot.pickle").is_file());
}

#[test]
fn claims_prints_a_verdict_per_claim() {
    let d = scratch("claims");
    let (code, out, err) = run_in(&d, &["claims", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let claims = v["claims"].as_array().expect("claims");
    for c in claims {
        assert!(!c["verdict"].as_str().unwrap_or("").is_empty(), "{c}");
        assert!(!c["numbers"].as_array().unwrap().is_empty(), "{c}");
    }
    let (code, text, err) = run_in(&d, &["claims"]);
    assert_eq!(code, 0, "{err}");
    for c in claims {
        assert!(text.contains(c["claim"].as_str().unwrap()), "{text}");
    }
    assert!(files_under(&d).is_empty(), "claims writes no file");
}

#[test]
fn claims_agree_only_when_every_row_agrees() {
    let d = scratch("claims-agree");
    let (code, text, err) = run_in(&d, &["claims"]);
    assert_eq!(code, 0, "{err}");
    let mut agreeing = 0;
    for block in text
        .split("\n\n")
        .filter(|b| b.contains("agrees with PyTorch"))
    {
        let rows_say_no = block
            .lines()
            .any(|l| l.trim_end().ends_with(" no") && !l.contains("agrees with"));
        let says_yes = block.contains("agrees with PyTorch's measurements: yes");
        assert_eq!(says_yes, !rows_say_no, "{block}");
        agreeing += says_yes as usize;
    }
    assert!(
        text.contains(&format!("{agreeing} of 5 agree")),
        "the summary must count the claims whose every row agrees ({agreeing}):\n{text}"
    );
}

#[test]
fn over_capacity_run_blames_demand_and_the_what_if_agrees() {
    // 32 zoo-gpt-small workers on 128 MiB: about 160 MiB of demand.
    let d = scratch("over-capacity");
    let (code, out, err) = run_in(
        &d,
        &[
            "loadtest",
            "--device",
            "meta",
            "-c",
            "32",
            "-z",
            "1s",
            "--capacity",
            "128MiB",
            "--quiet",
            "--out",
            "o",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("[CRITICAL] The load needs more memory than the device has (out_of_memory)"),
        "{out}"
    );
    assert!(!out.contains("[CRITICAL] The caching allocator"), "{out}");
    assert!(
        out.contains("what if: replayed from the run log") && out.contains("agrees with the run"),
        "{out}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("o/results.json")).unwrap()).unwrap();
    assert_eq!(v["what_if_check"]["agrees"], true, "{}", v["what_if_check"]);
    assert_eq!(
        v["what_if"][0]["num_ooms"],
        v["final_memory_stats"]["num_ooms"]
    );
}
