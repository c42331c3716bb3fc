//! The HTTP surface: `POST /v1/infer`, `GET /metrics`, `GET /healthz`.
//!
//! Design note: handlers only parse, route (to the replica that admits the request, see
//! [`crate::replicas`]) and wait; compute happens on the scheduler's
//! threads, and anything that could take more than a few microseconds of CPU on the async
//! executor (decoding a large body, a meta-device prediction on a cache miss) goes
//! through `spawn_blocking`. The body is read by hand under `--max-body` (a declared
//! `Content-Length` over the limit is refused before a byte is read), so an oversized body
//! gets 413 with the same JSON error shape as every other error. A handler whose client
//! disconnects is dropped by hyper; its [`Ticket`](crate::scheduler::Ticket) drops with it
//! and takes the request out of the queue.
//!
//! `POST /v1/infer` request formats:
//! - `Content-Type: application/json` (or none): `{"inputs": X, "top_k": K, "return_logits":
//!   bool}`; `X` is token ids for GPT-2 (`[ids]` or `[[ids], ...]`), a nested numeric
//!   array for the MLP (`[F]`, `[N, F]`) and ResNets (`[3, H, W]`, `[N, 3, H, W]`), or for
//!   any model `{"shape": [...], "data": [flat values]}`.
//! - `Content-Type: application/octet-stream`: the raw little-endian, row-major values;
//!   `X-Shape: N,3,224,224` (comma-separated dims, brackets and spaces allowed), `X-Dtype:
//!   float32|int64|int32` (default `int64` for token models, `float32` otherwise),
//!   optional `X-Top-K: K` and `X-Return-Logits: true`.
//!
//! An optional `X-Request-Id` (up to 128 visible ASCII characters) names the request;
//! otherwise the server numbers it. Every `/v1/infer` answer carries `X-Request-Id`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::Serialize;

use tokio::sync::watch;

use crate::config::ServeConfig;
use crate::conn::ConnStats;
use crate::error::ApiError;
use crate::metrics::{MemoryView, SchedView};
use crate::model::{BatchKey, Input, Predictor, SampleOutput, ServedModel};
use crate::replicas::{Replica, Replicas};

/// Bodies larger than this are decoded off the async executor.
const INLINE_DECODE_BYTES: usize = 64 << 10;

/// Everything the handlers share.
pub struct App {
    pub cfg: ServeConfig,
    /// One per `--device` entry, and the router between them.
    pub replicas: Replicas,
    /// The model every replica serves (the first one's copy): what decoding and the
    /// answers' `model` field read. A replica's own state is in `replicas`.
    pub model: Arc<ServedModel>,
    /// The replicas' names, comma-separated (`cpu`, `cuda:0,cuda:1`).
    pub device_name: String,
    next_id: AtomicU64,
    next_ticket: AtomicU64,
    pub(crate) draining: AtomicBool,
    /// Connection counts (open, closed for deadlines, requests in flight).
    pub conns: Arc<ConnStats>,
    /// Turns true at shutdown: connections with nothing in flight close, and requests
    /// still sending their body are answered 503 instead of holding the drain.
    pub(crate) shutdown: watch::Sender<bool>,
}

impl App {
    pub fn new(cfg: ServeConfig, replicas: Replicas) -> App {
        let model = replicas.first().model.clone();
        let device_name = replicas
            .list()
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        App {
            cfg,
            model,
            device_name,
            replicas,
            next_id: AtomicU64::new(1),
            next_ticket: AtomicU64::new(1),
            draining: AtomicBool::new(false),
            conns: Arc::new(ConnStats::default()),
            shutdown: watch::channel(false).0,
        }
    }

    /// One replica's series, unlabelled.
    fn render_replica(r: &Replica) -> String {
        let (committed, ..) = r.sched.ledger();
        let (queue_depth, queue_samples, running) = r.sched.depth();
        let (cost, quiet) = r.sched.cost_model();
        let mem = MemoryView {
            allocated: r.model.device().memory_allocated(),
            reserved: r.model.device().memory_reserved(),
            capacity: r.capacity,
            stats: r.probe.memory_stats(),
        };
        let sched = SchedView {
            queue_depth,
            queue_samples,
            running,
            committed,
            limit: r.limit,
            cost_fixed_s: cost.alpha,
            cost_per_unit_s: cost.beta,
            quiet_cost_fixed_s: quiet.alpha,
            quiet_cost_per_unit_s: quiet.beta,
        };
        let mut o = r.metrics.render(&mem, &sched);
        let (entries, evicted) = r.predictor.cache_stats();
        crate::metrics::gauge(
            &mut o,
            "vramroom_prediction_cache_entries",
            "Memory predictions cached by (input shape, batch size); bounded, least recently used evicted.",
            entries as u64,
        );
        crate::metrics::counter(
            &mut o,
            "vramroom_prediction_cache_evictions_total",
            "Predictions evicted from the bounded cache.",
            evicted,
        );
        o
    }

