//! `vramroom loadtest`: put a model workload under load, watch its memory as the allocator
//! sees it, find the OOM point, name the waste, and write the report.
//!
//! Flags follow k6 and oha: `-c` workers, `-n` requests, `-z` duration, `--stages` k6-style,
//! `--threshold` k6-style (a broken one exits 99). Everything the user typed is checked
//! before the run starts and before any file is created: a bad value exits 2 and leaves no
//! output behind. Ctrl-C stops the load; what was measured is still reported and written.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, Context};
use clap::Args;
use vramroom_alloc::size::{human_bytes, parse_size};
use vramroom_load::{
    parse_stages, parse_thresholds, LoadConfig, LoadPlan, Progress, RampStep, Stage,
};
use vramroom_workload::{DeviceChoice, ModelSpec, Scenario, MAX_WORKERS};

use crate::error::UserError;
use crate::run_cmd::{
    check_out_dir, discard_out_dir, duration, finish, le, load_fraction, progress_bar,
    stop_on_ctrl_c,
};
use crate::workload_args::WorkloadArgs;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    vramroom loadtest                                  # the default scenario on cpu\n  \
    vramroom loadtest --model zoo-gpt-tiny -c 4 -z 10s --threshold 'peak_reserved<64MiB'\n  \
    vramroom loadtest --stages 1:10s,4:20s,16:20s --grad-on\n  \
    vramroom loadtest --device meta --ramp-until-oom --capacity 1GiB\n  \
    vramroom loadtest --mode train --model mlp-small --accum 4 --sum-losses\n  \
    vramroom loadtest --model fixtures/hf/gpt2-tiny --mode generate --prompt 16 --new 8")]
pub struct LoadtestArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// cpu (real compute under --capacity), meta (no data, fast) or cuda.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Device capacity, e.g. 256MiB, 6GiB (simulated on cpu and meta). Default: a small
    /// simulated card (128 MiB).
    #[arg(long, value_name = "SIZE")]
    capacity: Option<String>,
    /// Allocator config in PYTORCH_CUDA_ALLOC_CONF syntax. Default: $PYTORCH_CUDA_ALLOC_CONF
    /// when set, else PyTorch's default.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    alloc_conf: Option<String>,
    /// Extra allocator configs to replay the run's trace under (the what-if table).
    #[arg(long = "what-if", value_name = "CONF")]
    what_if: Vec<String>,
    /// Concurrent workers (closed model), at most 4096 (each is a thread of this process).
    #[arg(short = 'c', long = "concurrency", value_name = "N")]
    concurrency: Option<usize>,
    /// Total requests to make, then stop.
    #[arg(short = 'n', long = "requests", value_name = "N", conflicts_with_all = ["duration", "stages"])]
    requests: Option<u64>,
    /// Duration of a fixed-concurrency run (10s, 500ms, 1m); with --ramp-until-oom, of each
    /// ramp stage.
    #[arg(short = 'z', long = "duration", value_name = "DURATION")]
    duration: Option<String>,
    /// k6-style stages WORKERS:DURATION,... e.g. 1:10s,4:20s,16:20s.
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["concurrency", "ramp_until_oom"])]
    stages: Option<String>,
    /// Raise the load (from -c, default 1) until the first OOM, then stop.
    #[arg(long = "ramp-until-oom")]
    ramp_until_oom: bool,
    /// How the ramp raises the load: x2 (double) or +4 (add).
    #[arg(long = "ramp-step", default_value = "x2", value_name = "STEP")]
    ramp_step: String,
    /// Highest concurrency the ramp tries.
    #[arg(long = "ramp-max", default_value_t = 256, value_name = "N")]
    ramp_max: usize,
    /// Time bound of the ramp.
    #[arg(long = "time-limit", default_value = "90s", value_name = "DURATION")]
    time_limit: String,
    /// Period of the memory sampler.
    #[arg(
        long = "sample-period",
        default_value = "20ms",
        value_name = "DURATION"
    )]
    sample_period: String,
    /// Skip the OOM search (the fit and the bisection on meta).
    #[arg(long = "no-search")]
    no_search: bool,
    /// k6-style threshold, repeatable: 'peak_reserved<6GiB', 'p99<200ms', 'oom_count==0'.
    /// A broken one makes the run exit 99.
    #[arg(long = "threshold", value_name = "EXPR")]
    threshold: Vec<String>,
    /// Folder for report.html, results.json and snapshot.pickle (created, and checked with a
    /// probe file, before the run; the files are written after it).
    #[arg(long, default_value = "out/loadtest", value_name = "DIR")]
    out: PathBuf,
    /// Print the results as JSON on stdout instead of the summary table.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// On a real GPU: the whole card unless `--capacity` says less, and NVML's process and
