//! `vramroom watch URL…`: the memory of one or more services (the ranks of a torchrun job,
//! replicas) on one timeline, without sending any load.
//!
//! Design note: each tick scrapes every endpoint concurrently (one slow rank does not skew
//! the others' time stamps), maps each scrape with the same known names as `vramroom http`
//! ([`MetricMap`]), and keeps each endpoint's reading beside their sum, so the per-rank
//! imbalance and the job's total are both on the one clock. The rank of an endpoint is what
//! its probe says (`vramroom_probe_info{rank=…,local_rank=…}`), else its position. The
//! watch runs until its duration, or until the stop flag (Ctrl-C); what was sampled is
//! returned either way. An endpoint that fails is counted and the watch goes on; only
//! endpoints that all fail their first scrape are an error (before anything starts).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::Method;
use serde::{Deserialize, Serialize};

use crate::error::{LoadError, Result};
use crate::http::client::{self, Target};
use crate::http::prometheus::MetricMap;
use crate::http::prometheus::{self, Selector, Target as MetricTarget, PROBE_INFO_METRIC};
use crate::http::sample::add_reading;
use crate::memsource::MemoryReading;

/// What to watch.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    pub urls: Vec<String>,
    pub interval: Duration,
    /// `None`: until stopped.
    pub duration: Option<Duration>,
    pub metric_rules: Vec<(MetricTarget, Selector)>,
    pub timeout: Duration,
}

/// One endpoint and how it did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WatchSource {
    pub url: String,
    /// The probe's `rank` label (torchrun's RANK), when it exports one.
    pub rank: Option<String>,
    pub local_rank: Option<String>,
    pub samples: u64,
    pub failures: u64,
    /// The last error, in words.
    pub note: String,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub capacity_bytes: Option<u64>,
    /// OOMs its counter rose by during the watch.
    pub ooms: u64,
}

/// One tick: each endpoint's reading (`None`: that scrape failed) and their sum.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WatchTick {
    pub t_s: f64,
    pub per_source: Vec<Option<MemoryReading>>,
    pub total: MemoryReading,
}

/// The whole watch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WatchResult {
    pub interval_ms: f64,
    pub wall_s: f64,
    /// `"completed"` (the duration ran out) or `"cancelled"` (Ctrl-C).
    pub stop_reason: String,
    pub sources: Vec<WatchSource>,
    /// Bounded: a day at 250 ms fits.
    pub ticks: Vec<WatchTick>,
    /// The highest summed reserved and allocated over the watch.
    pub peak_total_reserved_bytes: u64,
    pub peak_total_allocated_bytes: u64,
}

/// Most ticks kept (the same bound as the load's timeline).
const MAX_TICKS: usize = crate::timeline::MAX_SAMPLES;

struct Ep {
    url: String,
    target: Target,
}

async fn scrape_one(
    ep: &Ep,
    map: &MetricMap,
    timeout: Duration,
) -> std::result::Result<(MemoryReading, Option<String>, Option<String>), String> {
    let (status, body) = client::get(&ep.target, timeout, Method::GET).await?;
    if status != 200 {
        return Err(format!("HTTP {status}"));
    }
    let e = prometheus::parse(&String::from_utf8_lossy(&body)).map_err(|e| e.to_string())?;
    let info = e.get(PROBE_INFO_METRIC).next();
    let rank = info.and_then(|s| s.label("rank")).map(str::to_string);
    let local = info.and_then(|s| s.label("local_rank")).map(str::to_string);
    Ok((map.apply(&e).reading, rank, local))
}

