//! The load's configuration: what `vramroom loadtest` asks for (the workload, the device,
//! the stages or ramp, the search, the what-if configs, thresholds), and its validation.
//!
//! Design note: the first step of the one-way flow config → engine → OOM search →
//! diagnosis → results → report. Everything a user can get wrong is checked here, in
//! [`LoadConfig::validate`], before any work starts; later steps trust it.

use std::sync::Arc;
use std::time::Duration;

use vramroom_alloc::AllocatorConfig;

use crate::error::{LoadError, Result};
use crate::results::*;
use crate::threshold::Threshold;
use vramroom_workload::device::{DeviceChoice, MAX_WORKERS};
pub use vramroom_workload::stages::Stage;
use vramroom_workload::stages::{StageLoad, MAX_STAGES};
use vramroom_workload::Scenario;

/// How the concurrency rises in `--ramp-until-oom`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RampStep {
    Add(usize),
    Mul(usize),
}

/// How the load is driven.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadPlan {
    /// k6-style stages (`--stages`), or one stage for `-c N -d T`.
    Stages(Vec<Stage>),
    /// `-n`: exactly `total` requests with `concurrency` workers.
    Requests { concurrency: usize, total: u64 },
    /// `--ramp-until-oom`: stages of rising concurrency until the first OOM, bounded by
    /// `max_concurrency` and `time_limit`.
    RampUntilOom {
        start: usize,
        step: RampStep,
        /// Each ramp stage's length (its `target` is ignored).
        stage: Stage,
        max_concurrency: usize,
        time_limit: Duration,
    },
}

/// Everything a run needs. `LoadConfig::default()` is the default `vramroom loadtest`.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub scenario: Scenario,
    pub device: DeviceChoice,
    /// Device capacity in bytes (simulated on cpu and meta).
    pub capacity: u64,
    /// `PYTORCH_CUDA_ALLOC_CONF` syntax; `""` is the default config.
    pub alloc_conf: String,
    pub plan: LoadPlan,
    /// Period of the memory sampler.
    pub sample_period: Duration,
    /// The OOM search (on meta) after the load; `None` skips it.
    pub search: Option<SearchConfig>,
    /// Run the diagnosis (findings) after the load.
    pub diagnose: bool,
    /// Allocator configs to replay the run's trace under (the what-if table). The run's
    /// own config is always replayed first.
    pub what_if: Vec<String>,
    pub thresholds: Vec<Threshold>,
    /// Entries of allocator history kept for the snapshot (ring buffer).
    pub history_entries: usize,
    /// Allocator requests the what-if's run log keeps (16 bytes each): the what-if replays
    /// the whole run from it. A longer run falls back to the history ring, with a note.
    pub what_if_log_entries: usize,
    /// Memory seen from outside the allocator (NVML on a CUDA device), sampled with every
    /// periodic timeline sample: the process's bytes on the device and the context +
    /// library overhead beside the allocator's numbers. `None`: the allocator's view only.
    pub memory_source: Option<Arc<dyn crate::memsource::MemorySource>>,
}

pub use vramroom_workload::device::DEFAULT_CAPACITY;

/// The run log's default bound: 8M requests, 128 MiB, about a minute of the busiest meta
/// run (zoo-gpt-small at 32 workers makes some 135,000 requests a second).
pub const DEFAULT_WHAT_IF_LOG_ENTRIES: usize = 8_000_000;

/// The default what-if configs.
pub const DEFAULT_WHAT_IF: [&str; 3] = [
    "expandable_segments:True",
    "max_split_size_mb:128",
    "garbage_collection_threshold:0.6",
];

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            scenario: Scenario::default(),
            device: DeviceChoice::Cpu,
            capacity: DEFAULT_CAPACITY,
            alloc_conf: String::new(),
            // 8 s of load: with the what-if replay and the OOM search after it, the default
            // run of every zoo model ends within 15 s on two cores (it was 25 s of load and
            // 26–35 s in all). The longest stage is still 3 s of 20 ms samples, enough
            // floors for the leak rule's fit.
            plan: LoadPlan::Stages(vec![
                Stage::timed(1, Duration::from_secs(2)),
                Stage::timed(4, Duration::from_secs(3)),
                Stage::timed(8, Duration::from_secs(3)),
            ]),
            sample_period: Duration::from_millis(20),
            search: Some(SearchConfig::default()),
            diagnose: true,
            what_if: DEFAULT_WHAT_IF.iter().map(|s| s.to_string()).collect(),
            thresholds: Vec::new(),
            history_entries: 400_000,
            what_if_log_entries: DEFAULT_WHAT_IF_LOG_ENTRIES,
            memory_source: None,
        }
    }
}

