//! The result of a load run, and the documented JSON schema of `vramroom loadtest --json`.
//!
//! Design note: these types are the contract between the engine (this crate) and the report
//! side (HTML, terminal summary, CLI). They are plain data — no handles, no allocator types
//! except the kept [`Snapshot`]s, which are skipped in JSON (the CLI writes them as pickles
//! for memory_viz). Everything serializes with `serde`, field names are the JSON keys, and
//! the schema is versioned by [`SCHEMA_VERSION`]: a field is only ever added, never renamed
//! or re-typed, without bumping it.
//!
//! # JSON schema (version 1)
//!
//! Units: every `*_bytes` field is an integer count of bytes; every `*_ms` a float of
//! milliseconds; every `*_s` a float of seconds since the run started (`t_s`) or a duration.
//! Rates are per second. `null` means "not measured / does not apply".
//!
//! ```text
//! RunResult {
//!   schema_version: 1,
//!   vramroom_version: "0.1.0",
//!   scenario: ScenarioInfo,        // what ran (model, batch, input sizes, mistakes planted)
//!   load: LoadInfo,                // how it was driven (stages, -c, -n, ramp-until-oom)
//!   device: "cpu" | "meta" | "cuda:0",
//!   capacity_bytes, alloc_conf,    // the simulated (or real) device capacity, PYTORCH_CUDA_ALLOC_CONF
//!   wall_s, stop_reason,           // "completed" | "cancelled" | "oom_found" | "time_limit" | "request_limit"
//!   baseline_bytes,                // allocated before any request: weights, optimizer, BLAS workspace
//!   requests: RequestSummary,      // total / ok / oom / other errors
//!   latency: LatencyStats,         // over all successful requests (HDR histogram)
//!   throughput: Throughput,        // requests/s and items/s (items = samples = batch elements)
//!   errors: ErrorCounts,           // { oom, by_kind: { kind: count } }
//!   stages: [StageResult],         // one per stage, in order
//!   by_concurrency: [ConcurrencyResult], // one per distinct concurrency level, ascending
//!   timeline: [MemorySample],      // periodic + every new peak + every OOM, by t_s
//!   peaks: Peaks,                  // run-wide peaks and the category breakdown at the peak
//!   ooms: [OomRecord],             // allocator state at each OOM (first `MAX_OOM_RECORDS`)
//!   oom_search: OomSearch | null,  // largest safe concurrency (or batch), fit + bisection
//!   findings: [Finding],           // named causes; empty for a clean run
//!   what_if: [WhatIfRow],          // the run's own requests replayed under other alloc configs
//!   what_if_check: WhatIfCheck,    // what was replayed; does the own-config row agree with the run
//!   thresholds: [ThresholdResult], // k6-style gates; any `passed: false` => exit 99
//!   final_memory_stats: { "allocated_bytes.all.current": i64, ... }, // torch.cuda.memory_stats()
//!   final_memory_summary: "...",   // torch.cuda.memory_summary()
//!   memory_sources: [MemorySourceInfo], // optional: NVML, a scraped endpoint (absent = none)
//!   http: HttpResult                // optional: `vramroom http` runs only (absent for loadtest)
//! }
//! ```
//!
//! Added in place, all optional (absent in older files and read back as absent), so version
//! 1 readers are unaffected:
//! - `MemorySample.process_used_bytes` / `overhead_bytes`: NVML's bytes of the process on
//!   the device, and that minus the allocator's reserved bytes (the CUDA context and library
//!   workspaces: "context + library overhead"); `Peaks.process_used_bytes`,
//!   `Peaks.overhead_bytes`, `Peaks.device_used_bytes`: their maxima.
//! - `memory_sources`, `http` (see [`HttpResult`]): what `vramroom http` measures. An HTTP
//!   run fills the common fields this way: `scenario.kind` is `"http"` and `scenario.name`
//!   the URL; `device` is `"service"`; `capacity_bytes` is what the memory sources say the
//!   service may use (0 = unknown); `baseline_bytes` is allocated memory before the first
//!   request; `requests.ok` counts 1xx–3xx answers, `requests.other_errors` 4xx, 5xx other
//!   than 503, and transport errors, and 503s (load shedding) are counted apart in
//!   `http.shed`; `requests.oom` is 0 and `errors.oom` the OOMs the service itself reported
//!   during the run (its metrics' OOM counter); `latency` is over the ok answers, corrected
//!   for coordinated omission (`http.latency_correction` says how); `stages[].concurrency`
//!   is the stage's workers (closed model) or the most requests in flight (open model);
//!   `timeline` samples come from the memory sources at `--metrics-interval`, with
//!   `concurrency` the requests in flight, and only the series in `http.memory_series` are
//!   measured (the others read 0); `final_memory_stats` is the probe's last
//!   `torch.cuda.memory_stats()`, summed over devices.
//!
//! - `requests.stopped` (every `RequestSummary`): requests still in flight when the load's
//!   duration ended (or Ctrl-C), stopped at their next op; not in `requests.total`.
//!   `stages[].workers_started`: the workers that ran in the stage (fewer than its
//!   `concurrency` only when the load ended before all could start).
//! - `what_if_check` (see [`WhatIfCheck`]); `OomSearch.not_better`,
//!   `RecommendedSearch.safe_peak_reserved_bytes`; `LoadPoint.peak_activation_bytes`.
//!
//! Each type below documents its own fields; the doc comment of a field is its schema entry.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use vramroom_alloc::Snapshot;
pub use vramroom_workload::{Mistakes, ScenarioInfo};

