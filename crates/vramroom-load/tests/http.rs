//! `vramroom http`'s engine against loopback servers started here: the load models hit
//! their concurrency and rate, stages and `-n`/`-z` stop where they should, latency is
//! corrected for coordinated omission, bodies reach the server as specified, memory from a
//! Prometheus endpoint and a fake NVML lands on the timeline, and bad targets are errors.
//!
//! Every run is bounded (a second or less, or a few hundred requests) and every server
//! answers within a second, so the suite stays well under a minute on two cores.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use vramroom_load::http::body::BodySpec;
use vramroom_load::http::load::{Arrival, Stage, StageLoad};
use vramroom_load::http::server::{Reply, Seen, TestServer};
use vramroom_load::http::{self, HttpConfig};
use vramroom_load::{
    parse_thresholds, FnSource, LoadError, MemoryReading, MemorySource, RunResult, StopReason,
};

fn no_stop() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

fn stage(load: StageLoad, secs: f64) -> Stage {
    Stage::held(load, Some(Duration::from_secs_f64(secs)))
}

fn cfg(url: &str, stages: Vec<Stage>) -> HttpConfig {
    let mut c = HttpConfig::new(url);
    c.stages = stages;
    c.threads = 2;
    c.timeout = Duration::from_secs(5);
    c
}

