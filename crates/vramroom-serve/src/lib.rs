//! # vramroom-serve
//!
//! An inference server that knows its memory and sheds load instead of dying: it serves a
//! Vramroom model (GPT-2, ResNet, MLP, a Hugging Face decoder; cpu or cuda, one replica per
//! device of `--device cuda:0,cuda:1`) over HTTP,
//! batches requests dynamically, and admits a request only if the memory the meta device
//! predicts for its input still fits under the capacity minus a margin, and if it can
//! finish within its latency target. Everything else gets `503` with `Retry-After`, so the
//! process never runs out of memory and the requests it admits stay fast.
//!
//! Endpoints: `POST /v1/infer` (JSON or a binary tensor; formats in [`http`]),
//! `GET /metrics` (Prometheus text: allocator stats, admission, batching, latency; names
//! in [`metrics`]), `GET /healthz`. Graceful shutdown: [`ServerHandle::shutdown`] stops
//! accepting, drains queued and running requests (bounded by `drain_timeout`), and joins
//! the compute threads.
//!
//! Main types:
//! - [`ServeConfig`]: model, devices (one replica each), capacity and margin (per replica),
//!   allocator config, batching and queue limits, address; [`start`] builds the replicas,
//!   calibrates, binds and serves.
//! - [`ServerHandle`]: the bound address, the shared [`App`], `shutdown()`.
//! - [`replicas::Replicas`]: one [`replicas::Replica`] per `--device` entry (model copy,
//!   twin, scheduler, metrics) and the router that places each request on the replica
//!   that admits it with the most memory left (design note there). One device: one replica.
//! - [`scheduler::Scheduler`]: the admission ledger, the batch queue and the compute
//!   threads (design note there); [`model::ServedModel`] runs batches and
//!   [`model::Predictor`] predicts their memory on the meta twin.
//! - [`device::open_device`]: the one place that opens a device kind.
//!
//! ```
//! use vramroom_serve::{start, ServeConfig};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let cfg = ServeConfig {
//!     model: "mlp-tiny".parse().unwrap(),
//!     addr: "127.0.0.1:0".parse().unwrap(), // port 0: any free port
//!     ..ServeConfig::default()
//! };
//! let server = start(cfg).await?;
//! println!("listening on {}", server.url());
//! // POST {"inputs": [[0.1, ...64 values]]} to {url}/v1/infer ...
//! let report = server.shutdown().await;
//! assert!(report.drained);
//! # Ok::<(), vramroom_serve::ServeError>(())
//! # }).unwrap();
//! ```

pub mod config;
pub mod conn;
pub mod device;
pub mod error;
pub mod http;
pub mod metrics;
pub mod model;
pub mod replicas;
pub mod scheduler;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

pub use config::{parse_duration, DeviceList, Margin, ServeConfig, ServeDevice};
pub use device::{open_device, OpenedDevice};
pub use error::{ApiError, Reject, ServeError};
pub use http::{App, InferResponse};
pub use metrics::Metrics;
pub use model::{BatchKey, Family, Generation, Input, Predictor, SampleOutput, ServedModel};
pub use replicas::{Replica, Replicas};
pub use scheduler::{LatencyTarget, SchedConfig, Scheduler};

/// A running server.
pub struct ServerHandle {
    addr: SocketAddr,
    app: Arc<App>,
    task: tokio::task::JoinHandle<()>,
}

/// How a shutdown went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShutdownReport {
    /// Every queued and running request was answered within the drain timeout.
    pub drained: bool,
    pub elapsed: Duration,
    /// Requests being served when the drain began (queued, running, or between: reading
    /// a body, predicting), on every replica; what the drain waited for.
    pub in_flight_at_start: usize,
    /// When the drain timed out: requests still queued (answered 503 then), still
    /// running (cut off), and in flight elsewhere in a handler. All 0 when drained.
    pub queued_at_timeout: usize,
    pub running_at_timeout: usize,
    pub in_flight_at_timeout: usize,
}

/// Builds every replica (one per `--device` entry) and the app around them.
fn build_app(cfg: ServeConfig) -> Result<Arc<App>, ServeError> {
    let replicas = Replicas::build(&cfg)?;
    Ok(Arc::new(App::new(cfg, replicas)))
}

/// Binds `cfg.addr`, builds everything and serves until [`ServerHandle::shutdown`].
pub async fn start(cfg: ServeConfig) -> Result<ServerHandle, ServeError> {
    cfg.validate()?;
    let bind = cfg.addr;
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|source| ServeError::Bind {
            addr: bind.to_string(),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: bind.to_string(),
        source,
    })?;
    let app = tokio::task::spawn_blocking(move || build_app(cfg))
        .await
        .map_err(|e| ServeError::Config(format!("start-up failed: {e}")))??;
    let router = http::router(app.clone());
    let task = tokio::spawn(conn::serve(
        listener,
        router,
        app.cfg.limits,
        app.conns.clone(),
        app.shutdown.subscribe(),
    ));
    Ok(ServerHandle { addr, app, task })
}

impl ServerHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// Graceful shutdown: stop accepting connections and admitting requests, let queued
    /// and running requests finish (batches no longer wait to fill), close idle
    /// connections; after `drain_timeout`, answer what is still queued with 503 and stop.
    /// Then join the compute threads.
    pub async fn shutdown(mut self) -> ShutdownReport {
        let t0 = Instant::now();
        let in_flight_at_start = self.app.conns.in_flight.load(Ordering::Acquire);
        self.app.draining.store(true, Ordering::Relaxed);
        self.app.replicas.drain();
        // Stops accepting; connections with nothing in flight (idle, or still sending a
        // head) close now, bodies still arriving are answered 503.
        // send_replace: the value changes even when no receiver is left to be told
        self.app.shutdown.send_replace(true);
        let timeout = self.app.cfg.drain_timeout;
        let mut report = ShutdownReport {
            drained: true,
            elapsed: Duration::ZERO,
            in_flight_at_start,
            queued_at_timeout: 0,
            running_at_timeout: 0,
            in_flight_at_timeout: 0,
        };
        if tokio::time::timeout(timeout, &mut self.task).await.is_err() {
            report.drained = false;
            let (queued, running) = self.app.replicas.depth();
            report.queued_at_timeout = queued;
            report.running_at_timeout = running;
            report.in_flight_at_timeout = self.app.conns.in_flight.load(Ordering::Acquire);
            self.app.replicas.abort_queued();
            // The 503s are on their way; give connections a moment to flush them.
            if tokio::time::timeout(Duration::from_secs(1), &mut self.task)
                .await
                .is_err()
            {
                self.task.abort();
            }
        }
        let app = self.app.clone();
        let _ = tokio::task::spawn_blocking(move || app.replicas.close_and_join()).await;
        report.elapsed = t0.elapsed();
        report
    }
}

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM received after this call.
///
/// The handlers are installed here, not at the first poll: a caller that announces it is
/// listening and then awaits must already own the signal, or a SIGTERM sent in between (a
/// supervisor that reads the announcement) would kill the process with the default action.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let int = signal(SignalKind::interrupt()).ok();
        let term = signal(SignalKind::terminate()).ok();
        async move {
            async fn recv(s: Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                _ = recv(int) => {}
                _ = recv(term) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async move {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
