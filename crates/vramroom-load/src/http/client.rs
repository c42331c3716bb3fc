//! The HTTP/1.1 client: one hyper connection per worker, kept alive across requests.
//!
//! Design note: load is generated with hyper's low-level `client::conn::http1` API rather
//! than a pooled client, as oha does: each worker (closed model) or each connection slot
//! (open model) owns one TCP connection with `TCP_NODELAY`, reused for every request
//! (HTTP/1.1 keep-alive) and reopened only when the server closes it or a request fails.
//! Nothing is looked up, locked or allocated per request beyond the request itself: the
//! method, path and headers are built once ([`RequestTemplate`]), bodies are `Bytes`
//! (shared, or cut from a shared buffer), and the response body is drained frame by frame
//! and only counted, never buffered. The connection's I/O future is polled by the task that
//! sends on it ([`exchange`] polls both), not spawned as a task of its own: a request then
//! costs no hand-off between tasks, which measured 1.5x the throughput of the spawned
//! design on a two-core loopback run against wrk.
//!
//! Errors are sorted into a few kinds a user can act on ([`ErrorKind`]): connect refused
//! or timed out, request timed out, connection closed mid-request, protocol error.
//!
//! Only `http://` is supported: TLS would measure the handshake and the cipher as much as
//! the service, and every service under test here sits behind plain HTTP on a private
//! network or loopback.

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::error::{LoadError, Result};

/// Where requests go: the resolved address and the parts of the URL a request needs.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL as given.
    pub url: String,
    pub addrs: Vec<SocketAddr>,
    /// `host[:port]` for the `Host` header.
    pub authority: String,
    /// Origin-form request target (`/path?query`).
    pub path: Uri,
}

/// Parses and resolves an `http://` URL. DNS runs here, once, before the run.
pub fn resolve(url: &str) -> Result<Target> {
    let bad = |m: String| LoadError::Http(format!("{url:?}: {m}"));
    let uri: Uri = url
        .trim()
        .parse()
        .map_err(|e| bad(format!("not a URL ({e})")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                "https is not supported (point the load at the service's plain HTTP port)".into(),
            ))
        }
        Some(s) => return Err(bad(format!("unsupported scheme {s:?} (expected http://)"))),
        None => return Err(bad("no scheme (expected http://host:port/path)".into())),
    }
    let auth = uri
        .authority()
        .ok_or_else(|| bad("no host".into()))?
        .clone();
    if auth.as_str().contains('@') {
        return Err(bad("user info in the URL is not supported".into()));
    }
    let host = auth.host().trim_start_matches('[').trim_end_matches(']');
    let port = auth.port_u16().unwrap_or(80);
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| bad(format!("cannot resolve {host:?}: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(bad(format!("{host:?} has no address")));
    }
    let path: Uri = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .parse()
        .map_err(|e| bad(format!("bad path ({e})")))?;
    Ok(Target {
        url: url.trim().to_string(),
        addrs,
        authority: auth.as_str().to_string(),
        path,
    })
}

/// Why a request got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorKind {
    /// Nobody listens (`ECONNREFUSED`).
    ConnectRefused,
    /// The connection was not established within the timeout.
    ConnectTimeout,
    /// Another connect error (unreachable, reset, too many open files).
    Connect,
    /// No complete answer within `--timeout`.
    Timeout,
    /// The server closed the connection before the answer was complete.
    ConnectionClosed,
    /// The answer was not HTTP/1.1 as hyper reads it.
    Protocol,
    /// Another I/O error while sending or reading.
    Io,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 7] = [
        ErrorKind::ConnectRefused,
        ErrorKind::ConnectTimeout,
        ErrorKind::Connect,
        ErrorKind::Timeout,
        ErrorKind::ConnectionClosed,
        ErrorKind::Protocol,
        ErrorKind::Io,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::ConnectRefused => "connect_refused",
            ErrorKind::ConnectTimeout => "connect_timeout",
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::ConnectionClosed => "connection_closed",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Io => "io",
        }
    }
    pub fn index(self) -> usize {
        self as usize
    }
    fn of(e: &hyper::Error) -> ErrorKind {
        if e.is_parse() || e.is_parse_status() || e.is_user() {
            ErrorKind::Protocol
        } else if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
            ErrorKind::ConnectionClosed
        } else if e.is_timeout() {
            ErrorKind::Timeout
        } else {
            ErrorKind::Io
        }
    }
}

/// Method, path and headers of every request, built once.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    pub method: Method,
    pub path: Uri,
    pub headers: HeaderMap,
}

