//! The README's generated tables are their committed results files': each script regenerates
//! its tables and compares them with the README (`--check`). The corpus table of issue 32
//! (`scripts/services/readme_table_d.py`) and the tracer's tables of issue 30 (the hidden
//! allocations it applies and its accuracy against real GPU runs,
//! `scripts/trace_corpus/readme_table.py`). Skips, saying why, while there is nothing to
//! compare (no results file committed yet, or no python3).

use std::path::Path;
use std::process::Command;

/// Runs `python3 SCRIPT --check README.md`: exit 0 agrees, 3 is a skip (said why), any
/// other exit fails the test with the script's words.
fn check(script: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = match Command::new("python3")
        .arg(root.join(script))
        .arg("--check")
        .arg(root.join("README.md"))
        .current_dir(&root)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: python3 cannot run ({e})");
            return;
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match out.status.code() {
        Some(0) => eprintln!("{}", text.trim()),
        Some(3) => eprintln!("skipped: {}", text.trim()),
        _ => panic!("README's tables and their results files disagree ({script}):\n{text}"),
    }
}

#[test]
fn readme_corpus_table_matches_the_results_file() {
    check("scripts/services/readme_table_d.py");
}

#[test]
fn readme_tracer_tables_match_their_sources() {
    check("scripts/trace_corpus/readme_table.py");
}
