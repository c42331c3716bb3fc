//! What `vramroom http --predict` predicted, as plain data in the run's JSON: per device, the
//! concurrency at which the service runs out under its own config and each what-if, the
//! input-size cap for a target concurrency, per-request memory against input size, and how
//! the prediction compares with a ramp. `http/predict.rs` computes it; this file only holds
//! it, so `results` depends on nothing above it.

use serde::{Deserialize, Serialize};

/// One device's capacity as the probe exports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceCapacity {
    pub device: usize,
    /// `get_per_process_memory_fraction` (1 when unset or not exported).
    pub fraction: f64,
    /// What the process may reserve: fraction × total.
    pub capacity_bytes: u64,
    pub total_bytes: u64,
}

/// One config's prediction on one device.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfigPrediction {
    /// `PYTORCH_CUDA_ALLOC_CONF` syntax; `""` is the default.
    pub alloc_conf: String,
    /// The first concurrency at which at least half the simulated runs ran out; `None`
    /// when none did up to `max_concurrency_tried`.
    pub first_oom_concurrency: Option<u32>,
    /// The highest concurrency tried that did not run out.
    pub safe_concurrency: u32,
    pub max_concurrency_tried: u32,
    /// (concurrency, peak reserved bytes, share of seeds that ran out) for each tried.
    pub points: Vec<(u32, u64, f64)>,
    /// One worker thread ran every request: only concurrency 1 was replayed (in-flight
    /// requests queue for that thread), and `max_concurrency_tried` is the model's answer
    /// for any load.
    #[serde(default)]
    pub one_worker: bool,
}

/// The cap on one request's input size that keeps `target` concurrent requests safe.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SizeCap {
    pub target_concurrency: u32,
    /// The largest recorded size that fits; `None` when even the smallest does not.
    pub max_size: Option<u64>,
    /// `tokens`, `items` or `bytes`, as the service tagged its requests.
    pub unit: Option<String>,
}

/// One request's own peak against its size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestPoint {
    pub id: String,
    pub size: Option<u64>,
    pub peak_bytes: u64,
}

/// Per-request memory against input size.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RequestAttribution {
    pub unit: Option<String>,
    pub requests: usize,
    /// Peak bytes per unit of input (least squares) and the fixed part.
    pub bytes_per_unit: Option<f64>,
    pub intercept_bytes: Option<f64>,
    /// Requests more than 50% above the fit: (id, size, peak bytes).
    pub outliers: Vec<(String, u64, u64)>,
    /// Up to 2000 requests, for the scatter plot.
    pub points: Vec<RequestPoint>,
}

/// The prediction for one device of the process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DevicePrediction {
    pub device: usize,
    pub capacity: DeviceCapacity,
    /// The limit the replays ran under (the fraction's bytes, or the card less overhead).
    pub limit_bytes: u64,
    /// Bytes the process held beyond PyTorch's reserved (NVML), taken off the card.
    pub overhead_bytes: u64,
    /// Requests the trace was cut into, and whether the probe tagged them.
    pub requests: usize,
    pub tagged: bool,
    /// The service's own config first, then the what-ifs.
    pub configs: Vec<ConfigPrediction>,
    pub size_cap: Option<SizeCap>,
    pub attribution: RequestAttribution,
}

/// `--predict`'s answer, and a ramp's comparison with it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServicePrediction {
    /// The gentle run's highest load (workers), which the prediction came from.
    pub gentle_concurrency: usize,
    pub devices: Vec<DevicePrediction>,
    /// The service's own config's first OOM concurrency, lowest over the devices.
    pub first_oom_concurrency: Option<u32>,
    /// `--ramp-until-oom`: what the ramp saw.
    pub observed: Option<Observed>,
    pub notes: Vec<String>,
}

/// What `--ramp-until-oom` observed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Observed {
    /// Concurrency of the stage where the first OOM was seen (`None`: none).
    pub first_oom_concurrency: Option<u32>,
    /// The stage before it (ran without OOM).
    pub last_ok_concurrency: Option<u32>,
    /// The ramp's steps.
    pub steps: Vec<u32>,
    /// The prediction compared with it (from `--predicted-from` or this run).
    pub predicted_first_oom: Option<u32>,
    pub error_pct: Option<f64>,
    pub steps_apart: Option<i64>,
    /// Within 15% or one ramp step.
    pub agrees: Option<bool>,
}

impl Observed {
    /// Fills the comparison fields from a predicted first-OOM concurrency.
    pub fn compare(&mut self, predicted: Option<u32>) {
        self.predicted_first_oom = predicted;
        let (Some(p), Some(o)) = (predicted, self.first_oom_concurrency) else {
            self.agrees = None;
            return;
        };
        let err = (f64::from(p) - f64::from(o)) / f64::from(o.max(1)) * 100.0;
        // The step a prediction lands in is the first ramp step at or above it.
        let step_of = |c: u32| -> i64 {
            self.steps
                .iter()
                .position(|&s| s >= c)
                .unwrap_or(self.steps.len()) as i64
        };
        let apart = step_of(p) - step_of(o);
        self.error_pct = Some(err);
        self.steps_apart = Some(apart);
        self.agrees = Some(err.abs() <= 15.0 || apart.abs() <= 1);
    }
}