pub mod prediction;
pub use prediction::{
    ConfigPrediction, DeviceCapacity, DevicePrediction, Observed, RequestAttribution, RequestPoint,
    ServicePrediction, SizeCap,
};

/// Version of the JSON layout below. Bumped on any incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// At most this many OOMs keep their full allocator state (summary text and stats); later
/// ones are only counted (a ramp past the OOM point can fail thousands of requests).
pub const MAX_OOM_RECORDS: usize = 16;

/// The whole run. See the module docs for the JSON layout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The vramroom-load crate version that produced this file.
    pub vramroom_version: String,
    pub scenario: ScenarioInfo,
    pub load: LoadInfo,
    /// `"cpu"`, `"meta"` or `"cuda:N"`.
    pub device: String,
    /// The device capacity the allocator ran under (simulated for cpu/meta).
    pub capacity_bytes: u64,
    /// The allocator config string in `PYTORCH_CUDA_ALLOC_CONF` syntax (`""` = default).
    pub alloc_conf: String,
    /// Seconds from the first request to the end of the run.
    pub wall_s: f64,
    pub stop_reason: StopReason,
    /// Bytes allocated after setup and before the first request (model weights, optimizer
    /// object, persistent workspaces). "Above base" figures subtract this.
    pub baseline_bytes: u64,
    pub requests: RequestSummary,
    /// Latency of successful requests.
    pub latency: LatencyStats,
    pub throughput: Throughput,
    pub errors: ErrorCounts,
    pub stages: Vec<StageResult>,
    /// One row per distinct concurrency level, ascending (a level seen in two stages is
    /// merged).
    pub by_concurrency: Vec<ConcurrencyResult>,
    pub timeline: Vec<MemorySample>,
    pub peaks: Peaks,
    pub ooms: Vec<OomRecord>,
    pub oom_search: Option<OomSearch>,
    pub findings: Vec<Finding>,
    pub what_if: Vec<WhatIfRow>,
    /// Whether the what-if row for the run's own config and capacity agrees with the run.
    #[serde(default)]
    pub what_if_check: WhatIfCheck,
    pub thresholds: Vec<ThresholdResult>,
    /// `torch.cuda.memory_stats()` at the end of the run.
    pub final_memory_stats: BTreeMap<String, i64>,
    /// `torch.cuda.memory_summary()` at the end of the run.
    pub final_memory_summary: String,
    /// Memory sources besides the allocator's own stats, and how they did. Empty (absent in
    /// the JSON) when there were none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_sources: Vec<MemorySourceInfo>,
    /// `vramroom http` only: the HTTP side of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpResult>,
    /// The allocator's snapshot at the end of the run (segments + event history), for
    /// `vramroom_trace::write_snapshot_file` → memory_viz. Not in the JSON.
    #[serde(skip)]
    pub snapshot: Option<Snapshot>,
    /// The allocator's snapshot at the first OOM. Not in the JSON.
    #[serde(skip)]
    pub oom_snapshot: Option<Snapshot>,
}

impl RunResult {
    /// True when every threshold held (or none was given). The CLI exits 99 otherwise.
    pub fn thresholds_passed(&self) -> bool {
        self.thresholds.iter().all(|t| t.passed)
    }
    /// Serialize as pretty JSON (the documented output).
    pub fn to_json(&self) -> String {
        // Serialization of plain data with string keys cannot fail; a non-finite float
        // becomes `null` in serde_json.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// Why the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// All stages ran to their end (or `-n` requests were made).
    Completed,
    /// The stop flag was set (Ctrl-C): the result holds what was measured so far.
    Cancelled,
    /// `--ramp-until-oom`: the first OOM was reached and the ramp stopped.
    OomFound,
    /// `--ramp-until-oom` hit its time bound before any OOM.
    TimeLimit,
    /// `vramroom http --ramp-until-oom`: no request sent at the last load step got an answer
    /// within `--timeout`, so higher steps could not show an OOM either; the ramp stopped.
    Saturated,
    /// `vramroom http`: every answer was the same 4xx (the endpoint refuses the request
    /// itself: method, path, body, credentials), so the run stopped early; `http.stop_hint`
    /// says what to change.
    Refused,
}

/// How the load was driven.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadInfo {
    /// `"stages"`, `"fixed"` (`-c` with a duration), `"requests"` (`-n`), or
    /// `"ramp_until_oom"`.
    pub mode: String,
    /// The planned stages (for `-c`/`-n` one stage).
    pub stages: Vec<StageSpecInfo>,
    /// `-n`: total requests to make.
    pub max_requests: Option<u64>,
    /// `--ramp-until-oom`: the time bound in seconds.
    pub time_limit_s: Option<f64>,
    /// Memory sampler period in milliseconds.
    pub sample_period_ms: f64,
}

/// One planned stage: `workers:duration`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StageSpecInfo {
    pub concurrency: usize,
    /// Planned duration; `null` for a request-count stage.
    pub duration_s: Option<f64>,
}

