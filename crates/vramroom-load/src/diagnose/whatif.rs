//! The what-if table: the run's own allocator trace replayed under its config and others.
//!
//! Design note: a row says what PyTorch's allocator would have reserved under that config
//! for exactly this run's sequence of requests. A load test replays its run log (runlog.rs:
//! every request from the empty allocator on) on the allocator itself, so the row for the
//! run's own config and capacity re-makes the run, OOMs included; when the log overflowed,
//! or for an HTTP run (a service's snapshot), it is vramroom-trace's replay of the
//! snapshot's history ring, which starts from a rebuilt warm state. Either way [`check`]
//! compares the own-config row with the run and says how and why they disagree, so a row
//! is never silently shown as the run's.

use tracing::warn;
use vramroom_alloc::AllocatorConfig;
use vramroom_trace::{replay, ReplayOptions};

use super::rules::mib;
use super::runlog::RunLog;
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

/// The own config first, then each of `configs` once.
fn configs_of(own_conf: &str, configs: &[String]) -> Vec<String> {
    let mut confs: Vec<String> = vec![own_conf.to_string()];
    for c in configs {
        if !confs.contains(c) {
            confs.push(c.clone());
        }
    }
    confs
}

fn with_savings(mut rows: Vec<WhatIfRow>) -> Vec<WhatIfRow> {
    if let Some(base) = rows.first().map(|r| r.peak_reserved_bytes as i64) {
        for row in &mut rows {
            row.saving_vs_run_bytes = base - row.peak_reserved_bytes as i64;
        }
    }
    rows
}

/// Replays the run under its config and each of `configs`: from the run log when it holds
/// the whole run, else from the snapshot's history ring. Returns the rows and the check of
/// the own-config row against the run.
pub fn what_if(
    r: &RunResult,
    log: Option<&RunLog>,
    own_conf: &str,
    configs: &[String],
) -> (Vec<WhatIfRow>, WhatIfCheck) {
    let complete = log.filter(|l| l.incomplete().is_none() && !l.is_empty());
    if let Some(l) = complete {
        let mut rows = Vec::new();
        for c in configs_of(own_conf, configs) {
            let Ok(config) = AllocatorConfig::parse(&c) else {
                warn!(conf = %c, "what-if: config does not parse");
                continue;
            };
            match l.replay(&config, r.capacity_bytes) {
                Ok(rr) => rows.push(row(
                    c,
                    [rr.peak_allocated_bytes, rr.peak_reserved_bytes],
                    rr.num_alloc_retries,
                    rr.num_ooms,
                    rr.num_ooms == 0,
                )),
                Err(e) => warn!(conf = %c, error = %e, "what-if replay of the run log failed"),
            }
        }
        let rows = with_savings(rows);
        let chk = check(r, &rows, "run log", l.len() as u64, "");
        return (rows, chk);
    }
    let Some(snap) = r.snapshot.as_ref() else {
        return (Vec::new(), WhatIfCheck::default());
    };
    let rows = what_if_snapshot(snap, r.capacity_bytes, own_conf, configs);
    let events = snap
        .device_traces
        .iter()
        .find(|t| !t.is_empty())
        .map(|t| t.len() as u64)
        .unwrap_or(0);
    let why = match log.and_then(|l| l.incomplete()) {
        Some((why, missed)) => format!(
            "the run log stopped ({why}; {missed} requests after it), so the rows replay the \
             snapshot's history ring of the last {events} events, from a warm state rebuilt at \
             its start, and miss what came before"
        ),
        None => format!(
            "the rows replay the snapshot's history ring of the last {events} events, from a \
             warm state rebuilt at its start, and miss what came before"
        ),
    };
    let chk = check(r, &rows, "history ring", events, &why);
    (rows, chk)
}

/// The own-config row (the first) against the run: peak reserved and the allocator's OOM
/// count must be the run's for the replay to stand for it.
pub fn check(
    r: &RunResult,
    rows: &[WhatIfRow],
    source: &str,
    events: u64,
    why: &str,
) -> WhatIfCheck {
    let run_ooms = r
        .final_memory_stats
        .get("num_ooms")
        .copied()
        .unwrap_or(r.errors.oom as i64);
    check_against(r.peaks.reserved_bytes, run_ooms, rows, source, events, why)
}