/// device figures beside the allocator's (the context and library overhead as a series).
fn cuda_defaults(cfg: &mut LoadConfig, device: &str, whole_card: bool) {
    let Ok(p) = vramroom_workload::CudaProvider::parse(device.trim()) else {
        return;
    };
    if whole_card {
        if let Ok(d) = vramroom_cuda::CudaDevice::new(p.ordinal) {
            cfg.capacity = vramroom_alloc::Device::total_memory(&d);
        }
    }
    if let Some(bus) = p.pci_bus_id() {
        match vramroom_load::memsource::NvmlSource::open(
            vramroom_load::memsource::NvmlDevice::PciBusId(bus),
            None,
        ) {
            Ok(s) => cfg.memory_source = Some(std::sync::Arc::new(s)),
            Err(e) => tracing::warn!("no NVML series: {e}"),
        }
    }
}

/// The scenario: vramroom-workload's one parser of the workload flags.
fn scenario(a: &LoadtestArgs) -> Result<Scenario, UserError> {
    a.workload.flags().and_then(|f| f.scenario()).map_err(le)
}

fn plan(a: &LoadtestArgs, default: &LoadPlan) -> Result<LoadPlan, UserError> {
    if a.concurrency == Some(0) {
        return Err(anyhow!("-c must be at least 1").into());
    }
    // Workers are threads of this process: refused here, before one is spawned.
    if let Some(c) = a.concurrency.filter(|&c| c > MAX_WORKERS) {
        return Err(anyhow!("-c {c}: at most {MAX_WORKERS} workers are allowed").into());
    }
    if a.ramp_until_oom && a.ramp_max > MAX_WORKERS {
        return Err(anyhow!(
            "--ramp-max {}: at most {MAX_WORKERS} workers are allowed",
            a.ramp_max
        )
        .into());
    }
    let c = a.concurrency.unwrap_or(1);
    if a.ramp_until_oom {
        let step_s = a.ramp_step.trim();
        let step = if let Some(n) = step_s.strip_prefix('+') {
            RampStep::Add(
                n.parse()
                    .map_err(|_| anyhow!("bad --ramp-step {step_s:?} (expected x2 or +4)"))?,
            )
        } else if let Some(n) = step_s.strip_prefix(['x', '*']) {
            RampStep::Mul(
                n.parse()
                    .map_err(|_| anyhow!("bad --ramp-step {step_s:?} (expected x2 or +4)"))?,
            )
        } else {
            return Err(anyhow!("bad --ramp-step {step_s:?} (expected x2 or +4)").into());
        };
        let stage = match &a.duration {
            Some(d) => duration("-z", d)?,
            None => Duration::from_secs(2),
        };
        return Ok(LoadPlan::RampUntilOom {
            start: c,
            step,
            stage: Stage::timed(c, stage),
            max_concurrency: a.ramp_max,
            time_limit: duration("--time-limit", &a.time_limit)?,
        });
    }
    if let Some(s) = &a.stages {
        if a.duration.is_some() {
            return Err(anyhow!("--stages sets its own durations: drop -z").into());
        }
        return Ok(LoadPlan::Stages(parse_stages(s).map_err(le)?));
    }
    if let Some(n) = a.requests {
        if n == 0 {
            return Err(anyhow!("-n must be at least 1").into());
        }
        return Ok(LoadPlan::Requests {
            concurrency: c,
            total: n,
        });
    }
    if let Some(d) = &a.duration {
        return Ok(LoadPlan::Stages(vec![Stage::timed(c, duration("-z", d)?)]));
    }
    if let Some(c) = a.concurrency {
        return Ok(LoadPlan::Stages(vec![Stage::timed(
            c,
            Duration::from_secs(10),
        )]));
    }
    Ok(default.clone())
}

