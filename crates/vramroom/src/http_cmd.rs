//! `vramroom http URL`: load any HTTP endpoint, with the service's memory on the same
//! timeline; and `vramroom bench http`: Vramroom's client against wrk or oha.
//!
//! Flags follow oha, wrk2 and k6: `-c` workers (closed model) or `-q` rate (open model,
//! `--arrival constant|poisson`), `-n`, `-z`, `--stages 4:10s,16:20s` or
//! `--stages 100/s:10s,400/s:20s`, `-m`, `-H`, `-d`, `--timeout`, `--threshold` (a broken one
//! exits 99). As `vramroom loadtest` does, everything the user typed is checked before the
//! run and before any file exists — a bad flag, a dead URL, a refused connection, a metrics
//! endpoint that does not answer Prometheus text: one line, exit 2, nothing written.
//! Ctrl-C stops the load and what was measured is still written (exit 130).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use clap::Args;
use vramroom_alloc::size::human_bytes;
use vramroom_load::http::body::BodySpec;
use vramroom_load::http::load::{
    parse_http_stages, parse_rate, Arrival, Stage, StageLoad, DEFAULT_MAX_CONNECTIONS,
    MAX_CONCURRENCY,
};
use vramroom_load::http::peer as peer_client;
use vramroom_load::http::predict::{PredictOptions, ServicePrediction, DEFAULT_RAMP};
use vramroom_load::http::prometheus::parse_metric_rule;
use vramroom_load::http::server::TestServer;
use vramroom_load::http::HttpConfig;
use vramroom_load::{parse_thresholds, NvmlDevice, Progress};

use crate::error::UserError;
use crate::run_cmd::{
    check_out_dir, discard_out_dir, duration, finish, le, load_fraction, progress_bar,
    stop_on_ctrl_c,
};

/// Workers of the closed model when neither `-c` nor `--stages` says.
const DEFAULT_CONCURRENCY: usize = 10;
/// `--predict`'s gentle load when the user sets none: two workers for 20 s, enough requests
/// to sample the service's sizes, far below any OOM point worth predicting.
const PREDICT_CONCURRENCY: usize = 2;
const PREDICT_SECONDS: u64 = 20;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
    vramroom http http://127.0.0.1:8000/v1/infer -c 8 -z 30s\n  \
    vramroom http http://127.0.0.1:8000/v1/infer -q 200 --arrival poisson -z 1m \\\n      \
        -d '{\"prompt\": \"{{tokens 16..512}}\"}' --metrics-url http://127.0.0.1:8000/metrics\n  \
    vramroom http http://10.0.0.5/generate --stages 4:10s,16:20s,64:20s --threshold 'p99<500ms'\n\n\