/// Runs `c` on its own thread: a run that does not end within 60 s fails the test instead
/// of hanging it.
fn go(c: &HttpConfig) -> RunResult {
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let c = c.clone();
    std::thread::spawn(move || {
        let _ = tx.send(http::run(&c, no_stop(), |_| {}));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the run did not end within 60 s")
        .expect("run");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "a run took {:?}",
        t.elapsed()
    );
    r
}

/// A server that answers 200 after `delay`.
fn slow(delay: Duration) -> TestServer {
    TestServer::start(2, Arc::new(move |_: &Seen| Reply::ok("ok").after(delay))).unwrap()
}

#[test]
fn closed_model_keeps_its_workers_busy() {
    let s = slow(Duration::from_millis(10));
    let r = go(&cfg(&s.url("/"), vec![stage(StageLoad::Workers(4), 0.6)]));
    let h = r.http.as_ref().unwrap();
    assert_eq!(h.model, "closed");
    assert_eq!(s.peak_in_flight(), 4, "4 workers, 4 requests in flight");
    // 4 workers × 10 ms: at most 400/s, and close to it on an idle loopback.
    let rps = r.throughput.requests_per_s;
    assert!((150.0..=420.0).contains(&rps), "{rps} req/s");
    assert_eq!(r.requests.ok, r.requests.total);
    assert_eq!(h.status_codes["200"], r.requests.ok);
    assert!(
        r.latency.p50_ms >= 10.0 && r.latency.p50_ms < 40.0,
        "{:?}",
        r.latency
    );
    assert!(
        h.connections_opened >= 4 && h.connections_opened <= 6,
        "keep-alive"
    );
    assert_eq!(r.stop_reason, StopReason::Completed);
    assert!(
        (0.55..1.5).contains(&r.wall_s),
        "-z bounds the run: {}",
        r.wall_s
    );
}

#[test]
fn open_model_sends_at_its_rate() {
    for arrival in [Arrival::Constant, Arrival::Poisson] {
        let s = slow(Duration::from_millis(2));
        let mut c = cfg(&s.url("/"), vec![stage(StageLoad::Rate(300.0), 1.0)]);
        c.arrival = arrival;
        let r = go(&c);
        let h = r.http.as_ref().unwrap();
        assert_eq!(h.model, "open");
        let n = r.requests.total as f64;
        // The schedule decides the count: 300 intended sends in 1 s (Poisson: ± 3 sd).
        let tol = if arrival == Arrival::Constant {
            3.0
        } else {
            3.0 * 300f64.sqrt()
        };
        assert!((n - 300.0).abs() <= tol, "{arrival:?}: {n} requests");
        assert_eq!(h.dropped + h.aborted, 0);
        assert_eq!(h.latency_correction, "intended_send_time");
        assert_eq!(s.requests(), r.requests.total);
    }
}

#[test]
fn stages_change_the_load_at_their_boundaries() {
    let s = slow(Duration::from_millis(20));
    let r = go(&cfg(
        &s.url("/"),
        vec![
            stage(StageLoad::Workers(2), 0.4),
            stage(StageLoad::Workers(6), 0.4),
        ],
    ));
    assert_eq!(r.stages.len(), 2);
    assert_eq!(r.stages[0].concurrency, 2);
    assert_eq!(r.stages[1].concurrency, 6);
    assert!((r.stages[0].end_s - 0.4).abs() < 0.05, "{:?}", r.stages[0]);
    assert_eq!(s.peak_in_flight(), 6);
    // Three times the workers, about three times the throughput.
    let ratio = r.stages[1].throughput.requests_per_s / r.stages[0].throughput.requests_per_s;
    assert!((2.0..4.0).contains(&ratio), "{ratio}");
    assert_eq!(r.by_concurrency.len(), 2);

    let s = slow(Duration::from_millis(1));
    let r = go(&cfg(
        &s.url("/"),
        vec![
            stage(StageLoad::Rate(100.0), 0.5),
            stage(StageLoad::Rate(300.0), 0.5),
        ],
    ));
    let h = r.http.as_ref().unwrap();
    assert_eq!(h.by_rate.len(), 2);
    let n0 = r.stages[0].requests.total as i64;
    let n1 = r.stages[1].requests.total as i64;
    assert!((n0 - 50).abs() <= 2 && (n1 - 150).abs() <= 2, "{n0} {n1}");
    assert_eq!(h.stages[1].rate_per_s, Some(300.0));
}

#[test]
fn n_stops_after_exactly_n_requests() {
    let s = slow(Duration::from_millis(1));
    let mut c = cfg(&s.url("/"), vec![Stage::held(StageLoad::Workers(4), None)]);
    c.max_requests = Some(123);
    let r = go(&c);
    assert_eq!(r.requests.total, 123);
    assert_eq!(s.requests(), 123);
    assert_eq!(r.load.mode, "requests");

    let mut c = cfg(
        &s.url("/"),
        vec![Stage::held(StageLoad::Rate(1000.0), None)],
    );
    c.max_requests = Some(77);
    let r = go(&c);
    assert_eq!(r.requests.total, 77);
    // -n with -z: whichever comes first.
    let mut c = cfg(&s.url("/"), vec![stage(StageLoad::Workers(2), 0.3)]);
    c.max_requests = Some(1_000_000);
    let r = go(&c);
    assert!(r.wall_s < 1.0 && r.requests.total < 1_000_000);
}

/// A server that holds every request arriving in [0.3 s, 0.6 s) after its first request
/// until 0.6 s: a stall such as a GC pause or a model reload.
fn stalling() -> TestServer {
    let first: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    TestServer::start(
        2,
        Arc::new(move |_: &Seen| {
            let f = *first.get_or_init(Instant::now);
            let t = f.elapsed().as_secs_f64();
            if (0.3..0.6).contains(&t) {
                Reply::ok("late").after(Duration::from_secs_f64(0.6 - t))
            } else {
                Reply::ok("ok").after(Duration::from_millis(1))
            }
        }),
    )
    .unwrap()
}

#[test]
fn open_model_latency_includes_the_stall_for_requests_that_waited_to_be_sent() {
    let s = stalling();
    let mut c = cfg(&s.url("/"), vec![stage(StageLoad::Rate(200.0), 1.0)]);
    // Two connections: during the stall the schedule's requests wait for a connection,
    // so they are sent late; measured from the send they look fast.
    c.max_connections = 2;
    let r = go(&c);
    let h = r.http.as_ref().unwrap();
    assert!(r.requests.total >= 190, "{}", r.requests.total);
    // ~30% of the schedule fell in the stall, waiting up to 300 ms.
    assert!(
        r.latency.p90_ms > 100.0,
        "corrected p90 {} should show the stall",
        r.latency.p90_ms
    );
    assert!(r.latency.max_ms > 250.0, "{:?}", r.latency);
    assert!(
        h.latency_uncorrected.p90_ms < 50.0,
        "uncorrected p90 {} hides it (coordinated omission)",
        h.latency_uncorrected.p90_ms
    );
}

#[test]
fn closed_model_correction_counts_the_requests_a_stall_hid() {
    let s = stalling();
    let r = go(&cfg(&s.url("/"), vec![stage(StageLoad::Workers(2), 1.0)]));
    let h = r.http.as_ref().unwrap();
    assert_eq!(h.latency_correction, "expected_interval");
    // Raw: two 300 ms answers among hundreds of ~1 ms ones.
    assert!(
        h.latency_uncorrected.p99_ms < 50.0,
        "{:?}",
        h.latency_uncorrected
    );
    assert!(
        r.latency.p99_ms > 100.0,
        "corrected p99 {} should count the requests the stall hid",
        r.latency.p99_ms
    );
    assert_eq!(r.latency.count, r.requests.ok, "count is of real requests");
    assert!(h.stages[0].correction_interval_ms.unwrap() < 20.0);
}

#[test]
fn shed_503_are_counted_apart_from_errors() {
    let s = TestServer::start(
        2,
        Arc::new(|seen: &Seen| match seen.seq % 4 {
            0 => Reply::status(503),
            1 => Reply::status(500),
            _ => Reply::ok("ok"),
        }),
    )
    .unwrap();
    let mut c = cfg(&s.url("/"), vec![Stage::held(StageLoad::Workers(1), None)]);
    c.max_requests = Some(200);
    c.thresholds = parse_thresholds(&["shed_rate<0.3", "error_rate<0.3", "shed==50"]).unwrap();
    let r = go(&c);
    let h = r.http.as_ref().unwrap();
    assert_eq!(h.shed, 50);
    assert_eq!(h.status_codes["503"], 50);
    assert_eq!(r.requests.ok, 100);
    assert_eq!(r.requests.other_errors, 50);
    assert_eq!(r.errors.by_kind["status_500"], 50);
    assert!(!r.errors.by_kind.contains_key("status_503"));
    assert_eq!(h.shed_latency.count, 50);
    let sum: u64 = h
        .status_timeline
        .iter()
        .map(|b| b.ok + b.shed + b.server_error)
        .sum();
    assert_eq!(sum, 200);
    assert!(r.thresholds.iter().all(|t| t.passed), "{:?}", r.thresholds);
    // Shedding is a finding: a quarter of the load, a warning; no reason was given.
    let f = r
        .findings
        .iter()
        .find(|f| f.id.as_str() == "load_shed")
        .expect("a load_shed finding");
    assert_eq!(
        f.severity,
        vramroom_load::Severity::Warning,
        "{}",
        f.evidence
    );
    assert!(f.evidence.contains("did not say why"), "{}", f.evidence);
}

#[test]
fn every_answer_the_same_4xx_stops_early_with_a_hint() {
    // A GET against a POST endpoint: 405 every time. The run stops after the refusals
    // agree, long before its 20 s, and says what to change.
    let s = TestServer::start(2, Arc::new(|_: &Seen| Reply::status(405))).unwrap();
    let c = cfg(
        &s.url("/v1/infer"),
        vec![stage(StageLoad::Workers(4), 20.0)],
    );
    let t = Instant::now();
    let r = go(&c);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(r.stop_reason, StopReason::Refused);
    let h = r.http.as_ref().unwrap();
    let hint = h.stop_hint.as_deref().expect("a hint");
    assert!(hint.contains("405") && hint.contains("-m POST"), "{hint}");
    assert_eq!(r.requests.ok, 0);
}

#[test]
fn bodies_reach_the_server_as_specified() {
    let seen: Arc<Mutex<Vec<(String, usize)>>> = Arc::new(Mutex::new(Vec::new()));
    let s = {
        let seen = seen.clone();
        TestServer::start(
            2,
            Arc::new(move |x: &Seen| {
                seen.lock().unwrap().push((x.method.clone(), x.body_len));
                Reply::ok("")
            }),
        )
        .unwrap()
    };
    let mut c = cfg(
        &s.url("/v1"),
        vec![Stage::held(StageLoad::Workers(2), None)],
    );
    c.max_requests = Some(300);
    c.body = BodySpec {
        size: Some("uniform:100..2000".into()),
        ..Default::default()
    };
    let r = go(&c);
    assert_eq!(r.http.as_ref().unwrap().method, "POST");
    let v = seen.lock().unwrap().clone();
    assert_eq!(v.len(), 300);
    assert!(v
        .iter()
        .all(|(m, n)| m == "POST" && (100..=2000).contains(n)));
    let mean = v.iter().map(|x| x.1).sum::<usize>() as f64 / 300.0;
    assert!((mean - 1050.0).abs() < 120.0, "mean body {mean}");
    let sent = r.http.as_ref().unwrap().bytes_sent as usize;
    assert!(sent > v.iter().map(|x| x.1).sum::<usize>());

    seen.lock().unwrap().clear();
    c.body = BodySpec {
        template: Some("{\"prompt\":\"{{tokens 5..50}}\",\"id\":{{seq}}}".into()),
        ..Default::default()
    };
    c.method = Some("PUT".into());
    c.max_requests = Some(100);
    go(&c);
    let v = seen.lock().unwrap().clone();
    assert!(v.iter().all(|(m, n)| m == "PUT" && *n >= 20 && *n < 400));
    let lens: std::collections::BTreeSet<usize> = v.iter().map(|x| x.1).collect();
    assert!(lens.len() > 20, "template lengths vary");
}

/// A service exporting `vramroom serve`'s gauges: allocated grows with the requests in
/// flight, capacity 1 GiB.
fn service_with_metrics(ooms: Arc<AtomicU64>) -> TestServer {
    let in_flight = Arc::new(AtomicU64::new(0));
    TestServer::start(
        2,
        Arc::new(move |x: &Seen| {
            if x.path == "/metrics" {
                let n = in_flight.load(Ordering::Relaxed);
                let alloc = (100 << 20) + n * (10 << 20);
                return Reply::ok(format!(
                    "# HELP vramroom_memory_allocated_bytes Allocated.\n\
                     # TYPE vramroom_memory_allocated_bytes gauge\n\
                     vramroom_memory_allocated_bytes{{device=\"0\"}} {alloc}\n\
                     vramroom_memory_reserved_bytes{{device=\"0\"}} {}\n\
                     vramroom_memory_capacity_bytes{{device=\"0\"}} {}\n\
                     vramroom_num_ooms_total {}\n",
                    alloc + (20 << 20),
                    1u64 << 30,
                    ooms.load(Ordering::Relaxed)
                ));
            }
            in_flight.store(x.in_flight as u64, Ordering::Relaxed);
            Reply::ok("ok").after(Duration::from_millis(5))
        }),
    )
    .unwrap()
}

#[test]
fn prometheus_and_nvml_memory_join_the_load_on_one_timeline() {
    let ooms = Arc::new(AtomicU64::new(0));
    let s = service_with_metrics(ooms.clone());
    let mut c = cfg(
        &s.url("/infer"),
        vec![
            stage(StageLoad::Workers(2), 0.4),
            stage(StageLoad::Workers(8), 0.4),
        ],
    );
    c.metrics_url = Some(s.url("/metrics"));
    c.metrics_interval = Duration::from_millis(50);
    // A fake NVML: the process holds reserved + a 300 MiB context.
    let fake = Arc::new(FnSource::new("nvml:fake", "fake", |t| {
        Ok(MemoryReading {
            process_used: Some((400 << 20) + t * 1024),
            device_used: Some(600 << 20),
            capacity: Some(2 << 30),
            ..Default::default()
        })
    }));
    c.memory_sources = vec![fake.clone() as Arc<dyn MemorySource>];
    let r = go(&c);
    let h = r.http.as_ref().unwrap();
    assert!(fake.ticks() >= 10, "{}", fake.ticks());
    for s in [
        "allocated",
        "reserved",
        "capacity",
        "process_used",
        "overhead",
    ] {
        assert!(
            h.memory_series.iter().any(|x| x == s),
            "{s}: {:?}",
            h.memory_series
        );
    }
    // The endpoint's capacity wins over NVML's (first source to know it).
    assert_eq!(r.capacity_bytes, 1 << 30);
    assert!(r.timeline.len() >= 10, "{}", r.timeline.len());
    assert!(r.timeline.windows(2).all(|w| w[0].t_s <= w[1].t_s));
    assert_eq!(r.timeline[0].t_s, 0.0);
    assert_eq!(r.baseline_bytes, 100 << 20, "before the first request");
    // More workers in stage 2, more memory.
    assert!(
        r.stages[1].peak_allocated_bytes > r.stages[0].peak_allocated_bytes,
        "{} vs {}",
        r.stages[1].peak_allocated_bytes,
        r.stages[0].peak_allocated_bytes
    );
    let s0 = &r.timeline[1];
    assert_eq!(
        s0.overhead_bytes.unwrap(),
        s0.process_used_bytes.unwrap() - s0.reserved_bytes
    );
    assert!(r.peaks.process_used_bytes.unwrap() >= 400 << 20);
    let kinds: Vec<&str> = r.memory_sources.iter().map(|m| m.kind.as_str()).collect();
    assert_eq!(kinds, vec!["prometheus", "fake"]);
    assert!(r.memory_sources[0]
        .mapped
        .iter()
        .any(|m| m.contains("vramroom serve")));
    assert_eq!(r.errors.oom, 0);
    assert!(r.findings.is_empty(), "{:?}", r.findings);
}

#[test]
fn service_ooms_are_reported() {
    let ooms = Arc::new(AtomicU64::new(3));
    let s = service_with_metrics(ooms.clone());
    let mut c = cfg(&s.url("/infer"), vec![stage(StageLoad::Workers(2), 0.5)]);
    c.metrics_url = Some(s.url("/metrics"));
    c.metrics_interval = Duration::from_millis(40);
    c.thresholds = parse_thresholds(&["oom_count==0"]).unwrap();
    let bump = {
        let ooms = ooms.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(250));
            ooms.fetch_add(2, Ordering::Relaxed);
        })
    };
    let r = go(&c);
    bump.join().unwrap();
    assert_eq!(r.errors.oom, 2, "the rise during the run, not the 3 before");
    assert_eq!(r.ooms.len(), 1);
    assert!(r.ooms[0].t_s > 0.2 && r.ooms[0].message.contains("from 3 to 5"));
    assert!(r.findings.iter().any(|f| f.id.as_str() == "out_of_memory"));
    assert!(!r.thresholds[0].passed);
}

