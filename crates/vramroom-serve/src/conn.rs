//! Connections: accepting them under a cap, bounding what each may hold and for how long,
//! and closing the ones with no work at shutdown.
//!
//! Design note: admission control bounds the memory of the requests the server runs; this
//! module bounds the memory of the connections that carry them, which admission never sees.
//! Without it, 2000 clients each sending a 400 KB header that never ends held 700 MB of
//! buffers, and nothing ever closed them. The rules:
//! * at most [`ConnLimits::max_connections`] connections are open; past that the server
//!   stops accepting, and new clients wait in the kernel's backlog;
//! * a request head (HTTP/1 request line and headers) is at most
//!   [`ConnLimits::max_header_bytes`] (431 past it), and must arrive within
//!   [`ConnLimits::header_timeout`] of the server waiting for it (the connection is closed
//!   otherwise); HTTP/2 header lists have the same size bound;
//! * a connection with no request in flight is closed after
//!   [`ConnLimits::header_timeout`] when it never sent a request (a client that connects and
//!   trickles, or says nothing), and after [`ConnLimits::idle_timeout`] once its last request
//!   was answered (keep-alive, HTTP/2 pings);
//! * a request body must arrive within [`ConnLimits::body_timeout`] (408 otherwise; see
//!   `http::read_body`).
//!
//! Shutdown: every connection is told to finish (HTTP/1 keep-alive off, HTTP/2 GOAWAY), and
//! one with no request in flight — idle, or still sending a head — is closed at once. Only
//! connections whose requests are really being served keep the drain waiting.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

/// Limits on connections, independent of the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnLimits {
    /// Most connections open at once (`--max-connections`).
    pub max_connections: usize,
    /// Largest request head, bytes: request line and headers (HTTP/1), or the header list
    /// (HTTP/2).
    pub max_header_bytes: usize,
    /// How long a request head may take to arrive, and how long a new connection may stay
    /// without sending a request.
    pub header_timeout: Duration,
    /// How long a connection may stay open with no request in flight after its last one.
    pub idle_timeout: Duration,
    /// How long a request body may take to arrive.
    pub body_timeout: Duration,
}

pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// The most `--max-connections` accepts: each connection may hold a head buffer of up to
/// [`ConnLimits::max_header_bytes`], so this bounds that memory (65,536 x 64 KiB = 4 GiB).
pub const MAX_CONNECTIONS_LIMIT: usize = 65_536;
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 << 10;
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
        }
    }
}

/// hyper's HTTP/1 read buffer has a floor of 8 KiB.
const MIN_BUF: usize = 8 << 10;
/// How often a connection checks its idle and header deadlines.
const TICK: Duration = Duration::from_millis(250);

/// Counts over all connections, for the metrics and the shutdown report.
#[derive(Debug, Default)]
pub struct ConnStats {
    /// Open now.
    pub open: AtomicUsize,
    /// Accepted since start.
    pub accepted: AtomicU64,
    /// Closed by the server for a deadline (head, idle) or at shutdown with no request
    /// in flight.
    pub closed_idle: AtomicU64,
    /// Requests inside the service now (head read, not yet answered), all connections.
    pub in_flight: AtomicUsize,
}

/// One connection's activity.
struct ConnState {
    started: Instant,
    in_flight: AtomicUsize,
    requests: AtomicU64,
    /// Milliseconds after `started` when the last request was answered.
    last_end_ms: AtomicU64,
}

impl ConnState {
    fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = self.started + Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
        Some(now.saturating_duration_since(since))
    }
}

/// Marks a request in flight on its connection for as long as it lives.
struct InFlight {
    conn: Arc<ConnState>,
    stats: Arc<ConnStats>,
}

