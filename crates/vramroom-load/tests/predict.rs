//! `vramroom http --predict` and `--ramp-until-oom` against services that really run out of
//! memory, with no GPU:
//! - scripts/services/fake_service.py on the torch stub (tests/fixtures/torch_stub), whose
//!   allocator refuses past its memory fraction as PyTorch's does: 64 MiB of "weights" and
//!   40 MiB per request in a 484 MiB cap, so it runs out at 11 requests in flight. The run
//!   reads the real capacity from the probe (not the stub card's 80 GiB), predicts from a
//!   gentle run, and the ramp stops at the first OOM, whose 507 answers count as OOMs and
//!   whose probe counter rises;
//! - Vramroom's loopback server answering 500 with PyTorch's OOM message: counted as OOMs,
//!   and the ramp stops there.
//!
//! Skips (saying why) when python3 is not installed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use vramroom_load::http::load::{Stage, StageLoad};
use vramroom_load::http::predict::{PredictOptions, DEFAULT_RAMP};
use vramroom_load::http::server::{Reply, Seen, TestServer};
use vramroom_load::http::{self, HttpConfig};
use vramroom_load::StopReason;

const MIB: u64 = 1 << 20;
const CAP: u64 = 484 * MIB;

fn python() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Fake {
    child: Child,
    port: u16,
    probe: u16,
}

