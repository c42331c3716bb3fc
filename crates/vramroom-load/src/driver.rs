//! The one interface both load testers implement: what a run needs from whatever makes
//! the load.
//!
//! Design note: `vramroom loadtest` (the in-process engine on the caching allocator) and
//! `vramroom http` (a client against a service) used to be two pipelines that redid every
//! step. What really differs between them is how load is made and where the evidence
//! comes from, so that is all a [`Driver`] says:
//! - [`Driver::prepare`]: everything that can be wrong with the user's input, checked
//!   before the clock starts (the CLI exits 2 with nothing written);
//! - [`Driver::drive`]: the stages, measured and aggregated into a [`RunResult`];
//! - [`Driver::search`]: the questions answered after the load from the driver's own
//!   evidence (the in-process what-if replay and OOM search; the HTTP probe's replays and
//!   prediction);
//! - [`Driver::evidence`]: what the diagnosis may read beyond the result.
//!
//! [`crate::pipeline::run_driver`] orders the steps once: prepare → drive → search →
//! diagnose → thresholds. The diagnosis and the thresholds are called only there. Progress
//! phases stay the driver's: the HTTP progress line shows the load alone, and the in-process
//! one names each phase, as before.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramroom_alloc::AllocatorConfig;
use vramroom_workload::Scenario;

use crate::error::Result;
use crate::results::{Progress, RunResult};
use crate::threshold::Threshold;

/// What the diagnosis reads beside the result.
pub enum Evidence<'a> {
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
    ) -> Result<RunResult>;

    /// Answers from the driver's evidence after the load (replays, search, prediction).
    fn search(
        &mut self,
        result: &mut RunResult,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(&Progress),
    );

    /// What the diagnosis may read; reports the phase when the driver shows phases.
    fn evidence(&mut self, progress: &mut dyn FnMut(&Progress)) -> Evidence<'_>;

    /// The user's pass/fail rules.
    fn thresholds(&self) -> &[Threshold];

    /// The run is over (the in-process progress line says "done").
    fn done(&mut self, _progress: &mut dyn FnMut(&Progress)) {}
}
