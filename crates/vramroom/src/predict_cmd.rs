//! `vramroom predict`: one request of a workload on the meta device, its peak memory and
//! breakdown. The workload flags are loadtest's (vramroom-workload parses both).

use std::process::ExitCode;

use anyhow::{anyhow, Context};
use clap::Args;
use vramroom_alloc::size::{human_bytes, parse_size};
use vramroom_alloc::AllocatorConfig;
use vramroom_workload::{max_batch, predict as run_predict, PredictDevice, Prediction, Scenario};

use crate::error::UserError;
use crate::table::print_rows;
use crate::workload_args::WorkloadArgs;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    vramroom predict                                   # loadtest's default scenario\n  \
    vramroom predict --model gpt2 --batch 8 --seq 512            # transformers' GPT-2\n  \
    vramroom predict --model zoo-gpt --batch 8 --seq 512 --grad-on\n  \
    vramroom predict --model fixtures/hf/gpt2 --batch 8 --seq 512 --no-cache\n  \
    vramroom predict --model fixtures/hf/llama-small --mode generate --prompt 256 --new 32\n  \
    vramroom predict --model fixtures/hf/gpt2 --mode train --batch 8 --seq 512 --dtype bf16")]
pub struct PredictArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Training: optimizer steps to run (default 1 for the zoo, 3 for --model PATH: the
    /// optimizer state exists from the first step on).
    #[arg(long)]
    steps: Option<usize>,
    /// Allocator config in PYTORCH_CUDA_ALLOC_CONF syntax. Default: $PYTORCH_CUDA_ALLOC_CONF
    /// when set, else PyTorch's default.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    alloc_conf: Option<String>,
    /// Simulated GPU capacity, e.g. 80GiB. Default: unbounded.
    #[arg(long, value_name = "SIZE")]
    capacity: Option<String>,
    /// Find the largest batch that fits in --capacity (doubling, then bisection). Not
    /// serve's --max-batch N, which caps the batches it forms.
    #[arg(long = "find-max-batch")]
    find_max_batch: bool,
    /// Print JSON (peaks, categories at the peak, memory_stats keys) instead of tables.
    #[arg(long)]
    json: bool,
}

fn device(a: &PredictArgs) -> Result<PredictDevice, UserError> {
    let env = crate::replay_cmd::env_alloc_conf(a.alloc_conf.is_some());
    if let Some(e) = &env {
        crate::replay_cmd::parse_env_conf(e)?;
    }
    let alloc_conf = match a.alloc_conf.as_deref().or(env.as_deref()) {
        None | Some("") | Some("default") => AllocatorConfig::default(),
        Some(c) => AllocatorConfig::parse(c).with_context(|| format!("bad --alloc-conf {c:?}"))?,
    };
    let mut d = PredictDevice {
        alloc_conf,
        steps: a.steps,
        ..PredictDevice::default()
    };
    if a.steps == Some(0) {
        return Err(anyhow!("--steps must be at least 1").into());
    }
    if let Some(c) = &a.capacity {
        d.capacity = parse_size(c).with_context(|| format!("bad --capacity {c:?}"))?;
        if d.capacity == 0 {
            return Err(anyhow!("--capacity must be more than 0 bytes").into());
        }
    }
    if a.find_max_batch && a.capacity.is_none() {
        return Err(anyhow!("--find-max-batch needs --capacity").into());
    }
    Ok(d)
}

pub fn predict(a: PredictArgs) -> Result<ExitCode, UserError> {
    let mut sc = a
        .workload
        .flags()
        .and_then(|f| f.scenario())
        .map_err(|e| anyhow!(e.to_string()))?;
    let dev = device(&a)?;
    let p = if a.find_max_batch {
        match max_batch(&sc, &dev, 1 << 20) {
            Ok(Some((b, p))) => {
                sc.batch = b;
                p
            }
            Ok(None) => {
                eprintln!("batch 1 does not fit in {}", human_bytes(dev.capacity));
                return Ok(ExitCode::from(1));
            }
            Err(e) => return Err(anyhow!(e.to_string()).into()),
        }
    } else {
        match run_predict(&sc, &dev) {
            Ok(p) => p,
            Err(e) if e.is_oom() => {
                eprintln!("out of memory: {e}");
                return Ok(ExitCode::from(1));
            }
            Err(e) => return Err(anyhow!(e.to_string()).into()),
        }
    };
    if a.json {
        let j = p.to_json(&sc);
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    } else {
        print_human(&sc, &p);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_human(sc: &Scenario, p: &Prediction) {
    println!("{}", sc.info().description);
    println!(
        "one request on the meta device{}",
        if sc.input.is_fixed() {
            String::new()
        } else {
            format!(
                ", at the largest {} the distribution draws ({})",
                sc.model.size_dim(),
                p.size
            )
        }
    );
    let rows = vec![
        vec!["peak allocated".into(), human_bytes(p.peak_allocated_bytes)],
        vec!["peak reserved".into(), human_bytes(p.peak_reserved_bytes)],
        vec![
            "allocated before the request".into(),
            human_bytes(p.base_bytes),
        ],
        vec![
            "peak above that".into(),
            human_bytes(p.peak_over_base_bytes),
        ],
    ];
    print_rows(&["", "bytes"], &rows);
    println!();
    let rows: Vec<Vec<String>> = p
        .categories
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| vec![k.to_string(), human_bytes(*v)])
        .collect();
    print_rows(&["category at peak", "bytes"], &rows);
    if let Some(s) = &p.summary {
        println!();
        println!("{s}");
    }
}
