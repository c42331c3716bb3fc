//! `vramroom serve` on loopback: real answers, bad inputs, admission, batching, metrics,
//! shutdown. Every server binds port 0, every request has a timeout, models are tiny.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use vramroom_alloc::AllocatorConfig;
use vramroom_serve::{start, BatchKey, LatencyTarget, Margin, ServeConfig, ServerHandle};
use vramroom_tensor::{no_grad, DType, Device, Tensor};
use vramroom_workload::Net;
use vramroom_workload::{ModelSpec, RunDevice};

use common::*;

/// Tests that measure time or fill the machine run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cfg(model: &str) -> ServeConfig {
    ServeConfig {
        model: model.parse().expect("model"),
        addr: "127.0.0.1:0".parse().unwrap(),
        capacity: 256 << 20,
        max_wait: Duration::from_millis(2),
        drain_timeout: Duration::from_secs(10),
        ..ServeConfig::default()
    }
}

async fn serve(c: ServeConfig) -> (ServerHandle, SocketAddr) {
    let h = start(c).await.expect("server starts");
    let a = h.local_addr();
    (h, a)
}

/// The model run directly, as a user would without the server: a fresh cpu device, the
/// model built first (so it draws the same weights the server's did), eval mode,
/// no_grad; the output rows.
fn reference_rows(model: &str, input: impl Fn(&Device) -> Tensor) -> Vec<Vec<f32>> {
    let _g = no_grad();
    let spec: ModelSpec = model.parse().unwrap();
    let dev = RunDevice::cpu(1 << 30, &AllocatorConfig::default()).device;
    let mut net = Net::build(&spec, &dev, DType::F32).unwrap();
    net.set_train(false);
    let out = net.forward(&input(&dev), false).unwrap();
    let c = *out.shape().last().unwrap();
    let v = out.to_vec_f32().unwrap();
    v.chunks(c).map(|r| r.to_vec()).collect()
}

