//! Load models of `vramroom http`: closed (`-c` workers) and open (`-q` rate), in stages.
//!
//! Design note: the two models answer different questions and measure latency differently.
//!
//! - **Closed** (`-c N`, wrk/oha's default): N workers, each sends its next request when
//!   its last answer is in. The load adapts to the service: a slow service gets fewer
//!   requests, so a stall hides the requests that would have been sent during it
//!   (coordinated omission). Vramroom corrects for it after the run as HdrHistogram's
//!   `recordValueWithExpectedInterval` does, with each stage's median latency as the
//!   interval a worker would have kept: an answer that took k intervals also counts the
//!   k−1 requests the worker would have sent meanwhile, at their would-be latencies.
//! - **Open** (`-q RATE`, wrk2/k6's arrival rate, Triton perf_analyzer's request rate):
//!   requests are sent on a schedule — evenly spaced (`constant`) or with exponential gaps
//!   (`poisson`, a Poisson process) — whatever the service does. Each request's latency
//!   runs from the moment the schedule meant to send it, so a stall is measured for every
//!   request it delays, including the ones still waiting for a connection. Requests in
//!   flight are bounded by the connection limit (`-c` in this model, default
//!   [`DEFAULT_MAX_CONNECTIONS`]); a request that never got one before the end, or that
//!   found 100 000 others already waiting, is "dropped" (counted, not sent).
//!
//! Stages are k6-style and constant within a stage: `--stages 4:10s,16:20s` is 4 then 16
//! workers; `--stages 100/s:10s,400/s:20s` is 100 then 400 requests per second. Stage
//! boundaries are fixed times from the start of the run, so the open schedule of each stage
//! starts exactly at its boundary.

use crate::error::{LoadError, Result};
use crate::http::body::Rng;
use vramroom_workload::stages::parse_stages;
pub use vramroom_workload::stages::{Stage, StageLoad};

/// Connections the open model may open when `-c` does not say.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Most workers or connections.
pub const MAX_CONCURRENCY: usize = 16_384;

/// Inter-arrival times of the open model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    Constant,
    Poisson,
}

impl std::str::FromStr for Arrival {
    type Err = LoadError;
    fn from_str(s: &str) -> Result<Arrival> {
        match s.trim().to_ascii_lowercase().as_str() {
            "constant" | "uniform" | "fixed" => Ok(Arrival::Constant),
            "poisson" | "exponential" => Ok(Arrival::Poisson),
            o => Err(LoadError::Config(format!(
                "unknown --arrival {o:?} (expected constant or poisson)"
            ))),
        }
    }
}

impl Arrival {
    pub fn as_str(self) -> &'static str {
        match self {
            Arrival::Constant => "constant",
            Arrival::Poisson => "poisson",
        }
    }
}

pub use vramroom_workload::stages::{parse_rate, MAX_RATE};

/// k6-style stages: `4:10s,16:20s` (workers) or `100/s:10s,400/s:20s` (rates), on
/// vramroom-workload's parser (one syntax and one set of messages for every command).
pub fn parse_http_stages(s: &str) -> Result<Vec<Stage>> {
    Ok(parse_stages(s, MAX_CONCURRENCY)?)
}

/// The open model's schedule: gaps between intended send times.
#[derive(Debug, Clone)]
pub struct Schedule {
    arrival: Arrival,
    rng: Rng,
}

impl Schedule {
    pub fn new(arrival: Arrival, seed: u64) -> Schedule {
        Schedule {
            arrival,
            rng: Rng::new(seed ^ 0x005E_ED0F_A77E),
        }
    }
    /// Seconds to the next request at `rate` per second.
    pub fn gap(&mut self, rate: f64) -> f64 {
        match self.arrival {
            Arrival::Constant => 1.0 / rate,
            // Inverse-CDF of the exponential; 1 − u is in (0, 1].
            Arrival::Poisson => -(1.0 - self.rng.unit()).ln() / rate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stages_of_both_models() {
        let s = parse_http_stages("4:10s, 16:500ms").unwrap();
        assert_eq!(s[0].target, StageLoad::Workers(4));
        assert_eq!(s[1].duration, Some(Duration::from_millis(500)));
        let s = parse_http_stages("100/s:2s,6000/m:1s,50rps:1s").unwrap();
        assert_eq!(s[0].target, StageLoad::Rate(100.0));
        assert_eq!(s[1].target, StageLoad::Rate(100.0));
        assert_eq!(s[2].target, StageLoad::Rate(50.0));
        for bad in [
            "",
            "4",
            "0:1s",
            "4:1s,100/s:1s",
            "x:1s",
            "0/s:1s",
            "4:soon",
            "4:1s,",
        ] {
            let e = parse_http_stages(bad).expect_err(bad).to_string();
            assert!(e.contains("invalid stages"), "{bad}: {e}");
        }
    }

    #[test]
    fn schedules_have_the_rate() {
        let mut c = Schedule::new(Arrival::Constant, 1);
        assert_eq!(c.gap(200.0), 0.005);
        let mut p = Schedule::new(Arrival::Poisson, 1);
        let n = 20_000;
        let gaps: Vec<f64> = (0..n).map(|_| p.gap(100.0)).collect();
        let mean = gaps.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.01).abs() < 0.0005, "mean gap {mean}");
        // Exponential: the standard deviation equals the mean.
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!((sd / mean - 1.0).abs() < 0.05, "sd/mean {}", sd / mean);
        assert!(gaps.iter().all(|g| *g >= 0.0 && g.is_finite()));
    }
}
