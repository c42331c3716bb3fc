//! Issue #6's acceptance test, on loopback: `vramroom http` against `vramroom serve` with a
//! ramp to 4× the safe concurrency. The server sheds some requests with 503, never runs out
//! of memory and never crashes; the p99 of the admitted requests keeps serve's promise (1.5×
//! the unloaded p99 plus the measured compute of two full batches: the one a request may wait
//! behind, and the overrun of a batch that runs slower than the fit, which cannot be
//! preempted; see the scheduler's design note); a few clients (`-c 4`) of this CPU-speed model
//! are served, not shed; and the report's timeline shows allocated memory below the capacity
//! throughout.
//!
//! The unloaded run lasts as long as the ramp (4 s at one worker): a p99 of 100 requests is
//! one sample's luck, and both runs should be exposed alike to the machine's own stalls.
//!
//! Bounded: the server starts in seconds, the unloaded run is 4 s, the safe
//! concurrency is found with three 0.8 s probes, the ramp is 4 s and capped at 200 000
//! requests (503s are cheap: a fast machine answers tens of thousands a second), and every
//! child process is killed on drop.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramroom"))
}

/// `vramroom serve` on a free port; killed on drop.
struct Serve {
    child: Child,
    url: String,
}

impl Serve {
    fn start() -> Serve {
        let mut child = bin()
            .args([
                "serve",
                "--model",
                "zoo-gpt-small",
                "--port",
                "0",
                "--workers",
                "1",
                "--capacity",
                "128MiB",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start vramroom serve");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(u) = l.strip_prefix("listening on ") {
                    let _ = tx.send(u.trim().to_string());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(u) => u,
            Err(_) => {
                let _ = child.kill();
                panic!("vramroom serve did not say where it listens within 120 s");
            }
        };
        Serve { child, url }
    }
    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scratch() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("http-serve")
        .join(format!("{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// GPT-2 requests of 16 token ids, the shape serve batches together.
const BODY: &str = "{\"inputs\": [[{{rand_ints 16 0 999}}]]}";

/// `vramroom http ARGS --json` in `dir`: the results.
fn load(dir: &Path, url: &str, args: &[&str]) -> serde_json::Value {
    let t = Instant::now();
    let mut cmd = bin();
    // The client runs niced: the property under test is the server's, and on a small CI
    // machine a client sending tens of thousands of requests a second to be shed otherwise
    // takes the core the admitted batch waits for (a load generator normally has its own
    // host). Both the unloaded and the ramp runs are niced alike.
    // SAFETY: setpriority is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::setpriority(libc::PRIO_PROCESS, 0, 10);
            Ok(())
        });
    }
    let out = cmd
        .args([
            "http",
            url,
            "-d",
            BODY,
            "--threads",
            "1",
            "--no-nvml",
            "--quiet",
            "--json",
        ])
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run vramroom http");
    assert!(
        t.elapsed() < Duration::from_secs(90),
        "{args:?}: {:?}",
        t.elapsed()
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).expect("results JSON on stdout")
}

/// The body of `GET url` (HTTP/1.0 on loopback: no chunked encoding to undo).
fn get(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = std::net::TcpStream::connect(host).expect("connect to serve");
    write!(s, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

#[test]
fn http_ramp_against_serve_sheds_with_503_and_keeps_admitted_latency() {
    let mut serve = Serve::start();
    let infer = format!("{}/v1/infer", serve.url);
    let metrics = format!("{}/metrics", serve.url);
    let d = scratch();

    // Unloaded: one request at a time, for as long as the ramp.
    let unloaded = load(&d, &infer, &["-c", "1", "-z", "4s", "--out", "unloaded"]);
    assert_eq!(u(&unloaded["http"]["shed"]), 0, "shed unloaded");
    assert!(u(&unloaded["requests"]["ok"]) >= 50, "{unloaded}");
    let p99_unloaded = unloaded["latency"]["p99_ms"].as_f64().unwrap();

    // Four clients of a model served at CPU speed are served, not shed: the auto latency
    // target allows the batch a request arrives behind (measured before it did: 99.95% of
    // `-c 4` shed with memory at 3% of the capacity).
    let four = load(&d, &infer, &["-c", "4", "-z", "2s", "--out", "four"]);
    let (ok4, shed4) = (u(&four["requests"]["ok"]), u(&four["http"]["shed"]));
    assert!(
        shed4 * 10 < ok4 + shed4,
        "-c 4: {shed4} of {} shed",
        ok4 + shed4
    );

    // The safe concurrency: the most workers the server admits every request of.
    let mut safe = 1;
    for c in [2usize, 3, 4] {
        let r = load(
            &d,
            &infer,
            &["-c", &c.to_string(), "-z", "800ms", "--out", "probe"],
        );
        if u(&r["http"]["shed"]) > 0 {
            break;
        }
        safe = c;
    }

    // The ramp: safe, 2× safe, 4× safe, with the server's memory scraped on the way.
    let stages = format!("{}:1s,{}:1s,{}:2s", safe, 2 * safe, 4 * safe);
    let r = load(
        &d,
        &infer,
        &[
            "--stages",
            &stages,
            "-n",
            "200000",
            "--metrics-url",
            &metrics,
            "--metrics-interval",
            "100ms",
            "--out",
            "ramp",
        ],
    );
    let h = &r["http"];
    let summary = format!(
        "safe concurrency {safe}, unloaded p99 {p99_unloaded:.2} ms (max {:.2} ms, {} requests); \
         ramp {stages}: {} ok, {} shed, {} errors, admitted p99 {:.2} ms (uncorrected {:.2} ms, \
         max {:.2} ms), status {}",
        unloaded["latency"]["max_ms"].as_f64().unwrap_or(0.0),
        unloaded["requests"]["ok"],
        r["requests"]["ok"],
        h["shed"],
        r["requests"]["other_errors"],
        r["latency"]["p99_ms"].as_f64().unwrap_or(0.0),
        h["latency_uncorrected"]["p99_ms"].as_f64().unwrap_or(0.0),
        h["latency_uncorrected"]["max_ms"].as_f64().unwrap_or(0.0),
        h["status_codes"]
    );
    println!("{summary}");

    // Load was shed, nothing failed, nothing ran out of memory, the server lives on.
    assert!(
        u(&h["shed"]) > 0,
        "no 503 at 4x the safe concurrency: {summary}"
    );
    assert_eq!(u(&r["requests"]["other_errors"]), 0, "{summary}");
    assert_eq!(h["service_ooms"], 0, "{summary}");
    assert_eq!(u(&r["errors"]["oom"]), 0);
    assert!(serve.alive(), "vramroom serve died under the ramp");

    // Admitted requests keep serve's promise: within 1.5x their unloaded latency plus two
    // full batches of the server's own measured compute (its quiet fit, as /metrics says it:
    // 8 samples of 16 tokens, the default --max-batch and this body's length). Measured on
    // two busy cores: 23.0 ms against 1.5 x 8.1 + 9.3 for one batch, which the target aims
    // at; the second batch is the compute that ran slower than the fit.
    let text = get(&metrics);
    let gauge = |term: &str| {
        let key = format!("vramroom_compute_model_seconds{{fit=\"quiet\",term=\"{term}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {key} in /metrics"))
    };
    let batch_ms = 1e3 * (gauge("fixed") + gauge("per_unit") * (8.0 * 16.0));
    let p99 = r["latency"]["p99_ms"].as_f64().unwrap();
    assert!(
        p99 < 1.5 * p99_unloaded + 2.0 * batch_ms,
        "admitted p99 {p99:.2} ms is over 1.5x the unloaded p99 {p99_unloaded:.2} ms plus two \
         batches of {batch_ms:.2} ms: {summary}"
    );

    // The timeline: allocated memory, on the load's clock, below the capacity throughout.
    let cap = u(&r["capacity_bytes"]);
    assert_eq!(cap, 128 << 20);
    let series: Vec<&str> = h["memory_series"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    assert!(
        series.contains(&"allocated") && series.contains(&"capacity"),
        "{series:?}"
    );
    let tl = r["timeline"].as_array().unwrap();
    assert!(tl.len() >= 10, "{} samples", tl.len());
    for s in tl {
        let a = u(&s["allocated_bytes"]);
        assert!(
            a > 0 && a < cap,
            "allocated {a} at t={} vs capacity {cap}",
            s["t_s"]
        );
    }
    let ramp = d.join("ramp");
    let html = std::fs::read_to_string(ramp.join("report.html")).unwrap();
    assert!(html.contains("id=\"plot-timeline\"") && html.contains("stage 3"));
    assert!(ramp.join("results.json").is_file());
}
