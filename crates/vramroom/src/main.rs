//! `vramroom`: the command line. Thin: it parses arguments, calls the libraries, prints.

mod bench_models_cmd;
mod claims_cmd;
mod diff_cmd;
mod error;
mod http_cmd;
mod loadtest_cmd;
mod predict_cmd;
mod progress;
mod replay_cmd;
mod replay_findings;
mod replay_ranks;
mod run_cmd;
mod serve_cmd;
mod table;
mod trace_cmd;
mod watch_cmd;
mod workload_args;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use error::UserError;

#[derive(Parser)]
#[command(
    name = "vramroom",
    version,
    about = "Make GPU memory visible, predictable and survivable",
    long_about = "Vramroom re-implements PyTorch's CUDA caching allocator exactly, replays PyTorch \
                  memory snapshots under other configs or smaller GPUs, and load-tests model \
                  workloads to find the OOM point before production does."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load-test a model workload: ramp the load, watch memory as the allocator sees it,
    /// find the OOM point, name the waste, write report.html, results.json and
    /// snapshot.pickle. With no arguments: the default scenario on the CPU device.
    Loadtest(Box<loadtest_cmd::LoadtestArgs>),
    /// Re-run the five well-known claims about PyTorch memory and print a verdict for each.
    Claims(claims_cmd::ClaimsArgs),
    /// Replay a PyTorch memory snapshot through Vramroom's allocator, under one or more
    /// configs, and report peaks, segments, retries and OOMs.
    Replay(replay_cmd::ReplayArgs),
    /// Print PyTorch's `memory_summary()` table after replaying a snapshot.
    Summary(replay_cmd::SummaryArgs),
    /// Predict a model workload's peak memory on the meta device (no GPU needed).
    Predict(Box<predict_cmd::PredictArgs>),
    /// Serve a model over HTTP (POST /v1/infer, GET /metrics, GET /healthz) with dynamic
    /// batching and admission control: requests whose predicted memory or latency does not
    /// fit get 503 + Retry-After instead of an OOM.
    Serve(Box<serve_cmd::ServeArgs>),
    /// Load any HTTP endpoint (closed -c or open -q model, stages, thresholds) with the
    /// service's memory on the same timeline (NVML, --metrics-url, the probe); write
    /// report.html and results.json.
    Http(Box<http_cmd::HttpArgs>),
    /// Watch the memory of running services (one or more metrics URLs, e.g. every rank of
    /// a torchrun job) on one timeline, without load; Ctrl-C or -z ends it.
    Watch(watch_cmd::WatchArgs),
    /// Trace your own PyTorch program on fake CUDA (no GPU): `vramroom trace -- python
    /// train.py ARGS`; peaks, OOM at a capacity and what-if rows from Vramroom's allocator,
    /// and the traced snapshot (--snapshot-out) for replay, diff and memory_viz.
    Trace(trace_cmd::TraceArgs),
    /// Compare two snapshots (peaks, reserved, fragmentation, allocation sites) or two
    /// results JSON, with thresholds for CI (exit 99 when one is broken).
    Diff(diff_cmd::DiffArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// ns per malloc+free pair, on the cases PyTorch's own figures use.
    Alloc(replay_cmd::BenchAllocArgs),
    /// ResNet-50 and GPT-2 on a GPU: ms and peak memory per case, beside PyTorch's.
    Models(Box<bench_models_cmd::BenchModelsArgs>),
    /// Vramroom's HTTP client against wrk or oha on the same loopback target: req/s of
    /// each and the ratio.
    Http(http_cmd::BenchHttpArgs),
}

/// `vramroom predict --json | head` ends as `cat | head` does, without a panic: Rust starts
/// with SIGPIPE ignored, so a write to a closed pipe is an error `println!` panics on. The
/// default disposition ends the process quietly instead. Not for the commands that talk
/// HTTP: there a peer closing its socket must be an error the command handles, not a signal.
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: called once at start, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Serve(_) | Command::Http(_) | Command::Watch(_) | Command::Bench(_)
    ) {
        quiet_on_closed_pipe();
    }
    let result = dispatch(cli.command);
    match result {
        Ok(code) => code,
        Err(UserError(e)) => {
            // One line: the chain of causes joined, as a user reads it.
            // Some errors print their source in their own text: skip a cause already said.
            let mut msg = String::new();
            for c in e.chain() {
                let c = c.to_string();
                if !msg.contains(&c) {
                    if !msg.is_empty() {
                        msg.push_str(": ");
                    }
                    msg.push_str(&c);
                }
            }
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}

/// The finished command line run (apart from `main` so the README's commands run in tests).
fn dispatch(command: Command) -> Result<ExitCode, UserError> {
    match command {
        Command::Loadtest(a) => loadtest_cmd::loadtest(*a),
        Command::Claims(a) => claims_cmd::claims(a),
        Command::Replay(a) => replay_cmd::replay(a),
        Command::Summary(a) => replay_cmd::summary(a),
        Command::Predict(a) => predict_cmd::predict(*a),
        Command::Serve(a) => serve_cmd::serve(*a),
        Command::Http(a) => http_cmd::http(*a),
        Command::Watch(a) => watch_cmd::watch(a),
        Command::Diff(a) => diff_cmd::diff(a),
        Command::Trace(a) => trace_cmd::trace(a),
        Command::Bench(BenchCommand::Http(a)) => http_cmd::bench_http(a),
        Command::Bench(BenchCommand::Alloc(a)) => replay_cmd::bench_alloc(a),
        Command::Bench(BenchCommand::Models(a)) => bench_models_cmd::bench_models(*a),
    }
}

#[cfg(test)]
mod readme_commands;
