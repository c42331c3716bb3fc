//! Errors of the server: start-up errors ([`ServeError`]) and per-request answers
//! ([`ApiError`]).
//!
//! Design note: a start-up error is the user's (a bad flag, a model that does not fit the
//! capacity, a port in use) and the CLI prints it on one line and exits 2. A request error
//! is an HTTP answer with a JSON body `{"error": "..."}`; its status code is chosen once,
//! here, so the handlers cannot drift apart: 400 the body cannot be read (malformed JSON, a
//! missing or unparsable header), 413 the body is over `--max-body`, 415 an unsupported
//! content type, 422 the body was read but does not fit the model (wrong shape, dtype,
//! length, token id out of range, too many samples, an input too big to ever fit the
//! memory), 503 with `Retry-After` when the server sheds load or drains, 500 only for a
//! fault of the server itself.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A configuration value that does not make sense.
    #[error("{0}")]
    Config(String),
    /// The requested device cannot be opened in this build.
    #[error("device {device} is not available: {reason}")]
    DeviceUnavailable { device: String, reason: String },
    /// Building the model (or its prediction twin) failed, e.g. it does not fit the capacity.
    #[error("could not load model {model}: {source}")]
    Model {
        model: String,
        #[source]
        source: vramroom_tensor::TensorError,
    },
    /// Binding the listening socket failed.
    #[error("could not listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// A compute thread could not be started.
    #[error("could not start a compute thread: {0}")]
    Thread(std::io::Error),
}

/// Why the server refused a request it could parse (the `reason` label of
/// `vramroom_admission_rejections_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reject {
    /// Its predicted peak would push committed memory past capacity − margin.
    Memory,
    /// `--max-queue` requests are already waiting.
    QueueFull,
    /// The predicted wait before its batch starts is over the queue-delay budget.
    QueueDelay,
    /// It waited in the queue past the budget anyway (predictions were off): refused at
    /// dispatch rather than served late.
    Deadline,
    /// Its batch ran out of memory (the prediction was wrong): freed, counted, refused.
    Oom,
    /// The server is draining.
    Shutdown,
}

impl Reject {
    pub const ALL: [Reject; 6] = [
        Reject::Memory,
        Reject::QueueFull,
        Reject::QueueDelay,
        Reject::Deadline,
        Reject::Oom,
        Reject::Shutdown,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Reject::Memory => "memory",
            Reject::QueueFull => "queue_full",
            Reject::QueueDelay => "queue_delay",
            Reject::Deadline => "deadline",
            Reject::Oom => "oom",
            Reject::Shutdown => "shutdown",
        }
    }
}

/// An HTTP error answer: status, message, and for 503 the `Retry-After` seconds.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub retry_after_s: Option<u64>,
    pub reject: Option<Reject>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after_s: None,
            reject: None,
        }
    }
    /// 400: the body or a header cannot be read.
    pub fn bad_request(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, m)
    }
    /// 422: readable, but not an input this model takes.
    pub fn unprocessable(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, m)
    }
    /// 503 + `Retry-After`.
    pub fn shed(reason: Reject, retry_after_s: u64, m: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: m.into(),
            retry_after_s: Some(retry_after_s.max(1)),
            reject: Some(reason),
        }
    }
    pub fn internal(m: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, m)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message });
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
            }
        }
        r
    }
}
