//! `vramroom http` as a user runs it, against loopback servers started here: the files
//! written, `--json`, exit codes 0, 2 (one line, no file), 99 (a broken threshold) and 130
//! (Ctrl-C, the report still written).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vramroom_load::http::server::{Reply, Seen, TestServer};

mod common;

use common::{bin, files_under, read_json};

fn scratch(name: &str) -> PathBuf {
    common::scratch("http-cli", name)
}

/// `vramroom ARGS` in `dir`, bounded to a minute.
fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    common::run_in_within(dir, args, Duration::from_secs(60))
}

fn ok_server() -> TestServer {
    TestServer::start(
        1,
        Arc::new(|_: &Seen| Reply::ok("ok").after(Duration::from_millis(2))),
    )
    .unwrap()
}

#[test]
fn a_run_writes_the_report_and_the_results() {
    let s = ok_server();
    let d = scratch("run");
    let url = s.url("/v1/x");
    let (code, out, err) = run_in(
        &d,
        &[
            "http",
            &url,
            "-c",
            "2",
            "-z",
            "600ms",
            "--no-nvml",
            "--quiet",
            "-d",
            "{\"n\": {{seq}}}",
        ],
    );
    assert_eq!(code, 0, "stdout {out}\nstderr {err}");
    assert!(out.starts_with("vramroom http: POST"), "{out}");
    assert!(out.contains("status codes   200:"), "{out}");
    let dir = d.join("out/http");
    for f in ["results.json", "report.html"] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let v = read_json(&dir.join("results.json"));
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["scenario"]["kind"], "http");
    assert_eq!(v["http"]["model"], "closed");
    assert_eq!(v["http"]["method"], "POST");
    assert!(v["requests"]["ok"].as_u64().unwrap() > 20);
    assert_eq!(v["requests"]["ok"], v["http"]["status_codes"]["200"]);
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("id=\"plot-status\"") && html.contains("Vramroom HTTP load test"));
    assert!(!files_under(&dir).iter().any(|p| p
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with('.')));
}