/// Requests by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSummary {
    pub total: u64,
    pub ok: u64,
    /// Failed with out-of-memory.
    pub oom: u64,
    /// Failed with any other error.
    pub other_errors: u64,
    /// Samples (batch elements) processed by successful requests.
    pub items: u64,
    /// Requests still in flight when the load ended (the duration was over, or Ctrl-C),
    /// stopped at their next op; not in `total` (they neither succeeded nor failed).
    #[serde(default)]
    pub stopped: u64,
}

impl RequestSummary {
    /// Adds another stage's counts in (a concurrency level over its stages).
    pub fn add(&mut self, b: &RequestSummary) {
        self.total += b.total;
        self.ok += b.ok;
        self.oom += b.oom;
        self.other_errors += b.other_errors;
        self.items += b.items;
        self.stopped += b.stopped;
    }
}

/// Latency percentiles from an HDR histogram (microsecond resolution, 3 significant
/// digits). All zero when `count` is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    pub count: u64,
    pub min_ms: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    /// p99.9.
    pub p999_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Successful requests per second of wall time.
    pub requests_per_s: f64,
    /// Samples per second (requests × batch).
    pub items_per_s: f64,
}

impl Throughput {
    /// The rates of `s` over `secs` of wall time (zero for no time): one rule for every
    /// stage, level and run, in-process or HTTP.
    pub fn of(s: &RequestSummary, secs: f64) -> Throughput {
        if secs <= 0.0 {
            return Throughput::default();
        }
        Throughput {
            requests_per_s: s.ok as f64 / secs,
            items_per_s: s.items as f64 / secs,
        }
    }
}

/// Errors by kind. OOM is counted on its own; `by_kind` holds the rest, keyed by a short
/// kind (`"shape"`, `"invalid_argument"`, `"alloc"`, `"panic"`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCounts {
    pub oom: u64,
    pub by_kind: BTreeMap<String, u64>,
}

/// One stage as it ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StageResult {
    /// 0-based position in `load.stages`.
    pub index: usize,
    pub concurrency: usize,
    pub start_s: f64,
    pub end_s: f64,
    pub requests: RequestSummary,
    pub latency: LatencyStats,
    pub throughput: Throughput,
    /// Peak allocated bytes during the stage (allocator peak, exact).
    pub peak_allocated_bytes: u64,
    /// Peak reserved bytes during the stage.
    pub peak_reserved_bytes: u64,
    /// Workers running when the stage ended: below `concurrency` only when the load
    /// ended (its duration, or Ctrl-C) before all of them could be started.
    #[serde(default)]
    pub workers_started: usize,
}

/// One concurrency level, all stages at that level merged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConcurrencyResult {
    pub concurrency: usize,
    pub requests: RequestSummary,
    pub latency: LatencyStats,
    pub throughput: Throughput,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// `peak_allocated_bytes - baseline_bytes`.
    pub peak_above_base_bytes: u64,
}

/// Bytes per memory category (what the memory is *for*). Sums to `allocated` up to
/// allocator-internal blocks (none on the runtime's devices).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CategoryBytes {
    pub parameter: u64,
    pub gradient: u64,
    pub optimizer_state: u64,
    /// Saved for backward by a live autograd graph.
    pub activation: u64,
    /// Op outputs not saved for backward, workspaces.
    pub temporary: u64,
    pub input: u64,
}

impl CategoryBytes {
    pub fn total(&self) -> u64 {
        self.parameter
            + self.gradient
            + self.optimizer_state
            + self.activation
            + self.temporary
            + self.input
    }
    /// `(name, bytes)` pairs in a fixed order, for tables and stacked plots.
    pub fn entries(&self) -> [(&'static str, u64); 6] {
        [
            ("parameter", self.parameter),
            ("gradient", self.gradient),
            ("optimizer_state", self.optimizer_state),
            ("activation", self.activation),
            ("temporary", self.temporary),
            ("input", self.input),
        ]
    }
}

/// Why a timeline sample was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleKind {
    /// The sampler thread's fixed-rate tick.
    Periodic,
    /// A new allocated-bytes peak, seen by the allocator observer.
    Peak,
    /// The moment of an OOM.
    Oom,
}

/// One point of the memory timeline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemorySample {
    /// Seconds since the run started.
    pub t_s: f64,
    pub kind: SampleKind,
    /// Index of the stage running at `t_s`.
    pub stage: usize,
    /// Workers running at `t_s`.
    pub concurrency: usize,
    /// `torch.cuda.memory_allocated()`.
    pub allocated_bytes: u64,
    /// `torch.cuda.memory_reserved()`.
    pub reserved_bytes: u64,
    /// `active_bytes.all.current`: allocated plus blocks pending free on another stream.
    pub active_bytes: u64,
    /// `inactive_split_bytes.all.current`: free bytes inside split segments (fragmentation).
    pub inactive_split_bytes: u64,
    /// Device memory in use per the driver (`total - mem_get_info().free`), where there is a
    /// device that reports it; `null` otherwise.
    pub device_used_bytes: Option<u64>,
    /// Bytes the process holds on the device per NVML (the allocator's reserved memory plus
    /// the CUDA context and library workspaces). Absent without an NVML source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_used_bytes: Option<u64>,
    /// `process_used_bytes − reserved_bytes` (floored at 0): the CUDA context and library
    /// workspaces, "context + library overhead". Absent without both figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_bytes: Option<u64>,
    /// Category breakdown at `t_s`. Periodic samples read it without the allocator lock, so
    /// it may lag `allocated_bytes` by the in-flight op.
    pub categories: CategoryBytes,
}

