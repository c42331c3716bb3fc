//! The what-if table: the run's own allocator trace replayed under its config and others.
//!
//! Design note: the replay is headroom-trace's, on the allocator itself, so a row says what
//! PyTorch's allocator would have reserved under that config for exactly this sequence of
//! requests.

use headroom_alloc::AllocatorConfig;
use headroom_trace::{replay, ReplayOptions};
use tracing::warn;

use super::mib;
use crate::results::*;

/// `default: 812.0 MiB; expandable_segments:True: 640.0 MiB`: each replayed config's peak
/// reserved, for a finding's evidence.
pub fn what_if_table(rows: &[WhatIfRow]) -> String {
    rows.iter()
        .map(|w| {
            let conf = if w.alloc_conf.is_empty() {
                "default"
            } else {
                &w.alloc_conf
            };
            format!("{conf}: {}", mib(w.peak_reserved_bytes as f64))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Replays the run's own snapshot under its config and each of `configs`.
pub fn what_if(r: &RunResult, own_conf: &str, configs: &[String]) -> Vec<WhatIfRow> {
    let Some(snap) = r.snapshot.as_ref() else {
        return Vec::new();
    };
    what_if_snapshot(snap, r.capacity_bytes, own_conf, configs)
}

/// Replays `snap`'s first device trace under `own_conf` and each of `configs`, on a device
/// of `capacity` bytes (`headroom http` replays the snapshot a probe served).
pub fn what_if_snapshot(
    snap: &headroom_alloc::Snapshot,
    capacity: u64,
    own_conf: &str,
    configs: &[String],
) -> Vec<WhatIfRow> {
    if snap.device_traces.iter().all(|t| t.is_empty()) {
        return Vec::new();
    }
    let mut confs: Vec<String> = vec![own_conf.to_string()];
    for c in configs {
        if !confs.contains(c) {
            confs.push(c.clone());
        }
    }
    let mut rows = Vec::new();
    for c in confs {
        let Ok(config) = AllocatorConfig::parse(&c) else {
            warn!(conf = %c, "what-if: config does not parse");
            continue;
        };
        let opts = ReplayOptions {
            config,
            capacity: Some(capacity),
            stop_at_oom: false,
            record_history: false,
            ..ReplayOptions::default()
        };
        match replay(snap, &opts) {
            Ok(rr) => rows.push(WhatIfRow {
                alloc_conf: c,
                peak_allocated_bytes: rr.peak_allocated_bytes,
                peak_reserved_bytes: rr.peak_reserved_bytes,
                reserved_over_allocated: if rr.peak_allocated_bytes > 0 {
                    rr.peak_reserved_bytes as f64 / rr.peak_allocated_bytes as f64
                } else {
                    0.0
                },
                num_alloc_retries: rr.num_alloc_retries,
                num_ooms: rr.num_ooms,
                // An allocation of 1 EB or more fails without counting an OOM (as in
                // PyTorch): any failed allocation means the config does not fit.
                fits_capacity: rr.num_ooms == 0 && rr.oom_event.is_none(),
                saving_vs_run_bytes: 0,
            }),
            Err(e) => warn!(conf = %c, error = %e, "what-if replay failed"),
        }
    }
    if let Some(base) = rows.first().map(|r| r.peak_reserved_bytes as i64) {
        for row in &mut rows {
            row.saving_vs_run_bytes = base - row.peak_reserved_bytes as i64;
        }
    }
    rows
}