impl RequestTemplate {
    /// `headers` are `-H 'Name: value'` lines. `Host` is the target's unless given;
    /// `content_type` is set unless a `Content-Type` header was given.
    pub fn new(
        target: &Target,
        method: &str,
        headers: &[String],
        content_type: Option<&str>,
    ) -> Result<RequestTemplate> {
        let method = Method::from_bytes(method.trim().to_ascii_uppercase().as_bytes())
            .map_err(|_| LoadError::Config(format!("{method:?} is not an HTTP method")))?;
        let mut map = HeaderMap::new();
        for h in headers {
            let (k, v) = h
                .split_once(':')
                .ok_or_else(|| LoadError::Config(format!("-H {h:?}: expected 'Name: value'")))?;
            let name = HeaderName::from_bytes(k.trim().as_bytes())
                .map_err(|_| LoadError::Config(format!("-H {h:?}: bad header name")))?;
            let value = HeaderValue::from_str(v.trim())
                .map_err(|_| LoadError::Config(format!("-H {h:?}: bad header value")))?;
            map.append(name, value);
        }
        if !map.contains_key(HOST) {
            let v = HeaderValue::from_str(&target.authority)
                .map_err(|_| LoadError::Http(format!("bad host {:?}", target.authority)))?;
            map.insert(HOST, v);
        }
        if let Some(ct) = content_type {
            if !map.contains_key(CONTENT_TYPE) {
                map.insert(CONTENT_TYPE, HeaderValue::from_static(ct_static(ct)));
            }
        }
        Ok(RequestTemplate {
            method,
            path: target.path.clone(),
            headers: map,
        })
    }

    pub fn build(&self, body: Bytes) -> Request<Full<Bytes>> {
        let mut r = Request::new(Full::new(body));
        *r.method_mut() = self.method.clone();
        *r.uri_mut() = self.path.clone();
        *r.headers_mut() = self.headers.clone();
        r
    }

    /// Bytes of the request line and headers as sent (for the bytes-sent figure).
    pub fn head_len(&self) -> u64 {
        let mut n = self.method.as_str().len() + 1 + self.path.to_string().len() + 11;
        for (k, v) in &self.headers {
            n += k.as_str().len() + 2 + v.len() + 2;
        }
        n as u64 + 2
    }
}

fn ct_static(ct: &str) -> &'static str {
    match ct {
        "application/json" => "application/json",
        _ => "application/octet-stream",
    }
}

type Io = hyper::client::conn::http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// One live connection: the handle that sends and the future that does the I/O, polled
/// together by whoever sends.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    io: Pin<Box<Io>>,
    /// The I/O future has finished: the connection is closed.
    closed: bool,
}

/// Opens a connection to the first address that answers.
pub async fn connect(target: &Target, timeout: Duration) -> std::result::Result<Conn, ErrorKind> {
    let mut last = ErrorKind::Connect;
    for addr in &target.addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Err(_) => last = ErrorKind::ConnectTimeout,
            Ok(Err(e)) => {
                last = if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    ErrorKind::ConnectRefused
                } else {
                    ErrorKind::Connect
                }
            }
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                let (sender, io) = http1::handshake(TokioIo::new(tcp))
                    .await
                    .map_err(|e| ErrorKind::of(&e))?;
                return Ok(Conn {
                    sender,
                    io: Box::pin(io),
                    closed: false,
                });
            }
        }
    }
    Err(last)
}

/// What an answer was: its status, the body bytes read, and whether it was a 5xx whose body
/// names a CUDA out-of-memory error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body_bytes: u64,
    pub oom: bool,
    /// The answer's `Retry-After` in whole seconds (a service shedding load says when to
    /// come back); `None` without one, or with an HTTP date.
    pub retry_after_s: Option<u64>,
}

/// How much of a 5xx body is searched for an OOM message: services put PyTorch's message
/// (or the exception's name) near the start of their error answer.
const OOM_SCAN_BYTES: usize = 64 * 1024;

/// Whether an error body names a CUDA OOM: PyTorch's message (`CUDA out of memory`) or its
/// exception (`torch.OutOfMemoryError`, `torch.cuda.OutOfMemoryError`). Many services answer
/// 500, 503 or 507 with it; counting those as "other errors" hides the OOM.
pub fn body_names_oom(body: &[u8]) -> bool {
    const NEEDLES: [&[u8]; 2] = [b"CUDA out of memory", b"OutOfMemoryError"];
    NEEDLES
        .iter()
        .any(|n| body.windows(n.len()).any(|w| w == *n))
}

/// Sends one request and reads the whole answer, driving the connection's I/O meanwhile.
pub async fn exchange(
    conn: &mut Conn,
    req: Request<Full<Bytes>>,
) -> std::result::Result<Answer, ErrorKind> {
    let Conn { sender, io, closed } = conn;
    let fut = async move {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ErrorKind::of(&e))?;
        let status = resp.status().as_u16();
        let retry_after_s = resp
            .headers()
            .get(hyper::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let mut body = resp.into_body();
        let mut n = 0u64;
        // Only 5xx bodies are kept (the first bytes), to look for an OOM message: the hot
        // path of ok answers copies nothing.
        let mut head: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ErrorKind::of(&e))?;
            if let Some(d) = frame.data_ref() {
                n += d.len() as u64;
                if status >= 500 && head.len() < OOM_SCAN_BYTES {
                    let take = d.len().min(OOM_SCAN_BYTES - head.len());
                    head.extend_from_slice(&d[..take]);
                }
            }
        }
        Ok(Answer {
            status,
            body_bytes: n,
            oom: status >= 500 && body_names_oom(&head),
            retry_after_s,
        })
    };
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        // The request first (it queues itself for the I/O), then the I/O (which writes it,
        // or reads the answer and hands it to the request), then the request again: what
        // the I/O just delivered is taken in this same poll, not after a wake-up and a trip
        // through the scheduler.
        if let Poll::Ready(r) = fut.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        if !*closed && io.as_mut().poll(cx).is_ready() {
            // The connection ended: the request either completes now or never will.
            *closed = true;
        }
        fut.as_mut().poll(cx)
    })
    .await
}