/// Run-wide peaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// `max_memory_allocated()` over the run (exact, from the allocator).
    pub allocated_bytes: u64,
    /// `max_memory_reserved()` over the run.
    pub reserved_bytes: u64,
    /// `active_bytes.all.peak`.
    pub active_bytes: u64,
    /// `inactive_split_bytes.all.peak`.
    pub inactive_split_bytes: u64,
    /// When the allocated peak was last reached (observer time, seconds).
    pub allocated_t_s: f64,
    /// `peaks.allocated_bytes - baseline_bytes`.
    pub above_base_bytes: u64,
    /// The category breakdown at the allocated peak.
    pub categories_at_peak: CategoryBytes,
    /// `num_alloc_retries` over the run: mallocs that failed, flushed the cache and retried.
    pub alloc_retries: i64,
    /// Segments the allocator reserved from the device although the pool already held at
    /// least the request's size in free cached blocks — the free memory was in pieces too
    /// small or split the wrong way: fragmentation, measured at the moment it costs memory.
    #[serde(default)]
    pub fragmented_segment_allocs: u64,
    /// Bytes of those segments.
    #[serde(default)]
    pub fragmented_segment_bytes: u64,
    /// Most bytes the process held on the device per NVML (absent without NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_used_bytes: Option<u64>,
    /// Most "context + library overhead" (`process used − reserved`) seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_bytes: Option<u64>,
    /// Most device memory in use (all processes) seen by any source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_used_bytes: Option<u64>,
}

/// The allocator's state at an OOM, as PyTorch would show it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OomRecord {
    pub t_s: f64,
    pub stage: usize,
    pub concurrency: usize,
    /// Worker thread index (0-based).
    pub worker: usize,
    /// The request's sequence number in the run.
    pub request: u64,
    /// Bytes the failing malloc asked for, when the allocator said.
    pub requested_bytes: Option<u64>,
    /// PyTorch's OOM message text.
    pub message: String,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub categories: CategoryBytes,
    /// `torch.cuda.memory_stats()` at the OOM.
    pub memory_stats: BTreeMap<String, i64>,
    /// `torch.cuda.memory_summary()` at the OOM.
    pub memory_summary: String,
}

/// The search for the largest safe load under the capacity.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OomSearch {
    /// `"concurrency"` or `"batch"`.
    pub axis: String,
    /// Device the search ran on (usually `"meta"`: same allocation sequence, no compute).
    pub device: String,
    pub capacity_bytes: u64,
    /// Fragmentation margin as a fraction of capacity (e.g. 0.1).
    pub margin_fraction: f64,
    /// `capacity_bytes - margin`: what a "safe" load must stay under.
    pub budget_bytes: u64,
    /// Which peak was fitted: `"peak_reserved"`, what runs into the capacity (see
    /// `search.rs`).
    pub metric: String,
    /// The measured points the fit used.
    pub points: Vec<LoadPoint>,
    /// `peak ≈ a + b·load` by least squares over `points`.
    pub fit: LinearFit,
    /// Smallest integer load where the fit exceeds `capacity_bytes` (predicted first OOM);
    /// `null` when the slope is ≤ 0.
    pub predicted_oom_load: Option<usize>,
    /// Largest integer load where the fit stays under `budget_bytes`.
    pub predicted_safe_load: Option<usize>,
    /// Smallest load that actually OOMed, found by bisection; `null` when none up to
    /// `max_load_tried` did.
    pub observed_oom_load: Option<usize>,
    /// Largest load that ran with no OOM, found by bisection.
    pub verified_max_load: Option<usize>,
    /// Largest verified load whose peak reserved also stays under `budget_bytes` (the
    /// recommendation).
    pub verified_safe_load: Option<usize>,
    /// Every probe of the bisection, in order.
    pub bisection: Vec<LoadPoint>,
    /// `fit.b`, rounded: the memory one more concurrent request costs.
    pub marginal_bytes_per_unit: u64,
    /// Upper bound of the search.
    pub max_load_tried: usize,
    /// The allocator config the search ran under (`PYTORCH_CUDA_ALLOC_CONF` syntax, `""`
    /// is the default).
    #[serde(default)]
    pub alloc_conf: String,
    /// The same search under the recommended config: of the what-if's configs, the one
    /// whose search does best, when it does better than the run's own config (more safe
    /// load, or the same with less peak reserved there).
    #[serde(default)]
    pub recommended: Option<RecommendedSearch>,
    /// The best of the what-if's configs when its search did no better: the run's config
    /// is already the best of those tried, and this says what the other one gave.
    #[serde(default)]
    pub not_better: Option<RecommendedSearch>,
    /// The verdict in one sentence ([`OomSearch::headline`]), said identically by the
    /// terminal summary, this file and the HTML report.
    #[serde(default)]
    pub headline: String,
    /// Requests each worker made in one probe: a probe at load N verified N times this.
    #[serde(default)]
    pub requests_per_worker: u64,
    /// The search stopped at its time limit (or Ctrl-C) before it finished: what it did
    /// not probe, the headline does not claim.
    #[serde(default)]
    pub stopped_early: bool,
}