#[test]
fn a_stop_flag_ends_the_run_with_what_was_measured() {
    let s = slow(Duration::from_millis(2));
    let c = cfg(&s.url("/"), vec![stage(StageLoad::Workers(2), 20.0)]);
    let stop = no_stop();
    let t = Instant::now();
    let stopper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::SeqCst);
        })
    };
    let r = http::run(&c, stop, |_| {}).unwrap();
    stopper.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(r.stop_reason, StopReason::Cancelled);
    assert!(r.requests.ok > 10);
}

#[test]
fn bad_targets_are_errors_before_anything_runs() {
    // A port nobody listens on: bind one, note it, close it.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dead = format!("http://127.0.0.1:{port}/");
    let e = http::run(
        &cfg(&dead, vec![stage(StageLoad::Workers(1), 0.2)]),
        no_stop(),
        |_| {},
    )
    .unwrap_err();
    assert!(matches!(e, LoadError::Http(_)), "{e}");
    assert!(e.to_string().contains("connection refused"), "{e}");

    let s = slow(Duration::ZERO);
    let mut c = cfg(&s.url("/"), vec![stage(StageLoad::Workers(1), 0.2)]);
    c.metrics_url = Some(dead.clone() + "metrics");
    let e = http::run(&c, no_stop(), |_| {}).unwrap_err();
    assert!(e.to_string().contains("--metrics-url"), "{e}");
    // A metrics endpoint that is not Prometheus text.
    c.metrics_url = Some(s.url("/not-metrics"));
    let bad = TestServer::start(1, Arc::new(|_: &Seen| Reply::ok("{not: prometheus}"))).unwrap();
    c.metrics_url = Some(bad.url("/metrics"));
    let e = http::run(&c, no_stop(), |_| {}).unwrap_err();
    assert!(e.to_string().contains("metrics line 1"), "{e}");
    for url in [
        "https://127.0.0.1/",
        "ftp://x",
        "http://no-such-host.invalid/",
    ] {
        let e = http::run(
            &cfg(url, vec![stage(StageLoad::Workers(1), 0.2)]),
            no_stop(),
            |_| {},
        )
        .unwrap_err();
        assert!(matches!(e, LoadError::Http(_)), "{url}: {e}");
    }
}