impl Fake {
    fn start() -> Option<Fake> {
        let Some(py) = python() else {
            println!("SKIPPED: python3 is not on PATH");
            return None;
        };
        let (port, probe) = (free_port(), free_port());
        let pythonpath = std::env::join_paths([
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_stub"),
            repo().join("python"),
        ])
        .unwrap();
        let fraction = CAP as f64 / (80u64 << 30) as f64;
        let mut child = Command::new(py)
            .arg(repo().join("scripts/services/fake_service.py"))
            .args([
                "--port",
                &port.to_string(),
                "--probe-port",
                &probe.to_string(),
            ])
            .args(["--fraction", &format!("{fraction:.17}")])
            .env("PYTHONPATH", pythonpath)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("PYTORCH_CUDA_ALLOC_CONF")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "the fake service did not start");
        Some(Fake { child, port, probe })
    }

    fn cfg(&self, stages: Vec<Stage>) -> HttpConfig {
        let mut c = HttpConfig::new(format!("http://127.0.0.1:{}/infer", self.port));
        c.stages = stages;
        c.method = Some("POST".into());
        c.body.template = Some("{\"k\": 2}".into());
        c.metrics_url = Some(format!("http://127.0.0.1:{}/metrics", self.probe));
        c.metrics_interval = Duration::from_millis(50);
        c.threads = 2;
        c.timeout = Duration::from_secs(10);
        c
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn no_stop() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

/// `--ramp-until-oom` against a loopback test server (no probe).
fn loopback_ramp(s: &TestServer, step: Duration) -> HttpConfig {
    let mut c = HttpConfig::new(s.url("/"));
    c.stages = ramp(step);
    c.stop_at_first_oom = true;
    c.probe = false;
    c.threads = 2;
    c
}

fn ramp(step: Duration) -> Vec<Stage> {
    DEFAULT_RAMP[..8]
        .iter()
        .map(|&c| Stage::held(StageLoad::Workers(c as usize), Some(step)))
        .collect()
}

#[test]
fn predict_from_a_gentle_run_then_the_ramp_confirms_it() {
    let Some(svc) = Fake::start() else { return };
    // Gentle: one request at a time, 30 requests.
    let mut c = svc.cfg(vec![Stage::held(StageLoad::Workers(1), None)]);
    c.max_requests = Some(30);
    c.predict = Some(PredictOptions {
        target_concurrency: Some(8),
        seeds: 3,
        ..Default::default()
    });
    let g = http::run(&c, no_stop(), |_| {}).unwrap();
    assert_eq!(g.requests.ok, 30);
    // The run's capacity is the service's (its fraction), not the stub card's 80 GiB.
    assert!(
        g.capacity_bytes.abs_diff(CAP) <= 1,
        "capacity {}",
        g.capacity_bytes
    );
    let p = g.http.as_ref().unwrap().prediction.as_ref().unwrap();
    assert_eq!(p.devices.len(), 1, "{p:?}");
    let d = &p.devices[0];
    assert!(d.tagged && d.requests >= 30, "{d:?}");
    assert!(d.limit_bytes.abs_diff(CAP) <= 1);
    // 64 MiB + 40 MiB per request under 484 MiB: 10 fit, the 11th does not.
    assert_eq!(p.first_oom_concurrency, Some(11), "{p:?}");
    let cap = d.size_cap.as_ref().unwrap();
    assert_eq!(
        (cap.max_size, cap.unit.as_deref()),
        (Some(2), Some("items"))
    );
    // Every request costs the same 40 MiB.
    assert!(d
        .attribution
        .points
        .iter()
        .all(|q| q.peak_bytes == 40 * MIB));

    // The ramp, on the same service: it stops at the first OOM and compares.
    let mut c = svc.cfg(ramp(Duration::from_millis(1500)));
    c.stop_at_first_oom = true;
    let t0 = std::time::Instant::now();
    let r = http::run(&c, no_stop(), |_| {}).unwrap();
    assert_eq!(r.stop_reason, StopReason::OomFound);
    let o = r
        .http
        .as_ref()
        .unwrap()
        .prediction
        .as_ref()
        .unwrap()
        .observed
        .clone()
        .unwrap();
    // 12 workers have 11 or more in flight at once unless the threads' timing keeps some
    // apart: the first OOM is at 12, or at 16 on a loaded machine.
    let first = o.first_oom_concurrency.unwrap();
    assert!(first == 12 || first == 16, "{o:?}");
    assert!(o.last_ok_concurrency.unwrap() >= 8);
    // It stopped at that step: the later ones never ran.
    assert_eq!(r.stages.last().unwrap().concurrency as u32, first);
    assert!(t0.elapsed() < Duration::from_secs(15));
    // The 507 answers name a CUDA OOM: they are OOMs, not "other errors".
    assert!(r.requests.oom > 0, "{:?}", r.requests);
    assert_eq!(r.requests.other_errors, 0, "{:?}", r.requests);
    // The probe's own counter rose with them.
    assert!(
        r.http.as_ref().unwrap().service_ooms.unwrap_or(0) > 0,
        "the probe's OOM counter did not rise"
    );
    let mut o2 = o.clone();
    o2.compare(p.first_oom_concurrency);
    assert_eq!(o2.agrees, Some(true), "{o2:?}");
}

#[test]
fn a_500_naming_a_cuda_oom_is_an_oom_and_ends_the_ramp() {
    let s = TestServer::start(
        2,
        Arc::new(|seen: &Seen| {
            if seen.in_flight > 3 {
                Reply {
                    status: 500,
                    body: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
                        .into(),
                    ..Reply::ok("")
                }
            } else if seen.in_flight == 3 {
                Reply::status(500).after(Duration::from_millis(5))
            } else {
                Reply::ok("ok").after(Duration::from_millis(5))
            }
        }),
    )
    .unwrap();
    let c = loopback_ramp(&s, Duration::from_millis(400));
    let r = http::run(&c, no_stop(), |_| {}).unwrap();
    assert_eq!(r.stop_reason, StopReason::OomFound);
    assert!(r.requests.oom > 0);
    // More than 3 in flight first happens at 4 workers: the ramp ends in that step.
    let last = r.stages.last().unwrap();
    assert_eq!(last.concurrency, 4);
    // Below it nothing failed.
    assert!(r.stages[..r.stages.len() - 1]
        .iter()
        .all(|st| st.requests.oom == 0 && st.requests.other_errors == 0));
}

/// A `generate()` service: each request takes longer the more are in flight (the GPU and
/// the GIL are shared), and one sent with more than 6 in flight runs out of memory, which
/// it only says when it is done.
fn slow_generate(seen: &Seen) -> Reply {
    let took = Duration::from_millis(150 * seen.in_flight as u64);
    if seen.in_flight > 6 {
        Reply {
            status: 500,
            body: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB".into(),
            ..Reply::ok("")
        }
        .after(took)
    } else {
        Reply::ok("ok").after(took)
    }
}

#[test]
fn a_ramp_step_is_held_until_its_own_slow_answers_are_back() {
    let s = TestServer::start(2, Arc::new(slow_generate)).unwrap();
    // Steps far shorter than a request at 8 in flight (1.2 s): without the hold the ramp
    // would be at 24 workers before any answer sent at 8 came back.
    let mut c = loopback_ramp(&s, Duration::from_millis(200));
    c.timeout = Duration::from_secs(10);
    let r = http::run(&c, no_stop(), |_| {}).unwrap();
    assert_eq!(r.stop_reason, StopReason::OomFound, "{:?}", r.stages);
    let last = r.stages.last().unwrap();
    // 8 workers are the first step with more than 6 in flight; it is where the ramp ends,
    // and no later step (more workers) ever ran.
    assert_eq!(last.concurrency, 8, "{:?}", r.stages);
    assert!(last.requests.oom > 0);
    assert!(r.stages[..r.stages.len() - 1]
        .iter()
        .all(|st| st.requests.oom == 0 && st.requests.ok > 0));
}

#[test]
fn a_ramp_whose_step_gets_no_answer_stops_as_saturated() {
    // From 4 in flight on, the service answers nothing within the client's timeout.
    let s = TestServer::start(
        2,
        Arc::new(|seen: &Seen| {
            if seen.in_flight >= 4 {
                Reply::ok("late").after(Duration::from_secs(5))
            } else {
                Reply::ok("ok").after(Duration::from_millis(5))
            }
        }),
    )
    .unwrap();
    let mut c = loopback_ramp(&s, Duration::from_millis(200));
    c.timeout = Duration::from_millis(600);
    let t0 = std::time::Instant::now();
    let r = http::run(&c, no_stop(), |_| {}).unwrap();
    assert_eq!(r.stop_reason, StopReason::Saturated, "{:?}", r.stages);
    assert_eq!(r.requests.oom, 0);
    // It stopped at the first step with nothing answered (4 or 6 workers), not at the end
    // of the ramp.
    let last = r.stages.last().unwrap().concurrency;
    assert!(last == 4 || last == 6, "{:?}", r.stages);
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn oom_messages_are_recognised_in_error_bodies() {
    use vramroom_load::http::client::body_names_oom;
    assert!(body_names_oom(
        b"{\"error\": \"CUDA out of memory. Tried to allocate 20.00 MiB\"}"
    ));
    assert!(body_names_oom(b"torch.OutOfMemoryError: ..."));
    assert!(!body_names_oom(b"{\"error\": \"KeyError: 'prompt'\"}"));
    assert!(!body_names_oom(b""));
}

#[test]
fn in_a_torchrun_job_the_probe_listens_on_base_port_plus_local_rank() {
    let Some(py) = python() else {
        println!("SKIPPED: python3 is not on PATH");
        return;
    };
    let pythonpath = std::env::join_paths([
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_stub"),
        repo().join("python"),
    ])
    .unwrap();
    let base = free_port();
    let out = Command::new(py)
        .args([
            "-c",
            "import sys, urllib.request\nfrom vramroom import probe as vramroom_probe\n\
             p = vramroom_probe.start(port=int(sys.argv[1]))\n\
             m = urllib.request.urlopen(p.url + '/metrics').read().decode()\n\
             print(p.port)\n\
             print([l for l in m.splitlines() if l.startswith('vramroom_probe_info')][0])\n",
            &base.to_string(),
        ])
        .env("PYTHONPATH", pythonpath)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("LOCAL_RANK", "0")
        .env("RANK", "2")
        .env("WORLD_SIZE", "4")
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    // LOCAL_RANK 0 keeps the base port (another local rank would add its number).
    assert_eq!(lines.next(), Some(base.to_string().as_str()));
    let info = lines.next().unwrap();
    assert!(
        info.contains("rank=\"2\"")
            && info.contains("local_rank=\"0\"")
            && info.contains("world_size=\"4\""),
        "{info}"
    );
}
