//! What `vramroom http` asks for: the target, the body, the stages, the memory sources,
//! the replays and prediction, and what of it can be checked without the network.
//!
//! Design note: [`HttpConfig::validate`] is the offline half of the driver's `prepare`
//! (see [`crate::http::prepare`] for the half that needs the network), so a config a test
//! or a script builds is checked by the same rules as the CLI's flags.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{LoadError, Result};
use crate::http::body::BodySpec;
use crate::http::load::{Arrival, Stage, StageLoad};
use crate::http::prometheus::{Selector, Target as MetricTarget};
use crate::memsource::{MemorySource, NvmlDevice};
use crate::threshold::Threshold;

/// Everything an HTTP run needs. `HttpConfig::new(url)` is `vramroom http URL` with the
/// defaults.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub url: String,
    /// `None`: GET, or POST when there is a body (as curl does).
    pub method: Option<String>,
    /// `-H 'Name: value'`.
    pub headers: Vec<String>,
    pub body: BodySpec,
    /// At least one; only the last may have no duration (it runs until `-n`).
    pub stages: Vec<Stage>,
    /// `-n`: no request beyond this many is sent.
    pub max_requests: Option<u64>,
    pub arrival: Arrival,
    /// Open model: the most connections (requests in flight).
    pub max_connections: usize,
    pub timeout: Duration,
    /// Client runtime threads; 0 = one per core.
    pub threads: usize,
    pub seed: u64,
    /// A Prometheus endpoint to scrape for memory (`--metrics-url`).
    pub metrics_url: Option<String>,
    /// More endpoints (`--metrics-url` repeated: the other ranks of a job), summed with the
    /// first onto the one timeline.
    pub more_metrics_urls: Vec<String>,
    pub metrics_interval: Duration,
    /// `--metric TARGET=SELECTOR`, tried before the known names.
    pub metric_rules: Vec<(MetricTarget, Selector)>,
    /// NVML device to sample (`None`: no NVML).
    pub nvml: Option<NvmlDevice>,
    /// The service's process id, for NVML's per-process figure.
    pub pid: Option<u32>,
    /// More sources (tests pass a fake NVML here).
    pub memory_sources: Vec<Arc<dyn MemorySource>>,
    pub thresholds: Vec<Threshold>,
    /// Fetch the probe's snapshots at the end when the endpoint is a probe.
    pub probe: bool,
    /// Allocator configs to replay the probe's trace under.
    pub what_if: Vec<String>,
    /// Connect once before the run and fail (exit 2) if nothing listens.
    pub check_target: bool,
    /// `--ramp-until-oom`: end the run at the first OOM (an answer naming a CUDA OOM, or the
    /// service's OOM counter rising), so a ramp finds the OOM point without hammering on.
    pub stop_at_first_oom: bool,
    /// `--predict`: after the run, predict from the probe's trace the concurrency at which
    /// the service runs out of memory (see [`crate::http::predict`]).
    pub predict: Option<crate::http::predict::PredictOptions>,
}

impl HttpConfig {
    pub fn new(url: impl Into<String>) -> HttpConfig {
        HttpConfig {
            url: url.into(),
            method: None,
            headers: Vec::new(),
            body: BodySpec::default(),
            stages: vec![Stage::held(
                StageLoad::Workers(10),
                Some(Duration::from_secs(10)),
            )],
            max_requests: None,
            arrival: Arrival::Constant,
            max_connections: crate::http::load::DEFAULT_MAX_CONNECTIONS,
            timeout: Duration::from_secs(30),
            threads: 0,
            seed: 1,
            metrics_url: None,
            more_metrics_urls: Vec::new(),
            metrics_interval: Duration::from_millis(250),
            metric_rules: Vec::new(),
            nvml: None,
            pid: None,
            memory_sources: Vec::new(),
            thresholds: Vec::new(),
            probe: true,
            what_if: crate::config::DEFAULT_WHAT_IF
                .iter()
                .map(|s| s.to_string())
                .collect(),
            check_target: true,
            stop_at_first_oom: false,
            predict: None,
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        matches!(
            self.stages.first().map(|s| s.target),
            Some(StageLoad::Rate(_))
        )
    }

    /// Checks what can be checked without the network.
    pub fn validate(&self) -> Result<()> {
        if self.stages.is_empty() {
            return Err(LoadError::Config("at least one stage is needed".into()));
        }
        let open = self.is_open();
        for (i, s) in self.stages.iter().enumerate() {
            match s.target {
                StageLoad::Workers(0) => {
                    return Err(LoadError::Config("concurrency must be at least 1".into()))
                }
                StageLoad::Rate(r) if !(r.is_finite() && r > 0.0) => {
                    return Err(LoadError::Config("the rate must be more than 0".into()))
                }
                StageLoad::Rate(_) if !open => {
                    return Err(LoadError::Config("stages mix workers and rates".into()))
                }
                StageLoad::Workers(_) if open => {
                    return Err(LoadError::Config("stages mix workers and rates".into()))
                }
                _ => {}
            }
            if s.requests_per_worker.is_some() {
                return Err(LoadError::Config(
                    "requests per worker are loadtest's; an HTTP stage ends by its duration or -n"
                        .into(),
                ));
            }
            if s.duration.is_none() && (i + 1 < self.stages.len() || self.max_requests.is_none()) {
                return Err(LoadError::Config(
                    "a stage needs a duration (-z) unless it is the last and -n bounds it".into(),
                ));
            }
        }
        if self.max_requests == Some(0) {
            return Err(LoadError::Config("-n must be at least 1".into()));
        }
        if self.max_connections == 0 {
            return Err(LoadError::Config(
                "the connection limit must be at least 1".into(),
            ));
        }
        if self.timeout < Duration::from_millis(1) {
            return Err(LoadError::Config("--timeout must be at least 1ms".into()));
        }
        if self.metrics_interval < Duration::from_millis(10) {
            return Err(LoadError::Config(
                "--metrics-interval must be at least 10ms".into(),
            ));
        }
        for w in &self.what_if {
            vramroom_alloc::AllocatorConfig::parse(w)
                .map_err(|e| LoadError::AllocConf(format!("{w:?}: {e}")))?;
        }
        Ok(())
    }

    pub(crate) fn planned_s(&self) -> Option<f64> {
        self.stages
            .iter()
            .map(|s| s.duration.map(|d| d.as_secs_f64()))
            .sum()
    }
}
