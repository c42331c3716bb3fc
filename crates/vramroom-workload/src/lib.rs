//! # vramroom-workload
//!
//! One vocabulary for `vramroom predict`, `vramroom loadtest` and `vramroom serve`: what a
//! workload is, how a user names it, how it is built and run, and on which device.
//!
//! - [`spec`]: the workload spec ([`Scenario`]: model, batch, input-size distribution,
//!   inference or training with its optimizer and accumulation, dtype, planted mistakes)
//!   and the parsing of every name a user types for it.
//! - [`model`]: bring your own model: a Hugging Face `config.json` as a spec's model.
//! - [`flags`]: the one parser of the workload flags `predict`, `loadtest` and `serve` share.
//! - [`predict`]: a workload's peak memory on the meta device (`vramroom predict`).
//! - [`net`]: the network builder ([`Net`]) and its forward.
//! - [`step`]: one request of a workload run as a PyTorch loop runs it ([`Workload`]).
//! - [`device`]: the devices a run uses (cpu, meta, cuda), their capacity limits, the meta
//!   twin's virtual clock, and the allocator probe beside each ([`RunDevice`]).
//! - [`stages`]: the one parser of durations and k6-style stages.
//!
//! Data flows one way: this crate sits on vramroom-tensor and vramroom-alloc; the load
//! engine (vramroom-load) and the server (vramroom-serve) sit on it.

pub mod device;
pub mod error;
pub mod flags;
pub mod model;
pub mod net;
pub mod predict;
pub mod spec;
pub mod stages;
pub mod step;

pub use device::{
    make_device, AllocatorProbe, CudaProvider, DeviceChoice, DeviceProvider, Interleave, RunDevice,
    MAX_WORKERS,
};
pub use error::{Result, WorkloadError};
pub use flags::WorkloadFlags;
pub use model::HfModelSpec;
pub use net::Net;
pub use predict::{max_batch, predict, PredictDevice, Prediction};
pub use spec::{
    parse_dtype, AccumPattern, InputDist, Mistakes, Mode, ModelSpec, OptimKind, Scenario,
    ScenarioInfo, ZooModel, MODEL_NAMES,
};
pub use stages::{parse_duration, parse_rate, parse_stages, Stage, StageLoad, MAX_STAGES};
pub use step::{WorkerState, Workload};