fn argmax(r: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in r.iter().enumerate() {
        if x > r[best] {
            best = i;
        }
    }
    best
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
            "value {i}: served {x}, direct {y}"
        );
    }
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lm_answers_equal_the_model_run_directly_whatever_the_padding() {
    let (h, addr) = serve(cfg("zoo-gpt-tiny")).await;
    // Three lengths in one request: padded to one bucket, each answered at its own end.
    let seqs: Vec<Vec<i64>> = vec![
        vec![3, 14, 15, 9, 2, 6],
        vec![1],
        (0..13).map(|i| (i * 7 % 50) as i64).collect(),
    ];
    let r = post_json(
        addr,
        &json!({"inputs": seqs, "return_logits": true, "top_k": 3}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["padded_len"], 16);
    assert_eq!(v["model"], "zoo-gpt-tiny");
    assert!(v["queue_ms"].as_f64().unwrap() >= 0.0 && v["compute_ms"].as_f64().unwrap() > 0.0);
    assert!(r.header("x-request-id").is_some());
    let outs = v["outputs"].as_array().unwrap();
    assert_eq!(outs.len(), 3);
    for (s, o) in seqs.iter().zip(outs) {
        let rows = reference_rows("zoo-gpt-tiny", |d| {
            Tensor::from_i64(s, &[1, s.len()], d).unwrap()
        });
        let last = &rows[s.len() - 1];
        close(&f32s(&o["logits"]), last);
        assert_eq!(o["next_token"].as_u64().unwrap() as usize, argmax(last));
        assert_eq!(o["top_k"].as_array().unwrap().len(), 3);
        assert_eq!(o["top_k"][0]["index"], o["next_token"]);
    }
    // Binary int64 tokens, one sequence, same answer as JSON.
    let s = &seqs[0];
    let body: Vec<u8> = s.iter().flat_map(|t| t.to_le_bytes()).collect();
    let shape = format!("1,{}", s.len());
    let rb = request(
        addr,
        "POST",
        "/v1/infer",
        &[
            ("Content-Type", "application/octet-stream"),
            ("X-Shape", shape.as_str()),
            ("X-Dtype", "int64"),
        ],
        &body,
    )
    .await;
    assert_eq!(rb.status, 200, "{}", rb.text());
    assert_eq!(rb.json()["outputs"][0]["next_token"], outs[0]["next_token"]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlp_and_resnet_answers_equal_the_model_run_directly() {
    let (h, addr) = serve(cfg("mlp-tiny")).await;
    let x = values(3 * 64, 1);
    let nested: Vec<Vec<f32>> = x.chunks(64).map(|c| c.to_vec()).collect();
    let r = post_json(addr, &json!({"inputs": nested, "return_logits": true})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let want = reference_rows("mlp-tiny", |d| Tensor::from_f32(&x, &[3, 64], d).unwrap());
    for (o, w) in v["outputs"].as_array().unwrap().iter().zip(&want) {
        close(&f32s(&o["logits"]), w);
        assert_eq!(o["top_k"][0]["index"].as_u64().unwrap() as usize, argmax(w));
        assert!(o.get("next_token").is_none());
    }
    // {"shape", "data"} is the same input.
    let r2 = post_json(
        addr,
        &json!({"inputs": {"shape": [3, 64], "data": x}, "return_logits": true}),
    )
    .await;
    assert_eq!(r2.json()["outputs"], v["outputs"]);
    h.shutdown().await;

    let (h, addr) = serve(cfg("resnet18")).await;
    let img = values(3 * 32 * 32, 2);
    let body: Vec<u8> = img.iter().flat_map(|f| f.to_le_bytes()).collect();
    let r = request(
        addr,
        "POST",
        "/v1/infer",
        &[
            ("Content-Type", "application/octet-stream"),
            ("X-Shape", "1,3,32,32"),
            ("X-Top-K", "4"),
        ],
        &body,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let want = reference_rows("resnet18", |d| {
        Tensor::from_f32(&img, &[1, 3, 32, 32], d).unwrap()
    });
    let top = r.json()["outputs"][0]["top_k"].clone();
    assert_eq!(top.as_array().unwrap().len(), 4);
    assert_eq!(top[0]["index"].as_u64().unwrap() as usize, argmax(&want[0]));
    let l = top[0]["logit"].as_f64().unwrap() as f32;
    close(&[l], &[want[0][argmax(&want[0])]]);
    h.shutdown().await;
}

async fn good_lm_request(addr: SocketAddr) {
    let r = post_json(addr, &json!({"inputs": [1, 2, 3]})).await;
    assert_eq!(r.status, 200, "the server stopped serving: {}", r.text());
}

fn assert_error(r: &Resp, code: u16, says: &str) {
    assert_eq!(r.status, code, "{}", r.text());
    let e = r.json()["error"].as_str().expect("error field").to_string();
    assert!(e.contains(says), "{e:?} does not say {says:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_4xx_and_the_server_keeps_serving() {
    let mut c = cfg("zoo-gpt-tiny");
    c.max_body = 4096;
    let (h, addr) = serve(c).await;
    let json_ct = [("Content-Type", "application/json")];
    let cases: Vec<(Resp, u16, &str)> = vec![
        (
            request(addr, "POST", "/v1/infer", &json_ct, b"{\"inputs\": [1, 2").await,
            400,
            "malformed JSON",
        ),
        (
            request(addr, "POST", "/v1/infer", &json_ct, b"{\"input\": [1]}").await,
            400,
            "unknown field",
        ),
        (
            post_json(addr, &json!({"inputs": [[1.5, 2.0]]})).await,
            422,
            "not an integer",
        ),
        (
            post_json(addr, &json!({"inputs": [1, 2, 999]})).await,
            422,
            "outside the vocabulary",
        ),
        (
            post_json(addr, &json!({"inputs": (0..33).collect::<Vec<_>>()})).await,
            422,
            "takes 1 to 32",
        ),
        (
            post_json(addr, &json!({"inputs": []})).await,
            422,
            "0 tokens",
        ),
        (
            post_json(addr, &json!({"inputs": vec![vec![1]; 9]})).await,
            422,
            "--max-batch",
        ),
        (
            post_json(addr, &json!({"inputs": "hello"})).await,
            422,
            "token ids",
        ),
        (
            request(addr, "POST", "/v1/infer", &json_ct, &vec![b' '; 5000]).await,
            413,
            "--max-body",
        ),
        (
            request(
                addr,
                "POST",
                "/v1/infer",
                &[("Content-Type", "text/plain")],
                b"1 2 3",
            )
            .await,
            415,
            "not supported",
        ),
        (
            request(
                addr,
                "POST",
                "/v1/infer",
                &[("Content-Type", "application/octet-stream")],
                &[0u8; 16],
            )
            .await,
            400,
            "X-Shape",
        ),
        (
            request(
                addr,
                "POST",
                "/v1/infer",
                &[
                    ("Content-Type", "application/octet-stream"),
                    ("X-Shape", "1,3"),
                ],
                &[0u8; 16],
            )
            .await,
            422,
            "needs 24",
        ),
        (
            request(
                addr,
                "POST",
                "/v1/infer",
                &[
                    ("Content-Type", "application/octet-stream"),
                    ("X-Shape", "2"),
                    ("X-Dtype", "float32"),
                ],
                &[0u8; 8],
            )
            .await,
            422,
            "takes token ids",
        ),
        (
            request(
                addr,
                "POST",
                "/v1/infer",
                &[
                    ("Content-Type", "application/octet-stream"),
                    ("X-Shape", "three"),
                ],
                &[0u8; 8],
            )
            .await,
            400,
            "X-Shape",
        ),
        (get(addr, "/v2/nothing").await, 404, "no such endpoint"),
    ];
    for (r, code, says) in &cases {
        assert_error(r, *code, says);
        assert!(r.header("x-request-id").is_some() || *code == 404);
    }
    // A declared Content-Length over the limit is refused before the body is read.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100000000\r\nConnection: close\r\n\r\n{\"inputs\":",
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(
        REQUEST_TIMEOUT,
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut buf),
    )
    .await
    .expect("413 comes without the body");
    assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 413"));
    good_lm_request(addr).await;
    let m = get(addr, "/metrics").await.text();
    assert_eq!(
        metric(&m, "vramroom_requests_total{code=\"422\"}"),
        Some(8.0)
    );
    assert_eq!(metric(&m, "vramroom_requests_total{code=\"500\"}"), None);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_mid_request_wedges_nothing() {
    let mut c = cfg("zoo-gpt-tiny");
    c.max_wait = Duration::from_secs(3);
    c.latency = LatencyTarget::Off;
    let (h, addr) = serve(c).await;
    // Half a body, then gone.
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 200\r\n\r\n{\"inputs\": [1, 2",
        )
        .await
        .unwrap();
        drop(s);
    }
    // Half the headers, then gone.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /v1/infer HTTP/1.1\r\nContent-Ty")
        .await
        .unwrap();
    drop(s);
    // A whole request whose client leaves while it is queued (the batch waits 3 s to
    // fill): it is taken out of the queue and never computed.
    let batches_before = h.app().replicas.first().metrics.batches();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let body = br#"{"inputs": [5, 6, 7]}"#;
    let head = format!(
        "POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let t0 = Instant::now();
    while h.app().replicas.first().sched.depth().0 == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "request never queued"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    drop(s);
    while h
        .app()
        .replicas
        .first()
        .metrics
        .cancelled
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the queued request of a closed connection was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(h.app().replicas.first().sched.depth().0, 0);
    let (committed, queued, running, base) = h.app().replicas.first().sched.ledger();
    assert_eq!((queued, running), (0, 0));
    assert_eq!(committed, base);
    // Only a request still in the queue counts as cancelled: it never ran.
    assert_eq!(
        h.app().replicas.first().metrics.batches(),
        batches_before,
        "a cancelled request was computed"
    );
    good_lm_request(addr).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_sheds_with_503_and_memory_stays_under_capacity() {
    let _s = SERIAL.lock().await;
    let key = BatchKey::Tokens { len: 32 };
    let (limit, p1) = room_for("zoo-gpt-tiny", key, 2.5);
    // The caching allocator reserves 2 MiB segments: the capacity holds them, the margin
    // brings what admitted work may add up to down to 2.5 requests.
    let capacity = 8 << 20;
    let mut c = cfg("zoo-gpt-tiny");
    c.capacity = capacity;
    c.margin = Margin::Bytes(capacity - limit);
    c.latency = LatencyTarget::Off;
    c.max_wait = Duration::from_millis(20);
    c.max_batch = 2;
    let (h, addr) = serve(c).await;
    let seq: Vec<i64> = (0..30).collect();
    let tasks: Vec<_> = (0..24)
        .map(|_| {
            let seq = seq.clone();
            tokio::spawn(async move { post_json(addr, &json!({ "inputs": seq })).await })
        })
        .collect();
    let mut ok = 0;
    let mut shed = 0;
    for t in tasks {
        let r = t.await.unwrap();
        match r.status {
            200 => ok += 1,
            503 => {
                shed += 1;
                let ra: u64 = r
                    .header("retry-after")
                    .expect("Retry-After")
                    .parse()
                    .unwrap();
                assert!(ra >= 1);
                assert!(r.json()["error"].as_str().unwrap().contains("memory"));
            }
            s => panic!("unexpected {s}: {}", r.text()),
        }
    }
    assert!(ok >= 2 && shed >= 1, "{ok} admitted, {shed} shed");
    let m = get(addr, "/metrics").await.text();
    let peak = metric(&m, "vramroom_max_memory_allocated_bytes").unwrap();
    assert!(
        peak <= limit as f64,
        "peak {peak} > limit {limit} (one request {p1})"
    );
    assert!(peak <= metric(&m, "vramroom_memory_capacity_bytes").unwrap());
    assert_eq!(metric(&m, "vramroom_num_ooms_total"), Some(0.0));
    assert_eq!(
        metric(&m, "vramroom_admission_rejections_total{reason=\"memory\"}"),
        Some(shed as f64)
    );
    assert_eq!(
        metric(&m, "vramroom_requests_total{code=\"200\"}"),
        Some(ok as f64)
    );
    // Every batch peaked at or below its prediction.
    assert_eq!(
        metric(&m, "vramroom_prediction_underestimates_total"),
        Some(0.0)
    );
    good_lm_request(addr).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_that_can_never_fit_is_422_not_503() {
    let key = BatchKey::Tokens { len: 8 };
    let (limit, _) = room_for("zoo-gpt-tiny", key, 1.5);
    let mut c = cfg("zoo-gpt-tiny");
    c.capacity = 8 << 20;
    c.margin = Margin::Bytes((8 << 20) - limit);
    let (h, addr) = serve(c).await;
    good_lm_request(addr).await;
    let r = post_json(addr, &json!({"inputs": (0..32).collect::<Vec<_>>()})).await;
    assert_error(&r, 422, "capacity");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_form_batches() {
    let _s = SERIAL.lock().await;
    let mut c = cfg("zoo-gpt-tiny");
    c.max_wait = Duration::from_secs(3);
    c.max_batch = 8;
    c.latency = LatencyTarget::Off;
    let (h, addr) = serve(c).await;
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(async move { post_json(addr, &json!({"inputs": [i, i + 1, 2]})).await })
        })
        .collect();
    let mut sizes = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        sizes.push(r.json()["batch_size"].as_u64().unwrap());
    }
    // Eight requests within the wait fill one batch; it leaves as soon as it is full.
    assert!(sizes.iter().all(|&s| s == 8), "batch sizes {sizes:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "the full batch waited"
    );
    let m = get(addr, "/metrics").await.text();
    assert_eq!(metric(&m, "vramroom_batch_size_count"), Some(1.0));
    assert_eq!(
        metric(&m, "vramroom_batch_size_bucket{le=\"4\"}"),
        Some(0.0)
    );
    assert_eq!(
        metric(&m, "vramroom_batch_size_bucket{le=\"8\"}"),
        Some(1.0)
    );
    assert_eq!(metric(&m, "vramroom_batch_samples{slot=\"0\"}"), Some(8.0));
    // Requests of different buckets do not share a batch.
    let a = tokio::spawn(async move { post_json(addr, &json!({"inputs": [1]})).await });
    let b = tokio::spawn(async move {
        post_json(addr, &json!({"inputs": (0..20).collect::<Vec<_>>()})).await
    });
    let (a, b) = (a.await.unwrap().json(), b.await.unwrap().json());
    assert_eq!(
        (a["batch_size"].as_u64(), b["batch_size"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        (a["padded_len"].as_u64(), b["padded_len"].as_u64()),
        (Some(8), Some(32))
    );
    h.shutdown().await;
}

/// Checks the whole exposition against the text format: every sample belongs to a family
/// declared by HELP and TYPE before it, names and labels are well formed, values parse.
fn check_exposition(text: &str) -> BTreeSet<String> {
    let mut declared: BTreeSet<String> = BTreeSet::new();
    let mut typed: std::collections::BTreeMap<String, String> = Default::default();
    let mut families = BTreeSet::new();
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (n, help) = rest.split_once(' ').expect("HELP has text");
            assert!(name_ok(n) && !help.is_empty(), "{line}");
            declared.insert(n.to_string());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (n, t) = rest.split_once(' ').expect("TYPE has a type");
            assert!(declared.contains(n), "TYPE before HELP: {line}");
            assert!(["gauge", "counter", "histogram"].contains(&t), "{line}");
            typed.insert(n.to_string(), t.to_string());
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.is_empty(),
            "stray line {line:?}"
        );
        let (series, value) = line.rsplit_once(' ').expect("sample has a value");
        assert!(
            value.parse::<f64>().is_ok() || ["NaN", "+Inf", "-Inf"].contains(&value),
            "{line}"
        );
        let name = series.split('{').next().unwrap();
        assert!(name_ok(name), "{line}");
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
                for kv in labels[1..labels.len() - 1].split("\",") {
                    let (k, v) = kv.split_once("=\"").expect("label=\"value\"");
                    assert!(name_ok(k), "{line}");
                    assert!(!v.trim_end_matches('"').contains('"'), "{line}");
                }
            }
        }
        let family = typed
            .keys()
            .filter(|f| {
                name == f.as_str()
                    || (typed[*f] == "histogram"
                        && [
                            format!("{f}_bucket"),
                            format!("{f}_sum"),
                            format!("{f}_count"),
                        ]
                        .contains(&name.to_string()))
            })
            .max_by_key(|f| f.len())
            .unwrap_or_else(|| panic!("sample of an undeclared family: {line}"));
        families.insert(family.clone());
    }
    families
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_text_format_and_export_the_agreed_names() {
    let (h, addr) = serve(cfg("zoo-gpt-tiny")).await;
    good_lm_request(addr).await;
    let r = get(addr, "/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text();
    let families = check_exposition(&text);
    for name in [
        "vramroom_memory_allocated_bytes",
        "vramroom_memory_reserved_bytes",
        "vramroom_memory_capacity_bytes",
        "vramroom_max_memory_allocated_bytes",
        "vramroom_max_memory_reserved_bytes",
        "vramroom_num_ooms_total",
        "vramroom_memory_stats",
        "vramroom_requests_total",
        "vramroom_admission_rejections_total",
        "vramroom_queue_depth",
        "vramroom_batch_size",
        "vramroom_request_queue_seconds",
        "vramroom_request_compute_seconds",
        "vramroom_batch_predicted_peak_bytes",
        "vramroom_batch_actual_peak_bytes",
    ] {
        assert!(families.contains(name), "{name} missing");
    }
    assert!(text.contains("# TYPE vramroom_num_ooms_total counter"));
    assert!(text.contains("# TYPE vramroom_memory_stats gauge"));
    // Every memory_stats() key, with the allocator's value at scrape time.
    let stats = h.app().replicas.first().probe.memory_stats();
    assert!(stats.len() > 100);
    for (k, v) in &stats {
        if k.contains("current") && k.starts_with("allocated_bytes.all") {
            let s = format!("vramroom_memory_stats{{key=\"{k}\"}}");
            assert_eq!(metric(&text, &s), Some(*v as f64), "{s}");
        }
        assert!(
            text.contains(&format!("vramroom_memory_stats{{key=\"{k}\"}} ")),
            "{k}"
        );
    }
    assert_eq!(
        metric(&text, "vramroom_memory_allocated_bytes"),
        Some(h.app().replicas.first().model.device().memory_allocated() as f64)
    );
    assert_eq!(
        metric(&text, "vramroom_memory_capacity_bytes"),
        Some((256u64 << 20) as f64)
    );
    assert_eq!(
        metric(&text, "vramroom_requests_total{code=\"200\"}"),
        Some(1.0)
    );
    // The one batch ran alone: its actual peak is measured and within the prediction.
    let pred = metric(&text, "vramroom_batch_predicted_peak_bytes{slot=\"0\"}").unwrap();
    let actual = metric(&text, "vramroom_batch_actual_peak_bytes{slot=\"0\"}").unwrap();
    assert!(
        actual > 0.0 && actual <= pred,
        "actual {actual}, predicted {pred}"
    );
    // The `vramroom http` client's parser reads the same scrape into its memory fields.
    let e = vramroom_load::http::prometheus::parse(&text).expect("the client parses it");
    let mapped = vramroom_load::http::prometheus::MetricMap::known().apply(&e);
    let alloc = h.app().replicas.first().model.device().memory_allocated();
    assert_eq!(mapped.reading.allocated, Some(alloc));
    assert_eq!(mapped.reading.capacity, Some(256 << 20));
    assert_eq!(mapped.reading.num_ooms, Some(0));
    assert!(mapped.reading.reserved.is_some() && mapped.reading.max_allocated.is_some());
    assert_eq!(mapped.memory_stats, stats);
    let hz = get(addr, "/healthz").await;
    assert_eq!(hz.status, 200);
    let v = hz.json();
    assert_eq!(
        (v["status"].as_str(), v["model"].as_str()),
        (Some("ok"), Some("zoo-gpt-tiny"))
    );
    assert_eq!(v["device"], "cpu");
    assert!(v["allocated_bytes"].as_u64().unwrap() > 0);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_drains_queued_requests() {
    let mut c = cfg("zoo-gpt-tiny");
    c.max_wait = Duration::from_secs(5);
    c.latency = LatencyTarget::Off;
    let (h, addr) = serve(c).await;
    let tasks: Vec<_> = (0..3)
        .map(|i| tokio::spawn(async move { post_json(addr, &json!({"inputs": [i]})).await }))
        .collect();
    let t0 = Instant::now();
    while h.app().replicas.first().sched.depth().0 < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "requests never queued"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let report = h.shutdown().await;
    assert!(report.drained);
    // Draining does not wait for the batch to fill.
    assert!(report.elapsed < Duration::from_secs(4), "{report:?}");
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["batch_size"], 3);
    }
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}

/// A client stuck sending its body is not work the drain waits for: it is answered 503 at
/// once and the drain ends, whatever the drain timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_client_cannot_hold_shutdown() {
    let mut c = cfg("zoo-gpt-tiny");
    c.drain_timeout = Duration::from_secs(30);
    let (h, addr) = serve(c).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"in")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let report = tokio::time::timeout(Duration::from_secs(10), h.shutdown())
        .await
        .expect("shutdown is bounded");
    assert!(report.drained, "{report:?}");
    assert!(report.elapsed < Duration::from_secs(3), "{report:?}");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
}

/// Work that cannot finish within the drain timeout: the drain stops there, and the
/// report counts what was still queued or running, which the 503s went to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_times_out_reports_what_was_left() {
    let _s = SERIAL.lock().await;
    let mut c = cfg("zoo-gpt-small");
    c.max_wait = Duration::from_secs(5);
    c.max_batch = 1;
    c.latency = LatencyTarget::Off;
    c.drain_timeout = Duration::from_millis(1);
    let (h, addr) = serve(c).await;
    // the batch still running when the drain gives up may have its connection reset
    // (nothing else would answer it): that request is neither served nor shed
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(async move {
                try_post_json(addr, &json!({"inputs": [vec![i; 128]]}))
                    .await
                    .ok()
            })
        })
        .collect();
    let t0 = Instant::now();
    // one batch running, the rest queued behind it
    while h.app().replicas.first().sched.depth().0 < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "requests never queued"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let report = tokio::time::timeout(Duration::from_secs(30), h.shutdown())
        .await
        .expect("shutdown is bounded");
    assert!(!report.drained, "{report:?}");
    assert!(report.in_flight_at_start >= 2, "{report:?}");
    assert!(report.queued_at_timeout >= 1, "{report:?}");
    let mut shed = 0;
    for t in tasks {
        if t.await.unwrap().is_some_and(|r| r.status == 503) {
            shed += 1;
        }
    }
    // the queued ones got their 503; one still being admitted may have too (a drain
    // refuses new work)
    assert!(shed >= report.queued_at_timeout, "{shed} {report:?}");
    assert!(shed <= report.in_flight_at_start, "{shed} {report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_requests_wait_no_longer_than_the_latency_target() {
    let _s = SERIAL.lock().await;
    let target = Duration::from_millis(30);
    let mut c = cfg("zoo-gpt-small");
    c.latency = LatencyTarget::Fixed(target);
    c.max_wait = Duration::from_millis(2);
    let (h, addr) = serve(c).await;
    let seq: Vec<i64> = (0..60).collect();
    // 24 closed-loop clients, 6 requests each: far more work than 30 ms holds.
    let tasks: Vec<_> = (0..24)
        .map(|_| {
            let seq = seq.clone();
            tokio::spawn(async move {
                let mut out = Vec::new();
                for _ in 0..6 {
                    out.push(post_json(addr, &json!({ "inputs": seq })).await);
                }
                out
            })
        })
        .collect();
    let mut ok = Vec::new();
    let mut shed = 0;
    for t in tasks {
        for r in t.await.unwrap() {
            match r.status {
                200 => ok.push(r.json()),
                503 => {
                    shed += 1;
                    assert!(r.header("retry-after").is_some());
                }
                s => panic!("{s}: {}", r.text()),
            }
        }
    }
    assert!(
        !ok.is_empty() && shed > 0,
        "{} admitted, {shed} shed",
        ok.len()
    );
    let worst_queue = ok
        .iter()
        .map(|v| v["queue_ms"].as_f64().unwrap())
        .fold(0.0, f64::max);
    // The dispatch-time check bounds the wait itself; the slack is for a preempted thread
    // between the check and the batch's start on a loaded CI machine.
    assert!(
        worst_queue <= target.as_secs_f64() * 1e3 * 1.5,
        "an admitted request waited {worst_queue:.1} ms"
    );
    let m = get(addr, "/metrics").await.text();
    let by_latency = metric(
        &m,
        "vramroom_admission_rejections_total{reason=\"queue_delay\"}",
    )
    .unwrap()
        + metric(
            &m,
            "vramroom_admission_rejections_total{reason=\"deadline\"}",
        )
        .unwrap();
    assert_eq!(by_latency, shed as f64);
    good_lm_request(addr).await;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_the_prediction_missed_is_a_503_and_the_server_keeps_serving() {
    let mut c = cfg("zoo-gpt-tiny");
    c.capacity = 16 << 20;
    c.max_wait = Duration::from_secs(1);
    c.latency = LatencyTarget::Off;
    let (h, addr) = serve(c).await;
    good_lm_request(addr).await;
    let req = tokio::spawn(async move { post_json(addr, &json!({"inputs": [4, 5, 6]})).await });
    let t0 = Instant::now();
    while h.app().replicas.first().sched.depth().0 == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "request never queued"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Admitted and queued; now something outside the ledger takes every free byte of the
    // device (cached blocks included), as a misprediction or a leak would.
    let dev = h.app().replicas.first().model.device().clone();
    dev.empty_cache();
    let mut hog = Vec::new();
    let mut size = 16usize << 20;
    while size >= 512 {
        match Tensor::empty(&[size], DType::U8, &dev) {
            Ok(t) => hog.push(t),
            Err(_) => size /= 2,
        }
    }
    let r = req.await.unwrap();
    assert_error(&r, 503, "ran out of device memory");
    assert!(r.header("retry-after").is_some());
    drop(hog);
    good_lm_request(addr).await;
    let m = get(addr, "/metrics").await.text();
    assert_eq!(
        metric(&m, "vramroom_admission_rejections_total{reason=\"oom\"}"),
        Some(1.0)
    );
    assert!(metric(&m, "vramroom_num_ooms_total").unwrap() >= 1.0);
    h.shutdown().await;
}
