//! `--device cpu,cpu`: two simulated devices, one replica each, behind one router. Under
//! 4x the load one replica sheds at, they answer only 200 or 503 (never an OOM), both take
//! requests, and `/metrics` and `/healthz` show each replica.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use vramroom_serve::{start, BatchKey, LatencyTarget, Margin, ServeConfig};

use common::*;

/// zoo-gpt-tiny on `devices`, each with room for 2.5 requests of 30 tokens (memory is what
/// sheds: no latency target).
fn cfg(devices: &str) -> (ServeConfig, u64) {
    let (limit, _) = room_for("zoo-gpt-tiny", BatchKey::Tokens { len: 32 }, 2.5);
    let capacity = 8 << 20;
    let c = ServeConfig {
        model: "zoo-gpt-tiny".parse().unwrap(),
        devices: devices.parse().unwrap(),
        addr: "127.0.0.1:0".parse().unwrap(),
        capacity,
        margin: Margin::Bytes(capacity - limit),
        latency: LatencyTarget::Off,
        max_wait: Duration::from_millis(20),
        max_batch: 2,
        drain_timeout: Duration::from_secs(10),
        ..ServeConfig::default()
    };
    (c, limit)
}

/// `clients` closed-loop clients sending `each` requests of 30 tokens; answers by status.
async fn load(addr: std::net::SocketAddr, clients: usize, each: usize) -> BTreeMap<u16, u64> {
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(async move {
                let mut codes = Vec::new();
                for _ in 0..each {
                    let r =
                        post_json(addr, &json!({ "inputs": (0..30).collect::<Vec<i64>>() })).await;
                    if r.status == 503 {
                        let ra: u64 = r
                            .header("retry-after")
                            .expect("a 503 carries Retry-After")
                            .parse()
                            .unwrap();
                        assert!(ra >= 1);
                    }
                    codes.push(r.status);
                }
                codes
            })
        })
        .collect();
    let mut by = BTreeMap::new();
    for t in tasks {
        for c in t.await.unwrap() {
            *by.entry(c).or_default() += 1;
        }
    }
    by
}

/// The sum of a series over every `device` (or its one unlabelled sample).
fn sum(m: &str, name: &str, label: Option<&str>) -> f64 {
    m.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, labels) = series.split_once('{').unwrap_or((series, "}"));
            let other: Vec<&str> = labels
                .trim_end_matches('}')
                .split(',')
                .filter(|p| !p.is_empty() && !p.starts_with("device="))
                .collect();
            let want: Vec<&str> = label.into_iter().collect();
            (n == name && other == want).then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_hold_4x_the_load_one_sheds_at_with_only_200_and_503() {
    // The load one replica sheds at: 6 clients.
    let (one, _) = cfg("cpu");
    let h = start(one).await.expect("one replica starts");
    let single = load(h.local_addr(), 6, 4).await;
    h.shutdown().await;
    assert!(
        single.get(&503).copied().unwrap_or(0) > 0,
        "one replica did not shed at 6 clients: {single:?}"
    );

    // Two replicas under 4x that.
    let (two, limit) = cfg("cpu,cpu");
    let h = start(two).await.expect("two replicas start");
    let addr = h.local_addr();
    let by = load(addr, 24, 4).await;
    eprintln!("one replica, 6 clients: {single:?}; two replicas, 24 clients: {by:?}");
    let ok = by.get(&200).copied().unwrap_or(0);
    let shed = by.get(&503).copied().unwrap_or(0);
    assert_eq!(ok + shed, 96, "only 200 and 503: {by:?}");
    assert!(ok > 0 && shed > 0, "{by:?}");

    let m = get(addr, "/metrics").await.text();
    for dev in ["cpu:0", "cpu:1"] {
        let s = |name: &str| metric(&m, &format!("{name}{{device=\"{dev}\"}}"));
        assert_eq!(s("vramroom_num_ooms_total"), Some(0.0), "{dev}");
        let peak = s("vramroom_max_memory_allocated_bytes").expect("peak per device");
        assert!(peak <= limit as f64, "{dev}: peak {peak} > limit {limit}");
        assert_eq!(s("vramroom_prediction_underestimates_total"), Some(0.0));
        assert_eq!(s("vramroom_admission_limit_bytes"), Some(limit as f64));
        // The router spread the requests: both replicas served some.
        let routed = s("vramroom_replica_requests_total").unwrap();
        let served = metric(
            &m,
            &format!("vramroom_requests_total{{device=\"{dev}\",code=\"200\"}}"),
        )
        .unwrap_or(0.0);
        assert!(
            routed > 0.0 && served > 0.0,
            "{dev}: routed {routed}, served {served}"
        );
        assert_eq!(
            routed, served,
            "{dev}: every placed request was answered 200"
        );
    }
    // Summed over devices, the counts are the answers the clients saw.
    assert_eq!(
        sum(&m, "vramroom_requests_total", Some("code=\"200\"")),
        ok as f64
    );
    assert_eq!(
        sum(&m, "vramroom_requests_total", Some("code=\"503\"")),
        shed as f64
    );
    assert_eq!(
        sum(
            &m,
            "vramroom_admission_rejections_total",
            Some("reason=\"memory\"")
        ),
        shed as f64
    );
    // Each family is declared once, its samples labelled per replica.
    assert_eq!(
        m.matches("# TYPE vramroom_memory_allocated_bytes gauge")
            .count(),
        1
    );
    assert!(!m
        .lines()
        .any(|l| l.starts_with("vramroom_memory_allocated_bytes ")));

    let hz = get(addr, "/healthz").await.json();
    assert_eq!(hz["device"], "cpu:0,cpu:1");
    let reps = hz["replicas"].as_array().expect("replicas");
    assert_eq!(reps.len(), 2);
    let mut routed_total = 0;
    for (r, dev) in reps.iter().zip(["cpu:0", "cpu:1"]) {
        assert_eq!(r["device"], dev);
        assert_eq!(r["limit_bytes"], limit);
        assert_eq!(r["queue_depth"], 0);
        routed_total += r["requests"].as_u64().unwrap();
    }
    assert_eq!(routed_total, ok);
    assert_eq!(hz["limit_bytes"], 2 * limit);

    let report = h.shutdown().await;
    assert!(report.drained);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_every_replica() {
    let (mut c, _) = cfg("cpu,cpu");
    // Batches wait to fill for long: requests stay queued until the drain dispatches them.
    c.max_wait = Duration::from_secs(5);
    c.max_batch = 8;
    let h = start(c).await.expect("starts");
    let addr = h.local_addr();
    let tasks: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { post_json(addr, &json!({"inputs": [1, 2, 3]})).await }))
        .collect();
    // One request waits on each replica (the second finds more memory left on the other).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while h
        .app()
        .replicas
        .list()
        .iter()
        .any(|r| r.sched.depth().0 == 0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "requests never queued on both"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t0 = std::time::Instant::now();
    let report = h.shutdown().await;
    assert!(report.drained, "{report:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "the drain waited for max_wait"
    );
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
}