    /// The Prometheus exposition of everything now. With several replicas every
    /// per-replica series carries `device="cuda:1"` (same names; sum or filter by label);
    /// with one it is unlabelled, as a single-device server always wrote it.
    pub fn render_metrics(&self) -> String {
        let list = self.replicas.list();
        let mut o = if list.len() == 1 {
            Self::render_replica(&list[0])
        } else {
            let parts: Vec<(String, String)> = list
                .iter()
                .map(|r| (r.name.clone(), Self::render_replica(r)))
                .collect();
            crate::metrics::merge_labelled("device", &parts)
        };
        let conns = &self.conns;
        crate::metrics::gauge(
            &mut o,
            "vramroom_connections_open",
            "HTTP connections open now (at most --max-connections).",
            conns.open.load(Ordering::Relaxed) as u64,
        );
        crate::metrics::counter(
            &mut o,
            "vramroom_connections_accepted_total",
            "HTTP connections accepted since start.",
            conns.accepted.load(Ordering::Relaxed),
        );
        crate::metrics::counter(
            &mut o,
            "vramroom_connections_closed_idle_total",
            "Connections the server closed with no request in flight: no request head in time, idle past the keep-alive timeout, or at shutdown.",
            conns.closed_idle.load(Ordering::Relaxed),
        );
        let routed: Vec<(String, u64)> =
            list.iter().map(|r| (r.name.clone(), r.routed())).collect();
        crate::metrics::labelled_counter(
            &mut o,
            "vramroom_replica_requests_total",
            "Requests the router placed on each replica (admitted there), by device.",
            "device",
            &routed,
        );
        o
    }
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/infer", post(infer))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .with_state(app)
}

async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such endpoint (POST /v1/infer, GET /metrics, GET /healthz)",
    )
    .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let body = app.render_metrics();
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
    model: String,
    /// The replicas' names, comma-separated; the figures below are their sums.
    device: String,
    capacity_bytes: u64,
    allocated_bytes: u64,
    reserved_bytes: u64,
    limit_bytes: u64,
    queue_depth: usize,
    replicas: Vec<ReplicaHealth>,
}

#[derive(Serialize)]
struct ReplicaHealth {
    device: String,
    capacity_bytes: u64,
    allocated_bytes: u64,
    reserved_bytes: u64,
    limit_bytes: u64,
    committed_bytes: u64,
    queue_depth: usize,
    batches_running: usize,
    /// Requests the router placed here since start.
    requests: u64,
}

/// 200 while serving, 503 while draining (so a balancer stops sending).
async fn healthz(State(app): State<Arc<App>>) -> Response {
    let draining = app.draining.load(Ordering::Relaxed);
    let replicas: Vec<ReplicaHealth> = app
        .replicas
        .list()
        .iter()
        .map(|r| {
            let (queue_depth, _, batches_running) = r.sched.depth();
            ReplicaHealth {
                device: r.name.clone(),
                capacity_bytes: r.capacity,
                allocated_bytes: r.model.device().memory_allocated(),
                reserved_bytes: r.model.device().memory_reserved(),
                limit_bytes: r.limit,
                committed_bytes: r.sched.ledger().0,
                queue_depth,
                batches_running,
                requests: r.routed(),
            }
        })
        .collect();
    let sum = |f: fn(&ReplicaHealth) -> u64| replicas.iter().map(f).sum::<u64>();
    let h = Health {
        status: if draining { "draining" } else { "ok" },
        model: app.model.name(),
        device: app.device_name.clone(),
        capacity_bytes: sum(|r| r.capacity_bytes),
        allocated_bytes: sum(|r| r.allocated_bytes),
        reserved_bytes: sum(|r| r.reserved_bytes),
        limit_bytes: sum(|r| r.limit_bytes),
        queue_depth: replicas.iter().map(|r| r.queue_depth).sum(),
        replicas,
    };
    let code = if draining {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, Json(h)).into_response()
}

/// The JSON answer of a successful inference.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct InferResponse {
    pub id: String,
    pub model: String,
    pub outputs: Vec<SampleOutput>,
    /// Arrival to the start of its batch.
    pub queue_ms: f64,
    /// The batch's compute.
    pub compute_ms: f64,
    /// Samples in the batch it ran in.
    pub batch_size: usize,
    /// Requests in that batch.
    pub batch_requests: usize,
    /// Token models: the length its sequences were padded to.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub padded_len: Option<usize>,
}