/// Everything the user typed, checked, as the engine's config. No file is touched.
fn config(a: &LoadtestArgs) -> Result<LoadConfig, UserError> {
    let mut cfg = LoadConfig {
        scenario: scenario(a)?,
        ..LoadConfig::default()
    };
    cfg.device = a.device.parse::<DeviceChoice>().map_err(le)?;
    if let Some(c) = &a.capacity {
        cfg.capacity = parse_size(c).with_context(|| format!("bad --capacity {c:?}"))?;
        if cfg.capacity == 0 {
            return Err(anyhow!("--capacity must be more than 0 bytes").into());
        }
    }
    if let DeviceChoice::Custom(_) = &cfg.device {
        cuda_defaults(&mut cfg, &a.device, a.capacity.is_none());
    }
    if let ModelSpec::Hf(h) = &cfg.scenario.model {
        if let Some(n) = h.weights_note(!matches!(cfg.device, DeviceChoice::Meta)) {
            eprintln!("{n}");
        }
    }
    let env = crate::replay_cmd::env_alloc_conf(a.alloc_conf.is_some());
    if let Some(c) = a.alloc_conf.as_ref().or(env.as_ref()) {
        cfg.alloc_conf = if c == "default" {
            String::new()
        } else {
            c.clone()
        };
    }
    cfg.what_if.extend(a.what_if.iter().cloned());
    cfg.plan = plan(a, &cfg.plan)?;
    cfg.sample_period = duration("--sample-period", &a.sample_period)?;
    cfg.thresholds = parse_thresholds(&a.threshold).map_err(le)?;
    if a.no_search {
        cfg.search = None;
    }
    cfg.validate().map_err(le)?;
    Ok(cfg)
}

fn progress_message(p: &Progress) -> String {
    let mem = format!(
        "alloc {} | reserved {} | peak {} of {}",
        human_bytes(p.allocated_bytes),
        human_bytes(p.reserved_bytes),
        human_bytes(p.peak_allocated_bytes),
        human_bytes(p.capacity_bytes)
    );
    match p.phase.as_str() {
        "load" => format!(
            "stage {}/{} c={} | {} req | {} OOM{} | {mem}",
            p.stage + 1,
            p.stages.max(p.stage + 1),
            p.concurrency,
            p.requests_done,
            p.ooms,
            if p.errors > 0 {
                format!(" | {} err", p.errors)
            } else {
                String::new()
            }
        ),
        "setup" => "building the model".into(),
        "search" => "OOM search on meta (fit + bisection)".into(),
        "what_if" => "replaying the run's trace under other allocator configs".into(),
        "diagnose" => "diagnosing".into(),
        "done" => "done".into(),
        other => other.to_string(),
    }
}

fn position(p: &Progress) -> u64 {
    let f = load_fraction(p);
    match p.phase.as_str() {
        "setup" => 0,
        "load" => (f * 900.0) as u64,
        "search" => 920,
        "what_if" => 950,
        "diagnose" => 980,
        _ => 1000,
    }
}