impl InFlight {
    fn enter(conn: &Arc<ConnState>, stats: &Arc<ConnStats>) -> InFlight {
        conn.in_flight.fetch_add(1, Ordering::AcqRel);
        conn.requests.fetch_add(1, Ordering::Relaxed);
        stats.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            conn: conn.clone(),
            stats: stats.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let ms = self.conn.started.elapsed().as_millis() as u64;
        self.conn.last_end_ms.fetch_max(ms, Ordering::AcqRel);
        self.conn.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.stats.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

fn builder(limits: &ConnLimits) -> Builder<TokioExecutor> {
    let mut b = Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // the read buffer bounds the head: past it hyper answers 431 and closes
        .max_buf_size(limits.max_header_bytes.max(MIN_BUF))
        .max_headers(128);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32)
        .max_concurrent_streams(128)
        // a dead peer is found by pings, not kept forever
        .keep_alive_interval(Some(limits.idle_timeout))
        .keep_alive_timeout(Duration::from_secs(10));
    b
}

/// Accepts and serves connections on `listener` until `shutdown` turns true; returns when
/// every connection has finished (or was closed for having nothing in flight).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    stats: Arc<ConnStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = Arc::new(builder(&limits));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        // A permit first: at the cap the server stops accepting, and the kernel's backlog
        // holds new clients, instead of each getting buffers and a task.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = turned_on(&mut shutdown) => break,
        };
        let (tcp, _peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and the like: wait a little rather than spin
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = turned_on(&mut shutdown) => break,
        };
        let _ = tcp.set_nodelay(true);
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::AcqRel);
        let conn = Arc::new(ConnState {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            last_end_ms: AtomicU64::new(0),
        });
        let router = router.clone();
        let builder = builder.clone();
        let stats2 = stats.clone();
        let shutdown2 = shutdown.clone();
        tasks.spawn(async move {
            serve_one(tcp, router, &builder, limits, conn, &stats2, shutdown2).await;
            stats2.open.fetch_sub(1, Ordering::AcqRel);
            drop(permit);
        });
        // reap finished tasks so the set does not grow with the connections ever served
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

/// Serves one connection under its deadlines, and closes it at shutdown once nothing is
/// in flight on it.
async fn serve_one(
    tcp: tokio::net::TcpStream,
    router: Router,
    builder: &Builder<TokioExecutor>,
    limits: ConnLimits,
    conn: Arc<ConnState>,
    stats: &Arc<ConnStats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let svc_conn = conn.clone();
    let svc_stats = stats.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let guard = InFlight::enter(&svc_conn, &svc_stats);
        let router = router.clone();
        async move {
            let resp = router.oneshot(req.map(Body::new)).await;
            // the guard lives until the handler has produced its answer
            drop(guard);
            resp
        }
    });
    let io = TokioIo::new(tcp);
    let mut c = pin!(builder.serve_connection(io, service));
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutting_down = false;
    loop {
        tokio::select! {
            r = c.as_mut() => {
                if let Err(e) = r {
                    // hyper's own head deadline closed it: one of ours, counted as such
                    if e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout) {
                        stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!("connection ended: {e}");
                }
                return;
            }
            _ = tick.tick() => {
                let now = Instant::now();
                if let Some(idle) = conn.idle_for(now) {
                    let limit = if conn.requests.load(Ordering::Relaxed) == 0 {
                        limits.header_timeout
                    } else {
                        limits.idle_timeout
                    };
                    if idle >= limit || shutting_down {
                        stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                        return; // dropping the connection closes the socket
                    }
                }
            }
            _ = turned_on(&mut shutdown), if !shutting_down => {
                shutting_down = true;
                c.as_mut().graceful_shutdown();
                if conn.idle_for(Instant::now()).is_some() {
                    // idle, or still sending a head: nothing to wait for
                    stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
}

/// Runs `fut` unless `shutdown` turns true first.
pub async fn unless_shutdown<F: Future>(
    fut: F,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<F::Output> {
    tokio::select! {
        v = fut => Some(v),
        _ = turned_on(shutdown) => None,
    }
}

/// Resolves when the flag is true (or its sender is gone, which is a shutdown too). The
/// watch guard is dropped inside, so the future stays `Send`.
async fn turned_on(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
