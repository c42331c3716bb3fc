//! `headroom predict`: a model workload on the meta device, its peak memory and breakdown.

use std::process::ExitCode;

use anyhow::{anyhow, Context};
use clap::Args;
use headroom_alloc::size::{human_bytes, parse_size};
use headroom_alloc::AllocatorConfig;
use headroom_tensor::predict::{
    max_batch, predict as run_predict, AccumPattern, Mode, ModelKind, OptimKind, PredictOptions,
    Prediction,
};
use headroom_tensor::DType;

use crate::replay_cmd::print_rows;
use crate::UserError;

#[derive(Args)]
pub struct PredictArgs {
    /// resnet50, resnet18, gpt2 (124M) or mlp (1024-4096-4096-1000).
    #[arg(long)]
    model: String,
    /// Samples (sequences for gpt2) per step.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Sequence length (gpt2).
    #[arg(long, default_value_t = 1024)]
    seq: usize,
    /// infer or train.
    #[arg(long, default_value = "infer")]
    mode: String,
    /// Infer with grad on (activations kept for a backward) instead of no_grad.
    #[arg(long)]
    grad: bool,
    /// sgd (momentum 0.9) or adamw (train).
    #[arg(long, default_value = "sgd")]
    optimizer: String,
    /// Micro-steps per optimizer step (train).
    #[arg(long, default_value_t = 1)]
    accum: usize,
    /// each: backward every micro-step; sum: sum the losses, one backward.
    #[arg(long = "accum-pattern", default_value = "each")]
    accum_pattern: String,
    /// f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Allocator config in PYTORCH_CUDA_ALLOC_CONF syntax. Default: $PYTORCH_CUDA_ALLOC_CONF
    /// when set, else PyTorch's default.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    alloc_conf: Option<String>,
    /// Simulated GPU capacity, e.g. 80GiB. Default: unbounded.
    #[arg(long, value_name = "SIZE")]
    capacity: Option<String>,
    /// Find the largest batch that fits in --capacity (doubling, then bisection).
    #[arg(long = "max-batch")]
    max_batch: bool,
    /// Print JSON (peaks, categories at the peak, memory_stats keys) instead of tables.
    #[arg(long)]
    json: bool,
}

fn options(a: &PredictArgs) -> Result<PredictOptions, UserError> {
    let e = |x: headroom_tensor::TensorError| anyhow!(x.to_string());
    let dtype = match a.dtype.to_ascii_lowercase().as_str() {
        "f32" | "float32" => DType::F32,
        "bf16" | "bfloat16" => DType::BF16,
        other => return Err(anyhow!("unknown dtype {other:?} (expected f32, bf16)").into()),
    };
    let env = crate::replay_cmd::env_alloc_conf(a.alloc_conf.is_some());
    if let Some(e) = &env {
        crate::replay_cmd::parse_env_conf(e)?;
    }
    let alloc_conf = match a.alloc_conf.as_deref().or(env.as_deref()) {
        None | Some("") | Some("default") => AllocatorConfig::default(),
        Some(c) => AllocatorConfig::parse(c).with_context(|| format!("bad --alloc-conf {c:?}"))?,
    };
    let mut o = PredictOptions {
        model: a.model.parse::<ModelKind>().map_err(e)?,
        batch: a.batch,
        seq: a.seq,
        mode: a.mode.parse::<Mode>().map_err(e)?,
        grad: a.grad,
        optimizer: a.optimizer.parse::<OptimKind>().map_err(e)?,
        accum: a.accum,
        accum_pattern: a.accum_pattern.parse::<AccumPattern>().map_err(e)?,
        dtype,
        alloc_conf,
        ..Default::default()
    };
    if let Some(c) = &a.capacity {
        o.capacity = parse_size(c).with_context(|| format!("bad --capacity {c:?}"))?;
        if o.capacity == 0 {
            return Err(anyhow!("--capacity must be more than 0 bytes").into());
        }
    }
    if a.max_batch && a.capacity.is_none() {
        return Err(anyhow!("--max-batch needs --capacity").into());
    }
    if o.batch == 0 {
        return Err(anyhow!("--batch must be at least 1").into());
    }
    if o.accum == 0 {
        return Err(anyhow!("--accum must be at least 1").into());
    }
    Ok(o)
}

pub fn predict(a: PredictArgs) -> Result<ExitCode, UserError> {
    let mut o = options(&a)?;
    let p = if a.max_batch {
        match max_batch(&o, 1 << 20).map_err(|e| anyhow!(e.to_string()))? {
            Some((b, p)) => {
                o.batch = b;
                p
            }
            None => {
                eprintln!("batch 1 does not fit in {}", human_bytes(o.capacity));
                return Ok(ExitCode::from(1));
            }
        }
    } else {
        match run_predict(&o) {
            Ok(p) => p,
            Err(e) if e.is_oom() => {
                eprintln!("out of memory: {e}");
                return Ok(ExitCode::from(1));
            }
            Err(e) => return Err(anyhow!(e.to_string()).into()),
        }
    };
    if a.json {
        let j = serde_json::json!({
            "model": a.model,
            "batch": o.batch,
            "peak_allocated_bytes": p.peak_allocated_bytes,
            "peak_reserved_bytes": p.peak_reserved_bytes,
            "peak_over_input_bytes": p.peak_over_input_bytes,
            "categories": p.categories,
            "stats": p.stats,
        });
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    } else {
        print_human(&a, &o, &p);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_human(a: &PredictArgs, o: &PredictOptions, p: &Prediction) {
    println!(
        "{} batch {}{} {:?}{} on the meta device",
        a.model,
        o.batch,
        if o.model == ModelKind::Gpt2 {
            format!(" seq {}", o.seq)
        } else {
            String::new()
        },
        o.mode,
        match o.mode {
            Mode::Infer if o.grad => " (grad on)".to_string(),
            Mode::Infer => " (no_grad)".to_string(),
            Mode::Train => format!(
                " ({:?}, accum {} {:?})",
                o.optimizer, o.accum, o.accum_pattern
            ),
        }
    );
    let rows = vec![
        vec!["peak allocated".into(), human_bytes(p.peak_allocated_bytes)],
        vec!["peak reserved".into(), human_bytes(p.peak_reserved_bytes)],
        vec![
            "peak above the input".into(),
            human_bytes(p.peak_over_input_bytes),
        ],
    ];
    print_rows(&["", "bytes"], &rows);
    println!();
    let rows: Vec<Vec<String>> = p
        .categories
        .iter()
        .map(|(k, v)| vec![k.to_string(), human_bytes(*v)])
        .collect();
    print_rows(&["category at peak", "bytes"], &rows);
    println!();
    println!("{}", p.summary);
}
