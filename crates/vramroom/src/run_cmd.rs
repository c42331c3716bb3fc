//! What `vramroom loadtest` and `vramroom http` share around a run: Ctrl-C handling, the
//! progress bar, the files written, the summary, and the exit code (0; 1 when no request
//! of a `vramroom http` run succeeded; 99 when a threshold broke and 130 when stopped by
//! Ctrl-C, as k6 does).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use vramroom_load::report::{summary_table, write_html, write_json};
use vramroom_load::{LoadError, Progress, RunResult, StopReason};
use vramroom_workload::parse_duration;

use crate::error::UserError;

/// Exit code of a run that broke a `--threshold` (k6's).
pub const EXIT_THRESHOLD: u8 = 99;
/// Exit code of a run stopped by Ctrl-C (after writing what was measured).
pub const EXIT_CANCELLED: u8 = 130;
/// Exit code of a `vramroom http` run in which no request succeeded (every one timed out,
/// failed, was refused or shed): the report is written, but a load test of nothing that
/// worked must not read as a pass in a script.
pub const EXIT_NO_SUCCESS: u8 = 1;

/// A load or workload error as the one-line message of exit 2.
pub fn le(e: impl Into<LoadError>) -> UserError {
    UserError(anyhow!(e.into().to_string()))
}

pub fn duration(flag: &str, v: &str) -> Result<Duration, UserError> {
    parse_duration(v).map_err(|m| UserError(anyhow!("bad {flag} {v:?}: {m}")))
}

/// Checks the output folder before the run, so that a folder that cannot be written is
/// found in the first second and not after the load, when the measurements would be lost:
/// creates it (parents included) and writes and removes a probe file in it.
/// Returns the folders it created, for [`discard_out_dir`].
pub fn check_out_dir(out: &Path) -> Result<Vec<PathBuf>, UserError> {
    vramroom_alloc::output::probe_dir(out)
        .map_err(|e| anyhow!("--out {}: cannot write there: {e}", out.display()).into())
}

/// The run failed before anything was measured (a dead URL, a model that does not
/// build): take back the empty folders [`check_out_dir`] created, so that an exit 2
/// leaves nothing behind.
pub fn discard_out_dir(created: &[PathBuf]) {
    vramroom_alloc::output::remove_created(created);
}

/// Checks an output file's place before the work (see [`check_out_dir`]).
pub fn check_out_file(flag: &str, path: &Path) -> Result<(), UserError> {
    vramroom_alloc::output::probe_file(path)
        .map_err(|e| anyhow!("{flag} {}: cannot write there: {e}", path.display()).into())
}

/// The run's stop flag: the first Ctrl-C sets it (the run finishes what is in flight and
/// the report is written); a second one ends the process at once.
pub fn stop_on_ctrl_c() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let _ = ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            std::process::exit(EXIT_CANCELLED as i32);
        }
        eprintln!(
            "\nstopping: finishing the requests in flight, then writing the report \
             (Ctrl-C again to quit now)"
        );
    });
    stop
}

/// The run's bar; its messages are fitted to the terminal by the caller
/// (`progress::fitted(.., RUN_PREFIX_COLS)`, which this template's prefix is measured for).
pub fn progress_bar(quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(1000);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner:.green} [{elapsed:>4}] {bar:24.cyan/blue} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// How far the load is, 0..=1: by time when the plan has a length, else by requests (-n).
pub fn load_fraction(p: &Progress) -> f64 {
    let f = if let Some(total) = p.planned_s.filter(|t| *t > 0.0) {
        p.elapsed_s / total
    } else if let Some(n) = p.requests_planned.filter(|n| *n > 0) {
        p.requests_done as f64 / n as f64
    } else {
        0.0
    };
    f.clamp(0.0, 1.0)
}

