//! `vramroom watch URL…`: the memory of one or more running services (the ranks of a
//! torchrun job, each with its probe on base port + LOCAL_RANK) on one timeline, with no
//! load. A line per tick on stderr (per endpoint and the total), Ctrl-C or `-z` ends it,
//! and `--json` / `--out FILE` give the whole timeline as JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;
use clap::Args;
use vramroom_alloc::size::human_bytes;
use vramroom_load::http::prometheus::parse_metric_rule;
use vramroom_load::http::watch::{watch as run_watch, WatchConfig, WatchSource, WatchTick};

use crate::error::UserError;
use crate::run_cmd::{duration, le, stop_on_ctrl_c, EXIT_CANCELLED};

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    vramroom watch http://127.0.0.1:9464/metrics\n  \
    vramroom watch http://127.0.0.1:9464/metrics http://127.0.0.1:9465/metrics -z 5m --out watch.json\n\n\
In a torchrun job, start the probe with vramroom.probe.start(port=9464) in every rank: each\n\
rank listens on 9464 + LOCAL_RANK. Exit codes: 0 done (-z over), 2 bad input or no endpoint\n\
answers, 130 Ctrl-C (the timeline is still written).")]
pub struct WatchArgs {
    /// Prometheus endpoints: the probe (vramroom.probe), vramroom serve, DCGM exporter, Triton.
    #[arg(required = true, value_name = "URL")]
    urls: Vec<String>,
    /// Stop after this long (default: until Ctrl-C).
    #[arg(short = 'z', long = "duration", value_name = "DURATION")]
    duration: Option<String>,
    /// How often to scrape.
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    interval: String,
    /// A scrape with no answer by then counts as failed.
    #[arg(long, default_value = "5s", value_name = "DURATION")]
    timeout: String,
    /// Map a metric to memory, as `vramroom http --metric`.
    #[arg(long = "metric", value_name = "RULE")]
    metric: Vec<String>,
    /// Write the timeline as JSON to this file (checked before the watch starts).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Print the timeline as JSON on stdout at the end.
    #[arg(long)]
    json: bool,
    /// No line per tick.
    #[arg(long)]
    quiet: bool,
}

fn name(s: &WatchSource, i: usize) -> String {
    match &s.rank {
        Some(r) => format!("rank {r}"),
        None => format!("#{i}"),
    }
}

fn line(t: &WatchTick, sources: &[WatchSource]) -> String {
    let mut o = format!("{:>8.1}s", t.t_s);
    for (i, (r, s)) in t.per_source.iter().zip(sources).enumerate() {
        match r {
            Some(r) => o.push_str(&format!(
                " | {} alloc {} res {}",
                name(s, i),
                human_bytes(r.allocated.unwrap_or(0)),
                human_bytes(r.reserved.unwrap_or(0))
            )),
            None => o.push_str(&format!(" | {} (no answer)", name(s, i))),
        }
    }
    if t.per_source.len() > 1 {
        o.push_str(&format!(
            " | total res {}",
            human_bytes(t.total.reserved.unwrap_or(0))
        ));
    }
    o
}

pub fn watch(a: WatchArgs) -> Result<ExitCode, UserError> {
    let cfg = WatchConfig {
        urls: a.urls.iter().map(|u| u.trim().to_string()).collect(),
        interval: duration("--interval", &a.interval)?,
        duration: a
            .duration
            .as_deref()
            .map(|d| duration("-z", d))
            .transpose()?,
        metric_rules: a
            .metric
            .iter()
            .map(|m| parse_metric_rule(m).map_err(|e| UserError(anyhow!(e))))
            .collect::<Result<_, _>>()?,
        timeout: duration("--timeout", &a.timeout)?,
    };
    if let Some(p) = &a.out {
        vramroom_alloc::output::probe_file(p)
            .map_err(|e| anyhow!("--out {}: cannot write there: {e}", p.display()))?;
    }
    let stop = stop_on_ctrl_c();
    let quiet = a.quiet;
    let r = run_watch(&cfg, stop, |t, s| {
        if !quiet {
            eprintln!("{}", line(t, s));
        }
    })
    .map_err(le)?;
    let json = serde_json::to_string_pretty(&r).map_err(|e| anyhow!("JSON: {e}"))?;
    if let Some(p) = &a.out {
        vramroom_alloc::output::write_file(p, json.as_bytes())
            .map_err(|e| anyhow!("--out {}: {e}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if a.json {
        println!("{json}");
    } else {
        for (i, s) in r.sources.iter().enumerate() {
            println!(
                "{:<8} {}  peak allocated {}  peak reserved {}  capacity {}  OOMs {}  ({} samples, {} failed)",
                name(s, i),
                s.url,
                human_bytes(s.peak_allocated_bytes),
                human_bytes(s.peak_reserved_bytes),
                s.capacity_bytes.map(human_bytes).unwrap_or_else(|| "unknown".into()),
                s.ooms,
                s.samples,
                s.failures
            );
        }
        if r.sources.len() > 1 {
            println!(
                "total    peak reserved {}  peak allocated {} (summed at each tick)",
                human_bytes(r.peak_total_reserved_bytes),
                human_bytes(r.peak_total_allocated_bytes)
            );
        }
    }
    Ok(if r.stop_reason == "cancelled" {
        ExitCode::from(EXIT_CANCELLED)
    } else {
        ExitCode::SUCCESS
    })
}
