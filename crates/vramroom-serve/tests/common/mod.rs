//! A tiny HTTP/1.1 client over a raw socket (so a test can also misbehave on purpose), and
//! the reference computations tests compare the server's answers with.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every request of a test gives up after this long: a wedged server fails the test
/// instead of hanging CI.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn parse(buf: &[u8]) -> Resp {
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(buf)));
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = buf[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Resp {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(i) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..i]).trim(), 16).unwrap_or(0);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
}

/// Sends one request on a fresh connection (`Connection: close`) and reads the answer.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    try_request(addr, method, path, headers, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// `request`, with an I/O error (a connection the server reset) returned, not a panic.
pub async fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut s = TcpStream::connect(addr).await?;
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await?;
        s.write_all(body).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok(parse(&buf))
    })
    .await
    .unwrap_or_else(|_| panic!("{method} {path} took over {REQUEST_TIMEOUT:?}"))
}

pub async fn post_json(addr: SocketAddr, v: &Value) -> Resp {
    try_post_json(addr, v)
        .await
        .unwrap_or_else(|e| panic!("POST /v1/infer: {e}"))
}

/// `post_json`, with an I/O error (a connection the server reset) returned.
pub async fn try_post_json(addr: SocketAddr, v: &Value) -> std::io::Result<Resp> {
    let body = serde_json::to_vec(v).expect("json");
    try_request(
        addr,
        "POST",
        "/v1/infer",
        &[("Content-Type", "application/json")],
        &body,
    )
    .await
}

pub async fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], b"").await
}

/// A sample's value from a Prometheus exposition, e.g. `metric(&m, "vramroom_num_ooms_total")`
/// or `metric(&m, "vramroom_requests_total{code=\"503\"}")`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, v) = l.rsplit_once(' ')?;
        (name == series).then(|| v.parse().ok())?
    })
}

/// Deterministic pseudo-random values in [-1, 1).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The memory for the model plus `n` single requests of `key` on a cpu device (margin 0),
/// and one request's predicted peak: the capacity tests give a server so that memory, not
/// latency, is what sheds.
pub fn room_for(model: &str, key: vramroom_serve::BatchKey, n: f64) -> (u64, u64) {
    use vramroom_serve::{open_device, Predictor, ServeDevice, ServedModel};
    let spec: vramroom_workload::ModelSpec = model.parse().unwrap();
    let conf = vramroom_alloc::AllocatorConfig::default();
    let d = open_device(ServeDevice::Cpu, 1 << 30, &conf).unwrap();
    let m = ServedModel::load(&spec, &d.run.device).unwrap();
    let p = Predictor::new(&spec, &d.twin).unwrap();
    let p1 = p.predict(key, 1).unwrap();
    (m.device().memory_allocated() + (n * p1 as f64) as u64, p1)
}
