//! `vramroom replay`, `vramroom summary`, `vramroom bench alloc`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use vramroom_alloc::size::{human_bytes, parse_size};
use vramroom_alloc::AllocatorConfig;
use vramroom_trace::{
    min_capacity, read_snapshot_file, replay as run_replay, ReplayOptions, ReplayResult,
};

use crate::error::UserError;
use crate::table::{cell, print_rows};

#[derive(Args)]
pub struct ReplayArgs {
    /// A snapshot pickle from `torch.cuda.memory._dump_snapshot()` (or an RMM CSV log).
    /// Several snapshots, or a folder of them (one per rank of a multi-GPU job), or one
    /// snapshot with several devices' traces: a table with a row per rank and device, the
    /// imbalance, and (with --min-capacity) each rank's minimum capacity.
    #[arg(required = true, value_name = "SNAPSHOT")]
    snapshots: Vec<PathBuf>,
    /// Allocator config in PYTORCH_CUDA_ALLOC_CONF syntax; repeat for a side-by-side table.
    /// "" or "default" is PyTorch's default. Without it: $PYTORCH_CUDA_ALLOC_CONF when set,
    /// else the snapshot's own config.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    alloc_conf: Vec<String>,
    /// Simulated GPU capacity, e.g. 80GiB, 24GB, 4096 (bytes). Default: the H200 of the
    /// reference traces (139.80 GiB).
    #[arg(long, value_name = "SIZE")]
    capacity: Option<String>,
    /// Also search (by bisection, to 2 MiB) for the smallest GPU on which the trace runs
    /// without OOM; the table prints it exactly (e.g. 3076 MiB), so `--capacity` with it never OOMs.
    #[arg(long)]
    min_capacity: bool,
    /// Print a JSON array, one object per config.
    #[arg(long)]
    json: bool,
    /// Write Vramroom's own snapshot of the (first config's) replay here, as a pickle that
    /// pytorch.org/memory_viz opens.
    #[arg(long, value_name = "PATH")]
    snapshot_out: Option<PathBuf>,
    /// Write the replay's allocations as an RMM-style CSV log here.
    #[arg(long, value_name = "PATH")]
    rmm_out: Option<PathBuf>,
    /// Replay under the snapshot's own config and a set of candidate configs (or the
    /// `--alloc-conf` list), and recommend the one with the lowest peak reserved that does
    /// not OOM.
    #[arg(long)]
    recommend: bool,
    /// The tracer's evidence (`vramroom trace` writes SNAPSHOT.evidence.json beside the
    /// snapshot): diagnose the traced program (the first config's replay) and print its
    /// findings, each with the file:line of the user's code (`findings` in --json).
    #[arg(long, value_name = "FILE")]
    evidence: Option<PathBuf>,
    /// Place every cudaMalloc with the driver model, as for a traced snapshot, ignoring the
    /// recorded addresses: measures the model on real snapshots
    /// (scripts/trace_corpus/va_replay.py). Hidden: an experiment, not a user's question.
    #[arg(long, hide = true)]
    ignore_recorded_addresses: bool,
}

pub use vramroom_trace::recommend::{recommended, CANDIDATE_CONFS};

#[derive(Args)]
pub struct SummaryArgs {
    /// A snapshot pickle from `torch.cuda.memory._dump_snapshot()` (or an RMM CSV log).
    snapshot: PathBuf,
    /// Allocator config in PYTORCH_CUDA_ALLOC_CONF syntax. Default: $PYTORCH_CUDA_ALLOC_CONF
    /// when set, else the snapshot's own config.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    alloc_conf: Option<String>,
    /// Simulated GPU capacity, e.g. 80GiB. Default: the recording's GPU.
    #[arg(long, value_name = "SIZE")]
    capacity: Option<String>,
    /// The short form, without the per-pool rows.
    #[arg(long)]
    abbreviated: bool,
}

#[derive(Args)]
pub struct BenchAllocArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Fewer iterations (for a smoke run).
    #[arg(long)]
    quick: bool,
    /// PyTorch's own figures (the `microbench` object of a results JSON) to print beside
    /// ours. Default: ../shared/spec/golden/results__default.json when it exists.
    #[arg(long, value_name = "PATH")]
    reference: Option<PathBuf>,
}

