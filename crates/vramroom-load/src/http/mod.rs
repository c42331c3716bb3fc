//! `vramroom http`: load on any HTTP endpoint, with the service's memory on the same
//! timeline, and the same results and report as `vramroom loadtest`.
//!
//! Design note: most users test a service, not a function. This module is the load client
//! of issue #6, and it reuses everything `vramroom loadtest` has on the output side: the
//! run ends as a [`RunResult`](crate::results::RunResult) (with its optional `http` part),
//! so thresholds, results.json and the HTML report work unchanged.
//!
//! - [`client`]: HTTP/1.1 on hyper, one kept-alive connection per worker; error kinds.
//! - [`load`]: the closed (`-c`) and open (`-q`, constant or Poisson) models, stages.
//! - [`body`]: request bodies — templates with placeholders, files, size distributions.
//! - [`record`]: per-thread HDR histograms and counters; coordinated-omission correction.
//! - [`refusal`]: a run whose every answer is the same 4xx stops early, with a hint.
//! - [`prometheus`]: the text exposition format, and known metric names mapped to memory.
//! - [`sample`]: the memory sampler (scraped endpoint, NVML) on the load's clock.
//! - [`predict`]: `--predict` (the OOM concurrency per device and config, size caps,
//!   per-request attribution) and `--ramp-until-oom`'s comparison with it.
//! - [`probe`]: snapshots from `python/vramroom/probe.py`, replays, findings.
//! - [`config`]: [`HttpConfig`], and what of it is checked without the network.
//! - [`mod@run`]: the HTTP [`Driver`](crate::driver::Driver) and [`run()`](run::run), the
//!   whole run through the shared pipeline; the replays and prediction after it.
//! - [`prepare`]: the config checked against the world before the clock starts.
//! - [`controller`]: the stages, the memory sampler, the probe's snapshots.
//! - [`workers`]: one request; the closed model's load threads, the open dispatcher.
//! - [`aggregate`]: histograms and readings into the [`RunResult`](crate::results::RunResult).
//! - [`watch`]: `vramroom watch`: several endpoints (ranks) on one timeline, no load.
//! - [`server`]: a small loopback server for tests and `vramroom bench http`.
//! - [`peer`]: `vramroom bench http`'s peer client (wrk, oha), run and read.
//! - [`listener`]: the local process listening on a URL's port (for NVML's `--pid`).
//!
//! ```no_run
//! use std::sync::{atomic::AtomicBool, Arc};
//! use std::time::Duration;
//! use vramroom_load::http::{load::{Stage, StageLoad}, HttpConfig};
//!
//! let mut cfg = HttpConfig::new("http://127.0.0.1:8000/generate");
//! cfg.stages = vec![
//!     Stage::held(StageLoad::Workers(4), Some(Duration::from_secs(10))),
//!     Stage::held(StageLoad::Workers(16), Some(Duration::from_secs(20))),
//! ];
//! cfg.metrics_url = Some("http://127.0.0.1:8000/metrics".into());
//! let r = vramroom_load::http::run(&cfg, Arc::new(AtomicBool::new(false)), |_| {})?;
//! println!("{} ok, {} shed, p99 {:.1} ms", r.requests.ok, r.http.unwrap().shed, r.latency.p99_ms);
//! # Ok::<(), vramroom_load::LoadError>(())
//! ```

pub mod aggregate;
pub mod body;
pub mod client;
pub mod config;
pub mod controller;
pub mod limits;
pub mod listener;
pub mod load;
pub mod peer;
pub mod predict;
pub mod prepare;
pub mod probe;
pub mod prometheus;
pub mod record;
pub mod refusal;
pub mod run;
pub mod sample;
pub mod server;
pub mod watch;
pub mod workers;

pub use config::HttpConfig;
pub use run::{run, HttpDriver};
