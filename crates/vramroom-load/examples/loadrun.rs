//! Runs a load test from the command line, for measuring the engine without the CLI:
//! `cargo run --release -p vramroom-load --example loadrun -- [device] [stages] [capacity] [model] [input] [batch] [mistakes]`
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramroom_load::*;

fn main() -> Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let get = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let mut cfg = LoadConfig {
        device: get(0, "cpu").parse()?,
        ..Default::default()
    };
    let stages = get(1, "");
    if !stages.is_empty() {
        cfg.plan = LoadPlan::Stages(parse_stages(&stages)?);
    }
    let cap = get(2, "");
    if !cap.is_empty() {
        cfg.capacity =
            vramroom_alloc::parse_size(&cap).map_err(|e| LoadError::Config(e.to_string()))?;
    }
    let model = get(3, "");
    if !model.is_empty() {
        cfg.scenario.model = model.parse()?;
        cfg.scenario.name = model;
    }
    let input = get(4, "");
    if !input.is_empty() {
        cfg.scenario.input = input.parse()?;
    }
    let batch = get(5, "");
    if !batch.is_empty() {
        cfg.scenario.batch = batch
            .parse()
            .map_err(|_| LoadError::Config("batch".into()))?;
    }
    for m in get(6, "").split(',') {
        match m {
            "grad" => cfg.scenario.mistakes.grad_at_inference = true,
            "keep" => cfg.scenario.mistakes.keep_outputs = true,
            "named" => cfg.scenario.mistakes.named_temporaries = true,
            _ => {}
        }
    }
    cfg.alloc_conf = get(7, "");
    let t = std::time::Instant::now();
    let mut last = String::new();
    let r = run(&cfg, Arc::new(AtomicBool::new(false)), |p| {
        let s = format!("{} stage {} c{}", p.phase, p.stage, p.concurrency);
        if s != last {
            eprintln!(
                "[{:6.2}s] {s} req {} alloc {} MiB",
                t.elapsed().as_secs_f64(),
                p.requests_done,
                p.allocated_bytes >> 20
            );
            last = s;
        }
    })?;
    let mut v = serde_json::to_value(&r).map_err(|e| LoadError::Config(e.to_string()))?;
    if let Some(o) = v.as_object_mut() {
        let n = o
            .get("timeline")
            .and_then(|t| t.as_array())
            .map(|a| a.len())
            .unwrap_or(0);
        o.insert("timeline".into(), serde_json::json!(format!("{n} samples")));
        o.remove("final_memory_summary");
        o.remove("final_memory_stats");
        if let Some(oo) = o.get_mut("ooms").and_then(|x| x.as_array_mut()) {
            for x in oo.iter_mut() {
                if let Some(m) = x.as_object_mut() {
                    m.remove("memory_summary");
                    m.remove("memory_stats");
                }
            }
        }
    }
    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    eprintln!("total {:.2}s", t.elapsed().as_secs_f64());
    Ok(())
}
