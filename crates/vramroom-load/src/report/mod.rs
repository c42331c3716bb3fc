//! The output side of a load run: the self-contained HTML report with SVG plots, the
//! terminal summary table, and the JSON results file.
//!
//! This module is the dispatcher: [`render_html`] and [`summary_table`] pick the in-process
//! page ([`html`], [`terminal`]) or the HTTP run's ([`http`]); the pieces they share are in
//! [`parts`]. The pages import the parts and the plots, never each other.
//!
//! Design note: everything here is a pure function of a finished [`RunResult`] — the report
//! never looks at the engine's live state — so a cancelled run (Ctrl-C) reports what it
//! measured exactly as a completed one does. Files are written atomically (a temporary file
//! in the same folder, then a rename), so an error never leaves a partial `report.html` or
//! `results.json` behind.

pub mod format;
pub mod histogram;
pub mod html;
pub mod http;
pub mod http_predict;
pub mod parts;
pub mod plots;
pub mod terminal;

use std::io;
use std::path::Path;

use crate::results::RunResult;

pub use format::{fmt_bytes, fmt_ms, fmt_signed_bytes, fmt_value};
pub use parts::esc;

/// The self-contained HTML report: the HTTP run's page for a run with an `http` part, the
/// load test's page otherwise.
pub fn render_html(r: &RunResult) -> String {
    let page = match r.http.as_ref() {
        Some(hr) => http::render_http_html(r, hr),
        None => html::render_run_html(r),
    };
    parts::scroll_tables(&page)
}

/// The terminal summary, chosen as [`render_html`] chooses the page.
pub fn summary_table(r: &RunResult) -> String {
    match r.http.as_ref() {
        Some(hr) => http::http_summary_table(r, hr),
        None => terminal::run_summary_table(r),
    }
}

/// Writes `bytes` to `path` by `vramroom_alloc::output::write_file`'s rules: atomically
/// (a temporary file beside it, flushed, then renamed) for a regular file, through a
/// symlink to its target, and into a device or FIFO without replacing it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    vramroom_alloc::output::write_file(path, bytes)
}

/// Writes the run as pretty JSON (the documented schema of [`crate::results`]).
pub fn write_json(path: &Path, r: &RunResult) -> io::Result<()> {
    let mut s = serde_json::to_string_pretty(r).map_err(io::Error::other)?;
    s.push('\n');
    write_atomic(path, s.as_bytes())
}

/// Writes the self-contained HTML report.
pub fn write_html(path: &Path, r: &RunResult) -> io::Result<()> {
    write_atomic(path, render_html(r).as_bytes())
}

#[cfg(test)]
pub(crate) mod testdata;

#[cfg(test)]
mod browser_test;

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn atomic_write_leaves_no_temp_and_fails_cleanly() {
        let dir = std::env::temp_dir().join(format!("vramroom-report-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a.json");
        write_atomic(&p, b"{}").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"{}");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A missing folder: an error, and nothing created.
        let q = dir.join("missing").join("b.json");
        assert!(write_atomic(&q, b"x").is_err());
        assert!(!q.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn json_round_trips() {
        let r = testdata::synthetic();
        let dir = std::env::temp_dir().join(format!("vramroom-json-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join("results.json");
        write_json(&p, &r).unwrap();
        let back: RunResult = serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap();
        assert_eq!(back.stages.len(), r.stages.len());
        assert_eq!(back.findings.len(), r.findings.len());
        assert_eq!(back.timeline.len(), r.timeline.len());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(3 << 20), "3.00 MiB");
        assert_eq!(fmt_signed_bytes(-(2 << 20)), "-2.00 MiB");
        assert_eq!(fmt_ms(1.234), "1.23 ms");
        assert_eq!(fmt_value(512.0 * 1024.0 * 1024.0, "bytes"), "512.00 MiB");
    }
}
