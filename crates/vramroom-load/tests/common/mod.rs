//! What the findings and calibration tests share: a fixed number of requests at a fixed
//! concurrency, and a run that is not cancelled.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramroom_load::{run, LoadConfig, LoadPlan, RunResult};

pub const MIB: u64 = 1 << 20;

/// `n` requests, `c` at a time.
pub fn requests(c: usize, n: u64) -> LoadPlan {
    LoadPlan::Requests {
        concurrency: c,
        total: n,
    }
}

/// The run to its end (nothing cancels it); panics on a run error.
pub fn run_it(c: &LoadConfig) -> RunResult {
    run(c, Arc::new(AtomicBool::new(false)), |_| {}).unwrap()
}