/// Parses the loadtest's k6-style stages `workers:duration,...`, e.g. `1:10s,4:20s,16:20s`
/// (vramroom-workload's parser; a rate is `vramroom http`'s open model, refused here).
pub fn parse_stages(s: &str) -> Result<Vec<Stage>> {
    vramroom_workload::parse_stages(s, MAX_WORKERS)?
        .into_iter()
        .enumerate()
        .map(|(i, st)| match st.target {
            StageLoad::Workers(_) => Ok(st),
            StageLoad::Rate(_) => Err(LoadError::Stages {
                input: s.to_string(),
                msg: format!(
                    "stage {}: a rate is the open model of vramroom http; loadtest stages are worker counts",
                    i + 1
                ),
            }),
        })
        .collect()
}

impl LoadConfig {
    /// Checks everything a user can get wrong, before any work starts.
    pub fn validate(&self) -> Result<AllocatorConfig> {
        if self.capacity == 0 {
            return Err(LoadError::Config(
                "capacity must be more than 0 bytes".into(),
            ));
        }
        self.scenario.validate()?;
        let conf = AllocatorConfig::parse(&self.alloc_conf)
            .map_err(|e| LoadError::AllocConf(e.to_string()))?;
        for w in &self.what_if {
            AllocatorConfig::parse(w).map_err(|e| LoadError::AllocConf(format!("{w:?}: {e}")))?;
        }
        if self.sample_period < Duration::from_millis(1) {
            return Err(LoadError::Config(
                "sample period must be at least 1ms".into(),
            ));
        }
        let check_stage = |s: &Stage| -> Result<()> {
            if s.duration.is_none() && s.requests_per_worker.is_none() {
                return Err(LoadError::Config(
                    "a stage needs a duration or a request count".into(),
                ));
            }
            if s.requests_per_worker == Some(0) {
                return Err(LoadError::Config(
                    "requests per worker must be at least 1".into(),
                ));
            }
            Ok(())
        };
        let check_workers = |what: &str, n: usize| -> Result<()> {
            if n > MAX_WORKERS {
                return Err(LoadError::Config(format!(
                    "{what} {n}: at most {MAX_WORKERS} workers are allowed"
                )));
            }
            Ok(())
        };
        match &self.plan {
            LoadPlan::Stages(v) => {
                if v.is_empty() {
                    return Err(LoadError::Config("at least one stage is needed".into()));
                }
                if v.len() > MAX_STAGES {
                    return Err(LoadError::Config(format!(
                        "{} stages: at most {MAX_STAGES} are allowed",
                        v.len()
                    )));
                }
                for s in v {
                    if s.workers() == 0 {
                        return Err(LoadError::Config("concurrency must be at least 1".into()));
                    }
                    check_workers("concurrency", s.workers())?;
                    check_stage(s)?;
                }
            }
            LoadPlan::Requests { concurrency, total } => {
                if *concurrency == 0 || *total == 0 {
                    return Err(LoadError::Config(
                        "concurrency and request count must be at least 1".into(),
                    ));
                }
                check_workers("concurrency", *concurrency)?;
            }
            LoadPlan::RampUntilOom {
                start,
                step,
                stage,
                max_concurrency,
                ..
            } => {
                if *start == 0 || *max_concurrency < *start {
                    return Err(LoadError::Config(
                        "ramp start must be at least 1 and at most the maximum".into(),
                    ));
                }
                check_workers("ramp maximum", *max_concurrency)?;
                match step {
                    RampStep::Add(0) | RampStep::Mul(0) | RampStep::Mul(1) => {
                        return Err(LoadError::Config(
                            "the ramp step must raise the load".into(),
                        ))
                    }
                    _ => {}
                }
                check_stage(stage)?;
            }
        }
        Ok(conf)
    }

