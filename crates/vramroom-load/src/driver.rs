//! The one interface both load testers implement: what a run needs from whatever makes
//! the load.
//!
//! Design note: `vramroom loadtest` (the in-process engine on the caching allocator) and
//! `vramroom http` (a client against a service) used to be two pipelines that redid every
//! step. What really differs between them is how load is made and where the evidence
//! comes from, so that is all a [`Driver`] says:
//! - [`Driver::prepare`]: everything that can be wrong with the user's input, checked
//!   before the clock starts (the CLI exits 2 with nothing written);
//! - [`Driver::drive`]: the stages, one measurement per stage ([`Measured`]); the pipeline
//!   folds them into the [`RunResult`] ([`crate::aggregate::fold`]), once for both;
//! - [`Driver::memory_sources`]: the memory sources the run read and how each fared;
//! - [`Driver::evidence`]: the run log and the snapshots, the driver's own (in-process) or
//!   the probe's (a service);
//! - [`Driver::search`]: the questions answered after the load from that evidence (the
//!   in-process what-if replay and OOM search; the HTTP probe's replays and prediction);
//! - [`Driver::diagnosis`]: what the diagnosis may re-run beyond the result.
//!
//! [`crate::pipeline::run_driver`] orders the steps once: prepare → drive → fold →
//! search → diagnose → thresholds. The fold, the diagnosis and the thresholds are called
//! only there. Progress phases stay the driver's: the HTTP progress line shows the load
//! alone, and the in-process one names each phase, as before.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramroom_alloc::{AllocatorConfig, Snapshot};
use vramroom_workload::Scenario;

pub use crate::aggregate::{Measured, StageMeasure};
use crate::diagnose::RunLog;
use crate::error::Result;
use crate::results::{MemorySourceInfo, Progress, RunResult};
use crate::threshold::Threshold;

/// What the run left to read after the load, handed over once by [`Driver::evidence`].
#[derive(Default)]
pub struct Evidence {
    /// The allocator's event log of the whole run, for the what-if replays (in-process
    /// runs: a service's history comes inside its snapshot).
    pub run_log: Option<RunLog>,
    /// The allocator's snapshot after the load: the run's own, or the service's from the
    /// probe.
    pub snapshot: Option<Snapshot>,
    /// The snapshot at the first OOM: the run's own, or the probe's `/oom_snapshot`.
    pub oom_snapshot: Option<Snapshot>,
}

/// What the diagnosis reads beside the result.
pub enum Diagnosis<'a> {
    /// An in-process workload: its scenario and the allocator config it ran under (the
    /// rules that re-run pieces of it need both).
    Workload {
        scenario: &'a Scenario,
        conf: &'a AllocatorConfig,
    },
    /// A service: the result alone (its memory timeline, the probe's snapshot).
    Service,
    /// No diagnosis was asked for.
    None,
}

/// A source of load; see the module note.
pub trait Driver {
    /// Checks everything before the clock starts. Errors are for input that cannot run.
    fn prepare(&mut self, progress: &mut dyn FnMut(&Progress)) -> Result<()>;

    /// Runs the stages until they end, `stop` is set, or the driver's own stop rule fires,
    /// and returns what was measured. Failed requests are counted, not errors.
    fn drive(
        &mut self,
        stop: &Arc<AtomicBool>,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<Measured>;

    /// The memory sources beside the allocator's own stats and how each fared (empty when
    /// there were none).
    fn memory_sources(&self) -> Vec<MemorySourceInfo>;

    /// The run log and snapshots, taken once after the load.
    fn evidence(&mut self) -> Evidence;

    /// Answers from the evidence after the load (replays, search, prediction).
    fn search(
        &mut self,
        result: &mut RunResult,
        run_log: Option<&RunLog>,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(&Progress),
    );

    /// What the diagnosis may read; reports the phase when the driver shows phases.
    fn diagnosis(&mut self, progress: &mut dyn FnMut(&Progress)) -> Diagnosis<'_>;

    /// The user's pass/fail rules.
    fn thresholds(&self) -> &[Threshold];

    /// The run is over (the in-process progress line says "done").
    fn done(&mut self, _progress: &mut dyn FnMut(&Progress)) {}
}
