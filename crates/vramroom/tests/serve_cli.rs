//! `vramroom serve` as a user runs it: one-line errors with exit 2, the bound address on
//! stdout, real answers, and SIGTERM draining to exit 0.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramroom"))
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    for args in [
        &["--model", "bert"][..],
        &["--device", "tpu"],
        &["--device", "cuda"],
        &["--capacity", "0"],
        &["--alloc-conf", "bogus:1"],
        &["--margin", "100%"],
        &["--max-batch", "0"],
        &["--max-wait", "soon"],
        &["--max-latency", "fast"],
        &["--workers", "0"],
        &["--model", "zoo-gpt-small", "--capacity", "1MiB"],
    ] {
        let out = bin()
            .arg("serve")
            .args(args)
            .args(["--port", "0"])
            .output()
            .expect("run vramroom");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    }
}

/// How long a test waits for the server's answer.
const ANSWER: Duration = Duration::from_secs(20);

fn http(addr: &str, req: &str) -> String {
    common::http(addr, req, ANSWER)
}

#[test]
fn serves_on_port_0_and_drains_on_sigterm() {
    let (mut child, url) = common::spawn_serve(&[
        "--model",
        "zoo-gpt-tiny",
        "--port",
        "0",
        "--max-wait",
        "1ms",
    ]);
    let health = http(
        &url,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains("\"model\":\"zoo-gpt-tiny\""), "{health}");
    let body = r#"{"inputs": [1, 2, 3]}"#;
    let answer = common::post_infer(&url, body, ANSWER);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"next_token\""), "{answer}");
    let err = sigterm_exit_0(&mut child, Duration::from_secs(30), "no exit after SIGTERM");
    assert!(
        err.contains("shutting down") && err.contains("drained"),
        "{err}"
    );
    assert!(
        TcpStream::connect(&url).is_err(),
        "still listening after exit"
    );
}

/// 50 slowloris connections and nothing queued: SIGTERM ends the server at once (it used
/// to wait out the whole drain timeout), and what it says is true: nothing was in flight.
#[test]
fn slowloris_connections_do_not_hold_sigterm() {
    let (mut child, url) = common::spawn_serve(&[
        "--model",
        "mlp-tiny",
        "--port",
        "0",
        "--drain-timeout",
        "31s",
    ]);
    let mut lorises = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(&url).expect("connect");
        s.write_all(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .unwrap();
        lorises.push(s);
    }
    std::thread::sleep(Duration::from_millis(300));
    let err = sigterm_exit_0(
        &mut child,
        Duration::from_secs(10),
        "SIGTERM waited on slowloris connections",
    );
    assert!(err.contains("no request was in flight"), "{err}");
    assert!(!err.contains("still queued"), "{err}");
}

/// A bad `--device` list is one line and exit 2, naming the bad entry.
#[test]
fn bad_device_lists_exit_2_naming_the_entry() {
    for (list, says) in [
        ("cuda:x", "\"cuda:x\""),
        ("cpu,,cpu", "empty entry (entry 2)"),
        ("cpu,", "empty entry (entry 2)"),
        ("tpu", "\"tpu\""),
        ("cpu,tpu", "\"tpu\""),
        ("cuda:0,cuda:0", "cuda:0 is listed twice"),
        ("cpu,cuda:0", "mixes cpu and cuda"),
    ] {
        let out = bin()
            .args([
                "serve", "--model", "mlp-tiny", "--port", "0", "--device", list,
            ])
            .output()
            .expect("run vramroom");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{list}: {err}");
        assert_eq!(err.lines().count(), 1, "{list}: {err}");
        assert!(err.starts_with("error: bad --device"), "{list}: {err}");
        assert!(err.contains(says), "{list}: {err}");
    }
}

fn get_body(url: &str, path: &str) -> String {
    let r = http(
        url,
        &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    );
    r.split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or(r)
}

/// SIGTERM, then the exit within `within` (else `what`): exit code 0; returns stderr.
fn sigterm_exit_0(child: &mut common::Killed, within: Duration, what: &str) -> String {
    let pid = child.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < within, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    err
}

/// `--device cpu,cpu`: two replicas, each announced, each in /healthz and /metrics.
#[test]
fn two_cpu_replicas_serve_and_show_in_healthz_and_metrics() {
    let (mut child, url) = common::spawn_serve(&[
        "--model",
        "mlp-tiny",
        "--port",
        "0",
        "--device",
        "cpu,cpu",
        "--capacity",
        "64MiB",
    ]);
    let health = get_body(&url, "/healthz");
    assert!(health.contains("\"device\":\"cpu:0,cpu:1\""), "{health}");
    assert!(
        health.contains("\"replicas\":[{\"device\":\"cpu:0\""),
        "{health}"
    );
    let body = format!("{{\"inputs\": [{}]}}", vec!["0.5"; 64].join(","));
    for _ in 0..4 {
        let answer = common::post_infer(&url, &body, ANSWER);
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let m = get_body(&url, "/metrics");
    for dev in ["cpu:0", "cpu:1"] {
        assert!(
            m.contains(&format!(
                "vramroom_memory_capacity_bytes{{device=\"{dev}\"}} {}",
                64 << 20
            )),
            "{m}"
        );
        // idle replicas take turns: four sequential requests, two each
        assert!(
            m.contains(&format!(
                "vramroom_replica_requests_total{{device=\"{dev}\"}} 2"
            )),
            "{m}"
        );
    }
    let err = sigterm_exit_0(&mut child, Duration::from_secs(30), "no exit after SIGTERM");
    assert!(
        err.contains("serving mlp-tiny on cpu:0") && err.contains("on cpu:1"),
        "{err}"
    );
    assert!(err.contains("drained"), "{err}");
}

/// `--device cuda:0` through the same replica code, on a machine with a GPU.
#[test]
#[ignore = "needs a CUDA GPU and driver: on one, cargo test -- --include-ignored"]
fn one_gpu_serves_through_the_replica_code() {
    if let Some(why) = vramroom_cuda::unavailable_reason() {
        panic!("asked to run without a GPU: {why}");
    }
    let (mut child, url) = common::spawn_serve(&[
        "--model",
        "zoo-gpt-tiny",
        "--port",
        "0",
        "--device",
        "cuda:0",
        "--capacity",
        "2GiB",
    ]);
    let health = get_body(&url, "/healthz");
    assert!(
        health.contains("\"replicas\":[{\"device\":\"cuda:0\""),
        "{health}"
    );
    let body = r#"{"inputs": [1, 2, 3]}"#;
    let answer = common::post_infer(&url, body, ANSWER);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let m = get_body(&url, "/metrics");
    assert!(
        m.contains("vramroom_replica_requests_total{device=\"cuda:0\"} 1"),
        "{m}"
    );
    assert!(m.contains("vramroom_num_ooms_total 0"), "{m}");
    sigterm_exit_0(&mut child, Duration::from_secs(30), "no exit after SIGTERM");
}
