//! # headroom-load
//!
//! The load tester's engine: run a model workload under load in-process (N worker threads
//! sharing one device and its caching allocator, as PyTorch threads share one process),
//! watch memory the way the allocator sees it, find the OOM point, and name the waste.
//!
//! [`results`] holds the run's result types and the documented JSON schema.

pub mod results;

pub use results::*;
pub mod report;
