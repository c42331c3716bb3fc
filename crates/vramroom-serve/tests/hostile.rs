//! Hostile clients: memory and time outside admission control stay bounded. Huge or
//! never-ending heads, silent and idle connections, more connections than the cap,
//! slowloris at shutdown, a content type of raw bytes, an oversized body over h2c, and a
//! client cycling through input shapes.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use vramroom_serve::conn::ConnLimits;
use vramroom_serve::{start, ServeConfig, ServerHandle};

use common::*;

/// These tests measure time, memory and connection counts: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cfg(limits: ConnLimits) -> ServeConfig {
    ServeConfig {
        model: "mlp-tiny".parse().unwrap(),
        addr: "127.0.0.1:0".parse().unwrap(),
        capacity: 256 << 20,
        max_wait: Duration::from_millis(2),
        drain_timeout: Duration::from_secs(31),
        limits,
        ..ServeConfig::default()
    }
}

async fn serve(c: ServeConfig) -> (ServerHandle, SocketAddr) {
    let h = start(c).await.expect("server starts");
    let a = h.local_addr();
    (h, a)
}

/// Reads until EOF, reset or `limit`; what came, and whether the peer closed.
async fn read_some(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (buf, true),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return (buf, false),
        }
    }
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_64_kib_gets_431() {
    let _s = SERIAL.lock().await;
    let (h, addr) = serve(cfg(ConnLimits::default())).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 70 << 10));
    // half the head, a pause, the rest: the server has read everything when it decides
    let _ = s.write_all(&head).await;
    let (got, closed) = read_some(&mut s, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 431"), "{text:?}");
    assert!(closed, "the connection stays open after a 431");
    // and a normal head still works
    assert_eq!(get(addr, "/healthz").await.status, 200);
    h.shutdown().await;
}