async fn infer(
    State(app): State<Arc<App>>,
    version: Version,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let id = request_id(&headers)
        .unwrap_or_else(|| format!("req-{}", app.next_id.fetch_add(1, Ordering::Relaxed)));
    // The replica that answers counts the answer; one refused before routing (unreadable,
    // unsupported) is counted on the first.
    let mut at = 0;
    let mut resp = match infer_inner(&app, version, &headers, body, &id, &mut at).await {
        Ok(r) => {
            app.replicas.list()[at]
                .metrics
                .observe_duration(arrived.elapsed().as_secs_f64());
            Json(r).into_response()
        }
        Err(e) => e.into_response(),
    };
    app.replicas.list()[at]
        .metrics
        .count_response(resp.status().as_u16());
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

fn request_id(h: &HeaderMap) -> Option<String> {
    let v = h.get("x-request-id")?.to_str().ok()?.trim();
    (!v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| v.to_string())
}

enum Format {
    Json,
    Binary,
}

/// How much of an oversized HTTP/2 body is read and thrown away after the 413, and for how
/// long. HTTP/2 lets a server answer early and then reset the stream with NO_ERROR, but
/// some clients (curl 7.x) drop the answer when that reset comes while they are still
/// sending. So the 413 goes at once, and the rest of the body is read and dropped in the
/// background (nothing is kept) until it ends or these bounds are reached; only then is the
/// stream reset. The request is no longer in flight meanwhile: it holds no drain.
const H2_DRAIN_BYTES: u64 = 256 << 20;
const H2_DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(5);

enum BodyErr {
    /// Over the limit; the body, for the rest to be drained.
    TooBig(Body),
    Read(axum::Error),
}

/// Reads the body into memory up to `limit` bytes.
async fn collect_limited(mut body: Body, limit: usize) -> Result<Bytes, BodyErr> {
    let mut buf = bytes::BytesMut::new();
    let mut seen: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyErr::Read)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen += data.len() as u64;
        if seen > limit as u64 {
            return Err(BodyErr::TooBig(body));
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

/// HTTP/2: reads and drops the rest of an oversized body in the background (see
/// [`H2_DRAIN_BYTES`]).
fn drain_in_background(version: Version, mut body: Body) {
    if version != Version::HTTP_2 {
        return; // HTTP/1: hyper closes the connection after the answer
    }
    tokio::spawn(async move {
        let rest = async {
            let mut seen: u64 = 0;
            while let Some(Ok(f)) = body.frame().await {
                seen += f.data_ref().map_or(0, |d| d.len() as u64);
                if seen > H2_DRAIN_BYTES {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(H2_DRAIN_TIME, rest).await;
    });
}

async fn read_body(
    app: &App,
    version: Version,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limit = app.cfg.max_body;
    let too_big = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is over the {limit}-byte limit (--max-body)"),
        )
    };
    if let Some(n) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        if n > limit as u64 {
            drain_in_background(version, body);
            return Err(too_big());
        }
    }
    let timeout = app.cfg.limits.body_timeout;
    let mut shutdown = app.shutdown.subscribe();
    let read = tokio::time::timeout(timeout, collect_limited(body, limit));
    // A body still arriving at shutdown is not work the drain should wait for.
    let Some(read) = crate::conn::unless_shutdown(read, &mut shutdown).await else {
        return Err(ApiError::shed(
            crate::error::Reject::Shutdown,
            1,
            "the server is shutting down; the request body had not arrived",
        ));
    };
    match read {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(BodyErr::TooBig(rest))) => {
            drain_in_background(version, rest);
            Err(too_big())
        }
        Ok(Err(BodyErr::Read(e))) => Err(ApiError::bad_request(format!(
            "could not read the request body: {e}"
        ))),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                timeout.as_secs_f64()
            ),
        )),
    }
}

fn content_format(headers: &HeaderMap) -> Result<Format, ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(Format::Json);
    };
    // A content type that is not text (0xFF bytes, say) is no type this server knows:
    // 415, not read as JSON as if it were absent.
    let Ok(ct) = ct.to_str() else {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the Content-Type header is not ASCII text (application/json or \
             application/octet-stream)",
        ));
    };
    let ct = ct.to_ascii_lowercase();
    let essence = ct.split(';').next().unwrap_or("").trim();
    match essence {
        "application/json" | "" => Ok(Format::Json),
        "application/octet-stream" => Ok(Format::Binary),
        other => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "content type {other:?} is not supported (application/json or \
                 application/octet-stream with X-Shape and X-Dtype)"
            ),
        )),
    }
}

/// `X-Shape: 2,3,32,32` (also `[2, 3, 32, 32]` or `2x3x32x32`).
pub fn parse_shape(s: &str) -> Option<Vec<usize>> {
    let t = s.trim().trim_start_matches('[').trim_end_matches(']');
    if t.trim().is_empty() {
        return None;
    }
    t.split([',', 'x'])
        .map(|d| d.trim().parse::<usize>().ok())
        .collect()
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match h.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()))
            .map_err(|_| ApiError::bad_request(format!("header {name} is not ASCII"))),
    }
}

