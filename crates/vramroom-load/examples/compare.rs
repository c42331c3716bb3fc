//! Peak memory of the same closed load on cpu and on meta, per concurrency:
//! `cargo run --release -p vramroom-load --example compare -- MODEL INPUT BATCH [grad] [R]`
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramroom_load::*;
use vramroom_workload::{DeviceChoice, Scenario};

fn main() -> Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let get = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_string());
    let mut sc = Scenario {
        model: get(0, "zoo-gpt-small").parse()?,
        input: get(1, "uniform:16..128").parse()?,
        batch: get(2, "4").parse().unwrap_or(4),
        ..Default::default()
    };
    sc.mistakes.grad_at_inference = get(3, "") == "grad";
    let r: u64 = get(4, "6").parse().unwrap_or(6);
    for c in [1usize, 2, 4, 8, 16] {
        let mut line = format!("c={c:2}");
        for dev in [DeviceChoice::Cpu, DeviceChoice::Meta] {
            let cfg = LoadConfig {
                scenario: sc.clone(),
                device: dev,
                capacity: 8 << 30,
                plan: LoadPlan::Requests {
                    concurrency: c,
                    total: c as u64 * r,
                },
                search: None,
                diagnose: false,
                what_if: vec![],
                ..Default::default()
            };
            let t = std::time::Instant::now();
            let res = run(&cfg, Arc::new(AtomicBool::new(false)), |_| {})?;
            line += &format!(
                "  {}: above_base {:7.2} MiB reserved {:7.2} MiB ({:.2}s)",
                res.device,
                res.peaks.above_base_bytes as f64 / 1048576.0,
                res.peaks.reserved_bytes as f64 / 1048576.0,
                t.elapsed().as_secs_f64()
            );
        }
        println!("{line}");
    }
    Ok(())
}
