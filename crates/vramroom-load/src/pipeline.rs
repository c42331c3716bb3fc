//! The pipeline of a load test, for any [`Driver`]: prepare → drive → fold → search →
//! diagnose → thresholds → results.
//!
//! Design note: [`run_driver`] is the one place that orders the steps, for `vramroom
//! loadtest` (the in-process engine, [`crate::inprocess`]) and `vramroom http` (the HTTP
//! client, [`crate::http::run`]) alike, and each step only looks down the flow: the driver
//! makes load and measures it, the measurements are folded into the result once
//! ([`crate::aggregate::fold`]), the search and replays read the driver's own evidence, the
//! diagnosis ([`crate::diagnose`]) reads the finished result, the thresholds read the
//! result with its findings, and the report ([`crate::report`]) is a pure function of it.
//! No step calls back into the one that called it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::config::LoadConfig;
use crate::driver::{Diagnosis, Driver};
use crate::error::Result;
use crate::inprocess::InProcess;
use crate::results::*;
use crate::threshold::evaluate_thresholds;

/// Runs a load test. This is the entry point of `vramroom loadtest`.
///
/// `stop` is polled throughout; setting it (Ctrl-C) ends the load early and the result of
/// what was measured is still returned (`stop_reason: cancelled`; the search and what-if
/// are skipped, the diagnosis runs on what there is). `progress` is called on the calling
/// thread several times a second.
///
/// Errors are only for bad configuration or a setup that cannot run (the model alone does
/// not fit); failures of requests are counted in the result.
pub fn run(
    cfg: &LoadConfig,
    stop: Arc<AtomicBool>,
    progress: impl FnMut(&Progress),
) -> Result<RunResult> {
    run_driver(&mut InProcess::new(cfg), stop, progress)
}

/// Runs any driver through the steps; see the module note.
pub fn run_driver(
    driver: &mut dyn Driver,
    stop: Arc<AtomicBool>,
    mut progress: impl FnMut(&Progress),
) -> Result<RunResult> {
    driver.prepare(&mut progress)?;
    let measured = driver.drive(&stop, &mut progress)?;
    let mut result = crate::aggregate::fold(measured);
    result.memory_sources = driver.memory_sources();
    let evidence = driver.evidence();
    result.snapshot = evidence.snapshot;
    result.oom_snapshot = evidence.oom_snapshot;
    driver.search(&mut result, evidence.run_log.as_ref(), &stop, &mut progress);
    drop(evidence.run_log);
    result.findings = diagnose(&result, driver.diagnosis(&mut progress), &stop);
    result.thresholds = evaluate_thresholds(driver.thresholds(), &result);
    driver.done(&mut progress);
    Ok(result)
}

/// The one call into the diagnosis.
fn diagnose(r: &RunResult, diagnosis: Diagnosis<'_>, stop: &AtomicBool) -> Vec<Finding> {
    match diagnosis {
        Diagnosis::Workload { scenario, conf } => {
            crate::diagnose::diagnose(r, scenario, conf, stop)
        }
        Diagnosis::Service => crate::diagnose::diagnose_service(r),
        Diagnosis::None => Vec::new(),
    }
}