pub fn loadtest(a: LoadtestArgs) -> Result<ExitCode, UserError> {
    let cfg = config(&a)?;
    let created = check_out_dir(&a.out)?;

    let stop = stop_on_ctrl_c();
    let pb = progress_bar(a.quiet);
    let result = vramroom_load::run(&cfg, stop.clone(), |p| {
        pb.set_position(position(p));
        pb.set_message(crate::progress::fitted(
            &progress_message(p),
            crate::progress::RUN_PREFIX_COLS,
        ));
    });
    pb.finish_and_clear();
    let r = result.map_err(|e| {
        discard_out_dir(&created);
        // the simulated default card: no --capacity, and not a real device (cuda_defaults)
        let default_card = a.capacity.is_none() && !matches!(cfg.device, DeviceChoice::Custom(_));
        match e {
            // The model alone does not fit the default scenario's small simulated card.
            vramroom_load::LoadError::Workload(w) if w.is_oom() && default_card => {
                UserError(anyhow!(
                    "{w} (the default simulated card; give the run one that holds the model, \
                     e.g. --capacity 2GiB)"
                ))
            }
            e => le(e),
        }
    })?;

    finish(&a.out, a.json, &r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: LoadtestArgs,
    }

    fn cfg(args: &[&str]) -> Result<LoadConfig, String> {
        let t = T::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        config(&t.a).map_err(|e| e.0.to_string())
    }

    #[test]
    fn default_is_the_engines_default() {
        let c = cfg(&[]).unwrap();
        let d = LoadConfig::default();
        assert_eq!(c.scenario, d.scenario);
        assert_eq!(c.plan, d.plan);
        assert_eq!(c.capacity, d.capacity);
        assert!(c.search.is_some());
    }

    #[test]
    fn flags_map_to_the_plan() {
        let c = cfg(&["-c", "4", "-z", "3s"]).unwrap();
        assert_eq!(
            c.plan,
            LoadPlan::Stages(vec![Stage::timed(4, Duration::from_secs(3))])
        );
        let c = cfg(&["-n", "20", "-c", "2"]).unwrap();
        assert_eq!(
            c.plan,
            LoadPlan::Requests {
                concurrency: 2,
                total: 20
            }
        );
        let c = cfg(&["--stages", "1:1s,2:2s"]).unwrap();
        assert!(matches!(c.plan, LoadPlan::Stages(ref v) if v.len() == 2));
        let c = cfg(&["--ramp-until-oom", "--ramp-step", "+2"]).unwrap();
        assert!(matches!(
            c.plan,
            LoadPlan::RampUntilOom {
                step: RampStep::Add(2),
                ..
            }
        ));
        let c = cfg(&["--model", "zoo-gpt-tiny", "--grad-on", "--keep-outputs"]).unwrap();
        assert!(c.scenario.mistakes.grad_at_inference && c.scenario.mistakes.keep_outputs);
        assert!(c.scenario.input.max() <= 32);
        let c = cfg(&[
            "--mode",
            "train",
            "--model",
            "mlp-tiny",
            "--accum",
            "4",
            "--sum-losses",
        ])
        .unwrap();
        assert!(c.scenario.is_training() && c.scenario.mistakes.sum_losses);
        let c = cfg(&["--capacity", "1GiB", "--threshold", "p99<200ms"]).unwrap();
        assert_eq!(c.capacity, 1 << 30);
        assert_eq!(c.thresholds.len(), 1);
    }

    #[test]
    fn bad_arguments_are_errors() {
        for bad in [
            &["--model", "resnet9000"][..],
            &["--stages", "1:10s,x"],
            &["--stages", "0:10s"],
            &["--threshold", "peak_reserved<<6GiB"],
            &["--threshold", "nonsense"],
            &["--capacity", "0"],
            &["--capacity", "lots"],
            &["-c", "0"],
            &["-n", "0"],
            &["-z", "ten"],
            &["--device", "tpu"],
            &["--alloc-conf", "bogus:1"],
            &["--mode", "fly"],
            &["--sum-losses"],
            &["--seq", "uniform:9..3"],
            &["--stages", "1:1s", "-c", "3"],
            &["-n", "3", "-z", "1s"],
        ] {
            assert!(cfg(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