fn decode(app: &App, headers: &HeaderMap, fmt: Format, body: &[u8]) -> Result<Input, ApiError> {
    let max = app.cfg.max_batch;
    match fmt {
        Format::Json => app.model.decode_json(body, max),
        Format::Binary => {
            let shape_s = header_str(headers, "x-shape")?.ok_or_else(|| {
                ApiError::bad_request("a binary body needs an X-Shape header (e.g. 1,3,224,224)")
            })?;
            let shape = parse_shape(shape_s).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "X-Shape {shape_s:?} is not a comma-separated list of dimensions"
                ))
            })?;
            let default_dtype = match app.model.family() {
                crate::model::Family::Lm { .. } => "int64",
                _ => "float32",
            };
            let dtype = header_str(headers, "x-dtype")?
                .map(|s| s.to_ascii_lowercase())
                .unwrap_or_else(|| default_dtype.to_string());
            let top_k = match header_str(headers, "x-top-k")? {
                None => None,
                Some(s) => Some(s.parse::<usize>().map_err(|_| {
                    ApiError::bad_request(format!("X-Top-K {s:?} is not a whole number"))
                })?),
            };
            let return_logits = match header_str(headers, "x-return-logits")? {
                None => false,
                Some(s) => match s.to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => {
                        return Err(ApiError::bad_request(format!(
                            "X-Return-Logits {s:?} is not true or false"
                        )))
                    }
                },
            };
            app.model
                .decode_binary(&shape, &dtype, body, top_k, return_logits, max)
        }
    }
}

async fn infer_inner(
    app: &Arc<App>,
    version: Version,
    headers: &HeaderMap,
    body: Body,
    id: &str,
    at: &mut usize,
) -> Result<InferResponse, ApiError> {
    let fmt = content_format(headers)?;
    let body = read_body(app, version, headers, body).await?;
    let input = if body.len() <= INLINE_DECODE_BYTES {
        decode(app, headers, fmt, &body)?
    } else {
        let a = app.clone();
        let h = headers.clone();
        tokio::task::spawn_blocking(move || decode(&a, &h, fmt, &body))
            .await
            .map_err(|e| ApiError::internal(format!("decoder failed: {e}")))??
    };
    let preds = predict(app, input.key, input.samples).await?;
    let key = input.key;
    let ticket_id = app.next_ticket.fetch_add(1, Ordering::Relaxed);
    let (ticket, rx) = match app.replicas.route(ticket_id, input, &preds) {
        Ok((i, admitted)) => {
            *at = i;
            admitted
        }
        Err((i, e)) => {
            *at = i;
            return Err(e);
        }
    };
    let done = rx
        .await
        .map_err(|_| ApiError::internal("the request was dropped by the scheduler"))??;
    ticket.complete();
    Ok(InferResponse {
        id: id.to_string(),
        model: app.model.name(),
        outputs: done.outputs,
        queue_ms: done.queue_s * 1e3,
        compute_ms: done.compute_s * 1e3,
        batch_size: done.batch_samples,
        batch_requests: done.batch_requests,
        padded_len: match key {
            BatchKey::Tokens { len } => Some(len),
            _ => None,
        },
    })
}

/// A request's predicted peak on every replica's twin; on the first request of a new
/// shape, also predicts every batch size of that shape the schedulers may form (so
/// dispatch never waits on a twin).
async fn predict(app: &Arc<App>, key: BatchKey, samples: usize) -> Result<Vec<u64>, ApiError> {
    if let Some(p) = app.replicas.cached_preds(key, samples) {
        return Ok(p);
    }
    let preds: Vec<Arc<Predictor>> = app
        .replicas
        .list()
        .iter()
        .map(|r| r.predictor.clone())
        .collect();
    let max = app.cfg.max_batch;
    tokio::task::spawn_blocking(move || {
        let mut own = Vec::with_capacity(preds.len());
        for pred in &preds {
            own.push(pred.predict(key, samples)?);
            for n in 1..=max {
                pred.predict(key, n)?;
            }
        }
        Ok::<Vec<u64>, vramroom_tensor::TensorError>(own)
    })
    .await
    .map_err(|e| ApiError::internal(format!("predictor failed: {e}")))?
    .map_err(|e| ApiError::unprocessable(format!("this input cannot run on the model: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_in_three_spellings() {
        assert_eq!(parse_shape("2,3,32,32"), Some(vec![2, 3, 32, 32]));
        assert_eq!(parse_shape("[2, 3, 32, 32]"), Some(vec![2, 3, 32, 32]));
        assert_eq!(parse_shape("2x3"), Some(vec![2, 3]));
        assert_eq!(parse_shape(""), None);
        assert_eq!(parse_shape("2,,3"), None);
        assert_eq!(parse_shape("a,b"), None);
    }
}
