//! The thresholds every rule of the diagnosis reads, and the helpers they share (the
//! severity by cost, MiB wording, evidence numbers): one place below the rules, so no rule
//! reaches back into `diagnose/mod.rs`.

use std::collections::BTreeMap;

use crate::results::Severity;

const MIB: f64 = 1048576.0;

pub(super) fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / MIB)
}

/// Thresholds of the rules, in one place.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// A byte figure matters when it is at least this share of the capacity...
    pub capacity_share: f64,
    /// ...and at least this many bytes.
    pub min_bytes: u64,
    /// Fragmentation: peak reserved / peak allocated at least this.
    pub frag_ratio: f64,
    /// Graph accumulated: activation bytes at the peak of the run's pattern over those of
    /// backward-every-micro-step at least this.
    pub accum_ratio: f64,
    /// Severity by measured cost: a cause that takes at least this share of the run's peak
    /// above the baseline is critical...
    pub critical_share: f64,
    /// ...and at least this share a warning; less is info.
    pub warning_share: f64,
    /// Fragmentation is blamed for OOMs only when a replayed config avoids at least this
    /// share of them (and at least one).
    pub avoidable_oom_share: f64,
    /// Cache held: the last stage's peak allocated at most this share of the run's peak.
    pub load_drop: f64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules {
            capacity_share: 0.05,
            min_bytes: 4 << 20,
            frag_ratio: 1.5,
            accum_ratio: 1.5,
            critical_share: 0.25,
            warning_share: 0.05,
            avoidable_oom_share: 0.1,
            load_drop: 0.6,
        }
    }
}

impl Rules {
    /// The smallest byte figure that matters on a device of `capacity` bytes.
    pub fn floor(&self, capacity: u64) -> u64 {
        ((capacity as f64 * self.capacity_share) as u64).max(self.min_bytes)
    }
}

/// The severity of a cause from what it costs: its share of the run's peak above the
/// baseline. Whether the run happened to OOM does not make a cheap cause critical.
pub(super) fn by_cost(share: f64, rules: &Rules) -> Severity {
    if share >= rules.critical_share {
        Severity::Critical
    } else if share >= rules.warning_share {
        Severity::Warning
    } else {
        Severity::Info
    }
}

pub(super) fn nums(v: &[(&str, f64)]) -> BTreeMap<String, f64> {
    v.iter().map(|(k, x)| (k.to_string(), *x)).collect()
}
