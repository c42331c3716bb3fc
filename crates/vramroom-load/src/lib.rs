//! # vramroom-load
//!
//! The load tester's engine: run a model workload under load in-process (N worker threads
//! sharing one device and its caching allocator, as PyTorch threads share one process),
//! watch memory the way the allocator sees it, find the OOM point, and name the waste.
//!
//! Entry points (what `vramroom loadtest` / `vramroom claims` call):
//! - [`run`]`(&LoadConfig, stop, progress) -> Result<RunResult>`: the whole load test —
//!   load, timeline, latency, OOM search, what-if replay, diagnosis, thresholds.
//! - [`claims::run_claims`]`() -> ClaimsResult`: the five claims of ground-truth.md.
//! - Parsers for user input: [`parse_stages`] (the loadtest's stages, on
//!   vramroom-workload's parser), [`threshold::parse_thresholds`]; the workload's own
//!   vocabulary (models, input sizes, devices, durations) is vramroom-workload's.
//!
//! - [`http::run()`]`(&HttpConfig, stop, progress) -> Result<RunResult>`: `vramroom http`, load
//!   on any HTTP endpoint (closed or open model, stages), with the service's memory (NVML, a
//!   Prometheus endpoint, the `vramroom.probe` probe) on the same timeline; the result is
//!   the same [`RunResult`] with its `http` part, so reports and thresholds are shared.
//!
//! The flow is one way: [`config`] (what the user asked, validated) → [`engine`] (the
//! closed-model load on one device) → [`search`] (the OOM search on the meta twin, which
//! probes with the engine) → [`diagnose`] (findings and the what-if replay, for in-process
//! and HTTP runs alike) → [`results`] (the result types and the documented JSON schema) →
//! [`report`] (terminal, JSON, HTML; a pure function of the result). [`pipeline`] orders
//! the steps once for any [`driver::Driver`]: [`inprocess`] (the engine) and
//! [`http::run`] (the HTTP client) are the two, and [`aggregate`] is what they share in
//! turning measurements into a result; no step calls back into the one that called it. Beside them: [`timeline`]
//! (measurement), [`threshold`], [`claims`], [`http`] (the HTTP load client),
//! [`memsource`] (memory from outside the allocator: NVML, fakes). Workloads, devices and
//! stages come from vramroom-workload.

pub mod aggregate;
pub mod claims;
pub mod config;
pub mod diagnose;
pub mod driver;
pub mod engine;
pub mod error;
pub mod http;
pub mod inprocess;
pub mod memsource;
pub mod pipeline;
pub mod report;
pub mod results;
pub mod search;
pub mod threshold;
pub mod timeline;

pub use config::{
    parse_stages, LoadConfig, LoadPlan, RampStep, Stage, DEFAULT_CAPACITY, DEFAULT_WHAT_IF,
};
pub use driver::{Driver, Evidence};
pub use error::{LoadError, Result};
pub use memsource::{FnSource, MemoryReading, MemorySource, NvmlDevice, NvmlSource};
pub use pipeline::{run, run_driver};
pub use results::*;
pub use search::{oom_search, SearchAxis, SearchConfig};
pub use threshold::{parse_thresholds, Threshold};