/// The own-config row of a service's snapshot (`vramroom http`) against the service's own
/// figures: `max_memory_reserved` and `num_ooms` from its `memory_stats()` as the probe
/// or `vramroom serve` exports them. Only for one traced device (the exported stats are
/// summed over devices); empty when the service exports no stats.
pub fn check_service(
    r: &RunResult,
    rows: &[WhatIfRow],
    snap: &vramroom_alloc::Snapshot,
) -> WhatIfCheck {
    let traced: Vec<usize> = snap
        .device_traces
        .iter()
        .filter(|t| !t.is_empty())
        .map(Vec::len)
        .collect();
    let (Some(&peak), [events]) = (
        r.final_memory_stats.get("reserved_bytes.all.peak"),
        traced.as_slice(),
    ) else {
        return WhatIfCheck::default();
    };
    let ooms = r.final_memory_stats.get("num_ooms").copied().unwrap_or(0);
    let why = format!(
        "the rows replay the service's snapshot ({events} events, from the state rebuilt at \
         its start); a peak from before its recording began, a history ring that wrapped, or \
         a reset_peak_memory_stats() in the service is outside it"
    );
    check_against(
        peak.max(0) as u64,
        ooms,
        rows,
        "service snapshot",
        *events as u64,
        &why,
    )
}

fn check_against(
    run_peak_reserved: u64,
    run_ooms: i64,
    rows: &[WhatIfRow],
    source: &str,
    events: u64,
    why: &str,
) -> WhatIfCheck {
    let mut c = WhatIfCheck {
        source: source.into(),
        events,
        run_peak_reserved_bytes: run_peak_reserved,
        run_ooms,
        ..Default::default()
    };
    let Some(own) = rows.first() else {
        c.note = "no what-if row for the run's own config".into();
        return c;
    };
    c.row_peak_reserved_bytes = own.peak_reserved_bytes;
    c.row_ooms = own.num_ooms;
    c.agrees = own.peak_reserved_bytes == run_peak_reserved && own.num_ooms == run_ooms;
    if !c.agrees {
        c.note = format!(
            "the row for the run's own config peaks at {} reserved with {} OOMs where the run \
             peaked at {} with {}: {}",
            mib(own.peak_reserved_bytes as f64),
            own.num_ooms,
            mib(run_peak_reserved as f64),
            run_ooms,
            if why.is_empty() {
                "the replay of the run's own requests did not re-make it (a device whose \
                 addresses differ from the simulated one's can break best-fit ties otherwise)"
            } else {
                why
            }
        );
    }
    c
}

/// Replays `snap`'s first device trace under `own_conf` and each of `configs`, on a device
/// of `capacity` bytes (`vramroom http` replays the snapshot a probe served).
pub fn what_if_snapshot(
    snap: &vramroom_alloc::Snapshot,
    capacity: u64,
    own_conf: &str,
    configs: &[String],
) -> Vec<WhatIfRow> {
    if snap.device_traces.iter().all(|t| t.is_empty()) {
        return Vec::new();
    }
    let mut rows = Vec::new();
    for c in configs_of(own_conf, configs) {
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
            Ok(rr) => rows.push(row(
                c,
                [rr.peak_allocated_bytes, rr.peak_reserved_bytes],
                rr.num_alloc_retries,
                rr.num_ooms,
                // An allocation of 1 EB or more fails without counting an OOM (as in
                // PyTorch): any failed allocation means the config does not fit.
                rr.num_ooms == 0 && rr.oom_event.is_none(),
            )),
            Err(e) => warn!(conf = %c, error = %e, "what-if replay failed"),
        }
    }
    with_savings(rows)
}

/// One what-if row from a replay's figures (`peaks`: allocated, reserved).
fn row(conf: String, peaks: [u64; 2], retries: i64, ooms: i64, fits: bool) -> WhatIfRow {
    let [alloc, reserved] = peaks;
    WhatIfRow {
        alloc_conf: conf,
        peak_allocated_bytes: alloc,
        peak_reserved_bytes: reserved,
        reserved_over_allocated: if alloc > 0 {
            reserved as f64 / alloc as f64
        } else {
            0.0
        },
        num_alloc_retries: retries,
        num_ooms: ooms,
        fits_capacity: fits,
        saving_vs_run_bytes: 0,
    }
}