fn parse_conf(s: &str) -> Result<AllocatorConfig, UserError> {
    parse_conf_flag("--alloc-conf", s)
}

/// A config given to `flag`: "" or "default" is PyTorch's default; an error names the flag.
pub fn parse_conf_flag(flag: &str, s: &str) -> Result<AllocatorConfig, UserError> {
    let s = s.trim();
    if s.is_empty() || s == "default" {
        return Ok(AllocatorConfig::default());
    }
    AllocatorConfig::parse(s)
        .with_context(|| format!("bad {flag} '{s}'"))
        .map_err(UserError)
}

/// `PYTORCH_CUDA_ALLOC_CONF` from the environment, the default config of every command that
/// takes `--alloc-conf` (PyTorch users set their config there). `None` when unset or empty, or
/// when the flag was given (`flag_given`: flags win); when used, one line on stderr says so,
/// so a number never silently depends on the shell it was run from.
pub fn env_alloc_conf(flag_given: bool) -> Option<String> {
    let v = std::env::var("PYTORCH_CUDA_ALLOC_CONF").ok()?;
    if v.trim().is_empty() || flag_given {
        return None;
    }
    eprintln!("using PYTORCH_CUDA_ALLOC_CONF={v} from the environment (--alloc-conf overrides it)");
    Some(v)
}

/// The environment's config parsed, its error naming the variable rather than the flag.
pub fn parse_env_conf(s: &str) -> Result<AllocatorConfig, UserError> {
    AllocatorConfig::parse(s.trim())
        .with_context(|| format!("bad PYTORCH_CUDA_ALLOC_CONF '{s}' in the environment"))
        .map_err(UserError)
}

/// `n` bytes exactly, in the largest unit that divides them (`3076 MiB`, `80 GiB`): a figure
/// a user passes back as `--capacity` (the minimum capacity) must be the true value, and
/// [`human_bytes`]' two decimals are not (3.0039 GiB prints as "3.00 GiB", which OOMs, and
/// a rounded-up "3.01 GiB" is not a whole number of bytes, which `--capacity` refuses).
pub fn human_bytes_exact(n: u64) -> String {
    for (unit, shift) in [
        ("PiB", 50),
        ("TiB", 40),
        ("GiB", 30),
        ("MiB", 20),
        ("KiB", 10),
    ] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} B")
}

/// `--capacity`; none: the trace's own (see `ReplayOptions::capacity`).
fn parse_capacity(s: Option<&str>) -> Result<Option<u64>, UserError> {
    match s {
        None => Ok(None),
        Some(s) => {
            let v = parse_size(s).with_context(|| format!("bad --capacity '{s}'"))?;
            if v == 0 {
                return Err(UserError(anyhow::anyhow!(
                    "bad --capacity '{s}': must be greater than 0"
                )));
            }
            Ok(Some(v))
        }
    }
}

/// The config's name in the table and the JSON: what is in force, so a snapshot whose
/// settings fields differ from its conf string is not labelled by the string alone.
fn label(conf: &AllocatorConfig) -> String {
    let s = conf.conf_string();
    if s.trim().is_empty() {
        "default".into()
    } else {
        s
    }
}

