//! `headroom serve` as a user runs it: one-line errors with exit 2, the bound address on
//! stdout, real answers, and SIGTERM draining to exit 0.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_headroom"))
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
        &["--model", "gpt2-small", "--capacity", "1MiB"],
    ] {
        let out = bin()
            .arg("serve")
            .args(args)
            .args(["--port", "0"])
            .output()
            .expect("run headroom");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    }
}

fn http(addr: &str, req: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the answer");
    out
}

#[test]
fn serves_on_port_0_and_drains_on_sigterm() {
    let (mut child, url) =
        common::spawn_serve(&["--model", "gpt2-tiny", "--port", "0", "--max-wait", "1ms"]);
    let health = http(
        &url,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.contains("\"model\":\"gpt2-tiny\""), "{health}");
    let body = r#"{"inputs": [1, 2, 3]}"#;
    let answer = http(
        &url,
        &format!(
            "POST /v1/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: \
             application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"next_token\""), "{answer}");
    let pid = child.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let mut err = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
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
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "SIGTERM waited on slowloris connections"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let mut err = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("no request was in flight"), "{err}");
    assert!(!err.contains("still queued"), "{err}");
}