/// Whether the connection can take another request: waits (driving the I/O) until hyper
/// says it is ready, or that it closed (after a `Connection: close` answer, or a server
/// that hung up while the connection was idle).
pub async fn usable(conn: &mut Conn) -> bool {
    let Conn { sender, io, closed } = conn;
    std::future::poll_fn(|cx| loop {
        match sender.poll_ready(cx) {
            Poll::Ready(r) => return Poll::Ready(r.is_ok()),
            Poll::Pending if *closed => return Poll::Ready(false),
            Poll::Pending => {}
        }
        match io.as_mut().poll(cx) {
            Poll::Ready(_) => *closed = true,
            Poll::Pending => return Poll::Pending,
        }
    })
    .await
}

/// `GET url` with a timeout, returning the status and the whole body, at most a metrics
/// body's cap ([`super::limits::METRICS`]): for scrapes (not on the load's hot path).
pub async fn get(
    target: &Target,
    timeout: Duration,
    method: Method,
) -> std::result::Result<(u16, Bytes), String> {
    get_limited(target, timeout, method, super::limits::METRICS).await
}

/// [`get`] with the body capped at `limit` while it streams in: a body past it is an error
/// naming the cap, never a buffer that grows without bound.
pub async fn get_limited(
    target: &Target,
    timeout: Duration,
    method: Method,
    limit: vramroom_alloc::input::Limit,
) -> std::result::Result<(u16, Bytes), String> {
    let fut = async {
        let c = connect(target, timeout)
            .await
            .map_err(|k| k.as_str().to_string())?;
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.method_mut() = method;
        *req.uri_mut() = target.path.clone();
        req.headers_mut().insert(
            HOST,
            HeaderValue::from_str(&target.authority).map_err(|e| e.to_string())?,
        );
        let Conn { mut sender, io, .. } = c;
        // Not the hot path: the I/O runs as its own task, and ends with the connection.
        tokio::spawn(async move {
            let _ = io.await;
        });
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| ErrorKind::of(&e).as_str().to_string())?;
        let status = resp.status().as_u16();
        let cap = usize::try_from(limit.bytes).unwrap_or(usize::MAX);
        let body = http_body_util::Limited::new(resp.into_body(), cap)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    vramroom_alloc::input::too_large(limit, &target.path.to_string()).to_string()
                } else {
                    e.to_string()
                }
            })?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = resolve("http://127.0.0.1:8080/v1/x?a=b").unwrap();
        assert_eq!(t.authority, "127.0.0.1:8080");
        assert_eq!(t.path, "/v1/x?a=b");
        assert_eq!(t.addrs[0].port(), 8080);
        let t = resolve("http://localhost").unwrap();
        assert_eq!(t.path, "/");
        assert_eq!(t.addrs[0].port(), 80);
        let t = resolve("http://[::1]:9/").unwrap();
        assert!(t.addrs[0].is_ipv6());
        for (bad, what) in [
            ("https://x", "https"),
            ("ftp://x/", "scheme"),
            ("localhost:80", "scheme"),
            ("http://", "URL"),
            ("http://no-such-host.invalid/", "resolve"),
            ("not a url", "URL"),
        ] {
            let e = resolve(bad).expect_err(bad).to_string();
            assert!(e.contains(what), "{bad}: {e}");
        }
    }

    #[test]
    fn request_template() {
        let t = resolve("http://127.0.0.1:1/p").unwrap();
        let r = RequestTemplate::new(
            &t,
            "post",
            &["X-A: 1".into(), "x-a: 2".into()],
            Some("application/json"),
        )
        .unwrap();
        assert_eq!(r.method, Method::POST);
        assert_eq!(r.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(r.headers[HOST], "127.0.0.1:1");
        assert_eq!(r.headers[CONTENT_TYPE], "application/json");
        let req = r.build(Bytes::from_static(b"{}"));
        assert_eq!(req.uri(), "/p");
        let r2 = RequestTemplate::new(
            &t,
            "GET",
            &["Content-Type: text/x".into()],
            Some("application/json"),
        )
        .unwrap();
        assert_eq!(r2.headers[CONTENT_TYPE], "text/x");
        for bad in [&["nocolon"][..], &["bad name: x"], &["k: \u{1}"]] {
            let h: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            assert!(
                RequestTemplate::new(&t, "GET", &h, None).is_err(),
                "{bad:?}"
            );
        }
        assert!(RequestTemplate::new(&t, "GE T", &[], None).is_err());
    }
}