pub fn replay(a: ReplayArgs) -> Result<ExitCode, UserError> {
    let capacity = parse_capacity(a.capacity.as_deref())?;
    // Outputs are checked before the replays (a --min-capacity search takes a while).
    if let Some(p) = &a.snapshot_out {
        crate::run_cmd::check_out_file("--snapshot-out", p)?;
    }
    if let Some(p) = &a.rmm_out {
        crate::run_cmd::check_out_file("--rmm-out", p)?;
    }
    let files = crate::replay_ranks::expand(&a.snapshots)?;
    let mut loaded = None;
    if files.len() == 1 {
        let snap = load_trace(&files[0])?;
        if vramroom_trace::traced_devices(&snap).len() <= 1 {
            loaded = Some(snap);
        }
    }
    let Some(snap) = loaded else {
        return replay_ranks(&a, &files);
    };
    let snapshot_path = &files[0];
    let own = AllocatorConfig::from_settings(&snap.allocator_settings)
        .context("the snapshot's allocator_settings")?;
    let env = env_alloc_conf(!a.alloc_conf.is_empty());
    let mut configs: Vec<AllocatorConfig> = match (&env, a.alloc_conf.is_empty()) {
        (Some(e), true) if !a.recommend => vec![parse_env_conf(e)?],
        (_, true) => vec![own.clone()],
        (_, false) => a
            .alloc_conf
            .iter()
            .map(|c| parse_conf(c))
            .collect::<Result<_, _>>()?,
    };
    if a.recommend {
        if !a.alloc_conf.is_empty() {
            configs.insert(0, own);
        } else {
            // The environment's config is one more candidate, right after the snapshot's own.
            if let Some(e) = &env {
                configs.push(parse_env_conf(e)?);
            }
            for c in CANDIDATE_CONFS {
                configs.push(parse_conf(c)?);
            }
        }
        // The same config twice (the snapshot's own is usually the default) is one row.
        let mut seen = Vec::new();
        configs.retain(|c| {
            let l = label(c);
            let new = !seen.contains(&l);
            seen.push(l);
            new
        });
    }
    let bar = (a.min_capacity && !a.json)
        .then(|| crate::progress::spinner("searching for the minimum capacity"));
    let mut results: Vec<(String, ReplayResult)> = Vec::new();
    let want_snapshot = a.snapshot_out.is_some() || a.rmm_out.is_some();
    for (i, conf) in configs.iter().enumerate() {
        let opts = ReplayOptions {
            config: conf.clone(),
            capacity,
            stop_at_oom: true,
            record_history: want_snapshot && i == 0,
            ignore_recorded_addresses: a.ignore_recorded_addresses,
            ..ReplayOptions::default()
        };
        let mut r = run_replay(&snap, &opts)?;
        if a.min_capacity {
            if let Some(pb) = &bar {
                pb.set_message(crate::progress::fitted(
                    &format!("minimum capacity under {}", cell(&label(conf))),
                    crate::progress::SPINNER_PREFIX_COLS,
                ));
            }
            r.min_capacity_bytes = Some(min_capacity(&snap, &opts)?);
        }
        results.push((label(conf), r));
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    if let Some(s) = results.first().and_then(|r| r.1.snapshot.as_ref()) {
        if let Some(p) = &a.snapshot_out {
            vramroom_trace::write_snapshot_file(s, p)
                .with_context(|| format!("cannot write {}", p.display()))?;
        }
        if let Some(p) = &a.rmm_out {
            let csv = vramroom_trace::write_rmm_csv(&vramroom_trace::rmm_from_snapshot(s));
            write_atomic(p, csv.as_bytes())?;
        }
    }
    let findings =
        crate::replay_findings::findings(a.evidence.as_deref(), &snap, &configs[0], capacity)?;
    let pick = if a.recommend {
        recommended(&results)
    } else {
        None
    };
    if a.json {
        let arr: Vec<serde_json::Value> = results
            .iter()
            .enumerate()
            .map(|(i, (l, r))| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("alloc_conf".into(), serde_json::Value::String(l.clone()));
                    o.insert(
                        "snapshot".into(),
                        snapshot_path.display().to_string().into(),
                    );
                    if a.recommend {
                        o.insert("recommended".into(), (pick == Some(i)).into());
                    }
                    if let (0, Some(f)) = (i, &findings) {
                        o.insert(
                            "findings".into(),
                            serde_json::to_value(f).unwrap_or_default(),
                        );
                    }
                }
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&arr).unwrap_or_default());
    } else {
        let shown = results.first().map_or(0, |r| r.1.capacity_bytes);
        print_table(snapshot_path, shown, &results);
        crate::replay_findings::print(findings.as_deref());
        if a.recommend {
            match pick {
                Some(i) => {
                    let (l, r) = &results[i];
                    let base = results[0].1.peak_reserved_bytes.max(1);
                    println!(
                        "\nrecommended: PYTORCH_CUDA_ALLOC_CONF={} (peak reserved {}, {:.1}% below the snapshot's own config {})",
                        if l == "default" { "\"\"".to_string() } else { cell(l) },
                        human_bytes(r.peak_reserved_bytes),
                        100.0 * (1.0 - r.peak_reserved_bytes as f64 / base as f64),
                        cell(&results[0].0)
                    );
                }
                None => println!("\nno config runs this trace without an OOM on this device"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Several ranks (or devices): one table with a row each. The flags that write one
/// replay's files or pick one config are for a single snapshot.
fn replay_ranks(a: &ReplayArgs, files: &[PathBuf]) -> Result<ExitCode, UserError> {
    for (set, flag) in [
        (a.snapshot_out.is_some(), "--snapshot-out"),
        (a.rmm_out.is_some(), "--rmm-out"),
        (a.recommend, "--recommend"),
        (a.evidence.is_some(), "--evidence"),
    ] {
        if set {
            return Err(anyhow::anyhow!(
                "{flag} takes one snapshot of one device; replay each rank on its own for it"
            )
            .into());
        }
    }
    let configs = a
        .alloc_conf
        .iter()
        .map(|c| {
            let conf = parse_conf(c)?;
            Ok((label(&conf), conf))
        })
        .collect::<Result<Vec<_>, UserError>>()?;
    crate::replay_ranks::run(
        crate::replay_ranks::RankArgs {
            configs,
            capacity: parse_capacity(a.capacity.as_deref())?,
            min_capacity: a.min_capacity,
            json: a.json,
            files,
        },
        load_trace,
    )
}

fn print_table(path: &std::path::Path, capacity: u64, results: &[(String, ReplayResult)]) {
    println!(
        "replay of {} ({} events) on a {} device",
        path.display(),
        results.first().map(|r| r.1.events).unwrap_or(0),
        human_bytes(capacity)
    );
    let has_min = results.iter().any(|r| r.1.min_capacity_bytes.is_some());
    let mut header = vec![
        "alloc_conf",
        "peak allocated",
        "peak reserved",
        "reserved/alloc",
        "device allocs",
        "retries",
        "OOMs",
        "OOM at event",
    ];
    if has_min {
        header.push("min capacity");
    }
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|(l, r)| {
            let mut row = vec![
                l.clone(),
                human_bytes(r.peak_allocated_bytes),
                human_bytes(r.peak_reserved_bytes),
                if r.peak_allocated_bytes > 0 {
                    format!(
                        "{:.2}x",
                        r.peak_reserved_bytes as f64 / r.peak_allocated_bytes as f64
                    )
                } else {
                    "-".into()
                },
                r.segment_allocs.to_string(),
                r.num_alloc_retries.to_string(),
                r.num_ooms.to_string(),
                r.oom_event
                    .map(|i| i.to_string())
                    .unwrap_or_else(|| "-".into()),
            ];
            if has_min {
                row.push(
                    r.min_capacity_bytes
                        .map(human_bytes_exact)
                        .unwrap_or_else(|| "-".into()),
                );
            }
            row
        })
        .collect();
    print_rows(&header, &rows);
    for (l, r) in results {
        let l = cell(l);
        if let Some(o) = &r.oom {
            println!(
                "\n[{l}] OOM at event {} (alloc of {} bytes): {}",
                o.event_index, o.requested_bytes, o.message
            );
            println!(
                "[{l}] state at the OOM: {} allocated, {} reserved in {} segments, largest free block {}",
                human_bytes(o.allocated_bytes),
                human_bytes(o.reserved_bytes),
                o.segments,
                human_bytes(o.largest_free_block)
            );
        }
        if r.workspace_fallbacks > 0 {
            println!(
                "[{l}] {} cuDNN convolution(s) could not get their workspace and ran a plan that needs none, as PyTorch does (the OOMs column counts those attempts)",
                r.workspace_fallbacks
            );
        }
        if r.initial_live_blocks > 0 {
            println!(
                "[{l}] {} blocks were live before the recording began; rebuilt at their offsets ({} reserved at start)",
                r.initial_live_blocks,
                human_bytes(r.initial_reserved_bytes)
            );
        }
    }
}

/// A snapshot pickle, or an RMM CSV log (by extension `.csv`).
fn load_trace(path: &std::path::Path) -> Result<vramroom_trace::Snapshot, UserError> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
    {
        let text = vramroom_alloc::input::read_text(path, vramroom_alloc::input::Limit::RMM_LOG)
            .map_err(|e| anyhow::anyhow!("cannot read RMM log {e}"))?;
        let events = vramroom_trace::read_rmm_csv(&text)
            .with_context(|| format!("cannot read RMM log {}", path.display()))?;
        return Ok(vramroom_trace::snapshot_from_rmm(&events));
    }
    Ok(read_snapshot_file(path)
        .with_context(|| format!("cannot read snapshot {}", path.display()))?)
}

/// Write by `output::write_file`'s rules: a regular file through a temporary file (a
/// failure never leaves a partial file), a device or FIFO written into, never replaced.
fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<(), UserError> {
    vramroom_alloc::output::write_file(path, bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

pub fn summary(a: SummaryArgs) -> Result<ExitCode, UserError> {
    let snap = load_trace(&a.snapshot)?;
    let config = match (&a.alloc_conf, env_alloc_conf(a.alloc_conf.is_some())) {
        (Some(c), _) => parse_conf(c)?,
        (None, Some(e)) => parse_env_conf(&e)?,
        (None, None) => AllocatorConfig::from_settings(&snap.allocator_settings)
            .context("the snapshot's allocator_settings")?,
    };
    let opts = ReplayOptions {
        config,
        capacity: parse_capacity(a.capacity.as_deref())?,
        stop_at_oom: true,
        record_history: false,
        ..ReplayOptions::default()
    };
    let r = run_replay(&snap, &opts)?;
    let stats = vramroom_alloc::DeviceStats::from_memory_stats(&r.stats);
    print!(
        "{}",
        vramroom_alloc::summary::memory_summary(&stats, 0, a.abbreviated)
    );
    Ok(ExitCode::SUCCESS)
}

pub fn bench_alloc(a: BenchAllocArgs) -> Result<ExitCode, UserError> {
    use vramroom_alloc::bench;
    let reference = match &a.reference {
        Some(p) => Some(
            vramroom_alloc::input::read_text(p, vramroom_alloc::input::Limit::RESULTS)
                .map_err(|e| anyhow::anyhow!("--reference {e}"))?,
        ),
        None => std::fs::read_to_string("../shared/spec/golden/results__default.json").ok(),
    };
    let reference: Option<serde_json::Value> = match reference {
        Some(text) => Some(serde_json::from_str(&text).context("bad --reference JSON")?),
        None => None,
    };
    let opts = bench::BenchOptions::new(a.quick);
    let pb = (!a.json).then(|| {
        crate::progress::spinner("timing malloc+free pairs (Vramroom, then the system allocator)")
    });
    // An H200-sized simulated device: the 4096-block mixed set holds about 33 GB.
    let mut ours = bench::run_alloc_bench(
        || {
            vramroom_alloc::CachingAllocator::new(
                vramroom_alloc::SimDevice::new(vramroom_trace::replay::DEFAULT_CAPACITY),
                AllocatorConfig::default(),
            )
        },
        &opts,
    )
    .map_err(|e| UserError(anyhow::anyhow!("benchmark failed: {e}")))?;
    let system = bench::run_system_bench(&opts)
        .map_err(|e| UserError(anyhow::anyhow!("benchmark failed: {e}")))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if let Some(r) = &reference {
        bench::attach_pytorch_reference(&mut ours, |k| r["microbench"][k].as_f64());
    }
    if a.json {
        let v = serde_json::json!({ "vramroom": ours, "system": system });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("ns per malloc+free pair; pytorch = PyTorch 2.11 C++ raw_alloc/raw_delete on the H200 host");
        print!("{}", bench::format_table(&ours, Some(&system)));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_capacity_figures_read_back_exactly() {
        // Multiples of 2 MiB (min_capacity's step) and arbitrary sizes, across units.
        let mut cases: Vec<u64> = (1..3000u64).map(|k| k * (2 << 20)).collect();
        cases.extend([
            1,
            1023,
            1024,
            1025,
            3 * (1 << 30) + 4 * (1 << 20),
            u64::MAX / 2,
        ]);
        cases.extend((0..2000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20));
        for n in cases {
            let shown = human_bytes_exact(n);
            assert_eq!(parse_size(&shown).unwrap(), n, "{n} printed as {shown}");
        }
        // The case: 3.0039 GiB is not "3.00 GiB".
        assert_eq!(human_bytes_exact(3 * (1 << 30) + 4 * (1 << 20)), "3076 MiB");
        assert_eq!(human_bytes_exact(80 << 30), "80 GiB");
    }
}