/// The OOM search's answer under the recommended allocator config.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RecommendedSearch {
    pub alloc_conf: String,
    pub verified_safe_load: Option<usize>,
    pub observed_oom_load: Option<usize>,
    /// Peak reserved of its probe at its safe load.
    #[serde(default)]
    pub safe_peak_reserved_bytes: Option<u64>,
}

impl OomSearch {
    /// `safe concurrency N (verified over K requests: ...), first OOM at M, on capacity C
    /// under config X, and N' under the recommended config Y`: the one verdict, from the
    /// search's own numbers. It never claims more than the probes showed: the safe load
    /// says how many requests verified it and the per-request OOM chance that leaves (the
    /// rule of three: none in K draws bounds it below 3/K at 95% confidence); a missing safe
    /// load says why (one request alone runs out, or is over the budget, or the search's
    /// time ran out first); "no OOM up to" names the highest load actually probed.
    pub fn headline(&self) -> String {
        let conf = |c: &str| {
            if c.is_empty() {
                "the default config".to_string()
            } else {
                format!("PYTORCH_CUDA_ALLOC_CONF={c}")
            }
        };
        let opt = |v: Option<usize>| v.map_or_else(|| "none".to_string(), |x| x.to_string());
        let probed = |l: usize| self.bisection.iter().find(|p| p.load == l);
        let safe = match self.verified_safe_load {
            Some(n) => {
                let k = n as u64 * self.requests_per_worker.max(1);
                format!(
                    "{n} (verified over {k} requests at that load within the {} budget: \
                     per-request OOM chance below {:.1}% at 95% confidence)",
                    vramroom_alloc::human_bytes(self.budget_bytes),
                    300.0 / k as f64
                )
            }
            None => match probed(1) {
                Some(p) if p.oom => "none (one request alone runs out of memory)".to_string(),
                Some(p) => format!(
                    "none (one request alone peaks at {} reserved, over the {} budget)",
                    vramroom_alloc::human_bytes(p.peak_reserved_bytes),
                    vramroom_alloc::human_bytes(self.budget_bytes)
                ),
                None if self.stopped_early => {
                    "not verified (the search's time ran out before a probe under the \
                     capacity could)"
                        .to_string()
                }
                None => "none".to_string(),
            },
        };
        let first = match self.observed_oom_load {
            Some(m) => format!("first OOM at {m}"),
            None => match self
                .bisection
                .iter()
                .filter(|p| !p.oom)
                .map(|p| p.load)
                .max()
            {
                Some(top) => format!("no OOM up to {top}"),
                None => "no probe under the capacity".to_string(),
            },
        };
        let mut h = format!(
            "safe {} {safe}, {first}, on capacity {} under {}",
            self.axis,
            vramroom_alloc::human_bytes(self.capacity_bytes),
            conf(&self.alloc_conf)
        );
        match (&self.recommended, &self.not_better) {
            (Some(r), _) => {
                h.push_str(&format!(
                    ", and {} under the recommended {}",
                    opt(r.verified_safe_load),
                    conf(&r.alloc_conf)
                ));
                if r.verified_safe_load == self.verified_safe_load {
                    if let (Some(b), Some(a)) =
                        (r.safe_peak_reserved_bytes, self.safe_peak_reserved())
                    {
                        h.push_str(&format!(
                            " with less peak reserved there ({} against {})",
                            vramroom_alloc::human_bytes(b),
                            vramroom_alloc::human_bytes(a)
                        ));
                    }
                }
            }
            (None, Some(n)) => h.push_str(&format!(
                ", which is already the best config tried ({} gives {})",
                conf(&n.alloc_conf),
                opt(n.verified_safe_load)
            )),
            (None, None) => h.push_str(", which is already the best config tried"),
        }
        h
    }

    /// Peak reserved of the probe at the verified safe load, when one ran there.
    pub fn safe_peak_reserved(&self) -> Option<u64> {
        let safe = self.verified_safe_load?;
        self.bisection
            .iter()
            .chain(self.points.iter())
            .filter(|p| p.load == safe && !p.oom)
            .map(|p| p.peak_reserved_bytes)
            .max()
    }

    /// This search's outcome under another config, for [`OomSearch::recommended`].
    pub fn as_recommended(&self, alloc_conf: &str) -> RecommendedSearch {
        RecommendedSearch {
            alloc_conf: alloc_conf.into(),
            verified_safe_load: self.verified_safe_load,
            observed_oom_load: self.observed_oom_load,
            safe_peak_reserved_bytes: self.safe_peak_reserved(),
        }
    }

    /// `other` (the same search under another config) does better: more safe load, or the
    /// same safe load with less peak reserved there.
    pub fn is_beaten_by(&self, other: &OomSearch) -> bool {
        let (a, b) = (self.verified_safe_load, other.verified_safe_load);
        b > a
            || (b == a
                && b.is_some()
                && matches!(
                    (self.safe_peak_reserved(), other.safe_peak_reserved()),
                    (Some(x), Some(y)) if y < x
                ))
    }
}

/// One probe: a load level and what it measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadPoint {
    pub load: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The probe hit at least one OOM.
    pub oom: bool,
    /// Activation-category bytes (saved for backward) at the peak: what a graph kept alive
    /// holds, apart from weights, gradients and optimizer state.
    #[serde(default)]
    pub peak_activation_bytes: u64,
}

