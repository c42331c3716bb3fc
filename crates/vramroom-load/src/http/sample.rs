//! The memory sampler of an HTTP run: a scraped Prometheus endpoint and blocking sources
//! (NVML), read together at every tick onto the load's time axis.
//!
//! Design note: one tick reads every source and merges their readings (the first source to
//! know a field wins: the endpoints before NVML, since the service knows its own allocator),
//! Several endpoints (the ranks of a torchrun job, one probe port each) are summed field by
//! field into one reading: the job's memory on one timeline (the first endpoint is the one
//! whose snapshot the run fetches).
//! so every timeline sample is one moment of all sources. A tick is stamped at the middle
//! of its reads. Blocking sources run on tokio's blocking pool so a slow NVML call never
//! stalls the load's tasks. A source that fails is counted and warned about once; the run
//! goes on, and the report says how many samples each source gave.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use tracing::warn;

use crate::http::client::{self, Target};
use crate::http::prometheus::{self, Mapped, MetricMap};
use crate::memsource::{MemoryReading, MemorySource};
use crate::results::MemorySourceInfo;

/// A Prometheus endpoint to scrape.
pub struct Scrape {
    pub url: String,
    pub target: Target,
    pub map: MetricMap,
}

/// Scrapes once: the status must be 200 and the text must parse.
pub async fn scrape(s: &Scrape, timeout: Duration) -> Result<Mapped, String> {
    let (status, body) = client::get(&s.target, timeout, Method::GET).await?;
    if status != 200 {
        return Err(format!("HTTP {status}"));
    }
    let text = String::from_utf8_lossy(&body);
    let e = prometheus::parse(&text).map_err(|e| e.to_string())?;
    Ok(s.map.apply(&e))
}

pub struct Sampler {
    scrapes: Vec<(Scrape, MemorySourceInfo)>,
    blocking: Vec<(Arc<dyn MemorySource>, MemorySourceInfo)>,
    timeout: Duration,
    /// The endpoint is a `vramroom.probe`.
    pub is_probe: bool,
    /// The probe's `memory_stats()` at the first and at the latest scrape.
    pub first_stats: BTreeMap<String, i64>,
    pub last_stats: BTreeMap<String, i64>,
    /// The service's admission rejections by reason at the first and the latest scrape.
    pub first_rejections: Option<BTreeMap<String, u64>>,
    pub last_rejections: BTreeMap<String, u64>,
}

fn note_series(info: &mut MemorySourceInfo, r: &MemoryReading) {
    for n in r.series() {
        if !info.series.iter().any(|s| s == n) {
            info.series.push(n.into());
        }
    }
}

/// Adds `r` into `acc`, field by field ([`MemoryReading::add`]).
pub fn add_reading(acc: &mut MemoryReading, r: &MemoryReading) {
    acc.add(r);
}

impl Sampler {
    pub fn new(
        scrapes: Vec<Scrape>,
        blocking: Vec<Arc<dyn MemorySource>>,
        timeout: Duration,
    ) -> Sampler {
        let scrapes = scrapes.into_iter().map(|s| {
            let info = MemorySourceInfo {
                name: format!("prometheus {}", s.url),
                kind: "prometheus".into(),
                ..Default::default()
            };
            (s, info)
        });
        let scrapes = scrapes.collect();
        let blocking = blocking
            .into_iter()
            .map(|b| {
                let info = MemorySourceInfo {
                    name: b.name(),
                    kind: b.kind().into(),
                    ..Default::default()
                };
                (b, info)
            })
            .collect();
        Sampler {
            scrapes,
            blocking,
            timeout,
            is_probe: false,
            first_stats: BTreeMap::new(),
            last_stats: BTreeMap::new(),
            first_rejections: None,
            last_rejections: BTreeMap::new(),
        }
    }

    /// Whether there is anything to sample.
    pub fn has_sources(&self) -> bool {
        !self.scrapes.is_empty() || !self.blocking.is_empty()
    }

    /// The endpoint's URL.
    pub fn scrape_url(&self) -> Option<&str> {
        self.scrapes.first().map(|s| s.0.url.as_str())
    }

    /// Reads every source once and merges the readings.
    pub async fn read(&mut self) -> MemoryReading {
        let mut reading = MemoryReading::default();
        let mut summed = MemoryReading::default();
        for (s, info) in &mut self.scrapes {
            match scrape(s, self.timeout).await {
                Ok(m) => {
                    info.samples += 1;
                    note_series(info, &m.reading);
                    info.mapped = m.matched.clone();
                    if m.is_probe {
                        self.is_probe = true;
                        info.kind = "probe".into();
                    }
                    if !m.rejections.is_empty() || self.first_rejections.is_some() {
                        self.first_rejections
                            .get_or_insert_with(|| m.rejections.clone());
                        self.last_rejections = m.rejections.clone();
                    }
                    if !m.memory_stats.is_empty() {
                        if self.first_stats.is_empty() {
                            self.first_stats = m.memory_stats.clone();
                        }
                        self.last_stats = m.memory_stats;
                    }
                    add_reading(&mut summed, &m.reading);
                }
                Err(e) => {
                    if info.failures == 0 {
                        warn!(url = %s.url, error = %e, "metrics scrape failed");
                        info.note = e;
                    }
                    info.failures += 1;
                }
            }
        }
        reading.fill_from(&summed);
        for (src, info) in &mut self.blocking {
            let s = src.clone();
            let r = tokio::task::spawn_blocking(move || s.sample())
                .await
                .unwrap_or_else(|e| Err(format!("sampler task failed: {e}")));
            match r {
                Ok(r) => {
                    info.samples += 1;
                    note_series(info, &r);
                    reading.fill_from(&r);
                }
                Err(e) => {
                    if info.failures == 0 {
                        warn!(source = %info.name, error = %e, "memory source failed");
                        info.note = e;
                    }
                    info.failures += 1;
                }
            }
        }
        reading
    }

    /// Every source with its tally.
    pub fn infos(&self) -> Vec<MemorySourceInfo> {
        let mut v: Vec<MemorySourceInfo> = self.scrapes.iter().map(|s| s.1.clone()).collect();
        v.extend(self.blocking.iter().map(|b| b.1.clone()));
        for i in &mut v {
            i.status = if i.samples > 0 { "ok" } else { "failing" }.into();
        }
        v
    }
}

/// What the service rejected during the run, by reason: the latest scrape's counters less
/// the first's (a counter that went down, a restart, counts from zero).
pub fn rejections_during(
    first: Option<&BTreeMap<String, u64>>,
    last: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    last.iter()
        .map(|(k, &v)| {
            let before = first.and_then(|f| f.get(k)).copied().unwrap_or(0);
            (k.clone(), if v >= before { v - before } else { v })
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}
