//! `vramroom bench models`: ResNet-50 and GPT-2 on a GPU, milliseconds and peak memory per
//! case, beside PyTorch's figures for the same cases when given (`--reference`, the JSON that
//! scripts/torch_models_bench.py writes), with the ratios.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use vramroom_alloc::{format_size, AllocatorConfig};
use vramroom_tensor::bench::{predict_case, run_case, standard_cases, BenchResult};
use vramroom_tensor::Device;

use crate::error::UserError;

#[derive(Args)]
pub struct BenchModelsArgs {
    /// One case of each kind (for a smoke run).
    #[arg(long)]
    quick: bool,
    /// Only cases whose name contains this (repeatable), e.g. `--case "resnet50 fp32"`.
    #[arg(long = "case", value_name = "SUBSTRING")]
    cases: Vec<String>,
    /// Timed iterations per case.
    #[arg(long, default_value_t = 30)]
    iters: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// PyTorch's results for the same cases (JSON lines of {case, ms, peak_allocated,
    /// peak_reserved}) to print beside ours, with ratios.
    #[arg(long, value_name = "PATH")]
    reference: Option<PathBuf>,
    /// Also write every result as JSON lines to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Skip the meta-device prediction column.
    #[arg(long)]
    no_predict: bool,
    /// After each case, the host time spent per backend method (calls and microseconds,
    /// warm-up included): where a launch-bound case spends its time.
    #[arg(long)]
    profile: bool,
}

fn load_reference(p: &PathBuf) -> Result<Vec<Value>, UserError> {
    let text = vramroom_alloc::input::read_text(p, vramroom_alloc::input::Limit::RESULTS)
        .map_err(|e| anyhow::anyhow!("--reference {e}"))?;
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        v.push(
            serde_json::from_str(line)
                .with_context(|| format!("{}: line {} is not JSON", p.display(), i + 1))?,
        );
    }
    Ok(v)
}

pub fn bench_models(a: BenchModelsArgs) -> Result<ExitCode, UserError> {
    if a.iters == 0 {
        return Err(UserError(anyhow::anyhow!("--iters must be at least 1")));
    }
    let reference = match &a.reference {
        Some(p) => load_reference(p)?,
        None => Vec::new(),
    };
    let all = standard_cases(a.quick);
    // A filter that is a whole case name selects that case alone; otherwise a substring.
    let matches = |name: &str, f: &str| {
        if all.iter().any(|c| c.name() == f) {
            name == f
        } else {
            name.contains(f)
        }
    };
    let cases: Vec<_> = all
        .iter()
        .filter(|c| a.cases.is_empty() || a.cases.iter().any(|s| matches(&c.name(), s)))
        .copied()
        .collect();
    if cases.is_empty() {
        return Err(UserError(anyhow::anyhow!(
            "no case matches --case {:?}",
            a.cases
        )));
    }
    let rt = Device::cuda(a.device, AllocatorConfig::default())
        .map_err(|e| UserError(anyhow::anyhow!("cannot open cuda:{}: {e}", a.device)))?;
    let mut out_file = match &a.json {
        Some(p) => Some(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        ),
        None => None,
    };
    let (maj, min) = rt.gpu.arch();
    println!(
        "{} (sm_{maj}{min}), {} cases, median of {} iterations after {} warm-up",
        rt.gpu.name(),
        cases.len(),
        a.iters,
        a.warmup
    );
    println!(
        "{:<30} {:>9} {:>10} {:>11} {:>11} {:>11} | {:>9} {:>7} {:>11} {:>7}",
        "case",
        "ms",
        "items/s",
        "peak alloc",
        "peak resv",
        "predicted",
        "torch ms",
        "t/hr",
        "torch alloc",
        "hr/t"
    );
    let pb = indicatif::ProgressBar::new(cases.len() as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    let mut failed = 0;
    for c in &cases {
        // `{spinner} {pos}/{len} `: the counts are at most len's digits each.
        let digits = cases.len().to_string().len();
        pb.set_message(crate::progress::fitted(&c.name(), 2 * digits + 4));
        rt.backend.profile().enable(a.profile);
        let r: Result<BenchResult, _> = run_case(&rt, c, a.warmup, a.iters).map(|mut r| {
            if !a.no_predict && c.mode != vramroom_tensor::bench::BenchMode::InferGraph {
                r.predicted_peak_allocated = predict_case(c).ok();
            }
            r
        });
        pb.inc(1);
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                failed += 1;
                pb.suspend(|| println!("{:<30} FAILED: {e}", c.name()));
                continue;
            }
        };
        let peer = reference.iter().find(|v| v["case"] == r.case.as_str());
        let pms = peer.and_then(|v| v["ms"].as_f64());
        let palloc = peer.and_then(|v| v["peak_allocated"].as_u64());
        let line = format!(
            "{:<30} {:>9.3} {:>10.0} {:>11} {:>11} {:>11} | {:>9} {:>7} {:>11} {:>7}",
            r.case,
            r.ms,
            r.items_per_s,
            format_size(r.peak_allocated),
            format_size(r.peak_reserved),
            r.predicted_peak_allocated
                .map(format_size)
                .unwrap_or_else(|| "-".into()),
            pms.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into()),
            pms.map(|v| format!("{:.2}x", v / r.ms))
                .unwrap_or_else(|| "-".into()),
            palloc.map(format_size).unwrap_or_else(|| "-".into()),
            palloc
                .map(|v| format!("{:.3}", r.peak_allocated as f64 / v as f64))
                .unwrap_or_else(|| "-".into()),
        );
        pb.suspend(|| println!("{line}"));
        if a.profile {
            let iters = (a.iters + a.warmup) as f64;
            for (what, n, ns) in rt.backend.profile().take().into_iter().take(10) {
                pb.suspend(|| {
                    println!(
                        "    host {what:<28} {:>8.1} calls/iter {:>9.1} us/iter {:>7.2} us/call",
                        n as f64 / iters,
                        ns as f64 / 1e3 / iters,
                        ns as f64 / 1e3 / n.max(1) as f64
                    )
                });
            }
        }
        if let Some(f) = out_file.as_mut() {
            use std::io::Write;
            let rec = json!({
                "case": r.case, "ms": r.ms, "ms_min": r.ms_min, "iters": r.iters,
                "items_per_s": r.items_per_s, "peak_allocated": r.peak_allocated,
                "peak_reserved": r.peak_reserved,
                "predicted_peak_allocated": r.predicted_peak_allocated,
                "torch_ms": pms, "torch_peak_allocated": palloc,
                "torch_peak_reserved": peer.and_then(|v| v["peak_reserved"].as_u64()),
            });
            writeln!(f, "{rec}").context("cannot write --json")?;
        }
    }
    pb.finish_and_clear();
    println!(
        "t/hr: PyTorch's time over Vramroom's (above 1: Vramroom faster); hr/t: Vramroom's \
         peak allocated over PyTorch's (below 1: Vramroom smaller). predicted: the meta \
         device's peak for the case, no GPU needed."
    );
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
