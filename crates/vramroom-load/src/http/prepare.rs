//! The HTTP driver's `prepare`: the whole config checked against the world before the clock
//! starts.
//!
//! Design note: everything that can be wrong with the user's input (the URL, the body, the
//! metrics endpoint, nothing listening) is found here, so the CLI can exit 2 with nothing
//! written; the load itself ([`crate::http::controller`]) then only counts failures.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::error::{LoadError, Result};
use crate::http::body::Bodies;
use crate::http::client::{self, ErrorKind, RequestTemplate, Target};
use crate::http::config::HttpConfig;
use crate::http::prometheus::MetricMap;
use crate::http::sample::{self, Scrape};
use crate::memsource::{MemorySource, NvmlDevice, NvmlSource};
use crate::results::MemorySourceInfo;

/// The run's inputs, checked.
pub(crate) struct Prepared {
    pub(crate) target: Target,
    pub(crate) template: RequestTemplate,
    pub(crate) bodies: Bodies,
    pub(crate) method: String,
    pub(crate) scrapes: Vec<Scrape>,
    pub(crate) blocking: Vec<Arc<dyn MemorySource>>,
    pub(crate) absent: Vec<MemorySourceInfo>,
}

/// Checks the whole config against the world: URL, body files, the metrics endpoint (one
/// scrape), NVML, and (when asked) that something listens at the target.
pub(crate) async fn prepare(cfg: &HttpConfig) -> Result<Prepared> {
    cfg.validate()?;
    let target = client::resolve(&cfg.url)?;
    let bodies = Bodies::new(&cfg.body)?;
    let method = cfg
        .method
        .clone()
        .unwrap_or_else(|| if bodies.is_empty() { "GET" } else { "POST" }.to_string());
    let template = RequestTemplate::new(&target, &method, &cfg.headers, bodies.content_type())?;
    let mut scrapes = Vec::new();
    for u in cfg.metrics_url.iter().chain(cfg.more_metrics_urls.iter()) {
        let t = client::resolve(u).map_err(|e| LoadError::Http(format!("--metrics-url {e}")))?;
        let s = Scrape {
            url: u.clone(),
            target: t,
            map: MetricMap::with_user(cfg.metric_rules.clone()),
        };
        let first = sample::scrape(&s, scrape_timeout(cfg))
            .await
            .map_err(|e| LoadError::Http(format!("--metrics-url {u}: {e}")))?;
        if first.reading.is_empty() {
            warn!(
                url = %u,
                "the metrics endpoint exports no memory metric Vramroom knows; map one with --metric"
            );
        }
        scrapes.push(s);
    }
    let mut blocking: Vec<Arc<dyn MemorySource>> = cfg.memory_sources.clone();
    let mut absent = Vec::new();
    if let Some(dev) = &cfg.nvml {
        match NvmlSource::open(dev.clone(), cfg.pid) {
            Ok(s) => blocking.push(Arc::new(s)),
            Err(e) => {
                info!(reason = %e, "NVML is absent: device memory is not sampled");
                absent.push(MemorySourceInfo {
                    name: format!("nvml:{}", nvml_name(dev)),
                    kind: "nvml".into(),
                    status: "absent".into(),
                    note: e,
                    ..Default::default()
                });
            }
        }
    }
    if cfg.check_target {
        let t = cfg.timeout.min(Duration::from_secs(5));
        if let Err(k) = client::connect(&target, t).await {
            return Err(LoadError::Http(format!(
                "cannot connect to {}: {}",
                cfg.url,
                match k {
                    ErrorKind::ConnectRefused => "connection refused (is the service running?)",
                    ErrorKind::ConnectTimeout => "no answer to the connection (timed out)",
                    _ => "the connection failed",
                }
            )));
        }
    }
    Ok(Prepared {
        target,
        template,
        bodies,
        method,
        scrapes,
        blocking,
        absent,
    })
}

fn nvml_name(d: &NvmlDevice) -> String {
    match d {
        NvmlDevice::Index(i) => i.to_string(),
        NvmlDevice::PciBusId(p) => p.clone(),
    }
}

pub(crate) fn scrape_timeout(cfg: &HttpConfig) -> Duration {
    (cfg.metrics_interval * 4).clamp(Duration::from_secs(1), Duration::from_secs(10))
}
