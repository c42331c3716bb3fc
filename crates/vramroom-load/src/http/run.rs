//! The HTTP driver: [`HttpConfig`] run through the one pipeline
//! ([`crate::pipeline::run_driver`]), and what only an HTTP run does after the load (the
//! probe trace's replays and `--predict`).
//!
//! Design note: the steps of a run live in their own files: [`crate::http::prepare`] (the
//! config against the world, before the clock starts), [`crate::http::controller`] (the
//! stages, the sampler, the probe's snapshots), [`crate::http::workers`] (where requests
//! are sent), [`crate::http::aggregate`] (the measurements, one per stage, for the
//! pipeline's fold). The evidence is the probe's: the service's snapshots. This file
//! owns the runtimes they run on: one small runtime for the controller (`block_on`), plus
//! the closed model's load threads, both gone before the replays, the diagnosis and the
//! thresholds run on the calling thread.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::diagnose::RunLog;
use crate::driver::{Diagnosis, Driver, Evidence, Measured};
use crate::error::{LoadError, Result};
use crate::http::config::HttpConfig;
use crate::http::controller::drive;
use crate::http::predict::{observed, predict, DeviceCapacity};
use crate::http::prepare::{prepare, Prepared};
use crate::http::workers::Shards;
use crate::results::*;
use crate::threshold::Threshold;

/// Runs an HTTP load test. This is the entry point of `vramroom http`.
///
/// `stop` (Ctrl-C) ends the load early; what was measured is still returned with
/// `stop_reason: cancelled`. `progress` is called on the calling thread several times a
/// second. Errors are only for input that cannot run (see [`crate::http::prepare`]: a bad
/// URL, body, metrics endpoint, or nothing listening).
pub fn run(
    cfg: &HttpConfig,
    stop: Arc<AtomicBool>,
    progress: impl FnMut(&Progress),
) -> Result<RunResult> {
    crate::pipeline::run_driver(&mut HttpDriver::new(cfg), stop, progress)
}

/// The HTTP client as a [`Driver`].
pub struct HttpDriver<'a> {
    cfg: &'a HttpConfig,
    /// Set by `prepare`, taken by `drive`.
    ready: Option<(tokio::runtime::Runtime, Prepared, Option<Shards>)>,
    /// Each device's capacity, for `--predict`.
    caps: Vec<DeviceCapacity>,
    sources: Vec<MemorySourceInfo>,
    /// The probe's snapshots, until the pipeline takes them.
    evidence: Evidence,
}

impl<'a> HttpDriver<'a> {
    pub fn new(cfg: &'a HttpConfig) -> HttpDriver<'a> {
        HttpDriver {
            cfg,
            ready: None,
            caps: Vec::new(),
            sources: Vec::new(),
            evidence: Evidence::default(),
        }
    }
}

impl Driver for HttpDriver<'_> {
    fn prepare(&mut self, _progress: &mut dyn FnMut(&Progress)) -> Result<()> {
        let cfg = self.cfg;
        cfg.validate()?;
        let threads = if cfg.threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
        } else {
            cfg.threads
        };
        let open = cfg.is_open();
        // Closed model: the controller and the sampler need one thread; the load has its own.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(if open { threads } else { 1 })
            .thread_name("vramroom-http")
            .enable_all()
            .build()
            .map_err(|e| LoadError::Thread(e.to_string()))?;
        let prep = rt.block_on(prepare(cfg))?;
        let shards = if open {
            None
        } else {
            Some(Shards::start(threads)?)
        };
        self.ready = Some((rt, prep, shards));
        Ok(())
    }

    fn drive(
        &mut self,
        stop: &Arc<AtomicBool>,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<Measured> {
        let (rt, prep, shards) = self
            .ready
            .take()
            .ok_or_else(|| LoadError::Config("the run was not prepared".into()))?;
        let result = rt.block_on(drive(self.cfg, prep, shards.as_ref(), stop, progress));
        // Tasks still running (requests past the grace period) are dropped with the runtimes.
        if let Some(s) = shards {
            s.stop();
        }
        rt.shutdown_background();
        let d = result?;
        self.caps = d.caps;
        self.sources = d.sources;
        self.evidence = Evidence {
            run_log: None,
            snapshot: d.snapshot,
            oom_snapshot: d.oom_snapshot,
        };
        Ok(d.measured)
    }

    fn memory_sources(&self) -> Vec<MemorySourceInfo> {
        self.sources.clone()
    }

    fn evidence(&mut self) -> Evidence {
        std::mem::take(&mut self.evidence)
    }

    fn search(
        &mut self,
        result: &mut RunResult,
        _run_log: Option<&RunLog>,
        _stop: &AtomicBool,
        _progress: &mut dyn FnMut(&Progress),
    ) {
        replay_and_predict(self.cfg, result, &self.caps);
    }

    fn diagnosis(&mut self, _progress: &mut dyn FnMut(&Progress)) -> Diagnosis<'_> {
        Diagnosis::Service
    }

    fn thresholds(&self) -> &[Threshold] {
        &self.cfg.thresholds
    }
}

/// The replays of the probe's trace and the prediction from it, after the runtime is gone.
fn replay_and_predict(cfg: &HttpConfig, r: &mut RunResult, caps: &[DeviceCapacity]) {
    if let Some(s) = &r.snapshot {
        let own = vramroom_alloc::AllocatorConfig::from_settings(&s.allocator_settings)
            .map(|c| c.to_string())
            .unwrap_or_default();
        let own = if own == vramroom_alloc::AllocatorConfig::default().to_string() {
            String::new()
        } else {
            own
        };
        r.alloc_conf = own.clone();
        // Replay on the service's device when its size is known, else unbounded: the
        // question is how much each config reserves, not whether it fits a guess.
        let cap = if r.capacity_bytes > 0 {
            r.capacity_bytes
        } else {
            1 << 50
        };
        r.what_if = crate::diagnose::what_if_snapshot(s, cap, &own, &cfg.what_if);
        r.what_if_check = crate::diagnose::what_if_check_service(r, &r.what_if, s);
        if let Some(po) = &cfg.predict {
            let gentle = r.stages.iter().map(|s| s.concurrency).max().unwrap_or(1);
            let p = predict(s, caps, &overhead(r), &own, &cfg.what_if, gentle, po);
            if let Some(h) = r.http.as_mut() {
                h.prediction = Some(p);
            }
        }
    }
    if cfg.stop_at_first_oom {
        let mut o = observed(r);
        if let Some(h) = r.http.as_mut() {
            let mine = h.prediction.as_ref().and_then(|p| p.first_oom_concurrency);
            o.compare(mine);
            h.prediction.get_or_insert_with(Default::default).observed = Some(o);
        }
    }
}

/// Per device, what the process held beyond PyTorch's reserved bytes (the CUDA context,
/// libraries), as NVML saw it: the most over the run. NVML samples one device, taken as the
/// process's device 0.
fn overhead(r: &RunResult) -> BTreeMap<usize, u64> {
    let oh = r
        .timeline
        .iter()
        .filter(|s| s.reserved_bytes > 0)
        .filter_map(|s| {
            s.process_used_bytes
                .map(|u| u.saturating_sub(s.reserved_bytes))
        })
        .max();
    oh.map(|v| BTreeMap::from([(0usize, v)]))
        .unwrap_or_default()
}