#[test]
fn json_open_model_and_request_count() {
    let s = ok_server();
    let d = scratch("json");
    let url = s.url("/");
    let (code, out, err) = run_in(
        &d,
        &[
            "http",
            &url,
            "-q",
            "200",
            "-z",
            "500ms",
            "--no-nvml",
            "--quiet",
            "--json",
            "--out",
            "o",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("stdout is the JSON");
    assert_eq!(v["http"]["model"], "open");
    let n = v["requests"]["total"].as_u64().unwrap();
    assert!((97..=103).contains(&n), "{n}");
    assert_eq!(v["http"]["latency_correction"], "intended_send_time");
    let (code, out, err) = run_in(
        &d,
        &[
            "http",
            &url,
            "-n",
            "37",
            "-c",
            "3",
            "--no-nvml",
            "--quiet",
            "--json",
            "--out",
            "o",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["requests"]["total"], 37);
    assert_eq!(s.requests(), n + 37);
}

#[test]
fn a_broken_threshold_exits_99_and_still_writes_the_report() {
    let s = ok_server();
    let d = scratch("t99");
    let url = s.url("/");
    let (code, out, err) = run_in(
        &d,
        &[
            "http",
            &url,
            "-n",
            "30",
            "--no-nvml",
            "--quiet",
            "--out",
            "o",
            "--threshold",
            "p99<1us",
            "--threshold",
            "error_rate<1%",
        ],
    );
    assert_eq!(code, 99, "stdout {out}\nstderr {err}");
    assert!(err.contains("p99<1us"), "{err}");
    let v = read_json(&d.join("o/results.json"));
    let t = v["thresholds"].as_array().unwrap();
    assert_eq!(t[0]["passed"], false);
    assert_eq!(t[1]["passed"], true);
    assert!(d.join("o/report.html").is_file());
    let (code, _, err) = run_in(
        &d,
        &[
            "http",
            &url,
            "-n",
            "30",
            "--no-nvml",
            "--quiet",
            "--out",
            "o2",
            "--threshold",
            "p99<60s",
            "--threshold",
            "shed==0",
        ],
    );
    assert_eq!(code, 0, "{err}");
}

#[test]
fn bad_input_exits_2_with_one_line_and_no_files() {
    let s = ok_server();
    let url = s.url("/");
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}/", l.local_addr().unwrap().port())
    };
    let metrics_dead = format!("{dead}metrics");
    let cases: Vec<Vec<&str>> = vec![
        vec![&dead],
        vec!["https://127.0.0.1:1/"],
        vec!["not a url"],
        vec!["http://no-such-host.invalid/"],
        vec![&url, "-c", "0"],
        vec![&url, "-n", "0"],
        vec![&url, "-q", "fast"],
        vec![&url, "-z", "soon"],
        vec![&url, "--stages", "2:1s,100/s:1s"],
        vec![&url, "--stages", "x:1s"],
        vec![&url, "--threshold", "p99<<2"],
        vec![&url, "--threshold", "nosuch<2"],
        vec![&url, "--timeout", "0s"],
        vec![&url, "--arrival", "bursty"],
        vec![&url, "-H", "no colon"],
        vec![&url, "-m", "GE T"],
        vec![&url, "-d", "{{nope}}"],
        vec![&url, "--body-file", "/no/such/file"],
        vec![&url, "--body-size", "uniform:9..3"],
        vec![&url, "--metrics-url", &metrics_dead],
        vec![&url, "--metric", "allocated=x"],
        vec![&url, "--what-if", "bogus:1"],
    ];
    for case in cases {
        let d = scratch("bad");
        let mut a = vec!["http"];
        a.extend(case.iter().copied());
        a.extend(["--out", "o", "-z", "200ms", "--no-nvml"]);
        // -z twice is clap's own usage error; the cases that set -z replace it.
        if case.contains(&"-z") || case.contains(&"--stages") {
            a.truncate(a.len() - 3);
            a.push("--no-nvml");
        }
        let (code, out, err) = run_in(&d, &a);
        assert_eq!(code, 2, "{case:?}: stdout {out} stderr {err}");
        let lines: Vec<&str> = err.trim().lines().collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("error"),
            "{case:?}: not one clear line: {err}"
        );
        let left = files_under(&d);
        assert!(left.is_empty(), "{case:?} left files: {left:?}");
    }
    // A dead URL says what is wrong.
    let d = scratch("dead");
    let (_, _, err) = run_in(&d, &["http", &dead, "--no-nvml"]);
    assert!(err.contains("connection refused"), "{err}");
    // --out that is a file.
    let d = scratch("outfile");
    std::fs::write(d.join("o"), "x").unwrap();
    let (code, _, err) = run_in(&d, &["http", &url, "-n", "3", "--out", "o", "--no-nvml"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(files_under(&d).len(), 1);
}

#[test]
fn ctrl_c_exits_130_with_the_report_of_what_was_measured() {
    let s = ok_server();
    let d = scratch("sigint");
    let url = s.url("/");
    let mut child = bin()
        .args([
            "http",
            &url,
            "-c",
            "2",
            "-z",
            "30s",
            "--no-nvml",
            "--quiet",
            "--out",
            "o",
        ])
        .current_dir(&d)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t = Instant::now();
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("vramroom http did not stop after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(130));
    let v = read_json(&d.join("o/results.json"));
    assert_eq!(v["stop_reason"], "cancelled");
    assert!(v["requests"]["ok"].as_u64().unwrap() > 10);
    assert!(d.join("o/report.html").is_file());
}

/// Every request failed (500s, timeouts, 503s): the report is written, but the run exits 1
/// with one line that says what happened, instead of passing as 0.
#[test]
fn no_successful_request_exits_1_with_a_message() {
    let cases: Vec<(TestServer, Vec<&str>, &str)> = vec![
        (
            TestServer::start(1, Arc::new(|_: &Seen| Reply::status(500))).unwrap(),
            vec!["-n", "20"],
            "status_500",
        ),
        (
            TestServer::start(
                1,
                Arc::new(|_: &Seen| Reply::ok("late").after(Duration::from_millis(800))),
            )
            .unwrap(),
            vec!["-n", "4", "-c", "2", "--timeout", "50ms"],
            "timeout",
        ),
        (
            TestServer::start(1, Arc::new(|_: &Seen| Reply::status(503))).unwrap(),
            vec!["-n", "10"],
            "shed (503)",
        ),
    ];
    for (i, (s, extra, says)) in cases.into_iter().enumerate() {
        let d = scratch(&format!("nosuccess{i}"));
        let url = s.url("/");
        let mut args = vec!["http", url.as_str(), "--no-nvml", "--quiet", "--out", "o"];
        args.extend(extra);
        let (code, out, err) = run_in(&d, &args);
        assert_eq!(code, 1, "{says}: stdout {out}\nstderr {err}");
        let last = err.lines().last().unwrap_or("");
        assert!(last.starts_with("no request succeeded: 0 of"), "{err}");
        assert!(last.contains(says), "{says}: {err}");
        let v = read_json(&d.join("o/results.json"));
        assert_eq!(v["requests"]["ok"], 0);
        assert!(d.join("o/report.html").is_file());
    }
    // one success is enough for 0
    let s = TestServer::start(
        1,
        Arc::new(|seen: &Seen| {
            if seen.seq == 0 {
                Reply::ok("ok")
            } else {
                Reply::status(500)
            }
        }),
    )
    .unwrap();
    let d = scratch("onesuccess");
    let url = s.url("/");
    let (code, _, err) = run_in(
        &d,
        &["http", &url, "-n", "5", "-c", "1", "--no-nvml", "--quiet"],
    );
    assert_eq!(code, 0, "{err}");
}