/// `y ≈ a + b·x`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LinearFit {
    /// Intercept (bytes).
    pub a: f64,
    /// Slope (bytes per unit of load).
    pub b: f64,
    /// Coefficient of determination (1 = perfect line).
    pub r2: f64,
}

impl LinearFit {
    pub fn at(&self, x: f64) -> f64 {
        self.a + self.b * x
    }
}

/// The named causes diagnosis can report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingId {
    /// Activation bytes saved in an inference scenario: autograd was on.
    AutogradInInference,
    /// Peak grows with accumulation steps: the graphs of all micro-steps were alive.
    GraphAccumulated,
    /// Allocated memory drifts up at steady load.
    Leak,
    /// Reserved far above allocated, inactive split bytes, alloc retries.
    Fragmentation,
    /// Reserved − allocated held by the cache at the end of the run.
    CacheHeld,
    /// The service ran out of memory (`vramroom http` with a probe: the allocator state at
    /// the OOM, from the probe's OOM snapshot).
    OutOfMemory,
    /// The service shed load (503 without an OOM), with its reason when it said one.
    LoadShed,
}

impl FindingId {
    pub fn as_str(self) -> &'static str {
        match self {
            FindingId::AutogradInInference => "autograd_in_inference",
            FindingId::GraphAccumulated => "graph_accumulated",
            FindingId::Leak => "leak",
            FindingId::Fragmentation => "fragmentation",
            FindingId::CacheHeld => "cache_held",
            FindingId::OutOfMemory => "out_of_memory",
            FindingId::LoadShed => "load_shed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

/// One diagnosed cause.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Finding {
    pub id: FindingId,
    /// One line: `"Autograd was on during inference"`.
    pub title: String,
    pub severity: Severity,
    /// What was measured, in words with the numbers in them.
    pub evidence: String,
    /// The numbers behind the evidence, by name (bytes, ratios, slopes in bytes/s).
    pub numbers: BTreeMap<String, f64>,
    /// What to change, as code a PyTorch user would write.
    pub fix: String,
    /// Bytes of peak the fix is predicted to save (0 when it does not lower the peak).
    pub predicted_saving_bytes: u64,
}

/// The run's own allocation trace replayed under one allocator config.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WhatIfRow {
    /// `PYTORCH_CUDA_ALLOC_CONF` string; `""` is the default config.
    pub alloc_conf: String,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// `peak_reserved / peak_allocated`.
    pub reserved_over_allocated: f64,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    /// The replay never OOMed under `capacity_bytes`.
    pub fits_capacity: bool,
    /// `run peak reserved − this peak reserved` (negative: this config needs more).
    pub saving_vs_run_bytes: i64,
}

/// The what-if's row for the run's own config and capacity against the run itself: the
/// replay is evidence only when they agree.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WhatIfCheck {
    /// What was replayed: `"run log"` (every allocator request of the run, from an empty
    /// allocator), `"history ring"` (the snapshot's last events, from the state rebuilt at
    /// their start), `"service snapshot"` (`vramroom http`: the probe's snapshot, checked
    /// against the service's `memory_stats()`), or `""` (no what-if).
    pub source: String,
    /// Allocator requests (allocs, frees, OOMs) replayed.
    pub events: u64,
    /// The own-config row has the run's peak reserved and OOM count.
    pub agrees: bool,
    pub run_peak_reserved_bytes: u64,
    /// The allocator's `num_ooms` at the end of the run.
    pub run_ooms: i64,
    pub row_peak_reserved_bytes: u64,
    pub row_ooms: i64,
    /// How and why they disagree (empty when they agree).
    pub note: String,
}

impl WhatIfCheck {
    /// One sentence under the what-if table, the same in the terminal and the report:
    /// what was replayed and whether the own-config row is the run. Empty without a
    /// what-if.
    pub fn summary(&self) -> String {
        let what = match self.source.as_str() {
            "" => return String::new(),
            "run log" => format!(
                "replayed from the run log ({} allocator requests, from the empty allocator)",
                self.events
            ),
            "history ring" => format!(
                "replayed from the snapshot's history ring ({} events)",
                self.events
            ),
            "service snapshot" => format!(
                "replayed from the service's snapshot ({} events, from the state rebuilt at \
                 its start)",
                self.events
            ),
            other => format!("replayed from {other} ({} events)", self.events),
        };
        let whose = if self.source == "service snapshot" {
            "the service's own figures (max_memory_reserved, num_ooms)"
        } else {
            "the run"
        };
        if self.agrees {
            format!(
                "{what}; the row for the run's own config agrees with {whose}: {} peak \
                 reserved, {} OOMs",
                vramroom_alloc::human_bytes(self.run_peak_reserved_bytes),
                self.run_ooms
            )
        } else {
            format!("{what}; it DISAGREES with the run: {}", self.note)
        }
    }
}

/// One `--threshold` and how the run did against it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThresholdResult {
    /// The expression as given: `"peak_reserved<6GiB"`.
    pub expr: String,
    /// The metric name: `peak_reserved`, `peak_allocated`, `p50`, `p90`, `p99`, `p99.9`,
    /// `oom_count`, `error_rate`, `rps`, ...
    pub metric: String,
    /// `"<"`, `"<="`, `">"`, `">="`, `"=="`.
    pub op: String,
    /// The limit in the metric's base unit (bytes, milliseconds, count, ratio, 1/s).
    pub limit: f64,
    /// The measured value in the same unit; `null` when the run has no such value.
    pub actual: Option<f64>,
    /// `"bytes"`, `"ms"`, `"count"`, `"ratio"`, `"1/s"`.
    pub unit: String,
    pub passed: bool,
}

