//! `python/vramroom/probe.py` (vramroom.probe) against a stub of `torch.cuda` (tests/fixtures/torch_stub),
//! so no torch is needed: its /metrics text parses with Vramroom's Prometheus parser and
//! maps to the stub allocator's numbers, /snapshot is a pickle vramroom-trace reads and
//! replays, POST /dump writes a snapshot file, the OOM observer dumps one and counts the OOM,
//! and `vramroom http` picks the probe up: it fetches the snapshots, replays the trace and
//! reports.
//!
//! Skips (saying why) when python3 is not installed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use vramroom_load::http::client;
use vramroom_load::http::load::{Stage, StageLoad};
use vramroom_load::http::prometheus::{self, MetricMap};
use vramroom_load::http::server::{Reply, Seen, TestServer};
use vramroom_load::http::{self, HttpConfig};

fn python() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The service: a Python process with the stub torch and the probe, driven by lines on
/// stdin (`alloc N`, `free I`, `oom N`, `quit`), answering `ok` on stdout.
struct Service {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    port: u16,
    dir: PathBuf,
}

const SCRIPT: &str = r#"
import sys, torch
import vramroom.probe as vramroom_probe
snapshot_dir = sys.argv[1]
addrs = [torch.cuda._stub_alloc(64 << 20)]          # weights, before the probe: no trace
p = vramroom_probe.start(port=0, snapshot_dir=snapshot_dir, record_history=True)
print("port", p.port, flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    if cmd[0] == "alloc":
        addrs.append(torch.cuda._stub_alloc(int(cmd[1])))
    elif cmd[0] == "free":
        torch.cuda._stub_free(addrs[int(cmd[1])])
    elif cmd[0] == "oom":
        try:
            torch.cuda._stub_oom(int(cmd[1]))
        except torch.cuda.OutOfMemoryError:
            pass
    elif cmd[0] == "quit":
        break
    print("ok", flush=True)
"#;

impl Service {
    fn start(name: &str) -> Option<Service> {
        let Some(py) = python() else {
            println!("SKIPPED: python3 is not on PATH");
            return None;
        };
        let dir =
            std::env::temp_dir().join(format!("vramroom-probe-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pythonpath = std::env::join_paths([
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_stub"),
            repo().join("python"),
        ])
        .unwrap();
        let mut child = Command::new(py)
            .args(["-c", SCRIPT])
            .arg(&dir)
            .env("PYTHONPATH", pythonpath)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let first = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the probe did not start within 20 s");
        let port = first
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
        Some(Service {
            child,
            stdin,
            lines,
            port,
            dir,
        })
    }

    fn cmd(&mut self, c: &str) {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        let l = self
            .lines
            .recv_timeout(Duration::from_secs(10))
            .expect("the service did not answer");
        assert_eq!(l, "ok", "{c}");
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fetch(url: &str, method: Method) -> (u16, Vec<u8>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = client::resolve(url).unwrap();
    let (s, b) = rt
        .block_on(client::get(&t, Duration::from_secs(10), method))
        .unwrap();
    (s, b.to_vec())
}

const MIB: u64 = 1 << 20;

#[test]
fn probe_metrics_snapshot_dump_and_oom_against_the_torch_stub() {
    let Some(mut svc) = Service::start("unit") else {
        return;
    };
    svc.cmd("alloc 10485760"); // 10 MiB: a 10 MiB segment
    svc.cmd("alloc 1000"); // small: 1024 B in a 2 MiB segment
    svc.cmd("free 2");

    // /metrics: Prometheus text that the parser reads and the known names map.
    let (status, body) = fetch(&svc.url("/metrics"), Method::GET);
    assert_eq!(status, 200);
    let text = String::from_utf8(body).unwrap();
    let e = prometheus::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let m = MetricMap::known().apply(&e);
    assert!(m.is_probe);
    let r = m.reading;
    // Live: the 64 MiB weights and the 10 MiB tensor; the small block was freed.
    assert_eq!(r.allocated, Some(74 * MIB));
    // Reserved: 64 + 10 + the cached 2 MiB small segment.
    assert_eq!(r.reserved, Some(76 * MIB));
    assert_eq!(r.max_allocated, Some(74 * MIB + 1024));
    assert_eq!(r.capacity, Some(80 << 30));
    // mem_get_info: the context (512 MiB) plus reserved is in use on the device.
    assert_eq!(r.device_used, Some(512 * MIB + 76 * MIB));
    assert_eq!(r.num_ooms, Some(0));
    // The freed small block left its segment whole again: nothing is split.
    assert_eq!(r.inactive_split, Some(0));
    assert_eq!(
        m.memory_stats["inactive_split_bytes.all.peak"],
        (2 * MIB - 1024) as i64
    );
    assert_eq!(
        m.memory_stats["allocated_bytes.all.current"],
        (74 * MIB) as i64
    );
    assert_eq!(m.memory_stats["segment.all.current"], 3);
    assert!(m.memory_stats.len() > 100, "every memory_stats key");
    assert!(e
        .types
        .iter()
        .any(|(n, _)| n == "vramroom_probe_ooms_total"));

    // /snapshot: the pickle vramroom-trace reads, with the trace since the probe started.
    let (status, body) = fetch(&svc.url("/snapshot"), Method::GET);
    assert_eq!(status, 200);
    let snap = vramroom_trace::read_snapshot(&body).unwrap();
    assert_eq!(snap.segments.len(), 3);
    let trace = &snap.device_traces[0];
    // segment_alloc + alloc twice, free_requested + free_completed once.
    assert_eq!(trace.len(), 6, "{trace:?}");
    let rr = vramroom_trace::replay(&snap, &vramroom_trace::ReplayOptions::default()).unwrap();
    assert_eq!(rr.num_ooms, 0);
    assert!(
        rr.peak_allocated_bytes >= 74 * MIB,
        "{}",
        rr.peak_allocated_bytes
    );

    // POST /dump: a file, which reads back.
    let (status, body) = fetch(&svc.url("/dump"), Method::POST);
    assert_eq!(status, 200);
    let path = PathBuf::from(String::from_utf8(body).unwrap().trim());
    assert!(path.starts_with(&svc.dir), "{path:?}");
    let dumped = vramroom_trace::read_snapshot_file(&path).unwrap();
    assert_eq!(dumped.segments.len(), 3);

    // No OOM yet: /oom_snapshot is 404.
    assert_eq!(fetch(&svc.url("/oom_snapshot"), Method::GET).0, 404);
    // An OOM: the observer dumps a snapshot and counts it.
    svc.cmd("oom 1099511627776");
    let files: Vec<_> = std::fs::read_dir(&svc.dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.iter().any(|f| f.contains("_oom1_")), "{files:?}");
    let (status, body) = fetch(&svc.url("/oom_snapshot"), Method::GET);
    assert_eq!(status, 200);
    assert_eq!(
        vramroom_trace::read_snapshot(&body).unwrap().segments.len(),
        3
    );
    let (_, body) = fetch(&svc.url("/metrics"), Method::GET);
    let e = prometheus::parse(&String::from_utf8(body).unwrap()).unwrap();
    let m = MetricMap::known().apply(&e);
    assert_eq!(m.reading.num_ooms, Some(1));
    assert_eq!(m.memory_stats["num_ooms"], 1);
    // And the JSON index.
    let (status, body) = fetch(&svc.url("/"), Method::GET);
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["ooms"], 1);
    assert_eq!(v["torch"], "2.11.0+stub");
}

#[test]
fn vramroom_http_picks_up_the_probe() {
    let Some(mut svc) = Service::start("http") else {
        return;
    };
    // The service's traffic: each request allocates (the load itself runs against a
    // loopback server; the probe is what the client scrapes).
    for _ in 0..3 {
        svc.cmd("alloc 33554432");
    }
    svc.cmd("free 1");
    svc.cmd("free 2");
    let target = TestServer::start(1, Arc::new(|_: &Seen| Reply::ok("ok"))).unwrap();
    let mut c = HttpConfig::new(target.url("/"));
    c.stages = vec![Stage::held(
        StageLoad::Workers(2),
        Some(Duration::from_millis(400)),
    )];
    c.threads = 2;
    c.metrics_url = Some(svc.url("/metrics"));
    c.metrics_interval = Duration::from_millis(50);
    // An OOM during the run.
    let oom = std::thread::spawn({
        let mut stdin = svc.stdin.try_clone_or_write();
        move || {
            std::thread::sleep(Duration::from_millis(150));
            stdin("oom 1099511627776");
        }
    });
    let r = http::run(&c, Arc::new(AtomicBool::new(false)), |_| {}).unwrap();
    oom.join().unwrap();
    let h = r.http.as_ref().unwrap();
    assert_eq!(r.memory_sources[0].kind, "probe");
    let p = h.probe.as_ref().expect("the probe is picked up");
    assert!(p.snapshot_fetched, "{p:?}");
    assert!(p.trace_entries >= 8, "{p:?}");
    assert!(p.oom_snapshot_fetched, "{p:?}");
    assert!(r.snapshot.is_some() && r.oom_snapshot.is_some());
    assert_eq!(r.errors.oom, 1, "the OOM during the run");
    assert_eq!(r.capacity_bytes, 80 << 30);
    // The service's own trace replayed under its config and the what-if configs.
    assert!(r.what_if.len() >= 2, "{:?}", r.what_if);
    assert_eq!(r.what_if[0].alloc_conf, "");
    // The 1 TiB request fails again under every config, as the service's counter says: the
    // own-config row agrees with the service's max_memory_reserved and num_ooms.
    assert!(r.what_if.iter().all(|w| w.num_ooms == 1), "{:?}", r.what_if);
    let chk = &r.what_if_check;
    assert_eq!(chk.source, "service snapshot");
    assert!(chk.agrees, "{chk:?}");
    assert_eq!(chk.run_peak_reserved_bytes, 160 << 20, "{chk:?}");
    let ids: Vec<&str> = r.findings.iter().map(|f| f.id.as_str()).collect();
    assert!(ids.contains(&"out_of_memory"), "{ids:?}");
    // The stub's failed allocation flushed the cache and retried once, during the run.
    assert_eq!(r.peaks.alloc_retries, 1);
    assert!(ids.contains(&"fragmentation"), "{ids:?}");
    let oom_f = r
        .findings
        .iter()
        .find(|f| f.id.as_str() == "out_of_memory")
        .unwrap();
    assert!(
        oom_f.evidence.contains("OOM snapshot"),
        "{}",
        oom_f.evidence
    );
    // Cache held at rest: 64 MiB cached is far below what matters on an 80 GiB device
    // (5% of the capacity), so no cache_held finding.
    assert!(!ids.contains(&"cache_held"), "{ids:?}");
    assert!(r.final_memory_stats["num_ooms"] >= 1);
    assert!(h.memory_series.iter().any(|s| s == "inactive_split"));
}

/// Writing a command to the service from another thread (the test's own `cmd` waits for
/// the answer on the main thread's receiver, which the run does not read).
trait CloneWrite {
    fn try_clone_or_write(&mut self) -> Box<dyn FnMut(&str) + Send>;
}

impl CloneWrite for ChildStdin {
    fn try_clone_or_write(&mut self) -> Box<dyn FnMut(&str) + Send> {
        // ChildStdin cannot be cloned; hand a duplicate of its file descriptor over.
        use std::os::fd::AsFd;
        let fd = self.as_fd().try_clone_to_owned().expect("dup stdin");
        let mut f = std::fs::File::from(fd);
        Box::new(move |c: &str| {
            writeln!(f, "{c}").unwrap();
            f.flush().unwrap();
        })
    }
}

#[test]
fn python_m_vramroom_probe_runs_a_script_with_the_probe_started() {
    let Some(py) = python() else {
        println!("SKIPPED: python3 is not on PATH");
        return;
    };
    let dir = std::env::temp_dir().join(format!("vramroom-probe-m-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The script sees the probe the wrapper started (start() again returns it), and its
    // arguments as sys.argv.
    let script = dir.join("service.py");
    std::fs::write(
        &script,
        "import sys, urllib.request, torch\n\
         import vramroom.probe as vramroom_probe\n\
         p = vramroom_probe.start()\n\
         cold = urllib.request.urlopen(p.url + '/metrics').read().decode()\n\
         torch.cuda._stub_alloc(5 << 20)\n\
         text = urllib.request.urlopen(p.url + '/metrics').read().decode()\n\
         print(sys.argv[1:], 'torch_cuda' in cold, \
               'torch_cuda_memory_allocated_bytes{device=\"0\"} 5242880' in text)\n",
    )
    .unwrap();
    let pythonpath = std::env::join_paths([
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_stub"),
        repo().join("python"),
    ])
    .unwrap();
    let mut child = Command::new(py)
        .args(["-m", "vramroom.probe", "--port", "0", "--snapshot-dir"])
        .arg(&dir)
        .arg("--")
        .arg(&script)
        .args(["--model", "x"])
        .env("PYTHONPATH", pythonpath)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("python -m vramroom.probe did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Before the service initialised CUDA the probe asks nothing of it; after, it exports.
    assert_eq!(stdout.trim(), "['--model', 'x'] False True", "{stderr}");
    assert!(
        stderr.contains("vramroom.probe: serving http://127.0.0.1:"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