/// Writes results.json, the snapshots (snapshot.pickle, oom_snapshot.pickle) and
/// report.html; returns the paths written.
fn write_outputs(out: &Path, r: &RunResult) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut written = Vec::new();
    let json = out.join("results.json");
    write_json(&json, r).with_context(|| format!("writing {}", json.display()))?;
    written.push(json);
    for (snap, name) in [
        (&r.snapshot, "snapshot.pickle"),
        (&r.oom_snapshot, "oom_snapshot.pickle"),
    ] {
        if let Some(s) = snap {
            let p = out.join(name);
            vramroom_trace::write_snapshot_file(s, &p)
                .with_context(|| format!("writing {}", p.display()))?;
            written.push(p);
        }
    }
    let html = out.join("report.html");
    write_html(&html, r).with_context(|| format!("writing {}", html.display()))?;
    written.push(html);
    Ok(written)
}

/// After the run: the files, the summary table (or the JSON with `--json`), the exit code.
pub fn finish(out: &Path, json: bool, r: &RunResult) -> Result<ExitCode, UserError> {
    let written = write_outputs(out, r);
    // The measurements reach the terminal even when the files could not be written (a
    // disk that filled during the run): the run is not lost with them.
    if json || written.is_err() {
        println!("{}", r.to_json());
    } else {
        print!("{}", summary_table(r));
        println!();
    }
    let written = written.map_err(|e| {
        UserError(e.context(format!(
            "the run finished but its files could not be written to {} (its results are on stdout above)",
            out.display()
        )))
    })?;
    for p in &written {
        eprintln!("wrote {}", p.display());
    }
    // Precedence: nothing succeeded (1) says more than a broken threshold (99), which says
    // more than Ctrl-C (130); a run stopped by Ctrl-C before any answer is just cancelled.
    let cancelled = r.stop_reason == StopReason::Cancelled;
    if let Some(msg) = no_success(r).filter(|_| !cancelled) {
        eprintln!("{msg}");
        return Ok(ExitCode::from(EXIT_NO_SUCCESS));
    }
    if !r.thresholds_passed() {
        let broken: Vec<String> = r
            .thresholds
            .iter()
            .filter(|t| !t.passed)
            .map(|t| match t.actual {
                Some(_) => t.expr.clone(),
                // A gate on a number nobody measured fails, and says so.
                None => format!("{} (not measured by this run)", t.expr),
            })
            .collect();
        eprintln!("threshold(s) broken: {}", broken.join(", "));
        return Ok(ExitCode::from(EXIT_THRESHOLD));
    }
    if cancelled {
        eprintln!("cancelled: the report holds what was measured before Ctrl-C");
        return Ok(ExitCode::from(EXIT_CANCELLED));
    }
    Ok(ExitCode::SUCCESS)
}

/// For a run in which no request succeeded: one line saying what happened to them
/// instead. `None` when one succeeded. A `vramroom loadtest` run whose requests ran out of
/// memory is what a ramp looks for (an answer, not a failure); one whose every request
/// failed otherwise (and none ran out of memory) failed, as an HTTP run of nothing that
/// worked does.
pub fn no_success(r: &RunResult) -> Option<String> {
    if r.requests.ok > 0 {
        return None;
    }
    let Some(http) = r.http.as_ref() else {
        if r.requests.total == 0 || r.errors.oom > 0 || r.requests.oom > 0 {
            return None;
        }
        let what: Vec<String> = r
            .errors
            .by_kind
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        return Some(format!(
            "no request succeeded: 0 of {} ({}); the report is written, exit code \
             {EXIT_NO_SUCCESS}",
            r.requests.total,
            if what.is_empty() {
                "every one failed".into()
            } else {
                what.join(", ")
            }
        ));
    };
    // `requests.total` counts every request sent, the shed 503s among them: adding
    // `http.shed` again counted them twice.
    let sent = r.requests.total;
    let mut what: Vec<String> = r
        .errors
        .by_kind
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect();
    if http.shed > 0 {
        what.push(format!("{} shed (503)", http.shed));
    }
    if what.is_empty() {
        what.push("none was answered".into());
    }
    Some(format!(
        "no request succeeded: 0 of {sent} ({}); the report is written, exit code {EXIT_NO_SUCCESS}",
        what.join(", ")
    ))
}