/// Live progress, passed to the caller's callback several times a second.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Progress {
    /// `"setup"`, `"load"`, `"search"`, `"diagnose"`, `"done"`.
    pub phase: String,
    pub elapsed_s: f64,
    /// Planned total seconds of the load phase (`null` for `-n` runs).
    pub planned_s: Option<f64>,
    pub stage: usize,
    pub stages: usize,
    pub concurrency: usize,
    pub requests_done: u64,
    /// `-n`: the target count.
    pub requests_planned: Option<u64>,
    pub ooms: u64,
    pub errors: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub capacity_bytes: u64,
    /// `vramroom http`: 503 answers so far (load shedding).
    #[serde(default)]
    pub shed: u64,
    /// `vramroom http`, open model: the stage's target rate (1/s).
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// `vramroom http`: requests in flight now.
    #[serde(default)]
    pub in_flight: usize,
}

/// A memory source of the run (NVML, a Prometheus endpoint, the probe) and how it did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySourceInfo {
    /// `"nvml:0"`, `"prometheus http://127.0.0.1:9400/metrics"`.
    pub name: String,
    /// `"nvml"`, `"prometheus"`, `"probe"` (a Prometheus endpoint that is a
    /// `vramroom_probe.py`), `"fake"`.
    pub kind: String,
    /// `"ok"` (sampled), `"absent"` (not there, e.g. NVML without a GPU: the run went on
    /// without it), `"failing"` (there, but no sample succeeded).
    pub status: String,
    /// Why absent or failing; empty when ok.
    pub note: String,
    /// Successful samples.
    pub samples: u64,
    /// Failed samples (a scrape that timed out or did not parse).
    pub failures: u64,
    /// The series it gave: `"allocated"`, `"reserved"`, `"process_used"`, `"device_used"`,
    /// `"capacity"`, ...
    pub series: Vec<String>,
    /// For scraped endpoints: which metric filled which series, `"allocated ←
    /// vramroom_memory_allocated_bytes (vramroom serve)"`.
    pub mapped: Vec<String>,
}

/// The HTTP side of a `vramroom http` run. See the module docs for how the common fields
/// are filled.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HttpResult {
    pub url: String,
    pub method: String,
    /// `"closed"` (`-c` workers, each sends when its last answer is in) or `"open"` (`-q`:
    /// requests are sent on a schedule, whatever the answers do).
    pub model: String,
    /// Open model: `"constant"` or `"poisson"` inter-arrival times.
    pub arrival: Option<String>,
    /// Open model: the most connections (requests in flight) the client opens.
    pub max_connections: Option<usize>,
    /// Where request bodies came from, in words.
    pub body: String,
    pub timeout_ms: f64,
    /// How `latency` is corrected for coordinated omission: `"intended_send_time"` (open
    /// model: each request's latency runs from when the schedule meant to send it) or
    /// `"expected_interval"` (closed model: HdrHistogram's correction with each stage's
    /// median latency as the expected interval between a worker's requests).
    pub latency_correction: String,
    /// Answers by status code (`"200"`, `"503"`, ...).
    pub status_codes: BTreeMap<String, u64>,
    /// 503 answers: load the service shed. Not failures of the client, not in
    /// `requests.ok` nor `requests.other_errors`.
    pub shed: u64,
    /// Latency of the 503 answers (measured as `latency` is).
    pub shed_latency: LatencyStats,
    /// Latency of the ok answers as each request itself took (send to last byte), without
    /// the coordinated-omission correction.
    pub latency_uncorrected: LatencyStats,
    /// Open model: requests the schedule meant to send that were never sent: still waiting
    /// for a connection when the grace period ended (the client's connection limit was the
    /// bottleneck) or when Ctrl-C stopped the run, or beyond 100 000 pending at once.
    pub dropped: u64,
    /// Requests still in flight when the run ended and the grace period ran out.
    pub aborted: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub connections_opened: u64,
    /// Per stage, beside `stages`.
    pub stages: Vec<HttpStageResult>,
    /// Open model: one row per distinct rate, ascending (the open-model `by_concurrency`).
    pub by_rate: Vec<RateResult>,
    /// Answers by class over time.
    pub status_timeline: Vec<StatusBucket>,
    /// The timeline series the memory sources measured (`"allocated"`, `"reserved"`,
    /// `"device_used"`, `"process_used"`, `"overhead"`, ...); the others read 0.
    pub memory_series: Vec<String>,
    /// OOMs the service reported during the run (its metrics' OOM counter), when a source
    /// exports one.
    pub service_ooms: Option<u64>,
    /// The `vramroom_probe.py` endpoint, when the metrics URL is one.
    pub probe: Option<ProbeResult>,
    /// Why the run stopped early and what to change, in words (`stop_reason: refused`).
    #[serde(default)]
    pub stop_hint: Option<String>,
    /// Why the service shed load, by its own account: `vramroom serve`'s admission
    /// rejections during the run, by reason (`queue_delay`, `memory`, `queue_full`).
    #[serde(default)]
    pub shed_reasons: BTreeMap<String, u64>,
    /// Answers that carried a `Retry-After` (in seconds), and the longest it asked for.
    #[serde(default)]
    pub retry_after_answers: u64,
    #[serde(default)]
    pub retry_after_max_s: Option<u64>,
    /// `--predict`: the OOM concurrency predicted from this run's trace; with
    /// `--ramp-until-oom`, what the ramp observed against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<prediction::ServicePrediction>,
}

