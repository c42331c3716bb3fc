//! `vramroom serve`: serve a model over HTTP with memory-aware admission control.
//!
//! Thin: parse and check every flag (a bad one exits 2 with one line, before anything is
//! built or bound), start `vramroom_serve`, print the bound address on one line of stdout
//! (`listening on http://HOST:PORT`, so scripts using `--port 0` can find it), then wait for
//! SIGINT or SIGTERM and shut down gracefully: exit 0 once drained. A second signal during
//! the drain stops at once (exit 130).

use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use clap::Args;
use vramroom_alloc::size::{human_bytes, parse_size};
use vramroom_alloc::AllocatorConfig;
use vramroom_serve::{parse_duration, DeviceList, Generation, LatencyTarget, Margin, ServeConfig};
use vramroom_workload::ModelSpec;

use crate::error::UserError;

/// Exit code when a second signal cut the drain short.
const EXIT_INTERRUPTED: u8 = 130;

#[derive(Args, Debug)]
#[command(after_help = "Endpoints:\n  \
    POST /v1/infer   {\"inputs\": ...} as JSON, or a raw tensor (application/octet-stream\n                   \
    with X-Shape: N,3,224,224 and X-Dtype: float32|int64|int32)\n  \
    GET  /metrics    Prometheus text: memory_stats(), admission, batching, latency\n  \
    GET  /healthz    {\"status\": \"ok\", \"model\", \"device\", \"capacity_bytes\", ..., \"replicas\"}\n\n\
    Examples:\n  \
    vramroom serve --model zoo-gpt-tiny --port 0\n  \
    vramroom serve --model resnet18 --capacity 2GiB --margin 256MiB --max-batch 16\n  \
    vramroom serve --model fixtures/hf/llama-tiny --new 16 --capacity 256MiB\n  \
    vramroom serve --model gpt2 --device cuda:0,cuda:1 --margin 2GiB\n  \
    curl -s localhost:8000/v1/infer -H 'Content-Type: application/json' \\\n      \
    -d '{\"inputs\": [[464, 2068, 1586]]}'")]
pub struct ServeArgs {
    /// mlp, mlp-small, mlp-tiny, resnet18, resnet50, gpt2 (transformers' GPT2LMHeadModel,
    /// its built-in config), zoo-gpt, zoo-gpt-small, zoo-gpt-tiny (the zoo's own GPT), or the
    /// path of a Hugging Face decoder's config.json (or of a folder holding one and,
    /// optionally, *.safetensors): gpt2, llama, mistral, qwen2.
    #[arg(long, default_value = "zoo-gpt-small")]
    model: String,
    /// --model PATH: tokens generated per sequence (greedy; the KV cache of prompt + new
    /// tokens is priced at admission). 1: the next token from one forward.
    #[arg(long = "new", default_value_t = 1, value_name = "N")]
    new_tokens: usize,
    /// --model PATH with --new 1: transformers' use_cache for the forward (default true).
    #[arg(long = "use-cache", value_name = "BOOL")]
    use_cache: Option<String>,
    /// Same as --use-cache false.
    #[arg(long = "no-cache", conflicts_with = "use_cache")]
    no_cache: bool,
    /// cpu (real compute under --capacity), cuda (= cuda:0), cuda:N, or a comma list: one
    /// replica per entry (cuda:0,cuda:1; cpu,cpu simulates two devices), each with its own
    /// model copy, allocator and admission; requests go to the one with the most memory left.
    #[arg(long, default_value = "cpu", value_name = "DEVICE[,DEVICE...]")]
    device: String,
    /// Device capacity of each replica, e.g. 256MiB, 6GiB (on cuda: default the whole card;
    /// on cpu: the simulated GPU the caching allocator manages). Default: 128MiB.
    #[arg(long, value_name = "SIZE")]
    capacity: Option<String>,
    /// Allocator config in PYTORCH_CUDA_ALLOC_CONF syntax. Default: $PYTORCH_CUDA_ALLOC_CONF
    /// when set, else PyTorch's default.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    alloc_conf: Option<String>,
    /// Memory kept free below each replica's capacity: bytes (256MiB) or a percentage (10%).
    #[arg(long, default_value = "10%")]
    margin: String,
    /// Most samples (sequences, images, rows) per batch, and per request.
    #[arg(long = "max-batch", default_value_t = 8)]
    max_batch: usize,
    /// Longest a batch waits to fill after its first request arrived (0: never waits).
    #[arg(long = "max-wait", default_value = "5ms", value_name = "DURATION")]
    max_wait: String,
    /// Most requests waiting for a batch; more are answered 503.
    #[arg(long = "max-queue", default_value_t = 128)]
    max_queue: usize,
    /// Latency target of admitted requests: auto (1.5x the predicted unloaded latency of
    /// each request plus the measured compute of one full batch, the batch it may wait
    /// behind), off, or a duration. Requests predicted to miss it get 503.
    #[arg(
        long = "max-latency",
        default_value = "auto",
        value_name = "auto|off|DURATION"
    )]
    max_latency: String,
    /// Largest request body.
    #[arg(long = "max-body", default_value = "4MiB", value_name = "SIZE")]
    max_body: String,
    /// Address to listen on (0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0: any free port (the bound address is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Compute threads (each runs one batch at a time).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// How long a shutdown waits for queued and running requests (connections with no
    /// request in flight are closed at once).
    #[arg(long = "drain-timeout", default_value = "30s", value_name = "DURATION")]
    drain_timeout: String,
    /// Most HTTP connections open at once; past it new clients wait in the kernel's backlog.
    #[arg(long = "max-connections", default_value_t = vramroom_serve::conn::DEFAULT_MAX_CONNECTIONS, value_name = "N")]
    max_connections: usize,
}