Body templates (-d): {{seq}}, {{rand_int A B}}, {{tokens A..B}}, {{rand_ints A..B MIN MAX}},\n{{choice a,b,c}}, {{uuid}};\n\
\\{{ is a literal {{. Size distributions (--body-size): N, uniform:A..B, choice:a,b,c,\n\
normal:MEAN,SD (sizes like 512, 4KiB).\n\n\
Latency is corrected for coordinated omission: in the open model (-q) from each request's\n\
intended send time; in the closed model (-c) with HdrHistogram's expected-interval\n\
correction (each stage's median latency as the interval). 503 answers are load shedding:\n\
counted apart, not as errors.")]
pub struct HttpArgs {
    /// The endpoint: http://host:port/path (plain HTTP/1.1).
    url: String,
    /// Closed model: concurrent workers (default 10). Open model (-q): the most
    /// connections, i.e. requests in flight (default 256).
    #[arg(short = 'c', long = "concurrency", value_name = "N")]
    concurrency: Option<usize>,
    /// Open model: requests per second (100, 100/s, 6000/m), sent on a schedule whatever
    /// the service does.
    #[arg(short = 'q', long = "rate", value_name = "RATE")]
    rate: Option<String>,
    /// Open model inter-arrival times: constant or poisson.
    #[arg(long, default_value = "constant", value_name = "KIND")]
    arrival: String,
    /// Stop after this many requests (with -z or --stages: whichever comes first).
    #[arg(short = 'n', long = "requests", value_name = "N")]
    requests: Option<u64>,
    /// Duration of the run (10s, 500ms, 1m). Default 10s unless -n is given.
    #[arg(short = 'z', long = "duration", value_name = "DURATION")]
    duration: Option<String>,
    /// k6-style stages, workers or rates: 4:10s,16:20s or 100/s:10s,400/s:20s.
    #[arg(long, value_name = "SPEC", conflicts_with_all = ["concurrency", "rate"])]
    stages: Option<String>,
    /// HTTP method. Default GET, or POST when a body is given.
    #[arg(short = 'm', long, value_name = "METHOD")]
    method: Option<String>,
    /// A request header 'Name: value' (repeatable).
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    header: Vec<String>,
    /// Request body template, with placeholders (see below).
    #[arg(short = 'd', long = "body", value_name = "TEMPLATE")]
    body: Option<String>,
    /// Request body from a file (with --body-size: repeated or cut to the drawn size).
    #[arg(long = "body-file", value_name = "PATH")]
    body_file: Option<PathBuf>,
    /// Request bodies from the files of a folder (with --body-size: the nearest size).
    #[arg(long = "body-dir", value_name = "DIR")]
    body_dir: Option<PathBuf>,
    /// Body size distribution: 512, uniform:16..1KiB, choice:64,4KiB, normal:1KiB,200.
    #[arg(long = "body-size", value_name = "DIST")]
    body_size: Option<String>,
    /// Seed of the body and arrival draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A request with no complete answer by then is an error.
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    timeout: String,
    /// Client threads (default: one per core).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// A Prometheus endpoint with the service's memory (vramroom serve, vramroom.probe,
    /// DCGM exporter, Triton, or any with --metric). Repeat it for the ranks of a job (one
    /// probe port each): all are scraped and summed onto one timeline; the first one's
    /// snapshot is fetched.
    #[arg(long = "metrics-url", value_name = "URL")]
    metrics_url: Vec<String>,
    /// How often to scrape it (and to sample NVML).
    #[arg(
        long = "metrics-interval",
        default_value = "250ms",
        value_name = "DURATION"
    )]
    metrics_interval: String,
    /// Map a metric to memory: TARGET=NAME{label="v"}[*SCALE], e.g.
    /// allocated=vllm_gpu_bytes{gpu="0"} or device_used=fb_used_mib*MiB. Targets:
    /// allocated, reserved, active, inactive_split, max_allocated, max_reserved,
    /// process_used, device_used, capacity, num_ooms, device_free.
    #[arg(long = "metric", value_name = "RULE")]
    metric: Vec<String>,
    /// NVML device index to sample (nvidia-smi's numbering).
    #[arg(long = "nvml-device", default_value_t = 0, value_name = "N")]
    nvml_device: u32,
    /// The service's process id, for NVML's per-process bytes. Default: the process that
    /// listens on the URL's port, when the URL is on this machine.
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// Do not sample NVML.
    #[arg(long = "no-nvml")]
    no_nvml: bool,
    /// Do not fetch the probe's snapshots at the end.
    #[arg(long = "no-probe")]
    no_probe: bool,
    /// The most bytes of the probe's snapshot pickles to read (they stream in with this
    /// cap; a larger one is skipped with a note). Default 512MiB.
    #[arg(long = "max-snapshot-size", value_name = "SIZE")]
    max_snapshot_size: Option<String>,
    /// Extra allocator configs to replay the probe's trace under. Default:
    /// $PYTORCH_CUDA_ALLOC_CONF when set.
    #[arg(long = "what-if", value_name = "CONF")]
    what_if: Vec<String>,
    /// Predict, from this run's probe trace, the concurrency at which the service runs out
    /// of memory on its real capacity (per device; under its config and each --what-if),
    /// and the input-size cap that keeps --target-concurrency safe. The load stays at what
    /// -c/-q/--stages say (default: -c 2 for 20s): keep it gentle, well below the OOM point.
    #[arg(long)]
    predict: bool,
    /// With --predict: the concurrency the size cap must keep safe (default: twice the
    /// run's load).
    #[arg(long = "target-concurrency", value_name = "N", requires = "predict")]
    target_concurrency: Option<u32>,
    /// With --predict: simulated runs per concurrency (which recorded requests meet).
    #[arg(long = "predict-seeds", default_value_t = 5, value_name = "N")]
    predict_seeds: u64,
    /// Ramp the load (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, ... workers, --step-duration each,
    /// or --stages) and stop at the first OOM: an answer naming a CUDA OOM or the
    /// service's OOM counter rising. Reports the observed OOM concurrency.
    #[arg(long = "ramp-until-oom", conflicts_with_all = ["concurrency", "rate", "predict"])]
    ramp_until_oom: bool,
    /// With --ramp-until-oom: how long each load step runs.
    #[arg(long = "step-duration", default_value = "6s", value_name = "DURATION")]
    step_duration: String,
    /// With --ramp-until-oom: the results.json of an earlier `--predict` run, to compare
    /// the observed OOM concurrency with its prediction.
    #[arg(
        long = "predicted-from",
        value_name = "RESULTS_JSON",
        requires = "ramp_until_oom"
    )]
    predicted_from: Option<PathBuf>,
    /// k6-style threshold, repeatable: 'p99<200ms', 'error_rate<1%', 'shed_rate<0.2',
    /// 'peak_reserved<60GiB', 'oom_count==0'. A broken one makes the run exit 99.
    #[arg(long = "threshold", value_name = "EXPR")]
    threshold: Vec<String>,
    /// Folder for report.html, results.json and the probe's snapshots (created, and checked
    /// with a probe file, before the run; the files are written after it).
    #[arg(long, default_value = "out/http", value_name = "DIR")]
    out: PathBuf,
    /// Print the results as JSON on stdout instead of the summary table.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn stages(a: &HttpArgs) -> Result<(Vec<Stage>, bool), UserError> {
    if a.concurrency == Some(0) {
        return Err(anyhow!("-c must be at least 1").into());
    }
    if a.concurrency.is_some_and(|c| c > MAX_CONCURRENCY) {
        return Err(anyhow!("-c must be at most {MAX_CONCURRENCY}").into());
    }
    if a.requests == Some(0) {
        return Err(anyhow!("-n must be at least 1").into());
    }
    if a.ramp_until_oom && a.stages.is_none() {
        if a.duration.is_some() {
            return Err(anyhow!(
                "--ramp-until-oom sets its own durations (--step-duration): drop -z"
            )
            .into());
        }
        let d = duration("--step-duration", &a.step_duration)?;
        let v = DEFAULT_RAMP
            .iter()
            .map(|&c| Stage::held(StageLoad::Workers(c as usize), Some(d)))
            .collect();
        return Ok((v, false));
    }
    if let Some(s) = &a.stages {
        if a.duration.is_some() {
            return Err(anyhow!("--stages sets its own durations: drop -z").into());
        }
        let v = parse_http_stages(s).map_err(le)?;
        let open = matches!(v[0].target, StageLoad::Rate(_));
        return Ok((v, open));
    }
    let d = match (&a.duration, a.requests) {
        (Some(d), _) => Some(duration("-z", d)?),
        (None, Some(_)) => None,
        (None, None) if a.predict => Some(Duration::from_secs(PREDICT_SECONDS)),
        (None, None) => Some(Duration::from_secs(10)),
    };
    let (load, open) = match &a.rate {
        Some(q) => (
            StageLoad::Rate(parse_rate(q).map_err(|m| anyhow!("bad -q {q:?}: {m}"))?),
            true,
        ),
        None => (
            StageLoad::Workers(a.concurrency.unwrap_or(if a.predict {
                PREDICT_CONCURRENCY
            } else {
                DEFAULT_CONCURRENCY
            })),
            false,
        ),
    };
    Ok((vec![Stage::held(load, d)], open))
}

/// Everything the user typed, checked, as the engine's config. No file is touched and
/// nothing is sent.
fn config(a: &HttpArgs) -> Result<HttpConfig, UserError> {
    let mut c = HttpConfig::new(a.url.trim());
    let (st, open) = stages(a)?;
    c.stages = st;
    c.max_requests = a.requests;
    if open {
        c.max_connections = a.concurrency.unwrap_or(DEFAULT_MAX_CONNECTIONS);
    }
    c.arrival = a.arrival.parse::<Arrival>().map_err(le)?;
    c.method = a.method.clone();
    c.headers = a.header.clone();
    c.body = BodySpec {
        template: a.body.clone(),
        file: a.body_file.clone(),
        dir: a.body_dir.clone(),
        size: a.body_size.clone(),
        seed: a.seed,
    };
    c.seed = a.seed;
    c.timeout = duration("--timeout", &a.timeout)?;
    if let Some(t) = a.threads {
        if t == 0 || t > 1024 {
            return Err(anyhow!("--threads must be 1..=1024").into());
        }
        c.threads = t;
    }
    c.metrics_url = a.metrics_url.first().cloned();
    c.more_metrics_urls = a.metrics_url.iter().skip(1).cloned().collect();
    c.metrics_interval = duration("--metrics-interval", &a.metrics_interval)?;
    c.metric_rules = a
        .metric
        .iter()
        .map(|m| parse_metric_rule(m).map_err(|e| UserError(anyhow!(e))))
        .collect::<Result<_, _>>()?;
    if !a.metric.is_empty() && a.metrics_url.is_empty() {
        return Err(anyhow!("--metric maps names of --metrics-url: give one").into());
    }
    if !a.no_nvml {
        c.nvml = Some(NvmlDevice::Index(a.nvml_device));
        c.pid = a
            .pid
            .or_else(|| vramroom_load::http::listener::listener_pid(&a.url));
    }
    c.probe = !a.no_probe;
    c.what_if.extend(a.what_if.iter().cloned());
    // The service's own config is the service's; the shell's PYTORCH_CUDA_ALLOC_CONF is the
    // config to compare it with, when no --what-if names one.
    if let Some(e) = crate::replay_cmd::env_alloc_conf(!a.what_if.is_empty()) {
        crate::replay_cmd::parse_env_conf(&e)?;
        c.what_if.push(e);
    }
    c.thresholds = parse_thresholds(&a.threshold).map_err(le)?;
    if a.predict {
        if a.metrics_url.is_empty() || a.no_probe {
            return Err(anyhow!(
                "--predict needs the probe's trace: give --metrics-url of a vramroom.probe endpoint (and no --no-probe)"
            )
            .into());
        }
        if a.predict_seeds == 0 || a.predict_seeds > 100 {
            return Err(anyhow!("--predict-seeds must be 1..=100").into());
        }
        if a.target_concurrency == Some(0) {
            return Err(anyhow!("--target-concurrency must be at least 1").into());
        }
        c.predict = Some(PredictOptions {
            target_concurrency: a.target_concurrency,
            seeds: a.predict_seeds,
            ..Default::default()
        });
    }
    c.stop_at_first_oom = a.ramp_until_oom;
    c.validate().map_err(le)?;
    Ok(c)
}

fn progress_message(p: &Progress) -> String {
    let load = match p.rate_per_s {
        Some(q) => format!("q={q}/s in flight {}", p.in_flight),
        None => format!("c={}", p.concurrency),
    };
    let mem = if p.allocated_bytes > 0 || p.reserved_bytes > 0 {
        format!(
            " | alloc {} | reserved {}{}",
            human_bytes(p.allocated_bytes),
            human_bytes(p.reserved_bytes),
            if p.capacity_bytes > 0 {
                format!(" of {}", human_bytes(p.capacity_bytes))
            } else {
                String::new()
            }
        )
    } else {
        String::new()
    };
    format!(
        "stage {}/{} {load} | {} done | {} shed | {} err{mem}",
        p.stage + 1,
        p.stages.max(p.stage + 1),
        p.requests_done,
        p.shed,
        p.errors
    )
}

fn position(p: &Progress) -> u64 {
    let f = load_fraction(p);
    (f * 1000.0) as u64
}

/// The prediction in an earlier `--predict` run's results.json.
fn read_prediction(p: &Path) -> Result<ServicePrediction, UserError> {
    let text = vramroom_alloc::input::read_text(p, vramroom_alloc::input::Limit::RESULTS)
        .map_err(|e| anyhow!("--predicted-from {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow!("--predicted-from {}: not JSON: {e}", p.display()))?;
    let pred = v
        .get("http")
        .and_then(|h| h.get("prediction"))
        .cloned()
        .ok_or_else(|| {
            anyhow!(
                "--predicted-from {}: no http.prediction in it (was it written by `vramroom http --predict`?)",
                p.display()
            )
        })?;
    serde_json::from_value(pred)
        .map_err(|e| anyhow!("--predicted-from {}: http.prediction: {e}", p.display()).into())
}

pub fn http(a: HttpArgs) -> Result<ExitCode, UserError> {
    let cfg = config(&a)?;
    if let Some(s) = &a.max_snapshot_size {
        let n = vramroom_alloc::size::parse_size(s)
            .with_context(|| format!("bad --max-snapshot-size {s:?}"))?;
        vramroom_load::http::limits::set_snapshot_bytes(n);
    }
    let earlier = a
        .predicted_from
        .as_deref()
        .map(read_prediction)
        .transpose()?;
    let created = check_out_dir(&a.out)?;
    let stop = stop_on_ctrl_c();
    let pb = progress_bar(a.quiet);
    let result = vramroom_load::http::run(&cfg, stop.clone(), |p| {
        pb.set_position(position(p));
        pb.set_message(crate::progress::fitted(
            &progress_message(p),
            crate::progress::RUN_PREFIX_COLS,
        ));
    });
    pb.finish_and_clear();
    let mut r = result.map_err(|e| {
        discard_out_dir(&created);
        le(e)
    })?;
    if let (Some(mut p), Some(h)) = (earlier, r.http.as_mut()) {
        let mut o = h
            .prediction
            .take()
            .and_then(|x| x.observed)
            .unwrap_or_default();
        o.compare(p.first_oom_concurrency);
        p.observed = Some(o);
        h.prediction = Some(p);
    }
    // The summary table says it otherwise; with --json, say once on stderr.
    if a.json && !a.quiet {
        for m in r.memory_sources.iter().filter(|m| m.status == "absent") {
            eprintln!("note: {} is absent: {}", m.name, m.note);
        }
    }

    finish(&a.out, a.json, &r)
}

// ---------------------------------------------------------------------------------------
// vramroom bench http

#[derive(Args, Debug)]
#[command(
    after_help = "Runs Vramroom's client and a peer (wrk, else oha) against the same \
    loopback target, alternately, with the same connections and duration, and prints the \
    requests per second of each and their ratio. The target is a minimal hyper server \
    started in this process (200 \"ok\"), or --url."
)]
pub struct BenchHttpArgs {
    /// Load this URL instead of the built-in server.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// Connections (workers), the same for both clients.
    #[arg(
        short = 'c',
        long = "concurrency",
        default_value_t = 64,
        value_name = "N"
    )]
    concurrency: usize,
    /// Duration of each client's run.
    #[arg(
        short = 'z',
        long = "duration",
        default_value = "3s",
        value_name = "DURATION"
    )]
    duration: String,
    /// Runs of each client, alternating; the median is compared.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// auto (wrk, else oha), wrk, oha, or none.
    #[arg(long, default_value = "auto")]
    peer: String,
    /// Threads of each client (wrk -t, Vramroom's runtime). Default: half the cores.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Threads of the built-in server. Default: half the cores.
    #[arg(long = "server-threads", value_name = "N")]
    server_threads: Option<usize>,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
}