/// Watches `cfg.urls` until the duration or `stop`. `on_tick` sees every tick as it comes
/// (the CLI prints a line).
pub fn watch(
    cfg: &WatchConfig,
    stop: Arc<AtomicBool>,
    mut on_tick: impl FnMut(&WatchTick, &[WatchSource]),
) -> Result<WatchResult> {
    if cfg.urls.is_empty() {
        return Err(LoadError::Config("give at least one metrics URL".into()));
    }
    if cfg.interval < Duration::from_millis(10) {
        return Err(LoadError::Config("--interval must be at least 10ms".into()));
    }
    let eps: Vec<Ep> = cfg
        .urls
        .iter()
        .map(|u| {
            client::resolve(u)
                .map(|t| Ep {
                    url: u.clone(),
                    target: t,
                })
                .map_err(|e| LoadError::Http(format!("{u}: {e}")))
        })
        .collect::<Result<_>>()?;
    let map = MetricMap::with_user(cfg.metric_rules.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LoadError::Thread(e.to_string()))?;
    rt.block_on(async {
        let mut sources: Vec<WatchSource> = eps
            .iter()
            .map(|e| WatchSource {
                url: e.url.clone(),
                ..Default::default()
            })
            .collect();
        let mut first_ooms: Vec<Option<u64>> = vec![None; eps.len()];
        let mut out = WatchResult {
            interval_ms: cfg.interval.as_secs_f64() * 1e3,
            stop_reason: "completed".into(),
            ..Default::default()
        };
        let start = Instant::now();
        let mut next = start;
        let mut first = true;
        loop {
            let t0 = start.elapsed().as_secs_f64();
            let reads = futures_join(eps.iter().map(|e| scrape_one(e, &map, cfg.timeout))).await;
            if first && reads.iter().all(|r| r.is_err()) {
                let why: Vec<String> = eps
                    .iter()
                    .zip(&reads)
                    .map(|(e, r)| {
                        format!(
                            "{}: {}",
                            e.url,
                            r.as_ref().err().cloned().unwrap_or_default()
                        )
                    })
                    .collect();
                return Err(LoadError::Http(format!(
                    "no metrics endpoint answered: {}",
                    why.join("; ")
                )));
            }
            first = false;
            let mut tick = WatchTick {
                t_s: (t0 + start.elapsed().as_secs_f64()) / 2.0,
                ..Default::default()
            };
            for (i, r) in reads.into_iter().enumerate() {
                let s = &mut sources[i];
                match r {
                    Ok((m, rank, local)) => {
                        s.samples += 1;
                        s.rank = rank.or(s.rank.take());
                        s.local_rank = local.or(s.local_rank.take());
                        s.peak_allocated_bytes =
                            s.peak_allocated_bytes.max(m.allocated.unwrap_or(0));
                        s.peak_reserved_bytes = s.peak_reserved_bytes.max(m.reserved.unwrap_or(0));
                        s.capacity_bytes = m.capacity.or(s.capacity_bytes);
                        if let Some(n) = m.num_ooms {
                            let f = *first_ooms[i].get_or_insert(n);
                            s.ooms = n.saturating_sub(f);
                        }
                        add_reading(&mut tick.total, &m);
                        tick.per_source.push(Some(m));
                    }
                    Err(e) => {
                        s.failures += 1;
                        s.note = e;
                        tick.per_source.push(None);
                    }
                }
            }
            out.peak_total_reserved_bytes = out
                .peak_total_reserved_bytes
                .max(tick.total.reserved.unwrap_or(0));
            out.peak_total_allocated_bytes = out
                .peak_total_allocated_bytes
                .max(tick.total.allocated.unwrap_or(0));
            on_tick(&tick, &sources);
            if out.ticks.len() < MAX_TICKS {
                out.ticks.push(tick);
            }
            next += cfg.interval;
            let done_at = cfg.duration.map(|d| start + d);
            // Sleep in short steps so Ctrl-C is seen within 50 ms.
            loop {
                if stop.load(Ordering::Relaxed) {
                    out.stop_reason = "cancelled".into();
                    out.wall_s = start.elapsed().as_secs_f64();
                    out.sources = sources;
                    return Ok(out);
                }
                if done_at.is_some_and(|d| Instant::now() >= d) {
                    out.wall_s = start.elapsed().as_secs_f64();
                    out.sources = sources;
                    return Ok(out);
                }
                let now = Instant::now();
                if now >= next {
                    if now > next + cfg.interval {
                        next = now;
                    }
                    break;
                }
                tokio::time::sleep((next - now).min(Duration::from_millis(50))).await;
            }
        }
    })
}

/// Runs the futures concurrently on this task and returns their outputs in order.
async fn futures_join<F, T>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T>,
{
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futs.map(Box::pin).collect();
    let mut outs: Vec<Option<T>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in pinned.iter_mut().zip(outs.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::server::{Reply, Seen, TestServer};

    fn probe(rank: u32, reserved: u64) -> TestServer {
        TestServer::start(
            1,
            Arc::new(move |_: &Seen| {
                Reply::ok(format!(
                    "vramroom_probe_info{{version=\"x\",rank=\"{rank}\",local_rank=\"{rank}\"}} 1\n\
                     torch_cuda_memory_allocated_bytes{{device=\"0\"}} {}\n\
                     torch_cuda_memory_reserved_bytes{{device=\"0\"}} {reserved}\n\
                     torch_cuda_device_capacity_bytes{{device=\"0\"}} 1000000\n",
                    reserved / 2
                ))
            }),
        )
        .unwrap()
    }

    #[test]
    fn two_ranks_on_one_timeline() {
        let (a, b) = (probe(0, 1000), probe(1, 3000));
        let cfg = WatchConfig {
            urls: vec![a.url("/metrics"), b.url("/metrics")],
            interval: Duration::from_millis(20),
            duration: Some(Duration::from_millis(200)),
            metric_rules: Vec::new(),
            timeout: Duration::from_secs(2),
        };
        let mut seen = 0;
        let r = watch(&cfg, Arc::new(AtomicBool::new(false)), |_, _| seen += 1).unwrap();
        assert!(
            r.ticks.len() >= 3 && seen == r.ticks.len(),
            "{}",
            r.ticks.len()
        );
        assert_eq!(r.stop_reason, "completed");
        assert_eq!(r.sources[0].rank.as_deref(), Some("0"));
        assert_eq!(r.sources[1].rank.as_deref(), Some("1"));
        assert_eq!(r.sources[1].peak_reserved_bytes, 3000);
        let t = &r.ticks[0];
        assert_eq!(t.total.reserved, Some(4000));
        assert_eq!(t.total.capacity, Some(2_000_000));
        assert_eq!(t.per_source[1].unwrap().allocated, Some(1500));
        assert_eq!(r.peak_total_reserved_bytes, 4000);
        assert!(t.t_s <= r.ticks.last().unwrap().t_s);
    }

    #[test]
    fn a_stop_ends_it_and_dead_endpoints_are_an_error() {
        let a = probe(0, 10);
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = WatchConfig {
            urls: vec![a.url("/metrics")],
            interval: Duration::from_millis(20),
            duration: None,
            metric_rules: Vec::new(),
            timeout: Duration::from_secs(2),
        };
        let s2 = stop.clone();
        let r = watch(&cfg, stop, move |_, _| s2.store(true, Ordering::Relaxed)).unwrap();
        assert_eq!(r.stop_reason, "cancelled");
        assert_eq!(r.ticks.len(), 1);
        let dead = WatchConfig {
            urls: vec!["http://127.0.0.1:9/metrics".into()],
            ..cfg
        };
        assert!(watch(&dead, Arc::new(AtomicBool::new(false)), |_, _| {}).is_err());
    }
}
