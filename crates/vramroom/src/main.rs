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

fn main() -> ExitCode {
    let cli = Cli::parse();
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

/// Every `vramroom ...` command in the README's code blocks parses with this very clap
/// definition (a renamed flag or a dropped value fails here, not in a reader's shell).
#[cfg(test)]
mod readme_commands {
    use super::*;

    /// The argument vectors of the `vramroom` commands in `md`'s fenced code blocks: lines
    /// that start with `vramroom ` (or `$ vramroom `), and `cargo run ... -p vramroom -- ARGS`;
    /// continuation lines joined, a shell comment and anything after a pipe, `&&`, `;` or a
    /// redirection dropped.
    pub(crate) fn commands(md: &str) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        let mut in_block = false;
        let mut pending = String::new();
        for line in md.lines() {
            if line.trim_start().starts_with("```") {
                in_block = !in_block;
                pending.clear();
                continue;
            }
            if !in_block {
                continue;
            }
            let t = line.trim();
            if let Some(head) = t.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            let full = std::mem::take(&mut pending) + t;
            let full = full.strip_prefix("$ ").unwrap_or(&full);
            let words = shell_words(full);
            let args: Vec<String> = if words.first().is_some_and(|w| w == "vramroom") {
                words
            } else if words.first().is_some_and(|w| w == "cargo")
                && words.windows(2).any(|w| w[0] == "-p" && w[1] == "vramroom")
            {
                match words.iter().position(|w| w == "--") {
                    Some(i) => std::iter::once("vramroom".to_string())
                        .chain(words[i + 1..].iter().cloned())
                        .collect(),
                    None => continue,
                }
            } else {
                continue;
            };
            out.push(args);
        }
        out
    }

    /// Words as sh splits them, for the README's simple commands: quotes, and the end of the
    /// command at an unquoted `#` (a comment), `|`, `&`, `;` or `>`.
    fn shell_words(s: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut cur = String::new();
        let mut has = false;
        let mut quote: Option<char> = None;
        for c in s.chars() {
            match quote {
                Some(q) if c == q => quote = None,
                Some(_) => cur.push(c),
                None => match c {
                    '\'' | '"' => {
                        quote = Some(c);
                        has = true;
                    }
                    '#' if !has => break,
                    '|' | '&' | ';' | '>' => break,
                    c if c.is_whitespace() => {
                        if has {
                            words.push(std::mem::take(&mut cur));
                            has = false;
                        }
                    }
                    c => {
                        cur.push(c);
                        has = true;
                    }
                },
            }
        }
        if has {
            words.push(cur);
        }
        words
    }

    #[test]
    fn shell_words_split_as_sh_does() {
        assert_eq!(
            shell_words("vramroom diff a b --threshold 'p99<+10%'    # exit 99"),
            ["vramroom", "diff", "a", "b", "--threshold", "p99<+10%"]
        );
        assert_eq!(
            shell_words("vramroom replay x | head"),
            ["vramroom", "replay", "x"]
        );
        let md = "text\n```sh\nvramroom replay a \\\n  --json\ncargo run --release -p vramroom -- loadtest\necho no\n```\nvramroom not-in-a-block\n";
        assert_eq!(
            commands(md),
            [
                vec!["vramroom", "replay", "a", "--json"],
                vec!["vramroom", "loadtest"]
            ]
        );
    }

    #[test]
    fn every_readme_command_parses() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
        let md = std::fs::read_to_string(&path).expect("README.md");
        let cmds = commands(&md);
        assert!(cmds.len() >= 8, "only {} commands found", cmds.len());
        let bad: Vec<String> = cmds
            .iter()
            .filter_map(|c| {
                Cli::try_parse_from(c)
                    .err()
                    .map(|e| format!("{}\n  {}", c.join(" "), e.kind()))
            })
            .collect();
        assert!(
            bad.is_empty(),
            "README commands clap rejects:\n{}",
            bad.join("\n")
        );
    }

    /// The README's commands that need no GPU and finish in seconds: `predict` (the meta
    /// device) and `replay`/`summary` of files at hand. The others (a load test of 10 s, a
    /// server, `trace` of the reader's script, `diff` of the reader's files) parse only.
    fn runs_here(args: &[String], root: &std::path::Path) -> bool {
        let quick = matches!(
            args.get(1).map(String::as_str),
            Some("predict" | "replay" | "summary")
        );
        // Every path it names is in the checkout (or ../shared, beside it).
        let paths_here = args[2..]
            .iter()
            .filter(|a| a.contains('/'))
            .all(|a| root.join(a).exists());
        quick && paths_here
    }

    #[test]
    fn the_readme_commands_that_need_no_gpu_run() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let md = std::fs::read_to_string(root.join("README.md")).expect("README.md");
        let mut ran = 0;
        for c in commands(&md).iter().filter(|c| runs_here(c, &root)) {
            // The README's paths are relative to the checkout; the test's working directory is
            // the crate's, and changing it would race the other tests.
            let args: Vec<String> = c
                .iter()
                .map(|a| {
                    if a.contains('/') && root.join(a).exists() {
                        root.join(a).display().to_string()
                    } else {
                        a.clone()
                    }
                })
                .collect();
            let cli = Cli::try_parse_from(&args).expect("parses");
            match dispatch(cli.command) {
                Ok(code) => assert_eq!(code, ExitCode::SUCCESS, "{}", c.join(" ")),
                Err(UserError(e)) => panic!("{}: {e:#}", c.join(" ")),
            }
            ran += 1;
        }
        // The predict examples at least, whatever else is at hand.
        assert!(ran >= 4, "only {ran} README commands ran");
    }
}