pub fn bench_http(a: BenchHttpArgs) -> Result<ExitCode, UserError> {
    let d = duration("-z", &a.duration)?;
    if a.concurrency == 0 || a.rounds == 0 {
        return Err(anyhow!("-c and --rounds must be at least 1").into());
    }
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let threads = a.threads.unwrap_or((cores / 2).max(1));
    let server_threads = a.server_threads.unwrap_or((cores / 2).max(1));
    let (peer, peer_bin) = match a.peer.as_str() {
        "none" => ("none", None),
        "wrk" => ("wrk", peer_client::on_path("wrk")),
        "oha" => ("oha", peer_client::on_path("oha")),
        "auto" => match peer_client::on_path("wrk") {
            Some(p) => ("wrk", Some(p)),
            None => ("oha", peer_client::on_path("oha")),
        },
        o => return Err(anyhow!("unknown --peer {o:?} (expected auto, wrk, oha, none)").into()),
    };
    let server = match &a.url {
        Some(_) => None,
        None => Some(TestServer::hello(server_threads).context("starting the target server")?),
    };
    let url = match (&a.url, &server) {
        (Some(u), _) => u.clone(),
        (None, Some(s)) => s.url("/"),
        (None, None) => unreachable!("a server is started when no --url is given"),
    };
    let mut cfg = HttpConfig::new(url.clone());
    cfg.stages = vec![Stage::held(StageLoad::Workers(a.concurrency), Some(d))];
    cfg.threads = threads;
    cfg.probe = false;
    cfg.what_if.clear();
    cfg.validate().map_err(le)?;
    let peer_note = match (&peer_bin, peer) {
        (_, "none") => Some("the peer was skipped (--peer none)".to_string()),
        (None, p) => Some(format!(
            "{p} is not installed, so there is no peer to compare with \
             (apt-get install -y wrk, or cargo install oha)"
        )),
        _ => None,
    };
    if let Some(n) = &peer_note {
        eprintln!("note: {n}");
    }
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut errors = 0u64;
    for round in 0..a.rounds {
        let r =
            vramroom_load::http::run(&cfg, Arc::new(AtomicBool::new(false)), |_| {}).map_err(le)?;
        errors += r.requests.other_errors;
        ours.push(r.throughput.requests_per_s);
        if !a.json {
            eprintln!(
                "round {}: vramroom {:.0} req/s (p99 {:.2} ms)",
                round + 1,
                r.throughput.requests_per_s,
                r.latency.p99_ms
            );
        }
        if let Some(bin) = &peer_bin {
            match peer_client::run_peer(peer, bin, &url, a.concurrency, threads, d.as_secs_f64()) {
                Ok(v) => {
                    theirs.push(v);
                    if !a.json {
                        eprintln!("round {}: {peer} {v:.0} req/s", round + 1);
                    }
                }
                Err(e) => return Err(anyhow!(e).into()),
            }
        }
    }
    let ours_m = peer_client::median(&mut ours.clone());
    let theirs_m = (!theirs.is_empty()).then(|| peer_client::median(&mut theirs.clone()));
    let ratio = theirs_m.map(|t| ours_m / t.max(1e-9));
    let command = format!(
        "vramroom bench http -c {} -z {} --rounds {} --peer {} --threads {threads} --server-threads {server_threads}{}",
        a.concurrency,
        a.duration,
        a.rounds,
        peer,
        a.url.as_ref().map(|u| format!(" --url {u}")).unwrap_or_default()
    );
    if a.json {
        let v = serde_json::json!({
            "command": command,
            "target": url,
            "connections": a.concurrency,
            "duration_s": d.as_secs_f64(),
            "client_threads": threads,
            "server_threads": if a.url.is_some() { None } else { Some(server_threads) },
            "vramroom_rps": ours,
            "vramroom_rps_median": ours_m,
            "vramroom_errors": errors,
            "peer": if peer_bin.is_some() { Some(peer) } else { None },
            "peer_rps": theirs,
            "peer_rps_median": theirs_m,
            "ratio": ratio,
            "note": peer_note,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("{command}");
        println!(
            "target {url}, {} connections, {:.1}s per run, {} rounds, {threads} client thread(s){}",
            a.concurrency,
            d.as_secs_f64(),
            a.rounds,
            if a.url.is_none() {
                format!(", {server_threads} server thread(s)")
            } else {
                String::new()
            }
        );
        println!("vramroom  {ours_m:>10.0} req/s (median; errors {errors})");
        match (theirs_m, ratio) {
            (Some(t), Some(x)) => {
                println!("{peer:<8}  {t:>10.0} req/s (median)");
                println!(
                    "ratio     {:>10.3}  (vramroom / {peer}; the bar is 0.90: {})",
                    x,
                    if x >= 0.9 { "met" } else { "NOT met" }
                );
            }
            _ => println!("no peer: {}", peer_note.unwrap_or_default()),
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: HttpArgs,
    }

    fn cfg(args: &[&str]) -> Result<HttpConfig, String> {
        let t = T::try_parse_from(
            ["x", "http://127.0.0.1:9/p"]
                .into_iter()
                .chain(args.iter().copied()),
        )
        .map_err(|e| e.to_string())?;
        config(&t.a).map_err(|e| e.0.to_string())
    }

    #[test]
    fn flags_map_to_the_config() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.stages[0].target, StageLoad::Workers(DEFAULT_CONCURRENCY));
        assert_eq!(c.stages[0].duration, Some(Duration::from_secs(10)));
        let c = cfg(&["-c", "4", "-n", "100"]).unwrap();
        assert_eq!(c.stages[0].duration, None);
        assert_eq!(c.max_requests, Some(100));
        let c = cfg(&["-q", "250", "-c", "32", "--arrival", "poisson", "-z", "2s"]).unwrap();
        assert_eq!(c.stages[0].target, StageLoad::Rate(250.0));
        assert_eq!(c.max_connections, 32);
        assert_eq!(c.arrival, Arrival::Poisson);
        let c = cfg(&["--stages", "100/s:1s,200/s:1s", "-n", "50"]).unwrap();
        assert_eq!(c.stages.len(), 2);
        assert_eq!(c.max_requests, Some(50));
        let c = cfg(&[
            "-H",
            "Authorization: Bearer x",
            "-d",
            "{\"n\": {{seq}}}",
            "--metrics-url",
            "http://127.0.0.1:9/metrics",
            "--metric",
            "allocated=a_bytes",
            "--threshold",
            "p99<100ms",
        ])
        .unwrap();
        assert_eq!(c.headers.len(), 1);
        assert_eq!(c.metric_rules.len(), 1);
        assert_eq!(c.thresholds.len(), 1);
        assert!(cfg(&["--no-nvml"]).unwrap().nvml.is_none());
        // --predict: a gentle default load, and the prediction asked for.
        let c = cfg(&["--predict", "--metrics-url", "http://127.0.0.1:9/metrics"]).unwrap();
        assert_eq!(c.stages[0].target, StageLoad::Workers(PREDICT_CONCURRENCY));
        assert_eq!(
            c.stages[0].duration,
            Some(Duration::from_secs(PREDICT_SECONDS))
        );
        assert!(c.predict.is_some() && !c.stop_at_first_oom);
        // --ramp-until-oom: the default ramp, each step --step-duration long.
        let c = cfg(&["--ramp-until-oom", "--step-duration", "2s"]).unwrap();
        assert!(c.stop_at_first_oom);
        assert_eq!(c.stages.len(), DEFAULT_RAMP.len());
        assert_eq!(
            c.stages[3].target,
            StageLoad::Workers(DEFAULT_RAMP[3] as usize)
        );
        assert_eq!(c.stages[3].duration, Some(Duration::from_secs(2)));
        let c = cfg(&["--ramp-until-oom", "--stages", "1:1s,5:1s"]).unwrap();
        assert_eq!(c.stages.len(), 2);
    }

    #[test]
    fn bad_flags_are_errors() {
        for bad in [
            &["-c", "0"][..],
            &["-n", "0"],
            &["-q", "fast"],
            &["-q", "0"],
            &["-z", "soon"],
            &["--stages", "4:1s,100/s:1s"],
            &["--stages", "1:1s", "-z", "2s"],
            &["--stages", "1:1s", "-c", "3"],
            &["--arrival", "bursty"],
            &["--timeout", "0s"],
            &["--threshold", "p99<<1"],
            &["--metric", "allocated=x"],
            &["--metrics-url", "http://x/", "--metric", "bogus=x"],
            &["--what-if", "nope:1"],
            &["--threads", "0"],
            &["--metrics-interval", "1ms"],
            &["--predict"],
            &["--predict", "--metrics-url", "http://x/m", "--no-probe"],
            &[
                "--predict",
                "--metrics-url",
                "http://x/m",
                "--predict-seeds",
                "0",
            ],
            &["--ramp-until-oom", "-c", "4"],
            &["--ramp-until-oom", "-z", "10s"],
            &["--ramp-until-oom", "--step-duration", "soon"],
            &["--ramp-until-oom", "--predict"],
            &["--predicted-from", "x.json"],
        ] {
            assert!(cfg(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
