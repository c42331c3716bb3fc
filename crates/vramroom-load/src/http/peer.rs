//! `vramroom bench http`'s peer: wrk or oha, found on PATH and run once against the same
//! target, their requests per second read from their output. The CLI alternates runs of the
//! peer and of this crate's client and compares the medians.

use std::path::{Path, PathBuf};

/// `name` on PATH.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs the peer once; its requests per second.
pub fn run_peer(
    peer: &str,
    bin: &Path,
    url: &str,
    c: usize,
    t: usize,
    secs: f64,
) -> Result<f64, String> {
    let secs_s = format!("{}s", secs.ceil().max(1.0) as u64);
    let out = match peer {
        "wrk" => std::process::Command::new(bin)
            .args([
                "-t",
                &t.min(c).to_string(),
                "-c",
                &c.to_string(),
                "-d",
                &secs_s,
                url,
            ])
            .output(),
        _ => std::process::Command::new(bin)
            .args([
                "-c",
                &c.to_string(),
                "-z",
                &secs_s,
                "--no-tui",
                "--output-format",
                "json",
                url,
            ])
            .output(),
    }
    .map_err(|e| format!("cannot run {peer}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{peer} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if peer == "wrk" {
        text.lines()
            .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or_else(|| format!("no Requests/sec in wrk's output: {text}"))
    } else {
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("oha's JSON: {e}"))?;
        v["summary"]["requestsPerSec"]
            .as_f64()
            .ok_or_else(|| "no summary.requestsPerSec in oha's JSON".into())
    }
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
