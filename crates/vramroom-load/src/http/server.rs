//! A small loopback HTTP/1.1 server on hyper, for tests and `vramroom bench http`.
//!
//! Design note: the server runs on its own tokio runtime (its own threads), so a test or
//! the bench can drive it from any thread and tear it down by dropping it. What it answers
//! is a function of the request ([`Seen`]: arrival number, time since start, method, path,
//! body length) to a [`Reply`] (status, body, a delay before answering), which is enough
//! to script a service that stalls for a window, sheds load with 503, echoes body sizes or
//! exports Prometheus metrics. It counts requests and the most it had in flight.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// What the handler sees of a request.
#[derive(Debug, Clone)]
pub struct Seen {
    /// 0-based arrival number.
    pub seq: u64,
    /// Since the server started.
    pub since_start: Duration,
    pub method: String,
    pub path: String,
    pub body_len: usize,
    /// Requests in flight at arrival, this one included.
    pub in_flight: usize,
}

/// What to answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
    /// Wait this long before answering.
    pub delay: Duration,
    pub content_type: &'static str,
}

impl Reply {
    pub fn ok(body: impl Into<Bytes>) -> Reply {
        Reply {
            status: 200,
            body: body.into(),
            delay: Duration::ZERO,
            content_type: "text/plain",
        }
    }
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            ..Reply::ok(Bytes::new())
        }
    }
    pub fn after(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }
}

pub type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// A running server; dropping it stops it.
pub struct TestServer {
    addr: SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
    requests: Arc<AtomicU64>,
    peak_in_flight: Arc<AtomicUsize>,
}

impl TestServer {
    /// Starts on `127.0.0.1:0` with `threads` runtime threads.
    pub fn start(threads: usize, handler: Handler) -> std::io::Result<TestServer> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("vramroom-test-server")
            .enable_all()
            .build()?;
        let listener = rt.block_on(async {
            let s = tokio::net::TcpSocket::new_v4()?;
            s.set_reuseaddr(true)?;
            s.bind("127.0.0.1:0".parse().expect("constant address"))?;
            s.listen(4096)
        })?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let peak_in_flight = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        {
            let requests = requests.clone();
            let peak = peak_in_flight.clone();
            rt.spawn(async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    };
                    let _ = tcp.set_nodelay(true);
                    let handler = handler.clone();
                    let requests = requests.clone();
                    let in_flight = in_flight.clone();
                    let peak = peak.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: Request<Incoming>| {
                            let handler = handler.clone();
                            let requests = requests.clone();
                            let in_flight = in_flight.clone();
                            let peak = peak.clone();
                            async move {
                                let seq = requests.fetch_add(1, Ordering::Relaxed);
                                let now = in_flight.fetch_add(1, Ordering::Relaxed) + 1;
                                peak.fetch_max(now, Ordering::Relaxed);
                                let method = req.method().to_string();
                                let path = req
                                    .uri()
                                    .path_and_query()
                                    .map(|p| p.as_str().to_string())
                                    .unwrap_or_default();
                                let body_len = match req.into_body().collect().await {
                                    Ok(b) => b.to_bytes().len(),
                                    Err(_) => 0,
                                };
                                let seen = Seen {
                                    seq,
                                    since_start: start.elapsed(),
                                    method,
                                    path,
                                    body_len,
                                    in_flight: now,
                                };
                                let reply = handler(&seen);
                                if !reply.delay.is_zero() {
                                    tokio::time::sleep(reply.delay).await;
                                }
                                in_flight.fetch_sub(1, Ordering::Relaxed);
                                let mut resp = Response::new(Full::new(reply.body));
                                *resp.status_mut() = StatusCode::from_u16(reply.status)
                                    .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                                resp.headers_mut().insert(
                                    hyper::header::CONTENT_TYPE,
                                    hyper::header::HeaderValue::from_static(reply.content_type),
                                );
                                Ok::<_, Infallible>(resp)
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tcp), svc)
                            .await;
                    });
                }
            });
        }
        Ok(TestServer {
            addr,
            rt: Some(rt),
            requests,
            peak_in_flight,
        })
    }

    /// A server that answers `200 ok` at once: the bench's target.
    pub fn hello(threads: usize) -> std::io::Result<TestServer> {
        let body = Bytes::from_static(b"ok");
        TestServer::start(threads, Arc::new(move |_: &Seen| Reply::ok(body.clone())))
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
    /// Most requests in flight at once.
    pub fn peak_in_flight(&self) -> usize {
        self.peak_in_flight.load(Ordering::Relaxed)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