/// One stage of an HTTP run, beside its [`StageResult`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HttpStageResult {
    pub index: usize,
    /// Closed model: workers.
    pub concurrency: Option<usize>,
    /// Open model: the target rate.
    pub rate_per_s: Option<f64>,
    /// Most requests in flight during the stage.
    pub peak_in_flight: usize,
    pub shed: u64,
    pub status_codes: BTreeMap<String, u64>,
    pub latency_uncorrected: LatencyStats,
    pub shed_latency: LatencyStats,
    /// Closed model: the expected interval the correction used (the stage's median).
    pub correction_interval_ms: Option<f64>,
}

/// One open-model rate level, all stages at that rate merged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RateResult {
    pub rate_per_s: f64,
    pub requests: RequestSummary,
    pub shed: u64,
    pub latency: LatencyStats,
    pub throughput: Throughput,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
}

/// Answers by class in one time bucket (by completion time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusBucket {
    /// Start of the bucket, seconds since the run started.
    pub t_s: f64,
    pub width_s: f64,
    /// 1xx–3xx.
    pub ok: u64,
    /// 503.
    pub shed: u64,
    /// 4xx.
    pub client_error: u64,
    /// 5xx other than 503.
    pub server_error: u64,
    /// No answer: connect errors, timeouts, closed connections.
    pub transport_error: u64,
    /// Mean latency of the ok answers in the bucket (as `latency` measures it).
    pub mean_latency_ms: Option<f64>,
}

/// What `vramroom http` got from a `vramroom_probe.py` endpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProbeResult {
    /// The probe's base URL.
    pub url: String,
    /// `GET /snapshot` at the end of the run worked and vramroom-trace read it.
    pub snapshot_fetched: bool,
    pub snapshot_segments: usize,
    /// Entries of the snapshot's device trace (0 when the service records no history).
    pub trace_entries: usize,
    /// OOMs the probe's OOM observer counted (over the service's life).
    pub ooms: u64,
    /// The OOM snapshot (`GET /oom_snapshot`) was fetched and read.
    pub oom_snapshot_fetched: bool,
    /// The service's allocator config, from the snapshot's `allocator_settings`.
    pub alloc_conf: String,
    /// Anything that did not work, in words.
    pub notes: Vec<String>,
}

/// `vramroom claims`: the five claims of ground-truth.md re-run on Vramroom's runtime.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClaimsResult {
    pub schema_version: u32,
    pub claims: Vec<ClaimVerdict>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClaimVerdict {
    /// `"no_grad_saving"`, `"accumulation"`, `"chained_calls"`, `"empty_cache"`,
    /// `"resnet50_activations"`.
    pub id: String,
    /// The claim as users repeat it.
    pub claim: String,
    /// Vramroom's verdict in one sentence.
    pub verdict: String,
    /// Whether the claim holds on Vramroom's runtime (`false` = myth).
    pub holds: bool,
    /// Whether Vramroom's figures agree with PyTorch's measured ones within `tolerance`.
    pub matches_pytorch: bool,
    /// The figures, Vramroom's beside PyTorch's.
    pub numbers: Vec<ClaimNumber>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClaimNumber {
    /// What was measured: `"bs8 grad on, above input"`.
    pub label: String,
    /// `"MiB"`, `"x"`, `"%"`.
    pub unit: String,
    pub vramroom: f64,
    /// PyTorch 2.11 on H200 (ground-truth.md); `null` where the spec has no figure.
    pub pytorch: Option<f64>,
    /// Relative tolerance used for `matches_pytorch`.
    pub tolerance: f64,
}

impl ClaimNumber {
    /// Whether Vramroom's figure is within the tolerance of PyTorch's (relative, or
    /// absolute around a PyTorch figure of 0); `None` where PyTorch has no figure. The one
    /// test of a row, for the row's "match" column and the claim's `matches_pytorch` alike.
    pub fn matches(&self) -> Option<bool> {
        let p = self.pytorch?;
        Some(if p != 0.0 {
            ((self.vramroom - p) / p).abs() <= self.tolerance
        } else {
            self.vramroom.abs() <= self.tolerance
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_serialize_snake_case() {
        assert_eq!(
            serde_json::to_string(&FindingId::AutogradInInference).unwrap(),
            "\"autograd_in_inference\""
        );
        assert_eq!(
            serde_json::to_string(&StopReason::OomFound).unwrap(),
            "\"oom_found\""
        );
        assert_eq!(
            serde_json::to_string(&SampleKind::Periodic).unwrap(),
            "\"periodic\""
        );
    }

    #[test]
    fn category_entries_sum() {
        let c = CategoryBytes {
            parameter: 1,
            activation: 2,
            input: 3,
            ..Default::default()
        };
        assert_eq!(c.total(), 6);
        assert_eq!(c.entries().iter().map(|e| e.1).sum::<u64>(), 6);
    }
}