fn duration(flag: &str, s: &str) -> Result<std::time::Duration, UserError> {
    parse_duration(s)
        .with_context(|| format!("bad {flag} {s:?}"))
        .map_err(UserError)
}

/// Everything the user typed, checked.
fn config(a: &ServeArgs) -> Result<ServeConfig, UserError> {
    let model: ModelSpec = a.model.parse().map_err(|e| anyhow!("bad --model: {e}"))?;
    let devices: DeviceList = a
        .device
        .parse()
        .map_err(|e| anyhow!("bad --device {:?}: {e}", a.device))?;
    let use_cache = match (&a.use_cache, a.no_cache) {
        (_, true) => false,
        (Some(u), false) => vramroom_workload::flags::parse_bool("--use-cache", u)
            .map_err(|e| anyhow!(e.to_string()))?,
        (None, false) => true,
    };
    let generation = Generation {
        new_tokens: a.new_tokens,
        use_cache,
    };
    match &model {
        ModelSpec::Hf(h) => {
            if !h.config.family.is_decoder() {
                return Err(anyhow!(
                    "bad --model: {} is an encoder; serve answers next tokens, so it needs a \
                     decoder (gpt2, llama, mistral, qwen2)",
                    model.name()
                )
                .into());
            }
            let max = h.config.max_position_embeddings;
            if a.new_tokens == 0 || a.new_tokens >= max {
                return Err(anyhow!(
                    "bad --new {}: 1 to {} (max_position_embeddings - 1)",
                    a.new_tokens,
                    max.saturating_sub(1)
                )
                .into());
            }
            if a.new_tokens > 1 && !use_cache {
                return Err(
                    anyhow!("--new above 1 decodes on the KV cache: drop --no-cache").into(),
                );
            }
            if let Some(n) = h.weights_note(true) {
                eprintln!("{n}");
            }
        }
        _ if generation != Generation::default() => {
            return Err(anyhow!(
                "--new and --use-cache/--no-cache apply to --model PATH (a Hugging Face decoder)"
            )
            .into())
        }
        _ => {}
    }
    let capacity = match &a.capacity {
        // On a GPU the default is the whole card (the device clamps to its total).
        None if devices.has_cuda() => u64::MAX,
        None => vramroom_serve::config::DEFAULT_CAPACITY,
        Some(c) => parse_size(c).with_context(|| format!("bad --capacity {c:?}"))?,
    };
    let env = crate::replay_cmd::env_alloc_conf(a.alloc_conf.is_some());
    if let Some(e) = &env {
        crate::replay_cmd::parse_env_conf(e)?;
    }
    let alloc_conf = match a.alloc_conf.as_deref().or(env.as_deref()).map(str::trim) {
        None | Some("") | Some("default") => AllocatorConfig::default(),
        Some(c) => AllocatorConfig::parse(c).with_context(|| format!("bad --alloc-conf {c:?}"))?,
    };
    let margin: Margin = a.margin.parse().map_err(|e| anyhow!("bad --margin: {e}"))?;
    let latency: LatencyTarget = a
        .max_latency
        .parse()
        .map_err(|e| anyhow!("bad --max-latency: {e}"))?;
    let max_body =
        parse_size(&a.max_body).with_context(|| format!("bad --max-body {:?}", a.max_body))?;
    let addr: SocketAddr = (a.host.as_str(), a.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .ok_or_else(|| {
            anyhow!(
                "bad --host {:?}: not an address this machine resolves",
                a.host
            )
        })?;
    let cfg = ServeConfig {
        model,
        generation,
        devices,
        capacity,
        alloc_conf,
        margin,
        max_batch: a.max_batch,
        max_wait: duration("--max-wait", &a.max_wait)?,
        max_queue: a.max_queue,
        latency,
        max_body: usize::try_from(max_body).unwrap_or(usize::MAX),
        workers: a.workers,
        addr,
        drain_timeout: duration("--drain-timeout", &a.drain_timeout)?,
        limits: vramroom_serve::conn::ConnLimits {
            max_connections: a.max_connections,
            ..Default::default()
        },
    };
    cfg.validate()?;
    Ok(cfg)
}

pub fn serve(a: ServeArgs) -> Result<ExitCode, UserError> {
    let cfg = config(&a)?;
    // The HTTP threads get the cores the compute threads leave: on a 2-core machine under a
    // storm of requests that are shed, a second HTTP thread only steals time from the batch
    // the admitted requests wait for (measured: admitted p99 at 4x the safe concurrency
    // 1.1-1.2x unloaded with one HTTP thread, 1.35-3.6x with two; loopback_bench example).
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .saturating_sub(cfg.workers)
        .clamp(1, 4);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("vramroom-http")
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    rt.block_on(run(cfg))
}

async fn run(cfg: ServeConfig) -> Result<ExitCode, UserError> {
    let drain = cfg.drain_timeout;
    let server = vramroom_serve::start(cfg).await?;
    let app = server.app().clone();
    for r in app.replicas.list() {
        let (_, _, _, base) = r.sched.ledger();
        eprintln!(
            "serving {} on {}: capacity {}, admits up to {} (model {}), max batch {}, max wait \
             {:?}, {} worker(s)",
            r.model.name(),
            r.name,
            human_bytes(r.capacity),
            human_bytes(r.limit),
            human_bytes(base),
            app.cfg.max_batch,
            app.cfg.max_wait,
            app.cfg.workers,
        );
    }
    let stop = vramroom_serve::shutdown_signal();
    println!("listening on {}", server.url());
    let _ = std::io::stdout().flush();
    stop.await;
    eprintln!("shutting down: draining queued and running requests (up to {drain:?})");
    let again = vramroom_serve::shutdown_signal();
    tokio::select! {
        report = server.shutdown() => {
            eprintln!("{}", shutdown_message(&report));
            Ok(ExitCode::SUCCESS)
        }
        _ = again => {
            eprintln!("stopped before the drain finished");
            Ok(ExitCode::from(EXIT_INTERRUPTED))
        }
    }
}

/// What the drain did, in one line that is true of it: how many requests it waited for,
/// and when it timed out, how many were still queued (answered 503) or running.
pub fn shutdown_message(r: &vramroom_serve::ShutdownReport) -> String {
    // "1 request still queued was answered 503", "2 requests ... were ..."
    let n = |k: usize, state: &str, then: &str| {
        let (s, be) = if k == 1 { ("", "was") } else { ("s", "were") };
        format!("{k} request{s} {state} {be} {then}")
    };
    if r.drained {
        if r.in_flight_at_start == 0 {
            format!("drained in {:.0?}: no request was in flight", r.elapsed)
        } else {
            format!(
                "drained in {:.0?}: {}",
                r.elapsed,
                n(r.in_flight_at_start, "in flight", "answered")
            )
        }
    } else {
        let mut parts = Vec::new();
        if r.queued_at_timeout > 0 {
            parts.push(n(r.queued_at_timeout, "still queued", "answered 503"));
        }
        if r.running_at_timeout > 0 {
            parts.push(n(r.running_at_timeout, "still running", "cut off"));
        }
        let other = r
            .in_flight_at_timeout
            .saturating_sub(r.queued_at_timeout + r.running_at_timeout);
        if other > 0 {
            parts.push(n(other, "still being read or admitted", "stopped"));
        }
        if parts.is_empty() {
            parts.push("connections were still sending their answers".into());
        }
        format!(
            "drain timed out after {:.0?}: {}",
            r.elapsed,
            parts.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: ServeArgs,
    }

    fn cfg(args: &[&str]) -> Result<ServeConfig, String> {
        let mut v = vec!["serve"];
        v.extend_from_slice(args);
        let cli = Cli::try_parse_from(v).map_err(|e| e.to_string())?;
        config(&cli.a).map_err(|e| e.0.to_string())
    }

    #[test]
    fn the_shutdown_message_says_what_happened() {
        use std::time::Duration;
        use vramroom_serve::ShutdownReport;
        let r = |drained, start, q, run, inflight| ShutdownReport {
            drained,
            elapsed: Duration::from_millis(12),
            in_flight_at_start: start,
            queued_at_timeout: q,
            running_at_timeout: run,
            in_flight_at_timeout: inflight,
        };
        let m = shutdown_message(&r(true, 0, 0, 0, 0));
        assert!(m.contains("no request was in flight"), "{m}");
        let m = shutdown_message(&r(true, 3, 0, 0, 0));
        assert!(m.contains("3 requests in flight were answered"), "{m}");
        let m = shutdown_message(&r(false, 5, 2, 1, 4));
        assert!(
            m.contains("2 requests still queued were answered 503"),
            "{m}"
        );
        assert!(m.contains("1 request still running was cut off"), "{m}");
        assert!(
            m.contains("1 request still being read or admitted was stopped"),
            "{m}"
        );
        // nothing queued at the timeout: the message never claims there was
        let m = shutdown_message(&r(false, 1, 0, 0, 0));
        assert!(!m.contains("queued"), "{m}");
    }

    #[test]
    fn defaults_and_values() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.capacity, 128 << 20);
        assert_eq!(c.max_wait, std::time::Duration::from_millis(5));
        assert_eq!(c.addr.port(), 8000);
        assert_eq!(c.devices.to_string(), "cpu");
        let c = cfg(&["--device", "cpu,cpu", "--capacity", "64MiB"]).unwrap();
        assert_eq!(c.devices.names(), ["cpu:0", "cpu:1"]);
        assert_eq!(c.capacity, 64 << 20);
        // a GPU list defaults to each whole card
        assert_eq!(
            cfg(&["--device", "cuda:0,cuda:1"]).unwrap().capacity,
            u64::MAX
        );
        let c = cfg(&[
            "--model",
            "mlp-tiny",
            "--capacity",
            "1GiB",
            "--margin",
            "64MiB",
            "--max-wait",
            "0",
            "--port",
            "0",
            "--alloc-conf",
            "expandable_segments:True",
            "--max-latency",
            "20ms",
        ])
        .unwrap();
        assert_eq!(c.limit_bytes(), (1 << 30) - (64 << 20));
        assert!(c.max_wait.is_zero());
        assert_eq!(
            c.latency,
            LatencyTarget::Fixed(std::time::Duration::from_millis(20))
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, says) in [
            (&["--model", "bert"][..], "--model"),
            (&["--device", "tpu"], "--device"),
            (&["--device", "cuda:x"], "\"cuda:x\""),
            (&["--device", "cpu,,cpu"], "empty entry (entry 2)"),
            (&["--device", "cuda:0,tpu"], "\"tpu\""),
            (&["--device", "cuda:1,cuda:1"], "cuda:1 is listed twice"),
            (&["--capacity", "0"], "--capacity"),
            (&["--capacity", "lots"], "--capacity"),
            (&["--alloc-conf", "bogus:1"], "--alloc-conf"),
            (&["--margin", "150%"], "--margin"),
            (&["--max-batch", "0"], "--max-batch"),
            (&["--max-wait", "soon"], "--max-wait"),
            (&["--max-latency", "fast"], "--max-latency"),
            (&["--max-body", "0"], "--max-body"),
            (&["--workers", "0"], "--workers"),
            (&["--host", "no such host.invalid"], "--host"),
        ] {
            let e = cfg(args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }
}
