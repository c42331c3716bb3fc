//! `cargo run --release -p vramroom-load --example repredict -- RESULTS_JSON SNAPSHOT [--slices US | --lockstep]`
//!
//! Recomputes `vramroom http --predict` from a gentle run's files, without the service: its
//! results.json (for what only the live service knew: each device's capacity and fraction, the
//! overhead NVML saw, the configs, the target concurrency) and the probe's snapshot of that
//! run (scripts/services/pack_gentle.py keeps both). Prints the prediction as JSON. `--slices
//! US` replays concurrent requests in GIL-like slices of US microseconds, `--lockstep` from
//! aligned starts, instead of the default (staggered).
use std::collections::BTreeMap;

use serde_json::Value;
use vramroom_load::http::predict::{predict, DeviceCapacity, PredictOptions};
use vramroom_trace::concurrency::Interleave;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    let (Some(res), Some(snap)) = (a.get(1), a.get(2)) else {
        return Err("usage: repredict RESULTS_JSON SNAPSHOT [--slices US | --lockstep]".into());
    };
    let interleave = match a.iter().position(|x| x == "--slices") {
        Some(i) => {
            let us = a.get(i + 1).ok_or("--slices needs microseconds")?.parse()?;
            Interleave::Slices { us }
        }
        None if a.iter().any(|x| x == "--lockstep") => Interleave::Lockstep,
        None if a.iter().any(|x| x == "--timed") => Interleave::Timed,
        None if a.iter().any(|x| x == "--staggered") => Interleave::Staggered,
        None => Interleave::Either,
    };
    let r: Value = serde_json::from_str(&std::fs::read_to_string(res)?)?;
    let pred = &r["http"]["prediction"];
    let devs = pred["devices"]
        .as_array()
        .ok_or("results.json has no prediction")?;
    let mut caps = Vec::new();
    let mut overhead = BTreeMap::new();
    let mut confs: Vec<String> = Vec::new();
    let mut target = None;
    for d in devs {
        let c: DeviceCapacity = serde_json::from_value(d["capacity"].clone())?;
        overhead.insert(c.device, d["overhead_bytes"].as_u64().unwrap_or(0));
        caps.push(c);
        for c in d["configs"].as_array().into_iter().flatten() {
            let s = c["alloc_conf"].as_str().unwrap_or("").to_string();
            if !confs.contains(&s) {
                confs.push(s);
            }
        }
        target = target.or(d["size_cap"]["target_concurrency"]
            .as_u64()
            .and_then(|t| u32::try_from(t).ok()));
    }
    let own = confs.first().cloned().unwrap_or_default();
    let snap = vramroom_trace::read_snapshot_file(std::path::Path::new(snap))?;
    let gentle = pred["gentle_concurrency"].as_u64().unwrap_or(1) as usize;
    let p = predict(
        &snap,
        &caps,
        &overhead,
        &own,
        confs.get(1..).unwrap_or(&[]),
        gentle,
        &PredictOptions {
            target_concurrency: target,
            seeds: 5,
            interleave: Some(interleave),
        },
    );
    println!("{}", serde_json::to_string(&p)?);
    Ok(())
}