    pub(crate) fn load_info(&self) -> LoadInfo {
        let si = |s: &Stage| StageSpecInfo {
            concurrency: s.workers(),
            duration_s: s.duration.map(|d| d.as_secs_f64()),
        };
        let (mode, stages, max_requests, time_limit_s) = match &self.plan {
            LoadPlan::Stages(v) if v.len() == 1 => {
                ("fixed", v.iter().map(si).collect(), None, None)
            }
            LoadPlan::Stages(v) => ("stages", v.iter().map(si).collect(), None, None),
            LoadPlan::Requests { concurrency, total } => (
                "requests",
                vec![StageSpecInfo {
                    concurrency: *concurrency,
                    duration_s: None,
                }],
                Some(*total),
                None,
            ),
            LoadPlan::RampUntilOom { time_limit, .. } => (
                "ramp_until_oom",
                Vec::new(),
                None,
                Some(time_limit.as_secs_f64()),
            ),
        };
        LoadInfo {
            mode: mode.into(),
            stages,
            max_requests,
            time_limit_s,
            sample_period_ms: self.sample_period.as_secs_f64() * 1e3,
        }
    }
}

/// How the OOM search (`search.rs`) probes: part of what was asked, so it lives here and
/// the search reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchAxis {
    Concurrency,
    /// Batch size at `SearchConfig::concurrency` workers.
    Batch,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SearchConfig {
    pub axis: SearchAxis,
    /// Fraction of the capacity kept free against fragmentation and non-allocator memory.
    pub margin_fraction: f64,
    /// Loads probed for the fit.
    pub fit_points: Vec<usize>,
    /// Requests each worker makes in one probe.
    pub requests_per_worker: u64,
    /// Workers, for the batch axis.
    pub concurrency: usize,
    /// Highest load the search considers.
    pub max_load: usize,
    /// Wall-clock bound of the whole search; it returns what it has when reached.
    pub time_limit: Duration,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            axis: SearchAxis::Concurrency,
            margin_fraction: 0.1,
            fit_points: vec![1, 2, 3, 4],
            requests_per_worker: 4,
            concurrency: 1,
            max_load: 256,
            time_limit: Duration::from_secs(20),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_parse() {
        let s = parse_stages("1:10s,4:20s, 16:1m30s").unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0], Stage::timed(1, Duration::from_secs(10)));
        assert_eq!(s[2].duration, Some(Duration::from_secs(90)));
        assert_eq!(
            parse_stages("2:500ms").unwrap()[0].duration,
            Some(Duration::from_millis(500))
        );
        for bad in [
            "", "1", "0:10s", "x:10s", "1:10", "1:-3s", "1:10q", "1:10s,",
        ] {
            let r = parse_stages(bad);
            if bad == "1:10" {
                // a bare number is seconds
                assert!(r.is_ok());
                continue;
            }
            let e = r.expect_err(bad).to_string();
            assert!(e.contains("invalid stages"), "{bad}: {e}");
        }
    }

    #[test]
    fn config_validation() {
        let mut c = LoadConfig {
            capacity: 0,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("capacity"));
        c.capacity = 1 << 30;
        c.alloc_conf = "bogus_option:3".into();
        assert!(c.validate().is_err());
        c.alloc_conf = String::new();
        assert!(c.validate().is_ok());
        // cuda parses where there is a GPU and says why not elsewhere.
        match vramroom_cuda::unavailable_reason() {
            Some(_) => assert!(matches!(
                "cuda".parse::<DeviceChoice>(),
                Err(vramroom_workload::WorkloadError::DeviceUnavailable(..))
            )),
            None => assert!("cuda:0".parse::<DeviceChoice>().is_ok()),
        }
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
        assert!("tpu".parse::<DeviceChoice>().is_err());
    }
}