/// 300 clients each sending a 400 KB header that never ends: each is cut at 64 KiB and
/// closed, and the server's memory grows by far less than the 120 MB they sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_ending_heads_cannot_grow_memory() {
    let _s = SERIAL.lock().await;
    let (h, addr) = serve(cfg(ConnLimits::default())).await;
    let before = rss_bytes();
    let clients: Vec<_> = (0..300)
        .map(|_| {
            tokio::spawn(async move {
                let Ok(mut s) = TcpStream::connect(addr).await else {
                    return false;
                };
                let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: ").await;
                let chunk = vec![b'a'; 16 << 10];
                for _ in 0..25 {
                    if s.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
                // never the final CRLF: the server must end it
                let (_, closed) = read_some(&mut s, Duration::from_secs(15)).await;
                closed
            })
        })
        .collect();
    let mut closed = 0;
    for c in clients {
        if c.await.unwrap() {
            closed += 1;
        }
    }
    let grew = rss_bytes().saturating_sub(before);
    assert_eq!(
        closed, 300,
        "every never-ending head was closed by the server"
    );
    assert!(grew < 60 << 20, "RSS grew {} MiB", grew >> 20);
    // the server's side of each close is counted a moment after the client sees it
    let t0 = Instant::now();
    loop {
        let m = get(addr, "/metrics").await.text();
        if metric(&m, "vramroom_connections_open") == Some(1.0) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_trickling_and_idle_connections_are_closed() {
    let _s = SERIAL.lock().await;
    let limits = ConnLimits {
        header_timeout: Duration::from_millis(400),
        idle_timeout: Duration::from_millis(600),
        ..ConnLimits::default()
    };
    let (h, addr) = serve(cfg(limits)).await;
    // says nothing at all
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // trickles a head one byte at a time, never finishing
    let mut trickle = TcpStream::connect(addr).await.unwrap();
    let t0 = Instant::now();
    let trickler = tokio::spawn(async move {
        for b in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: aaaaaaaaaaaaaaaaaaaaaaaaaaa".iter() {
            if trickle.write_all(&[*b]).await.is_err() {
                return (true, t0.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (_, closed) = read_some(&mut trickle, Duration::from_secs(5)).await;
        (closed, t0.elapsed())
    });
    let (_, closed) = read_some(&mut silent, Duration::from_secs(5)).await;
    assert!(closed, "a silent connection was kept");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let (closed, at) = trickler.await.unwrap();
    assert!(
        closed && at < Duration::from_secs(4),
        "trickle: {closed} {at:?}"
    );
    // keep-alive: one request, then nothing
    let mut ka = TcpStream::connect(addr).await.unwrap();
    ka.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let t1 = Instant::now();
    let (got, closed) = read_some(&mut ka, Duration::from_secs(5)).await;
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    assert!(
        closed && t1.elapsed() < Duration::from_secs(3),
        "{:?}",
        t1.elapsed()
    );
    let m = get(addr, "/metrics").await.text();
    assert!(
        metric(&m, "vramroom_connections_closed_idle_total").unwrap() >= 2.0,
        "{m}"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_a_free_one() {
    let _s = SERIAL.lock().await;
    let limits = ConnLimits {
        max_connections: 4,
        ..ConnLimits::default()
    };
    let (h, addr) = serve(cfg(limits)).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // a partial head: each connection is busy reading it
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // the fifth connects (the kernel's backlog) but is not served
    let mut fifth = TcpStream::connect(addr).await.unwrap();
    fifth
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (got, _) = read_some(&mut fifth, Duration::from_millis(500)).await;
    assert!(got.is_empty(), "served past the cap");
    assert_eq!(
        h.app()
            .conns
            .open
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
    drop(held.pop());
    let (got, _) = read_some(&mut fifth, Duration::from_secs(5)).await;
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"),
        "{got:?}"
    );
    drop(held);
    h.shutdown().await;
}

/// 50 slowloris connections and nothing queued: SIGTERM's drain ends at once (it used to
/// wait the whole drain timeout), and the report says nothing was in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_do_not_hold_the_drain() {
    let _s = SERIAL.lock().await;
    let (h, addr) = serve(cfg(ConnLimits::default())).await;
    let mut lorises = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        lorises.push(s);
    }
    // and a few bodies that will never finish arriving
    for _ in 0..3 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST /v1/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"in")
            .await
            .unwrap();
        lorises.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = tokio::time::timeout(Duration::from_secs(10), h.shutdown())
        .await
        .expect("shutdown is bounded");
    assert!(report.drained, "{report:?}");
    assert!(report.elapsed < Duration::from_secs(2), "{report:?}");
    assert_eq!(report.queued_at_timeout + report.running_at_timeout, 0);
    // every slowloris connection was closed
    for mut s in lorises {
        let (_, closed) = read_some(&mut s, Duration::from_secs(2)).await;
        assert!(closed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_type_that_is_not_text_is_415() {
    let _s = SERIAL.lock().await;
    let (h, addr) = serve(cfg(ConnLimits::default())).await;
    let body = br#"{"inputs": [[0.1, 0.2]]}"#;
    for ct in [&b"\xff\xfe"[..], b"application/json\xff", b"text/plain"] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut req = format!(
            "POST /v1/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\nContent-Type: ",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(ct);
        req.extend_from_slice(b"\r\n\r\n");
        req.extend_from_slice(body);
        s.write_all(&req).await.unwrap();
        let (got, _) = read_some(&mut s, Duration::from_secs(10)).await;
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with("HTTP/1.1 415"), "{ct:?}: {text}");
    }
    h.shutdown().await;
}

/// Over h2c (prior knowledge), a body over --max-body: the client gets its 413, whether
/// the size was declared or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_over_h2c_gets_its_413() {
    let _s = SERIAL.lock().await;
    let mut c = cfg(ConnLimits::default());
    c.max_body = 1024;
    let (h, addr) = serve(c).await;
    for declared in [true, false] {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .expect("h2 handshake");
        tokio::spawn(conn);
        let big = Bytes::from(vec![b'a'; 10 << 20]);
        let mut req = hyper::Request::post(format!("http://{addr}/v1/infer"))
            .header("content-type", "application/json");
        if declared {
            req = req.header("content-length", big.len());
        }
        let req = req.body(Full::new(big)).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(20), send.send_request(req))
            .await
            .expect("an answer in time")
            .expect("an answer, not a reset");
        assert_eq!(resp.status(), 413, "declared {declared}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("--max-body"));
    }
    h.shutdown().await;
}

/// A client cycling through shapes cannot grow the prediction cache past its bound; an
/// evicted prediction is made again, the same.
#[test]
fn the_prediction_cache_is_bounded() {
    use vramroom_alloc::AllocatorConfig;
    use vramroom_serve::{open_device, BatchKey, Predictor, ServeDevice};
    let dev = open_device(ServeDevice::Cpu, 256 << 20, &AllocatorConfig::default()).unwrap();
    let spec = "mlp-tiny".parse().unwrap();
    let p = Predictor::with_cache_capacity(&spec, &dev.twin, 64).unwrap();
    let first = p.predict(BatchKey::Rows, 1).unwrap();
    let reserved = dev.twin.memory_reserved();
    for n in 1..=300 {
        p.predict(BatchKey::Rows, n).unwrap();
        assert!(p.cache_stats().0 <= 64, "{} entries", p.cache_stats().0);
    }
    let (entries, evicted) = p.cache_stats();
    assert!(entries <= 64 && evicted >= 300 - 64, "{entries} {evicted}");
    assert_eq!(p.cached(BatchKey::Rows, 1), None, "the oldest was evicted");
    assert_eq!(p.predict(BatchKey::Rows, 1).unwrap(), first);
    // the twin keeps no cache of its own between predictions: it holds what it held
    // after the first one, however many shapes came since
    assert_eq!(dev.twin.memory_reserved(), reserved);
}