#[test]
fn nvml_is_absent_here_and_said_so_once() {
    let s = slow(Duration::ZERO);
    let mut c = cfg(&s.url("/"), vec![stage(StageLoad::Workers(1), 0.2)]);
    c.nvml = Some(vramroom_load::NvmlDevice::Index(0));
    let r = go(&c);
    match r.memory_sources.first() {
        // No GPU on this machine: the source is recorded as absent, the run went on.
        Some(m) if m.status == "absent" => assert!(m.note.contains("NVML"), "{m:?}"),
        Some(m) => assert_eq!(m.status, "ok"),
        None => panic!("the NVML source is not mentioned"),
    }
    assert!(r.requests.ok > 0);
}

#[test]
fn n_ends_a_last_stage_smaller_than_an_earlier_one() {
    // Workers of the first stage idle in the second: -n must still end the run.
    // 4 workers × 0.2 s / 10 ms: about 80 requests in the first stage, the rest after.
    let s = slow(Duration::from_millis(10));
    let mut c = cfg(
        &s.url("/"),
        vec![
            stage(StageLoad::Workers(4), 0.2),
            Stage::held(StageLoad::Workers(1), None),
        ],
    );
    c.max_requests = Some(120);
    let t = Instant::now();
    let r = go(&c);
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(r.requests.total, 120);
    assert_eq!(r.stages.len(), 2);
}
